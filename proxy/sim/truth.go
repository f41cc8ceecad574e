package sim

import "time"

// Truth is what the engine knows about one request and never tells the
// client: its true queue wait, prefill time and cache use. Tests compare
// what a measuring proxy infers from the outside (queue vs prefill, cache
// hits the engine did not report) against it.
type Truth struct {
	ID string // the key: X-Request-Id, or the generated id (the response id without its prefix)

	Arrived  time.Time // the handler started, before reading the body: the request reached the engine
	Admitted time.Time // a slot was acquired (the slot starts the prompt); zero if the request never got one
	// Head is when the response head left: for a stream on admission,
	// at slot start or with the first output (Config.Head); for a whole
	// response with its body. Zero if it never left.
	Head time.Time
	// PrefillStart is when the prefill proper started: Admitted plus the
	// work before it (PrePrefill). Zero if never admitted.
	PrefillStart time.Time
	FirstToken   time.Time // prefill ended and the first token was due; zero if never
	LastToken    time.Time // the last output event went out; zero if none did
	// Released is when the slot was let go: with the last token
	// (ReleaseLastToken), or at the stream's end (ReleaseStreamEnd), one
	// decode step after the last token for an answer that stopped by
	// itself. Zero if the request never held a slot.
	Released time.Time
	Finished time.Time // the engine stopped work on it: Released, or when it left the queue

	Slot int // the slot it held, 0..Slots-1; -1 if none

	Queue time.Duration // Arrived → Admitted; for a request that left the queue, Arrived → Finished
	// PrePrefill is the work on the slot before this prompt's prefill
	// (Admitted → PrefillStart): llama.cpp saving the slot's old prompt to
	// its RAM prompt cache and restoring a better prefix from it
	// (Config.SwitchCost). Neither queue nor this prompt's prefill.
	PrePrefill time.Duration
	Prefill    time.Duration // PrefillStart → FirstToken

	// Left is when the engine noticed the client had gone during prefill
	// (or the work before it); zero if it did not leave then.
	Left time.Time
	// Abandoned is how long the slot stayed busy after Left, prefilling
	// for nobody (Config.Abandon): Left → Released. The next request's
	// wait for that slot is queue.
	Abandoned time.Duration

	PromptTokens     int
	CachedTokens     int // prompt tokens the prefix cache actually served, reported or not
	CompletionTokens int // generated, including those of a stream cut short

	Outcome Outcome
}

// Outcome is how a request ended inside the engine.
type Outcome string

// The outcomes of a request that reached admission.
const (
	OutcomeCompleted Outcome = "completed" // generated in full and written
	OutcomeAborted   Outcome = "aborted"   // the client went away first
	OutcomeFailed    Outcome = "failed"    // cut by X-Sim-Fail-After-Events
	OutcomeTruncated Outcome = "truncated" // ended cleanly without finish, usage or [DONE] (X-Sim-Truncate-After-Events, Config.TruncateRate)
)

// maxTruths bounds the truth records kept: the oldest are forgotten first.
// Tests send far fewer requests; a long-running sim keeps its memory bounded.
const maxTruths = 1 << 14

// truths is a bounded map from id to Truth, forgetting the oldest entry
// first. It is not safe for concurrent use; Server.mu guards it.
type truths struct {
	byID  map[string]Truth
	order []string // ring of ids, oldest at next
	next  int
}

func newTruths() *truths { return &truths{byID: make(map[string]Truth)} }

func (t *truths) put(tr Truth) {
	if _, ok := t.byID[tr.ID]; ok { // a repeated X-Request-Id: the latest wins
		t.byID[tr.ID] = tr
		return
	}
	if len(t.order) < maxTruths {
		t.order = append(t.order, tr.ID)
	} else {
		delete(t.byID, t.order[t.next])
		t.order[t.next] = tr.ID
		t.next = (t.next + 1) % maxTruths
	}
	t.byID[tr.ID] = tr
}

// Truth returns the engine's record of the request whose X-Request-Id was
// id (for a request sent without one: the id the sim generated, which is
// the response id without its "chatcmpl-", "resp_"… prefix). The record is
// written when the engine stops work on the request, so a request still
// queued, prefilling or decoding is not found yet; requests answered with an
// error before admission (X-Sim-Status, 429, bad bodies) are never recorded.
// Safe for concurrent use. The last 16,384 requests are kept.
func (s *Server) Truth(id string) (Truth, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tr, ok := s.truths.byID[id]
	return tr, ok
}

// record stores the truth of j once the engine is done with it.
func (s *Server) record(j *job, res *result, outcome Outcome) {
	tr := Truth{
		ID:               j.base,
		Arrived:          j.arrived,
		Admitted:         res.admitted,
		FirstToken:       res.firstToken,
		LastToken:        res.lastToken,
		PrefillStart:     res.prefillStart,
		Left:             res.left,
		Abandoned:        res.abandoned,
		Head:             res.head,
		Released:         res.released,
		Finished:         res.released,
		Slot:             res.slot,
		PromptTokens:     res.promptTokens,
		CachedTokens:     res.cachedTokens,
		CompletionTokens: res.completionTokens,
		Outcome:          outcome,
	}
	if tr.Finished.IsZero() {
		tr.Finished = time.Now()
	}
	if tr.Admitted.IsZero() {
		tr.Queue = tr.Finished.Sub(tr.Arrived)
	} else {
		tr.Queue = tr.Admitted.Sub(tr.Arrived)
	}
	if !tr.Admitted.IsZero() {
		tr.PrePrefill = tr.PrefillStart.Sub(tr.Admitted)
	}
	if !tr.FirstToken.IsZero() {
		tr.Prefill = tr.FirstToken.Sub(tr.PrefillStart)
	}
	reason := "abort"
	switch {
	case outcome == OutcomeTruncated || (outcome == OutcomeCompleted && !j.limited):
		reason = "stop"
	case outcome == OutcomeCompleted:
		reason = "length"
	}
	s.mu.Lock()
	s.truths.put(tr)
	s.counters.countEnd(res, reason)
	s.mu.Unlock()
	if outcome == OutcomeCompleted {
		s.hists.observe(tr)
	}
}
