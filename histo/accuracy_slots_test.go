package histo_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// The multi-slot accuracy tests (issue 23): engines of 2, 3 and 4 slots and
// continuous-batching engines of 8 and 32 sequences, bursts of 4 and 8
// requests (16 on 8 sequences, so that half of each burst waits) of
// mixed prompt and output lengths that stop by themselves (so that an
// engine that frees the slot at the stream's end takes its one more decode
// step), given no hint, the right --engine-slots and a wrong one. Bar: at
// least 95% of the requests of each slot count and kind of hint (a cell,
// 24 requests or more: one miss in 24 is the most 95% allows) within
// max(25 ms, 10%) of the engine's own record of their queue; a right hint
// is never reported wrong.

// slotCase is one engine and burst.
type slotCase struct {
	engine sim.Engine
	slots  int
	burst  int
	hint   int
	first  int // the first request's output tokens (naturalBurst)
}

func (c slotCase) String() string {
	return fmt.Sprintf("%v %d slots, burst %d from %d tokens, --engine-slots %d", c.engine, c.slots, c.burst, c.first, c.hint)
}

// slotEngine is the engine of a case: a slower decode than accEngine's
// (100 tokens/s: the stream-end step is 10 ms), the persona's cache,
// release and reporting.
func slotEngine(c slotCase) sim.Config {
	return sim.Config{
		Engine: c.engine, Slots: c.slots, PrefillTokensPerSec: 20000, DecodeTokensPerSec: 100, TokensPerEvent: 1,
		ExactLength: true, UnreportedCache: true, Seed: 1,
		// ollama's batch lock is learned only once the cost model can say a
		// request waited for another's prefill: TestBatchLockAccuracy, which
		// warms the model first. These bursts start from a fresh proxy.
		BatchLock: sim.LockNone,
	}
}

// naturalBurst is n requests of distinct cold prompts of 300 to 2,000
// tokens that stop by themselves after first, first+3, … tokens (a
// distinct length: its key in the records).
func naturalBurst(prefix string, n, first int) []burstReq {
	out := make([]burstReq, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i)
		tokens := 300 + (i*700)%1700
		out[i] = burstReq{id: id, body: msgsBody(coldPrompt(id, tokens), 4096), maxTokens: first + 3*i}
	}
	return out
}

// sendNatural posts r with its natural length set.
func sendNatural(t *testing.T, base string, r burstReq) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(r.body))
	require.NoError(t, err)
	req.Header.Set("X-Request-Id", r.id)
	req.Header.Set("X-Sim-Completion-Tokens", fmt.Sprint(r.maxTokens))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// slotTally counts requests within the bar.
type slotTally struct{ within, total int }

// runSlotCase sends one cold warm-up request (a first sample of the cold
// rate, as any engine's first minute gives), then the burst, and compares
// each request's queue with the engine's record.
func runSlotCase(t *testing.T, c slotCase) (slotTally, time.Duration, histo.SlotsSection) {
	s, err := sim.New(slotEngine(c))
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	defer hs.Close()
	st := newStack(t, hs.URL, proxy.Config{}, histo.Config{EngineSlots: c.hint})
	acc := &accStack{stack: st, sim: s}
	sendNatural(t, st.base, burstReq{id: "warm", body: msgsBody(coldPrompt("warm", 1000), 4096), maxTokens: 3})
	reqs := naturalBurst("burst", c.burst, max(c.first, 5))
	sendInOrder(t, s, len(reqs), func(i int) { sendNatural(t, st.base, reqs[i]) })
	var tally slotTally
	var worst time.Duration
	for _, r := range reqs {
		truth, ok := s.Truth(r.id)
		require.True(t, ok, r.id)
		rq := acc.record(t, r.maxTokens)
		got := time.Duration(rq.Queue)
		diff := (got - truth.Queue).Abs()
		tally.total++
		if rq.Queue >= 0 && diff <= queueTolerance(truth.Queue) {
			tally.within++
		} else {
			rate, n, _ := acc.rec.PrefillRate()
			t.Logf("%v: %s off the bar: queue %v (%s), truth %v; prefill %v, truth %v; prompt %d, reuse %v; rate %.0f/%d", c, r.id, got.Round(100*time.Microsecond), rq.QueueSource, truth.Queue.Round(100*time.Microsecond),
				time.Duration(rq.Prefill).Round(100*time.Microsecond), truth.Prefill.Round(100*time.Microsecond), rq.PromptTokens, rq.PrefixReuse, rate, n)
		}
		worst = max(worst, diff)
	}
	return tally, worst, acc.rec.Slots()
}

