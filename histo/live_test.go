package histo

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// TestLiveTableConcurrentPuts: two requests whose IDs share a slot (256
// apart) note their first outputs at the same moment while a reader scans.
// The reader must only ever see one request's stamps whole (each request's
// three stamps here are its ID in ms, +1, +2), and once both are done the
// count of occupied slots is back to 0, so that a scan's early stop still
// works. Without the writer's claim both writers took the empty slot
// (the count rose by 2 for 1) and their stores interleaved.
func TestLiveTableConcurrentPuts(t *testing.T) {
	base := time.Unix(1000, 0)
	l := &liveTable{base: base}
	traceOf := func(id uint64) *proxy.Trace {
		at := base.Add(time.Duration(id) * time.Millisecond)
		return &proxy.Trace{ID: id, Admit: at, Connect: time.Millisecond, FirstOutput: at.Add(2 * time.Millisecond)}
	}
	const rounds = 20000
	stop := make(chan struct{})
	var torn int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the reader, as liveAhead scans
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			x, _, ok := l.read(5, base, 1<<40)
			if ok && (x.arrive != x.admit+int64(time.Millisecond) || x.first != x.admit+2*int64(time.Millisecond)) {
				torn++
			}
		}
	}()
	for i := range uint64(rounds) {
		a, b := traceOf(5+liveRing*(2*i+1)), traceOf(5+liveRing*(2*i+2))
		var start, both sync.WaitGroup
		start.Add(1)
		both.Add(2)
		for _, tr := range []*proxy.Trace{a, b} {
			go func() {
				defer both.Done()
				start.Wait()
				l.put(tr, 0, 0)
			}()
		}
		start.Done()
		both.Wait()
		l.done(a.ID)
		l.done(b.ID)
		require.Zero(t, l.n.Load(), "round %d: the occupied count drifted", i)
	}
	close(stop)
	wg.Wait()
	require.Zero(t, torn, "a reader took stamps of two requests")
}

// TestLiveSlotClaimed: a first output that finds its slot claimed by
// another writer is dropped, leaving the writer's stamps and the count
// alone, and a reader skips the slot while it is being written.
func TestLiveSlotClaimed(t *testing.T) {
	base := time.Unix(1000, 0)
	l := &liveTable{base: base}
	at := base.Add(time.Second)
	l.slots[9].id.Store(liveWriting)
	l.slots[9].first.Store(42)
	l.put(&proxy.Trace{ID: 9, Admit: at, FirstOutput: at.Add(time.Millisecond)}, 0, 0)
	require.Equal(t, int64(42), l.slots[9].first.Load(), "the claimed slot's stamps are the writer's")
	require.Zero(t, l.n.Load())
	_, occupied, ok := l.read(9, base, 1<<40)
	require.True(t, occupied)
	require.False(t, ok, "being written: not read")

	l.slots[9].id.Store(0)
	l.put(&proxy.Trace{ID: 9, Admit: at, FirstOutput: at.Add(time.Millisecond)}, 0, 0)
	x, occupied, ok := l.read(9, base, 1<<40)
	require.True(t, occupied && ok)
	require.Equal(t, int64(time.Second+time.Millisecond), x.first)
	require.Equal(t, int64(1), l.n.Load())
	l.done(9)
	require.Zero(t, l.n.Load())
}

// TestLiveAheadByAdmitSeq: which requests in flight were counted at a
// request's admission is told by the proxy's numbers of their admissions,
// not by the t_admit stamps, which two requests admitted microseconds
// apart may carry in the other order. On one slot, a request in flight
// whose first output came after e's was served after e and is taken off
// the requests ahead, but only if the proxy counted it at e's admission:
// admitted before e by its number (though stamped 0.3 ms after), it is
// behind; admitted after (though stamped 0.3 ms before), it was never
// counted, and taking it off would lose one that was.
func TestLiveAheadByAdmitSeq(t *testing.T) {
	for _, c := range []struct {
		name       string
		xSeq       uint64
		xAdmit     float64
		wantBehind int
	}{
		{"counted, stamped after", 9, 10.3, 1},
		{"not counted, stamped before", 11, 9.7, 0},
		{"no numbers: by the stamps", 0, 9.7, 1},
	} {
		r, _, _ := newTest(t, Config{})
		first := served(0, 5, 6, 0) // puts the timeline's epoch
		r.Record(&first)
		x := served(c.xAdmit, 400, 500, 0)
		x.ID, x.AdmitSeq = 20, c.xSeq
		r.FirstOutput(&x)
		e := served(10, 200, 300, 1)
		e.ID, e.AdmitSeq = 21, 10
		if c.xSeq == 0 {
			e.AdmitSeq = 0
		}
		r.occ.mu.Lock()
		ent, ok := r.occ.entryOf(&e)
		require.True(t, ok)
		behind := r.occ.liveAhead(ent, e.ID)
		r.occ.mu.Unlock()
		require.Equal(t, c.wantBehind, behind, c.name)
	}
}
