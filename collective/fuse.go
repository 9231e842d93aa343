package collective

import (
	"context"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/memory"
)

// Fusing small all-reduces in a Group. A training step often all-reduces
// many small tensors (biases, norms, a loss); each is a round of latency.
// Inside Group, StartAllReduce calls on host memory with the same type and
// operator are held back and, when the group ends (or another operation
// is issued), run as one all-reduce of their concatenation, as NCCL
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
	return op.Coll == algorithms.CollAllReduce && !k.premul && op.Ready == nil &&
		op.In.Kind() == memory.Host && op.Out.Kind() == memory.Host && op.Bytes(1) <= fuseMaxBytes
}

// hold keeps an all-reduce for the group's end and returns the caller's
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
		if last.k.op.Type != k.op.Type || last.k.op.Red != k.op.Red || c.heldBytes+size > fuseMaxBytes {
			c.mu.Unlock()
			c.flushHeld() // another kind: what is held goes first
			c.mu.Lock()
		}
	}
	r := &Request{c: c, name: k.name, async: true, done: make(chan struct{})}
	c.ops.Add(1) // finished with the fused operation
	c.held = append(c.held, fused{ctx: ctx, k: *k, r: r, size: size})
	c.heldBytes += size
	c.mu.Unlock()
	return r, true, nil
}

// flushHeld issues what a group holds: one call alone as it is, several
// as one all-reduce of their concatenation, whose results are copied back
// before their Requests finish.
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
	off := 0
	for _, h := range held {
		copy(pack[off:], h.k.op.In.Bytes())
		off += h.size
	}
	k := held[0].k
	k.op.In, k.op.Out = memory.HostBuffer(pack), memory.HostBuffer(pack)
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
