package collective

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/bootstrap"
	"github.com/goccl/goccl/internal/clock"
	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/mem"
)

// Comm is one rank's handle on a communicator: a fixed group of ranks that
// run collectives together. Its methods and the collectives are safe for
// concurrent use, but collectives run one at a time, in the order they
// were issued; host sends and receives run in a lane per peer and
// direction, beside them (see the package documentation for what that
// asks of callers).
type Comm struct {
	rank, size int
	cfg        Config
	eng        *engine.Engine
	ep         transport.Endpoint
	peers      []wire.PeerInfo // from the bootstrap; nil in a local group
	transport  string          // "mem" in a local group
	routes     []string        // by rank, between processes: "self", "shm", "tcp" or "verbs"
	ibPort     string          // the RDMA port, when some peer is reached over verbs
	nics       []string        // the interfaces TCP connections use, when some peer is reached over TCP
	// ibDevicePath says how device operations cross RDMA, and why.
	ibDevicePath string
	dev          *devState // nil without a device (WithDevice)
	devNames     []string  // by rank, where known (RankInfo.Device)
	// closed, in a local group, is called once this rank has closed: the
	// group gives its network's device memory back after the last one.
	onClose func()

	// ctx is cancelled, with the cause, when the communicator is aborted or
	// closed; it is the parent of every operation's context.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// ended is set once ctx has been cancelled: every operation looks at
	// it, without the context's lock.
	ended atomic.Bool

	mu     opMutex // guards closed, tail, lanes, seq, cseq, flight, pending, op (oplock.go)
	closed bool
	tail   *Request // the last operation issued (but host point-to-point)
	// lanes: the last host send to, and receive from, each peer issued
	// and not yet finished (lanes.go).
	lanes  map[laneKey]*Request
	seq    uint64
	cseq   uint64              // collectives issued (the engine's sequence numbers)
	flight [flightOps]*Request // the flight recorder: the last operations, by seq
	dumped sync.Once           // the dump on a failure is written once
	// released: Close gives back the engine's and the device's resources
	// once.
	released sync.Once
	opLog    *slog.Logger // TRACE per operation, nil when off

	// The bootstrap watch (watch.go); nil in a local group.
	rootWatch *bootstrap.Watch
	// watchReady, when set, is closed once rootWatch has come (or will
	// not): a split child's watch comes after the child (watchLater).
	watchReady   chan struct{}
	abandonWatch func()
	watchExit    chan struct{}
	shrunk       chan *wire.Table // a shrink's new table, from the watcher
	id           UniqueID         // the job (its secret), for Shrink
	lookup       func(string) (string, bool)
	facts        *hostFacts     // what Init learnt of this host, for Split and Shrink
	told         sync.Once      // the root is told of this rank's abort once (see silence)
	toldRoot     atomic.Bool    // it has been, or need not be (tellOnce)
	leaving      atomic.Bool    // Close gave up waiting for a watch still being joined
	splits       uint64         // Splits so far (guarded by mu): every rank counts them alike
	premul       map[Op]float64 // PreMulSum operators (guarded by mu), by Op
	// In a Group (guarded by mu): its nesting, and the all-reduces held
	// back to be fused (fuse.go).
	grouping   int
	held       []fused
	heldBytes  int
	premulNext int
	family     *localFamily // a local group's meeting place for Split; nil between processes
	// local is a local group's stand-in for the root's diagnosis (nil
	// between processes); set after the watchdog starts, so atomic.
	local atomic.Pointer[localWatch]
	wg    sync.WaitGroup // goroutines of asynchronous operations
	// Operations issued and not finished, and the channel Close waits on
	// until there are none (made by Close, closed by the last finish):
	// counted under mu, which issue and finish hold anyway, where a
	// WaitGroup was two more atomic adds an operation.
	pending int           // guarded by mu
	idle    chan struct{} // guarded by mu

	// The watchdog enforces Config.Timeout without a timer per operation:
	// op is the collective whose turn it is, running or about to (set
	// under mu by issue when nothing runs ahead of it, else by exec once
	// its predecessor has finished, and cleared by finish, where an
	// atomic store each side of the engine's run was a tenth of an 8-byte
	// operation, docs/performance.md), and one goroutine per communicator,
	// started by newComm and stopped by Close, aborts the communicator
	// when that operation has run too long.
	op        *Request                     // guarded by mu; nil between operations
	timedOut  atomic.Pointer[timeoutError] // this rank's timeout, while the root diagnoses it
	asked     atomic.Int64                 // when (since bornNano) this rank last told the root where it waits; 0: never
	bornNano  int64                        // clock.Now at creation: the base of Request.start
	stopWatch chan struct{}                // closed by Close
	watchDone chan struct{}                // closed when the watchdog has returned
}

