package proxy

import (
	"bufio"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// upstreamBufSize is the size of an upstream connection's read buffer and
// of the pooled buffers requests are written through. A response head must fit in the read buffer (a larger one is a
// 502, as nginx's "upstream sent too big header"); bodies are read through
// it in relay-sized pieces.
const upstreamBufSize = 16 << 10

// pool owns the upstream connections. A connection belongs either to the
// idle list or to exactly one request, which takes it with get and gives it
// back with put; nothing else reads from it, so no byte can reach a request
// it was not the answer to. The pool never trusts an idle connection: it is
// closed when it has been idle longer than the idle timeout (uvicorn, in
// front of vLLM and SGLang, closes after 5 s) and when it became readable
// while idle (the peer closed it, or sent bytes nobody asked for: Go's
// Transport "Unsolicited response received on idle HTTP channel").
// Free connections are reused last-in first-out, so the busiest stay warm.
// A pool is safe for concurrent use.
type pool struct {
	cfg   *Config
	up    Upstream
	stats *Stats
	sem   chan struct{} // one token per connection in use: bounds upstream connections

	mu      sync.Mutex
	idle    []*upConn // LIFO
	busy    map[*upConn]struct{}
	reaping bool // a reap is scheduled
	closed  bool // abortAll ran: idle connections are no longer kept
}

func newPool(cfg *Config, up Upstream, stats *Stats) *pool {
	return &pool{cfg: cfg, up: up, stats: stats, sem: make(chan struct{}, cfg.MaxUpstreamConns), busy: map[*upConn]struct{}{}}
}

// acquire takes one of MaxUpstreamConns tokens, waiting up to MaxConnWait
// when all are in use; false means none became free. Each token is given
// back by exactly one put or discard.
func (p *pool) acquire() bool {
	select {
	case p.sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(p.cfg.MaxConnWait)
	defer t.Stop()
	select {
	case p.sem <- struct{}{}:
		return true
	case <-t.C:
		return false
	}
}

// get returns a connection for one request, holding a token from acquire:
// an idle one that passed its checks, or a new one; fresh asks for a new
// one. reused says which.
func (p *pool) get(fresh bool) (c *upConn, reused bool, err error) {
	now := time.Now()
	for !fresh {
		c = p.popIdle()
		if c == nil {
			break
		}
		if reason := c.stale(now, p.cfg.UpstreamIdleTimeout); reason != RedialNone {
			p.stats.redial(reason)
			_ = c.Close()
			continue
		}
		p.markBusy(c)
		return c, true, nil
	}
	c, err = p.dial()
	if err != nil {
		return nil, false, err
	}
	p.markBusy(c)
	return c, false, nil
}

func (p *pool) popIdle() *upConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	c := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	return c
}

func (p *pool) markBusy(c *upConn) {
	p.mu.Lock()
	p.busy[c] = struct{}{}
	closed := p.closed
	p.mu.Unlock()
	if closed {
		_ = c.Close() // shutting down: the request fails at once
	}
}

// put ends a request's use of c and gives back its token; c is nil when
// the request never got a connection. A connection whose last exchange
// left any doubt about where the next response starts (reusable false, or
// bytes beyond the response already read) is closed, never pooled.
func (p *pool) put(c *upConn, reusable bool) {
	if c == nil {
		<-p.sem
		return
	}
	p.mu.Lock()
	delete(p.busy, c)
	keep := reusable && !p.closed && c.br.Buffered() == 0
	if keep {
		c.idleSince = time.Now()
		p.idle = append(p.idle, c)
		if !p.reaping {
			p.reaping = true
			time.AfterFunc(p.cfg.UpstreamIdleTimeout, p.reap)
		}
	}
	p.mu.Unlock()
	if !keep {
		_ = c.Close()
	}
	<-p.sem
}

// discard closes c, which failed, and keeps its token for the connection
// that replaces it.
func (p *pool) discard(c *upConn) {
	p.mu.Lock()
	delete(p.busy, c)
	p.mu.Unlock()
	_ = c.Close()
}

// reap closes idle connections past the idle timeout, so that the proxy
// closes first and a pooled connection is not held open on the engine; it
// re-arms itself while idle connections remain. It runs on a timer, never
// on a goroutine of its own.
func (p *pool) reap() {
	now := time.Now()
	timeout := p.cfg.UpstreamIdleTimeout
	var expired []*upConn
	p.mu.Lock()
	kept := p.idle[:0]
	next := timeout
	for _, c := range p.idle {
		if left := timeout - now.Sub(c.idleSince); left > 0 {
			kept = append(kept, c)
			next = min(next, left)
		} else {
			expired = append(expired, c)
		}
	}
	clear(p.idle[len(kept):])
	p.idle = kept
	p.reaping = len(kept) > 0
	if p.reaping {
		time.AfterFunc(next, p.reap)
	}
	p.mu.Unlock()
	for _, c := range expired {
		_ = c.Close()
	}
}

// abortAll closes every connection, idle or busy, and keeps none from now
// on: requests still running end with an upstream read error at once.
func (p *pool) abortAll() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*upConn, 0, len(p.idle)+len(p.busy))
	conns = append(conns, p.idle...)
	clear(p.idle)
	p.idle = p.idle[:0]
	for c := range p.busy {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// dialError marks an error as having happened while connecting, so that it
// maps to 502 "unreachable" rather than a broken response.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dialing upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func (p *pool) dial() (*upConn, error) {
	start := time.Now()
	raw, err := fasthttp.DialTimeout(p.up.Addr, p.cfg.DialTimeout)
	if err != nil {
		return nil, &dialError{err}
	}
	if p.up.TLS {
		tc := tls.Client(raw, &tls.Config{ //nolint:gosec // InsecureSkipVerify is an opt-in flag
			ServerName:         p.up.Hostname,
			InsecureSkipVerify: p.cfg.InsecureSkipVerify,
		})
		_ = tc.SetDeadline(time.Now().Add(p.cfg.DialTimeout))
		if err := tc.Handshake(); err != nil {
			_ = raw.Close()
			return nil, &dialError{err}
		}
		_ = tc.SetDeadline(time.Time{})
		raw = tc
	}
	c := &upConn{Conn: raw, raw: raw, idle: p.cfg.UpstreamReadTimeout, dialTook: time.Since(start)}
	if tc, ok := raw.(*tls.Conn); ok {
		c.raw = tc.NetConn()
	}
	c.br = bufio.NewReaderSize(c, upstreamBufSize)
	return c, nil
}

