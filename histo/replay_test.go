package histo_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// replayTimeline is a timeline the real-engine suite captured
// (proxy/conformance/capture_test.go, ANVIL_SPLIT_CAPTURE): the Traces one
// proxy recorded in front of ollama, in Record order, and the engine's
// truth for the requests the suite paired with ollama's slot log.
type replayTimeline struct {
	Name   string            `json:"name"`
	Slots  int               `json:"slots"`
	Hint   int               `json:"engine_slots_hint"`
	Raw    []json.RawMessage `json:"traces"`
	Traces []proxy.Trace     `json:"-"`
	// Calls is the order of the proxy's calls into the Recorder, where
	// the capture has it (session 8 on): "first" (FirstOutput) or
	// "record" (Record), by request ID.
	Calls []struct {
		Op string `json:"op"`
		ID uint64 `json:"id"`
	} `json:"calls"`
	Truth []struct {
		ID      uint64  `json:"id"`
		QueueMs float64 `json:"queue_ms"`
		Used    int64   `json:"used"` // prompt tokens the engine reused (agent runs)
	} `json:"truth"`
	LoadAverage string `json:"load_average"`
}

// replay feeds tl's Traces to a fresh Recorder as the proxy did. With the
// captured calls it makes them in their order, so that the live table
// holds at each Record what it held live; without (the captures before
// session 8), each request's first output when its stamp came, each
// Record in the captured order at its request's end.
func replay(t *testing.T, tl *replayTimeline) *histo.Recorder {
	t.Helper()
	rec, err := histo.New(histo.Config{EngineSlots: tl.Hint}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if len(tl.Calls) > 0 {
		byID := make(map[uint64]*proxy.Trace, len(tl.Traces))
		for i := range tl.Traces {
			byID[tl.Traces[i].ID] = &tl.Traces[i]
		}
		// As the proxy makes them: at most one first output, before the
		// request's one Record.
		const first, recorded = 1, 2
		seen := make(map[uint64]int, len(tl.Traces))
		for _, c := range tl.Calls {
			tr, ok := byID[c.ID]
			if !ok {
				t.Fatalf("%s: call %s for request %d, which has no Trace", tl.Name, c.Op, c.ID)
			}
			cp := *tr
			switch c.Op {
			case "first":
				if seen[c.ID] != 0 {
					t.Fatalf("%s: a first output of request %d after its first output or Record", tl.Name, c.ID)
				}
				seen[c.ID] = first
				rec.FirstOutput(&cp)
			case "record":
				if seen[c.ID] == recorded {
					t.Fatalf("%s: request %d recorded twice", tl.Name, c.ID)
				}
				seen[c.ID] = recorded
				rec.Record(&cp)
			default:
				t.Fatalf("%s: unknown call %q", tl.Name, c.Op)
			}
		}
		if len(seen) != len(byID) {
			t.Fatalf("%s: calls for %d of its %d requests", tl.Name, len(seen), len(byID))
		}
		return rec
	}
	firsts := make([]*proxy.Trace, 0, len(tl.Traces))
	for i := range tl.Traces {
		if !tl.Traces[i].FirstOutput.IsZero() {
			firsts = append(firsts, &tl.Traces[i])
		}
	}
	sort.SliceStable(firsts, func(a, b int) bool { return firsts[a].FirstOutput.Before(firsts[b].FirstOutput) })
	next := 0
	for i := range tl.Traces {
		tr := &tl.Traces[i]
		at := tr.ClientDone
		if at.IsZero() {
			at = tr.End
		}
		for next < len(firsts) && !firsts[next].FirstOutput.After(at) {
			rec.FirstOutput(firsts[next])
			next++
		}
		cp := *tr
		rec.Record(&cp)
	}
	return rec
}

// TestReplayOllama splits again the timelines captured against ollama
// v0.17.4 (llamarunner, OLLAMA_NUM_PARALLEL 1, 2 and 4, on the shared
// 2-core host; docs/queue-split.md "Measured against ollama") and holds
// the queues to the engine's slot log with the real-engine suite's bar,
// max(25 ms, 10%) of the truth, for at least replayBars of each slot
// count's requests. The data are the engine's, not a model of it: the
// batch lock, the order its handlers race in, the slot freed at the
// stream's end, a prefill that runs on after its client left. The split
// is deterministic given the Traces, so the figures are exact.
func TestReplayOllama(t *testing.T) {
	replaySet(t, "testdata/ollama/*.json", replayBars, nil)
}

// TestReplayOllamaWrongHint replays the quiet captures of 2 and 4 slots
// with a wrong --engine-slots, too large (slots + 2) and too small
// (slots − 1), as the sim's wrong-hint cases do (accuracy_slots_test.go):
// the engine's behaviour does not depend on the proxy's hint, so its
// captured Traces and slot log are a real engine's wrong-hint case.
// Issue 23 asks the split to hold its bar with a wrong hint too. Too
// small, it does (session 17: 2 slots 183 of 192, 95.3%; 4 slots 306 of
// 320, 95.6%): the first request that ran beside more streams than the
// hint sets it aside. Too large, it did not (176 of 192, 91.7%; 293 of
// 320, 91.6%): until two requests waited with fewer in the engine than
// the hint (hintRefuted), the split counted slots that are not there, and
// a waiter that took its slot at an end and then waited for ollama's
// batch lock, or shared its batches with the others that took theirs
// there, was not seen as one. With waitedWithLock it does: 186 of 192
// (96.9%) and 307 of 320 (95.9%), and every miss but one is missed with
// the right hint or none too (docs/queue-split.md "A wrong hint").
func TestReplayOllamaWrongHint(t *testing.T) {
	for _, c := range []struct {
		name string
		hint func(slots int) int
		bars map[int]float64
	}{
		{"too large", func(slots int) int { return slots + 2 }, map[int]float64{2: 0.95, 4: 0.95}},
		{"too small", func(slots int) int { return slots - 1 }, map[int]float64{2: 0.95, 4: 0.95}},
	} {
		t.Run(c.name, func(t *testing.T) {
			replaySet(t, "testdata/ollama/*-p[24]-*.json", c.bars, c.hint)
		})
	}
}

// TestReplayOllamaLoaded splits again the timelines captured against
// ollama while the shared host was loaded (session 8: the other helpers'
// work, or 2–4 busy loops beside the suite; histo/testdata/ollama/loaded,
// docs/real-engine.md), held to bars of their own: under load a request
// waiting for llamarunner's batch mutex wins its first unlock far more
// often and joins the holder at its first 512-token batch's end (24–38%
// of the P=4 waiters against 6–14% quiet), which the split's first-batch
// rule sees only for waiters whose slot came free as that prefill began.
// The bars are today's figures less a margin, so that a rule tuned on
// the quiet runs shows what it costs here.
func TestReplayOllamaLoaded(t *testing.T) {
	replaySet(t, "testdata/ollama/loaded/*.json", replayBarsLoaded, nil)
}

// TestReplayOllamaAbandoned holds every captured abandoned prefill (a
// 2,000-token prompt whose client left after 200 and 600 ms on one slot,
// a 600-token one next; quiet and loaded host) within the bar. The
// loaded sets' bar would let one through: in the full suite under load
// the cost model estimated the abandoned prefill at 362 ms where the
// engine took 2,249, ending the estimate before the client left at
// 600 ms, and the next request was given 1.3 ms of queue for 1,659
// (docs/queue-split.md "A client that left during prefill").
func TestReplayOllamaAbandoned(t *testing.T) {
	replaySet(t, "testdata/ollama/abandoned-*.json", map[int]float64{1: 1}, nil)
	replaySet(t, "testdata/ollama/loaded/abandoned-*.json", map[int]float64{1: 1}, nil)
}

// TestReplayLlamaServer splits again the timelines captured against
// llama.cpp's llama-server (the source of mid-2025 docs/real-engine.md
// builds by hand: --parallel 1, 2 and 4, one thread, bursts of 4 and 8
// fresh prompts of 3,000–5,100 tokens, waits of up to 9 s) and holds them
// to issue 23's bar against the engine's own log of when each prefill
// began, with the right hint, none, and a wrong one. The evidence is the
// engine's timings.prompt_ms (queue_source server_prefill): issue 23
// measured 137 of 216 within the bar on --parallel 2 before the split
// used it. What the engine does there that the proxy never sees: a slot
// launched while another's long prompt fills every 2,048-token batch
// waits in it, up to 5 s here, before its prefill begins (the queue
// ends there, as prompt_ms says, not at the launch), and a burst's sixth
// simultaneous dial waits 1 s for its SYN's retransmission (listen
// backlog 5: connect, not queue).
func TestReplayLlamaServer(t *testing.T) {
	bars := map[int]float64{1: 0.95, 2: 0.95, 4: 0.95}
	replaySet(t, "testdata/llamaserver/*.json", bars, nil)
	for _, c := range []struct {
		name string
		hint func(slots int) int
	}{
		{"too large", func(slots int) int { return slots + 2 }},
		{"too small", func(slots int) int { return max(slots-1, 1) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			replaySet(t, "testdata/llamaserver/*-np[24]-*.json", map[int]float64{2: 0.95, 4: 0.95}, c.hint)
		})
	}
	// A hint one short is set aside in every capture: no two outputs
	// overlap here (answers of milliseconds after prefills of seconds),
	// but the engine's reported prefills say how many held a slot at once
	// (heldAtStart).
	files, err := filepath.Glob("testdata/llamaserver/*-np[24]-*.json")
	require.NoError(t, err)
	for _, f := range files {
		tl := loadTimeline(t, f)
		tl.Hint = tl.Slots - 1
		require.Equal(t, histo.SlotsHintLow, replay(t, tl).Slots().State, "%s with --engine-slots %d", filepath.Base(f), tl.Hint)
	}
}

// loadTimeline reads a captured timeline.
func loadTimeline(t *testing.T, path string) *replayTimeline {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tl replayTimeline
	if err := json.Unmarshal(b, &tl); err != nil {
		t.Fatal(err)
	}
	tl.Traces = decodeTraces(t, tl.Raw)
	return &tl
}

// replaySet replays every timeline the glob names and holds each slot
// count's share of requests within max(25 ms, 10%) of the truth to bars.
// A capture run with the right hint must end with the hint standing
// (issue 23: a correct hint is never reported as wrong). wrongHint, when
// set, replaces each capture's hint with wrongHint(slots).
func replaySet(t *testing.T, glob string, bars map[int]float64, wrongHint func(slots int) int) {
	if g := os.Getenv("REPLAYGLOB"); g != "" { // one capture to look at: REPLAYGLOB=testdata/ollama/x.json
		t.Logf("REPLAYGLOB: %s replayed instead of %s; the bars of slot counts it lacks fail", g, glob)
		glob = g
	}
	files, err := filepath.Glob(glob)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no captured timelines in %s", glob)
	}
	within, total := map[int]int{}, map[int]int{}
	for _, f := range files {
		tl := loadTimeline(t, f)
		if wrongHint != nil {
			tl.Hint = wrongHint(tl.Slots)
		}
		rec := replay(t, tl)
		w, misses := checkReplay(t, rec, tl)
		state := rec.Slots().State
		t.Logf("%s (%d slots, hint %d, load %s): %d of %d within max(25 ms, 10%%), slots %s; misses: %s",
			filepath.Base(f), tl.Slots, tl.Hint, tl.LoadAverage, w, len(tl.Truth), state, strings.Join(misses, "; "))
		if tl.Hint == tl.Slots && state != histo.SlotsHint {
			t.Errorf("%s: the right hint (%d slots) reported as %s", filepath.Base(f), tl.Hint, state)
		}
		within[tl.Slots] += w
		total[tl.Slots] += len(tl.Truth)
	}
	for slots := range bars {
		if total[slots] == 0 {
			t.Errorf("no captured timeline of %d slots", slots)
		}
	}
	for slots, n := range total {
		share := float64(within[slots]) / float64(n)
		t.Logf("%d slots: %d of %d (%.1f%%) within the bar", slots, within[slots], n, 100*share)
		if bar, ok := bars[slots]; !ok || share < bar {
			t.Errorf("%d slots: %d of %d within the bar (%.1f%%), want ≥ %.0f%%", slots, within[slots], n, 100*share, 100*bar)
		}
	}
}

