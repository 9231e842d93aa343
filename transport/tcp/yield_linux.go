package tcp

import "golang.org/x/sys/unix"

// yieldCPU gives the CPU to another runnable thread, if any, as Open MPI's
// mpi_yield_when_idle does for ranks that outnumber cores.
func yieldCPU() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
