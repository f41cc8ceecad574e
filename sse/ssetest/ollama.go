// Package ssetest builds engine streams for tests of the packages that
// read them (sse, proxy), as net/http/httptest serves them for net/http's.
// It holds no text a real prompt or answer could have come from.
package ssetest

import (
	"strconv"
	"strings"
)

// OllamaLongContext is an /api/generate NDJSON stream of one content line
// and a done line that carries ids token ids in "context" (6 bytes each:
// 200,000 make 1.3 MiB, over sse.DefaultMaxEventBytes) before ollama's
// counts and durations: prompt_eval_count ids, eval_count evalCount,
// total 912345678 ns, prompt_eval 345678901 ns, eval 512345678 ns.
func OllamaLongContext(ids, evalCount int) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","created_at":"2026-12-01T18:39:45Z","response":"a","done":false}` + "\n")
	b.WriteString(`{"model":"m","created_at":"2026-12-01T18:39:46Z","response":"","done":true,"done_reason":"stop","context":[`)
	for i := range ids {
		b.WriteString(strconv.Itoa(100000 + i%28000))
		b.WriteByte(',')
	}
	b.WriteString(`13],"total_duration":912345678,"load_duration":1234567,"prompt_eval_count":` + strconv.Itoa(ids) +
		`,"prompt_eval_duration":345678901,"eval_count":` + strconv.Itoa(evalCount) + `,"eval_duration":512345678}` + "\n")
	return []byte(b.String())
}
