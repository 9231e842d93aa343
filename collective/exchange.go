package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/memory"
)

// Collectives made of point-to-point operations: uneven all-to-all,
// gather and scatter (MPI_Alltoallv, MPI_Gather, MPI_Scatter; NCCL builds
// them from ncclSend and ncclRecv in a group, as here). Each rank starts
// every send and receive it has, in its lanes (lanes.go), then waits for
// all: the lanes let them progress in any order.

// Group issues the Start* calls that fn makes on c together, as NCCL's
// ncclGroupStart and ncclGroupEnd do, and returns once all are issued
// (with fn's error); each Request is waited as usual.
//
// goccl starts every operation when it is issued and runs each host send
// and receive in a lane of its own peer and direction (see Send), so the
// sends and receives of a group already progress together, in any order:
// an all-to-all or a pipeline-parallel exchange written as StartSend and
// StartRecv calls completes however each rank orders them. Small
// StartAllReduce calls on host memory (up to 1 MiB together) with the
// same type and operator are held back and run as one all-reduce of their
// concatenation when the group ends, or when another kind of operation is
// issued (which keeps the order of everything else): one round of latency
// for all of them. Small StartBroadcast calls from one root are fused the
// same way, whatever their types (as DDP broadcasts a model's initial
// parameters, coalesced). While fn runs, this holds for Start calls on c from any
// goroutine. Device sends and receives keep their stream order inside a
// group too. Group may be nested; fn must not wait for the operations it
// starts (an all-reduce held back would never finish).
func Group(ctx context.Context, c *Comm, fn func() error) error {
	if c == nil {
		return &ArgError{Rank: -1, Op: "group", Err: ErrNilComm}
	}
	if ctx == nil {
		return c.argError("group", "nil context")
	}
	if fn == nil {
		return c.argError("group", "nil function")
	}
	if cause := c.endCause(); cause != nil {
		return &OpError{Rank: c.rank, Op: "group", Peer: -1, Err: cause}
	}
	c.mu.Lock()
	c.grouping++
	c.mu.Unlock()
	defer func() { // even if fn panics: nothing stays held
		c.mu.Lock()
		c.grouping--
		outer := c.grouping == 0
		c.mu.Unlock()
		if outer {
			c.flushHeld() // the small collectives held back, fused
		}
	}()
	return fn()
}

// AllToAllv sends block j of send (sendCounts[j] elements; the blocks
// contiguous in rank order) to rank j, and receives block i of recv
// (recvCounts[i] elements, contiguous likewise) from rank i: MPI_Alltoallv
// without displacements. Every rank calls it. The ranks first exchange
// their counts (one small all-gather), so counts that disagree between
// the two ends of a block are an error on every rank, naming them, and no
// data moves; the communicator stays usable. A block of zero elements
// sends nothing.
func AllToAllv[T Number](ctx context.Context, c *Comm, send []T, sendCounts []int, recv []T, recvCounts []int) error {
	const name = "alltoallv"
	if err := checkComm(c, name); err != nil {
		return err
	}
	if ctx == nil {
		return c.argError(name, "nil context")
	}
	n := c.size
	if len(sendCounts) != n || len(recvCounts) != n {
		return c.argError(name, "%d send counts and %d receive counts for %d ranks", len(sendCounts), len(recvCounts), n)
	}
	sendOff, err := offsets(c, name, "send", sendCounts, len(send))
	if err != nil {
		return err
	}
	recvOff, err := offsets(c, name, "receive", recvCounts, len(recv))
	if err != nil {
		return err
	}
	if overlap(asBytes(send[:sendOff[n]]), asBytes(recv[:recvOff[n]])) {
		return c.argError(name, "send and recv overlap; all-to-all has no in-place form")
	}
	// Every rank's counts, so that every rank reaches the same verdict.
	mine := make([]int64, 2*n)
	for j := range n {
		mine[j], mine[n+j] = int64(sendCounts[j]), int64(recvCounts[j])
	}
	all := make([]int64, 2*n*n)
	if err := AllGather(ctx, c, mine, all); err != nil {
		return err
	}
	if err := countsAgree(all, n); err != nil {
		return &OpError{Rank: c.rank, Op: name, Peer: -1, Err: err}
	}
	// One all-to-all of uneven blocks, planned for the largest block of
	// the whole exchange (the same on every rank): the pairwise schedule
	// of AllToAll, each block cut by its own length (algorithms.Layout).
	// Written first as n-1 rounds of a receive and a send, it measured
	// 1.11-1.45 times the padded AllToAll over shared memory at 1 MiB: a
	// Request, a lane's turn and one channel per round (docs/performance.md).
	most := 0
	for _, v := range all {
		most = max(most, int(v))
	}
	if most == 0 {
		return nil
	}
	var k call
	var a args
	hostArgs(&a, send[:sendOff[n]], recv[:recvOff[n]])
	newCall(&k, name, algorithms.CollAllToAll, most, &a)
	k.op.InOffs, k.op.OutOffs = sendOff, recvOff
	return c.run(ctx, &k)
}

