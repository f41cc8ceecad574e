package snapshot

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
)

// The report's lines beyond the engine's phases: where a conversation's
// time goes (engine or agent), what the prompts are made of, the queue
// knee, and whether the host let the proxy measure. Each prints only when
// the document has its section (a benchmark file has none).

// writeBeyond adds those lines to b. An unreadable section is an error.
func writeBeyond(b *strings.Builder, ext *Extension) error {
	convs, err := section[histo.ConversationsSection](ext.Conversations, "conversations")
	if err != nil {
		return err
	}
	ledger, err := section[histo.LedgerSection](ext.PromptLedger, "prompt_ledger")
	if err != nil {
		return err
	}
	levels, err := section[histo.ConcurrencySection](ext.Concurrency, "concurrency")
	if err != nil {
		return err
	}
	quality, err := section[selfcheck.Section](ext.MeasurementQuality, "measurement_quality")
	if err != nil {
		return err
	}
	if convs != nil {
		writeConversations(b, convs, ext.Windows)
	}
	if ledger != nil {
		writeLedger(b, ledger)
	}
	if levels != nil {
		writeKnee(b, levels)
	}
	if quality != nil {
		writeQuality(b, quality)
	}
	return nil
}

func writeConversations(b *strings.Builder, s *histo.ConversationsSection, windows int64) {
	if s.Turns == 0 {
		blank(b)
		fmt.Fprintf(b, "agent/engine  no conversations tracked\n")
		return
	}
	engine := histo.Float(1 - float64(s.AgentShare))
	blank(b)
	turns := Plural(s.Turns, "turn")
	if windows == 1 { // merged, a conversation counts once per window
		turns += " of " + Plural(s.Conversations, "conversation")
	}
	fmt.Fprintf(b, "agent/engine  %s in the agent, %s in the engine (%s; agent gap p50 %s, p90 %s)\n",
		percent(Num(s.AgentShare)), percent(Num(engine)), turns, duration(s.AgentGapMs.P50), duration(s.AgentGapMs.P90))
	if len(s.Slowest) > 0 {
		c := s.Slowest[0]
		fmt.Fprintf(b, "  slowest conversation %s: %s over %s, %s agent, %s engine\n",
			c.Conversation, Plural(int64(c.Turns), "turn"), duration(c.WallMs), percent(Num(c.AgentShare)), percent(Num(c.EngineShare)))
	}
}

// partNames are the ledger's parts as the report names them.
var partNames = [...]string{"system", "tools", "history", "last turn"}

func ledgerParts(l *histo.LedgerParts) [4]histo.LedgerPart {
	return [...]histo.LedgerPart{l.System, l.Tools, l.History, l.LastTurn}
}

func writeLedger(b *strings.Builder, s *histo.LedgerSection) {
	if s.Requests == 0 {
		blank(b)
		fmt.Fprintf(b, "prompt ledger  no prompt composition tracked\n")
		return
	}
	blank(b)
	fmt.Fprintf(b, "prompt ledger  %s sent in %s (~%d bytes/token)\n", size(float64(s.PromptBytes)), Plural(s.Requests, "prompt"), s.BytesPerToken)
	parts := [][]string{{"part", "sent", "tokens est", "share", "p50/request", "p95/request"}}
	for i, p := range ledgerParts(&s.Parts) {
		parts = append(parts, []string{partNames[i], size(float64(p.Bytes)), fmt.Sprint(p.TokensEst), percent(Num(p.Share)),
			percent(Num(p.PerRequest.P50)), percent(Num(p.PerRequest.P95))})
	}
	turns := [][]string{{"turns", "n", "system", "tools", "history", "last turn"}}
	for _, t := range s.ByTurn {
		m := t.MeanBytes
		turns = append(turns, []string{t.Turns, fmt.Sprint(t.Requests), meanSize(m.System), meanSize(m.Tools), meanSize(m.History), meanSize(m.LastTurn)})
	}
	writeTables(b, parts)
	b.WriteString("mean bytes per prompt by turn\n")
	writeTables(b, turns)
}

func writeKnee(b *strings.Builder, s *histo.ConcurrencySection) {
	blank(b)
	if len(s.Levels) > 0 {
		rows := [][]string{{"in flight", "n", "429/503", "queue p95 ms", "service p50 ms"}}
		for _, l := range s.Levels {
			name := l.Level
			if s.Knee >= 0 && l.Inflight == int(s.Knee) {
				name += " (knee)"
			}
			rows = append(rows, []string{name, fmt.Sprint(l.Requests), fmt.Sprint(l.Rejected), num(Num(l.QueueMs.P95)), num(Num(l.ServiceMs.P50))})
		}
		writeTables(b, rows)
	}
	fmt.Fprintf(b, "concurrency  %s\n", kneeLine(s))
}

