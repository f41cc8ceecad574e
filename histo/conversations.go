package histo

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/lru"
)

// Agent-side time: the prefix tracker links each request to the
// conversation it continues (prefix.Result.ConversationID), so the time
// between the end of one response and the next request of the same
// conversation is the agent's own (tool runs, prompt rebuilding, backoff
// sleeps), to set against the engine's (t_recv → t_end of each turn).
//
// A conversation's engine time is the union of its turns' t_recv → t_end
// spans, its agent time the sum of the gaps from the latest t_client_done
// to the next t_recv; neither overlaps the other, so together they are at
// most its wall time (first t_recv → last t_client_done). The rest is the
// proxy's tail (t_end → t_client_done, ~0). A request sent before its
// conversation's previous response ended (parallel calls) has no gap; as
// turns are recorded when they finish, one that started before and ended
// after an already recorded one adds only its time past that one's end.

// Defaults of the conversation state bounds.
const (
	defaultMaxConversations = 4096
	defaultConversationIdle = 30 * time.Minute
)

const (
	timelineTurns        = 16 // turns kept per conversation for the timeline
	slowestConversations = 10 // conversations itemized per window
)

// convMetrics are the agent-side time exports.
type convMetrics struct {
	gap           prometheus.Histogram
	engine, agent prometheus.Counter
}

func newConvMetrics() (*convMetrics, []prometheus.Collector) {
	m := &convMetrics{
		gap: prometheus.NewHistogram(dist.PromHistogram("anvilproxy_agent_gap_seconds",
			"Time from the end of a response to the next request of the same conversation: the agent's own time (tools, prompt building, backoff).",
			[]float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 25, 50, 100, 250, 600, 1800})),
	}
	split := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_conversation_seconds_total",
		Help: "Conversation time by where it was spent: engine (a request in flight) or agent (between a response and the next request). The agent share is rate(agent) / (rate(agent) + rate(engine)).",
	}, []string{"part"})
	m.engine, m.agent = split.WithLabelValues("engine"), split.WithLabelValues("agent")
	return m, []prometheus.Collector{m.gap, split}
}

func (m *convMetrics) observe(t convTurn) {
	if !t.tracked {
		return
	}
	if t.hasGap {
		m.gap.Observe(t.gap.Seconds())
		m.agent.Add(t.gap.Seconds())
	}
	m.engine.Add(t.busy.Seconds())
}

// convTurn is what one request added to its conversation.
type convTurn struct {
	tracked    bool
	first      bool          // the request started the conversation's state
	hasGap     bool          // the conversation's previous response had ended
	overlapped bool          // it had not
	gap        time.Duration // the agent gap before the request
	engine     time.Duration // the request's t_recv → t_end
	busy       time.Duration // engine time the request added to its conversation
}

// turnMark is one turn in a conversation's timeline.
type turnMark struct {
	turn   int
	status int
	start  time.Duration // from the conversation's first t_recv
	engine time.Duration
	gap    time.Duration // -1: none
}

// convState is one conversation's running figures, an element of the
// conversations LRU list.
type convState struct {
	lru.Links[convState]
	id            uint64
	first         time.Time // earliest t_recv
	lastEnd       time.Time // latest engine end
	lastDone      time.Time // latest t_client_done
	turns         int
	engine, agent time.Duration
	gen           uint64 // the window that saw its latest turn
	marks         [timelineTurns]turnMark
	next          int // ring position in marks
}

// conversations holds the most recently active conversations, least
// recently active evicted first, and those idle for longer than idle. It
// is guarded by Recorder.mu.
type conversations struct {
	max   int
	idle  time.Duration
	byID  map[uint64]*convState
	order lru.List[convState, *convState] // most recently active first
}

func newConversations(max int, idle time.Duration) conversations {
	return conversations{max: max, idle: idle, byID: make(map[uint64]*convState)}
}

// engineEnd is when the engine was done with tr: t_end, or t_client_done
// when the upstream never finished (refused, broken).
func engineEnd(tr *proxy.Trace) time.Time {
	switch {
	case !tr.End.IsZero():
		return tr.End
	case !tr.ClientDone.IsZero():
		return tr.ClientDone
	}
	return tr.Recv
}

