//go:build !unix

package launch

import (
	"os"
	"syscall"
)

// sysProcAttr: without process groups a rank runs as a plain child.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup kills p itself: without process groups and POSIX signals,
// Run can neither ask politely nor reach what p started.
func signalGroup(p *os.Process, _ syscall.Signal) {
	_ = p.Kill()
}

// exitStatus returns a finished rank's exit status.
func exitStatus(st *os.ProcessState) (int, syscall.Signal) {
	return st.ExitCode(), 0
}
