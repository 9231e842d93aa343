package collective

import (
	"fmt"
	"unsafe"

	"github.com/goccl/goccl/memory"
)

// MemAlloc returns n zeroed elements of host memory that the other ranks
// on this host can map, for a collective's buffers (NCCL's ncclMemAlloc).
// Over shared memory, in operations of 64 KiB to 4 MiB (from 64 KiB on,
// with no upper bound, on a host with more ranks than CPUs), the slices
// of broadcasts and all-gathers then go with one copy, the receiver's,
// straight out of the sender's buffer at memcpy's speed (with ordinary Go
// memory they go through the transport's slots: two copies), and a
// reduction's receiver reads the sender's input (and, in an
// out-of-place all-reduce, its finished blocks) where they are. It is
// ordinary memory otherwise, for any operation and any communicator, and
// stays valid until MemFree. It counts against the process's shared
// memory (a memfd), not the Go heap. Linux only: elsewhere it returns an
// error.
func MemAlloc[T Number](n int) ([]T, error) {
	var z T
	size := int(unsafe.Sizeof(z))
	if n <= 0 || n > (1<<46)/size {
		return nil, fmt.Errorf("goccl: MemAlloc of %d elements of %d bytes (want 1 to %d)", n, size, (1<<46)/size)
	}
	b, err := memory.AllocShared(n * size)
	if err != nil {
		return nil, fmt.Errorf("goccl: MemAlloc: %w", err)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n), nil
}

// MemFree frees what MemAlloc returned (the whole slice). No operation
// that uses it may still be running.
func MemFree[T Number](s []T) error {
	if err := memory.FreeShared(asBytes(s)); err != nil {
		return fmt.Errorf("goccl: MemFree: %w", err)
	}
	return nil
}
