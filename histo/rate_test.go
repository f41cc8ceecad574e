package histo

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// turnTrace is turn of conversation conv: prompt tokens, canonical prompt
// bytes of which sys are the system prompt's, and the proxy's reuse.
func turnTrace(conv uint64, turn int, tokens, bytes, sys int64, reuse float64) *proxy.Trace {
	return &proxy.Trace{PromptTokens: tokens, CachedTokens: -1, Prefix: prefix.Result{Tracked: true,
		ConversationID: conv, Turn: turn, PromptBytes: bytes, SystemBytes: sys, Reuse: reuse}}
}

// TestSharedOnly: on a one-slot engine whose slot held another
// conversation, the learned sample's cached tokens are the shared system
// prompt's, not the proxy's reuse of the whole history: the prompt less
// the other segments at the tokens per byte turns add (the template's
// fixed tokens stay with the shared part), else the byte share, never
// more than the reuse. The figures are a turn of the ollama run: 1,456
// tokens, 1,080 bytes of which 300 system, reuse 0.82, 1.08 tokens per
// byte added; ollama reused 632.
func TestSharedOnly(t *testing.T) {
	tr := turnTrace(1, 3, 1456, 1080, 300, 0.82)
	n, cached := sharedOnly(tr, 1.08)
	require.Equal(t, float64(1456-842), cached) // 1456 − 780·1.08 = 613.6
	require.Equal(t, 1456-cached, n)
	_, cached = sharedOnly(tr, 0)
	require.Equal(t, float64(404), cached) // 1456 · 300/1080
	tr.Prefix.Reuse = 0.2
	_, cached = sharedOnly(tr, 1.08)
	require.Equal(t, float64(291), cached) // the reuse bounds it
	tr.Prefix.PromptBytes = 0
	n, cached = sharedOnly(tr, 1.08)
	require.Equal(t, [2]float64{1456, 0}, [2]float64{n, cached})
}

// TestServedContinues: a turn continues the slot only when the request
// recorded just before it was its own conversation's previous turn.
func TestServedContinues(t *testing.T) {
	var m rateModel
	steps := []struct {
		conv uint64
		turn int
		want bool
	}{{1, 0, false}, {2, 0, false}, {1, 1, false}, {1, 2, true}, {2, 1, false}, {2, 2, true}, {2, 4, false}}
	for i, s := range steps {
		require.Equal(t, s.want, m.served(turnTrace(s.conv, s.turn, 1000, 800, 300, 0.5)), "step %d", i)
	}
}

// TestLearnTurnBytes: the tokens per byte that turns add are followed,
// smoothed, from the first one on.
func TestLearnTurnBytes(t *testing.T) {
	var m rateModel
	m.learnTurnBytes(0)
	require.Zero(t, m.turnPerByteNow())
	m.learnTurnBytes(1.2)
	require.Equal(t, 1.2, m.turnPerByteNow())
	m.learnTurnBytes(2.8)
	require.InDelta(t, 1.3, m.turnPerByteNow(), 1e-9)
}
