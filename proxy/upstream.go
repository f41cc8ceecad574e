package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/anvilproxy/anvilproxy/proxy/lru"
)

// upstreamBufSize is the size of an upstream connection's read buffer and
// of the pooled buffers requests are written through. A response head must fit in the read buffer (a larger one is a
// 502, as nginx's "upstream sent too big header"); bodies are read through
// it in relay-sized pieces.
const upstreamBufSize = 16 << 10

// pool owns the upstream connections. A connection belongs either to one
// request, which takes it with get and gives it back with put, or, idle,
// to the client connection whose request used it last: only a request of
// that same client connection may take it again (HAProxy's default, its
// "http-reuse never" mode). An upstream that sends one response too many
// can then misplace those bytes only within the conversation that drew
// them, never hand them to another client: whatever arrives after the
// last check is read as the next response of the same client (Go's
// Transport and nginx share that race for any client; docs/design.md
// "Upstream pool"). An idle connection is closed when its client
// connection closes (clientGone), when it has been idle longer than the
// idle timeout (uvicorn, in front of vLLM and SGLang, closes after 5 s),
// and when it became readable while idle (the peer closed it, or sent
// bytes nobody asked for: Go's Transport "Unsolicited response received
// on idle HTTP channel"). Open connections, idle and busy, stay within
// MaxUpstreamConns: a dial at the bound closes the least recently used
// idle one first. A pool is safe for concurrent use.
type pool struct {
	cfg   *Config
	up    Upstream
	tls   *tls.Config // nil for a plain upstream
	stats *Stats
	sem   chan struct{} // one token per connection in use: bounds busy connections

	mu      sync.Mutex
	idle    map[net.Conn]*upConn      // by the client connection each is bound to
	lru     lru.List[upConn, *upConn] // the idle connections; Oldest is the least recently used
	busy    map[*upConn]struct{}
	reaping bool // a reap is scheduled
	closed  bool // abortAll ran: idle connections are no longer kept
}

func newPool(cfg *Config, up Upstream, stats *Stats) *pool {
	p := &pool{cfg: cfg, up: up, stats: stats, sem: make(chan struct{}, cfg.MaxUpstreamConns),
		idle: map[net.Conn]*upConn{}, busy: map[*upConn]struct{}{}}
	if up.TLS {
		p.tls = &tls.Config{ //nolint:gosec // InsecureSkipVerify is an opt-in flag
			ServerName:         up.Hostname,
			InsecureSkipVerify: cfg.InsecureSkipVerify,
			RootCAs:            cfg.UpstreamRootCAs,
		}
	}
	return p
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

// get returns a connection for one request of client, holding a token
// from acquire: the idle connection bound to client if it passed its
// checks, or a new one bound to client; fresh asks for a new one. A nil
// client (a connection that ends with this response) always gets a new
// one, never kept. reused says which.
func (p *pool) get(client net.Conn, fresh bool) (c *upConn, reused bool, err error) {
	if !fresh && client != nil {
		if c = p.takeIdle(client); c != nil {
			if reason := c.stale(time.Now(), p.cfg.UpstreamIdleTimeout); reason != RedialNone {
				p.stats.redial(reason)
				_ = c.Close()
			} else {
				p.markBusy(c)
				return c, true, nil
			}
		}
	}
	p.makeRoom()
	c, err = p.dial()
	if err != nil {
		return nil, false, err
	}
	c.client = client
	p.markBusy(c)
	return c, false, nil
}

// takeIdle removes and returns the idle connection bound to client, if any.
func (p *pool) takeIdle(client net.Conn) *upConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.idle[client]
	if c != nil {
		p.unidleLocked(c)
	}
	return c
}

func (p *pool) unidleLocked(c *upConn) {
	delete(p.idle, c.client)
	p.lru.Remove(c)
}

