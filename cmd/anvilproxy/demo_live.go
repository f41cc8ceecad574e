package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/snapshot"
)

// The live table refreshes in place every second on a terminal; elsewhere
// (a pipe, a CI log) it appends one line every few seconds. The demo and
// "anvilproxy top" print the same table from a liveStatus (status.go).
const (
	ttyEvery   = time.Second
	plainEvery = 5 * time.Second
)

// live prints the demo's table until ctx ends, then once more.
func (d *demo) live(ctx context.Context, w io.Writer) {
	render := func(s liveStatus, tty bool) []string {
		c := clock(time.Duration(s.UptimeSec*float64(time.Second))) + " / " + clock(d.f.duration)
		if tty {
			return s.block(c)
		}
		return []string{s.line(c)}
	}
	refresh(ctx, w, isTerminal(w), 0, -1, func() (liveStatus, error) { return d.st.status(time.Now()), nil }, render)
}

// refresh prints the table from get at once, then every interval (0: a
// second on a terminal, plainEvery elsewhere) until ctx ends, and once
// more; n > 0 stops it after n tables. A failed get prints its error in
// the table's place.
func refresh(ctx context.Context, w io.Writer, tty bool, every time.Duration, n int, get func() (liveStatus, error), render func(s liveStatus, tty bool) []string) {
	if every <= 0 {
		every = plainEvery
		if tty {
			every = ttyEvery
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	width := 0
	if f, ok := w.(*os.File); ok && tty {
		width = termWidth(f)
	}
	lines := 0
	for printed := 0; ; {
		if printed > 0 {
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
		var block []string
		if s, err := get(); err != nil {
			block = []string{"  " + err.Error()}
		} else {
			block = render(s, tty)
		}
		if tty {
			// A line wider than the terminal wraps into rows that the
			// cursor-up below would not count: each redraw would leave
			// the previous one's extra rows behind.
			block = fitLines(block, width)
		}
		if tty && lines > 0 {
			fmt.Fprintf(w, "\x1b[%dA", lines) // back to the top of the previous block
			for i := len(block); i < lines; i++ {
				block = append(block, "") // a shorter block clears the rest
			}
		}
		for _, l := range block {
			if tty {
				l = "\x1b[2K" + l
			}
			fmt.Fprintln(w, l)
		}
		lines = len(block)
		printed++
		if ctx.Err() != nil || printed == n {
			return
		}
	}
}

// defaultWidth is the terminal width assumed when it cannot be read.
const defaultWidth = 80

// fitLines breaks every line of block longer than width-1 runes (the last
// column is left free: some terminals wrap on it) at a space, else
// anywhere, continuing indented, so that each printed line is one row.
func fitLines(block []string, width int) []string {
	if width <= 0 {
		width = defaultWidth
	}
	limit := max(width-1, 20)
	var out []string
	for _, l := range block {
		for {
			r := []rune(l)
			if len(r) <= limit {
				out = append(out, l)
				break
			}
			cut := limit
			if i := strings.LastIndex(string(r[:limit]), " "); i > limit/2 {
				cut = len([]rune(string(r[:limit])[:i]))
			}
			out = append(out, strings.TrimRight(string(r[:cut]), " "))
			l = "    " + strings.TrimLeft(string(r[cut:]), " ")
		}
	}
	return out
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

// countsText is the header's counts, in the words of histo/failures.go.
func (s liveStatus) countsText() string {
	var parts []string
	for _, p := range []struct {
		n    int64
		name string
	}{{s.Abandoned, histo.FailureAbandoned}, {s.Refused, histo.FailureRefused}, {s.Errors, ""}} {
		switch {
		case p.n == 0:
		case p.name == "":
			parts = append(parts, plural(p.n, "error"))
		default:
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.name))
		}
	}
	failed := fmt.Sprintf("%d failed", s.Failed)
	if len(parts) > 0 {
		failed += " (" + strings.Join(parts, ", ") + ")"
	}
	return fmt.Sprintf("%s, %s, %s", plural(s.Requests, "request"), failed, plural(s.Retries, "retry"))
}

// plural is "1 retry", "2 retries", "0 requests": the report's words.
func plural(n int64, word string) string { return snapshot.Plural(n, word) }

// block is the table for a terminal: the same number of lines every time.
func (s liveStatus) block(clockText string) []string {
	window := s.recentName()
	head := fmt.Sprintf("  %s   since start: %s   %d in flight", clockText, s.countsText(), s.Inflight)
	cols := fmt.Sprintf("  %-12s", window)
	p50, p99 := fmt.Sprintf("  %-12s", "p50 ms"), fmt.Sprintf("  %-12s", "p99 ms")
	for _, ph := range s.Recent.Phases {
		cols += fmt.Sprintf("%10s", ph.Name)
		p50 += fmt.Sprintf("%10s", msText(float64(ph.P50)))
		p99 += fmt.Sprintf("%10s", msText(float64(ph.P99)))
	}
	recent := fmt.Sprintf("  %-13s%s req/s   cache hit %s of prompt tokens, inferred %s", window, rateText(s.Recent.Rate),
		pctText(float64(s.Recent.CacheHit)), pctText(float64(s.Recent.CacheHitInferred)))
	total := fmt.Sprintf("  %-13sgoodput %s (%s)   retry amplification %s", "since start", pctText(float64(s.Goodput)), sloText(s.SLOs), ampl(float64(s.Amplification)))
	return []string{head, cols, p50, p99, recent, total}
}

// recentName names the span the percentiles, rate and cache hit cover.
func (s liveStatus) recentName() string {
	if s.Recent.Truncated {
		return fmt.Sprintf("newest %d", recentLimit)
	}
	return fmt.Sprintf("last %ds", int(math.Round(s.Recent.Seconds)))
}

// line is the table as one appended line, for logs.
func (s liveStatus) line(clockText string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s  since start: %s  %d in flight | %s p50/p99 ms", clockText, s.countsText(), s.Inflight, s.recentName())
	for _, ph := range s.Recent.Phases {
		fmt.Fprintf(&b, "  %s %s/%s", ph.Name, msText(float64(ph.P50)), msText(float64(ph.P99)))
	}
	fmt.Fprintf(&b, "  cache %s (inferred %s) | since start: goodput %s  retry %s", pctText(float64(s.Recent.CacheHit)),
		pctText(float64(s.Recent.CacheHitInferred)), pctText(float64(s.Goodput)), ampl(float64(s.Amplification)))
	return b.String()
}

func sloText(slos string) string {
	if slos == "" {
		return "no SLO: requests that did not fail"
	}
	return slos
}

func clock(d time.Duration) string {
	sec := int(d.Round(time.Second).Seconds())
	if sec >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", sec/3600, sec/60%60, sec%60)
	}
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

func rateText(v histo.Float) string {
	if !v.Known() {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(v))
}

func pctText(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func ampl(v float64) string {
	if v == 0 || math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}
