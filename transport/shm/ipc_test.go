//go:build linux

package shm

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// TestDeviceConnectionFallsBackFromIPC: two ranks in one process, each
// with its own emulated device, make a device connection. Each offers its
// device memory, but a process cannot map its own export (CUDA refuses
// it, and so does the emulator), so both sides' sends go through the
// registered segment, say why, and move bytes intact; the offers are
// freed with the connection.
func TestDeviceConnectionFallsBackFromIPC(t *testing.T) {
	devs := []*emu.Device{emu.New(0, emu.Options{Seed: 1}), emu.New(0, emu.Options{Seed: 2})}
	var logs [2]syncBuffer
	eps := endpoints(t, 2, func(r int, o *Options) {
		o.Device = devs[r]
		o.Logger = slog.New(slog.NewTextHandler(&logs[r], nil))
	})
	require.Equal(t, memory.Device, eps[0].Caps().DeviceSlots, "an exporting device offers device slots")
	a, b := connectPair(t, eps[0], eps[1], transport.DeviceChannels)
	for r := range logs {
		require.Contains(t, logs[r].String(), "sends go through registered host memory", "rank %d", r)
		require.Contains(t, logs[r].String(), "cannot map rank", "rank %d", r)
	}
	ctx := context.Background()
	s, err := devs[0].NewStream()
	require.NoError(t, err)
	defer s.Close()
	src, err := devs[0].Alloc(4096)
	require.NoError(t, err)
	copy(devs[0].Bytes(src), bytes.Repeat([]byte{7}, 4096))
	slot, err := a.Reserve(ctx, 4096)
	require.NoError(t, err)
	require.Equal(t, memory.Mapped, slot.Kind(), "the segment's slot, registered")
	require.NoError(t, s.Copy(slot, memory.Buffer{}, src))
	require.NoError(t, s.Sync(ctx))
	require.NoError(t, a.Post(4096, transport.Tag{Op: 1}))
	got, tag, err := b.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), tag.Op)
	require.Equal(t, memory.Mapped, got.Kind())
	require.Equal(t, bytes.Repeat([]byte{7}, 4096), got.Bytes())
	require.NoError(t, b.Release())
	require.NoError(t, devs[0].Free(src))
	for _, ep := range eps {
		ep.Close(nil)
	}
	for r, d := range devs {
		require.Zero(t, d.Live(), "rank %d: the offer is freed with the connection", r)
	}
}

// TestNoDeviceIPCOffersNothing: with NoDeviceIPC the device slots are the
// registered segment's, and no device memory is allocated for them.
func TestNoDeviceIPCOffersNothing(t *testing.T) {
	devs := []*emu.Device{emu.New(0, emu.Options{Seed: 1}), emu.New(0, emu.Options{Seed: 2})}
	var logs [2]syncBuffer
	eps := endpoints(t, 2, func(r int, o *Options) {
		o.Device, o.NoDeviceIPC = devs[r], true
		o.Logger = slog.New(slog.NewTextHandler(&logs[r], nil))
	})
	require.Equal(t, memory.Mapped, eps[0].Caps().DeviceSlots)
	connectPair(t, eps[0], eps[1], transport.DeviceChannels)
	for r, d := range devs {
		require.Equal(t, 1, d.Live(), "rank %d: the segment's registration only, no device slots", r)
		require.True(t, strings.Contains(logs[r].String(), "IPC turned off on this rank"), "rank %d: %s", r, logs[r].String())
	}
}
