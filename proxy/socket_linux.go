//go:build linux

package proxy

import (
	"syscall"
	"unsafe"
)

// The socket primitives below read a socket's state without waiting and
// without consuming anything. They are the only place the pool and the
// client watch touch a descriptor directly.

// peekFD looks at socket fd into b (at least one byte): peekQuiet when
// nothing is waiting, peekClosed on EOF or an error (the peer closed or
// reset it), otherwise peekData and how many bytes b holds. It is a raw
// system call (as the loop's rawIO): MSG_DONTWAIT never blocks, and
// syscall.Recvfrom's entry into the runtime's syscall state would wake
// sysmon with a futex in a quiet process; it runs once per reused
// upstream connection (upConn.stale).
func peekFD(fd int, b []byte) (state, n int) {
	r, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(fd),
		uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	switch {
	case errno == syscall.EAGAIN || errno == syscall.EINTR:
		return peekQuiet, 0
	case errno != 0 || r == 0:
		return peekClosed, 0 // reset, or EOF
	}
	return peekData, int(r)
}

// resetFD reports whether a reset reached socket fd after it read an EOF:
// Linux records an RST that arrives after the peer's FIN as the socket's
// pending error (EPIPE, tcp_reset in net/ipv4/tcp_input.c), which a read
// never returns once the FIN was read. Reading SO_ERROR clears it.
func resetFD(fd int) bool {
	v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
	return err == nil && (syscall.Errno(v) == syscall.EPIPE || syscall.Errno(v) == syscall.ECONNRESET)
}
