package histo

import (
	"testing"
	"time"

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

// TestLearnFirstTurn: two first turns that share a system prompt tell the
// tokens per byte of what follows it; a different system prompt, or too
// small a difference, tells nothing.
func TestLearnFirstTurn(t *testing.T) {
	var m rateModel
	m.learnFirstTurn(turnTrace(1, 0, 722, 400, 300, 0.79))
	require.Zero(t, m.turnPerByteNow())
	m.learnFirstTurn(turnTrace(2, 0, 861, 540, 300, 0.58))
	require.InDelta(t, 139.0/140, m.turnPerByteNow(), 1e-9)
	m.learnFirstTurn(turnTrace(3, 0, 2000, 900, 700, 0.1)) // another system prompt
	m.learnFirstTurn(turnTrace(4, 0, 2010, 910, 700, 0.1)) // 10 bytes apart
	require.InDelta(t, 139.0/140, m.turnPerByteNow(), 1e-9)
}

// TestConversationTurnSince: a turn counts the tracked requests recorded
// since its conversation's previous turn, and the tokens per byte it
// added to it.
func TestConversationTurnSince(t *testing.T) {
	c := newConversations(16, time.Hour)
	at := time.Unix(1000, 0)
	add := func(conv uint64, turn int, tokens, bytes int64) convTurn {
		tr := turnTrace(conv, turn, tokens, bytes, 300, 0.5)
		at = at.Add(time.Second)
		tr.Recv, tr.End, tr.ClientDone = at, at.Add(time.Millisecond), at.Add(time.Millisecond)
		return c.add(tr, 0)
	}
	require.Equal(t, int64(-1), add(1, 0, 722, 400).since)
	require.Equal(t, int64(-1), add(2, 0, 861, 540).since)
	t1 := add(1, 1, 938, 600)
	require.Equal(t, int64(1), t1.since)
	require.InDelta(t, 216.0/200, t1.perByte, 1e-9)
	require.Equal(t, int64(0), add(1, 2, 1100, 750).since)
	require.Equal(t, int64(2), add(2, 1, 1000, 700).since)
}
