package main

import (
	"syscall"

	"go.uber.org/zap"
)

// fdReserve is the most file descriptors kept out of the connection bound
// (a quarter of the limit when that is less): the listeners, the admin
// connections, snapshot files and the dials in progress.
const fdReserve = 256

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
	soft := lim.Cur
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			lim = raised
		}
	}
	reserve := min(fdReserve, lim.Cur/4)
	bound := max(int((lim.Cur-reserve)/2), 1)
	log.Info("open-file limit", zap.Uint64("soft_at_start", soft), zap.Uint64("soft", lim.Cur), zap.Uint64("hard", lim.Max),
		zap.Int("max_conns", bound))
	if bound < 10000 {
		log.Warn("the open-file limit holds fewer than 10,000 streams; raise it (ulimit -n, LimitNOFILE=) to serve more", zap.Uint64("limit", lim.Cur))
	}
	return bound
}
