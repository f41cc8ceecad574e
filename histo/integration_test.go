package histo_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// stack is a proxy in front of an upstream, recording into a real Recorder.
type stack struct {
	base  string
	rec   *histo.Recorder
	reg   *prometheus.Registry
	proxy *proxy.Proxy
}

func newStack(t *testing.T, upstream string, pcfg proxy.Config, hcfg histo.Config) *stack {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec, err := histo.New(hcfg, reg)
	require.NoError(t, err)
	pcfg.Upstream = upstream
	p, err := proxy.New(pcfg, zap.NewNop(), rec)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := p.Server()
	go srv.Serve(ln) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() { _ = srv.Shutdown() })
	return &stack{base: "http://" + ln.Addr().String(), rec: rec, reg: reg, proxy: p}
}

func simUpstream(t *testing.T, cfg sim.Config) string {
	t.Helper()
	_, url := simServer(t, cfg)
	return url
}

// simServer is simUpstream with the engine itself, whose Stats and Truth
// let a test wait for a request to reach it and compare with what it knows.
func simServer(t *testing.T, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	s, err := sim.New(cfg)
	require.NoError(t, err)
	hs := httptest.NewUnstartedServer(s)
	hs.Config = s.HTTPServer() // the sim's idle keep-alive close (5 s), as uvicorn's
	hs.Start()
	t.Cleanup(hs.Close)
	return s, hs.URL
}

// enqueued is the number of requests the engine has taken into a slot or
// its FIFO queue so far. Waiting for it to pass n before sending the next
// request orders the requests in the engine: requests that reach it within
// the same few microseconds could otherwise be queued in either order.
func enqueued(s *sim.Server) int64 {
	st := s.Stats()
	return int64(st.Active+st.Queued) + st.Completed
}

// waitEnqueued waits until the engine has enqueued more than n requests.
func waitEnqueued(t *testing.T, s *sim.Server, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return enqueued(s) > n }, 10*time.Second, 200*time.Microsecond,
		"the engine never received request %d", n+1)
}

// sendInOrder sends n requests at once, each in its own goroutine, the
// next only once the engine has enqueued the one before, so that their
// order at the engine is their index; it returns when all have ended.
func sendInOrder(t *testing.T, s *sim.Server, n int, send func(i int)) {
	t.Helper()
	before := enqueued(s)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { send(i) })
		waitEnqueued(t, s, before+int64(i))
	}
	wg.Wait()
}

func (s *stack) post(t *testing.T, body string, header ...string) {
	t.Helper()
	req, err := http.NewRequest("POST", s.base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
}

// last waits for the n-th recorded request and returns the most recent.
func (s *stack) last(t *testing.T, n int) histo.Request {
	t.Helper()
	var got []histo.Request
	require.Eventually(t, func() bool { got = s.rec.Recent(n); return len(got) >= n }, 5*time.Second, 5*time.Millisecond)
	return got[0] // newest first
}

func chatBody(prompt string, maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, maxTokens, prompt)
}

// TestPhasesMatchScriptedUpstream: an upstream with known emission times;
// every phase the proxy reports is within 2 ms of the truth taken at the
// upstream. A starved machine can delay a wake-up past 2 ms, so the check
// passes if one of three runs is within tolerance (CI must not flake).
func TestPhasesMatchScriptedUpstream(t *testing.T) {
	type truth struct{ arrive, reasoning, content, done time.Time }
	got := make(chan truth, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tt truth
		tt.arrive = time.Now()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		send := func(s string) time.Time {
			io.WriteString(w, s)
			w.(http.Flusher).Flush()
			return time.Now()
		}
		time.Sleep(60 * time.Millisecond) // "prefill"
		send(`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n")
		time.Sleep(15 * time.Millisecond)
		tt.reasoning = send(`data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}` + "\n\n")
		time.Sleep(40 * time.Millisecond)
		tt.content = send(`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n")
		time.Sleep(25 * time.Millisecond)
		send(`data: {"choices":[{"delta":{"content":"b"},"finish_reason":"stop"}]}` + "\n\n")
		time.Sleep(10 * time.Millisecond)
		send(`data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":11}}` + "\n\n")
		tt.done = send("data: [DONE]\n\n")
		got <- tt
	}))
	t.Cleanup(up.Close)
	s := newStack(t, up.URL, proxy.Config{}, histo.Config{})

	const tol = 2 * time.Millisecond
	var failures []string
	for run := 1; run <= 3; run++ {
		s.post(t, chatBody("x", 11))
		tt := <-got
		rq := s.last(t, run)
		ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
		var bad []string
		for _, c := range []struct {
			name      string
			got, want time.Duration
		}{
			// TTFO at the proxy also holds the two loopback hops to and
			// from the upstream, well under a millisecond.
			{"ttfo", ms(rq.TTFO.Millis()), tt.reasoning.Sub(tt.arrive)},
			{"ttft", ms(rq.TTFT.Millis()), tt.content.Sub(tt.arrive)},
			{"reasoning", ms(rq.Reasoning.Millis()), tt.content.Sub(tt.reasoning)},
			{"generation", ms(rq.Generation.Millis()), tt.done.Sub(tt.reasoning)},
			{"e2e", ms(rq.E2E.Millis()), tt.done.Sub(tt.arrive)},
		} {
			if d := c.got - c.want; d < -tol || d > tol {
				bad = append(bad, fmt.Sprintf("%s %v vs truth %v", c.name, c.got, c.want))
			}
		}
		require.Less(t, rq.TTFO.Millis(), rq.TTFT.Millis(), "reasoning first: TTFO < TTFT")
		require.EqualValues(t, 11, rq.OutputTokens)
		if len(bad) == 0 {
			return
		}
		failures = append(failures, strings.Join(bad, "; "))
	}
	t.Fatalf("no run within %v of the truth: %v", tol, failures)
}

