package proxy

import (
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/sse"
)

// This file is the relay's lifecycle: where a relay comes from, the ways a
// request ends, and what ending gives back. The rest of the package fills
// and reads a relay; only these functions take one out of the pool, record
// its Trace or put it back.
//
// States, in order:
//
//  1. Pooled. Proxy.relays holds relays reset and ready (newRelay, reset);
//     nobody may touch one there.
//  2. Begun. begin takes one for a request, numbers its Trace and counts it
//     in Inflight (beginUnread, for a request fasthttp could not read, the
//     same without a route). From here the request owns it until finish.
//  3. Handled. Handle's goroutine (fasthttp's, for the client connection)
//     fills it: admission, the upstream exchange, the response head. The
//     one other goroutine that touches it is the client watch's
//     (clientLeft), and only through gone, left and up: the handler stores
//     up before it checks gone, the watch stores gone before it loads up,
//     so one of them always closes the connection.
//  4. Relaying, on exactly one of these paths, each a single owner at a
//     time, handed over by fasthttp or by a goroutine start (which orders
//     the handler's writes before the new owner's reads):
//     - no streamed body (a refusal, a bodiless status): finishHandler on
//       the handler's goroutine;
//     - a body fasthttp writes (SetBodyStream): fasthttp's connection
//       goroutine calls WriteTo, then CloseWithError;
//     - an HTTP/1.0 body delimited by the close (closeDelimited) and a
//       protocol switch (tunnel): the hijack handler's goroutine owns it,
//       or, if fasthttp drops the hijack, connState's abandon function
//       (hijacks: exactly one of the two runs); both end in CloseWithError
//       or endTunnel;
//     - the event loop (loop_linux.go, toLoop): the loop owns it from add
//       until done, then loopStream.finish (on a worker, worker.go; or
//       abandoned, or a failed hijacked) ends it. loopStream.finish is
//       the loop's side of the end, not a second one: it gives back the
//       loop's own resources (a dirty upstream connection discarded, the
//       client connection served again or closed) and calls Proxy.finish's
//       two halves for everything else, keeping what it still needs (the
//       server, the client connection) out of the relay first: conclude,
//       then report on another worker when the connection is served again
//       (the relay passes to it, a worker hand-off), else on its own.
//     - a panic in the handler: recoverHandle releases what the relay
//       holds and records its Trace, but does not reuse it: it may be half
//       filled, so it is left to the garbage collector.
//  5. Finished. finish releases what the request holds (release: the
//     watch, the upstream connection back to its pool if reusable says
//     so, the limiter slot, the counts), completes and records the Trace,
//     takes the request out of Inflight (uncount, after the record, so
//     that Inflight() == 0 means every Trace is in) and puts the relay,
//     reset, back in the pool. After finish returns the caller must not
//     touch the relay. finish is conclude (up to the Trace complete) and
//     report (the record on); between them the relay stays the caller's.

// newRelay is the pool's constructor: a relay with its parser, reset, and
// no relay buffer; one that relays a body on a goroutine takes one then
// and keeps it in the pool (takeBuf, relaybuf.go).
func (p *Proxy) newRelay() *relay {
	r := &relay{p: p, parser: sse.NewParser(p.cfg.MaxEventBytes), maxHold: p.cfg.MaxEventBytes}
	r.cw.gone = r.clientLeft
	if r.maxHold <= 0 {
		r.maxHold = sse.DefaultMaxEventBytes
	}
	r.reset()
	return r
}

// begin takes a relay for a request received at recv and counts it in
// flight: the handler and the early refusals start so.
func (p *Proxy) begin(ctx *fasthttp.RequestCtx, recv time.Time) *relay {
	r := p.beginUnread(ctx, recv)
	r.tr.Route = routeOf(ctx.URI().PathOriginal())
	r.tr.Path = pathOf(ctx.URI().PathOriginal())
	return r
}

// beginUnread is begin for a request fasthttp could not read
// (handleReadError): numbered, stamped and counted, with the method it
// may have read, but no route or path, which could be read from a
// request line that is not one.
func (p *Proxy) beginUnread(ctx *fasthttp.RequestCtx, recv time.Time) *relay {
	r := p.relays.Get().(*relay)
	r.tr.ID = p.nextID.Add(1)
	r.tr.Recv = recv
	r.tr.Method = methodOf(ctx.Method())
	p.inflight.Add(1)
	r.counted = true
	return r
}

