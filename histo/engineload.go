package histo

import (
	"sync/atomic"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// EngineLoad is the engine's own view of its load, scraped from its
// /metrics (package histo/engine): vLLM's num_requests_running and
// num_requests_waiting, llama.cpp's requests_processing and
// requests_deferred, SGLang's and TGI's equivalents. It is evidence the
// proxy's own timeline cannot give: the engine counts the requests that
// reached it by other ways too (other replicas of the proxy, other
// clients).
//
// LoadAt returns the counts as last scraped at or before t; ok is false
// when nothing was scraped by then (or the scrape is too old to stand for
// t: the implementation decides). It must be safe for concurrent use and
// cheap: Record calls it once per inference request.
type EngineLoad interface {
	LoadAt(t time.Time) (running, waiting int, ok bool)
}

// SetEngineLoad gives the Recorder the engine's load (nil takes it away).
// The split then uses it as evidence (docs/queue-split.md "The engine's
// load"). Safe for concurrent use with Record.
func (r *Recorder) SetEngineLoad(l EngineLoad) {
	if l == nil {
		r.load.Store(nil)
		return
	}
	r.load.Store(&engineLoadBox{l})
}

// engineLoadBox holds an EngineLoad for atomic.Pointer.
type engineLoadBox struct{ EngineLoad }

// engineLoadRef is the Recorder's EngineLoad, swapped atomically.
type engineLoadRef = atomic.Pointer[engineLoadBox]

// engineLoad is the engine's load at one request's arrival.
type engineLoad struct {
	running, waiting int
	ok               bool
}

// loadAt reads the engine's load at tr's arrival (t_admit + connect).
func (r *Recorder) loadAt(tr *proxy.Trace) engineLoad {
	b := r.load.Load()
	if b == nil || tr.Admit.IsZero() {
		return engineLoad{}
	}
	running, waiting, ok := b.LoadAt(tr.Admit.Add(tr.Connect))
	if !ok {
		return engineLoad{}
	}
	return engineLoad{running: max(running, 0), waiting: max(waiting, 0), ok: true}
}

// hidden reports whether the engine had requests waiting at the
// request's arrival that the proxy's timeline cannot account for: more in
// the engine than the proxy had ahead of the request (p.ahead), some of
// them waiting. Other front doors' traffic is then queueing the request,
// and the occupancy split, which sees only the proxy's, would read it as
// prefill.
func (l engineLoad) hidden(p placement) bool {
	return l.ok && l.waiting > 0 && l.running+l.waiting > p.ahead
}
