package main

import (
	"context"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// startTestStack starts serve's wiring on loopback ports, in front of a
// fast simulated engine.
func startTestStack(t *testing.T, cfg snapshot.Config) *stack {
	t.Helper()
	var f serveFlags
	f.register(flag.NewFlagSet("serve", flag.ContinueOnError))
	f.listen, f.adminListen = "127.0.0.1:0", "127.0.0.1:0"
	f.snapshot = cfg
	f.slos = sloFlag{{Metric: "ttft", Threshold: time.Second}}
	f.sim = sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 5000}
	st, err := startStack(&f, zap.NewNop())
	require.NoError(t, err)
	srv := st.proxy.Server()
	go srv.Serve(st.ln) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() {
		_ = srv.Shutdown()
		_ = st.close()
	})
	return st
}

// chat sends one streamed chat request through the proxy and checks that
// it was served whole.
func (st *stack) chat(t *testing.T) {
	t.Helper()
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":20,` +
		`"messages":[{"role":"user","content":"` + strings.Repeat("word ", 100) + `"}]}`
	resp, err := http.Post(st.proxyURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasSuffix(string(raw), "data: [DONE]\n\n"))
}

func (st *stack) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := st.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestSnapshotsAgainstSim: /snapshot serves the window in progress; the
// final snapshot at shutdown is a file that report reads.
func TestSnapshotsAgainstSim(t *testing.T) {
	dir := t.TempDir()
	st := startTestStack(t, snapshot.Config{Dir: dir, Interval: time.Hour})
	for range 3 {
		st.chat(t)
	}
	resp, err := http.Get(st.adminURL + "/snapshot")
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	doc, err := snapshot.Decode(raw)
	require.NoError(t, err)
	require.Equal(t, int64(3), doc.Completed)
	require.Equal(t, "m", *doc.Model)
	require.Equal(t, 3.0, doc.Metrics["ttft_samples"], "a read document holds JSON numbers")

	require.NoError(t, st.snaps.Close(context.Background()))
	files, err := filepath.Glob(filepath.Join(dir, "anvilproxy-*.json"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	code, out, errOut := runCmd("report", files[0])
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "3 requests: 3 completed, 0 failed")
	require.Contains(t, out, "ttft <= 1s")
}

// TestSnapshotDiskGone: the snapshot directory disappears under a running
// proxy. Every request is still served, the errors are counted, and
// windows keep rotating.
func TestSnapshotDiskGone(t *testing.T) {
	dir := t.TempDir()
	st := startTestStack(t, snapshot.Config{Dir: dir, Interval: 20 * time.Millisecond})
	require.NoError(t, os.RemoveAll(dir))
	deadline := time.Now().Add(10 * time.Second)
	for st.counter(t, "anvilproxy_snapshot_errors_total") < 2 {
		require.True(t, time.Now().Before(deadline), "no snapshot error counted")
		st.chat(t)
	}
	require.Zero(t, st.counter(t, "anvilproxy_snapshots_written_total"))
	require.NoError(t, st.snaps.Close(context.Background()))
}

// firstOutputs counts the first outputs passed to it.
type firstOutputs struct{ ids []uint64 }

func (f *firstOutputs) FirstOutput(tr *proxy.Trace) { f.ids = append(f.ids, tr.ID) }

// TestServeForwardsFirstOutputs: serve's proxy is given the tap, so the tap
// must be the proxy's FirstOutputObserver (proxy.New asks once) and hand
// each first output to the histo Recorder behind it; without that the
// split sees requests in flight only when they end (docs/queue-split.md).
func TestServeForwardsFirstOutputs(t *testing.T) {
	st := startTestStack(t, snapshot.Config{})
	require.Same(t, st.rec, st.tap.first, "serve wires the Recorder's live hook through the tap")

	var seen firstOutputs
	tp := &tap{next: proxy.NopRecorder{}, first: &seen}
	var rec proxy.Recorder = tp
	obs, ok := rec.(proxy.FirstOutputObserver)
	require.True(t, ok)
	obs.FirstOutput(&proxy.Trace{ID: 7})
	require.Equal(t, []uint64{7}, seen.ids)
	(&tap{next: proxy.NopRecorder{}}).FirstOutput(&proxy.Trace{ID: 8}) // nothing behind it: no panic
}