// replayBars is the share of each slot count's captured requests whose
// queue must be within the bar. Issue 23's is 95%; below it on 2 and 4
// slots are ollama's own work before the slot at a burst's arrival
// (tokenizing 8 prompts at once: 28–56 ms with nothing ahead, read as
// prefill), the engine's mutex race between requests that arrive within
// a millisecond (which of them joins the first batch), and prefills that
// ran twice their estimate on the loaded host (docs/queue-split.md
// "Measured against ollama"). Session 9: 72 of 72, 182 of 192, 234 of
// 256; session 10, with two agent runs more on 4 slots: 72, 182 and 304
// of 320 (95.0%); session 11 (tailBatchJoin): 72, 185 of 192 (96.4%) and
// 305 (95.3%), and 2 slots holds issue 23's bar, two requests to spare;
// session 17 holds 4 slots to it too (one to spare); with
// waitedWithLock: 72, 186 (96.9%) and 305. Session 19 added its live
// 4-slot agents run (*-s19run01.json, 31 of 32 live and replayed): 72,
// 186 and 368 of 384 (95.8%); its miss was a prefill the cost model put
// at 738 ms where ollama ran it alone in 272, and with the floor no
// higher than the fastest sample's per-token time allows
// (TestReplayPointOverEstimated): 72, 186 and 370 (96.4%). Its second run
// (*-s19run02.json: all of the suite's ollama cases, 1 run of each, the
// replays equal to live): 106 of 106, 209 of 216 (96.8%) and 421 of 440
// (95.7%). Its 4-slot burst of 8 with the right hint had three requests
// that took their slots with the first at once and shared its batches read
// as waiting for its prefill (+380 ms): ollama, that time, gave all four
// slots at the burst's arrival, and the prefill of 516 tokens that ran
// 138 ms alone took 383 beside the three others. A third (*-s19run03.json,
// every request within the bar live): 138 of 138, 233 of 240 (97.1%) and
// 477 of 496 (96.2%). Four runs of the bursts alone back to back
// (*-s19burst01..04.json; live 2 slots 23, 24, 20 and 23 of 24, 4 slots
// 23, 23, 24 and 22, as replayed, and as the session's first build reads
// them but for one request more): 138, 323 of 336 (96.1%) and 569 of 592
// (96.1%). The 2-slot run at 20 is ollama's handler race: eight requests
// sent within 0.7 ms were served in an order unrelated to their arrival.
// With the starts of near-simultaneous arrivals estimated by one model
// (TestReplayOrderByOneModel): 138, 323 and 572 (96.6%).
var replayBars = map[int]float64{1: 1, 2: 0.95, 4: 0.95}