// makeRoom closes the least recently used idle connection when the open
// ones are at MaxUpstreamConns, so that a dial never passes the bound.
// The caller holds a token, so at the bound at least one is idle.
func (p *pool) makeRoom() {
	p.mu.Lock()
	var victim *upConn
	if len(p.busy)+len(p.idle) >= p.cfg.MaxUpstreamConns {
		victim = p.lru.Oldest()
		if victim != nil {
			p.unidleLocked(victim)
		}
	}
	p.mu.Unlock()
	if victim != nil {
		_ = victim.Close()
	}
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
// left any doubt about where the next response starts (reusable false, a
// request not written whole, or bytes beyond the response already read,
// by the reader or by crypto/tls) is closed, never pooled; it stays bound
// to the client connection of the request that used it.
func (p *pool) put(c *upConn, reusable bool) {
	if c == nil {
		<-p.sem
		return
	}
	keep := reusable && c.client != nil && !c.spent
	if keep && !c.quiet() {
		keep = false
		p.stats.redial(RedialUnsolicited)
	}
	c.giveReader() // before another request can take c
	var old *upConn
	p.mu.Lock()
	delete(p.busy, c)
	keep = keep && !p.closed
	if keep {
		old = p.idle[c.client] // none: a client connection carries one request at a time
		if old != nil {
			p.unidleLocked(old)
		}
		c.idleSince = time.Now()
		p.idle[c.client] = c
		p.lru.Touch(c)
		if !p.reaping {
			p.reaping = true
			time.AfterFunc(p.cfg.UpstreamIdleTimeout, p.reap)
		}
	}
	p.mu.Unlock()
	if !keep {
		_ = c.Close()
	}
	if old != nil {
		_ = old.Close()
	}
	<-p.sem
}

// discard closes c, which failed, and keeps its token for the connection
// that replaces it.
func (p *pool) discard(c *upConn) {
	c.giveReader()
	p.mu.Lock()
	delete(p.busy, c)
	p.mu.Unlock()
	_ = c.Close()
}

// clientGone closes the idle connection bound to a client connection that
// closed or left HTTP (a tunnel): nobody may use it any more. It is the
// server's ConnState hook (Proxy.Server).
func (p *pool) clientGone(client net.Conn, state fasthttp.ConnState) {
	if state != fasthttp.StateClosed && state != fasthttp.StateHijacked {
		return
	}
	if c := p.takeIdle(client); c != nil {
		_ = c.Close()
	}
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
	for c := p.lru.Oldest(); c != nil && now.Sub(c.idleSince) >= timeout; c = p.lru.Oldest() {
		p.unidleLocked(c)
		expired = append(expired, c)
	}
	oldest := p.lru.Oldest()
	p.reaping = oldest != nil
	if p.reaping {
		time.AfterFunc(timeout-now.Sub(oldest.idleSince), p.reap)
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
	for c := p.lru.Oldest(); c != nil; c = p.lru.Oldest() {
		p.unidleLocked(c)
		conns = append(conns, c)
	}
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
	p.stats.UpstreamDials.Add(1)
	c := &upConn{Conn: raw, raw: raw, idle: p.cfg.UpstreamReadTimeout}
	if p.tls != nil {
		c.rec = &recordConn{Conn: raw}
		tc := tls.Client(c.rec, p.tls)
		_ = tc.SetDeadline(time.Now().Add(p.cfg.DialTimeout))
		if err := tc.Handshake(); err != nil {
			_ = raw.Close()
			return nil, &dialError{err}
		}
		_ = tc.SetDeadline(time.Time{})
		c.Conn, c.tls = tc, tc
	}
	c.dialTook = time.Since(start)
	return c, nil
}

// readers are the upstream connections' read buffers. A connection holds
// one only while a request owns it and reads through it: taken at begin,
// given back when the connection goes idle or closes (pool.put, discard),
// or when the event loop takes over the stream and reads the raw socket
// (loop.start). An idle connection or a stream held in a loop keeps no
// 16 KiB of its own (issue 25).
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, upstreamBufSize) }}

// takeReader gives c a read buffer if it has none. Called by the request
// that owns c.
func (c *upConn) takeReader() {
	if c.br == nil {
		c.br = readers.Get().(*bufio.Reader)
		c.br.Reset(c)
	}
}

// giveReader returns c's read buffer to readers, dropping what it still
// held: the caller has checked that c carries nothing more (quiet), or
// is closing it, or took the held bytes. Called by the request that owns
// c; nothing may read through the buffer afterwards (a response body
// stream over it is only ever closed, never read, once c is given back).
func (c *upConn) giveReader() {
	if c.br != nil {
		c.br.Reset(nil)
		readers.Put(c.br)
		c.br = nil
	}
}

// buffered is how many bytes c's reader holds beyond what was read.
func (c *upConn) buffered() int {
	if c.br == nil {
		return 0
	}
	return c.br.Buffered()
}

