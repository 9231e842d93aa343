package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
)

// A rank whose process is stopped (SIGSTOP) keeps its sockets open and the
// kernel acknowledges them, so nothing breaks: without the heartbeat its
// peers waited for the operation timeout, and their errors named whichever
// neighbour they waited on. With it every survivor's error names the
// stopped rank within the heartbeat timeout and an interval (issue 18). A
// rank stopped for less than the timeout, or busy between collectives for
// longer, is never reported.

const freezeHeartbeat = 3 * time.Second

func TestMultiProcessFrozenRank(t *testing.T) {
	type tc struct {
		transport string
		n, victim int
		mode      string // stop (mid-operation), between, cont, busy
	}
	cases := []tc{{"tcp", 3, 1, "stop"}, {"tcp", 3, 2, "between"}, {"tcp", 4, 2, "between"}, {"tcp", 3, 0, "stop"},
		{"tcp", 3, 1, "cont"}, {"tcp", 3, 1, "busy"}, {"tcp", 4, 1, "shrink"}}
	if len(transports()) > 1 {
		cases = append(cases, tc{"shm", 3, 1, "stop"}, tc{"shm", 4, 2, "stop"}, tc{"shm", 3, 1, "between"},
			tc{"shm", 4, 3, "between"}, tc{"shm", 3, 2, "cont"})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/n=%d/victim=%d/%s", c.transport, c.n, c.victim, c.mode), func(t *testing.T) {
			t.Parallel()
			res := spawn(t, "freeze", gocclEnvs(t, c.n, "GOCCL_TRANSPORT="+c.transport, "GOCCL_TIMEOUT=10m",
				"GOCCL_HEARTBEAT_TIMEOUT="+freezeHeartbeat.String(), "GOCCL_TEST_VICTIM="+strconv.Itoa(c.victim), "GOCCL_TEST_FREEZE="+c.mode), nil)
			for _, r := range res {
				t.Logf("rank %d (exit %d): %s", r.rank, r.code, strings.TrimSpace(r.output))
				if r.rank == c.victim && (c.mode == "stop" || c.mode == "between" || c.mode == "shrink") {
					continue // killed by its waker once the others are done
				}
				require.Equal(t, 0, r.code, "rank %d:\n%s", r.rank, r.output)
				if c.mode == "cont" || c.mode == "busy" {
					require.Contains(t, r.output, "finished", "rank %d", r.rank)
					require.NotContains(t, r.output, "stopped responding", "rank %d", r.rank)
				} else {
					// The stopped rank, never a neighbour, is the one that
					// stopped responding.
					require.Regexp(t, fmt.Sprintf(`rank %d( \(it hosts the bootstrap root at [^)]*\))? stopped responding`, c.victim), r.output, "rank %d", r.rank)
				}
				if c.mode == "shrink" {
					require.Contains(t, r.output, fmt.Sprintf("shrunk to %d ranks", c.n-1), "rank %d", r.rank)
				}
			}
		})
	}
}

// childFreeze is a rank of TestMultiProcessFrozenRank. Every rank runs
// small all-reduces; the victim stops its own process at the 200th (in
// the middle of it, or between two), having started a waker that kills it
// (or continues it, in mode cont) later; in mode busy it computes for 30 s
// instead.
// The others print the error that ends their loop and how long the
// operation ran, and check it.
func childFreeze(ctx context.Context, c *collective.Comm) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	victim, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_VICTIM"))
	mode := os.Getenv("GOCCL_TEST_FREEZE")
	const at, total = 200, 600
	buf := make([]float32, 2)
	waker := func(after time.Duration, sig string) {
		exec.Command("sh", "-c", fmt.Sprintf("sleep %.1f; kill -%s %d", after.Seconds(), sig, os.Getpid())).Start()
	}
	limit := total
	if mode == "stop" || mode == "shrink" {
		// The victim stops itself 1 ms after the 200th, from another
		// goroutine, to land mid-operation; on shared memory the other
		// 400 small all-reduces can finish within that millisecond. So
		// every rank runs on until the stop ends its loop (the waker's
		// kill ends the victim's, and then the others' too).
		limit = math.MaxInt
	}
	for i := 0; i < limit; i++ {
		if c.Rank() == victim && i == at {
			switch mode {
			case "stop", "shrink":
				waker(3*freezeHeartbeat, "KILL")
				go func() {
					time.Sleep(time.Millisecond)
					syscall.Kill(os.Getpid(), syscall.SIGSTOP)
				}()
			case "between":
				waker(3*freezeHeartbeat, "KILL")
				syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			case "cont":
				waker(freezeHeartbeat/3, "CONT")
				syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			case "busy":
				// 30 s of computing between two collectives, ten heartbeat
				// timeouts: the library answers meanwhile.
				x := 1.0
				for t0 := time.Now(); time.Since(t0) < 30*time.Second; {
					for range 1 << 16 {
						x = x*1.0000001 + 1e-9
					}
				}
				buf[0] = float32(x) * 0
			}
		}
		start := time.Now()
		err := collective.AllReduce(ctx, c, buf, buf, collective.Sum)
		if err == nil {
			continue
		}
		took := time.Since(start)
		fmt.Printf("after %v: %v\n", took.Round(time.Millisecond), err)
		var oe *collective.OpError
		if !errors.As(err, &oe) {
			return fail("not an OpError: %v", err)
		}
		// From the victim's stop the error takes the heartbeat timeout and
		// an interval (the root's report, or the ranks' own watch of a
		// stopped root), plus scheduling: the issue asks for 2 s at most
		// past the timeout, well under the 10 m operation timeout.
		if took > freezeHeartbeat+2*time.Second && mode != "between" {
			return fail("the stopped rank was named after %v", took)
		}
		if mode == "shrink" {
			// The root counts the silent rank out, as a dead one.
			nc, err := c.Shrink(ctx)
			if err != nil {
				return fail("shrink: %v", err)
			}
			defer nc.Close()
			v := []int64{1}
			if err := collective.AllReduce(ctx, nc, v, v, collective.Sum); err != nil || v[0] != int64(nc.Size()) {
				return fail("all-reduce after the shrink: %v, sum %d", err, v[0])
			}
			fmt.Printf("shrunk to %d ranks\n", nc.Size())
		}
		return 0
	}
	fmt.Println("finished")
	return 0
}