// Kinds of hint, the columns of docs/queue-split.md's table.
const (
	noHint    = "no hint"
	rightHint = "right hint"
	wrongHint = "wrong hint"
)

// slotCell is the unit of TestQueueAccuracySlots' bar.
type slotCell struct {
	slots int
	kind  string
}

// slotCases are TestQueueAccuracySlots' engines and bursts by cell. Each
// burst is sent twice, on fresh stacks, with output lengths from 5 and
// from 8 tokens (the ends fall elsewhere): 24 requests a cell. The right
// hint is given to llama.cpp (its head at slot start splits it) and to
// ollama (nothing but the timeline does); a wrong hint is too large for
// bursts of 4 (slots+2) and too small for bursts of 8 (slots−1), and a
// vLLM-like engine of 32 sequences is given 2 and 4.
func slotCases() map[slotCell][]slotCase {
	cells := map[slotCell][]slotCase{}
	add := func(kind string, c slotCase) {
		for _, first := range []int{5, 8} {
			c.first = first
			cell := slotCell{c.slots, kind}
			cells[cell] = append(cells[cell], c)
		}
	}
	for _, slots := range []int{2, 3, 4} {
		for _, burst := range []int{4, 8} {
			wrong := slots + 2
			if burst == 8 {
				wrong = slots - 1
			}
			add(noHint, slotCase{engine: sim.EngineOllama, slots: slots, burst: burst})
			add(rightHint, slotCase{engine: sim.EngineLlamaCpp, slots: slots, burst: burst, hint: slots})
			add(rightHint, slotCase{engine: sim.EngineOllama, slots: slots, burst: burst, hint: slots})
			add(wrongHint, slotCase{engine: sim.EngineOllama, slots: slots, burst: burst, hint: wrong})
		}
	}
	// A continuous-batching engine of many sequences: no burst waits.
	for _, burst := range []int{4, 8} {
		add(noHint, slotCase{engine: sim.EngineVLLM, slots: 32, burst: burst})
		add(rightHint, slotCase{engine: sim.EngineVLLM, slots: 32, burst: burst, hint: 32})
		add(wrongHint, slotCase{engine: sim.EngineVLLM, slots: 32, burst: burst, hint: burst / 2})
	}
	// One of 8 sequences, in bursts of twice that: half of each burst
	// waits for the first half's ends.
	add(noHint, slotCase{engine: sim.EngineVLLM, slots: 8, burst: 16})
	add(rightHint, slotCase{engine: sim.EngineVLLM, slots: 8, burst: 16, hint: 8})
	add(wrongHint, slotCase{engine: sim.EngineVLLM, slots: 8, burst: 16, hint: 12})
	add(wrongHint, slotCase{engine: sim.EngineVLLM, slots: 8, burst: 16, hint: 6})
	return cells
}

