package histo

// Slot learning parameters. The evidence of the last slotWindow requests
// that found others in the engine is kept, so that a restarted engine with
// fewer slots is followed.
const (
	slotWindow = 1024
	maxSlots   = 1024
	// hintRefuted is the number of requests that waited for a free slot
	// with fewer streams in the engine than --engine-slots says it has
	// before the hint is set aside. A wait the engine's KV cache explains
	// (kv_bound) is not one of them.
	hintRefuted = 2
)

// Slot states, in the snapshot's engine_slots.state.
const (
	SlotsLearned   = "learned"        // no hint: the count is what was observed
	SlotsHint      = "hint"           // the hint, not contradicted (evidence may be short of it)
	SlotsHintLow   = "hint_too_small" // more streams ran at once than the hint allows
	SlotsHintHigh  = "hint_too_large" // requests waited for a slot with fewer in the engine
	slotsUnlearned = 0
)

// SlotsSection is the engine's slot count as the occupancy split uses it.
type SlotsSection struct {
	Hint         Count  `json:"hint"`      // --engine-slots; null when not given
	Learned      Count  `json:"learned"`   // from observation; null before any request found company
	Effective    int    `json:"effective"` // what the split uses
	State        string `json:"state"`
	Observations int64  `json:"observations"` // requests behind Learned (the last slotWindow)
	Waited       int64  `json:"waited"`       // of them, those whose first output came right after another's end
	// KVBound is, of Waited, those during whose wait the engine's /metrics
	// reported requests waiting with its KV cache at least kvFull used:
	// the KV cache, not a sequence slot, held them (vLLM under KV
	// pressure), so they are no evidence against the hint. It says why
	// fewer than the slots ran at once; 0 without /metrics.
	KVBound int64 `json:"kv_bound"`
	// ResponseHead is when the engine sends its response head, as learned
	// from the traffic (HeadUnknown … HeadFirstOutput): at slot start the
	// head is the split's evidence (queue_source "headers").
	ResponseHead string `json:"response_head"`
}

// slotLearner learns the engine's effective concurrency. Each request
// that found others in the engine gives a lower bound, the streams in the
// engine at its first output (streams of the requests ahead that had not
// ended, and itself), and says whether it waited for an end. It is
// guarded by occupancy.mu.
type slotLearner struct {
	hint    int
	streams [slotWindow]uint16 // lower bounds, oldest at next once full
	waited  [slotWindow]bool   // the request waited for an end (tight)
	below   [slotWindow]bool   // … with fewer in the engine than the hint, not kvBound
	kv      [slotWindow]bool   // … while the engine said its KV cache held requests back
	next, n int
	counts  [maxSlots + 1]int32 // lower bounds in the window, by value
	top     int                 // no count above it is non-zero
	nBelow  int                 // waited with fewer in the engine than the hint
	tight   int                 // waited, any count
	nKV     int                 // waited while the KV cache held requests back
	state   string              // last reported state
}

func newSlotLearner(hint int) slotLearner {
	l := slotLearner{hint: min(hint, maxSlots), state: SlotsLearned}
	if hint > 0 {
		l.state = SlotsHint
	}
	return l
}

// observe adds one request's evidence: streams, a hard lower bound on the
// slots, and, when it waited for another's end, inEngine, the requests in
// the engine then, and kvBound, whether the engine reported its KV cache
// full with requests waiting during that wait (kvHeld); it reports
// whether the state has just turned to a disagreement with the hint.
func (l *slotLearner) observe(streams, inEngine int, waited, kvBound bool) bool {
	streams = min(max(streams, 1), maxSlots)
	if l.n == slotWindow {
		old := int(l.streams[l.next])
		l.counts[old]--
		if l.waited[l.next] {
			l.tight--
		}
		if l.below[l.next] {
			l.nBelow--
		}
		if l.kv[l.next] {
			l.nKV--
		}
		l.n--
	}
	kv := waited && kvBound
	// A wait with fewer in the engine than the hint refutes it only when
	// a slot, not the KV cache, can have held it: on a continuous-batching
	// engine short of KV cache a right hint (vLLM's max_num_seqs) sees
	// requests wait with sequence slots free.
	below := waited && inEngine < l.hint && !kv
	l.streams[l.next], l.waited[l.next], l.below[l.next], l.kv[l.next] = uint16(streams), waited, below, kv
	l.next = (l.next + 1) % slotWindow
	l.n++
	l.counts[streams]++
	l.top = max(l.top, streams)
	if waited {
		l.tight++
	}
	if below {
		l.nBelow++
	}
	if kv {
		l.nKV++
	}
	st := l.stateNow()
	changed := st != l.state && (st == SlotsHintLow || st == SlotsHintHigh)
	l.state = st
	return changed
}

// learned is the most streams a request of the window ran beside (itself
// included), 0 before any evidence. A stream count is hard evidence: the
// requests ahead that had not let their slots go by its first output, and
// itself, were all in slots at once.
func (l *slotLearner) learned() int {
	for l.top > 0 && l.counts[l.top] == 0 {
		l.top--
	}
	return l.top
}

func (l *slotLearner) stateNow() string {
	lrn := l.learned()
	switch {
	case l.hint == 0:
		return SlotsLearned
	case lrn > l.hint:
		return SlotsHintLow
	case l.nBelow >= hintRefuted:
		return SlotsHintHigh
	}
	return SlotsHint
}

// effective is the slot count the split uses: the hint unless the
// evidence contradicts it, else what was learned, and 1 before anything
// was learned (a request that ran beside others raises it for itself).
func (l *slotLearner) effective() int {
	if l.state == SlotsHint {
		return l.hint
	}
	return max(l.learned(), 1)
}

func (l *slotLearner) section() SlotsSection {
	s := SlotsSection{Hint: -1, Learned: -1, Effective: l.effective(), State: l.state,
		Observations: int64(l.n), Waited: int64(l.tight), KVBound: int64(l.nKV)}
	if l.hint > 0 {
		s.Hint = Count(l.hint)
	}
	if lrn := l.learned(); lrn > 0 {
		s.Learned = Count(lrn)
	}
	return s
}
