package memory

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared host memory (issue 17; NCCL's ncclMemAlloc). A slice in an
// ordinary Go buffer crosses to a peer on the same host with two copies,
// into a shared-memory slot and out of it, or with the kernel's
// process_vm_readv, which runs at a third of a user-space copy's speed on
// the VMs here (docs/performance.md). Memory that AllocShared hands out
// lives in a memfd of its own: a peer of the same user opens it through
// /proc/<pid>/fd/<fd>, maps it, and copies the slice straight out of it
// at memcpy's speed, once.
//
// The memfd's first page is a header (a magic word and a random nonce)
// and the caller's bytes start at the next; the peer checks the nonce it
// was told against the header before it uses a mapping, so that a reused
// pid or descriptor number maps nothing. The memfd is sealed against
// growing and shrinking, so no holder can truncate it under a peer's
// mapping (which would make the peer's copy fault).

const (
	sharedPage  = 4096
	sharedMagic = 0x676f63636c53484d // "goccl" SHM
	// SharedHeader is the bytes before the caller's in a shared
	// allocation's memfd.
	SharedHeader = sharedPage
	sharedSeals  = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
)

// SharedRef says where a range of bytes lies in a shared allocation, as a
// peer on this host finds it: the memfd's descriptor number in this
// process, the allocation's nonce, and the range's offset after the
// header and its length.
type SharedRef struct {
	FD    int
	Nonce uint64
	Off   int64
	Len   int64
}

type sharedAlloc struct {
	base, n uintptr // the caller's bytes
	mem     []byte  // the whole mapping, header included
	fd      int
	nonce   uint64
}

var shared struct {
	mu     sync.Mutex
	allocs []*sharedAlloc // by base
	count  atomic.Int32   // len(allocs), read without the lock
}

// AllocShared returns n bytes (n > 0) of zeroed host memory that peers on
// this host can map (see above), for buffers that collectives move
// between the ranks of one host. Free it with FreeShared.
func AllocShared(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("memory: a shared allocation of %d bytes (want > 0)", n)
	}
	size := SharedHeader + (n+sharedPage-1)/sharedPage*sharedPage
	if size < n {
		return nil, fmt.Errorf("memory: a shared allocation of %d bytes is too large", n)
	}
	fd, err := unix.MemfdCreate("goccl-shared", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memory: memfd_create: %w", err)
	}
	fail := func(what string, err error) ([]byte, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("memory: shared allocation of %d bytes: %s: %w", n, what, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("sizing the memfd", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sharedSeals); err != nil {
		return fail("sealing the memfd", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mapping it", err)
	}
	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		unix.Munmap(mem)
		return fail("a nonce", err)
	}
	a := &sharedAlloc{mem: mem, fd: fd, nonce: binary.LittleEndian.Uint64(nb[:]) | 1}
	binary.LittleEndian.PutUint64(mem[0:], sharedMagic)
	binary.LittleEndian.PutUint64(mem[8:], a.nonce)
	binary.LittleEndian.PutUint64(mem[16:], uint64(n))
	user := mem[SharedHeader : SharedHeader+n : SharedHeader+n]
	a.base, a.n = uintptr(unsafe.Pointer(&user[0])), uintptr(n)
	shared.mu.Lock()
	i, _ := findShared(a.base)
	shared.allocs = slices.Insert(shared.allocs, i, a)
	shared.count.Store(int32(len(shared.allocs)))
	shared.mu.Unlock()
	return user, nil
}

// findShared is where an allocation starting at p is, or would go, in
// shared.allocs. The caller holds shared.mu.
func findShared(p uintptr) (int, bool) {
	return slices.BinarySearchFunc(shared.allocs, p, func(x *sharedAlloc, p uintptr) int { return cmp.Compare(x.base, p) })
}

// FreeShared frees what AllocShared returned (the whole slice it
// returned, not a part). A peer that mapped it keeps its mapping until it
// lets go, so no operation in flight may still use it: free it only once
// every operation on it has returned, as any buffer.
func FreeShared(b []byte) error {
	if len(b) == 0 {
		return errors.New("memory: FreeShared of an empty slice")
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	shared.mu.Lock()
	i, found := findShared(p)
	if !found {
		shared.mu.Unlock()
		return errors.New("memory: FreeShared of memory that AllocShared did not return (or freed already)")
	}
	a := shared.allocs[i]
	shared.allocs = slices.Delete(shared.allocs, i, i+1)
	shared.count.Store(int32(len(shared.allocs)))
	shared.mu.Unlock()
	err := unix.Munmap(a.mem)
	unix.Close(a.fd)
	if err != nil {
		return fmt.Errorf("memory: unmapping a shared allocation: %w", err)
	}
	return nil
}

// lookupShared returns the allocation that holds [p, p+n), if any.
func lookupShared(p, n uintptr) (*sharedAlloc, bool) {
	if shared.count.Load() == 0 || n == 0 {
		return nil, false
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	i, found := findShared(p)
	if !found {
		i-- // the last allocation that starts before p
	}
	if i < 0 {
		return nil, false
	}
	a := shared.allocs[i]
	if p < a.base || p-a.base+n > a.n || p-a.base+n < n {
		return nil, false
	}
	return a, true
}

// SharedOf returns where b lies in a shared allocation (AllocShared), or
// false if it is not wholly in one.
func SharedOf(b []byte) (SharedRef, bool) {
	if len(b) == 0 {
		return SharedRef{}, false
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	a, ok := lookupShared(p, uintptr(len(b)))
	if !ok {
		return SharedRef{}, false
	}
	return SharedRef{FD: a.fd, Nonce: a.nonce, Off: int64(p - a.base), Len: int64(len(b))}, true
}

// IsShared reports whether buf is host memory wholly inside one shared
// allocation.
func IsShared(buf Buffer) bool {
	if buf.at.kind != Host || buf.n == 0 || shared.count.Load() == 0 {
		return false
	}
	_, ok := lookupShared(uintptr(buf.host), uintptr(buf.n))
	return ok
}

// PeerShared is a peer's shared allocation, mapped read-only here.
type PeerShared struct {
	mem []byte
	n   int64 // the caller's bytes, from the header
}

// MapPeerShared maps the shared allocation that process pid holds at
// descriptor fd, checking that it is one (sealed, with goccl's header)
// with the given nonce. The caller unmaps it with Close.
func MapPeerShared(pid, fd int, nonce uint64) (*PeerShared, error) {
	if pid <= 0 || fd < 0 {
		return nil, fmt.Errorf("memory: no shared allocation at pid %d, descriptor %d", pid, fd)
	}
	f, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("memory: opening descriptor %d of pid %d: %w", fd, pid, err)
	}
	defer unix.Close(f)
	seals, err := unix.FcntlInt(uintptr(f), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, fmt.Errorf("memory: descriptor %d of pid %d is not a sealed memfd (seals %#x, %v)", fd, pid, seals, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return nil, fmt.Errorf("memory: stat of descriptor %d of pid %d: %w", fd, pid, err)
	}
	if st.Size <= SharedHeader || st.Size > 1<<46 {
		return nil, fmt.Errorf("memory: descriptor %d of pid %d is %d bytes, not a shared allocation", fd, pid, st.Size)
	}
	mem, err := unix.Mmap(f, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("memory: mapping descriptor %d of pid %d: %w", fd, pid, err)
	}
	n := int64(binary.LittleEndian.Uint64(mem[16:]))
	if binary.LittleEndian.Uint64(mem[0:]) != sharedMagic || binary.LittleEndian.Uint64(mem[8:]) != nonce ||
		n <= 0 || n > st.Size-SharedHeader {
		unix.Munmap(mem)
		return nil, fmt.Errorf("memory: descriptor %d of pid %d is not the shared allocation it was said to be (nonce or header differ)", fd, pid)
	}
	return &PeerShared{mem: mem, n: n}, nil
}

// Bytes returns the allocation's range [off, off+n), or false if it lies
// outside.
func (p *PeerShared) Bytes(off, n int64) ([]byte, bool) {
	if off < 0 || n < 0 || off > p.n || n > p.n-off {
		return nil, false
	}
	return p.mem[SharedHeader+off : SharedHeader+off+n : SharedHeader+off+n], true
}

// Close unmaps the peer's allocation.
func (p *PeerShared) Close() error {
	if p.mem == nil {
		return nil
	}
	err := unix.Munmap(p.mem)
	p.mem = nil
	return err
}
