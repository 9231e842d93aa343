package ibv

import (
	"sort"
	"sync"
)

// Mem is memory for registration: a shared mapping of a memfd, never Go
// heap memory, which the emulated device can also map in a peer's
// process.
type Mem struct {
	B   []byte
	fd  int
	all []byte // the whole mapping, whole pages
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
