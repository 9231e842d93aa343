package bench

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/half"
)

func group(t *testing.T, n int) []*collective.Comm {
	t.Helper()
	comms, err := collective.NewLocalGroup(n, collective.WithTimeout(time.Minute))
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// runAll runs o on every rank; rank 0 collects the rows through a Printer.
func runAll(t *testing.T, comms []*collective.Comm, o Options) ([]Row, string, error) {
	t.Helper()
	var out bytes.Buffer
	errs := make([]error, len(comms))
	rows := make([][]Row, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			var sink Sink
			if r == 0 {
				sink = Printer{W: &out}
			}
			rows[r], errs[r] = Run(context.Background(), c, o, sink)
		})
	}
	wg.Wait()
	for r := 1; r < len(comms); r++ {
		require.Equal(t, errs[0] == nil, errs[r] == nil, "ranks disagree on failure: %v vs %v", errs[0], errs[r])
		require.Equal(t, len(rows[0]), len(rows[r]), "rank %d measured a different number of rows", r)
	}
	return rows[0], out.String(), errs[0]
}

// TestEveryCollectiveTypeAndOperator sweeps every collective with every
// type and operator (and every root) on 3 ranks, checking every result.
func TestEveryCollectiveTypeAndOperator(t *testing.T) {
	comms := group(t, 3)
	for _, c := range Colls {
		t.Run(string(c), func(t *testing.T) {
			o := Options{Coll: c, MinBytes: 8, MaxBytes: 64 << 10, Factor: 32, Iters: 2, Warmup: 1, Check: 1,
				Types: AllTypes, Ops: AllOps, Root: AllRoots}
			rows, out, err := runAll(t, comms, o)
			require.NoError(t, err, out)
			require.NotEmpty(t, rows)
			for _, r := range rows {
				require.EqualValues(t, 0, r.OutOfPlace.Wrong, "%+v", r)
				require.Equal(t, c.hasInPlace(), r.InPlace != nil, "%+v", r)
				if r.InPlace != nil {
					require.EqualValues(t, 0, r.InPlace.Wrong, "%+v", r)
				}
				require.Greater(t, r.OutOfPlace.TimeUs, 0.0)
				require.InDelta(t, r.OutOfPlace.AlgBW*BusFactor(c, 3), r.OutOfPlace.BusBW, 1e-12)
			}
			// Every requested type and (where it reduces) operator appears.
			seen := map[string]bool{}
			for _, r := range rows {
				seen[r.Type+"/"+r.RedOp] = true
			}
			want := len(AllTypes)
			if c.reduces() {
				want *= len(AllOps)
			}
			require.Len(t, seen, want)
		})
	}
}

func TestCheckCountsWrongElements(t *testing.T) {
	comms := group(t, 2)
	testCorrupt = func(rank int, out any) {
		if rank == 1 {
			if s, ok := out.([]float32); ok {
				s[len(s)-1]++
			}
		}
	}
	defer func() { testCorrupt = nil }()
	rows, out, err := runAll(t, comms, Options{Coll: AllReduce, MinBytes: 64, MaxBytes: 64, Factor: 2, Iters: 1, Check: 1})
	require.ErrorIs(t, err, ErrWrong)
	require.Len(t, rows, 1)
	require.EqualValues(t, 1, rows[0].OutOfPlace.Wrong)
	require.EqualValues(t, 1, rows[0].InPlace.Wrong)
	require.Contains(t, out, "       1") // the #wrong column
}

