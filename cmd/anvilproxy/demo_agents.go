package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// agentKind is what one simulated coding agent does differently from a
// plain agent loop; each exercises one thing the proxy measures.
type agentKind int

const (
	kindCoder     agentKind = iota // chat completions, reasoning on most turns
	kindClock                      // the current time, to the second, in its system prompt: drifts every turn
	kindImpatient                  // gives up on long answers and re-sends; backs off after 429s
	kindShuffler                   // reorders its tools now and then: drifts at the tools
	kindResponses                  // the Responses API instead of chat completions
	kindReviewer                   // reasoning off, short answers
	kindLocal                      // as against a local ollama: no cached tokens reported, pauses longer than the engine's keep-alive
)

var kindNames = [...]string{"coder", "clock", "impatient", "shuffler", "responses", "reviewer", "local"}

func (k agentKind) String() string { return kindNames[k] }

// roster is the order in which agents are given kinds: with fewer agents,
// the first kinds come first.
var roster = [...]agentKind{kindCoder, kindClock, kindImpatient, kindShuffler, kindResponses, kindReviewer, kindCoder, kindLocal}

// Workload shape. In the simulated engine an answer stops by itself after
// 274–519 tokens unless max_tokens is smaller: at 235 tokens/s, 100–519
// tokens take 0.4–2.2 s. Agents that send an agent's large cap (8192,
// 32000, none) always get a natural stop; the others are cut by their cap now
// and then.
const (
	minTurns, maxTurns  = 6, 14 // turns per task before the agent starts a new conversation
	minToolRun          = 150 * time.Millisecond
	maxToolRun          = 1200 * time.Millisecond
	impatientTimeout    = 2500 * time.Millisecond // shorter than the impatient agent's long answers once they queue
	impatientAbandons   = 2                       // then it waits as long as it takes
	truncatedResends    = 2                       // re-sends of a truncated stream before taking its partial answer
	localPause          = 6 * time.Second         // longer than the engine's 5 s keep-alive: the proxy's pooled connection is closed meanwhile
	localPauseJitter    = 3 * time.Second
	agentCap            = 8192  // max_tokens as Claude Code and opencode recipes send it
	localCap            = 32000 // opencode's default max_tokens
	maxBackoffAttempts  = 4
	patientTimeout      = 2 * time.Minute
	demoModel           = "qwen3-8b"
	demoUserAgentPrefix = "anvilproxy-demo/1.0"
)

// workload runs the simulated agents against a proxy until stop.
type workload struct {
	base   string // the proxy's URL
	client *http.Client
	wg     sync.WaitGroup

	turns, abandoned, rejected, failed, truncated atomic.Int64
}

// startWorkload starts n agents against the proxy at base. They begin no new
// turn once soft is done, and abandon the turn in progress when hard is.
func startWorkload(soft, hard context.Context, base string, n int, seed int64) *workload {
	w := &workload{
		base: base,
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2 * n,
			DisableCompression:  true, // the agents read SSE as it comes
		}},
	}
	for i := range n {
		a := newAgent(i, roster[i%len(roster)], rand.New(rand.NewPCG(uint64(seed), uint64(i))), w)
		w.wg.Go(func() { a.run(soft, hard) })
	}
	return w
}

// wait returns once every agent has stopped.
func (w *workload) wait() {
	w.wg.Wait()
	w.client.CloseIdleConnections()
}

// agent is one simulated coding agent: a loop of model turns and tool runs
// over a growing conversation, as Codex CLI, opencode or Claude Code run.
type agent struct {
	id   int
	kind agentKind
	rng  *rand.Rand
	w    *workload

	system string
	tools  []demoTool
	msgs   []chatMessage // the conversation after the system prompt
	turn   int
	turns  int // this task's length
	task   int
}

func newAgent(id int, kind agentKind, rng *rand.Rand, w *workload) *agent {
	a := &agent{id: id, kind: kind, rng: rng, w: w}
	a.system = systemPrompt(rng, kind)
	a.tools = demoTools()
	a.newTask()
	return a
}

