package prefix

import (
	"fmt"
	"strings"
	"testing"

	"github.com/anvilproxy/anvilproxy/sse"
	"github.com/stretchr/testify/require"
)

// parts is a Result's composition.
type parts struct{ system, tools, history, last int64 }

func partsOf(r Result) parts {
	return parts{r.SystemBytes, r.ToolsBytes, r.HistoryBytes, r.LastTurnBytes}
}

// TestComposition: the prompt's bytes split exactly into system, tools,
// history and last turn. Plain string contents are their own canonical
// text, so the expected sizes are the strings' lengths.
func TestComposition(t *testing.T) {
	sys := strings.Repeat("You are a coding agent. ", 20)
	t1, t2 := tool("read_file", "Read a file."), tool("grep", "Search.")
	u1 := "Fix the failing test in pkg/parse, it broke yesterday."
	a1 := "I will read the parser first and then run the tests."
	u2 := "The tests pass now; please also update the changelog."
	msg := func(role, content string) string { return fmt.Sprintf(`{"role":%q,"content":%q}`, role, content) }
	chat := func(msgs ...string) string {
		return `{"model":"m","stream":true,"tools":[` + t1 + `,` + t2 + `],"messages":[` + msg("system", sys) + `,` + strings.Join(msgs, ",") + `]}`
	}
	toolsBytes := int64(len(t1) + 1 + len(t2))
	for _, c := range []struct {
		name  string
		proto sse.Protocol
		body  string
		want  parts
	}{
		{"first turn: all messages are the last turn", sse.ProtocolChat, chat(msg("user", u1)),
			parts{int64(len(sys)), toolsBytes, 0, int64(len(u1))}},
		{"history up to the last assistant message", sse.ProtocolChat, chat(msg("user", u1), msg("assistant", a1), msg("user", u2)),
			parts{int64(len(sys)), toolsBytes, int64(len(u1) + len(a1)), int64(len(u2))}},
		{"a trailing assistant message leaves no last turn", sse.ProtocolChat, chat(msg("user", u1), msg("assistant", a1)),
			parts{int64(len(sys)), toolsBytes, int64(len(u1) + len(a1)), 0}},
		{"several messages after the assistant", sse.ProtocolChat, chat(msg("user", u1), msg("assistant", a1), msg("user", u2), msg("user", u1)),
			parts{int64(len(sys)), toolsBytes, int64(len(u1) + len(a1)), int64(len(u2) + len(u1))}},
		{"anthropic system field", sse.ProtocolMessages,
			fmt.Sprintf(`{"model":"m","max_tokens":9,"system":%q,"messages":[%s,%s,%s]}`, sys, msg("user", u1), msg("assistant", a1), msg("user", u2)),
			parts{int64(len(sys)), 0, int64(len(u1) + len(a1)), int64(len(u2))}},
		{"completions have no parts", sse.ProtocolCompletions, fmt.Sprintf(`{"model":"m","prompt":%q}`, sys), parts{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newTracker(t, Config{}).Observe(c.proto, []byte(c.body), t0)
			require.True(t, r.Tracked)
			require.Equal(t, c.want, partsOf(r))
			if c.proto != sse.ProtocolCompletions {
				require.Equal(t, r.PromptBytes, r.SystemBytes+r.ToolsBytes+r.HistoryBytes+r.LastTurnBytes)
			}
		})
	}
}

// TestCompositionResponses: a Responses function call is the model's (the
// history), its output the tool's (the last turn).
func TestCompositionResponses(t *testing.T) {
	body := `{"model":"m","instructions":"Be brief and precise in every answer.","input":[` +
		`{"role":"user","content":"Which files import the parser package today?"},` +
		`{"type":"function_call","call_id":"c1","name":"grep","arguments":"{\"q\":\"parse\"}"},` +
		`{"type":"function_call_output","call_id":"c1","output":"a.go b.go"}]}`
	r := newTracker(t, Config{}).Observe(sse.ProtocolResponses, []byte(body), t0)
	require.True(t, r.Tracked)
	require.Equal(t, int64(len("Be brief and precise in every answer.")), r.SystemBytes)
	require.Zero(t, r.ToolsBytes)
	require.Greater(t, r.HistoryBytes, int64(len("Which files import the parser package today?")))
	require.Greater(t, r.LastTurnBytes, int64(len("a.go b.go")))
	require.Equal(t, r.PromptBytes, r.SystemBytes+r.HistoryBytes+r.LastTurnBytes)
}

// TestCompositionGrowsWithTurns: along an agent conversation the history
// grows turn by turn while system and tools stay put, and the parts always
// add up to the prompt.
func TestCompositionGrowsWithTurns(t *testing.T) {
	rs := run(t, newTracker(t, Config{}), newConv(task), 6, nil)
	for i, r := range rs {
		require.Equal(t, r.PromptBytes, r.SystemBytes+r.ToolsBytes+r.HistoryBytes+r.LastTurnBytes, "turn %d", i)
		require.Equal(t, rs[0].SystemBytes, r.SystemBytes)
		require.Equal(t, int64(len(toolsText(defaultTools))), r.ToolsBytes)
		if i == 0 {
			require.Zero(t, r.HistoryBytes)
			require.Equal(t, int64(len(task)), r.LastTurnBytes)
			continue
		}
		// The previous last turn moved into the history, followed by the
		// assistant's tool call; the tool's result is the new last turn.
		assistant := r.HistoryBytes - rs[i-1].HistoryBytes - rs[i-1].LastTurnBytes
		require.Greater(t, assistant, int64(len("Let me look at file 1.")), "turn %d", i)
		require.Equal(t, int64(len(fmt.Sprintf("package pkg\n\n// File %d.\nfunc F%d() int {\n\treturn %d\n}\n", i, i, i))+len("\x1ftool_call_id:")+len(fmt.Sprintf("%q", fmt.Sprintf("call_%d", i)))),
			r.LastTurnBytes, "turn %d", i)
	}
}
