// Package proxy is anvilproxy's transparent relay: a fasthttp server that
// forwards every request to one upstream inference server, passes every
// byte back unchanged and flushes every SSE event the moment it arrives,
// and emits one Trace per request to a Recorder.
//
// The files, one concept each: proxy.go (the Proxy and Handle, the story of
// a request), config.go, request.go (framing checks, the upstream request),
// headers.go (hop-by-hop and forwarded headers), route.go and path.go (the
// route and path labels), body.go (request bodies and their memory bound),
// limiter.go (--max-inflight), upstream.go and roundtrip.go (the upstream
// connection pool and one exchange), stream.go and inject.go (the relay),
// lifecycle.go (a relay's begin, its ends and its reuse: who owns it
// when), deadline.go (coarse idle deadlines), hijack.go (tunnels and
// HTTP/1.0 bodies), loop_linux.go (the event-loop relay), errors.go
// (refusals and their statuses), trace.go and phase.go (what is recorded),
// recorder.go (where it goes), log.go (the log line), listener.go (the
// guarded listener), watch_*.go (the client watch).
// docs/design.md tells the whole story.
package proxy

import (
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/proxy/prefix"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
	"github.com/anvilproxy/anvilproxy/sse"
)

// Proxy forwards requests to one upstream. It is safe for concurrent use;
// its configuration is fixed by New.
type Proxy struct {
	cfg    Config
	up     Upstream
	pool   *pool
	stats  Stats
	log    *zap.Logger
	rec    Recorder
	first  FirstOutputObserver // rec's, when it observes first outputs live; else nil
	models *modelSet
	limit  *limiter // nil without --max-inflight
	retry  *retry.Tracker
	prefix *prefix.Tracker

	aborting  atomic.Bool  // Abort ran: upstream failures are the shutdown's
	bodyBytes atomic.Int64 // request body bytes held by requests in flight
	nextID    atomic.Uint64
	inflight  atomic.Int64  // requests being served, from headers read to trace emitted
	upstream  upstreamCount // requests admitted upstream and not finished, and the admissions and releases so far
	relays    sync.Pool
	hj        hijacks

	srv      atomic.Pointer[fasthttp.Server] // the last Server: the event loop hands connections back to it
	draining atomic.Bool                     // Drain ran: a stream's end closes its client connection
}

// New validates cfg and returns a Proxy that reports to rec and logs one
// line per request to log.
func New(cfg Config, log *zap.Logger, rec Recorder) (*Proxy, error) {
	cfg.setDefaults()
	cfg.EventLoop = cfg.EventLoop || testEventLoop
	up, err := ParseUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	pt, err := prefix.New(prefix.Config{
		MaxIndexBytes:    cfg.PrefixMaxBytes,
		VolatileFields:   cfg.VolatileFields,
		VolatilePatterns: cfg.VolatilePatterns,
		MaxBodyBytes:     cfg.MaxBodyBytes,
	})
	if err != nil {
		return nil, err
	}
	if rec == nil {
		rec = NopRecorder{}
	}
	p := &Proxy{
		cfg:    cfg,
		up:     up,
		log:    log,
		rec:    rec,
		models: newModelSet(cfg.Models, cfg.MaxModels),
		limit:  newLimiter(cfg.MaxInflight, cfg.MaxQueue, cfg.MaxQueueWait),
		retry:  retry.New(retry.Config{Window: cfg.RetryWindow, MaxBytes: cfg.RetryMaxBytes}),
		prefix: pt,
	}
	p.first, _ = rec.(FirstOutputObserver)
	p.pool = newPool(&p.cfg, up, &p.stats)
	p.relays.New = func() any { return p.newRelay() }
	return p, nil
}

// Retries returns the tracker of client retries, for its aggregates.
func (p *Proxy) Retries() *retry.Tracker { return p.retry }

// Stats returns the proxy's connection counters.
func (p *Proxy) Stats() *Stats { return &p.stats }

// Abort closes every upstream connection, so that every request still in
// flight ends at once (its client sees the stream cut, its Trace says
// ErrShutdown), and keeps no connection from then on. Call it when a
// shutdown's grace has run out; Inflight then falls to 0 quickly.
func (p *Proxy) Abort() {
	p.aborting.Store(true)
	p.pool.abortAll()
	p.abortLoops()
}

