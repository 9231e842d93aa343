// Package bench is the harness behind goccl-perf: it sweeps a collective
// over message sizes on a communicator, times it the way nccl-tests does,
// checks every result, and prints nccl-tests' table.
//
// Every rank of the communicator calls Run with the same Options; rank 0
// writes the table. Timing: Warmup untimed operations, then Iters timed
// back to back (or as many as fill Target, agreed across ranks); the time
// of a size is the slowest rank's average. algbw is size/time; busbw
// multiplies it by nccl-tests' factor (PERFORMANCE.md there): 2(n-1)/n for
// all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for broadcast.
// Checking runs one more operation on inputs whose result is exact in the
// type (small integers), with the output poisoned first, and counts wrong
// elements on the worst rank.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/goccl/goccl/collective"
)

// Coll names a benchmarked collective.
type Coll string

// The collectives Run knows.
const (
	AllReduce     Coll = "all_reduce"
	ReduceScatter Coll = "reduce_scatter"
	AllGather     Coll = "all_gather"
	Broadcast     Coll = "broadcast"
)

// Options configures a sweep.
type Options struct {
	Coll     Coll
	MinBytes int64
	MaxBytes int64
	Factor   int64         // size multiplier; 0 means 2
	Iters    int           // timed iterations per size; 0 means 20 (nccl-tests' -n)
	Warmup   int           // untimed iterations; 0 means 5 (nccl-tests' -w)
	Target   time.Duration // when > 0, time each size for about this long instead of Iters
	Check    bool
	Root     int
	InPlace  bool
}

// Row is one size's result.
type Row struct {
	Bytes  int64
	Count  int
	Time   time.Duration // per operation, slowest rank
	Iters  int
	AlgBW  float64 // GB/s
	BusBW  float64 // GB/s
	Wrong  int64
	Failed error
}

// busFactor is nccl-tests' bus bandwidth factor.
func busFactor(c Coll, n int) float64 {
	switch c {
	case AllReduce:
		return 2 * float64(n-1) / float64(n)
	case ReduceScatter, AllGather:
		return float64(n-1) / float64(n)
	}
	return 1
}

// Run sweeps o on c and writes nccl-tests' table to out (rank 0 only; out
// may be nil elsewhere). It returns the rows (on every rank) and an error
// if any element was wrong or an operation failed.
func Run(ctx context.Context, c *collective.Comm, o Options, out io.Writer) ([]Row, error) {
	if o.Factor == 0 {
		o.Factor = 2
	}
	if o.Iters == 0 {
		o.Iters = 20
	}
	if o.Warmup == 0 {
		o.Warmup = 5
	}
	n := c.Size()
	if o.MinBytes < 4 || o.MaxBytes < o.MinBytes || o.Factor < 2 {
		return nil, fmt.Errorf("bench: want 4 ≤ min ≤ max bytes and factor ≥ 2, got %d, %d, %d", o.MinBytes, o.MaxBytes, o.Factor)
	}
	maxCount := int(o.MaxBytes / 4)
	send := make([]float32, maxCount)
	recv := make([]float32, maxCount)
	var rows []Row
	var bad error
	for size := o.MinBytes; size <= o.MaxBytes; size *= o.Factor {
		count := int(size / 4)
		if o.Coll == ReduceScatter || o.Coll == AllGather {
			count = count / n * n // whole blocks per rank
		}
		if count == 0 {
			continue
		}
		op := opFor(o, c, send[:count], recv[:count])
		row := Row{Bytes: int64(count) * 4, Count: count}
		row.Time, row.Iters, row.Failed = timeIt(ctx, c, o, op)
		if row.Failed == nil {
			row.AlgBW = float64(row.Bytes) / row.Time.Seconds() / 1e9
			row.BusBW = row.AlgBW * busFactor(o.Coll, n)
			if o.Check {
				row.Wrong, row.Failed = check(ctx, c, o, count, send, recv, op)
			}
		}
		rows = append(rows, row)
		if out != nil && c.Rank() == 0 {
			printRow(out, o, row)
		}
		if row.Failed != nil {
			return rows, row.Failed
		}
		if row.Wrong > 0 && bad == nil {
			bad = fmt.Errorf("bench: %d wrong elements at %d bytes", row.Wrong, row.Bytes)
		}
	}
	return rows, bad
}

