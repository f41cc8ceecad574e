package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// The request shapes the demo agents send: the fields real agents send that
// matter to the engine's prefix cache and timing, nothing more.

type chatBody struct {
	Model           string         `json:"model"`
	Messages        []chatMessage  `json:"messages"`
	Tools           []chatTool     `json:"tools,omitempty"`
	Stream          bool           `json:"stream"`
	StreamOptions   *streamOptions `json:"stream_options,omitempty"`
	MaxTokens       int            `json:"max_tokens"`
	ReasoningEffort string         `json:"reasoning_effort,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    string         `json:"content"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string   `json:"type"`
	Function demoTool `json:"function"`
}

// demoTool is a function definition, as chat completions nest it and as
// the Responses API flattens it.
type demoTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

type responsesRequest struct {
	Model           string            `json:"model"`
	Instructions    string            `json:"instructions"`
	Input           []json.RawMessage `json:"input"`
	Tools           []responsesTool   `json:"tools"`
	Stream          bool              `json:"stream"`
	MaxOutputTokens int               `json:"max_output_tokens,omitempty"`
	Reasoning       struct {
		Effort string `json:"effort"`
	} `json:"reasoning"`
}

type responsesTool struct {
	Type string `json:"type"`
	demoTool
}

// responsesBody renders the agent's conversation for POST /v1/responses:
// the system prompt as instructions, tool calls and their outputs as items.
func responsesBody(a *agent, system string, maxTokens int, reasoning bool) responsesRequest {
	r := responsesRequest{Model: demoModel, Instructions: system, Stream: true, MaxOutputTokens: maxTokens}
	r.Reasoning.Effort = "medium"
	if !reasoning {
		r.Reasoning.Effort = "none"
	}
	for _, t := range a.tools {
		r.Tools = append(r.Tools, responsesTool{Type: "function", demoTool: t})
	}
	for _, m := range a.msgs {
		switch m.Role {
		case "tool":
			r.Input = append(r.Input, mustJSON(map[string]string{"type": "function_call_output", "call_id": m.ToolCallID, "output": m.Content}))
		default:
			r.Input = append(r.Input, mustJSON(map[string]string{"role": m.Role, "content": m.Content}))
			for _, c := range m.ToolCalls {
				r.Input = append(r.Input, mustJSON(map[string]string{"type": "function_call", "call_id": c.ID, "name": c.Function.Name, "arguments": c.Function.Arguments}))
			}
		}
	}
	return r
}

// demoTools are a coding agent's usual tools, about 2.5 KB of definitions.
func demoTools() []demoTool {
	tool := func(name, desc, params string) demoTool {
		return demoTool{Name: name, Description: desc, Parameters: json.RawMessage(params)}
	}
	path := `"path":{"type":"string","description":"Path relative to the repository root."}`
	return []demoTool{
		tool("read_file", "Read a file from the repository. Returns its contents with line numbers. Use offset and limit for large files.",
			`{"type":"object","properties":{`+path+`,"offset":{"type":"integer","description":"First line, 1-based."},"limit":{"type":"integer","description":"Number of lines."}},"required":["path"]}`),
		tool("list_dir", "List the entries of a directory, with sizes. Directories end in a slash.",
			`{"type":"object","properties":{`+path+`},"required":["path"]}`),
		tool("grep", "Search the repository for a regular expression (RE2). Returns matching lines as path:line: text, at most 200.",
			`{"type":"object","properties":{"pattern":{"type":"string"},"glob":{"type":"string","description":"Only files matching this glob."}},"required":["pattern"]}`),
		tool("edit_file", "Replace an exact, unique string in a file with another. Fails when the old string is missing or appears more than once.",
			`{"type":"object","properties":{`+path+`,"old_string":{"type":"string"},"new_string":{"type":"string"}},"required":["path","old_string","new_string"]}`),
		tool("run_tests", "Run the test suite or one package's tests and return the output, truncated to the last 8 KB.",
			`{"type":"object","properties":{"package":{"type":"string","description":"Go package pattern, e.g. ./proxy/..."},"run":{"type":"string","description":"Regular expression of test names."}}}`),
		tool("shell", "Run a shell command in the repository with a 120 s timeout. Prefer the dedicated tools for reading and editing files.",
			`{"type":"object","properties":{"command":{"type":"string"},"timeout_s":{"type":"integer"}},"required":["command"]}`),
	}
}

// clockMark is replaced by the clock agent's current time.
const clockMark = "{{clock}}"

var systemRules = []string{
	"You are a coding agent working in a Go repository on the user's machine. You can read and edit files and run commands through the tools provided.",
	"Work in small steps. Before editing a file, read the part you will change. After a change, run the tests of the package you changed.",
	"Never invent file contents, paths or APIs: look them up with the tools. When a command fails, read its output before trying again.",
	"Keep answers short. When you call a tool, say in one sentence why. When the task is done, summarize what changed and how you verified it.",
	"Follow the repository's style: gofmt, wrapped errors with %w, doc comments on exported names, table tests with t.Run.",
	"Do not run commands that need network access, and do not modify files outside the repository.",
	"If the user's request is ambiguous, pick the reading that changes the least and say which one you picked.",
	"Prefer the standard library. Do not add dependencies without asking.",
}

