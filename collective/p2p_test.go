package collective_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
)

// p2pPatterns are exchanges that complete under MPI's Isend/Irecv rules
// whatever the message size, and deadlocked (until the timeout) when
// every operation of a rank ran in issue order (issue 15): each starts
// every send and receive of the rank, then waits for all.
var p2pPatterns = map[string]func(ctx context.Context, c *collective.Comm, out, in []float32) ([]*collective.Request, error){
	// A ring shift that starts the receive first.
	"ring-recv-first": func(ctx context.Context, c *collective.Comm, out, in []float32) ([]*collective.Request, error) {
		n, r := c.Size(), c.Rank()
		return startAll(func() (*collective.Request, error) { return collective.StartRecv(ctx, c, in, (r+n-1)%n) },
			func() (*collective.Request, error) { return collective.StartSend(ctx, c, out, (r+1)%n) })
	},
	// And the send first.
	"ring-send-first": func(ctx context.Context, c *collective.Comm, out, in []float32) ([]*collective.Request, error) {
		n, r := c.Size(), c.Rank()
		return startAll(func() (*collective.Request, error) { return collective.StartSend(ctx, c, out, (r+1)%n) },
			func() (*collective.Request, error) { return collective.StartRecv(ctx, c, in, (r+n-1)%n) })
	},
	// Rank 0 sends to 1 and then 2; rank 1 sends to 2 before it receives
	// from 0; rank 2 receives from 0 before 1. In issue order each waits
	// on the next: 0 on 1, 1 on 2, 2 on 0. Ranks above 2 stand by.
	"cycle": func(ctx context.Context, c *collective.Comm, out, in []float32) ([]*collective.Request, error) {
		half := len(in) / 2
		switch c.Rank() {
		case 0:
			return startAll(func() (*collective.Request, error) { return collective.StartSend(ctx, c, out[:half], 1) },
				func() (*collective.Request, error) { return collective.StartSend(ctx, c, out[half:], 2) })
		case 1:
			return startAll(func() (*collective.Request, error) { return collective.StartSend(ctx, c, out[:half], 2) },
				func() (*collective.Request, error) { return collective.StartRecv(ctx, c, in[:half], 0) })
		case 2:
			return startAll(func() (*collective.Request, error) { return collective.StartRecv(ctx, c, in[half:], 0) },
				func() (*collective.Request, error) { return collective.StartRecv(ctx, c, in[:half], 1) })
		}
		return nil, nil
	},
}

func startAll(fs ...func() (*collective.Request, error)) ([]*collective.Request, error) {
	var rs []*collective.Request
	for _, f := range fs {
		r, err := f()
		if err != nil {
			return rs, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// checkP2P runs pattern on c with messages of n elements and checks what
// arrived: rank r sends r*1000+i.
func checkP2P(ctx context.Context, c *collective.Comm, name string, n int) error {
	out, in := make([]float32, n), make([]float32, n)
	for i := range out {
		out[i] = float32(c.Rank()*1000 + i%1000)
	}
	rs, err := p2pPatterns[name](ctx, c, out, in)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if err := r.Wait(ctx); err != nil {
			return err
		}
	}
	size, r := c.Size(), c.Rank()
	check := func(lo, hi, from int) error {
		for i := lo; i < hi; i++ {
			if want := float32(from*1000 + (i-lo)%1000); in[i] != want {
				return fmt.Errorf("rank %d: element %d from rank %d is %v, want %v", r, i, from, in[i], want)
			}
		}
		return nil
	}
	switch name {
	case "cycle":
		switch r {
		case 1:
			return check(0, n/2, 0)
		case 2:
			if err := check(0, n/2, 1); err != nil {
				return err
			}
			// Rank 0's second half starts at its element n/2.
			for i := n / 2; i < n; i++ {
				if want := float32(0*1000 + i%1000); in[i] != want {
					return fmt.Errorf("rank 2: element %d from rank 0 is %v, want %v", i, in[i], want)
				}
			}
		}
		return nil
	}
	return check(0, n, (r+size-1)%size)
}

func TestPointToPointCompletesInAnyOrder(t *testing.T) {
	for _, name := range []string{"ring-recv-first", "ring-send-first", "cycle"} {
		for _, n := range []int{1 << 10, 1 << 20, 0} { // 4 KiB, 4 MiB, empty
			t.Run(fmt.Sprintf("%s/%dB", name, 4*n), func(t *testing.T) {
				// A minute's timeout: a deadlock fails the test, it does
				// not stall it.
				comms, _ := newNet(t, 4, collective.WithTimeout(time.Minute))
				errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
					return checkP2P(context.Background(), c, name, n)
				})
				for r, err := range errs {
					require.NoError(t, err, "rank %d", r)
				}
			})
		}
	}
}

