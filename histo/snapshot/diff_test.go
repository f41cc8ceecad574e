package snapshot

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// load is a synthetic workload for the gate: n requests whose queue,
// prefill and decode are drawn around the given means (±30%, seeded), with
// the engine reporting its queue and prefill (queue_source server) so that
// the phases are exactly what is drawn.
type load struct {
	n                   int
	seed                uint64
	queueMs, prefillMs  float64
	tpotMs, cachedShare float64
	retries, drifts     int // per 100 requests
}

func (l load) doc(t *testing.T) *Document {
	t.Helper()
	rng := rand.New(rand.NewPCG(l.seed, 7))
	jit := func(m float64) float64 { return m * (0.7 + 0.6*rng.Float64()) }
	r, clk := newRecorder(t, histo.Config{})
	clk.t = t0
	r.Rotate()
	for i := range l.n {
		q, p, tpot := jit(l.queueMs), jit(l.prefillMs), jit(l.tpotMs)
		recv := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		at := func(ms float64) time.Time { return recv.Add(ms2d(ms)) }
		first := q + p
		const out = 200
		tr := proxy.Trace{
			ID: uint64(i + 1), Route: proxy.RouteChat, Method: "POST", Model: "qwen", Stream: true, Status: 200,
			Recv: recv, Admit: recv, Sent: at(1), Headers: at(2), FirstEvent: at(first), FirstOutput: at(first), FirstContent: at(first),
			LastToken: at(first + tpot*(out-1)), End: at(first + tpot*(out-1) + 1), ClientDone: at(first + tpot*(out-1) + 2),
			Events: out, ContentEvents: out, PromptTokens: 10000, CompletionTokens: out,
			CachedTokens: int64(10000 * l.cachedShare * (0.9 + 0.2*rng.Float64())), UsageSeen: true,
			ServerQueue: ms2d(q), ServerPrefill: ms2d(p),
		}
		r.Record(&tr)
	}
	clk.t = t0.Add(time.Duration(l.n)*100*time.Millisecond + time.Second)
	doc := build(t, r.Rotate())
	// The retry and prefix sections as the proxy writes them, from counts.
	rs, err := json.Marshal(histo.RetrySection{Attempts: int64(l.n), LogicalRequests: int64(l.n) * 100 / int64(100+l.retries), Retries: int64(l.n * l.retries / 100)})
	require.NoError(t, err)
	ps, err := json.Marshal(histo.PrefixSection{Tracked: int64(l.n), Drifts: int64(l.n * l.drifts / 100)})
	require.NoError(t, err)
	doc.Anvilproxy.Retry, doc.Anvilproxy.Prefix = rs, ps
	return roundTrip(t, doc)
}

var baseLoad = load{n: 400, seed: 1, queueMs: 20, prefillMs: 300, tpotMs: 10, cachedShare: 0.8, retries: 5, drifts: 2}

func compare(t *testing.T, base, cur load) *Diff {
	t.Helper()
	b, err := Merge(base.doc(t))
	require.NoError(t, err)
	c, err := Merge(cur.doc(t))
	require.NoError(t, err)
	d, err := Compare(b, c)
	require.NoError(t, err)
	return d
}

// TestDiffSameLoadIsNoise: the same workload drawn with another seed moves
// nothing beyond the noise.
func TestDiffSameLoadIsNoise(t *testing.T) {
	cur := baseLoad
	cur.seed = 2
	d := compare(t, baseLoad, cur)
	require.Empty(t, d.Moved, d.Verdict)
	require.Equal(t, "no phase moved beyond the noise", d.Verdict)
	for _, r := range d.Rows {
		for _, p := range r.Points {
			if r.Name != "amplification" && r.Name != "drift" {
				require.Equal(t, int64(400), p.BaseN, r.Name)
				require.True(t, p.Noise, "%s.%s %v → %v", r.Name, p.Stat, p.Base, p.Cur)
			}
		}
	}
}

