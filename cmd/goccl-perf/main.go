// Command goccl-perf measures goccl's collectives in the manner of
// nccl-tests' all_reduce_perf: a sweep over sizes, time per operation,
// algorithm and bus bandwidth, and a check of every result.
//
//	goccl-perf -np 2 -b 8 -e 64M -f 4          # starts 2 local ranks itself
//	goccl-run -np 4 goccl-perf -b 1M -e 1G      # or under any launcher
//	goccl-perf -local -np 4                    # 4 ranks in one process
//
// Without -np it joins the job its launcher describes (collective.InitFromEnv).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/bench"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/launch"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		np      = flag.Int("np", 0, "start this many local ranks (processes, or goroutines with -local)")
		local   = flag.Bool("local", false, "run the ranks in this process (with -np)")
		coll    = flag.String("C", "all_reduce", "collective: all_reduce, reduce_scatter, all_gather, broadcast")
		minB    = flag.String("b", "8", "smallest size in bytes (K, M, G suffixes)")
		maxB    = flag.String("e", "64M", "largest size in bytes")
		factor  = flag.Int64("f", 2, "size multiplication factor")
		iters   = flag.Int("n", 20, "timed iterations per size")
		warmup  = flag.Int("w", 5, "warmup iterations per size")
		checkV  = flag.Int("c", 1, "check results (1) or not (0)")
		target  = flag.Duration("target", 0, "time each size for about this long instead of -n iterations")
		root    = flag.Int("r", 0, "root for broadcast")
		inplace = flag.Bool("inplace", false, "run in place")
		algo    = flag.String("algo", "auto", "all-reduce algorithm: auto, ring, tree, recdoubling, rabenseifner, oneshot")
		cpuProf = flag.String("cpuprofile", "", "write each rank's CPU profile to this file with .RANK appended (go tool pprof reads it)")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	lo, err := collective.ParseSize(*minB)
	if err != nil {
		return fail(err)
	}
	hi, err := collective.ParseSize(*maxB)
	if err != nil {
		return fail(err)
	}
	a, err := algorithms.ParseAlgorithm(*algo)
	if err != nil {
		return fail(err)
	}
	o := bench.Options{Coll: bench.Coll(*coll), MinBytes: lo, MaxBytes: hi, Factor: *factor, Iters: *iters,
		Warmup: *warmup, Target: *target, Check: *checkV != 0, Root: *root, InPlace: *inplace}
	opts := []collective.Option{}
	if a != algorithms.AlgoAuto {
		opts = append(opts, collective.WithAlgorithm(a))
	}

	switch {
	case *np > 0 && *local:
		comms, err := collective.NewLocalGroup(*np, opts...)
		if err != nil {
			return fail(err)
		}
		defer func() {
			for _, c := range comms {
				c.Close()
			}
		}()
		errs := make(chan error, len(comms))
		for _, c := range comms {
			go func() { errs <- sweep(ctx, c, o) }()
		}
		var first error
		for range comms {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		if first != nil {
			return fail(first)
		}
		return 0
	case *np > 0:
		self, err := os.Executable()
		if err != nil {
			return fail(err)
		}
		err = launch.Run(ctx, launch.Options{NP: *np, Program: self, Args: withoutNP(os.Args[1:]), Stdout: os.Stdout, Stderr: os.Stderr})
		var ee *launch.ExitError
		if errors.As(err, &ee) && ee.Code > 0 {
			fmt.Fprintln(os.Stderr, "goccl-perf:", err)
			return ee.Code
		}
		if err != nil {
			return fail(err)
		}
		return 0
	}
	c, err := collective.InitFromEnv(ctx, opts...)
	if err != nil {
		return fail(fmt.Errorf("%w\n(run under a launcher, or give -np N to start N local ranks)", err))
	}
	defer c.Close()
	if *cpuProf != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", *cpuProf, c.Rank()))
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := sweep(ctx, c, o); err != nil {
		return fail(err)
	}
	return 0
}

func sweep(ctx context.Context, c *collective.Comm, o bench.Options) error {
	var out io.Writer // rank 0 prints
	if c.Rank() == 0 {
		out = os.Stdout
		bench.Header(out, c, o)
	}
	start := time.Now()
	rows, err := bench.Run(ctx, c, o, out)
	if out != nil {
		bench.Footer(out, rows, err)
		fmt.Fprintf(out, "# Total time %.1fs\n", time.Since(start).Seconds())
	}
	return err
}

// withoutNP drops -np N (and -np=N) from the arguments for the children.
func withoutNP(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-np" || a == "--np":
			i++
		case len(a) > 4 && (a[:4] == "-np=" || (len(a) > 5 && a[:5] == "--np=")):
		default:
			out = append(out, a)
		}
	}
	return out
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "goccl-perf:", err)
	return 1
}
