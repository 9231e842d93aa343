package ibv

import (
	"fmt"
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

// Mem is memory for registration: a shared mapping of a memfd, never Go
// heap memory, which the emulated device can also map in a peer's
// process.
type Mem struct {
	B   []byte
	fd  int
	all []byte // the whole mapping, whole pages
}

// Alloc maps n bytes (rounded up to whole pages) of fresh zeroed memory.
func Alloc(n int) (*Mem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("ibv: allocating %d bytes", n)
	}
	page := unix.Getpagesize()
	size := (n + page - 1) &^ (page - 1)
	fd, err := unix.MemfdCreate("goccl-verbs", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ibv: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ibv: sizing %d bytes of memory: %w", size, err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ibv: mapping %d bytes: %w", size, err)
	}
	m := &Mem{B: b[:n:n], fd: fd, all: b}
	allocs.add(m, size)
	return m, nil
}

// Free unmaps the memory. Its regions must have been deregistered.
func (m *Mem) Free() error {
	if m == nil || m.B == nil {
		return nil
	}
	allocs.remove(m)
	err := unix.Munmap(m.all)
	unix.Close(m.fd)
	m.B = nil
	return err
}

// Lookup finds the allocation that holds [p, p+n): its memfd and the
// offset of p in it. The emulated device registers only such memory.
func Lookup(p uintptr, n int) (fd int, off int64, ok bool) {
	return allocs.lookup(p, n)
}

type allocation struct {
	start, end uintptr
	m          *Mem
}

type allocTable struct {
	mu sync.Mutex
	a  []allocation // sorted by start
}

var allocs allocTable

func (t *allocTable) add(m *Mem, size int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := addrOf(m.B)
	i := sort.Search(len(t.a), func(i int) bool { return t.a[i].start > p })
	t.a = append(t.a, allocation{})
	copy(t.a[i+1:], t.a[i:])
	t.a[i] = allocation{start: p, end: p + uintptr(size), m: m}
}

func (t *allocTable) remove(m *Mem) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.a {
		if t.a[i].m == m {
			t.a = append(t.a[:i], t.a[i+1:]...)
			return
		}
	}
}

func (t *allocTable) lookup(p uintptr, n int) (int, int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := sort.Search(len(t.a), func(i int) bool { return t.a[i].start > p }) - 1
	if i < 0 || p+uintptr(n) > t.a[i].end {
		return -1, 0, false
	}
	return t.a[i].m.fd, int64(p - t.a[i].start), true
}
