//go:build !race

package dist

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEncodeAllocatesLittle: a pooled encoder does not take a compressor
// per call. The library's takes about 1 MB; Encode copies the counts
// (26 KB for Ms) and writes the base64 string. Not under -race: there
// sync.Pool drops a quarter of its Puts at random, and Encode then takes a
// fresh compressor (257 KB a call measured).
func TestEncodeAllocatesLittle(t *testing.T) {
	h := encodeCases(t)["ms"]
	Encode(h) // fill the pool
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Encode(h)
		}
	})
	require.Less(t, res.AllocedBytesPerOp(), int64(64<<10), "Encode allocated %d bytes per call", res.AllocedBytesPerOp())
}
