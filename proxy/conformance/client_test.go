package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"
)

// The independent client: plain net/http with no connection reuse, its own
// SSE splitter and its own reading of the four protocols. It shares no code
// with the proxy's sse package, so a classification bug there cannot hide
// here.

// route is one of the four inference protocols ollama serves.
type route struct {
	name string // for subtest names
	path string
	body func(model string, extra string) string // extra: JSON members to add, "" or `"k":v,`
}

var routes = []route{
	{"chat", "/v1/chat/completions", func(m, x string) string {
		return `{` + x + `"model":"` + m + `","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"say hi to the proxy"}]}`
	}},
	{"completions", "/v1/completions", func(m, x string) string {
		return `{` + x + `"model":"` + m + `","stream":true,"stream_options":{"include_usage":true},"prompt":"say hi to the proxy"}`
	}},
	{"responses", "/v1/responses", func(m, x string) string {
		return `{` + x + `"model":"` + m + `","stream":true,"input":"say hi to the proxy"}`
	}},
	{"messages", "/v1/messages", func(m, x string) string {
		return `{` + x + `"model":"` + m + `","stream":true,"max_tokens":1024,"messages":[{"role":"user","content":"say hi to the proxy"}]}`
	}},
}

// event is one SSE event as the client saw it, stamped when the read that
// completed it returned.
type event struct {
	at   time.Time
	name string // the event: field, "" if none
	data string
}

// response is what the client measured for one request.
type response struct {
	sent    time.Time // request headers written (the proxy's t_recv is when it read them)
	status  int
	header  http.Header
	body    []byte // every byte, as received
	events  []event
	eof     time.Time // the body's end
	readErr error

	mu        sync.Mutex
	cancelled time.Time // when do cancelled the request; zero if it did not
}

func (r *response) cancelledAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancelled
}

