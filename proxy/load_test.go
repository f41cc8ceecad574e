package proxy

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// proxyGoroutines counts the goroutines that serve a request: fasthttp's
// per-connection loop, the client watcher, and anything running in a relay.
// Idle fasthttp workers and timers are left out: they sleep out their
// period and are goleak's business.
func proxyGoroutines() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("fasthttp.(*Server).serveConn")) ||
			bytes.Contains(g, []byte("proxy.clientWatcher")) ||
			bytes.Contains(g, []byte("proxy.(*relay)")) {
			n++
		}
	}
	return n
}

// requireDrained waits until the proxy holds no request, no goroutine for
// one, and no more goroutines overall than at baseline (plus slack for
// fasthttp's idle workers, which exit within 10 s).
func requireDrained(t *testing.T, p *Proxy, client *http.Transport) {
	t.Helper()
	client.CloseIdleConnections()
	require.Eventually(t, func() bool { return p.Inflight() == 0 && proxyGoroutines() == 0 }, 5*time.Second, 10*time.Millisecond,
		"inflight %d, goroutines serving requests %d", p.Inflight(), proxyGoroutines())
}

// TestManyConcurrentStreams (B3): 500 streams at once, a token every 20 ms,
// on this machine's cores: none fails or is altered, and the proxy returns
// to holding nothing.
func TestManyConcurrentStreams(t *testing.T) {
	const streams, events = 500, 5
	up := scriptedUpstream(t, events, 20*time.Millisecond)
	want := scriptedBody(events)
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up}, log)
	go func() { // traceLog.done holds 1024; drain it for 500 requests
		for i := 0; i < streams; i++ {
			<-log.done
		}
	}()
	transport := &http.Transport{MaxIdleConnsPerHost: streams}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	baseline := runtime.NumGoroutine()

	var failed atomic.Int32
	var firstErr sync.Once
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
			if err == nil {
				var got []byte
				got, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && (resp.StatusCode != 200 || string(got) != want) {
					err = io.ErrUnexpectedEOF
				}
			}
			if err != nil {
				failed.Add(1)
				firstErr.Do(func() { t.Errorf("stream failed: %v", err) })
			}
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("%d streams in %v; %d goroutines over baseline before draining",
		streams, time.Since(began).Round(time.Millisecond), runtime.NumGoroutine()-baseline)
	require.Zero(t, failed.Load())
	require.Eventually(t, func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return len(log.traces) == streams
	}, 5*time.Second, 10*time.Millisecond)
	log.mu.Lock()
	for _, tr := range log.traces {
		require.Equal(t, ErrNone, tr.ErrKind)
	}
	log.mu.Unlock()
	requireDrained(t, p, transport)
}

// TestStreamedResponseMemoryBounded (L4): a long fast stream passes
// through with the proxy's heap flat: the relay holds one read, the
// measuring tap one event.
func TestStreamedResponseMemoryBounded(t *testing.T) {
	total := int64(128 << 20)
	if raceEnabled {
		total = 32 << 20
	}
	ev := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 4000) + "\"}}]}\n\n")
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		for sent := int64(0); sent < total; sent += int64(len(ev)) {
			if _, err := w.Write(ev); err != nil {
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	close(stop)
	<-sampled
	require.NoError(t, err)
	require.Greater(t, n, total)
	tr := log.next(t)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.Equal(t, n, tr.RespBytes)
	grew := int64(peak.Load()) - int64(before.HeapInuse)
	t.Logf("%d MiB streamed; peak heap in use %+d MiB", n>>20, grew>>20)
	require.Less(t, grew, int64(16<<20), "the proxy accumulated the stream")
}
