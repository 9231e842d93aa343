package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/mem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testLink = algorithms.LinkModel{Latency: 2e-6, Bandwidth: 6e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 1 << 16, ChunkBytes: 1 << 14}

func engines(t *testing.T, n int, cfg Config, opts mem.Options) ([]*Engine, *mem.Network) {
	t.Helper()
	nw, err := mem.NewNetwork(n, opts)
	require.NoError(t, err)
	if cfg.MaxChannels == 0 {
		cfg.MaxChannels = 2
	}
	if cfg.Link == (algorithms.LinkModel{}) {
		cfg.Link = testLink
	}
	es := enginesOn(t, nw, n, cfg)
	t.Cleanup(func() {
		for r := 0; r < n; r++ {
			nw.Endpoint(r).Close(nil)
		}
	})
	return es, nw
}

// enginesOn makes an engine with cfg for each of nw's n ranks, beside
// any engines nw already carries.
func enginesOn(t *testing.T, nw *mem.Network, n int, cfg Config) []*Engine {
	t.Helper()
	es := make([]*Engine, n)
	for r := range es {
		var err error
		es[r], err = New(r, n, nw.Endpoint(r), cfg)
		require.NoError(t, err)
	}
	return es
}

func f32s(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func f32at(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }

// runAll runs op(r) on every engine concurrently.
func runAll(t *testing.T, es []*Engine, op func(r int) *Op) []error {
	t.Helper()
	errs := make([]error, len(es))
	var wg sync.WaitGroup
	for r, e := range es {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, errs[r] = e.Run(ctx, op(r))
		})
	}
	wg.Wait()
	return errs
}

func TestAllReduceEveryAlgorithmThroughTheEngine(t *testing.T) {
	for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot} {
		for _, n := range []int{1, 2, 3, 5} {
			es, _ := engines(t, n, Config{Algo: a, Channels: 2}, mem.Options{Slots: 4, SlotSize: 4096})
			const count = 10_007
			outs := make([][]byte, n)
			errs := runAll(t, es, func(r int) *Op {
				in := make([]float32, count)
				for i := range in {
					in[i] = float32(r*3 + i%11)
				}
				outs[r] = make([]byte, 4*count)
				return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Avg, Count: count,
					In: memory.HostBuffer(f32s(in)), Out: memory.HostBuffer(outs[r])}
			})
			for r, err := range errs {
				require.NoError(t, err, "%v n=%d rank %d", a, n, r)
			}
			for r := range outs {
				for i := 0; i < count; i++ {
					want := float32(0)
					for q := 0; q < n; q++ {
						want += float32(q*3 + i%11)
					}
					want /= float32(n)
					require.Equal(t, want, f32at(outs[r], i), "%v n=%d rank %d element %d", a, n, r, i)
				}
			}
		}
	}
}

func TestPlanIsTheSameOnEveryRankAndCached(t *testing.T) {
	es, _ := engines(t, 4, Config{Channels: 2}, mem.Options{Slots: 8, SlotSize: 8192})
	for _, coll := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollReduceScatter} {
		var first Plan
		for r, e := range es {
			pl, err := e.Plan(&Op{Coll: coll, Type: kernels.Float64, Count: 123_457, Root: 1})
			require.NoError(t, err)
			if r == 0 {
				first = pl
				continue
			}
			require.Equal(t, first.Plan, pl.Plan, "%v rank %d", coll, r)
			require.Equal(t, first.Pieces, pl.Pieces, "%v rank %d", coll, r)
		}
		again, err := es[0].Plan(&Op{Coll: coll, Type: kernels.Float64, Count: 123_457, Root: 1})
		require.NoError(t, err)
		require.Same(t, first.Sched, again.Sched)
	}
}

func TestMismatchIsDetected(t *testing.T) {
	es, _ := engines(t, 2, Config{Algo: algorithms.Ring}, mem.Options{})
	errs := runAll(t, es, func(r int) *Op {
		count := 64 * (r + 1)
		return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Int32, Red: kernels.Sum, Count: count,
			In: memory.HostBuffer(make([]byte, 4*count)), Out: memory.HostBuffer(make([]byte, 4*count))}
	})
	var me *MismatchError
	require.True(t, errors.As(errs[0], &me) || errors.As(errs[1], &me), "errors: %v", errs)
	var se *StepError
	require.ErrorAs(t, errs[0], &se)
	require.Equal(t, 1, se.Peer)
	require.Contains(t, se.Error(), "channel 0 piece 0 step")
}

func TestDeviceMemoryIsRefused(t *testing.T) {
	es, _ := engines(t, 1, Config{}, mem.Options{})
	_, err := es[0].Run(context.Background(), &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Count: 4,
		In: memory.DeviceBuffer(0, 0x1000, 16), Out: memory.DeviceBuffer(0, 0x2000, 16)})
	require.ErrorContains(t, err, "without a device")
}

