package prefix

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/anvilproxy/anvilproxy/sse"
	"github.com/stretchr/testify/require"
)

// words returns n bytes of pseudo-random prose with code-like lines.
func words(r *rand.Rand, n int) string {
	vocab := []string{"func", "return", "the", "error", "if", "nil", "value", "parse", "request", "for", "range", "cache", "prefix", "engine", "token", "123", "2025", "\n", "\t", "{", "}", "(", ")", "x", "len"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(vocab[r.IntN(len(vocab))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

func chatBody(t testing.TB, system string, msgs ...string) []byte {
	t.Helper()
	all := []map[string]string{{"role": "system", "content": system}}
	for i, m := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		all = append(all, map[string]string{"role": role, "content": m})
	}
	b, err := json.Marshal(map[string]any{"model": "m", "messages": all})
	require.NoError(t, err)
	return b
}

func TestIndexStaysUnderCap(t *testing.T) {
	const capBytes = 1 << 20
	tr := newTracker(t, Config{MaxIndexBytes: capBytes})
	r := rand.New(rand.NewPCG(1, 2))
	bodies := make([][]byte, 60)
	for i := range bodies {
		bodies[i] = chatBody(t, words(r, 20<<10), words(r, 30<<10), words(r, 200), words(r, 10<<10))
		res := tr.Observe(sse.ProtocolChat, bodies[i], t0)
		require.True(t, res.Tracked)
		s := tr.Stats()
		require.LessOrEqual(t, s.IndexBytes, int64(capBytes))
		require.Equal(t, int64(capBytes), s.IndexCapBytes)
	}
	s := tr.Stats()
	require.NotZero(t, s.Evictions)
	require.Greater(t, s.IndexBytes, int64(capBytes/2), "eviction keeps the index full, not empty")

	// The newest prompt is remembered, the oldest is gone.
	require.Equal(t, 1.0, tr.Observe(sse.ProtocolChat, bodies[len(bodies)-1], t0).Reuse)
	require.Less(t, tr.Observe(sse.ProtocolChat, bodies[0], t0).Reuse, 0.01)
}

func TestIndexTinyCap(t *testing.T) {
	// A cap smaller than one prompt keeps nothing, and says so.
	tr := newTracker(t, Config{MaxIndexBytes: 100, VolatilePatterns: []string{`\d+`}})
	c := newConv(task)
	for i := range 3 {
		c.turn(i + 1)
		r := tr.Observe(sse.ProtocolChat, c.body(t), t0)
		require.Zero(t, r.ReusableBytes)
		s := tr.Stats()
		require.LessOrEqual(t, s.IndexBytes, int64(100))
		require.Zero(t, s.IndexNodes)
	}
}

func TestIndexAccountingMatchesHeap(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("measures the heap")
	}
	heap := func() int64 {
		runtime.GC()
		runtime.GC() // and the pool's victim cache
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	r := rand.New(rand.NewPCG(3, 4))
	var bodies [][]byte
	for range 150 {
		c := newConv(words(r, 100))
		c.system = words(r, 8<<10)
		for j := range 30 {
			c.turn(j)
		}
		bodies = append(bodies, c.body(t))
	}
	tr := newTracker(t, Config{})
	for _, b := range bodies[:2] { // warm the pool and the maps' first tables
		tr.Observe(sse.ProtocolChat, b, t0)
	}
	before, acc := heap(), tr.Stats().IndexBytes
	for _, b := range bodies[2:] {
		tr.Observe(sse.ProtocolChat, b, t0)
	}
	grew, accounted := heap()-before, tr.Stats().IndexBytes-acc
	runtime.KeepAlive(bodies)
	t.Logf("heap grew %d bytes, index accounted %d", grew, accounted)
	require.InDelta(t, 1, float64(accounted)/float64(grew), 0.25)
	runtime.KeepAlive(tr)
}

func TestConcurrentObserve(t *testing.T) {
	tr := newTracker(t, Config{MaxIndexBytes: 256 << 10, VolatilePatterns: []string{`\d+`}})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newConv(fmt.Sprintf("Task %d: make the integration tests pass on arm64.", g))
			for i := range 25 {
				c.turn(i + 1)
				if i%7 == 3 {
					c.system = systemPrompt(fmt.Sprintf("2025-06-01T10:%02d:00Z", i))
				}
				r := tr.Observe(sse.ProtocolChat, c.body(t), t0)
				tr.Cache(&r, r.PromptBytes/4, r.ReusableTokensEst)
				tr.RecentDrifts(3)
				tr.Stats()
			}
		}()
	}
	wg.Wait()
	s := tr.Stats()
	require.Equal(t, uint64(100), s.Tracked)
	require.LessOrEqual(t, s.IndexBytes, s.IndexCapBytes)
}