// Rank returns this rank's index, 0..Size()-1.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.size }

// Config returns the communicator's settings after defaults and the
// environment were applied.
func (c *Comm) Config() Config { return c.cfg }

// Choice is how a communicator runs an operation: the algorithm the tuner
// picks (or the one forced), "board" for a small all-reduce on the host's
// shared board, and the number of channels.
type Choice struct {
	Algorithm string
	Channels  int
}

func (ch Choice) String() string { return fmt.Sprintf("%s/%dch", ch.Algorithm, ch.Channels) }

// Choose says how coll on count elements of dt would run on host memory,
// without running it: count as the collective functions take it (the
// per-rank block of reduce-scatter, all-gather and all-to-all). Every rank
// gets the same answer to the same question, as the plans must agree. It
// is what goccl-perf prints under its table and what the INFO summary
// shows for all-reduce, so that the tuner's crossovers can be seen.
func (c *Comm) Choose(coll algorithms.Collective, dt DataType, count int) (Choice, error) {
	switch {
	case !coll.Valid() || coll == algorithms.CollRecv:
		return Choice{}, fmt.Errorf("%w: Choose: collective %v", ErrInvalidArgument, coll)
	case !dt.Valid():
		return Choice{}, fmt.Errorf("%w: Choose: data type %v", ErrInvalidArgument, dt)
	case count < 0:
		return Choice{}, fmt.Errorf("%w: Choose: count %d", ErrInvalidArgument, count)
	}
	root := 0
	if coll == algorithms.CollSend {
		root = (c.rank + 1) % c.size
	}
	pl, err := c.eng.Plan(&engine.Op{Coll: coll, Type: dt.kernel(), Red: kernels.Sum, Count: count, Root: root})
	if err != nil {
		return Choice{}, err
	}
	return Choice{Algorithm: pl.AlgoName(), Channels: pl.Channels}, nil
}

// RankInfo describes one rank of a communicator.
type RankInfo struct {
	Rank      int
	PID       int
	Host      string // host identity (hostname/boot id, or GOCCL_HOSTID)
	Addr      string // data address (an RDMA peer's control listener), "" in a local group
	Transport string // how this rank reaches it: "self", "mem", "shm", "tcp", "verbs"
	// Device describes the rank's GPU ("cuda:0 NVIDIA H200 [0000:19:00.0]"),
	// where this rank knows it: its own, and every rank's in a local
	// group; "" for none or unknown.
	Device string
	// NIC is the RDMA port this rank uses ("mlx5_0:1 RoCE 200 Gbit/s GID
	// 3 (::ffff:10.0.0.7)"), for this rank itself when it uses the verbs
	// transport; "" otherwise.
	NIC string
}

// Ranks describes every rank of the communicator, as this rank sees it.
func (c *Comm) Ranks() []RankInfo {
	out := make([]RankInfo, c.size)
	for r := range out {
		ri := RankInfo{Rank: r, Transport: c.transport}
		if c.routes != nil {
			ri.Transport = c.routes[r]
		}
		if r == c.rank {
			ri.Transport = "self"
		}
		if r < len(c.devNames) {
			ri.Device = c.devNames[r]
		}
		if r == c.rank && c.dev != nil {
			ri.Device = describeDevice(c.dev.dev)
		}
		if r == c.rank {
			ri.NIC = c.ibPort
		}
		if c.peers != nil {
			p := c.peers[r]
			ri.PID, ri.Host, ri.Addr = int(p.PID), p.HostID, p.DataAddr
			if ri.Transport == TransportVerbs {
				s, _ := decodeHostSummary(p.Topology)
				ri.Addr = s.Verbs // its RDMA connections' control listener
			}
		} else {
			ri.PID = os.Getpid()
			ri.Host, _ = os.Hostname()
		}
		out[r] = ri
	}
	return out
}

// Context returns a context that is cancelled when the communicator is
// aborted (context.Cause wraps ErrAborted and the abort's cause) or closed
// (ErrClosed).
func (c *Comm) Context() context.Context { return c.ctx }

