package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// silentUpstream accepts connections and never answers: the start probe
// is still waiting when the stack stops.
func silentUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestAdminPortBusy: with the admin port taken, serve fails naming
// --admin-listen, and the start probe it cancels on the way out logs no
// false "upstream unreachable … context canceled" (issue 27, 6).
func TestAdminPortBusy(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	var f serveFlags
	f.register(flag.NewFlagSet("serve", flag.ContinueOnError))
	f.listen, f.adminListen, f.upstream = "127.0.0.1:0", busy.Addr().String(), silentUpstream(t)
	logs := &lockedBuffer{}
	log, err := newLogger(logs, "info")
	require.NoError(t, err)
	start := time.Now()
	_, err = startStack(&f, log)
	require.Error(t, err)
	require.Less(t, time.Since(start), 3*time.Second, "the failure does not wait for the probe")
	require.Contains(t, err.Error(), "--admin-listen "+busy.Addr().String())
	require.Contains(t, err.Error(), "address already in use: another process listens there; choose a free one")
	require.NotContains(t, logs.String(), "upstream unreachable")
	require.NotContains(t, logs.String(), "context canceled")

	f.adminListen, f.listen = "127.0.0.1:0", busy.Addr().String()
	_, err = startStack(&f, log)
	require.ErrorContains(t, err, "--listen "+busy.Addr().String())
	require.False(t, strings.Contains(logs.String(), "upstream unreachable"), logs.String())
}

// TestSignalEchoDrains: SIGTERM twice at once, as GNU timeout sends it (to
// the process, then to its process group), is one request to drain: the
// stream in flight finishes whole, the final snapshot is written and the
// process exits 0 (issue 27, 8).
func TestSignalEchoDrains(t *testing.T) {
	up, upURL := startTapSim(t, 60) // 90 tokens: 1.5 s a stream
	s := startProc(t, upURL)
	results := startStreams(s.proxyURL, 1, 90)
	require.Eventually(t, func() bool { return up.begun() == 1 }, 10*time.Second, 5*time.Millisecond)
	s.signal(t)
	s.signal(t)
	r := <-results
	require.NoError(t, r.err)
	require.True(t, strings.HasSuffix(r.body, "data: [DONE]\n\n"), "the stream was cut")
	require.Equal(t, 0, s.wait(t, 10*time.Second), s.stderr.String())
	require.NotContains(t, s.stderr.String(), "exiting at once")
	require.Len(t, s.snapshots(t), 1, "the final snapshot")
}

// TestSecondSignalAfterEcho: secondSignal ignores signals before the echo
// window ends and returns at the first one after it.
func TestSecondSignalAfterEcho(t *testing.T) {
	sigc := make(chan os.Signal, 2)
	echoEnd := make(chan time.Time)
	done := make(chan struct{})
	logs := &lockedBuffer{}
	log, err := newLogger(logs, "debug")
	require.NoError(t, err)
	go func() { secondSignal(sigc, time.Now(), echoEnd, log); close(done) }()
	sigc <- syscall.SIGTERM // the echo
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "the same request") }, 5*time.Second, time.Millisecond)
	select {
	case <-done:
		t.Fatal("the echo ended the drain")
	default:
	}
	echoEnd <- time.Now()
	sigc <- syscall.SIGINT
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a later signal did not return")
	}
}

// TestStreamBound: the warning follows what a limit holds: 20,000
// descriptors hold 9,872 streams and do not warn; the default 1024 does
// (issue 27, 8).
func TestStreamBound(t *testing.T) {
	for _, c := range []struct {
		fds   uint64
		bound int
		warn  bool
	}{{20000, 9872, false}, {1024, 384, true}, {128, 48, true}, {8448, 4096, false}, {8447, 4095, true}, {1 << 20, 524160, false}} {
		bound, warn := streamBound(c.fds)
		require.Equal(t, c.bound, bound, c.fds)
		require.Equal(t, c.warn, warn, c.fds)
	}
}

// TestAdminPortMisdirected: an agent pointed at the admin port gets an
// error object that the OpenAI and Anthropic SDKs print, naming the proxy
// listener's base URL, and the log says so once (issue 27, 3).
func TestAdminPortMisdirected(t *testing.T) {
	st, logs := startStackFor(t, "sim")
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/chat/completions"}, {"POST", "/v1/messages"}, {"POST", "/v1/responses"}, {"GET", "/v1/models"}, {"POST", "/chat/completions"},
	} {
		req, err := http.NewRequest(c.method, st.adminURL+c.path, strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body struct {
			Type  string
			Error struct{ Message, Type, Code string }
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, c.path)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.Equal(t, "error", body.Type)
		require.Equal(t, "wrong_port", body.Error.Code)
		require.Contains(t, body.Error.Message, "use "+st.proxyURL+"/v1 as the base URL", c.path)
	}
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "an inference request came to the admin listener") }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), "an inference request came to the admin listener"), "rate-limited")
	code, _ := get(t, st.adminURL+"/metrics")
	require.Equal(t, http.StatusOK, code, "the admin endpoints are untouched")
	code, _ = get(t, st.adminURL+"/nothing")
	require.Equal(t, http.StatusNotFound, code)
}

// screen is a minimal terminal of width columns: text with autowrap,
// "\n", ESC[nA (cursor up) and ESC[2K (erase line); what refresh sends.
type screen struct {
	width, row, col int
	rows            []string
}

