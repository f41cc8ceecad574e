package conformance

// llama.cpp's llama-server as a second real engine (issue 23 measured the
// split's misses on it first). The suite does not build it: the CI builds
// ollama only (scripts/real-engine.sh), and docs/real-engine.md says how
// the llama-server figures were taken by hand. These tests skip, loudly,
// unless ANVIL_LLAMA_SERVER is its base URL, ANVIL_LLAMA_SERVER_LOG its
// log file and ANVIL_LLAMA_SERVER_SLOTS its --parallel.
//
// The truth is llama-server's own log, read from tools/server/server.cpp:
//
//   - A request becomes a task when its handler posts it; the server's
//     loop hands a task to an idle slot in launch_slot_with_task, which
//     logs `slot launch_slot_: id  0 | task 12 | processing task` (INF).
//   - Its prefill starts when update_slots first puts its prompt's tokens
//     in a batch: it stamps t_start_process_prompt, from which its
//     timings.prompt_ms runs, and logs `slot update_slots: id  0 | task 12
//     | new prompt, n_ctx_slot = 32768, n_keep = 0, n_prompt_tokens = 118`
//     (the usage's prompt_tokens). That is the end of its queue (the design's
//     "before prefill started"). It can come long after the launch: the
//     loop fills a batch of n_batch (2,048) tokens slot by slot and stops
//     when it is full, so a slot launched while another's long prompt
//     fills every batch waits, launched, until that prompt's last batch
//     leaves room (a second slot waited 1.0 s so here).
//   - With --log-timestamps and --log-prefix each line starts with the
//     time since the logger started, M.SS.mmm.uuu, and its level: `0.05.123.456 I `.
//     The logger's start on the host clock is not in the log; calibrate
//     places it from requests sent straight to an idle server, whose slot
//     starts the moment they arrive.