// TestDiffQueueWithoutPrefillIsWaiting: the queue grows, prefill stays:
// waiting, not work.
func TestDiffQueueWithoutPrefillIsWaiting(t *testing.T) {
	cur := baseLoad
	cur.seed, cur.queueMs = 2, 500
	d := compare(t, baseLoad, cur)
	require.Contains(t, d.Moved, "queue.p90 up")
	require.NotContains(t, strings.Join(d.Moved, ","), "prefill")
	require.Contains(t, d.Verdict, "queue up with prefill flat: waiting, not work")
	require.NotContains(t, d.Verdict, "prefix")
	q := d.Point("queue", StatP50)
	require.InDelta(t, 20, float64(q.Base), 6)
	require.InDelta(t, 500, float64(q.Cur), 150)
	require.False(t, q.Noise)
}

// TestDiffPrefixChanged: prefill up, cache hit down, drift up: the prompt
// prefix changed.
func TestDiffPrefixChanged(t *testing.T) {
	cur := baseLoad
	cur.seed, cur.prefillMs, cur.cachedShare, cur.drifts = 2, 900, 0.3, 40
	d := compare(t, baseLoad, cur)
	require.Contains(t, d.Verdict, "prefill up with cache hit down and drift up: the prompt prefix changed")
	require.NotContains(t, d.Verdict, "waiting, not work")
	require.Contains(t, d.Moved, "drift.value up")
	require.Contains(t, d.Moved, "cache_hit.p90 down")
}

// TestDiffDecodeAndRetries: decode slower and more retries, each named.
func TestDiffDecodeAndRetries(t *testing.T) {
	cur := baseLoad
	cur.seed, cur.tpotMs, cur.retries = 2, 16, 60
	d := compare(t, baseLoad, cur)
	require.Contains(t, d.Verdict, "decode slower: the engine or its batch")
	require.Contains(t, d.Verdict, "retry amplification up: clients re-send more")
	require.Contains(t, d.Moved, "tokens_s.p90 down")
}

// TestDiffFewSamples: a p99 on 40 requests is marked, and a bound on it
// does not fail the gate; a p50 on 40 does.
func TestDiffFewSamples(t *testing.T) {
	base, cur := baseLoad, baseLoad
	base.n, cur.n, cur.seed, cur.queueMs = 40, 40, 2, 500
	d := compare(t, base, cur)
	p99 := d.Point("queue", StatP99)
	require.True(t, p99.FewSamples)
	require.Equal(t, int64(100), p99.NeedN)
	require.False(t, d.Point("queue", StatP50).FewSamples, "p50 needs 2")
	require.Equal(t, int64(10), d.Point("queue", StatP90).NeedN)

	b, err := ParseBound("queue.p99>+25%")
	require.NoError(t, err)
	r := d.Check(b)
	require.True(t, r.Holds)
	require.False(t, r.Fails, "too few samples for a p99")
	b, err = ParseBound("queue.p50 > +200ms")
	require.NoError(t, err)
	require.True(t, d.Check(b).Fails)
	b, err = ParseBound("queue.p50>+2s")
	require.NoError(t, err)
	require.False(t, d.Check(b).Holds, "about +480 ms, not +2 s")
}

