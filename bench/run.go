package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goccl/goccl/collective"
)

// Measure is one placement's (out-of-place or in-place) result at one size.
type Measure struct {
	TimeUs float64 `json:"timeUs"` // per operation, aggregated over ranks (Options.Agg)
	AlgBW  float64 `json:"algbw"`  // GB/s: bytes / time
	BusBW  float64 `json:"busbw"`  // GB/s: algbw × BusFactor
	Iters  int     `json:"iters"`
	// Wrong counts wrong output elements over all ranks; -1 when not checked.
	Wrong int64 `json:"wrong"`
}

// Row is one line of the table: one size of one type, operator and root.
type Row struct {
	Bytes      int64    `json:"size"`  // nccl-tests' size column (see geometry)
	Count      int      `json:"count"` // elements per rank (per block for the gathering collectives)
	Type       string   `json:"type"`
	RedOp      string   `json:"redop"` // "none" where nothing reduces
	Root       int      `json:"root"`  // -1 where there is none
	OutOfPlace Measure  `json:"outOfPlace"`
	InPlace    *Measure `json:"inPlace"` // nil: no in-place form (printed N/A)
	// Pick is the plan goccl's tuner chose at this size ("ring/1ch",
	// Comm.Choose), as goccl-perf prints under its table; empty for a
	// peer's table.
	Pick string `json:"pick,omitempty"`
}

// Sink receives rows as they are measured; rank 0's Run gets one.
type Sink interface {
	Row(Row)
	// Progress reports that the sweep is at step i of total, about to
	// measure what label says.
	Progress(i, total int, label string)
}

// ErrWrong is wrapped by Run's error when any checked element was wrong.
var ErrWrong = errors.New("wrong results")

// geometry is the shape of one size of a collective on n ranks: buffer
// lengths in elements, the count column and the size column (nccl-tests'
// conventions: the full vector for all-reduce, broadcast, reduce and
// sendrecv; the send buffer of reduce-scatter; the receive buffer of
// all-gather and alltoall).
type geometry struct {
	sendLen, recvLen int
	count            int // the count column
	blk              int // elements per rank block (RS, AG, A2A)
	bytes            int64
}

func geometryOf(c Coll, n, esize int, size int64) geometry {
	elems := int(size / int64(esize))
	switch c {
	case ReduceScatter, AllGather, AllToAll:
		k := elems / n
		g := geometry{count: k, blk: k, bytes: int64(k*n) * int64(esize)}
		switch c {
		case ReduceScatter:
			g.sendLen, g.recvLen = k*n, k
		case AllGather:
			g.sendLen, g.recvLen = k, k*n
		default:
			g.sendLen, g.recvLen = k*n, k*n
		}
		return g
	}
	return geometry{sendLen: elems, recvLen: elems, count: elems, bytes: int64(elems) * int64(esize)}
}

// Run sweeps o on c. Every rank calls it with the same Options; rank 0
// passes a Sink (others nil) that gets each row as soon as it is measured.
// It returns the rows (on every rank). The error wraps ErrWrong when any
// element was wrong; an operation's failure ends the sweep.
func Run(ctx context.Context, c *collective.Comm, o Options, sink Sink) ([]Row, error) {
	o.defaults()
	if err := o.Validate(c.Size()); err != nil {
		return nil, err
	}
	var rows []Row
	var wrong int64
	steps := stepsOf(o, c.Size())
	st := &stepper{total: steps}
	for _, t := range o.Types {
		var err error
		rows, err = runType(ctx, c, o, t, sink, st, rows, &wrong)
		if err != nil {
			return rows, err
		}
	}
	if wrong > 0 {
		return rows, fmt.Errorf("bench: %d wrong elements: %w", wrong, ErrWrong)
	}
	return rows, nil
}

type stepper struct{ i, total int }

// stepsOf counts the rows a sweep will measure, for progress reports.
func stepsOf(o Options, n int) int {
	roots := 1
	if o.Coll.rooted() && o.Root == AllRoots {
		roots = n
	}
	return len(o.Types) * len(o.Ops) * roots * len(o.sizes())
}

