package histo

import (
	"math"
	"reflect"
	"testing"

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
				if phases[m].field.kind == spanField {
					want[m] = float64(n) / 1e6 // nanoseconds → milliseconds
				}
			}
		}
	}
	for m := range numRequestMetrics {
		require.Contains(t, want, m, "%s: no Request field %q", m, phases[m].Key)
		require.Equal(t, want[m], m.Value(&rq), m.String())
		hv, ok := phases[m].hdrValue(&rq)
		require.True(t, ok, m.String())
		require.Positive(t, hv, m.String())
	}
	require.True(t, math.IsNaN(MetricInterEvent.Value(&rq)), "per-event metrics have no per-request value")
}
