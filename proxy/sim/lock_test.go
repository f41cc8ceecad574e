package sim

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBatchLock: on four free slots, a request that arrives 100 ms into
// another's 1-second prefill starts at once on vLLM, and on ollama
// (LockPrefill) only when that prefill ends; a third arriving during the
// wait takes its slot together with the second, and its own truth says so.
func TestBatchLock(t *testing.T) {
	for _, tc := range []struct {
		engine Engine
		queue  [2]time.Duration // of the second and the third
	}{
		{EngineVLLM, [2]time.Duration{0, 0}},
		{EngineOllama, [2]time.Duration{901 * time.Millisecond, 801 * time.Millisecond}},
	} {
		t.Run(tc.engine.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = tc.engine
				cfg.Slots = 4
				cfg.PrefillTokensPerSec = 1000
				cfg.ContextSlowdown = -1
				v := startVirtual(t, cfg)
				done, _ := sendEvery(t, v, "lock", 100*time.Millisecond, []int{1000, 100, 100}, -1)
				for range 3 {
					<-done
				}
				first := truthOf(t, v.s, "lock0")
				require.Zero(t, first.Queue)
				for i, want := range tc.queue {
					require.Equal(t, want, truthOf(t, v.s, fmt.Sprintf("lock%d", i+1)).Queue, "request %d", i+1)
				}
			})
		})
	}
}

// TestArrivalJitter: requests sent at the same instant reach one slot's
// queue in an order that is not their sending order, and each one's wait
// before the queue is counted in its truth's queue.
func TestArrivalJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 1
		cfg.ArrivalJitter = 2 * time.Millisecond
		cfg.Seed = 3
		v := startVirtual(t, cfg)
		const n = 8
		done := make(chan struct{}, n)
		for i := range n {
			go func() {
				body := longPrompt(fmt.Sprintf("jit%d", i), 100, false)
				resp := v.post(t, context.Background(), "/v1/chat/completions", body, "X-Request-Id", fmt.Sprintf("jit%d", i))
				resp.Body.Close()
				done <- struct{}{}
			}()
			synctest.Wait() // each is in the engine (sleeping its jitter) before the next is sent
		}
		for range n {
			<-done
		}
		inOrder := true
		prev := time.Time{}
		for i := range n {
			tr := truthOf(t, v.s, fmt.Sprintf("jit%d", i))
			if tr.Admitted.Before(prev) {
				inOrder = false
			}
			prev = tr.Admitted
			require.Equal(t, tr.Admitted.Sub(tr.Arrived), tr.Queue)
		}
		require.False(t, inOrder, "the jitter reorders simultaneous arrivals")
	})
}

// TestSharedPrefillAbandoned: with SharedPrefill, the requests that took
// their slots together when the lock's prefill ended share the engine,
// and one whose client left during its prefill goes on sharing it: ollama
// prefills the whole prompt for nobody in the same batches. a (300
// tokens, 301 ms alone) and b (500, 501 ms) wait for lock0's 1,000-token
// prefill and then take 602 and 802 ms together; b's client leaves 100 ms
// in, and its slot stays busy 702 ms more, not the 401 ms of its work
// alone.
func TestSharedPrefillAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := sharedOllama()
		v := startVirtual(t, cfg)
		done, leave := sendEvery(t, v, "shared", 100*time.Millisecond, []int{1000, 300, 500}, 2)
		time.Sleep(901 * time.Millisecond) // at 1,101 ms: 100 ms into b's prefill
		leave()
		for range 3 {
			<-done
		}
		time.Sleep(time.Second) // past b's run-on, shared or alone
		synctest.Wait()
		a, b := truthOf(t, v.s, "shared1"), truthOf(t, v.s, "shared2")
		require.Equal(t, 602*time.Millisecond, a.Prefill, "a shares the engine with b")
		require.Equal(t, 100*time.Millisecond, b.Left.Sub(b.Admitted), "b's client left 100 ms into its prefill")
		require.Equal(t, 702*time.Millisecond, b.Abandoned, "b's prefill runs on shared")
	})
}

// TestSharedPrefillInOrder: without the lock, SharedPrefill computes the
// prefills in progress in the order they began, as llama.cpp fills its
// batches from its slots in order: b, arriving 100 ms into a's 1,001 ms
// prefill, has its slot at once (no queue) and its first output a's end
// plus its own 501 ms later.
func TestSharedPrefillInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineLlamaCpp
		cfg.Slots = 4
		cfg.PrefillTokensPerSec = 1000
		cfg.ContextSlowdown = -1
		cfg.SwitchCost = -1
		cfg.SharedPrefill = true
		v := startVirtual(t, cfg)
		done, _ := sendEvery(t, v, "order", 100*time.Millisecond, []int{1000, 500}, -1)
		for range 2 {
			<-done
		}
		a, b := truthOf(t, v.s, "order0"), truthOf(t, v.s, "order1")
		require.Zero(t, b.Queue, "a slot at once: no lock")
		require.Equal(t, 1001*time.Millisecond, a.Prefill)
		require.Equal(t, 1402*time.Millisecond, b.Prefill, "after a's prefill computed")
	})
}

