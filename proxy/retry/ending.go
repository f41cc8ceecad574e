package retry

import (
	"encoding/json"
	"time"
)

// Ending says what ended an attempt, as seen by the next attempt of the
// same logical request (Result.PrevOutcome). Its String values are bounded,
// so they can be metric labels.
type Ending uint8

// Endings. EndingNone is the PrevOutcome of a first attempt.
const (
	EndingNone                        Ending = iota
	Ending429                                // the engine (or a gateway before it) said 429 Too Many Requests
	Ending5xx                                // a 5xx status, or the upstream broke the response (Outcome.UpstreamError)
	EndingUpstreamTimeout                    // the proxy gave up waiting for the upstream
	EndingClientAbortBeforeFirstToken        // the client went away before any output token
	EndingClientAbortMidStream               // the client went away after output had started
	EndingSuccess                            // a 2xx response was delivered: the retry is a duplicate
	EndingInFlight                           // the previous attempt was still running: the client gave up waiting
	EndingOther4xx                           // any other 4xx status
	EndingUnknown                            // never seen (a header-only retry) or no classifiable status

	NumEndings = iota // the number of Endings, for arrays indexed by Ending
)

var endingNames = [NumEndings]string{"", "429", "5xx", "upstream_timeout", "client_abort_before_first_token",
	"client_abort_mid_stream", "success", "in_flight", "other_4xx", "unknown"}

func (e Ending) String() string {
	if int(e) < len(endingNames) {
		return endingNames[e]
	}
	return "unknown"
}

// MarshalText writes the String value, so Endings read as labels in JSON.
func (e Ending) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// ByEnding is a count per Ending, indexed by Ending. It marshals to JSON as
// an object keyed by Ending.String, without EndingNone.
type ByEnding [NumEndings]int64

// MarshalJSON writes {"429": n, "5xx": n, …}.
func (b ByEnding) MarshalJSON() ([]byte, error) {
	m := make(map[string]int64, NumEndings-1)
	for e := Ending(1); e < NumEndings; e++ {
		m[e.String()] = b[e]
	}
	return json.Marshal(m)
}

// GapUnknown is the Result.Gap and Result.SincePrev of a retry whose
// previous attempt had not ended (EndingInFlight: the overlap is not known
// when Begin returns, and it is not a backoff) or was never seen
// (EndingUnknown).
const GapUnknown time.Duration = -1

// Outcome is how an attempt ended, passed to Tracker.End. It holds only
// values. Token counts are the engine's usage, or the proxy's estimate;
// -1 (or any negative value) means unknown and counts as 0 tokens.
type Outcome struct {
	Status          int  // status sent to the client; 0 if none was sent
	UpstreamTimeout bool // the proxy timed out waiting for the upstream
	// UpstreamError is set when the upstream was unreachable or broke the
	// response (proxy.ErrUpstreamBroken): it counts as a 5xx even after a
	// 200 went to the client, since a stream that breaks mid-way still
	// carries status 200.
	UpstreamError    bool
	ClientAbort      bool // the client went away before the response was delivered
	FirstTokenSeen   bool // at least one output token (reasoning, content or tool call) came from the upstream
	PromptTokens     int64
	CompletionTokens int64
	End              time.Time // the zero time means Config.Now() at the call
}

// ending classifies o. A client abort wins over everything else: whatever
// the upstream did, the client stopped listening first.
func (o *Outcome) ending() Ending {
	switch {
	case o.ClientAbort && o.FirstTokenSeen:
		return EndingClientAbortMidStream
	case o.ClientAbort:
		return EndingClientAbortBeforeFirstToken
	case o.UpstreamTimeout:
		return EndingUpstreamTimeout
	case o.UpstreamError, o.Status >= 500 && o.Status <= 599:
		return Ending5xx
	case o.Status == 429:
		return Ending429
	case o.Status >= 200 && o.Status <= 299:
		return EndingSuccess
	case o.Status >= 400 && o.Status <= 499:
		return EndingOther4xx
	}
	return EndingUnknown
}

// tokens returns o's prompt and completion tokens, unknown counted as 0.
func (o *Outcome) tokens() (prompt, completion int64) {
	return max(o.PromptTokens, 0), max(o.CompletionTokens, 0)
}

// abandoned is the engine work lost when o's attempt is followed by a
// retry: work done for a response the client never got.
//
//   - A client abort before the first token wastes the prefill (the prompt
//     tokens, when known; usage rarely arrives that early).
//   - A client abort mid-stream wastes the prefill and every token
//     generated so far.
//   - An upstream failure (5xx, broken stream, timeout) after tokens flowed
//     wastes the same; before the first token we cannot tell whether the
//     prefill ran, so it counts 0.
//   - A 429 and a 4xx did no engine work. A success was read by the
//     client: the waste is the retry itself, charged when it ends.
func (o *Outcome) abandoned(e Ending) (prompt, completion int64) {
	p, c := o.tokens()
	switch e {
	case EndingClientAbortBeforeFirstToken:
		return p, 0
	case EndingClientAbortMidStream:
		return p, c
	case Ending5xx, EndingUpstreamTimeout:
		if o.FirstTokenSeen {
			return p, c
		}
	}
	return 0, 0
}

// superseded is the work lost by an attempt that a retry overtook while it
// was in flight: the client had already given up on it, so even a
// successful response went to nobody (for concurrent duplicates, one of the
// two responses is the waste, and we charge the older one).
func (o *Outcome) superseded(e Ending) (prompt, completion int64) {
	if e == EndingSuccess {
		return o.tokens()
	}
	return o.abandoned(e)
}
