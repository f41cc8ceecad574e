package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// The process tests of the reliability checklist (RELIABILITY.md) run the
// real binary: this file builds it once and drives "anvilproxy serve" as a
// subprocess in front of an upstream that records what it sent.

// binDir holds the anvilproxy binary the process tests run, built once.
var (
	binDir    string
	buildOnce sync.Once
	buildErr  error
)

// TestMain only owns binDir: the binary is built on first use, so tests
// that do not run it pay nothing.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "anvilproxy-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// anvilBinary builds this command with go build -o and returns its path.
func anvilBinary(t *testing.T) string {
	t.Helper()
	path := filepath.Join(binDir, "anvilproxy")
	buildOnce.Do(func() {
		// "go test" puts its own go first on PATH (GOROOT/bin).
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("no go tool on PATH: %v", err)
			return
		}
		out, err := exec.Command(goTool, "build", "-o", path, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return path
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is one anvilproxy serve process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr lockedBuffer
	proxyURL       string
	adminURL       string
	snapDir        string
	exited         chan struct{}
	exitedAt       time.Time
	code           int
}

// startProc runs anvilproxy serve in front of upstream on loopback
// ports at debug level, and waits until it listens.
func startProc(t *testing.T, upstream string, flags ...string) *proc {
	t.Helper()
	return startProcIn(t, t.TempDir(), upstream, flags...)
}

// startProcIn is startProc with the snapshot directory given.
func startProcIn(t *testing.T, snapDir, upstream string, flags ...string) *proc {
	t.Helper()
	return startProcWith(t, exec.Command, snapDir, upstream, flags...)
}

// startProcWith is startProcIn with the command built by command, which can
// wrap the binary (in a shell that sets a limit, for example).
func startProcWith(t *testing.T, command func(string, ...string) *exec.Cmd, snapDir, upstream string, flags ...string) *proc {
	t.Helper()
	s := &proc{snapDir: snapDir, exited: make(chan struct{})}
	args := append([]string{"serve", "--upstream", upstream, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--snapshot-dir", s.snapDir, "--log-level", "debug"}, flags...)
	s.cmd = command(anvilBinary(t), args...)
	s.cmd.Stdout, s.cmd.Stderr = &s.stdout, &s.stderr
	require.NoError(t, s.cmd.Start())
	go func() {
		err := s.cmd.Wait()
		s.exitedAt = time.Now()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			s.code = ee.ExitCode()
		} else if err != nil {
			s.code = -1
		}
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			s.cmd.Process.Kill()
			<-s.exited
		}
	})
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(s.stderr.String(), "\n") {
			var l struct{ Msg, Listen, Listener, Addr string }
			if json.Unmarshal([]byte(line), &l) != nil {
				continue
			}
			switch {
			case l.Msg == "anvilproxy serving":
				s.proxyURL = "http://" + l.Listen
			case l.Msg == "listening" && l.Listener == "admin":
				s.adminURL = "http://" + l.Addr
			}
		}
		return s.proxyURL != "" && s.adminURL != ""
	}, 10*time.Second, 10*time.Millisecond, "the server never listened:\n%s", s.stderr.String())
	return s
}

// signal sends SIGTERM and returns when: stamped before sending, so that
// a duration measured from it is never short, however late this goroutine
// runs again.
func (s *proc) signal(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	return at
}

// hasExited reports whether the process has exited.
func (s *proc) hasExited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// waitLog waits until the process has logged a line containing substr.
func (s *proc) waitLog(t *testing.T, substr string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), substr) }, 10*time.Second, 2*time.Millisecond,
		"no %s in the log:\n%s", substr, s.stderr.String())
}

// wait waits up to d for the process to exit and returns its exit code.
func (s *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-s.exited:
		return s.code
	case <-time.After(d):
		// SIGQUIT makes the Go runtime print every goroutine's stack: the
		// failure shows where the exit hung.
		_ = s.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("the server did not exit within %v (its goroutines after SIGQUIT at the end):\n%s", d, s.stderr.String())
		return 0
	}
}

