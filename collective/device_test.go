package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/flight"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/memory"
)

// The device collectives run here on the host-emulated device
// (internal/device/emu: asynchronous streams, random delays, torn writes,
// poisoned memory), which exists for tests only. Each case goes through
// the caller's stream the way a framework's does: the input is written
// on the stream just before the call (so the operation must wait for the
// stream's earlier work), and the output is copied out on the stream
// right after it (so the stream must wait for the operation).

func bytesOf[T collective.Number](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// devRank is one rank's device state in a test (or in a child process
// of one): its device, its stream, and where to register what to free.
type devRank struct {
	d     *emu.Device
	s     collective.Stream
	later func(func()) // t.Cleanup, or a child's list
}

// alloc returns n bytes of device memory, freed at the end.
func (dr devRank) alloc(n int) (memory.Buffer, error) {
	b, err := dr.d.Alloc(max(n, 1))
	if err != nil {
		return memory.Buffer{}, err
	}
	dr.later(func() { dr.d.Free(b) })
	return b.Slice(0, n), nil
}

// upload enqueues a copy of host bytes into dst on the stream, from a
// staging buffer the stream reads later.
func (dr devRank) upload(dst memory.Buffer, src []byte) error {
	if dst.Len() == 0 {
		return nil
	}
	stage, err := dr.alloc(len(src))
	if err != nil {
		return err
	}
	copy(dr.d.Bytes(stage), src)
	return dr.s.Copy(dst, memory.Buffer{}, stage)
}

// download enqueues a copy of src on the stream and returns a function
// that syncs the stream and returns the bytes.
func (dr devRank) download(src memory.Buffer) (func() ([]byte, error), error) {
	out, err := dr.alloc(src.Len())
	if err != nil {
		return nil, err
	}
	if src.Len() > 0 {
		if err := dr.s.Copy(out, memory.Buffer{}, src); err != nil {
			return nil, err
		}
	}
	return func() ([]byte, error) {
		if err := dr.s.Sync(context.Background()); err != nil {
			return nil, err
		}
		if out.Len() == 0 {
			return nil, nil
		}
		return append([]byte(nil), dr.d.Bytes(out)...), nil
	}, nil
}

// devGroup makes n ranks on one emulated device (several ranks on one GPU,
// the case of the GPU machine this project tests on), each with a stream.
func devGroup(t *testing.T, n int, seed uint64, opts ...collective.Option) ([]*collective.Comm, []devRank) {
	t.Helper()
	d := emu.New(0, emu.Options{Seed: seed, MaxDelay: 20e3})
	comms := newGroup(t, n, append([]collective.Option{collective.WithDevice(d)}, opts...)...)
	drs := make([]devRank, n)
	for r := range drs {
		s, err := d.NewStream()
		require.NoError(t, err)
		drs[r] = devRank{d: d, s: s, later: t.Cleanup}
		t.Cleanup(func() { require.NoError(t, s.Close()) })
	}
	t.Cleanup(func() {
		// Registered after newGroup's cleanup, so it runs before it: close
		// here, then count what is left on the device.
		for _, c := range comms {
			require.NoError(t, c.Close())
		}
	})
	return comms, drs
}

// runDeviceCase is runCase on device memory, through dr's stream.
func runDeviceCase[T collective.Number](ctx context.Context, c *collective.Comm, dr devRank, s caseSpec, input []T) ([]T, error) {
	n, r, k := c.Size(), c.Rank(), s.count
	dt := collective.TypeOf[T]()
	es := dt.Size()
	in := bytesOf(input)
	sendLen, recvLen := len(in), k*es
	if s.coll == algorithms.CollAllGather || s.coll == algorithms.CollAllToAll {
		recvLen = n * k * es
	}
	send, err := dr.alloc(sendLen)
	if err != nil {
		return nil, err
	}
	recv, err := dr.alloc(recvLen)
	if err != nil {
		return nil, err
	}
	if s.inPlace {
		switch s.coll {
		case algorithms.CollReduceScatter:
			recv = send.Slice(r*k*es, (r+1)*k*es)
		case algorithms.CollAllGather:
			send = recv.Slice(r*k*es, (r+1)*k*es)
		case algorithms.CollAllReduce:
			recv = send
		case algorithms.CollBroadcast, algorithms.CollReduce:
			if r == s.root {
				recv = send
			}
		}
	}
	if err := dr.upload(send, in); err != nil {
		return nil, err
	}
	var req *collective.Request
	switch s.coll {
	case algorithms.CollAllReduce:
		req, err = collective.AllReduceDevice(ctx, c, send, recv, dt, s.op, dr.s)
	case algorithms.CollReduceScatter:
		req, err = collective.ReduceScatterDevice(ctx, c, send, recv, dt, s.op, dr.s)
	case algorithms.CollAllGather:
		req, err = collective.AllGatherDevice(ctx, c, send, recv, dt, dr.s)
	case algorithms.CollBroadcast:
		req, err = collective.BroadcastDevice(ctx, c, send, recv, dt, s.root, dr.s)
	case algorithms.CollReduce:
		req, err = collective.ReduceDevice(ctx, c, send, recv, dt, s.op, s.root, dr.s)
	case algorithms.CollAllToAll:
		req, err = collective.AllToAllDevice(ctx, c, send, recv, dt, dr.s)
	default:
		return nil, fmt.Errorf("unknown collective %v", s.coll)
	}
	if err != nil {
		return nil, err
	}
	// Ordered after the operation by the stream alone.
	get, err := dr.download(recv)
	if err != nil {
		return nil, err
	}
	got, err := get()
	if err != nil {
		return nil, err
	}
	if err := req.Wait(ctx); err != nil {
		return nil, err
	}
	out := make([]T, len(got)/es)
	copy(bytesOf(out), got)
	return out, nil
}

func TestDeviceCollectives(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, n := range []int{1, 2, 3} {
		comms, drs := devGroup(t, n, seed+uint64(n))
		for _, coll := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollReduceScatter, algorithms.CollAllGather,
			algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllToAll} {
			for _, inPlace := range []bool{false, true} {
				if inPlace && coll == algorithms.CollAllToAll {
					continue
				}
				for _, count := range []int{1, 1000, 70_001} {
					s := caseSpec{coll: coll, op: collective.Avg, count: count, root: n - 1, inPlace: inPlace, seed: seed + uint64(count)}
					if !coll.Reduces() {
						s.op = collective.Sum
					}
					t.Run(fmt.Sprintf("nranks=%d/%v/count=%d/inplace=%v", n, coll, count, inPlace), func(t *testing.T) {
						checkDevice[float32](t, comms, drs, s)
						s.op = collective.Max
						checkDevice[collective.BFloat16](t, comms, drs, s)
						checkDevice[int64](t, comms, drs, s)
					})
				}
			}
		}
	}
}

