package prefix

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/sse"
	"github.com/stretchr/testify/require"
)

// testChainKey makes fine hashes, and so exact offsets, deterministic in
// tests; production keys are random.
const testChainKey = 0x5eed5eed5eed5eed

func newTracker(t testing.TB, cfg Config) *Tracker {
	t.Helper()
	tr, err := New(cfg)
	require.NoError(t, err)
	tr.chain = testChainKey
	return tr
}

var t0 = time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatMsg struct {
	Role       string     `json:"role"`
	Content    any        `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// conv is a synthetic coding-agent conversation in chat completions form.
type conv struct {
	system string
	tools  []string // compact JSON of each tool
	msgs   []chatMsg
}

func systemPrompt(stamp string) string {
	return "You are a coding agent working in /home/dev/project.\n" +
		"Follow the repository conventions. Run the tests after every change.\n\n" +
		"Current time: " + stamp + "\nPlatform: linux\n"
}

func tool(name, desc string) string {
	return fmt.Sprintf(`{"type":"function","function":{"name":%q,"description":%q,"parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}`, name, desc)
}

var defaultTools = []string{
	tool("read_file", "Read a file from the workspace."),
	tool("write_file", "Write a file in the workspace."),
	tool("run_tests", "Run the test suite."),
	tool("grep", "Search the workspace."),
}

func newConv(task string) *conv {
	return &conv{
		system: systemPrompt("2025-06-01T10:00:00Z"),
		tools:  append([]string(nil), defaultTools...),
		msgs:   []chatMsg{{Role: "user", Content: task}},
	}
}

// turn appends an assistant tool call and its result, as an agent does
// between two requests.
func (c *conv) turn(i int) {
	call := toolCall{ID: fmt.Sprintf("call_%d", i), Type: "function"}
	call.Function.Name = "read_file"
	call.Function.Arguments = fmt.Sprintf(`{"path":"pkg/file%d.go"}`, i)
	c.msgs = append(c.msgs,
		chatMsg{Role: "assistant", Content: fmt.Sprintf("Let me look at file %d.", i), ToolCalls: []toolCall{call}},
		chatMsg{Role: "tool", ToolCallID: call.ID, Content: fmt.Sprintf("package pkg\n\n// File %d.\nfunc F%d() int {\n\treturn %d\n}\n", i, i, i)},
	)
}

func (c *conv) body(t testing.TB) []byte {
	t.Helper()
	msgs := append([]chatMsg{{Role: "system", Content: c.system}}, c.msgs...)
	tools := make([]json.RawMessage, len(c.tools))
	for i, s := range c.tools {
		tools[i] = json.RawMessage(s)
	}
	b, err := json.Marshal(map[string]any{"model": "qwen3-coder", "stream": true, "temperature": 0.2, "messages": msgs, "tools": tools})
	require.NoError(t, err)
	return b
}

// firstDiffString is the byte offset where a and b first differ.
func firstDiffString(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// run observes the conversation for turns turns, calling edit before each
// request, and returns the results.
func run(t *testing.T, tr *Tracker, c *conv, turns int, edit func(turn int, c *conv)) []Result {
	t.Helper()
	var out []Result
	for i := range turns {
		if i > 0 {
			c.turn(i)
		}
		if edit != nil {
			edit(i, c)
		}
		out = append(out, tr.Observe(sse.ProtocolChat, c.body(t), t0.Add(time.Duration(i)*time.Minute)))
	}
	return out
}

// drifts returns the indexes of the results that drifted.
func drifts(rs []Result) []int {
	var out []int
	for i, r := range rs {
		if r.Drift.Happened {
			out = append(out, i)
		}
	}
	return out
}

func toolsText(tools []string) string { return strings.Join(tools, "\n") }
