package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/shm"
)

// shmEngines makes n engines over shared-memory endpoints in this
// process that have joined their board, as Init does when every rank is
// on one host.
func shmEngines(t *testing.T, n int, cfg Config) []*Engine {
	t.Helper()
	eps := shmEndpoints(t, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r, ep := range eps {
		wg.Go(func() { errs[r] = ep.JoinBoard(context.Background()) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	return boardEngines(t, eps, cfg)
}

func boardEngines(t *testing.T, eps []*shm.Endpoint, cfg Config) []*Engine {
	t.Helper()
	if cfg.MaxChannels == 0 {
		cfg.MaxChannels = 2
	}
	cfg.Link = testLink
	es := make([]*Engine, len(eps))
	for r, ep := range eps {
		var err error
		es[r], err = New(r, len(eps), ep, cfg)
		require.NoError(t, err)
		require.NotNil(t, es[r].board)
	}
	return es
}

func shmEndpoints(t *testing.T, n int) []*shm.Endpoint {
	t.Helper()
	lns := make([]*net.UnixListener, n)
	addrs := make([]string, n)
	for r := range lns {
		ln, err := shm.Listen()
		require.NoError(t, err)
		lns[r], addrs[r] = ln, ln.Addr().String()
	}
	eps := make([]*shm.Endpoint, n)
	for r := range eps {
		ep, err := shm.New(shm.Options{Rank: r, NRanks: n, Peers: addrs, Secret: []byte("0123456789abcdef"), Listener: lns[r], Slots: 4, SlotSize: 8192})
		require.NoError(t, err)
		eps[r] = ep
		t.Cleanup(func() { ep.Close(nil) })
	}
	return eps
}

// f32Bytes is v's memory.
func f32Bytes(v []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)) }

// TestBoardJoinedInTheBackground: endpoints that StartBoard (as Init and
// Split do) hand the engine a board still being joined; the first
// collective waits for it and runs there, and so does every later one.
func TestBoardJoinedInTheBackground(t *testing.T) {
	const n = 3
	eps := shmEndpoints(t, n)
	for _, ep := range eps[1:] {
		require.NoError(t, ep.StartBoard(0))
	}
	// Rank 0, which hands the board over, has not started: rank 1's
	// engine gets a board still being joined.
	e1, err := New(1, n, eps[1], Config{MaxChannels: 2, Link: testLink})
	require.NoError(t, err)
	joiner, joining := e1.board.(transport.BoardJoiner)
	require.True(t, joining, "the engine holds the board being joined")
	require.NoError(t, eps[0].StartBoard(0))
	es := boardEngines(t, eps, Config{})
	es[1] = e1
	for round := range 3 {
		outs := make([][]float32, n)
		pls, errs := runPlans(es, context.Background(), func(r int) *Op {
			outs[r] = []float32{float32(r + round), 1}
			return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: 2,
				In: memory.HostBuffer(f32Bytes(outs[r])), Out: memory.HostBuffer(f32Bytes(outs[r]))}
		})
		require.NoError(t, errors.Join(errs...))
		for r := range n {
			require.True(t, pls[r].OnBoard(), "round %d, rank %d on the board", round, r)
			require.Equal(t, []float32{float32(3 + 3*round), 3}, outs[r], "round %d, rank %d", round, r)
		}
	}
	// Once joined, the engine runs on the joined board itself, and the
	// joining board is ready even to a context that has ended. (Rank 1's:
	// it held the board while it was being joined. Rank 0's engine may
	// have come after the join and hold the plain board.)
	_, still := e1.board.(transport.BoardJoiner)
	require.False(t, still, "the engine moved to the joined board")
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, joiner.Joined(ended))
}

