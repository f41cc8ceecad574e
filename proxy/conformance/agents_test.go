package conformance

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// Agent conversations, shaped as cmd/anvilproxy's demo agents: a system
// prompt every agent shares, a task, then turns of the model's answer and a
// tool's result, each request re-sending the whole history.
const (
	conversations      = 8
	conversationTurns  = 4
	sharedSystemChars  = 300 // the plain model's template writes it twice: ~600 tokens
	taskChars          = 100
	minToolResultChars = 80
	maxToolResultChars = 160
	minToolRun         = 50 * time.Millisecond
	maxToolRun         = 200 * time.Millisecond
	// readyByTurn: from this turn of every conversation on, the inferred
	// cache figure must be known (issue 23: ready within the first turns).
	readyByTurn = 2
	// cacheBar: over a conversation, the inferred cached tokens within 20%
	// of the tokens ollama reused (its slot lines' used=N).
	cacheBar = 0.20
)

// TestAgentConversationsInferredCache: 8 concurrent agent conversations of
// 4 turns through a proxy given no flags, on ollama with one slot and with
// four. ollama reports no cached tokens, but its slot log says how much of
// each prompt it reused (used=N). The proxy's inferred figure
// (cache_inferred_tokens) must be known from each conversation's second
// turn, and within 20% of ollama's reuse over each conversation; each
// request's queue is held to the slot log as in the bursts.
func TestAgentConversationsInferredCache(t *testing.T) {
	for _, slots := range []int{1, 4} {
		t.Run(fmt.Sprintf("parallel%d", slots), func(t *testing.T) {
			url, logPath := engineWithSlots(t, slots)
			warmEngine(t, url)
			st := newStackOn(t, url, histo.Config{})
			elog := markLog(t, logPath)
			convs := runConversations(t, st.proxyURL)
			var ss []*sample
			for _, c := range convs {
				ss = append(ss, c...)
			}
			pairRecords(t, ss, st.waitRecords(t, len(ss)))
			pairSlots(t, ss, elog.waitSlots(t, len(ss)))
			for _, c := range convs {
				for _, s := range c {
					logSample(t, s)
				}
			}
			logSplitTable(t, ss)
			writeCapture(t, st, ollamaEngine, fmt.Sprintf("agents-p%d", slots), slots, 0, ss)
			checkQueueBar(t, ss)
			checkInferredCache(t, convs)
		})
	}
}

// chatMsg is one message of a conversation.
type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// runConversations runs the conversations at once and returns each one's
// turns, in order.
func runConversations(t *testing.T, base string) [][]*sample {
	t.Helper()
	system := freshPrompt(sharedSystemChars)
	out := make([][]*sample, conversations)
	var wg sync.WaitGroup
	for c := range conversations {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(c)))
		// Tasks of distinct lengths, so that first turns differ in prompt
		// tokens (they pair the engine's slot lines).
		msgs := []chatMsg{{"system", system}, {"user", freshPrompt(taskChars + 20*c)}}
		wg.Go(func() {
			// Agents are not started in the same millisecond.
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
			for turn := 1; turn <= conversationTurns; turn++ {
				s := &sample{label: fmt.Sprintf("conversation %d turn %d", c+1, turn)}
				s.resp = do(t, base, "/v1/chat/completions", conversationBody(t, msgs), "", 0)
				if s.resp.status != 200 || s.resp.readErr != nil {
					t.Errorf("%s: status %d, read error %v", s.label, s.resp.status, s.resp.readErr)
					return
				}
				out[c] = append(out[c], s)
				msgs = append(msgs,
					chatMsg{"assistant", chatAnswer(t, s.resp)},
					chatMsg{"user", "tool result: " + freshPrompt(minToolResultChars+rng.IntN(maxToolResultChars-minToolResultChars))})
				time.Sleep(minToolRun + time.Duration(rng.Int64N(int64(maxToolRun-minToolRun))))
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, c := range out {
		for _, s := range c {
			s.obs = s.resp.observe(t, "/v1/chat/completions")
			if s.obs.usage == nil {
				t.Fatalf("%s: no usage", s.label)
			}
			s.prompt = int(s.obs.usage.prompt)
		}
	}
	return out
}

func conversationBody(t *testing.T, msgs []chatMsg) string {
	b, err := json.Marshal(map[string]any{
		"model": plainModel, "stream": true, "stream_options": map[string]bool{"include_usage": true}, "messages": msgs,
	})
	if err != nil {
		t.Error(err)
	}
	return string(b)
}

// chatAnswer is the content the client read from a streamed chat answer.
func chatAnswer(t *testing.T, r *response) string {
	var s string
	for _, ev := range r.events {
		if ev.data == "[DONE]" {
			continue
		}
		var v struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
			t.Errorf("event data is not JSON: %v", err)
			return s
		}
		for _, c := range v.Choices {
			s += c.Delta.Content
		}
	}
	return s
}

// checkInferredCache holds the proxy's inferred cached tokens to ollama's
// reuse: known from readyByTurn on, and within cacheBar over each
// conversation (the turns where it is known).
func checkInferredCache(t *testing.T, convs [][]*sample) {
	t.Helper()
	var allInf, allUsed int64
	for c, turns := range convs {
		var inf, used, prompt int64
		firstKnown := 0
		for k, s := range turns {
			turn := k + 1
			if s.rec.CacheInferredTokens == nil {
				if turn >= readyByTurn {
					barMissed(t, "%s: cache_inferred_tokens null (ollama reused %d of %d)", s.label, s.slot.used, s.slot.prompt)
				}
				continue
			}
			if firstKnown == 0 {
				firstKnown = turn
			}
			inf += *s.rec.CacheInferredTokens
			used += int64(s.slot.used)
			prompt += int64(s.slot.prompt)
		}
		allInf += inf
		allUsed += used
		if firstKnown == 0 {
			barMissed(t, "conversation %d: no inferred figure on any turn", c+1)
			continue
		}
		rel := relErr(inf, used)
		t.Logf("conversation %d: inferred known from turn %d; over those turns inferred %d, ollama reused %d of %d prompt tokens: %+.1f%%", c+1, firstKnown, inf, used, prompt, 100*rel)
		if rel < -cacheBar || rel > cacheBar {
			barMissed(t, "conversation %d: inferred %d cached tokens where ollama reused %d (%+.1f%%, bar ±%.0f%%)", c+1, inf, used, 100*rel, 100*cacheBar)
		}
	}
	t.Logf("all conversations: inferred %d, ollama reused %d: %+.1f%%", allInf, allUsed, 100*relErr(allInf, allUsed))
}

// relErr is (got − want) / want; a want of 0 counts got as all error.
func relErr(got, want int64) float64 {
	if want == 0 {
		if got == 0 {
			return 0
		}
		return 1
	}
	return float64(got-want) / float64(want)
}
