package verbs

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// mrCache registers memory with the device once per page range and
// access, and counts its users, as NCCL's ncclIbRegMr does
// (src/transport/net_ib: addresses rounded down and sizes up to pages,
// an entry reused when both match, deregistered with its last user).
// Registration pins pages and costs a system call and an IOMMU update
// each time; connections that share memory share one region.
type mrCache struct {
	ctx ibv.Context

	mu      sync.Mutex
	entries map[mrKey]*mrEntry
}

type mrKey struct {
	start, pages uint64
	access       ibv.Access
}

type mrEntry struct {
	mr   ibv.MR
	refs int
}

// mrRef is one user's hold on a cached region.
type mrRef struct {
	c   *mrCache
	key mrKey
	e   *mrEntry
	MR  ibv.MR
}

func newMRCache(ctx ibv.Context) *mrCache {
	return &mrCache{ctx: ctx, entries: map[mrKey]*mrEntry{}}
}

// register returns a region covering mem with the access given: a cached
// one when the same pages are registered so already. mem must not be Go
// heap memory (see ibv.Alloc) and must stay mapped until release.
func (c *mrCache) register(mem []byte, access ibv.Access) (*mrRef, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("verbs: registering 0 bytes")
	}
	start := ibv.Addr(mem) &^ (pageSize - 1)
	end := (ibv.Addr(mem) + uint64(len(mem)) + pageSize - 1) &^ (pageSize - 1)
	k := mrKey{start, (end - start) / pageSize, access}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[k]; e != nil {
		e.refs++
		return &mrRef{c: c, key: k, e: e, MR: e.mr}, nil
	}
	// The whole pages: a later user of the same pages finds this entry,
	// and an SGE anywhere in them is covered.
	off := ibv.Addr(mem) - start
	whole := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(mem)), -int(off))), int(end-start))
	mr, err := c.ctx.RegMR(whole, access)
	if err != nil {
		return nil, err
	}
	e := &mrEntry{mr: mr, refs: 1}
	c.entries[k] = e
	return &mrRef{c: c, key: k, e: e, MR: mr}, nil
}

// release drops the hold; the last one deregisters the region.
func (r *mrRef) release() error {
	if r == nil || r.e == nil {
		return nil
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	e := r.e
	r.e = nil
	if e.refs--; e.refs > 0 {
		return nil
	}
	delete(c.entries, r.key)
	return e.mr.Dereg()
}

// len is the number of cached regions.
func (c *mrCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