// upConn is one upstream connection with idle deadlines renewed as it is
// read and written (coarsely: see idleDeadline), and the facts a Trace
// needs about it. It is used by one request at a time (see pool), which
// owns the fields marked so; Close may be called from any goroutine (the
// client watcher, shutdown, clientGone).
type upConn struct {
	net.Conn
	raw               net.Conn      // the TCP connection, under TLS too: for the idle peek and the reset check
	tls               *tls.Conn     // the TLS layer of an https upstream, or nil
	rec               *recordConn   // the record boundaries under tls, or nil
	br                *bufio.Reader // lent per exchange (readers); nil while idle or in a loop
	idle              time.Duration
	dialTook          time.Duration
	client            net.Conn // the client connection it is bound to (see pool); nil: never kept
	idleSince         time.Time
	lru.Links[upConn]           // its place in the pool's idle list; owned by the pool
	uses              int       // requests begun on it; owned by the request holding it
	read              int64     // bytes read since the current request began
	readErr           error     // the current request's first read error, as the socket gave it
	lastWrite         time.Time // when the current request's write ended (or failed); zero before
	spent             bool      // the request was not written whole: never reused
	readDL            idleDeadline
	writeDL           idleDeadline
	peek              idlePeek
}

// begin readies c for one more request: the facts of the last one are
// forgotten, so that a request that fails before it is written never
// carries the previous one's send time.
func (c *upConn) begin() {
	c.takeReader()
	c.uses++
	c.read, c.readErr, c.lastWrite = 0, nil, time.Time{}
}

