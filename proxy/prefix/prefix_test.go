package prefix

import (
	"fmt"
	"strings"
	"testing"

	"github.com/anvilproxy/anvilproxy/sse"
	"github.com/stretchr/testify/require"
)

const task = "The test TestParse in pkg/parse fails since yesterday. Find out why and fix it."

func TestAppendOnlyConversation(t *testing.T) {
	tr := newTracker(t, Config{})
	rs := run(t, tr, newConv(task), 10, nil)
	require.Empty(t, drifts(rs))
	for i, r := range rs {
		require.True(t, r.Tracked)
		require.Equal(t, i, r.Turn)
		require.Equal(t, rs[0].ConversationID, r.ConversationID)
		require.NotZero(t, r.ConversationID)
		if i == 0 {
			require.Zero(t, r.ReusableBytes)
			continue
		}
		prev := rs[i-1].PromptBytes
		require.Greater(t, r.PromptBytes, prev)
		require.Equal(t, prev, r.ReusableBytes, "turn %d reuses exactly the previous prompt", i)
		require.Equal(t, float64(prev)/float64(r.PromptBytes), r.Reuse)
		require.Equal(t, r.ReusableBytes/4, r.ReusableTokensEst)
		require.Greater(t, r.Reuse, rs[i-1].Reuse)
	}
	s := tr.Stats()
	require.Equal(t, uint64(10), s.Tracked)
	require.Equal(t, [NumSegmentKinds][NumClasses]uint64{}, s.Drifts)
	require.Empty(t, tr.RecentDrifts(0))
}

func TestTimestampInSystemPrompt(t *testing.T) {
	tr := newTracker(t, Config{})
	c := newConv(task)
	old, updated := c.system, systemPrompt("2025-06-01T10:04:00Z")
	rs := run(t, tr, c, 10, func(turn int, c *conv) {
		if turn == 4 {
			c.system = updated
		}
	})
	require.Equal(t, []int{4}, drifts(rs))
	off := firstDiffString(old, updated)
	require.Equal(t, byte('4'), updated[off])
	want := Drift{
		Happened:     true,
		Segment:      SegmentSystem,
		MessageIndex: 0,
		Role:         RoleSystem,
		Offset:       int64(off),
		Exact:        true,
		Class:        ClassDigits,
		LostBytes:    rs[3].PromptBytes - int64(off),
	}
	require.Equal(t, want, rs[4].Drift)
	require.Equal(t, rs[0].ConversationID, rs[4].ConversationID)
	require.Equal(t, 4, rs[4].Turn)
	require.Equal(t, int64(off), rs[4].ReusableBytes, "the engine can reuse the system prompt up to the change")
	require.Equal(t, rs[4].PromptBytes, rs[5].ReusableBytes)

	ev := tr.RecentDrifts(0)
	require.Len(t, ev, 1)
	require.Equal(t, want, ev[0].Drift)
	require.Equal(t, t0.Add(4*60e9), ev[0].At)
	require.Equal(t, uint64(1), tr.Stats().Drifts[SegmentSystem][ClassDigits])
}

func TestVolatilePatternHidesTimestamp(t *testing.T) {
	tr := newTracker(t, Config{VolatilePatterns: []string{`\d{4}-\d\d-\d\dT[\d:.]+Z?`}})
	c := newConv(task)
	rs := run(t, tr, c, 8, func(turn int, c *conv) {
		if turn == 4 {
			c.system = systemPrompt("2025-06-01T10:04:00Z")
		}
	})
	require.Empty(t, drifts(rs))
	for i, r := range rs {
		require.Equal(t, i == 4, r.Masked, "turn %d", i)
		if i > 0 {
			require.Equal(t, rs[i-1].PromptBytes, r.ReusableBytes)
		}
	}
	require.Equal(t, uint64(1), tr.Stats().MaskedDrifts)
}

func TestVolatileFieldHidesToolCallIDs(t *testing.T) {
	// Some agents renumber tool call ids when they replay history.
	for _, fields := range [][]string{nil, {"tool_calls.id", "tool_call_id"}} {
		tr := newTracker(t, Config{VolatileFields: fields})
		rs := run(t, tr, newConv(task), 6, func(turn int, c *conv) {
			if turn == 4 {
				c.msgs[1].ToolCalls[0].ID = "call_renumbered"
				c.msgs[2].ToolCallID = "call_renumbered"
			}
		})
		if fields == nil {
			require.Equal(t, []int{4}, drifts(rs))
			require.Equal(t, SegmentMessage, rs[4].Drift.Segment)
			require.Equal(t, 2, rs[4].Drift.MessageIndex)
			require.Equal(t, RoleAssistant, rs[4].Drift.Role)
			continue
		}
		require.Empty(t, drifts(rs))
		require.True(t, rs[4].Masked)
	}
}

