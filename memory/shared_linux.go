package memory

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
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
	mem     []byte  // the whole mapping, header included (AllocShared's; nil for a registration)
	fd      int
	nonce   uint64
	// A registration's (RegisterShared; nil pages for AllocShared's
	// allocations): its pages (which this reference keeps from the
	// garbage collector until the last Release), its holders, and whether
	// it is being moved in or out (then lookups pass it by, and other
	// registrations of its pages are refused).
	pages      []byte
	registered int
	moving     bool
}

// reg reports whether a is a registration.
func (a *sharedAlloc) reg() bool { return a.pages != nil }

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
	fd, nonce, err := newSharedMemfd("goccl-shared", size, n)
	if err != nil {
		return nil, fmt.Errorf("memory: shared allocation of %d bytes: %w", n, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("memory: shared allocation of %d bytes: mapping it: %w", n, err)
	}
	a := &sharedAlloc{mem: mem, fd: fd, nonce: nonce}
	user := mem[SharedHeader : SharedHeader+n : SharedHeader+n]
	a.base, a.n = uintptr(unsafe.Pointer(&user[0])), uintptr(n)
	shared.mu.Lock()
	i, _ := findShared(a.base)
	shared.allocs = slices.Insert(shared.allocs, i, a)
	shared.count.Store(int32(len(shared.allocs)))
	shared.mu.Unlock()
	return user, nil
}

