package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Slices out of shared allocations (memory.AllocShared, NCCL's
// ncclMemAlloc). Where the sender's slice lies in memory that
// AllocShared made, PostFrom sends it by reference as it does for the
// kernel's copy (cma_linux.go), but the reference names the allocation
// (its descriptor number in the sender, its nonce) and the slice's offset
// in it: the receiver maps the allocation read-only, once, through
// /proc/<pid>/fd/<fd>, and copies the slice out with a plain copy, at
// memcpy's speed, where process_vm_readv runs at a third of it here
// (WaitInto, and fetch for the kernel's copy). A plain Wait copies
// nothing: it lends the mapped slice itself (read-only) until Release,
// and the engine reduces straight out of it; Intact then says whether the
// sender had aborted before the caller was done reading (an aborted
// sender's caller may write the buffer again). The sender's Flush waits
// for the receiver's release, as for any slice by reference, so its
// buffer is intact while the peer reads.
//
// Whether a receiver can map the sender's allocations is probed, as the
// kernel's copy is: it opens the sender's /proc/<pid>/fd directory (the
// same user, a dumpable process) and says so in the segment (sideMaps);
// only then does the sender post such references. A mapping that fails
// later (a security module that refuses the open) fails the operation
// with the reason.
//
// What a peer can do with it: make this rank map and read memory of the
// peer's own (a memfd sealed against shrinking, checked to carry the
// nonce it was told), at most the bytes the engine expected. The
// mappings are kept per connection (at most peerSharedMax, the oldest
// let go first) and unmapped with the connection's segment; one of an
// allocation the sender has freed since stays mapped, read by nobody,
// until then.

const (
	// In a descriptor's inline bytes, for a slice by reference: the
	// reference's kind at refKind; for refShared, the allocation's
	// descriptor number at refFD and its nonce at refNonce (the offset at
	// 0 and the length at 8, where the kernel's copy has the address and
	// the length).
	refKind  = 16
	refFD    = 20
	refNonce = 24

	refCMA    = 0 // the sender's address, for process_vm_readv
	refShared = 1 // an offset in one of the sender's shared allocations

	// peerSharedMax bounds the peer allocations a connection keeps mapped.
	peerSharedMax = 16

	// DefaultSharedMax is Options.SharedMax's default: the largest
	// operation whose slices of shared allocations go by reference.
	// Measured (docs/performance.md, "MemAlloc"): at 4 MiB the one copy
	// took half the slots' time in 2-rank all-gathers and 3-rank
	// broadcasts, at 8 MiB it took 1.2-1.5 times as long, at 64 MiB 1.4.
	DefaultSharedMax = 4 << 20
)

// sharedReceived counts the slices this process has copied out of its
// peers' shared allocations.
var sharedReceived atomic.Int64

// SharedSlicesReceived returns how many slices this process has copied
// straight out of its peers' shared allocations (memory.AllocShared), for
// tests and diagnostics.
func SharedSlicesReceived() int64 { return sharedReceived.Load() }

type peerSharedKey struct {
	fd    int
	nonce uint64
}

// probeMaps finds out, once, whether this side can map the peer's
// shared allocations, and says so in the segment. The caller holds the
// segment.
func (c *conn) probeMaps() {
	if c.mapsProbed {
		return
	}
	c.mapsProbed = true
	res := uint32(cmaNo)
	if c.pid > 0 && c.mapped.Len() == 0 {
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/fd", c.pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			res = cmaYes
		} else if c.e.o.Logger != nil {
			c.e.o.Logger.Debug("goccl: shm: this rank cannot map the peer's shared allocations; their slices go through slots",
				"peer", c.peer, "channel", c.ch, "err", err)
		}
	}
	c.seg.u32(sideOff(c.seg.side) + sideMaps).Store(res)
}

// maps reports whether side has found that it can map the other side's
// shared allocations; false once the segment is being torn down.
func (c *conn) maps(side int) bool {
	if !c.seg.acquire() {
		return false
	}
	defer c.seg.release()
	return c.seg.u32(sideOff(side)+sideMaps).Load() == cmaYes
}

