package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// startGuardedProxy serves p through its guarded Listener.
func startGuardedProxy(t *testing.T, cfg Config) (string, *Proxy) {
	t.Helper()
	p, err := New(cfg, zap.NewNop(), newTraceLog())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := p.Server()
	go srv.Serve(p.Listener(ln)) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String(), p
}

// TestClientConnectionCap (R3): with --max-conns 2, two idle keep-alive
// clients hold their connections; a third is answered 503 with Retry-After
// and closed, and is served again once one of the two has gone.
func TestClientConnectionCap(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	addr, p := startGuardedProxy(t, Config{Upstream: up.URL, MaxClientConns: 2})
	get := func(c net.Conn) *http.Response {
		_, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
		require.Equal(t, 200, get(c).StatusCode)
		held = append(held, c)
	}
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	resp := get(c)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.True(t, resp.Close)
	require.Equal(t, uint64(1), p.Stats().ConnsRefused.Load())

	held[0].Close()
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		return get(c).StatusCode == 200
	}, 5*time.Second, 20*time.Millisecond, "a freed connection slot was not given back")
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
