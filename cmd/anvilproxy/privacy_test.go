package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// canaryUpstream answers every route the way an engine would, echoing the
// completion canary in every completion and the prompt in a 400 body
// (FastAPI validation errors echo their input).
func canaryUpstream(t *testing.T, completion string) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("X-Echo-Status") == "400" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprintf(w, `{"error":{"message":"invalid request: %q"}}`, body)
			return
		}
		stream := bytes.Contains(body, []byte(`"stream":true`))
		usage := `"usage":{"prompt_tokens":12,"completion_tokens":3,"input_tokens":12,"output_tokens":3}`
		var events []string
		switch r.URL.Path {
		case "/v1/chat/completions":
			if !stream {
				fmt.Fprintf(w, `{"choices":[{"message":{"role":"assistant","content":%q}}],%s}`, completion, usage)
				return
			}
			events = []string{fmt.Sprintf(`data: {"choices":[{"delta":{"content":%q}}]}`, completion), `data: {"choices":[],` + usage + `}`, "data: [DONE]"}
		case "/v1/completions":
			if !stream {
				fmt.Fprintf(w, `{"choices":[{"text":%q}],%s}`, completion, usage)
				return
			}
			events = []string{fmt.Sprintf(`data: {"choices":[{"text":%q}]}`, completion), "data: [DONE]"}
		case "/v1/responses":
			if !stream {
				fmt.Fprintf(w, `{"output":[{"type":"message","content":[{"type":"output_text","text":%q}]}],%s}`, completion, usage)
				return
			}
			events = []string{fmt.Sprintf("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":%q}", completion),
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{" + usage + "}}"}
		case "/v1/messages":
			if !stream {
				fmt.Fprintf(w, `{"content":[{"type":"text","text":%q}],%s}`, completion, usage)
				return
			}
			events = []string{fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":%q}}", completion),
				"event: message_stop\ndata: {\"type\":\"message_stop\"}"}
		case "/api/generate", "/api/chat": // ollama's native routes: NDJSON, one object when not streamed
			text := fmt.Sprintf(`"response":%q`, completion)
			if r.URL.Path == "/api/chat" {
				text = fmt.Sprintf(`"message":{"role":"assistant","content":%q}`, completion)
			}
			done := `{"model":"m","done":true,"done_reason":"stop","prompt_eval_count":12,"eval_count":3,"total_duration":5000000,"prompt_eval_duration":1000000,"eval_duration":3000000}`
			if !stream {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"model":"m",%s,"done":true,"prompt_eval_count":12,"eval_count":3}`, text)
				return
			}
			w.Header().Set("Content-Type", "application/x-ndjson")
			fmt.Fprintf(w, "{\"model\":\"m\",%s,\"done\":false}\n", text)
			w.(http.Flusher).Flush()
			fmt.Fprintf(w, "%s\n", done)
			return
		case "/completion": // llama.cpp's native route
			if !stream {
				fmt.Fprintf(w, `{"content":%q,"stop":true,"tokens_evaluated":12,"tokens_predicted":3}`, completion)
				return
			}
			events = []string{fmt.Sprintf(`data: {"content":%q,"stop":false}`, completion), `data: {"content":"","stop":true,"tokens_evaluated":12,"tokens_predicted":3}`}
		case "/v1/models":
			fmt.Fprintf(w, `{"data":[{"id":"m","owned_by":%q}]}`, completion)
			return
		default:
			fmt.Fprintf(w, "unknown route, %s", completion)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			fmt.Fprintf(w, "%s\n\n", ev)
			w.(http.Flusher).Flush()
			if r.Header.Get("X-Echo-Slow") != "" {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestNoSecretsOrContentAnywhere (P1): prompts, completions and keys
// (Authorization, x-api-key, ?key=) go through every route and every
// error path at debug level, and none of them appears in anything the
// proxy itself produces: its stdout and stderr, /metrics, /requests,
// /snapshot, the dashboard, the snapshot files, and the error bodies it
// makes (LiteLLM #906: "there should be 0 matches").
func TestNoSecretsOrContentAnywhere(t *testing.T) {
	token := fmt.Sprintf("Q%dZ", time.Now().UnixNano()) // in every canary, and nowhere else
	auth, xkey, qkey := "sk-CANARY-"+token+"-auth", "CANARY-"+token+"-xkey", "CANARY-"+token+"-qkey"
	prompt, completion := "CANARY-PROMPT-"+token, "CANARY-COMPLETION-"+token
	up := canaryUpstream(t, completion)
	s := startProc(t, up, "--max-body-bytes", "65536", "--max-header-bytes", "16384")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	unreachable := startProc(t, deadURL)

	var proxyMade []string // error bodies the proxy wrote
	sent := 0              // requests that reached the first server
	try := func(base, method, path, body string, header ...string) (int, string, error) {
		req, err := http.NewRequest(method, base+path+"?key="+qkey, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+auth)
		req.Header.Set("X-Api-Key", xkey)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err != nil {
			return 0, "", err
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(got), nil
	}
	do := func(base, method, path, body string, header ...string) (int, string) {
		t.Helper()
		code, got, err := try(base, method, path, body, header...)
		require.NoError(t, err)
		return code, got
	}
	// refused sends a request the proxy refuses before reading all of it.
	// It may close with bytes unread, and then the client can see a reset
	// instead of the answer (RELIABILITY.md, B4): try again, every attempt
	// is a request.
	refused := func(body string, header ...string) (int, string) {
		t.Helper()
		for range 10 {
			sent++
			if code, got, err := try(s.proxyURL, "POST", "/v1/chat/completions", body, header...); err == nil {
				return code, got
			}
		}
		t.Fatal("every attempt was reset")
		return 0, ""
	}
	chat := func(stream bool) string {
		return fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}],"prompt":%q,"input":%q}`, stream, prompt, prompt, prompt)
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/completion",
		"/api/generate", "/api/chat", "/v2/unknown"} {
		for _, stream := range []bool{false, true} {
			code, got := do(s.proxyURL, "POST", path, chat(stream))
			sent++
			require.Equal(t, 200, code, path)
			require.Contains(t, got, completion, "%s: the canary must reach the client, or the test proves nothing", path)
		}
	}
	code, got := do(s.proxyURL, "GET", "/v1/models", "")
	sent++
	require.Equal(t, 200, code)
	require.Contains(t, got, completion)

	code, got = do(s.proxyURL, "POST", "/v1/chat/completions", chat(false), "X-Echo-Status", "400")
	sent++
	require.Equal(t, 400, code)
	require.Contains(t, got, prompt, "the engine's own 400 echoes the prompt, and is relayed as it is")

	code, got = refused(chat(false) + strings.Repeat(" "+prompt, 5000))
	require.Equal(t, 413, code)
	proxyMade = append(proxyMade, got)

	code, got = refused(chat(false), "X-Big", strings.Repeat(auth, 1000))
	require.Equal(t, 431, code)
	proxyMade = append(proxyMade, got)

	for _, raw := range []string{
		"POST /v1/chat/completions?key=" + qkey + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + auth + "\r\nX-Api-Key: " + xkey +
			"\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(prompt), prompt),
		"POST /v1/chat/completions?key=" + qkey + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + auth +
			"\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n" + prompt,
		"POST /v1/chat/completions?key=" + qkey + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + auth +
			"\r\nTransfer-Encoding: chunked\r\n\r\nzz;" + prompt + "\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(s.proxyURL, "http://"))
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
		_, err = io.WriteString(c, raw)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		sent++
		require.Equal(t, 400, resp.StatusCode)
		proxyMade = append(proxyMade, string(b))
	}

	// A client that leaves mid-stream.
	req, err := http.NewRequest("POST", s.proxyURL+"/v1/chat/completions?key="+qkey, strings.NewReader(chat(true)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+auth)
	req.Header.Set("X-Echo-Slow", "1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	resp.Body.Close()
	sent++

	// The upstream is unreachable.
	for _, stream := range []bool{false, true} {
		code, got := do(unreachable.proxyURL, "POST", "/v1/chat/completions", chat(stream))
		require.Equal(t, 502, code)
		proxyMade = append(proxyMade, got)
	}

	// M2 end to end: every request is counted once, whatever its end.
	var metrics string
	require.Eventually(t, func() bool {
		metrics = fetch(t, s.adminURL+"/metrics")
		return sumSeries(metrics, "anvilproxy_requests_total") == float64(sent)
	}, 5*time.Second, 50*time.Millisecond, "requests_total %v, sent %d", sumSeries(metrics, "anvilproxy_requests_total"), sent)

	sinks := map[string]string{}
	for name, srv := range map[string]*proc{"proxy": s, "unreachable": unreachable} {
		for _, path := range []string{"/metrics", "/requests", "/snapshot", "/status", "/", "/healthz"} {
			sinks[name+" admin "+path] = fetch(t, srv.adminURL+path)
		}
		// 404 before a window ended, 503 with the engine down: the bodies
		// are checked whatever the status.
		for _, path := range []string{"/snapshot?window=last", "/readyz"} {
			_, body := get(t, srv.adminURL+path)
			sinks[name+" admin "+path] = body
		}
		srv.signal(t)
		require.Equal(t, 0, srv.wait(t, 10*time.Second))
		sinks[name+" stdout"] = srv.stdout.String()
		sinks[name+" stderr"] = srv.stderr.String()
		files := srv.snapshots(t)
		require.NotEmpty(t, files, "%s wrote no snapshot: nothing to check", name)
		for file, b := range files {
			sinks[name+" snapshot "+file] = string(b)
		}
	}
	require.Contains(t, sinks["proxy stderr"], `"level":"debug"`, "the run must be at debug level")
	for i, b := range proxyMade {
		sinks[fmt.Sprintf("error body %d", i)] = b
	}
	total := 0
	for _, text := range sinks {
		total += len(text)
	}
	t.Logf("%d requests; %d sinks, %d KiB searched", sent+2, len(sinks), total>>10)
	for name, text := range sinks {
		for _, mark := range []string{token, "CANARY"} { // the word alone catches a cut value
			if i := strings.Index(text, mark); i >= 0 {
				t.Errorf("a canary leaked into %s: …%s…", name, text[max(0, i-120):min(len(text), i+60)])
				break
			}
		}
	}
}
