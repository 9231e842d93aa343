package collective_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/goccl/goccl/collective"
)

// testTimeout bounds how long a test waits for its ranks; a hang fails the
// test with a message instead of stalling the run.
const testTimeout = 2 * time.Minute

func TestMain(m *testing.M) {
	// The multi-process tests re-execute this binary as their ranks.
	if scenario := os.Getenv(childEnv); scenario != "" {
		os.Exit(childMain(scenario))
	}
	// The SIGUSR1 handler of communicators with a dump directory lives as
	// long as the process, by design (collective/flight.go).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/goccl/goccl/collective.registerDump.func1.1"),
		goleak.IgnoreAnyFunction("os/signal.signal_recv"))
}

// runRanks runs f for every rank on its own goroutine and returns each
// rank's error.
func runRanks(t testing.TB, comms []*collective.Comm, f func(r int, c *collective.Comm) error) []error {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatalf("ranks did not finish within %v", testTimeout)
	}
	return errs
}

// newGroup makes a local group and closes it when the test ends.
func newGroup(t testing.TB, n int, opts ...collective.Option) []*collective.Comm {
	t.Helper()
	opts = append([]collective.Option{collective.WithEnv(nil)}, opts...)
	comms, err := collective.NewLocalGroup(n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func isFloat(t collective.DataType) bool {
	switch t {
	case collective.Float16Type, collective.Float32, collective.Float64, collective.BFloat16Type:
		return true
	}
	return false
}

func isSigned(t collective.DataType) bool {
	switch t {
	case collective.Int8, collective.Int32, collective.Int64:
		return true
	}
	return false
}

func toF64[T collective.Number](v T) float64 {
	switch x := any(v).(type) {
	case float32:
		return float64(x)
	case float64:
		return x
	case collective.Float16:
		return float64(x.Float32())
	case collective.BFloat16:
		return float64(x.Float32())
	}
	panic("not a float type")
}

func fromF64[T collective.Number](f float64) T {
	var z T
	switch any(z).(type) {
	case float32:
		return any(float32(f)).(T)
	case float64:
		return any(f).(T)
	case collective.Float16:
		return any(collective.Float16From(float32(f))).(T)
	case collective.BFloat16:
		return any(collective.BFloat16From(float32(f))).(T)
	}
	panic("not a float type")
}

// toBits returns an integer element as a wrapped 64-bit value (sign
// extended for signed types).
func toBits[T collective.Number](v T) uint64 {
	switch x := any(v).(type) {
	case int8:
		return uint64(int64(x))
	case uint8:
		return uint64(x)
	case int32:
		return uint64(int64(x))
	case uint32:
		return uint64(x)
	case int64:
		return uint64(x)
	case uint64:
		return x
	}
	panic("not an integer type")
}

func fromBits[T collective.Number](u uint64) T {
	var z T
	switch any(z).(type) {
	case int8:
		return any(int8(u)).(T)
	case uint8:
		return any(uint8(u)).(T)
	case int32:
		return any(int32(u)).(T)
	case uint32:
		return any(uint32(u)).(T)
	case int64:
		return any(int64(u)).(T)
	case uint64:
		return any(u).(T)
	}
	panic("not an integer type")
}

// gen returns count elements for op chosen so that every reduction order
// gives the same, exactly representable result: full-range values for
// integers (wrap-around arithmetic is associative), small integers for
// floats (sums stay below 2^8, products are ±2^k).
func gen[T collective.Number](rng *rand.Rand, op collective.Op, count int) []T {
	dt := collective.TypeOf[T]()
	out := make([]T, count)
	for i := range out {
		if !isFloat(dt) {
			out[i] = fromBits[T](rng.Uint64())
			continue
		}
		var f float64
		if op == collective.Prod {
			f = float64([]int{-2, -1, 1, 2}[rng.IntN(4)])
		} else {
			f = float64(rng.IntN(17) - 8)
		}
		out[i] = fromF64[T](f)
	}
	return out
}

// reduceRef reduces element i of every input with op: in float64 for
// floats (exact for gen's inputs), in wrapped 64-bit integers otherwise.
func reduceRef[T collective.Number](inputs [][]T, i int, op collective.Op) T {
	dt := collective.TypeOf[T]()
	n := len(inputs)
	if isFloat(dt) {
		acc := toF64(inputs[0][i])
		for _, in := range inputs[1:] {
			x := toF64(in[i])
			switch op {
			case collective.Sum, collective.Avg:
				acc += x
			case collective.Prod:
				acc *= x
			case collective.Min:
				acc = math.Min(acc, x)
			case collective.Max:
				acc = math.Max(acc, x)
			}
		}
		if op == collective.Avg {
			acc /= float64(n)
		}
		return fromF64[T](acc)
	}
	acc := toBits(inputs[0][i])
	signed := isSigned(dt)
	less := func(a, b uint64) bool {
		if signed {
			return int64(a) < int64(b)
		}
		return a < b
	}
	for _, in := range inputs[1:] {
		x := toBits(in[i])
		switch op {
		case collective.Sum, collective.Avg:
			acc += x
		case collective.Prod:
			acc *= x
		case collective.Min:
			if less(x, acc) {
				acc = x
			}
		case collective.Max:
			if less(acc, x) {
				acc = x
			}
		}
	}
	if op == collective.Avg {
		acc = toBits(fromBits[T](acc)) // wrap to the type first
		if signed {
			acc = uint64(int64(acc) / int64(n))
		} else {
			acc /= uint64(n)
		}
	}
	return fromBits[T](acc)
}

// same compares elements bit for bit (any NaN equals any NaN).
func same[T collective.Number](a, b T) bool {
	if a == b {
		return true
	}
	if isFloat(collective.TypeOf[T]()) {
		return math.IsNaN(toF64(a)) && math.IsNaN(toF64(b))
	}
	return false
}

// firstDiff returns the first index where got and want differ, or -1.
func firstDiff[T collective.Number](got, want []T) int {
	if len(got) != len(want) {
		return min(len(got), len(want))
	}
	for i := range got {
		if !same(got[i], want[i]) {
			return i
		}
	}
	return -1
}

// ringShift sends out to the next rank and receives in from the previous
// one, even ranks sending first so that no send waits in a cycle.
func ringShift[T collective.Number](ctx context.Context, c *collective.Comm, out, in []T) error {
	n, r := c.Size(), c.Rank()
	next, prev := (r+1)%n, (r+n-1)%n
	if r%2 == 0 {
		if err := collective.Send(ctx, c, out, next); err != nil {
			return err
		}
		return collective.Recv(ctx, c, in, prev)
	}
	if err := collective.Recv(ctx, c, in, prev); err != nil {
		return err
	}
	return collective.Send(ctx, c, out, next)
}