// memLink is the link model of the in-process transport: a hop costs a
// goroutine hand-off; bandwidth is a memory copy on this class of machine
// (docs/performance.md has the measurements it comes from).
var memLink = algorithms.LinkModel{
	Latency:      2e-6,
	Bandwidth:    6e9,
	ReduceRate:   6e9,
	MaxChannels:  DefaultMaxChannels,
	ChannelBytes: 4 << 20,
	ChunkBytes:   512 << 10,
}

// NewLocalGroup returns n communicators whose ranks live in this process
// and talk through shared memory (like ncclCommInitAll). Each Comm is used
// by its own goroutine, as each rank is by its own process elsewhere.
// Options apply to all of them; the GOCCL_* environment is read once.
func NewLocalGroup(n int, opts ...Option) ([]*Comm, error) {
	comms, _, err := newLocalGroup(n, opts)
	return comms, err
}

// newLocalGroup also returns the network, for fault injection in tests.
func newLocalGroup(n int, opts []Option) ([]*Comm, *mem.Network, error) {
	if n < 1 {
		return nil, nil, fmt.Errorf("%w: NewLocalGroup(%d): need at least 1 rank", ErrInvalidArgument, n)
	}
	cfg, _, err := resolve(opts)
	if err != nil {
		return nil, nil, err
	}
	return newLocalGroupCfg(n, cfg)
}

// newLocalGroupCfg makes a local group with settings already resolved.
func newLocalGroupCfg(n int, cfg Config) ([]*Comm, *mem.Network, error) {
	devs := cfg.devices
	if len(devs) > 1 && len(devs) != n {
		return nil, nil, fmt.Errorf("%w: NewLocalGroup(%d): %d devices; give one for every rank or one per rank", ErrInvalidArgument, n, len(devs))
	}
	devOf := func(r int) Device {
		if len(devs) == 0 {
			return nil
		}
		return devs[r%len(devs)]
	}
	mo := mem.Options{Slots: cfg.Slots, SlotSize: cfg.SlotSize, NoStreamSlots: cfg.SlotStreamDisable}
	if len(devs) > 0 {
		// The connections of device operations keep their slots on the
		// receiver's GPU, as NCCL's P2P transport does.
		mo.DeviceAlloc = func(r, n int) (memory.Buffer, error) { return devOf(r).Alloc(n) }
		mo.DeviceFree = func(r int, b memory.Buffer) error { return devOf(r).Free(b) }
		mo.DeviceMemory = memory.Device
	}
	nw, err := mem.NewNetwork(n, mo)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	// The network's device memory goes back once every rank has closed.
	var open atomic.Int32
	open.Store(int32(n))
	closed := func() {
		if open.Add(-1) == 0 {
			nw.Close()
		}
	}
	link := memLink
	link.MaxChannels = cfg.MaxChannels
	cfg.deviceLink, cfg.deviceLinkWhy = deviceLinkFor(cfg.topology, devOf, n, cfg.MaxChannels)
	fam := &localFamily{pending: map[[2]uint64]*localSplit{}}
	comms := make([]*Comm, n)
	lw := &localWatch{comms: make([]atomic.Pointer[Comm], n)}
	for r := range comms {
		c, err := newComm(r, n, cfg, nw.Endpoint(r), link, devOf(r), nil, algorithms.LinkModel{})
		if err != nil {
			for _, c := range comms[:r] {
				c.Close()
			}
			for range n - r {
				closed()
			}
			return nil, nil, err
		}
		c.transport = "mem"
		c.onClose = closed
		c.family = fam
		c.local.Store(lw)
		lw.comms[r].Store(c)
		if len(devs) > 0 {
			c.devNames = make([]string, n)
			for q := range n {
				c.devNames[q] = describeDevice(devOf(q))
			}
		}
		comms[r] = c
		c.logReady()
	}
	return comms, nw, nil
}