// Gather collects every rank's send into recv on root, rank i's at
// [i*len(send), (i+1)*len(send)): len(recv) == Size()*len(send) on root,
// and recv may be nil elsewhere. Every rank calls it with sends of one
// length.
func Gather[T Number](ctx context.Context, c *Comm, send, recv []T, root int) error {
	const name = "gather"
	if err := rootedArgs(c, ctx, name, root); err != nil {
		return err
	}
	if c.rank != root {
		return runP2P(ctx, c, name, algorithms.CollSend, send, root)
	}
	n, m := c.size, len(send)
	if len(recv) != n*m {
		return c.argError(name, "recv has %d elements on the root; want Size()×len(send) = %d×%d", len(recv), n, m)
	}
	if overlap(asBytes(send), asBytes(recv)) && &send[0] != &recv[root*m] {
		return c.argError(name, "send overlaps recv other than at this rank's block")
	}
	copy(recv[root*m:(root+1)*m], send)
	reqs, err := startBlocks(ctx, c, name, algorithms.CollRecv, recv, m, root)
	if err != nil {
		return err
	}
	return waitAll(ctx, reqs)
}

// Scatter sends block i of send on root, [i*len(recv), (i+1)*len(recv)),
// to rank i's recv: len(send) == Size()*len(recv) on root, and send may be
// nil elsewhere. Every rank calls it with receives of one length.
func Scatter[T Number](ctx context.Context, c *Comm, send, recv []T, root int) error {
	const name = "scatter"
	if err := rootedArgs(c, ctx, name, root); err != nil {
		return err
	}
	if c.rank != root {
		return runP2P(ctx, c, name, algorithms.CollRecv, recv, root)
	}
	n, m := c.size, len(recv)
	if len(send) != n*m {
		return c.argError(name, "send has %d elements on the root; want Size()×len(recv) = %d×%d", len(send), n, m)
	}
	if overlap(asBytes(send), asBytes(recv)) && &recv[0] != &send[root*m] {
		return c.argError(name, "recv overlaps send other than at this rank's block")
	}
	reqs, err := startBlocks(ctx, c, name, algorithms.CollSend, send, m, root)
	if err != nil {
		return err
	}
	copy(recv, send[root*m:(root+1)*m])
	return waitAll(ctx, reqs)
}

// startBlocks starts the root's side of Gather (coll CollRecv) and
// Scatter (CollSend): one message with every other rank, on its block of
// m elements of blocks, in rank order from the root's. When one fails to
// start, it waits for those started and returns both errors.
func startBlocks[T Number](ctx context.Context, c *Comm, name string, coll algorithms.Collective, blocks []T, m, root int) ([]*Request, error) {
	var reqs []*Request
	for k := 1; k < c.size; k++ {
		peer := (root + k) % c.size
		r, err := startP2P(ctx, c, name, coll, blocks[peer*m:(peer+1)*m], peer)
		if err != nil {
			return nil, errors.Join(err, waitAll(ctx, reqs))
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}

func rootedArgs(c *Comm, ctx context.Context, name string, root int) error {
	if err := checkComm(c, name); err != nil {
		return err
	}
	if ctx == nil {
		return c.argError(name, "nil context")
	}
	if root < 0 || root >= c.size {
		return c.argError(name, "root %d out of range [0,%d)", root, c.size)
	}
	return nil
}

// offsets returns the prefix sums of counts, checked against a buffer
// of n elements.
func offsets(c *Comm, name, what string, counts []int, n int) ([]int, error) {
	off := make([]int, len(counts)+1)
	for j, k := range counts {
		if k < 0 {
			return nil, c.argError(name, "%s count for rank %d is %d", what, j, k)
		}
		if k > n-off[j] { // checked before adding: a huge count must not wrap around
			return nil, c.argError(name, "%s counts add up to more than the buffer's %d elements (at rank %d's, %d)", what, n, j, k)
		}
		off[j+1] = off[j] + k
	}
	return off, nil
}

// countsAgree checks the all-gathered counts (rank i's at [2ni, 2n(i+1)):
// its send counts, then its receive counts): what i sends to j must be
// what j expects from i.
func countsAgree(all []int64, n int) error {
	var bad []string
	for i := range n {
		for j := range n {
			s, r := all[2*n*i+j], all[2*n*j+n+i]
			if s != r {
				bad = append(bad, fmt.Sprintf("rank %d sends %d elements to rank %d, which expects %d", i, s, j, r))
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	more := ""
	if len(bad) > 3 {
		more = fmt.Sprintf(" (and %d more)", len(bad)-3)
		bad = bad[:3]
	}
	return fmt.Errorf("%w: the ranks' counts disagree: %s%s", ErrMismatch, strings.Join(bad, "; "), more)
}

// waitAll waits for every request and returns the first error.
func waitAll(ctx context.Context, reqs []*Request) error {
	var first error
	for _, r := range reqs {
		if err := r.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// overlap reports whether two host byte slices share memory.
func overlap(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && memory.HostBuffer(a).Overlaps(memory.HostBuffer(b))
}
