package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestClientConnectionCap (R3): with --max-conns 2 and two requests in
// progress, a third connection is answered 503 with Retry-After and closed.
// Once the two are idle keep-alive connections, a new client is served:
// the connection idle the longest is closed to make room (as nginx does),
// the other keeps serving.
func TestClientConnectionCap(t *testing.T) {
	release := make(chan struct{})
	var busy atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			busy.Add(1)
			<-release
		}
		io.WriteString(w, "ok")
	})
	e := startGuarded(t, Config{Upstream: up.URL, MaxClientConns: 2})
	addr, p := e.addr, e.p
	send := func(c net.Conn, path string) {
		_, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
	}
	read := func(br *bufio.Reader) *http.Response {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
		return c, bufio.NewReader(c)
	}
	var held []net.Conn
	var readers []*bufio.Reader
	for range 2 {
		c, br := dial()
		send(c, "/slow")
		held, readers = append(held, c), append(readers, br)
	}
	require.Eventually(t, func() bool { return busy.Load() == 2 }, 5*time.Second, 5*time.Millisecond)
	c, br := dial()
	send(c, "/v1/models")
	resp := read(br)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a busy connection was closed to make room")
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.True(t, resp.Close)
	require.Equal(t, uint64(1), p.Stats().ConnsRefused.Load())

	close(release)
	for _, br := range readers {
		require.Equal(t, 200, read(br).StatusCode)
	}
	idle := func(n int) func() bool {
		return func() bool {
			e.ln.idleMu.Lock()
			defer e.ln.idleMu.Unlock()
			return e.ln.idle.Len() == n
		}
	}
	// Both idle before held[1] goes on: the server marks a connection idle
	// after the client may already have its answer, and held[0]'s mark must
	// not come after held[1]'s next one.
	require.Eventually(t, idle(2), 5*time.Second, time.Millisecond)
	send(held[1], "/v1/models") // held[1] is idle since now, held[0] since before
	require.Equal(t, 200, read(readers[1]).StatusCode)
	require.Eventually(t, func() bool { // the server marks them idle after the client has its answer
		e.ln.idleMu.Lock()
		defer e.ln.idleMu.Unlock()
		f := e.ln.idle.Oldest()
		return e.ln.idle.Len() == 2 && f.RemoteAddr().String() == held[0].LocalAddr().String()
	}, 5*time.Second, 5*time.Millisecond, "held[0] idle the longest")
	// Both are idle, held[0] the longest: the next client gets its place.
	c, br = dial()
	send(c, "/v1/models")
	require.Equal(t, 200, read(br).StatusCode, "idle keep-alive clients locked a new client out")
	require.Equal(t, uint64(1), p.Stats().IdleClosed.Load())
	_, err := readers[0].ReadByte()
	require.ErrorIs(t, err, io.EOF, "the longest idle connection was not the one closed")
	send(held[1], "/v1/models")
	require.Equal(t, 200, read(readers[1]).StatusCode)
	require.Equal(t, uint64(1), p.Stats().ConnsRefused.Load())
}

// TestAcceptErrorsDoNotStopServing (R3): an accept error (the listener's
// file-descriptor limit, here a listener whose Accept fails) is counted and
// backed off, and the proxy keeps serving.
func TestAcceptErrorsDoNotStopServing(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	p, err := New(Config{Upstream: up.URL}, zap.NewNop(), newTraceLog())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fl := &failingListener{Listener: ln, fails: 3}
	srv := p.Server()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(p.Listener(fl)) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	resp, err := http.Get("http://" + ln.Addr().String() + "/v1/models")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "ok", string(body))
	require.Equal(t, uint64(3), p.Stats().AcceptErrors.Load())
	select {
	case err := <-done:
		t.Fatalf("Serve returned: %v", err)
	default:
	}
}

// failingListener fails its first Accept calls with EMFILE, as a process
// out of file descriptors does.
type failingListener struct {
	net.Listener
	fails int
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: errEMFILE}
	}
	return l.Listener.Accept()
}

var errEMFILE error = os.NewSyscallError("accept4", syscall.EMFILE)
