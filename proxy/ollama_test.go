package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/sse"
	"github.com/anvilproxy/anvilproxy/sse/ssetest"
)

func ndjsonHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
}

// relayModes are the two stream relays: the connection goroutine's
// WriteTo and the event loop (Linux).
var relayModes = []struct {
	name string
	loop bool
}{{"writeto", false}, {"loop", true}}

// TestOllamaNativeStream: ollama's /api/generate and /api/chat stream
// NDJSON (recorded from ollama v0.17.4, sse/testdata): relayed unchanged,
// each line an event, ended by "done": true, with the engine's counts as
// usage and its durations as its own figures.
func TestOllamaNativeStream(t *testing.T) {
	for _, tc := range []struct {
		path, file       string
		route            Route
		content, reason  int
		prompt, output   int64
		prefill, decode  time.Duration
		total, loadDur   time.Duration
		firstIsReasoning bool
	}{
		{"/api/generate", "ollama_generate.ndjson", RouteOllamaGenerate, 47, 0, 29, 48,
			2636065, 23068495, 39278351, 6717752, false},
		{"/api/chat", "ollama_chat_thinking.ndjson", RouteOllamaChat, 0, 44, 32, 45,
			3757729, 30632385, 53864392, 7985189, true},
	} {
		stream, err := os.ReadFile(filepath.Join("..", "sse", "testdata", tc.file))
		require.NoError(t, err)
		for _, mode := range relayModes {
			t.Run(tc.path+"/"+mode.name, func(t *testing.T) {
				up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
					ndjsonHeaders(w)
					_, _ = w.Write(stream)
				})
				log := newTraceLog()
				base, _ := startProxy(t, Config{Upstream: up.URL, EventLoop: mode.loop}, log)
				resp, body := protoPost(t, base+tc.path, `{"model":"tiny","prompt":"hello"}`)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
				require.Equal(t, stream, body, "relayed unchanged")
				tr := log.next(t)
				require.Equal(t, tc.route, tr.Route)
				require.True(t, tr.Stream)
				require.False(t, tr.Truncated, "ended by done:true")
				require.False(t, tr.Failed())
				require.Zero(t, tr.ParseErrors)
				require.Equal(t, tc.content, tr.ContentEvents)
				require.Equal(t, tc.reason, tr.ReasoningEvents)
				require.False(t, tr.FirstOutput.IsZero())
				require.Equal(t, tc.firstIsReasoning, tr.FirstContent.IsZero(), "thinking is first output, not content")
				require.True(t, tr.UsageSeen)
				require.Equal(t, tc.prompt, tr.PromptTokens)
				require.Equal(t, tc.output, tr.CompletionTokens)
				require.EqualValues(t, -1, tr.CachedTokens, "ollama reports no cache hits")
				require.Equal(t, tc.prefill, tr.ServerPrefill, "prompt_eval_duration")
				require.Equal(t, tc.decode, tr.ServerDecode, "eval_duration")
				require.Equal(t, tc.total, tr.ServerTotal, "total_duration")
				require.Equal(t, tc.loadDur, tr.ServerLoad, "load_duration")
				require.EqualValues(t, -1, tr.ServerQueue, "ollama reports no queue time")
			})
		}
	}
}

// TestOllamaNativeUnary: "stream": false answers one JSON object
// (application/json), read as a whole body.
func TestOllamaNativeUnary(t *testing.T) {
	const body = `{"model":"tiny-plain","created_at":"2026-12-01T18:39:45.222517877Z","message":{"role":"assistant","content":" next the"},"done":true,"done_reason":"stop","total_duration":27118881,"load_duration":3674993,"prompt_eval_count":25,"prompt_eval_duration":654849,"eval_count":45,"eval_duration":15708497}`
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_, _ = io.WriteString(w, body)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	_, got := protoPost(t, base+"/api/chat", `{"model":"tiny","stream":false,"messages":[]}`)
	require.Equal(t, body, string(got))
	tr := log.next(t)
	require.False(t, tr.Stream)
	require.False(t, tr.Failed())
	require.EqualValues(t, 25, tr.PromptTokens)
	require.EqualValues(t, 45, tr.CompletionTokens)
	require.Equal(t, time.Duration(654849), tr.ServerPrefill)
	require.Equal(t, time.Duration(27118881), tr.ServerTotal)
}

