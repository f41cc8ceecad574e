package proxy

import (
	"io"
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
