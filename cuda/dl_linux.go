//go:build linux

package cuda

import (
	"runtime"

	"github.com/ebitengine/purego"
)

// dlopen loads a shared library for good (it is never closed: a driver's
// library stays mapped for the life of the process, as NCCL's does).
func dlopen(path string) (uintptr, error) {
	// dlerror's message is the calling thread's: purego reads it in a
	// second call, which must run on the thread that failed (else the
	// message is empty, as CI saw under the race detector).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

// dlsym returns the address of an exported symbol, or 0.
func dlsym(lib uintptr, name string) uintptr {
	p, err := purego.Dlsym(lib, name)
	if err != nil {
		return 0
	}
	return p
}

// callN calls the C function at fn with integer and pointer arguments and
// returns its CUresult. Every CUDA driver function returns a CUresult, a
// C enum: 32 bits in EAX (amd64) or W0 (arm64), the upper half of the
// register undefined, hence the conversion to uint32.
//
// purego.SyscallN (0.2–0.35 µs a call here) rather than RegisterLibFunc
// (0.45–1.3 µs, reflection on every call): every CUDA argument this
// package passes is an integer, a handle or a pointer, so no argument needs
// the float registers, which SyscallN cannot fill apart from the integers.
//
// uintptrescapes: a pointer converted to uintptr in the call expression of
// callN (uintptr(unsafe.Pointer(&x))) is kept alive, and on the heap, until
// callN returns, as for syscall.Syscall (rule 4 of unsafe.Pointer). Go's
// heap objects do not move, so the C side may write through it.
//
//go:uintptrescapes
func callN(fn uintptr, args ...uintptr) uint32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return uint32(r)
}