// refKind is the kind of reference in descriptor i (a slice posted by
// reference: refCMA or refShared).
func (r *ring) refKind(i uint32) uint32 {
	return binary.LittleEndian.Uint32(r.descOf(i)[descInline+refKind:])
}

// postShared posts a slice of a shared allocation by reference.
func (c *conn) postShared(ctx context.Context, ref memory.SharedRef, tag transport.Tag) error {
	if _, err := c.Reserve(ctx, 0); err != nil {
		return err
	}
	d := c.tx.descOf(c.tail)
	binary.LittleEndian.PutUint64(d[descInline:], uint64(ref.Off))
	binary.LittleEndian.PutUint64(d[descInline+8:], uint64(ref.Len))
	binary.LittleEndian.PutUint32(d[descInline+refKind:], refShared)
	binary.LittleEndian.PutUint32(d[descInline+refFD:], uint32(ref.FD))
	binary.LittleEndian.PutUint64(d[descInline+refNonce:], ref.Nonce)
	c.lastRef, c.hasRef = c.tail, true
	c.byRef.Add(1)
	c.byMap.Add(1)
	c.publish(tag, uint32(ref.Len)|refFlag)
	return nil
}

// copyShared copies the slice that descriptor d names in one of the
// peer's shared allocations into dst (whose length fetch has checked).
func (c *conn) copyShared(d, dst []byte) error {
	src, err := c.sharedSlice(d, len(dst))
	if err != nil {
		return err
	}
	copy(dst, src)
	sharedReceived.Add(1)
	return nil
}

// sharedSlice returns the n bytes that descriptor d names in one of the
// peer's shared allocations, mapped read-only.
func (c *conn) sharedSlice(d []byte, n int) ([]byte, error) {
	off := int64(binary.LittleEndian.Uint64(d[descInline:]))
	key := peerSharedKey{fd: int(binary.LittleEndian.Uint32(d[descInline+refFD:])), nonce: binary.LittleEndian.Uint64(d[descInline+refNonce:])}
	p, err := c.seg.peerShared(c.pid, key)
	if err != nil {
		return nil, fmt.Errorf("mapping rank %d's shared allocation: %w", c.peer, err)
	}
	src, ok := p.Bytes(off, int64(n))
	if !ok {
		return nil, &transport.PeerError{Peer: c.peer, Op: "recv", Err: fmt.Errorf("protocol error: rank %d posted %d bytes at %d of a shared allocation, which is shorter", c.peer, n, off)}
	}
	return src, nil
}

// viewShared is Wait's slice by reference into one of the peer's shared
// allocations (descriptor d, n bytes, as the descriptor's size says):
// the mapped bytes themselves, read where they are.
func (c *conn) viewShared(d []byte, n int) ([]byte, error) {
	if err := c.refLen(d, n); err != nil {
		return nil, err
	}
	v, err := c.sharedSlice(d, n)
	if err != nil {
		return nil, c.refFailed(err)
	}
	sharedReceived.Add(1)
	return v, nil
}

// Intact implements transport.Lender: the peer had not aborted by the
// time the caller was done reading the slice it lends (a sender that
// aborts returns to a caller that may reuse its buffer).
func (c *conn) Intact() error {
	if !c.holding || !c.lent {
		return nil
	}
	return c.senderAborted()
}

// peerShared returns the peer's allocation key, mapped once. Only the
// connection's goroutine calls it, holding the segment.
func (s *segment) peerShared(pid int, key peerSharedKey) (*memory.PeerShared, error) {
	if p, ok := s.peerMaps[key]; ok {
		return p, nil
	}
	p, err := memory.MapPeerShared(pid, key.fd, key.nonce)
	if err != nil {
		return nil, err
	}
	if s.peerMaps == nil {
		s.peerMaps = map[peerSharedKey]*memory.PeerShared{}
	}
	if len(s.peerMaps) >= peerSharedMax {
		old := s.peerOrder[0]
		s.peerOrder = s.peerOrder[1:]
		s.peerMaps[old].Close()
		delete(s.peerMaps, old)
	}
	s.peerMaps[key] = p
	s.peerOrder = append(s.peerOrder, key)
	return p, nil
}
