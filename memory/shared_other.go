//go:build !linux

package memory

import "errors"

// SharedHeader is the bytes before the caller's in a shared allocation.
const SharedHeader = 4096

// SharedRef says where a range of bytes lies in a shared allocation.
type SharedRef struct {
	FD    int
	Nonce uint64
	Off   int64
	Len   int64
}

var errNoShared = errors.New("memory: shared allocations need Linux (memfd)")

// AllocShared needs Linux.
func AllocShared(n int) ([]byte, error) { return nil, errNoShared }

// FreeShared needs Linux.
func FreeShared(b []byte) error { return errNoShared }

// SharedOf reports false: there are no shared allocations here.
func SharedOf(b []byte) (SharedRef, bool) { return SharedRef{}, false }

// IsShared reports false: there are no shared allocations here.
func IsShared(buf Buffer) bool { return false }

// SharesAny reports false: there are no shared allocations here.
func SharesAny(buf Buffer) bool { return false }

// SharedRegistration is a registration of existing memory; there are
// none here.
type SharedRegistration struct{}

// Bytes returns 0.
func (r *SharedRegistration) Bytes() int { return 0 }

// Release does nothing.
func (r *SharedRegistration) Release() error { return nil }

// RegisterShared needs Linux.
func RegisterShared(b []byte) (*SharedRegistration, error) { return nil, errNoShared }
