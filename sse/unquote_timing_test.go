package sse

import (
	"encoding/json"
	"strings"
	"testing"
)

// BenchmarkAppendString decodes a 1 MiB JSON string shaped like prompt
// text: lines of code, so an escaped newline every 40 bytes or so. It is
// the prefix tracker's inner loop (proxy/prefix canonicalises every
// message's content with it).
func BenchmarkAppendString(b *testing.B) {
	var text strings.Builder
	for text.Len() < 1<<20 {
		text.WriteString("\tif err := s.handle(ctx, req); err != nil {\n")
	}
	js, err := json.Marshal(text.String())
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, 0, len(js))
	b.SetBytes(int64(len(js)))
	b.ReportAllocs()
	for b.Loop() {
		s := NewScanner(js)
		dst = s.AppendString(dst[:0])
		if s.Bad() {
			b.Fatal("bad")
		}
	}
}
