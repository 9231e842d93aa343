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
	require.True(t, b.SameStart(b.Slice(0, 5)))
	require.False(t, b.SameStart(s))
	require.False(t, HostBuffer(nil).SameStart(HostBuffer(nil)))
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

func TestMappedBuffer(t *testing.T) {
	raw := make([]byte, 64)
	m := MappedBuffer(raw, 2, 0x9000)
	require.Equal(t, Mapped, m.Kind())
	require.True(t, m.HostVisible())
	require.True(t, m.DeviceVisible())
	s := m.Slice(8, 24)
	s.Bytes()[0] = 5
	require.Equal(t, byte(5), raw[8])
	dev, ptr := s.Device()
	require.Equal(t, 2, dev)
	require.Equal(t, uintptr(0x9008), ptr)
	// The same bytes seen as host memory overlap the mapped view.
	h := HostBuffer(raw[20:40])
	require.True(t, s.Overlaps(h))
	require.True(t, h.Overlaps(s))
	off, ok := m.Offset(HostBuffer(raw[16:32]))
	require.True(t, ok)
	require.Equal(t, 16, off)
	// A device buffer lives in another address space.
	require.False(t, m.Overlaps(DeviceBuffer(2, 0x9000, 64)))
	require.False(t, HostBuffer(raw).DeviceVisible())
	require.False(t, DeviceBuffer(0, 1, 1).HostVisible())
}

func TestView(t *testing.T) {
	raw := make([]byte, 64)
	m := MappedBuffer(raw, 1, 0x7000)
	v := m.View(raw[16:40])
	require.Equal(t, Mapped, v.Kind())
	require.Equal(t, 24, v.Len())
	_, ptr := v.Device()
	require.Equal(t, uintptr(0x7010), ptr)
	require.True(t, v.SameStart(HostBuffer(raw[16:])))
	require.Equal(t, 0, m.View(nil).Len())
	require.Panics(t, func() { m.View(make([]byte, 8)) })
}
