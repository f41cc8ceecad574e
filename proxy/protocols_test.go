package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"
)

// The protocol table (docs/design.md "Protocols and tokens"): every API the sim speaks, stream and
// non-stream, reasoning-first and content-only, through the proxy. The
// expectations come from the bytes the client received, parsed here with
// encoding/json and independently of the sse package, so that a
// classifier bug cannot hide behind the same bug in the test.

// clientUsage is the usage the engine reported, as the client read it; -1
// for a count the protocol does not report.
type clientUsage struct {
	prompt, completion, cached, reasoning int64
}

// protoEvent is one SSE event as a client reads it.
type protoEvent struct {
	typ  string // the "event:" field, "" if none
	data string
}

// protoParseSSE splits a complete SSE body (LF line ends, as the sim and
// most engines write) into events. A body that does not end with a blank
// line fails the test: its last event was cut.
func protoParseSSE(t *testing.T, raw []byte) []protoEvent {
	t.Helper()
	require.True(t, bytes.HasSuffix(raw, []byte("\n\n")), "the stream ends mid-event: %q", tail(raw))
	var evs []protoEvent
	for _, block := range strings.Split(strings.TrimSuffix(string(raw), "\n\n"), "\n\n") {
		var ev protoEvent
		var data []string
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "event:"):
				ev.typ = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
			case strings.HasPrefix(line, "data:"):
				data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
			}
		}
		if data != nil {
			ev.data = strings.Join(data, "\n")
			evs = append(evs, ev)
		}
	}
	require.NotEmpty(t, evs)
	return evs
}

func tail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
}

// openaiUsageJSON is the usage of chat completions, completions and the
// Responses API (which says input/output for prompt/completion).
type openaiUsageJSON struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	InputTokens         *int64 `json:"input_tokens"`
	OutputTokens        *int64 `json:"output_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

func (u *openaiUsageJSON) usage(t *testing.T) clientUsage {
	t.Helper()
	cu := clientUsage{prompt: -1, completion: -1, cached: -1, reasoning: -1}
	pick := func(dst *int64, vs ...*int64) {
		for _, v := range vs {
			if v != nil {
				*dst = *v
			}
		}
	}
	pick(&cu.prompt, u.PromptTokens, u.InputTokens)
	pick(&cu.completion, u.CompletionTokens, u.OutputTokens)
	if d := u.PromptTokensDetails; d != nil {
		cu.cached = d.CachedTokens
	}
	if d := u.InputTokensDetails; d != nil {
		cu.cached = d.CachedTokens
	}
	if d := u.CompletionTokensDetails; d != nil {
		cu.reasoning = d.ReasoningTokens
	}
	if d := u.OutputTokensDetails; d != nil {
		cu.reasoning = d.ReasoningTokens
	}
	require.GreaterOrEqual(t, cu.prompt, int64(0), "usage without prompt tokens")
	require.GreaterOrEqual(t, cu.completion, int64(0), "usage without completion tokens")
	return cu
}

// anthropicUsageJSON is an Anthropic usage object.
type anthropicUsageJSON struct {
	InputTokens              *int64 `json:"input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
}

// merge applies an Anthropic usage object to cu: the prompt is input +
// cache reads + cache writes (input_tokens excludes both), and output_tokens
// is cumulative, so a later one replaces an earlier one.
func (u *anthropicUsageJSON) merge(cu *clientUsage) {
	if u.InputTokens != nil {
		cu.prompt = *u.InputTokens
		if u.CacheReadInputTokens != nil {
			cu.prompt += *u.CacheReadInputTokens
		}
		if u.CacheCreationInputTokens != nil {
			cu.prompt += *u.CacheCreationInputTokens
		}
	}
	if u.CacheReadInputTokens != nil {
		cu.cached = *u.CacheReadInputTokens
	}
	if u.OutputTokens != nil {
		cu.completion = *u.OutputTokens
	}
}

