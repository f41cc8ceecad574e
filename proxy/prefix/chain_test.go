package prefix

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/sse"
)

// TestChainCommon: the chains of two prompts tell the segments and bytes
// they share at the start: the system prompt of two conversations, the
// whole previous turn of a conversation's next one (also past the first
// ChainEnds segments), and, when a long conversation forks in its middle,
// a lower bound (the deepest boundary both chains keep).
func TestChainCommon(t *testing.T) {
	tr := newTracker(t, Config{})
	sys := strings.Repeat("s", 300)
	turn := func(task string, turns int) Result {
		c := conv{system: sys, msgs: []chatMsg{{Role: "user", Content: task}}}
		for k := range turns {
			c.msgs = append(c.msgs, chatMsg{Role: "assistant", Content: fmt.Sprintf("answer %d", k)},
				chatMsg{Role: "user", Content: fmt.Sprintf("tool result %d %s", k, strings.Repeat("r", 40))})
		}
		return tr.Observe(sse.ProtocolChat, c.body(t), t0)
	}
	a0, b0 := turn("task a "+strings.Repeat("a", 40), 0), turn("task b "+strings.Repeat("b", 40), 0)
	d, bytes := Common(&a0.Chain, &b0.Chain)
	require.Equal(t, 1, d, "the system prompt")
	require.Equal(t, a0.SystemBytes, bytes)

	a1 := turn("task a "+strings.Repeat("a", 40), 1)
	d, bytes = Common(&a0.Chain, &a1.Chain)
	require.Equal(t, [2]int64{int64(a0.Chain.Depth), a0.PromptBytes}, [2]int64{int64(d), bytes}, "the previous turn")
	d, _ = Common(&a1.Chain, &a1.Chain)
	require.Equal(t, a1.Chain.Depth, d)

	a20, a21 := turn("task a "+strings.Repeat("a", 40), 20), turn("task a "+strings.Repeat("a", 40), 21)
	require.Greater(t, a20.Chain.Depth, 2*ChainEnds)
	d, bytes = Common(&a20.Chain, &a21.Chain)
	require.Equal(t, [2]int64{int64(a20.Chain.Depth), a20.PromptBytes}, [2]int64{int64(d), bytes}, "a long conversation's previous turn")
	d, _ = Common(&a21.Chain, &b0.Chain)
	require.Equal(t, 1, d)

	// a1 … a20 share 4 segments (system, task, answer 0, tool result 0);
	// a fork after 12 segments of a21 is kept by neither head nor tail.
	d, _ = Common(&a1.Chain, &a20.Chain)
	require.Equal(t, a1.Chain.Depth, d)
	fork := conv{system: sys, msgs: []chatMsg{{Role: "user", Content: "task a " + strings.Repeat("a", 40)}}}
	for k := range 20 {
		content := fmt.Sprintf("answer %d", k)
		if k >= 6 {
			content = fmt.Sprintf("another answer %d", k)
		}
		fork.msgs = append(fork.msgs, chatMsg{Role: "assistant", Content: content},
			chatMsg{Role: "user", Content: fmt.Sprintf("tool result %d %s", k, strings.Repeat("r", 40))})
	}
	f := tr.Observe(sse.ProtocolChat, fork.body(t), t0)
	d, bytes = Common(&f.Chain, &a21.Chain)
	require.Equal(t, ChainEnds, d, "a lower bound: the head")
	m, ok := a21.Chain.At(ChainEnds)
	require.True(t, ok)
	require.Equal(t, m.Bytes, bytes)
	require.Zero(t, func() int { d, _ := Common(&Chain{}, &a21.Chain); return d }())
}
