package histo

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

var t0 = time.Date(2026, 10, 5, 11, 0, 0, 0, time.UTC)

// at is t0 plus ms milliseconds.
func at(ms float64) time.Time { return t0.Add(ms2d(ms)) }

// monotonic moves tr's stamps (taken relative to t0) onto the running
// clock, so that they carry monotonic readings as the proxy's do:
// time.Time.Sub takes a slower path without them.
func monotonic(tr proxy.Trace) proxy.Trace {
	base := time.Now()
	for _, p := range []*time.Time{&tr.Recv, &tr.Admit, &tr.Sent, &tr.Headers, &tr.FirstEvent,
		&tr.FirstOutput, &tr.FirstContent, &tr.LastToken, &tr.End, &tr.ClientDone} {
		if !p.IsZero() {
			*p = base.Add(p.Sub(t0))
		}
	}
	return tr
}

func ms2d(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// chat returns a successful streamed chat request that reasoned first:
// first output at 300 ms, first content at 1300 ms, end at 2300 ms, 201
// output tokens, 10,000 prompt tokens of which 2,000 cached, no
// engine-reported timing, no limiter, engine idle.
func chat() proxy.Trace {
	return proxy.Trace{
		ID: 7, Route: proxy.RouteChat, Method: "POST", Model: "qwen", Stream: true, Status: 200,
		ReqBytes: 40000, RespBytes: 9000,
		Recv: at(0), Admit: at(0), Sent: at(2), Headers: at(50), FirstEvent: at(60),
		FirstOutput: at(300), FirstContent: at(1300), LastToken: at(2290), End: at(2300), ClientDone: at(2301),
		Connect: ms2d(1.5),
		Events:  101, ReasoningEvents: 40, ContentEvents: 60, EmptyEvents: 1,
		PromptTokens: 10000, CompletionTokens: 201, CachedTokens: 2000, ReasoningTokens: 80, UsageSeen: true,
		ServerQueue: -1, ServerPrefill: -1,
	}
}

// fixedClock is a settable Config.Now.
type fixedClock struct{ t time.Time }

func (c *fixedClock) now() time.Time { return c.t }

// newTest returns a Recorder on its own registry with a fixed clock.
func newTest(t testing.TB, cfg Config) (*Recorder, *prometheus.Registry, *fixedClock) {
	t.Helper()
	clk := &fixedClock{t: t0}
	if cfg.Now == nil {
		cfg.Now = clk.now
	}
	reg := prometheus.NewRegistry()
	r, err := New(cfg, reg)
	require.NoError(t, err)
	return r, reg, clk
}

// idle returns a request that found the engine idle and prefilled
// uncached tokens at rate tokens/s with nothing cached.
func idle(uncached int64, rate float64) proxy.Trace {
	tr := chat()
	tr.PromptTokens, tr.CachedTokens = uncached, 0
	tr.Connect = 0
	ttfo := time.Duration(float64(uncached) / rate * float64(time.Second))
	tr.FirstOutput = tr.Recv.Add(ttfo)
	tr.FirstContent = tr.FirstOutput
	return tr
}
