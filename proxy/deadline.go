package proxy

import "time"

// idleDeadline renews a connection's idle deadline coarsely. Setting a
// deadline takes the runtime's timer locks, and the relay would otherwise
// set two per event (the upstream read, the client write): about 5% of the
// proxy's CPU. Instead the deadline is set slack past the idle timeout and
// renewed only once slack has passed since the last renewal, so that it
// still never fires less than the idle timeout after the last read or
// write, and at most slack later than that.
//
// An idleDeadline belongs to whoever owns the connection's reads (or
// writes) at the time; it is not safe for concurrent use.
type idleDeadline struct {
	renewed time.Time // when the deadline was last set; zero: not set by this
}

// renewSlack is the renewal granularity for an idle timeout d: a second,
// or an eighth of d for timeouts under 8 s, so that a short timeout keeps
// its meaning (tests, and operators who set one).
func renewSlack(d time.Duration) time.Duration { return min(time.Second, d/8) }

// next returns the deadline to set at now for the idle timeout d, and
// false when the one in force is recent enough to keep.
func (l *idleDeadline) next(now time.Time, d time.Duration) (time.Time, bool) {
	slack := renewSlack(d)
	if !l.renewed.IsZero() && now.Sub(l.renewed) < slack {
		return time.Time{}, false
	}
	l.renewed = now
	return now.Add(d + slack), true
}

// set reports whether a deadline was set since the last clear.
func (l *idleDeadline) set() bool { return !l.renewed.IsZero() }

// clear forgets the deadline, which the caller has just removed or which
// someone else has replaced: the next call to next sets one.
func (l *idleDeadline) clear() { l.renewed = time.Time{} }