// TestQueueAccuracySlots: see the file's comment. The figures per cell go
// to the log (docs/queue-split.md quotes them). About 45 s without -race.
func TestQueueAccuracySlots(t *testing.T) {
	skipInaccurate(t)
	cells := slotCases()
	for _, kind := range []string{noHint, rightHint, wrongHint} {
		for _, slots := range []int{2, 3, 4, 8, 32} {
			cell := slotCell{slots, kind}
			var all slotTally
			var worst time.Duration
			for _, c := range cells[cell] {
				tally, w, sec := runSlotCase(t, c)
				all.within += tally.within
				all.total += tally.total
				worst = max(worst, w)
				if kind == rightHint {
					require.Equal(t, histo.SlotsHint, sec.State, "%v: a right hint is never reported wrong: %+v", c, sec)
				}
			}
			t.Logf("%s, %d slots: %d of %d within the bar (%.0f%%), worst error %v", kind, slots, all.within, all.total,
				100*float64(all.within)/float64(all.total), worst.Round(100*time.Microsecond))
			require.GreaterOrEqual(t, all.total, 24, "%s, %d slots", kind, slots)
			assert.GreaterOrEqual(t, float64(all.within), 0.95*float64(all.total), "%s, %d slots: %d of %d within the bar", kind, slots, all.within, all.total)
		}
	}
}