// An empty send is a message, as in MPI: a receive that expects data
// from it fails at once, on both ends, instead of waiting for the
// timeout.
func TestEmptySendAgainstAReceive(t *testing.T) {
	comms, _ := newNet(t, 2, collective.WithTimeout(time.Minute))
	start := time.Now()
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		if r == 0 {
			if err := collective.Send(ctx, c, []float32{}, 1); err != nil {
				return err
			}
			// The receiver's failure reaches this rank's next operation.
			return c.Barrier(ctx)
		}
		return collective.Recv(ctx, c, make([]float32, 5), 0)
	})
	require.Less(t, time.Since(start), 10*time.Second)
	require.ErrorIs(t, errs[1], collective.ErrMismatch)
	require.Contains(t, errs[1].Error(), "rank 0 sent 0 bytes")
	require.Contains(t, errs[1].Error(), "this rank expected 20 bytes")
	require.Error(t, errs[0])
	require.Contains(t, errs[0].Error(), "rank 1")
}

// A send waiting for its receive no longer holds back a collective
// started after it.
func TestPendingSendDoesNotHoldBackACollective(t *testing.T) {
	comms, _ := newNet(t, 2, collective.WithTimeout(time.Minute))
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		big := make([]float32, 1<<20) // larger than the connection holds
		var req *collective.Request
		var err error
		if r == 0 {
			req, err = collective.StartSend(ctx, c, big, 1)
		}
		if err != nil {
			return err
		}
		v := []int64{1}
		if err := collective.AllReduce(ctx, c, v, v, collective.Sum); err != nil || v[0] != 2 {
			return errors.Join(err, fmt.Errorf("sum %d", v[0]))
		}
		if r == 1 {
			return collective.Recv(ctx, c, big, 0)
		}
		return req.Wait(ctx)
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// Over the transports between processes: the same patterns, 4 ranks.
func TestMultiProcessPointToPointInAnyOrder(t *testing.T) {
	for _, tr := range allTransports() {
		t.Run(tr, func(t *testing.T) {
			res := spawn(t, "p2p", gocclEnvs(t, 4, transportEnv(t, tr)...), nil)
			requireAllOK(t, res)
			for _, r := range res {
				require.Contains(t, r.output, "9 exchanges checked", "rank %d", r.rank)
			}
		})
	}
}

// childP2P is a rank of TestMultiProcessPointToPointInAnyOrder.
func childP2P(ctx context.Context, c *collective.Comm) int {
	for _, name := range []string{"ring-recv-first", "ring-send-first", "cycle"} {
		for _, n := range []int{1 << 10, 1 << 20, 0} {
			if err := checkP2P(ctx, c, name, n); err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: %s with %d elements: %v\n", name, n, err)
				return 1
			}
		}
	}
	// Uneven all-to-all, gather and scatter.
	n, r := c.Size(), c.Rank()
	sc, rc := make([]int, n), make([]int, n)
	var send []int32
	total := 0
	for j := range n {
		sc[j], rc[j] = unevenCounts(r, j)*100, unevenCounts(j, r)*100 // up to 160 KiB blocks
		for k := range sc[j] {
			send = append(send, int32(r*1_000_000+j*1000+k%1000))
		}
		total += rc[j]
	}
	recv := make([]int32, total)
	if err := collective.AllToAllv(ctx, c, send, sc, recv, rc); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: alltoallv: %v\n", err)
		return 1
	}
	off := 0
	for i := range n {
		for k := range rc[i] {
			if want := int32(i*1_000_000 + r*1000 + k%1000); recv[off+k] != want {
				fmt.Fprintf(os.Stderr, "FAIL: alltoallv: element %d from rank %d is %d, want %d\n", k, i, recv[off+k], want)
				return 1
			}
		}
		off += rc[i]
	}
	mine := []float64{float64(r), float64(r * r)}
	var all []float64
	if r == n-1 {
		all = make([]float64, 2*n)
	}
	if err := collective.Gather(ctx, c, mine, all, n-1); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: gather: %v\n", err)
		return 1
	}
	if err := collective.Scatter(ctx, c, all, mine, n-1); err != nil || mine[0] != float64(r) || mine[1] != float64(r*r) {
		fmt.Fprintf(os.Stderr, "FAIL: scatter: %v, got %v\n", err, mine)
		return 1
	}
	fmt.Println("9 exchanges checked; alltoallv, gather and scatter too")
	return 0
}
