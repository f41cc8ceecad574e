package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// scriptedEvent is event i of scriptedBody.
func scriptedEvent(i int) string {
	return fmt.Sprintf("data: {\"choices\":[{\"delta\":{\"content\":\"tok-%02d\"}}]}\n\n", i)
}

// scriptedBody is the whole body scriptedUpstream sends for n events.
func scriptedBody(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(scriptedEvent(i))
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// scriptedUpstream streams scriptedBody(n) with gap between events, one
// HTTP chunk per event. Query knobs: die=k aborts the connection after k
// events, gap=ms overrides the gap, close=1 answers with Connection: close, stall=1 never answers,
// status=k answers k with a small JSON body.
func scriptedUpstream(t *testing.T, n int, gap time.Duration) string {
	t.Helper()
	s := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		q := r.URL.Query()
		if q.Get("stall") != "" {
			<-r.Context().Done()
			return
		}
		if code, _ := strconv.Atoi(q.Get("status")); code != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, `{"error":{"message":"scripted"}}`)
			return
		}
		if q.Get("close") != "" {
			w.Header().Set("Connection", "close")
		}
		die, _ := strconv.Atoi(q.Get("die"))
		if ms, _ := strconv.Atoi(q.Get("gap")); ms > 0 {
			gap = time.Duration(ms) * time.Millisecond
		}
		sseHeaders(w)
		for i := 0; i < n; i++ {
			if die > 0 && i == die {
				panic(http.ErrAbortHandler)
			}
			io.WriteString(w, scriptedEvent(i))
			w.(http.Flusher).Flush()
			time.Sleep(gap)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	return s.URL
}

// exchange is what a client saw of one request.
type exchange struct {
	status  int
	body    []byte
	readErr error // from reading the body: nil for a complete response
	took    time.Duration
}

// post sends body to url on a client of its own and reads the response.
func post(t *testing.T, url, body string) exchange {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	return postOn(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, url, body)
}

// postOn is post on client, whose kept-alive connection the next call
// reuses: the proxy binds an upstream connection to a client connection.
func postOn(t *testing.T, client *http.Client, url, body string) exchange {
	t.Helper()
	start := time.Now()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	return exchange{status: resp.StatusCode, body: got, readErr: err, took: time.Since(start)}
}

// clientState is what the agent can tell about a response.
type clientState uint8

const (
	stateComplete  clientState = iota // 200, the whole body byte for byte, a clean end
	stateTruncated                    // 200, a strict prefix of the body, then an abort (no last chunk)
	stateError                        // a proxy-made 5xx
)

