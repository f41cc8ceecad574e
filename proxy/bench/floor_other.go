//go:build !linux

package bench

import (
	"errors"
	"net"
)

// RunFloorRelay needs epoll: the floor target exists on Linux only.
func RunFloorRelay(net.Listener, string, int) error {
	return errors.New("the floor relay needs Linux (epoll)")
}