func runType(ctx context.Context, c *collective.Comm, o Options, t collective.DataType, sink Sink, st *stepper, rows []Row, wrong *int64) ([]Row, error) {
	switch t {
	case collective.Int8:
		return sweepType[int8](ctx, c, o, sink, st, rows, wrong)
	case collective.Uint8:
		return sweepType[uint8](ctx, c, o, sink, st, rows, wrong)
	case collective.Int32:
		return sweepType[int32](ctx, c, o, sink, st, rows, wrong)
	case collective.Uint32:
		return sweepType[uint32](ctx, c, o, sink, st, rows, wrong)
	case collective.Int64:
		return sweepType[int64](ctx, c, o, sink, st, rows, wrong)
	case collective.Uint64:
		return sweepType[uint64](ctx, c, o, sink, st, rows, wrong)
	case collective.Float16Type:
		return sweepType[collective.Float16](ctx, c, o, sink, st, rows, wrong)
	case collective.Float32:
		return sweepType[float32](ctx, c, o, sink, st, rows, wrong)
	case collective.Float64:
		return sweepType[float64](ctx, c, o, sink, st, rows, wrong)
	case collective.BFloat16Type:
		return sweepType[collective.BFloat16](ctx, c, o, sink, st, rows, wrong)
	case collective.Float8E4M3Type:
		return sweepType[collective.Float8E4M3](ctx, c, o, sink, st, rows, wrong)
	case collective.Float8E5M2Type:
		return sweepType[collective.Float8E5M2](ctx, c, o, sink, st, rows, wrong)
	}
	return rows, fmt.Errorf("bench: invalid data type %v", t)
}

// sweeper holds one element type's buffers and settings.
type sweeper[T collective.Number] struct {
	c          *collective.Comm
	o          Options
	t          typed[T]
	n, r       int
	send, recv []T
	reqs       []*collective.Request
	dev        *devSide // nil on host memory; see device.go
}

func sweepType[T collective.Number](ctx context.Context, c *collective.Comm, o Options, sink Sink, st *stepper, rows []Row, wrong *int64) ([]Row, error) {
	dt := collective.TypeOf[T]()
	n := c.Size()
	s := &sweeper[T]{c: c, o: o, t: typedFor[T]().(typed[T]), n: n, r: c.Rank()}
	sizes := o.sizes()
	maxG := geometryOf(o.Coll, n, dt.Size(), sizes[len(sizes)-1])
	sendLen, recvLen := maxG.sendLen, max(maxG.recvLen, maxG.sendLen) // in-place reduce-scatter runs in recv
	if o.Shared {
		// MemAlloc wants one element at least.
		send, err := collective.MemAlloc[T](max(sendLen, 1))
		if err != nil {
			return rows, err
		}
		defer collective.MemFree(send)
		recv, err := collective.MemAlloc[T](max(recvLen, 1))
		if err != nil {
			return rows, err
		}
		defer collective.MemFree(recv)
		s.send, s.recv = send[:sendLen], recv[:recvLen]
	} else {
		s.send, s.recv = make([]T, sendLen), make([]T, recvLen)
		if o.Registered {
			for _, b := range [][]T{s.send, s.recv} {
				if len(b) == 0 {
					continue
				}
				reg, err := collective.Register(b)
				if err != nil {
					return rows, err
				}
				defer reg.Deregister()
			}
		}
	}
	if o.Stream != nil {
		ds, err := newDevSide(o.Stream, len(s.send)*dt.Size(), len(s.recv)*dt.Size())
		if err != nil {
			return rows, err
		}
		defer ds.free()
		s.dev = ds
	}
	roots := []int{o.Root}
	switch {
	case !o.Coll.rooted():
		roots = []int{-1}
	case o.Root == AllRoots:
		roots = roots[:0]
		for r := 0; r < n; r++ {
			roots = append(roots, r)
		}
	}
	for _, op := range o.Ops {
		for _, root := range roots {
			for _, size := range sizes {
				g := geometryOf(o.Coll, n, dt.Size(), size)
				redop := "none"
				if o.Coll.reduces() {
					redop = op.String()
				}
				if sink != nil {
					sink.Progress(st.i, st.total, fmt.Sprintf("%s %d B %s %s root %d", o.Coll, g.bytes, TypeName(dt), redop, root))
				}
				st.i++
				if g.count == 0 {
					continue
				}
				row := Row{Bytes: g.bytes, Count: g.count, Type: TypeName(dt), RedOp: redop, Root: root}
				var err error
				if row.OutOfPlace, err = s.measure(ctx, g, op, root, false); err != nil {
					return rows, fmt.Errorf("%s %d B %s %s out of place: %w", o.Coll, g.bytes, row.Type, redop, err)
				}
				*wrong += max(0, row.OutOfPlace.Wrong)
				if o.Coll.hasInPlace() && !o.OutOfPlaceOnly {
					m, err := s.measure(ctx, g, op, root, true)
					if err != nil {
						return rows, fmt.Errorf("%s %d B %s %s in place: %w", o.Coll, g.bytes, row.Type, redop, err)
					}
					row.InPlace = &m
					*wrong += max(0, m.Wrong)
				}
				rows = append(rows, row)
				if sink != nil {
					sink.Row(row)
				}
			}
		}
	}
	return rows, nil
}