// TestFaultMatrix (U4) puts every toxic before the response headers and in
// the middle of the stream, in both directions: the proxy never panics,
// records the right outcome, and shows the client a complete stream byte
// for byte, a visibly truncated one, or a 5xx; TestMain's goleak check
// covers leaks.
func TestFaultMatrix(t *testing.T) {
	const events = 20
	up := strings.TrimPrefix(scriptedUpstream(t, events, 5*time.Millisecond), "http://")
	want := scriptedBody(events)
	const idle = 300 * time.Millisecond // the proxy's upstream idle timeout for every row
	tests := []struct {
		name   string
		tx     toxic
		query  string
		state  clientState
		status int // for stateError
		kind   ErrKind
	}{
		{"latency down", toxic{kind: toxicLatency, flow: flowDown, delay: 20 * time.Millisecond}, "", stateComplete, 0, ErrNone},
		{"latency up", toxic{kind: toxicLatency, flow: flowUp, delay: 20 * time.Millisecond}, "", stateComplete, 0, ErrNone},
		{"bandwidth down", toxic{kind: toxicBandwidth, flow: flowDown, rate: 32 << 10}, "", stateComplete, 0, ErrNone},
		{"slicer down", toxic{kind: toxicSlicer, flow: flowDown}, "", stateComplete, 0, ErrNone},
		{"slicer up", toxic{kind: toxicSlicer, flow: flowUp}, "", stateComplete, 0, ErrNone},
		{"reset_peer down pre-headers", toxic{kind: toxicResetPeer, flow: flowDown}, "", stateError, 502, ErrUpstreamBroken},
		{"reset_peer down mid-headers", toxic{kind: toxicResetPeer, flow: flowDown, after: 20}, "", stateError, 502, ErrUpstreamBroken},
		{"reset_peer down mid-stream", toxic{kind: toxicResetPeer, flow: flowDown, after: 400}, "", stateTruncated, 0, ErrUpstreamBroken},
		{"reset_peer up mid-request", toxic{kind: toxicResetPeer, flow: flowUp, after: 10}, "", stateError, 502, ErrUpstreamBroken},
		{"limit_data down mid-headers", toxic{kind: toxicLimitData, flow: flowDown, after: 20}, "", stateError, 502, ErrUpstreamBroken},
		{"limit_data down mid-stream", toxic{kind: toxicLimitData, flow: flowDown, after: 400}, "", stateTruncated, 0, ErrUpstreamBroken},
		{"limit_data up mid-request", toxic{kind: toxicLimitData, flow: flowUp, after: 10}, "", stateError, 502, ErrUpstreamBroken},
		{"timeout down pre-headers", toxic{kind: toxicTimeout, flow: flowDown}, "", stateError, 504, ErrUpstreamTimeout},
		{"timeout down mid-stream", toxic{kind: toxicTimeout, flow: flowDown, after: 400}, "", stateTruncated, 0, ErrUpstreamTimeout},
		{"timeout up mid-request", toxic{kind: toxicTimeout, flow: flowUp, after: 10}, "", stateError, 504, ErrUpstreamTimeout},
		{"slow_close down after a whole response", toxic{kind: toxicSlowClose, flow: flowDown, delay: time.Second}, "close=1", stateComplete, 0, ErrNone},
		{"slow_close down after the upstream died", toxic{kind: toxicSlowClose, flow: flowDown, delay: 200 * time.Millisecond}, "die=5", stateTruncated, 0, ErrUpstreamBroken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp := startFaultProxy(t, up, tt.tx)
			log := newTraceLog()
			base, p := startProxy(t, Config{Upstream: fp.URL(), UpstreamReadTimeout: idle}, log)
			got := post(t, base+"/v1/chat/completions?"+tt.query, `{"model":"m","stream":true}`)
			tr := log.next(t)
			switch tt.state {
			case stateComplete:
				require.Equal(t, http.StatusOK, got.status)
				require.NoError(t, got.readErr)
				require.Equal(t, want, string(got.body), "the stream was altered")
				if tt.tx.kind == toxicSlowClose {
					require.Less(t, got.took, tt.tx.delay, "the proxy waited for the upstream's close, not the end of the body")
				}
			case stateTruncated:
				require.Equal(t, http.StatusOK, got.status)
				require.ErrorIs(t, got.readErr, io.ErrUnexpectedEOF, "a broken stream must end without the last chunk")
				require.Less(t, len(got.body), len(want))
				require.True(t, strings.HasPrefix(want, string(got.body)), "the bytes before the fault were altered")
			case stateError:
				require.Equal(t, tt.status, got.status)
				require.NoError(t, got.readErr)
				require.Contains(t, string(got.body), `"code":`+strconv.Itoa(tt.status))
			}
			require.Equal(t, tt.kind, tr.ErrKind)
			if tt.kind != ErrNone {
				require.Equal(t, SideUpstream, tr.ErrSide)
			}
			require.Equal(t, got.status, tr.Status)
			if tt.state != stateError {
				require.Equal(t, int64(len(got.body)), tr.RespBytes, "the trace counts what the client got")
			}
			require.Eventually(t, func() bool { return p.Inflight() == 0 }, 5*time.Second, 5*time.Millisecond)
			require.Positive(t, fp.accepted.Load())
		})
	}
}

