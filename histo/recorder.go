package histo

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
)

// Config configures a Recorder. The zero value is usable.
type Config struct {
	// SLOs are the latency objectives goodput is judged against, at most
	// one per metric. None means goodput is the share of requests that did
	// not fail.
	SLOs []SLO
	// EngineSlots is a hint of the upstream's concurrency (its slot count)
	// for the occupancy split. Evidence overrides it, with a warning: more
	// streams decoding at once than it allows, or requests that waited for
	// another's end with fewer in the engine. 0 means no hint: the count is
	// learned from observation alone (docs/queue-split.md).
	EngineSlots int
	// Log receives the warnings of the measurement (a slot hint that the
	// evidence contradicts). nil means none.
	Log *zap.Logger
	// RecentRequests is the number of requests /requests keeps. 0 means 512.
	RecentRequests int
	// MaxWindowRequests caps the per-request records of one window (about
	// 450 bytes each); requests beyond it are counted in the histograms and
	// in Window.Dropped. 0 means 100,000.
	MaxWindowRequests int
	// Inflight reports the requests in flight, for
	// anvilproxy_inflight_requests. nil leaves the gauge out.
	Inflight func() int64
	// Now is the clock for window boundaries. nil means time.Now.
	Now func() time.Time
	// RetryStats reads the proxy's retry tracker, for the rolling
	// anvilproxy_retry_amplification gauge. nil leaves the gauge out.
	RetryStats func() retry.Stats
	// MaxConversations caps the conversations whose agent-side time is
	// followed (least recently active evicted first); ConversationIdle
	// forgets a conversation idle for longer. 0 means 4096 and 30 min.
	MaxConversations int
	ConversationIdle time.Duration
	// SelfCheck configures the measurement-quality probe
	// (Recorder.SelfCheck), which the caller starts.
	SelfCheck selfcheck.Config
	// EngineLoad is the engine's running and waiting counts as scraped
	// from its /metrics, evidence for the split (SetEngineLoad sets it
	// later). nil means none.
	EngineLoad EngineLoad

	sloMetrics [maxSLOs]Metric // SLOs[i]'s row, resolved by setDefaults
}

