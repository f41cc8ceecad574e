package conformance

// ollama's own record of when each request took a slot, the truth of the
// queue/prefill tests. Read from ollama v0.17.4's runner
// (runner/ollamarunner/runner.go and cache.go; llamarunner is the same):
//
//   - A request takes a slot in the runner's completion handler: it
//     tokenizes the prompt, waits on the semaphore of OLLAMA_NUM_PARALLEL
//     slots (seqsSem, FIFO), then InputCache.LoadCacheSlot picks a cache
//     slot and logs, at DEBUG (OLLAMA_DEBUG=1),
//     `msg="loading cache slot" id=0 cache=412 prompt=980 used=405 remaining=575`:
//     prompt is the request's prompt tokens (the usage's prompt_tokens, both
//     are len(seq.inputs)), used the prefix reused from the slot's KV cache
//     (one less than the prompt when all of it matches: one token is always
//     evaluated), remaining what it prefills. The line's time is the end of
//     the request's queue.
//   - A slot is freed in removeSequence, which logs nothing: for a finished
//     answer just before the final chunk is written (the stream's end), for
//     a request whose client left once its prefill is over and the first
//     sampled token finds the request gone (the runner never checks during
//     prefill). A request waiting for that slot is handed the semaphore at
//     once, so the waiting request's "loading cache slot" line is the
//     release too; nothing marks a release nobody waited for.
//   - Before the runner, ollama's server holds its own semaphore of the same
//     size (llm/server.go, released when the client leaves), so the runner's
//     queue is the only one that outlasts a disconnect.
//
// slog's text handler stamps each line with millisecond precision in the
// host's clock, the clock the client stamps with.

import (
	"bufio"
	"os"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"
)

// slotLine is one "loading cache slot" line.
type slotLine struct {
	at                                time.Time
	id, cache, prompt, used, remained int
}

var slotLineRe = regexp.MustCompile(`^time=(\S+) level=DEBUG source=\S+ msg="loading cache slot" id=(\d+) cache=(\d+) prompt=(\d+) used=(\d+) remaining=(\d+)`)

// slogTime is slog's text handler time layout.
const slogTime = "2006-01-02T15:04:05.000Z07:00"

// engineLog reads the slot lines one server appends to its log.
type engineLog struct {
	path   string
	offset int64     // lines before it belong to earlier requests
	since  time.Time // and so do lines stamped before this (a line can reach the file after its answer)
}

// markLog starts reading path's slot lines from its current end, taking
// only lines stamped from now on.
func markLog(t *testing.T, path string) *engineLog {
	t.Helper()
	return &engineLog{path: path, offset: fileSize(t, path), since: time.Now()}
}

// readLines calls f with each line of the file at path from offset on.
func readLines(t *testing.T, path string, offset int64, f func(line string)) {
	t.Helper()
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.Seek(offset, 0); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f(sc.Text())
	}
}

// slots returns the slot lines written since the mark, in log order.
func (l *engineLog) slots(t *testing.T) []slotLine {
	t.Helper()
	var out []slotLine
	readLines(t, l.path, l.offset, func(line string) {
		m := slotLineRe.FindStringSubmatch(line)
		if m == nil {
			return
		}
		at, err := time.Parse(slogTime, m[1])
		if err != nil {
			t.Fatalf("slot line time %q: %v", m[1], err)
		}
		if at.Before(l.since.Truncate(time.Millisecond)) {
			return
		}
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		out = append(out, slotLine{at: at, id: n(2), cache: n(3), prompt: n(4), used: n(5), remained: n(6)})
	})
	return out
}

