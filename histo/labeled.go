package histo

import (
	"sync"
	"sync/atomic"

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
//
// An observer is indexed by Metric and by the value of the row's extra
// label: the QueueSource index for bySource (SourceNone is never
// observed), warm/cold for byCold, 0 for byRouteModel.
type observers [NumMetrics][len(sources)]lazyObserver

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
	for i := range phases {
		x := &o[i]
		switch phases[i].labels {
		case byRouteModel:
			x[0].vec, x[0].labels = m.phase[i], rm
		case bySource:
			for j, s := range sources {
				x[j].vec, x[j].labels = m.phase[i], []string{string(s), route, model}
			}
		case byCold:
			for j, cold := range []string{"false", "true"} {
				x[j].vec, x[j].labels = m.phase[i], []string{cold, route, model}
			}
		}
	}
	return o
}

// observe records a successful inference request's phases. Failed requests
// (a truncated stream included) are left out of the latency
// distributions, as in the v1 schema ("failed … responses retain sanitized
// timing and metadata but are excluded from performance distributions");
// they are counted by code and error.
func (o *observers) observe(rq *Request, v *phaseValues) {
	for i := range v {
		row := &phases[i]
		j := 0
		switch row.labels {
		case noProm, perEvent:
			continue
		case bySource:
			if rq.QueueSource == SourceNone {
				continue
			}
			j = rq.QueueSource.index()
		case byCold:
			j = b2i(rq.Cold)
		}
		if x, ok := Metric(i).promValue(v[i]); ok {
			o[i][j].Observe(x)
		}
	}
}

// requestCounters caches anvilproxy_requests_total's children by route,
// model and status code, for count: WithLabelValues checks and hashes its
// three labels and looks the child up on every call (BENCHMARKS.md
// "Session 8 (issue 25): the recording's cost"); a map of small keys is
// one hash. Its keys are codeLabel's classes (every status without a
// label of its own is -1), so it holds one entry per child of the vector
// and is bounded as the vector is (the proxy bounds its model labels). A read takes the read lock; a new
// child is added under the write lock.
type requestCounters struct {
	mu sync.RWMutex
	m  map[countKey]prometheus.Counter
}

// countKey is a child's labels: the status as codeLabel reads it (-1 for
// "other" beyond the table).
type countKey struct {
	route  proxy.Route
	status int
	model  string
}

// requestCounter is the anvilproxy_requests_total child of route, model
// and status.
func (m *metrics) requestCounter(route proxy.Route, model string, status int) prometheus.Counter {
	if codeLabel(status) == "other" {
		status = -1
	}
	rc, key := &m.counted, countKey{route, status, model}
	rc.mu.RLock()
	c := rc.m[key]
	rc.mu.RUnlock()
	if c != nil {
		return c
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.m == nil {
		rc.m = make(map[countKey]prometheus.Counter)
	}
	if c = rc.m[key]; c == nil {
		c = m.requests.WithLabelValues(route.String(), model, codeLabel(status))
		rc.m[key] = c
	}
	return c
}
