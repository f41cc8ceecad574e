//go:build race

package proxy

// raceEnabled scales load and soak tests down under the race detector,
// which slows the relay about tenfold.
const raceEnabled = true
