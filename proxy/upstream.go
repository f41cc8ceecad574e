package proxy

import (
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// epoch anchors the monotonic stamps kept in atomics as offsets.
var epoch = time.Now()

// newHostClient returns the client pinned to the upstream. Its own timeouts
// stay zero: fasthttp's ReadTimeout is a deadline for the whole response
// body and would cut long generations (reliability-anchors §0.3); the idle
// deadlines live in upstreamConn instead.
func newHostClient(cfg *Config, up upstream) *fasthttp.HostClient {
	d := dialer{timeout: cfg.DialTimeout, idle: cfg.UpstreamReadTimeout}
	hc := &fasthttp.HostClient{
		Addr:                          up.addr,
		IsTLS:                         up.tls,
		Dial:                          d.dial,
		StreamResponseBody:            true,
		MaxConns:                      cfg.MaxConns,
		MaxConnWaitTimeout:            cfg.MaxConnWait,
		MaxIdemponentCallAttempts:     1, // a transparent proxy never re-sends on its own
		ReadBufferSize:                cfg.MaxHeaderBytes,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
	}
	if up.tls {
		hc.TLSConfig = &tls.Config{InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // opt-in flag
	}
	return hc
}

// dialError marks an error as having happened while connecting, so that it
// maps to 502 "unreachable" rather than a broken response.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dialing upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

type dialer struct {
	timeout time.Duration
	idle    time.Duration
}

func (d dialer) dial(addr string) (net.Conn, error) {
	start := time.Now()
	c, err := fasthttp.DialTimeout(addr, d.timeout)
	if err != nil {
		return nil, &dialError{err}
	}
	uc := &upstreamConn{Conn: c, idle: d.idle, dialTook: time.Since(start)}
	uc.addr = connAddr{Addr: c.LocalAddr(), conn: uc}
	return uc, nil
}

// upstreamConn is an upstream connection with idle deadlines renewed on every
// read and write, and the facts a Trace needs about it. The request that uses
// it finds it again through Response.LocalAddr, which returns a connAddr: the
// HostClient exposes no other link from a response to its connection.
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
