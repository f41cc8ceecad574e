package snapshot

import (
	"fmt"

	"github.com/anvilproxy/anvilproxy/histo"
)

// The snapshot's view of histo's phase table (Metric.Phase): the v1
// metrics stems, the extension's distributions, and the request_timings
// field of every per-request metric, all derived from the table's rows so
// that a phase added there appears here. Read-only after package init.

// stem is a distribution of the benchmark's metrics object.
type stem struct {
	name   string
	ms     bool // the statistics' keys end in _ms
	metric histo.Metric
	key    string // the request_timings key read
}

// value returns stem s of t in the v1 unit; each stem reads its own key, so
// a benchmark file's legacy duplicates are summarized as written.
func (s stem) value(t *Timing) Num { return timingValue(t, s.key) }

// extPhase is a distribution of the anvilproxy extension, keyed as in the
// document.
type extPhase struct {
	key    string
	metric histo.Metric
}

var (
	// stems are the benchmark's distributions, with the histogram behind each.
	stems []stem
	// phases are the extension's distributions.
	phases []extPhase
)

func init() {
	for m := range histo.NumMetrics {
		ph := m.Phase()
		if ph.Key != "" {
			timingSlot(new(Timing), ph.Key) // a key Timing lacks is a bug, caught here
		}
		if !ph.V1 {
			phases = append(phases, extPhase{ph.Name + "_ms", m})
			continue
		}
		stems = append(stems, stem{ph.Name, ph.Unit == histo.Microseconds, m, ph.Key})
		for _, a := range ph.Aliases {
			timingSlot(new(Timing), a.Key)
			stems = append(stems, stem{a.Stem, a.Ms, m, a.Key})
		}
	}
}

// timingSlot is the field of t with JSON name key, as exactly one
// non-nil pointer: the request_timings keys of the phase table's rows and
// aliases (TestTimingSlots checks each against Timing's tags). A key that
// Timing lacks is a bug in the phase table.
func timingSlot(t *Timing, key string) (*Num, *histo.Count) {
	switch key {
	case "time_to_first_output_ms":
		return &t.TimeToFirstOutputMs, nil
	case "ttft_ms":
		return &t.TtftMs, nil
	case "queue_ms":
		return &t.QueueMs, nil
	case "prefill_ms":
		return &t.PrefillMs, nil
	case "reasoning_ms":
		return &t.ReasoningMs, nil
	case "generation_ms":
		return &t.GenerationMs, nil
	case "tpot_ms":
		return &t.TpotMs, nil
	case "mean_inter_token_latency_ms":
		return &t.MeanInterTokenLatencyMs, nil
	case "mean_time_per_output_token_ms":
		return &t.MeanTimePerOutputTokenMs, nil
	case "e2e_ms":
		return &t.E2EMs, nil
	case "connect_ms":
		return &t.ConnectMs, nil
	case "decode_tok_s":
		return &t.DecodeTokS, nil
	case "effective_prefill_tok_s":
		return &t.EffectivePrefillTokS, nil
	case "prompt_tokens":
		return nil, &t.PromptTokens
	case "output_tokens":
		return nil, &t.OutputTokens
	}
	panic(fmt.Sprintf("BUG: the phase table's key %q is not a request_timings key", key))
}

// timingValue reads t's value under key in the v1 unit: NaN when unknown
// (a negative count, or no key).
func timingValue(t *Timing, key string) Num {
	if key == "" {
		return nan
	}
	num, count := timingSlot(t, key)
	if num != nil {
		return *num
	}
	if *count >= 0 {
		return Num(*count)
	}
	return nan
}

// setTiming sets t's value under key from a v1 value, NaN for unknown (−1
// in a count field).
func setTiming(t *Timing, key string, v float64) {
	num, count := timingSlot(t, key)
	if num != nil {
		*num = Num(v)
		return
	}
	*count = -1
	if v == v {
		*count = histo.Count(v)
	}
}

// metricValue returns the value of metric m of t in the v1 unit (NaN when
// unknown or recorded per event).
func metricValue(t *Timing, m histo.Metric) Num { return timingValue(t, m.Phase().Key) }

// putPhases sets t's fields of every per-request metric, and of their
// aliases, from rq.
func putPhases(t *Timing, rq *histo.Request) {
	for m := range histo.NumMetrics {
		ph := m.Phase()
		if ph.Key == "" {
			continue
		}
		v := m.Value(rq)
		setTiming(t, ph.Key, v)
		for _, a := range ph.Aliases {
			setTiming(t, a.Key, v)
		}
	}
}
