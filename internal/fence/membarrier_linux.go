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

var (
	once, sharedOnce sync.Once
	ok, sharedOK     bool
)

func membarrier(cmd int) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, uintptr(cmd), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

func ready() bool {
	if !plainStore {
		return true
	}
	once.Do(func() {
		cmds, err := membarrier(membarrierQuery)
		if err != nil || cmds&membarrierPrivateExpedited == 0 {
			return
		}
		// The process registers once; expedited barriers fail with
		// EPERM before that.
		if _, err := membarrier(membarrierRegisterPrivateExpedited); err != nil {
			return
		}
		_, err = membarrier(membarrierPrivateExpedited)
		ok = err == nil
	})
	return ok
}

func heavy() bool {
	if !plainStore {
		return true
	}
	_, err := membarrier(membarrierPrivateExpedited)
	return err == nil
}

func sharedReady() bool {
	if !plainStore {
		return true
	}
	sharedOnce.Do(func() {
		cmds, err := membarrier(membarrierQuery)
		if err != nil || cmds&membarrierGlobalExpedited == 0 {
			return
		}
		if _, err := membarrier(membarrierRegisterGlobalExpedited); err != nil {
			return
		}
		_, err = membarrier(membarrierGlobalExpedited)
		sharedOK = err == nil
	})
	return sharedOK
}

func sharedHeavy() bool {
	if !plainStore {
		return true
	}
	_, err := membarrier(membarrierGlobalExpedited)
	return err == nil
}