func TestNewRejectsBadConfig(t *testing.T) {
	nw, err := mem.NewNetwork(2, mem.Options{})
	require.NoError(t, err)
	_, err = New(2, 2, nw.Endpoint(0), Config{MaxChannels: 1, Link: testLink})
	require.Error(t, err)
	_, err = New(0, 2, nw.Endpoint(0), Config{MaxChannels: 0, Link: testLink})
	require.Error(t, err)
	_, err = New(0, 2, nw.Endpoint(0), Config{MaxChannels: 1, Channels: 2, Link: testLink})
	require.Error(t, err)
	_, err = New(0, 2, nw.Endpoint(0), Config{MaxChannels: 1})
	require.Error(t, err, "an empty link model")
	_, err = New(0, 2, nw.Endpoint(0), Config{MaxChannels: 1, Link: testLink, Hosts: []int{0}})
	require.ErrorContains(t, err, "1 host labels for 2 ranks")
	nw3, err := mem.NewNetwork(3, mem.Options{})
	require.NoError(t, err)
	_, err = New(0, 3, nw3.Endpoint(0), Config{MaxChannels: 1, Link: testLink, Hosts: []int{0, 0, 1}, Algo: algorithms.Hier})
	require.ErrorContains(t, err, "hier forced")
	require.ErrorContains(t, err, "hosts have 2, 1")
	e, err := New(0, 3, nw3.Endpoint(0), Config{MaxChannels: 1, Link: testLink, Hosts: []int{0, 0, 1}})
	require.NoError(t, err, "uneven hosts are fine when hier is not forced")
	pl, err := e.Plan(&Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: 1 << 24})
	require.NoError(t, err)
	require.NotEqual(t, algorithms.Hier, pl.Algo)
	// Uneven hosts still span hosts: the tuner keeps the one-host forms
	// of the all-gather (one-shot, recursive doubling) off them.
	onHost := testLink
	onHost.OneShotHalves, onHost.ExchangeEfficiency = true, 0.9
	for _, hosts := range [][]int{{0, 0, 0}, {0, 0, 1}} {
		e, err := New(0, 3, nw3.Endpoint(0), Config{MaxChannels: 1, Link: onHost, Hosts: hosts})
		require.NoError(t, err)
		pl, err := e.Plan(&Op{Coll: algorithms.CollAllGather, Type: kernels.Float32, Count: 16})
		require.NoError(t, err)
		if hosts[2] == 0 {
			require.Equal(t, algorithms.OneShot, pl.Algo, "one host")
		} else {
			require.Equal(t, algorithms.Ring, pl.Algo, "hosts %v", hosts)
		}
	}
}

// TestOperatorMismatchAfterSameShape: the plan cache is keyed by what the
// signature encodes. Both ranks first run a max over the same buffer
// shape; then one runs a sum and the other a min of that shape. The
// operator is in the signature, so the second operation must fail with a
// MismatchError, not reuse the first plan's signature and mix the data.
func TestOperatorMismatchAfterSameShape(t *testing.T) {
	es, _ := engines(t, 2, Config{Algo: algorithms.Ring}, mem.Options{Slots: 4, SlotSize: 4096})
	op := func(r int, red kernels.Op) *Op {
		b := f32s([]float32{1, 2, 3, 4})
		return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: red, Count: 4, In: memory.HostBuffer(b), Out: memory.HostBuffer(b)}
	}
	for r, err := range runAll(t, es, func(r int) *Op { return op(r, kernels.Max) }) {
		require.NoError(t, err, "rank %d", r)
	}
	errs := runAll(t, es, func(r int) *Op { return op(r, []kernels.Op{kernels.Sum, kernels.Min}[r]) })
	mismatch := false
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		var me *MismatchError
		mismatch = mismatch || errors.As(err, &me)
	}
	require.True(t, mismatch, "errors: %v", errs)
}

// heldDial holds the lower rank's first Connect as a real dial can be
// held between the peer's acknowledgement and this end's reading it:
// until the test releases it, or its context ends (then it fails, as a
// handshake cut short does).
type heldDial struct {
	transport.Endpoint
	entered, release chan struct{}
	once             sync.Once
}

func (h *heldDial) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	h.once.Do(func() { close(h.entered) })
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	return h.Endpoint.Connect(ctx, peer, ch)
}