// buffers returns the operation's send and receive slices.
func (s *sweeper[T]) buffers(g geometry, inPlace bool, root int) (in, out []T) {
	r := s.r
	switch s.o.Coll {
	case ReduceScatter:
		if inPlace {
			return s.recv[:g.sendLen], s.recv[r*g.blk : (r+1)*g.blk]
		}
	case AllGather:
		if inPlace {
			return s.recv[r*g.blk : (r+1)*g.blk], s.recv[:g.recvLen]
		}
	case AllReduce, Broadcast, Reduce:
		if inPlace {
			return s.recv[:g.recvLen], s.recv[:g.recvLen]
		}
	}
	return s.send[:g.sendLen], s.recv[:g.recvLen]
}

// call runs or starts one operation. Starting appends its requests.
func (s *sweeper[T]) call(ctx context.Context, in, out []T, op collective.Op, root int, start bool) error {
	c := s.c
	var req *collective.Request
	var err error
	switch s.o.Coll {
	case AllReduce:
		if !start {
			return collective.AllReduce(ctx, c, in, out, op)
		}
		req, err = collective.StartAllReduce(ctx, c, in, out, op)
	case ReduceScatter:
		if !start {
			return collective.ReduceScatter(ctx, c, in, out, op)
		}
		req, err = collective.StartReduceScatter(ctx, c, in, out, op)
	case AllGather:
		if !start {
			return collective.AllGather(ctx, c, in, out)
		}
		req, err = collective.StartAllGather(ctx, c, in, out)
	case Broadcast:
		if !start {
			return collective.Broadcast(ctx, c, in, out, root)
		}
		req, err = collective.StartBroadcast(ctx, c, in, out, root)
	case Reduce:
		if !start {
			return collective.Reduce(ctx, c, in, out, op, root)
		}
		req, err = collective.StartReduce(ctx, c, in, out, op, root)
	case AllToAll:
		if !start {
			return collective.AllToAll(ctx, c, in, out)
		}
		req, err = collective.StartAllToAll(ctx, c, in, out)
	case SendRecv:
		// A ring shift: send to the next rank, receive from the previous.
		// Even ranks send first and odd ranks receive first, so that a
		// send waiting for its receive never closes a cycle (each rank
		// runs its operations in the order it issued them).
		next, prev := (s.r+1)%s.n, (s.r+s.n-1)%s.n
		first, second := func() (*collective.Request, error) { return collective.StartSend(ctx, c, in, next) },
			func() (*collective.Request, error) { return collective.StartRecv(ctx, c, out, prev) }
		if s.r%2 == 1 {
			first, second = second, first
		}
		a, err := first()
		if err != nil {
			return err
		}
		b, err := second()
		if err != nil {
			a.Wait(ctx)
			return err
		}
		if start {
			s.reqs = append(s.reqs, a, b)
			return nil
		}
		if err := a.Wait(ctx); err != nil {
			b.Wait(ctx)
			return err
		}
		return b.Wait(ctx)
	default:
		return fmt.Errorf("unknown collective %q", s.o.Coll)
	}
	if err != nil {
		return err
	}
	s.reqs = append(s.reqs, req)
	return nil
}

