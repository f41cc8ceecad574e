package proxy

import (
	"slices"
	"sync"
	"time"
)

// workerIdle is how long a worker waits for its next task before it
// exits: fasthttp's own worker pool keeps idle workers as long
// (MaxIdleWorkerDuration's default).
const workerIdle = 10 * time.Second

// workers runs the event loop's hand-offs (a stream's finish, its report)
// on goroutines kept between tasks, as fasthttp serves connections. A
// fresh goroutine per task starts on a small stack and grows it, a copy
// at each doubling, in every Record and in the prefix tracker's parse:
// 4% of the proxy's CPU at 256 streams of 10 events (BENCHMARKS.md
// "Session 21"). A kept worker has grown its stack once.
var workers workerPool

// A workerPool hands tasks to idle workers, newest first (its stack is
// the warmest), and starts a worker when none is idle. A worker idle for
// workerIdle exits. Safe for concurrent use.
type workerPool struct {
	mu   sync.Mutex
	idle []*worker
}

type worker struct {
	pool  *workerPool
	task  chan func() // one slot: the hand-off never blocks
	timer *time.Timer
}

// run calls f on a worker; f owns what it was given from then on.
func (wp *workerPool) run(f func()) {
	wp.mu.Lock()
	if n := len(wp.idle); n > 0 {
		w := wp.idle[n-1]
		wp.idle[n-1] = nil
		wp.idle = wp.idle[:n-1]
		wp.mu.Unlock()
		w.task <- f
		return
	}
	wp.mu.Unlock()
	w := &worker{pool: wp, task: make(chan func(), 1), timer: time.NewTimer(workerIdle)}
	w.timer.Stop() // armed by wait
	go w.serve(f)
}

// serve runs f and then each task handed to w until it idles out.
func (w *worker) serve(f func()) {
	for f != nil {
		f()
		f = w.wait()
	}
}

// wait puts w in the idle list and returns its next task, or nil once it
// left the list idle for workerIdle. A worker taken from the list as its
// timer fired gets the task it was taken for.
func (w *worker) wait() func() {
	wp := w.pool
	wp.mu.Lock()
	wp.idle = append(wp.idle, w)
	wp.mu.Unlock()
	w.timer.Reset(workerIdle)
	select {
	case f := <-w.task:
		w.timer.Stop()
		return f
	case <-w.timer.C:
	}
	wp.mu.Lock()
	for i, x := range wp.idle {
		if x == w {
			wp.idle = slices.Delete(wp.idle, i, i+1)
			wp.mu.Unlock()
			return nil
		}
	}
	wp.mu.Unlock()
	return <-w.task // taken meanwhile: its task is on the way
}
