package histo

import (
	"sync"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// When an engine sends its response head is a fact about the engine that
// the proxy learns from the traffic (docs/queue-split.md "The response
// head"): vLLM sends it when it accepts the request, llama.cpp's
// llama-server when a slot starts the prompt, ollama with the first
// output. Only at slot start does it carry the split: head − arrival is the
// engine queue, first output − head the prefill.

// Head modes, in the snapshot's engine_slots.response_head.
const (
	HeadUnknown     = "unknown"      // not enough evidence: the head is not used
	HeadAdmission   = "admission"    // the head leaves before any queueing: no information
	HeadSlotStart   = "slot_start"   // the head leaves when the slot starts: queue = head − arrival
	HeadFirstOutput = "first_output" // the head leaves with the first output: no information
)

// Head learning parameters. A request is informative when its upstream
// time to first output is at least headInformative. Its head came early
// when within headNear of its arrival, late when within headNear of its
// first output, and in between ("mid") when at least headFar from both: a
// mid head is what only a slot-start engine sends (the request queued, the
// head left, the prefill followed). A request that the occupancy split
// found queued for at least headQueued but whose head came early argues
// for a head at admission, and one whose head was delayed although the
// proxy saw nothing ahead of it in the engine argues that the delay is not
// a queue. The votes of the last headWindow informative requests decide;
// slot_start needs headMinMid mid heads, headRatio times more of them
// than both kinds of contrary votes, and an early head (a slot-start engine
// sends one to every request that finds a free slot; an engine whose head
// always follows some fixed work never does), so that a
// few heads delayed by a descheduled reader on a loaded host never make an
// admission-head engine (vLLM, where the head says nothing) look like one
// whose head is the queue.
const (
	headWindow      = 256
	headInformative = 20 * time.Millisecond
	headNear        = 2 * time.Millisecond
	headFar         = 5 * time.Millisecond
	headQueued      = 50 * time.Millisecond
	headMinMid      = 4
	headRatio       = 4
)

// headVote is one informative request's evidence.
type headVote uint8

const (
	voteNone  headVote = iota
	voteEarly          // head at arrival: admission or slot start on a free slot
	voteLate           // head with the first output
	voteMid            // head between: a slot-start engine's queued request
	voteAdmit          // queued (by occupancy) with the head at arrival: admission
	voteIdle           // a mid head with nothing ahead: the delay is not a queue
)

// headLearner learns the engine's head mode from the last headWindow
// informative requests. It is safe for concurrent use; its mutex is held
// for a few array updates.
type headLearner struct {
	mu     sync.Mutex
	votes  [headWindow]headVote
	next   int
	counts [voteIdle + 1]int
	mode   string
}

// headTimes are tr's upstream stamps relative to its arrival at the engine
// (t_admit + connect): the head's delay and the first output's. ok is false
// when tr has no head or no first output, or was not streamed (a unary
// body's head comes with the whole answer).
func headTimes(tr *proxy.Trace) (head, first time.Duration, ok bool) {
	if !tr.Stream || tr.Headers.IsZero() || tr.FirstOutput.IsZero() || tr.Admit.IsZero() {
		return 0, 0, false
	}
	arrive := tr.Admit.Add(tr.Connect)
	head, first = tr.Headers.Sub(arrive), tr.FirstOutput.Sub(arrive)
	return min(max(head, 0), max(first, 0)), max(first, 0), true
}

// vote is tr's evidence; occQueue is its queue by occupancy and ahead the
// requests the proxy saw ahead of it (both -1 when unknown).
func vote(tr *proxy.Trace, occQueue time.Duration, ahead int) headVote {
	head, first, ok := headTimes(tr)
	if !ok || first < headInformative || tr.Failed() {
		return voteNone
	}
	switch {
	case head <= headNear && occQueue >= headQueued:
		return voteAdmit
	case head <= headNear:
		return voteEarly
	case first-head <= headNear:
		return voteLate
	case head >= headFar && first-head >= headFar && ahead == 0:
		return voteIdle
	case head >= headFar && first-head >= headFar:
		return voteMid
	}
	return voteNone
}

// observe adds tr's evidence, after tr was split (a request is never split
// by its own vote).
func (h *headLearner) observe(tr *proxy.Trace, occQueue time.Duration, ahead int) {
	v := vote(tr, occQueue, ahead)
	if v == voteNone {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[h.votes[h.next]]--
	h.votes[h.next] = v
	h.counts[v]++
	h.next = (h.next + 1) % headWindow
	h.mode = h.modeLocked()
}

// modeLocked decides from the votes held; the caller holds h.mu.
func (h *headLearner) modeLocked() string {
	c := &h.counts
	switch {
	case c[voteMid] >= headMinMid && c[voteEarly] > 0 && c[voteMid] >= headRatio*(c[voteAdmit]+c[voteIdle]):
		return HeadSlotStart
	case c[voteAdmit] >= headMinMid:
		return HeadAdmission
	case c[voteLate] >= headMinMid && c[voteLate] > headRatio*(c[voteEarly]+c[voteMid]):
		return HeadFirstOutput
	case c[voteEarly] >= headMinMid && c[voteEarly] > headRatio*c[voteLate]:
		return HeadAdmission // or slot start on an engine that never queued: either way the head says queue 0
	}
	return HeadUnknown
}

// slotStart reports whether the head is the engine's slot start.
func (h *headLearner) slotStart() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mode == HeadSlotStart
}

// current is the learned mode.
func (h *headLearner) current() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mode == "" {
		return HeadUnknown
	}
	return h.mode
}
