package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/anvilproxy/anvilproxy/sse"
)

// relayBufSize is the upstream read size. Engines send one SSE event per
// HTTP chunk (uvicorn, fasthttp), so reads return event by event; 16 KiB
// holds the largest common events (tool-call arguments) in one read.
const relayBufSize = 16 << 10

// relay is the body handed to fasthttp for one proxied response: it copies
// the upstream body to the client read by read, and measures each read only
// after it has been written and flushed (forward first, measure second).
//
// A relay is owned by one request at a time, one goroutine at a time: the
// handler fills it, then whoever relays the body (fasthttp's WriteTo and
// CloseWithError, a hijack, the event loop) until finish records the Trace
// and returns it to the pool; lifecycle.go tells who owns it when.
type relay struct {
	// What each relayed read touches comes first, the request and the
	// response (1.9 KB of fasthttp's) last: at 256 streams a stream's relay
	// is out of the cache by its next event, and every line read costs a
	// miss (BENCHMARKS.md "Session 22").
	p *Proxy

	// With --inject-usage: the stream is filtered event by event.
	inject bool

	// isSSE: the body is a stream measured event by event, which
	// forces it chunked to the client, one write and flush per read:
	// text/event-stream, or (ndjson) ollama's application/x-ndjson,
	// whose events are its lines, split by lines instead of parser.
	isSSE  bool
	ndjson bool
	proto  sse.Protocol
	parser *sse.Parser
	lines  *sse.Lines // made on the first NDJSON stream, then kept
	ev     sse.Event
	chunk  sse.Chunk
	usage  sse.Usage
	timing sse.Timing

	conn net.Conn     // the client connection, for per-write idle deadlines
	wdl  idleDeadline // conn's write deadline, renewed coarsely
	// clientHeader is the client response's header while fasthttp writes
	// the body, for the trailers copied at the end; nil without trailers.
	clientHeader *fasthttp.ResponseHeader
	buf          []byte
	// headOut: the response head went out by the proxy's own write
	// (loopStream.early), not fasthttp's: a panic after it must close the
	// connection, not answer 500 after the bytes sent (recoverHandle).
	headOut bool

	capture []byte // non-stream JSON body kept to read usage, bounded

	// serverClears says the relay's first write deadline was set through
	// the request (firstWriteDeadline), so fasthttp flushes the response
	// on its own and clears the deadline after it.
	serverClears bool

	// With --inject-usage (inject):
	hold    []byte // raw bytes of the incomplete event not yet forwarded
	holdOff int64  // stream offset of hold[0]
	out     []byte // bytes to forward, reused
	maxHold int

	atEOF  bool // the upstream body was read to its end
	sawEnd bool // an end-of-stream event ([DONE], message_stop) was seen

	limited  bool  // holds a limiter slot
	admitted bool  // counted in Proxy.upstream
	attempt  bool  // begun in the retry tracker
	upgrade  bool  // the client asked to switch to a protocol the proxy tunnels
	trailers bool  // the client accepts trailers (TE: trailers)
	upgraded bool  // the connection was handed to a tunnel
	counted  bool  // counted in Proxy.inflight
	reserved int64 // body bytes counted in Proxy.bodyBytes

	// The client watch: left is closed and gone set, once, when the client
	// goes away; up is the upstream connection to close then. up is also
	// the connection the request holds, given back to the pool by release.
	up       atomic.Pointer[upConn]
	token    bool // holds one of the pool's connection tokens
	left     chan struct{}
	gone     atomic.Bool
	cw       clientWatch
	watching bool

	tr Trace

	req  fasthttp.Request  // the request sent upstream; its body is read again at the end
	resp fasthttp.Response // the upstream response, streamed
}

var (
	_ fasthttp.BodyWriterTo        = (*relay)(nil)
	_ fasthttp.ReadCloserWithError = (*relay)(nil)
)

// SupportsBodyWriteTo lets fasthttp call WriteTo, where each Write to the
// chunked writer is one chunk plus a flush: one event reaches the client
// the moment it arrives, and a client write error is seen at once.
func (r *relay) SupportsBodyWriteTo() bool { return true }

// WriteTo copies the upstream body to w. An upstream error is returned as
// is, so fasthttp aborts the client's response without the terminating
// chunk: a broken generation must never look complete (nginx
// proxy_unfinished.t, Go's ErrAbortHandler).
func (r *relay) WriteTo(w io.Writer) (int64, error) {
	r.takeBuf()
	src := r.resp.BodyStream()
	var total int64
	for {
		n, err := src.Read(r.buf)
		if n > 0 {
			t := time.Now()
			out := r.buf[:n]
			if r.inject {
				out = r.filter(out, t)
			}
			if werr := r.write(w, out, t); werr != nil {
				return total, werr
			}
			r.p.rec.ObserveRelay(time.Since(t))
			total += int64(len(out))
			if !r.inject {
				r.measure(out, t)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				r.atEOF = true
				r.endAt(time.Now())
				if r.clientHeader != nil {
					copyTrailers(r.clientHeader, &r.resp.Header)
				}
				if len(r.hold) > 0 { // an incomplete last event: forward it as it came
					if werr := r.write(w, r.hold, time.Now()); werr != nil {
						return total, werr
					}
					total += int64(len(r.hold))
					r.tr.RespBytes += int64(len(r.hold))
				}
				return total, nil
			}
			if r.hasLeft() {
				r.fail(SideClient, ErrClientGone) // the watcher closed the upstream
			} else {
				r.fail(SideUpstream, streamFailure(err))
			}
			return total, fmt.Errorf("reading upstream: %w", err)
		}
	}
}