func (c *Config) setDefaults() error {
	if c.EngineSlots < 0 || c.RecentRequests < 0 || c.MaxWindowRequests < 0 || c.MaxConversations < 0 || c.ConversationIdle < 0 {
		return errors.New("histo: EngineSlots, RecentRequests, MaxWindowRequests, MaxConversations and ConversationIdle must not be negative")
	}
	if err := c.SelfCheck.SetDefaults(); err != nil {
		return err
	}
	if len(c.SLOs) > maxSLOs {
		return fmt.Errorf("histo: at most %d SLOs, one per metric", maxSLOs)
	}
	seen := make(map[Metric]bool)
	for i, s := range c.SLOs {
		if err := s.validate(); err != nil {
			return err
		}
		m, _ := s.metric()
		if seen[m] {
			return fmt.Errorf("histo: slo %q: configured twice", s.Metric)
		}
		seen[m] = true
		c.sloMetrics[i] = m
	}
	c.SLOs = append([]SLO(nil), c.SLOs...)
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	c.RecentRequests = orDefault(c.RecentRequests, 512)
	c.MaxWindowRequests = orDefault(c.MaxWindowRequests, 100_000)
	c.MaxConversations = orDefault(c.MaxConversations, defaultMaxConversations)
	if c.ConversationIdle == 0 {
		c.ConversationIdle = defaultConversationIdle
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// orDefault returns v, or def when v is zero.
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Recorder implements proxy.Recorder. It is safe for concurrent use; Record,
// ObserveGap and ObserveRelay never block on I/O.
//
// Locking: the per-request histograms, the current window's records and
// tallies, and the recent ring share one mutex, held for well under a
// microsecond per request, so that Rotate ends a window atomically (a
// request is in one window's histograms and records, never split). The two
// per-event histograms have a mutex each, and the prefill model and the
// engine timeline (occ) have their own.
type Recorder struct {
	cfg    Config
	reg    *prometheus.Registry
	prom   *metrics
	retry  *retryMetrics
	prefix *driftMetrics
	ledger *ledgerMetrics
	conv   *convMetrics
	self   *selfcheck.Probe
	model  rateModel
	occ    occupancy
	head   headLearner
	cache  slotCache     // the engine's per-slot prompt cache, as the proxy can tell it
	load   engineLoadRef // the engine's /metrics counts (SetEngineLoad); nil without
	totals proxyTotals   // for the agreement with the engine's /metrics (engine.go)
	start  time.Time

	gap, relay *eventPair

	// totalMu guards the hist pairs' totals: Rotate folds the windows it
	// swapped out into them after it lets go of mu. Taken before mu.
	totalMu sync.Mutex

	mu     sync.Mutex
	cur    *window
	prev   tally                   // the previous window's, for the rolling goodput gauge
	total  tally                   // all finished windows'; the current one is added on read
	hist   [numRequestMetrics]pair // the windows under mu, the totals under totalMu
	recent recent
	convs  conversations
}

// New returns a Recorder that registers its metrics on reg. reg nil means
// a private registry (tests); the global default registry is never used.
func New(cfg Config, reg *prometheus.Registry) (*Recorder, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	r := &Recorder{cfg: cfg, reg: reg, prom: newMetrics(), start: cfg.Now()}
	r.cur = newWindow(r.start, 0)
	r.occ.slots = newSlotLearner(cfg.EngineSlots)
	r.occ.live.base = time.Now()
	if cfg.EngineLoad != nil {
		r.SetEngineLoad(cfg.EngineLoad)
	}
	r.convs = newConversations(cfg.MaxConversations, cfg.ConversationIdle)
	for m := range numRequestMetrics {
		r.hist[m] = newPair(m, r.prom.clamped[m])
	}
	r.gap = newEventPair(MetricInterEvent, r.prom.clamped[MetricInterEvent], r.start)
	r.relay = newEventPair(MetricOverhead, r.prom.clamped[MetricOverhead], r.start)
	r.recent.buf = make([]Request, cfg.RecentRequests)
	var retryCollectors, prefixCollectors, ledgerCollectors, convCollectors, selfCollectors []prometheus.Collector
	r.retry, retryCollectors = newRetryMetrics()
	r.prefix, prefixCollectors = newDriftMetrics()
	r.ledger, ledgerCollectors = newLedgerMetrics()
	r.conv, convCollectors = newConvMetrics()
	r.self, selfCollectors = selfcheck.New(cfg.SelfCheck)
	retryCollectors = slices.Concat(retryCollectors, prefixCollectors, ledgerCollectors, convCollectors, selfCollectors)
	if cfg.RetryStats != nil {
		retryCollectors = append(retryCollectors, amplificationGauge(cfg.RetryStats))
	}
	for _, c := range slices.Concat(r.prom.all, []prometheus.Collector{r.gap, r.relay}, r.gauges(), retryCollectors) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("histo: registering metrics: %w", err)
		}
	}
	return r, nil
}

// gauges are the collectors that read the Recorder at scrape time.
func (r *Recorder) gauges() []prometheus.Collector {
	var out []prometheus.Collector
	goodput := func(label string, i int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "anvilproxy_goodput_ratio",
			Help:        "Share of inference requests over the current and previous window that did not fail and met the SLO (slo=\"all\": every SLO).",
			ConstLabels: prometheus.Labels{"slo": label},
		}, func() float64 { return r.rollingRatio(i) })
	}
	for i, s := range r.cfg.SLOs {
		out = append(out, goodput(s.Metric, i))
	}
	out = append(out, goodput("all", -1))
	if f := r.cfg.Inflight; f != nil {
		out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "anvilproxy_inflight_requests",
			Help: "Requests being served by the proxy.",
		}, func() float64 { return float64(f()) }))
	}
	return out
}