// protoCase is one API of the table.
type protoCase struct {
	name      string
	path      string
	route     Route
	reasoning bool // the API can send reasoning before content
	// body is the request for prompt; reasoning asks for reasoning first.
	body func(stream, reasoning bool, prompt string) string
	// read checks that the response is complete (its end markers are
	// there) and returns the usage the engine reported and the text
	// (reasoning and content) the client got.
	read func(t *testing.T, stream bool, raw []byte) (clientUsage, string)
}

func protoJSON(t *testing.T, data string, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal([]byte(data), v), "event data %q", data)
}

// readChat reads a chat completions or legacy completions response.
func readChat(t *testing.T, stream bool, raw []byte) (clientUsage, string) {
	t.Helper()
	type choice struct {
		Text    string `json:"text"`
		Delta   map[string]any
		Message map[string]any
		Finish  *string `json:"finish_reason"`
	}
	type chunk struct {
		Choices []choice         `json:"choices"`
		Usage   *openaiUsageJSON `json:"usage"`
	}
	var text strings.Builder
	addText := func(m map[string]any) {
		for _, k := range []string{"reasoning_content", "content"} {
			if s, ok := m[k].(string); ok {
				text.WriteString(s)
			}
		}
	}
	if !stream {
		var c chunk
		protoJSON(t, string(raw), &c)
		require.Len(t, c.Choices, 1)
		require.NotNil(t, c.Choices[0].Finish, "a complete body has a finish_reason")
		require.NotNil(t, c.Usage)
		text.WriteString(c.Choices[0].Text)
		addText(c.Choices[0].Message)
		return c.Usage.usage(t), text.String()
	}
	evs := protoParseSSE(t, raw)
	require.Equal(t, "[DONE]", evs[len(evs)-1].data, "the stream ends with [DONE]")
	var usage *openaiUsageJSON
	finished := false
	for _, ev := range evs[:len(evs)-1] {
		var c chunk
		protoJSON(t, ev.data, &c)
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
			addText(ch.Delta)
			finished = finished || ch.Finish != nil
		}
		if c.Usage != nil {
			usage = c.Usage
		}
	}
	require.True(t, finished, "no chunk carried a finish_reason")
	require.NotNil(t, usage, "no usage chunk")
	return usage.usage(t), text.String()
}