func (c *upConn) Read(p []byte) (int, error) {
	if dl, ok := c.readDL.next(time.Now(), c.idle); ok {
		if err := c.Conn.SetReadDeadline(dl); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	c.read += int64(n)
	if err != nil && c.readErr == nil { // the first: a reset is followed by EOFs
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
// RedialNone when it may. Only the socket can have changed while it was
// idle (nothing reads from it then), so the socket is what it peeks at;
// what the reader and crypto/tls held was checked by quiet when it went
// idle.
func (c *upConn) stale(now time.Time, timeout time.Duration) Redial {
	if now.Sub(c.idleSince) >= timeout {
		return RedialIdleTimeout
	}
	switch state, n := c.peekIdle(); state {
	case peekClosed:
		return RedialPeerClosed
	case peekData:
		if c.tls == nil && is408(c.peek.b[:n]) {
			// The engine's idle timer, announced before it closes: Go's
			// Transport takes it for the server closing an idle
			// connection too (is408Message, golang.org/issue/32310).
			return RedialPeerClosed
		}
		return RedialUnsolicited
	}
	return RedialNone
}

// is408 reports bytes that begin a 408 Request Timeout response.
func is408(b []byte) bool {
	return len(b) == len("HTTP/1.1 408") && bytes.HasPrefix(b, []byte("HTTP/1.")) && bytes.HasSuffix(b, []byte(" 408"))
}

// Results of peekIdle and peekFD.
const (
	peekQuiet  = iota // nothing to read: the connection is as it was left
	peekClosed        // EOF or an error: the peer closed or reset it
	peekData          // bytes are waiting that nobody asked for
)

// idlePeek is an upstream connection's means to peek at its socket at
// every reuse without an allocation: the RawConn and the callback are made
// once, at the first peek, and the bytes land in b. Used by the request
// that owns the connection. The peek runs under the RawConn's Control,
// not Read: it never waits, so it needs neither the read lock nor the
// poller's deadline check. A read deadline that passed while the
// connection was idle (UpstreamReadTimeout under UpstreamIdleTimeout) is
// renewed by the next read (idleDeadline.next: a renewal is due by then),
// where Read would have taken it for a closed connection.
type idlePeek struct {
	rc       syscall.RawConn
	fn       func(uintptr)
	b        [len("HTTP/1.1 408")]byte
	state, n int
}

// peekIdle looks, without waiting and without consuming anything, at
// whether the idle connection became readable, copying what waits into
// c.peek.b. Where the socket cannot be peeked (peekFD off Linux) it
// reports quiet: the idle timeout and the resend rule are then the only
// guards.
func (c *upConn) peekIdle() (state, n int) {
	pk := &c.peek
	if pk.rc == nil {
		sc, ok := c.raw.(syscall.Conn)
		if !ok {
			return peekQuiet, 0
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			return peekClosed, 0
		}
		pk.rc = rc
		pk.fn = func(fd uintptr) { pk.state, pk.n = peekFD(int(fd), pk.b[:]) }
	}
	pk.state, pk.n = peekQuiet, 0
	if pk.rc.Control(pk.fn) != nil {
		return peekClosed, 0
	}
	return pk.state, pk.n
}

// aLongTimeAgo is a deadline that has passed: a read under it returns what
// is buffered without waiting for the socket.
var aLongTimeAgo = time.Unix(1, 0)

// quiet reports that nothing beyond the response just read is held for c:
// not in its reader, and, over TLS, not in crypto/tls, where bytes already
// read from the socket are invisible to both Buffered and a socket peek.
// crypto/tls keeps decrypted bytes (input) and raw bytes read ahead
// (rawInput); its Read returns the one or decrypts a whole record of the
// other before it touches the socket, and under a deadline that has passed
// the socket read fails at once with a timeout, which crypto/tls does not
// keep as the connection's error (readRecordOrCCS: a net.Error that is
// Temporary). A part of a record it holds is seen by the record count
// under it (recordConn). Called by the request that owns c.
func (c *upConn) quiet() bool {
	if c.buffered() > 0 {
		return false
	}
	if c.tls == nil {
		return true
	}
	if !c.rec.atBoundary() {
		return false
	}
	if c.tls.SetReadDeadline(aLongTimeAgo) != nil {
		return false
	}
	var b [1]byte
	n, err := c.tls.Read(b[:])
	var ne net.Error
	ok := n == 0 && errors.As(err, &ne) && ne.Timeout()
	c.readDL.clear() // the next read sets its idle deadline again
	return ok && c.tls.SetReadDeadline(time.Time{}) == nil
}

// recordConn is the TCP connection under crypto/tls, counting TLS record
// boundaries in what is read from it, so that a part of a record read
// ahead beyond a response is seen (upConn.quiet). Its cost is a look at
// each record's 5-byte header. Owned by the tls.Conn's reader.
type recordConn struct {
	net.Conn
	left int     // bytes of the current record's body still to come
	hdr  [5]byte // the part of a record header read so far
	nhdr int
}

func (r *recordConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.count(p[:n])
	return n, err
}

func (r *recordConn) count(b []byte) {
	for len(b) > 0 {
		if r.left > 0 {
			k := min(r.left, len(b))
			r.left -= k
			b = b[k:]
			continue
		}
		k := copy(r.hdr[r.nhdr:], b)
		r.nhdr += k
		b = b[k:]
		if r.nhdr == len(r.hdr) {
			r.left = int(r.hdr[3])<<8 | int(r.hdr[4])
			r.nhdr = 0
		}
	}
}

// atBoundary reports that every record read from the socket was read whole.
func (r *recordConn) atBoundary() bool { return r.left == 0 && r.nhdr == 0 }

// resetSince reports whether c's socket met a reset, waiting for one until
// deadline: a request that reaches a socket the engine had closed draws an
// RST within a round trip, which is the proof the resend rule asks for
// (roundtrip.go). Called by the request that owns c, after a read failed.
func (c *upConn) resetSince(deadline time.Time) bool {
	if errors.Is(c.readErr, syscall.ECONNRESET) {
		return time.Now().Before(deadline)
	}
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	for {
		seen := false
		if rc.Control(func(fd uintptr) { seen = resetFD(int(fd)) }) != nil {
			return false
		}
		if seen {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// Redial says why a request did not use, or did not stay on, a pooled
// upstream connection.
type Redial uint8

// Reasons for a redial, bounded so that they can be metric labels.
const (
	RedialNone         Redial = iota
	RedialIdleTimeout         // idle longer than --upstream-idle-timeout: closed before the engine would
	RedialPeerClosed          // the engine closed it while it was idle (EOF, reset or a 408 seen at reuse)
	RedialUnsolicited         // the engine sent bytes nobody asked for, found after a response or while idle: discarded with the connection
	RedialReusedFailed        // the request failed on the reused connection before any response byte, and was sent once more on a new one
	numRedials
)

var redialNames = [...]string{"", "idle_timeout", "peer_closed", "unsolicited", "reused_failed"}

func (r Redial) String() string { return redialNames[r] }

// Stats counts what happens to connections outside any one request's
// Trace. Its fields are safe to read at any time.
type Stats struct {
	redials       [numRedials]atomic.Uint64
	AcceptErrors  atomic.Uint64 // accept failures on the data listener (EMFILE, ENFILE, ENOBUFS, …)
	UpstreamDials atomic.Uint64 // upstream connections opened (TCP connected; the TLS handshake may still fail)
	ConnsRefused  atomic.Uint64 // client connections over --max-conns, answered 503 and closed
	IdleClosed    atomic.Uint64 // idle keep-alive client connections closed to make room under --max-conns
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
