package proxy

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// The limiter is channels and a timer, so its waits run in a synctest
// bubble: time is virtual, a wait of maxWait is exactly maxWait, and
// synctest.Wait says when every waiter is blocked, so no test here sleeps
// to order anything.

// TestLimiterWaitIsExact: a waiter is refused exactly at maxWait, not a
// nanosecond sooner, and one that gets the slot within maxWait is admitted.
func TestLimiterWaitIsExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxWait = 250 * time.Millisecond
		l := newLimiter(1, 4, maxWait)
		require.Zero(t, l.acquire(nil), "a free slot is taken at once")

		start := time.Now()
		got := make(chan refusal, 1)
		go func() { got <- l.acquire(nil) }()
		synctest.Wait()
		require.Equal(t, int64(1), l.waiting.Load())
		time.Sleep(maxWait - time.Nanosecond)
		synctest.Wait()
		select {
		case r := <-got:
			t.Fatalf("refused (%v) after %v, before maxWait", r, time.Since(start))
		default:
		}
		time.Sleep(time.Nanosecond)
		require.Equal(t, refuseQueueWait, <-got)
		require.Equal(t, maxWait, time.Since(start))
		require.Zero(t, l.waiting.Load(), "a refused waiter leaves the queue")

		go func() { got <- l.acquire(nil) }()
		synctest.Wait()
		time.Sleep(maxWait / 2)
		l.release()
		require.Zero(t, <-got, "a slot freed within maxWait admits the waiter")
	})
}

// TestLimiterFIFO: waiters get slots in the order they came, and a full
// queue refuses at once.
func TestLimiterFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const waiters = 3
		l := newLimiter(1, waiters, time.Minute)
		require.Zero(t, l.acquire(nil))
		order := make(chan int, waiters)
		for i := range waiters {
			go func() {
				if l.acquire(nil) == 0 {
					order <- i
				}
			}()
			synctest.Wait() // waiter i is queued before i+1 comes
		}
		require.Equal(t, int64(waiters), l.waiting.Load())
		require.Equal(t, refuseQueueFull, l.acquire(nil), "past maxQueue")
		for want := range waiters {
			l.release()
			require.Equal(t, want, <-order)
		}
	})
}

// TestLimiterClientLeft: a waiter whose client leaves is refused at once
// and leaves the queue; the slot's holder is untouched.
func TestLimiterClientLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(1, 4, time.Minute)
		require.Zero(t, l.acquire(nil))
		left := make(chan struct{})
		got := make(chan refusal, 1)
		start := time.Now()
		go func() { got <- l.acquire(left) }()
		synctest.Wait()
		close(left)
		require.Equal(t, refuseClientGone, <-got)
		require.Zero(t, time.Since(start), "refused without waiting")
		require.Zero(t, l.waiting.Load())
		require.Len(t, l.slots, 1, "the holder keeps its slot")
	})
}