// TestBoardJoinFailsWhenAPeerGoes: rank 0 never hands the board over;
// rank 1's first collective waits for it until the communicator learns
// that rank 0 has gone (PeerGone, from the root's watch), then fails at
// once, naming rank 0.
func TestBoardJoinFailsWhenAPeerGoes(t *testing.T) {
	const n = 2
	eps := shmEndpoints(t, n)
	require.NoError(t, eps[1].StartBoard(0)) // and never rank 0
	e, err := New(1, n, eps[1], Config{MaxChannels: 2, Link: testLink})
	require.NoError(t, err)
	go func() {
		time.Sleep(50 * time.Millisecond)
		e.PeerGone(0, errors.New("rank 0 closed its communicator"))
	}()
	start := time.Now()
	v := []float32{1}
	_, err = e.Run(context.Background(), &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: 1,
		In: memory.HostBuffer(f32Bytes(v)), Out: memory.HostBuffer(f32Bytes(v))})
	var se *StepError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 0, se.Peer)
	require.ErrorContains(t, err, "rank 0 closed its communicator")
	require.Less(t, time.Since(start), 5*time.Second, "at once, not at the setup timeout")
	eps[1].Close(err) // an abort: it does not wait for the join, as a graceful close would
}

// runPlans runs op(r) on every engine concurrently and returns the plans.
// A rank that fails aborts every endpoint, as the communicator's abort
// reaches every rank through the bootstrap root.
func runPlans(es []*Engine, ctx context.Context, op func(r int) *Op) ([]Plan, []error) {
	pls := make([]Plan, len(es))
	errs := make([]error, len(es))
	var wg sync.WaitGroup
	for r, e := range es {
		wg.Go(func() {
			var pl *Plan
			pl, errs[r] = e.Run(ctx, op(r))
			pls[r] = *pl
			if errs[r] != nil {
				for _, e := range es {
					e.ep.Close(fmt.Errorf("rank %d aborts: %w", r, errs[r]))
				}
			}
		})
	}
	wg.Wait()
	return pls, errs
}

// TestBoardAllReduceMatchesTheConnections: every type and operator, in
// place and not, on the board and through the connections' one-shot
// (GOCCL_ALGO=oneshot), which reduces in the same order with the same
// kernels: the results must agree bit for bit, on every rank.
func TestBoardAllReduceMatchesTheConnections(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			onBoard := shmEngines(t, n, Config{})
			onConns := shmEngines(t, n, Config{Algo: algorithms.OneShot})
			rng := rand.New(rand.NewPCG(uint64(n), 1))
			for typ := kernels.Type(0); typ.Valid(); typ++ {
				for red := kernels.Op(0); red.Valid(); red++ {
					for _, inPlace := range []bool{false, true} {
						count := 1 + rng.IntN(shm.BoardMax/typ.Size())
						ins := make([][]byte, n)
						for r := range ins {
							ins[r] = make([]byte, count*typ.Size())
							for i := range ins[r] {
								ins[r][i] = byte(rng.IntN(5)) // small values: no overflow to argue about
							}
						}
						run := func(es []*Engine) ([][]byte, []Plan) {
							outs := make([][]byte, n)
							pls, errs := runPlans(es, context.Background(), func(r int) *Op {
								in := bytes.Clone(ins[r])
								outs[r] = in
								if !inPlace {
									outs[r] = make([]byte, len(in))
								}
								return &Op{Coll: algorithms.CollAllReduce, Type: typ, Red: red, Count: count, In: memory.HostBuffer(in), Out: memory.HostBuffer(outs[r])}
							})
							require.NoError(t, errors.Join(errs...), "%v %v", typ, red)
							return outs, pls
						}
						got, pls := run(onBoard)
						want, wpls := run(onConns)
						require.Same(t, &boardSched, pls[0].Sched, "%v %v ran on the board", typ, red)
						require.NotSame(t, &boardSched, wpls[0].Sched)
						for r := range n {
							require.Equal(t, want[r], got[r], "%v %v in place %v, %d elements, rank %d", typ, red, inPlace, count, r)
							require.Equal(t, got[0], got[r], "ranks agree bit for bit")
						}
					}
				}
			}
		})
	}
}