func (s *screen) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i++ {
		for s.row >= len(s.rows) {
			s.rows = append(s.rows, "")
		}
		switch {
		case p[i] == '\n':
			s.row, s.col = s.row+1, 0
		case p[i] == 0x1b:
			j := i + 2
			for j < len(p) && p[j] >= '0' && p[j] <= '9' {
				j++
			}
			n := 1
			if j > i+2 {
				n = 0
				for _, c := range p[i+2 : j] {
					n = 10*n + int(c-'0')
				}
			}
			switch p[j] {
			case 'A':
				s.row = max(0, s.row-n)
			case 'K':
				s.rows[s.row] = ""
			}
			i = j
		default:
			if s.col == s.width {
				s.row, s.col = s.row+1, 0
				for s.row >= len(s.rows) {
					s.rows = append(s.rows, "")
				}
			}
			r := []byte(s.rows[s.row])
			for len(r) < s.col {
				r = append(r, ' ')
			}
			s.rows[s.row] = string(append(r[:s.col], p[i]))
			s.col++
		}
	}
	return len(p), nil
}

// used is the number of rows with text.
func (s *screen) used() int {
	n := 0
	for _, r := range s.rows {
		if strings.TrimSpace(r) != "" {
			n++
		}
	}
	return n
}

// TestTopRedrawsInPlace: on a terminal, a table or an error wider than the
// terminal is redrawn in place, not appended row by row (issue 27, 9).
func TestTopRedrawsInPlace(t *testing.T) {
	long := errors.New("no answer from http://127.0.0.1:9464/status: dial tcp 127.0.0.1:9464: connect: connection refused (is anvilproxy serving there? --admin-listen sets the address)")
	scr := &screen{width: defaultWidth}
	get := func() (liveStatus, error) { return liveStatus{}, long }
	refresh(context.Background(), scr, true, time.Millisecond, 5, get, topRender)
	require.Equal(t, 3, scr.used(), "one error, three rows, redrawn five times:\n%s", strings.Join(scr.rows, "\n"))

	scr = &screen{width: defaultWidth}
	n := 0
	table := func() (liveStatus, error) {
		n++
		if n%2 == 0 {
			return liveStatus{}, long
		}
		return liveStatus{Requests: 1234, Recent: recentStats{Seconds: 15}, SLOs: "ttft=3s,tpot=50ms"}, nil
	}
	refresh(context.Background(), scr, true, time.Millisecond, 4, table, topRender)
	for _, r := range scr.rows {
		require.LessOrEqual(t, len(r), defaultWidth-1)
	}
	require.LessOrEqual(t, scr.used(), 9, "the table's rows, no leftovers:\n%s", strings.Join(scr.rows, "\n"))
	require.Contains(t, strings.Join(scr.rows, "\n"), "no answer from", "the newest draw is the error")
}

// TestStatusNamesItsWindows: /status says which window each figure covers:
// the counts and amplification since start (attempts per logical request
// over every request, not the retry tracker's last --retry-window), the
// percentiles over the recent span, and the snapshot window in progress
// with its length (issue 27, 5).
func TestStatusNamesItsWindows(t *testing.T) {
	st, _ := startStackFor(t, "sim", func(f *serveFlags) { f.snapshot.Interval = 90 * time.Second })
	for range 3 {
		st.chat(t) // one body three times: two retries
	}
	require.Eventually(t, func() bool { return st.tap.outcomes.requests.Load() == 3 }, 5*time.Second, 10*time.Millisecond)
	s := st.status(time.Now())
	require.Equal(t, 90.0, s.SnapshotWindow.Seconds)
	require.GreaterOrEqual(t, s.SnapshotWindow.Elapsed, 0.0)
	require.Less(t, s.SnapshotWindow.Elapsed, 90.0)
	require.InDelta(t, 3.0, float64(s.Amplification), 1e-9)
	rs := st.proxy.Retries().Stats()
	require.Equal(t, float64(rs.Attempts)/float64(rs.Logical), float64(s.Amplification))
	block := strings.Join(s.block("0:01"), "\n")
	require.Contains(t, block, "since start: 3 requests")
	require.Contains(t, block, "since start  goodput")
	require.Regexp(t, `last \d+s +\S+ req/s   cache hit`, block)
}

// TestBaselineDiffEndpoint: with --baseline, /diff compares the window in
// progress against it as "anvilproxy diff" does; without one it is 404; a
// baseline that cannot be read stops the start.
func TestBaselineDiffEndpoint(t *testing.T) {
	base := simSnapshots(t, 20, 3000)
	st, _ := startStackFor(t, "sim", func(f *serveFlags) {
		f.baseline = base
		f.sim = sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 1000}
	})
	for range 20 {
		st.chat(t)
	}
	code, body := get(t, st.adminURL+"/diff")
	require.Equal(t, http.StatusOK, code, body)
	var d snapshot.Diff
	require.NoError(t, json.Unmarshal([]byte(body), &d))
	require.Equal(t, int64(20), d.Baseline.Completed)
	require.Equal(t, int64(20), d.Current.Completed)
	require.Contains(t, d.Verdict, "decode slower")
	require.Len(t, d.Rows, len(snapshot.DiffRowNames))

	plain, _ := startStackFor(t, "sim")
	code, _ = get(t, plain.adminURL+"/diff")
	require.Equal(t, http.StatusNotFound, code)

	var f serveFlags
	f.register(flag.NewFlagSet("serve", flag.ContinueOnError))
	f.listen, f.adminListen, f.baseline = "127.0.0.1:0", "127.0.0.1:0", t.TempDir()
	_, err := startStack(&f, zap.NewNop())
	require.ErrorContains(t, err, "--baseline: ")
	require.ErrorContains(t, err, "a directory with no snapshot files")
}