// newComm makes rank's communicator over ep; dev is its GPU, or nil;
// hosts labels each rank's host (nil: all on one), and intra models the
// links inside a host (zero: link).
func newComm(rank, size int, cfg Config, ep transport.Endpoint, link algorithms.LinkModel, dev Device, hosts []int, intra algorithms.LinkModel) (*Comm, error) {
	eng, err := engine.New(rank, size, ep, engine.Config{
		Algo: cfg.Algorithm, Channels: cfg.Channels, ChunkBytes: cfg.ChunkSize,
		MaxChannels: cfg.MaxChannels, Link: link, Device: dev, Hosts: hosts, IntraLink: intra,
		DeviceLink: cfg.deviceLink, Oversubscribed: cfg.oversubscribed,
	})
	if err != nil {
		return nil, err
	}
	var ds *devState
	if dev != nil {
		if ds, err = newDevState(dev); err != nil {
			return nil, err
		}
	}
	caps := ep.Caps()
	cfg.Slots, cfg.SlotSize = caps.Slots, caps.SlotSize // report what is in effect
	c := &Comm{rank: rank, size: size, cfg: cfg, eng: eng, ep: ep, dev: ds, bornNano: clock.Now(),
		stopWatch: make(chan struct{}), watchDone: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	go c.watch()
	registerDump(c)
	if l := c.logger(SubsysColl); l.Enabled(context.Background(), LevelTrace) {
		c.opLog = l
	}
	return c, nil
}

// watch is the watchdog: it aborts the communicator when the operation
// in flight is still running at its deadline, and it has the ranks
// compare where they wait (a probe, through the bootstrap root or, in a
// local group, directly) once the operation has waited probeFirst, and
// again each time the wait doubles: a fault no wait cures (ranks that
// placed the operation's buffers differently) then ends it long before
// the timeout. It wakes at least every probeFirst.
func (c *Comm) watch() {
	defer close(c.watchDone)
	t := time.NewTimer(min(probeFirst, c.cfg.Timeout))
	defer t.Stop()
	type opKey struct {
		seq   uint64
		start int64
	}
	var probed opKey
	probeAt := probeFirst
	for {
		select {
		case <-c.stopWatch:
			return
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		c.seeFinish(c.since())
		op := c.op
		var name string
		var seq uint64
		var bytes int64
		var left time.Duration
		var dev bool
		var key opKey
		if op != nil {
			// Copied under the lock: a blocking operation's Request is
			// reused by a later one.
			name, seq, bytes, dev = op.name, op.cseq, op.op.Bytes(c.size), op.devV != 0
			left = time.Duration(op.start-c.since()) + c.cfg.Timeout
			key = opKey{op.cseq, op.start}
		}
		c.mu.Unlock()
		if op == nil {
			t.Reset(min(probeFirst, c.cfg.Timeout))
			continue
		}
		if left > 0 {
			if key != probed {
				probed, probeAt = key, probeFirst
			}
			waited := c.cfg.Timeout - left
			if waited >= probeAt {
				st := wire.Stall{Seq: seq, Timeout: int64(c.cfg.Timeout), Op: name}
				if w := c.rootConn(); w != nil {
					w.ProbeStall(st)
				} else if l := c.local.Load(); l != nil && l.probe(c.rank, st) {
					return // the group was aborted: ranks that placed the operation's buffers differently
				}
				for probeAt <= waited {
					probeAt *= 2
				}
			}
			t.Reset(min(left, probeAt-waited))
			continue
		}
		te := &timeoutError{op: name, seq: seq, d: c.cfg.Timeout, progress: c.eng.Progress(), bytes: bytes, device: dev}
		if l := c.local.Load(); l != nil {
			// In one process the ranks are at hand: compare where each
			// waits as the root would, and abort every rank with what
			// its own wait says.
			c.timedOut.Store(te)
			l.stall(c.rank, wire.Stall{Seq: te.seq, Timeout: int64(c.cfg.Timeout), Op: te.op})
			return
		}
		if w := c.rootConn(); w != nil {
			// Ask the root to compare where every rank waits: its
			// diagnosis aborts this communicator (and every rank's) with
			// the rank at the end of the chain (diagnose.go).
			c.timedOut.Store(te)
			if w.ReportStall(wire.Stall{Seq: te.seq, Timeout: int64(c.cfg.Timeout), Op: te.op}) == nil {
				select {
				case <-c.stopWatch:
					return
				case <-c.ctx.Done():
					return
				case <-time.After(diagnosisBound):
				}
			}
		}
		c.abort(te)
		return
	}
}

// probeFirst is how long an operation waits before the watchdog has the
// ranks compare where they wait (then after twice as long, and so on):
// short against the 10-minute timeout a misplacement would otherwise wait
// out, and rare enough to cost nothing (most operations end far sooner;
// one that waits on a late peer pays a round of small messages through
// the root per doubling, answered from each rank's watch goroutine).
const probeFirst = time.Second

// Abort fails every pending and later operation on this rank with cause
// (wrapped in ErrAborted), and tells the peers, whose operations that
// depend on this rank fail promptly naming it. It does not wait for
// pending operations to return. Close must still be called. A nil cause
// means ErrAborted.
func (c *Comm) Abort(cause error) {
	if c == nil {
		return
	}
	if cause == nil {
		cause = ErrAborted
	}
	c.abort(cause)
}

func (c *Comm) abort(cause error) { c.abortAfter(cause, 0) }

// abortAfter aborts with cause, closing the endpoint grace later: an
// operation that fails meanwhile (a peer's connection closing, say)
// reports cause all the same.
func (c *Comm) abortAfter(cause error, grace time.Duration) {
	c.dumpOnFailure(cause)
	c.cancel(&abortedError{cause: cause})
	c.ended.Store(true)
	if grace > 0 {
		time.Sleep(grace)
	}
	c.ep.Close(cause)
	c.told.Do(func() { c.tellRoot(cause) })
}

// Close waits for this rank's pending operations to finish (and for a
// board or a watch still being joined in the background: a few round
// trips, at most 2 s each when a peer never came), then releases the
// communicator; afterwards every call fails with ErrClosed. Peers that
// still expect data from this rank fail instead of waiting for it. Close is
// idempotent and safe to call concurrently; when it returns, no goroutine
// of the communicator is left. To cancel pending operations instead of
// waiting for them, call Abort first.
func (c *Comm) Close() error {
	if c == nil {
		return &ArgError{Rank: -1, Op: "close", Err: ErrNilComm}
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	// All-reduces a Group still holds (Close from another goroutine while
	// it runs) fail with ErrClosed rather than wait forever.
	c.flushHeld()
	// Every operation issued, not only the last of each order: one that
	// gave up waiting for its predecessor finishes before it.
	c.mu.Lock()
	if c.pending > 0 {
		if c.idle == nil {
			c.idle = make(chan struct{})
		}
		idle := c.idle
		c.mu.Unlock()
		<-idle
	} else {
		c.mu.Unlock()
	}
	c.wg.Wait()
	c.mu.Lock()
	select {
	case <-c.stopWatch:
	default:
		close(c.stopWatch)
	}
	c.mu.Unlock()
	<-c.watchDone
	unregisterDump(c)
	// The connections close before the root hears goodbye: a process
	// frozen between the two is then still watched (the heartbeat names
	// it), where the other order left its peers waiting on connections
	// it would never close, until their operation timed out.
	c.ep.Close(nil)
	c.leaveWatch()
	c.cancel(ErrClosed)
	c.ended.Store(true)
	var err error
	c.released.Do(func() {
		err = c.eng.Close()
		if c.dev != nil {
			if e := c.dev.close(c.cfg.Timeout); err == nil {
				err = e
			}
		}
		if c.onClose != nil {
			c.onClose()
		}
	})
	return err
}

// Request is an operation started asynchronously. Collectives complete in
// the order they were issued, and so do the sends (and the receives) of
// one pair of ranks; different lanes complete in any order.
type Request struct {
	c     *Comm
	name  string
	seq   uint64
	start int64 // guarded by c.mu: when it began to run (its turn came), in ns since Comm.bornNano; 0 before

	// What the flight recorder shows: the operation (without its
	// buffers), its collective sequence number, and times in ns since
	// Comm.bornNano.
	op     engine.Op // In and Out cleared: the recorder keeps no buffer alive
	async  bool
	cseq   uint64
	issued int64
	// finishNs: when it finished, or finishUnseen (a fast operation's,
	// until the next issue, the watchdog or a reader of the records
	// stamps it: Comm.seeFinish). Guarded by c.mu.
	finishNs int64

	devV uint32   // a device operation's value of the stream flag (devState)
	lane *laneKey // host point-to-point: its lane (set at issue)

	// Guarded by c.mu. done is made when first needed: a blocking
	// operation that nobody waits on needs no channel.
	finished bool
	done     chan struct{}
	err      error // set before finished
}

// doneChan returns a channel closed when r has finished.
func (c *Comm) doneChan(r *Request) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.done == nil {
		r.done = make(chan struct{})
		if r.finished {
			close(r.done)
		}
	}
	return r.done
}

func (c *Comm) finish(r *Request, err error) {
	c.mu.Lock()
	c.finishLocked(r, err)
	c.mu.Unlock()
}

// finishLocked records r's end; the caller holds the records (c.mu, or
// a fast operation's window).
func (c *Comm) finishLocked(r *Request, err error) {
	c.endLocked(r, err)
	r.finishNs = c.since()
}

// finishUnseen is the finish time of a blocking operation that ran on the
// fast path (issueFast, finishFast), until something looks: the next
// operation's issue stamps it with its own issue time, and the watchdog's
// next round (within a second; within a few after an operation that ran
// for seconds, whose probes double the round) or a reader of the records
// (the flight recorder, the root's where-query) with the time it looked,
// as PyTorch's flight recorder records the time its watchdog discovered
// an operation's end. A stream of small blocking
// operations then reads the clock once per operation instead of twice,
// a tenth of a 2-rank 8-byte broadcast over shared memory
// (docs/performance.md, "One clock read per operation").
const finishUnseen = -1

// seeFinish stamps the latest operation's finish time with now if it is
// unseen (only the latest can be: every issue stamps its predecessor's).
// The caller holds the records.
func (c *Comm) seeFinish(now int64) {
	if c.seq == 0 {
		return
	}
	if r := c.flight[(c.seq-1)%flightOps]; r != nil && r.finished && r.finishNs == finishUnseen {
		// No earlier than it started: another goroutine's issue may have
		// read the clock before this operation finished.
		r.finishNs = max(now, r.start, r.issued)
	}
}

// endLocked is finishLocked but for the finish time, which the caller
// sets.
func (c *Comm) endLocked(r *Request, err error) {
	if c.pending--; c.pending == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
	r.err = err
	r.finished = true
	if r.done != nil {
		close(r.done)
	}
	if c.tail == r {
		c.tail = nil // nothing left to wait for
	}
	if c.op == r {
		c.op = nil
	}
	if r.lane != nil && c.lanes[*r.lane] == r {
		delete(c.lanes, *r.lane)
	}
}

// Done returns a channel that is closed when the operation has completed.
func (r *Request) Done() <-chan struct{} { return r.c.doneChan(r) }

// Wait blocks until the operation completes and returns its error, or
// until ctx ends, which returns ctx's error and leaves the operation
// running (cancel the context given at Start to stop it). Until Wait has
// returned nil, the operation's buffers belong to goccl: do not read the
// output or change the input.
func (r *Request) Wait(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	done := r.Done()
	select {
	case <-done:
		return r.Err()
	default:
	}
	select {
	case <-done:
		return r.Err()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Err returns the operation's error once it has completed, and nil before.
func (r *Request) Err() error {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.err
}

// call is one operation after its arguments were checked.
type call struct {
	name string
	op   engine.Op
	// A PreMulSum (premulsum.go); its scale is op.Scale.
	premul bool
}

func (c *Comm) argError(name, format string, args ...any) error {
	return &ArgError{Rank: c.rank, Op: name, Msg: fmt.Sprintf(format, args...)}
}

// run issues a blocking operation and runs it in the caller's goroutine
// once its predecessor is done. k does not escape, so a blocking
// operation allocates only its Request.
func (c *Comm) run(ctx context.Context, k *call) error {
	if r := c.issueFast(ctx, k); r != nil {
		err := c.exec(ctx, k, r, nil)
		c.finishFast(r, err)
		return err
	}
	r, prev, err := c.issue(ctx, k, false)
	if err != nil {
		return err
	}
	err = c.exec(ctx, k, r, prev)
	c.finish(r, err)
	return err
}

// issueFast issues a blocking operation without c.mu when nothing else is
// in flight and no goroutine holds the lock (opMutex), or returns nil:
// then issue does it under the lock.
func (c *Comm) issueFast(ctx context.Context, k *call) *Request {
	if ctx == nil || laneOf(k) != nil {
		return nil
	}
	issued := c.since()
	if !c.mu.enter() {
		return nil
	}
	if c.closed || c.tail != nil || len(c.lanes) > 0 || len(c.held) > 0 {
		c.mu.idle()
		return nil
	}
	r, _ := c.issueLocked(k, false, issued, nil)
	c.mu.running()
	return r
}

// finishFast finishes what issueFast issued, its finish time unseen.
func (c *Comm) finishFast(r *Request, err error) {
	locked := !c.mu.finishing()
	if locked {
		c.mu.Lock()
	}
	c.endLocked(r, err)
	r.finishNs = finishUnseen
	c.mu.idle()
	if locked {
		c.mu.Unlock()
	}
}

// start issues an asynchronous operation and runs it in a goroutine. In
// a Group, a small all-reduce or broadcast is held back to be fused
// (fuse.go), and
// anything else lets what is held go first.
func (c *Comm) start(ctx context.Context, k call) (*Request, error) {
	if ctx != nil {
		if r, held, err := c.hold(ctx, &k); held {
			return r, err
		}
	}
	return c.startNow(ctx, k)
}

// startNow is start without holding k back.
func (c *Comm) startNow(ctx context.Context, k call) (*Request, error) {
	r, prev, err := c.issue(ctx, &k, true)
	if err != nil {
		return nil, err
	}
	go func() {
		defer c.wg.Done()
		c.finish(r, c.exec(ctx, &k, r, prev))
	}()
	return r, nil
}

// issue gives an operation the communicator's next sequence number and
// returns its Request and its predecessor's.
func (c *Comm) issue(ctx context.Context, k *call, async bool) (r, prev *Request, err error) {
	name := k.name
	if ctx == nil {
		return nil, nil, c.argError(name, "nil context")
	}
	issued := c.since()
	var done chan struct{}
	if async {
		done = make(chan struct{}) // the caller will wait on it
	}
	c.mu.Lock()
	if len(c.held) > 0 && laneOf(k) == nil {
		// A collective while a group holds small ones back: they go
		// first, so that the order is every rank's alike.
		c.mu.Unlock()
		c.flushHeld()
		c.mu.Lock()
	}
	if c.closed {
		c.mu.Unlock()
		return nil, nil, &ArgError{Rank: c.rank, Op: name, Err: ErrClosed}
	}
	r, prev = c.issueLocked(k, async, issued, done)
	c.mu.Unlock()
	return r, prev, nil
}

// issueLocked gives k the communicator's next sequence number and its
// place in the flight recorder and the order; the caller holds the
// records (c.mu, or a fast operation's window) and has checked closed.
func (c *Comm) issueLocked(k *call, async bool, issued int64, done chan struct{}) (r, prev *Request) {
	name := k.name
	c.seeFinish(issued)
	// A blocking operation reuses the Request the recorder is about to
	// drop, when nothing is in flight: then no operation holds it as its
	// predecessor, and blocking Requests are never handed out. This keeps
	// the common loop of blocking calls free of allocations (a Request per
	// call cost 2-rank 8-byte all-reduce a third of its time in GC).
	slot := &c.flight[c.seq%flightOps]
	if old := *slot; !async && old != nil && !old.async && old.finished && c.tail == nil && len(c.lanes) == 0 {
		r = old
		r.finished, r.done, r.err, r.finishNs = false, nil, nil, 0
	} else {
		r = &Request{c: c}
	}
	r.name, r.async, r.issued, r.done = name, async, issued, done
	// The op without its buffers, field by field (a whole copy, then
	// clearing the buffers, stalled on store forwarding).
	r.op = engine.Op{}
	r.op.Coll, r.op.Type, r.op.Red, r.op.Count, r.op.Root = k.op.Coll, k.op.Type, k.op.Red, k.op.Count, k.op.Root
	r.op.PreMul, r.op.Scale, r.op.InOffs, r.op.OutOffs = k.op.PreMul, k.op.Scale, k.op.InOffs, k.op.OutOffs
	if k.op.Ready != nil {
		c.dev.devOps++
		r.devV = c.dev.devOps
	}
	r.seq = c.seq
	c.seq++
	if k.op.Coll != algorithms.CollSend && k.op.Coll != algorithms.CollRecv {
		r.cseq = c.cseq
		c.cseq++
	} else {
		r.cseq = r.seq
	}
	*slot = r
	c.pending++ // with the records held, before closed can be set: Close waits for it
	r.lane = nil
	if l := laneOf(k); l != nil {
		// Host point-to-point: after the last operation of its lane only.
		prev = c.lanes[*l]
		if c.lanes == nil {
			c.lanes = map[laneKey]*Request{}
		}
		c.lanes[*l] = r
		r.lane = l
	} else {
		prev = c.tail
		c.tail = r
	}
	r.start = 0
	if prev == nil {
		// Nothing runs ahead of it: its turn is now (a clock read costs
		// 25-100 ns in these VMs, a tenth of an 8-byte operation).
		r.start = issued
		if r.lane == nil {
			c.op = r
		}
	}
	if async {
		c.wg.Add(1)
	}
	return r, prev
}

// endCause returns why the communicator ended (closed or aborted), or nil.
func (c *Comm) endCause() error {
	if !c.ended.Load() {
		return nil
	}
	return context.Cause(c.ctx)
}

// since returns the time since the communicator was made, in ns on
// internal/clock's monotonic clock (time.Since also reads the wall clock,
// and the runtime's clock costs twice as much a read here).
func (c *Comm) since() int64 { return clock.Now() - c.bornNano }

// exec runs one operation once its predecessor is done.
func (c *Comm) exec(ctx context.Context, k *call, r *Request, prev *Request) error {
	opErr := func(err error) *OpError {
		return &OpError{Rank: c.rank, Op: k.name, Seq: r.seq, Peer: -1, Err: err}
	}
	if prev != nil {
		c.mu.Lock()
		waiting := !prev.finished
		c.mu.Unlock()
		if waiting {
			select {
			case <-c.doneChan(prev):
			case <-ctx.Done():
				// Skipping an issued operation would leave the peers waiting
				// for it: this rank can no longer take part.
				e := opErr(context.Cause(ctx))
				c.abort(e)
				return e
			}
		}
		c.mu.Lock()
		r.start = c.since()
		if r.lane == nil {
			c.op = r
		}
		c.mu.Unlock()
	}
	if cause := c.endCause(); cause != nil {
		return opErr(cause) // ErrClosed itself, or the abort's cause wrapped in ErrAborted
	}
	// The engine waits on the caller's context only: an abort (by Abort,
	// the watchdog's timeout, or a failed operation) closes the endpoint,
	// which fails every wait in the transports at once, so no context per
	// operation needs to merge the caller's with the communicator's.
	var pl *engine.Plan
	var err error
	if r.lane != nil {
		// A send or receive in its lane (lanes.go): beside the
		// collectives, so the watchdog does not see it; it has its own
		// deadline.
		lctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		var lp engine.Plan // lanes run beside each other: a plan each
		lp, err = c.eng.RunP2P(lctx, &k.op)
		pl = &lp
		if err != nil && ctx.Err() == nil && lctx.Err() != nil {
			err = &timeoutError{op: k.name, seq: r.seq, d: c.cfg.Timeout, bytes: k.op.Bytes(c.size),
				progress: []engine.Progress{{Channel: laneChannel(c.rank, r.lane), Step: 0, Kind: laneKind(r.lane), Peer: r.lane.peer}}}
		}
		cancel()
	} else {
		pl, err = c.eng.Run(ctx, &k.op)
	}
	c.logOp(r, pl, err)
	if err == nil {
		if cause := c.endCause(); cause != nil {
			// Aborted while running: the contract is that pending
			// operations fail, even one whose data happened to arrive.
			return opErr(cause)
		}
		return nil
	}
	e := opErr(err)
	if pl.Sched != nil {
		e.Algo = pl.AlgoName()
		e.Bytes = k.op.Bytes(c.size)
	}
	var se *engine.StepError
	if errors.As(err, &se) {
		e.Peer = se.Peer
		e.Where = fmt.Sprintf("channel %d piece %d step %d (%v)", se.Channel, se.Piece, se.Step, se.Kind)
		if se.Step < 0 {
			e.Where = fmt.Sprintf("channel %d, connecting", se.Channel)
		}
		e.Err = se.Err
	}
	var pe *transport.PeerError
	if e.Peer < 0 && errors.As(err, &pe) {
		e.Peer = pe.Peer
	}
	if context.Cause(c.ctx) == nil && c.diagnosing() {
		// The root is comparing where the ranks wait, and a neighbour
		// that got its diagnosis first has aborted: this rank's own
		// diagnosis is on its way and says more than the neighbour's
		// abort (its chain of waits, from this rank).
		t := time.NewTimer(diagnosisBound)
		select {
		case <-c.ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if cause := context.Cause(c.ctx); cause != nil {
		// Aborted (by Abort, the watchdog or another operation) while
		// running: report the abort's cause, which wraps ErrAborted, rather
		// than whichever symptom the transport saw first.
		e.Err = cause
	}
	// The connections are in an unknown state: no later operation can use
	// them, and the peers must not wait for this rank.
	c.abort(e)
	return e
}

// Barrier blocks until every rank has entered it (or the operation fails).
func (c *Comm) Barrier(ctx context.Context) error {
	if c == nil {
		return &ArgError{Rank: -1, Op: "barrier", Err: ErrNilComm}
	}
	var b [1]uint8
	var k call
	var a args
	hostArgs(&a, b[:], b[:])
	if err := allReduceArgs(c, &a, Max, &k); err != nil {
		return err
	}
	k.name = "barrier" // in errors and the flight recorder, as the caller wrote it
	return c.run(ctx, &k)
}