// byOutput returns the record of the request that generated outputTokens
// (each request of a test asks for a different length), among the n most
// recent.
func (s *stack) byOutput(t *testing.T, n, outputTokens int) histo.Request {
	t.Helper()
	for _, rq := range s.rec.Recent(n) {
		if int(rq.OutputTokens) == outputTokens {
			return rq
		}
	}
	t.Fatalf("no record with %d output tokens", outputTokens)
	return histo.Request{}
}

// stampAt is the wall-clock time of one of rq's stamps (a span from its
// t_recv): a test compares the stamps of two requests with it.
func stampAt(rq histo.Request, stamp histo.Span) time.Time { return rq.Start.Add(time.Duration(stamp)) }

// TestQueueSourceServer: an engine that reports each request's queue time
// (vLLM's per-request metrics) is believed: the proxy's queue and prefill
// are the engine's own, for the request that waited for the only slot and
// for the one that held it.
func TestQueueSourceServer(t *testing.T) {
	engine, up := simServer(t, sim.Config{Slots: 1, PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 2000, Timings: sim.TimingVLLM})
	s := newStack(t, up, proxy.Config{}, histo.Config{EngineSlots: 1})
	var wg sync.WaitGroup
	// The first holds the only slot for 300 ms of prefill and 50 ms of
	// decode; the second is sent once the engine has taken the first, so it
	// waits for the slot unless the machine delays it by all of that.
	wg.Go(func() { s.post(t, chatBody("prompt 0", 100), "X-Request-Id", "held", "X-Sim-Prefill", "300ms") })
	waitEnqueued(t, engine, 0)
	wg.Go(func() { s.post(t, chatBody("prompt 1", 101), "X-Request-Id", "waited") })
	wg.Wait()
	s.last(t, 2)
	for id, tokens := range map[string]int{"held": 100, "waited": 101} {
		rq := s.byOutput(t, 2, tokens)
		truth, ok := engine.Truth(id)
		require.True(t, ok, id)
		require.Equal(t, histo.SourceServer, rq.QueueSource, id)
		require.True(t, rq.Queue.Known(), id)
		// The engine reports microseconds; the proxy adds no queue of its own.
		require.InDelta(t, float64(truth.Queue), float64(rq.Queue), float64(time.Microsecond), id)
		require.InDelta(t, float64(truth.Prefill), float64(rq.Prefill), float64(time.Microsecond), id)
	}
	held, _ := engine.Truth("held")
	waited, _ := engine.Truth("waited")
	require.GreaterOrEqual(t, held.Prefill, 300*time.Millisecond, "X-Sim-Prefill")
	require.Greater(t, waited.Queue, 20*time.Millisecond, "the second waited for the only slot (a premise, not the check)")
}

