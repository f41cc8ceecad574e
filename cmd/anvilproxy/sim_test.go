package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// TestSimFlagsOneSlotUnreported serves the engine `anvilproxy sim --slots 1
// --report-cached=false` configures: a one-slot FIFO engine whose usage
// carries no cached count.
func TestSimFlagsOneSlotUnreported(t *testing.T) {
	c, listen, err := parseSimFlags([]string{"--slots", "1", "--report-cached=false", "--listen", "127.0.0.1:0",
		"--prefill-tps", "1000000", "--decode-tps", "5000"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:0", listen)
	require.Equal(t, 1, c.Slots)
	require.True(t, c.UnreportedCache)
	s, err := sim.New(c)
	require.NoError(t, err)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)

	const prefill = 300 * time.Millisecond
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", ts.URL+"/v1/chat/completions",
				strings.NewReader(`{"stream":true,"stream_options":{"include_usage":true},"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("X-Request-Id", id)
			req.Header.Set("X-Sim-Prefill", prefill.String())
			resp, err := http.DefaultClient.Do(req)
			if !assertNoErr(t, err) {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if strings.Contains(string(b), "cached_tokens") {
				t.Errorf("usage reports cached tokens: %s", b)
			}
		}()
		// b is sent once a holds the slot, so the queue order is known.
		require.Eventually(t, func() bool { st := s.Stats(); return st.Active == 1 && (id == "a" || st.Queued == 1) },
			5*time.Second, time.Millisecond)
	}
	wg.Wait()
	a, ok := s.Truth("a")
	require.True(t, ok)
	b, ok := s.Truth("b")
	require.True(t, ok)
	require.False(t, b.Admitted.Before(a.Finished), "one slot: b waits for a")
	require.Greater(t, b.Queue, prefill/2)
}

func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func TestSimFlagsDefaultsAndLengths(t *testing.T) {
	c, _, err := parseSimFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, sim.DefaultKeepAliveTimeout, c.KeepAliveTimeout)
	require.False(t, c.UnreportedCache)
	require.Nil(t, c.NaturalLengths, "the sim's reference lengths")
	require.False(t, c.ExactLength)

	c, _, err = parseSimFlags([]string{"--keepalive-timeout", "0", "--lengths", "20, 40,60", "--exact-length", "--truncate-rate", "0.25"}, io.Discard)
	require.NoError(t, err)
	require.Negative(t, c.KeepAliveTimeout, "0 on the command line: never close")
	require.Equal(t, []int{20, 40, 60}, c.NaturalLengths)
	require.True(t, c.ExactLength)
	require.Equal(t, 0.25, c.TruncateRate)

	_, _, err = parseSimFlags([]string{"--lengths", "20,x"}, io.Discard)
	require.Error(t, err)
}

// TestSimFlagsEngine: --engine sets the engine-specific defaults, which a
// flag of their own still overrides; a bad name is a flag error.
func TestSimFlagsEngine(t *testing.T) {
	c, _, err := parseSimFlags([]string{"--engine", "llamacpp", "--slots", "2", "--head", "admission",
		"--kv-cache-tokens", "5000", "--switch-cost", "20ms"}, io.Discard)
	require.NoError(t, err)
	s, err := sim.New(c)
	require.NoError(t, err)
	got := s.Config()
	require.Equal(t, sim.EngineLlamaCpp, got.Engine)
	require.Equal(t, sim.CacheSlot, got.Cache)
	require.Equal(t, sim.ReleaseStreamEnd, got.Release)
	require.Equal(t, sim.HeadAdmission, got.Head, "the flag overrides the engine's slot-start")
	require.Equal(t, sim.TimingLlamaCpp, got.Timings)
	require.Equal(t, sim.AbandonBatch, got.Abandon)
	require.Equal(t, sim.LockNone, got.BatchLock)
	require.Equal(t, sim.MetricsLlamaCpp, got.Metrics)
	require.Equal(t, 20*time.Millisecond, got.SwitchCost)
	require.Equal(t, 5000, got.KVCacheTokens)
	require.Equal(t, 2, got.Slots)

	c, _, err = parseSimFlags([]string{"--engine", "ollama"}, io.Discard)
	require.NoError(t, err)
	s, err = sim.New(c)
	require.NoError(t, err)
	require.Equal(t, sim.HeadFirstOutput, s.Config().Head)
	require.True(t, s.Config().UnreportedCache, "ollama reports no cached tokens")
	require.Equal(t, sim.LockPrefill, s.Config().BatchLock, "ollama's runner holds its lock for a prefill batch")

	c, _, err = parseSimFlags([]string{"--engine", "ollama", "--batch-lock", "none", "--arrival-jitter", "2ms"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, sim.LockNone, c.BatchLock)
	require.Equal(t, 2*time.Millisecond, c.ArrivalJitter)
	require.False(t, c.SharedPrefill)

	c, _, err = parseSimFlags([]string{"--engine", "ollama", "--shared-prefill"}, io.Discard)
	require.NoError(t, err)
	require.True(t, c.SharedPrefill, "the prefills granted together share the engine")

	for _, bad := range [][]string{{"--engine", "tgi"}, {"--head", "late"}, {"--abandon", "never"}, {"--metrics", "json"}, {"--batch-lock", "mutex"}} {
		_, _, err := parseSimFlags(bad, io.Discard)
		require.Error(t, err, "%v", bad)
	}
}
