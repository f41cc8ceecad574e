//go:build !race

package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// The relay loop end to end: an upstream streams N chat chunks back to back
// over loopback, through a real Proxy with the real histo.Recorder (so SSE
// parsing, classification and recording are in), to a client reading the
// raw bytes. The upstream and the client allocate nothing per event, so
// the allocations counted per event are the proxy's.
//
// This file is excluded under -race: the race detector changes both the
// timings and the allocation counts.

// relayEvent is one streamed chat chunk, of the size engines send for a few
// tokens.
const relayEvent = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"m",` +
	`"choices":[{"index":0,"delta":{"content":" tokens"},"finish_reason":null}]}` + "\n\n"

type relayEnv struct {
	up, srv *fasthttp.Server
	conn    net.Conn
	addr    string
	req     []byte
	buf     []byte
	n       int
}

func newRelayEnv(tb testing.TB) *relayEnv {
	tb.Helper()
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	up := &fasthttp.Server{Handler: serveEvents, CloseOnShutdown: true}
	go up.Serve(upLn) //nolint:errcheck // ends at Shutdown

	rec, err := histo.New(histo.Config{}, prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	p, err := proxy.New(proxy.Config{Upstream: "http://" + upLn.Addr().String()}, zap.NewNop(), rec)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e := &relayEnv{up: up, srv: p.Server(), addr: ln.Addr().String(), buf: make([]byte, 64<<10)}
	go e.srv.Serve(p.Listener(ln)) //nolint:errcheck // ends at Shutdown; as serve does (the event loop, under -loop, needs it)
	if e.conn, err = net.Dial("tcp", e.addr); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		e.conn.Close()
		_ = e.srv.Shutdown()
		_ = up.Shutdown()
	})
	return e
}

// serveEvents streams ?events=N chunks, one write and flush each.
func serveEvents(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStream(&eventSource{n: ctx.QueryArgs().GetUintOrZero("events")}, -1)
}

// The events as bytes: io.WriteString would convert, and allocate, per write.
var relayEventBytes, relayDoneBytes = []byte(relayEvent), []byte("data: [DONE]\n\n")

type eventSource struct{ n int }

func (s *eventSource) SupportsBodyWriteTo() bool { return true }

func (s *eventSource) Read([]byte) (int, error) { return 0, io.EOF }

func (s *eventSource) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for range s.n {
		n, err := w.Write(relayEventBytes)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	n, err := w.Write(relayDoneBytes)
	return total + int64(n), err
}

// stream sends one streamed chat request for events events and reads the
// response to its last chunk. It allocates nothing in steady state.
func (e *relayEnv) stream(tb testing.TB, events int) {
	e.n++
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"request `
	r := append(e.req[:0], "POST /v1/chat/completions?events="...)
	r = strconv.AppendInt(r, int64(events), 10)
	r = append(r, " HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: "...)
	n := len(body) + len(strconv.AppendInt(e.buf[:0], int64(e.n), 10)) + len(`"}]}`)
	r = strconv.AppendInt(r, int64(n), 10)
	r = append(r, "\r\n\r\n"...)
	r = append(r, body...)
	r = strconv.AppendInt(r, int64(e.n), 10)
	r = append(r, `"}]}`...)
	e.req = r
	if _, err := e.conn.Write(r); err != nil {
		tb.Fatal(err)
	}
	// The body ends with the last chunk, "0\r\n\r\n"; the headers end first
	// with their own blank line.
	var tail [8]byte
	t := 0
	inBody := false
	for {
		k, err := e.conn.Read(e.buf)
		if err != nil {
			tb.Fatal(err)
		}
		for _, c := range e.buf[:k] {
			copy(tail[:], tail[1:])
			tail[7] = c
			t++
			if !inBody && t >= 4 && bytes.Equal(tail[4:], []byte("\r\n\r\n")) {
				inBody, t = true, 0
			} else if inBody && t >= 5 && bytes.Equal(tail[3:], []byte("0\r\n\r\n")) && tail[2] == '\n' {
				return
			}
		}
	}
}

// BenchmarkRelay is one stream per op. ns/event is wall time per event with
// the upstream, proxy and client sharing the CPUs and the upstream writing
// back to back (so reads may carry several events); allocs/event includes
// the per-request allocations spread over the stream, which the longer
// stream shows to be all there is.
func BenchmarkRelay(b *testing.B) {
	for _, events := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("events=%d", events), func(b *testing.B) {
			e := newRelayEnv(b)
			for range 3 {
				e.stream(b, events) // warm the pools and connections
			}
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				e.stream(b, events)
			}
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			total := float64(b.N * events)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/event")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/total, "allocs/event")
		})
	}
}

// TestRelayAllocsPerEvent: the relay allocates per request, never per
// event. A stream of 10,000 events must allocate no more than one of 10
// (beyond noise from background goroutines): docs/design.md "Rules the code keeps".
func TestRelayAllocsPerEvent(t *testing.T) {
	e := newRelayEnv(t)
	for range 3 {
		e.stream(t, 10)
		e.stream(t, 10_000)
	}
	mallocs := func(events, runs int) float64 {
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for range runs {
			e.stream(t, events)
		}
		runtime.ReadMemStats(&ms1)
		return float64(ms1.Mallocs-ms0.Mallocs) / float64(runs)
	}
	short := mallocs(10, 20)
	long := mallocs(10_000, 5)
	perEvent := (long - short) / (10_000 - 10)
	t.Logf("allocations per stream: %.1f with 10 events, %.1f with 10,000; per event: %.4f", short, long, perEvent)
	if perEvent > 0.01 {
		t.Errorf("the relay allocates per event: %.4f allocations per event (%.1f per stream of 10, %.1f per stream of 10,000)", perEvent, short, long)
	}
}