// do sends body to base+path with the given Host ("" for the URL's) and
// reads the whole response, stamping events. It may run on any goroutine
// (it reports with t.Error, never t.Fatal). cancelAfter > 0 closes the
// request that long after the headers were written (a client disconnect).
func do(t *testing.T, base, path, body, host string, cancelAfter time.Duration) *response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Error(err) // not Fatal: do also runs on goroutines of its own
		return &response{readErr: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if host != "" {
		req.Host = host
	}
	r := &response{}
	// The transport's write loop runs the hook; wrote orders r.sent before
	// every read of it.
	wrote := make(chan struct{})
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { r.sent = time.Now(); close(wrote) },
	}))
	if cancelAfter > 0 {
		go func() {
			<-wrote
			time.Sleep(time.Until(r.sent.Add(cancelAfter)))
			r.mu.Lock()
			r.cancelled = time.Now()
			r.mu.Unlock()
			cancel()
		}()
	}
	resp, err := client.Do(req)
	if err != nil {
		r.readErr = err
		r.eof = time.Now()
	} else {
		r.status, r.header = resp.StatusCode, resp.Header
		r.read(resp.Body)
		resp.Body.Close()
	}
	select {
	case <-wrote:
	case <-time.After(5 * time.Second):
		t.Error("the request's headers were never written")
	}
	if cancelAfter > 0 {
		cancel()
		for range 100 { // the cancel goroutine has run once ctx is done and cancelled is set
			if !r.cancelledAt().IsZero() {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return r
}

// client never reuses a connection: each request is measured from a fresh
// dial on both paths, the same for direct and proxied requests.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}

// read consumes the body, splitting SSE events as bytes arrive.
func (r *response) read(body io.Reader) {
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := body.Read(buf)
		now := time.Now()
		if n > 0 {
			r.body = append(r.body, buf[:n]...)
			pending = append(pending, buf[:n]...)
			pending = r.split(pending, now)
		}
		if err != nil {
			r.eof = now
			if err != io.EOF {
				r.readErr = err
			}
			return
		}
	}
}

// split takes complete events (ended by a blank line) off the front of b;
// an NDJSON body's events are its lines (native_test.go).
func (r *response) split(b []byte, now time.Time) []byte {
	if isNDJSON(r.header) {
		return r.splitLines(b, now)
	}
	for {
		b = bytes.TrimLeft(b, "\r\n")
		i := bytes.Index(b, []byte("\n\n"))
		if i < 0 {
			return b
		}
		ev := event{at: now}
		for _, line := range strings.Split(string(b[:i]), "\n") {
			line = strings.TrimSuffix(line, "\r")
			switch {
			case strings.HasPrefix(line, "event:"):
				ev.name = strings.TrimSpace(line[len("event:"):])
			case strings.HasPrefix(line, "data:"):
				ev.data += strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
			}
		}
		r.events = append(r.events, ev)
		b = b[i+2:]
	}
}

// kind is what the client makes of one event.
type kind struct {
	reasoning, content bool // a non-empty delta of that kind (tool calls count as content)
	done               bool // the protocol's end-of-stream event
	usage              *usage
	finish             string
}

type usage struct{ prompt, output int64 }

// observed is the client's measurement of one stream.
type observed struct {
	firstOutput, firstContent, end time.Time // end: the end event, else EOF
	reasoningEvents, contentEvents int
	done                           bool
	usage                          *usage
	finish                         string
}

func (r *response) observe(t *testing.T, path string) observed {
	t.Helper()
	var o observed
	for _, ev := range r.events {
		k := classify(t, path, ev)
		if k.reasoning || k.content {
			if o.firstOutput.IsZero() {
				o.firstOutput = ev.at
			}
			if k.content && o.firstContent.IsZero() {
				o.firstContent = ev.at
			}
		}
		if k.reasoning {
			o.reasoningEvents++
		}
		if k.content {
			o.contentEvents++
		}
		if k.usage != nil {
			o.usage = k.usage
		}
		if k.finish != "" {
			o.finish = k.finish
		}
		if k.done && !o.done {
			o.done, o.end = true, ev.at
		}
	}
	if !o.done {
		o.end = r.eof
	}
	return o
}

// classify reads one event the way each protocol's documentation describes
// it.
func classify(t *testing.T, path string, ev event) kind {
	t.Helper()
	var k kind
	if ev.data == "[DONE]" {
		k.done = true
		return k
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
		t.Fatalf("event data is not JSON (%v): %d bytes", err, len(ev.data))
	}
	switch path {
	case "/api/generate", "/api/chat":
		return classifyNative(v)
	case "/v1/chat/completions", "/v1/completions":
		for _, c := range list(v["choices"]) {
			c := obj(c)
			d := obj(c["delta"])
			k.content = k.content || str(d["content"]) != "" || len(list(d["tool_calls"])) > 0 || str(c["text"]) != ""
			k.reasoning = k.reasoning || str(d["reasoning"]) != "" || str(d["reasoning_content"]) != ""
			if f := str(c["finish_reason"]); f != "" {
				k.finish = f
			}
		}
		// ollama's /v1/completions puts an all-zero usage on every chunk
		// (a quirk, docs/real-engine.md); only the final chunk's counts.
		if u := obj(v["usage"]); u != nil && (num(u["total_tokens"]) != 0 || len(list(v["choices"])) == 0) {
			k.usage = &usage{num(u["prompt_tokens"]), num(u["completion_tokens"])}
		}
	case "/v1/responses":
		typ := str(v["type"])
		delta := str(v["delta"]) != ""
		switch typ {
		case "response.output_text.delta", "response.function_call_arguments.delta":
			k.content = delta
		case "response.reasoning_summary_text.delta", "response.reasoning_text.delta":
			k.reasoning = delta
		case "response.completed", "response.incomplete", "response.failed":
			k.done = true
			resp := obj(v["response"])
			if u := obj(resp["usage"]); u != nil {
				k.usage = &usage{num(u["input_tokens"]), num(u["output_tokens"])}
			}
			k.finish = str(resp["status"])
		}
	case "/v1/messages":
		switch str(v["type"]) {
		case "content_block_delta":
			d := obj(v["delta"])
			switch str(d["type"]) {
			case "text_delta":
				k.content = str(d["text"]) != ""
			case "input_json_delta":
				k.content = str(d["partial_json"]) != ""
			case "thinking_delta":
				k.reasoning = str(d["thinking"]) != ""
			}
		case "message_delta":
			if u := obj(v["usage"]); u != nil {
				k.usage = &usage{num(u["input_tokens"]), num(u["output_tokens"])}
			}
			k.finish = str(obj(v["delta"])["stop_reason"])
		case "message_stop":
			k.done = true
		}
	}
	return k
}

func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }
func list(v any) []any         { l, _ := v.([]any); return l }
func str(v any) string         { s, _ := v.(string); return s }
func num(v any) int64          { f, _ := v.(float64); return int64(f) }
