package collective

import (
	"errors"
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

// Registration is a buffer registered with Register.
type Registration struct {
	r *memory.SharedRegistration
}

// Register makes an existing host buffer shareable with the other ranks
// on this host in place, for every communicator of the process (NCCL's
// ncclCommRegister): the whole pages inside buf move into memory the
// ranks can map, with their contents, at the same addresses, so that
// operations on buf go as they do on MemAlloc's buffers (their slices in
// those pages with one copy over shared memory; the part-pages at either
// end the ordinary way). buf must be Go memory or other private
// anonymous memory (a file's mapping or shared memory is refused), and
// nothing may write it or run an operation on it while Register or
// Deregister runs. Registering the same pages again, or a buffer inside
// registered pages, holds them once more (they stay shared until every
// registration is deregistered); a buffer inside a MemAlloc allocation
// needs none and gets one that moves nothing. Deregister before buf's
// memory is used for anything else: until then the registration keeps
// it alive. Linux only: elsewhere it returns an error.
func Register[T Number](buf []T) (*Registration, error) {
	if len(buf) == 0 {
		return nil, errors.New("goccl: Register of an empty buffer")
	}
	r, err := memory.RegisterShared(asBytes(buf))
	if err != nil {
		return nil, fmt.Errorf("goccl: Register: %w", err)
	}
	return &Registration{r: r}, nil
}

// Bytes returns how many of the buffer's bytes the ranks on this host can
// map: those in its whole pages (0 for a buffer with no whole page in
// it), or all of a buffer inside a MemAlloc allocation or registered
// pages.
func (r *Registration) Bytes() int {
	if r == nil || r.r == nil {
		return 0
	}
	return r.r.Bytes()
}

// Deregister ends the registration (NCCL's ncclCommDeregister): the last
// of a buffer's registrations moves its pages back into private memory,
// with their contents. No operation on the buffer may be running, and
// nothing may write it meanwhile. A second Deregister is an error; one
// that failed (the kernel refused to move the pages) may be tried again.
func (r *Registration) Deregister() error {
	if r == nil || r.r == nil {
		return errors.New("goccl: Deregister of a registration that is not one, or deregistered already")
	}
	if err := r.r.Release(); err != nil {
		return fmt.Errorf("goccl: Deregister: %w", err)
	}
	r.r = nil
	return nil
}
