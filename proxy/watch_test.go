//go:build linux

package proxy

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// TestClientLeavesDuringPrefill: a client that gives up before the first
// token makes the proxy close the upstream connection within 100 ms, so the
// engine stops prefilling an orphan, whether the engine has sent response
// headers (streams: vLLM answers at admission) or not (non-stream).
func TestClientLeavesDuringPrefill(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			s, up := startSim(t, fastSim)
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up}, log)
			body := `{"stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"long prompt"}]}`
			c := rawPost(t, base, "/v1/chat/completions", body, "X-Sim-Prefill", "5s")
			// The engine counts a request's prompt as it starts its prefill.
			require.Eventually(t, func() bool { return s.Stats().PromptTokens > 0 }, 5*time.Second, time.Millisecond, "never reached prefill")
			left := time.Now()
			require.NoError(t, c.Close())
			select {
			case ev := <-s.Aborts():
				require.Equal(t, sim.PhasePrefill, ev.Phase)
				// The proxy's bound is 100 ms (watchDelay, then the socket is
				// checked at once); a second leaves room for a loaded machine
				// and is still far inside the 5 s prefill that a proxy
				// noticing only at the first token would let run.
				require.Less(t, ev.At.Sub(left), time.Second, "the engine prefilled %v for nobody", ev.At.Sub(left))
			case <-time.After(3 * time.Second):
				t.Fatal("the engine never noticed the client leaving during prefill")
			}
			tr := log.next(t)
			require.Equal(t, SideClient, tr.ErrSide)
			require.Equal(t, ErrClientGone, tr.ErrKind)
		})
	}
}

// TestClientLeavesWhileLimited: a client that leaves while queued in the
// local limiter is dropped from the queue and never reaches the engine.
func TestClientLeavesWhileLimited(t *testing.T) {
	s, up := startSim(t, fastSim)
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up, MaxInflight: 1}, log)
	hog := rawPost(t, base, "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}]}`, "X-Sim-Prefill", "2s")
	require.Eventually(t, func() bool { return p.upstream.Load() == 1 }, 5*time.Second, time.Millisecond)
	waiter := rawPost(t, base, "/v1/chat/completions", `{"messages":[{"role":"user","content":"b"}]}`)
	require.Eventually(t, func() bool { return p.limit.waiting.Load() == 1 }, 5*time.Second, time.Millisecond, "the waiter is queued")
	require.NoError(t, waiter.Close())
	tr := log.next(t)
	require.Equal(t, ErrClientGone, tr.ErrKind)
	require.Equal(t, StatusClientClosed, tr.Status)
	require.True(t, tr.Sent.IsZero(), "never sent upstream")
	require.Equal(t, int64(1), s.Stats().Requests)
	hog.Close()
}

// watchClient watches conn with a clientWatch of its own and returns its
// stop: a watch outside a relay, for the tests of the watch itself.
func watchClient(t *testing.T, conn net.Conn, gone func()) (stop func()) {
	t.Helper()
	w := &clientWatch{gone: gone}
	require.True(t, w.start(conn), "a TCP socket can be watched")
	return w.stop
}

// loopbackPair is the two ends of one TCP connection on 127.0.0.1, closed
// at the test's end.
func loopbackPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })
	return client, server
}

// TestWatchStopsWithoutVerdictOnData: pipelined bytes end the watch without
// calling the client gone.
func TestWatchStopsWithoutVerdictOnData(t *testing.T) {
	client, server := loopbackPair(t)

	gone := make(chan struct{}, 1)
	w := &clientWatch{gone: func() { gone <- struct{}{} }}
	require.True(t, w.start(server))
	_, err := client.Write([]byte("GET / HTTP/1.1\r\n"))
	require.NoError(t, err)
	// The hub has registered the socket and peeked at it: the watch ended,
	// still in the set until stop.
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.state == watchIdle && w.inSet
	}, 5*time.Second, time.Millisecond, "the hub never looked at the readable socket")
	w.stop()
	select {
	case <-gone:
		t.Fatal("data was taken for a disconnect")
	default:
	}
	// The peeked bytes are still there for the server to read.
	buf := make([]byte, 64)
	require.NoError(t, server.SetReadDeadline(time.Now().Add(time.Second)))
	n, err := server.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "GET / HTTP/1.1\r\n", string(buf[:n]))

	stop := watchClient(t, server, func() { gone <- struct{}{} })
	client.Close()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("EOF not reported")
	}
	stop()
}

// hubRegistrations counts the client watches in the hub's epoll set.
func hubRegistrations() int {
	h := theWatchHub()
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.regs)
}

// TestWatchDelayedRegistration: a request that ends within watchDelay
// never enters the epoll set; one that outlives it does, and stop takes it
// out again, also when the watch fired. Start and stop around the timer's
// firing, many times over, leave nothing behind.
func TestWatchDelayedRegistration(t *testing.T) {
	client, server := loopbackPair(t)

	base := hubRegistrations()
	w := &clientWatch{gone: func() { t.Error("gone called for a client that stayed") }}
	require.True(t, w.start(server))
	require.Equal(t, base, hubRegistrations(), "registered before the delay")
	w.stop()
	time.Sleep(2 * watchDelay)
	require.Equal(t, base, hubRegistrations(), "a stopped watch registered late")

	require.True(t, w.start(server))
	require.Eventually(t, func() bool { return hubRegistrations() == base+1 }, 5*time.Second, time.Millisecond)
	w.stop()
	require.Equal(t, base, hubRegistrations())

	for i := range 200 { // stop just before, at and after the timer fires
		require.True(t, w.start(server))
		time.Sleep(watchDelay - 2*time.Millisecond + time.Duration(i%5)*time.Millisecond)
		w.stop()
	}
	require.Equal(t, base, hubRegistrations())

	left := make(chan struct{})
	w2 := &clientWatch{gone: func() { close(left) }}
	require.True(t, w2.start(server))
	require.NoError(t, client.Close())
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Fatal("EOF not reported")
	}
	require.Equal(t, base+1, hubRegistrations(), "fired, still in the set until stop")
	w2.stop()
	require.Equal(t, base, hubRegistrations())
}

// TestWatchStartAllocs: arming and stopping the client watch on a guarded
// listener's connection allocates nothing (the socket's descriptor is
// taken once, at accept: countedConn.sysFD), and the descriptor is the
// socket's.
func TestWatchStartAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer peer.Close()
	c, err := ln.Accept()
	require.NoError(t, err)
	defer c.Close()
	cc := newCountedConn(c, &guardedListener{})
	require.Equal(t, connFD(c), cc.sysFD(), "the same descriptor as the socket's own")
	require.GreaterOrEqual(t, cc.sysFD(), 0)
	var w clientWatch
	w.gone = func() {}
	require.True(t, w.start(cc))
	w.stop() // the first start made the timer
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if w.start(cc) {
			w.stop()
		}
	}))
	require.NoError(t, cc.Close())
	require.Equal(t, -1, cc.sysFD(), "a closed connection's number may be another socket's")
	require.False(t, w.start(cc))
}