var projectNotes = []string{
	"The proxy relays bytes first and measures second: never buffer a stream.",
	"Histograms are HDR with three significant digits; quantiles are nearest rank.",
	"Snapshots are written atomically: temporary file, fsync, rename, fsync of the directory.",
	"Tests use testify's require only; fake upstreams listen on loopback.",
	"The sse package is a leaf and imports the standard library only.",
	"Time in tests comes from an injected clock or testing/synctest.",
	"Errors name the side that failed: client, upstream or proxy.",
	"Labels are bounded; no metric label carries a client-supplied string.",
}

// systemPrompt is 2–6 KB of instructions, repository notes and an
// environment block, the shape of Codex CLI's and Claude Code's.
func systemPrompt(rng *rand.Rand, kind agentKind) string {
	var b strings.Builder
	target := 2048 + rng.IntN(4096)
	b.WriteString("# Instructions\n\n")
	for _, r := range systemRules {
		b.WriteString("- " + r + "\n")
	}
	b.WriteString("\n# Environment\n\n- Working directory: /src/anvilproxy\n- Platform: linux/amd64\n- Shell: bash\n")
	if kind == kindClock {
		b.WriteString("- " + clockMark + "\n")
	}
	b.WriteString("\n# Repository notes (AGENTS.md)\n\n")
	for b.Len() < target {
		b.WriteString("- " + projectNotes[rng.IntN(len(projectNotes))] + "\n")
	}
	return b.String()
}

var tasks = []string{
	"The retry tracker counts a 429 followed by a success as two logical requests. Find out why and fix it; add a test.",
	"Add a --max-event-bytes flag to serve and document it in the README's flag table.",
	"TestSnapshotDiskGone is flaky on slow machines. Make it deterministic without sleeping.",
	"The report command prints '-' for tpot when every request has one output token. Print 'n/a (1 token)' instead.",
	"Rename Window.Dropped to Window.DroppedRecords everywhere and keep the JSON key unchanged.",
	"Profile the SSE parser on a 10 MB capture and remove the allocation in the event loop.",
	"Add the route label to anvilproxy_errors_total and update the Grafana dashboard queries.",
}

// taskPrompt is the user's first message of a task.
func taskPrompt(rng *rand.Rand) string {
	return tasks[rng.IntN(len(tasks))] + "\n\nRepository: anvilproxy. Run the tests before you finish."
}

var toolNames = [...]string{"read_file", "grep", "run_tests", "list_dir", "edit_file", "shell", "read_file", "grep"}

var demoFiles = [...]string{"proxy/proxy.go", "proxy/stream.go", "histo/recorder.go", "histo/window.go", "sse/parser.go",
	"proxy/retry/retry.go", "histo/snapshot/writer.go", "cmd/anvilproxy/serve.go"}

// toolCall picks the tool the assistant "calls" and its arguments.
func toolCall(rng *rand.Rand) (name, args string) {
	name = toolNames[rng.IntN(len(toolNames))]
	file := demoFiles[rng.IntN(len(demoFiles))]
	switch name {
	case "grep":
		return name, fmt.Sprintf(`{"pattern":"func \\(\\w+ \\*%s\\)"}`, []string{"Recorder", "Proxy", "Writer", "Parser"}[rng.IntN(4)])
	case "run_tests":
		return name, fmt.Sprintf(`{"package":"./%s"}`, file[:strings.LastIndexByte(file, '/')])
	case "shell":
		return name, `{"command":"go vet ./... && git status --short"}`
	}
	return name, fmt.Sprintf(`{"path":%q}`, file)
}

var codeWords = strings.Fields(`func return err nil if for range ctx req resp buf n ok := = != == { } ( ) []byte
	string int64 time.Duration defer mu.Lock() mu.Unlock() fmt.Errorf("reading upstream: %w", err) select case <-done:
	atomic.Int64 *Trace tr.Recv tr.End histo.Span require.NoError(t, err) t.Run(tc.name, func(t *testing.T) {`)

// toolResult is 0.5–8 KB of output in the shape of the tool's: source
// lines, grep hits, test output.
func toolResult(rng *rand.Rand, name string) string {
	size := 512 + rng.IntN(7680)
	var b strings.Builder
	file := demoFiles[rng.IntN(len(demoFiles))]
	for line := 1; b.Len() < size; line++ {
		switch name {
		case "grep":
			fmt.Fprintf(&b, "%s:%d: ", demoFiles[rng.IntN(len(demoFiles))], 10+rng.IntN(400))
		case "run_tests":
			if rng.IntN(6) == 0 {
				fmt.Fprintf(&b, "--- PASS: Test%s%d (%.2fs)\n", []string{"Relay", "Split", "Window", "Merge"}[rng.IntN(4)], line, rng.Float64())
				continue
			}
			b.WriteString("    ")
		case "list_dir":
			fmt.Fprintf(&b, "%-28s %6d\n", fmt.Sprintf("file_%03d.go", line), 500+rng.IntN(20000))
			continue
		default:
			fmt.Fprintf(&b, "%5d\t", line)
		}
		for w := 3 + rng.IntN(9); w > 0; w-- {
			b.WriteString(codeWords[rng.IntN(len(codeWords))])
			b.WriteByte(' ')
		}
		b.WriteByte('\n')
	}
	if name == "read_file" {
		return file + "\n" + b.String()
	}
	return b.String()
}