// TestPatternsAreExactInAnyOrder reduces the check patterns in the
// element type's own arithmetic (rounding after every step), in random
// orders, and demands the expected bits every time: the property that lets
// the checker ignore the order in which an algorithm combines ranks.
func TestPatternsAreExactInAnyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{2, 3, 5, 8, 16} {
		for _, dt := range []collective.DataType{collective.Float16Type, collective.BFloat16Type, collective.Float32, collective.Int8, collective.Uint8} {
			round := map[collective.DataType]func(float64) float64{
				collective.Float16Type:  func(v float64) float64 { return float64(half.F16ToF32(half.F32ToF16(float32(v)))) },
				collective.BFloat16Type: func(v float64) float64 { return float64(half.BF16ToF32(half.F32ToBF16(float32(v)))) },
				collective.Float32:      func(v float64) float64 { return float64(float32(v)) },
			}[dt]
			for _, op := range AllOps {
				for i := 0; i < 200; i++ {
					order := rng.Perm(n)
					switch {
					case round != nil:
						acc := pattern(AllReduce, op, true, false, n, order[0], i)
						for _, r := range order[1:] {
							v := pattern(AllReduce, op, true, false, n, r, i)
							switch op {
							case collective.Sum, collective.Avg:
								acc = round(acc + v)
							case collective.Prod:
								acc = round(acc * v)
							case collective.Min:
								acc = min(acc, v)
							case collective.Max:
								acc = max(acc, v)
							}
						}
						if op == collective.Avg {
							acc = round(acc / float64(n))
						}
						exp := expectedF(dt, op, n, i)
						require.Equal(t, exp, acc, "%v %v n=%d i=%d order %v", dt, op, n, i, order)
					default:
						// Integers wrap alike in any order; check the
						// pattern stays in the type's range for min/max.
						v := pattern(AllReduce, op, false, dt == collective.Uint8, n, order[0], i)
						require.False(t, math.IsNaN(v))
					}
				}
			}
		}
	}
}

// expectedF is the checker's expected value as a float64.
func expectedF(dt collective.DataType, op collective.Op, n, i int) float64 {
	switch dt {
	case collective.Float16Type:
		return typedFor[collective.Float16]().(typed[collective.Float16]).toF(typedFor[collective.Float16]().(typed[collective.Float16]).reduced(AllReduce, op, n, i))
	case collective.BFloat16Type:
		tt := typedFor[collective.BFloat16]().(typed[collective.BFloat16])
		return tt.toF(tt.reduced(AllReduce, op, n, i))
	}
	tt := typedFor[float32]().(typed[float32])
	return tt.toF(tt.reduced(AllReduce, op, n, i))
}

func TestGeometryFollowsNCCLTests(t *testing.T) {
	g := geometryOf(AllGather, 4, 4, 1000) // 250 floats → 62 per rank
	require.Equal(t, geometry{sendLen: 62, recvLen: 248, count: 62, blk: 62, bytes: 992}, g)
	g = geometryOf(ReduceScatter, 4, 4, 1000)
	require.Equal(t, 248, g.sendLen)
	require.Equal(t, 62, g.recvLen)
	g = geometryOf(AllReduce, 4, 2, 9)
	require.Equal(t, geometry{sendLen: 4, recvLen: 4, count: 4, bytes: 8}, g)
	require.Equal(t, []int64{8, 64, 512}, Options{MinBytes: 8, MaxBytes: 600, Factor: 8}.sizes())
	require.Equal(t, []int64{100, 150, 200}, Options{MinBytes: 100, MaxBytes: 200, Factor: 1, Step: 50}.sizes())
	require.InDelta(t, 1.5, BusFactor(AllReduce, 4), 1e-12)
	require.InDelta(t, 0.75, BusFactor(AllToAll, 4), 1e-12)
	require.InDelta(t, 1.0, BusFactor(SendRecv, 4), 1e-12)
}

func TestOptionsAreValidated(t *testing.T) {
	ok := Options{Coll: AllReduce, MinBytes: 8, MaxBytes: 8, Factor: 2}
	require.NoError(t, ok.Validate(2))
	for name, o := range map[string]Options{
		"no step":     {Coll: AllReduce, MinBytes: 8, MaxBytes: 16},
		"max < min":   {Coll: AllReduce, MinBytes: 16, MaxBytes: 8, Factor: 2},
		"bad root":    {Coll: Broadcast, MinBytes: 8, MaxBytes: 8, Factor: 2, Root: 2},
		"bad agg":     {Coll: AllReduce, MinBytes: 8, MaxBytes: 8, Factor: 2, Agg: 7},
		"bad coll":    {Coll: "gather", MinBytes: 8, MaxBytes: 8, Factor: 2},
		"one-rank sr": {Coll: SendRecv, MinBytes: 8, MaxBytes: 8, Factor: 2},
	} {
		n := 2
		if name == "one-rank sr" {
			n = 1
		}
		require.Error(t, o.Validate(n), name)
	}
	_, err := ParseTypes("float,quad")
	require.ErrorContains(t, err, "quad")
	ts, err := ParseTypes("half,bfloat16,float32")
	require.NoError(t, err)
	require.Equal(t, []collective.DataType{collective.Float16Type, collective.BFloat16Type, collective.Float32}, ts)
	ops, err := ParseOps("all")
	require.NoError(t, err)
	require.Len(t, ops, 5)
	r, err := ParseRoot("all")
	require.NoError(t, err)
	require.Equal(t, AllRoots, r)
	c, err := ParseColl("all_reduce_perf")
	require.NoError(t, err)
	require.Equal(t, AllReduce, c)
}

