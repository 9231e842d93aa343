package launch

import "syscall"

// setPdeathsig has the kernel kill a rank if the thread that started it
// dies, which Run arranges to happen only with the launching process.
func setPdeathsig(a *syscall.SysProcAttr) {
	a.Pdeathsig = syscall.SIGKILL
}