// Inflight returns the number of requests being served: counted from
// the handler's start until their Trace has been recorded.
func (p *Proxy) Inflight() int64 { return p.inflight.Load() }

// Server returns a fasthttp server that serves the proxy. Its timeouts are
// those of the Config: a total ReadTimeout for reading a request (slowloris
// protection) and no WriteTimeout, since streams have per-write idle
// deadlines instead.
func (p *Proxy) Server() *fasthttp.Server {
	srv := &fasthttp.Server{
		Handler:        p.Handle,
		ErrorHandler:   p.handleReadError,
		ExpectHandler:  p.expect,
		HeaderReceived: p.headerReceived,
		ConnState:      p.connState,
		ReadTimeout:    p.cfg.ReadTimeout,
		IdleTimeout:    2 * time.Minute,
		ReadBufferSize: p.cfg.MaxHeaderBytes,
		// The body limit is the proxy's (readBody): fasthttp's would refuse
		// an oversized Content-Length in its error path, which cannot
		// linger, so the client would read a reset instead of the 413.
		MaxRequestBodySize:           math.MaxInt,
		StreamRequestBody:            true, // so that t_recv is taken when the headers are in
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		Logger:                       serverLog{p.log},
		// fasthttp closes a hijacked connection when the hijack handler
		// returns, and takes back its read buffer: the event loop, which
		// keeps the connection for its stream and gives it back after
		// (ServeConn), detaches it first so that the close is ignored
		// (countedConn.detach).
	}
	p.srv.Store(srv)
	return srv
}

// expect answers a client's Expect: 100-continue: 413 instead of 100 when
// the declared body is over the limit (headerReceived marked it), so that a
// client that waits (curl does for bodies over 1 MiB) sends none of it. The
// refusal is recorded like any other; fasthttp writes the response and
// closes the connection, with nothing unread to linger for.
func (p *Proxy) expect(ctx *fasthttp.RequestCtx) int {
	if !bodyOverLimit(&ctx.Request.Header) {
		return fasthttp.StatusContinue
	}
	r := p.begin(ctx, time.Now()) // ctx.Time is stamped after the expectation
	row := &refusals[refuseBodyTooLarge]
	r.fail(row.side, row.kind)
	p.answerError(ctx, r, row.status)
	return row.status
}

// overLimitHeader marks a request whose declared Content-Length is over
// --max-body-bytes (headerReceived sets it; a client's own copy is deleted
// there, so only the proxy can set it). It never reaches the engine: the
// request is refused before it is built.
const overLimitHeader = "X-Anvilproxy-Body-Over-Limit"

// headerReceived runs once the request's header is read, before fasthttp
// pre-reads up to 8 KiB of the body (which, from a client that sends less,
// waits for the whole --read-timeout). A declared Content-Length over the
// limit is marked and the body declared empty, so that the handler runs at
// once and refuses it with 413 and the lingering close, which drains what
// the client sends.
func (p *Proxy) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	h.Del(overLimitHeader)
	if h.ContentLength() > p.cfg.MaxBodyBytes {
		h.Set(overLimitHeader, "1")
		h.SetContentLength(0)
	}
	return fasthttp.RequestConfig{}
}

// connState is the server's connection-state hook: it tells the guarded
// listener which connections wait for a request (new, or idle between
// keep-alive requests: the first to close when a new client needs room),
// tells the event loop that fasthttp let go of a connection (its stream
// may hand it back: countedConn.awaitRelease) and finishes a hijack
// fasthttp dropped; the upstream pool closes the idle connection bound to
// a client connection that closed.
func (p *Proxy) connState(c net.Conn, s fasthttp.ConnState) {
	MarkIdle(c, s == fasthttp.StateNew || s == fasthttp.StateIdle)
	if s == fasthttp.StateClosed || s == fasthttp.StateHijacked {
		if cc, ok := c.(*countedConn); ok {
			cc.release() // fasthttp is done with c: the loop may hand it back
		}
	}
	if s == fasthttp.StateClosed {
		p.abandonHijack(c)
	}
	p.pool.clientGone(c, s) // an idle upstream connection dies with its client's
}

func bodyOverLimit(h *fasthttp.RequestHeader) bool { return len(h.Peek(overLimitHeader)) > 0 }

