package proxy

import "sync"

// relayBufs holds relay buffers that no relay holds. A relay takes one
// only when it relays a body on a goroutine (WriteTo, the tunnel), not at
// the start of every request: a stream the event loop relays never takes
// one (the loop reads into its own), so a held stream keeps no 16 KiB of
// its own and its start allocates none. A relay keeps its buffer in the
// relay pool between requests, so the goroutine relay takes one once.
var relayBufs = sync.Pool{New: func() any { return new([relayBufSize]byte) }}

// takeBuf gives r a buffer if it has none.
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
