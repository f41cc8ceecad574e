package retry

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// ringSlots is the resolution of the rolling window: the "last window"
// is the current slot and the nine before it, so it spans between 0.9 and
// 1 Window.
const ringSlots = 10

// slot holds the counts of one tenth of the window.
type slot struct {
	epoch                              int64 // which tenth: offset / slot width
	attempts, logical, retries, wasted int64
}

// ring is a rolling window of slots. A logical request is counted in the
// slot of its latest attempt only (moveLogical), so a sum over the window
// counts each logical request with an attempt in the window exactly once,
// however long its retries went on.
type ring [ringSlots]slot

func (r *ring) reset() {
	for i := range r {
		r[i] = slot{epoch: math.MinInt64}
	}
}

func (r *ring) slot(ep int64) *slot { return &r[((ep%ringSlots)+ringSlots)%ringSlots] }

// add adds d's counts to slot ep. Counts older than the slot's current
// epoch fell out of the window already and are dropped.
func (r *ring) add(ep int64, d slot) {
	s := r.slot(ep)
	if s.epoch > ep {
		return
	}
	if s.epoch < ep {
		*s = slot{epoch: ep}
	}
	s.attempts += d.attempts
	s.logical += d.logical
	s.retries += d.retries
	s.wasted += d.wasted
}

// moveLogical moves one logical request from slot from to slot to.
func (r *ring) moveLogical(from, to int64) {
	if from == to {
		return
	}
	if s := r.slot(from); s.epoch == from && s.logical > 0 {
		s.logical--
	}
	r.add(to, slot{logical: 1})
}

// sum adds up the slots of the window that ends with slot cur.
func (r *ring) sum(cur int64) (total slot) {
	for _, s := range r {
		if s.epoch > cur-ringSlots && s.epoch <= cur {
			total.attempts += s.attempts
			total.logical += s.logical
			total.retries += s.retries
			total.wasted += s.wasted
		}
	}
	return total
}

// counters are the Tracker's cumulative counts.
type counters struct {
	attempts, logical, retries, byHeader int64
	retriesBy                            ByEnding
	wastedPrompt, wastedCompletion       int64
	evicted, evictedClients, expired     int64
}

// Stats are a Tracker's aggregates: cumulative counters since New (for
// Prometheus counters), the rolling window, and the index's size.
// A Stats holds only values.
type Stats struct {
	Attempts int64 `json:"attempts"` // Begin calls
	// Logical counts logical requests: first attempts, plus retries whose
	// earlier attempts were not seen (EndingUnknown).
	Logical int64 `json:"logical"`
	Retries int64 `json:"retries"` // attempts with Result.Retry
	// ByHeader counts the retries that carried X-Stainless-Retry-Count > 0.
	// Retries − ByHeader were found by body alone: a plain client, or an
	// application retrying around an SDK that starts again at 0.
	ByHeader  int64    `json:"retries_by_header"`
	RetriesBy ByEnding `json:"retries_by_prev_outcome"` // by Result.PrevOutcome
	// Engine tokens spent on responses nobody read (see End): the sum of
	// Result.WastedPrompt and WastedCompletion over every Begin and End.
	WastedPrompt     int64 `json:"wasted_prompt_tokens"`
	WastedCompletion int64 `json:"wasted_completion_tokens"`

	// The last Window (to a tenth of it): attempts begun in it, logical
	// requests with at least one attempt in it, and their ratio, the
	// amplification (1 means no retries; 0 means no attempts).
	Window         time.Duration `json:"-"`
	WindowAttempts int64         `json:"window_attempts"`
	WindowLogical  int64         `json:"window_logical"`
	WindowRetries  int64         `json:"window_retries"`
	Amplification  float64       `json:"amplification"`

	// The dedup index: live logical requests, known clients, the bytes
	// allocated for both (at most MaxBytes), entries dropped for age, and
	// entries and clients evicted to fit (a sign MaxBytes is too small for
	// the traffic: a retry after its entry was evicted is a new logical
	// request).
	Entries        int   `json:"index_entries"`
	Clients        int   `json:"index_clients"`
	Bytes          int64 `json:"index_bytes"`
	MaxBytes       int64 `json:"index_max_bytes"`
	Expired        int64 `json:"index_expired"`
	Evicted        int64 `json:"index_evicted"`
	EvictedClients int64 `json:"index_evicted_clients"`
}

// Stats returns the current aggregates.
func (t *Tracker) Stats() Stats {
	cur := t.epoch(t.now().Sub(t.base))
	t.mu.Lock()
	s := Stats{
		Attempts: t.st.attempts, Logical: t.st.logical, Retries: t.st.retries, ByHeader: t.st.byHeader,
		RetriesBy: t.st.retriesBy, WastedPrompt: t.st.wastedPrompt, WastedCompletion: t.st.wastedCompletion,
		Entries: t.entries.len(), Clients: t.clients.len(), Bytes: t.entries.bytes() + t.clients.bytes(),
		Expired: t.st.expired, Evicted: t.st.evicted, EvictedClients: t.st.evictedClients,
	}
	w := t.total.sum(cur)
	t.mu.Unlock()
	s.Window, s.MaxBytes = t.window, t.maxBytes
	s.WindowAttempts, s.WindowLogical, s.WindowRetries = w.attempts, w.logical, w.retries
	s.Amplification = ratio(w.attempts, w.logical)
	return s
}

func ratio(attempts, logical int64) float64 {
	if logical <= 0 {
		return 0
	}
	return float64(attempts) / float64(logical)
}

// ClientStat is one client's counts over the last Window, as Stats'
// window fields. It holds only values and no credentials: ClientID is a
// keyed hash.
type ClientStat struct {
	ClientID      ClientID `json:"client"`
	Attempts      int64    `json:"attempts"`
	Logical       int64    `json:"logical"`
	Retries       int64    `json:"retries"`
	Amplification float64  `json:"amplification"`
	WastedTokens  int64    `json:"wasted_tokens"` // prompt plus completion, charged in the window
}

// TopClients returns up to n clients active in the last Window, highest
// amplification first (then most attempts, then ClientID). It scans every
// known client under the lock, so call it at snapshot cadence, not per
// request. The slice belongs to the caller.
func (t *Tracker) TopClients(n int) []ClientStat {
	if n <= 0 {
		return nil
	}
	cur := t.epoch(t.now().Sub(t.base))
	t.mu.Lock()
	out := make([]ClientStat, 0, t.clients.len())
	for c := t.clients.at(t.clients.head); c != nil; c = t.clients.at(c.next) {
		w := c.val.ring.sum(cur)
		if w.attempts == 0 {
			continue
		}
		out = append(out, ClientStat{ClientID: c.key, Attempts: w.attempts, Logical: w.logical,
			Retries: w.retries, WastedTokens: w.wasted})
	}
	t.mu.Unlock()
	for i := range out {
		out[i].Amplification = ratio(out[i].Attempts, out[i].Logical)
	}
	slices.SortFunc(out, func(a, b ClientStat) int {
		return cmp.Or(cmp.Compare(b.Amplification, a.Amplification), cmp.Compare(b.Attempts, a.Attempts),
			cmp.Compare(a.ClientID, b.ClientID))
	})
	return slices.Clone(out[:min(n, len(out))]) // release the rest
}
