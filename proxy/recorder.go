package proxy

import "time"

// Recorder receives what the proxy measures. Implementations must be safe
// for concurrent use and must not block: they are called on the relay path.
type Recorder interface {
	// Record is called once per request, when it has ended. t is valid only
	// during the call; copy the value to keep it.
	Record(t *Trace)
	// ObserveRelay is called for every upstream read relayed to the client,
	// with the time from the read returning to the client write and flush
	// returning (the proxy's own residency). It must not allocate.
	ObserveRelay(d time.Duration)
	// ObserveGap is called for every gap between consecutive output events
	// of a stream. It must not allocate.
	ObserveGap(d time.Duration)
}

// FirstOutputObserver is an optional extension of Recorder: the proxy
// calls FirstOutput once per request, on the relay path, when the request's
// first output event arrives (t.FirstOutput is set, and every stamp before
// it; usage and the end are not). Record, by contrast, comes only when the
// request has ended, so a split made at Record sees the requests still in
// flight only through this (a prefill in progress on another slot, the
// order in which an engine served requests sent together). t is valid only
// during the call. It must not block or allocate. New type-asserts the
// Recorder once: a Recorder that wraps another must implement this too and
// pass it on, or the one it wraps never sees a first output.
type FirstOutputObserver interface {
	FirstOutput(t *Trace)
}

// NopRecorder discards everything.
type NopRecorder struct{}

func (NopRecorder) Record(*Trace) {}

func (NopRecorder) ObserveRelay(time.Duration) {}

func (NopRecorder) ObserveGap(time.Duration) {}
