package snapshot

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
)

// TestTimingSlots: every request_timings key of the phase table, its rows'
// and their aliases', reaches the Timing field with that JSON name, and a
// value set through it reads back.
func TestTimingSlots(t *testing.T) {
	var tm Timing
	v := reflect.ValueOf(&tm).Elem()
	field := func(key string) any {
		for i := range v.NumField() {
			if v.Type().Field(i).Tag.Get("json") == key {
				return v.Field(i).Addr().Interface()
			}
		}
		t.Fatalf("Timing has no field %q", key)
		return nil
	}
	check := func(key string) {
		num, count := timingSlot(&tm, key)
		if num != nil {
			require.Nil(t, count, key)
			require.Equal(t, field(key), any(num), key)
		} else {
			require.Equal(t, field(key), any(count), key)
		}
		setTiming(&tm, key, 12)
		require.Equal(t, Num(12), timingValue(&tm, key), key)
		setTiming(&tm, key, float64(nan))
		require.False(t, timingValue(&tm, key).Known(), key)
	}
	n := 0
	for m := range histo.NumMetrics {
		ph := m.Phase()
		if ph.Key == "" {
			continue
		}
		check(ph.Key)
		n++
		for _, a := range ph.Aliases {
			check(a.Key)
			n++
		}
	}
	require.Equal(t, 15, n, "13 per-request rows and TPOT's 2 aliases")
	require.Panics(t, func() { timingSlot(&tm, "no_such_key") })
}
