package prefix

import (
	"sync"
	"time"
)

// DefaultMaxWorkBytes bounds the canonical copies that Observe calls in
// progress hold together.
const DefaultMaxWorkBytes = 128 << 20

// workIdle is how long large canonical buffers are kept for reuse after the
// last Observe that needed one.
const workIdle = 30 * time.Second

// workBudget bounds the working memory of concurrent Observe calls on large
// bodies: each canonicalizes its body into a buffer about 9/8 of the body's
// size, so eight 57 MiB prompts at once would otherwise add half a gigabyte
// to the bodies themselves, and as much garbage again. A call waits until
// its share fits (one larger than the whole budget runs when it is alone),
// and takes its buffer from the budget, which keeps the large buffers for
// reuse until it has been idle for workIdle. It is safe for concurrent use.
type workBudget struct {
	mu    sync.Mutex
	cond  sync.Cond
	max   int64
	inUse int64
	free  [][]byte
	idle  *time.Timer
}

func newWorkBudget(max int64) *workBudget {
	w := &workBudget{max: max}
	w.cond.L = &w.mu
	return w
}

// acquire waits for n bytes of the budget and returns a buffer with at
// least that capacity.
func (w *workBudget) acquire(n int) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.inUse > 0 && w.inUse+int64(n) > w.max {
		w.cond.Wait()
	}
	w.inUse += int64(n)
	for i, b := range w.free {
		if cap(b) >= n {
			w.free = append(w.free[:i], w.free[i+1:]...)
			return b[:0]
		}
	}
	if len(w.free) > 0 { // too small: make room for one that fits
		w.free = w.free[1:]
	}
	return make([]byte, 0, n)
}

// release gives back n bytes of the budget and the buffer b.
func (w *workBudget) release(n int, b []byte) {
	w.mu.Lock()
	w.inUse -= int64(n)
	if b != nil {
		w.free = append(w.free, b[:0])
		if w.idle == nil {
			w.idle = time.AfterFunc(workIdle, w.drop)
		} else {
			w.idle.Reset(workIdle)
		}
	}
	w.mu.Unlock()
	w.cond.Broadcast()
}

// drop lets the kept buffers go, once no Observe has needed one for a while.
func (w *workBudget) drop() {
	w.mu.Lock()
	clear(w.free)
	w.free = w.free[:0]
	w.mu.Unlock()
}
