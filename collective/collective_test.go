package collective_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

var allOps = []collective.Op{collective.Sum, collective.Prod, collective.Min, collective.Max, collective.Avg}

// caseSpec is one checked run of a collective.
type caseSpec struct {
	coll    algorithms.Collective
	op      collective.Op
	count   int // elements per major block
	root    int
	inPlace bool
	seed    uint64
}

// check runs spec on comms with element type T and compares every rank's
// output with the reference.
func check[T collective.Number](t *testing.T, comms []*collective.Comm, s caseSpec) {
	t.Helper()
	checkWith(t, comms, s, func(_ int, c *collective.Comm, in []T) ([]T, error) {
		return runCase(context.Background(), c, s, in)
	})
}

// checkWith is check with run doing rank r's part (on host slices, or on
// device memory: device_test.go); run gets its own copy of the input.
func checkWith[T collective.Number](t *testing.T, comms []*collective.Comm, s caseSpec, run func(r int, c *collective.Comm, in []T) ([]T, error)) {
	t.Helper()
	n := len(comms)
	rng := rand.New(rand.NewPCG(s.seed, 7))
	k := s.count
	inputs := make([][]T, n)
	for r := range inputs {
		inputs[r] = gen[T](rng, s.op, inputLen(s, n))
	}
	outs := make([][]T, n)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		var err error
		outs[r], err = run(r, c, append([]T(nil), inputs[r]...))
		return err
	})
	noErrors(t, errs)
	for r := 0; r < n; r++ {
		want, defined := expected(s, inputs, r)
		if !defined {
			continue
		}
		if i := firstDiff(outs[r], want); i >= 0 {
			t.Fatalf("%v %v %v n=%d count=%d inplace=%v seed=%d: rank %d element %d = %v, want %v",
				collective.TypeOf[T](), s.coll, s.op, n, k, s.inPlace, s.seed, r, i, outs[r][i], want[i])
		}
	}
}

// inputLen is how many elements each rank sends in case s on n ranks.
func inputLen(s caseSpec, n int) int {
	if s.coll == algorithms.CollReduceScatter || s.coll == algorithms.CollAllToAll {
		return n * s.count
	}
	return s.count
}

// runCase runs case s on c with send as this rank's input (the caller's
// copy: an in-place case writes it) and returns the output buffer.
func runCase[T collective.Number](ctx context.Context, c *collective.Comm, s caseSpec, send []T) ([]T, error) {
	n, r, k := c.Size(), c.Rank(), s.count
	var recv []T
	switch s.coll {
	case algorithms.CollAllReduce:
		recv = make([]T, k)
		if s.inPlace {
			recv = send
		}
		return recv, collective.AllReduce(ctx, c, send, recv, s.op)
	case algorithms.CollReduceScatter:
		recv = make([]T, k)
		if s.inPlace {
			recv = send[r*k : (r+1)*k]
		}
		return recv, collective.ReduceScatter(ctx, c, send, recv, s.op)
	case algorithms.CollAllGather:
		recv = make([]T, n*k)
		if s.inPlace {
			copy(recv[r*k:], send)
			send = recv[r*k : (r+1)*k]
		}
		return recv, collective.AllGather(ctx, c, send, recv)
	case algorithms.CollBroadcast:
		recv = make([]T, k)
		if s.inPlace && r == s.root {
			recv = send
		}
		return recv, collective.Broadcast(ctx, c, send, recv, s.root)
	case algorithms.CollReduce:
		recv = make([]T, k)
		if s.inPlace && r == s.root {
			recv = send
		}
		return recv, collective.Reduce(ctx, c, send, recv, s.op, s.root)
	case algorithms.CollAllToAll:
		recv = make([]T, n*k)
		return recv, collective.AllToAll(ctx, c, send, recv)
	}
	return nil, fmt.Errorf("unknown collective %v", s.coll)
}