import (
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// llamaEngine names the engine of the llama-server captures: the source
// of mid-2025 that docs/real-engine.md builds (it reports timings.prompt_n,
// not yet cache_n).
const llamaEngine = "llama.cpp llama-server (source of 2025-06)"

// llamaServer returns llama-server's base URL, log file and slot count, or
// skips the test, loudly.
func llamaServer(t *testing.T) (url, logPath string, slots int) {
	t.Helper()
	url, logPath = os.Getenv("ANVIL_LLAMA_SERVER"), os.Getenv("ANVIL_LLAMA_SERVER_LOG")
	slots, _ = strconv.Atoi(os.Getenv("ANVIL_LLAMA_SERVER_SLOTS"))
	if url == "" || logPath == "" || slots < 1 {
		t.Skip("SKIP llama-server conformance: ANVIL_LLAMA_SERVER, ANVIL_LLAMA_SERVER_LOG and ANVIL_LLAMA_SERVER_SLOTS are not set (docs/real-engine.md, \"llama-server\")")
	}
	return url, logPath, slots
}

// TestQueueSplitLlamaServer: llama-server with --parallel N, bursts of 4
// and 8 requests sent at once, through a proxy given no flags and one
// given the right --engine-slots, as TestQueueSplitMultiSlot does for
// ollama; the truth is llama-server's log of when each prefill began.
func TestQueueSplitLlamaServer(t *testing.T) {
	url, logPath, slots := llamaServer(t)
	warmEngine(t, url)
	lg := calibrate(t, url, logPath)
	var all []*sample
	for _, hint := range []int{0, slots} {
		name := "nohint"
		if hint > 0 {
			name = "hint" + strconv.Itoa(hint)
		}
		t.Run(name, func(t *testing.T) {
			st := newStackOn(t, url, histo.Config{EngineSlots: hint})
			// Prompts of 3,000–5,100 characters (about a token each: the
			// vocabulary falls back to bytes): 0.5–2 s of prefill for
			// llama-server on one thread, whose cost grows with the
			// prompt's square; waits of seconds, as in issue 23.
			ss := burstsThrough(t, st, lg.mark, []int{4, 8}, 3000)
			all = append(all, ss...)
			writeCapture(t, st, llamaEngine, "llamaserver-np"+strconv.Itoa(slots)+"-"+name, slots, hint, ss)
			if s := st.rec.Slots(); hint > 0 && (s.State == histo.SlotsHintLow || s.State == histo.SlotsHintHigh) {
				barMissed(t, "the right hint %d was reported %q (learned %d)", hint, s.State, s.Learned)
			}
			sources := map[histo.QueueSource]int{}
			for _, s := range ss {
				sources[s.rec.QueueSource]++
			}
			t.Logf("queue sources: %v", sources)
		})
	}
	checkQueueBar(t, all)
}

// llamaLog reads llama-server's slot starts from its log.
type llamaLog struct {
	path   string
	offset int64     // lines before it belong to earlier requests
	zero   time.Time // the logger's start on the host clock
}

var (
	llamaLaunchRe = regexp.MustCompile(`^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) I slot launch_slot_: id +(\d+) \| task (\d+) \| processing task`)
	llamaPromptRe = regexp.MustCompile(`^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) I slot update_slots: id +\d+ \| task (\d+) \| new prompt, .*n_prompt_tokens = (\d+)`)
	ansiRe        = regexp.MustCompile("\x1b\\[[0-9;]*m")
)

// mark starts reading slot lines at the log's current end.
func (l *llamaLog) mark(t *testing.T) slotSource {
	t.Helper()
	return &llamaLog{path: l.path, offset: fileSize(t, l.path), zero: l.zero}
}

// starts returns, in log order of launch, each task's prefill start since
// the mark (time since the logger's start) with its slot, prompt tokens and
// launch; a task whose prompt line is not written yet is left out.
func (l *llamaLog) starts(t *testing.T) []llamaStart {
	t.Helper()
	var order []int
	byTask := map[int]*llamaStart{}
	readLines(t, l.path, l.offset, func(line string) {
		line = ansiRe.ReplaceAllString(line, "")
		n := func(s string) int { v, _ := strconv.Atoi(s); return v }
		if m := llamaLaunchRe.FindStringSubmatch(line); m != nil {
			task := n(m[6])
			byTask[task] = &llamaStart{launch: logTime(m), slot: n(m[5])}
			order = append(order, task)
		} else if m := llamaPromptRe.FindStringSubmatch(line); m != nil {
			if s := byTask[n(m[5])]; s != nil {
				s.rel, s.prompt = logTime(m), n(m[6])
			}
		}
	})
	var out []llamaStart
	for _, task := range order {
		if s := byTask[task]; s.prompt > 0 {
			out = append(out, *s)
		}
	}
	return out
}

// llamaStart is one task's start in the log, times since the logger's
// start.
type llamaStart struct {
	rel          time.Duration // its prefill's start: the "new prompt" line
	launch       time.Duration // its slot's: the "processing task" line
	slot, prompt int
}

// logTime reads a line's M.SS.mmm.uuu, the submatches 1 to 4 of m.
func logTime(m []string) time.Duration {
	n := func(s string) time.Duration { v, _ := strconv.Atoi(s); return time.Duration(v) }
	return n(m[1])*time.Minute + n(m[2])*time.Second + n(m[3])*time.Millisecond + n(m[4])*time.Microsecond
}

// waitSlots waits until at least n tasks started since the mark and
// returns them as slot lines on the host clock.
func (l *llamaLog) waitSlots(t *testing.T, n int) []slotLine {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ss := l.starts(t)
		if len(ss) >= n {
			out := make([]slotLine, len(ss))
			for i, s := range ss {
				out[i] = slotLine{at: l.zero.Add(s.rel), id: s.slot, prompt: s.prompt}
				if d := s.rel - s.launch; d > time.Millisecond {
					t.Logf("task of %d prompt tokens: launched on slot %d %.1f ms before its prefill began", s.prompt, s.slot, ms(d))
				}
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d \"processing task\" lines since the mark, want %d (is llama-server running with --log-timestamps --log-prefix?)", l.path, len(ss), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// calibrate places the log's zero on the host clock: each of a few
// requests sent straight to the idle server took its slot as it arrived,
// so its send − its start's time in the log is the zero less the
// request's way in (a fraction of a millisecond on loopback); the latest
// of those is the closest. It logs their spread, the calibration's error.
func calibrate(t *testing.T, url, logPath string) *llamaLog {
	t.Helper()
	l := &llamaLog{path: logPath}
	var zeros []time.Time
	for range 5 {
		l.offset = fileSize(t, logPath)
		r := do(t, url, "/v1/chat/completions", chatBody(freshPrompt(300)), "", 0)
		if r.status != 200 {
			t.Fatalf("calibration request: status %d", r.status)
		}
		var ss []llamaStart
		for deadline := time.Now().Add(5 * time.Second); len(ss) == 0; time.Sleep(20 * time.Millisecond) {
			if ss = l.starts(t); len(ss) == 0 && time.Now().After(deadline) {
				t.Fatalf("%s: no \"processing task\" line for a calibration request (--log-timestamps --log-prefix?)", logPath)
			}
		}
		zeros = append(zeros, r.sent.Add(-ss[0].rel))
	}
	early, late := zeros[0], zeros[0]
	for _, z := range zeros {
		early, late = minTime(early, z), maxTime(late, z)
	}
	t.Logf("llama-server's log zero placed from %d idle requests; their spread %.2f ms", len(zeros), ms(late.Sub(early)))
	l.zero = late
	return l
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
