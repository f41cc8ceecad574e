package main

import (
	"os"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// memoryLimitMargin is what the process holds besides request bodies under
// the memory limit: the runtime, buffers, the prefix index and the retry
// tracker at their defaults, the histograms.
const memoryLimitMargin = 128 << 20

// setMemoryLimit gives the Go runtime a soft memory limit of 1.125 × the
// request-body budget + 128 MiB (1,280 MiB at the default 1 GiB), unless
// GOMEMLIMIT is set: below the bound promised for the resident set, 1.25 ×
// the budget + 150 MiB, since the runtime lets memory approach its limit. Bodies are the
// one large live set, and the GC's default pacing lets garbage grow to the
// live heap's size before it collects: with 1 GiB of bodies in flight the
// growth buffers they left behind took the process to 2 GiB. Under the
// limit the GC collects sooner as the limit nears, so that the bound on
// bodies bounds memory (TestBodyBudgetBoundsMemory). A live heap over the
// limit does not stop the process: the runtime then caps the GC's CPU
// share at half and lets the heap grow.
func setMemoryLimit(cfg proxy.Config, log *zap.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	budget := cfg.MaxInflightBodyBytes
	if budget <= 0 {
		budget = proxy.DefaultMaxInflightBody
	}
	limit := budget + budget/8 + memoryLimitMargin
	debug.SetMemoryLimit(limit)
	log.Debug("memory limit set from the body budget", zap.Int64("bytes", limit))
}
