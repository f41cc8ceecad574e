//go:build !linux

package bench

import (
	"errors"
	"runtime"
	"time"
)

// The process figures come from Linux's /proc and process CPU clocks;
// elsewhere the bench runs and reports them as unknown.

var errNoProc = errors.New("bench: process CPU and memory figures need Linux")

func cpuTime(int) (time.Duration, error)   { return 0, errNoProc }
func rssBytes(int) (int64, error)          { return 0, errNoProc }
func childPIDs(int) []int                  { return nil }
func raiseNoFile(n uint64) (uint64, error) { return 0, errNoProc }
func loadAvg() float64                     { return -1 }
func cpuModel() string                     { return "" }
func kernel() string                       { return runtime.GOOS }