// finishHandler ends a request whose response has no streamed body.
func (p *Proxy) finishHandler(r *relay) {
	r.tr.ClientDone = time.Now()
	r.endWatch()
	_ = r.resp.CloseBodyStream()
	p.finish(r)
}

// CloseWithError is called by fasthttp once the response is written, or
// abandoned, with the client write error if any. A body not read to its end
// leaves the upstream connection mid-response: release closes it, which is
// how the engine learns that nobody reads the generation any more.
func (r *relay) CloseWithError(err error) error {
	r.tr.ClientDone = time.Now()
	r.endWatch() // before the upstream connection can go back to its pool
	if err != nil {
		r.fail(SideClient, ErrClientGone)
	}
	if !r.atEOF {
		if r.tr.ErrKind == ErrNone {
			r.fail(SideClient, ErrClientGone) // abandoned without a write error (server shutdown)
		}
	}
	if r.conn != nil && r.wdl.set() {
		// When the first one was set through the request, fasthttp clears
		// it after its last flush, so what is still in its buffer goes out
		// under the relay's last deadline (a stalled client cannot hold
		// the connection on that flush); a hijacked HTTP/1.0 stream, or
		// one whose first deadline failed, clears it here.
		if !r.serverClears { // a deadline change less per request
			_ = r.conn.SetWriteDeadline(time.Time{})
		}
		r.wdl.clear()
	}
	_ = r.resp.CloseBodyStream()
	r.p.finish(r)
	return nil
}

// endTunnel ends a tunnel's request: its upstream connection is closed
// (never pooled: release sees upgraded) and its Trace recorded.
func (p *Proxy) endTunnel(r *relay) {
	if c := r.up.Load(); c != nil {
		_ = c.Close()
	}
	now := time.Now()
	r.tr.Upgraded = true
	r.tr.End, r.tr.ClientDone = now, now
	r.atEOF = true
	p.finish(r)
}

// recoverHandle keeps a bug in one request from taking the process down
// with every other stream (fasthttp does not recover handler panics, as
// net/http does). The log line names the request and the stack, never the
// panic value, which could quote request data. The relay is not reused.
func (p *Proxy) recoverHandle(ctx *fasthttp.RequestCtx, r *relay) {
	v := recover()
	if v == nil {
		return
	}
	p.log.Error("BUG: request handler panicked", zap.Uint64("id", r.tr.ID), zap.Stack("stack"))
	if c := r.up.Load(); c != nil {
		_ = c.Close()
	}
	p.release(r)
	if r.headOut {
		// The client has a head and maybe body bytes: a 500 now would be
		// read as the body's rest or the next request's answer.
		_ = ctx.Conn().Close()
	}
	ctx.Response.Reset()
	row := &refusals[refuseInternal]
	ctx.SetStatusCode(row.status)
	ctx.SetConnectionClose()
	r.tr.Status = row.status
	r.tr.ErrSide, r.tr.ErrKind = row.side, row.kind
	r.tr.ClientDone = time.Now()
	p.recordAfterPanic(&r.tr)
	p.uncount(r)
}

// recordAfterPanic emits the Trace of a request whose handler panicked, so
// that it is counted like any other; a Recorder that panics in turn (the
// first panic may have been its own) is not given a second chance to take
// the process down.
func (p *Proxy) recordAfterPanic(tr *Trace) {
	defer func() {
		if recover() != nil {
			p.log.Error("BUG: recording a panicked request panicked too", zap.Uint64("id", tr.ID))
		}
	}()
	p.rec.Record(tr)
	p.logTrace(tr)
}

// finish completes the Trace, reports it, and recycles the relay.
func (p *Proxy) finish(r *relay) {
	p.conclude(r)
	p.report(r)
}

