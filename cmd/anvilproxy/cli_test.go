package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHelpListsEveryCommand: "anvilproxy --help" (and "help", "-h") name
// every command, then serve's flags.
func TestHelpListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, errOut := runCmd(args...)
		require.Equal(t, 0, code, errOut)
		for _, want := range []string{"anvilproxy [serve]", "anvilproxy top", "anvilproxy demo", "anvilproxy report", "anvilproxy sim", "anvilproxy bench",
			"Flags of serve (the default command):", "-upstream string", "-admin-listen string"} {
			require.Contains(t, out, want, args)
		}
	}
	code, out, errOut := runCmd("serve", "--help")
	require.Equal(t, 0, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "-upstream-probe-interval duration")
}

// TestFlagMistakeIsOneLine: a typo prints the reason and one line pointing
// at --help, not every flag.
func TestFlagMistakeIsOneLine(t *testing.T) {
	for _, tc := range []struct{ args []string }{
		{[]string{"--lissten", ":1"}},
		{[]string{"serve", "--lissten", ":1"}},
		{[]string{"demo", "--agent", "3"}},
		{[]string{"report", "--jsn", "x"}},
		{[]string{"top", "--onse"}},
		{[]string{"serve", "stray"}},
	} {
		code, out, errOut := runCmd(tc.args...)
		require.Equal(t, 2, code, tc.args)
		require.Empty(t, out)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		require.Len(t, lines, 2, "%v:\n%s", tc.args, errOut)
		require.Regexp(t, `^(flag provided but not defined: -\w+|unexpected arguments: .*)$`, lines[0])
		require.Regexp(t, `^Run "anvilproxy \w+ --help" for its flags\.$`, lines[1])
	}
	code, _, errOut := runCmd("srve")
	require.Equal(t, 2, code)
	require.Equal(t, "anvilproxy: unknown command \"srve\"\nRun \"anvilproxy help\" for the commands.\n", errOut)
}

// TestUpstreamMistakesSuggestHTTP: a bare host:port, a bare IP:port and a
// wrong scheme all say what to type.
func TestUpstreamMistakesSuggestHTTP(t *testing.T) {
	for raw, want := range map[string]string{
		"127.0.0.1:8000":               "did you mean --upstream http://127.0.0.1:8000 ?",
		"localhost:8000":               "did you mean --upstream http://localhost:8000 ?",
		"ftp://gpu-box:8000":           "the scheme must be http or https; did you mean --upstream http://gpu-box:8000 ?",
		"http://":                      "no host",
		"gpu-box:8000/v1":              "did you mean --upstream http://gpu-box:8000/v1 ?",
		"http://u:s3cret@gpu-box:8000": `--upstream "http://u:xxxxx@gpu-box:8000": credentials in the upstream URL are not supported`,
	} {
		code, _, errOut := runCmd("serve", "--upstream", raw, "--listen", "127.0.0.1:0", "--admin-listen", "")
		require.Equal(t, 1, code, raw)
		require.Contains(t, errOut, want, raw)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %s", errOut)
	}
	up, err := checkUpstream("https://gpu-box/engine/v1/")
	require.NoError(t, err)
	require.Equal(t, "gpu-box:443", up.Addr)
	require.Equal(t, "/engine/v1", up.Prefix)
	require.True(t, endsInV1(up.Prefix))
	require.Contains(t, v1Hint("https://gpu-box/engine/v1/"), "--upstream https://gpu-box/engine ")
}

// TestReportDirectory: "report DIR" reads the snapshot files in it; a
// directory without any says so.
func TestReportDirectory(t *testing.T) {
	dir := t.TempDir()
	ref, err := os.ReadFile(referenceFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "anvilproxy-20260101T000000.000Z.json"), ref, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a snapshot"), 0o644))
	code, fromDir, errOut := runCmd("report", dir)
	require.Equal(t, 0, code, errOut)
	_, fromFile, _ := runCmd("report", referenceFile)
	require.Equal(t, fromFile, fromDir)

	empty := t.TempDir()
	code, _, errOut = runCmd("report", empty)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, empty+": a directory with no snapshot files (anvilproxy-*.json)")
}

func TestUpstreamPasswordRedacted(t *testing.T) {
	require.Equal(t, "http://user:xxxxx@gpu-box:8000", redacted("http://user:s3cret@gpu-box:8000"))
	require.Equal(t, "http://gpu-box:8000/v1", redacted("http://gpu-box:8000/v1"))
}
