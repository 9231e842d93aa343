package collective

import (
	"context"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/memory"
)

// The collectives. Each blocks until this rank's part is done: its output
// is complete and its input may be reused. Each has a Start form that
// returns a *Request at once and runs the operation in the background, in
// issue order with the blocking ones.
//
// Buffer rules follow NCCL. Out-of-place buffers must not overlap; the
// in-place forms are: send and recv the same slice (AllReduce, Broadcast,
// Reduce); send == recv[rank*k:(rank+1)*k] (AllGather); recv ==
// send[rank*k:(rank+1)*k] (ReduceScatter).
//
// Errors: bad arguments return an *ArgError (errors.Is ErrInvalidArgument)
// before anything happens, and the communicator stays usable. Any later
// failure returns an *OpError naming the rank, the operation, its sequence
// number and the peer involved, and aborts the communicator.

// AllReduce reduces send across all ranks with op and leaves the result in
// recv on every rank. len(send) == len(recv).
func AllReduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := allReduceArgs(c, &a, op, &k); err != nil {
		return err
	}
	return c.run(ctx, &k)
}

// StartAllReduce is the asynchronous form of AllReduce.
func StartAllReduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) (*Request, error) {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := allReduceArgs(c, &a, op, &k); err != nil {
		return nil, err
	}
	return c.start(ctx, k)
}

// ReduceScatter reduces send across all ranks with op and leaves block
// Rank() of the result in recv: len(send) == Size()*len(recv), and rank r
// gets elements [r*len(recv), (r+1)*len(recv)) of the reduction.
func ReduceScatter[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := reduceScatterArgs(c, &a, op, &k); err != nil {
		return err
	}
	return c.run(ctx, &k)
}

// StartReduceScatter is the asynchronous form of ReduceScatter.
func StartReduceScatter[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) (*Request, error) {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := reduceScatterArgs(c, &a, op, &k); err != nil {
		return nil, err
	}
	return c.start(ctx, k)
}

// AllGather gathers every rank's send into recv, rank r's at
// recv[r*len(send):(r+1)*len(send)]: len(recv) == Size()*len(send).
func AllGather[T Number](ctx context.Context, c *Comm, send, recv []T) error {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := allGatherArgs(c, &a, &k); err != nil {
		return err
	}
	return c.run(ctx, &k)
}

// StartAllGather is the asynchronous form of AllGather.
func StartAllGather[T Number](ctx context.Context, c *Comm, send, recv []T) (*Request, error) {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := allGatherArgs(c, &a, &k); err != nil {
		return nil, err
	}
	return c.start(ctx, k)
}

// Broadcast copies root's send into recv on every rank (root included).
// send is read on root only (and may be nil elsewhere); on root
// len(send) == len(recv).
func Broadcast[T Number](ctx context.Context, c *Comm, send, recv []T, root int) error {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := broadcastArgs(c, &a, root, &k); err != nil {
		return err
	}
	return c.run(ctx, &k)
}

// StartBroadcast is the asynchronous form of Broadcast.
func StartBroadcast[T Number](ctx context.Context, c *Comm, send, recv []T, root int) (*Request, error) {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := broadcastArgs(c, &a, root, &k); err != nil {
		return nil, err
	}
	return c.start(ctx, k)
}

// Reduce reduces send across all ranks with op into recv on root. recv is
// written on root only (and may be nil elsewhere); on root
// len(recv) == len(send).
func Reduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op, root int) error {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := reduceArgs(c, &a, op, root, &k); err != nil {
		return err
	}
	return c.run(ctx, &k)
}

// StartReduce is the asynchronous form of Reduce.
func StartReduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op, root int) (*Request, error) {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := reduceArgs(c, &a, op, root, &k); err != nil {
		return nil, err
	}
	return c.start(ctx, k)
}

// AllToAll sends block j of send to rank j, which stores it as block
// Rank() of its recv: len(send) == len(recv) == Size()*block. The buffers
// must not overlap.
func AllToAll[T Number](ctx context.Context, c *Comm, send, recv []T) error {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := allToAllArgs(c, &a, &k); err != nil {
		return err
	}
	return c.run(ctx, &k)
}

// StartAllToAll is the asynchronous form of AllToAll.
func StartAllToAll[T Number](ctx context.Context, c *Comm, send, recv []T) (*Request, error) {
	var k call
	var a args
	hostArgs(&a, send, recv)
	if err := allToAllArgs(c, &a, &k); err != nil {
		return nil, err
	}
	return c.start(ctx, k)
}

