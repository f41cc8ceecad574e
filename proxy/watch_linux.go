//go:build linux

package proxy

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// watchDelay is how long a request runs before its client is watched: a
// request answered sooner (an error, a cache hit, /v1/models, the
// throughput bench) costs no epoll_ctl at all, and a client that leaves
// still reaches the engine within the bound the proxy keeps (100 ms; the
// socket is checked as soon as it is registered).
const watchDelay = 20 * time.Millisecond

// A clientWatch reports a client that goes away while the proxy has
// nothing to write to it: fasthttp notices a disconnect only when a write
// fails (fasthttp #874, #965, #993), so without this a client that gives
// up during a long prefill would leave the engine working on an orphan
// until the first token. Once the request has run for watchDelay, the
// client socket is added to the watch hub's epoll set (EPOLLIN,
// EPOLLRDHUP, one-shot); when it becomes readable the hub peeks: zero
// bytes or an error is the client gone, bytes (a pipelined request) end
// the watch without a verdict.
//
// Watching costs a timer and, past watchDelay, two epoll_ctl calls per
// request, and no goroutine: one hub goroutine serves every request in
// flight. The runtime's own netpoller is left alone, so the connection's
// deadlines are not touched either.
//
// A clientWatch is owned by one request at a time, which calls start and
// then stop; it is reused by the next. gone is called at most once per
// start, on the hub's goroutine, and never after stop has returned.
type clientWatch struct {
	gone func() // set by the owner before the first start

	mu    sync.Mutex // held by the timer and the hub while they use the fields below
	timer *time.Timer
	id    uint64 // the registration, so that a stale epoll event is ignored
	fd    int
	state watchState
	inSet bool // fd is in the hub's epoll set and map under id, until stop
}

type watchState uint8

const (
	watchIdle   watchState = iota // not watching
	watchArmed                    // started, registered when the timer fires
	watchActive                   // in the hub's epoll set
)

// start watches conn until stop; false means it cannot be watched (not a
// socket), and stop need not be called.
func (w *clientWatch) start(conn net.Conn) bool {
	// The fd stays open until stop returns: the request owns the
	// connection, and fasthttp closes it only after the request ended.
	fd := connFD(conn)
	if fd < 0 {
		return false
	}
	w.mu.Lock()
	w.fd, w.state = fd, watchArmed
	if w.timer == nil {
		w.timer = time.AfterFunc(watchDelay, w.register)
	} else {
		w.timer.Reset(watchDelay)
	}
	w.mu.Unlock()
	return true
}

// register runs on the timer: the request is still going, so its client
// is watched from now on.
func (w *clientWatch) register() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != watchArmed { // stopped meanwhile
		return
	}
	h := theWatchHub()
	if h == nil {
		w.state = watchIdle // out of descriptors: noticed at the next write, as without a watch
		return
	}
	w.id = h.add(w)
	if h.ctl(syscall.EPOLL_CTL_ADD, w.fd, w.id) != nil {
		h.remove(w.id)
		w.state = watchIdle
		return
	}
	w.state, w.inSet = watchActive, true
}

// stop ends the watch. When it returns, gone has either run to its end or
// will never run.
func (w *clientWatch) stop() {
	w.timer.Stop() // a register already running finds the state idle, or is waited for below
	w.mu.Lock()
	inSet, id := w.inSet, w.id
	if inSet {
		_ = theWatchHub().ctl(syscall.EPOLL_CTL_DEL, w.fd, 0)
	}
	w.state, w.inSet = watchIdle, false
	w.mu.Unlock()
	if inSet {
		theWatchHub().remove(id)
	}
}

// watchHub is the process's one epoll set of watched client sockets and
// the goroutine that waits on it. It is created on first use and lives as
// long as the process, like the runtime's netpoller. Safe for concurrent
// use.
type watchHub struct {
	epfd int
	mu   sync.Mutex
	next uint64
	regs map[uint64]*clientWatch
}

var (
	hubMu sync.Mutex
	hub   *watchHub
)

// theWatchHub returns the hub, creating it the first time; nil if the
// epoll set cannot be created (out of descriptors), in which case a later
// call tries again.
func theWatchHub() *watchHub {
	hubMu.Lock()
	defer hubMu.Unlock()
	if hub == nil {
		fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return nil
		}
		hub = &watchHub{epfd: fd, regs: map[uint64]*clientWatch{}}
		go hub.run()
	}
	return hub
}

func (h *watchHub) add(w *clientWatch) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.regs[h.next] = w
	return h.next
}

func (h *watchHub) remove(id uint64) {
	h.mu.Lock()
	delete(h.regs, id)
	h.mu.Unlock()
}

func (h *watchHub) lookup(id uint64) *clientWatch {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.regs[id]
}

// watchEvents: readable or the peer's half-close, reported once per arming.
const watchEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// ctl adds, re-arms or removes fd, with id as the event's data.
func (h *watchHub) ctl(op, fd int, id uint64) error {
	ev := syscall.EpollEvent{Events: watchEvents, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	return syscall.EpollCtl(h.epfd, op, fd, &ev)
}

// run waits for watched sockets to become readable, for the life of the
// process.
func (h *watchHub) run() {
	var evs [64]syscall.EpollEvent
	for {
		n, err := syscall.EpollWait(h.epfd, evs[:], -1)
		if err != nil {
			if !errors.Is(err, syscall.EINTR) {
				time.Sleep(10 * time.Millisecond) // cannot happen with a valid set; never spin
			}
			continue
		}
		for _, ev := range evs[:n] {
			h.check(uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32)
		}
	}
}

// check looks at the socket of registration id, which became readable.
func (h *watchHub) check(id uint64) {
	w := h.lookup(id)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != watchActive || w.id != id { // stopped, or reused by a later request
		return
	}
	var b [1]byte
	switch state, _ := peekFD(w.fd, b[:]); state {
	case peekQuiet:
		_ = h.ctl(syscall.EPOLL_CTL_MOD, w.fd, id) // nothing after all: wait again
	case peekClosed:
		w.state = watchIdle // reset, or EOF; stop takes it out of the set
		w.gone()
	default:
		w.state = watchIdle // a pipelined request: no verdict, and no more watching
	}
}

// connFD returns conn's socket descriptor, or -1: the guarded listener's
// connections know theirs (countedConn.sysFD, no allocation); others are
// asked through SyscallConn.
func connFD(conn net.Conn) int {
	if c, ok := conn.(interface{ sysFD() int }); ok {
		return c.sysFD()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil {
		return -1
	}
	return fd
}
