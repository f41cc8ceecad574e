//go:build !linux

package bench

import (
	"errors"
	"os"
	"runtime"
	"time"
)

// The process figures come from Linux's /proc and process CPU clocks;
// elsewhere the bench runs and reports them as unknown.

// HeapSignal is nil: the heap profile of the capacity run is Linux only,
// as its memory figures are.
var HeapSignal os.Signal

var errNoProc = errors.New("bench: process CPU and memory figures need Linux")

func cpuTime(int) (time.Duration, error)   { return 0, errNoProc }
func rssBytes(int) (int64, error)          { return 0, errNoProc }
func childPIDs(int) []int                  { return nil }
func raiseNoFile(n uint64) (uint64, error) { return 0, errNoProc }
func loadAvg() float64                     { return -1 }
func cpuModel() string                     { return "" }
func kernel() string                       { return runtime.GOOS }
