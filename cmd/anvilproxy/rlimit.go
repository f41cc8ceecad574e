package main

import (
	"fmt"
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
	bound, warn := streamBound(lim.Cur)
	log.Info("open-file limit", zap.Uint64("soft_at_start", soft), zap.Uint64("soft", lim.Cur), zap.Uint64("hard", lim.Max),
		zap.Int("max_conns", bound))
	if warn {
		log.Warn(fmt.Sprintf("the open-file limit of %d holds %d concurrent streams (two descriptors each, less a reserve), fewer than %d; raise it (ulimit -n, LimitNOFILE=) to serve more",
			lim.Cur, bound, minStreams), zap.Uint64("limit", lim.Cur), zap.Int("streams", bound))
	}
	return bound
}

// minStreams is the fewest concurrent streams the file limit should hold
// before the start warns: several times the slots of a large engine
// (vLLM's --max-num-seqs defaults to 256), with its queue. The default soft
// limit of 1024 holds 384 and warns; 20,000 holds 9,872 and does not.
const minStreams = 4096

// streamBound is the client-connection bound a limit of fds open files
// allows, and whether it is below minStreams.
func streamBound(fds uint64) (bound int, warn bool) {
	reserve := min(fdReserve, fds/4)
	bound = max(int((fds-reserve)/2), 1)
	return bound, bound < minStreams
}