// readResponses reads a Responses API response.
func readResponses(t *testing.T, stream bool, raw []byte) (clientUsage, string) {
	t.Helper()
	type response struct {
		Status string           `json:"status"`
		Usage  *openaiUsageJSON `json:"usage"`
		Output []struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	if !stream {
		var r response
		protoJSON(t, string(raw), &r)
		require.Equal(t, "completed", r.Status)
		require.NotNil(t, r.Usage)
		var text strings.Builder
		for _, it := range r.Output {
			for _, c := range it.Content {
				text.WriteString(c.Text)
			}
		}
		return r.Usage.usage(t), text.String()
	}
	evs := protoParseSSE(t, raw)
	last := evs[len(evs)-1]
	require.Equal(t, "response.completed", last.typ, "the stream ends with response.completed")
	var text strings.Builder
	for _, ev := range evs {
		var e struct {
			Type  string `json:"type"`
			Delta string `json:"delta"`
		}
		protoJSON(t, ev.data, &e)
		require.Equal(t, ev.typ, e.Type, "the event field names the JSON type")
		if strings.HasSuffix(e.Type, ".delta") {
			text.WriteString(e.Delta)
		}
	}
	var done struct {
		Response response `json:"response"`
	}
	protoJSON(t, last.data, &done)
	require.Equal(t, "completed", done.Response.Status)
	require.NotNil(t, done.Response.Usage, "response.completed without usage")
	return done.Response.Usage.usage(t), text.String()
}

// readMessages reads an Anthropic Messages response.
func readMessages(t *testing.T, stream bool, raw []byte) (clientUsage, string) {
	t.Helper()
	cu := clientUsage{prompt: -1, completion: -1, cached: -1, reasoning: -1}
	var text strings.Builder
	if !stream {
		var m struct {
			Type       string             `json:"type"`
			StopReason *string            `json:"stop_reason"`
			Usage      anthropicUsageJSON `json:"usage"`
			Content    []struct {
				Text     string `json:"text"`
				Thinking string `json:"thinking"`
			} `json:"content"`
		}
		protoJSON(t, string(raw), &m)
		require.Equal(t, "message", m.Type)
		require.NotNil(t, m.StopReason)
		m.Usage.merge(&cu)
		for _, c := range m.Content {
			text.WriteString(c.Thinking + c.Text)
		}
		return cu, text.String()
	}
	evs := protoParseSSE(t, raw)
	require.Equal(t, "message_stop", evs[len(evs)-1].typ, "the stream ends with message_stop")
	require.Equal(t, "message_start", evs[0].typ)
	sawDelta := false
	for _, ev := range evs {
		var e struct {
			Type    string `json:"type"`
			Message *struct {
				Usage anthropicUsageJSON `json:"usage"`
			} `json:"message"`
			Delta struct {
				Text     string `json:"text"`
				Thinking string `json:"thinking"`
			} `json:"delta"`
			Usage *anthropicUsageJSON `json:"usage"`
		}
		protoJSON(t, ev.data, &e)
		require.Equal(t, ev.typ, e.Type, "the event field names the JSON type")
		switch e.Type {
		case "message_start":
			e.Message.Usage.merge(&cu)
		case "message_delta":
			require.NotNil(t, e.Usage)
			e.Usage.merge(&cu)
			sawDelta = true
		case "content_block_delta":
			text.WriteString(e.Delta.Thinking + e.Delta.Text)
		}
	}
	require.True(t, sawDelta, "no message_delta: the final output_tokens is missing")
	return cu, text.String()
}

func protoMaybe(cond bool, s string) string {
	if cond {
		return s
	}
	return ""
}

var protoCases = []protoCase{
	{
		name: "chat", path: "/v1/chat/completions", route: RouteChat, reasoning: true,
		body: func(stream, reasoning bool, prompt string) string {
			return `{"model":"m","max_tokens":40,"stream":` + fmt.Sprint(stream) +
				protoMaybe(stream, `,"stream_options":{"include_usage":true}`) +
				protoMaybe(!reasoning, `,"reasoning_effort":"none"`) +
				`,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + prompt + `"}]}`
		},
		read: readChat,
	},
	{
		name: "completions", path: "/v1/completions", route: RouteCompletions,
		body: func(stream, _ bool, prompt string) string {
			return `{"model":"m","max_tokens":40,"stream":` + fmt.Sprint(stream) +
				protoMaybe(stream, `,"stream_options":{"include_usage":true}`) +
				`,"prompt":"` + prompt + `"}`
		},
		read: readChat,
	},
	{
		name: "responses", path: "/v1/responses", route: RouteResponses, reasoning: true,
		body: func(stream, reasoning bool, prompt string) string {
			return `{"model":"m","max_output_tokens":40,"stream":` + fmt.Sprint(stream) +
				protoMaybe(!reasoning, `,"reasoning":{"effort":"none"}`) +
				`,"instructions":"be brief","input":"` + prompt + `"}`
		},
		read: readResponses,
	},
	{
		name: "messages", path: "/v1/messages", route: RouteMessages, reasoning: true,
		body: func(stream, reasoning bool, prompt string) string {
			return `{"model":"m","max_tokens":40,"stream":` + fmt.Sprint(stream) +
				protoMaybe(reasoning, `,"thinking":{"type":"enabled","budget_tokens":1024}`) +
				`,"system":"be brief","messages":[{"role":"user","content":"` + prompt + `"}]}`
		},
		read: readMessages,
	},
}

// protoPost sends body to url with the given header pairs and returns the
// whole response body.
func protoPost(t *testing.T, url, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, raw
}

// requireTokens checks that the Trace's token counts are the usage the
// client got.
func requireTokens(t *testing.T, want clientUsage, tr *Trace) {
	t.Helper()
	require.True(t, tr.UsageSeen, "the engine reported usage")
	require.Equal(t, want.prompt, tr.PromptTokens, "prompt tokens")
	require.Equal(t, want.completion, tr.CompletionTokens, "completion tokens")
	require.Equal(t, want.cached, tr.CachedTokens, "cached tokens")
	require.Equal(t, want.reasoning, tr.ReasoningTokens, "reasoning tokens")
	n, src := tr.OutputTokens()
	require.Equal(t, "usage", src)
	require.Equal(t, want.completion, n)
}

// requireStreamStamps checks the stamps of a complete stream: all present,
// in the order of docs/design.md "Stamps and phases", and TTFO < TTFT exactly when reasoning
// came first.
func requireStreamStamps(t *testing.T, tr *Trace, reasoning bool) {
	t.Helper()
	stamps := []struct {
		name string
		at   time.Time
	}{
		{"recv", tr.Recv}, {"admit", tr.Admit}, {"sent", tr.Sent}, {"headers", tr.Headers},
		{"first_event", tr.FirstEvent}, {"first_output", tr.FirstOutput},
		{"first_content", tr.FirstContent}, {"last_token", tr.LastToken},
		{"end", tr.End}, {"client_done", tr.ClientDone},
	}
	for i, s := range stamps {
		require.False(t, s.at.IsZero(), "stamp %s missing", s.name)
		if i > 0 {
			require.False(t, s.at.Before(stamps[i-1].at), "stamp %s before %s", s.name, stamps[i-1].name)
		}
	}
	ttfo, ok := tr.TTFO()
	require.True(t, ok)
	ttft, ok := tr.TTFT()
	require.True(t, ok)
	require.Greater(t, tr.ContentEvents, 0)
	if reasoning {
		require.Greater(t, tr.ReasoningEvents, 0)
		require.Less(t, ttfo, ttft, "reasoning came first: TTFO < TTFT")
		d, ok := tr.Reasoning()
		require.True(t, ok)
		require.Equal(t, ttft-ttfo, d)
	} else {
		require.Zero(t, tr.ReasoningEvents)
		require.True(t, tr.FirstOutput.Equal(tr.FirstContent), "content only: the first output is the first content")
		require.Equal(t, ttfo, ttft)
		d, ok := tr.Reasoning()
		require.True(t, ok)
		require.Zero(t, d)
	}
	_, ok = tr.Generation()
	require.True(t, ok)
	_, ok = tr.TPOT()
	require.True(t, ok)
}

// requireNonStreamStamps checks a non-stream response: no event came, so
// the output phases are unknown (reported as null, never 0), and the
// request's own span is there.
func requireNonStreamStamps(t *testing.T, tr *Trace) {
	t.Helper()
	require.Zero(t, tr.Events)
	require.True(t, tr.FirstEvent.IsZero() && tr.FirstOutput.IsZero() && tr.FirstContent.IsZero())
	_, ok := tr.TTFO()
	require.False(t, ok, "no TTFO without a stream")
	_, ok = tr.TTFT()
	require.False(t, ok, "no TTFT without a stream")
	for _, s := range []time.Time{tr.Recv, tr.Sent, tr.Headers, tr.End, tr.ClientDone} {
		require.False(t, s.IsZero())
	}
	e2e, ok := tr.E2E()
	require.True(t, ok)
	require.Greater(t, e2e, time.Duration(0))
}

// protoPrompt is long enough for the sim's prefix cache (16-token blocks of
// 4 bytes per token) to serve most of it on a repeat.
func protoPrompt(tag string) string {
	return tag + ": " + strings.Repeat("the quick brown fox jumps over the lazy dog ", 12)
}

func TestProtocolTable(t *testing.T) {
	for _, pc := range protoCases {
		for _, stream := range []bool{true, false} {
			variants := []bool{false}
			if pc.reasoning {
				variants = []bool{true, false}
			}
			for _, reasoning := range variants {
				name := fmt.Sprintf("%s/stream=%v/reasoning=%v", pc.name, stream, reasoning)
				t.Run(name, func(t *testing.T) {
					_, up := startSim(t, fastSim)
					log := newTraceLog()
					base, _ := startProxy(t, Config{Upstream: up}, log)
					body := pc.body(stream, reasoning, protoPrompt(name))
					// Events 10 ms apart keep the reasoning and content
					// events in separate reads even on a loaded machine.
					header := []string{"X-Sim-Event-Gap", "10ms"}

					var first clientUsage
					for i := 0; i < 2; i++ { // the same prompt twice: the second hits the prefix cache
						resp, raw := protoPost(t, base+pc.path, body, header...)
						require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
						usage, text := pc.read(t, stream, raw)
						require.NotEmpty(t, text)
						require.Equal(t, int64(40), usage.completion)

						tr := log.next(t)
						require.Equal(t, pc.route, tr.Route)
						require.Equal(t, "POST", tr.Method)
						require.Equal(t, "m", tr.Model)
						require.Equal(t, http.StatusOK, tr.Status)
						require.Equal(t, stream, tr.Stream)
						require.Equal(t, ErrNone, tr.ErrKind)
						require.False(t, tr.Truncated)
						require.False(t, tr.Failed())
						require.Zero(t, tr.ParseErrors)
						require.Equal(t, int64(len(body)), tr.ReqBytes)
						require.Equal(t, int64(len(raw)), tr.RespBytes, "the client got every byte")
						requireTokens(t, usage, &tr)
						if stream {
							requireStreamStamps(t, &tr, reasoning)
						} else {
							requireNonStreamStamps(t, &tr)
						}

						if i == 0 {
							first = usage
							require.Zero(t, usage.cached, "a cold cache serves nothing")
							continue
						}
						require.Equal(t, first.prompt, usage.prompt)
						require.Greater(t, usage.cached, int64(0), "the repeat hits the prefix cache")
						require.Less(t, usage.cached, usage.prompt)
					}
				})
			}
		}
	}
}

// TestProtocolUnknownPath: a path the proxy does not know is forwarded
// verbatim both ways and counted under route "other", never parsed.
func TestProtocolUnknownPath(t *testing.T) {
	_, up := startSim(t, fastSim)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up}, log)

	direct, want := protoPost(t, up+"/v1/unknown/thing?x=1", `{"model":"m"}`)
	resp, got := protoPost(t, base+"/v1/unknown/thing?x=1", `{"model":"m"}`)
	require.Equal(t, direct.StatusCode, resp.StatusCode)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Equal(t, string(want), string(got))

	tr := log.next(t)
	require.Equal(t, RouteOther, tr.Route)
	require.Equal(t, http.StatusNotFound, tr.Status)
	require.Equal(t, int64(len(got)), tr.RespBytes)
	require.Zero(t, tr.Events)
	require.Zero(t, tr.ParseErrors, "a non-stream body of an unknown route is not parsed")
	require.False(t, tr.UsageSeen)
	require.Equal(t, int64(-1), tr.PromptTokens)
	require.Equal(t, int64(-1), tr.CompletionTokens)

	// The engine's own endpoints are forwarded the same way.
	for _, c := range []struct {
		path  string
		route Route
	}{{"/v1/models", RouteModels}, {"/health", RouteHealth}, {"/metrics", RouteMetrics}} {
		// No Accept-Encoding: the sim's /metrics (promhttp) gzips for a
		// client that asks, and RespBytes counts the bytes on the wire.
		plain := &http.Client{Transport: &http.Transport{DisableCompression: true}}
		d, err := plain.Get(up + c.path)
		require.NoError(t, err)
		want, _ := io.ReadAll(d.Body)
		d.Body.Close()
		p, err := plain.Get(base + c.path)
		require.NoError(t, err)
		got, _ := io.ReadAll(p.Body)
		p.Body.Close()
		require.Equal(t, http.StatusOK, p.StatusCode, c.path)
		if c.path != "/metrics" { // the sim's metrics move between the two reads
			require.Equal(t, string(want), string(got), c.path)
		}
		tr := log.next(t)
		require.Equal(t, c.route, tr.Route, c.path)
		require.Equal(t, "GET", tr.Method)
		require.Equal(t, int64(len(got)), tr.RespBytes)
		require.Zero(t, tr.ParseErrors, c.path)
	}
}