// TestBoardMismatches: ranks that disagree fail at once, whether both are
// on the board or one runs the operation over its connections.
func TestBoardMismatches(t *testing.T) {
	small := func(count int, red kernels.Op) *Op {
		return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: red, Count: count,
			In: memory.HostBuffer(make([]byte, 4*count)), Out: memory.HostBuffer(make([]byte, 4*count))}
	}
	for _, c := range []struct {
		name  string
		odd   func() *Op // rank 1's operation; the others run small(4, Sum)
		wants string     // in some rank's error
	}{
		{"count", func() *Op { return small(5, kernels.Sum) }, "with a different count"},
		{"operator", func() *Op { return small(4, kernels.Max) }, "allreduce(float32, max)"},
		{"connections", func() *Op { return small(4096, kernels.Sum) }, "did not post operation 0 on the shared board, where this rank waits for 16 bytes: both called allreduce(float32, sum), with a different count"},
		{"broadcast", func() *Op {
			b := make([]byte, 16)
			return &Op{Coll: algorithms.CollBroadcast, Type: kernels.Float32, Count: 4, In: memory.HostBuffer(b), Out: memory.HostBuffer(b)}
		}, "broadcast(float32)"}, // both on the board now: named by rank 1 (it called allreduce, this rank broadcast) or by the others (it called broadcast)
	} {
		t.Run(c.name, func(t *testing.T) {
			es := shmEngines(t, 3, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			_, errs := runPlans(es, ctx, func(r int) *Op {
				if r == 1 {
					return c.odd()
				}
				return small(4, kernels.Sum)
			})
			own, found := 0, false
			for r, err := range errs {
				require.Error(t, err, "rank %d", r)
				var me *MismatchError
				if errors.As(err, &me) && !errors.Is(err, transport.ErrClosed) { // its own, not an abort's cause
					own++
					if r != 1 {
						require.Equal(t, 1, me.Peer, "rank %d names the odd rank", r)
					}
				}
				found = found || bytes.Contains([]byte(err.Error()), []byte(c.wants))
				t.Logf("rank %d: %v", r, err)
			}
			require.Positive(t, own, "some rank finds the mismatch itself")
			require.True(t, found, "no rank's error says %q", c.wants)
			require.Less(t, time.Since(start), 5*time.Second, "at once, not at a timeout")
		})
	}
}

