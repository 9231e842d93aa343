package collective

import (
	"context"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/memory"
)

// Fusing small collectives in a Group. A training step often all-reduces
// many small tensors (biases, norms, a loss), and a data-parallel job
// starts by broadcasting every parameter and buffer from rank 0 (DDP
// coalesces those broadcasts into buckets, _broadcast_coalesced); each
// is a round of latency. Inside Group, StartAllReduce calls on host
// memory with the same type and operator, and StartBroadcast calls on
// host memory from the same root (of any types: a broadcast moves bytes),
// are held back and, when the group ends (or another kind of operation is
// issued), run as one operation on their concatenation, as NCCL
// aggregates the operations of a group: every rank fuses the same calls
// in the same order, so they agree on the fused operation.

// fuseMaxBytes bounds a fused all-reduce: beyond it a round of latency is
// small against the transfer, and the packing copies would cost more.
const fuseMaxBytes = 1 << 20

// fused is an all-reduce held back in a group.
type fused struct {
	ctx  context.Context
	k    call
	r    *Request // the caller's, finished once the fused operation is
	size int      // bytes
}

// groupFusable reports whether k can wait for the group's end.
func groupFusable(k *call) bool {
	op := &k.op
	if op.Ready != nil || op.Out.Kind() != memory.Host || op.Bytes(1) > fuseMaxBytes {
		return false
	}
	switch op.Coll {
	case algorithms.CollAllReduce:
		return !k.premul && op.In.Kind() == memory.Host
	case algorithms.CollBroadcast:
		return op.In.Len() == 0 || op.In.Kind() == memory.Host // no input off the root
	}
	return false
}

// fusesWith reports whether k can join the held call last in one
// operation.
func fusesWith(last, k *call) bool {
	a, b := &last.op, &k.op
	if a.Coll != b.Coll {
		return false
	}
	if a.Coll == algorithms.CollBroadcast {
		return a.Root == b.Root
	}
	return a.Type == b.Type && a.Red == b.Red
}

// hold keeps a small all-reduce or broadcast for the group's end and returns the caller's
// Request; false when c is not in a group or k cannot be fused.
func (c *Comm) hold(ctx context.Context, k *call) (*Request, bool, error) {
	c.mu.Lock()
	if c.grouping == 0 || !groupFusable(k) {
		c.mu.Unlock()
		return nil, false, nil
	}
	if c.closed {
		c.mu.Unlock()
		return nil, true, &ArgError{Rank: c.rank, Op: k.name, Err: ErrClosed}
	}
	size := int(k.op.Bytes(1))
	if n := len(c.held); n > 0 {
		last := c.held[n-1]
		if !fusesWith(&last.k, k) || c.heldBytes+size > fuseMaxBytes {
			c.mu.Unlock()
			c.flushHeld() // another kind: what is held goes first
			c.mu.Lock()
		}
	}
	r := &Request{c: c, name: k.name, async: true, done: make(chan struct{})}
	c.pending++ // finished with the fused operation
	c.held = append(c.held, fused{ctx: ctx, k: *k, r: r, size: size})
	c.heldBytes += size
	c.mu.Unlock()
	return r, true, nil
}

// flushHeld issues what a group holds: one call alone as it is, several
// as one operation on their concatenation, whose results are copied back
// before their Requests finish. A fused broadcast is of bytes, packed on
// the root only.
func (c *Comm) flushHeld() {
	c.mu.Lock()
	held := c.held
	c.held, c.heldBytes = nil, 0
	c.mu.Unlock()
	if len(held) == 0 {
		return
	}
	total := 0
	for _, h := range held {
		total += h.size
	}
	pack := make([]byte, total)
	k := held[0].k
	bcast := k.op.Coll == algorithms.CollBroadcast
	if !bcast || c.rank == k.op.Root {
		off := 0
		for _, h := range held {
			copy(pack[off:off+h.size], h.k.op.In.Bytes())
			off += h.size
		}
	}
	k.op.In, k.op.Out = memory.HostBuffer(pack), memory.HostBuffer(pack)
	if bcast {
		k.op.Type = Uint8.kernel()
		if c.rank != k.op.Root {
			k.op.In = memory.Buffer{}
		}
	}
	k.op.Count = total / k.op.Type.Size()
	fin := func(err error) {
		off := 0
		for _, h := range held {
			if err == nil {
				copy(h.k.op.Out.Bytes(), pack[off:off+h.size])
			}
			off += h.size
			c.finish(h.r, err)
		}
	}
	r, err := c.startNow(held[0].ctx, k) // not held back again
	if err != nil {
		fin(err)
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fin(r.Wait(context.Background()))
	}()
}