// expected is rank r's output for case s given every rank's input; false
// where it is undefined (reduce, off the root).
func expected[T collective.Number](s caseSpec, inputs [][]T, r int) ([]T, bool) {
	n, k := len(inputs), s.count
	var want []T
	switch s.coll {
	case algorithms.CollAllReduce, algorithms.CollReduce:
		if s.coll == algorithms.CollReduce && r != s.root {
			return nil, false
		}
		want = make([]T, k)
		for i := range want {
			want[i] = reduceRef(inputs, i, s.op)
		}
	case algorithms.CollReduceScatter:
		want = make([]T, k)
		for i := range want {
			want[i] = reduceRef(inputs, r*k+i, s.op)
		}
	case algorithms.CollAllGather:
		for _, in := range inputs {
			want = append(want, in...)
		}
	case algorithms.CollBroadcast:
		want = inputs[s.root]
	case algorithms.CollAllToAll:
		for j := 0; j < n; j++ {
			want = append(want, inputs[j][r*k:(r+1)*k]...)
		}
	}
	return want, true
}

// checkType dispatches check on a DataType.
func checkType(t *testing.T, dt collective.DataType, comms []*collective.Comm, s caseSpec) {
	t.Helper()
	switch dt {
	case collective.Int8:
		check[int8](t, comms, s)
	case collective.Uint8:
		check[uint8](t, comms, s)
	case collective.Int32:
		check[int32](t, comms, s)
	case collective.Uint32:
		check[uint32](t, comms, s)
	case collective.Int64:
		check[int64](t, comms, s)
	case collective.Uint64:
		check[uint64](t, comms, s)
	case collective.Float16Type:
		check[collective.Float16](t, comms, s)
	case collective.Float32:
		check[float32](t, comms, s)
	case collective.Float64:
		check[float64](t, comms, s)
	case collective.BFloat16Type:
		check[collective.BFloat16](t, comms, s)
	}
}

var allTypes = []collective.DataType{
	collective.Int8, collective.Uint8, collective.Int32, collective.Uint32, collective.Int64,
	collective.Uint64, collective.Float16Type, collective.Float32, collective.Float64, collective.BFloat16Type,
}

// TestAllReduceEveryTypeOpAlgorithm checks every type × operator ×
// algorithm on rank counts that are and are not powers of two.
func TestAllReduceEveryTypeOpAlgorithm(t *testing.T) {
	algos := []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot}
	for _, n := range []int{1, 2, 3, 4, 6} {
		for _, a := range algos {
			t.Run(fmt.Sprintf("nranks=%d/algo=%v", n, a), func(t *testing.T) {
				comms := newGroup(t, n, collective.WithAlgorithm(a))
				seed := uint64(n*100 + int(a))
				for _, dt := range allTypes {
					for _, op := range allOps {
						for _, count := range []int{0, 1, 2*n + 1, 1000} {
							checkType(t, dt, comms, caseSpec{coll: algorithms.CollAllReduce, op: op, count: count, inPlace: count%2 == 1, seed: seed})
							seed++
						}
					}
				}
			})
		}
	}
}

// TestEveryCollectiveEveryType checks the other collectives with every
// type, in place and out of place.
func TestEveryCollectiveEveryType(t *testing.T) {
	colls := []algorithms.Collective{algorithms.CollReduceScatter, algorithms.CollAllGather,
		algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllToAll}
	for _, n := range []int{1, 2, 3, 4, 5} {
		comms := newGroup(t, n, collective.WithChannels(min(n, 2)))
		for _, coll := range colls {
			t.Run(fmt.Sprintf("nranks=%d/coll=%v", n, coll), func(t *testing.T) {
				seed := uint64(n * 1000)
				for ti, dt := range allTypes {
					for _, count := range []int{0, 1, 3, 257} {
						op := allOps[(ti+count)%len(allOps)]
						s := caseSpec{coll: coll, op: op, count: count, root: (ti + count) % n,
							inPlace: coll != algorithms.CollAllToAll && ti%2 == 0, seed: seed}
						checkType(t, dt, comms, s)
						seed++
					}
				}
			})
		}
	}
}

