package bench

import (
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// capacityStreams returns how many streams the capacity run can hold with
// an open-file limit of lim: the proxy and the bench process (emitter and
// clients) each need two descriptors per stream, plus a few of their own.
func capacityStreams(want int, lim uint64) int {
	const reserve = 256
	if lim == 0 || lim > uint64(2*want+reserve) {
		return want
	}
	return max(int(lim)-reserve, 0) / 2
}

// capacity holds asked slow streams open at once through a fresh
// anvilproxy (goroutine relay, then event loop), then through a fresh nginx
// when it is installed and wanted, and reads each proxy's resident memory
// idle and with every stream open: (RSS at N − RSS idle) / N is the memory
// one stream costs; for anvilproxy also its heap in use, from /metrics.
// Every stream must end intact.
func (b *runner) capacity(asked int) error {
	n := asked
	if got := capacityStreams(n, b.noFile); got < n {
		b.rep.note("capacity run: %d streams, not %d: the open-file limit is %d (the hard limit could not be raised) and the proxy and the bench each need 2 per stream", got, n, b.noFile)
		n = got
	}
	lv := Level{Streams: n, Events: b.cfg.CapacityEvents, Gap: b.cfg.CapacityGap}
	if lv.streamTime() <= b.cfg.CapacityRamp {
		return fmt.Errorf("bench: capacity streams last %v, not longer than the %v ramp: they would not all be open at once", lv.streamTime(), b.cfg.CapacityRamp)
	}
	res := b.rep.newCapacity(asked, lv, b.cfg.CapacityRamp)
	b.targets = b.targets[:0] // the stream test's, stopped and their cuts noted: only the capacity run's from here
	for _, name := range []string{AnvilProxy, AnvilBase, AnvilGoroutine, Nginx} {
		if !b.wanted(name) {
			continue
		}
		t, err := b.startCapacityTarget(name, n)
		if err != nil {
			return err
		}
		if t == nil {
			continue
		}
		ct, err := b.capacityTarget(t, lv)
		t.stop()
		if err != nil {
			return err
		}
		res.Targets = append(res.Targets, ct)
	}
	b.noteCuts()
	return nil
}

// startCapacityTarget starts a fresh proxy for the capacity run of n
// streams; nil without an error means it is not installed.
func (b *runner) startCapacityTarget(name string, n int) (*target, error) {
	up, err := b.em.Listen()
	if err != nil {
		return nil, err
	}
	var t *target
	switch name {
	case AnvilProxy, AnvilGoroutine, AnvilBase:
		argv, _ := b.ownArgv(name)
		if len(argv) == 0 {
			return nil, nil
		}
		if name == AnvilBase {
			t, err = startBase(argv, up, b.dir, b.cfg.ProxyLogLevel, n+1024)
		} else {
			t, err = startAnvil(name, argv, up, b.dir, b.cfg.ProxyLogLevel, n+1024)
		}
	case Nginx:
		bin, lerr := exec.LookPath(Nginx)
		if lerr != nil {
			return nil, nil
		}
		t, err = startNginx(bin, up, b.dir)
	}
	if err != nil {
		return nil, fmt.Errorf("capacity run: %s: %w", name, err)
	}
	t.upstream = up
	b.targets = append(b.targets, t) // stopped by close too
	if !slices.ContainsFunc(b.rep.Targets, func(i TargetInfo) bool { return i.Name == name }) {
		b.rep.addTarget(t, "")
	}
	return t, nil
}

// capacityTarget runs the capacity waves through one proxy.
func (b *runner) capacityTarget(t *target, lv Level) (CapacityTarget, error) {
	b.progress("capacity: %d streams of %d events %v apart through %s (pid %d), opened over %v",
		lv.Streams, lv.Events, lv.Gap, t.name, t.cmd.Process.Pid, b.cfg.CapacityRamp)
	// Warm the proxy's code and pools a little, so "idle" is a proxy that
	// has served, not one that has just started.
	warm := newCellStats()
	if _, err := b.streamCell(t, Level{Streams: 16, Events: 3, Gap: time.Millisecond}, warm, 0); err != nil {
		return CapacityTarget{}, err
	}
	time.Sleep(time.Second)
	idle, err := t.rss()
	if err != nil {
		return CapacityTarget{}, fmt.Errorf("capacity run: %w", err)
	}
	ct := CapacityTarget{Target: t.name, RSSIdleMiB: Num(mib(idle)), HeapIdleMiB: unknown}
	heapIdle := heapInuse(t)
	if heapIdle >= 0 {
		ct.HeapIdleMiB = Num(mib(heapIdle))
	}
	for w := 1; w <= capacityWaves; w++ {
		wv, err := b.capacityWave(t, lv, w, idle, heapIdle)
		if err != nil {
			return ct, err
		}
		ct.Waves = append(ct.Waves, wv)
		if !t.alive() {
			return ct, fmt.Errorf("capacity run: %s exited: %s", t.name, t.logTail())
		}
		if w < capacityWaves {
			time.Sleep(2 * time.Second)
		}
	}
	return ct, nil
}

// capacityWaves is how many times the capacity run opens its streams. The
// first wave runs on memory fresh from the OS, whose pages become resident
// only where they are written; the second reuses the first's freed memory,
// which the Go runtime zeroes, making whole buffers resident: a longer-lived
// proxy's figure.
const capacityWaves = 2

// capacityWave opens the streams once and samples the proxy's RSS with
// the number of streams open: the sample with the most open is the one
// per-stream memory is computed from.
func (b *runner) capacityWave(t *target, lv Level, w int, idle, heapIdle int64) (CapacityWave, error) {
	n := lv.Streams
	st := newCellStats()
	var open, peakOpen atomic.Int64
	cpu0, _ := t.cpu()
	t0 := time.Now()
	// A stream that has not ended well after its time is cut and counted
	// failed: a run never hangs on a stuck stream.
	deadline := t0.Add(b.cfg.CapacityRamp + lv.streamTime() + stuck)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * b.cfg.CapacityRamp / time.Duration(n))
			b.capacityStream(t, lv, st, i, deadline, func() {
				cur := open.Add(1)
				for p := peakOpen.Load(); cur > p && !peakOpen.CompareAndSwap(p, cur); p = peakOpen.Load() {
				}
			}, func() { open.Add(-1) })
		}()
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()

	var best rssSample
	var peak int64
	heapOpen := int64(-1) // anvilproxy's heap in use once every stream is open
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	announced := false
	for done := false; !done; {
		select {
		case <-tick.C:
			s := rssSample{open: open.Load()}
			s.rss, _ = t.rss()
			peak = max(peak, s.rss)
			if s.open > best.open {
				best = s
			}
			if s.open == int64(n) && !announced {
				announced = true
				b.progress("  wave %d: all %d streams open after %v: proxy RSS %.1f MiB (idle %.1f MiB)", w, n, time.Since(t0).Round(time.Millisecond), mib(s.rss), mib(idle))
				heapOpen = heapInuse(t)
				if b.cfg.HeapProfile && HeapSignal != nil && w == capacityWaves && t.name == AnvilProxy {
					_ = t.cmd.Process.Signal(HeapSignal) // the child writes its heap profile
				}
			}
		case <-finished:
			done = true
		case <-b.ctx.Done():
			<-finished
			return CapacityWave{}, b.ctx.Err()
		}
	}
	cpu1, _ := t.cpu()
	wv := newCapacityWave(best, idle, peak, peakOpen.Load(), cpu1-cpu0, st)
	wv.HeapPerStreamKiB = unknown
	if heapOpen >= 0 && heapIdle >= 0 {
		wv.HeapPerStreamKiB = Num(float64(heapOpen-heapIdle) / 1024 / float64(n))
	}
	return wv, nil
}

