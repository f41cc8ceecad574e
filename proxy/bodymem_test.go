package proxy

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestInflightBodyBytesBounded (L4): request bodies held at once are bounded
// by MaxInflightBodyBytes: while one large body is in flight, a second that
// would cross the bound gets 503 with Retry-After and reaches nothing
// upstream; once the first is done, the same request goes through.
func TestInflightBodyBytesBounded(t *testing.T) {
	release := make(chan struct{})
	var hits atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if hits.Add(1) == 1 {
			<-release
		}
		io.WriteString(w, "{}")
	})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the upstream's own cleanup
	log := newTraceLog()
	const body = 600 << 10
	base, _ := startProxy(t, Config{Upstream: up.URL, MaxInflightBodyBytes: 1 << 20}, log)
	first := make(chan exchange, 1)
	go func() { first <- post(t, base+"/v1/chat/completions", strings.Repeat("a", body)) }()
	require.Eventually(t, func() bool { return hits.Load() == 1 }, 5*time.Second, 5*time.Millisecond)

	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(strings.Repeat("b", body)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	tr := log.next(t)
	require.Equal(t, ErrOverloaded, tr.ErrKind, "%v %v", tr.ErrKind, tr.Status)
	require.Equal(t, SideProxy, tr.ErrSide)
	require.Equal(t, int32(1), hits.Load())

	once.Do(func() { close(release) })
	require.Equal(t, 200, (<-first).status)
	log.next(t)
	require.Equal(t, 200, post(t, base+"/v1/chat/completions", strings.Repeat("b", body)).status, "the bound was not given back")
}

// TestSlowBodyLiarsCannotStarve (L4b): sixteen clients that declare a
// large body and send 9 KB of it hold only what they sent (their buffer's
// first step), so that an honest POST is served at once. The bound used to
// be reserved for the declared length before any body byte arrived, and
// kept every POST at 503 for the whole read timeout.
func TestSlowBodyLiarsCannotStarve(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "{}")
	})
	const budget = 16 << 20
	base, p := startProxy(t, Config{Upstream: up.URL, MaxInflightBodyBytes: budget, ReadTimeout: time.Minute}, newTraceLog())
	for range 16 {
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n"+strings.Repeat("a", 9000))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return p.bodyBytes.Load() >= 16*9000 }, 5*time.Second, 5*time.Millisecond,
		"the liars' bodies are being read")
	require.LessOrEqual(t, p.bodyBytes.Load(), int64(16*bodyStepMin), "a liar holds more than its first step")
	ex := post(t, base+"/v1/chat/completions", strings.Repeat("b", 1<<20))
	require.Equal(t, 200, ex.status, "slow liars starved an honest client")
}
