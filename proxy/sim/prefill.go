package sim

import (
	"context"
	"time"
)

// AbandonMode is what the engine does with a prefill whose client left.
type AbandonMode int

const (
	// AbandonAuto is the Engine's choice.
	AbandonAuto AbandonMode = iota
	// AbandonStop stops at once and frees the slot, as vLLM aborts a
	// request at its next step.
	AbandonStop
	// AbandonBatch finishes the Config.BatchTokens batch the prefill is on,
	// then frees the slot, as llama.cpp does (2,048 tokens by default).
	AbandonBatch
	// AbandonPrompt prefills the whole prompt before the slot is free, as
	// ollama's runner does (3–16 s measured for 3–5k tokens on CPU).
	AbandonPrompt
)

var abandonNames = enumText[AbandonMode]{"auto", "stop", "batch", "prompt"}

// String returns "auto", "stop", "batch" or "prompt".
func (m AbandonMode) String() string { return abandonNames.text(m) }

// MarshalText implements encoding.TextMarshaler.
func (m AbandonMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (flag.TextVar).
func (m *AbandonMode) UnmarshalText(b []byte) error {
	return abandonNames.parse("abandon mode", b, m)
}

// LockMode is whether a slot can start while another request's prefill is
// computing.
type LockMode int

const (
	// LockAuto is the Engine's choice.
	LockAuto LockMode = iota
	// LockNone starts a request on a free slot at once, whatever the other
	// slots do (vLLM's scheduler admits between steps; llama-server's
	// slots are taken in its loop between batches of a few ms).
	LockNone
	// LockPrefill holds one engine lock for the whole prefill in progress:
	// a request finds its free slot only when every prefill under way has
	// ended, and all the requests waiting then take theirs together. It is
	// ollama's llamarunner, whose processBatch holds the runner mutex for
	// the llama_decode of a batch (≤ 512 tokens: a prompt that size is one
	// batch) that its completion handler needs to take a slot
	// (/work/wt/realengine-findings.md: three requests of a burst on four
	// free slots waited 1.1 s for the first one's prefill). The sim holds
	// it for the whole prefill, whatever its length.
	LockPrefill
)

var lockNames = enumText[LockMode]{"auto", "none", "prefill"}

// String returns "auto", "none" or "prefill".
func (m LockMode) String() string { return lockNames.text(m) }

// MarshalText implements encoding.TextMarshaler.
func (m LockMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (flag.TextVar).
func (m *LockMode) UnmarshalText(b []byte) error { return lockNames.parse("lock mode", b, m) }

// unlockPrefill ends a prefill that held the engine's lock (BatchLock
// LockPrefill) and hands the free slots to the queue.
func (s *Server) unlockPrefill(res *result) {
	if !res.locked {
		return
	}
	res.locked = false
	s.mu.Lock()
	s.prefilling--
	s.dispatch()
	s.mu.Unlock()
}

// prefillTime is how long the first n of res's new prompt tokens take to
// prefill: the fixed overhead, then per token 1/PrefillTokensPerSec grown
// by Config.ContextSlowdown for every 1,000 tokens of context it attends
// to (the cached prefix and the new tokens before it):
//
//	(n + g·(cached·n + n²/2)/1000) / rate
//
// X-Sim-Prefill instead fixes the whole prefill, spread evenly over the
// new tokens.
func (s *Server) prefillTime(j *job, res *result, n int) time.Duration {
	fresh := res.promptTokens - res.cachedTokens // >= 1: leaveOne
	if j.knobs.prefill >= 0 {
		return time.Duration(int64(j.knobs.prefill) * int64(n) / int64(fresh))
	}
	g := max(0, s.cfg.ContextSlowdown)
	work := float64(n) + g*(float64(res.cachedTokens)*float64(n)+float64(n)*float64(n)/2)/1000
	return prefillOverhead + time.Duration(work/s.cfg.PrefillTokensPerSec*float64(time.Second))
}

// abandonedUntil returns how far into the prefill (from its start) the
// engine goes on for a client that left elapsed into it, and the new tokens
// prefilled by then.
func (s *Server) abandonedUntil(j *job, res *result, elapsed time.Duration) (time.Duration, int) {
	fresh := res.promptTokens - res.cachedTokens
	switch s.cfg.Abandon {
	case AbandonPrompt:
		return s.prefillTime(j, res, fresh), fresh
	case AbandonBatch:
		b := s.cfg.BatchTokens
		n := min(b, fresh)
		for n < fresh && s.prefillTime(j, res, n) <= elapsed {
			n = min(n+b, fresh)
		}
		return s.prefillTime(j, res, n), n
	}
	// Stop: what was done by then, to the last whole token.
	n := 0
	for n < fresh && s.prefillTime(j, res, n+1) <= elapsed {
		n++
	}
	return elapsed, n
}

// prePrefill is the work on slot k before res's prompt can be prefilled:
// with per-slot caches and llama.cpp's RAM prompt cache (Config.SwitchCost
// > 0), a slot whose resident prompt the new one would overwrite saves it
// to the RAM cache first, and a prompt the RAM cache holds a longer prefix
// of than the slot is restored from it; each costs SwitchCost. It sets
// res.cachedTokens to what the slot, or the restore, serves. The caller
// holds s.mu.
func (s *Server) prePrefill(k int, hs []uint64, res *result) time.Duration {
	res.cachedTokens = s.reuse(k, hs, res.promptTokens)
	if s.cfg.Cache != CacheSlot || s.cfg.SwitchCost <= 0 {
		return 0
	}
	var work time.Duration
	resident := s.slots[k].resident
	restored := s.cache.match(hs, res.promptTokens)
	if len(resident) > 0 && commonPrefix(resident, hs) < len(resident) {
		s.cache.insert(resident) // saved before it is overwritten
		work += s.cfg.SwitchCost
	}
	if restored > res.cachedTokens {
		res.cachedTokens = restored
		work += s.cfg.SwitchCost
	}
	return work
}

// runOn keeps the slot of a request whose client left at left during its
// prefill busy until the work the engine does anyway is done
// (Config.Abandon), and records what the slot holds then. scale is how
// much slower than alone its prefill runs (SharedPrefill under the lock:
// its shared time over its solo time; 1 alone): the run-on shares the
// engine as the prefill did, so its work, judged in solo time, takes scale
// times as long. ctx is done; the wait is not cancellable, as the
// engine's is not.
func (s *Server) runOn(j *job, res *result, k int, left, prefillStart time.Time, scale float64) {
	res.left = left
	elapsed := time.Duration(float64(max(0, left.Sub(prefillStart))) / scale)
	until, done := s.abandonedUntil(j, res, elapsed)
	s.runOnUntil(j, res, k, prefillStart.Add(time.Duration(float64(until)*scale)), done)
}

// runOnUntil keeps slot k busy for nobody until release, then records
// the done new tokens as what the slot holds. res.left is set.
func (s *Server) runOnUntil(j *job, res *result, k int, release time.Time, done int) {
	if d := time.Until(release); d > 0 {
		time.Sleep(d)
	}
	res.abandoned = time.Since(res.left)
	if s.cfg.Cache == CacheSlot {
		blocks := (res.cachedTokens + done) / s.cfg.CacheBlockTokens
		s.mu.Lock()
		s.keep(k, j.hashes[:min(blocks, len(j.hashes))])
		s.mu.Unlock()
	}
}

// prefill waits out res's prefill from start; if the client leaves first
// it records the abort at once, runs on as the engine would and returns
// errClientGone.
func (s *Server) prefill(ctx context.Context, timer *time.Timer, j *job, res *result, k int, start time.Time) error {
	fresh := res.promptTokens - res.cachedTokens
	defer s.unlockPrefill(res) // an abandoned prefill holds the lock while it runs on
	solo := s.prefillTime(j, res, fresh)
	if s.cfg.SharedPrefill && s.cfg.BatchLock != LockPrefill {
		return s.prefillInOrder(ctx, timer, j, res, k, start, solo)
	}
	d, g := solo, res.group
	shared := false
	if g != nil {
		s.mu.Lock()
		g.add(d)
		s.mu.Unlock()
		select {
		case <-g.done: // the others register as they start, microseconds apart
			d, shared = g.shared(d), true
		case <-ctx.Done(): // the sleep below ends at once
		}
	}
	if sleepUntil(ctx, timer, start.Add(d)) != nil {
		err := s.abort(j, res, PhasePrefill)
		left := time.Now()
		if g != nil && !shared {
			// The others count its whole prefill in their shares: it runs
			// on in their batches, at the shared speed.
			<-g.done
			d = g.shared(d)
		}
		scale := 1.0
		if solo > 0 {
			scale = max(1, float64(d)/float64(solo))
		}
		s.runOn(j, res, k, left, start, scale)
		return err
	}
	return nil
}
