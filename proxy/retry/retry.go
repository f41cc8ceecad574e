// Package retry measures client retry amplification: how much of the
// engine's load is clients re-sending a request they already sent
// (docs/design.md "Retries"). Gateways count only their own upstream retries; a
// Tracker sees the client's, links each retry to the attempt it replaces,
// and reports what ended that attempt, the client's backoff, and the
// engine tokens spent on responses nobody read.
//
// # Identity
//
// A client is a keyed hash (hash/maphash, random seed per Tracker) of its
// Authorization value, its x-api-key value, its IP address without the
// port, and its User-Agent. The port is left out because SDK retries often
// come on a new connection: a timeout closes the old one. Raw credentials
// are hashed during Begin and never stored; maphash is not a MAC, but the
// key never leaves the process and API keys are high-entropy. Agents that
// share all four (same host, no key, same SDK) are one client. Behind a
// load balancer, pass the forwarded client address as RemoteIP.
//
// # Retries
//
// An attempt is a retry when the same client sends the same body within
// Config.Window of the last activity of an earlier attempt (its start or
// its end; an attempt still in flight is always active), or when it
// carries X-Stainless-Retry-Count > 0. The body is hashed as raw bytes,
// not normalized JSON: SDKs and HTTP clients re-send the bytes they
// serialized once, and hashing raw bytes costs ~10 µs per 100 KiB where
// parsing would cost milliseconds and allocate. A client that re-serializes
// with a different key order is therefore not caught by body (it is by
// header if it is an SDK). A deliberate identical request (sampling the
// same prompt twice) cannot be told from a duplicate and counts as one.
//
// # Waste
//
// Waste is charged once, when both facts are known: that an attempt's
// response went unread, and how many tokens it cost. See End.
package retry

import (
	"hash/maphash"
	"sync"
	"time"
)

// Defaults for the zero Config.
const (
	DefaultWindow   = 10 * time.Minute
	DefaultMaxBytes = 16 << 20
)

