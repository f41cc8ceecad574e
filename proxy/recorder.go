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

// NopRecorder discards everything.
type NopRecorder struct{}

func (NopRecorder) Record(*Trace) {}

func (NopRecorder) ObserveRelay(time.Duration) {}

func (NopRecorder) ObserveGap(time.Duration) {}