// The peer accepted the lower rank's connection, sent on it and closed
// its communicator while the lower rank was still reading the
// acknowledgement; the root's notice that it left (PeerGone) comes then.
// The lower rank's Connect is not cut short: what the peer sent arrives.
// (The higher rank's wait is cut short: TestBoardJoinFailsWhenAPeerGoes.)
// Seen in CI as "connect with rank 3: rank 3 closed its communicator" in
// a scatter whose root had sent everything.
func TestDialOutlivesThePeersLeaving(t *testing.T) {
	nw, err := mem.NewNetwork(2, mem.Options{})
	require.NoError(t, err)
	h := &heldDial{Endpoint: nw.Endpoint(0), entered: make(chan struct{}), release: make(chan struct{})}
	cfg := Config{MaxChannels: 2, Link: testLink}
	e0, err := New(0, 2, h, cfg)
	require.NoError(t, err)
	e1, err := New(1, 2, nw.Endpoint(1), cfg)
	require.NoError(t, err)
	defer nw.Endpoint(0).Close(nil)
	want := []float32{1, 2, 3, 4}
	got := make([]byte, 16)
	recvErr := make(chan error, 1)
	go func() {
		_, err := e0.RunP2P(context.Background(), &Op{Coll: algorithms.CollRecv, Type: kernels.Float32, Count: 4, Root: 1, Out: memory.HostBuffer(got)})
		recvErr <- err
	}()
	<-h.entered
	_, err = e1.RunP2P(context.Background(), &Op{Coll: algorithms.CollSend, Type: kernels.Float32, Count: 4, Root: 0, In: memory.HostBuffer(f32s(want))})
	require.NoError(t, err)
	require.NoError(t, nw.Endpoint(1).Close(nil))
	e0.PeerGone(1, errors.New("rank 1 closed its communicator"))
	close(h.release)
	require.NoError(t, <-recvErr)
	require.Equal(t, f32s(want), got)
}

