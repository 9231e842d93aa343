//go:build unix

package launch

import (
	"os"
	"syscall"
)

// sysProcAttr puts a rank in a process group of its own, so that a signal
// to the group reaches what the rank starts, and so that a terminal's
// Ctrl-C reaches only the launcher, which decides what the ranks get.
func sysProcAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	setPdeathsig(a)
	return a
}

// signalGroup sends sig to the process group that p leads. A group with no
// members left (ESRCH) is not an error.
func signalGroup(p *os.Process, sig syscall.Signal) {
	_ = syscall.Kill(-p.Pid, sig)
}

// exitStatus returns a finished rank's exit status, or -1 and the signal
// that ended it.
func exitStatus(st *os.ProcessState) (int, syscall.Signal) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal()
	}
	return st.ExitCode(), 0
}
