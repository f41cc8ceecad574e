package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openIdle opens n client connections to addr and leaves them idle.
func openIdle(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// statusOf sends one GET on c and returns the status, or 0 when the
// connection was closed without one.
func statusOf(c net.Conn) int {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestFileLimitDerivesConnectionCap (R3): under a low open-file limit
// (ulimit -n 128) the default --max-conns is derived from it, so that 100
// clients that connect and wait never hold more than 48 descriptors: each
// one past the bound closes the one waiting the longest (or, while none is
// known to be idle yet, is refused with 503), and the process never runs
// out of descriptors: it keeps serving the 48 newest, and a stream's
// upstream connection still has its fd.
func TestFileLimitDerivesConnectionCap(t *testing.T) {
	_, upURL := startTapSim(t, 20)
	limited := func(bin string, args ...string) *exec.Cmd {
		return exec.Command("sh", append([]string{"-c", `ulimit -n 128 && exec "$0" "$@"`, bin}, args...)...)
	}
	s := startProcWith(t, limited, t.TempDir(), upURL)
	require.Contains(t, s.stderr.String(), `"max_conns":48`, "the bound derived from 128 descriptors")
	addr := strings.TrimPrefix(s.proxyURL, "http://")
	conns := openIdle(t, addr, 100)
	var ok, refused, closed int
	for _, c := range conns {
		switch statusOf(c) {
		case 200:
			ok++
		case 503:
			refused++
		case 0:
			closed++
		}
	}
	t.Logf("%d served, %d refused with 503, %d closed to make room", ok, refused, closed)
	require.Equal(t, 48, ok)
	require.Equal(t, 52, refused+closed)
	// Counted before the held connections close: a request after that may
	// find the server not yet aware of every close and make room once more.
	metrics := fetch(t, s.adminURL+"/metrics")
	require.Equal(t, 52.0, sumSeries(metrics, "anvilproxy_conns_refused_total")+sumSeries(metrics, "anvilproxy_conns_idle_closed_total"))
	require.Zero(t, sumSeries(metrics, "anvilproxy_accept_errors_total"))
	for _, c := range conns {
		c.Close()
	}
	require.Eventually(t, func() bool { // the held connections are given back once closed
		resp, err := http.Get(s.proxyURL + "/v1/models")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 5*time.Second, 20*time.Millisecond)
}

// TestFileExhaustionKeepsServing (R3): with the connection bound set above
// what the descriptors allow, the process runs out of them (accept4: too
// many open files). It used to exit with every stream cut; now it backs
// off, logs at most once a second, counts, and serves again once clients
// leave.
func TestFileExhaustionKeepsServing(t *testing.T) {
	_, upURL := startTapSim(t, 20)
	s := startProc(t, upURL, "--max-conns", "100000")
	lim := unix.Rlimit{Cur: 128, Max: 128}
	require.NoError(t, unix.Prlimit(s.cmd.Process.Pid, unix.RLIMIT_NOFILE, &lim, nil))
	addr := strings.TrimPrefix(s.proxyURL, "http://")
	conns := openIdle(t, addr, 300) // the kernel completes them; the proxy cannot accept them all
	s.waitLog(t, "accepting a client connection failed")
	// It used to exit here; if it still did, it could not serve again below.
	require.False(t, s.hasExited(), "the process exited (%d):\n%s", s.code, s.stderr.String())
	for _, c := range conns {
		c.Close()
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.proxyURL + "/v1/models")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 10*time.Second, 50*time.Millisecond, "the proxy did not serve again")
	metrics := fetch(t, s.adminURL+"/metrics")
	errs := sumSeries(metrics, "anvilproxy_accept_errors_total")
	require.Positive(t, errs)
	lines := strings.Count(s.stderr.String(), "accepting a client connection failed")
	t.Logf("%v accept errors, %d log lines", errs, lines)
	require.LessOrEqual(t, lines, 5, "accept errors logged more than once a second")
	require.Contains(t, s.stderr.String(), "too many open files")
}
