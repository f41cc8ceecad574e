package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy/bench"
	"github.com/stretchr/testify/require"
)

// TestBenchTargetsArgv: the bench's anvilproxy target runs serve as it
// runs by default (no --event-loop of its own), and anvilproxy-goroutine
// ends with --event-loop=false, so a --proxy-flag cannot turn it into the
// loop; a profile goes to the anvilproxy target.
func TestBenchTargetsArgv(t *testing.T) {
	f := benchFlags{proxyFlags: listFlag{"--event-loop", "--max-header-bytes=16384"}}
	var cfg bench.Config
	require.NoError(t, f.setArgv(&cfg, "/bin/ap"))
	require.Equal(t, []string{"/bin/ap", "serve", "--event-loop", "--max-header-bytes=16384"}, cfg.ProxyArgv)
	require.Equal(t, []string{"/bin/ap", "serve", "--event-loop", "--max-header-bytes=16384", "--event-loop=false"}, cfg.GoroutineArgv)
	require.False(t, cfg.HeapProfile)

	f = benchFlags{cpuProfile: "/tmp/cpu.pprof"}
	require.NoError(t, f.setArgv(&cfg, "/bin/ap"))
	require.Equal(t, []string{"/bin/ap", "bench", childProfileFlag, "/tmp/cpu.pprof", ""}, cfg.ProxyArgv)
	require.Equal(t, []string{"/bin/ap", "serve", "--event-loop=false"}, cfg.GoroutineArgv)
}

// TestBaseTargetWanted: --base-binary runs that binary's serve with the
// same flags as the anvilproxy target (anvilproxy-base); without the flag
// there is no such target; a missing or non-executable file is a usage
// error before any round runs, and so is the target asked for without a
// binary.
func TestBaseTargetWanted(t *testing.T) {
	parse := func(args ...string) (benchFlags, bench.Config, error) {
		var f benchFlags
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		f.register(fs)
		require.NoError(t, fs.Parse(args))
		cfg, err := f.config(fs)
		if err == nil {
			err = f.setArgv(&cfg, "/bin/ap")
		}
		return f, cfg, err
	}
	_, cfg, err := parse("--proxy-flag=--event-loop=false")
	require.NoError(t, err)
	require.Empty(t, cfg.BaseArgv, "no base target without --base-binary")

	dir := t.TempDir()
	base := filepath.Join(dir, "anvilproxy-old")
	require.NoError(t, os.WriteFile(base, []byte("#!/bin/sh\n"), 0o755))
	_, cfg, err = parse("--base-binary", base, "--proxy-flag=--event-loop=false")
	require.NoError(t, err)
	require.Equal(t, []string{base, "serve", "--event-loop=false"}, cfg.BaseArgv)
	require.Equal(t, []string{"/bin/ap", "serve", "--event-loop=false"}, cfg.ProxyArgv, "both builds run alike")

	notExec := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(notExec, []byte("x"), 0o644))
	for _, file := range []string{filepath.Join(dir, "missing"), notExec, dir} {
		_, _, err = parse("--base-binary", file)
		require.ErrorContains(t, err, "--base-binary")
		require.ErrorContains(t, err, file)
	}

	// Through the command: a usage error at once, before the emitter or
	// any target starts.
	var stdout, stderr bytes.Buffer
	start := time.Now()
	err = runBench([]string{"--quick", "--base-binary", filepath.Join(dir, "missing")}, &stdout, &stderr)
	require.ErrorIs(t, err, errUsage)
	require.Contains(t, stderr.String(), "--base-binary")
	require.Contains(t, stderr.String(), "no such file")
	require.Empty(t, stdout.String())
	require.Less(t, time.Since(start), 5*time.Second)

	err = runBench([]string{"--quick", "--targets", bench.AnvilBase}, &stdout, &stderr)
	require.ErrorContains(t, err, "--base-binary")
	require.Empty(t, stdout.String())
}
