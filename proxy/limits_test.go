package proxy

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests of this file hold the proxy to its limits and timeouts
// (RELIABILITY.md §6.3): big legitimate requests pass, abusive ones
// are cut, and no timeout is a total over a stream.

// TestLargeLegitimatePromptPasses (L3): an 8 MiB chat request, a long
// agent context, reaches the upstream byte for byte under the default
// 64 MiB limit; the live heap grows by a few times the body at most
// (3–4× measured: the body buffer grown by appends, old and new arrays
// both live while it grows, and the prefix tracker's pass over it), and
// nothing of it is kept afterwards.
func TestLargeLegitimatePromptPasses(t *testing.T) {
	const size = 8 << 20
	content := bytes.Repeat([]byte("fn main() { println!(\"hello\"); } // "), size/36)
	body := append(append([]byte(`{"model":"m","messages":[{"role":"user","content":"`), content...), `"}]}`...)
	sum := sha256.Sum256(body)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		io.Copy(h, r.Body)
		if !bytes.Equal(h.Sum(nil), sum[:]) {
			http.Error(w, "body altered", 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":2000000,"completion_tokens":1}}`)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)

	// A low GOGC keeps HeapAlloc close to the live heap, so that its peak
	// measures what the proxy holds rather than when the GC ran.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
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
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	for i := 0; i < 3; i++ {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, string(got))
		tr := log.next(t)
		require.Equal(t, int64(len(body)), tr.ReqBytes)
		require.Equal(t, int64(2000000), tr.PromptTokens)
	}
	close(stop)
	<-sampled
	grew := int64(peak.Load()) - int64(before.HeapAlloc)
	var end runtime.MemStats
	runtime.ReadMemStats(&end)
	t.Logf("peak heap growth %d MiB, %d MiB allocated per request, for a %d MiB body", grew>>20, (end.TotalAlloc-before.TotalAlloc)/3>>20, len(body)>>20)
	require.Less(t, grew, int64(6*len(body)), "the proxy holds more than a few copies of the body")

	var after runtime.MemStats
	runtime.GC()
	runtime.GC() // sync.Pool's victim cache goes on the second
	runtime.ReadMemStats(&after)
	require.Less(t, int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(len(body)/2), "a request body outlived its request")
}

// TestHeaderSizeLimit (L1): a header block just under the limit is
// proxied whole; just over it gets 431 and a closed connection, and the
// upstream never hears of it.
func TestHeaderSizeLimit(t *testing.T) {
	const limit = 8 << 10
	seen := make(chan int, 2)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { seen <- len(r.Header.Get("X-Big")) })
	base, _ := startProxy(t, Config{Upstream: up.URL, MaxHeaderBytes: limit}, newTraceLog())
	for _, tt := range []struct {
		size, want int
	}{{limit - 256, 200}, {limit + 256, 431}} {
		resp := rawExchange(t, base, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", tt.size)+"\r\n\r\n")
		resp.Body.Close()
		require.Equal(t, tt.want, resp.StatusCode, "header of %d bytes", tt.size)
		if tt.want == 200 {
			require.Equal(t, tt.size, <-seen)
		} else {
			require.True(t, resp.Close)
		}
	}
	require.Empty(t, seen, "an oversized request reached the upstream")
}

// TestSlowlorisDoesNotStarveOthers (T1): 200 connections trickling their
// headers a byte at a time neither slow down a normal client nor outlive
// the read timeout.
func TestSlowlorisDoesNotStarveOthers(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	const readTimeout = time.Second
	base, _ := startProxy(t, Config{Upstream: up.URL, ReadTimeout: readTimeout}, newTraceLog())
	const slow = 200
	cut := make(chan time.Duration, slow)
	start := time.Now()
	for i := 0; i < slow; i++ {
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		go func() {
			io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
			for j := 0; j < 30; j++ {
				if _, err := c.Write([]byte("a")); err != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			io.Copy(io.Discard, c)
			cut <- time.Since(start)
		}()
	}
	client := &http.Client{Transport: &http.Transport{}}
	took := make([]time.Duration, 20)
	for i := range took {
		began := time.Now()
		resp, err := client.Get(base + "/v1/models")
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		took[i] = time.Since(began)
		time.Sleep(20 * time.Millisecond) // spread over the slowloris trickle: the subject, not an ordering
	}
	slices.Sort(took)
	// A proxy that starves the normal client makes it wait for a worker the
	// slowloris connections hold, until the read timeout frees one: every
	// request about a second. The median shows a general slowdown; the
	// worst gets half the read timeout, as one request on a loaded machine
	// can be late for reasons of its own.
	bound := 50 * time.Millisecond
	if raceEnabled {
		bound = 250 * time.Millisecond
	}
	require.Less(t, took[len(took)/2], bound, "slowloris connections slowed normal requests: %v", took)
	require.Less(t, took[len(took)-1], readTimeout/2, "a normal request waited for a slowloris connection: %v", took)
	for i := 0; i < slow; i++ {
		d := <-cut
		// Uncut, a connection trickles for 3 s and then waits 5 s more.
		require.Less(t, d, 2*readTimeout+time.Second/2, "a slowloris connection outlived the read timeout")
	}
}

// TestLongStreamNotKilledByTotalTimeouts (T3): a stream far longer than
// every configured timeout, never idle that long, arrives whole. The
// timeouts are five gaps long, so that a gap stretched by a loaded machine
// does not reach one.
func TestLongStreamNotKilledByTotalTimeouts(t *testing.T) {
	up := scriptedUpstream(t, 20, 100*time.Millisecond)
	log := newTraceLog()
	short := 500 * time.Millisecond
	base, _ := startProxy(t, Config{Upstream: up, ReadTimeout: short, ClientWriteTimeout: short, UpstreamReadTimeout: short}, log)
	got := post(t, base+"/v1/chat/completions", `{"stream":true}`)
	require.NoError(t, got.readErr)
	require.Equal(t, scriptedBody(20), string(got.body))
	require.Greater(t, got.took, 3*short)
	require.Equal(t, ErrNone, log.next(t).ErrKind)
}

// TestUpstreamIdleTimeoutClosesUpstream (T4): an upstream that stalls
// mid-stream is cut at the idle timeout, not before it (less 20% for where
// the stall is stamped) and well before twice it (the deadline runs at
// most an eighth late; the rest is room for a loaded machine), and it sees
// its connection close, so the engine stops.
func TestUpstreamIdleTimeoutClosesUpstream(t *testing.T) {
	const idle = 400 * time.Millisecond
	stalled, closed := make(chan time.Time, 1), make(chan time.Time, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		for i := 0; i < 3; i++ {
			io.WriteString(w, scriptedEvent(i))
			w.(http.Flusher).Flush()
		}
		stalled <- time.Now()
		<-r.Context().Done()
		closed <- time.Now()
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, UpstreamReadTimeout: idle}, log)
	got := post(t, base+"/v1/chat/completions", `{"stream":true}`)
	require.ErrorIs(t, got.readErr, io.ErrUnexpectedEOF)
	require.Equal(t, scriptedEvent(0)+scriptedEvent(1)+scriptedEvent(2), string(got.body))
	from := <-stalled
	select {
	case at := <-closed:
		d := at.Sub(from)
		require.Greater(t, d, idle*4/5, "cut after %v, before the idle timeout", d)
		require.Less(t, d, 2*idle, "cut after %v", d)
	case <-time.After(3 * time.Second):
		t.Fatal("the upstream never saw its connection close")
	}
	tr := log.next(t)
	require.Equal(t, ErrUpstreamTimeout, tr.ErrKind)
	require.Equal(t, SideUpstream, tr.ErrSide)
}
