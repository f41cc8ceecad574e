package bench

import (
	"fmt"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// stuck is how long past its due time a request may take before the
// client gives up on it and counts it failed: a run never hangs on a stuck
// proxy.
const stuck = 30 * time.Second

// levelAcc accumulates one target's rounds at one level.
type levelAcc struct {
	ttfb, event *hdrhistogram.Histogram
	tally       streamTally
	cpu         time.Duration
	cpuKnown    bool
	elapsed     time.Duration
	roundP50    []float64 // added per-event p50 of each round, µs
	roundTTFB   []float64 // added TTFB p50 of each round, µs
	errs        []string
	residency   *Quantiles // the proxy's own, from its /metrics
	before      buckets
}

// add takes one round's cell.
func (a *levelAcc) add(st *cellStats, cr cellRun) {
	a.ttfb.Merge(st.ttfb)
	a.event.Merge(st.event)
	a.tally.add(st.tally)
	a.elapsed += cr.elapsed
	a.cpu += cr.cpu
	a.cpuKnown = a.cpuKnown && cr.cpuKnown
	for _, e := range st.errs {
		if len(a.errs) < 4 {
			a.errs = append(a.errs, e)
		}
	}
}

// cell is how long a level's measured cells run: cfg.Cell, and at least
// three streams' time, so that most of it is at full concurrency after
// the staggered start.
func (b *runner) cell(lv Level) time.Duration { return max(b.cfg.Cell, 3*lv.streamTime()) }

// streamLevel runs one level: a warm-up cell per target, then the
// interleaved rounds.
func (b *runner) streamLevel(lv Level) error {
	b.progress("streams %d: %d events of %d B, %v apart (%.0f events/s offered), %d rounds",
		lv.Streams, lv.Events, b.cfg.EventBytes, lv.Gap, lv.offered(), b.cfg.Rounds)
	warm := lv
	warm.Events = min(lv.Events, 5)
	st := newCellStats()
	for _, t := range b.targets {
		st.reset()
		if _, err := b.streamCell(t, warm, st, 0); err != nil {
			return err
		}
		if err := b.checkAlive(); err != nil {
			return err
		}
	}
	acc := make([]levelAcc, len(b.targets))
	for i, t := range b.targets {
		acc[i] = levelAcc{ttfb: newHist(), event: newHist(), cpuKnown: true}
		if t.metrics != "" {
			acc[i].before, _ = scrapeBuckets(t.metrics, residencyMetric)
		}
	}
	for round := 1; round <= b.cfg.Rounds; round++ {
		var direct Quantiles
		var directTTFB Quantiles
		for i, t := range b.targets {
			st.reset()
			cr, err := b.streamCell(t, lv, st, b.cell(lv))
			if err != nil {
				return err
			}
			if err := b.checkAlive(); err != nil {
				return err
			}
			acc[i].add(st, cr)
			q, qt := quantiles(st.event), quantiles(st.ttfb)
			if t.name == Direct {
				direct, directTTFB = q, qt
			} else {
				a := &acc[i]
				a.roundP50 = append(a.roundP50, float64(q.P50-direct.P50))
				a.roundTTFB = append(a.roundTTFB, float64(qt.P50-directTTFB.P50))
			}
			b.progress("  round %d/%d %-10s %6d events  event p50 %7.1f µs  p99 %8.1f µs  ttfb p50 %7.1f µs  cpu %v%s",
				round, b.cfg.Rounds, t.name, st.tally.Events, q.P50, q.P99, qt.P50, cr.cpu.Round(time.Millisecond), badTally(st.tally))
		}
	}
	for i, t := range b.targets {
		if a := &acc[i]; a.before != nil {
			if after, err := scrapeBuckets(t.metrics, residencyMetric); err == nil {
				a.residency = after.since(a.before).residency()
			}
		}
	}
	b.rep.addLevel(lv, b.targets, acc)
	return nil
}

func badTally(t streamTally) string {
	if t.ok() {
		return ""
	}
	return fmt.Sprintf("  LOST %d REORDERED %d CORRUPT %d FAILED %d", t.Lost, t.Reordered, t.Corrupt, t.Failed)
}

// cellRun is what a cell measured apart from its latencies.
type cellRun struct {
	elapsed  time.Duration
	cpu      time.Duration
	cpuKnown bool
}

// streamCell runs one target at one level for one round: the clients start
// staggered over one gap so that events are spread in time as independent
// streams' are, and keep starting streams until cell has passed (cell 0:
// one stream each).
func (b *runner) streamCell(t *target, lv Level, st *cellStats, cell time.Duration) (cellRun, error) {
	return b.runCell(t, lv.Streams, cell, stuck, func(i int, cc *clientConn, err error, deadline int64) {
		if err != nil {
			st.addStream(streamTally{Streams: 1, Failed: 1, Lost: int64(lv.Events)}, 0, nil, fmt.Errorf("connecting: %w", err), false)
			return
		}
		b.streamWorker(cc, t, lv, st, i, deadline, cell > 0)
	})
}

// runCell is the frame of one measured cell of n clients against t. Every
// client dials and warms its connection with a small request first, outside
// the measurement, with connDeadline as its socket deadline; then the
// clients start together and each runs client, with the dial or warm-up
// error and the now() at which the cell ends, d after the start. The
// cell's wall time and the target's CPU are measured around them.
func (b *runner) runCell(t *target, n int, d, connDeadline time.Duration,
	client func(i int, cc *clientConn, err error, deadline int64)) (cellRun, error) {
	ready := make(chan struct{}, n)
	start := make(chan struct{})
	var deadline int64 // written before start closes, read after
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := dialClient(t.addr, clientBufSize)
			if err == nil {
				_ = cc.c.SetDeadline(time.Now().Add(connDeadline))
				_, err = runSmall(cc, t.addr, appendSmallRequest(nil, i, 0))
			}
			ready <- struct{}{}
			if cc != nil {
				defer cc.Close()
			}
			<-start
			client(i, cc, err, deadline)
		}()
	}
	for range n {
		<-ready
	}
	cpu0, cerr := t.cpu()
	t0 := now()
	deadline = t0 + int64(d)
	close(start)
	wg.Wait()
	elapsed := time.Duration(now() - t0)
	cpu1, cerr1 := t.cpu()
	return cellRun{elapsed: elapsed, cpu: cpu1 - cpu0, cpuKnown: cerr == nil && cerr1 == nil && t.proxied()}, b.ctx.Err()
}

