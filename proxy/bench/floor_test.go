//go:build linux

package bench

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// TestFloorRelay: the floor relays bytes both ways unchanged, a megabyte
// at once (more than a read: the loops park and resume), and stops when its
// listener closes.
func TestFloorRelay(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() { // an echo upstream
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- RunFloorRelay(ln, up.Addr().String(), 2) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	go func() { _, _ = c.Write(want) }()                    // no half-close: the floor ends a pair at either side's EOF
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading back: %v after %d bytes", err, len(got))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes back, want %d unchanged", len(got), len(want))
	}
	c.Close()
	ln.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