// TestSharedPrefillInOrderAbandoned: in the in-order mode a prefill whose
// client leaves is judged by the work it did, not by its place in line. a
// (1,000 tokens, 1,001 ms) begins at 0, b (1,000) at 100 ms and c (500,
// 501 ms) at 200 ms; b computes from a's end at 1,001 ms. b's client
// leaves at 200 ms, before b computed anything: vLLM (stop) and llama.cpp
// (batch) drop b's turn and c computes from 1,001 ms (1,302 ms prefill,
// not the 2,303 of b's whole turn before it). Leaving at 1,101 ms, 100 ms
// into its compute, vLLM stops b there and llama.cpp finishes b's
// 256-token batch (257 ms) first. A prompt run-on (ollama's policy) keeps
// b's whole turn wherever b was.
func TestSharedPrefillInOrderAbandoned(t *testing.T) {
	for _, tc := range []struct {
		name      string
		engine    Engine
		abandon   AbandonMode
		leaveAt   time.Duration
		abandoned time.Duration // b's run-on after its client left
		cPrefill  time.Duration
	}{
		{"stop-waiting", EngineVLLM, AbandonStop, 200 * time.Millisecond, 0, 1302 * time.Millisecond},
		{"stop-computing", EngineVLLM, AbandonStop, 1101 * time.Millisecond, 0, 1402 * time.Millisecond},
		{"batch-waiting", EngineLlamaCpp, AbandonBatch, 200 * time.Millisecond, 0, 1302 * time.Millisecond},
		{"batch-computing", EngineLlamaCpp, AbandonBatch, 1101 * time.Millisecond, 157 * time.Millisecond, 1559 * time.Millisecond},
		{"prompt-waiting", EngineLlamaCpp, AbandonPrompt, 200 * time.Millisecond, 1802 * time.Millisecond, 2303 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = tc.engine
				cfg.Abandon = tc.abandon
				cfg.BatchLock = LockNone
				cfg.BatchTokens = 256
				cfg.Slots = 4
				cfg.PrefillTokensPerSec = 1000
				cfg.ContextSlowdown = -1
				cfg.SwitchCost = -1
				cfg.SharedPrefill = true
				v := startVirtual(t, cfg)
				done, leave := sendEvery(t, v, "turn", 100*time.Millisecond, []int{1000, 1000, 500}, 1)
				time.Sleep(tc.leaveAt - 200*time.Millisecond)
				leave()
				for range 3 {
					<-done
				}
				time.Sleep(3 * time.Second) // past b's run-on
				synctest.Wait()
				a, b, c := truthOf(t, v.s, "turn0"), truthOf(t, v.s, "turn1"), truthOf(t, v.s, "turn2")
				require.Equal(t, 1001*time.Millisecond, a.Prefill)
				require.Equal(t, OutcomeAborted, b.Outcome)
				require.Equal(t, tc.leaveAt-100*time.Millisecond, b.Left.Sub(b.Admitted))
				require.Equal(t, tc.abandoned, b.Abandoned)
				require.Zero(t, c.Queue)
				require.Equal(t, tc.cPrefill, c.Prefill)
			})
		})
	}
}

// TestSharedPrefillGroupLeftEarly: a member of a group that shares the
// engine (SharedPrefill under the lock) whose client is gone before the
// group's last member registered runs on at the group's shared speed, as
// the others count its whole prefill in their shares. b (500 tokens, 501
// ms alone) is gone as its prefill starts; a (300, 301 ms) registers just
// after; ollama prefills b's whole prompt for nobody in their shared
// batches: 802 ms, what a's share counts, not b's 501 ms alone.
func TestSharedPrefillGroupLeftEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := sharedOllama()
		s, err := New(cfg)
		require.NoError(t, err)
		g := &prefillGroup{members: 2, done: make(chan struct{})}
		j := &job{id: "b", promptTokens: 500, knobs: knobs{prefill: -1}}
		res := &result{slot: 0, promptTokens: 500, group: g}
		ctx, leave := context.WithCancel(context.Background())
		leave()
		start := time.Now()
		errc := make(chan error, 1)
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		go func() { errc <- s.prefill(ctx, timer, j, res, 0, start) }()
		synctest.Wait() // b registered and saw its client gone
		s.mu.Lock()
		g.add(s.prefillTime(j, &result{promptTokens: 300}, 300)) // a
		s.mu.Unlock()
		require.ErrorIs(t, <-errc, errClientGone)
		require.Equal(t, start, res.left)
		require.Equal(t, 602*time.Millisecond, g.shared(301*time.Millisecond), "a counts b's share")
		require.Equal(t, 802*time.Millisecond, res.abandoned, "b runs on at the shared speed")
	})
}

// sendEvery sends one chat request of each prompt size in tokens, every
// gap from now (ids prefix0, prefix1, …), each on its own goroutine that
// signals done when its response is closed; the request at index abandon
// is sent with a context that leave cancels (-1: none). It returns after the last
// send, inside the synctest bubble.
func sendEvery(t *testing.T, v *virtualSim, prefix string, gap time.Duration, tokens []int, abandon int) (done chan struct{}, leave context.CancelFunc) {
	done = make(chan struct{}, len(tokens))
	ctx, leave := context.WithCancel(context.Background())
	for i, n := range tokens {
		if i > 0 {
			time.Sleep(gap)
		}
		go func() {
			defer func() { done <- struct{}{} }()
			c := context.Background()
			if i == abandon {
				c = ctx
			}
			id := fmt.Sprintf("%s%d", prefix, i)
			req := mustRequest(t, c, "http://sim/v1/chat/completions", longPrompt(id, n, false), "X-Request-Id", id)
			if resp, err := v.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
	}
	return done, leave
}

// sharedOllama is the ollama persona with 4 slots at 1,000 prompt tokens/s
// whose concurrent prefills share the engine (SharedPrefill, the lock).
func sharedOllama() Config {
	cfg := fast()
	cfg.Engine = EngineOllama
	cfg.Slots = 4
	cfg.PrefillTokensPerSec = 1000
	cfg.ContextSlowdown = -1
	cfg.SharedPrefill = true
	return cfg
}
