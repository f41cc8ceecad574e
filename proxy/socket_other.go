//go:build !linux

package proxy

// peekFD cannot look at the socket here: idle connections are trusted
// until the idle timeout, and the resend rule's proofs that need the
// socket's state are never found (see resetFD).
func peekFD(int, []byte) (state, n int) { return peekQuiet, 0 }

// resetFD cannot read the socket's pending error here: a request that met
// an EOF is never taken for one the engine did not read.
func resetFD(int) bool { return false }
