//go:build unix

package prefix

import "syscall"

// cpuTime returns the process's user and system CPU time in nanoseconds,
// so that benchmarks can report CPU per operation on a shared machine,
// where wall time also counts other processes' turns.
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
