//go:build linux

package proxy

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// watchClient reports a client that goes away while the proxy has nothing
// to write to it: fasthttp notices a disconnect only when a write fails
// (fasthttp #874, #965, #993), so without this a client that gives up during
// a long prefill would leave the engine working on an orphan until the first
// token. It waits in the runtime's netpoller (epoll, with EPOLLRDHUP) for the
// client socket to become readable and peeks: zero bytes is EOF, the client
// left. Bytes (a pipelined request) end the watch without a verdict.
//
// gone is called at most once, from the watcher's goroutine. stop ends the
// watch and returns after the goroutine has exited; it must be called
// before the connection is read again, and the connection's read deadline
// is left for fasthttp to set before its next read, as it always does.
func watchClient(conn net.Conn, gone func()) (stop func()) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	// fasthttp's deadline for reading the request would end the watch of a
	// stream that outlives ReadTimeout; the request is read by now.
	_ = conn.SetReadDeadline(time.Time{})
	done := make(chan struct{})
	go clientWatcher{rc: rc, gone: gone, done: done}.run()
	return func() {
		_ = conn.SetReadDeadline(time.Unix(1, 0)) // wakes the netpoller wait
		<-done
		_ = conn.SetReadDeadline(time.Time{})
	}
}

// clientWatcher exists so the goroutine has a readable name in stacks.
type clientWatcher struct {
	rc   syscall.RawConn
	gone func()
	done chan struct{}
}

func (w clientWatcher) run() {
	defer close(w.done)
	left := false
	_ = w.rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN):
			return false // nothing yet: wait for readability
		case err != nil || n == 0:
			left = true // reset, or EOF
		}
		return true
	})
	if left {
		w.gone()
	}
}

// Results of peekIdle.
const (
	peekQuiet  = iota // nothing to read: the connection is as it was left
	peekClosed        // EOF or an error: the peer closed or reset it
	peekData          // bytes are waiting that nobody asked for
)

// peekIdle looks, without waiting and without consuming anything, at
// whether an idle connection became readable.
func peekIdle(conn net.Conn) int {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return peekQuiet
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return peekClosed
	}
	state := peekQuiet
	cerr := rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN):
		case err != nil || n == 0:
			state = peekClosed
		default:
			state = peekData
		}
		return true // never wait
	})
	if cerr != nil {
		return peekClosed
	}
	return state
}