// TestRepeatedBroadcastStillChecksItsRoot: a reader whose broadcast
// repeats the last board operation's key goes straight to the board
// (boardAgain), and still finds at once a root that called something
// else (here a float64 broadcast of as many bytes), and reads the root's
// data as it was before that.
func TestRepeatedBroadcastStillChecksItsRoot(t *testing.T) {
	es := shmEngines(t, 2, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bcast := func(typ kernels.Type, buf []byte) *Op {
		return &Op{Coll: algorithms.CollBroadcast, Type: typ, Count: 4, In: memory.HostBuffer(buf), Out: memory.HostBuffer(buf)}
	}
	require.False(t, es[1].boardAgain(bcast(kernels.Float32, make([]byte, 16))), "nothing has run on the board yet")
	for i := range 5 {
		bufs := [][]byte{bytes.Repeat([]byte{byte(i + 1)}, 16), make([]byte, 16)}
		_, errs := runPlans(es, ctx, func(r int) *Op { return bcast(kernels.Float32, bufs[r]) })
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		require.Equal(t, bufs[0], bufs[1], "broadcast %d", i)
		require.True(t, es[1].boardAgain(bcast(kernels.Float32, bufs[1])), "the next one goes straight to the board")
	}
	start := time.Now()
	_, errs := runPlans(es, ctx, func(r int) *Op {
		if r == 0 {
			op := bcast(kernels.Float64, make([]byte, 16))
			op.Count = 2 // as many bytes: only the signature tells
			return op
		}
		return bcast(kernels.Float32, make([]byte, 16))
	})
	var me *MismatchError
	require.ErrorAs(t, errs[1], &me, "the reader names the root")
	require.Equal(t, 0, me.Peer)
	require.Contains(t, errs[1].Error(), "broadcast(float64)")
	require.Less(t, time.Since(start), 5*time.Second, "at once, not at a timeout")
}

// TestRepeatedReduceStillChecksItsPosters: a reduce's root whose
// operation repeats the last board operation's key goes straight to
// runOnBoard (boardAgain) and still finds at once a poster that called
// another operator.
func TestRepeatedReduceStillChecksItsPosters(t *testing.T) {
	es := shmEngines(t, 2, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reduce := func(red kernels.Op, r int) *Op {
		v := []float32{float32(r + 1), 2, 3, 4}
		return &Op{Coll: algorithms.CollReduce, Type: kernels.Float32, Red: red, Count: 4,
			In: memory.HostBuffer(f32Bytes(v)), Out: memory.HostBuffer(make([]byte, 16))}
	}
	for range 5 {
		ops := []*Op{reduce(kernels.Sum, 0), reduce(kernels.Sum, 1)}
		_, errs := runPlans(es, ctx, func(r int) *Op { return ops[r] })
		require.NoError(t, errors.Join(errs...))
		require.Equal(t, f32Bytes([]float32{3, 4, 6, 8}), ops[0].Out.Bytes(), "the root's sum")
		require.True(t, es[0].boardAgain(reduce(kernels.Sum, 0)), "the next one goes straight to the board")
	}
	start := time.Now()
	_, errs := runPlans(es, ctx, func(r int) *Op {
		if r == 1 {
			return reduce(kernels.Max, 1)
		}
		return reduce(kernels.Sum, 0)
	})
	var me *MismatchError
	require.ErrorAs(t, errs[0], &me, "the root names the poster")
	require.Equal(t, 1, me.Peer)
	require.Less(t, time.Since(start), 5*time.Second, "at once, not at a timeout")
}

// TestBoardZeroCountThenWork: a rank that calls a zero-count all-reduce
// (a no-op) where the others call a real one is named when it moves on.
func TestBoardZeroCountThenWork(t *testing.T) {
	es := shmEngines(t, 2, Config{})
	errs := make([]error, 2)
	var wg sync.WaitGroup
	op := func(count int) *Op {
		return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Int32, Red: kernels.Sum, Count: count,
			In: memory.HostBuffer(make([]byte, 4*count)), Out: memory.HostBuffer(make([]byte, 4*count))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	wg.Go(func() {
		if _, errs[0] = es[0].Run(ctx, op(2)); errs[0] != nil {
			es[0].ep.Close(errs[0]) // as the communicator aborts
		}
	})
	wg.Go(func() {
		if _, errs[1] = es[1].Run(ctx, op(0)); errs[1] == nil {
			_, errs[1] = es[1].Run(ctx, op(2))
		}
	})
	wg.Wait()
	var me *MismatchError
	require.ErrorAs(t, errs[0], &me)
	require.Equal(t, 1, me.Peer)
	// Rank 0 finds either rank 1's mark for operation 0 or, if rank 1 has
	// already moved on, that it went past.
	require.Regexp(t, `rank 1 (did not post operation 0 on the shared board, where this rank waits for 8 bytes: both called allreduce\(int32, sum\), with a different count|went past operation 0 without posting it on the shared board)`, errs[0].Error())
	require.ErrorContains(t, errs[1], "rank 0 aborted", "the zero-count rank learns of it in its next operation")
	require.Less(t, time.Since(start), 5*time.Second)
	t.Log(errs[0])
	t.Log(errs[1])
}

// TestBoardWaitIsReported: a rank waiting on the board for a peer that
// never comes says whom it waits for, in Progress and in its error.
func TestBoardWaitIsReported(t *testing.T) {
	es := shmEngines(t, 3, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	progress := make(chan []Progress, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		progress <- es[0].Progress()
	}()
	b := make([]byte, 8)
	_, err := es[0].Run(ctx, &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float64, Red: kernels.Sum, Count: 1, In: memory.HostBuffer(b), Out: memory.HostBuffer(b)})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var se *StepError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 1, se.Peer)
	require.Equal(t, []Progress{{Channel: 0, Step: 0, Kind: algorithms.SendRecv, Peer: 1}}, <-progress)
}

// TestForcedAlgorithmStaysOffTheBoard: GOCCL_ALGO picks the connections'
// algorithm even where the board would serve.
func TestForcedAlgorithmStaysOffTheBoard(t *testing.T) {
	es := shmEngines(t, 2, Config{Algo: algorithms.Ring})
	pls, errs := runPlans(es, context.Background(), func(r int) *Op {
		b := make([]byte, 8)
		return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: 2, In: memory.HostBuffer(b), Out: memory.HostBuffer(b)}
	})
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, algorithms.Ring, pls[0].Algo)
}

