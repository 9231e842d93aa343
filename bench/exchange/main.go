// Command exchange measures goccl's point-to-point exchanges side by side
// in one job, alternating the forms so that drift hits each alike, and
// prints each one's median time and bus bandwidth:
//
//   - a ring shift written by hand with even/odd ordering (even ranks send
//     first, odd ranks receive first) against the same shift with every
//     rank starting its receive first inside a Group (what the lanes make
//     possible);
//   - AllToAllv of uneven blocks (rank i sends rank j a block of
//     (0.5 + ((i+2j) mod 5)/4) × the mean, so the largest is 1.5×) against
//     AllToAll with every block padded to the largest;
//   - eight all-reduces of 8 bytes started one by one against the same
//     in a Group, which fuses them into one;
//   - eight broadcasts from rank 0 of a small model's tensors (weights of
//     1 KiB to 16 KiB and their biases, 46 KiB in all) one by one against
//     the same in a Group, fused into one (DDP's coalesced broadcast of
//     the initial parameters).
//
// Run it under goccl-run, one rank per process:
//
//	go build -o /tmp/exchange ./bench/exchange && go run ./cmd/goccl-run -np 4 /tmp/exchange -size 64M
//	GOCCL_TRANSPORT=tcp go run ./cmd/goccl-run -np 4 /tmp/exchange -size 1M
//
// Only rank 0 prints. Bus bandwidth is nccl-tests' for sendrecv (the
// bytes a rank sends per second) and for alltoall ((n-1)/n of the bytes
// a rank receives per second, the padded form counted by what it moves).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/goccl/goccl/collective"
)

func main() {
	size := flag.String("size", "64M", "bytes per rank: the shift's message, the all-to-all's mean total")
	reps := flag.Int("reps", 7, "rounds of every form (medians are reported)")
	iters := flag.Int("iters", 0, "operations per round (0: about 0.2 s worth)")
	flag.Parse()
	nb, err := collective.ParseSize(*size)
	if err == nil && nb < 4 {
		err = fmt.Errorf("size %d: want at least 4 bytes", nb)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "exchange:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "exchange:", err)
		os.Exit(1)
	}
	defer c.Close()
	if err := run(ctx, c, int(nb/4), *reps, *iters); err != nil {
		fmt.Fprintf(os.Stderr, "exchange: rank %d: %v\n", c.Rank(), err)
		os.Exit(1)
	}
}

type form struct {
	name  string
	bytes float64 // bus bytes per operation
	op    func(ctx context.Context) error
}

