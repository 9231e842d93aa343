//go:build !linux

package emu

import (
	"errors"
	"fmt"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
)

var errNoIPC = errors.New("emu: IPC needs Linux (memfd and /proc/<pid>/fd)")

type sharedMem struct{}

// AllocShared fails: IPC needs Linux.
func (d *Device) AllocShared(n int) (memory.Buffer, error) { return memory.Buffer{}, errNoIPC }

// IPCHandle fails: IPC needs Linux.
func (d *Device) IPCHandle(b memory.Buffer) ([64]byte, error) { return [64]byte{}, errNoIPC }

// AllocIPC fails: IPC needs Linux.
func (d *Device) AllocIPC(n int) (memory.Buffer, error) { return memory.Buffer{}, errNoIPC }

// OpenIPC fails: IPC needs Linux.
func (d *Device) OpenIPC(h [64]byte) (memory.Buffer, error) { return memory.Buffer{}, errNoIPC }

// allocExportable fails: memfds need Linux.
func (d *Device) allocExportable(n int) (memory.Buffer, error) {
	d.unreserve(n)
	return memory.Buffer{}, errNoIPC
}

// DMABuf fails: the emulated dma-buf is a memfd, which needs Linux.
func (d *Device) DMABuf(b memory.Buffer) (int, uint64, error) {
	return -1, 0, fmt.Errorf("%w: %w", errNoIPC, device.ErrNotSupported)
}
