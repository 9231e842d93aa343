package memory

import (
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestSharedAllocationIsMappedByAPeer(t *testing.T) {
	b, err := AllocShared(10000)
	require.NoError(t, err)
	require.Len(t, b, 10000)
	for i := range b {
		require.Zero(t, b[i], "zeroed")
		b[i] = byte(i * 7)
	}
	ref, ok := SharedOf(b[100:300])
	require.True(t, ok)
	require.Equal(t, int64(100), ref.Off)
	require.Equal(t, int64(200), ref.Len)
	require.True(t, IsShared(HostBuffer(b[9000:])))
	require.False(t, IsShared(HostBuffer(make([]byte, 64))), "Go memory")
	_, ok = SharedOf(append([]byte(nil), b[:10]...))
	require.False(t, ok, "a copy is not shared")

	// This process stands for the peer: /proc/self/fd works alike.
	p, err := MapPeerShared(os.Getpid(), ref.FD, ref.Nonce)
	require.NoError(t, err)
	got, ok := p.Bytes(ref.Off, ref.Len)
	require.True(t, ok)
	require.Equal(t, b[100:300], got)
	b[150] = 42
	require.Equal(t, byte(42), got[50], "the same pages, not a copy")
	_, ok = p.Bytes(9999, 2)
	require.False(t, ok, "past the allocation's end")
	_, ok = p.Bytes(-1, 2)
	require.False(t, ok)
	require.NoError(t, p.Close())

	_, err = MapPeerShared(os.Getpid(), ref.FD, ref.Nonce+2)
	require.ErrorContains(t, err, "nonce", "a reused descriptor with another nonce maps nothing")
	require.Error(t, unix.Ftruncate(ref.FD, 1), "sealed against shrinking")

	require.NoError(t, FreeShared(b))
	require.ErrorContains(t, FreeShared(b), "did not return (or freed already)")
	require.False(t, IsShared(HostBuffer(make([]byte, 1))))
}

func TestSharedAllocationsAreFoundAmongSeveral(t *testing.T) {
	var bufs [][]byte
	for _, n := range []int{1, 4096, 4097, 1 << 20} {
		b, err := AllocShared(n)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		ref, ok := SharedOf(b)
		require.True(t, ok)
		require.Zero(t, ref.Off)
		require.Equal(t, int64(len(b)), ref.Len)
		if len(b) > 1 {
			_, ok = SharedOf(b[1:])
			require.True(t, ok)
		}
		// One byte past the end is outside (the next page is padding or
		// another allocation).
		_, ok = SharedOf(unsafe.Slice(&b[len(b)-1], 2)) // not read
		require.False(t, ok, "a range that runs past the allocation")
	}
	for _, b := range bufs {
		require.NoError(t, FreeShared(b))
	}
	_, err := AllocShared(0)
	require.Error(t, err)
	_, err = MapPeerShared(os.Getpid(), 0, 1) // stdin: not a memfd
	require.Error(t, err)
}