// Record takes one finished request: counters and a /requests record for
// every route; for inference routes the queue/prefill split, the
// Prometheus and HDR histograms, goodput, the window's record and the
// prefill model. It keeps no reference to tr.
func (r *Recorder) Record(tr *proxy.Trace) {
	r.prom.count(tr)
	if !tr.Route.Generates() {
		r.cache.record(slotTurn{id: tr.ID, held: true})
		r.occ.passing(tr)
		r.recordOther(tr)
		return
	}
	r.retry.observe(tr)
	r.prefix.observe(&tr.Prefix)
	r.ledger.observe(&tr.Prefix)
	var rq Request
	rs := r.model.read()
	sp, place := r.split(tr, rs)
	v := evalPhases(tr, &sp)
	newRequest(&rq, tr, sp, &v)
	rq.Engine.setLoad(r.loadAt(tr))
	r.totals.add(&rq, !tr.Sent.IsZero())
	// An engine that reports its cached tokens, or whose head leaves at
	// admission (a shared prefix cache), is not replayed: its requests
	// only go by in the slot cache's admission order. One whose head is
	// not known yet is, so that the replay holds the first requests.
	head := r.head.current() // its lock once a request
	turn, perSlot := turnOf(tr, sp), perSlotCache(tr, head)
	turn.rs = rs
	turn.ran = turn.ran && tr.CachedTokens < 0 && head != HeadAdmission
	inferred, slotCached := inferCached(tr, sp, rs), int64(0)
	if perSlot {
		cached, alt, inFlight := r.cache.predict(&turn, boundsOf(r.Slots()))
		// The replay's count is the figure for requests whose prefill
		// was measured, once the cost model has a sample to judge by.
		if slotCached = refereed(cached, alt, inFlight, tr, sp, rs); rs.any && measuredPrefill(tr, sp) {
			inferred = slotCached
		}
	}
	rq.CacheInferredTokens = Count(inferred)
	set := r.prom.labeled(tr.Route, tr.Model)
	r.prom.tokens(&rq)
	if !rq.Failed {
		set.observe(&rq, &v)
	}
	r.add(&rq, tr, &v)
	// Learn after splitting, so a request is never judged by its own
	// sample. On an engine with a cache per slot the new tokens are the
	// slot cache's, and the sample scores its replays once placed.
	if prefill, ok := learnable(tr, sp, place); ok && r.model.learnable(tr) {
		switch {
		case perSlot:
			r.model.learnSample(float64(tr.PromptTokens-slotCached), float64(slotCached), prefill.Seconds(), rs)
			turn.score, turn.prefill = true, prefill.Seconds()
		case head == HeadUnknown && tr.CachedTokens < 0:
			cached := r.earlyCached(tr, &turn)
			r.model.learnSample(float64(tr.PromptTokens)-cached, cached, prefill.Seconds(), rs)
		default:
			r.model.learn(tr, prefill, rs)
		}
	}
	r.cache.record(turn)
}

// perSlotCache reports whether tr's new tokens are the slot cache's
// (slotcache.go) rather than the proxy's reuse, head being the learned
// head mode: the engine reported no cached tokens and its response head
// leaves late, at the slot's start or with the first output, as only
// llama.cpp's and ollama's do among the engines researched
// (docs/engines.md): they keep a cache per slot. vLLM, SGLang and TGI,
// whose heads leave at admission, share one prefix cache among all
// requests, which the proxy's reuse describes.
func perSlotCache(tr *proxy.Trace, head string) bool {
	if tr.CachedTokens >= 0 {
		return false
	}
	switch head {
	case HeadSlotStart, HeadFirstOutput:
		return true
	}
	return false
}

// earlyCached is the cached tokens tr's sample is learned at before the
// head mode tells which kind of prefix cache the engine keeps (a run's
// first requests, on an engine that reports no cached tokens): one shared
// by all requests (vLLM), where they are the proxy's reuse, or one per
// slot (perSlotCache), where they are the slot cache's (turn's), never
// more but for how each counts tokens. Where the slot cache's reading
// leaves more than scoreSlack times the new tokens of the shared one, the
// two kinds disagree, and the sample is learned at the slot cache's, the
// lesser: against ollama on 4 slots, three first turns of concurrent
// conversations, each prefilled whole in a slot of its own, were learned
// at the proxy's reuse (the shared system prompt, 625 of about 800
// tokens) as 2.9 ms a token where a cold one took 0.3, and a fourth then
// read as the system prompt's cache hit (+34% of ollama's reuse over its
// conversation, histo/testdata/ollama/agents-p4-s20run03.json).
func (r *Recorder) earlyCached(tr *proxy.Trace, turn *slotTurn) float64 {
	p := float64(tr.PromptTokens)
	shared, cached, _ := promptParts(tr, true)
	if shared*scoreSlack >= p {
		return cached // too little reused for either reading to matter
	}
	slot, _, _ := r.cache.predict(turn, boundsOf(r.Slots()))
	if p-float64(slot) > scoreSlack*shared {
		return float64(slot)
	}
	return cached
}

