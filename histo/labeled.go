package histo

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// maxModelLabels bounds the model label of the latency histograms. The
// proxy bounds its model labels already (--max-models, default 16, then
// "other"); this is the recorder's own guard against a caller that does
// not: a model beyond it is recorded as "other".
const maxModelLabels = 64

// routeModel keys a set of labeled observers.
type routeModel struct {
	route proxy.Route
	model string
}

// observers are the per-request histograms' children for one route and
// model. Each is resolved on its first observation, so that only series
// with data are exported (a route and model that never saw a server-timed
// request has no queue{source="server"} series), and once, so that Record
// does not hash labels.
type observers struct {
	ttfo, ttft, prefill, reasoning, generation, tpot, e2e lazyObserver
	decodeRate, prefillRate                               lazyObserver
	queue                                                 [len(sources)]lazyObserver // none is never observed
	connect                                               [2]lazyObserver            // warm, cold
}

// lazyObserver is one child of vec with labels, resolved on first use.
// Safe for concurrent use: two first observations may both resolve it, to
// the same child.
type lazyObserver struct {
	vec    *prometheus.HistogramVec
	labels []string
	child  atomic.Pointer[observerBox]
}

type observerBox struct{ o prometheus.Observer }

func (l *lazyObserver) Observe(v float64) {
	b := l.child.Load()
	if b == nil {
		b = &observerBox{l.vec.WithLabelValues(l.labels...)}
		l.child.Store(b)
	}
	b.o.Observe(v)
}

// labeledSets caches observers by route and model. A read takes the read
// lock and one map lookup; a new pair builds its set under the write lock,
// once.
type labeledSets struct {
	m      *metrics
	mu     sync.RWMutex
	sets   map[routeModel]*observers
	models map[string]bool // distinct model labels, bounded by maxModelLabels
}

// labeled returns the observers of route and model. A model name beyond
// the bound is never a map key: its requests go to "other".
func (m *metrics) labeled(route proxy.Route, model string) *observers {
	ls := &m.sets
	key := routeModel{route, model}
	ls.mu.RLock()
	o := ls.sets[key]
	if o == nil && len(ls.models) >= maxModelLabels && !ls.models[model] {
		key.model = "other"
		o = ls.sets[key]
	}
	ls.mu.RUnlock()
	if o != nil {
		return o
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.sets == nil {
		ls.sets, ls.models = make(map[routeModel]*observers), make(map[string]bool)
	}
	if !ls.models[key.model] && len(ls.models) >= maxModelLabels {
		key.model = "other"
	}
	if o = ls.sets[key]; o == nil {
		ls.models[key.model] = true
		o = m.newObservers(key.route.String(), key.model)
		ls.sets[key] = o
	}
	return o
}

func (m *metrics) newObservers(route, model string) *observers {
	rm := []string{route, model}
	o := &observers{}
	for _, x := range []struct {
		l   *lazyObserver
		vec *prometheus.HistogramVec
	}{
		{&o.ttfo, m.ttfo}, {&o.ttft, m.ttft}, {&o.prefill, m.prefill}, {&o.reasoning, m.reasoning},
		{&o.generation, m.generation}, {&o.tpot, m.tpot}, {&o.e2e, m.e2e},
		{&o.decodeRate, m.decodeRate}, {&o.prefillRate, m.prefillRate},
	} {
		x.l.vec, x.l.labels = x.vec, rm
	}
	for i, s := range sources {
		o.queue[i].vec, o.queue[i].labels = m.queue, []string{string(s), route, model}
	}
	for i, cold := range []string{"false", "true"} {
		o.connect[i].vec, o.connect[i].labels = m.connect, []string{cold, route, model}
	}
	return o
}

// observe records a successful inference request's phases. Failed requests
// (a truncated stream included) are left out of the latency
// distributions, as in the v1 schema ("failed … responses retain sanitized
// timing and metadata but are excluded from performance distributions");
// they are counted by code and error.
func (o *observers) observe(rq *Request) {
	obs := func(x *lazyObserver, s Span) {
		if s.Known() {
			x.Observe(time.Duration(s).Seconds())
		}
	}
	obs(&o.ttfo, rq.TTFO)
	obs(&o.ttft, rq.TTFT)
	if rq.QueueSource != SourceNone {
		obs(&o.queue[rq.QueueSource.index()], rq.Queue)
	}
	obs(&o.prefill, rq.Prefill)
	obs(&o.reasoning, rq.Reasoning)
	obs(&o.generation, rq.Generation)
	obs(&o.tpot, rq.TPOT)
	obs(&o.e2e, rq.E2E)
	obs(&o.connect[b2i(rq.Cold)], rq.Connect)
	rate := func(x *lazyObserver, f Float) {
		if f.Known() {
			x.Observe(float64(f))
		}
	}
	rate(&o.decodeRate, rq.DecodeRate)
	rate(&o.prefillRate, rq.PrefillRate)
}
