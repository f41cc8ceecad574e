package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// randomSSE builds an SSE body with events of many sizes and every line
// ending the WHATWG rules allow, plus comments and multi-line data.
func randomSSE(rng *rand.Rand, events int) []byte {
	ends := []string{"\n", "\r\n", "\r"}
	var b bytes.Buffer
	for i := 0; i < events; i++ {
		eol := ends[rng.IntN(len(ends))]
		if rng.IntN(5) == 0 {
			b.WriteString(": keep-alive" + eol)
		}
		if rng.IntN(4) == 0 {
			b.WriteString("event: message" + eol)
		}
		lines := 1 + rng.IntN(3)
		for l := 0; l < lines; l++ {
			size := []int{1, 10, 100, 1000, 5000, 20000}[rng.IntN(6)]
			b.WriteString(`data: {"choices":[{"delta":{"content":"`)
			for j := 0; j < size; j++ {
				b.WriteByte("abcdefghij é"[rng.IntN(12)])
			}
			b.WriteString(`"}}]}` + eol)
		}
		b.WriteString(eol)
	}
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// splitUpstream serves bodies[path] split at the offsets in the "cuts" query,
// flushing after each piece, so each piece is one HTTP chunk.
func splitUpstream(t *testing.T, bodies *sync.Map) string {
	s := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		v, _ := bodies.Load(r.URL.Path)
		body := v.([]byte)
		sseHeaders(w)
		prev := 0
		for _, c := range strings.Split(r.URL.Query().Get("cuts"), ",") {
			if c == "" {
				continue
			}
			n, _ := strconv.Atoi(c)
			w.Write(body[prev:n])
			w.(http.Flusher).Flush()
			prev = n
		}
		w.Write(body[prev:])
	})
	return s.URL
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return got
}

func TestRelayByteExactRandomBodies(t *testing.T) {
	var bodies sync.Map
	up := splitUpstream(t, &bodies)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up}, log)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 40; i++ {
		body := randomSSE(rng, 1+rng.IntN(30))
		path := fmt.Sprintf("/r%d/v1/chat/completions", i)
		bodies.Store(path, body)
		var cuts []string
		for c := rng.IntN(200) + 1; c < len(body); c += 1 + rng.IntN(3000) {
			cuts = append(cuts, strconv.Itoa(c))
		}
		got := get(t, base+path+"?cuts="+strings.Join(cuts, ","))
		require.Equal(t, body, got, "body %d", i)
		tr := log.next(t)
		require.Equal(t, int64(len(body)), tr.RespBytes)
		require.False(t, tr.Truncated)
		require.Equal(t, ErrNone, tr.ErrKind)
	}
}

func TestRelayByteExactEverySplit(t *testing.T) {
	var bodies sync.Map
	up := splitUpstream(t, &bodies)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up}, log)
	body := []byte("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n" +
		": comment\n" +
		"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"think\"}}]}\r\r" +
		"event: x\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n" +
		"data: line two\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n" +
		"data: [DONE]\n\n")
	bodies.Store("/v1/chat/completions", body)
	for cut := 1; cut < len(body); cut++ {
		got := get(t, base+"/v1/chat/completions?cuts="+strconv.Itoa(cut))
		require.Equal(t, body, got, "cut at %d", cut)
		tr := log.next(t)
		require.Equal(t, 5, tr.Events, "cut at %d", cut)
		require.Equal(t, int64(7), tr.PromptTokens, "cut at %d", cut)
		require.Equal(t, 1, tr.ReasoningEvents)
	}
}

// TestRelayFlushesEachEvent: each event reaches the client before the
// upstream sends the next one, so nothing is coalesced or held back. The
// upstream waits, event by event, for the client to say it got the last
// one; a relay that buffered would leave it waiting until its patience
// ran out, and the events would then arrive together, flagged late.
func TestRelayFlushesEachEvent(t *testing.T) {
	const events = 5
	got := make(chan int, events)
	var heldBack atomic.Int32 // events the client had not seen within the upstream's patience
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		for i := range events {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-got:
			case <-time.After(5 * time.Second):
				heldBack.Add(1)
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	base, _ := startProxy(t, Config{Upstream: up.URL}, newTraceLog())
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	seen := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "data: {") {
			require.Contains(t, line, `"`+strconv.Itoa(seen)+`"`, "out of order")
			seen++
			got <- seen
		}
	}
	require.Equal(t, events, seen)
	require.Zero(t, heldBack.Load(), "events held back until the upstream sent more")
}

func TestFlushPolicy(t *testing.T) {
	tests := []struct {
		name string
		ct   string
		want bool
	}{
		{name: "plain", ct: "text/event-stream", want: true},
		{name: "charset", ct: "text/event-stream; charset=utf-8", want: true},
		{name: "upper case", ct: "Text/Event-Stream", want: true},
		{name: "json", ct: "application/json", want: false},
		{name: "empty", ct: "", want: false},
		{name: "prefix only", ct: "text/event-streamer", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, isEventStream([]byte(tt.ct)))
		})
	}
}