// TestLargeAndPipelined runs sizes that need many pieces and slices, with
// several channels, so the pipeline and the channel split are exercised.
func TestLargeAndPipelined(t *testing.T) {
	count := 3<<20 + 7 // 12 MiB of float32, not a multiple of anything
	if testing.Short() {
		count = 1<<18 + 7
	}
	for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.Rabenseifner, algorithms.RecDoubling, algorithms.OneShot} {
		t.Run("algo="+a.String(), func(t *testing.T) {
			comms := newGroup(t, 3, collective.WithAlgorithm(a), collective.WithChannels(2), collective.WithChunkSize(64<<10), collective.WithSlots(4, 16<<10))
			check[float32](t, comms, caseSpec{coll: algorithms.CollAllReduce, op: collective.Sum, count: count, seed: 1})
		})
	}
	comms := newGroup(t, 4, collective.WithChannels(3), collective.WithSlots(2, 4096))
	for _, coll := range []algorithms.Collective{algorithms.CollReduceScatter, algorithms.CollAllGather, algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllToAll} {
		check[float64](t, comms, caseSpec{coll: coll, op: collective.Max, count: count / 16, root: 3, seed: 2})
	}
}

func TestSendRecv(t *testing.T) {
	ctx := context.Background()
	comms := newGroup(t, 4)
	const count = 300_001 // larger than the slots: the receiver must meet it
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		prev := (r + 3) % 4 // ringShift receives from the previous rank
		out := make([]int64, count)
		for i := range out {
			out[i] = int64(r*count + i)
		}
		in := make([]int64, count)
		if err := ringShift(ctx, c, out, in); err != nil {
			return err
		}
		for i, v := range in {
			if v != int64(prev*count+i) {
				return fmt.Errorf("element %d = %d, want %d", i, v, prev*count+i)
			}
		}
		return nil
	})
	noErrors(t, errs)
}

func TestAsyncOperationsCompleteInIssueOrder(t *testing.T) {
	ctx := context.Background()
	comms := newGroup(t, 3)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		// Issue several operations without waiting; each depends on the
		// data of the one before only through issue order.
		bufs := make([][]float64, 6)
		reqs := make([]*collective.Request, len(bufs))
		for i := range bufs {
			bufs[i] = make([]float64, 10_000*(i+1))
			for j := range bufs[i] {
				bufs[i][j] = float64(r + i)
			}
			var err error
			reqs[i], err = collective.StartAllReduce(ctx, c, bufs[i], bufs[i], collective.Sum)
			if err != nil {
				return err
			}
		}
		// A blocking operation issued last runs after all of them.
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		for i, req := range reqs {
			select {
			case <-req.Done():
			default:
				return fmt.Errorf("request %d not done after a later blocking operation returned", i)
			}
			if err := req.Wait(ctx); err != nil {
				return err
			}
			want := float64(3*i + 3)
			for j, v := range bufs[i] {
				if v != want {
					return fmt.Errorf("op %d element %d = %v, want %v", i, j, v, want)
				}
			}
		}
		return nil
	})
	noErrors(t, errs)
}

func TestRanksAgreeBitForBit(t *testing.T) {
	// Random floats are not exact; whatever the algorithm, every rank must
	// end with the same bits.
	ctx := context.Background()
	for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot} {
		comms := newGroup(t, 5, collective.WithAlgorithm(a))
		outs := make([][]float32, 5)
		errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			buf := make([]float32, 4099)
			for i := range buf {
				buf[i] = rng.Float32()*2 - 1
			}
			outs[r] = buf
			return collective.AllReduce(ctx, c, buf, buf, collective.Sum)
		})
		noErrors(t, errs)
		for r := 1; r < 5; r++ {
			require.Equal(t, outs[0], outs[r], "algo %v: rank %d differs from rank 0", a, r)
		}
	}
}