// checkDevice is check on device memory.
func checkDevice[T collective.Number](t *testing.T, comms []*collective.Comm, drs []devRank, s caseSpec) {
	t.Helper()
	checkWith(t, comms, s, func(r int, c *collective.Comm, in []T) ([]T, error) {
		return runDeviceCase(context.Background(), c, drs[r], s, in)
	})
}

func TestDeviceSendRecvRingShift(t *testing.T) {
	ctx := context.Background()
	comms, drs := devGroup(t, 3, 5)
	const nb = 50_000
	results := make([][]byte, 3)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		dr := drs[r]
		send, err := dr.alloc(nb)
		if err != nil {
			return err
		}
		recv, err := dr.alloc(nb)
		if err != nil {
			return err
		}
		b := make([]byte, nb)
		for i := range b {
			b[i] = byte(r*31 + i)
		}
		if err := dr.upload(send, b); err != nil {
			return err
		}
		next, prev := (r+1)%3, (r+2)%3
		var reqs []*collective.Request
		ops := []func() (*collective.Request, error){
			func() (*collective.Request, error) {
				return collective.SendDevice(ctx, c, send, collective.Uint8, next, dr.s)
			},
			func() (*collective.Request, error) {
				return collective.RecvDevice(ctx, c, recv, collective.Uint8, prev, dr.s)
			},
		}
		if r%2 == 1 {
			ops[0], ops[1] = ops[1], ops[0]
		}
		for _, op := range ops {
			req, err := op()
			if err != nil {
				return err
			}
			reqs = append(reqs, req)
		}
		get, err := dr.download(recv)
		if err != nil {
			return err
		}
		if results[r], err = get(); err != nil {
			return err
		}
		for _, req := range reqs {
			if err := req.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	noErrors(t, errs)
	for r := range 3 {
		prev := (r + 2) % 3
		for i, v := range results[r] {
			if v != byte(prev*31+i) {
				t.Fatalf("rank %d byte %d = %d, want %d", r, i, v, byte(prev*31+i))
			}
		}
	}
}

func TestDeviceArgumentErrors(t *testing.T) {
	ctx := context.Background()
	comms, drs := devGroup(t, 2, 9)
	c, dr := comms[0], drs[0]
	buf, err := dr.alloc(64)
	require.NoError(t, err)
	other := emu.New(3, emu.Options{})
	ob, err := other.Alloc(64)
	require.NoError(t, err)
	defer other.Free(ob)
	os, err := other.NewStream()
	require.NoError(t, err)
	defer os.Close()
	host := memory.HostBuffer(make([]byte, 64))
	for _, tc := range []struct {
		name string
		call func() (*collective.Request, error)
		want string
	}{
		{"pageable", func() (*collective.Request, error) {
			return collective.AllReduceDevice(ctx, c, host, buf, collective.Float32, collective.Sum, dr.s)
		}, "pageable host memory"},
		{"other device's buffer", func() (*collective.Request, error) {
			return collective.AllReduceDevice(ctx, c, ob, buf, collective.Float32, collective.Sum, dr.s)
		}, "on device 3"},
		{"other device's stream", func() (*collective.Request, error) {
			return collective.AllReduceDevice(ctx, c, buf, buf, collective.Float32, collective.Sum, os)
		}, "stream of device 3"},
		{"partial element", func() (*collective.Request, error) {
			return collective.AllReduceDevice(ctx, c, buf.Slice(0, 6), buf.Slice(8, 14), collective.Float32, collective.Sum, dr.s)
		}, "not a whole number"},
		{"nil stream", func() (*collective.Request, error) {
			return collective.BroadcastDevice(ctx, c, buf, buf, collective.Float32, 0, nil)
		}, "nil stream"},
		{"lengths", func() (*collective.Request, error) {
			return collective.AllReduceDevice(ctx, c, buf.Slice(0, 32), buf.Slice(32, 48), collective.Float32, collective.Sum, dr.s)
		}, "len(send) = 8 but len(recv) = 4"},
	} {
		_, err := tc.call()
		require.ErrorIs(t, err, collective.ErrInvalidArgument, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	// Without a device.
	hc := newGroup(t, 1)[0]
	_, err = collective.AllReduceDevice(ctx, hc, buf, buf, collective.Float32, collective.Sum, dr.s)
	require.ErrorContains(t, err, "without a device")
	// The communicator is still usable: host and device operations.
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		v := []float32{float32(r)}
		if err := collective.AllReduce(ctx, c, v, v, collective.Sum); err != nil {
			return err
		}
		if v[0] != 1 {
			return fmt.Errorf("host all-reduce gave %v", v[0])
		}
		return nil
	})
	noErrors(t, errs)
}

func TestDeviceFailureReleasesTheStream(t *testing.T) {
	// The ranks disagree (different counts): the operation fails, the
	// communicator aborts, and the caller's stream must still move on.
	ctx := context.Background()
	comms, drs := devGroup(t, 2, 13)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		dr := drs[r]
		n := 4 * 100 * (r + 1)
		buf, err := dr.alloc(n)
		if err != nil {
			return err
		}
		req, err := collective.AllReduceDevice(ctx, c, buf, buf, collective.Float32, collective.Sum, dr.s)
		if err != nil {
			return err
		}
		if err := dr.s.Sync(ctx); err != nil {
			return fmt.Errorf("stream after a failed operation: %w", err)
		}
		return req.Wait(ctx)
	})
	for r, err := range errs {
		var oe *collective.OpError
		require.True(t, errors.As(err, &oe), "rank %d: %v", r, err)
	}
}