// TestProtocolUnknownPathStream: an event stream on a path the proxy does
// not know is forwarded untouched; its events, of no known protocol, are
// counted as unparsed and never as output.
func TestProtocolUnknownPathStream(t *testing.T) {
	body := "data: {\"foo\":1}\n\n" + "event: tick\ndata: {\"foo\":2}\n\n" + "data: {\"foo\":3}\n\n"
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		io.WriteString(w, body)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, got := protoPost(t, base+"/v1/custom/stream", `{"model":"m"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, body, string(got))

	tr := log.next(t)
	require.Equal(t, RouteOther, tr.Route)
	require.True(t, tr.Stream)
	require.Equal(t, 3, tr.Events)
	require.Equal(t, 3, tr.ParseErrors)
	require.True(t, tr.FirstOutput.IsZero())
	require.Equal(t, int64(len(body)), tr.RespBytes)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.False(t, tr.Truncated, "a stream of unknown protocol has no end marker to miss")
	require.False(t, tr.Failed())
}

// TestProtocolUnknownEventShape: events of unknown shape inside a chat
// stream are forwarded untouched, counted as unparsed, and take no stamp:
// the timing of the rest of the stream is what it would be without them.
func TestProtocolUnknownEventShape(t *testing.T) {
	chunk := func(delta string, extra string) string {
		return `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` +
			delta + `,"finish_reason":` + extra + `}]}`
	}
	events := []string{
		chunk(`{"role":"assistant","content":""}`, "null"),
		`{"foo":1}`, // 1: before any output
		chunk(`{"reasoning_content":"thinking"}`, "null"),
		`{"foo":1}`, // 3: between reasoning and content
		chunk(`{"content":"Hello"}`, "null"),
		`{"foo":1}`, // 5: between two content events
		chunk(`{"content":" world"}`, `"stop"`),
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],` +
			`"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`,
		`{"foo":1}`, // 8: after the usage
		"[DONE]",
	}
	var want strings.Builder
	for _, e := range events {
		want.WriteString("data: " + e + "\n\n")
	}
	written := make([]time.Time, len(events)) // when the upstream began writing each event
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		for i, e := range events {
			time.Sleep(15 * time.Millisecond)
			written[i] = time.Now()
			io.WriteString(w, "data: "+e+"\n\n")
			w.(http.Flusher).Flush()
		}
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, got := protoPost(t, base+"/v1/chat/completions",
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, want.String(), string(got), "forwarded untouched")

	tr := log.next(t)
	require.Equal(t, RouteChat, tr.Route)
	require.Equal(t, len(events), tr.Events)
	require.Equal(t, 4, tr.ParseErrors, "each {\"foo\":1} is counted as unparsed")
	require.Equal(t, 1, tr.ReasoningEvents)
	require.Equal(t, 2, tr.ContentEvents)
	require.Equal(t, len(events)-3, tr.EmptyEvents)
	require.False(t, tr.Truncated)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.True(t, tr.UsageSeen)
	require.Equal(t, int64(7), tr.PromptTokens)
	require.Equal(t, int64(3), tr.CompletionTokens)
	require.Equal(t, int64(len(got)), tr.RespBytes)

	// Each stamp is taken when the proxy read its event, so it is never
	// earlier than the upstream's write of that event: an unknown event
	// written before it did not take the stamp.
	requireStreamStamps(t, &tr, true)
	require.False(t, tr.FirstEvent.Before(written[0]))
	require.False(t, tr.FirstOutput.Before(written[2]), "the unknown event before any output is not output")
	require.False(t, tr.FirstContent.Before(written[4]), "the unknown event after the reasoning is not content")
	require.False(t, tr.LastToken.Before(written[6]))
	require.False(t, tr.End.Before(written[9]), "the stream ends at [DONE]")
	log.mu.Lock()
	gaps := len(log.gaps)
	log.mu.Unlock()
	require.Equal(t, 2, gaps, "inter-event gaps are taken between output events only")
}