// write sends b to the client as one chunk, under an idle deadline
// renewed as the stream goes (idleDeadline): fasthttp's WriteTimeout would
// be a total over the whole stream (fasthttp #839).
func (r *relay) write(w io.Writer, b []byte, now time.Time) error {
	if len(b) == 0 {
		return nil
	}
	if r.conn != nil {
		if dl, ok := r.wdl.next(now, r.p.cfg.ClientWriteTimeout); ok {
			r.setWriteDeadline(dl)
		}
	}
	if _, err := w.Write(b); err != nil {
		r.fail(SideClient, ErrClientGone)
		return fmt.Errorf("writing client: %w", err)
	}
	return nil
}

// setWriteDeadline renews the client connection's write deadline.
func (r *relay) setWriteDeadline(dl time.Time) { _ = r.conn.SetWriteDeadline(dl) }

// firstWriteDeadline sets the relay's first idle write deadline, before
// fasthttp writes the head, through the request (now is when the engine's
// head came): a deadline the handler set makes fasthttp flush the response
// before it reads the next pipelined request, which flushEachResponse
// otherwise asks for with a deadline change of its own, and clear the
// deadline after the flush (serverClears). So the head, a head flushed
// before the body starts, and the last flush are all under a deadline: a
// client that stops reading is cut, never held. It reports whether the
// deadline is set; when not, the relay sets its own at its first write.
func (r *relay) firstWriteDeadline(ctx *fasthttp.RequestCtx, now time.Time) bool {
	r.wdl.clear() // nothing was written yet: the deadline must be set here
	dl, _ := r.wdl.next(now, r.p.cfg.ClientWriteTimeout)
	if ctx.SetWriteDeadline(dl) != nil {
		r.wdl.clear()
		return false
	}
	r.serverClears = true
	return true
}

// bodyBuffered reports whether a response body of size bytes is all in
// the upstream connection's read buffer already, so that relaying it
// cannot wait on the engine.
func (r *relay) bodyBuffered(size int) bool {
	c := r.up.Load()
	return c != nil && c.buffered() >= size
}

// Read serves fasthttp paths that do not use WriteTo. The chunk is measured
// before it is written here, so WriteTo is the path the proxy relies on.
func (r *relay) Read(p []byte) (int, error) {
	n, err := r.resp.BodyStream().Read(p)
	if n > 0 {
		r.measure(p[:n], time.Now())
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			r.atEOF = true
			r.endAt(time.Now())
			return n, io.EOF
		}
		r.fail(SideUpstream, streamFailure(err))
	}
	return n, err
}

// endWatch stops the client watch, once; when it returns the watch can no
// longer close the upstream connection.
func (r *relay) endWatch() {
	if r.watching {
		r.cw.stop()
		r.watching = false
	}
}

// watch starts watching the client connection for the rest of the request.
// left is made once per relay and kept while nothing closed it (reset):
// one allocation less per request.
func (r *relay) watch(ctx *fasthttp.RequestCtx) {
	if r.left == nil {
		r.left = make(chan struct{})
	}
	r.watching = r.cw.start(ctx.Conn())
}

// clientLeft runs on the watch hub's goroutine when the client has gone: it
// closes the upstream connection at once, whether the request waits for
// headers (queue, prefill) or streams, so the engine stops working for
// nobody. The handler stores the connection before checking gone and this
// stores gone before loading it, so one of them always sees the other.
func (r *relay) clientLeft() {
	r.gone.Store(true)
	close(r.left)
	if c := r.up.Load(); c != nil {
		_ = c.Close()
	}
}

func (r *relay) hasLeft() bool { return r.gone.Load() }

// fail records the first failure of the request; later ones are
// consequences. Once Proxy.Abort ran, an upstream failure is the shutdown's.
func (r *relay) fail(side Side, kind ErrKind) {
	if side == SideUpstream && r.p.aborting.Load() {
		side, kind = SideProxy, ErrShutdown
	}
	if r.tr.ErrKind == ErrNone {
		r.tr.ErrSide, r.tr.ErrKind = side, kind
	}
}

func (r *relay) endAt(t time.Time) {
	if r.tr.End.IsZero() {
		r.tr.End = t
	}
}