// streamWorker is one client of a cell: streams back to back on cc. The
// clients start staggered over one stream's time, each with a different
// phase within the gap, so that streams start and events arrive spread in
// time as independent streams' do. In a measured cell (deadline past the
// start) the first stream of each client is the ramp-up: its events are
// checked and counted, its latencies are not recorded.
func (b *runner) streamWorker(cc *clientConn, t *target, lv Level, st *cellStats, i int, deadline int64, measured bool) {
	n := time.Duration(lv.Streams)
	time.Sleep(time.Duration(i)*lv.Gap/n + lv.Gap*time.Duration((i*(lv.Events-1))/lv.Streams))
	sc := newEventScanner(b.cfg.EventBytes)
	var body []byte
	for k := 0; k == 0 || now()+int64(lv.streamTime()) <= deadline; k++ {
		if b.ctx.Err() != nil {
			return
		}
		body = appendStreamRequest(body[:0], lv.Events, lv.Gap, i, k+1)
		_ = cc.c.SetDeadline(time.Now().Add(lv.streamTime() + stuck))
		tally, ttfb, err := runStream(cc, t.addr, sc, body, lv.Events)
		st.addStream(tally, ttfb, sc.lat, err, k > 0 || !measured)
		if err != nil || cc.broken {
			return
		}
	}
}

// smallAcc accumulates one target's throughput rounds.
type smallAcc struct {
	requests int64
	failed   int64
	elapsed  time.Duration
	cpu      time.Duration
	cpuKnown bool
	lat      *hdrhistogram.Histogram
	roundRPS []float64
	errs     []string
}

// add takes one round's cell and returns its rate.
func (a *smallAcc) add(r smallRun, lat *hdrhistogram.Histogram) float64 {
	a.requests += r.requests
	a.failed += r.failed
	a.elapsed += r.elapsed
	a.cpu += r.cpu
	a.cpuKnown = a.cpuKnown && r.cpuKnown
	a.lat.Merge(lat)
	rps := float64(r.requests) / r.elapsed.Seconds()
	a.roundRPS = append(a.roundRPS, rps)
	for _, e := range r.errs {
		if len(a.errs) < 4 {
			a.errs = append(a.errs, e)
		}
	}
	return rps
}

// smallTest measures closed-loop throughput of small non-streamed
// requests, in interleaved rounds like the stream levels.
func (b *runner) smallTest() error {
	w := b.cfg.SmallWorkers
	b.progress("non-stream: %d closed-loop clients, %v rounds ×%d", w, b.cfg.SmallCell, b.cfg.SmallRounds)
	scratch := newHist()
	for _, t := range b.targets {
		if _, err := b.smallCell(t, w, 300*time.Millisecond, scratch); err != nil {
			return err
		}
	}
	acc := make([]smallAcc, len(b.targets))
	for i := range acc {
		acc[i] = smallAcc{lat: newHist(), cpuKnown: true}
	}
	for round := 1; round <= b.cfg.SmallRounds; round++ {
		for i, t := range b.targets {
			scratch.Reset()
			r, err := b.smallCell(t, w, b.cfg.SmallCell, scratch)
			if err != nil {
				return err
			}
			if err := b.checkAlive(); err != nil {
				return err
			}
			rps := acc[i].add(r, scratch)
			b.progress("  round %d/%d %-10s %8.0f req/s  cpu %v  failed %d", round, b.cfg.SmallRounds, t.name, rps, r.cpu.Round(time.Millisecond), r.failed)
		}
	}
	b.rep.addSmall(w, b.targets, acc)
	return nil
}

type smallRun struct {
	cellRun
	requests, failed int64
	errs             []string
}

// smallCell runs w closed-loop clients against t for d.
func (b *runner) smallCell(t *target, w int, d time.Duration, lat *hdrhistogram.Histogram) (smallRun, error) {
	var mu sync.Mutex
	var out smallRun
	run, err := b.runCell(t, w, d, d+stuck, func(i int, cc *clientConn, err error, deadline int64) {
		var lats []int64
		var n, failed int64
		var errMsg string
		body := make([]byte, 0, 256)
		for k := 1; err == nil && now() < deadline && b.ctx.Err() == nil; k++ {
			body = appendSmallRequest(body[:0], i, k)
			var d time.Duration
			if d, err = runSmall(cc, t.addr, body); err == nil {
				n++
				lats = append(lats, int64(d))
			}
		}
		if err != nil {
			failed++
			errMsg = err.Error()
		}
		mu.Lock()
		defer mu.Unlock()
		out.requests += n
		out.failed += failed
		if errMsg != "" && len(out.errs) < 4 {
			out.errs = append(out.errs, errMsg)
		}
		for _, v := range lats {
			record(lat, v)
		}
	})
	out.cellRun = run
	return out, err
}