// snapshots returns the snapshot files the server wrote.
func (s *proc) snapshots(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	entries, err := os.ReadDir(s.snapDir)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(s.snapDir, e.Name()))
		require.NoError(t, err)
		files[e.Name()] = b
	}
	return files
}

// tapUpstream wraps an upstream handler and keeps the exact body bytes it
// sent for each request, by its X-Test-Id header, and counts the requests
// whose connection closed before the handler finished.
type tapUpstream struct {
	h       http.Handler
	mu      sync.Mutex
	sent    map[string]*bytes.Buffer
	active  atomic.Int32
	dropped atomic.Int32
}

func (u *tapUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	buf := &bytes.Buffer{}
	u.mu.Lock()
	u.sent[r.Header.Get("X-Test-Id")] = buf
	u.mu.Unlock()
	u.active.Add(1)
	defer u.active.Add(-1)
	u.h.ServeHTTP(&tapWriter{ResponseWriter: w, u: u, buf: buf}, r)
	if r.Context().Err() != nil {
		u.dropped.Add(1)
	}
}

// begun is the number of test streams (requests with an X-Test-Id) whose
// response body the upstream has begun to send.
func (u *tapUpstream) begun() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for id, b := range u.sent {
		if id != "" && b.Len() > 0 {
			n++
		}
	}
	return n
}

func (u *tapUpstream) body(id string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sent[id].String()
}

type tapWriter struct {
	http.ResponseWriter
	u   *tapUpstream
	buf *bytes.Buffer
}

func (w *tapWriter) Write(p []byte) (int, error) {
	w.u.mu.Lock()
	w.buf.Write(p)
	w.u.mu.Unlock()
	return w.ResponseWriter.Write(p)
}

func (w *tapWriter) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }
func (w *tapWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// startTapSim serves a sim with a decode rate that makes streams of
// maxTokens last maxTokens/rate seconds.
func startTapSim(t *testing.T, rate float64) (*tapUpstream, string) {
	t.Helper()
	s, err := sim.New(sim.Config{Slots: 512, PrefillTokensPerSec: 1e6, DecodeTokensPerSec: rate, TokensPerEvent: 3})
	require.NoError(t, err)
	u := &tapUpstream{h: s, sent: map[string]*bytes.Buffer{}}
	hs := httptest.NewUnstartedServer(u)
	hs.Config = s.HTTPServer() // idle keep-alive close after 5 s, like uvicorn
	hs.Config.Handler = u
	hs.Start()
	t.Cleanup(hs.Close)
	return u, hs.URL
}

// streamResult is what one client stream got.
type streamResult struct {
	id     string
	status int
	body   string
	err    error
}

// startStreams starts n streamed chat requests of maxTokens each.
func startStreams(base string, n, maxTokens int) <-chan streamResult {
	out := make(chan streamResult, n)
	for i := 0; i < n; i++ {
		go func() {
			id := fmt.Sprintf("s%d", i)
			body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"stream %d"}]}`, maxTokens, i)
			req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("X-Test-Id", id)
			resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
			if err != nil {
				out <- streamResult{id: id, err: err}
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			out <- streamResult{id: id, status: resp.StatusCode, body: string(got), err: err}
		}()
	}
	return out
}

// shortRequest sends one streamed request of a single token and waits
// for its end, so that the window holds a finished request.
func shortRequest(t *testing.T, base string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"short"}]}`))
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
}

// fetch returns the body of a GET.
func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, url)
	return string(b)
}

// sumSeries adds up every series of a metric family in Prometheus text.
func sumSeries(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		var v float64
		fields := strings.Fields(line)
		if len(fields) >= 2 {
			fmt.Sscan(fields[len(fields)-1], &v)
			if len(fields) >= 3 { // value then timestamp
				fmt.Sscan(fields[len(fields)-2], &v)
			}
		}
		sum += v
	}
	return sum
}