// knownVersion reports a request line's HTTP version the proxy speaks:
// HTTP/1.0 or HTTP/1.1. Any other (HTTP/2.0 as a text request line,
// HTTP/1.9) is answered 505 (RFC 9110 §15.6.6), never forwarded as it came.
func knownVersion(proto []byte) bool {
	return string(proto) == "HTTP/1.1" || string(proto) == "HTTP/1.0"
}

// Handle serves one request: read it, forward it, hand the response body to
// a relay. It is the story of the package; the relay takes over once the
// upstream headers are in.
func (p *Proxy) Handle(ctx *fasthttp.RequestCtx) {
	r := p.begin(ctx, ctx.Time())
	tr := &r.tr
	defer p.recoverHandle(ctx, r)
	// The response goes out on its own and under a write deadline
	// (flushEachResponse); a body the relay writes has both done by its
	// first write deadline instead (one deadline change less per request:
	// relay.firstWriteDeadline), and a hijacked connection's writes are
	// the hijack's to bound (fasthttp clears every deadline before it).
	flushArranged := false
	defer func() {
		if !flushArranged && !ctx.Hijacked() {
			p.flushEachResponse(ctx)
		}
	}()

	if !knownVersion(ctx.Request.Header.Protocol()) {
		p.refuse(ctx, r, refuseVersion)
		return
	}
	if badFraming(&ctx.Request.Header) {
		p.refuse(ctx, r, refuseFraming)
		return
	}
	if why := p.buildRequest(ctx, r); why != 0 {
		p.refuse(ctx, r, why)
		return
	}
	tr.ReqBytes = int64(len(r.req.Body()))
	r.watch(ctx)
	if tr.Route.Generates() {
		p.beginAttempt(ctx, r)
	}
	if p.cfg.InjectUsage && (tr.Route == RouteChat || tr.Route == RouteCompletions) {
		if body, ok := injectIncludeUsage(r.req.Body()); ok {
			r.req.SetBody(body)
			tr.UsageInject = true
		}
	}
	if why := p.admit(r); why != 0 {
		p.refuse(ctx, r, why)
		return
	}
	if !p.pool.acquire() {
		p.refuse(ctx, r, refusePoolExhausted)
		return
	}
	r.token = true
	// The engine's head is read into a header that carries the server's
	// settings (NoDefaultDate, NoDefaultContentType): Read keeps them, and
	// CopyTo carries them back, so the engine's Date is kept and no
	// Content-Type it did not send is added. fasthttp has no setter for them.
	ctx.Response.Header.CopyTo(&r.resp.Header)
	err := p.roundTrip(ctx, r)
	if err != nil {
		// No headers came from the upstream: tr.Headers stays zero, so
		// that the proxy's own 502/504 is never read as the engine's answer
		// (the upstream's reachability, cmd/anvilproxy/tap.go).
		why := upstreamFailure(err)
		if r.hasLeft() {
			why = refuseClientGone
		}
		p.refuse(ctx, r, why)
		return
	}
	tr.Headers = time.Now()
	if r.resp.StatusCode() == fasthttp.StatusSwitchingProtocols {
		p.switchProtocols(ctx, r)
		return
	}

	status := r.resp.StatusCode()
	if engineHeaders(&r.resp.Header, &r.timing, &r.usage) {
		tr.UsageSeen = r.usage.PromptTokens >= 0 || r.usage.CompletionTokens >= 0
	}
	r.resp.Header.CopyTo(&ctx.Response.Header)
	stripResponseHops(&ctx.Response.Header)
	// Trailers come only after a chunked body, which goes to an HTTP/1.1
	// client chunked too.
	if r.trailers && r.resp.Header.ContentLength() == -1 && ctx.Request.Header.IsHTTP11() {
		announceTrailers(&ctx.Response.Header, &r.resp.Header)
		r.clientHeader = &ctx.Response.Header
	}
	tr.Status = status
	if noBody(ctx, status) {
		r.atEOF = true
		r.endAt(tr.Headers)
		p.finishHandler(r)
		return
	}
	ct := r.resp.Header.ContentType()
	r.proto = tr.Route.Protocol()
	r.isSSE = isEventStream(ct)
	if !r.isSSE && r.proto == sse.ProtocolOllama && isNDJSON(ct) {
		r.startNDJSON()
	}
	tr.Stream = r.isSSE
	r.inject = r.isSSE && tr.UsageInject
	if !r.isSSE && r.proto != sse.ProtocolUnknown && isJSON(ct) {
		r.capture = r.capture[:0:cap(r.capture)]
		if r.capture == nil {
			r.capture = make([]byte, 0, 4096)
		}
	}
	r.conn = ctx.Conn()
	size := r.resp.Header.ContentLength()
	if size < 0 || r.inject || r.isSSE {
		// Chunked to the client: fasthttp writes a fixed-size body through
		// a buffer it never flushes, which would hold back every event of
		// an SSE response that came with a Content-Length.
		size = -1
	}
	// The head goes out at once, before any body byte, unless the whole
	// body is already read from the engine: then head and body leave in
	// one write, and nothing waits on the engine in between.
	ctx.Response.ImmediateHeaderFlush = size < 0 || !r.bodyBuffered(size)
	if size < 0 && p.toLoop(ctx, r) {
		return // the event loop relays the body (loop_linux.go)
	}
	if size < 0 && !ctx.Request.Header.IsHTTP11() {
		p.closeDelimited(ctx, r)
		return
	}
	flushArranged = r.firstWriteDeadline(ctx, tr.Headers)
	ctx.Response.SetBodyStream(r, size)
}