func run(ctx context.Context, c *collective.Comm, count, reps, iters int) error {
	n, r := c.Size(), c.Rank()
	next, prev := (r+1)%n, (r+n-1)%n
	out, in := make([]float32, count), make([]float32, count)
	shift := func(grouped bool) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			var a, b *collective.Request
			err := collective.Group(ctx, c, func() error {
				var err error
				recvFirst := grouped || r%2 == 1
				if recvFirst {
					if a, err = collective.StartRecv(ctx, c, in, prev); err == nil {
						b, err = collective.StartSend(ctx, c, out, next)
					}
				} else if a, err = collective.StartSend(ctx, c, out, next); err == nil {
					b, err = collective.StartRecv(ctx, c, in, prev)
				}
				return err
			})
			if err != nil {
				return err
			}
			return errors.Join(a.Wait(ctx), b.Wait(ctx))
		}
	}
	// Uneven blocks: mean count/n elements, from 0.5 to 1.5 times it.
	mean := max(count/n, 1)
	blk := func(i, j int) int { return mean/2 + mean*((i+2*j)%5)/4 }
	sc, rc := make([]int, n), make([]int, n)
	st, rt, largest := 0, 0, 0
	for j := range n {
		sc[j], rc[j] = blk(r, j), blk(j, r)
		st, rt = st+sc[j], rt+rc[j]
		for i := range n {
			largest = max(largest, blk(i, j))
		}
	}
	vs, vr := make([]float32, st), make([]float32, rt)
	ps, pr := make([]float32, largest*n), make([]float32, largest*n)
	moved := 0 // elements rank r receives in the uneven form, summed over the ranks for the bus bytes
	for i := range n {
		for j := range n {
			moved += blk(i, j)
		}
	}
	frac := float64(n-1) / float64(n)
	small := make([][]float32, 8) // a step's biases and norms: 8 all-reduces of 2 floats
	for i := range small {
		small[i] = make([]float32, 2)
	}
	// many starts one operation per buffer, one by one or in a Group, and
	// waits for them all.
	many := func(bufs [][]float32, start func(ctx context.Context, v []float32) (*collective.Request, error), grouped bool) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			var reqs []*collective.Request
			issue := func() error {
				for _, v := range bufs {
					q, err := start(ctx, v)
					if err != nil {
						return err
					}
					reqs = append(reqs, q)
				}
				return nil
			}
			var err error
			if grouped {
				err = collective.Group(ctx, c, issue)
			} else {
				err = issue()
			}
			for _, q := range reqs {
				err = errors.Join(err, q.Wait(ctx))
			}
			return err
		}
	}
	sum := func(ctx context.Context, v []float32) (*collective.Request, error) {
		return collective.StartAllReduce(ctx, c, v, v, collective.Sum)
	}
	fromRoot := func(ctx context.Context, v []float32) (*collective.Request, error) {
		return collective.StartBroadcast(ctx, c, v, v, 0)
	}
	params := make([][]float32, 8) // weights of 256..4096 floats and biases of 16..64
	for i := range params {
		n := 16 << (i / 2)
		if i%2 == 0 {
			n = 256 << (i / 2)
		}
		params[i] = make([]float32, n)
	}
	paramBytes := 0
	for _, p := range params {
		paramBytes += 4 * len(p)
	}
	forms := []form{
		{"shift, even/odd order", float64(4 * count), shift(false)},
		{"shift, receive first, grouped", float64(4 * count), shift(true)},
		{"alltoallv, uneven blocks", frac * float64(4*moved) / float64(n), func(ctx context.Context) error {
			return collective.AllToAllv(ctx, c, vs, sc, vr, rc)
		}},
		{"alltoall, padded to the largest", frac * float64(4*largest*n), func(ctx context.Context) error {
			return collective.AllToAll(ctx, c, ps, pr)
		}},
		{"8 all-reduces of 8 B, one by one", 64, many(small, sum, false)},
		{"8 all-reduces of 8 B in a Group", 64, many(small, sum, true)},
		{"8 broadcasts of parameters, one by one", float64(paramBytes), many(params, fromRoot, false)},
		{"8 broadcasts of parameters, Group", float64(paramBytes), many(params, fromRoot, true)},
	}
	// Warm up, and size the rounds.
	if iters == 0 {
		t0 := time.Now()
		for _, f := range forms {
			if err := f.op(ctx); err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
		}
		per := time.Since(t0) / time.Duration(len(forms))
		iters = max(1, int(200*time.Millisecond/max(per, time.Microsecond)))
		v := []int64{int64(iters)}
		if err := collective.AllReduce(ctx, c, v, v, collective.Max); err != nil {
			return err
		}
		iters = int(v[0])
	}
	times := make([][]float64, len(forms))
	for range reps {
		for k, f := range forms {
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			t0 := time.Now()
			for range iters {
				if err := f.op(ctx); err != nil {
					return fmt.Errorf("%s: %w", f.name, err)
				}
			}
			v := []float64{time.Since(t0).Seconds() / float64(iters)}
			if err := collective.AllReduce(ctx, c, v, v, collective.Max); err != nil { // the slowest rank's
				return err
			}
			times[k] = append(times[k], v[0])
		}
	}
	if r == 0 {
		fmt.Printf("# exchange: %d ranks, %d bytes per rank, %d rounds of %d operations; medians of the slowest rank\n", n, 4*count, reps, iters)
		fmt.Printf("# %-34s %12s %10s\n", "form", "time (us)", "busbw (GB/s)")
		for k, f := range forms {
			m := median(times[k])
			fmt.Printf("  %-34s %12.1f %10.2f\n", f.name, m*1e6, f.bytes/m/1e9)
		}
		fmt.Printf("# grouped/ordered time %.2f; alltoallv/padded time %.2f; fused/separate small all-reduces time %.2f, broadcasts %.2f\n",
			median(times[1])/median(times[0]), median(times[2])/median(times[3]), median(times[5])/median(times[4]), median(times[7])/median(times[6]))
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
