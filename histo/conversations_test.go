package histo

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// turnAt is turn of conversation conv: received at recv ms, its upstream
// done engine ms later and its client 1 ms after that.
func turnAt(conv uint64, turn int, recv, engine float64) proxy.Trace {
	tr := chat()
	tr.Recv, tr.Admit, tr.Sent = at(recv), at(recv), at(recv+1)
	tr.Headers, tr.FirstEvent, tr.FirstOutput, tr.FirstContent = at(recv+2), at(recv+3), at(recv+4), at(recv+5)
	tr.LastToken, tr.End, tr.ClientDone = at(recv+engine-1), at(recv+engine), at(recv+engine+1)
	tr.Prefix = prefix.Result{Tracked: true, ConversationID: conv, Turn: turn, PromptBytes: 1000, Reuse: 0,
		SystemBytes: 1000}
	return tr
}

// requireMs checks a millisecond figure exactly (to the nanosecond).
func requireMs(t *testing.T, want float64, got Float, msg ...any) {
	t.Helper()
	require.InDelta(t, want, float64(got), 1e-6, msg...)
}

// TestAgentGaps: a scripted conversation with known gaps between turns;
// the gaps, engine times and shares come out exact, in the window and in
// the conversation's timeline.
func TestAgentGaps(t *testing.T) {
	r, reg, clk := newTest(t, Config{})
	record := func(tr proxy.Trace) { r.Record(&tr) }
	// Conversation 0xa: engine 1000, gap 500, engine 2000, gap 2500, engine 1000.
	record(turnAt(0xa, 0, 0, 1000))
	record(turnAt(0xb, 0, 200, 300)) // another conversation, one turn
	record(turnAt(0xa, 1, 1501, 2000))
	record(turnAt(0xa, 2, 6002, 1000))
	untracked := chat()
	r.Record(&untracked)
	// Conversation 0xc: the second request starts before the first ends.
	record(turnAt(0xc, 0, 0, 1000))
	record(turnAt(0xc, 1, 500, 1000))

	clk.t = at(60_000)
	s := r.Rotate().Conversations
	require.Equal(t, int64(3), s.Conversations)
	require.Equal(t, int64(3), s.New)
	require.Equal(t, int64(6), s.Turns)
	require.Equal(t, int64(1), s.Untracked)
	require.Equal(t, int64(1), s.OverlappingTurns)
	requireMs(t, 500+2500, s.AgentMs)
	requireMs(t, 1000+300+2000+1000+1500, s.EngineMs, "0xc's engine time is the union of its turns")
	requireMs(t, 3000.0/(3000+5800), s.AgentShare)
	require.Equal(t, int64(2), s.AgentGapMs.Count)
	require.InEpsilon(t, 2500, float64(s.AgentGapMs.Max), 0.01)
	require.InEpsilon(t, 500, float64(s.AgentGapMs.P50), 0.01)
	require.Equal(t, int64(6), s.EngineTurnMs.Count)
	require.Equal(t, int64(3), s.AgentShareByConversation.Count)

	require.Len(t, s.Slowest, 3)
	a := s.Slowest[0]
	require.Equal(t, "000000000000000a", a.Conversation)
	require.Equal(t, t0, a.StartedAt)
	require.Equal(t, 3, a.Turns)
	requireMs(t, 7003, a.WallMs)
	requireMs(t, 4000, a.EngineMs)
	requireMs(t, 3000, a.AgentMs)
	requireMs(t, 3000.0/7003, a.AgentShare)
	requireMs(t, 4000.0/7003, a.EngineShare)
	require.Len(t, a.Timeline, 3)
	for i, want := range []struct{ start, engine, gap float64 }{{0, 1000, -1}, {1501, 2000, 500}, {6002, 1000, 2500}} {
		tt := a.Timeline[i]
		require.Equal(t, i, tt.Turn)
		requireMs(t, want.start, tt.StartMs)
		requireMs(t, want.engine, tt.EngineMs)
		if want.gap < 0 {
			require.False(t, tt.AgentGapMs.Known(), "the first turn has no gap")
		} else {
			requireMs(t, want.gap, tt.AgentGapMs)
		}
		require.Equal(t, 200, tt.Status)
	}
	c := s.Slowest[1]
	require.Equal(t, "000000000000000c", c.Conversation)
	requireMs(t, 1501, c.WallMs)
	require.False(t, c.Timeline[1].AgentGapMs.Known(), "an overlapping turn has no gap")
	requireMs(t, 500, c.Timeline[1].StartMs)

	// Prometheus: the gaps and the split in seconds.
	require.Equal(t, 1, testutil.CollectAndCount(reg, "anvilproxy_agent_gap_seconds"))
	require.InDelta(t, 3.0, gatherSum(t, reg, "anvilproxy_agent_gap_seconds"), 1e-9)
	agent := prometheus.Labels{"part": "agent"}
	require.InDelta(t, 3.0, counterValue(t, reg, "anvilproxy_conversation_seconds_total", agent), 1e-9)

	// The conversation goes on in the next window: its gap spans the two.
	tr := turnAt(0xa, 3, 7503, 100)
	r.Record(&tr)
	s = r.Rotate().Conversations
	require.Equal(t, int64(1), s.Conversations)
	require.Zero(t, s.New)
	requireMs(t, 500, s.AgentMs)
	require.Equal(t, 4, s.Slowest[0].Turns)
	requireMs(t, 7604, s.Slowest[0].WallMs)
}

