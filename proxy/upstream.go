package proxy

import (
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// epoch anchors the monotonic stamps kept in atomics as offsets.
var epoch = time.Now()

// pool hands out slots: single-connection HostClients pinned to the
// upstream. A HostClient exposes no link from a request to its connection,
// and a request waiting for response headers (queue and prefill, possibly
// minutes) can only be cancelled by closing that connection; with one
// connection per slot the request holding the slot knows it. Free slots are
// reused last-in first-out, so the busiest keep their connections warm.
// A pool is safe for concurrent use.
type pool struct {
	cfg  *Config
	up   upstream
	sem  chan struct{} // one token per slot in use: bounds upstream connections
	mu   sync.Mutex
	free []*slot
	all  []*slot
}

// slot is one upstream connection's client. conn is the connection it
// dialled last (nil before the first dial); it is set by the dialer and read
// by whoever must close it.
type slot struct {
	hc   *fasthttp.HostClient
	conn atomic.Pointer[upstreamConn]
}

func newPool(cfg *Config, up upstream) *pool {
	return &pool{cfg: cfg, up: up, sem: make(chan struct{}, cfg.MaxConns)}
}

// acquire returns a free slot, waiting up to MaxConnWait when all
// MaxConns are in use; nil means none became free.
func (p *pool) acquire() *slot {
	select {
	case p.sem <- struct{}{}:
	default:
		t := time.NewTimer(p.cfg.MaxConnWait)
		defer t.Stop()
		select {
		case p.sem <- struct{}{}:
		case <-t.C:
			return nil
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free = p.free[:n-1]
		return s
	}
	s := p.newSlot()
	p.all = append(p.all, s)
	return s
}

// release returns s to the pool. The caller has closed or drained the
// response body, so the connection is idle or closed.
func (p *pool) release(s *slot) {
	p.mu.Lock()
	p.free = append(p.free, s)
	p.mu.Unlock()
	<-p.sem
}

// conns counts open upstream connections.
func (p *pool) conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.all {
		n += s.hc.ConnsCount()
	}
	return n
}

// newSlot builds a slot's client. Its own timeouts stay zero: fasthttp's
// ReadTimeout is a deadline for the whole response body and would cut long
// generations (reliability-anchors §0.3); the idle deadlines live in
// upstreamConn instead.
func (p *pool) newSlot() *slot {
	s := &slot{}
	s.hc = &fasthttp.HostClient{
		Addr:                      p.up.addr,
		IsTLS:                     p.up.tls,
		Dial:                      func(addr string) (net.Conn, error) { return s.dial(addr, p.cfg) },
		StreamResponseBody:        true,
		MaxConns:                  1,
		MaxIdemponentCallAttempts: 1, // a transparent proxy never re-sends on its own
		ReadBufferSize:            p.cfg.MaxHeaderBytes,
		NoDefaultUserAgentHeader:  true,
		DisablePathNormalizing:    true,
	}
	if p.up.tls {
		s.hc.TLSConfig = &tls.Config{InsecureSkipVerify: p.cfg.InsecureSkipVerify} //nolint:gosec // opt-in flag
	}
	return s
}

// abort closes the slot's connection, which ends a Do waiting for headers
// or a body read in progress with an error; the engine sees the close and
// stops work on the request.
func (s *slot) abort() {
	if c := s.conn.Load(); c != nil {
		_ = c.Conn.Close()
	}
}

// dialError marks an error as having happened while connecting, so that it
// maps to 502 "unreachable" rather than a broken response.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dialing upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func (s *slot) dial(addr string, cfg *Config) (net.Conn, error) {
	start := time.Now()
	c, err := fasthttp.DialTimeout(addr, cfg.DialTimeout)
	if err != nil {
		return nil, &dialError{err}
	}
	uc := &upstreamConn{Conn: c, idle: cfg.UpstreamReadTimeout, dialTook: time.Since(start)}
	uc.addr = connAddr{Addr: c.LocalAddr(), conn: uc}
	s.conn.Store(uc)
	return uc, nil
}

// upstreamConn is an upstream connection with idle deadlines renewed on every
// read and write, and the facts a Trace needs about it. The request that uses
// it finds it again through Response.LocalAddr, which returns a connAddr.
type upstreamConn struct {
	net.Conn
	idle      time.Duration
	dialTook  time.Duration
	claimed   atomic.Bool  // the first request on the connection has taken the dial
	lastWrite atomic.Int64 // since epoch; the end of the last request write
	addr      connAddr
}

func (c *upstreamConn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *upstreamConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(p)
	c.lastWrite.Store(int64(time.Since(epoch)))
	return n, err
}

func (c *upstreamConn) LocalAddr() net.Addr { return &c.addr }

// connAddr is the local address of an upstreamConn, carrying the connection.
type connAddr struct {
	net.Addr
	conn *upstreamConn
}

// connFacts fills the connection stamps of tr from the connection that
// carried resp: when the request was sent and whether it paid for a dial.
func connFacts(resp *fasthttp.Response, tr *Trace) {
	a, ok := resp.LocalAddr().(*connAddr)
	if !ok {
		return
	}
	c := a.conn
	tr.Sent = epoch.Add(time.Duration(c.lastWrite.Load()))
	if c.claimed.CompareAndSwap(false, true) {
		tr.Cold = true
		tr.Connect = c.dialTook
	}
}
