// flightjob is a goccl job that goes wrong on purpose, for goccl-run's
// flight recorder test: every rank runs one all-reduce, then rank 1
// stops taking part (hang), calls a broadcast instead (mismatch), stops
// its own process (stop) or exits, leaving the others to shrink the
// communicator and go on (shrink).
package main

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/goccl/goccl/collective"
)

func main() {
	ctx := context.Background()
	// A stopped rank is named by the heartbeat, long before a timeout.
	opts := []collective.Option{collective.WithTimeout(2 * time.Second)}
	switch os.Args[1] {
	case "hangforever": // until goccl-run is interrupted
		opts = []collective.Option{collective.WithTimeout(time.Hour)}
	case "stop":
		opts = []collective.Option{collective.WithTimeout(time.Minute), collective.WithHeartbeatTimeout(1500 * time.Millisecond)}
	}
	c, err := collective.InitFromEnv(ctx, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	buf := make([]float32, 1024)
	if err := collective.AllReduce(ctx, c, buf, buf, collective.Sum); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch {
	case c.Rank() == 1 && (os.Args[1] == "hang" || os.Args[1] == "hangforever"):
		time.Sleep(time.Hour)
	case os.Args[1] == "shrink": // rank 1 dies; the others go on without it
		if c.Rank() == 1 {
			// Let the others finish the first all-reduce, as in
			// "mismatch": a rank still draining it when this one's
			// death is seen fails it and exits before it can shrink.
			time.Sleep(300 * time.Millisecond)
			os.Exit(7)
		}
		err = collective.AllReduce(ctx, c, buf, buf, collective.Sum)
		if err == nil {
			err = fmt.Errorf("the all-reduce without rank 1 succeeded")
			break
		}
		nc, serr := c.Shrink(ctx)
		if serr != nil {
			err = serr
			break
		}
		v := []int64{1}
		err = collective.AllReduce(ctx, nc, v, v, collective.Sum)
		if err == nil {
			fmt.Printf("rank %d: went on as rank %d of %d (sum %d)\n", c.Rank(), nc.Rank(), nc.Size(), v[0])
		}
		nc.Close()
	case c.Rank() == 1 && os.Args[1] == "stop":
		// kill returns before the stop reaches this thread (another
		// thread takes the signal and stops the others): without the
		// sleep, this rank sometimes went on to Close first.
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		time.Sleep(time.Hour)
	case c.Rank() == 1 && os.Args[1] == "mismatch":
		// Let the others finish the first all-reduce: rank 1's abort
		// fails a rank still draining it, whose recorder then shows no
		// second operation.
		time.Sleep(300 * time.Millisecond)
		err = collective.Broadcast(ctx, c, buf, buf, 0)
	default:
		err = collective.AllReduce(ctx, c, buf, buf, collective.Sum)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
