package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// toxicKind names a fault, after toxiproxy's toxics (its CLI help and the
// toxiproxyr docs give their semantics; toxiproxy is not packaged for apt,
// so the few we need live here, in-process on loopback).
type toxicKind uint8

const (
	toxicNone      toxicKind = iota
	toxicLatency             // delay every segment by delay
	toxicBandwidth           // pass at most rate bytes per second
	toxicSlicer              // pass one byte per write, so every read sees a fragment
	toxicTimeout             // after `after` bytes pass nothing, and close after delay (0: hold until Close)
	toxicResetPeer           // after `after` bytes reset both connections (RST)
	toxicSlowClose           // delay the close that follows the source's EOF by delay
	toxicLimitData           // after `after` bytes close both connections (FIN)
)

var toxicNames = [...]string{"none", "latency", "bandwidth", "slicer", "timeout", "reset_peer", "slow_close", "limit_data"}

func (k toxicKind) String() string { return toxicNames[k] }

// flow is the direction a toxic acts on.
type flow uint8

const (
	flowDown flow = iota // upstream → proxy: the response
	flowUp               // proxy → upstream: the request
)

func (f flow) String() string { return [...]string{"down", "up"}[f] }

// toxic is one fault on one direction of every connection.
type toxic struct {
	kind  toxicKind
	flow  flow
	after int64 // bytes passed before timeout, reset_peer and limit_data act
	delay time.Duration
	rate  int // bytes per second, for bandwidth
}

// faultProxy is a TCP relay between the proxy and its upstream that applies
// one toxic, and counts the connections it accepted (each one is a dial by
// the proxy). Close stops every connection and waits for its goroutines.
type faultProxy struct {
	ln       net.Listener
	target   string
	toxic    toxic
	accepted atomic.Int32
	closed   chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startFaultProxy relays to target with tx applied; it is closed at the
// end of the test.
func startFaultProxy(t *testing.T, target string, tx toxic) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &faultProxy{ln: ln, target: target, toxic: tx, closed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.Close)
	return f
}

// URL is the base URL to give the proxy as its upstream.
func (f *faultProxy) URL() string { return "http://" + f.ln.Addr().String() }

// Close closes the listener and every relayed connection, and waits.
func (f *faultProxy) Close() {
	select {
	case <-f.closed:
		return
	default:
	}
	close(f.closed)
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *faultProxy) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.closed:
		return false
	default:
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *faultProxy) accept() {
	defer f.wg.Done()
	for {
		down, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.accepted.Add(1)
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			down.Close()
			continue
		}
		if !f.track(down) || !f.track(up) {
			down.Close()
			up.Close()
			return
		}
		f.wg.Add(1)
		go f.relay(down, up)
	}
}

// relay runs both directions of one connection pair until both end.
func (f *faultProxy) relay(down, up net.Conn) {
	defer f.wg.Done()
	var once sync.Once
	kill := func(reset bool) {
		once.Do(func() {
			if reset {
				down.(*net.TCPConn).SetLinger(0)
				up.(*net.TCPConn).SetLinger(0)
			}
			down.Close()
			up.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); f.pipe(down, up, flowDown, kill) }()
	go func() { defer wg.Done(); f.pipe(up, down, flowUp, kill) }()
	wg.Wait()
	kill(false)
}

// pipe copies src to dst, applying the toxic if it acts on this flow. At
// the source's EOF it half-closes dst, so a FIN crosses the relay as a FIN.
func (f *faultProxy) pipe(dst, src net.Conn, fl flow, kill func(reset bool)) {
	tx := f.toxic
	if tx.flow != fl {
		tx = toxic{}
	}
	buf := make([]byte, 32<<10)
	var passed int64
	for {
		n, err := src.Read(buf)
		b := buf[:n]
		if n > 0 && tx.after >= 0 {
			switch tx.kind {
			case toxicTimeout, toxicResetPeer, toxicLimitData:
				if passed+int64(n) > tx.after {
					b = b[:tx.after-passed]
					if len(b) > 0 && f.write(dst, b, toxic{}) != nil {
						kill(false)
						return
					}
					f.act(tx, src, kill)
					return
				}
			}
			if f.write(dst, b, tx) != nil {
				kill(false)
				return
			}
			passed += int64(n)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tx.kind == toxicSlowClose && !f.sleep(tx.delay) {
					return
				}
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
				return
			}
			kill(false)
			return
		}
	}
}

// act applies an offset toxic once its byte budget is spent.
func (f *faultProxy) act(tx toxic, src net.Conn, kill func(reset bool)) {
	switch tx.kind {
	case toxicResetPeer:
		kill(true)
	case toxicLimitData:
		kill(false)
	case toxicTimeout:
		stop := make(chan struct{})
		go func() { // swallow everything the source sends meanwhile
			defer close(stop)
			io.Copy(io.Discard, src)
		}()
		if tx.delay > 0 {
			f.sleep(tx.delay)
		} else {
			select {
			case <-f.closed:
			case <-stop:
			}
		}
		kill(false)
		<-stop
	}
}

// write passes b to dst, shaped by the toxic.
func (f *faultProxy) write(dst net.Conn, b []byte, tx toxic) error {
	switch tx.kind {
	case toxicLatency:
		if !f.sleep(tx.delay) {
			return net.ErrClosed
		}
	case toxicSlicer:
		for i := range b {
			if _, err := dst.Write(b[i : i+1]); err != nil {
				return err
			}
			time.Sleep(10 * time.Microsecond) // a segment each, not coalesced
		}
		return nil
	case toxicBandwidth:
		step := max(tx.rate/100, 1) // 10 ms worth per write
		for len(b) > 0 {
			n := min(step, len(b))
			if _, err := dst.Write(b[:n]); err != nil {
				return err
			}
			b = b[n:]
			if !f.sleep(10 * time.Millisecond) {
				return net.ErrClosed
			}
		}
		return nil
	}
	_, err := dst.Write(b)
	return err
}

// sleep waits d, or less if the fault proxy closes; it reports whether it
// waited the whole time.
func (f *faultProxy) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-f.closed:
		return false
	}
}
