package memory

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHostBuffer(t *testing.T) {
	raw := make([]byte, 100)
	b := HostBuffer(raw)
	require.Equal(t, Host, b.Kind())
	require.Equal(t, 100, b.Len())
	s := b.Slice(10, 30)
	require.Equal(t, 20, s.Len())
	s.Bytes()[0] = 7
	require.Equal(t, byte(7), raw[10])
	require.True(t, b.Overlaps(s))
	require.False(t, b.Slice(0, 10).Overlaps(b.Slice(10, 20)))
	off, ok := b.Offset(s)
	require.True(t, ok)
	require.Equal(t, 10, off)
	require.True(t, s.Same(b.Slice(10, 30)))
	require.False(t, s.Same(b.Slice(10, 29)))
	require.False(t, HostBuffer(nil).Overlaps(b))
	require.Panics(t, func() { b.Slice(50, 101) })
	// Appending to a slice must not write past it into the parent.
	x := append(s.Bytes(), 1)
	x[0] = 9
	require.Equal(t, byte(7), raw[10])
}

func TestDeviceBuffer(t *testing.T) {
	d := DeviceBuffer(1, 0x1000, 256)
	require.Equal(t, Device, d.Kind())
	require.Panics(t, func() { d.Bytes() })
	dev, ptr := d.Slice(16, 32).Device()
	require.Equal(t, 1, dev)
	require.Equal(t, uintptr(0x1010), ptr)
	require.True(t, d.Overlaps(DeviceBuffer(1, 0x10f0, 64)))
	require.False(t, d.Overlaps(DeviceBuffer(2, 0x10f0, 64)), "other GPU")
	require.False(t, d.Overlaps(HostBuffer(make([]byte, 8))))
}