// TestBoardMovesSmallCollectives: broadcast (from every root), all-gather
// and reduce-scatter small enough for the board run there, in place and
// not, and give what the connections' ring gives (GOCCL_ALGO=ring keeps
// them off the board), bit for bit on every rank; one a byte too large
// for the board runs over the connections.
func TestBoardMovesSmallCollectives(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			onBoard := shmEngines(t, n, Config{})
			onConns := shmEngines(t, n, Config{Algo: algorithms.Ring})
			rng := rand.New(rand.NewPCG(uint64(n), 2))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			type tc struct {
				coll  algorithms.Collective
				root  int
				count int // elements per block
			}
			var cases []tc
			for root := range n {
				cases = append(cases, tc{algorithms.CollBroadcast, root, 1 + rng.IntN(shm.BoardMax/4)},
					tc{algorithms.CollReduce, root, 1 + rng.IntN(shm.BoardMax/4)})
			}
			cases = append(cases, tc{algorithms.CollAllGather, 0, 1 + rng.IntN(shm.BoardMax/4)},
				tc{algorithms.CollReduceScatter, 0, 1 + rng.IntN(shm.BoardMax/4/n)})
			for _, c := range cases {
				for _, inPlace := range []bool{false, true} {
					inLen, outLen := c.count, c.count
					switch c.coll {
					case algorithms.CollAllGather:
						outLen = n * c.count
					case algorithms.CollReduceScatter:
						inLen = n * c.count
					}
					ins := make([][]byte, n)
					for r := range ins {
						ins[r] = make([]byte, 4*inLen)
						for i := 0; i < inLen; i++ {
							// Whole numbers: the board folds in rank order, the ring
							// in ring order; with exact sums the two agree.
							binary.LittleEndian.PutUint32(ins[r][4*i:], math.Float32bits(float32(rng.IntN(201)-100)))
						}
					}
					run := func(es []*Engine) ([][]byte, []Plan) {
						outs := make([][]byte, n)
						ops := make([]*Op, n)
						for r := range n {
							in := append([]byte(nil), ins[r]...)
							var inBuf, outBuf memory.Buffer
							switch {
							case !inPlace:
								inBuf, outBuf = memory.HostBuffer(in), memory.HostBuffer(make([]byte, 4*outLen))
							case c.coll == algorithms.CollAllGather:
								out := make([]byte, 4*outLen)
								copy(out[4*r*c.count:], in)
								outBuf = memory.HostBuffer(out)
								inBuf = outBuf.Slice(4*r*c.count, 4*(r+1)*c.count)
							case c.coll == algorithms.CollReduceScatter:
								inBuf = memory.HostBuffer(in)
								outBuf = inBuf.Slice(4*r*c.count, 4*(r+1)*c.count)
							default:
								inBuf, outBuf = memory.HostBuffer(in), memory.HostBuffer(in)
							}
							if c.coll == algorithms.CollBroadcast && r != c.root && !inPlace {
								inBuf = memory.Buffer{}
							}
							if c.coll == algorithms.CollReduce && r != c.root {
								outBuf = memory.Buffer{} // not written (collective.Reduce passes none)
							}
							ops[r] = &Op{Coll: c.coll, Type: kernels.Float32, Red: kernels.Sum, Count: c.count, Root: c.root, In: inBuf, Out: outBuf}
						}
						pls, errs := runPlans(es, ctx, func(r int) *Op { return ops[r] })
						require.NoError(t, errors.Join(errs...), "%v root %d in place %v", c.coll, c.root, inPlace)
						for r := range n {
							outs[r] = append([]byte(nil), ops[r].Out.Bytes()...)
						}
						return outs, pls
					}
					got, pls := run(onBoard)
					want, wpls := run(onConns)
					require.Same(t, &boardSched, pls[0].Sched, "%v on the board", c.coll)
					require.NotSame(t, &boardSched, wpls[0].Sched)
					for r := range n {
						require.Equal(t, want[r], got[r], "%v root %d in place %v, rank %d", c.coll, c.root, inPlace, r)
					}
				}
			}
			// A byte over the board's size: the connections.
			big := shm.BoardMax/4 + 1
			pls, errs := runPlans(onBoard, ctx, func(r int) *Op {
				b := make([]byte, 4*big)
				return &Op{Coll: algorithms.CollBroadcast, Type: kernels.Float32, Count: big, In: memory.HostBuffer(b), Out: memory.HostBuffer(b)}
			})
			require.NoError(t, errors.Join(errs...))
			require.NotSame(t, &boardSched, pls[0].Sched)
		})
	}
}

