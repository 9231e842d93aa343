package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h).
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *w == v, at most d. It returns early when woken,
// when *w != v, or on a signal; callers recheck their condition.
func futexWait(w *atomic.Uint32, v uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	// FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the word is shared between
	// processes (the kernel keys it by the segment's inode and offset).
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every thread sleeping on w, in any process.
func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, 1<<30, 0, 0, 0)
}

// yieldCPU gives the CPU to another runnable thread, if any, as Open MPI's
// mpi_yield_when_idle does for ranks that outnumber cores.
func yieldCPU() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// hungUp reports whether the other end of the stream socket fd has closed
// or sent something (it sends nothing, so either means it is gone).
func hungUp(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0 && p[0].Revents != 0
}
