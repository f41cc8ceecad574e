package histo

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// TestWholeSplit: an answer sent whole is split by the engine's durations
// (queue total − prefill − decode, prefill the engine's), with the
// limiter's wait added, bounded by the upstream time the proxy saw; a
// stream, or a whole answer without its prefill or decode, is not; with
// no total (llama.cpp) the upstream time is the total.
func TestWholeSplit(t *testing.T) {
	t0 := time.Now()
	whole := func(total, prefill, decode time.Duration, e2e time.Duration) *proxy.Trace {
		return &proxy.Trace{Recv: t0, Admit: t0.Add(5 * time.Millisecond), Connect: time.Millisecond, End: t0.Add(e2e),
			ServerTotal: total, ServerPrefill: prefill, ServerDecode: decode, ServerQueue: -1}
	}
	ms := time.Millisecond
	sp, ok := wholeSplit(whole(300*ms, 100*ms, 150*ms, 320*ms))
	require.True(t, ok)
	require.Equal(t, split{Queue: 55 * ms, Prefill: 100 * ms, Source: SourceServerPrefill, OK: true}, sp)

	// total over what the proxy saw (another clock's rounding): the queue
	// is at most the upstream time less prefill and decode.
	sp, _ = wholeSplit(whole(400*ms, 100*ms, 150*ms, 300*ms))
	require.Equal(t, 5*ms+44*ms, sp.Queue)
	// durations that leave nothing: queue 0, never negative.
	sp, _ = wholeSplit(whole(200*ms, 100*ms, 150*ms, 300*ms))
	require.Equal(t, 5*ms, sp.Queue)

	for name, tr := range map[string]*proxy.Trace{
		"stream":     {Stream: true, Recv: t0, End: t0.Add(time.Second), ServerTotal: ms, ServerPrefill: ms, ServerDecode: ms},
		"no prefill": whole(300*ms, -1, 150*ms, time.Second),
		"no decode":  whole(300*ms, 100*ms, -1, time.Second),
	} {
		_, ok := wholeSplit(tr)
		require.False(t, ok, name)
	}
	// No total (llama.cpp): the upstream time the proxy saw is the total.
	sp, _ = wholeSplit(whole(-1, 100*ms, 150*ms, 320*ms))
	require.Equal(t, 5*ms+64*ms, sp.Queue)

	// Through evidenceSplit: a whole answer is split, not left as none.
	sp, done := evidenceSplit(whole(300*ms, 100*ms, 150*ms, 320*ms), false)
	require.True(t, done)
	require.Equal(t, SourceServerPrefill, sp.Source)
	sp, _ = evidenceSplit(whole(300*ms, 100*ms, -1, 320*ms), false)
	require.Equal(t, noSplit, sp)
}
