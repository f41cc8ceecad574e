package snapshot

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// referenceFile is a copy of shared/reference/anvil-benchmark-v1-example.json,
// a file the benchmark client wrote.
const referenceFile = "testdata/reference.json"

var t0 = time.Date(2026, 11, 29, 23, 5, 0, 123_000_000, time.UTC)

func ms2d(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// trace returns the i-th request of a synthetic workload: a streamed chat
// request that reasons first, with phases that vary with i so that every
// percentile differs. Every fifth request reports the engine's queue time
// (queue_source server), every seventh went through the proxy's limiter,
// and the others are split by the prefill-rate model once it has learned.
func trace(i int) proxy.Trace {
	f := float64(i)
	recv := t0.Add(time.Duration(i) * time.Second)
	at := func(ms float64) time.Time { return recv.Add(ms2d(ms)) }
	ttfo := 300 + 37*f
	tr := proxy.Trace{
		ID: uint64(i + 1), Route: proxy.RouteChat, Method: "POST", Model: "qwen", Stream: true, Status: 200,
		ReqBytes: 40000, RespBytes: 9000,
		Recv: recv, Admit: recv, Sent: at(2), Headers: at(40), FirstEvent: at(ttfo - 5),
		FirstOutput: at(ttfo), FirstContent: at(ttfo + 400 + 11*f), LastToken: at(ttfo + 2000 + 53*f), End: at(ttfo + 2001 + 53*f),
		ClientDone: at(ttfo + 2002 + 53*f),
		Connect:    ms2d(0.5),
		Events:     100 + i, ReasoningEvents: 40 + i, ContentEvents: 60, EmptyEvents: 2,
		PromptTokens: 10000 + 100*int64(i), CompletionTokens: 201 + 3*int64(i), CachedTokens: 2000 + 50*int64(i),
		ReasoningTokens: 80, UsageSeen: true,
		ServerQueue: -1, ServerPrefill: -1,
	}
	switch {
	case i%5 == 4:
		tr.ServerQueue = ms2d(20 + f)
	case i%7 == 6:
		tr.Limited, tr.Admit = true, at(15)
	}
	return tr
}

// failedTrace is a request the upstream broke after its first output.
func failedTrace(i int) proxy.Trace {
	tr := trace(i)
	tr.ErrSide, tr.ErrKind, tr.Truncated = proxy.SideUpstream, proxy.ErrUpstreamBroken, true
	tr.FirstContent, tr.LastToken, tr.ClientDone = time.Time{}, time.Time{}, time.Time{}
	tr.UsageSeen, tr.CompletionTokens = false, -1
	return tr
}

// clock is a settable histo.Config.Now.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newRecorder(t testing.TB, cfg histo.Config) (*histo.Recorder, *clock) {
	t.Helper()
	clk := &clock{t: t0}
	cfg.Now = clk.now
	cfg.SLOs = []histo.SLO{{Metric: "ttft", Threshold: 1200 * time.Millisecond}, {Metric: "tpot", Threshold: 20 * time.Millisecond}}
	r, err := histo.New(cfg, nil)
	require.NoError(t, err)
	return r, clk
}

// record records requests from..to−1 of the workload, failing every
// failEvery-th (0: none).
func record(r *histo.Recorder, from, to, failEvery int) {
	for i := from; i < to; i++ {
		tr := trace(i)
		if failEvery > 0 && i%failEvery == failEvery-1 {
			tr = failedTrace(i)
		}
		r.Record(&tr)
	}
}

// window records requests from..to−1 into a fresh Recorder and returns
// the window, which ends a minute after t0.
func window(t testing.TB, cfg histo.Config, from, to, failEvery int) *histo.Window {
	r, clk := newRecorder(t, cfg)
	record(r, from, to, failEvery)
	clk.t = t0.Add(time.Minute)
	return r.Rotate()
}

// build builds w's document with the model state of a Recorder that has not
// learned.
func build(t testing.TB, w *histo.Window) *Document {
	t.Helper()
	doc, err := Build(w, PrefillModel{TokensPerS: nan})
	require.NoError(t, err)
	return doc
}

// roundTrip writes doc as a file would and reads it back.
func roundTrip(t testing.TB, doc *Document) *Document {
	t.Helper()
	b, err := json.MarshalIndent(doc, "", "  ")
	require.NoError(t, err)
	back, err := Decode(b)
	require.NoError(t, err)
	return back
}

// generic decodes JSON into maps, keeping numbers as written.
func generic(t testing.TB, v any) map[string]any {
	t.Helper()
	b, ok := v.([]byte)
	if !ok {
		var err error
		b, err = json.Marshal(v)
		require.NoError(t, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out map[string]any
	require.NoError(t, dec.Decode(&out))
	return out
}

func readReference(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(referenceFile)
	require.NoError(t, err)
	return b
}