// Config configures a Tracker. The zero Config is usable.
type Config struct {
	// Window is how long after an attempt's last activity a same-body
	// request from the same client still counts as a retry, and the span of
	// the rolling aggregates. 0 (or negative) means DefaultWindow.
	Window time.Duration
	// MaxBytes caps the memory of the dedup index (3/4 of it) and of the
	// per-client counts (1/4), counted exactly: both are arrays the Tracker
	// sizes itself. They grow on demand; at the cap, the least recently
	// active element is evicted. The default holds about 109k logical
	// requests and 9.1k clients; each part holds at least 64. While an
	// array grows (by doubling), the old one is garbage until the next GC.
	// 0 (or negative) means DefaultMaxBytes.
	MaxBytes int64
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Tracker links retries to earlier attempts and keeps the aggregates. It
// is safe for concurrent use; each call holds one mutex for a few map
// operations, and hashing is done outside it.
type Tracker struct {
	window, slotWidth time.Duration
	maxBytes          int64
	now               func() time.Time
	seed              maphash.Seed
	base              time.Time // offsets (time.Duration) count from here

	mu          sync.Mutex
	entries     table[entryKey, entry]
	clients     table[ClientID, client]
	nextLogical uint64
	total       ring
	st          counters
}

// New returns a Tracker with a fresh random hash key.
func New(cfg Config) *Tracker {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Tracker{
		window:    cfg.Window,
		slotWidth: max(cfg.Window/ringSlots, 1),
		maxBytes:  cfg.MaxBytes,
		now:       cfg.Now,
		seed:      maphash.MakeSeed(),
		base:      cfg.Now(),
		entries:   newTable[entryKey, entry](cfg.MaxBytes - cfg.MaxBytes/clientShare),
		clients:   newTable[ClientID, client](cfg.MaxBytes / clientShare),
	}
	t.total.reset()
	return t
}

// Request is what Begin needs from an inference request. Its slices are
// borrowed during the call only (fasthttp Peek values are fine) and are
// never retained.
type Request struct {
	Auth      []byte // the Authorization header value
	APIKey    []byte // the x-api-key header value (Anthropic)
	RemoteIP  []byte // the client's IP without the port, as net.IP bytes or text; use one form throughout
	UserAgent []byte
	// Body is the request body as received. An empty body is never matched
	// by body: call Begin for inference requests only.
	Body []byte
	// RetryHeader is the X-Stainless-Retry-Count value (ParseRetryCount);
	// -1 when absent. Only a value above 0 marks a retry.
	RetryHeader int
	Start       time.Time // the zero time means Config.Now() at the call
}

// Result describes one attempt. It holds only values (the unexported
// fields are hashes), so copying it is always safe; keep it with the
// request and pass a pointer to End.
type Result struct {
	ClientID  ClientID
	LogicalID uint64 // from 1, unique per Tracker; shared by an attempt and its retries
	Attempt   int    // 0 for a first attempt; for a retry the previous Attempt + 1, or the header's count if larger
	Retry     bool   // Attempt > 0: found by body or by header
	ByHeader  bool   // X-Stainless-Retry-Count > 0
	// PrevOutcome is what ended the attempt this one retries (EndingNone
	// for a first attempt).
	PrevOutcome Ending
	// Gap is the time from the previous attempt's end to this one's start:
	// the client's backoff. GapUnknown when the previous attempt was in
	// flight or never seen; 0 when its end was stamped after this start.
	Gap time.Duration
	// SincePrev is the time from the previous attempt's start to this
	// one's start; for EndingInFlight, how long the client waited before
	// giving up. GapUnknown when the previous attempt was never seen.
	SincePrev time.Duration
	// Engine tokens wasted, charged to this Result by Begin or End (see
	// End); their sums over all Results are Stats' Wasted counts.
	WastedPrompt     int64
	WastedCompletion int64

	key   entryKey // zero without a body
	seq   uint32   // entry.seq of this attempt
	ended bool     // End was called
}

// Begin records the start of an attempt, after the body is read and before
// it is forwarded, and says whether it is a retry and of what.
func (t *Tracker) Begin(r Request) Result {
	start := r.Start
	if start.IsZero() {
		start = t.now()
	}
	res := Result{ClientID: t.clientID(&r), Gap: GapUnknown, SincePrev: GapUnknown, ByHeader: r.RetryHeader > 0}
	if len(r.Body) > 0 {
		res.key = entryKey{res.ClientID, maphash.Bytes(t.seed, r.Body)}
	}
	at := start.Sub(t.base)
	ep := t.epoch(at)

	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(at)
	c := t.client(res.ClientID, at)
	var n *tnode[entryKey, entry]
	if len(r.Body) > 0 {
		n = t.lookup(res.key, at)
	}
	newLogical := n == nil
	if n != nil {
		// A retry of a known attempt: say how that one ended, then make
		// this one the latest.
		e := &n.val
		res.Retry, res.LogicalID = true, e.logical
		res.Attempt = max(int(e.attempt)+1, r.RetryHeader)
		res.SincePrev = max(at-e.start, 0)
		res.PrevOutcome = EndingInFlight
		if e.ended {
			res.PrevOutcome, res.Gap = e.ending, max(at-e.end, 0)
			res.WastedPrompt, res.WastedCompletion = e.pendPrompt, e.pendCompletion
		}
		t.total.moveLogical(t.epoch(e.start), ep)
		c.ring.moveLogical(t.epoch(e.start), ep)
		t.entries.touch(n, at)
	} else {
		t.nextLogical++
		res.LogicalID = t.nextLogical
		if r.RetryHeader > 0 {
			// Its earlier attempts went elsewhere, or before the window.
			res.Retry, res.Attempt, res.PrevOutcome = true, r.RetryHeader, EndingUnknown
		}
		if len(r.Body) > 0 {
			n = t.addEntry(res.key, at)
			n.val.logical = res.LogicalID
		}
	}
	if n != nil {
		n.val.seq++
		res.seq = n.val.seq
		n.val.attempt, n.val.start, n.val.ended = int32(res.Attempt), at, false
		n.val.pendPrompt, n.val.pendCompletion = 0, 0
	}
	t.count(&res, c, ep, newLogical)
	return res
}

// count adds the attempt res to the counters and rolling windows.
func (t *Tracker) count(res *Result, c *client, ep int64, newLogical bool) {
	d := slot{attempts: 1, wasted: res.WastedPrompt + res.WastedCompletion}
	t.st.attempts++
	if newLogical {
		t.st.logical++
		d.logical = 1
	}
	if res.Retry {
		t.st.retries++
		t.st.retriesBy[res.PrevOutcome]++
		d.retries = 1
	}
	if res.ByHeader {
		t.st.byHeader++
	}
	t.st.wastedPrompt += res.WastedPrompt
	t.st.wastedCompletion += res.WastedCompletion
	t.total.add(ep, d)
	c.ring.add(ep, d)
}

// End records how the attempt r ended, for the retry that may follow,
// and charges to r the tokens it is now known to have wasted:
//
//   - an attempt that retried a success (a duplicate) wastes all its own
//     tokens: the client had its answer already;
//   - an attempt that a retry overtook while it was in flight
//     (EndingInFlight) wastes its own work, a success included: the
//     client had stopped waiting for it;
//   - otherwise nothing yet. If a retry follows, Begin charges the retry
//     with this attempt's abandoned work: the prompt after a client abort
//     before the first token; prompt and completion after an abort or an
//     upstream failure mid-stream; nothing after a 429, a 4xx, a success,
//     or a failure before the first token. An abandoned attempt that no
//     retry follows is an abort, not amplification, and is not counted.
//
// End must be called once per Begin; later calls are ignored, as is a
// Result that Begin did not return. An attempt whose index entry was
// evicted for space charges nothing.
func (t *Tracker) End(r *Result, o Outcome) {
	if r.LogicalID == 0 || r.ended {
		return
	}
	r.ended = true
	end := o.End
	if end.IsZero() {
		end = t.now()
	}
	at := end.Sub(t.base)
	ending := o.ending()

	t.mu.Lock()
	defer t.mu.Unlock()
	var n *tnode[entryKey, entry]
	if r.seq != 0 { // it has an index entry
		n = t.entries.get(r.key)
	}
	if n != nil && n.val.logical != r.LogicalID {
		n = nil // expired, and the body sent again as a new logical request
	}
	var p, c int64
	switch {
	case n != nil && n.val.seq != r.seq:
		p, c = o.superseded(ending)
	case r.PrevOutcome == EndingSuccess:
		p, c = o.tokens()
	}
	if n != nil && n.val.seq == r.seq {
		e := &n.val
		e.ended, e.end, e.ending = true, at, ending
		e.pendPrompt, e.pendCompletion = o.abandoned(ending)
		if p|c != 0 {
			e.pendPrompt, e.pendCompletion = 0, 0 // charged here already
		}
		t.entries.touch(n, at)
	}
	if p|c == 0 {
		return
	}
	r.WastedPrompt += p
	r.WastedCompletion += c
	t.st.wastedPrompt += p
	t.st.wastedCompletion += c
	if cn := t.clients.get(r.ClientID); cn != nil {
		cn.val.ring.add(t.epoch(at), slot{wasted: p + c})
	}
}

// epoch is the rolling-window slot of the offset at.
func (t *Tracker) epoch(at time.Duration) int64 {
	q := int64(at / t.slotWidth)
	if at%t.slotWidth < 0 {
		q-- // floor, for stamps before base
	}
	return q
}
