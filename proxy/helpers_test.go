package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// traceLog is a Recorder that keeps every Trace for assertions.
type traceLog struct {
	mu     sync.Mutex
	traces []Trace
	relays int
	gaps   []time.Duration
	done   chan struct{} // receives one value per Record
	read   int           // traces returned by next
}

func newTraceLog() *traceLog { return &traceLog{done: make(chan struct{}, 1024)} }

func (l *traceLog) Record(t *Trace) {
	l.mu.Lock()
	l.traces = append(l.traces, *t)
	l.mu.Unlock()
	l.done <- struct{}{}
}

func (l *traceLog) ObserveRelay(time.Duration) {
	l.mu.Lock()
	l.relays++
	l.mu.Unlock()
}

func (l *traceLog) ObserveGap(d time.Duration) {
	l.mu.Lock()
	l.gaps = append(l.gaps, d)
	l.mu.Unlock()
}

// next waits for the next recorded Trace, in the order they were recorded.
func (l *traceLog) next(t *testing.T) Trace {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(5 * time.Second):
		t.Fatal("no trace recorded within 5s")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.read++
	return l.traces[l.read-1]
}

// startProxy serves a Proxy for cfg on a loopback port and returns its base URL.
func startProxy(t *testing.T, cfg Config, rec Recorder) (string, *Proxy) {
	t.Helper()
	p, err := New(cfg, zap.NewNop(), rec)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := p.Server()
	go srv.Serve(p.Listener(ln)) //nolint:errcheck // ends at Shutdown; the listener serve uses
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String(), p
}

// rawPost sends a request on a fresh connection and returns the connection
// without reading the response.
func rawPost(t *testing.T, base, path, body string, header ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	for i := 0; i+1 < len(header); i += 2 {
		req += header[i] + ": " + header[i+1] + "\r\n"
	}
	req += "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	_, err = c.Write([]byte(req))
	require.NoError(t, err)
	return c
}

// rawDial sends raw on a new connection to the proxy and returns the
// reader of what comes back.
func rawDial(t *testing.T, base, raw string) (*bufio.Reader, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(c, raw)
	require.NoError(t, err)
	return bufio.NewReader(c), c
}

// upstreamConns counts p's open upstream connections, idle and busy.
func upstreamConns(p *Proxy) int {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	return len(p.pool.idle) + len(p.pool.busy)
}

// keepAliveClient is an HTTP client whose connections to the proxy stay
// open until the test ends.
func keepAliveClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// startUpstream serves h on a loopback port.
func startUpstream(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

// sseHeaders sets the headers of an SSE response.
func sseHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
}

// logBuffer is a zap sink that tests can read while servers write to it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) Sync() error { return nil }

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// debugLogger returns a debug-level JSON logger writing to b.
func debugLogger(b *logBuffer) *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), b, zap.DebugLevel))
}