// TestMultiProcessDevice runs device collectives between processes, each
// with its own emulated device: over shared memory the segments are
// registered with the device, so its kernels reduce straight into the
// slots; over TCP the slices are staged in registered memory; and a
// communicator that mixes the two (ranks on two "hosts") uses both.
func TestMultiProcessDevice(t *testing.T) {
	trs := transports()
	for _, tr := range trs {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("transport=%s/nranks=%d", tr, n), func(t *testing.T) {
				res := spawn(t, "device", gocclEnvs(t, n, "GOCCL_TRANSPORT="+tr), nil)
				requireAllOK(t, res)
				require.Contains(t, res[0].output, "device collectives ok")
			})
		}
	}
	if runtime.GOOS == "linux" {
		// Over shared memory each rank's sends go into the receiver's
		// device memory, mapped through the emulated device's IPC, or, with
		// GOCCL_P2P_DISABLE, through the registered segments: every
		// connection says which it took.
		const toDevice, toHost = "sends go to the receiver's device memory (IPC)", "sends go through registered host memory"
		for _, c := range []struct {
			name, env, path string
		}{
			{"ipc", "", "shared memory: into the receiver's device memory (CUDA IPC)"},
			{"p2p-disabled", "GOCCL_P2P_DISABLE=1", "shared memory: through registered host memory"},
		} {
			t.Run("transport=shm/"+c.name, func(t *testing.T) {
				env := append(transportEnv(t, "shm"), "GOCCL_DEBUG=INFO")
				if c.env != "" {
					env = append(env, c.env)
				}
				res := spawn(t, "device", gocclEnvs(t, 3, env...), nil)
				requireAllOK(t, res)
				require.Contains(t, res[0].output, "device collectives ok")
				for _, r := range res {
					require.Contains(t, r.output, c.path, "rank %d", r.rank)
					if c.name == "ipc" {
						require.Contains(t, r.output, toDevice, "rank %d", r.rank)
						require.NotContains(t, r.output, toHost, "rank %d: every connection maps its peer's device memory", r.rank)
					} else {
						require.Contains(t, r.output, toHost, "rank %d", r.rank)
						require.NotContains(t, r.output, toDevice, "rank %d", r.rank)
						require.Contains(t, r.output, "IPC turned off on this rank", "rank %d", r.rank)
					}
				}
			})
		}
		// Over the emulated RDMA device: GPUDirect (the emulated GPU
		// exports dma-bufs, the emulated NIC maps them; compute capability
		// 0.0 takes the flush read), staged through registered host memory
		// when GOCCL_NET_GDR_LEVEL puts the pair out of reach, and hosts of
		// two ranks that mix shared memory with RDMA.
		for _, c := range []struct {
			name  string
			n     int
			env   []string
			hosts bool
			want  string
		}{
			{"gdr", 3, nil, false, "device-to-device over RDMA: GPUDirect RDMA (dma-buf), with a flush read per slot"},
			{"staged", 2, []string{"GOCCL_NET_GDR_LEVEL=LOC"}, false, "device_path=\"over RDMA: staged through registered host memory: GPUDirect RDMA not allowed"},
			{"hosts", 4, []string{"GOCCL_TRANSPORT=auto"}, true, "shared memory: into the receiver's device memory (CUDA IPC) where both ends map each other's, else registered host memory; device-to-device over RDMA: GPUDirect RDMA (dma-buf)"},
		} {
			t.Run("transport=verbs/"+c.name, func(t *testing.T) {
				envs := gocclEnvs(t, c.n, append(append(transportEnv(t, "verbs"), "GOCCL_DEBUG=INFO"), c.env...)...)
				for r := range envs {
					if c.hosts {
						envs[r] = append(envs[r], fmt.Sprintf("GOCCL_HOSTID=devhost%d", r/2))
					}
				}
				res := spawn(t, "device", envs, nil)
				requireAllOK(t, res)
				require.Contains(t, res[0].output, "device collectives ok")
				for _, r := range res {
					require.Contains(t, r.output, c.want, "rank %d", r.rank)
				}
			})
		}
	}
	if len(trs) > 1 {
		t.Run("mixed/nranks=4", func(t *testing.T) {
			// Ranks 0 and 1 on one host identity, 2 and 3 on another: shared
			// memory within each, TCP between them.
			envs := gocclEnvs(t, 4)
			for r := range envs {
				envs[r] = append(envs[r], fmt.Sprintf("GOCCL_HOSTID=devhost%d", r/2))
			}
			res := spawn(t, "device", envs, nil)
			requireAllOK(t, res)
			require.Contains(t, res[0].output, "device collectives ok")
		})
	}
}