// TestTableLayout checks that rows split into nccl-tests' 13 columns and
// that ParseTable reads back what Table writes.
func TestTableLayout(t *testing.T) {
	rep := &Report{Collective: AllReduce, NRanks: 2, Params: ParamsOf(Options{MinBytes: 8, MaxBytes: 1 << 30, Factor: 2}),
		Ranks: []collective.RankInfo{{Rank: 0, PID: 1, Host: "h/boot", Transport: "self"}, {Rank: 1, PID: 2, Host: "h/boot", Transport: "shm"}}}
	ip := Measure{TimeUs: 123456.7, AlgBW: 1234.5, BusBW: 0.004, Wrong: 0}
	rep.Rows = []Row{
		{Bytes: 8, Count: 2, Type: "float", RedOp: "sum", Root: -1, OutOfPlace: Measure{TimeUs: 0.63, AlgBW: 0.01, BusBW: 0.01, Wrong: 0}, InPlace: &ip},
		{Bytes: 1 << 30, Count: 1 << 28, Type: "bfloat16", RedOp: "none", Root: -1, OutOfPlace: Measure{TimeUs: 9.9e7, AlgBW: 1e6, BusBW: 5, Wrong: -1}},
	}
	rep.Summarise()
	var b bytes.Buffer
	tb := Table{}
	tb.Header(&b, rep)
	for _, r := range rep.Rows {
		tb.WriteRow(&b, r)
	}
	tb.Footer(&b, rep)
	text := b.String()
	var rowLines int
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		rowLines++
		require.Len(t, strings.Fields(l), 13, "row %q", l)
	}
	require.Equal(t, 2, rowLines)
	require.Contains(t, text, "# Out of bounds values : 0 OK")
	require.Contains(t, text, "# Avg bus bandwidth    : ")
	require.Contains(t, text, "#  Rank  1 Pid      2 on          h transport shm")
	var heads []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "#wrong") {
			heads = strings.Fields(l)
			break
		}
	}
	require.Equal(t, []string{"#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"}, heads)

	got, err := ParseTable(strings.NewReader(text))
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, int64(8), got[0].Bytes)
	require.InDelta(t, 0.63, got[0].OutOfPlace.TimeUs, 1e-9)
	require.NotNil(t, got[0].InPlace)
	require.InDelta(t, 123457, got[0].InPlace.TimeUs, 1) // printed in 7 characters
	require.Nil(t, got[1].InPlace)
	require.EqualValues(t, -1, got[1].OutOfPlace.Wrong)
}