// upConn is one upstream connection with idle deadlines renewed as it is
// read and written (coarsely: see idleDeadline), and the facts a Trace
// needs about it. It is used by one
// request at a time (see pool); Close may be called from any goroutine
// (the client watcher, shutdown).
type upConn struct {
	net.Conn
	raw       net.Conn // the TCP connection under TLS, for the idle peek
	br        *bufio.Reader
	idle      time.Duration
	dialTook  time.Duration
	idleSince time.Time // when it was last put back; owned by the pool
	uses      int       // requests begun on it; owned by the request holding it
	read      int64     // bytes read since the current request began
	readErr   error     // the last read error, as the socket gave it
	lastWrite time.Time // the end of the last request write
	readDL    idleDeadline
	writeDL   idleDeadline
}

func (c *upConn) Read(p []byte) (int, error) {
	if dl, ok := c.readDL.next(time.Now(), c.idle); ok {
		if err := c.Conn.SetReadDeadline(dl); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	c.read += int64(n)
	if err != nil {
		c.readErr = err
	}
	return n, err
}

// cause is the socket's own error behind err: fasthttp reports any failure
// before the first byte of a response as io.EOF, a reset included.
func (c *upConn) cause(err error) error {
	if c.readErr != nil {
		return c.readErr
	}
	return err
}

func (c *upConn) Write(p []byte) (int, error) {
	if dl, ok := c.writeDL.next(time.Now(), c.idle); ok {
		if err := c.Conn.SetWriteDeadline(dl); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// stale says why an idle connection must not carry another request, or
// RedialNone when it may.
func (c *upConn) stale(now time.Time, timeout time.Duration) Redial {
	if now.Sub(c.idleSince) >= timeout {
		return RedialIdleTimeout
	}
	switch peekIdle(c.raw) {
	case peekClosed:
		return RedialPeerClosed
	case peekData:
		return RedialUnsolicited
	}
	return RedialNone
}

// Redial says why a request did not use, or did not stay on, a pooled
// upstream connection.
type Redial uint8

// Reasons for a redial, bounded so that they can be metric labels.
const (
	RedialNone         Redial = iota
	RedialIdleTimeout         // idle longer than --upstream-idle-timeout: closed before the engine would
	RedialPeerClosed          // the engine closed it while it was idle (EOF or reset seen at reuse)
	RedialUnsolicited         // the engine sent bytes while it was idle: nobody's response, discarded
	RedialReusedFailed        // the request failed on the reused connection before any response byte, and was sent once more on a new one
	numRedials
)

var redialNames = [...]string{"", "idle_timeout", "peer_closed", "unsolicited", "reused_failed"}

func (r Redial) String() string { return redialNames[r] }

// Stats counts what happens to connections outside any one request's
// Trace. Its fields are safe to read at any time.
type Stats struct {
	redials      [numRedials]atomic.Uint64
	AcceptErrors atomic.Uint64 // accept failures on the data listener (EMFILE, ENFILE, ENOBUFS, …)
	ConnsRefused atomic.Uint64 // client connections over --max-conns, answered 503 and closed
	IdleClosed   atomic.Uint64 // idle keep-alive client connections closed to make room under --max-conns
}

func (s *Stats) redial(r Redial) { s.redials[r].Add(1) }

// Redials returns how many times a connection was not reused, or a request
// was re-sent, for the reason r.
func (s *Stats) Redials(r Redial) uint64 { return s.redials[r].Load() }

// RedialReasons lists every Redial but RedialNone, for exporting.
func RedialReasons() []Redial {
	out := make([]Redial, 0, numRedials-1)
	for r := RedialNone + 1; r < numRedials; r++ {
		out = append(out, r)
	}
	return out
}

// connFacts fills the connection stamps of tr from c, the connection that
// carried the request: when the request was sent and whether it paid for a
// dial.
func connFacts(c *upConn, reused bool, tr *Trace) {
	tr.Sent = c.lastWrite
	tr.Cold = !reused
	if !reused {
		tr.Connect = c.dialTook
	}
}
