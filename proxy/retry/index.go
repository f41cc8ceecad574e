package retry

import "time"

// entryKey identifies a request body sent by one client: the dedup key.
type entryKey struct {
	client ClientID
	body   uint64 // keyed hash of the raw body bytes
}

// Both halves are keyed hashes already.
func (k entryKey) hash() uint64 { return k.body ^ uint64(k.client) }

func (id ClientID) hash() uint64 { return uint64(id) }

// entry is the dedup index's record of a logical request: its latest
// attempt, which is what the next retry links to.
type entry struct {
	logical uint64
	seq     uint32 // attempts seen; identifies the latest one (Result.seq)
	attempt int32  // Result.Attempt of the latest attempt
	ending  Ending // how the latest attempt ended, once ended
	ended   bool
	start   time.Duration // offsets from Tracker.base
	end     time.Duration
	// The latest attempt's abandoned work, charged to the next retry if one
	// comes (Outcome.abandoned).
	pendPrompt, pendCompletion int64
}

// client is one client's rolling counts, for TopClients.
type client struct {
	ring ring
}

// Config.MaxBytes is split between the dedup index and the client counts
// so that a flood of one kind cannot starve the other: a flood of bodies
// from one client must not leave TopClients blind, nor a flood of spoofed
// User-Agents empty the dedup index.
const clientShare = 4 // clients get 1/clientShare of MaxBytes

// lookup returns the live index entry for k, dropping it if it expired.
func (t *Tracker) lookup(k entryKey, at time.Duration) *tnode[entryKey, entry] {
	n := t.entries.get(k)
	if n != nil && t.idle(n.val.ended, n.last, at) {
		t.entries.remove(n)
		t.st.expired++
		return nil
	}
	return n
}

// idle reports whether an element last active at last is older than the
// window at at. An attempt in flight is active by definition: a client
// that times out after the SDK default of 600 s must still link its retry
// to it, and End always follows Begin.
func (t *Tracker) idle(ended bool, last, at time.Duration) bool {
	return ended && at-last > t.window
}

// expire drops the entries and clients idle for longer than the window.
// An entry in flight found at the tail is moved to the front instead, so
// the scan stops at the first live element and costs O(1) amortized.
func (t *Tracker) expire(at time.Duration) {
	for n := t.entries.at(t.entries.tail); n != nil && at-n.last > t.window; n = t.entries.at(t.entries.tail) {
		if !n.val.ended {
			t.entries.touch(n, at)
			continue
		}
		t.entries.remove(n)
		t.st.expired++
	}
	for n := t.clients.at(t.clients.tail); n != nil && t.idle(true, n.last, at); n = t.clients.at(t.clients.tail) {
		t.clients.remove(n)
	}
}

// addEntry inserts a new index entry, evicting the least recently used
// one when the index is at its budget.
func (t *Tracker) addEntry(k entryKey, at time.Duration) *tnode[entryKey, entry] {
	n, evicted := t.entries.add(k, at)
	if evicted {
		t.st.evicted++
	}
	return n
}

// client returns id's counts, created on first sight, and marks it active.
// The pointer is valid until the next call.
func (t *Tracker) client(id ClientID, at time.Duration) *client {
	n := t.clients.get(id)
	if n == nil {
		var evicted bool
		n, evicted = t.clients.add(id, at)
		if evicted {
			t.st.evictedClients++
		}
		n.val.ring.reset()
	}
	t.clients.touch(n, at)
	return &n.val
}