// TestBoardReducesRunAhead: reduces on the board, many more than the
// board's entries, each rank running the whole sequence on its own (so
// the posters run ahead of the root as far as the entries let them),
// roots in turn (a hundred operations each, so that the posters must learn
// of each other from their marks) and an all-reduce now and then. Every
// root's result is checked; a poster that overwrote an entry its root had
// not read yet would show as a wrong sum, a lost mark as a timeout.
func TestBoardReducesRunAhead(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			es := shmEngines(t, n, Config{})
			require.NoError(t, runAheadOnBoard(es, 300, func(i int) (algorithms.Collective, int) {
				root := (i / 100) % n // runs of a hundred with one root: the others post ahead
				if i%150 == 149 {
					return algorithms.CollAllReduce, root
				}
				return algorithms.CollReduce, root
			}, nil))
		})
	}
}

// runAheadOnBoard runs ops collectives of 8 float32 on es, each rank the
// whole sequence on its own goroutine within 20 s: op says operation i's
// collective (broadcast, reduce or all-reduce) and root, and pause, if
// not nil, runs before rank r's operation i. Every result is checked
// (a broadcast's is its root's input, a reduction's the sum of all
// inputs); an operation off the board is an error.
func runAheadOnBoard(es []*Engine, ops int, op func(i int) (algorithms.Collective, int), pause func(r, i, root int)) error {
	const count = 8
	n := len(es)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	val := func(r, i, k int) float32 { return float32(r*1000 + i*10 + k) }
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, e := range es {
		wg.Go(func() {
			for i := range ops {
				coll, root := op(i)
				if pause != nil {
					pause(r, i, root)
				}
				in := make([]float32, count)
				for k := range in {
					in[k] = val(r, i, k)
				}
				out := make([]float32, count)
				o := &Op{Coll: coll, Type: kernels.Float32, Red: kernels.Sum, Count: count, Root: root,
					In: memory.HostBuffer(f32Bytes(in)), Out: memory.HostBuffer(f32Bytes(out))}
				if coll == algorithms.CollReduce && r != root {
					o.Out = memory.Buffer{}
				}
				pl, err := e.Run(ctx, o)
				if err == nil && !pl.OnBoard() {
					err = fmt.Errorf("operation %d did not run on the board", i)
				}
				if err != nil {
					errs[r] = fmt.Errorf("rank %d, operation %d: %w", r, i, err)
					return
				}
				if o.Out.Len() == 0 {
					continue
				}
				for k := range out {
					want := val(root, i, k)
					if coll != algorithms.CollBroadcast {
						want = 0
						for q := range n {
							want += val(q, i, k)
						}
					}
					if out[k] != want {
						errs[r] = fmt.Errorf("rank %d, operation %d (%v, root %d): element %d is %v, want %v", r, i, coll, root, k, out[k], want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestBoardBroadcastsRunAhead: broadcasts, whose readers mark the board
// only on multiples of its MarkEvery, with roots in runs of a hundred
// (so that a root runs ahead of its readers as far as the entries let it)
// and a reduce or all-reduce now and then, one reader pausing every few
// dozen operations (so that its root waits for its marks at the reuse
// limit). Every reader's result is checked: a root that overwrote an
// entry its reader had not read would show as a wrong value or a
// mismatch, a missing mark as a timeout.
func TestBoardBroadcastsRunAhead(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			es := shmEngines(t, n, Config{})
			require.Greater(t, es[0].markEvery, uint64(1), "the shm board marks sparsely")
			require.NoError(t, runAheadOnBoard(es, 400, func(i int) (algorithms.Collective, int) {
				root := (i / 100) % n
				switch {
				case i%150 == 149:
					return algorithms.CollAllReduce, root
				case i%90 == 89:
					return algorithms.CollReduce, root
				}
				return algorithms.CollBroadcast, root
			}, func(r, i, root int) {
				if r == (root+1)%n && i%37 == 0 {
					time.Sleep(2 * time.Millisecond) // a slow reader: its root reaches the reuse limit
				}
			}))
		})
	}
}