func TestParseTableReadsThePeersOutput(t *testing.T) {
	// nccl-tests' layout, with a launcher's prefix.
	nccl := `# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
[0]            8             2     float     sum      -1    10.33    0.00    0.00      0    10.06    0.00    0.00      0
[0]    134217728      33554432     float     sum      -1   1093.6  122.73  230.12      0   1092.1  122.90  230.43      0
# Out of bounds values : 0 OK
`
	rows, err := ParseTable(strings.NewReader(nccl))
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.InDelta(t, 230.43, rows[1].InPlace.BusBW, 1e-9)
	// The baseline tools' layout (../shared/baselines): iters instead of root, no in-place.
	base := `#       size(B)  count  type  redop  iters  time(us)  algbw(GB/s)  busbw(GB/s)  #wrong
             8            2  float    sum   200000         0.41      0.020      0.020        0
      67108864     16777216  float    sum       9     53602.32      1.252      1.252        0
`
	rows, err = ParseTable(strings.NewReader(base))
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, 9, rows[1].OutOfPlace.Iters)
	require.InDelta(t, 53602.32, rows[1].OutOfPlace.TimeUs, 1e-9)
	// mpirun --tag-output, and nccl-tests' older layout without the root
	// column (issue 15).
	tagged := `[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
[1,0]<stdout>:     1048576        262144     float     sum      -1    41.10   25.51   44.65      0    40.95   25.61   44.81      0
`
	rows, err = ParseTable(strings.NewReader(tagged))
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.InDelta(t, 44.81, rows[0].InPlace.BusBW, 1e-9)
	old := `#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
           8             2   float     sum    16.21    0.00    0.00  0e+00    15.97    0.00    0.00  0e+00
   134217728      33554432   float     sum   1544.2   86.92  162.97  4e-07   1544.0   86.93  162.99  4e-07
`
	rows, err = ParseTable(strings.NewReader(old))
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, -1, rows[1].Root)
	require.InDelta(t, 162.99, rows[1].InPlace.BusBW, 1e-9)
	require.Equal(t, "sum", rows[1].RedOp)
	_, err = ParseTable(strings.NewReader("# nothing here\nhello\n"))
	require.Error(t, err)
}

func TestJSONAndPlot(t *testing.T) {
	comms := group(t, 2)
	rows, _, err := runAll(t, comms, Options{Coll: AllReduce, MinBytes: 8, MaxBytes: 1 << 20, Factor: 8, Iters: 3, Check: 1})
	require.NoError(t, err)
	dir := t.TempDir()
	rep := &Report{Tool: "goccl-perf", Collective: AllReduce, NRanks: 2, Rows: rows, Params: ParamsOf(Options{MinBytes: 8, MaxBytes: 1 << 20, Factor: 8})}
	rep.Summarise()
	js := filepath.Join(dir, "a.json")
	require.NoError(t, rep.WriteJSON(js))
	back, err := ReadReport(js)
	require.NoError(t, err)
	require.Equal(t, rep.Rows, back.Rows)
	require.Equal(t, AllReduce, back.Collective)

	txt := filepath.Join(dir, "b.txt")
	var b bytes.Buffer
	for _, r := range rows {
		Table{}.WriteRow(&b, r)
	}
	require.NoError(t, os.WriteFile(txt, b.Bytes(), 0o644))
	fromText, err := ReadReport(txt)
	require.NoError(t, err)
	require.Len(t, fromText.Rows, len(rows))

	pngPath := filepath.Join(dir, "cmp.png")
	require.NoError(t, Plot(pngPath, "all_reduce", []*Report{back, fromText}, true))
	f, err := os.Open(pngPath)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Greater(t, img.Bounds().Dx(), 1000)
	require.Error(t, Plot(filepath.Join(dir, "none.png"), "x", nil, false))
}

func TestSendRecvLargeDoesNotDeadlock(t *testing.T) {
	// Messages far beyond what a connection buffers: a ring of sends that
	// all waited for their receives would never finish.
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := group(t, n)
			_, out, err := runAll(t, comms, Options{Coll: SendRecv, MinBytes: 8 << 20, MaxBytes: 8 << 20, Factor: 2, Iters: 2, Warmup: -1, Check: 1})
			require.NoError(t, err, out)
		})
	}
}

func TestNonBlockingAndAggregations(t *testing.T) {
	comms := group(t, 3)
	for _, agg := range []Aggregation{AggRank0, AggAvg, AggMin, AggMax} {
		rows, out, err := runAll(t, comms, Options{Coll: AllReduce, MinBytes: 4096, MaxBytes: 4096, Factor: 2, Iters: 40,
			Check: 1, Agg: agg, Blocking: agg%2 == 0})
		require.NoError(t, err, out)
		require.Len(t, rows, 1)
		require.Greater(t, rows[0].OutOfPlace.TimeUs, 0.0)
	}
}