// heapInuse is anvilproxy's heap in use (go_memstats_heap_inuse_bytes on
// its /metrics), or -1 for another target or when it cannot be read. It
// counts spans that hold garbage not yet collected, so it is an upper
// bound on what the streams keep; RSS adds what the runtime holds freed.
func heapInuse(t *target) int64 {
	if t.metrics == "" {
		return -1
	}
	v, err := scrapeValue(t.metrics, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return -1
	}
	return int64(v)
}

// rssSample is the proxy's RSS with open streams open.
type rssSample struct {
	open int64
	rss  int64
}

// capacityStream runs one stream of the capacity run on its own
// connection; first and last mark the stream open and closed.
func (b *runner) capacityStream(t *target, lv Level, st *cellStats, i int, deadline time.Time, first, last func()) {
	cc, err := dialClient(t.addr, 4<<10) // 10,000 of them: keep the bench's own memory small
	if err != nil {
		st.addStream(streamTally{Streams: 1, Failed: 1, Lost: int64(lv.Events)}, 0, nil, fmt.Errorf("connecting: %w", err), false)
		return
	}
	defer cc.Close()
	_ = cc.c.SetDeadline(deadline)
	sc := newEventScanner(b.cfg.EventBytes)
	sc.onFirst = first
	tally, ttfb, err := runStream(cc, t.addr, sc, appendStreamRequest(nil, lv.Events, lv.Gap, i, 1), lv.Events)
	if tally.Events > 0 {
		last()
	}
	st.addStream(tally, ttfb, sc.lat, err, true)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
