package conformance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
)

// capture is the stack's Recorder: the histo.Recorder, and a copy of every
// Trace it was given, so that a test can write the engine's timeline as the
// proxy saw it beside the engine's truth (ANVIL_SPLIT_CAPTURE, below) and
// histo's replay test can split it again offline (histo/replay_test.go).
// A Trace holds stamps, sizes and counts, never prompt or completion text;
// the retry tracker's client identity is cleared. Safe for concurrent use:
// mu is held across each call into the Recorder, so traces and calls are
// in the order the Recorder saw them. Requests that end together are
// recorded concurrently, and a neighbour's first output can arrive between
// one's end and its Record: with the copy taken before the call and the
// lock released first, and the replay feeding first outputs by their
// stamps, 2 of 1,952 requests of session 8's 18 runs were split otherwise
// in replay than live (docs/real-engine.md "Session 8").
type capture struct {
	*histo.Recorder
	mu     sync.Mutex
	traces []proxy.Trace
	calls  []Call
}

// Call is one call into the Recorder, in the order it was made: "first"
// (FirstOutput, the live table) or "record" (Record).
type Call struct {
	Op string `json:"op"`
	ID uint64 `json:"id"`
}

// Record keeps a copy of tr and records it.
func (c *capture) Record(tr *proxy.Trace) {
	cp := *tr
	cp.Retry = retry.Result{}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.traces = append(c.traces, cp)
	c.calls = append(c.calls, Call{Op: "record", ID: tr.ID})
	c.Recorder.Record(tr)
}

// FirstOutput is the Recorder's (proxy.New finds it by type assertion).
func (c *capture) FirstOutput(tr *proxy.Trace) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, Call{Op: "first", ID: tr.ID})
	c.Recorder.FirstOutput(tr)
}

// Timeline is one captured case: the Traces in Record order, the calls
// into the Recorder in order (a replay that follows them feeds the live
// table exactly as the proxy did), and the engine's truth for those the
// test paired with a slot line.
type Timeline struct {
	Name        string        `json:"name"`
	Slots       int           `json:"slots"`             // the engine's OLLAMA_NUM_PARALLEL
	Hint        int           `json:"engine_slots_hint"` // histo.Config.EngineSlots (0: none)
	Traces      []proxy.Trace `json:"traces"`
	Calls       []Call        `json:"calls"`
	Truth       []TruthRow    `json:"truth"`
	Engine      string        `json:"engine"`
	LoadAverage string        `json:"load_average"`
}

// TruthRow is one request's truth: its slot line's time less the client's
// send (the queue the tests hold the proxy to), and the slot line itself.
type TruthRow struct {
	ID        uint64    `json:"id"`
	QueueMs   float64   `json:"queue_ms"`
	SlotStart time.Time `json:"slot_start"`
	Sent      time.Time `json:"client_sent"`
	Prompt    int       `json:"prompt"`
	Used      int       `json:"used"`
}

// ollamaEngine names the engine of the suite's captures.
const ollamaEngine = "ollama v0.17.4 (llamarunner)"

// writeCapture writes st's timeline in front of engine and ss's truth to
// $ANVIL_SPLIT_CAPTURE/<name>.json when that directory is set (histo's
// replay tests read such files from histo/testdata/ollama/ and
// histo/testdata/llamaserver/).
func writeCapture(t *testing.T, st *stack, engine, name string, slots, hint int, ss []*sample) {
	t.Helper()
	dir := os.Getenv("ANVIL_SPLIT_CAPTURE")
	if dir == "" {
		return
	}
	st.capture.mu.Lock()
	tl := Timeline{Name: name, Slots: slots, Hint: hint, Traces: append([]proxy.Trace(nil), st.capture.traces...), Calls: append([]Call(nil), st.capture.calls...), Engine: engine}
	st.capture.mu.Unlock()
	tl.LoadAverage = hostLoad()
	for _, s := range ss {
		if s.slot.at.IsZero() {
			continue
		}
		tl.Truth = append(tl.Truth, TruthRow{ID: s.rec.ID, QueueMs: ms(s.truthQueue()), SlotStart: s.slot.at, Sent: s.resp.sent, Prompt: s.slot.prompt, Used: s.slot.used})
	}
	b, err := json.MarshalIndent(tl, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("timeline written to %s", path)
}
