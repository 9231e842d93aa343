// Command inprocess sweeps float32 all-reduce over ranks that live in this
// process (collective.NewLocalGroup) and prints time and bandwidth per size
// in nccl-tests' columns, checking every result.
//
//	go run ./examples/inprocess -np 4 -b 8 -e 64M -f 8
//
// algbw is size/time; busbw is algbw × 2(n-1)/n, nccl-tests' bus bandwidth
// for all-reduce (the rate each rank's links run at in a ring).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

func main() {
	np := flag.Int("np", 4, "number of ranks")
	minB := flag.String("b", "8", "smallest size in bytes (K, M, G suffixes)")
	maxB := flag.String("e", "64M", "largest size in bytes")
	factor := flag.Int("f", 8, "size multiplication factor")
	algo := flag.String("algo", "auto", "all-reduce algorithm: auto, ring, tree, recdoubling, rabenseifner")
	minTime := flag.Duration("t", 200*time.Millisecond, "minimum time to measure per size")
	flag.Parse()
	if err := run(*np, *minB, *maxB, *factor, *algo, *minTime); err != nil {
		fmt.Fprintln(os.Stderr, "inprocess:", err)
		os.Exit(1)
	}
}

func run(np int, minS, maxS string, factor int, algoName string, minTime time.Duration) error {
	lo, err := collective.ParseSize(minS)
	if err != nil {
		return err
	}
	hi, err := collective.ParseSize(maxS)
	if err != nil {
		return err
	}
	if factor < 2 || lo < 4 || hi < lo {
		return fmt.Errorf("want -f ≥ 2 and 4 ≤ -b ≤ -e")
	}
	a, err := algorithms.ParseAlgorithm(algoName)
	if err != nil {
		return err
	}
	comms, err := collective.NewLocalGroup(np, collective.WithAlgorithm(a))
	if err != nil {
		return err
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	fmt.Printf("# goccl in-process all-reduce: %d ranks, float32 sum, algorithm %v\n", np, a)
	fmt.Printf("# %12s %12s %10s %12s %12s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong")
	wrongTotal := 0
	for size := lo; size <= hi; size *= int64(factor) {
		count := int(size / 4)
		t, wrong, err := measure(comms, count, minTime)
		if err != nil {
			return fmt.Errorf("size %d: %w", size, err)
		}
		algbw := float64(count*4) / t.Seconds() / 1e9
		busbw := algbw * 2 * float64(np-1) / float64(np)
		fmt.Printf("  %12d %12d %10.2f %12.3f %12.3f %8d\n", count*4, count, float64(t.Nanoseconds())/1e3, algbw, busbw, wrong)
		wrongTotal += wrong
	}
	if wrongTotal > 0 {
		return fmt.Errorf("%d wrong elements", wrongTotal)
	}
	return nil
}

// measure times all-reduces of count elements on every rank and returns the
// time per operation (slowest rank) and the number of wrong elements found
// by a final checked operation.
func measure(comms []*collective.Comm, count int, minTime time.Duration) (time.Duration, int, error) {
	np := len(comms)
	ctx := context.Background()
	send := make([][]float32, np)
	recv := make([][]float32, np)
	for r := range send {
		send[r] = make([]float32, count)
		recv[r] = make([]float32, count)
		for i := range send[r] {
			send[r][i] = float32((r + i) % 16) // small integers: exact sums
		}
	}
	loop := func(iters int) (time.Duration, error) {
		times := make([]time.Duration, np)
		errs := make([]error, np)
		var wg sync.WaitGroup
		for r, c := range comms {
			wg.Go(func() {
				start := time.Now()
				for i := 0; i < iters && errs[r] == nil; i++ {
					errs[r] = collective.AllReduce(ctx, c, send[r], recv[r], collective.Sum)
				}
				times[r] = time.Since(start)
			})
		}
		wg.Wait()
		var worst time.Duration
		for r := range times {
			if errs[r] != nil {
				return 0, errs[r]
			}
			worst = max(worst, times[r])
		}
		return worst, nil
	}
	if _, err := loop(3); err != nil { // warm up
		return 0, 0, err
	}
	iters := 1
	for {
		d, err := loop(iters)
		if err != nil {
			return 0, 0, err
		}
		if d >= minTime || iters >= 1<<20 {
			wrong := 0
			for r := range recv {
				for i, v := range recv[r] {
					want := 0
					for q := 0; q < np; q++ {
						want += (q + i) % 16
					}
					if v != float32(want) {
						wrong++
					}
				}
			}
			return d / time.Duration(iters), wrong, nil
		}
		iters *= 2
	}
}
