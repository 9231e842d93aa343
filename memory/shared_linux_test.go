package memory

import (
	"os"
	"runtime"
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

// A Go buffer registered in place: its whole pages become a shared
// allocation that a peer maps (the same pages, not a copy), with the
// contents it had; the part-pages at the ends stay private; Release
// moves the pages back with their contents, after which a peer's
// mapping no longer sees the buffer's writes.
func TestRegisteredGoMemoryIsMappedByAPeer(t *testing.T) {
	backing := make([]byte, 3<<20)
	b := backing[1000 : 1000+2<<20] // starts and ends inside a page
	for i := range b {
		b[i] = byte(i * 13)
	}
	reg, err := RegisterShared(b)
	require.NoError(t, err)
	start := (4096 - (uintptr(unsafe.Pointer(&b[0])) % 4096)) % 4096
	require.Equal(t, len(b)-int(start)-int((uintptr(unsafe.Pointer(&b[0]))+uintptr(len(b)))%4096), reg.Bytes())
	for i := range b {
		if b[i] != byte(i*13) {
			t.Fatalf("byte %d changed by the registration: %d", i, b[i])
		}
	}
	require.True(t, SharesAny(HostBuffer(b)))
	require.False(t, IsShared(HostBuffer(b)), "the part-pages at the ends are not shared")
	_, ok := SharedOf(b[:10])
	require.Equal(t, start == 0, ok, "the first part-page")
	mid := b[8192 : 8192+100000]
	ref, ok := SharedOf(mid)
	require.True(t, ok)
	p, err := MapPeerShared(os.Getpid(), ref.FD, ref.Nonce)
	require.NoError(t, err)
	got, ok := p.Bytes(ref.Off, ref.Len)
	require.True(t, ok)
	require.Equal(t, mid, got)
	mid[5] = 99
	require.Equal(t, byte(99), got[5], "the peer maps the buffer's own pages")

	again, err := RegisterShared(b)
	require.NoError(t, err)
	require.Equal(t, reg.Bytes(), again.Bytes())
	require.NoError(t, again.Release())
	_, ok = SharedOf(mid)
	require.True(t, ok, "still registered once")
	require.ErrorContains(t, FreeShared(b[start:]), "registered")

	require.NoError(t, reg.Release())
	require.NoError(t, reg.Release(), "a released registration releases nothing")
	_, ok = SharedOf(mid)
	require.False(t, ok)
	require.False(t, SharesAny(HostBuffer(b)))
	require.Equal(t, byte(99), mid[5], "the contents came back")
	for i := range b {
		if i != 8192+5 && b[i] != byte(i*13) {
			t.Fatalf("byte %d after Release: %d", i, b[i])
		}
	}
	mid[6] = 77
	require.NotEqual(t, byte(77), got[6], "private again: the peer's old mapping does not see new writes")
	require.NoError(t, p.Close())
}

func TestRegisteringWhatCannotBeMoved(t *testing.T) {
	// Within one page: nothing to share, nothing moved.
	small := make([]byte, 100)
	reg, err := RegisterShared(small)
	require.NoError(t, err)
	require.Zero(t, reg.Bytes())
	require.NoError(t, reg.Release())

	// Inside a shared allocation already: nothing moved.
	sb, err := AllocShared(1 << 16)
	require.NoError(t, err)
	reg, err = RegisterShared(sb[100:5000])
	require.NoError(t, err)
	require.Equal(t, 4900, reg.Bytes())
	require.NoError(t, reg.Release())
	_, ok := SharedOf(sb[100:5000])
	require.True(t, ok, "the allocation is untouched")
	require.NoError(t, FreeShared(sb))

	// A file's mapping would be cut off from its file.
	f, err := os.CreateTemp(t.TempDir(), "mapped")
	require.NoError(t, err)
	require.NoError(t, f.Truncate(1<<16))
	fm, err := unix.Mmap(int(f.Fd()), 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(fm)
	_, err = RegisterShared(fm)
	require.ErrorContains(t, err, "not private anonymous")

	// Read-only memory is not the caller's to move.
	ro, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(ro)
	_, err = RegisterShared(ro)
	require.ErrorContains(t, err, "not private anonymous")

	// Overlapping another registration's pages, but not the same pages.
	backing := make([]byte, 1<<20)
	reg, err = RegisterShared(backing[:1<<19])
	require.NoError(t, err)
	_, err = RegisterShared(backing[1<<18:])
	require.ErrorContains(t, err, "overlap")
	require.NoError(t, reg.Release())

	_, err = RegisterShared(nil)
	require.Error(t, err)
}

// A registered buffer lives through collections and a heap that churns
// around it, with its contents.
func TestRegisteredMemoryThroughCollections(t *testing.T) {
	b := make([]uint64, 1<<17)
	for i := range b {
		b[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	bytes := unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b)*8)
	reg, err := RegisterShared(bytes)
	require.NoError(t, err)
	require.Positive(t, reg.Bytes())
	var junk [][]byte
	for i := range 200 {
		junk = append(junk, make([]byte, 1<<(10+i%10)))
		if i%50 == 0 {
			runtime.GC()
		}
	}
	runtime.GC()
	for i := range b {
		if b[i] != uint64(i)*0x9e3779b97f4a7c15 {
			t.Fatalf("element %d: %#x", i, b[i])
		}
		b[i]++
	}
	require.NoError(t, reg.Release())
	runtime.GC()
	for i := range b {
		if b[i] != uint64(i)*0x9e3779b97f4a7c15+1 {
			t.Fatalf("element %d after Release: %#x", i, b[i])
		}
	}
	runtime.KeepAlive(junk)
}

// A buffer that lies wholly in registered pages (registered again, or a
// part of one) holds a count of that registration: the pages stay shared
// until every holder has released them.
func TestRegistrationsInsideRegisteredPagesAreCounted(t *testing.T) {
	b := make([]byte, 1<<20)
	if uintptr(unsafe.Pointer(&b[0]))%4096 != 0 {
		t.Skip("the runtime did not give a page-aligned 1 MiB buffer here")
	}
	first, err := RegisterShared(b)
	require.NoError(t, err)
	require.Equal(t, len(b), first.Bytes())
	second, err := RegisterShared(b)
	require.NoError(t, err)
	part, err := RegisterShared(b[5000:9000])
	require.NoError(t, err)
	require.Equal(t, 4000, part.Bytes())

	require.NoError(t, first.Release())
	_, ok := SharedOf(b)
	require.True(t, ok, "two holders left")
	require.NoError(t, second.Release())
	_, ok = SharedOf(b[5000:9000])
	require.True(t, ok, "the part still holds the pages")
	require.NoError(t, part.Release())
	_, ok = SharedOf(b)
	require.False(t, ok, "released by every holder")
	require.False(t, SharesAny(HostBuffer(b)))
}