// TestQueueSourceLimiter: with --max-inflight 1, a request that arrives
// while another holds the only slot waits in the proxy's limiter until that
// one ends, and the wait is its queue (queue_source "limiter"). An upstream
// that holds the first request until the test lets it go orders the two;
// the bounds on the wait are causal, not guessed from a machine's speed.
func TestQueueSourceLimiter(t *testing.T) {
	var mu sync.Mutex
	upArrived := map[string]time.Time{} // when each request reached the upstream
	reached, release := make(chan struct{}, 2), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		mu.Lock()
		upArrived[id] = time.Now()
		mu.Unlock()
		reached <- struct{}{}
		if id == "first" {
			<-release
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}`+"\n\n"+
			`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`+"\n\n"+"data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	s := newStack(t, up.URL, proxy.Config{MaxInflight: 1}, histo.Config{})

	var wg sync.WaitGroup
	wg.Go(func() { s.post(t, chatBody("prompt 0", 1), "X-Request-Id", "first") })
	<-reached // the first holds the only slot, at the upstream
	wg.Go(func() { s.post(t, chatBody("prompt 1", 1), "X-Request-Id", "second") })
	require.Eventually(t, func() bool { return s.proxy.Inflight() == 2 }, 10*time.Second, 100*time.Microsecond,
		"the second reaches the proxy, whose only slot is taken")
	const hold = 50 * time.Millisecond
	time.Sleep(hold) // the wait to measure: a sleep only ever overruns
	close(release)
	wg.Wait()

	rqs := s.rec.Recent(2)
	require.Len(t, rqs, 2)
	first, second := rqs[0], rqs[1]
	if first.ID > second.ID { // IDs follow arrival
		first, second = second, first
	}
	for _, rq := range rqs {
		require.Equal(t, histo.SourceLimiter, rq.QueueSource)
		require.Equal(t, rq.ProxyQueue, rq.Queue, "the limiter's wait is the whole queue")
		require.Equal(t, rq.Stamps.Admit, rq.ProxyQueue, "t_admit − t_recv")
	}
	at := stampAt
	const slack = time.Millisecond // Start is wall clock, the stamps monotonic
	// The first was admitted at once: before it reached the upstream.
	require.False(t, at(first, first.Stamps.Admit).After(upArrived["first"].Round(0).Add(slack)))
	// The second waited at least as long as the first was held, was let in
	// only once the first had ended, and before it reached the upstream.
	require.GreaterOrEqual(t, time.Duration(second.Queue), hold)
	require.False(t, at(second, second.Stamps.Admit).Before(at(first, first.Stamps.End).Add(-slack)),
		"admitted at %v, before the first ended at %v", at(second, second.Stamps.Admit), at(first, first.Stamps.End))
	require.False(t, at(second, second.Stamps.Admit).After(upArrived["second"].Round(0).Add(slack)))
}

// TestQueueSourceOccupancy: without engine timing or a limiter, the
// engine's slots as the proxy saw them fill and free split a queued
// request's TTFO; an idle request queued 0, known, not guessed. The
// engine's own record of each request (sim.Truth) is the reference.
func TestQueueSourceOccupancy(t *testing.T) {
	cfg := sim.Config{Slots: 1, PrefillTokensPerSec: 40000, DecodeTokensPerSec: 2000, ExactLength: true}
	engine, err := sim.New(cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(engine)
	t.Cleanup(hs.Close)
	s := newStack(t, hs.URL, proxy.Config{}, histo.Config{})
	long := func(i int) string { return fmt.Sprintf("%d %s", i, strings.Repeat("token ", 700)) } // ~1000 tokens, 25 ms
	s.post(t, chatBody(long(0), 4), "X-Request-Id", "first")
	first := s.last(t, 1)
	require.Equal(t, histo.SourceOccupancy, first.QueueSource)
	require.Equal(t, histo.Span(0), first.Queue, "nothing was ahead of it")

	// burst-0 holds the only slot for 25 ms of prefill and 150 ms of
	// decode; burst-1 is sent once the engine has taken it, and waits.
	burst := []struct {
		id     string
		tokens int
	}{{"burst-0", 300}, {"burst-1", 101}}
	var wg sync.WaitGroup
	for i, b := range burst {
		wg.Go(func() { s.post(t, chatBody(long(100+i), b.tokens), "X-Request-Id", b.id) })
		waitEnqueued(t, engine, 1+int64(i))
	}
	wg.Wait()
	s.last(t, 3)
	for _, b := range burst {
		rq := s.byOutput(t, 2, b.tokens)
		truth, ok := engine.Truth(b.id)
		require.True(t, ok, b.id)
		require.Equal(t, histo.SourceOccupancy, rq.QueueSource, b.id)
		require.InDelta(t, float64(truth.Queue), float64(rq.Queue), float64(25*time.Millisecond), b.id)
		require.InDelta(t, float64(truth.Prefill), float64(rq.Prefill), float64(25*time.Millisecond), b.id)
	}
	waited, _ := engine.Truth("burst-1")
	require.Greater(t, waited.Queue, 30*time.Millisecond, "burst-1 waited for burst-0 (a premise, not the check)")
}

// TestLabelFloodBounded: 10,000 distinct model names keep the series bounded.
func TestLabelFloodBounded(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	t.Cleanup(up.Close)
	s := newStack(t, up.URL, proxy.Config{}, histo.Config{})
	const names, workers = 10000, 8
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{}
			for i := w; i < names; i += workers {
				resp, err := c.Post(s.base+"/v1/chat/completions", "application/json",
					strings.NewReader(fmt.Sprintf(`{"model":"model-%d-%s"}`, i, strings.Repeat("z", i%7))))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	mfs, err := s.reg.Gather()
	require.NoError(t, err)
	series, models := 0, map[string]bool{}
	for _, mf := range mfs {
		series += len(mf.GetMetric())
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" {
					models[l.GetValue()] = true
				}
			}
		}
	}
	require.LessOrEqual(t, len(models), proxy.DefaultMaxModels+1, "learned models plus \"other\"")
	require.True(t, models[proxy.ModelOther])
	// Each route and model has 15 latency series (9 histograms, the queue
	// by 4 sources, connect warm and cold); the rest are a fixed set.
	require.Less(t, series, (proxy.DefaultMaxModels+1)*15+150, "series stay bounded")
}