// TestProtocolCutStreamOutputTokens: a stream cut by the upstream after a
// few output events never reports fewer output tokens than the output
// events the client received (each carries at least one token).
func TestProtocolCutStreamOutputTokens(t *testing.T) {
	for _, pc := range protoCases {
		t.Run(pc.name, func(t *testing.T) {
			_, up := startSim(t, fastSim)
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up}, log)
			body := strings.Replace(pc.body(true, false, "cut short"), `"max_tokens":40`, `"max_tokens":400`, 1)
			body = strings.Replace(body, `"max_output_tokens":40`, `"max_output_tokens":400`, 1)
			req, err := http.NewRequest(http.MethodPost, base+pc.path, strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("X-Sim-Fail-After-Events", "5")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Error(t, err, "the client sees the cut")

			tr := log.next(t)
			require.Equal(t, pc.route, tr.Route)
			require.True(t, tr.Failed())
			require.Equal(t, SideUpstream, tr.ErrSide)
			require.Equal(t, 5, tr.ContentEvents+tr.ReasoningEvents)
			n, src := tr.OutputTokens()
			require.GreaterOrEqual(t, n, int64(5), "output tokens %d from %q", n, src)
		})
	}
}

// TestProtocolClientClosesAfterEndMarker: the official Go SDK closes a
// stream's body as soon as it reads [DONE] (ssestream.Stream.finish), before
// the chunked body's terminator, so its connection closes while the proxy
// still waits for the upstream's end of body. The client got the whole
// generation: the request must not be recorded as failed. The upstream here
// ends its body only after the client has closed, which makes deterministic
// a race that against the sim loses about one request in ten.
func TestProtocolClientClosesAfterEndMarker(t *testing.T) {
	body := "data: " + `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":"stop"}]}` + "\n\n" +
		"data: " + `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n" +
		"data: [DONE]\n\n"
	clientClosed := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		io.WriteString(w, body)
		w.(http.Flusher).Flush()
		select { // the engine's end of body comes after the client has gone
		case <-clientClosed:
		case <-time.After(5 * time.Second):
		}
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	rt := &http.Transport{}
	defer rt.CloseIdleConnections()
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("sk-test"),
		option.WithHTTPClient(&http.Client{Transport: rt}), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "m",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	content := ""
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			content += ch.Delta.Content
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, "Hello", content)
	stream.Close()
	close(clientClosed)

	tr := log.next(t)
	require.False(t, tr.Truncated, "the proxy relayed [DONE]")
	require.True(t, tr.UsageSeen)
	require.Equal(t, int64(1), tr.CompletionTokens)
	require.Equal(t, int64(len(body)), tr.RespBytes, "the client was sent every byte")
	require.Equal(t, ErrNone, tr.ErrKind)
	require.False(t, tr.Failed())
}

// TestProtocolCloseAfterEndKeepsUpstreamUsable: clients that close their
// connection as soon as they have what they need (a stream's end marker; an
// error's status line, as openai-go does with a 429 before it retries) must
// not break the proxy's next request. The race it looks for is narrow, so
// it tries many times and passes when it never sees it.
func TestProtocolCloseAfterEndKeepsUpstreamUsable(t *testing.T) {
	for _, c := range []struct {
		name, body, header string
		stream             bool
	}{
		{"stream", `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "", true},
		{"error", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "X-Sim-Status: 429\r\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, up := startSim(t, fastSim)
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up}, log)
			rt := &http.Transport{}
			defer rt.CloseIdleConnections()
			hc := &http.Client{Transport: rt}
			next := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
			for i := 0; i < 200; i++ {
				conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
				require.NoError(t, err)
				_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
					c.header, len(c.body), c.body)
				require.NoError(t, err)
				br := bufio.NewReader(conn)
				if c.stream {
					for { // up to [DONE], not the chunked terminator
						line, err := br.ReadString('\n')
						require.NoError(t, err)
						if line == "data: [DONE]\n" {
							break
						}
					}
				} else { // the status line only, as a client that gives up on an error at once
					line, err := br.ReadString('\n')
					require.NoError(t, err)
					require.Contains(t, line, " 429 ")
				}
				conn.Close() // gone as soon as the response is in
				log.next(t)

				resp, err := hc.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(next))
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				tr := log.next(t)
				require.Equal(t, http.StatusOK, resp.StatusCode, "after %d clients that closed right after a response (%s): %s/%s", i+1, c.name, tr.ErrSide, tr.ErrKind)
			}
		})
	}
}