// Send sends buf to peer, which must call Recv with a buffer of the same
// length and type. Sends and receives between a pair of ranks match in the
// order they were issued. On host memory each peer and direction is a lane
// of its own (as MPI's Isend and Irecv): a send waits only for the sends
// to the same peer issued before it, never for a receive, a send to
// another peer or a collective, and any set of matched StartSend and
// StartRecv calls completes whatever order each rank starts them in.
// Collectives keep their issue order among themselves. A Send completes
// without its Recv only while what is in flight to that peer fits in the
// connection: one message of at most half its slots' bytes (4 × 128 KiB by
// default), and at most Config.Slots messages in all. On host memory a
// send of no elements is a message too: its Recv must have no elements
// either. On device memory (SendDevice, RecvDevice) sends and receives
// keep issue order, as on a CUDA stream, and a zero count is a no-op.
func Send[T Number](ctx context.Context, c *Comm, buf []T, peer int) error {
	return runP2P(ctx, c, "send", algorithms.CollSend, buf, peer)
}

// StartSend is the asynchronous form of Send.
func StartSend[T Number](ctx context.Context, c *Comm, buf []T, peer int) (*Request, error) {
	return startP2P(ctx, c, "send", algorithms.CollSend, buf, peer)
}

// Recv receives into buf what peer sends with Send.
func Recv[T Number](ctx context.Context, c *Comm, buf []T, peer int) error {
	return runP2P(ctx, c, "recv", algorithms.CollRecv, buf, peer)
}

// StartRecv is the asynchronous form of Recv.
func StartRecv[T Number](ctx context.Context, c *Comm, buf []T, peer int) (*Request, error) {
	return startP2P(ctx, c, "recv", algorithms.CollRecv, buf, peer)
}

// runP2P and startP2P issue a send or receive under name (what the caller
// called: send, recv, or a collective built of them, in errors and the
// flight recorder).
func runP2P[T Number](ctx context.Context, c *Comm, name string, coll algorithms.Collective, buf []T, peer int) error {
	var k call
	if err := p2pCall(c, name, coll, buf, peer, &k); err != nil {
		return err
	}
	return c.run(ctx, &k)
}

func startP2P[T Number](ctx context.Context, c *Comm, name string, coll algorithms.Collective, buf []T, peer int) (*Request, error) {
	var k call
	if err := p2pCall(c, name, coll, buf, peer, &k); err != nil {
		return nil, err
	}
	return c.start(ctx, k)
}

// Argument checks. Each returns the call for issue, or an *ArgError.

func checkComm(c *Comm, name string) error {
	if c == nil {
		return &ArgError{Rank: -1, Op: name, Err: ErrNilComm}
	}
	return nil
}

func (c *Comm) checkRoot(name string, root int) error {
	if root < 0 || root >= c.size {
		return c.argError(name, "root %d out of range [0,%d)", root, c.size)
	}
	return nil
}

// Every check works on buffers and element counts, so that host slices
// (the generic functions above) and device buffers (device.go) share it.

// args is a call's buffers as the checks see them, with their lengths in
// elements.
type args struct {
	t          DataType
	send, recv memory.Buffer
	ns, nr     int
}

// hostArgs describes host slices in a (in place: returned, the args were
// copied from a temporary, which stalls on store forwarding).
func hostArgs[T Number](a *args, send, recv []T) {
	a.t, a.ns, a.nr = TypeOf[T](), len(send), len(recv)
	a.send, a.recv = memory.HostBuffer(asBytes(send)), memory.HostBuffer(asBytes(recv))
}

// bufferArgs describes buffers of elements of t (whole elements: the
// caller has checked).
func bufferArgs(t DataType, send, recv memory.Buffer) args {
	return args{t: t, send: send, recv: recv, ns: send.Len() / t.Size(), nr: recv.Len() / t.Size()}
}

// lens returns the buffers' lengths in elements.
func (a *args) lens() (int, int) { return a.ns, a.nr }

// newCall fills k (in place: a call is large, and this runs for every
// operation).
func newCall(k *call, name string, coll algorithms.Collective, count int, a *args) {
	// Field by field into the zeroed op, not a literal: the literal is
	// built in a temporary and copied, which stalls on store forwarding.
	k.name = name
	k.op = engine.Op{}
	k.op.Coll, k.op.Type, k.op.Count = coll, a.t.kernel(), count
	k.op.In, k.op.Out = a.send, a.recv
}

func allReduceArgs(c *Comm, a *args, op Op, k *call) error {
	const name = "allreduce"
	if err := checkComm(c, name); err != nil {
		return err
	}
	ns, nr := a.lens()
	if ns != nr {
		return c.argError(name, "len(send) = %d but len(recv) = %d; they must be equal", ns, nr)
	}
	newCall(k, name, algorithms.CollAllReduce, ns, a)
	if k.op.In.Overlaps(k.op.Out) && !k.op.In.Same(k.op.Out) {
		return c.argError(name, "send and recv overlap without being the same slice")
	}
	return c.setRed(name, op, k)
}

