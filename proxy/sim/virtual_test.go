package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The engine's pacing (prefill, decode rate, event gaps) is timers and
// time.Now, so its timing tests run in a testing/synctest bubble: the sim
// serves net.Pipe connections through its own http.Server, time is virtual,
// and a 200 ms prefill takes exactly 200 ms however loaded the machine is.
// Real sockets are not durably blocking, so these tests use pipes only.

// pipeListener is a net.Listener whose connections are net.Pipe pairs made
// by dial. Safe for concurrent use.
type pipeListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial is a Transport's DialContext: the server end goes to Accept.
func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// virtualSim is a sim served over pipes inside a bubble.
type virtualSim struct {
	s      *Server
	client *http.Client
	ln     *pipeListener
}

// startVirtual serves a sim for cfg in the calling bubble; the server,
// its connections and the client's are closed at cleanup, so that the
// bubble's goroutines end.
func startVirtual(t *testing.T, cfg Config) *virtualSim {
	t.Helper()
	s, err := New(cfg)
	require.NoError(t, err)
	ln := newPipeListener()
	hs := s.HTTPServer()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = hs.Serve(ln)
	}()
	tr := &http.Transport{DialContext: ln.dial}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		_ = hs.Close()
		<-served
	})
	return &virtualSim{s: s, client: &http.Client{Transport: tr}, ln: ln}
}

// dialRaw opens a connection of its own to the sim, for tests that speak
// HTTP/1.1 by hand.
func (v *virtualSim) dialRaw(t *testing.T) *rawConn {
	t.Helper()
	c, err := v.ln.dial(context.Background(), "", "")
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, br: bufio.NewReader(c)}
}

// post sends body as JSON to path; headers alternate names and values.
func (v *virtualSim) post(t *testing.T, ctx context.Context, path string, body any, headers ...string) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://sim"+path, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := v.client.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}