// opFor returns one operation of o on the first count elements.
func opFor(o Options, c *collective.Comm, send, recv []float32) func(context.Context) error {
	n := c.Size()
	in := send
	switch o.Coll {
	case AllReduce:
		if o.InPlace {
			in = recv
		}
		return func(ctx context.Context) error { return collective.AllReduce(ctx, c, in, recv, collective.Sum) }
	case ReduceScatter:
		k := len(send) / n
		out := recv[:k]
		if o.InPlace {
			in, out = recv, recv[c.Rank()*k:(c.Rank()+1)*k]
		}
		return func(ctx context.Context) error { return collective.ReduceScatter(ctx, c, in, out, collective.Sum) }
	case AllGather:
		k := len(send) / n
		in = send[:k]
		if o.InPlace {
			in = recv[c.Rank()*k : (c.Rank()+1)*k]
		}
		return func(ctx context.Context) error { return collective.AllGather(ctx, c, in, recv) }
	case Broadcast:
		if o.InPlace {
			in = recv
		}
		return func(ctx context.Context) error { return collective.Broadcast(ctx, c, in, recv, o.Root) }
	}
	return func(context.Context) error { return fmt.Errorf("bench: unknown collective %q", o.Coll) }
}

// timeIt returns the slowest rank's time per operation.
func timeIt(ctx context.Context, c *collective.Comm, o Options, op func(context.Context) error) (time.Duration, int, error) {
	run := func(iters int) (time.Duration, error) {
		if err := c.Barrier(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		for i := 0; i < iters; i++ {
			if err := op(ctx); err != nil {
				return 0, err
			}
		}
		return maxOver(ctx, c, time.Since(start))
	}
	if _, err := run(o.Warmup); err != nil {
		return 0, 0, err
	}
	iters := o.Iters
	if o.Target > 0 {
		// Calibrate like the baseline tools: double k until the slowest
		// rank needs a tenth of the target.
		k := 1
		for {
			d, err := run(k)
			if err != nil {
				return 0, 0, err
			}
			if d >= o.Target/10 || k >= 1<<20 {
				iters = int(max(5, min(1<<22, int64(float64(k)*o.Target.Seconds()/d.Seconds()))))
				break
			}
			k *= 2
		}
	}
	d, err := run(iters)
	if err != nil {
		return 0, 0, err
	}
	return d / time.Duration(iters), iters, nil
}

// maxOver returns the largest d over all ranks.
func maxOver(ctx context.Context, c *collective.Comm, d time.Duration) (time.Duration, error) {
	v := []int64{int64(d)}
	if err := collective.AllReduce(ctx, c, v, v, collective.Max); err != nil {
		return 0, err
	}
	return time.Duration(v[0]), nil
}

// value is rank r's i-th input: small integers, exact in float32 sums for
// any realistic rank count (the baseline tools use the same pattern).
func value(r, i int) float32 { return float32((i*3+r*5)%17) - 8 }

// check runs one operation on verifiable inputs and returns the number of
// wrong elements on the worst rank.
func check(ctx context.Context, c *collective.Comm, o Options, count int, send, recv []float32, op func(context.Context) error) (int64, error) {
	n, r := c.Size(), c.Rank()
	k := count / n
	for i := 0; i < count; i++ {
		recv[i] = float32(math.NaN())
	}
	switch {
	case o.Coll == AllGather && o.InPlace:
		for i := 0; i < k; i++ {
			recv[r*k+i] = value(r, r*k+i)
		}
	case o.Coll == AllGather:
		for i := 0; i < k; i++ {
			send[i] = value(r, r*k+i)
		}
	case o.InPlace:
		for i := 0; i < count; i++ {
			recv[i] = value(r, i)
		}
	default:
		for i := 0; i < count; i++ {
			send[i] = value(r, i)
		}
	}
	if err := op(ctx); err != nil {
		return 0, err
	}
	var wrong int64
	want := func(i int) float32 {
		switch o.Coll {
		case AllGather:
			return value(i/k, i)
		case Broadcast:
			return value(o.Root, i)
		}
		var s float32
		for q := 0; q < n; q++ {
			s += value(q, i)
		}
		return s
	}
	switch o.Coll {
	case ReduceScatter:
		out := recv[:k]
		if o.InPlace {
			out = recv[r*k : (r+1)*k]
		}
		for i, v := range out {
			if v != want(r*k+i) {
				wrong++
			}
		}
	default:
		for i := 0; i < count; i++ {
			if recv[i] != want(i) {
				wrong++
			}
		}
	}
	v := []int64{wrong}
	if err := collective.AllReduce(ctx, c, v, v, collective.Max); err != nil {
		return 0, err
	}
	return v[0], nil
}

// Header writes nccl-tests' preamble: parameters, one line per rank, and
// the column heads.
func Header(out io.Writer, c *collective.Comm, o Options) {
	fmt.Fprintf(out, "# goccl-perf %s: nranks %d minBytes %d maxBytes %d step: %d(factor) warmup iters: %d iters: %d validation: %d\n",
		o.Coll, c.Size(), o.MinBytes, o.MaxBytes, o.Factor, o.Warmup, o.Iters, b2i(o.Check))
	fmt.Fprintln(out, "#")
	fmt.Fprintln(out, "# Using ranks")
	for _, ri := range c.Ranks() {
		fmt.Fprintf(out, "#  Rank %2d Pid %6d on %10s transport %s\n", ri.Rank, ri.PID, ri.Host, ri.Transport)
	}
	fmt.Fprintln(out, "#")
	place := "out-of-place"
	if o.InPlace {
		place = "in-place"
	}
	fmt.Fprintf(out, "# %74s\n", place)
	fmt.Fprintf(out, "#  %12s %12s %8s %6s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(out, "#  %12s %12s %8s %6s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func printRow(out io.Writer, o Options, r Row) {
	root := -1
	redop := "sum"
	switch o.Coll {
	case Broadcast:
		root, redop = o.Root, "none"
	case AllGather:
		redop = "none"
	}
	if r.Failed != nil {
		fmt.Fprintf(out, "   %12d %12d %8s %6s %6d  failed: %v\n", r.Bytes, r.Count, "float", redop, root, r.Failed)
		return
	}
	wrong := "N/A"
	if o.Check {
		wrong = fmt.Sprint(r.Wrong)
	}
	fmt.Fprintf(out, "   %12d %12d %8s %6s %6d %10.2f %8.3f %8.3f %6s\n",
		r.Bytes, r.Count, "float", redop, root, float64(r.Time.Nanoseconds())/1e3, r.AlgBW, r.BusBW, wrong)
}

// Footer writes nccl-tests' summary lines.
func Footer(out io.Writer, rows []Row, err error) {
	var wrong int64
	var sum float64
	n := 0
	for _, r := range rows {
		wrong += r.Wrong
		if r.Failed == nil {
			sum += r.BusBW
			n++
		}
	}
	status := "OK"
	if wrong > 0 || errors.Is(err, context.Canceled) || err != nil {
		status = "FAILED"
	}
	fmt.Fprintf(out, "# Out of bounds values : %d %s\n", wrong, status)
	if n > 0 {
		fmt.Fprintf(out, "# Avg bus bandwidth    : %.4f \n", sum/float64(n))
	}
	fmt.Fprintln(out, "#")
}