// newTask starts a new conversation: the history is dropped, as when an
// agent session ends.
func (a *agent) newTask() {
	a.task++
	a.turn = 0
	a.turns = minTurns + a.rng.IntN(maxTurns-minTurns+1)
	a.msgs = []chatMessage{{Role: "user", Content: taskPrompt(a.rng)}}
}

func (a *agent) run(soft, hard context.Context) {
	// Stagger the start, as agents are not started in the same millisecond.
	if !sleepCtx(soft, time.Duration(a.rng.IntN(800))*time.Millisecond) {
		return
	}
	for soft.Err() == nil {
		answer, err := a.step(soft, hard)
		if err != nil {
			if hard.Err() != nil {
				return
			}
			a.w.failed.Add(1)
			if !sleepCtx(soft, time.Second) {
				return
			}
			continue
		}
		a.w.turns.Add(1)
		a.record(answer)
		if !sleepCtx(soft, a.pause()) {
			return
		}
	}
}

// pause is the time between turns: a tool run, or for the local agent on
// every other turn its user reading the answer for longer than the engine
// keeps an idle connection open.
func (a *agent) pause() time.Duration {
	d := minToolRun + time.Duration(a.rng.Int64N(int64(maxToolRun-minToolRun)))
	if a.kind == kindLocal && a.turn%2 == 1 {
		d = localPause + time.Duration(a.rng.Int64N(int64(localPauseJitter)))
	}
	return d
}

// record appends the assistant's answer and the tool call it "made", then
// the tool's result: the next request re-sends the whole history.
func (a *agent) record(answer string) {
	a.turn++
	if a.turn >= a.turns {
		a.newTask()
		return
	}
	name, args := toolCall(a.rng)
	id := fmt.Sprintf("call_%d_%d_%d", a.id, a.task, a.turn)
	a.msgs = append(a.msgs,
		chatMessage{Role: "assistant", Content: answer, ToolCalls: []chatToolCall{{ID: id, Type: "function", Function: chatFunction{Name: name, Arguments: args}}}},
		chatMessage{Role: "tool", ToolCallID: id, Content: toolResult(a.rng, name)})
}

// step sends one turn and returns the assistant's visible answer. The
// impatient agent gives up on a slow stream and sends the same body again,
// and retries a 429 with exponential backoff, as the OpenAI SDKs do.
func (a *agent) step(soft, hard context.Context) (string, error) {
	path, body := a.request()
	hdr := http.Header{}
	impatient := a.kind == kindImpatient
	if impatient && a.rng.IntN(5) == 0 {
		hdr.Set("X-Sim-Fail-Attempts", "2") // the engine answers 429 twice
	}
	if a.kind == kindLocal {
		hdr.Set("X-Sim-Report-Cached", "false") // as ollama: cache hits only in timing
	}
	abandons, truncations := 0, 0
	for attempt := 0; ; attempt++ {
		timeout := patientTimeout
		if impatient && abandons < impatientAbandons {
			timeout = impatientTimeout
		}
		answer, err := a.send(hard, path, body, hdr, timeout)
		var st statusError
		switch {
		case err == nil:
			return answer, nil
		case hard.Err() != nil:
			return "", err
		case errors.Is(err, errTruncatedStream):
			// As Codex does when a stream ends before response.completed:
			// send it again, and in the end make do with what came.
			a.w.truncated.Add(1)
			if truncations++; truncations > truncatedResends || soft.Err() != nil {
				return answer, nil
			}
			continue
		case impatient && errors.Is(err, context.DeadlineExceeded):
			abandons++
			a.w.abandoned.Add(1)
			continue // at once: an impatient client does not wait
		case errors.As(err, &st) && st == http.StatusTooManyRequests && attempt < maxBackoffAttempts && soft.Err() == nil:
			a.w.rejected.Add(1)
			hdr.Set("X-Stainless-Retry-Count", strconv.Itoa(attempt+1))
			backoff := (500 * time.Millisecond << attempt) + time.Duration(a.rng.IntN(250))*time.Millisecond
			if !sleepCtx(hard, backoff) {
				return "", hard.Err()
			}
			continue
		}
		return "", err
	}
}

