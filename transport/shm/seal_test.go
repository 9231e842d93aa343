//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
)

// TestMemfdsAreSealed: the segments and the board cannot change size
// once made, so no holder can truncate them under another's mapping
// (issue 19, finding 5: SIGBUS).
func TestMemfdsAreSealed(t *testing.T) {
	g := geometry{slots: 4, slotSize: 64 << 10}
	segFD, seg, err := createSegment(g)
	require.NoError(t, err)
	defer unix.Close(segFD)
	defer seg.detach()
	boardFD, board, err := createBoard(3)
	require.NoError(t, err)
	defer unix.Close(boardFD)
	defer board.detach()
	for _, m := range []struct {
		name     string
		fd, size int
	}{{"segment", segFD, g.size()}, {"board", boardFD, boardSize(3)}} {
		seals, err := unix.FcntlInt(uintptr(m.fd), unix.F_GET_SEALS, 0)
		require.NoError(t, err)
		want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		require.Equal(t, want, seals&want, "the %s's seals: %#x", m.name, seals)
		require.ErrorIs(t, unix.Ftruncate(m.fd, int64(m.size/2)), unix.EPERM, "shrinking the %s", m.name)
		require.ErrorIs(t, unix.Ftruncate(m.fd, 0), unix.EPERM, "truncating the %s", m.name)
		require.ErrorIs(t, unix.Ftruncate(m.fd, int64(2*m.size)), unix.EPERM, "growing the %s", m.name)
		_, err = unix.FcntlInt(uintptr(m.fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
		require.ErrorIs(t, err, unix.EPERM, "sealing the %s further", m.name)
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(m.fd, &st))
		require.Equal(t, int64(m.size), st.Size)
	}
	// The other side maps them.
	peerSeg, err := mapSegment(segFD, g, 1)
	require.NoError(t, err)
	peerSeg.detach()
	peerBoard, err := mapBoard(boardFD, 3, [16]byte{})
	require.NoError(t, err)
	peerBoard.detach()
}

// unsealedMemfd returns a memfd of size bytes made with flags, starting
// with header and carrying seals, closed when the test ends.
func unsealedMemfd(t *testing.T, flags, seals, size int, header []byte) int {
	t.Helper()
	fd, err := unix.MemfdCreate("goccl-test", flags)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	_, err = unix.Pwrite(fd, header, 0)
	require.NoError(t, err)
	if seals != 0 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
		require.NoError(t, err)
	}
	return fd
}

// segmentHeader and boardHeader are what the creator of a segment of g,
// or of a board for n, writes at its start.
func segmentHeader(g geometry) []byte {
	b := binary.LittleEndian.AppendUint64(nil, magic)
	b = binary.LittleEndian.AppendUint32(b, version)
	b = binary.LittleEndian.AppendUint32(b, uint32(g.slots))
	return binary.LittleEndian.AppendUint64(b, uint64(g.slotSize))
}

func boardHeader(n int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, magic)
	b = binary.LittleEndian.AppendUint32(b, boardVersion)
	return binary.LittleEndian.AppendUint32(b, uint32(n))
}

// TestUnsealedMemfdsAreRefused: a descriptor of the right size and with
// the right header that could still shrink or grow is not mapped; the
// rank says why, and the real hand-over goes ahead.
func TestUnsealedMemfdsAreRefused(t *testing.T) {
	g := geometry{slots: 4, slotSize: 64 << 10}
	const notSealed = "not sealed against shrinking and growing"
	for _, c := range []struct {
		name         string
		flags, seals int
	}{
		{"sealing not allowed", unix.MFD_CLOEXEC, 0},
		{"no seals", unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING, 0},
		{"shrink only", unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL},
		{"grow only", unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING, unix.F_SEAL_GROW | unix.F_SEAL_SEAL},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := mapSegment(unsealedMemfd(t, c.flags, c.seals, g.size(), segmentHeader(g)), g, 1)
			require.ErrorContains(t, err, notSealed)
			_, err = mapBoard(unsealedMemfd(t, c.flags, c.seals, boardSize(3), boardHeader(3)), 3, [16]byte{})
			require.ErrorContains(t, err, notSealed)
		})
	}
	t.Run("not a memfd", func(t *testing.T) {
		var p [2]int
		require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		_, err := mapSegment(p[0], g, 1)
		require.ErrorContains(t, err, "not a sealable memfd")
	})

	t.Run("handed over", func(t *testing.T) {
		eps := endpoints(t, 2, nil)
		addr, ag := eps[1].o.Peers[1], eps[1].g
		unsealed := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
		require.Contains(t, offer(t, addr, wire.ConnSetup{From: 0, To: 1, Channel: 2, NSocks: 1}, appendSegMsg(nil, ag),
			unsealedMemfd(t, unsealed, 0, ag.size(), segmentHeader(ag))), notSealed)
		require.Contains(t, offer(t, addr, wire.ConnSetup{From: 0, To: 1, NSocks: 1, Flags: wire.ConnBoard}, appendBoardMsg(nil, 2),
			unsealedMemfd(t, unsealed, 0, boardSize(2), boardHeader(2))), notSealed)
		// Neither was taken for the real ones.
		a, b := connectPair(t, eps[0], eps[1], 2)
		stream(t, a, b, 20, ag.slotSize)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r, ep := range eps {
			wg.Go(func() { errs[r] = ep.JoinBoard(context.Background()) })
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	})
}

// offer sets up a connection to addr as s says and hands over fd with
// msg, as a rank would; it returns the listener's reason for refusing.
func offer(t *testing.T, addr string, s wire.ConnSetup, msg []byte, fd int) string {
	t.Helper()
	c, err := net.Dial("unix", addr)
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(patience))
	require.NoError(t, handshake.Client(c, secret, wire.PurposeShm, func() (wire.FrameType, []byte) {
		return wire.FrameConnSetup, s.Append(nil)
	}))
	typ, _, err := handshake.ReadFrame(c, 4096)
	require.NoError(t, err)
	require.Equal(t, wire.FrameConnSetup, typ, "the setup is acknowledged")
	_, _, err = c.(*net.UnixConn).WriteMsgUnix(msg, unix.UnixRights(fd), nil)
	require.NoError(t, err)
	typ, payload, err := handshake.ReadFrame(c, 4096)
	require.NoError(t, err)
	require.Equal(t, wire.FrameReject, typ)
	r, _, err := wire.ParseReject(payload)
	require.NoError(t, err)
	return r.Reason
}