// newSharedMemfd makes a shared allocation's memfd of size bytes, sealed
// against growing and shrinking, with the header (magic, a fresh nonce,
// n: the caller's bytes) written, and returns it and the nonce.
func newSharedMemfd(name string, size, n int) (int, uint64, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, 0, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(what string, err error) (int, uint64, error) {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("sizing the memfd", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sharedSeals); err != nil {
		return fail("sealing the memfd", err)
	}
	var hdr [24]byte
	if _, err := rand.Read(hdr[8:16]); err != nil {
		return fail("a nonce", err)
	}
	nonce := binary.LittleEndian.Uint64(hdr[8:]) | 1
	binary.LittleEndian.PutUint64(hdr[0:], sharedMagic)
	binary.LittleEndian.PutUint64(hdr[8:], nonce)
	binary.LittleEndian.PutUint64(hdr[16:], uint64(n))
	if _, err := unix.Pwrite(fd, hdr[:], 0); err != nil {
		return fail("writing the header", err)
	}
	return fd, nonce, nil
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
	if a.reg() {
		shared.mu.Unlock()
		return errors.New("memory: FreeShared of registered memory (RegisterShared): release the registration instead")
	}
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
	return lookupLocked(p, n)
}

// lookupLocked is lookupShared; the caller holds shared.mu. A
// registration being moved holds nothing.
func lookupLocked(p, n uintptr) (*sharedAlloc, bool) {
	i, found := findShared(p)
	if !found {
		i-- // the last allocation that starts before p
	}
	if i < 0 {
		return nil, false
	}
	a := shared.allocs[i]
	if a.moving || p < a.base || p-a.base+n > a.n || p-a.base+n < n {
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

// SharesAny reports whether some of buf is host memory in a shared
// allocation (AllocShared's, or a registration's whole pages): its
// slices there can go by reference (SharedOf), the rest the ordinary way.
func SharesAny(buf Buffer) bool {
	if buf.at.kind != Host || buf.n == 0 || shared.count.Load() == 0 {
		return false
	}
	p, n := uintptr(buf.host), uintptr(buf.n)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	// The last allocation that starts before the buffer's end.
	i, _ := slices.BinarySearchFunc(shared.allocs, p+n, func(x *sharedAlloc, e uintptr) int { return cmp.Compare(x.base, e) })
	return i > 0 && !shared.allocs[i-1].moving && shared.allocs[i-1].base+shared.allocs[i-1].n > p
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

// Registered memory (issue 17; NCCL's ncclCommRegister). A buffer the
// caller already has, Go memory or any private anonymous mapping, is
// made shareable in place: the whole pages inside it move into a memfd
// of their own, laid out as AllocShared's (a header page, then the
// bytes), and that memfd is mapped over the very addresses they had,
// with their contents. From then on they are a shared allocation like
// any other (SharedOf, MapPeerShared); the part-pages at either end stay
// where they were, and slices that touch them go the ordinary way.
// Release moves the pages back into private anonymous memory.
//
// The move: the pages are copied into the memfd through a mapping of it
// elsewhere, and mremap(2) then puts that mapping in the buffer's place
// in one step (MREMAP_FIXED), so a reader of the buffer sees the old
// pages or the new, with the same bytes; Release does the reverse with
// an anonymous mapping. A write to the buffer from another goroutine
// while either runs may be lost: the caller must not write it then (as
// NCCL asks that a buffer not be in use when it is registered).
//
// Only private anonymous read-write memory is moved (checked against
// /proc/self/maps): moving a file's mapping would cut the buffer off from
// its file, and shared or read-only memory is not the caller's to move.
// Go's heap is private anonymous memory that the runtime never moves or
// unmaps while an object lives in it; the pages hold only the buffer
// (they lie wholly inside it), so no other object is copied under a
// writer. The garbage collector does not look inside a []T of numbers.

// SharedRegistration is a registration of existing memory (RegisterShared).
type SharedRegistration struct {
	a      *sharedAlloc // the registration held; nil: none (no whole page, or in an AllocShared allocation)
	shared int
}

// Bytes returns how many of the buffer's bytes are shared: its whole
// pages, or all of it if it already lay in a shared allocation.
func (r *SharedRegistration) Bytes() int { return r.shared }

var pageSize = unix.Getpagesize()

// RegisterShared makes the whole pages of b shareable with peers on this
// host, in place (see above). Registering the same pages again, or a
// buffer that lies inside registered pages, returns the same
// registration, counted: each Release drops one count, and the last
// moves the pages back. A buffer inside an AllocShared allocation needs
// nothing and gets a registration that moves nothing; one whose pages
// overlap other shared pages, or pages being registered or released by
// another goroutine, is refused. The pages are copied outside the
// allocations' lock.
func RegisterShared(b []byte) (*SharedRegistration, error) {
	if len(b) == 0 {
		return nil, errors.New("memory: registering an empty buffer")
	}
	if pageSize != sharedPage {
		return nil, fmt.Errorf("memory: registration needs %d-byte pages; this system's are %d bytes", sharedPage, pageSize)
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	start := (p + sharedPage - 1) &^ (sharedPage - 1)
	end := (p + uintptr(len(b))) &^ (sharedPage - 1)
	shared.mu.Lock()
	if a, ok := lookupLocked(p, uintptr(len(b))); ok {
		// Inside shared memory already: an allocation needs nothing; a
		// registration's pages are held once more, so that they stay
		// shared until this one is released too.
		r := &SharedRegistration{shared: len(b)}
		if a.reg() {
			a.registered++
			r.a = a
		}
		shared.mu.Unlock()
		return r, nil
	}
	if end <= start {
		shared.mu.Unlock()
		return &SharedRegistration{}, nil // no whole page: nothing to share
	}
	n := end - start
	i, found := findShared(start)
	if found {
		if a := shared.allocs[i]; a.reg() && !a.moving && a.n == n {
			a.registered++ // the same pages, in a buffer with other part-pages
			shared.mu.Unlock()
			return &SharedRegistration{a: a, shared: int(n)}, nil
		}
	}
	// Any overlap with another allocation: the one before start reaching
	// past it, or one starting inside [start, end).
	if i > 0 && shared.allocs[i-1].base+shared.allocs[i-1].n > start || i < len(shared.allocs) && shared.allocs[i].base < end {
		shared.mu.Unlock()
		return nil, fmt.Errorf("memory: the pages of %d bytes at %#x overlap a shared allocation or registration of other pages (or one being made or released)", len(b), p)
	}
	// Held in the list while it is moved, outside the lock (the copy may
	// take long): lookups pass it by, other registrations of its pages
	// are refused.
	a := &sharedAlloc{base: start, n: n, pages: b[start-p : end-p : end-p], moving: true}
	shared.allocs = slices.Insert(shared.allocs, i, a)
	shared.count.Store(int32(len(shared.allocs)))
	shared.mu.Unlock()
	err := privateAnonymous(start, end)
	if err == nil {
		a.fd, a.nonce, err = moveToMemfd(a.pages)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	a.moving = false
	if err != nil {
		dropLocked(a)
		return nil, err
	}
	a.registered = 1
	return &SharedRegistration{a: a, shared: int(n)}, nil
}

// dropLocked takes a out of the list; the caller holds shared.mu.
func dropLocked(a *sharedAlloc) {
	if i, found := findShared(a.base); found && shared.allocs[i] == a {
		shared.allocs = slices.Delete(shared.allocs, i, i+1)
		shared.count.Store(int32(len(shared.allocs)))
	}
}

// moveToMemfd moves whole pages into a new memfd, in place, and returns
// its descriptor and nonce.
func moveToMemfd(pages []byte) (int, uint64, error) {
	n := len(pages)
	fd, nonce, err := newSharedMemfd("goccl-registered", SharedHeader+n, n)
	if err != nil {
		return -1, 0, fmt.Errorf("memory: registering %d bytes: %w", n, err)
	}
	fail := func(what string, err error) (int, uint64, error) {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("memory: registering %d bytes: %s: %w", n, what, err)
	}
	tmp, err := mapTemp(fd, SharedHeader, n, unix.MAP_SHARED)
	if err != nil {
		return fail("mapping it", err)
	}
	copy(tmp, pages)
	if err := replace(tmp, pages); err != nil {
		// mremap unmaps the destination before it moves the mapping: put
		// private memory with the contents back in case it got that far.
		if rerr := restore(pages, -1, tmp); rerr != nil {
			err = fmt.Errorf("%w; and putting the buffer's pages back failed too, so they are unmapped: %v", err, rerr)
		}
		unix.MunmapPtr(unsafe.Pointer(&tmp[0]), uintptr(n))
		return fail("mapping it in the buffer's place", err)
	}
	return fd, nonce, nil
}

// restore maps memory over pages again after a failed replace: the
// memfd fd's bytes after its header, or (fd -1) private anonymous memory
// with the contents of from.
func restore(pages []byte, fd int, from []byte) error {
	flags, off := unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, int64(0)
	if fd >= 0 {
		flags, off = unix.MAP_SHARED|unix.MAP_FIXED, SharedHeader
	}
	if _, err := unix.MmapPtr(fd, off, unsafe.Pointer(&pages[0]), uintptr(len(pages)), unix.PROT_READ|unix.PROT_WRITE, flags); err != nil {
		return err
	}
	if fd < 0 {
		copy(pages, from)
	}
	return nil
}

// mapTemp maps n read-write bytes of fd from off (or anonymous memory,
// fd -1) wherever the kernel puts them, for replace to move: not through
// unix.Mmap, whose record of its mappings would keep one that replace
// has moved away.
func mapTemp(fd int, off int64, n int, flags int) ([]byte, error) {
	p, err := unix.MmapPtr(fd, off, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// replace moves the mapping m over the pages at, which it is the size
// of, in one step.
func replace(m, at []byte) error {
	_, _, errno := unix.Syscall6(unix.SYS_MREMAP, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(len(m)),
		unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, uintptr(unsafe.Pointer(&at[0])), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// Release drops one count of the registration; the last moves the pages
// back into private anonymous memory, with their contents, and closes
// the memfd (peers that mapped it keep a copy nobody writes). No
// operation on the buffer may be running, nor any write to it.
func (r *SharedRegistration) Release() error {
	if r == nil || r.a == nil {
		return nil
	}
	a := r.a
	shared.mu.Lock()
	switch {
	case a.moving:
		shared.mu.Unlock()
		return errors.New("memory: releasing a registration whose pages another goroutine is moving")
	case a.registered <= 0:
		shared.mu.Unlock()
		return errors.New("memory: releasing a registration released already")
	case a.registered > 1:
		a.registered--
		r.a = nil
		shared.mu.Unlock()
		return nil
	}
	a.moving = true // lookups pass it by from here on
	shared.mu.Unlock()
	tmp, err := mapTemp(-1, 0, len(a.pages), unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err == nil {
		copy(tmp, a.pages)
		if err = replace(tmp, a.pages); err != nil {
			if rerr := restore(a.pages, a.fd, nil); rerr != nil {
				err = fmt.Errorf("%w; and mapping the registered pages back failed too, so they are unmapped: %v", err, rerr)
			}
			unix.MunmapPtr(unsafe.Pointer(&tmp[0]), uintptr(len(tmp)))
		}
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	a.moving = false
	if err != nil {
		// Still registered, and r still holds it: Release may be tried
		// again.
		return fmt.Errorf("memory: moving %d registered bytes back to private memory: %w", len(a.pages), err)
	}
	a.registered = 0
	dropLocked(a)
	unix.Close(a.fd)
	a.pages = nil
	r.a = nil
	return nil
}

// privateAnonymous checks that [start, end) lies in private anonymous
// read-write mappings (/proc/self/maps).
func privateAnonymous(start, end uintptr) error {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return fmt.Errorf("memory: registering: reading /proc/self/maps: %w", err)
	}
	at := start
	for line := range strings.Lines(string(maps)) {
		// lo-hi perms offset dev inode [path]
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		l, err1 := strconv.ParseUint(lo, 16, 64)
		h, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || uintptr(h) <= at || uintptr(l) > at {
			continue
		}
		path := ""
		if len(f) > 5 {
			path = f[5]
		}
		if f[1] != "rw-p" || f[4] != "0" || path != "" && !strings.HasPrefix(path, "[heap]") && !strings.HasPrefix(path, "[anon") {
			return fmt.Errorf("memory: the buffer at %#x lies in a mapping that is not private anonymous read-write memory (%s %s %s), which registration would cut off from what backs it", start, f[0], f[1], path)
		}
		if at = uintptr(h); at >= end {
			return nil
		}
	}
	return fmt.Errorf("memory: the buffer's pages from %#x are not all mapped", at)
}