// TestConversationBounds: the state is an LRU of MaxConversations, and a
// conversation idle longer than ConversationIdle starts again (its long
// pause is not agent time).
func TestConversationBounds(t *testing.T) {
	r, _, _ := newTest(t, Config{MaxConversations: 3, ConversationIdle: time.Minute})
	for id := uint64(1); id <= 5; id++ {
		tr := turnAt(id, 0, float64(id)*10, 5)
		r.Record(&tr)
	}
	require.Len(t, r.convs.byID, 3)
	n := 0
	for st := r.convs.order.Newest(); st != nil; st = r.convs.order.Older(st) {
		n++
	}
	require.Equal(t, 3, n, "the list and the map agree")
	tr := turnAt(1, 1, 100, 5) // evicted: starts again
	r.Record(&tr)
	tr = turnAt(5, 1, 200, 5) // held: a gap
	r.Record(&tr)
	tr = turnAt(5, 2, 200+65_000, 5) // idle for 65 s: starts again
	r.Record(&tr)
	s := r.Rotate().Conversations
	require.Equal(t, int64(7), s.New, "five, one evicted, one idle")
	require.Equal(t, int64(1), s.AgentGapMs.Count)
	requireMs(t, 200-56, s.AgentMs)
	require.Len(t, r.convs.byID, 1, "the others idled out")
	require.Same(t, r.convs.order.Newest(), r.convs.order.Oldest())
	require.Equal(t, 1, r.convs.order.Len())
}

// TestTimelineBounded: a long conversation keeps its latest 16 turns.
func TestTimelineBounded(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	for i := range 40 {
		tr := turnAt(9, i, float64(i)*100, 50)
		r.Record(&tr)
	}
	rec := r.Rotate().Conversations.Slowest[0]
	require.Equal(t, 40, rec.Turns)
	require.Len(t, rec.Timeline, timelineTurns)
	require.Equal(t, 24, rec.Timeline[0].Turn)
	require.Equal(t, 39, rec.Timeline[15].Turn)
	requireMs(t, 3900, rec.Timeline[15].StartMs)
	requireMs(t, 49, rec.Timeline[15].AgentGapMs)
}

func TestMergeConversations(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	var sections []*ConversationsSection
	for w := range 3 {
		for c := range uint64(4) {
			tr := turnAt(c+1, w, float64(w)*10_000+float64(c)*100, 1000+float64(c))
			r.Record(&tr)
		}
		sections = append(sections, r.Rotate().Conversations)
	}
	m := MergeConversations(sections[0], nil, sections[1], sections[2])
	require.Equal(t, int64(12), m.Conversations, "once per window")
	require.Equal(t, int64(12), m.Turns)
	require.Equal(t, int64(8), m.AgentGapMs.Count)
	var agent, engine float64
	for _, s := range sections {
		agent += float64(s.AgentMs)
		engine += float64(s.EngineMs)
	}
	requireMs(t, agent, m.AgentMs)
	requireMs(t, agent/(agent+engine), m.AgentShare)
	require.Len(t, m.Slowest, 4, "each conversation once, by its latest record")
	require.Equal(t, 3, m.Slowest[0].Turns)
	require.Equal(t, "0000000000000004", m.Slowest[0].Conversation, "the longest wall time first")
	require.Nil(t, MergeConversations(nil, nil))
	require.Same(t, sections[1], MergeConversations(nil, sections[1]))
}

// metricOf returns the series of name whose labels include labels.
func metricOf(t *testing.T, reg prometheus.Gatherer, name string, labels prometheus.Labels) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == k && l.GetValue() == v
				}
				if !found {
					continue series
				}
			}
			return m
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return nil
}

func gatherSum(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	return metricOf(t, reg, name, nil).GetHistogram().GetSampleSum()
}

func counterValue(t *testing.T, reg prometheus.Gatherer, name string, labels prometheus.Labels) float64 {
	t.Helper()
	return metricOf(t, reg, name, labels).GetCounter().GetValue()
}