// childDevice is a rank of TestMultiProcessDevice.
func childDevice(ctx context.Context) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	// Exportable memory (Linux), so that GPUDirect over the emulated RDMA
	// device can register it.
	d := emu.New(0, emu.Options{Seed: uint64(os.Getpid()), MaxDelay: 20e3, DMABuf: runtime.GOOS == "linux"})
	c, err := collective.InitFromEnv(ctx, collective.WithDevice(d))
	if err != nil {
		return fail("init: %v", err)
	}
	var frees []func()
	defer func() {
		c.Close()
		for _, f := range frees {
			f()
		}
		if d.Live() != 0 {
			fmt.Fprintf(os.Stderr, "FAIL: %d device allocations left\n", d.Live())
			os.Exit(1)
		}
	}()
	s, err := d.NewStream()
	if err != nil {
		return fail("%v", err)
	}
	frees = append(frees, func() { s.Close() })
	dr := devRank{d: d, s: s, later: func(f func()) { frees = append(frees, f) }}
	n, r := c.Size(), c.Rank()
	for _, coll := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollReduceScatter, algorithms.CollAllGather,
		algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllToAll} {
		for _, inPlace := range []bool{false, true} {
			if inPlace && coll == algorithms.CollAllToAll {
				continue
			}
			for _, count := range []int{3, 50_000} {
				sp := caseSpec{coll: coll, op: collective.Sum, count: count, root: n - 1, inPlace: inPlace, seed: uint64(count) + 17}
				// Every rank draws every rank's input from the same seed, so
				// each can compute the expected output itself.
				rng := rand.New(rand.NewPCG(sp.seed, 7))
				inputs := make([][]float32, n)
				for q := range inputs {
					inputs[q] = gen[float32](rng, sp.op, inputLen(sp, n))
				}
				out, err := runDeviceCase(ctx, c, dr, sp, append([]float32(nil), inputs[r]...))
				if err != nil {
					return fail("%v count %d in place %v: %v", coll, count, inPlace, err)
				}
				if want, ok := expected(sp, inputs, r); ok {
					if i := firstDiff(out, want); i >= 0 {
						return fail("%v count %d in place %v: element %d = %v, want %v", coll, count, inPlace, i, out[i], want[i])
					}
				}
			}
		}
	}
	fmt.Println("device collectives ok")
	return 0
}

