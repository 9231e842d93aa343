package emu

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/device"
)

// DMABuf hands out a descriptor of the very memory behind a buffer: bytes
// written through it are the buffer's. It refuses what CUDA refuses.
func TestDMABuf(t *testing.T) {
	page := unix.Getpagesize()
	d := New(0, Options{DMABuf: true})
	b, err := d.Alloc(4 * page)
	require.NoError(t, err)
	defer d.Free(b)
	sub := b.Slice(page, 3*page)
	fd, off, err := d.DMABuf(sub)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.Equal(t, uint64(page), off)
	_, err = unix.Pwrite(fd, []byte("through the dma-buf"), int64(off)+10)
	require.NoError(t, err)
	require.Equal(t, "through the dma-buf", string(d.Bytes(sub)[10:29]))

	_, _, err = d.DMABuf(b.Slice(100, page+100))
	require.ErrorContains(t, err, "whole pages")
	h, err := d.AllocHost(page)
	require.NoError(t, err)
	defer d.Free(h)
	_, _, err = d.DMABuf(h)
	require.ErrorContains(t, err, "want device memory")

	plain := New(0, Options{})
	c, err := plain.Alloc(page)
	require.NoError(t, err)
	defer plain.Free(c)
	_, _, err = plain.DMABuf(c)
	require.ErrorIs(t, err, device.ErrNotSupported)
}
