package conformance

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// How the engine gave a case's requests their slots, read from its truth
// alone (the slot lines, the client's first outputs and stream ends), so
// that every CI log says which of ollama's behaviours the host brought out.
// A request waiting for llamarunner's batch mutex gets in at the end of the
// batch in progress or of the next one; on a quiet host mostly the next
// (the end of the holder's prefill, for these 2-batch prompts), on a loaded
// one often the first (sharing the holder's remaining batches): 6–14% of
// such waiters on quiet runs, 26–38% on 4 slots under load, and most of the
// split's misses there (docs/real-engine.md "Session 8").
type slotJoins struct {
	atOnce     int // took its slot within joinAtOnce of its send
	streamEnd  int // at another request's stream end: a slot freed
	prefillEnd int // at the first output of a prefill in progress (the batch lock)
	firstBatch int // while another was mid-prefill: at the end of its first batch
	other      int
}

const (
	joinAtOnce = 15 * time.Millisecond
	// A slot line is written 0–15 ms before the proxy's t_end on a quiet
	// host, up to ~30 ms before the client's end under load.
	joinEndBefore, joinEndAfter = 40 * time.Millisecond, 20 * time.Millisecond
	// slog's millisecond stamps and a decode step between a prefill's end
	// and its first output reaching the client.
	joinSlack = 12 * time.Millisecond
)

// tallyJoins classifies each sample with a slot line by what its slot start
// coincides with among the others'.
func tallyJoins(ss []*sample) slotJoins {
	var j slotJoins
	for _, s := range ss {
		if s.slot.at.IsZero() {
			continue
		}
		switch joinOf(s, ss) {
		case "at once":
			j.atOnce++
		case "stream end":
			j.streamEnd++
		case "prefill end":
			j.prefillEnd++
		case "first batch":
			j.firstBatch++
		default:
			j.other++
		}
	}
	return j
}

// joinOf is how s got its slot: at once, at the end of a prefill in
// progress, while one was mid-prefill (the end of its first batch), or at
// a stream end. A stream end near the slot start counts only when nothing
// was prefilling: a slot freed with the mutex free.
func joinOf(s *sample, ss []*sample) string {
	at := s.slot.at
	if at.Sub(s.resp.sent) < joinAtOnce {
		return "at once"
	}
	endNear, atFirst, mid := false, false, false
	for _, o := range ss {
		if o == s || o.slot.at.IsZero() {
			continue
		}
		if d := at.Sub(o.obs.end); !o.obs.end.IsZero() && d >= -joinEndBefore && d <= joinEndAfter {
			endNear = true
			continue // its slot freed: a short answer's first output is its end
		}
		first := o.obs.firstOutput
		if first.IsZero() || !o.slot.at.Before(at.Add(-4*time.Millisecond)) || !first.After(at.Add(-joinSlack)) {
			continue // not prefilling when s took its slot
		}
		if first.After(at.Add(joinSlack)) {
			mid = true
		} else {
			atFirst = true
		}
	}
	switch {
	case atFirst:
		return "prefill end"
	case mid:
		return "first batch"
	case endNear:
		return "stream end"
	}
	return "other"
}

func (j slotJoins) String() string {
	return fmt.Sprintf("%d took a slot at once, %d at a stream end, %d at a prefill's end (the batch lock), %d at the end of a prefill's first batch, %d other",
		j.atOnce, j.streamEnd, j.prefillEnd, j.firstBatch, j.other)
}

// hostLoad is /proc/loadavg (the 1, 5 and 15-minute load averages, the
// running/all tasks, the last PID), or "unknown".
func hostLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// TestJoinOf: a made-up 2-slot timeline in ms: h takes a slot at once and
// prefills to 200; a gets in at 100, mid-prefill (the end of h's first
// batch); b at 200, h's first output; h's stream ends at 500 and c takes
// the slot it frees at 495; d waits 100 ms with nothing to explain it;
// e's one-token answer (first output at its end, 1,500) frees the slot f
// takes at 1,495.
func TestJoinOf(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	mk := func(sent, slot, first, end int) *sample {
		return &sample{resp: &response{sent: at(sent)}, slot: slotLine{at: at(slot)}, obs: observed{firstOutput: at(first), end: at(end)}}
	}
	h := mk(0, 2, 200, 500)
	a := mk(0, 100, 400, 520)
	b := mk(0, 200, 350, 480)
	c := mk(0, 495, 700, 900)
	d := mk(1000, 1100, 1200, 1300)
	e := mk(1400, 1405, 1500, 1501)
	f := mk(1400, 1495, 1600, 1700)
	ss := []*sample{h, a, b, c, d, e, f}
	for _, tc := range []struct {
		name string
		s    *sample
		want string
	}{{"h", h, "at once"}, {"a", a, "first batch"}, {"b", b, "prefill end"}, {"c", c, "stream end"}, {"d", d, "other"}, {"e", e, "at once"}, {"f", f, "stream end"}} {
		if got := joinOf(tc.s, ss); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	want := slotJoins{atOnce: 2, streamEnd: 2, prefillEnd: 1, firstBatch: 1, other: 1}
	if got := tallyJoins(ss); got != want {
		t.Errorf("tally %+v, want %+v", got, want)
	}
}