// maxInFlight bounds the operations started ahead in non-blocking mode:
// each is a goroutine waiting for its predecessor.
const maxInFlight = 16

// loop runs iters operations and returns this rank's elapsed time.
func (s *sweeper[T]) loop(ctx context.Context, in, out []T, op collective.Op, root, iters int) (time.Duration, error) {
	if s.dev != nil {
		return s.devLoop(ctx, in, out, op, root, iters)
	}
	if err := s.c.Barrier(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	if s.o.Blocking {
		for i := 0; i < iters; i++ {
			if err := s.call(ctx, in, out, op, root, false); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	s.reqs = s.reqs[:0]
	done := 0
	wait := func(upTo int) error {
		for ; done < upTo; done++ {
			if err := s.reqs[done].Wait(ctx); err != nil {
				for _, r := range s.reqs[done+1:] {
					r.Wait(ctx)
				}
				return err
			}
			s.reqs[done] = nil
		}
		return nil
	}
	for i := 0; i < iters; i++ {
		if err := s.call(ctx, in, out, op, root, true); err != nil {
			wait(len(s.reqs))
			return 0, err
		}
		if len(s.reqs)-done > maxInFlight {
			if err := wait(len(s.reqs) - maxInFlight); err != nil {
				return 0, err
			}
		}
	}
	if err := wait(len(s.reqs)); err != nil {
		return 0, err
	}
	d := time.Since(start)
	s.reqs = s.reqs[:0]
	return d, nil
}

// measure times one placement of one size and checks it.
func (s *sweeper[T]) measure(ctx context.Context, g geometry, op collective.Op, root int, inPlace bool) (Measure, error) {
	in, out := s.buffers(g, inPlace, root)
	s.fillForTiming(in, op)
	if s.dev != nil {
		if err := s.upload(ctx); err != nil {
			return Measure{}, err
		}
	}
	if s.o.Warmup > 0 {
		if _, err := s.loop(ctx, in, out, op, root, s.o.Warmup); err != nil {
			return Measure{}, err
		}
	}
	iters := s.o.Iters
	if s.o.Target > 0 {
		// Calibrate like the baseline tools: double k until the slowest
		// rank needs a tenth of the target, then scale (all ranks agree,
		// since they use the slowest rank's time).
		for k := 1; ; k *= 2 {
			d, err := s.loop(ctx, in, out, op, root, k)
			if err != nil {
				return Measure{}, err
			}
			slowest, err := s.combine(ctx, d.Seconds(), AggMax)
			if err != nil {
				return Measure{}, err
			}
			if slowest >= s.o.Target.Seconds()/10 || k >= 1<<20 {
				iters = int(max(5, min(1<<22, int64(float64(k)*s.o.Target.Seconds()/slowest))))
				break
			}
		}
	}
	m := Measure{Iters: iters, Wrong: -1}
	if iters > 0 {
		d, err := s.loop(ctx, in, out, op, root, iters)
		if err != nil {
			return Measure{}, err
		}
		per, err := s.combine(ctx, d.Seconds()/float64(iters), s.o.Agg)
		if err != nil {
			return Measure{}, err
		}
		m.TimeUs = per * 1e6
		if per > 0 {
			m.AlgBW = float64(g.bytes) / per / 1e9
			m.BusBW = m.AlgBW * BusFactor(s.o.Coll, s.n)
		}
	}
	for i := 0; i < s.o.Check; i++ {
		w, err := s.check(ctx, g, op, root, inPlace)
		if err != nil {
			return Measure{}, err
		}
		m.Wrong = max(m.Wrong, 0) + w
		if w > 0 {
			break
		}
	}
	return m, nil
}

// combine aggregates a per-rank value across the ranks.
func (s *sweeper[T]) combine(ctx context.Context, v float64, agg Aggregation) (float64, error) {
	buf := []float64{v}
	var err error
	switch agg {
	case AggRank0:
		err = collective.Broadcast(ctx, s.c, buf, buf, 0)
	case AggAvg:
		err = collective.AllReduce(ctx, s.c, buf, buf, collective.Avg)
	case AggMin:
		err = collective.AllReduce(ctx, s.c, buf, buf, collective.Min)
	default:
		err = collective.AllReduce(ctx, s.c, buf, buf, collective.Max)
	}
	return buf[0], err
}

// fillForTiming gives the timed operations inputs that stay tame when the
// operation runs in place over and over (±1 for prod, which would
// otherwise underflow into slow denormals).
func (s *sweeper[T]) fillForTiming(in []T, op collective.Op) {
	for i := range in {
		v := float64((i+s.r)%11 - 5)
		if op == collective.Prod {
			v = float64(1 - 2*((i+s.r)&1))
		}
		if s.t.unsigned {
			v = float64((i + s.r) % 11)
		}
		in[i] = s.t.from(v)
	}
}

// testCorrupt, set by tests, may change a rank's output after the checked
// operation, to show that wrong elements are counted.
var testCorrupt func(rank int, out any)

// check runs one operation on verifiable inputs and returns the number of
// wrong elements over all ranks.
func (s *sweeper[T]) check(ctx context.Context, g geometry, op collective.Op, root int, inPlace bool) (int64, error) {
	t, c, n, r, k := s.t, s.o.Coll, s.n, s.r, g.blk
	in, out := s.buffers(g, inPlace, root)
	for i := range out {
		out[i] = t.poisonAt(i)
	}
	// Inputs, by global element index (after the poison: in place, the
	// input lies inside the output).
	switch c {
	case AllGather:
		for j := range in {
			in[j] = t.input(c, op, n, r, r*k+j)
		}
	default:
		for j := range in {
			in[j] = t.input(c, op, n, r, j)
		}
	}
	if s.dev != nil {
		if err := s.upload(ctx); err != nil {
			return 0, err
		}
		if err := s.devRun(ctx, in, out, op, root); err != nil {
			return 0, err
		}
		if err := s.download(ctx); err != nil {
			return 0, err
		}
	} else if err := s.call(ctx, in, out, op, root, false); err != nil {
		return 0, err
	}
	if testCorrupt != nil && len(out) > 0 {
		testCorrupt(r, any(out))
	}
	var want func(j int) T
	switch c {
	case AllReduce:
		want = func(j int) T { return t.reduced(c, op, n, j) }
	case Reduce:
		if r != root {
			want = nil // only the root's output is defined
		} else {
			want = func(j int) T { return t.reduced(c, op, n, j) }
		}
	case ReduceScatter:
		want = func(j int) T { return t.reduced(c, op, n, r*k+j) }
	case AllGather:
		want = func(j int) T { return t.input(c, op, n, j/k, j) }
	case Broadcast:
		want = func(j int) T { return t.input(c, op, n, root, j) }
	case AllToAll:
		want = func(j int) T { return t.input(c, op, n, j/k, r*k+j%k) }
	case SendRecv:
		want = func(j int) T { return t.input(c, op, n, (r+n-1)%n, j) }
	}
	var wrong int64
	if want != nil {
		for j, v := range out {
			if t.bits(v) != t.bits(want(j)) {
				wrong++
			}
		}
	}
	total := []int64{wrong}
	if err := collective.AllReduce(ctx, s.c, total, total, collective.Sum); err != nil {
		return 0, err
	}
	return total[0], nil
}