// beginAttempt links the request to the client's earlier attempts at the
// same body (docs/design.md "Retries"). The client is known by a keyed hash of its
// credentials, address and User-Agent; none of them is kept.
func (p *Proxy) beginAttempt(ctx *fasthttp.RequestCtx, r *relay) {
	h := &ctx.Request.Header
	r.tr.Retry = p.retry.Begin(retry.Request{
		Auth:        h.Peek("Authorization"),
		APIKey:      h.Peek("X-Api-Key"),
		RemoteIP:    ctx.RemoteIP(),
		UserAgent:   h.UserAgent(),
		Body:        r.req.Body(),
		RetryHeader: retry.ParseRetryCount(h.Peek(retry.HeaderRetryCount)),
		Start:       r.tr.Recv,
	})
	r.attempt = true
}

// endAttempt tells the retry tracker how the attempt ended.
func (p *Proxy) endAttempt(tr *Trace) {
	end := tr.ClientDone
	if end.IsZero() {
		end = tr.End
	}
	out, _ := tr.OutputTokens()
	p.retry.End(&tr.Retry, retry.Outcome{
		Status:           tr.Status,
		UpstreamTimeout:  tr.ErrKind == ErrUpstreamTimeout,
		UpstreamError:    tr.ErrKind == ErrConnect || tr.ErrKind == ErrUpstreamBroken,
		ClientAbort:      tr.ErrKind == ErrClientGone,
		FirstTokenSeen:   !tr.FirstOutput.IsZero(),
		PromptTokens:     tr.PromptTokens,
		CompletionTokens: out,
		End:              end,
	})
}

// observePrefix hashes the prompt's segments against the index of recent
// prompts (docs/design.md "Prefix drift"). It runs when the response is complete, off the
// streaming path: it costs about a millisecond per MiB of new prompt.
func (p *Proxy) observePrefix(r *relay) {
	tr := &r.tr
	tr.Prefix = p.prefix.Observe(tr.Route.Protocol(), r.req.Body(), tr.Recv)
	if tr.Prefix.Tracked && tr.UsageSeen && tr.CachedTokens >= 0 {
		p.prefix.Cache(&tr.Prefix, tr.PromptTokens, tr.CachedTokens)
	}
}

// admit passes the request through the limiter, if any, and counts it as
// in flight upstream. It returns why it was refused, or 0.
func (p *Proxy) admit(r *relay) refusal {
	tr := &r.tr
	tr.Admit = tr.Recv // without a limiter t_admit = t_recv (docs/design.md "Stamps and phases")
	if p.limit != nil {
		if why := p.limit.acquire(r.left); why != 0 {
			return why
		}
		r.limited = true
		tr.Limited = true
		tr.Admit = time.Now()
	}
	r.admitted = true
	tr.InflightAtAdmit, tr.AdmitSeq = p.upstream.admit()
	return 0
}