// statusError is an HTTP status other than 200.
type statusError int

func (e statusError) Error() string { return "HTTP " + strconv.Itoa(int(e)) }

// send makes one attempt and reads the stream to its end.
func (a *agent) send(hard context.Context, path string, body []byte, hdr http.Header, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(hard, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.w.base+path, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header = hdr.Clone()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", fmt.Sprintf("Bearer demo-key-%d", a.id))
	req.Header.Set("User-Agent", fmt.Sprintf("%s (agent %d, %s)", demoUserAgentPrefix, a.id, a.kind))
	resp, err := a.w.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return "", statusError(resp.StatusCode)
	}
	answer, err := readAnswer(resp.Body, a.kind == kindResponses)
	if err != nil && ctx.Err() != nil {
		return "", ctx.Err()
	}
	return answer, err
}

// errTruncatedStream is a stream that ended cleanly but unfinished: no
// finish_reason or [DONE] (chat), no response.completed (Responses), as
// ollama's streams end when it stops a generation for repetition.
var errTruncatedStream = errors.New("the stream ended before the answer finished")

// readAnswer collects the visible text of a chat completions or Responses
// stream. Reasoning is left out: agents do not send it back. A stream that
// ends without finishing returns its partial text and errTruncatedStream.
func readAnswer(r io.Reader, responses bool) (string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var out strings.Builder
	finished := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			finished = true
			continue
		}
		var ev struct {
			Type    string `json:"type"`
			Delta   string `json:"delta"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(data, &ev) != nil {
			continue
		}
		switch {
		case responses && ev.Type == "response.output_text.delta":
			out.WriteString(ev.Delta)
		case responses && ev.Type == "response.completed":
			finished = true
		case !responses && len(ev.Choices) > 0:
			out.WriteString(ev.Choices[0].Delta.Content)
		}
	}
	if err := sc.Err(); err != nil {
		return out.String(), err
	}
	if !finished {
		return out.String(), errTruncatedStream
	}
	return out.String(), nil
}

// request returns the path and body of the agent's next turn.
func (a *agent) request() (string, []byte) {
	maxTokens := 100 + a.rng.IntN(501)
	reasoning := a.rng.IntN(3) > 0
	switch a.kind {
	case kindCoder:
		maxTokens = agentCap
	case kindResponses:
		maxTokens = 0 // Codex sends no max_output_tokens
	case kindLocal:
		maxTokens = localCap
	case kindReviewer:
		maxTokens, reasoning = 60+a.rng.IntN(200), false
	case kindImpatient:
		maxTokens = 250 + a.rng.IntN(351)
	case kindShuffler:
		if a.rng.IntN(3) == 0 {
			a.rng.Shuffle(len(a.tools), func(i, j int) { a.tools[i], a.tools[j] = a.tools[j], a.tools[i] })
		}
	}
	system := a.system
	if a.kind == kindClock {
		// Where agents put the date: in the environment block, part way into
		// the system prompt, so everything after it is prefilled again.
		system = strings.Replace(system, clockMark, "Current time: "+time.Now().UTC().Format("2006-01-02 15:04:05")+" UTC", 1)
	}
	if a.kind == kindResponses {
		return "/v1/responses", mustJSON(responsesBody(a, system, maxTokens, reasoning))
	}
	msgs := append([]chatMessage{{Role: "system", Content: system}}, a.msgs...)
	b := chatBody{Model: demoModel, Messages: msgs, Stream: true, StreamOptions: &streamOptions{IncludeUsage: true}, MaxTokens: maxTokens}
	for _, t := range a.tools {
		b.Tools = append(b.Tools, chatTool{Type: "function", Function: t})
	}
	if !reasoning {
		b.ReasoningEffort = "none"
	}
	return "/v1/chat/completions", mustJSON(b)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: demo request: " + err.Error())
	}
	return b
}

// sleepCtx sleeps for d and reports whether ctx is still running.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