// A link model's MinSliceBytes raises the engine's floor: a 2-rank all-gather
// of 64 KiB (32 KiB blocks) is two 16 KiB slices per block by default and
// one slice with a 32 KiB floor, and it still lands exactly.
func TestLinkModelRaisesTheSliceFloor(t *testing.T) {
	const n = 2
	cfg := Config{Algo: algorithms.Ring, Channels: 1, MaxChannels: 1, Link: testLink}
	floor := cfg
	floor.Link.MinSliceBytes = 32 << 10
	plain, nw := engines(t, n, cfg, mem.Options{Slots: 8, SlotSize: 128 << 10})
	raised := enginesOn(t, nw, n, floor)
	for _, c := range []struct {
		count            int // float32 elements per rank
		plain, withFloor int // slice bytes
	}{{8 << 10, 16 << 10, 32 << 10}, {4 << 10, 16 << 10, 32 << 10}} {
		op := &Op{Coll: algorithms.CollAllGather, Type: kernels.Float32, Count: c.count}
		p, err := plain[0].Plan(op)
		require.NoError(t, err)
		q, err := raised[0].Plan(op)
		require.NoError(t, err)
		require.Equal(t, c.plain, 4*p.SliceElems, "default floor, %d elements", c.count)
		require.Equal(t, c.withFloor, 4*q.SliceElems, "32 KiB floor, %d elements", c.count)
	}
	outs := make([][]byte, n)
	errs := runAll(t, raised, func(r int) *Op {
		in := make([]float32, 8<<10)
		for i := range in {
			in[i] = float32(r*100_000 + i)
		}
		outs[r] = make([]byte, 4*n*len(in))
		return &Op{Coll: algorithms.CollAllGather, Type: kernels.Float32, Count: len(in),
			In: memory.HostBuffer(f32s(in)), Out: memory.HostBuffer(outs[r])}
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for r := range outs {
		for i := range n * (8 << 10) {
			require.Equal(t, float32(i/(8<<10)*100_000+i%(8<<10)), f32at(outs[r], i), "rank %d element %d", r, i)
		}
	}
}

// TestOversubscribedSlicesBySlot: where ranks outnumber cores
// (Config.Oversubscribed) broadcast, reduce and all-reduce send their
// blocks a slot at a time, the ring all-gather keeps the engine's cut,
// and the results are exact.
func TestOversubscribedSlicesBySlot(t *testing.T) {
	const n, slot = 4, 128 << 10
	cfg := Config{Algo: algorithms.Ring, Channels: 1, MaxChannels: 1, Link: testLink}
	plain, nw := engines(t, n, cfg, mem.Options{Slots: 8, SlotSize: slot})
	cfg.Oversubscribed = true
	busy := enginesOn(t, nw, n, cfg)
	const count = 64 << 10 // float32 elements: 256 KiB
	for _, c := range []algorithms.Collective{algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllReduce, algorithms.CollAllGather} {
		op := &Op{Coll: c, Type: kernels.Float32, Count: count}
		p, err := plain[0].Plan(op)
		require.NoError(t, err)
		require.Less(t, 4*p.SliceElems, slot, "%v: cut below a slot", c)
		q, err := busy[0].Plan(op)
		require.NoError(t, err)
		if c == algorithms.CollAllGather {
			require.Equal(t, p.SliceElems, q.SliceElems, "the ring all-gather keeps the cut")
		} else {
			require.Equal(t, slot, 4*q.SliceElems, "%v, oversubscribed: a slot", c)
		}
	}
	// 1 MiB: the all-reduce's 256 KiB blocks go as two slots each.
	const big = 256 << 10
	outs := make([][]byte, n)
	for _, c := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollReduce} {
		errs := runAll(t, busy, func(r int) *Op {
			in := make([]float32, big)
			for i := range in {
				in[i] = float32(r*1_000 + i%1_000)
			}
			outs[r] = make([]byte, 4*big)
			return &Op{Coll: c, Type: kernels.Float32, Red: kernels.Sum, Count: big, Root: 2,
				In: memory.HostBuffer(f32s(in)), Out: memory.HostBuffer(outs[r])}
		})
		for r, err := range errs {
			require.NoError(t, err, "%v, rank %d", c, r)
		}
		for r := range outs {
			if c == algorithms.CollReduce && r != 2 {
				continue
			}
			for i := range big {
				if got, want := f32at(outs[r], i), float32(6_000+4*(i%1_000)); got != want {
					t.Fatalf("%v, rank %d element %d: %v, want %v", c, r, i, got, want)
				}
			}
		}
	}
	errs := runAll(t, busy, func(r int) *Op {
		buf := make([]float32, count)
		if r == 1 {
			for i := range buf {
				buf[i] = float32(i)
			}
		}
		outs[r] = f32s(buf)
		return &Op{Coll: algorithms.CollBroadcast, Type: kernels.Float32, Count: count, Root: 1,
			In: memory.HostBuffer(outs[r]), Out: memory.HostBuffer(outs[r])}
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for r := range outs {
		for i := range count {
			if got := f32at(outs[r], i); got != float32(i) {
				t.Fatalf("broadcast, rank %d element %d: %v, want %v", r, i, got, i)
			}
		}
	}
}

// TestRecDoublingGatherSlicesBySlot: the recursive-doubling all-gather's
// exchanges go in lockstep and the one-shot halves forward nothing
// (slotSlices), so their slices are a slot's where the ring's are cut
// smaller; and the recursive-doubling all-gather's result is exact.
func TestRecDoublingGatherSlicesBySlot(t *testing.T) {
	const n, slot = 4, 128 << 10
	cfg := Config{Algo: algorithms.Ring, Channels: 1, MaxChannels: 1, Link: testLink}
	ring, nw := engines(t, n, cfg, mem.Options{Slots: 8, SlotSize: slot})
	cfg.Algo = algorithms.RecDoubling
	rd := enginesOn(t, nw, n, cfg)
	cfg.Algo = algorithms.OneShot
	one := enginesOn(t, nw, n, cfg)
	const count = 64 << 10 // float32 elements per rank: a 256 KiB block
	for _, c := range []algorithms.Collective{algorithms.CollAllGather, algorithms.CollReduceScatter} {
		op := &Op{Coll: c, Type: kernels.Float32, Count: count}
		p, err := ring[0].Plan(op)
		require.NoError(t, err)
		require.Less(t, 4*p.SliceElems, slot, "%v, the ring: cut below a slot", c)
		q, err := one[0].Plan(op)
		require.NoError(t, err)
		require.Equal(t, algorithms.OneShot, q.Algo)
		require.Equal(t, slot, 4*q.SliceElems, "%v, one-shot: a slot", c)
	}
	q, err := rd[0].Plan(&Op{Coll: algorithms.CollAllGather, Type: kernels.Float32, Count: count})
	require.NoError(t, err)
	require.Equal(t, algorithms.RecDoubling, q.Algo)
	require.Equal(t, slot, 4*q.SliceElems, "recursive doubling: a slot")
	ar, err := one[0].Plan(&Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Count: count})
	require.NoError(t, err)
	require.Less(t, 4*ar.SliceElems, slot, "the one-shot all-reduce keeps the engine's cut")
	outs := make([][]byte, n)
	errs := runAll(t, rd, func(r int) *Op {
		in := make([]float32, count)
		for i := range in {
			in[i] = float32(r*1_000_000 + i)
		}
		outs[r] = make([]byte, 4*n*count)
		return &Op{Coll: algorithms.CollAllGather, Type: kernels.Float32, Count: count,
			In: memory.HostBuffer(f32s(in)), Out: memory.HostBuffer(outs[r])}
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for r := range outs {
		for i := range n * count {
			if got, want := f32at(outs[r], i), float32(i/count*1_000_000+i%count); got != want {
				t.Fatalf("rank %d element %d: %v, want %v", r, i, got, want)
			}
		}
	}
}
