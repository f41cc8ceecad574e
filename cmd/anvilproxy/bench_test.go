package main

import (
	"testing"

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
