package sim

import (
	"context"
	"slices"
	"time"
)

// reservation is one prefill's turn on the engine's compute in the
// in-order mode (SharedPrefill without the lock): it computes from the
// end of the turn before it, or from its own start if that is later, for
// its solo time. Server.mu guards it; its waiter follows end through
// moved.
type reservation struct {
	start time.Time     // its prefill began
	solo  time.Duration // its prefill alone
	from  time.Time     // it begins to compute
	end   time.Time     // it will have computed
	moved chan struct{} // closed, and replaced, when end moves
}

// reserve queues the compute of a prefill that begins at start and takes
// solo alone, behind the ones begun before it. The caller holds s.mu.
func (s *Server) reserve(start time.Time, solo time.Duration) *reservation {
	from := start
	if n := len(s.computing); n > 0 && s.computing[n-1].end.After(from) {
		from = s.computing[n-1].end
	}
	r := &reservation{start: start, solo: solo, from: from, end: from.Add(solo), moved: make(chan struct{})}
	s.computing = append(s.computing, r)
	return r
}

// shorten ends r's compute at end (an abandoned prefill that stops early)
// and moves the later turns back to where the rule puts them now, waking
// their waiters. The later turns have not begun to compute: they start at
// or after r's old end, which is still ahead. The caller holds s.mu.
func (s *Server) shorten(r *reservation, end time.Time) {
	r.end = end
	i := slices.Index(s.computing, r)
	prev := end
	for _, e := range s.computing[i+1:] {
		from := e.start
		if prev.After(from) {
			from = prev
		}
		if !from.Equal(e.from) {
			e.from, e.end = from, from.Add(e.solo)
			close(e.moved)
			e.moved = make(chan struct{})
		}
		prev = e.end
	}
}

// unreserve drops r once its compute is over. Ends only grow along
// s.computing, so the last turn stays the one a new prefill queues behind.
// The caller holds s.mu.
func (s *Server) unreserve(r *reservation) {
	s.computing = slices.DeleteFunc(s.computing, func(e *reservation) bool { return e == r })
}

// awaitTurn sleeps until r's compute ends, following its end as turns
// before it shorten; it returns ctx's error if the client leaves first.
func (s *Server) awaitTurn(ctx context.Context, timer *time.Timer, r *reservation) error {
	for {
		s.mu.Lock()
		end, moved := r.end, r.moved
		s.mu.Unlock()
		d := time.Until(end)
		if d <= 0 {
			return ctx.Err()
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
			return nil
		case <-moved:
			timer.Stop() // Go ≥ 1.23: the next Reset leaves no stale tick
		}
	}
}

// prefillInOrder is prefill in the in-order mode: res's compute waits for
// the prefills begun before it. A client that leaves is judged by the work
// its prefill actually did (none while it waited its turn): under
// AbandonStop and AbandonBatch its turn shrinks to that work, and the
// later ones move up; under AbandonPrompt it keeps its whole turn.
func (s *Server) prefillInOrder(ctx context.Context, timer *time.Timer, j *job, res *result, k int, start time.Time, solo time.Duration) error {
	s.mu.Lock()
	r := s.reserve(start, solo)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.unreserve(r)
		s.mu.Unlock()
	}()
	if s.awaitTurn(ctx, timer, r) == nil {
		return nil
	}
	err := s.abort(j, res, PhasePrefill)
	res.left = time.Now()
	s.mu.Lock()
	from := r.from
	progress := max(0, res.left.Sub(from))
	var until time.Duration
	done := 0
	if progress > 0 || s.cfg.Abandon == AbandonPrompt {
		until, done = s.abandonedUntil(j, res, progress)
	}
	end := from.Add(until)
	if s.cfg.Abandon != AbandonPrompt {
		r.solo = until // what a later reflow must leave it
		s.shorten(r, end)
	}
	s.mu.Unlock()
	if until == 0 {
		end = res.left // it never computed: nothing to finish
	}
	s.runOnUntil(j, res, k, end, done)
	return err
}
