package snapshot

import (
	"fmt"
	"reflect"

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
	field  int // Timing field read, by index
}

// value returns stem s of t in the v1 unit; each stem reads its own key, so
// a benchmark file's legacy duplicates are summarized as written.
func (s stem) value(t *Timing) Num { return timingValue(t, s.field) }

// extPhase is a distribution of the anvilproxy extension, keyed as in the
// document.
type extPhase struct {
	key    string
	metric histo.Metric
}

var (
	// timingFields is the Timing field of each metric's Key; −1 for the
	// per-event metrics, which have none.
	timingFields [histo.NumMetrics]int
	// aliasFields are the Timing fields of each metric's aliases.
	aliasFields [histo.NumMetrics][]int
	// stems are the benchmark's distributions, with the histogram behind each.
	stems []stem
	// phases are the extension's distributions.
	phases []extPhase
)

func init() {
	for m := range histo.NumMetrics {
		ph := m.Phase()
		timingFields[m] = -1
		if ph.Key != "" {
			timingFields[m] = timingField(ph.Key)
		}
		if !ph.V1 {
			phases = append(phases, extPhase{ph.Name + "_ms", m})
			continue
		}
		stems = append(stems, stem{ph.Name, ph.Unit == histo.Microseconds, m, timingFields[m]})
		for _, a := range ph.Aliases {
			aliasFields[m] = append(aliasFields[m], timingField(a.Key))
			stems = append(stems, stem{a.Stem, a.Ms, m, timingField(a.Key)})
		}
	}
}

// timingField is the index of Timing's field with JSON name key. A key
// that Timing lacks is a bug in the phase table, caught at init.
func timingField(key string) int {
	t := reflect.TypeFor[Timing]()
	for i := range t.NumField() {
		if t.Field(i).Tag.Get("json") == key {
			return i
		}
	}
	panic(fmt.Sprintf("BUG: the phase table's key %q is not a request_timings key", key))
}

// timingValue reads field i of t in the v1 unit: NaN when unknown (a
// negative count, or no field).
func timingValue(t *Timing, i int) Num {
	if i < 0 {
		return nan
	}
	f := reflect.ValueOf(t).Elem().Field(i)
	if f.Kind() == reflect.Float64 {
		return Num(f.Float())
	}
	if c := f.Int(); c >= 0 {
		return Num(c)
	}
	return nan
}

// setTiming sets field i of t from a v1 value, NaN for unknown (−1 in a
// count field).
func setTiming(t *Timing, i int, v float64) {
	f := reflect.ValueOf(t).Elem().Field(i)
	if f.Kind() == reflect.Float64 {
		f.SetFloat(v)
		return
	}
	if v != v {
		f.SetInt(-1)
		return
	}
	f.SetInt(int64(v))
}

// metricValue returns the value of metric m of t in the v1 unit (NaN when
// unknown or recorded per event).
func metricValue(t *Timing, m histo.Metric) Num { return timingValue(t, timingFields[m]) }

// putPhases sets t's fields of every per-request metric, and of their
// aliases, from rq.
func putPhases(t *Timing, rq *histo.Request) {
	for m := range histo.NumMetrics {
		if timingFields[m] < 0 {
			continue
		}
		v := m.Value(rq)
		setTiming(t, timingFields[m], v)
		for _, i := range aliasFields[m] {
			setTiming(t, i, v)
		}
	}
}
