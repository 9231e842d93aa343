package emu_test

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/memory"
)

// ipcEnv carries the handle to TestHelperProcess in a child process.
const ipcEnv = "GOCCL_EMU_TEST_IPC_HANDLE"

const ipcSize = 10000

func ipcPattern() []byte {
	p := make([]byte, ipcSize)
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return p
}

// TestIPC exports shared memory to a child process (this test binary run
// again), which checks what the parent wrote and writes a pattern back
// through a stream.
func TestIPC(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: testSeed(t)})
	b, err := d.AllocShared(ipcSize)
	require.NoError(t, err)
	copy(d.Bytes(b), bytes.Repeat([]byte{0x11}, ipcSize))
	h, err := d.IPCHandle(b)
	require.NoError(t, err)

	_, err = d.OpenIPC(h)
	require.ErrorIs(t, err, emu.ErrIPCSameProcess)
	_, err = d.IPCHandle(b.Slice(0, 100))
	require.Error(t, err, "IPCHandle of part of an allocation")
	plain := alloc(t, d, 64)
	_, err = d.IPCHandle(plain)
	require.ErrorContains(t, err, "AllocShared")
	require.ErrorContains(t, d.CloseIPC(plain), "use Free")
	_, err = d.OpenIPC([64]byte{})
	require.Error(t, err)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), ipcEnv+"="+hex.EncodeToString(h[:]))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestHelperProcess", "child:\n%s", out)
	require.Equal(t, ipcPattern(), d.Bytes(b))

	free(t, d, b, plain)
	require.Zero(t, d.Live())
}

// TestHelperProcess is TestIPC's child process; run on its own it skips.
func TestHelperProcess(t *testing.T) {
	hx := os.Getenv(ipcEnv)
	if hx == "" {
		t.Skip("the child process of TestIPC")
	}
	raw, err := hex.DecodeString(hx)
	require.NoError(t, err)
	var h [64]byte
	copy(h[:], raw)

	d := emu.New(0, emu.Options{Seed: testSeed(t)})
	b, err := d.OpenIPC(h)
	require.NoError(t, err)
	require.Equal(t, ipcSize, b.Len())
	require.Equal(t, memory.Device, b.Kind())
	require.Equal(t, bytes.Repeat([]byte{0x11}, ipcSize), d.Bytes(b))
	require.ErrorContains(t, d.Free(b), "use CloseIPC")

	s := newStream(t, d)
	require.NoError(t, s.Copy(b, memory.Buffer{}, memory.HostBuffer(ipcPattern())))
	require.NoError(t, s.Sync(syncCtx(t)))
	require.NoError(t, s.Close())
	require.NoError(t, d.CloseIPC(b))
	require.Zero(t, d.Live())
}
