package proxy

import "sync"

// relayBufs holds relay buffers that no relay holds: a stream the event
// loop relays gives its relay's buffer back here when it leaves the
// connection's goroutine (the loop reads into its own), so a held stream
// keeps no 16 KiB of its own; the next request of that relay takes one.
var relayBufs = sync.Pool{New: func() any { return new([relayBufSize]byte) }}

// takeBuf gives r a buffer if it has none (its last stream went to a loop).
func (r *relay) takeBuf() {
	if r.buf == nil {
		r.buf = relayBufs.Get().(*[relayBufSize]byte)[:]
	}
}

// giveBuf returns r's buffer to relayBufs; r must not read through it
// until takeBuf.
func (r *relay) giveBuf() {
	if len(r.buf) == relayBufSize {
		relayBufs.Put((*[relayBufSize]byte)(r.buf))
	}
	r.buf = nil
}
