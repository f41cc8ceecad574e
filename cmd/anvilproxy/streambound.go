package main

// fdReserve is the most file descriptors kept out of the connection bound
// (a quarter of the limit when that is less): the listeners, the admin
// connections, snapshot files and the dials in progress.
const fdReserve = 256

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