// misplacedTimeout is the operations' timeout in TestMultiProcessMisplaced:
// far beyond the watchdog's first probe, which finds the misplacement.
const misplacedTimeout = time.Minute

// An all-reduce that rank 0 calls on host memory and the others on device
// memory runs on separate connections (transport.DeviceChannels), so no
// slice crosses and no signature check fires. The watchdog's probe, a
// second into the wait, has the ranks compare where they are: every rank
// fails with a MisplacedError naming the host and device ranks, long
// before the timeout.
func TestMultiProcessMisplaced(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			res := spawn(t, "misplaced", gocclEnvs(t, 3, "GOCCL_TRANSPORT="+tr, "GOCCL_TIMEOUT="+misplacedTimeout.String(), "GOCCL_TEST_COUNT=1000",
				"GOCCL_DEBUG_DUMP="+dir), nil)
			for _, r := range res {
				t.Logf("rank %d (exit %d): %s", r.rank, r.code, strings.TrimSpace(r.output))
				require.Equal(t, 0, r.code, "rank %d:\n%s", r.rank, r.output)
				require.Contains(t, r.output, "the ranks placed allreduce#0's buffers differently: rank 0 in host memory, ranks 1 and 2 in device memory", "rank %d", r.rank)
			}
			// The flight recorders every rank wrote as it aborted say the
			// same (goccl-run -analyze).
			dumps, err := flight.ReadDir(dir)
			require.NoError(t, err)
			require.Len(t, dumps, 3)
			f := flight.Analyze(dumps)
			require.Equal(t, "diverge", f.Kind, f.Summary)
			require.Equal(t, []int{0}, f.Ranks, f.Summary)
			require.Contains(t, f.Summary, "ranks [1 2] called allreduce(float32×1000, sum, device memory)")
		})
	}
}