// waitSlots waits until at least n slot lines were written since the mark
// (the server writes the log through a pipe from its runner: a line can
// trail the response) and returns them.
func (l *engineLog) waitSlots(t *testing.T, n int) []slotLine {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := l.slots(t)
		if len(s) >= n {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d \"loading cache slot\" lines since the mark, want %d (is the server running with OLLAMA_DEBUG=1?)", l.path, len(s), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sample is one request of a test: what the client measured, the proxy's
// record of it and the engine's slot line.
type sample struct {
	label  string // for messages: "burst 2 request 3", "conversation 4 turn 2"
	resp   *response
	obs    observed
	prompt int // prompt tokens, from the usage the client read (0: none)
	rec    record
	slot   slotLine
}

// truthQueue is the request's wait for a slot in the engine: its slot
// line's time − its arrival there, the client's send and the connect the
// proxy measured (a socket's handshake, not an inference; zero on a pooled
// connection). The connect matters where an engine drops the SYNs of a
// burst: llama-server's listen backlog is 5, and the sixth of eight
// simultaneous dials waited 1 s for the SYN's retransmission, which the
// proxy reports as connect, not queue.
func (s *sample) truthQueue() time.Duration {
	return max(0, s.slot.at.Sub(s.resp.sent)-max(0, time.Duration(s.rec.Connect)))
}

// truthPrefill is from the slot line to the client's first output.
func (s *sample) truthPrefill() time.Duration { return s.obs.firstOutput.Sub(s.slot.at) }

// pairSlots gives each sample its slot line: lines and samples are grouped
// by prompt tokens (the tests make them mostly distinct). A sample's line
// lies between its send and its first output; within a group of equal
// prompts each sample, earliest first output first, takes the earliest
// line left that fits (a request whose client left, with no first output,
// last). The caller gives a sample without a usage its prompt tokens.
func pairSlots(t *testing.T, ss []*sample, lines []slotLine) {
	t.Helper()
	byPrompt := map[int][]slotLine{}
	for _, l := range lines {
		byPrompt[l.prompt] = append(byPrompt[l.prompt], l)
	}
	want := map[int][]*sample{}
	for _, s := range ss {
		want[s.prompt] = append(want[s.prompt], s)
	}
	deadline := func(s *sample) time.Time {
		if s.obs.firstOutput.IsZero() {
			return time.Unix(1<<40, 0)
		}
		return s.obs.firstOutput
	}
	for p, group := range want {
		ls := byPrompt[p]
		if len(ls) != len(group) {
			t.Fatalf("%d requests with %d prompt tokens (first: %s) but %d slot lines with prompt=%d", len(group), p, group[0].label, len(ls), p)
		}
		sort.SliceStable(group, func(a, b int) bool { return deadline(group[a]).Before(deadline(group[b])) })
		used := make([]bool, len(ls))
		for _, s := range group {
			found := false
			for i, l := range ls {
				// slog truncates to the millisecond.
				if used[i] || l.at.Before(s.resp.sent.Add(-time.Millisecond)) || l.at.After(deadline(s)) {
					continue
				}
				s.slot, used[i], found = l, true, true
				break
			}
			if !found {
				t.Fatalf("%s (%d prompt tokens, sent %s, first output %s): no slot line left between its send and its first output",
					s.label, p, s.resp.sent.Format(slogTime), s.obs.firstOutput.Format(slogTime))
			}
		}
	}
}

// pairRecords gives each sample its proxy record: grouped by prompt tokens
// and, within a group, paired by send against t_recv. Records without a
// prompt count (a request whose client left) pair with samples without one.
func pairRecords(t *testing.T, ss []*sample, recs []record) {
	t.Helper()
	byPrompt := map[int][]record{}
	for _, r := range recs {
		p := 0
		if r.PromptTokens >= 0 && !r.Failed {
			p = int(r.PromptTokens)
		}
		byPrompt[p] = append(byPrompt[p], r)
	}
	want := map[int][]*sample{}
	for _, s := range ss {
		p := s.prompt
		if s.obs.usage == nil {
			p = 0
		}
		want[p] = append(want[p], s)
	}
	for p, group := range want {
		rs := byPrompt[p]
		if len(rs) != len(group) {
			t.Fatalf("%d requests with %d prompt tokens (first: %s) but %d proxy records", len(group), p, group[0].label, len(rs))
		}
		sort.SliceStable(group, func(a, b int) bool { return group[a].resp.sent.Before(group[b].resp.sent) })
		sort.SliceStable(rs, func(a, b int) bool { return rs[a].Start.Before(rs[b].Start) })
		for i, s := range group {
			s.rec = rs[i]
			if d := s.rec.Start.Sub(s.resp.sent); d < -time.Millisecond || d > time.Second {
				t.Fatalf("%s: its record's t_recv is %.1f ms after its send: paired wrong", s.label, ms(d))
			}
		}
	}
}