// measure reads one relayed chunk that arrived at t.
func (r *relay) measure(b []byte, t time.Time) {
	r.tr.RespBytes += int64(len(b))
	if !r.isSSE {
		switch {
		case r.capture == nil:
		case len(r.capture)+len(b) <= r.p.cfg.MaxCaptureBytes:
			r.capture = append(r.capture, b...)
		default:
			// Over the bound: read no usage rather than a body with a
			// hole where this chunk was (a smaller one after it would fit).
			r.capture = nil
		}
		return
	}
	if r.ndjson {
		r.lines.Feed(b)
	} else {
		r.parser.Feed(b)
	}
	for r.nextEvent() {
		r.onEvent(t)
	}
}

// nextEvent moves r.ev to the next complete event fed to the parser,
// counting the malformed ones it passes over, and reports false when no
// complete event is left.
func (r *relay) nextEvent() bool {
	for {
		var ok bool
		var err error
		if r.ndjson {
			ok, err = r.lines.Next(&r.ev)
		} else {
			ok, err = r.parser.Next(&r.ev)
		}
		if err == nil {
			return ok
		}
		r.tr.ParseErrors++
	}
}

// pending reports the bytes of the stream that belong to no complete
// event (or line): non-zero at the end means it was cut inside one.
func (r *relay) pending() int {
	if r.ndjson {
		return r.lines.Pending()
	}
	return r.parser.Pending()
}

// startNDJSON makes the relay split the stream into lines, each an event
// of r.proto (ollama's native routes, sse.Lines).
func (r *relay) startNDJSON() {
	if r.lines == nil {
		r.lines = sse.NewLines(r.maxHold)
	}
	r.isSSE, r.ndjson = true, true
}

// onEvent takes the stamps and counts of one SSE event (docs/design.md "Stamps and phases").
// Role-only and empty deltas never count as output: a gateway bug class that
// reports a wrong TTFT for reasoning models (docs/design.md "Stamps and phases").
func (r *relay) onEvent(t time.Time) {
	tr := &r.tr
	tr.Events++
	if tr.FirstEvent.IsZero() {
		tr.FirstEvent = t
	}
	sse.Classify(r.proto, &r.ev, &r.chunk)
	f := r.chunk.Flags
	if f&sse.FlagUnparsed != 0 {
		tr.ParseErrors++
	}
	if f&sse.FlagReasoning != 0 {
		tr.ReasoningEvents++
	}
	if f&sse.FlagContent != 0 {
		tr.ContentEvents++
	}
	if f&sse.FlagToolCall != 0 {
		tr.ToolEvents++
	}
	if f&(sse.FlagReasoning|sse.FlagContent|sse.FlagToolCall) != 0 {
		if tr.FirstOutput.IsZero() {
			tr.FirstOutput = t
			if r.p.first != nil {
				r.p.first.FirstOutput(tr)
			}
		} else {
			r.p.rec.ObserveGap(t.Sub(tr.LastToken))
		}
		if tr.FirstContent.IsZero() && f&(sse.FlagContent|sse.FlagToolCall) != 0 {
			tr.FirstContent = t
		}
		tr.LastToken = t
	} else {
		tr.EmptyEvents++
	}
	if f&sse.FlagUsage != 0 {
		r.usage.Merge(r.chunk.Usage)
		tr.UsageSeen = true
	}
	if f&sse.FlagTiming != 0 {
		r.timing.Merge(r.chunk.Timing)
	}
	if f&sse.FlagDone != 0 {
		r.sawEnd = true
		r.endAt(t)
	}
}

// isEventStream reports whether a Content-Type is text/event-stream, with
// any parameters (charset) allowed, as Go's ReverseProxy decides to flush.
// The bare type is compared in place: mime.ParseMediaType allocates
// (its parameter map), and it runs for every response.
func isEventStream(ct []byte) bool {
	const es = "text/event-stream"
	t := bytes.TrimSpace(ct)
	if len(t) < len(es) || !bytes.EqualFold(t[:len(es)], []byte(es)) {
		return false
	}
	if len(t) == len(es) {
		return true
	}
	mt, _, err := mime.ParseMediaType(string(ct))
	return err == nil && mt == "text/event-stream"
}

// isNDJSON reports whether a Content-Type is newline-delimited JSON, as
// ollama streams its native routes (application/x-ndjson; also the
// application/jsonl and application/x-jsonlines spellings); ollama's own
// bare type without an allocation, as isEventStream.
func isNDJSON(ct []byte) bool {
	if bytes.EqualFold(bytes.TrimSpace(ct), []byte("application/x-ndjson")) {
		return true
	}
	mt, _, err := mime.ParseMediaType(string(ct))
	return err == nil && (mt == "application/x-ndjson" || mt == "application/ndjson" || mt == "application/jsonl" ||
		mt == "application/x-jsonlines")
}

// isJSON reports whether a Content-Type is application/json (or +json);
// the bare type without an allocation, as isEventStream.
func isJSON(ct []byte) bool {
	if bytes.EqualFold(bytes.TrimSpace(ct), []byte("application/json")) {
		return true
	}
	mt, _, err := mime.ParseMediaType(string(ct))
	return err == nil && (mt == "application/json" || bytes.HasSuffix([]byte(mt), []byte("+json")))
}
