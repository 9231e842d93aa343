//go:build !linux

package cuda

import "errors"

func dlopen(path string) (uintptr, error) {
	return 0, errors.New("goccl loads the CUDA driver on Linux only")
}

func dlsym(lib uintptr, name string) uintptr { return 0 }

// callN is never reached: no library loads on this system.
func callN(fn uintptr, args ...uintptr) uint32 {
	panic("cuda: driver call without a driver")
}
