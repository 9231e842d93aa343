package fence

import (
	"sync"

	"golang.org/x/sys/unix"
)

// membarrier(2)'s commands (include/uapi/linux/membarrier.h).
const (
	membarrierQuery                    = 0
	membarrierGlobalExpedited          = 1 << 1
	membarrierRegisterGlobalExpedited  = 1 << 2
	membarrierPrivateExpedited         = 1 << 3
	membarrierRegisterPrivateExpedited = 1 << 4
)

// barrier is one kind of expedited barrier: the command that runs it and
// the one that registers the process for it, checked once.
type barrier struct {
	cmd, register int
	once          sync.Once
	ok            bool
}

var (
	private = barrier{cmd: membarrierPrivateExpedited, register: membarrierRegisterPrivateExpedited}
	global  = barrier{cmd: membarrierGlobalExpedited, register: membarrierRegisterGlobalExpedited}
)

// ready asks the kernel, once, whether it has the barrier, registers
// the process for it (expedited barriers fail with EPERM before that),
// and runs one.
func (b *barrier) ready() bool {
	if !plainStore {
		return true
	}
	b.once.Do(func() {
		cmds, err := membarrier(membarrierQuery)
		if err != nil || cmds&b.cmd == 0 {
			return
		}
		if _, err := membarrier(b.register); err != nil {
			return
		}
		_, err = membarrier(b.cmd)
		b.ok = err == nil
	})
	return b.ok
}

func (b *barrier) run() bool {
	if !plainStore {
		return true
	}
	_, err := membarrier(b.cmd)
	return err == nil
}

func membarrier(cmd int) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, uintptr(cmd), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

func ready() bool { return private.ready() }

func heavy() bool { return private.run() }

func sharedReady() bool { return global.ready() }

func sharedHeavy() bool { return global.run() }
