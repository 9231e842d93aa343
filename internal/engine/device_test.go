package engine

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport/mem"
)

// The device path is checked against the host path: the same operation on
// the same inputs, once on host memory and once on an emulated device's
// memory (internal/device/emu: asynchronous streams, torn writes, poisoned
// memory), must give the same bits on every rank. Both run the same
// schedule with the same kernels in the same order, so any difference is
// a missing fence, a wrong buffer or a lost slice.

// devEngines makes n engines whose device operations run on d, over a mem
// network whose device channels keep their slots in d's memory.
func devEngines(t *testing.T, n int, cfg Config, d *emu.Device) []*Engine {
	t.Helper()
	nw, err := mem.NewNetwork(n, mem.Options{Slots: 4, SlotSize: 4096,
		DeviceAlloc:  func(_, n int) (memory.Buffer, error) { return d.Alloc(n) },
		DeviceFree:   func(_ int, b memory.Buffer) error { return d.Free(b) },
		DeviceMemory: memory.Device})
	require.NoError(t, err)
	if cfg.MaxChannels == 0 {
		cfg.MaxChannels = 2
	}
	cfg.Link = testLink
	cfg.Device = d
	es := make([]*Engine, n)
	for r := range es {
		es[r], err = New(r, n, nw.Endpoint(r), cfg)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for r, e := range es {
			require.NoError(t, e.Close())
			nw.Endpoint(r).Close(nil)
		}
		require.NoError(t, nw.Close())
		require.Zero(t, d.Live(), "device memory left allocated")
	})
	return es
}

// devCase is one operation on every rank: its buffers' sizes and where
// the input sits in place.
type devCase struct {
	coll    algorithms.Collective
	algo    algorithms.Algorithm
	typ     kernels.Type
	red     kernels.Op
	count   int
	inPlace bool
	root    int
	// scales, when set, makes the case a pre-multiplied sum with rank r's
	// input scaled by scales[r] (Op.PreMul).
	scales []float64
}

func (c devCase) String() string {
	s := fmt.Sprintf("%v/%v/%v/%v/count=%d/root=%d", c.coll, c.algo, c.typ, c.red, c.count, c.root)
	if c.inPlace {
		s += "/inplace"
	}
	return s
}

// lens returns rank r's input and output lengths in bytes and the input's
// offset in the output when in place (-1 otherwise).
func (c devCase) lens(n, r int) (in, out, off int) {
	es := c.typ.Size()
	k := c.count * es
	off = -1
	switch c.coll {
	case algorithms.CollReduceScatter:
		in, out = n*k, k
		if c.inPlace {
			// recv = send[r*k:(r+1)*k]: the output lives in the input.
			return n * k, k, -2
		}
	case algorithms.CollAllGather:
		in, out = k, n*k
		if c.inPlace {
			off = r * k
		}
	case algorithms.CollAllToAll:
		in, out = n*k, n*k
	case algorithms.CollBroadcast:
		in, out = k, k
		if r != c.root {
			in = 0
		}
		if c.inPlace && r == c.root {
			off = 0
		}
	case algorithms.CollReduce:
		in, out = k, k
		if r != c.root {
			out = 0
		}
		if c.inPlace && r == c.root {
			off = 0
		}
	default:
		in, out = k, k
		if c.inPlace {
			off = 0
		}
	}
	return in, out, off
}

// inputs returns every rank's input bytes, random but finite for floats.
func (c devCase) inputs(n int, rng *rand.Rand) [][]byte {
	ins := make([][]byte, n)
	for r := range ins {
		nin, _, _ := c.lens(n, r)
		b := make([]byte, nin)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if c.typ == kernels.Float32 {
			for i := 0; i+4 <= len(b); i += 4 {
				b[i+3] &= 0xbf // clear an exponent bit: no Inf, no NaN
			}
		}
		ins[r] = b
	}
	return ins
}

// runCase runs c on es with each rank's input, on host memory (d nil) or
// on d's memory, and returns each rank's output bytes.
func runCase(t *testing.T, es []*Engine, c devCase, ins [][]byte, d *emu.Device) [][]byte {
	t.Helper()
	n := len(es)
	outs := make([][]byte, n)
	var bufs []memory.Buffer
	alloc := func(nb int) memory.Buffer {
		if d == nil {
			return memory.HostBuffer(make([]byte, nb))
		}
		b, err := d.Alloc(max(nb, 1))
		require.NoError(t, err)
		bufs = append(bufs, b)
		return b.Slice(0, nb)
	}
	bytesOf := func(b memory.Buffer) []byte {
		switch {
		case b.Len() == 0:
			return nil
		case d == nil:
			return b.Bytes()
		}
		return d.Bytes(b)
	}
	ops := make([]*Op, n)
	for r := range ops {
		nin, nout, off := c.lens(n, r)
		op := &Op{Coll: c.coll, Type: c.typ, Red: c.red, Count: c.count, Root: c.root}
		if c.scales != nil {
			op.PreMul, op.Scale = true, c.scales[r]
		}
		switch {
		case off == -2: // the output inside the input
			op.In = alloc(nin)
			op.Out = op.In.Slice(r*nout, (r+1)*nout)
		case off >= 0:
			op.Out = alloc(nout)
			op.In = op.Out.Slice(off, off+nin)
		default:
			op.In, op.Out = alloc(nin), alloc(nout)
		}
		if op.Out.Len() > 0 && off < 0 {
			// Poison the output: every byte of it must be written.
			for i := range bytesOf(op.Out) {
				bytesOf(op.Out)[i] = 0xA7
			}
		}
		copy(bytesOf(op.In), ins[r])
		ops[r] = op
	}
	errs := runAll(t, es, func(r int) *Op { return ops[r] })
	for r, err := range errs {
		require.NoError(t, err, "%v rank %d", c, r)
	}
	for r, op := range ops {
		outs[r] = append([]byte(nil), bytesOf(op.Out)...)
	}
	for _, b := range bufs {
		require.NoError(t, d.Free(b))
	}
	return outs
}

