// Command split measures what a Split costs against a barrier on the
// parent, in one job, alternating the two so that drift hits each alike,
// and checks that a child's all-reduces run as fast as the parent's:
//
//   - a barrier on the parent;
//   - Split of every rank into one child (the same color; ncclCommDup's
//     case) and its Close;
//   - Split into two children of the even and the odd ranks and Close;
//   - 8-byte and -size all-reduces on the parent and on a child of every
//     rank, alternated.
//
// Run it under goccl-run, one rank per process:
//
//	go build -o /tmp/split ./bench/split && go run ./cmd/goccl-run -np 4 /tmp/split
//	GOCCL_TRANSPORT=tcp go run ./cmd/goccl-run -np 4 /tmp/split
//
// Only rank 0 prints: each form's median over the rounds of the slowest
// rank's time.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/goccl/goccl/collective"
)

func main() {
	reps := flag.Int("reps", 21, "rounds of every form (medians are reported)")
	size := flag.String("size", "64M", "bytes of the large all-reduce")
	flag.Parse()
	nb, err := collective.ParseSize(*size)
	if err == nil && nb < 4 {
		err = fmt.Errorf("size %d: want at least 4 bytes", nb)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "split:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "split:", err)
		os.Exit(1)
	}
	defer c.Close()
	if err := run(ctx, c, *reps, int(nb/4)); err != nil {
		fmt.Fprintf(os.Stderr, "split: rank %d: %v\n", c.Rank(), err)
		os.Exit(1)
	}
}

type form struct {
	name string
	op   func(ctx context.Context) error
}

func run(ctx context.Context, c *collective.Comm, reps, count int) error {
	r := c.Rank()
	small := []float32{1, 2}
	big := make([]float32, count)
	allReduce := func(cc *collective.Comm, v []float32) error {
		return collective.AllReduce(ctx, cc, v, v, collective.Sum)
	}
	// A split's phases, each timed on its own (barriers between them):
	// the Split call, the child's first 8-byte all-reduce (its first
	// connections), its Close.
	var child *collective.Comm
	split := func(color func(int) int) []form {
		return []form{
			{"split", func(ctx context.Context) (err error) { child, err = c.Split(ctx, color(r), r); return err }},
			{"  child's first 8 B all-reduce", func(ctx context.Context) error { return allReduce(child, small) }},
			{"  child's second", func(ctx context.Context) error { return allReduce(child, small) }},
			{"  close the child", func(ctx context.Context) error { return child.Close() }},
		}
	}
	forms := []form{{"barrier on the parent", c.Barrier}}
	forms = append(forms, retitle("one child of every rank: ", split(func(int) int { return 0 }))...)
	forms = append(forms, retitle("two children (even, odd): ", split(func(q int) int { return q % 2 }))...)
	iters := make([]int, len(forms))
	for i := range iters {
		iters[i] = 1
	}
	dup, err := c.Split(ctx, 0, r)
	if err != nil {
		return err
	}
	defer dup.Close()
	for _, f := range []form{
		{"8 B all-reduce, parent (per op)", func(context.Context) error { return allReduce(c, small) }},
		{"8 B all-reduce, child (per op)", func(context.Context) error { return allReduce(dup, small) }},
		{fmt.Sprintf("%d B all-reduce, parent", 4*count), func(context.Context) error { return allReduce(c, big) }},
		{fmt.Sprintf("%d B all-reduce, child", 4*count), func(context.Context) error { return allReduce(dup, big) }},
	} {
		forms = append(forms, f)
		iters = append(iters, map[bool]int{true: 200, false: 3}[len(f.name) < 34])
	}
	times := make([][]time.Duration, len(forms))
	slowest := make([]int64, 1)
	for range reps {
		for i, f := range forms {
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			start := time.Now()
			for range iters[i] {
				if err := f.op(ctx); err != nil {
					return fmt.Errorf("%s: %w", f.name, err)
				}
			}
			slowest[0] = int64(time.Since(start)) / int64(iters[i])
			if err := collective.AllReduce(ctx, c, slowest, slowest, collective.Max); err != nil {
				return err
			}
			times[i] = append(times[i], time.Duration(slowest[0]))
		}
	}
	if r != 0 {
		return nil
	}
	fmt.Printf("# %d ranks, %d rounds; the median (and the quartiles) of the slowest rank's time\n", c.Size(), reps)
	for i, f := range forms {
		t := times[i]
		slices.Sort(t)
		q := func(k int) time.Duration { return t[k*(len(t)-1)/4].Round(time.Microsecond / 10) }
		fmt.Printf("%-48s %10v  (%v … %v)\n", f.name, q(2), q(1), q(3))
	}
	return nil
}

func retitle(prefix string, fs []form) []form {
	for i := range fs {
		if fs[i].name[0] != ' ' {
			fs[i].name = prefix + fs[i].name
		} else {
			fs[i].name = "  " + fs[i].name
		}
	}
	return fs
}
