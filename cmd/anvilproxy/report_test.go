package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// referenceFile is the benchmark client's file (DESIGN.md §8).
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
