//go:build !linux

package ibv

import "errors"

// Alloc fails away from Linux: verbs memory is a memfd mapping (see the
// Linux build), and neither libibverbs nor the emulated device runs
// elsewhere. The package still builds, so that a program linking goccl
// builds on any system and is told at run time that RDMA is not there.
func Alloc(n int) (*Mem, error) {
	return nil, errors.New("ibv: verbs memory is Linux only (memfd_create)")
}

// Free does nothing: no allocation succeeds here.
func (m *Mem) Free() error { return nil }
