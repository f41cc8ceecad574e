//go:build !race

package histo

import (
	"math"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestObserveAllocs holds the per-event calls to zero allocations: they
// run for every relayed chunk and every output event (docs/design.md "Rules the code keeps").
func TestObserveAllocs(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	d := 3 * time.Millisecond
	require.Zero(t, testing.AllocsPerRun(1000, func() { r.ObserveGap(d) }))
	require.Zero(t, testing.AllocsPerRun(1000, func() { r.ObserveRelay(d) }))
}

// TestWindowRecordsNotCopied: Rotate and Current allocate the same however
// many records the window holds, because its Requests are the window's
// chunks, not a copy (Records). A copy of even one chunk would be
// chunkSize × 584 bytes, 598 KB.
func TestWindowRecordsNotCopied(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	tr := chat()
	fill := func(n int) {
		for range n {
			r.Record(&tr)
		}
	}
	chunk := uint64(chunkSize * unsafe.Sizeof(Request{}))
	for name, end := range map[string]func() *Window{"Rotate": r.Rotate, "Current": r.Current} {
		one := leastBytes(func() { r.Rotate(); fill(1) }, func() { end() })
		many := leastBytes(func() { r.Rotate(); fill(3*chunkSize + 1) }, func() { end() })
		t.Logf("%s: %d B with 1 record, %d B with %d", name, one, many, 3*chunkSize+1)
		require.Less(t, many, one+chunk/4, name)
	}
}

// leastBytes returns the fewest bytes f allocated in five runs, each after
// setup: a run can pay for a pooled zlib writer (800 KB) that a garbage
// collection emptied from dist.Encode's pool.
func leastBytes(setup, f func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 5 {
		setup()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}