// doneAt is when the agent had the whole answer: t_client_done, or the
// engine's end when the client went away first.
func doneAt(tr *proxy.Trace) time.Time {
	if !tr.ClientDone.IsZero() {
		return tr.ClientDone
	}
	return engineEnd(tr)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// add records tr in its conversation, as seen in window gen.
func (c *conversations) add(tr *proxy.Trace, gen uint64) convTurn {
	res := &tr.Prefix
	if !res.Tracked || tr.Recv.IsZero() {
		return convTurn{}
	}
	recv, end, done := tr.Recv, later(tr.Recv, engineEnd(tr)), later(tr.Recv, doneAt(tr))
	c.expire(recv)
	t := convTurn{tracked: true, engine: end.Sub(recv), gap: -1}
	st := c.byID[res.ConversationID]
	switch {
	case st == nil:
		st = c.insert(res.ConversationID, recv)
		t.first = true
	case recv.Before(st.lastDone):
		c.order.Touch(st)
		t.overlapped = true
	default:
		c.order.Touch(st)
		t.hasGap, t.gap = true, recv.Sub(st.lastDone)
		st.agent += t.gap
	}
	if recv.Before(st.first) { // it started before every turn seen so far
		shift := st.first.Sub(recv)
		for i := range st.marks {
			st.marks[i].start += shift
		}
		st.first = recv
	}
	if from := later(recv, st.lastEnd); end.After(from) {
		t.busy = end.Sub(from)
		st.engine += t.busy
	}
	st.lastEnd, st.lastDone = later(st.lastEnd, end), later(st.lastDone, done)
	st.turns++
	st.gen = gen
	st.marks[st.next] = turnMark{turn: res.Turn, status: tr.Status, start: recv.Sub(st.first), engine: t.engine, gap: t.gap}
	st.next = (st.next + 1) % timelineTurns
	return t
}

// expire drops the conversations idle since before now − idle: a gap that
// long is a person away, not an agent at work.
func (c *conversations) expire(now time.Time) {
	for st := c.order.Oldest(); st != nil && now.Sub(st.lastDone) > c.idle; st = c.order.Oldest() {
		c.remove(st)
	}
}

// insert adds a conversation, evicting the least recently active one at
// the cap (and reusing its memory).
func (c *conversations) insert(id uint64, recv time.Time) *convState {
	st := c.order.Oldest()
	if len(c.byID) >= c.max && st != nil {
		c.remove(st)
		*st = convState{}
	} else {
		st = &convState{}
	}
	st.id, st.first, st.lastEnd, st.lastDone = id, recv, recv, recv
	c.byID[id] = st
	c.order.Touch(st)
	return st
}

func (c *conversations) remove(st *convState) {
	c.order.Remove(st)
	delete(c.byID, st.id)
}

// convSeal is the conversations active in one window, copied out under
// Recorder.mu when the window is read.
type convSeal struct {
	active                    int64
	agentShares, engineShares []float64
	slowest                   []ConversationRecord
}

// seal copies out the conversations with a turn in window gen. Those are
// the newest of the list (a window's turns come after every earlier
// window's), so it stops at the first older one.
func (c *conversations) seal(gen uint64) convSeal {
	var s convSeal
	var top []*convState // the slowest, by wall time, descending
	for st := c.order.Newest(); st != nil && st.gen == gen; st = c.order.Older(st) {
		s.active++
		wall := st.lastDone.Sub(st.first)
		if wall > 0 {
			s.agentShares = append(s.agentShares, float64(st.agent)/float64(wall))
			s.engineShares = append(s.engineShares, float64(st.engine)/float64(wall))
		}
		i, _ := slices.BinarySearchFunc(top, wall, func(x *convState, w time.Duration) int {
			return cmp.Compare(w, x.lastDone.Sub(x.first))
		})
		if i < slowestConversations {
			top = slices.Insert(top, i, st)
			top = top[:min(len(top), slowestConversations)]
		}
	}
	for _, st := range top {
		s.slowest = append(s.slowest, st.record())
	}
	return s
}

// ConversationRecord is one conversation's figures and its latest turns,
// for a per-conversation timeline. The conversation appears only by its
// keyed hash.
type ConversationRecord struct {
	Conversation string    `json:"conversation"` // keyed hash, hex
	StartedAt    time.Time `json:"started_at"`   // first t_recv seen
	Turns        int       `json:"turns"`        // turns the proxy saw
	WallMs       Float     `json:"wall_ms"`      // first t_recv → last t_client_done
	EngineMs     Float     `json:"engine_ms"`
	AgentMs      Float     `json:"agent_ms"`
	EngineShare  Float     `json:"engine_share"` // of the wall time
	AgentShare   Float     `json:"agent_share"`
	// Timeline is the latest turns (at most 16), oldest first.
	Timeline []TurnTiming `json:"timeline"`
}

// TurnTiming is one turn of a conversation.
type TurnTiming struct {
	Turn       int   `json:"turn"`     // prefix.Result.Turn
	StartMs    Float `json:"start_ms"` // from the conversation's first t_recv
	EngineMs   Float `json:"engine_ms"`
	AgentGapMs Float `json:"agent_gap_ms"` // null: the first turn seen, or it overlapped the previous response
	Status     int   `json:"status"`
}

func (st *convState) record() ConversationRecord {
	wall := st.lastDone.Sub(st.first)
	r := ConversationRecord{
		Conversation: fmt.Sprintf("%016x", st.id), StartedAt: st.first.Round(0).UTC(), Turns: st.turns,
		WallMs: dist.Millis(wall), EngineMs: dist.Millis(st.engine), AgentMs: dist.Millis(st.agent),
		EngineShare: ratio(int64(st.engine), int64(wall)), AgentShare: ratio(int64(st.agent), int64(wall)),
	}
	n := min(st.turns, timelineTurns)
	for i := range n {
		m := st.marks[(st.next-n+i+timelineTurns)%timelineTurns]
		tt := TurnTiming{Turn: m.turn, StartMs: dist.Millis(m.start), EngineMs: dist.Millis(m.engine), AgentGapMs: nan, Status: m.status}
		if m.gap >= 0 {
			tt.AgentGapMs = dist.Millis(m.gap)
		}
		r.Timeline = append(r.Timeline, tt)
	}
	return r
}

// ConversationsSection is a window's agent-side time: the snapshot's
// anvilproxy.conversations object. Conversations appear only by keyed
// hash.
type ConversationsSection struct {
	// Conversations counts those with a turn in the window (in a merge,
	// once per window they were active in); New those whose first turn
	// the proxy saw in it.
	Conversations int64 `json:"conversations"`
	New           int64 `json:"new"`
	// Turns counts the requests linked to a conversation; Untracked the
	// inference requests whose prompt was not tracked, so have none;
	// OverlappingTurns the turns sent before their conversation's previous
	// response had ended, which have no agent gap.
	Turns            int64 `json:"turns"`
	Untracked        int64 `json:"untracked"`
	OverlappingTurns int64 `json:"overlapping_turns"`
	// EngineMs and AgentMs are the window's turns' engine time (without
	// overlaps) and agent gaps; AgentShare is AgentMs / (AgentMs +
	// EngineMs).
	EngineMs   Float `json:"engine_ms"`
	AgentMs    Float `json:"agent_ms"`
	AgentShare Float `json:"agent_share"`
	// AgentGapMs is the agent gaps, EngineTurnMs each turn's t_recv →
	// t_end.
	AgentGapMs   dist.Dist `json:"agent_gap_ms"`
	EngineTurnMs dist.Dist `json:"engine_turn_ms"`
	// The shares of their wall time the window's conversations spent in the
	// agent and in the engine, one sample per conversation.
	AgentShareByConversation  dist.Dist `json:"agent_share_by_conversation"`
	EngineShareByConversation dist.Dist `json:"engine_share_by_conversation"`
	// Slowest are the conversations with the longest wall time, at most 10.
	Slowest []ConversationRecord `json:"slowest"`
}

// convTally accumulates a window's agent-side time; guarded by
// Recorder.mu. gen numbers the window for the conversations' states.
type convTally struct {
	gen                                  uint64
	turns, fresh, untracked, overlapping int64
	engine, agent                        time.Duration
	gaps, engineTurn                     dist.Rec
	sealed                               convSeal
}

func (t *convTally) add(turn convTurn) {
	if !turn.tracked {
		t.untracked++
		return
	}
	t.turns++
	if turn.first {
		t.fresh++
	}
	if turn.overlapped {
		t.overlapping++
	}
	if turn.hasGap {
		t.agent += turn.gap
		t.gaps.Record(dist.Ms, float64(turn.gap)/float64(time.Millisecond))
	}
	t.engine += turn.busy
	t.engineTurn.Record(dist.Ms, float64(turn.engine)/float64(time.Millisecond))
}

func (t *convTally) clone() convTally {
	c := *t
	c.gaps, c.engineTurn = t.gaps.Clone(), t.engineTurn.Clone()
	return c
}

// section summarizes the tally and its seal; it does not modify them.
func (t *convTally) section() *ConversationsSection {
	s := &ConversationsSection{
		Conversations: t.sealed.active, New: t.fresh, Turns: t.turns, Untracked: t.untracked, OverlappingTurns: t.overlapping,
		EngineMs: dist.Millis(t.engine), AgentMs: dist.Millis(t.agent), AgentShare: ratio(int64(t.agent), int64(t.agent+t.engine)),
		AgentGapMs: t.gaps.Dist(dist.Ms), EngineTurnMs: t.engineTurn.Dist(dist.Ms),
		Slowest: append([]ConversationRecord{}, t.sealed.slowest...),
	}
	var agent, engine dist.Rec
	for _, v := range t.sealed.agentShares {
		agent.Record(dist.Share, v)
	}
	for _, v := range t.sealed.engineShares {
		engine.Record(dist.Share, v)
	}
	s.AgentShareByConversation, s.EngineShareByConversation = agent.Dist(dist.Share), engine.Dist(dist.Share)
	return s
}

// MergeConversations combines the conversation sections of several
// windows (nil ones are skipped; nil when all are). Counts and times add
// up, distributions merge exactly, and the slowest conversations are
// taken again from each window's, a conversation by its latest record.
func MergeConversations(sections ...*ConversationsSection) *ConversationsSection {
	return dist.MergeSections(sections, mergeConversations)
}

// mergeConversations combines two or more sections.
func mergeConversations(in []*ConversationsSection) *ConversationsSection {
	out := &ConversationsSection{}
	var gaps, turns, agent, engine []dist.Dist
	latest := make(map[string]ConversationRecord)
	for _, s := range in {
		out.Conversations += s.Conversations
		out.New += s.New
		out.Turns += s.Turns
		out.Untracked += s.Untracked
		out.OverlappingTurns += s.OverlappingTurns
		out.EngineMs += known(s.EngineMs)
		out.AgentMs += known(s.AgentMs)
		gaps, turns = append(gaps, s.AgentGapMs), append(turns, s.EngineTurnMs)
		agent, engine = append(agent, s.AgentShareByConversation), append(engine, s.EngineShareByConversation)
		for _, r := range s.Slowest {
			if have, ok := latest[r.Conversation]; !ok || r.Turns > have.Turns {
				latest[r.Conversation] = r
			}
		}
	}
	out.AgentShare = Float(float64(out.AgentMs) / float64(out.AgentMs+out.EngineMs))
	if out.AgentMs+out.EngineMs == 0 {
		out.AgentShare = nan
	}
	out.AgentGapMs, out.EngineTurnMs = dist.Merge(dist.Ms, gaps...), dist.Merge(dist.Ms, turns...)
	out.AgentShareByConversation = dist.Merge(dist.Share, agent...)
	out.EngineShareByConversation = dist.Merge(dist.Share, engine...)
	out.Slowest = []ConversationRecord{}
	for _, r := range latest {
		out.Slowest = append(out.Slowest, r)
	}
	slices.SortFunc(out.Slowest, func(a, b ConversationRecord) int {
		if d := cmp.Compare(known(b.WallMs), known(a.WallMs)); d != 0 {
			return d
		}
		return cmp.Compare(a.Conversation, b.Conversation)
	})
	out.Slowest = out.Slowest[:min(len(out.Slowest), slowestConversations)]
	return out
}

// known is f, or 0 when unknown.
func known(f Float) Float {
	if !f.Known() {
		return 0
	}
	return f
}