// TestParseBound: the forms --fail-on accepts, and clear errors for the rest.
func TestParseBound(t *testing.T) {
	for expr, want := range map[string]Bound{
		"ttft.p99>+25%":       {Metric: "ttft", Stat: "p99", Op: ">", Value: 0.25, Relative: true},
		"e2e.p50>+200ms":      {Metric: "e2e", Stat: "p50", Op: ">", Value: 200},
		"e2e.p90>=1.5s":       {Metric: "e2e", Stat: "p90", Op: ">=", Value: 1500},
		"cache_hit.p50<-10%":  {Metric: "cache_hit", Stat: "p50", Op: "<", Value: -0.10, Relative: true},
		"cache_hit.p50<-5pp":  {Metric: "cache_hit", Stat: "p50", Op: "<", Value: -0.05},
		"amplification>+0.2":  {Metric: "amplification", Stat: "value", Op: ">", Value: 0.2},
		"decode.p50<-20tok/s": {Metric: "tokens_s", Stat: "p50", Op: "<", Value: -20},
		"drift>+5pp":          {Metric: "drift", Stat: "value", Op: ">", Value: 0.05},
	} {
		got, err := ParseBound(expr)
		require.NoError(t, err, expr)
		want.Expr = expr
		require.InDelta(t, want.Value, got.Value, 1e-12, expr)
		got.Value = want.Value
		require.Equal(t, want, got, expr)
	}
	for expr, msg := range map[string]string{
		"ttft>+25%":           "say which percentile",
		"ttft.p95>+25%":       "want METRIC.STAT OP CHANGE",
		"latency.p99>+25%":    `no metric "latency"`,
		"ttft.p99>+25":        "a change of ttft is in %, or ms, s or us",
		"cache_hit.p50<-10ms": "pp (percentage points)",
		"amplification.p99>1": "one figure",
		"ttft.p99=+25%":       "want METRIC.STAT OP CHANGE",
	} {
		_, err := ParseBound(expr)
		require.ErrorContains(t, err, msg, expr)
	}
}

// TestDiffRowsFromPhaseTable: the gate's rows keep the words they always
// had (scripts pass them to --fail-on), and a phase row takes its name,
// unit and direction from histo's table and answers to every name the
// table gives the phase; a phase the gate does not compare is no row.
func TestDiffRowsFromPhaseTable(t *testing.T) {
	require.Equal(t, []string{"queue", "prefill", "ttfo", "ttft", "tpot", "e2e", "tokens_s", "cache_hit", "amplification", "drift"}, DiffRowNames)
	for _, m := range diffPhases {
		ph := m.Phase()
		for _, name := range []string{ph.ShortName(), ph.Name, strings.TrimSuffix(ph.Key, "_ms"), ph.Label} {
			if name == "" || strings.Contains(name, " ") {
				continue
			}
			b, err := ParseBound(name + ".p99>+10%")
			require.NoError(t, err, name)
			require.Equal(t, ph.ShortName(), b.Metric, name)
			require.Equal(t, unitOf(m), b.Unit(), name)
		}
	}
	for _, name := range []string{"tok_s", "decode_tok_s", "decode", "time_to_first_output"} {
		_, err := ParseBound(name + ".p50<-10%")
		require.NoError(t, err, name)
	}
	require.Equal(t, "lower", betterOf(histo.MetricE2E))
	require.Equal(t, "higher", betterOf(histo.MetricDecodeRate))
	_, err := ParseBound(histo.MetricConnect.Phase().Name + ".p99>+10%")
	require.ErrorContains(t, err, "no metric", "connect is a phase the gate does not compare")
}

// TestWriteDiff: the table has a line per row and statistic, at most
// ReportWidth wide, and the verdict last.
func TestWriteDiff(t *testing.T) {
	cur := baseLoad
	cur.seed, cur.queueMs = 2, 500
	d := compare(t, baseLoad, cur)
	var b strings.Builder
	require.NoError(t, WriteDiff(&b, d))
	out := b.String()
	for _, l := range strings.Split(out, "\n") {
		require.LessOrEqual(t, len([]rune(l)), ReportWidth, l)
	}
	require.Regexp(t, `(?m)^queue +p90 +400/400 +\S+ ms +\S+ ms +\+\S+ ms +\+\d+%$`, out)
	require.Regexp(t, `(?m)^tpot +p50 +400/400 .* noise$`, out)
	require.Regexp(t, `(?m)^verdict: queue\.p\d\d up \+\d+%; queue up with prefill flat: waiting, not work`, out)
}
