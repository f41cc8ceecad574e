//go:build race

package histo_test

// raceEnabled skips the accuracy tests under the race detector: it slows
// the proxy's relay about tenfold, so its stamps carry the detector's
// delays and measure it, not the split. The same code paths run under the
// detector in the unit and integration tests.
const raceEnabled = true