// replayBarsLoaded is TestReplayOllamaLoaded's: the figures of session 8's
// last merge (1 slot 512 of 522, 2 slots 335 of 384, 4 slots 750 of 896,
// the agents' 8 conversations and the abandoned prefills included) less
// about two points. Session 9's: 512, 334 and 759; session 10's: 512, 334
// and 773 (86.3%); session 11's: 512, 341 (88.8%) and 776 (86.6%);
// with waitedWithLock: 512, 342 (89.1%) and 776; session 17 added its
// live run at host load 3.3 (*-s17run01.json, the replay equal to the
// live verdicts): 545 of 556, 361 of 408 (88.5%) and 829 of 952 (87.1%);
// with slotShort: 545, 364 (89.2%) and 829; session 18's kept end: 831;
// session 19's floor (prefillPoint): 546, 365 (89.5%) and 837 (87.9%);
// and one model for ordering (TestReplayOrderByOneModel): 841 (88.3%).
var replayBarsLoaded = map[int]float64{1: 0.96, 2: 0.85, 4: 0.84}

// decodeTraces decodes captured Traces. The prefix tracker's enums
// (Untracked, Drift) marshal as text and do not unmarshal; the split reads
// neither, so they are left at their zero values.
func decodeTraces(t *testing.T, raw []json.RawMessage) []proxy.Trace {
	t.Helper()
	out := make([]proxy.Trace, len(raw))
	for i, r := range raw {
		var m map[string]any
		if err := json.Unmarshal(r, &m); err != nil {
			t.Fatal(err)
		}
		if p, ok := m["Prefix"].(map[string]any); ok {
			delete(p, "Untracked")
			delete(p, "Drift")
		}
		delete(m, "Retry")
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// checkReplay compares the replayed records with the truth, logging one
// row per request in arrival order.
func checkReplay(t *testing.T, rec *histo.Recorder, tl *replayTimeline) (within int, misses []string) {
	t.Helper()
	byID := map[uint64]histo.Request{}
	for _, r := range rec.Recent(1 << 16) {
		byID[r.ID] = r
	}
	tr := map[uint64]*proxy.Trace{}
	for i := range tl.Traces {
		tr[tl.Traces[i].ID] = &tl.Traces[i]
	}
	rows := tl.Truth
	sort.SliceStable(rows, func(a, b int) bool { return tr[rows[a].ID].Admit.Before(tr[rows[b].ID].Admit) })
	for _, row := range rows {
		r, ok := byID[row.ID]
		if !ok {
			t.Fatalf("request %d: not recorded", row.ID)
		}
		truth := time.Duration(row.QueueMs * float64(time.Millisecond))
		got := "null"
		ok = false
		if r.Queue.Known() {
			d := time.Duration(r.Queue) - truth
			ok = d.Abs() <= queueTolerance(truth)
			got = fmt.Sprintf("%.1f (%+.1f)", r.Queue.Millis(), float64(d)/1e6)
		}
		if ok {
			within++
		} else {
			misses = append(misses, fmt.Sprintf("request %d: %s, truth %.1f", row.ID, got, row.QueueMs))
		}
		if testing.Verbose() {
			t.Logf("%s request %3d: truth %8.1f proxy %-18s %-10s inflight %d", tl.Name, row.ID, row.QueueMs, got, r.QueueSource, r.InflightAtAdmit)
		}
	}
	return within, misses
}

// TestReplayPointOverEstimated: in sessions 18's and 19's live 4-slot agent
// runs the cost model put a prefill at 424 ms where ollama took 270 and at
// 738 where it took 272 (it learns from prefills that shared ollama's
// batches, each timed as if alone), so a floor of 70% of the estimate
// rejected the end each waited for and sent it to its arrival, with all
// four slots held, and the lock on to a prefill end: queues 537 and 975 ms
// short. The floor is a lower bound no higher than half the fastest
// sample's per-token time (prefillPoint); every request of both runs is
// within the bar.
func TestReplayPointOverEstimated(t *testing.T) {
	for _, f := range []string{"testdata/ollama/agents-p4-s18run01.json", "testdata/ollama/agents-p4-s19run01.json"} {
		tl := loadTimeline(t, f)
		w, misses := checkReplay(t, replay(t, tl), tl)
		require.Equal(t, len(tl.Truth), w, "%s: misses: %v", f, misses)
	}
}

// TestReplayOrderByOneModel: in three of session 19's four 4-slot bursts
// of 8 without a hint, ollama served three requests admitted within 0.4 ms
// after request 8 first. Ordered by their estimated starts (first output
// less prefill), they were put behind it: their estimates were made when
// they were recorded, 139-182 ms, request 8's later, 470 ms, after the
// cost model had learned prefills that shared a batch; request 8 counted
// two ahead and read 237-634 ms short. Both starts are now estimated by
// the model of the request being placed (occupancy.prefillOf).
func TestReplayOrderByOneModel(t *testing.T) {
	for _, f := range []string{"01", "02", "04"} {
		tl := loadTimeline(t, "testdata/ollama/multislot-p4-nohint-s19burst"+f+".json")
		_, misses := checkReplay(t, replay(t, tl), tl)
		for _, m := range misses {
			require.NotContains(t, m, "request 8:", "burst run %s: %v", f, misses)
		}
	}
}