// upstreamCount counts the requests admitted upstream and not released,
// and numbers each admission and release, in one atomic word: the count
// in the low countBits, the events above. So a request's count of the
// others in flight at its admission and the numbers say the same thing: x
// was among them exactly when x.AdmitSeq < AdmitSeq < x.ReleaseSeq. The
// stamps cannot: ClientDone precedes the release (the event loop finishes
// a stream on a goroutine of its own), and a client that sends its next
// request on the last byte is admitted in between (histo's timeline then
// saw one request ahead that had ended). Safe for concurrent use.
type upstreamCount struct{ v atomic.Uint64 }

const (
	// Up to 1,048,575 requests in flight upstream: each holds a client
	// socket, and Linux's default ceiling on a process's descriptors
	// (fs.nr_open) is 1,048,576, so the count cannot carry into the
	// numbers, which last 2^44 events (five years at 50,000 requests/s).
	countBits = 20
	countMask = 1<<countBits - 1
)

// admit counts a request in: the others in flight, and its event number.
func (c *upstreamCount) admit() (others int, seq uint64) {
	v := c.v.Add(1<<countBits + 1)
	return int(v&countMask) - 1, v >> countBits
}

// Load is the number in flight.
func (c *upstreamCount) Load() int64 { return int64(c.v.Load() & countMask) }

// release counts one out and returns its event number.
func (c *upstreamCount) release() uint64 {
	return c.v.Add(1<<countBits-1) >> countBits
}

// handleReadError answers requests fasthttp could not read (see
// bodyFailure): 413 for a large body (fasthttp's default is 400), 431 for
// large headers, 408 for a read timeout, 499 for a client gone mid-request,
// 400 otherwise. The connection closes: what was read is not a request.
func (p *Proxy) handleReadError(ctx *fasthttp.RequestCtx, err error) {
	r := p.beginUnread(ctx, time.Now())
	why := bodyFailure(err)
	row := &refusals[why]
	r.fail(row.side, row.kind)
	p.answerError(ctx, r, row.status)
	// Not row.after: fasthttp closes a connection whose request it could
	// not read, after its ErrorHandler, whatever the handler asks; nothing
	// can linger here (which is why the body limit is readBody's, not
	// fasthttp's). Saying so keeps the response's Connection header true.
	ctx.SetConnectionClose()
}

// refuse answers the request with the proxy's own error for why, as the
// refusals table says, and ends it.
func (p *Proxy) refuse(ctx *fasthttp.RequestCtx, r *relay, why refusal) {
	row := &refusals[why]
	r.fail(row.side, row.kind)
	p.answerError(ctx, r, row.status)
	switch row.after {
	case closeConn:
		ctx.SetConnectionClose()
	case lingerAfter:
		// The rest of the body is unread: the connection cannot carry
		// another request (a pipelined one would be read from the middle).
		lingerClose(ctx)
	}
}

// answerError sends a proxy-made error response and ends the request.
func (p *Proxy) answerError(ctx *fasthttp.RequestCtx, r *relay, status int) {
	host := ""
	if r.tr.ErrSide == SideUpstream {
		host = p.up.Host
	}
	writeError(ctx, status, r.tr.ErrKind, host)
	r.tr.Status = status
	r.atEOF = true
	p.finishHandler(r)
}

// readUsage fills the token counts from the stream's usage, the captured
// non-stream body, or nothing (-1).
func (p *Proxy) readUsage(r *relay) {
	tr := &r.tr
	u := r.usage
	if !r.isSSE && len(r.capture) > 0 {
		sse.ClassifyBody(r.proto, r.capture, &r.chunk)
		if r.chunk.Flags&sse.FlagUsage != 0 {
			u = r.chunk.Usage
			tr.UsageSeen = true
		}
		if r.chunk.Flags&sse.FlagTiming != 0 {
			r.timing.Merge(r.chunk.Timing)
		}
	}
	tr.PromptTokens, tr.CompletionTokens = u.PromptTokens, u.CompletionTokens
	if out := int64(tr.ReasoningEvents + tr.ContentEvents + tr.ToolEvents); tr.CompletionTokens >= 0 && tr.CompletionTokens < out {
		// Every output event carries a token: a smaller count is a
		// placeholder (Anthropic's message_start says 1) from a stream
		// cut before its final usage. Fall back to counting events.
		tr.CompletionTokens = -1
	}
	tr.CachedTokens, tr.ReasoningTokens = u.CachedTokens, u.ReasoningTokens
	readTiming(tr, &r.timing)
}