// On a 4-rank ring where rank 3 never calls the 51st all-reduce, the
// others time out waiting in a chain: 0 on 3, 1 on 0, 2 on 1. Every rank's
// error names rank 3 as the end of the chain and what it last did, and
// each says how its own wait leads there; rank 3 learns it was the one
// (issue 18).
func TestMultiProcessChainOfWaits(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			res := spawn(t, "chain", gocclEnvs(t, 4, "GOCCL_TRANSPORT="+tr, "GOCCL_ALGO=ring", "GOCCL_TIMEOUT="+chainTimeout.String()), nil)
			for _, r := range res {
				t.Logf("rank %d (exit %d): %s", r.rank, r.code, strings.TrimSpace(r.output))
				require.Equal(t, 0, r.code, "rank %d:\n%s", r.rank, r.output)
				if r.rank == 3 {
					require.Contains(t, r.output, "the chain of waits ends at rank 3, which has not called allreduce#50: its last operation, allreduce#49, finished")
					continue
				}
				require.Contains(t, r.output, "the chain of waits ends at rank 3, which has not called allreduce#50: its last operation, allreduce#49, finished")
				require.Contains(t, r.output, fmt.Sprintf("rank %d waits on rank ", r.rank))
			}
			// Rank 0 receives from rank 3 on the ring: it waits on it
			// directly; rank 2 through ranks 1 and 0.
			require.Contains(t, res[0].output, "rank 0 waits on rank 3 (allreduce#50")
			require.Regexp(t, `rank 2 waits on rank 1 \(allreduce#50: [^)]*\), which waits on rank 0, which waits on rank 3`, res[2].output)
		})
	}
}

const chainTimeout = 3 * time.Second

// childChain is a rank of TestMultiProcessChainOfWaits.
func childChain(ctx context.Context, c *collective.Comm) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	const ops = 50
	buf := make([]float32, 256<<10) // 1 MiB: pipelined over the ring, not one shot
	for i := 0; i < ops; i++ {
		if err := collective.AllReduce(ctx, c, buf, buf, collective.Sum); err != nil {
			return fail("all-reduce %d: %v", i, err)
		}
	}
	var se *collective.StallError
	if c.Rank() == 3 {
		// Busy elsewhere: the library still answers the root.
		select {
		case <-c.Context().Done():
		case <-time.After(chainTimeout + 10*time.Second):
			return fail("the communicator was not aborted")
		}
		cause := context.Cause(c.Context())
		if !errors.As(cause, &se) || se.End != 3 || !errors.Is(cause, collective.ErrTimeout) {
			return fail("the cause is not a stall ending here: %v", cause)
		}
		fmt.Println(cause)
		return 0
	}
	start := time.Now()
	err := collective.AllReduce(ctx, c, buf, buf, collective.Sum)
	took := time.Since(start)
	fmt.Printf("after %v: %v\n", took.Round(time.Millisecond), err)
	if !errors.As(err, &se) || !errors.Is(err, collective.ErrTimeout) {
		return fail("not a stall: %v", err)
	}
	if se.End != 3 || se.Chain[0] != c.Rank() || se.Chain[len(se.Chain)-1] != 3 {
		return fail("the chain %v does not lead from this rank to rank 3", se.Chain)
	}
	if took > chainTimeout+3*time.Second {
		return fail("the diagnosis took %v after the %v timeout", took-chainTimeout, chainTimeout)
	}
	return 0
}