func TestToolReorder(t *testing.T) {
	tr := newTracker(t, Config{})
	c := newConv(task)
	old := toolsText(c.tools)
	rs := run(t, tr, c, 6, func(turn int, c *conv) {
		if turn == 3 {
			c.tools[1], c.tools[2] = c.tools[2], c.tools[1]
		}
	})
	require.Equal(t, []int{3}, drifts(rs))
	d := rs[3].Drift
	require.Equal(t, SegmentTools, d.Segment)
	require.Equal(t, ClassToolOrder, d.Class)
	require.Equal(t, 1, d.MessageIndex, "the second tool is the first to differ")
	require.Equal(t, RoleNone, d.Role)
	require.Equal(t, int64(firstDiffString(old, toolsText(c.tools))), d.Offset)
	require.True(t, d.Exact)
}

func TestEditedEarlyMessage(t *testing.T) {
	tr := newTracker(t, Config{})
	c := newConv(task)
	rs := run(t, tr, c, 8, func(turn int, c *conv) {
		if turn == 5 {
			c.msgs[2].Content = "package pkg\n\n// File 1, edited by the agent's history compressor.\n"
		}
	})
	require.Equal(t, []int{5}, drifts(rs))
	d := rs[5].Drift
	require.Equal(t, SegmentMessage, d.Segment)
	require.Equal(t, 3, d.MessageIndex, "messages[0] is the system prompt")
	require.Equal(t, RoleTool, d.Role)
	require.Equal(t, ClassOther, d.Class)
	require.Equal(t, int64(len("package pkg\n\n// File 1")), d.Offset)
	require.Equal(t, rs[0].ConversationID, rs[5].ConversationID)
}

func TestEditedFirstUserMessage(t *testing.T) {
	// Nothing after the tools matches; the conversation is found through a
	// later message.
	tr := newTracker(t, Config{})
	rs := run(t, tr, newConv(task), 5, func(turn int, c *conv) {
		if turn == 3 {
			c.msgs[0].Content = strings.Replace(task, "yesterday", "Monday", 1)
		}
	})
	require.Equal(t, []int{3}, drifts(rs))
	d := rs[3].Drift
	require.Equal(t, SegmentMessage, d.Segment)
	require.Equal(t, 1, d.MessageIndex)
	require.Equal(t, RoleUser, d.Role)
	require.Equal(t, int64(strings.Index(task, "yesterday")), d.Offset)
	require.Equal(t, ClassOther, d.Class)
	require.Equal(t, rs[0].ConversationID, rs[3].ConversationID)
}

func TestWhitespaceChange(t *testing.T) {
	tr := newTracker(t, Config{})
	c := newConv(task)
	old := c.system
	rs := run(t, tr, c, 5, func(turn int, c *conv) {
		if turn == 2 {
			c.system = strings.Replace(c.system, "\n\n", "\n \n", 1)
		}
	})
	require.Equal(t, []int{2}, drifts(rs))
	d := rs[2].Drift
	require.Equal(t, SegmentSystem, d.Segment)
	require.Equal(t, ClassWhitespace, d.Class)
	require.Equal(t, int64(firstDiffString(old, c.system)), d.Offset)
}

func TestTruncation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(c *conv)
	}{
		{"drop oldest turns", func(c *conv) { c.msgs = c.msgs[5:] }},
		{"summarize", func(c *conv) {
			c.msgs = append([]chatMsg{{Role: "user", Content: "Summary of the work so far: read files 1 to 3, no bug found yet."}}, c.msgs[7:]...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(t, Config{})
			rs := run(t, tr, newConv(task), 9, func(turn int, c *conv) {
				if turn == 6 {
					tc.cut(c)
				}
			})
			require.Equal(t, []int{6}, drifts(rs))
			d := rs[6].Drift
			require.Equal(t, SegmentMessage, d.Segment)
			require.Equal(t, ClassTruncation, d.Class)
			require.Equal(t, 1, d.MessageIndex)
			require.Equal(t, rs[0].ConversationID, rs[6].ConversationID)
			require.Equal(t, rs[5].PromptBytes-d.Offset-int64(len(systemPrompt(""))+len("2025-06-01T10:00:00Z")+len(toolsText(defaultTools))), d.LostBytes)
		})
	}
}