func TestDeviceCollectivesMatchTheHost(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var cases []devCase
	for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot} {
		cases = append(cases, devCase{coll: algorithms.CollAllReduce, algo: a, typ: kernels.Float32, red: kernels.Sum, count: 3001})
		cases = append(cases, devCase{coll: algorithms.CollAllReduce, algo: a, typ: kernels.Int32, red: kernels.Avg, count: 2000, inPlace: true})
	}
	cases = append(cases,
		devCase{coll: algorithms.CollAllReduce, typ: kernels.Float16, red: kernels.Max, count: 4099},
		devCase{coll: algorithms.CollAllReduce, typ: kernels.Float64, red: kernels.Avg, count: 7},
		devCase{coll: algorithms.CollReduceScatter, typ: kernels.Float32, red: kernels.Sum, count: 1500},
		devCase{coll: algorithms.CollReduceScatter, typ: kernels.BFloat16, red: kernels.Avg, count: 999, inPlace: true},
		devCase{coll: algorithms.CollAllGather, typ: kernels.Uint8, count: 5000},
		devCase{coll: algorithms.CollAllGather, typ: kernels.Int64, count: 300, inPlace: true},
		devCase{coll: algorithms.CollBroadcast, typ: kernels.Float32, count: 2500, root: 1},
		devCase{coll: algorithms.CollBroadcast, typ: kernels.Int8, count: 6000, root: 0, inPlace: true},
		devCase{coll: algorithms.CollReduce, typ: kernels.Float32, red: kernels.Prod, count: 2222, root: 1},
		devCase{coll: algorithms.CollReduce, typ: kernels.Uint64, red: kernels.Min, count: 800, root: 0, inPlace: true},
		devCase{coll: algorithms.CollAllToAll, typ: kernels.Float32, count: 700},
	)
	for _, n := range []int{1, 2, 3, 4} {
		d := emu.New(0, emu.Options{Seed: seed + uint64(n), MaxDelay: 20e3})
		for _, c := range cases {
			if c.root >= n {
				c.root = n - 1
			}
			t.Run(fmt.Sprintf("nranks=%d/%v", n, c), func(t *testing.T) {
				ins := c.inputs(n, rng)
				cfg := Config{Algo: c.algo, Channels: 2}
				if c.algo == algorithms.AlgoAuto {
					cfg.Algo = algorithms.AlgoAuto
				}
				want := runCase(t, hostEngines(t, n, cfg), c, ins, nil)
				got := runCase(t, devEngines(t, n, cfg, d), c, ins, d)
				for r := range want {
					require.Equal(t, want[r], got[r], "%v: rank %d's output differs from the host path's", c, r)
				}
			})
		}
	}
}

// hostEngines is engines with the device tests' slot shape.
func hostEngines(t *testing.T, n int, cfg Config) []*Engine {
	es, _ := engines(t, n, cfg, mem.Options{Slots: 4, SlotSize: 4096})
	return es
}

func TestDeviceSendRecv(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: 7})
	es := devEngines(t, 2, Config{}, d)
	const nb = 40_000 // several slices
	src, err := d.Alloc(nb)
	require.NoError(t, err)
	dst, err := d.Alloc(nb)
	require.NoError(t, err)
	for i := range d.Bytes(src) {
		d.Bytes(src)[i] = byte(i * 7)
	}
	errs := runAll(t, es, func(r int) *Op {
		if r == 0 {
			return &Op{Coll: algorithms.CollSend, Type: kernels.Uint8, Count: nb, Root: 1, In: src}
		}
		return &Op{Coll: algorithms.CollRecv, Type: kernels.Uint8, Count: nb, Root: 0, Out: dst}
	})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, d.Bytes(src), d.Bytes(dst))
	require.NoError(t, d.Free(src))
	require.NoError(t, d.Free(dst))
}

