package prefix

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/anvilproxy/anvilproxy/sse"
)

// agentBody returns a realistic coding-agent chat body of about size bytes:
// a 20 KB system prompt, 30 tools, then turns of an assistant tool call and
// a tool result holding Go source (many escaped newlines, tabs and quotes).
func agentBody(tb testing.TB, size int) []byte {
	r := rand.New(rand.NewPCG(7, 7))
	c := newConv("Refactor the storage layer to use the new cache interface; keep the tests green.")
	c.system = strings.Repeat(systemPrompt("2025-06-01T10:00:00Z"), 110)
	c.tools = nil
	for i := range 30 {
		c.tools = append(c.tools, tool(fmt.Sprintf("tool_%d", i), words(r, 300)))
	}
	for n, i := len(c.body(tb)), 0; n < size; i++ {
		c.turn(i)
		var src strings.Builder
		for src.Len() < 3000 {
			fmt.Fprintf(&src, "func (s *Store) Get%d(key string) (\"%s\", error) {\n\tif v, ok := s.m[key]; ok {\n\t\treturn v, nil\n\t}\n\t// %s\n}\n\n", r.IntN(1000), words(r, 12), words(r, 60))
		}
		c.msgs[len(c.msgs)-1].Content = src.String()
		n += 3800 // the tool result as JSON (escapes), the assistant call, the framing
	}
	return c.body(tb)
}

// BenchmarkObserve measures a 1 MiB agent prompt: cold (no segment known:
// parse, hash and fingerprint everything) and warm (every segment known:
// parse, hash and look up; the next turn of a conversation costs this plus
// the cold cost of its new messages), with and without volatile masks
// (whose regular expressions run on new text only). cpu-ns/op is process
// CPU time, steadier than wall time on a shared machine; compare it with
// BenchmarkByteLoop.
func BenchmarkObserve(b *testing.B) {
	body := agentBody(b, 1<<20)
	masks := Config{VolatilePatterns: []string{`\d{4}-\d\d-\d\dT[\d:.]+Z?`}, VolatileFields: []string{"tool_calls.id"}}
	for _, c := range []struct {
		name string
		cfg  Config
		warm bool // the tracker has seen the prompt: only canonicalising and hashing remain
	}{
		{"cold", Config{}, false},
		{"warm", Config{}, true},
		{"masked-cold", masks, false},
		{"masked-warm", masks, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			tr, _ := New(c.cfg)
			if c.warm {
				tr.Observe(sse.ProtocolChat, body, t0)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				if !c.warm {
					tr, _ = New(c.cfg)
				}
				tr.Observe(sse.ProtocolChat, body, t0)
			}
			reportCPU(b, cpu)
		})
	}
}

// reportCPU reports CPU nanoseconds per operation since start.
func reportCPU(b *testing.B, start int64) {
	if start > 0 {
		b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkFingerprint measures fingerprinting alone (the cold path's
// share beyond parsing) over the segments of a 1 MiB agent prompt.
func BenchmarkFingerprint(b *testing.B) {
	tr, _ := New(Config{})
	sc := &scratch{proto: sse.ProtocolChat}
	if tr.build(sc, agentBody(b, 1<<20)) != TrackedOK {
		b.Fatal("build")
	}
	tr.resolve(sc)
	b.SetBytes(int64(len(sc.canon.dst)))
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		for i := range sc.segs {
			tr.fingerprint(sc, i)
		}
	}
	reportCPU(b, cpu)
}

// BenchmarkByteLoop is the yardstick for the numbers above: one pass that
// sums the bytes of 1 MiB, about a cycle a byte on an idle machine.
func BenchmarkByteLoop(b *testing.B) {
	buf := agentBody(b, 1<<20)
	b.SetBytes(int64(len(buf)))
	cpu := cpuTime()
	var sum uint64
	for b.Loop() {
		for _, c := range buf {
			sum += uint64(c)
		}
	}
	reportCPU(b, cpu)
	if sum == 1 {
		b.Log(sum)
	}
}

// BenchmarkObserveSmall is the tracker's fixed cost per request: the
// bench's 60-byte chat prompt, seen before (a repeated prompt) — what a
// non-stream request of BenchmarkNonStream (proxy) pays.
func BenchmarkObserveSmall(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	tr, _ := New(Config{})
	tr.Observe(sse.ProtocolChat, body, t0)
	b.ReportAllocs()
	for b.Loop() {
		tr.Observe(sse.ProtocolChat, body, t0)
	}
}
