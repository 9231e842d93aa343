package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccl/goccl/collective"
)

// Coll names a benchmarked collective, as nccl-tests' binaries do
// (all_reduce_perf, ...).
type Coll string

// The collectives Run knows.
const (
	AllReduce     Coll = "all_reduce"
	ReduceScatter Coll = "reduce_scatter"
	AllGather     Coll = "all_gather"
	Broadcast     Coll = "broadcast"
	Reduce        Coll = "reduce"
	AllToAll      Coll = "alltoall"
	SendRecv      Coll = "sendrecv"
)

// Colls lists every collective Run knows, in nccl-tests' order.
var Colls = []Coll{AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, SendRecv}

// ParseColl accepts a collective's name, with or without nccl-tests'
// "_perf" suffix ("all_reduce", "all_reduce_perf", "allreduce").
func ParseColl(s string) (Coll, error) {
	k := strings.ReplaceAll(strings.TrimSuffix(strings.ToLower(s), "_perf"), "_", "")
	for _, c := range Colls {
		if strings.ReplaceAll(string(c), "_", "") == k {
			return c, nil
		}
	}
	names := make([]string, len(Colls))
	for i, c := range Colls {
		names[i] = string(c)
	}
	return "", fmt.Errorf("unknown collective %q (want one of %s)", s, strings.Join(names, ", "))
}

// reduces reports whether c takes a reduction operator.
func (c Coll) reduces() bool {
	return c == AllReduce || c == ReduceScatter || c == Reduce
}

// rooted reports whether c has a root.
func (c Coll) rooted() bool { return c == Broadcast || c == Reduce }

// hasInPlace reports whether c has an in-place form (nccl-tests prints
// N/A in the in-place columns of the others).
func (c Coll) hasInPlace() bool { return c != AllToAll && c != SendRecv }

// BusFactor is nccl-tests' bus bandwidth factor for c on n ranks
// (doc/PERFORMANCE.md there; sendrecv is 1): busbw = algbw × factor is
// what each rank's busiest link carries, comparable with the hardware's
// peak whatever the rank count.
func BusFactor(c Coll, n int) float64 {
	switch c {
	case AllReduce:
		return 2 * float64(n-1) / float64(n)
	case ReduceScatter, AllGather, AllToAll:
		return float64(n-1) / float64(n)
	}
	return 1
}

// Type names follow nccl-tests' -d names.
var typeNames = map[collective.DataType]string{
	collective.Int8: "int8", collective.Uint8: "uint8", collective.Int32: "int32", collective.Uint32: "uint32",
	collective.Int64: "int64", collective.Uint64: "uint64", collective.Float16Type: "half",
	collective.Float32: "float", collective.Float64: "double", collective.BFloat16Type: "bfloat16",
	collective.Float8E4M3Type: "f8e4m3", collective.Float8E5M2Type: "f8e5m2",
}

// AllTypes is what -d all runs, in nccl-tests' order.
var AllTypes = []collective.DataType{collective.Int8, collective.Uint8, collective.Int32, collective.Uint32,
	collective.Int64, collective.Uint64, collective.Float16Type, collective.Float32, collective.Float64, collective.BFloat16Type,
	collective.Float8E4M3Type, collective.Float8E5M2Type}

// AllOps is what -o all runs.
var AllOps = []collective.Op{collective.Sum, collective.Prod, collective.Max, collective.Min, collective.Avg}

// TypeName returns t's nccl-tests name ("float", "half", ...).
func TypeName(t collective.DataType) string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return t.String()
}

// ParseTypes parses -d: a comma-separated list of nccl-tests type names
// (also goccl's names: float32, float16, ...), or "all".
func ParseTypes(s string) ([]collective.DataType, error) {
	return parseList(s, AllTypes, func(t collective.DataType, f string) bool { return f == TypeName(t) || f == t.String() },
		"data type", "int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16 or all")
}

// ParseOps parses -o: a comma-separated list of sum, prod, min, max, avg,
// or "all".
func ParseOps(s string) ([]collective.Op, error) {
	return parseList(s, AllOps, func(o collective.Op, f string) bool { return f == o.String() },
		"reduction", "sum, prod, min, max, avg or all")
}

