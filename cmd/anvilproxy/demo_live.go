package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// liveWindow is the span of recent requests the live table's percentiles
// and cache hit rate cover.
const liveWindow = 15 * time.Second

// The live table refreshes in place every second on a terminal; elsewhere
// (a pipe, a CI log) it appends one line every few seconds.
const (
	ttyEvery   = time.Second
	plainEvery = 5 * time.Second
)

var livePhases = [...]string{"queue", "prefill", "ttfo", "ttft", "tpot"}

// liveStats is one refresh of the live table.
type liveStats struct {
	elapsed           time.Duration
	requests, failed  int64 // inference requests since the start
	inflight          int64
	rate              float64 // requests finished per second over liveWindow
	p50, p99          [len(livePhases)]float64
	cacheHit, goodput float64 // NaN when unknown
	amplification     float64 // 0 without traffic
}

// stats reads the in-process Recorder: counts since the start, and
// percentiles over the requests that finished in the last liveWindow.
func (d *demo) stats() liveStats {
	now := time.Now()
	_, total := d.st.rec.Goodput()
	s := liveStats{
		elapsed: now.Sub(d.started), requests: total.Requests, failed: total.Failed,
		inflight: d.st.proxy.Inflight(), goodput: float64(total.Ratio),
		amplification: d.st.proxy.Retries().Stats().Amplification,
	}
	var vals [len(livePhases)][]float64
	var cached, prompt int64
	n := 0
	for _, rq := range d.st.rec.Recent(512) {
		if rq.Failed || !rq.E2E.Known() || now.Sub(rq.Start.Add(time.Duration(rq.E2E))) > liveWindow {
			continue
		}
		n++
		for i, sp := range [...]histo.Span{rq.Queue, rq.Prefill, rq.TTFO, rq.TTFT, rq.TPOT} {
			if sp.Known() {
				vals[i] = append(vals[i], sp.Millis())
			}
		}
		if rq.PromptTokens > 0 && rq.CachedTokens >= 0 {
			cached += int64(rq.CachedTokens)
			prompt += int64(rq.PromptTokens)
		}
	}
	s.rate = float64(n) / min(liveWindow, s.elapsed).Seconds()
	for i, v := range vals {
		s.p50[i], s.p99[i] = nearestRank(v, 0.5), nearestRank(v, 0.99)
	}
	s.cacheHit = math.NaN()
	if prompt > 0 {
		s.cacheHit = float64(cached) / float64(prompt)
	}
	return s
}

// nearestRank is the q quantile of v by nearest rank, as the v1 schema;
// NaN without values. It sorts v.
func nearestRank(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	return v[max(0, int(math.Ceil(q*float64(len(v))))-1)]
}

// live prints the table until ctx ends, then once more.
func (d *demo) live(ctx context.Context, w io.Writer) {
	tty := isTerminal(w)
	every := plainEvery
	if tty {
		every = ttyEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	lines := 0
	for {
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		s := d.stats()
		if tty {
			block := s.block(d.f.duration, d.f.slos)
			if lines > 0 {
				fmt.Fprintf(w, "\x1b[%dA", lines) // back to the top of the previous block
			}
			for _, l := range block {
				fmt.Fprintf(w, "\x1b[2K%s\n", l)
			}
			lines = len(block)
		} else {
			fmt.Fprintln(w, s.line())
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// isTerminal reports whether w is a character device, so that ANSI cursor
// movement redraws in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// block is the table for a terminal: the same number of lines every time.
func (s liveStats) block(total time.Duration, slos sloFlag) []string {
	head := fmt.Sprintf("  %s / %s   %d requests, %d failed   %d in flight   %.1f req/s   retry amplification %s",
		clock(s.elapsed), clock(total), s.requests, s.failed, s.inflight, s.rate, ampl(s.amplification))
	cols := fmt.Sprintf("  %-12s", fmt.Sprintf("last %ds", int(liveWindow.Seconds())))
	p50, p99 := fmt.Sprintf("  %-12s", "p50 ms"), fmt.Sprintf("  %-12s", "p99 ms")
	for i, name := range livePhases {
		cols += fmt.Sprintf("%10s", name)
		p50 += fmt.Sprintf("%10s", msText(s.p50[i]))
		p99 += fmt.Sprintf("%10s", msText(s.p99[i]))
	}
	foot := fmt.Sprintf("  cache hit %s of prompt tokens   goodput %s (%s)", pctText(s.cacheHit), pctText(s.goodput), slos.String())
	return []string{head, cols, p50, p99, foot}
}

// line is the table as one appended line, for logs.
func (s liveStats) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s  %d req (%d failed)  %d in flight | p50/p99 ms", clock(s.elapsed), s.requests, s.failed, s.inflight)
	for i, name := range livePhases {
		fmt.Fprintf(&b, "  %s %s/%s", name, msText(s.p50[i]), msText(s.p99[i]))
	}
	fmt.Fprintf(&b, " | cache %s  goodput %s  retry %s", pctText(s.cacheHit), pctText(s.goodput), ampl(s.amplification))
	return b.String()
}

func clock(d time.Duration) string {
	sec := int(d.Round(time.Second).Seconds())
	return fmt.Sprintf("%d:%02d", sec/60, sec%60)
}

func msText(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func pctText(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func ampl(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}
