//go:build !linux

package emu

import (
	"errors"

	"github.com/goccl/goccl/memory"
)

var errNoIPC = errors.New("emu: IPC needs Linux (memfd and /proc/<pid>/fd)")

type sharedMem struct{}

// AllocShared fails: IPC needs Linux.
func (d *Device) AllocShared(n int) (memory.Buffer, error) { return memory.Buffer{}, errNoIPC }

// IPCHandle fails: IPC needs Linux.
func (d *Device) IPCHandle(b memory.Buffer) ([64]byte, error) { return [64]byte{}, errNoIPC }

// OpenIPC fails: IPC needs Linux.
func (d *Device) OpenIPC(h [64]byte) (memory.Buffer, error) { return memory.Buffer{}, errNoIPC }