// conclude gives back what the request holds and completes its Trace, with
// everything the client's next request on the connection may depend on:
// the upstream connection in its pool, the retry tracker's End before the
// next attempt's Begin, the prefix tracker's turn before the next turn's.
// What is left, report, depends on nothing the next request touches, so the
// event loop's hand-back runs it beside that request (loopStream.finish).
func (p *Proxy) conclude(r *relay) {
	p.release(r)
	tr := &r.tr
	if r.sawEnd && tr.ErrKind == ErrClientGone {
		// The client had the end-of-stream event: closing before the
		// chunked terminator (openai-go does, on [DONE]) lost it nothing.
		tr.ErrSide, tr.ErrKind = SideNone, ErrNone
	}
	if r.ndjson && tr.ErrKind == ErrNone && !tr.End.IsZero() && r.lines.Flush(&r.ev) {
		r.onEvent(tr.End) // a last line the clean end, not an LF, ended
	}
	if r.isSSE && r.proto != sse.ProtocolUnknown && !r.sawEnd && tr.ErrKind == ErrNone {
		tr.Truncated = true // a known protocol ended without its end marker
	}
	if r.isSSE && r.pending() > 0 {
		tr.Truncated = true
	}
	if tr.Truncated && r.proto != sse.ProtocolUnknown {
		// A failure, though the status was 200: the client got a cut
		// generation (ollama ends a stream so, with no finish_reason).
		// A stream of unknown protocol has no end marker to miss.
		r.fail(SideUpstream, ErrTruncated)
	}
	p.readUsage(r)
	tr.Model = p.models.label(requestModel(r.req.Body()))
	if r.attempt {
		p.endAttempt(tr)
		p.observePrefix(r)
	}
}

// report records the concluded Trace, logs it, takes the request out of
// Inflight and recycles the relay, which nobody may touch after. It runs
// once per request, after conclude, on any goroutine.
func (p *Proxy) report(r *relay) {
	tr := &r.tr
	p.rec.Record(tr)
	p.logTrace(tr)
	p.uncount(r)
	r.reset()
	p.relays.Put(r)
}

// release gives back what the request holds: the client watch, the
// upstream slot, the limiter slot and the upstream count (Inflight is
// uncount's). It is idempotent, so the panic path can call it whatever was
// released before.
func (p *Proxy) release(r *relay) {
	r.endWatch()
	if c := r.up.Swap(nil); c != nil || r.token {
		p.pool.put(c, r.reusable())
		r.token = false
	}
	r.unreserve()
	if r.limited {
		p.limit.release()
		r.limited = false
	}
	if r.admitted {
		r.tr.ReleaseSeq = p.upstream.release()
		r.admitted = false
	}
}

// uncount takes r out of Inflight. It comes after the Trace is recorded,
// not in release, so that Inflight() == 0 means every request's Trace is
// in the recorder: shutdown waits for that before its final snapshot.
func (p *Proxy) uncount(r *relay) {
	if r.counted {
		p.inflight.Add(-1)
		r.counted = false
	}
}

// reusable reports whether the upstream connection may carry another
// request: its response was read to the end, framed so that the end is
// known, and nobody closed it. Any doubt closes it (a response the client
// abandoned, a close-delimited body, a watcher that fired, a response that
// asked for close); pool.put also refuses one with bytes read beyond the
// response.
func (r *relay) reusable() bool {
	return r.atEOF && !r.hasLeft() && !r.upgraded &&
		r.tr.ErrSide != SideUpstream &&
		!r.resp.ConnectionClose() && !r.req.Header.ConnectionClose() &&
		r.resp.Header.ContentLength() != -2 // identity: ended by the close
}

// reset prepares a relay for the next request, keeping its buffers.
func (r *relay) reset() {
	r.req.Reset()
	r.resp.Reset()
	r.conn, r.clientHeader, r.trailers, r.serverClears, r.headOut = nil, nil, false, false, false
	r.wdl.clear()
	r.isSSE, r.ndjson = false, false
	r.proto = sse.ProtocolUnknown
	r.parser.Reset()
	if r.lines != nil {
		r.lines.Reset()
	}
	r.usage = sse.UnknownUsage()
	r.timing = sse.UnknownTiming()
	r.capture = r.capture[:0]
	if cap(r.capture) > 64<<10 { // as sse keeps (keptBytes): whole native answers with their context ids are often 100 KiB-1 MiB
		r.capture = nil // do not pin a large body in the pool
	}
	r.atEOF, r.sawEnd = false, false
	r.inject, r.hold, r.holdOff, r.out = false, r.hold[:0], 0, r.out[:0]
	r.attempt = false
	if r.gone.Load() { // closed by clientLeft; one never closed is kept for the next request
		r.left = nil
	}
	r.gone.Store(false)
	r.tr = Trace{}
	readTiming(&r.tr, &r.timing) // unknown until the engine says: -1, never 0
}
