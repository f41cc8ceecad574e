package proxy

import (
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// panicOnce is a Recorder whose first Record panics with request data in
// the panic value.
type panicOnce struct {
	*traceLog
	fired atomic.Bool
}

func (p *panicOnce) Record(t *Trace) {
	if p.fired.CompareAndSwap(false, true) {
		panic("CANARY-in-panic-value")
	}
	p.traceLog.Record(t)
}

// TestHandlerPanicContained: a bug in one request answers 500, keeps the
// process serving, releases what the request held, is counted with kind
// internal, and logs no panic value.
func TestHandlerPanicContained(t *testing.T) {
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone.Close() // nothing listens: every request takes the 502 path inside the handler
	var logs logBuffer
	rec := &panicOnce{traceLog: newTraceLog()}
	p, err := New(Config{Upstream: "http://" + gone.Addr().String(), MaxInflight: 1, MaxUpstreamConns: 1, MaxConnWait: time.Second}, debugLogger(&logs), rec)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := p.Server()
	go srv.Serve(p.Listener(ln)) //nolint:errcheck // as serve does: the event loop needs its countedConn
	t.Cleanup(func() { _ = srv.Shutdown() })
	base := "http://" + ln.Addr().String()

	resp, err := http.Post(base+"/v1/models", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)

	// With one limiter slot and one upstream connection, a leaked slot
	// would block this request.
	resp, err = http.Post(base+"/v1/models", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	tr := rec.next(t) // the panicked request is counted too
	require.Equal(t, ErrInternal, tr.ErrKind)
	require.Equal(t, SideProxy, tr.ErrSide)
	require.Equal(t, http.StatusInternalServerError, tr.Status)
	require.Equal(t, ErrConnect, rec.next(t).ErrKind)
	require.Zero(t, p.Inflight())
	require.Contains(t, logs.String(), "BUG: request handler panicked")
	require.NotContains(t, logs.String(), "CANARY")
}
