package histo

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// tracked is served with its prompt's new tokens known (ollama reports
// no cached count; the prefix tracker saw no reuse), so the split has a
// point estimate of its prefill.
func tracked(arrive, first, last float64, inflight int, tokens int64, id uint64) *proxy.Trace {
	tr := served(arrive, first, last, inflight)
	tr.PromptTokens, tr.Prefix.Tracked, tr.ID = tokens, true, id
	return &tr
}

// warmed is a Recorder with --engine-slots hint that learned from eight
// cold prompts alone: 2,000 tokens in 100 ms.
func warmed(t *testing.T, hint int) *Recorder {
	r, _, _ := newTest(t, Config{EngineSlots: hint})
	for i := range 8 {
		r.Record(tracked(float64(i*10000), float64(i*10000+100), float64(i*10000+150), 0, 2000, uint64(i+1)))
	}
	return r
}

// TestWaitedWithLockTooLargeHint: ollama, 2 slots, with --engine-slots 4.
// a and b fill both slots (b waits under the batch lock for a's prefill);
// x takes a's slot at 400 and prefills 150 ms; e, behind them, takes b's
// slot at 410 and waits under the lock for x's prefill, then prefills its
// own 100 ms: its first output at 650 is 240 ms after the slot's end, past
// what its prefill can take, so waitedFor sees no wait. The hint's 4 slots
// would have started it at its arrival, under the lock at 200, a prefill
// of 450 ms for 100; 3 slots start it at 400, under the lock at x's end
// (550), and its prefill fits: it waited with fewer slots than the hint,
// and, the second request to, sets the hint aside. Before, it was split
// with 197 ms of queue (the engine's: 547) and the hint stood.
func TestWaitedWithLockTooLargeHint(t *testing.T) {
	r := warmed(t, 4)
	base := 100000.0
	a := tracked(base, base+100, base+400, 0, 2000, 100)
	b := tracked(base+1, base+200, base+410, 1, 2000, 101)
	x := tracked(base+2, base+550, base+700, 2, 3000, 102)
	e := tracked(base+3, base+650, base+800, 3, 2000, 103)
	for _, tr := range []*proxy.Trace{a, b, x, e} {
		r.Record(tr)
	}
	got := r.Recent(2)
	require.InDelta(t, 398, got[1].Queue.Millis(), 1, "x waited for a's slot")
	require.InDelta(t, 547, got[0].Queue.Millis(), 1, "e waited for b's slot, then for x's prefill")
	require.Equal(t, SlotsHintHigh, r.Slots().State)
}

// TestWaitedWithLockSharedBatches: ollama, 4 slots, with --engine-slots
// 6. a1's prefill holds the batch lock; a2–a4 take their slots at its end
// and share their batches (300 ms for three prompts of 100). w1 and w2,
// behind them, take the first two slots the a's let go (600, 601) and
// share theirs: first outputs at 800, twice their own prefill from there.
// The hint's 6 slots would have started w1 at its arrival, under the lock
// at 100 (a1's end: a2–a4 began there with it), a prefill of 700 ms for
// 100; no count's start fits its prefill, so nothing says the hint is
// wrong, but 4 slots, what the engine ran at once, start it at 600, the
// closest account of it: split so (the engine's 596 ms of queue; before,
// 96). The hint stands: a right hint's shared prefill looks the same.
func TestWaitedWithLockSharedBatches(t *testing.T) {
	for _, hint := range []int{6, 4} {
		r := warmed(t, hint)
		base := 100000.0
		trs := []*proxy.Trace{tracked(base, base+100, base+600, 0, 2000, 100)}
		for i := range 3 {
			trs = append(trs, tracked(base+1+float64(i), base+400, base+601+float64(i), 1+i, 2000, uint64(101+i)))
		}
		trs = append(trs, tracked(base+4, base+800, base+900, 4, 2000, 104), tracked(base+5, base+801, base+950, 5, 2000, 105))
		for _, tr := range trs {
			r.Record(tr)
		}
		got := r.Recent(2)
		require.InDelta(t, 596, got[1].Queue.Millis(), 1, "hint %d: w1 took a1's slot", hint)
		require.InDelta(t, 596, got[0].Queue.Millis(), 25, "hint %d: w2 took a2's slot", hint)
		s := r.Slots()
		require.Equal(t, SlotsHint, s.State, "hint %d", hint)
		require.Equal(t, Count(4), s.Learned, "hint %d", hint)
	}
}
