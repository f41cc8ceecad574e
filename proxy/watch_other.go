//go:build !linux

package proxy

import "net"

// watchClient is the fallback where the socket cannot be watched: a client
// that leaves is noticed at the next write to it, so during a long prefill
// the upstream keeps working until the first token arrives.
func watchClient(net.Conn, func()) (stop func()) { return func() {} }
