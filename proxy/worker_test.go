package proxy

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWorkerPool: a task runs on an idle worker when there is one, a new
// one when there is none, and a worker idle for workerIdle exits.
func TestWorkerPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var wp workerPool
		idle := func() int {
			wp.mu.Lock()
			defer wp.mu.Unlock()
			return len(wp.idle)
		}
		ran := make(chan int, 4)
		wp.run(func() { ran <- 1 })
		require.Equal(t, 1, <-ran)
		synctest.Wait()
		require.Equal(t, 1, idle(), "the worker waits for the next task")

		// Two tasks at once: the idle worker takes one, a new worker the other.
		block := make(chan struct{})
		wp.run(func() { <-block; ran <- 2 })
		synctest.Wait()
		assert.Equal(t, 0, idle(), "the idle worker took the task")
		wp.run(func() { ran <- 3 })
		assert.Equal(t, 3, <-ran)
		close(block)
		assert.Equal(t, 2, <-ran)
		synctest.Wait()
		require.Equal(t, 2, idle())

		time.Sleep(workerIdle - time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 2, idle(), "not idle for workerIdle yet")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 0, idle(), "idle workers exit")
		// synctest.Test fails if a worker's goroutine is still running.
	})
}
