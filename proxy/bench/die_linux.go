package bench

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes cmd's process get SIGTERM when the bench dies, so
// that no proxy outlives it. SIGTERM, not SIGKILL: nginx's master then
// stops its workers, which a killed master would leave behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
