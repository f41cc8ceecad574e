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

// TestBatchLockSharedWithLiveAdmittedLater: a fresh proxy's first burst
// against ollama (P=4, no hint, agents-p4-s8run02 and -s9run01/-02,
// request 2): the first request holds the runner's lock for its prefill,
// and the next three, sent during it, take their slots together at its
// end and share their batches, their first outputs within 2 ms of each
// other. The proxy's 2nd is recorded while the 3rd and 4th are in flight;
// they were admitted more than the order window after it, and their first
// outputs came just before its own. The holder was the first request
// recorded, with no estimate, so its prefill is not known to be solo and
// the waiter's prefill from its end (shared) fits no estimate: without
// its partners it voted none and was split as unqueued (0 ms for 111,
// 276, 214). A partner's admission says nothing of the batches it shared:
// the start under the lock does, and a first output within endTolerance of
// this one's either side; nor does the slot count before any evidence (1):
// two requests whose first outputs came together and one of which is
// still running held two slots.
func TestBatchLockSharedWithLiveAdmittedLater(t *testing.T) {
	for _, c := range []struct {
		name        string
		firstOfLate float64 // the partners' first outputs, against the waiter's at 1800
	}{
		{"partners' first outputs before", 1798.5},
		{"partners' first outputs after", 1801},
	} {
		r, _, _ := newTest(t, Config{})
		h := served(0, 600, 1810, 0) // its stream ends just after w's first output, before w's end
		w := served(50, 1800, 1900, 1)
		p1 := served(60, c.firstOfLate, 2500, 2) // 10 ms after w: outside the order window
		p2 := served(70, c.firstOfLate+0.5, 2600, 3)
		burst600(&h, &w, &p1, &p2)
		for _, tr := range []*proxy.Trace{&h, &p1, &p2} {
			r.FirstOutput(tr)
		}
		r.Record(&h)
		r.FirstOutput(&w)
		r.Record(&w)
		rq := r.Recent(1)[0]
		require.Equal(t, SourceOccupancy, rq.QueueSource, c.name)
		require.InDelta(t, 550, rq.Queue.Millis(), 25, "%s: queue %.1f ms: it waited for the holder's prefill", c.name, rq.Queue.Millis())
	}
}

// BenchmarkRecordWithLive is Record in bursts under ollama's batch lock
// on 4 slots: a holder and three requests that waited for its prefill,
// the waiters recorded while the holder and the other waiters are in
// flight. With their first outputs noted live, each of those Records
// reads the live table and runs lockEnd once for each partner collected
// from it, under the timeline's mutex; "unseen" is the same bursts without
// (a Recorder fed by something other than the proxy). ns/record is the
// cost per Record.
func BenchmarkRecordWithLive(b *testing.B) {
	for _, live := range []bool{true, false} {
		name := "live"
		if !live {
			name = "unseen"
		}
		b.Run(name, func(b *testing.B) { benchRecordBursts(b, live) })
	}
}

func benchRecordBursts(b *testing.B, live bool) {
	r, _, _ := newTest(b, Config{EngineSlots: 4})
	trainPerToken(r)
	const n = 4 // the holder and three waiters
	var trs [n]proxy.Trace
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		base := 100000 + float64(i)*10000
		trs[0] = served(base, base+600, base+5000, 0)
		for k := 1; k < n; k++ {
			trs[k] = served(base+float64(k), base+1800+float64(k), base+1900+float64(k), k)
		}
		seq := uint64(100 + 2*n*i)
		for k := range trs {
			tr := &trs[k]
			tr.PromptTokens, tr.Prefix.Tracked = 600, true
			tr.ID, tr.AdmitSeq, tr.ReleaseSeq = seq+uint64(k), seq+uint64(k), seq+uint64(n+k)
			if live {
				r.FirstOutput(tr)
			}
		}
		for k := 1; k < n; k++ {
			r.Record(&trs[k])
		}
		r.Record(&trs[0])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
	if q := r.Recent(2)[1].Queue.Millis(); live && (q < 570 || q > 630) {
		b.Fatalf("the last waiter's queue %.1f ms, want its wait for the holder's prefill (600)", q)
	}
}