// learnable is the prefill time of tr the cost model may learn from: the
// split's when it rests on the engine's evidence or the timeline (a
// proven slot count), and the
// whole upstream time to first output when the rate model split a request
// that found nothing in flight (the engine was idle).
func learnable(tr *proxy.Trace, sp split, place placement) (time.Duration, bool) {
	switch sp.Source {
	case SourceServer, SourceServerPrefill, SourceHeaders, SourceLimiter:
		return sp.Prefill, sp.OK
	case SourceOccupancy:
		// Not from a split that rests on the model's own estimate, nor
		// on an unproven hint unless the request began at once all the
		// same: nothing was ahead, or it ran beside all that were.
		return sp.Prefill, sp.OK && !place.inferred && (place.ahead == 0 || place.streams > place.ahead || !place.unproven)
	case SourceModel, SourceNone:
		ttfo, ok := tr.TTFO()
		if ok && !place.ok && tr.InflightAtAdmit == 0 {
			pq, _ := tr.ProxyQueue()
			return ttfo - pq - tr.Connect, true
		}
	}
	return 0, false
}

// warnSlots logs that the slot hint and the evidence disagree.
func (r *Recorder) warnSlots() {
	s := r.Slots()
	r.cfg.Log.Warn("--engine-slots disagrees with what the proxy observed; the queue/prefill split uses the observed count",
		zap.Int64("engine_slots", int64(s.Hint)), zap.Int64("observed", int64(s.Learned)),
		zap.Int("used", s.Effective), zap.String("state", s.State))
}

// add puts rq, whose phases are v, into the current window under the lock.
func (r *Recorder) add(rq *Request, tr *proxy.Trace, v *phaseValues) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur.retry.add(tr)
	r.cur.prefix.add(tr)
	r.cur.ledger.add(tr)
	r.cur.knee.add(rq, tr)
	turn := r.convs.add(tr, r.cur.conv.gen)
	r.cur.conv.add(turn)
	r.conv.observe(turn)
	rq.Index = int(r.cur.tally.requests)
	rq.Good = r.cur.tally.add(rq.Failed, v, r.cfg.SLOs, &r.cfg.sloMetrics)
	r.cur.cache.add(rq)
	if !rq.Failed {
		r.recordHDR(v)
	}
	if !r.cur.add(rq, r.cfg.MaxWindowRequests) {
		r.prom.dropped.Inc()
	}
	r.recent.put(rq)
}

// recordHDR records a successful request's evaluated phases. The caller
// holds r.mu.
func (r *Recorder) recordHDR(v *phaseValues) {
	for m, raw := range v {
		if h, ok := Metric(m).hdrValue(raw); ok {
			r.hist[m].record(h)
		}
	}
}

// ObserveRelay records the proxy's residency for one relayed upstream read.
// It does not allocate.
func (r *Recorder) ObserveRelay(d time.Duration) {
	r.relay.observe(d)
}

// ObserveGap records the gap between two consecutive output events. It
// does not allocate.
func (r *Recorder) ObserveGap(d time.Duration) {
	r.gap.observe(d)
}

// SelfCheck returns the measurement-quality probe, stopped until the caller
// starts it; every window carries its verdict.
func (r *Recorder) SelfCheck() *selfcheck.Probe { return r.self }

// Register adds the admin endpoints to mux: /metrics (Prometheus; protobuf
// is negotiated for native histograms, OpenMetrics text otherwise),
// /requests and /healthz. The caller adds /snapshot and the dashboard at /
// to the same mux.
func (r *Recorder) Register(mux *http.ServeMux) {
	mux.Handle("GET /metrics", r.metricsHandler())
	mux.Handle("GET /requests", r.requestsHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
}

// Handler returns a new mux with the endpoints of Register.
func (r *Recorder) Handler() http.Handler {
	mux := http.NewServeMux()
	r.Register(mux)
	return mux
}

// metricsHandler serves the registry the Recorder was given.
func (r *Recorder) metricsHandler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

var _ proxy.Recorder = (*Recorder)(nil)