func TestShortenedToolOutput(t *testing.T) {
	tr := newTracker(t, Config{})
	rs := run(t, tr, newConv(task), 5, func(turn int, c *conv) {
		if turn == 3 {
			c.msgs[2].Content = "package pkg\n[output truncated]"
		}
	})
	require.Equal(t, []int{3}, drifts(rs))
	require.Equal(t, ClassOther, rs[3].Drift.Class, "replaced text is not a cut")

	tr = newTracker(t, Config{})
	rs = run(t, tr, newConv(task), 5, func(turn int, c *conv) {
		if turn == 3 {
			c.msgs[2].Content = "package pkg\n"
		}
	})
	require.Equal(t, []int{3}, drifts(rs))
	require.Equal(t, ClassTruncation, rs[3].Drift.Class)
	require.Equal(t, int64(len("package pkg\n")), rs[3].Drift.Offset)
}

func TestInterleavedConversations(t *testing.T) {
	tr := newTracker(t, Config{})
	a := newConv(task)
	b := newConv("Add a --verbose flag to the CLI and document it in the README.")
	var ra, rb []Result
	for i := range 6 {
		if i > 0 {
			a.turn(i)
			b.turn(i + 100)
		}
		ra = append(ra, tr.Observe(sse.ProtocolChat, a.body(t), t0))
		rb = append(rb, tr.Observe(sse.ProtocolChat, b.body(t), t0))
	}
	require.Empty(t, drifts(ra))
	require.Empty(t, drifts(rb))
	require.NotEqual(t, ra[0].ConversationID, rb[0].ConversationID)
	for i := range 6 {
		require.Equal(t, ra[0].ConversationID, ra[i].ConversationID)
		require.Equal(t, rb[0].ConversationID, rb[i].ConversationID)
		require.Equal(t, i, ra[i].Turn)
		require.Equal(t, i, rb[i].Turn)
	}
	// b's first request shares a's system prompt and tools with the cache.
	sys := int64(len(a.system) + len(toolsText(a.tools)))
	require.Equal(t, sys, rb[0].ReusableBytes)
}

func TestRewindIsNotDrift(t *testing.T) {
	// A client retrying an earlier, shorter state and then going on from
	// there continues its own last prompt.
	tr := newTracker(t, Config{})
	c := newConv(task)
	rs := run(t, tr, c, 5, nil)
	short := &conv{system: c.system, tools: c.tools, msgs: append([]chatMsg(nil), c.msgs[:3]...)}
	r := tr.Observe(sse.ProtocolChat, short.body(t), t0)
	require.False(t, r.Drift.Happened)
	require.Equal(t, r.PromptBytes, r.ReusableBytes)
	short.turn(77)
	r = tr.Observe(sse.ProtocolChat, short.body(t), t0)
	require.False(t, r.Drift.Happened)
	require.Equal(t, rs[0].ConversationID, r.ConversationID)
}

