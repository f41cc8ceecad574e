package histo_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// agentConv is a chat conversation as an agent sends it: the system
// prompt, then user and assistant messages.
type agentConv struct {
	system string
	tools  string // a JSON array, or ""
	msgs   []map[string]string
}

func (c *agentConv) say(role, content string) {
	c.msgs = append(c.msgs, map[string]string{"role": role, "content": content})
}

func (c *agentConv) body(t *testing.T, maxTokens int) string {
	t.Helper()
	msgs := append([]map[string]string{{"role": "system", "content": c.system}}, c.msgs...)
	b, err := json.Marshal(msgs)
	require.NoError(t, err)
	tools := ""
	if c.tools != "" {
		tools = `"tools":` + c.tools + `,`
	}
	return fmt.Sprintf(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,%s"messages":%s}`, maxTokens, tools, b)
}

// TestAgentGapsThroughProxy: a three-turn conversation through the real
// proxy and the sim, with the agent sleeping between turns; the proxy
// links the turns and measures the sleeps as agent time.
func TestAgentGapsThroughProxy(t *testing.T) {
	up := simUpstream(t, sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 5000})
	s := newStack(t, up, proxy.Config{}, histo.Config{})
	c := &agentConv{system: "You are a coding agent working in /home/dev/project. Run the tests after every change."}
	sleeps := []time.Duration{150 * time.Millisecond, 300 * time.Millisecond}
	c.say("user", "The test TestParse fails since yesterday; find out why and fix it.")
	for turn := range 3 {
		if turn > 0 {
			time.Sleep(sleeps[turn-1])
			c.say("assistant", fmt.Sprintf("I ran the tool for step %d and read its output carefully.", turn))
			c.say("user", fmt.Sprintf("Tool result %d: ok, 12 tests passed, 0 failed, 3 skipped.", turn))
		}
		s.post(t, c.body(t, 20))
		s.last(t, turn+1)
	}
	w := s.rec.Current()
	cs := w.Conversations
	require.Equal(t, int64(1), cs.Conversations, "the three turns are one conversation")
	require.Equal(t, int64(3), cs.Turns)
	require.Equal(t, int64(2), cs.AgentGapMs.Count)
	tl := cs.Slowest[0].Timeline
	require.Len(t, tl, 3)
	require.False(t, tl[0].AgentGapMs.Known())
	rqs := s.rec.Recent(3) // newest first
	for i, sleep := range sleeps {
		gap := time.Duration(float64(tl[i+1].AgentGapMs) * float64(time.Millisecond))
		require.GreaterOrEqual(t, gap, sleep-time.Millisecond, "turn %d", i+1)
		// The gap is the previous turn's t_client_done to this turn's
		// t_recv, whatever the client's own overhead on a loaded machine
		// (1 ms: Start is wall clock, the stamps monotonic).
		prev, next := rqs[2-i], rqs[1-i]
		require.InDelta(t, float64(next.Start.Sub(stampAt(prev, prev.Stamps.ClientDone))), float64(gap), float64(time.Millisecond), "turn %d", i+1)
		require.Equal(t, i+1, tl[i+1].Turn)
	}
	require.InDelta(t, float64(cs.AgentMs), float64(tl[1].AgentGapMs+tl[2].AgentGapMs), 1e-6)
	require.Greater(t, float64(cs.AgentShare), 0.5, "the sleeps dwarf the fast engine")

	// The ledger: the last turn is the newest user message; the rest of
	// the messages are history.
	l := w.Ledger
	require.Equal(t, int64(3), l.Requests)
	require.Equal(t, l.PromptBytes, l.Parts.System.Bytes+l.Parts.Tools.Bytes+l.Parts.History.Bytes+l.Parts.LastTurn.Bytes)
	require.Equal(t, int64(3*len(c.system)), l.Parts.System.Bytes)
	last := int64(len(c.msgs[0]["content"]) + len(c.msgs[2]["content"]) + len(c.msgs[4]["content"]))
	require.Equal(t, last, l.Parts.LastTurn.Bytes)
	require.Len(t, l.ByTurn, 3)
}

// TestKneeAtSlotCount: six requests at once against an engine with two
// slots; the third one admitted waits for a slot as long as it is served,
// so the knee is at two in flight. A request is served 800 ms: the six are
// sent one after another (each once the engine queued the one before),
// and under the race detector beside other packages' tests that took
// 100 ms, which at 200 ms a request left the third a queue of 84 ms and
// the knee elsewhere (once, session 17).
func TestKneeAtSlotCount(t *testing.T) {
	engine, up := simServer(t, sim.Config{Slots: 2, PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 50, Timings: sim.TimingVLLM})
	s := newStack(t, up, proxy.Config{}, histo.Config{EngineSlots: 2})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() { s.post(t, chatBody(fmt.Sprintf("prompt %d for the knee", i), 40)) })
		waitEnqueued(t, engine, int64(i)) // admitted in order, each in flight at the next's admission
	}
	wg.Wait()
	s.last(t, 6)
	k := s.rec.Current().Concurrency
	var levels []int
	for _, l := range k.Levels {
		levels = append(levels, l.Inflight)
		require.Equal(t, int64(1), l.QueueMs.Count, "level %s: a known queue (the sim reports vLLM's)", l.Level)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4, 5}, levels)
	require.Equal(t, histo.Count(2), k.Knee, "the knee is at the slot count: %+v", k.Levels)
	require.Equal(t, histo.Count(2), k.Typical)
	require.Equal(t, histo.ReadingAtKnee, k.Reading)
}

// TestNoPromptTextInNewOutputs: prompts carrying a canary in every part
// (system, tools, history, last turn) yield sections, snapshots, metrics
// and request records without it.
func TestNoPromptTextInNewOutputs(t *testing.T) {
	const canary = "CANARY-LEDGER"
	up := simUpstream(t, sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 5000})
	s := newStack(t, up, proxy.Config{}, histo.Config{})
	c := &agentConv{
		system: "You are " + canary + ", a coding agent. Never reveal " + canary + ".",
		tools:  `[{"type":"function","function":{"name":"` + canary + `","description":"` + canary + `","parameters":{"type":"object"}}}]`,
	}
	c.say("user", "Please look at "+canary+" in the parser; it crashes on input "+canary+".")
	for turn := range 3 {
		if turn > 0 {
			c.say("assistant", "Looking at "+canary+" now, step "+fmt.Sprint(turn))
			c.say("user", "Tool output: "+canary+" "+fmt.Sprint(turn))
		}
		s.post(t, c.body(t, 8))
	}
	s.last(t, 3)
	s.rec.SelfCheck().Start()
	require.Eventually(t, func() bool { return s.rec.Current().Quality.TimerOvershootMs.Count > 0 },
		10*time.Second, 5*time.Millisecond, "a probe sample")
	s.rec.SelfCheck().Stop()

	w := s.rec.Current()
	require.Equal(t, int64(3), w.Ledger.Requests)
	require.Equal(t, int64(3), w.Conversations.Turns)
	for name, v := range map[string]any{
		"conversations": w.Conversations, "prompt_ledger": w.Ledger, "concurrency": w.Concurrency, "measurement_quality": w.Quality,
	} {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		require.NotContains(t, string(b), canary, name)
		require.NotContains(t, fmt.Sprintf("%+v", v), canary, name)
	}
	doc, err := snapshot.Build(w, snapshot.PrefillModel{})
	require.NoError(t, err)
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	require.Contains(t, string(b), `"prompt_ledger":{`)
	require.NotContains(t, string(b), canary)
	var table strings.Builder
	require.NoError(t, snapshot.WriteTable(&table, doc))
	require.Contains(t, table.String(), "prompt ledger")
	require.NotContains(t, table.String(), canary)

	for _, path := range []string{"/metrics", "/requests"} {
		rr := httptest.NewRecorder()
		s.rec.Handler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, path, nil))
		body, err := io.ReadAll(rr.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, rr.Code)
		require.NotContains(t, string(body), canary, path)
		if path == "/metrics" {
			require.Contains(t, string(body), "anvilproxy_prompt_share_ratio")
			require.Contains(t, string(body), "anvilproxy_agent_gap_seconds")
		}
	}
}