// TestOllamaNativeCutIsTruncated: a stream that ends without its done
// line (ollama's own end when it stops a repeating generation), or inside
// a line, is a truncated failure, as on every protocol.
func TestOllamaNativeCutIsTruncated(t *testing.T) {
	for name, rest := range map[string]string{
		"no done line":   "",
		"cut in a line":  `{"model":"m","response":"","done":tr`,
		"done line, cut": `{"model":"m","response":"","done":true,"done_reason":"stop"`,
	} {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				ndjsonHeaders(w)
				_, _ = io.WriteString(w, `{"model":"m","response":"a","done":false}`+"\n"+rest)
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL}, log)
			resp, _ := protoPost(t, base+"/api/generate", `{"model":"m","prompt":"x"}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			tr := log.next(t)
			require.True(t, tr.Truncated)
			require.Equal(t, ErrTruncated, tr.ErrKind)
		})
	}
}

// TestOllamaNativeLastLineWithoutLF: JSON Lines lets the last line go
// without its LF; a whole done object the clean end of the body ended is
// read as the end, with its usage, not as a cut stream.
func TestOllamaNativeLastLineWithoutLF(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		ndjsonHeaders(w)
		_, _ = io.WriteString(w, `{"model":"m","response":"a","done":false}`+"\n"+
			`{"model":"m","response":"","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}`)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, _ := protoPost(t, base+"/api/generate", `{"model":"m","prompt":"x"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	tr := log.next(t)
	require.False(t, tr.Truncated)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.Equal(t, int64(3), tr.PromptTokens)
	require.Equal(t, 2, tr.Events)
}

// TestOllamaNativeFlushPerLine: each NDJSON line reaches the client before
// the engine writes the next, through both relays, chunked or with a
// Content-Length (a gateway's): the upstream waits for the client to have
// line i before it sends line i+1, so a relay that held lines back (NDJSON
// has no SSE framing to flush on) would stall here.
func TestOllamaNativeFlushPerLine(t *testing.T) {
	lines := []string{
		`{"model":"m","response":"a","done":false}`,
		`{"model":"m","response":"b","done":false}`,
		`{"model":"m","response":"","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":3,"prompt_eval_duration":1000000}`,
	}
	size := 0
	for _, l := range lines {
		size += len(l) + 1
	}
	for _, mode := range relayModes {
		for _, sized := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/content-length=%v", mode.name, sized), func(t *testing.T) {
				got := make(chan struct{})
				up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
					if sized {
						w.Header().Set("Content-Length", strconv.Itoa(size))
					}
					ndjsonHeaders(w)
					rc := http.NewResponseController(w)
					for i, l := range lines {
						_, _ = io.WriteString(w, l+"\n")
						_ = rc.Flush()
						if i+1 < len(lines) {
							select {
							case <-got:
							case <-time.After(10 * time.Second):
								return // the client side fails
							}
						}
					}
				})
				log := newTraceLog()
				base, _ := startProxy(t, Config{Upstream: up.URL, EventLoop: mode.loop}, log)
				client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
				resp, err := client.Post(base+"/api/generate", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
				require.NoError(t, err)
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				for i, want := range lines {
					line, err := br.ReadBytes('\n')
					require.NoError(t, err, "line %d", i)
					require.Equal(t, want, string(bytes.TrimSuffix(line, []byte("\n"))))
					if i+1 < len(lines) {
						got <- struct{}{}
					}
				}
				tr := log.next(t)
				require.False(t, tr.Failed())
				require.Equal(t, 2, tr.ContentEvents)
				require.Equal(t, time.Millisecond, tr.ServerPrefill)
			})
		}
	}
}

// TestOllamaRoutes: the native paths, with a gateway prefix too.
func TestOllamaRoutes(t *testing.T) {
	require.Equal(t, RouteOllamaGenerate, routeOf([]byte("/api/generate")))
	require.Equal(t, RouteOllamaChat, routeOf([]byte("/api/chat")))
	require.Equal(t, RouteOllamaChat, routeOf([]byte("/ollama/api/chat")))
	require.Equal(t, RouteOther, routeOf([]byte("/api/tags")))
	require.Equal(t, "ollama_generate", RouteOllamaGenerate.String())
	require.Equal(t, "ollama_chat", RouteOllamaChat.String())
	require.Len(t, Routes, len(routeNames))
}

// TestOllamaNativeLongContext: /api/generate's done line after ~200k
// tokens of conversation carries 1.3 MiB of token ids ("context") before
// its counts and durations, over the 1 MiB line limit. The relay sends it
// unchanged; the framing leaves the ids out of what it reads (sse.Lines),
// so the stream ends at its done line with ollama's figures, not
// truncated, through both relays.
func TestOllamaNativeLongContext(t *testing.T) {
	stream := ssetest.OllamaLongContext(200_000, 2)
	require.Greater(t, len(stream), sse.DefaultMaxEventBytes)
	for _, mode := range relayModes {
		t.Run(mode.name, func(t *testing.T) {
			up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				ndjsonHeaders(w)
				_, _ = w.Write(stream)
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL, EventLoop: mode.loop}, log)
			resp, body := protoPost(t, base+"/api/generate", `{"model":"m","prompt":"x"}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, stream, body, "relayed unchanged")
			tr := log.next(t)
			require.False(t, tr.Truncated, "ended by its done line")
			require.False(t, tr.Failed())
			require.Zero(t, tr.ParseErrors)
			require.Equal(t, 2, tr.Events)
			require.EqualValues(t, 200000, tr.PromptTokens)
			require.EqualValues(t, 2, tr.CompletionTokens)
			require.Equal(t, time.Duration(345678901), tr.ServerPrefill)
			require.Equal(t, time.Duration(912345678), tr.ServerTotal)
		})
	}
}