func TestUntracked(t *testing.T) {
	tr := newTracker(t, Config{MaxBodyBytes: 1 << 10})
	for _, tc := range []struct {
		proto sse.Protocol
		body  string
		want  UntrackedReason
	}{
		{sse.ProtocolChat, "", UntrackedNotJSON},
		{sse.ProtocolChat, "hello", UntrackedNotJSON},
		{sse.ProtocolChat, `{"messages":[{"role":"user","content":"hi"}]`, UntrackedNotJSON},
		{sse.ProtocolChat, `{"messages":[{"role":"user","content":"hi"}]} x`, UntrackedNotJSON},
		{sse.ProtocolChat, `{"messages":[{"role":"user","content":"bad \q escape"}]}`, UntrackedNotJSON},
		{sse.ProtocolChat, `[1,2]`, UntrackedNotJSON},
		{sse.ProtocolChat, `{"model":"m"}`, UntrackedUnknownShape},
		{sse.ProtocolChat, `{"messages":[]}`, UntrackedUnknownShape},
		{sse.ProtocolChat, `{"messages":[],"tools":[{"type":"function"}]}`, UntrackedUnknownShape},
		{sse.ProtocolChat, `{"tools":[{"type":"function"}]}`, UntrackedUnknownShape},
		{sse.ProtocolChat, `{"messages":"hi"}`, UntrackedUnknownShape},
		{sse.ProtocolChat, `{"messages":[1]}`, UntrackedUnknownShape},
		{sse.ProtocolCompletions, `{"prompt":["a","b"]}`, UntrackedUnknownShape},
		{sse.ProtocolCompletions, `{"prompt":[[1,2],[3]]}`, UntrackedUnknownShape},
		{sse.ProtocolResponses, `{"input":"hi","previous_response_id":"resp_1"}`, UntrackedStateful},
		{sse.ProtocolOllama, `{"prompt":"and then?","context":[1,2,3]}`, UntrackedStateful},
		{sse.ProtocolUnknown, `{"messages":[{"role":"user","content":"hi"}]}`, UntrackedUnknownShape},
		{sse.ProtocolChat, `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, UntrackedTooLarge},
	} {
		r := tr.Observe(tc.proto, []byte(tc.body), t0)
		require.Equal(t, Result{Untracked: tc.want, Reuse: -1}, r, "%s %q", tc.proto, tc.body)
	}
	s := tr.Stats()
	require.Equal(t, uint64(0), s.Tracked)
	require.Equal(t, [NumUntrackedReasons]uint64{0, 6, 9, 1, 2}, s.Untracked)
}

func TestCache(t *testing.T) {
	tr := newTracker(t, Config{})
	for _, tc := range []struct {
		name           string
		r              Result
		prompt, cached int64
		expected       int64
		miss           bool
	}{
		{"hit", Result{Tracked: true, Reuse: 0.9}, 10000, 8992, 9000, false},
		{"evicted", Result{Tracked: true, Reuse: 0.9}, 10000, 0, 9000, true},
		{"partly evicted", Result{Tracked: true, Reuse: 0.9}, 10000, 4000, 9000, true},
		{"small gap is granularity", Result{Tracked: true, Reuse: 0.9}, 250, 0, 225, false},
		{"volatile field changed", Result{Tracked: true, Reuse: 0.9, Masked: true}, 10000, 0, 9000, false},
		{"nothing expected", Result{Tracked: true, Reuse: 0}, 10000, 0, 0, false},
	} {
		r := tc.r
		tr.Cache(&r, tc.prompt, tc.cached)
		require.True(t, r.CacheChecked, tc.name)
		require.Equal(t, tc.expected, r.ExpectedCachedTokens, tc.name)
		require.Equal(t, tc.miss, r.MissDespiteReuse, tc.name)
	}
	untracked := Result{Reuse: -1}
	tr.Cache(&untracked, 100, 0)
	require.False(t, untracked.CacheChecked)
	s := tr.Stats()
	require.Equal(t, uint64(6), s.CacheChecked)
	require.Equal(t, uint64(2), s.MissDespiteReuse)
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{VolatilePatterns: []string{"("}})
	require.Error(t, err)
	_, err = New(Config{VolatileFields: []string{"a..b"}})
	require.Error(t, err)
	_, err = New(Config{MaxIndexBytes: -1})
	require.Error(t, err)
}

func TestEvictedHistoryIsNotDrift(t *testing.T) {
	// A conversation whose old turns fell out of the index goes on without
	// false drifts; its reuse is what the index still knows.
	tr := newTracker(t, Config{MaxIndexBytes: 24 << 10})
	c := newConv(task)
	other := newConv("Unrelated: write a haiku about caches, then explain it in detail.")
	for i := range 12 {
		c.turn(i + 1)
		other.turn(i + 50)
		other.system = systemPrompt(fmt.Sprintf("2025-06-01T11:%02d:00Z", i)) // churn the index
		r := tr.Observe(sse.ProtocolChat, c.body(t), t0)
		require.False(t, r.Drift.Happened, "turn %d: %+v", i, r.Drift)
		tr.Observe(sse.ProtocolChat, other.body(t), t0)
		require.LessOrEqual(t, tr.Stats().IndexBytes, int64(24<<10))
	}
	require.NotZero(t, tr.Stats().Evictions)
}

func TestRepeatedRequestIsFullReuse(t *testing.T) {
	tr := newTracker(t, Config{})
	c := newConv(task)
	c.turn(1)
	c.msgs = append(c.msgs, c.msgs[1], c.msgs[2]) // the same segment twice in one prompt
	r1 := tr.Observe(sse.ProtocolChat, c.body(t), t0)
	r2 := tr.Observe(sse.ProtocolChat, c.body(t), t0)
	require.False(t, r2.Drift.Happened)
	require.Equal(t, r1.PromptBytes, r2.ReusableBytes)
	require.Equal(t, 1.0, r2.Reuse)
	require.Equal(t, 1, r2.Turn)
	require.Equal(t, r1.ConversationID, r2.ConversationID)
}

func TestRoleChangeDriftsAtZero(t *testing.T) {
	tr := newTracker(t, Config{})
	rs := run(t, tr, newConv(task), 4, func(turn int, c *conv) {
		if turn == 3 {
			c.msgs[2].Role = "user" // a tool result replayed as a user message
			c.msgs[2].ToolCallID = ""
		}
	})
	require.Equal(t, []int{3}, drifts(rs))
	require.Equal(t, Drift{Happened: true, Segment: SegmentMessage, MessageIndex: 3, Role: RoleUser, Offset: 0, Exact: true, Class: ClassOther,
		LostBytes: rs[2].PromptBytes - rs[3].ReusableBytes}, rs[3].Drift)
}
