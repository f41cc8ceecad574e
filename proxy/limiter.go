package proxy

import (
	"sync/atomic"
	"time"
)

// limiter is the optional local concurrency limit (--max-inflight). Set to
// the engine's slot count, it moves the engine's queue into the proxy,
// where the wait is exact (queue_source "limiter", docs/design.md "Queue vs prefill").
//
// Waiters are served in FIFO order: goroutines blocked sending on a Go
// channel are queued first come, first served. It is safe for concurrent use.
type limiter struct {
	slots    chan struct{}
	waiting  atomic.Int64
	maxQueue int64
	maxWait  time.Duration
}

func newLimiter(n, maxQueue int, maxWait time.Duration) *limiter {
	if n <= 0 {
		return nil
	}
	return &limiter{slots: make(chan struct{}, n), maxQueue: int64(maxQueue), maxWait: maxWait}
}

// acquire takes a slot. It returns why the request was refused, or 0: the
// queue is full (429, like an engine's own rejection), the wait exceeded
// maxWait (503), or the client left while waiting.
func (l *limiter) acquire(left <-chan struct{}) refusal {
	select {
	case l.slots <- struct{}{}:
		return 0
	default:
	}
	if l.waiting.Add(1) > l.maxQueue {
		l.waiting.Add(-1)
		return refuseQueueFull
	}
	defer l.waiting.Add(-1)
	t := time.NewTimer(l.maxWait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return 0
	case <-t.C:
		return refuseQueueWait
	case <-left:
		return refuseClientGone
	}
}

func (l *limiter) release() { <-l.slots }
