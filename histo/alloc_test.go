//go:build !race

package histo

import (
	"testing"
	"time"

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