// parseList parses a comma-separated list of names of all's members
// (case-insensitive; is says whether a member has a name), or "all".
func parseList[T any](s string, all []T, is func(T, string) bool, what, want string) ([]T, error) {
	if strings.EqualFold(s, "all") {
		return all, nil
	}
	var out []T
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		i := slices.IndexFunc(all, func(v T) bool { return is(v, f) })
		if i < 0 {
			return nil, fmt.Errorf("unknown %s %q (want %s)", what, f, want)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// AllRoots, as Options.Root, runs every rank as the root in turn
// (nccl-tests' -r -1).
const AllRoots = -1

// ParseRoot parses -r: a rank, or "all" / -1 for every rank in turn.
func ParseRoot(s string) (int, error) {
	if strings.EqualFold(s, "all") {
		return AllRoots, nil
	}
	r, err := strconv.Atoi(s)
	if err != nil || r < -1 {
		return 0, fmt.Errorf("bad root %q (want a rank, or all / -1 for every rank in turn)", s)
	}
	return r, nil
}

// Aggregation is how the ranks' times are combined (nccl-tests' -a).
type Aggregation int

// Aggregations, numbered as nccl-tests' -a.
const (
	AggRank0 Aggregation = iota
	AggAvg
	AggMin
	AggMax
)

func (a Aggregation) String() string {
	switch a {
	case AggRank0:
		return "rank0"
	case AggAvg:
		return "avg"
	case AggMin:
		return "min"
	case AggMax:
		return "max"
	}
	return fmt.Sprintf("Aggregation(%d)", int(a))
}

// Options configures a sweep. Every rank passes the same Options.
type Options struct {
	Coll     Coll
	MinBytes int64
	MaxBytes int64
	// Factor multiplies the size from one row to the next when > 1;
	// otherwise Step is added (nccl-tests' -f and -i).
	Factor int64
	Step   int64
	Iters  int           // timed iterations per size and placement; 0 means 20
	Warmup int           // untimed iterations; 0 means 5, <0 none
	Target time.Duration // when > 0, time each size for about this long instead of Iters
	// Check is how many times each result is checked (nccl-tests' -c);
	// 0 turns checking off.
	Check int
	Types []collective.DataType // nil means float
	Ops   []collective.Op       // nil means sum; ignored by collectives without one
	Root  int                   // AllRoots runs each rank in turn
	// Blocking runs each operation to completion before the next
	// (nccl-tests' -z 1); otherwise a batch is started asynchronously and
	// waited for once.
	Blocking bool
	Agg      Aggregation
	// OutOfPlaceOnly skips the in-place columns (printed as N/A).
	OutOfPlaceOnly bool
	// Stream, when set, runs the sweep on device memory of the stream's
	// device, every operation the Device form ordered on it (each rank
	// passes its own stream; see device.go). Nil: host memory.
	Stream collective.Stream
	// Shared allocates the host buffers with collective.MemAlloc, which
	// the ranks of one host map (goccl-perf -R 1, after nccl-tests' -R
	// for NCCL's registered buffers).
	Shared bool
	// Registered makes the host buffers ordinary Go memory registered with
	// collective.Register (goccl-perf -R 2).
	Registered bool
}

func (o *Options) defaults() {
	if o.Iters == 0 {
		o.Iters = 20
	}
	if o.Warmup == 0 {
		o.Warmup = 5
	} else if o.Warmup < 0 {
		o.Warmup = 0
	}
	if len(o.Types) == 0 {
		o.Types = []collective.DataType{collective.Float32}
	}
	if len(o.Ops) == 0 || !o.Coll.reduces() {
		o.Ops = []collective.Op{collective.Sum} // (printed as "none" where nothing reduces)
	}
}

// Validate reports options no sweep can run.
func (o Options) Validate(nranks int) error {
	switch {
	case o.Coll == "":
		return fmt.Errorf("bench: no collective")
	case o.MinBytes < 1 || o.MaxBytes < o.MinBytes:
		return fmt.Errorf("bench: want 1 ≤ smallest ≤ largest size, got %d and %d bytes", o.MinBytes, o.MaxBytes)
	case o.Factor <= 1 && o.Step < 1:
		return fmt.Errorf("bench: want a size factor > 1 (-f) or a step ≥ 1 byte (-i)")
	case o.Iters < 0:
		return fmt.Errorf("bench: negative iteration count %d", o.Iters)
	case o.Check < 0:
		return fmt.Errorf("bench: negative check count %d", o.Check)
	case o.Agg < AggRank0 || o.Agg > AggMax:
		return fmt.Errorf("bench: aggregation %d: want 0 (rank 0), 1 (average), 2 (minimum) or 3 (maximum)", int(o.Agg))
	case o.Root >= nranks || o.Root < AllRoots:
		return fmt.Errorf("bench: root %d out of range for %d ranks", o.Root, nranks)
	case o.Coll == SendRecv && nranks < 2:
		return fmt.Errorf("bench: sendrecv needs at least 2 ranks")
	}
	for _, t := range o.Types {
		if !t.Valid() {
			return fmt.Errorf("bench: invalid data type %v", t)
		}
	}
	for _, op := range o.Ops {
		if !op.Valid() {
			return fmt.Errorf("bench: invalid reduction %v", op)
		}
	}
	if _, err := ParseColl(string(o.Coll)); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// sizes returns the sweep's requested sizes in bytes.
func (o Options) sizes() []int64 {
	var out []int64
	for s := o.MinBytes; s <= o.MaxBytes; {
		out = append(out, s)
		next := s + o.Step
		if o.Factor > 1 {
			next = s * o.Factor
		}
		if next <= s {
			break
		}
		s = next
	}
	return out
}