// An operation small enough for shared memory's board fails at once on
// the host rank, which finds the device ranks' operation marked as run
// over their connections.
func TestMultiProcessMisplacedOnBoard(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory's board is Linux only")
	}
	res := spawn(t, "misplaced", gocclEnvs(t, 2, "GOCCL_TRANSPORT=shm", "GOCCL_TIMEOUT="+misplacedTimeout.String(), "GOCCL_TEST_COUNT=2", "GOCCL_TEST_BOARD=1"), nil)
	for _, r := range res {
		t.Logf("rank %d (exit %d): %s", r.rank, r.code, strings.TrimSpace(r.output))
		require.Equal(t, 0, r.code, "rank %d:\n%s", r.rank, r.output)
		require.NotContains(t, r.output, "ran past", "rank %d: the board catches it before the timeout", r.rank)
	}
	// Rank 1 learns it from rank 0's abort, or, when rank 0's process
	// (the bootstrap root's) has already exited, from its leaving.
	require.Contains(t, res[0].output, "with its buffers in device memory and this rank's on the host")
}

// childMisplaced is a rank of TestMultiProcessMisplaced.
func childMisplaced(ctx context.Context) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	d := emu.New(0, emu.Options{Seed: uint64(os.Getpid())})
	c, err := collective.InitFromEnv(ctx, collective.WithDevice(d))
	if err != nil {
		return fail("init: %v", err)
	}
	defer c.Close()
	count, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_COUNT"))
	start := time.Now()
	if c.Rank() == 0 {
		buf := make([]float32, count)
		err = collective.AllReduce(ctx, c, buf, buf, collective.Sum)
	} else {
		s, serr := d.NewStream()
		if serr != nil {
			return fail("%v", serr)
		}
		defer s.Close()
		b, aerr := d.Alloc(4 * count)
		if aerr != nil {
			return fail("%v", aerr)
		}
		defer d.Free(b)
		var req *collective.Request
		if req, err = collective.AllReduceDevice(ctx, c, b, b, collective.Float32, collective.Sum, s); err == nil {
			err = req.Wait(ctx)
		}
	}
	took := time.Since(start)
	fmt.Printf("after %v: %v\n", took.Round(time.Millisecond), err)
	switch {
	case err == nil:
		return fail("the misplaced all-reduce succeeded")
	case errors.Is(err, collective.ErrTimeout):
		return fail("a timeout: %v", err)
	case os.Getenv("GOCCL_TEST_BOARD") == "" && !errors.As(err, new(*collective.MisplacedError)):
		// On the board the host rank's mismatch comes first, and the
		// others abort on it.
		return fail("not a MisplacedError: %v", err)
	case took > 10*time.Second:
		return fail("the error came %v into the wait, not after the first probes", took)
	}
	return 0
}