// TestOutcomeAccounting (M2): every request ends in exactly one Trace with
// exactly one outcome, for every way a request can end: Σ per-kind counts
// equals the number of requests, and no Trace is emitted twice or late.
func TestOutcomeAccounting(t *testing.T) {
	up := scriptedUpstream(t, 5, 5*time.Millisecond)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	log := newTraceLog()
	idle := 300 * time.Millisecond
	base, pMain := startProxy(t, Config{Upstream: up, UpstreamReadTimeout: idle, MaxBodyBytes: 1 << 10}, log)
	unreachable, pDead := startProxy(t, Config{Upstream: deadURL}, log)
	oneConn, pOne := startProxy(t, Config{Upstream: up, UpstreamReadTimeout: idle, MaxUpstreamConns: 1, MaxConnWait: 50 * time.Millisecond}, log)
	oneSlot, pSlot := startProxy(t, Config{Upstream: up, UpstreamReadTimeout: idle, MaxInflight: 1, MaxQueueWait: 50 * time.Millisecond}, log)

	tally := map[ErrKind]int{}
	requests := 0
	expect := func(kind ErrKind, side Side, status int) {
		t.Helper()
		tr := log.next(t)
		require.Equal(t, kind, tr.ErrKind, "trace %d", tr.ID)
		require.Equal(t, side, tr.ErrSide, "trace %d", tr.ID)
		require.Equal(t, status, tr.Status, "trace %d", tr.ID)
		tally[tr.ErrKind]++
	}
	do := func(url, body string) exchange { requests++; return post(t, url, body) }
	stream := `{"stream":true}`

	do(base+"/v1/chat/completions", stream)
	expect(ErrNone, SideNone, 200)
	do(base+"/v1/chat/completions?status=429", stream)
	expect(ErrNone, SideNone, 429) // the engine's answer, relayed: a failed request, not a proxy error
	do(base+"/v1/chat/completions?die=2", stream)
	expect(ErrUpstreamBroken, SideUpstream, 200)
	do(base+"/v1/chat/completions?stall=1", stream)
	expect(ErrUpstreamTimeout, SideUpstream, 504)
	do(unreachable+"/v1/chat/completions", stream)
	expect(ErrConnect, SideUpstream, 502)
	do(base+"/v1/chat/completions", strings.Repeat("x", 4<<10))
	expect(ErrBodyTooLarge, SideClient, 413)

	requests++ // a client that leaves mid-stream
	resp, err := http.Post(base+"/v1/chat/completions?gap=50", "application/json", strings.NewReader(stream))
	require.NoError(t, err)
	buf := make([]byte, 10)
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	resp.Body.Close()
	expect(ErrClientGone, SideClient, 200)

	for _, raw := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", // rejected by the handler
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",                 // rejected by fasthttp's reader
	} {
		requests++
		resp := rawExchange(t, base, raw)
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode)
		expect(ErrBadRequest, SideClient, 400)
	}

	for _, tc := range []struct {
		base string
		kind ErrKind
		code int
	}{{oneConn, ErrPoolExhausted, 503}, {oneSlot, ErrLimited, 503}} {
		hog := make(chan exchange, 1)
		requests++
		go func() { hog <- post(t, tc.base+"/v1/chat/completions?stall=1", stream) }()
		require.Eventually(t, func() bool { return pOne.upstream.Load()+pSlot.upstream.Load() == 1 }, 5*time.Second, time.Millisecond)
		got := do(tc.base+"/v1/chat/completions", stream)
		require.Equal(t, tc.code, got.status)
		expect(tc.kind, SideProxy, tc.code)
		require.Equal(t, 504, (<-hog).status)
		expect(ErrUpstreamTimeout, SideUpstream, 504)
	}

	total := 0
	for _, n := range tally {
		total += n
	}
	require.Equal(t, requests, total, "Σ outcomes == requests")
	for k := ErrNone; k <= ErrLimited; k++ {
		require.Positive(t, tally[k], "outcome %q never exercised", k)
	}
	select {
	case <-log.done:
		t.Fatal("a request was recorded twice")
	case <-time.After(200 * time.Millisecond):
	}
	for _, p := range []*Proxy{pMain, pDead, pOne, pSlot} {
		require.Zero(t, p.Inflight())
	}
}
