package main

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// tap sits between the proxy and the Recorder and sees every Trace on its
// way: it counts outcomes in the words of histo/failures.go for the live
// table (/status), feeds the upstream's reachability from the traffic
// (upstream_probe.go), and explains a 404 from an upstream whose URL ends
// in /v1. Record is called concurrently by the proxy; tap's state is
// atomic or behind upstreamHealth's lock. ObserveRelay, ObserveGap and
// FirstOutput pass straight through and do not allocate.
type tap struct {
	next     proxy.Recorder
	first    proxy.FirstOutputObserver // next's live first outputs, or nil: set at construction
	health   *upstreamHealth
	log      *zap.Logger
	upstream string
	v1       bool // the upstream path ends in /v1

	outcomes outcomes
	hinted   atomic.Int64 // unix ns of the last 404 hint: at most one a minute
}

// outcomes are the counts since start, inference routes only.
type outcomes struct {
	requests, failed, abandoned, refused, errors, retries atomic.Int64
}

// hintEvery bounds the 404 hint's rate: one line explains it.
const hintEvery = time.Minute

func (t *tap) Record(tr *proxy.Trace) {
	t.observeUpstream(tr)
	if tr.Route.Generates() { // inference, as histo counts it
		t.outcomes.add(tr)
	}
	if tr.Status == 404 && t.v1 && !tr.Headers.IsZero() {
		t.hint404(tr)
	}
	t.next.Record(tr)
}

func (t *tap) ObserveRelay(d time.Duration) { t.next.ObserveRelay(d) }
func (t *tap) ObserveGap(d time.Duration)   { t.next.ObserveGap(d) }

// FirstOutput passes the proxy's live first outputs on: the proxy asks its
// Recorder, the tap, once, so without this the split behind it would see
// requests in flight only when they end.
func (t *tap) FirstOutput(tr *proxy.Trace) {
	if t.first != nil {
		t.first.FirstOutput(tr)
	}
}

var _ proxy.FirstOutputObserver = (*tap)(nil)

// observeUpstream turns the trace into reachability evidence: response
// headers from the upstream prove it reachable, a failed dial proves it not.
func (t *tap) observeUpstream(tr *proxy.Trace) {
	switch {
	case !tr.Headers.IsZero():
		t.health.ok(tr.Headers)
	case tr.ErrKind == proxy.ErrConnect:
		t.health.bad(tr.Recv, "a request's dial failed")
	}
}

func (o *outcomes) add(tr *proxy.Trace) {
	o.requests.Add(1)
	if tr.Retry.Retry {
		o.retries.Add(1)
	}
	if !tr.Failed() {
		return
	}
	o.failed.Add(1)
	kind := ""
	if tr.ErrKind != proxy.ErrNone {
		kind = tr.ErrKind.String()
	}
	switch histo.FailureClass(tr.Status, kind) {
	case histo.FailureAbandoned:
		o.abandoned.Add(1)
	case histo.FailureRefused:
		o.refused.Add(1)
	default:
		o.errors.Add(1)
	}
}

// hint404 logs why the engine answered 404, at most once per hintEvery.
func (t *tap) hint404(tr *proxy.Trace) {
	now := time.Now().UnixNano()
	last := t.hinted.Load()
	if now-last < int64(hintEvery) || !t.hinted.CompareAndSwap(last, now) {
		return
	}
	t.log.Warn("upstream answered 404: "+v1Hint(t.upstream),
		zap.String("path", tr.Path), zap.String("upstream_path", upstreamPath(t.upstream, tr.Path)))
}

// upstreamPath is where the proxy sent a request for path.
func upstreamPath(upstream, path string) string {
	up, err := checkUpstream(upstream)
	if err != nil {
		return path
	}
	return up.Prefix + path
}

var _ proxy.Recorder = (*tap)(nil)
