//go:build !linux

package bench

import "os/exec"

// dieWithParent does nothing here: only Linux has a parent-death signal.
// The bench stops its proxies itself (target.stop) on every way out but
// its own SIGKILL.
func dieWithParent(*exec.Cmd) {}
