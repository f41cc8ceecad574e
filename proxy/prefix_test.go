package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// TestPrefixDriftThroughProxy: an agent loop whose history grows turn by
// turn reuses more and more of its prompt, and the engine's cache agrees;
// a clock in the system prompt at turn 4 is reported as one system/digits
// drift at the clock's offset, and the engine misses from there.
func TestPrefixDriftThroughProxy(t *testing.T) {
	_, up := startSim(t, fastSim)
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up}, log)
	system := "You are a coding agent. Current time: 2026-11-29T10:00:00Z. " + strings.Repeat("Follow the rules. ", 40)
	clock := strings.Index(system, "10:00:00")
	msgs := []map[string]string{{"role": "system", "content": system}}
	var last Trace
	for turn := 0; turn < 6; turn++ {
		if turn == 4 {
			msgs[0]["content"] = strings.Replace(system, "10:00:00", "10:04:00", 1)
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("turn %d: %s", turn, strings.Repeat("tool output ", 60))})
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": msgs})
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		require.NoError(t, err)
		resp.Body.Close()
		tr := log.next(t)
		res := tr.Prefix
		require.True(t, res.Tracked, "turn %d", turn)
		switch {
		case turn == 0:
			require.Zero(t, res.ReusableBytes)
		case turn == 4:
			require.True(t, res.Drift.Happened)
			require.Equal(t, prefix.SegmentSystem, res.Drift.Segment)
			require.Equal(t, prefix.ClassDigits, res.Drift.Class)
			require.Equal(t, int64(clock+4), res.Drift.Offset, "the first changed digit: 10:0[0] -> 10:0[4]")
			require.Less(t, tr.CachedTokens, last.CachedTokens, "the engine missed after the drift too")
			require.False(t, res.MissDespiteReuse)
		default:
			require.False(t, res.Drift.Happened, "turn %d", turn)
			require.Greater(t, res.Reuse, last.Prefix.Reuse-0.2, "turn %d", turn)
			require.Greater(t, tr.CachedTokens, int64(0), "turn %d: the engine's cache hit too", turn)
		}
		last = tr
		msgs = append(msgs, map[string]string{"role": "assistant", "content": "ok"})
	}
	require.Equal(t, uint64(1), p.prefix.Stats().Drifts[prefix.SegmentSystem][prefix.ClassDigits])
}
