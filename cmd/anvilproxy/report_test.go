package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// referenceFile is the benchmark client's file (docs/design.md "Snapshots").
const referenceFile = "../../histo/snapshot/testdata/reference.json"

// runCmd runs the command line and returns its exit code and output.
func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestReportGolden(t *testing.T) {
	code, out, errOut := runCmd("report", referenceFile)
	require.Equal(t, 0, code, errOut)
	golden := filepath.Join("testdata", "report-reference.golden")
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(out), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), out)
}

func TestReportJSON(t *testing.T) {
	// --json - writes the merged document, and only it, to stdout; flags
	// may follow the files.
	code, out, errOut := runCmd("report", referenceFile, referenceFile, "--json", "-")
	require.Equal(t, 0, code, errOut)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Equal(t, "anvil-serving.benchmark/v1", doc["schema"])
	require.Equal(t, 12.0, doc["requests"])
	require.Equal(t, 12.0, doc["metrics"].(map[string]any)["ttft_samples"])

	// To a file, with the table on stdout; the file reads back.
	path := filepath.Join(t.TempDir(), "merged.json")
	code, out, errOut = runCmd("report", "--json", path, referenceFile)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "time to first output")
	code, again, errOut := runCmd("report", path)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, out, again, "a merged file reports as its inputs")
}

func TestReportBadInput(t *testing.T) {
	dir := t.TempDir()
	ref, err := os.ReadFile(referenceFile)
	require.NoError(t, err)
	files := map[string]string{
		"text.json":      "not json at all",
		"schema.json":    `{"schema":"something-else/v1"}`,
		"truncated.json": string(ref[:len(ref)-100]),
	}
	for name, content := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	for _, name := range []string{"text.json", "schema.json", "truncated.json", "missing.json"} {
		path := filepath.Join(dir, name)
		code, out, errOut := runCmd("report", referenceFile, path)
		require.Equal(t, 1, code, name)
		require.Empty(t, out, name)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "%s: one line: %q", name, errOut)
		require.True(t, strings.HasPrefix(errOut, "anvilproxy report: "), errOut)
		require.Contains(t, errOut, path, "names the file")
	}
	code, _, errOut := runCmd("report")
	require.Equal(t, 2, code, "no files is a usage error")
	require.Contains(t, errOut, "no snapshot files")
}

// TestReportProxyWindows: the proxy's own files carry the sections beyond
// the phases, and the report prints them after the phase table, merged
// over the files: the agent/engine split, the prompt ledger, the knee and
// the measurement quality.
func TestReportProxyWindows(t *testing.T) {
	start := time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)
	now := start
	rec, err := histo.New(histo.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	dir := t.TempDir()
	var files []string
	for w := range 2 {
		for i := range 6 {
			recv := start.Add(time.Duration(w*6+i) * 2 * time.Second)
			at := func(ms int) time.Time { return recv.Add(time.Duration(ms) * time.Millisecond) }
			tr := proxy.Trace{
				ID: uint64(w*6 + i + 1), Route: proxy.RouteChat, Method: "POST", Model: "m", Stream: true, Status: 200,
				Recv: recv, Admit: recv, Sent: at(1), Headers: at(2), FirstEvent: at(300), FirstOutput: at(300),
				FirstContent: at(400), LastToken: at(999), End: at(1000), ClientDone: at(1001),
				PromptTokens: 1000, CompletionTokens: 100, CachedTokens: 0, UsageSeen: true,
				ServerQueue: 100 * time.Millisecond, ServerPrefill: 200 * time.Millisecond, InflightAtAdmit: i % 3,
				Prefix: prefix.Result{Tracked: true, ConversationID: 7, Turn: w*6 + i, PromptBytes: 4000,
					SystemBytes: 1000, ToolsBytes: 1000, HistoryBytes: 1500, LastTurnBytes: 500},
			}
			rec.Record(&tr)
		}
		now = start.Add(time.Duration(w+1) * 12 * time.Second)
		doc, err := snapshot.Build(rec.Rotate(), snapshot.PrefillModel{})
		require.NoError(t, err)
		data, err := json.Marshal(doc)
		require.NoError(t, err)
		files = append(files, filepath.Join(dir, fmt.Sprintf("w%d.json", w)))
		require.NoError(t, os.WriteFile(files[w], data, 0o644))
	}
	code, out, errOut := runCmd(append([]string{"report"}, files...)...)
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"agent/engine  47.8% in the agent, 52.2% in the engine (12 turns; agent gap p50 999ms",
		"history    17.6 KiB        4500  37.5%",
		"concurrency  ",
		"measurement  unknown: the self-check probe did not run in this window",
	} {
		require.Contains(t, out, want)
	}
	require.Less(t, strings.Index(out, "goodput"), strings.Index(out, "agent/engine"), "after the phase table")
}
