//go:build linux

package bench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// RunFloorRelay is the floor of a Go relay on this machine: a TCP relay
// that measures nothing, parses nothing, and touches a connection only
// when bytes arrive. Each client connection accepted on ln gets its own
// connection to upstream, and bytes are copied both ways by loops event
// loops (edge-triggered epoll on the raw descriptors, one 16 KiB buffer
// per loop; a full socket parks the rest and stops reading its peer until
// it drains). It is the "if out of reach" reference of issue 25: what the
// event-loop design costs with nothing else on the path. It runs until ln
// is closed, and is a benchmark target only (anvilproxy bench --targets
// floor), never a product.
func RunFloorRelay(ln net.Listener, upstream string, loops int) error {
	if loops <= 0 {
		loops = runtime.NumCPU()
	}
	ls := make([]*floorLoop, loops)
	for i := range ls {
		l, err := newFloorLoop()
		if err != nil {
			return err
		}
		ls[i] = l
		go l.run()
	}
	for i := 0; ; i++ {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			continue
		}
		u, err := net.Dial("tcp", upstream)
		if err != nil {
			c.Close()
			continue
		}
		if err := ls[i%loops].add(c, u); err != nil {
			c.Close()
			u.Close()
		}
	}
}

// floorConn is one side of a relayed pair. Owned by its loop's goroutine
// once added.
type floorConn struct {
	fd      int
	peer    *floorConn
	pending []byte // bytes read from peer that this socket has not taken yet
	blocked bool   // this side's reads wait until peer's pending drains
	closed  bool
}

// floorET is EPOLLET as the uint32 the event mask is (syscall's constant is negative).
const floorET = 1 << 31

type floorLoop struct {
	epfd  int
	buf   []byte
	mu    sync.Mutex
	conns map[int]*floorConn // by fd; written by add, read by the loop
	n     atomic.Int64
}

func newFloorLoop() (*floorLoop, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	return &floorLoop{epfd: fd, buf: make([]byte, 16<<10), conns: map[int]*floorConn{}}, nil
}

// rawFD takes c's descriptor for the loop: a duplicate, so that closing
// the Go connection leaves the socket open, and Go's poller out of it.
func rawFD(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = syscall.Dup(int(f)) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	_ = c.Close()
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	return fd, nil
}

func (l *floorLoop) add(c, u net.Conn) error {
	a, err := rawFD(c)
	if err != nil {
		return err
	}
	b, err := rawFD(u)
	if err != nil {
		syscall.Close(a)
		return err
	}
	ca, cb := &floorConn{fd: a}, &floorConn{fd: b}
	ca.peer, cb.peer = cb, ca
	l.mu.Lock()
	l.conns[a], l.conns[b] = ca, cb
	l.mu.Unlock()
	for _, fd := range []int{a, b} {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLOUT | syscall.EPOLLRDHUP | floorET, Fd: int32(fd)}
		if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fmt.Errorf("epoll add: %w", err)
		}
	}
	l.n.Add(1)
	return nil
}

func (l *floorLoop) lookup(fd int) *floorConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[fd]
}

// run waits as the proxy's loops do (proxy/loop_linux.go): the epoll set
// is registered with the runtime's netpoller and polled with a zero
// timeout, so an idle loop is a parked goroutine, not a blocked thread.
func (l *floorLoop) run() {
	var evs [256]syscall.EpollEvent
	f := os.NewFile(uintptr(l.epfd), "floor-loop")
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	// The events are handled inside the callback, which parks only after
	// a wait that was not full, as the proxy's loops do: one epoll_wait
	// per wake.
	wait := func(fd uintptr) bool {
		for {
			r, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
			n := int(r)
			if errno != 0 {
				n = 0
			}
			for i := range evs[:n] {
				l.handle(&evs[i])
			}
			if n < len(evs) {
				return false
			}
		}
	}
	for rc.Read(wait) == nil {
	}
}

// handle relays what one event announces.
func (l *floorLoop) handle(ev *syscall.EpollEvent) {
	c := l.lookup(int(ev.Fd))
	if c == nil || c.closed {
		return
	}
	e := ev.Events
	if e&syscall.EPOLLOUT != 0 && len(c.pending) > 0 {
		l.flush(c)
	}
	if e&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 && !c.blocked {
		l.pump(c, e&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0)
	}
}

// pump copies src to its peer until src is drained. A read shorter than
// the buffer drained it (edge-triggered: the next bytes bring a new
// event), as the proxy's loops take it, unless drain is set: the peer
// closed, and the EOF after the bytes brings no new event.
func (l *floorLoop) pump(src *floorConn, drain bool) {
	for !src.closed && !src.blocked {
		n, err := floorIO(syscall.SYS_READ, src.fd, l.buf)
		if err == syscall.EAGAIN {
			return
		}
		if err == syscall.EINTR {
			continue
		}
		if n <= 0 {
			l.close(src)
			return
		}
		dst := src.peer
		w, err := writeAll(dst.fd, l.buf[:n])
		if err != nil && err != syscall.EAGAIN {
			l.close(src)
			return
		}
		if w < n {
			dst.pending = append(dst.pending[:0], l.buf[w:n]...)
			src.blocked = true
			return
		}
		if n < len(l.buf) && !drain {
			return
		}
	}
}

// writeAll writes b until it is out or the socket is full (EAGAIN), as
// the proxy's loop does: the kernel promises an EPOLLOUT edge after EAGAIN.
func writeAll(fd int, b []byte) (int, error) {
	total := 0
	for total < len(b) {
		w, err := floorIO(syscall.SYS_WRITE, fd, b[total:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return total, err
		}
		total += w
	}
	return total, nil
}

// flush writes c's parked bytes; once they are all out, c's peer reads again.
func (l *floorLoop) flush(c *floorConn) {
	w, err := writeAll(c.fd, c.pending)
	if err != nil && err != syscall.EAGAIN {
		l.close(c)
		return
	}
	c.pending = c.pending[:copy(c.pending, c.pending[w:])]
	if len(c.pending) == 0 {
		c.peer.blocked = false
		l.pump(c.peer, true) // no event says what came meanwhile
	}
}

func (l *floorLoop) close(c *floorConn) {
	for _, x := range []*floorConn{c, c.peer} {
		if x.closed {
			continue
		}
		x.closed = true
		l.mu.Lock()
		delete(l.conns, x.fd)
		l.mu.Unlock()
		syscall.Close(x.fd)
	}
	l.n.Add(-1)
}

// floorIO is read(2) or write(2) as raw system calls, as the proxy's loops
// make them (rawIO, proxy/loop_linux.go): the descriptors are
// non-blocking, and the runtime's syscall entry would wake sysmon on
// every call in a quiet process. n is -1 with an error, as syscall.Read's.
func floorIO(trap uintptr, fd int, b []byte) (int, error) {
	r, _, errno := syscall.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}
