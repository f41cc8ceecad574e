package histo

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBatchLockNotFromSharedPrefill: on an engine without a batch lock
// whose concurrent prefills share its compute in arrival order
// (llama.cpp's slots, vLLM's chunked prefill), a request that arrived 1 ms
// after another gets its first output that one's prefill end plus its
// own prefill later, as under ollama's lock, so by the timing alone it
// looks like one that waited. x and e have 6,000 tokens each (300 ms
// alone by the 8 samples before), x's first output after 200 ms, e's
// 299 ms after that; x's stream ends 100 ms later still. On a fresh
// proxy (no lock votes yet, 1 slot learned) its own vote put 199 ms of
// queue on e, and with --engine-slots 2 the end of x's stream (e's first
// output 199 ms after it, 0.66 of its estimate) 299 ms. The engine
// reported its cached tokens, which ollama's OpenAI routes do not
// (lockable), and x's prefill end explains e's first output better than
// x's stream end (prefillExplains): e had a slot at once. A request
// whose head left at its admission is as clearly not behind the lock.
func TestBatchLockNotFromSharedPrefill(t *testing.T) {
	for _, c := range []struct {
		name    string
		xTokens int64
		hint    int
		cached  int64 // -1: not reported
		head    float64
	}{
		{"6,000 and 6,000", 6000, 0, 0, 0},
		{"6,000 and 6,000, --engine-slots 2", 6000, 2, 0, 0},
		{"2,000 and 6,000", 2000, 0, 0, 0},
		{"2,000 and 6,000, --engine-slots 2", 2000, 2, 0, 0},
		{"head at admission, no cached count", 6000, 0, -1, 100001.5},
		{"head at admission, no cached count, --engine-slots 2", 6000, 2, -1, 100001.5},
	} {
		r, _, _ := newTest(t, Config{EngineSlots: c.hint})
		for i := range 8 { // 2,000 tokens in 100 ms, alone
			tr := served(float64(i*10000), float64(i*10000+100), float64(i*10000+150), 0)
			tr.CachedTokens, tr.Prefix.Tracked = c.cached, true // new tokens known: by the count, else no prefix reuse
			r.Record(&tr)
		}
		x := served(100000, 100200, 100300, 0)
		x.PromptTokens, x.CachedTokens, x.Prefix.Tracked, x.ID = c.xTokens, c.cached, true, 100
		e := served(100001, 100499, 100600, 1)
		e.PromptTokens, e.CachedTokens, e.Prefix.Tracked, e.ID = 6000, c.cached, true, 101
		if c.head > 0 {
			x.Headers, e.Headers = at(100000.5), at(c.head)
		}
		r.FirstOutput(&x)
		r.Record(&x)
		r.Record(&e)
		rq := r.Recent(1)[0]
		require.Less(t, rq.Queue.Millis(), 25.0, "%s: queue %.1f ms (%s)", c.name, rq.Queue.Millis(), rq.QueueSource)
	}
}

// TestBatchLockLoneVoteStands: the same timeline from an engine that
// reports no cached count and sends its head with the first output
// (ollama's OpenAI routes) is a wait for the lock: e's own vote moves its
// queue to x's prefill end, as a fresh proxy's first burst against ollama
// needs (docs/queue-split.md "The batch lock").
func TestBatchLockLoneVoteStands(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	for i := range 8 {
		tr := served(float64(i*10000), float64(i*10000+100), float64(i*10000+150), 0)
		tr.Prefix.Tracked = true
		r.Record(&tr)
	}
	x := served(100000, 100200, 100300, 0)
	x.PromptTokens, x.Prefix.Tracked, x.ID = 6000, true, 100
	e := served(100001, 100499, 100600, 1)
	e.PromptTokens, e.Prefix.Tracked, e.ID = 6000, true, 101
	r.FirstOutput(&x)
	r.Record(&x)
	r.Record(&e)
	rq := r.Recent(1)[0]
	require.InDelta(t, 199, rq.Queue.Millis(), 1, "queue %.1f ms (%s)", rq.Queue.Millis(), rq.QueueSource)
}

// TestSlotWaitNotExplainedAwayUnderTheLock: a one-slot engine behind a
// too-large hint (--engine-slots 2), whose evidence is ollama's (no cached
// count, the head with the first output): e arrived 1 ms after x and got
// its first output 70% of its own prefill after x's stream ended. It
// waited for x's slot (queue 129 ms). A prefill end that explains its
// first output better (x's, at 100 ms) is another engine's story
// (prefillExplains is asked only when lockable says no lock); taken here,
// it put e's queue at 99 ms.
func TestSlotWaitNotExplainedAwayUnderTheLock(t *testing.T) {
	r, _, _ := newTest(t, Config{EngineSlots: 2})
	for i := range 8 { // 2,000 tokens in 100 ms, alone
		tr := served(float64(i*10000), float64(i*10000+100), float64(i*10000+150), 0)
		tr.Prefix.Tracked = true
		r.Record(&tr)
	}
	x := served(100000, 100100, 100130, 0)
	x.Prefix.Tracked, x.ID = true, 100
	e := served(100001, 100200, 100300, 1)
	e.Prefix.Tracked, e.ID = true, 101
	r.FirstOutput(&x)
	r.Record(&x)
	r.Record(&e)
	rq := r.Recent(1)[0]
	t.Logf("queue %.1f ms (%s)", rq.Queue.Millis(), rq.QueueSource)
	require.InDelta(t, 129, rq.Queue.Millis(), 25, "queue %.1f ms (%s)", rq.Queue.Millis(), rq.QueueSource)
}

// TestBatchLockNotFromAdmissionHead: a continuous-batching engine that
// sends its head at admission and reports no cached count (vLLM's
// default). e's first output came with y's (the same engine step) while
// a short prefill, x's, ran beside them: the shared-batch rule read a
// lock that made e wait for x (49 ms of queue, a review's trace), where
// the engine had started it at once. Its head, 649 ms before its first
// output, is not ollama's (lockable).
func TestBatchLockNotFromAdmissionHead(t *testing.T) {
	r, _, _ := newTest(t, Config{EngineSlots: 4})
	for i := range 8 { // 2,000 tokens in 100 ms, alone
		tr := served(float64(i*10000), float64(i*10000+100), float64(i*10000+150), 0)
		tr.Headers, tr.Prefix.Tracked = at(float64(i*10000)+0.5), true
		r.Record(&tr)
	}
	x := served(100000, 100050, 160000, 0) // a long answer: still in flight
	x.PromptTokens, x.Prefix.Tracked, x.ID, x.Headers = 1000, true, 100, at(100000.5)
	e := served(100001, 100650, 100700, 1)
	e.PromptTokens, e.Prefix.Tracked, e.ID, e.Headers = 6000, true, 101, at(100001.5)
	y := served(100001.2, 100651, 160000, 2)
	y.PromptTokens, y.Prefix.Tracked, y.ID, y.Headers = 6000, true, 102, at(100001.7)
	r.FirstOutput(&x)
	r.FirstOutput(&e)
	r.FirstOutput(&y)
	r.Record(&e)
	rq := r.Recent(1)[0]
	require.Less(t, rq.Queue.Millis(), 25.0, "queue %.1f ms (%s)", rq.Queue.Millis(), rq.QueueSource)
}