func reduceScatterArgs(c *Comm, a *args, op Op, k *call) error {
	const name = "reducescatter"
	if err := checkComm(c, name); err != nil {
		return err
	}
	ns, nr := a.lens()
	if ns != c.size*nr {
		return c.argError(name, "len(send) = %d, want Size()*len(recv) = %d*%d = %d", ns, c.size, nr, c.size*nr)
	}
	newCall(k, name, algorithms.CollReduceScatter, nr, a)
	if k.op.In.Overlaps(k.op.Out) {
		if off, ok := k.op.In.Offset(k.op.Out); !ok || off != c.rank*k.op.Out.Len() {
			return c.argError(name, "recv overlaps send but is not send[rank*len(recv):(rank+1)*len(recv)]")
		}
	}
	return c.setRed(name, op, k)
}

func allGatherArgs(c *Comm, a *args, k *call) error {
	const name = "allgather"
	if err := checkComm(c, name); err != nil {
		return err
	}
	ns, nr := a.lens()
	if nr != c.size*ns {
		return c.argError(name, "len(recv) = %d, want Size()*len(send) = %d*%d = %d", nr, c.size, ns, c.size*ns)
	}
	newCall(k, name, algorithms.CollAllGather, ns, a)
	if k.op.In.Overlaps(k.op.Out) {
		if off, ok := k.op.Out.Offset(k.op.In); !ok || off != c.rank*k.op.In.Len() {
			return c.argError(name, "send overlaps recv but is not recv[rank*len(send):(rank+1)*len(send)]")
		}
	}
	return nil
}

func broadcastArgs(c *Comm, a *args, root int, k *call) error {
	const name = "broadcast"
	if err := checkComm(c, name); err != nil {
		return err
	}
	if err := c.checkRoot(name, root); err != nil {
		return err
	}
	if c.rank != root {
		a.send, a.ns = memory.Buffer{}, 0 // not read
	} else if ns, nr := a.lens(); ns != nr {
		return c.argError(name, "on the root len(send) = %d but len(recv) = %d; they must be equal", ns, nr)
	}
	_, nr := a.lens()
	newCall(k, name, algorithms.CollBroadcast, nr, a)
	if k.op.In.Overlaps(k.op.Out) && !k.op.In.Same(k.op.Out) {
		return c.argError(name, "send and recv overlap without being the same slice")
	}
	k.op.Root = root
	return nil
}

func reduceArgs(c *Comm, a *args, op Op, root int, k *call) error {
	const name = "reduce"
	if err := checkComm(c, name); err != nil {
		return err
	}
	if err := c.checkRoot(name, root); err != nil {
		return err
	}
	if c.rank != root {
		a.recv, a.nr = memory.Buffer{}, 0 // not written
	} else if ns, nr := a.lens(); ns != nr {
		return c.argError(name, "on the root len(send) = %d but len(recv) = %d; they must be equal", ns, nr)
	}
	ns, _ := a.lens()
	newCall(k, name, algorithms.CollReduce, ns, a)
	if k.op.In.Overlaps(k.op.Out) && !k.op.In.Same(k.op.Out) {
		return c.argError(name, "send and recv overlap without being the same slice")
	}
	k.op.Root = root
	return c.setRed(name, op, k)
}

func allToAllArgs(c *Comm, a *args, k *call) error {
	const name = "alltoall"
	if err := checkComm(c, name); err != nil {
		return err
	}
	ns, nr := a.lens()
	if ns != nr || ns%c.size != 0 {
		return c.argError(name, "len(send) = %d and len(recv) = %d; both must equal Size()*block = %d*block", ns, nr, c.size)
	}
	newCall(k, name, algorithms.CollAllToAll, ns/c.size, a)
	if k.op.In.Overlaps(k.op.Out) {
		return c.argError(name, "send and recv overlap; all-to-all has no in-place form")
	}
	return nil
}

func p2pCall[T Number](c *Comm, name string, coll algorithms.Collective, buf []T, peer int, k *call) error {
	var a args
	if coll == algorithms.CollRecv {
		hostArgs(&a, nil, buf)
	} else {
		hostArgs(&a, buf, nil)
	}
	return p2pArgs(c, name, coll, &a, peer, k)
}

// p2pArgs checks a send (buffer in a.send) or a receive (in a.recv).
func p2pArgs(c *Comm, name string, coll algorithms.Collective, a *args, peer int, k *call) error {
	if err := checkComm(c, name); err != nil {
		return err
	}
	switch {
	case peer == c.rank:
		return c.argError(name, "peer %d is this rank itself", peer)
	case peer < 0 || peer >= c.size:
		return c.argError(name, "peer %d out of range [0,%d)", peer, c.size)
	}
	ns, nr := a.lens()
	newCall(k, name, coll, max(ns, nr), a)
	k.op.Root = peer
	return nil
}
