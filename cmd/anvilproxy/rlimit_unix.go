//go:build unix

package main

import (
	"fmt"
	"syscall"

	"go.uber.org/zap"
)

// raiseFileLimit raises the soft limit on open files to the hard one (Go
// does so at start on Linux since 1.19; this makes it explicit and
// portable to the platforms it does not), logs both, and returns the
// client-connection bound it allows: each stream holds a client and an
// upstream connection, so half of what is left after a reserve. It returns
// 0 (no bound) when the limit cannot be read.
func raiseFileLimit(log *zap.Logger) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the open-file limit; no client connection bound", zap.Error(err))
		return 0
	}
	soft, cur, hard := uint64(lim.Cur), uint64(lim.Cur), uint64(lim.Max) // int64 on the BSDs
	if cur < hard {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			cur = hard
		}
	}
	bound, warn := streamBound(cur)
	log.Info("open-file limit", zap.Uint64("soft_at_start", soft), zap.Uint64("soft", cur), zap.Uint64("hard", hard),
		zap.Int("max_conns", bound))
	if warn {
		log.Warn(fmt.Sprintf("the open-file limit of %d holds %d concurrent streams (two descriptors each, less a reserve), fewer than %d; raise it (ulimit -n, LimitNOFILE=) to serve more",
			cur, bound, minStreams), zap.Uint64("limit", cur), zap.Int("streams", bound))
	}
	return bound
}
