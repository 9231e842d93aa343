//go:build linux

package ibemu

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// An RDMA read copies the peer's bytes into the local SGE and completes
// as a read; it needs remote read access on the peer's region and local
// write on the destination, or it fails as hardware fails it.
func TestRead(t *testing.T) {
	t.Run("ok", func(t *testing.T) {
		a, b := pair(t, Options{Adversarial: true, Seed: 3}, endOpts{}, endOpts{access: ibv.AccessRemoteReadWriteAll})
		for i := range 5000 {
			b.mem.B[100+i] = byte(i * 7)
		}
		_, err := a.qp.PostSend([]ibv.SendWR{{ID: 9, Op: ibv.OpRead, Flags: ibv.SendSignaled,
			SGE:    ibv.SGE{Addr: ibv.Addr(a.mem.B[64:]), Len: 5000, LKey: a.mr.LKey()},
			Remote: b.mr.Addr() + 100, RKey: b.mr.RKey()}})
		require.NoError(t, err)
		wc := poll(t, a.cq, 1, 5*time.Second)
		require.Equal(t, ibv.Success, wc[0].Status)
		require.Equal(t, ibv.WCRead, wc[0].Opcode)
		require.Equal(t, uint64(9), wc[0].ID)
		require.True(t, bytes.Equal(b.mem.B[100:5100], a.mem.B[64:5064]))
	})
	t.Run("no remote read access", func(t *testing.T) {
		a, b := pair(t, Options{}, endOpts{}, endOpts{}) // b: remote write only
		_, err := a.qp.PostSend([]ibv.SendWR{{ID: 1, Op: ibv.OpRead, Flags: ibv.SendSignaled,
			SGE:    ibv.SGE{Addr: ibv.Addr(a.mem.B), Len: 8, LKey: a.mr.LKey()},
			Remote: b.mr.Addr(), RKey: b.mr.RKey()}})
		require.NoError(t, err)
		wc := poll(t, a.cq, 1, 5*time.Second)
		require.Equal(t, ibv.RemAccessErr, wc[0].Status)
	})
	t.Run("read-only destination", func(t *testing.T) {
		a, b := pair(t, Options{}, endOpts{access: ibv.AccessRemoteRead}, endOpts{access: ibv.AccessRemoteReadWriteAll})
		_, err := a.qp.PostSend([]ibv.SendWR{{ID: 1, Op: ibv.OpRead, Flags: ibv.SendSignaled,
			SGE:    ibv.SGE{Addr: ibv.Addr(a.mem.B), Len: 8, LKey: a.mr.LKey()},
			Remote: b.mr.Addr(), RKey: b.mr.RKey()}})
		require.NoError(t, err)
		wc := poll(t, a.cq, 1, 5*time.Second)
		require.Equal(t, ibv.LocProtErr, wc[0].Status)
	})
}

// A QP connected to itself (NCCL's flush QP) reads its own NIC's memory.
func TestLoopbackQP(t *testing.T) {
	p := New(Options{Dir: t.TempDir()})
	a := newEnd(t, p, endOpts{access: ibv.AccessRemoteReadWriteAll})
	gid, _, err := a.ctx.QueryGID(1, 2)
	require.NoError(t, err)
	connectTo(t, a, gid, a.qp.Num(), nil)
	copy(a.mem.B[4096:], "flush me")
	_, err = a.qp.PostSend([]ibv.SendWR{{ID: 2, Op: ibv.OpRead, Flags: ibv.SendSignaled,
		SGE:    ibv.SGE{Addr: ibv.Addr(a.mem.B), Len: 8, LKey: a.mr.LKey()},
		Remote: a.mr.Addr() + 4096, RKey: a.mr.RKey()}})
	require.NoError(t, err)
	wc := poll(t, a.cq, 1, 5*time.Second)
	require.Equal(t, ibv.Success, wc[0].Status)
	require.Equal(t, "flush me", string(a.mem.B[:8]))
}

// dmabuf is memory standing in for a GPU's exported allocation: a memfd,
// mapped here at addr (its "device address"), as the emulated GPU's are.
func dmabuf(t *testing.T, n int) (fd int, mem []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("test-dmabuf", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(n)))
	mem, err = unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem); unix.Close(fd) })
	return fd, mem
}

// A dma-buf region takes a peer's writes at its IOVA, visible through the
// exporter's own mapping, and the caller may close its descriptor once
// registered; misaligned, oversized and by-address registrations fail.
func TestDeviceMR(t *testing.T) {
	a, b := pair(t, Options{Adversarial: true, Seed: 5}, endOpts{}, endOpts{})
	fd, dev := dmabuf(t, 3*4096)
	iova := ibv.Addr(dev)
	dup, err := unix.Dup(fd)
	require.NoError(t, err)
	mr, err := b.ctx.RegDeviceMR(ibv.DeviceMem{FD: dup, Offset: 4096, Len: 2 * 4096, IOVA: iova + 4096}, ibv.AccessRemoteWriteAll)
	require.NoError(t, err)
	require.NoError(t, unix.Close(dup)) // the region keeps its own
	require.Equal(t, iova+4096, mr.Addr())
	for i := range 6000 {
		a.mem.B[i] = byte(i*3 + 1)
	}
	_, err = b.qp.PostRecv([]ibv.RecvWR{{ID: 1}})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]ibv.SendWR{{ID: 3, Op: ibv.OpWriteImm, Imm: 77, Flags: ibv.SendSignaled,
		SGE:    ibv.SGE{Addr: ibv.Addr(a.mem.B), Len: 6000, LKey: a.mr.LKey()},
		Remote: mr.Addr() + 100, RKey: mr.RKey()}})
	require.NoError(t, err)
	require.Equal(t, ibv.Success, poll(t, a.cq, 1, 5*time.Second)[0].Status)
	wc := poll(t, b.cq, 1, 5*time.Second)
	require.Equal(t, ibv.Success, wc[0].Status)
	require.True(t, bytes.Equal(a.mem.B[:6000], dev[4096+100:4096+6100]))

	// Out of the region: the first page is not in it.
	_, err = a.qp.PostSend([]ibv.SendWR{{ID: 4, Op: ibv.OpWrite, Flags: ibv.SendSignaled,
		SGE:    ibv.SGE{Addr: ibv.Addr(a.mem.B), Len: 8, LKey: a.mr.LKey()},
		Remote: iova, RKey: mr.RKey()}})
	require.NoError(t, err)
	require.Equal(t, ibv.RemAccessErr, poll(t, a.cq, 1, 5*time.Second)[0].Status)
	require.NoError(t, mr.Dereg())

	_, err = b.ctx.RegDeviceMR(ibv.DeviceMem{FD: fd, Offset: 100, Len: 4096, IOVA: iova + 100}, ibv.AccessRemoteWriteAll)
	require.ErrorIs(t, err, unix.EINVAL, "misaligned")
	_, err = b.ctx.RegDeviceMR(ibv.DeviceMem{FD: fd, Offset: 0, Len: 4 * 4096, IOVA: iova}, ibv.AccessRemoteWriteAll)
	require.ErrorIs(t, err, unix.EINVAL, "past the end")
	_, err = b.ctx.RegDeviceMR(ibv.DeviceMem{FD: -1, Len: 4096, IOVA: iova}, ibv.AccessRemoteWriteAll)
	require.ErrorIs(t, err, ibv.ErrNotSupported, "peer memory")
}
