package proxy

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/proxy/lru"
)

// Accept back-off bounds: the same as net/http's Server.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// maxRefusing bounds the connections being refused at once; past it an
// excess connection is closed without its 503.
const maxRefusing = 64

// tooManyConns is what a connection over MaxClientConns reads before the close.
var tooManyConns = func() []byte {
	const body = `{"error":{"message":"anvilproxy: too many client connections","type":"too_many_connections","code":503}}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nRetry-After: 1\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// Listener wraps the data listener so that running out of resources
// degrades service instead of ending it. fasthttp's Serve returns on any
// accept error but a timeout, and the process exits with every stream cut:
// here an accept error (EMFILE, ENFILE, ENOBUFS, …) is counted, logged at
// most once a second, and retried after a back-off. With MaxClientConns
// set, a connection over it gets a 503 and is closed, so the file
// descriptors that the streams in flight need are never taken by idle
// clients. At the bound, the connection idle the longest between two
// keep-alive requests is closed to make room (as nginx does), so that idle
// clients cannot lock new ones out; only a bound full of busy connections
// refuses. The returned listener is safe for concurrent use.
func (p *Proxy) Listener(ln net.Listener) net.Listener {
	return GuardListener(ln, p.cfg.MaxClientConns, &p.stats, p.log)
}

// GuardListener is Proxy.Listener for any listener (serve's admin listener
// too): at most maxConns connections at once (0: no bound), accept errors
// and refusals counted in st and logged to log. Its server must report
// idle connections with MarkIdle (Proxy.Server does) for the bound to
// close them to make room.
func GuardListener(ln net.Listener, maxConns int, st *Stats, log *zap.Logger) net.Listener {
	return &guardedListener{Listener: ln, st: st, log: log, max: int64(maxConns)}
}

// MarkIdle tells c's guarded listener whether c waits for a request: call
// it from the server's ConnState hook (idle: StateNew or StateIdle, no
// request in progress; not idle: any other state). Connections of other
// listeners are ignored.
func MarkIdle(c net.Conn, idle bool) {
	if cc, ok := c.(*countedConn); ok {
		cc.l.markIdle(cc, idle)
	}
}

type guardedListener struct {
	net.Listener
	st       *Stats
	log      *zap.Logger
	max      int64
	open     atomic.Int64
	refusing atomic.Int64
	mu       sync.Mutex
	lastLog  time.Time

	idleMu sync.Mutex
	idle   lru.List[countedConn, *countedConn] // the connections idle between requests; Oldest has been idle the longest
}

func (l *guardedListener) Accept() (net.Conn, error) {
	backoff := time.Duration(0)
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			l.st.AcceptErrors.Add(1)
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			l.logAcceptError(err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if l.max > 0 && l.open.Load() >= l.max && !l.closeIdle() {
			l.refuse(c)
			continue
		}
		l.open.Add(1)
		return newCountedConn(c, l), nil
	}
}

func (l *guardedListener) logAcceptError(err error, backoff time.Duration) {
	l.mu.Lock()
	now := time.Now()
	quiet := now.Sub(l.lastLog) < time.Second
	if !quiet {
		l.lastLog = now
	}
	l.mu.Unlock()
	if !quiet {
		l.log.Error("accepting a client connection failed; retrying", zap.Error(err),
			zap.Duration("backoff", backoff), zap.Uint64("accept_errors_total", l.st.AcceptErrors.Load()))
	}
}

// markIdle keeps the list of idle connections, in the order they became
// idle.
func (l *guardedListener) markIdle(c *countedConn, idle bool) {
	l.idleMu.Lock()
	defer l.idleMu.Unlock()
	if idle && !c.closed.Load() {
		l.idle.Touch(c)
	} else {
		l.idle.Remove(c)
	}
}

// closeIdle closes the connection idle the longest, to make room for a new
// one, and reports whether there was one. RFC 9112 §9.3 lets a server
// close an idle connection at any time; a client that sent a request on it
// in the same instant retries it as it would after any keep-alive close.
func (l *guardedListener) closeIdle() bool {
	l.idleMu.Lock()
	e := l.idle.Oldest()
	if e != nil {
		l.idle.Remove(e)
	}
	l.idleMu.Unlock()
	if e == nil {
		return false
	}
	l.st.IdleClosed.Add(1)
	_ = e.Close()
	return true
}

// refuse answers an excess connection with a 503 and closes it, on a
// goroutine of its own so that accepting goes on.
func (l *guardedListener) refuse(c net.Conn) {
	l.st.ConnsRefused.Add(1)
	if l.refusing.Add(1) > maxRefusing {
		l.refusing.Add(-1)
		_ = c.Close()
		return
	}
	go func() {
		defer l.refusing.Add(-1)
		defer c.Close()
		_ = c.SetWriteDeadline(time.Now().Add(lingerIdle))
		if _, err := c.Write(tooManyConns); err != nil {
			return
		}
		linger(c) // the client reads the 503, not a reset
	}()
}

// countedConn is a client connection counted against MaxClientConns until
// it is closed.
type countedConn struct {
	net.Conn
	l *guardedListener
	// raw and fd are the socket's, taken once at accept (nil and -1 for a
	// connection that has none): the client watch asks for them on every
	// request, and net's SyscallConn and Control allocate each time.
	raw                    syscall.RawConn
	fd                     int
	closed                 atomic.Bool
	detached               atomic.Int32 // Closes still to ignore (detach)
	serving                atomic.Bool  // fasthttp's goroutine that served the request the loop took has yet to let go (awaitRelease)
	lru.Links[countedConn]              // its place in l.idle while idle; guarded by l.idleMu
}

// detach makes the next Close a no-op. fasthttp closes a hijacked
// connection once its hijack handler returns (and only then gives its
// 64 KiB read buffer back to its pool), but a stream the event loop relays
// (loop_linux.go) keeps the socket, open and counted, and hands it to the
// server again after (ServeConn), or closes it. Called before the hijack;
// the one Close ignored is fasthttp's, or, if the stream ended before
// fasthttp got to it, the loop's own (fasthttp's then closes), so the
// connection is closed exactly when one of the two meant it to be. Each
// detach ignores one Close: a stream handed back may be hijacked again
// before the last hijack's close.
func (c *countedConn) detach() { c.detached.Add(1) }

// hold marks c as still fasthttp's: called before a hijack the event
// loop takes the stream from; release (the server's StateHijacked or
// StateClosed for c) undoes it.
func (c *countedConn) hold()    { c.serving.Store(true) }
func (c *countedConn) release() { c.serving.Store(false) }

// awaitRelease waits, up to d, until fasthttp's goroutine that served
// the request the loop took has let go of c, and reports whether it did.
// fasthttp keys its table of the connections Shutdown may close by the
// connection object, and that goroutine deletes c's entry after it
// started the hijack handler: a stream that ended first (its whole body
// came with the head) and handed c back with ServeConn lost the new
// serve's entry to that delete, and Shutdown then waited for c until its
// idle timeout. The wait is the few instructions between the two, unless
// the goroutine was descheduled there.
func (c *countedConn) awaitRelease(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for pause := time.Microsecond; c.serving.Load(); pause = min(2*pause, time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
	return true
}

func (c *countedConn) Close() error {
	for n := c.detached.Load(); n > 0; n = c.detached.Load() {
		if c.detached.CompareAndSwap(n, n-1) {
			return nil // detach
		}
	}
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
		c.l.markIdle(c, false)
	}
	return c.Conn.Close()
}

// newCountedConn wraps c, accepted by l.
func newCountedConn(c net.Conn, l *guardedListener) *countedConn {
	cc := &countedConn{Conn: c, l: l, fd: -1}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			cc.raw = rc
			_ = rc.Control(func(f uintptr) { cc.fd = int(f) })
		}
	}
	return cc
}

// SyscallConn and NetConn keep the socket reachable through the wrapper,
// for the client watcher and the lingering close.
func (c *countedConn) SyscallConn() (syscall.RawConn, error) {
	if c.raw == nil {
		return nil, errors.ErrUnsupported
	}
	return c.raw, nil
}

// sysFD is the socket's descriptor while the connection is open, else
// -1: once closed, its number may already be another socket's (a request
// can run on a connection closeIdle closed after its bytes were read).
func (c *countedConn) sysFD() int {
	if c.closed.Load() {
		return -1
	}
	return c.fd
}

func (c *countedConn) NetConn() net.Conn { return c.Conn }
