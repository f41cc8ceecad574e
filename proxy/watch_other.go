//go:build !linux

package proxy

import "net"

// clientWatch is the fallback where the socket cannot be watched: a client
// that leaves is noticed at the next write to it, so during a long prefill
// the upstream keeps working until the first token arrives.
type clientWatch struct {
	gone func()
}

func (w *clientWatch) start(net.Conn) bool { return false }
func (w *clientWatch) stop()               {}