func TestDeviceOperationWaitsForReady(t *testing.T) {
	// The caller's stream writes the input after a WaitValue that only the
	// test releases; the operation, ordered after an event recorded behind
	// that write, must see the written input, not what was there at the
	// call.
	d := emu.New(0, emu.Options{Seed: 11})
	es := devEngines(t, 2, Config{}, d)
	const count = 1000
	flag, err := d.AllocHost(64)
	require.NoError(t, err)
	clear(flag.Bytes()[:4]) // fresh memory is poisoned
	var ins, outs, staged [2]memory.Buffer
	var streams [2]interface {
		Close() error
	}
	ops := make([]*Op, 2)
	for r := range 2 {
		ins[r], err = d.Alloc(4 * count)
		require.NoError(t, err)
		outs[r], err = d.Alloc(4 * count)
		require.NoError(t, err)
		staged[r], err = d.Alloc(4 * count)
		require.NoError(t, err)
		copy(d.Bytes(staged[r]), f32s(repeat(float32(r+1), count)))
		s, err := d.NewStream()
		require.NoError(t, err)
		streams[r] = s
		require.NoError(t, s.WaitValue(flag.Slice(0, 4), 1))
		require.NoError(t, s.Copy(ins[r], memory.Buffer{}, staged[r]))
		ready, err := s.Record()
		require.NoError(t, err)
		ops[r] = &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: count, In: ins[r], Out: outs[r], Ready: ready}
	}
	done := make(chan []error)
	go func() { done <- runAll(t, es, func(r int) *Op { return ops[r] }) }()
	(*atomic.Uint32)(unsafe.Pointer(&flag.Bytes()[0])).Store(1) // release the callers' streams
	errs := <-done
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for r := range 2 {
		require.Equal(t, f32s(repeat(float32(3), count)), d.Bytes(outs[r]), "rank %d", r)
		require.NoError(t, streams[r].Close())
		for _, b := range []memory.Buffer{ins[r], outs[r], staged[r]} {
			require.NoError(t, d.Free(b))
		}
	}
	require.NoError(t, d.Free(flag))
}

func repeat(v float32, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func TestDeviceMemoryChecks(t *testing.T) {
	d := emu.New(0, emu.Options{})
	other := emu.New(1, emu.Options{})
	es := devEngines(t, 1, Config{}, d)
	ctx := context.Background()
	buf, err := d.Alloc(64)
	require.NoError(t, err)
	defer d.Free(buf)
	ob, err := other.Alloc(64)
	require.NoError(t, err)
	defer other.Free(ob)
	for _, tc := range []struct {
		name    string
		in, out memory.Buffer
		want    string
	}{
		{"host and device", memory.HostBuffer(make([]byte, 64)), buf, "pageable host memory"},
		{"other device", ob, buf, "on device 1"},
	} {
		_, err := es[0].Run(ctx, &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Count: 16, In: tc.in, Out: tc.out})
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	// A host-only network carries no device operations.
	hes, _ := engines(t, 1, Config{Device: d}, mem.Options{})
	_, err = hes[0].Run(ctx, &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Count: 16, In: buf, Out: buf})
	require.ErrorContains(t, err, "carries no device operations")
}

// TestDeviceLinkTunesDeviceOperations: with Config.DeviceLink, device
// operations are planned by it and host ones by Link, each with plans of
// their own, and a device operation planned so still gives the host
// path's bits.
func TestDeviceLinkTunesDeviceOperations(t *testing.T) {
	const n, count = 4, 1 << 16
	d := emu.New(0, emu.Options{Seed: 3, MaxDelay: 20e3})
	// A link whose hops cost a second and whose bytes cost nothing: the
	// tuner must then take fewer steps than the host link's ring.
	slow := algorithms.LinkModel{Latency: 1, Bandwidth: 1e15, MaxChannels: 2, ChannelBytes: 1 << 16, ChunkBytes: 1 << 14}
	es := devEngines(t, n, Config{Algo: algorithms.AlgoAuto, DeviceLink: slow}, d)
	host := Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: count}
	dev := host
	dev.Ready = readyEvent{}
	hp, err := es[0].Plan(&host)
	require.NoError(t, err)
	dp, err := es[0].Plan(&dev)
	require.NoError(t, err)
	want := algorithms.Tune(algorithms.Problem{Coll: algorithms.CollAllReduce, NRanks: n, Bytes: host.Bytes(n), Link: testLink}, algorithms.AlgoAuto, 0, 0)
	require.Equal(t, want.Algo, hp.Algo, "host operations keep the host link's plan")
	require.NotEqual(t, hp.Algo, dp.Algo, "the device link's plan (%v) is the host link's (%v)", dp.Algo, hp.Algo)
	require.Less(t, len(dp.Sched.Steps), len(hp.Sched.Steps), "fewer steps where a hop costs a second")
	// The device plan runs, with the bits of the host path forced to the
	// same algorithm (another one sums in another order).
	c := devCase{coll: algorithms.CollAllReduce, typ: kernels.Float32, red: kernels.Sum, count: count}
	ins := c.inputs(n, rand.New(rand.NewPCG(1, 2)))
	wantOut := runCase(t, hostEngines(t, n, Config{Algo: dp.Algo, Channels: dp.Channels}), c, ins, nil)
	got := runCase(t, es, c, ins, d)
	for r := range wantOut {
		require.True(t, bytes.Equal(wantOut[r], got[r]), "rank %d's output differs from the host path's", r)
	}
}