// kneeLine is the one-line reading of the concurrency section.
func kneeLine(s *histo.ConcurrencySection) string {
	typical := "-"
	if s.Typical >= 0 {
		typical = fmt.Sprint(s.Typical)
	}
	knee := "no level reached the knee"
	if s.Knee >= 0 {
		knee = fmt.Sprintf("the knee is at %d", s.Knee)
	}
	var reading string
	switch s.Reading {
	case histo.ReadingHeadroom:
		reading = fmt.Sprintf("headroom: typically %s in flight; %s", typical, knee)
	case histo.ReadingAtKnee:
		reading = fmt.Sprintf("at the knee: typically %s in flight, where requests start to wait; more load will queue", typical)
	case histo.ReadingQueueBound:
		reading = fmt.Sprintf("queue-bound: typically %s in flight, past the knee at %d: requests wait about as long as they are served", typical, s.Knee)
	case histo.ReadingRejecting:
		reading = "rejecting: a noticeable share of the most loaded requests got 429/503"
		if s.LimiterRejected > 0 {
			reading += fmt.Sprintf(" (%d refused by the proxy's limiter)", s.LimiterRejected)
		}
		reading += fmt.Sprintf("; typically %s in flight; %s", typical, knee)
	default:
		return "unknown: no request with a known queue and service time"
	}
	return reading + " (knee: the " + s.KneeRule + ")"
}

func writeQuality(b *strings.Builder, q *selfcheck.Section) {
	o := q.TimerOvershootMs
	detail := fmt.Sprintf("timer overshoot p50 %s ms, p99 %s ms, max %s ms", num(Num(o.P50)), num(Num(o.P99)), num(Num(o.Max)))
	if q.Pressure.CPU.Known() {
		detail += fmt.Sprintf("; peak pressure cpu %s, memory %s, io %s",
			percent(Num(q.Pressure.CPU)), percent(Num(q.Pressure.Memory)), percent(Num(q.Pressure.IO)))
	}
	switch q.Verdict {
	case selfcheck.VerdictNoisy:
		fmt.Fprintf(b, "measurement  noisy: %s (%s)\n", strings.Join(groupReasons(q.Reasons), "; "), detail)
	case selfcheck.VerdictGood:
		fmt.Fprintf(b, "measurement  good (%s)\n", detail)
	default:
		fmt.Fprintf(b, "measurement  unknown: %s\n", strings.Join(q.Reasons, "; "))
	}
}

// groupReasons merges the reasons of several windows that differ only in
// their figure ("cpu pressure 70.2% > 10%", "cpu pressure 57.1% > 10%")
// into one with the peak and the number of windows: "cpu pressure up to
// 70.2% > 10% (2 windows)". A merged section keeps each distinct reason
// once, up to a cap, so the count is of windows with distinct figures.
func groupReasons(reasons []string) []string {
	type group struct {
		head, tail string
		peak       float64
		peakText   string
		n          int
	}
	var order []string
	groups := map[string]*group{}
	for _, r := range reasons {
		loc := reasonFigure.FindStringIndex(r)
		if loc == nil {
			if groups[r] == nil {
				order = append(order, r)
				groups[r] = &group{head: r, n: 1}
			}
			continue
		}
		head, fig, tail := r[:loc[0]], r[loc[0]:loc[1]], r[loc[1]:]
		v, _ := strconv.ParseFloat(fig, 64)
		key := head + "\x00" + tail
		g := groups[key]
		if g == nil {
			g = &group{head: head, tail: tail, peak: v, peakText: fig}
			groups[key] = g
			order = append(order, key)
		}
		g.n++
		if v > g.peak {
			g.peak, g.peakText = v, fig
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		g := groups[k]
		switch {
		case g.peakText == "":
			out = append(out, g.head)
		case g.n == 1:
			out = append(out, g.head+g.peakText+g.tail)
		default:
			out = append(out, fmt.Sprintf("%sup to %s%s (%s)", g.head, g.peakText, g.tail, Plural(int64(g.n), "window")))
		}
	}
	return out
}

// reasonFigure is the first figure of a reason.
var reasonFigure = regexp.MustCompile(`\b[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?`)

// duration formats milliseconds as a rounded duration, "-" when unknown.
func duration(ms histo.Float) string {
	if !ms.Known() {
		return "-"
	}
	d := time.Duration(float64(ms) * float64(time.Millisecond))
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// size formats bytes with a binary unit.
func size(n float64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", n/(1<<10))
	}
	return fmt.Sprintf("%.0f B", n)
}

func meanSize(v histo.Float) string {
	if !v.Known() {
		return "-"
	}
	return size(float64(v))
}

// blank ends b with an empty line, once: the blocks are set apart by one.
func blank(b *strings.Builder) {
	if !strings.HasSuffix(b.String(), "\n\n") {
		b.WriteByte('\n')
	}
}
