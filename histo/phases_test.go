package histo

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPhaseTable: every row is complete, names are unique, and each
// per-request row reads the Request field its Key names.
func TestPhaseTable(t *testing.T) {
	names := map[string]bool{}
	for m := range NumMetrics {
		row := &phases[m]
		require.NotEmpty(t, row.Name, "row %d is missing", m)
		require.False(t, names[row.Name], "%s twice", row.Name)
		names[row.Name] = true
		require.Equal(t, row.prom == "", row.labels == noProm, "%s: a Prometheus name goes with labels", row.Name)
		require.Equal(t, row.prom == "", row.help == "", "%s: a Prometheus name goes with help", row.Name)
		perRequest := m < numRequestMetrics
		require.Equal(t, perRequest, row.Key != "", "%s: per-request metrics have a Key, per-event ones none", row.Name)
		require.Equal(t, row.labels == perEvent, !perRequest, "%s: per-event rows are unlabeled", row.Name)
	}
	// Set every Request field that a row reads to a distinct value, and read
	// it back through the row.
	var rq Request
	v := reflect.ValueOf(&rq).Elem()
	want := map[Metric]float64{}
	for m := range numRequestMetrics {
		n := int64(m+1) * 1_000_000
		for j := range v.NumField() {
			if v.Type().Field(j).Tag.Get("json") != phases[m].Key {
				continue
			}
			switch f := v.Field(j); f.Kind() {
			case reflect.Float64:
				f.SetFloat(float64(n))
				want[m] = float64(n)
			default:
				f.SetInt(n)
				want[m] = float64(n)
				if phases[m].Unit == Microseconds {
					want[m] = float64(n) / 1e6 // nanoseconds → milliseconds
				}
			}
		}
	}
	for m := range numRequestMetrics {
		require.Contains(t, want, m, "%s: no Request field %q", m, phases[m].Key)
		require.Equal(t, want[m], m.Value(&rq), m.String())
		hv, ok := m.hdrValue(rq.phase(m))
		require.True(t, ok, m.String())
		require.Positive(t, hv, m.String())
	}
	require.True(t, math.IsNaN(MetricInterEvent.Value(&rq)), "per-event metrics have no per-request value")
}

// TestPhaseSlots: Request.slot gives, for every per-request row, exactly
// one pointer, to the field whose JSON name is the row's Key and whose
// type fits the row's unit; and setPhases puts every evaluated value
// there, unknown as null.
func TestPhaseSlots(t *testing.T) {
	var rq Request
	v := reflect.ValueOf(&rq).Elem()
	for m := range numRequestMetrics {
		span, rate, count := rq.slot(m)
		var addr any
		n := 0
		for _, p := range []any{span, rate, count} {
			if !reflect.ValueOf(p).IsNil() {
				addr, n = p, n+1
			}
		}
		require.Equal(t, 1, n, "%s: one slot", m)
		switch phases[m].Unit {
		case Microseconds:
			require.NotNil(t, span, m.String())
		case MilliTokensPerSecond:
			require.NotNil(t, rate, m.String())
		case Tokens:
			require.NotNil(t, count, m.String())
		}
		found := false
		for j := range v.NumField() {
			if v.Type().Field(j).Tag.Get("json") == phases[m].Key {
				require.Equal(t, v.Field(j).Addr().Interface(), addr, "%s: slot is the field named by Key", m)
				found = true
			}
		}
		require.True(t, found, "%s: Request has a field %q", m, phases[m].Key)
	}
	var vals phaseValues
	for m := range vals {
		vals[m] = math.NaN()
	}
	vals[MetricTTFO], vals[MetricDecodeRate], vals[MetricPromptTokens] = 1.5e6, 42.5, 7
	rq.setPhases(&vals)
	// setPhases writes each value where slot finds it.
	var distinct phaseValues
	for m := range distinct {
		distinct[m] = float64(m + 1)
	}
	var rd Request
	rd.setPhases(&distinct)
	for m := range numRequestMetrics {
		require.Equal(t, float64(m+1), rd.phase(m), "%s: setPhases and slot agree", m)
	}
	require.Equal(t, Span(1_500_000), rq.TTFO)
	require.Equal(t, Float(42.5), rq.DecodeRate)
	require.Equal(t, Count(7), rq.PromptTokens)
	require.False(t, rq.TTFT.Known())
	require.Equal(t, Count(-1), rq.OutputTokens)
	require.True(t, math.IsNaN(float64(rq.PrefillRate)))
}

// TestPhaseDefinitions: every per-request row has a definition (its line
// of evalPhases) that knows a complete request's value.
func TestPhaseDefinitions(t *testing.T) {
	tr := chat()
	sp := split{Queue: time.Millisecond, Prefill: 2 * time.Millisecond, Source: SourceModel, OK: true}
	v := evalPhases(&tr, &sp)
	for m := range numRequestMetrics {
		require.False(t, math.IsNaN(v[m]), "%s has no definition", m)
	}
	require.Equal(t, float64(2*time.Millisecond), v[MetricPrefill])
}