// TestAbandonedPrefillAccuracy: a client leaves during its prefill of a
// long prompt; the engine (ollama: the whole prompt; llama.cpp: the
// 2,048-token batch it is on) prefills on before it frees the slot. The
// request queued behind it waited for that: its queue is within the bar of
// the engine's truth, not read as a prefill of the whole wait (−16.2 s on
// ollama in one case).
func TestAbandonedPrefillAccuracy(t *testing.T) {
	skipInaccurate(t)
	for _, tc := range []struct {
		engine sim.Engine
		after  bool // the next request is sent when the client leaves (real-engine suite's shape), not queued before
	}{{sim.EngineOllama, false}, {sim.EngineLlamaCpp, false}, {sim.EngineOllama, true}} {
		engine := tc.engine
		name := engine.String()
		if tc.after {
			name += " next sent as the client leaves"
		}
		t.Run(name, func(t *testing.T) {
			c := slotCase{engine: engine, slots: 1}
			s, err := sim.New(slotEngine(c))
			require.NoError(t, err)
			hs := httptest.NewServer(s)
			defer hs.Close()
			st := newStack(t, hs.URL, proxy.Config{}, histo.Config{})
			acc := &accStack{stack: st, sim: s}
			for i := range 8 { // the first minute's cold prompts, 500 to 6,100 tokens: the cost model is ready
				id := fmt.Sprintf("warm-%d", i)
				sendNatural(t, st.base, burstReq{id: id, body: msgsBody(coldPrompt(id, 500+800*i), 4096), maxTokens: 2})
			}
			_, n, ready := acc.rec.PrefillRate()
			require.True(t, ready, "%d samples", n)
			// 6,000 tokens: 300 ms of prefill and more (the context). Its client leaves once the
			// next request is queued behind it.
			ctx, cancel := context.WithCancel(context.Background())
			before := enqueued(s)
			gone := make(chan struct{})
			go func() {
				defer close(gone)
				req, err := http.NewRequestWithContext(ctx, "POST", st.base+"/v1/chat/completions",
					strings.NewReader(msgsBody(coldPrompt("abandoned", 6000), 4096)))
				if err != nil {
					return
				}
				req.Header.Set("X-Request-Id", "abandoned")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			waitEnqueued(t, s, before)
			next := burstReq{id: "next", body: msgsBody(coldPrompt("next-one", 1000), 4096), maxTokens: 9}
			done := make(chan struct{})
			if tc.after {
				time.Sleep(50 * time.Millisecond) // in its prefill
				cancel()
				go func() { defer close(done); sendNatural(t, st.base, next) }()
			} else {
				go func() { defer close(done); sendNatural(t, st.base, next) }()
				waitEnqueued(t, s, before+1)
				time.Sleep(50 * time.Millisecond) // in its prefill
				cancel()
			}
			<-gone
			<-done
			truth, ok := s.Truth("next")
			require.True(t, ok)
			rq := acc.record(t, next.maxTokens)
			got := time.Duration(rq.Queue)
			t.Logf("next: queue %v (%s), truth %v; prefill %v, truth %v", got.Round(100*time.Microsecond), rq.QueueSource,
				truth.Queue.Round(100*time.Microsecond), time.Duration(rq.Prefill).Round(100*time.Microsecond), truth.Prefill.Round(100*time.Microsecond))
			require.Greater(t, truth.Queue, 100*time.Millisecond, "the engine prefilled on after the client left")
			require.LessOrEqual(t, (got - truth.Queue).Abs(), queueTolerance(truth.Queue))
		})
	}
}

// TestHeadSlotStartAccuracy: llama.cpp sends its response head when a slot
// starts the prompt. After a few bursts the proxy has learned it from the
// traffic, and splits by the head: the 15 ms prompt-cache restore of a
// slot switch is no longer read as queue (as the engine's prompt_ms alone
// reads it), and every request of the last burst is within the bar.
func TestHeadSlotStartAccuracy(t *testing.T) {
	skipInaccurate(t)
	c := slotCase{engine: sim.EngineLlamaCpp, slots: 2}
	s, err := sim.New(slotEngine(c))
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	defer hs.Close()
	st := newStack(t, hs.URL, proxy.Config{}, histo.Config{})
	acc := &accStack{stack: st, sim: s}
	var last []burstReq
	for b := range 3 {
		last = naturalBurst(fmt.Sprintf("burst%d", b), 6, 5+20*b)
		sendInOrder(t, s, len(last), func(i int) { sendNatural(t, st.base, last[i]) })
	}
	require.Equal(t, histo.HeadSlotStart, acc.rec.Slots().ResponseHead, "%+v", acc.rec.Slots())
	var worst time.Duration
	for _, r := range last {
		truth, ok := s.Truth(r.id)
		require.True(t, ok)
		rq := acc.record(t, r.maxTokens)
		require.Equal(t, histo.SourceHeaders, rq.QueueSource, r.id)
		diff := (time.Duration(rq.Queue) - truth.Queue).Abs()
		worst = max(worst, diff)
		t.Logf("%s: queue %v, truth %v; prefill %v, truth %v + %v before it", r.id, time.Duration(rq.Queue).Round(100*time.Microsecond),
			truth.Queue.Round(100*time.Microsecond), time.Duration(rq.Prefill).Round(100*time.Microsecond), truth.Prefill.Round(100*time.Microsecond),
			truth.PrePrefill.Round(100*time.Microsecond))
		require.LessOrEqual(t, diff, queueTolerance(truth.Queue), "%s: queue %v, truth %v", r.id, time.Duration(rq.Queue), truth.Queue)
	}
	t.Logf("last burst by the head: worst error %v", worst.Round(100*time.Microsecond))
}

// TestBatchLockAccuracy: ollama's runner lets no slot start while a
// prefill batch computes (sim.LockPrefill), and simultaneous arrivals
// reach its queue in random order (sim.Config.ArrivalJitter). After the
// first minute's cold prompts (the cost model is ready), bursts on four
// free slots: the proxy learns the lock from the traffic, counts the wait
// for the prefill in progress as queue, and orders near-simultaneous
// arrivals by their first outputs. The last bursts are within the bar.
func TestBatchLockAccuracy(t *testing.T) {
	skipInaccurate(t)
	for _, tc := range []struct {
		jitter     time.Duration
		holderLast bool // the long prompt that holds the lock has the longest answer: it ends, and is recorded, last
		shared     bool // the prefills that start together share the engine (sim.Config.SharedPrefill), as llamarunner's do
	}{{0, false, false}, {2 * time.Millisecond, false, false}, {0, true, false}, {0, false, true}, {2 * time.Millisecond, false, true}} {
		jitter := tc.jitter
		t.Run(fmt.Sprintf("jitter %v holder ends last %v shared %v", jitter, tc.holderLast, tc.shared), func(t *testing.T) {
			cfg := slotEngine(slotCase{engine: sim.EngineOllama, slots: 4})
			cfg.BatchLock, cfg.ArrivalJitter, cfg.SharedPrefill = sim.LockPrefill, jitter, tc.shared
			s, err := sim.New(cfg)
			require.NoError(t, err)
			hs := httptest.NewServer(s)
			defer hs.Close()
			st := newStack(t, hs.URL, proxy.Config{}, histo.Config{})
			acc := &accStack{stack: st, sim: s}
			for i := range 8 {
				id := fmt.Sprintf("warm-%d", i)
				sendNatural(t, st.base, burstReq{id: id, body: msgsBody(coldPrompt(id, 500+800*i), 4096), maxTokens: 2})
			}
			var tally slotTally
			var worst time.Duration
			for b := range 4 {
				// In order: a long prompt first (2,000 tokens: 100 ms of
				// prefill), then short ones (300–500 tokens) that arrive
				// during its prefill. At once: 1,000-token prompts, the
				// engine serves them in an order of its own; lengths one
				// token apart, so that the one that took the lock ends, and is
				// recorded, before those that waited for it (see
				// docs/queue-split.md "Limits").
				reqs := make([]burstReq, 4)
				for i := range reqs {
					id := fmt.Sprintf("burst%d-%d", b, i)
					tokens := 300 + 100*i
					if i == 0 {
						tokens = 2000
					}
					if jitter > 0 {
						tokens = 1000
					}
					reqs[i] = burstReq{id: id, body: msgsBody(coldPrompt(id, tokens), 4096), maxTokens: 5 + 20*b + 3*i}
					switch {
					case jitter > 0:
						reqs[i].maxTokens = 40 + 20*b + i
					case tc.holderLast && i == 0:
						// Recorded after those that waited for its
						// prefill: they see it only by its first output,
						// live (proxy.FirstOutputObserver).
						reqs[i].maxTokens = 90 + 20*b
					}
				}
				var wg sync.WaitGroup
				for _, r := range reqs {
					wg.Add(1)
					go func() { defer wg.Done(); sendNatural(t, st.base, r) }()
					if jitter == 0 {
						time.Sleep(5 * time.Millisecond) // in order: the proxy's order is the engine's
					}
				}
				wg.Wait()
				if b < 2 {
					continue // learning
				}
				for _, r := range reqs {
					truth, ok := s.Truth(r.id)
					require.True(t, ok)
					rq := acc.record(t, r.maxTokens)
					diff := (time.Duration(rq.Queue) - truth.Queue).Abs()
					worst = max(worst, diff)
					tally.total++
					if rq.Queue >= 0 && diff <= queueTolerance(truth.Queue) {
						tally.within++
					}
					t.Logf("%s: queue %v (%s), truth %v; prefill %v, truth %v", r.id, time.Duration(rq.Queue).Round(100*time.Microsecond), rq.QueueSource,
						truth.Queue.Round(100*time.Microsecond), time.Duration(rq.Prefill).Round(100*time.Microsecond), truth.Prefill.Round(100*time.Microsecond))
				}
			}
			t.Logf("jitter %v: %d of %d within the bar, worst error %v", jitter, tally.within, tally.total, worst.Round(100*time.Microsecond))
			// Simultaneous arrivals reach the engine's queue in an order
			// the proxy cannot see and learns only from first outputs: one
			// swapped pair of 8 fails about 1 run in 8 at the 90% bar. In
			// order, one request of 8 may miss by a few milliseconds on a
			// busy host (27.7 and 27.9 ms against the 25 ms bar in sessions
			// 8 and 11, docs/queue-split.md; a fresh-clone CI run of session
			// 19 failed here): a rule that breaks misses several.
			bar := 0.85
			if jitter > 0 {
				bar = 0.75
			}
			require.GreaterOrEqual(t, float64(tally.within), bar*float64(tally.total))
		})
	}
}
