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
// time to first output is at least headInformative. The occupancy split
// is the referee: a request it found queued for at least headQueued
// votes "agree" when its head came about that late (within headAgree or a
// tenth of the queue: a slot-start head) and "admit" when its head came
// in the first quarter of the queue (a head at admission). A request with
// its head within headNear of its arrival that occupancy did not find
// queued votes "early", one with its head within headNear of its first
// output "late" (whatever the queue), and one whose head was delayed at least headFar although
// nothing was ahead of it "idle" (the delay is not a queue). The votes of
// the last headWindow informative requests decide: slot_start needs
// headMinMid agreeing heads, headRatio times more of them than "admit" and
// "idle" votes, and an early head (a slot-start engine sends one to every
// request that finds a free slot; an engine whose head always follows
// some fixed work never does). A head read late by a descheduled reader on
// a loaded host does not agree with a queue it was not part of, so an
// admission-head engine (vLLM, whose head says nothing) is never taken for
// one whose head is the queue. Once slot_start is learned the head is used
// for every request, those occupancy misreads included.
const (
	headWindow      = 256
	headInformative = 20 * time.Millisecond
	headNear        = 2 * time.Millisecond
	headFar         = 5 * time.Millisecond
	headQueued      = 50 * time.Millisecond
	headAgree       = 25 * time.Millisecond
	headMinMid      = 4
	headRatio       = 4
)

// headVote is one informative request's evidence.
type headVote uint8

const (
	voteNone  headVote = iota
	voteEarly          // head at arrival, not queued: admission or slot start on a free slot
	voteLate           // head with the first output
	voteAgree          // queued, the head as late as the queue: slot start
	voteAdmit          // queued, the head early: admission
	voteIdle           // the head delayed with nothing ahead: the delay is not a queue
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
	case first-head <= headNear:
		return voteLate
	case occQueue >= headQueued && (head-occQueue).Abs() <= max(headAgree, occQueue/10):
		return voteAgree
	case occQueue >= headQueued && head < occQueue/4:
		return voteAdmit
	case occQueue >= headQueued:
		return voteNone
	case head <= headNear:
		return voteEarly
	case head >= headFar && first-head >= headFar && ahead == 0:
		return voteIdle
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
	case c[voteAgree] >= headMinMid && c[voteEarly] > 0 && c[voteAgree] >= headRatio*(c[voteAdmit]+c[voteIdle]):
		return HeadSlotStart
	case c[voteAdmit] >= headMinMid && c[voteAdmit] > c[voteAgree]:
		return HeadAdmission
	case c[voteLate] >= headMinMid && c[voteLate] > headRatio*(c[voteEarly]+c[voteAgree]):
		return HeadFirstOutput
	case c[voteEarly] >= headMinMid && c[voteEarly] > headRatio*c[voteLate] && c[voteAgree] == 0:
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
