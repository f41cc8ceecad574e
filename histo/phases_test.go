package histo

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPhaseTable: every row is complete, names are unique, and each
// per-request row reads the Request field its Key names.
func TestPhaseTable(t *testing.T) {
	names := map[string]bool{}
	for i := range phases {
		row, m := &phases[i], Metric(i)
		require.NotEmpty(t, row.Name, "row %d is missing", i)
		require.False(t, names[row.Name], "%s twice", row.Name)
		names[row.Name] = true
		require.Equal(t, row.prom == "", row.labels == noProm, "%s: a Prometheus name goes with labels", row.Name)
		require.Equal(t, row.prom == "", row.help == "", "%s: a Prometheus name goes with help", row.Name)
		perRequest := m < numRequestMetrics
		require.Equal(t, perRequest, row.Key != "", "%s: per-request metrics have a Key, per-event ones none", row.Name)
		require.Equal(t, row.labels == perEvent, !perRequest && row.prom != "", row.Name)
	}
	// Set every Request field that a row reads to a distinct value, and read
	// it back through the row.
	var rq Request
	v := reflect.ValueOf(&rq).Elem()
	for i := range numRequestMetrics {
		row := &phases[i]
		for j := range v.NumField() {
			if v.Type().Field(j).Tag.Get("json") == row.Key {
				v.Field(j).SetInt(int64(i+1) * 1e6)
			}
		}
	}
	for i := range numRequestMetrics {
		row := &phases[i]
		want := float64(int64(i+1) * 1e6)
		switch row.field.kind {
		case spanField:
			want /= 1e6 // nanoseconds to milliseconds
		case rateField:
			want = float64(Float(want))
		}
		if row.field.kind == rateField {
			// A Float field set with SetInt is not a float: read the bits as
			// reflect wrote them instead.
			want = float64(rq.DecodeRate)
			if i == int(MetricPrefillRate) {
				want = float64(rq.PrefillRate)
			}
		}
		require.Equal(t, want, Metric(i).Value(&rq), row.Name)
	}
}
