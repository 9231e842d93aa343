package collective_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/transport/shm"
)

// splitCheck splits c by color (NoColor for a color of -1) and key, and
// checks the child: its size, this rank's place in it (members by key,
// then parent rank), and an all-reduce over it and then over the parent.
func splitCheck(ctx context.Context, c *collective.Comm, colorOf, keyOf func(r int) int) (*collective.Comm, error) {
	r, n := c.Rank(), c.Size()
	child, err := c.Split(ctx, colorOf(r), keyOf(r))
	if err != nil {
		return nil, err
	}
	if colorOf(r) == collective.NoColor {
		if child != nil {
			return nil, fmt.Errorf("rank %d: NoColor got a communicator", r)
		}
		// Still in the parent's all-reduce below.
		p := []int64{1}
		if err := collective.AllReduce(ctx, c, p, p, collective.Sum); err != nil || p[0] != int64(n) {
			return nil, errors.Join(err, fmt.Errorf("rank %d: parent sum %d after the split", r, p[0]))
		}
		return nil, nil
	}
	var members []int
	for q := range n {
		if colorOf(q) == colorOf(r) {
			members = append(members, q)
		}
	}
	// By key, then rank (a stable sort by key of ranks in order).
	for i := 1; i < len(members); i++ {
		for j := i; j > 0 && keyOf(members[j]) < keyOf(members[j-1]); j-- {
			members[j], members[j-1] = members[j-1], members[j]
		}
	}
	if child.Size() != len(members) || members[child.Rank()] != r {
		child.Close()
		return nil, fmt.Errorf("rank %d: child rank %d of %d, want the place of %d in %v", r, child.Rank(), child.Size(), r, members)
	}
	// Each member contributes its parent rank, and its child rank.
	v := []int64{int64(r), int64(child.Rank())}
	if err := collective.AllReduce(ctx, child, v, v, collective.Sum); err != nil {
		child.Close()
		return nil, err
	}
	want := int64(0)
	for _, q := range members {
		want += int64(q)
	}
	if k := int64(len(members)); v[0] != want || v[1] != k*(k-1)/2 {
		child.Close()
		return nil, fmt.Errorf("rank %d: child sum %v, want [%d %d]", r, v, want, k*(k-1)/2)
	}
	p := []int64{1}
	if err := collective.AllReduce(ctx, c, p, p, collective.Sum); err != nil || p[0] != int64(n) {
		child.Close()
		return nil, errors.Join(err, fmt.Errorf("rank %d: parent sum %d after the split", r, p[0]))
	}
	return child, nil
}

func TestSplitLocal(t *testing.T) {
	comms := newGroup(t, 6)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		// Rows of a 2×3 grid, ordered backwards by key; then columns, with
		// rank 5 left out; then everyone in one, by key 0 (rank order).
		rows, err := splitCheck(ctx, c, func(q int) int { return q / 3 }, func(q int) int { return -q })
		if err != nil {
			return err
		}
		defer rows.Close()
		cols, err := splitCheck(ctx, c, func(q int) int {
			if q == 5 {
				return collective.NoColor
			}
			return q % 3
		}, func(q int) int { return 0 })
		if err != nil {
			return err
		}
		if cols != nil {
			defer cols.Close()
		}
		all, err := splitCheck(ctx, c, func(int) int { return 7 }, func(int) int { return 0 })
		if err != nil {
			return err
		}
		defer all.Close()
		// A child of a child.
		sub, err := splitCheck(ctx, rows, func(q int) int { return q % 2 }, func(q int) int { return q })
		if err != nil {
			return err
		}
		defer sub.Close()
		// Parent and children in turn.
		for range 3 {
			for _, cc := range []*collective.Comm{c, rows, all, sub} {
				v := []float32{1}
				if err := collective.AllReduce(ctx, cc, v, v, collective.Sum); err != nil || v[0] != float32(cc.Size()) {
					return errors.Join(err, fmt.Errorf("rank %d: sum %v on a communicator of %d", r, v[0], cc.Size()))
				}
			}
		}
		return nil
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// An abort on a child leaves the parent and the sibling usable.
func TestSplitFailureStaysInTheChild(t *testing.T) {
	comms := newGroup(t, 4)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		child, err := c.Split(ctx, r%2, r)
		if err != nil {
			return err
		}
		defer child.Close()
		if r%2 == 0 {
			if r == 0 {
				child.Abort(errors.New("rank 0 gives up on its child"))
			}
			v := make([]float32, 1000)
			if err := collective.AllReduce(ctx, child, v, v, collective.Sum); !errors.Is(err, collective.ErrAborted) && r == 0 {
				return fmt.Errorf("rank 0: the aborted child still works: %v", err)
			} else if r == 2 && err == nil {
				return fmt.Errorf("rank 2: the all-reduce with an aborted member succeeded")
			}
		} else {
			v := []int64{1}
			if err := collective.AllReduce(ctx, child, v, v, collective.Sum); err != nil || v[0] != 2 {
				return errors.Join(err, fmt.Errorf("rank %d: sibling sum %d", r, v[0]))
			}
		}
		v := []int64{1}
		if err := collective.AllReduce(ctx, c, v, v, collective.Sum); err != nil || v[0] != 4 {
			return errors.Join(err, fmt.Errorf("rank %d: parent sum %d", r, v[0]))
		}
		return nil
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// TestSplitExchange: every rank's color, key, root port and PeerInfo
// reach every rank, a PeerInfo longer than the first all-gather holds
// takes the second, and a rank that failed before Split's exchange (its
// listeners, say) still takes part in it, saying so, so that every rank
// learns it at once and the parent stays in step.
func TestSplitExchange(t *testing.T) {
	comms := newGroup(t, 3)
	infos := []string{"x", "", strings.Repeat("z", collective.SplitInline+77)}
	for _, long := range []bool{false, true} {
		res := make([][]collective.SplitPart, 3)
		errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
			info := infos[r]
			if r == 2 && !long {
				info = "xxx"
			}
			var err error
			res[r], err = c.SplitExchange(context.Background(), collective.SplitPart{Color: r % 2, Key: -r, Port: int64(100 + r), Info: []byte(info), Failed: r == 1})
			return err
		})
		require.NoError(t, errors.Join(errs...))
		for r := range 3 {
			got := res[r]
			require.Len(t, got, 3)
			for q, p := range got {
				require.Equal(t, q%2, p.Color, "rank %d's view of %d", r, q)
				require.Equal(t, -q, p.Key)
				require.Equal(t, int64(100+q), p.Port)
				require.Equal(t, q == 1, p.Failed)
			}
			require.Equal(t, "x", string(got[0].Info))
			require.Empty(t, got[1].Info, "a failed rank sends no PeerInfo")
			if long {
				require.Equal(t, infos[2], string(got[2].Info), "the long PeerInfo, by the second all-gather")
			} else {
				require.Equal(t, "xxx", string(got[2].Info))
			}
		}
	}
	// The parent is still in step.
	require.NoError(t, errors.Join(runRanks(t, comms, func(_ int, c *collective.Comm) error { return c.Barrier(context.Background()) })...))
}

func TestSplitBadArguments(t *testing.T) {
	comms := newGroup(t, 1)
	_, err := comms[0].Split(context.Background(), -2, 0)
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
	var nilComm *collective.Comm
	_, err = nilComm.Split(context.Background(), 0, 0)
	require.ErrorIs(t, err, collective.ErrNilComm)
}

// Between processes: 4 ranks as 2 data-parallel × 2 tensor-parallel
// groups, both splits used in turn with the parent.
func TestMultiProcessSplit(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			res := spawn(t, "split", gocclEnvs(t, 4, transportEnv(t, tr)...), nil)
			requireAllOK(t, res)
			for _, r := range res {
				require.Contains(t, r.output, "split ok", "rank %d", r.rank)
			}
			t.Logf("rank 0: %s", res[0].output)
		})
	}
}

// TestMultiProcessSplitThenClose: children closed right after Split,
// while their boards and watches are still being joined in the
// background, many times over: nothing hangs, no connection is dropped
// half-way (the peers would log it), and no goroutine is left.
func TestMultiProcessSplitThenClose(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			res := spawn(t, "splitclose", gocclEnvs(t, 4, transportEnv(t, tr)...), nil)
			requireAllOK(t, res)
			for _, r := range res {
				require.Contains(t, r.output, "split and closed 30 times", "rank %d", r.rank)
				require.NotContains(t, r.output, "dropped", "rank %d: a hand-over broken by a close", r.rank)
				require.NotContains(t, r.output, "no watch", "rank %d", r.rank)
			}
			t.Logf("rank 0: %s", res[0].output)
		})
	}
}

func childSplitThenClose(ctx context.Context, c *collective.Comm) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	before := runtime.NumGoroutine()
	start := time.Now()
	for i := range 30 {
		color := 0
		if i%2 == 1 {
			color = c.Rank() % 2
		}
		child, err := c.Split(ctx, color, c.Rank())
		if err != nil {
			return fail(err)
		}
		if i%3 == 2 {
			// Some used at once, before their board has come.
			v := []int64{1}
			if err := collective.AllReduce(ctx, child, v, v, collective.Sum); err != nil || v[0] != int64(child.Size()) {
				return fail(errors.Join(err, fmt.Errorf("sum %d on a child of %d", v[0], child.Size())))
			}
		}
		t0 := time.Now()
		if err := child.Close(); err != nil {
			return fail(err)
		}
		if d := time.Since(t0); d > 500*time.Millisecond {
			return fail(fmt.Errorf("split %d: Close took %v", i, d))
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return fail(err)
	}
	took := time.Since(start)
	// The children's goroutines end with their Close; a root's, in the
	// process of a child's rank 0, once every member has said goodbye.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before+2 {
		return fail(fmt.Errorf("%d goroutines after 30 splits and closes, %d before", g, before))
	}
	fmt.Printf("split and closed 30 times in %v; goroutines %d before, %d after\n", took.Round(time.Millisecond), before, runtime.NumGoroutine())
	return 0
}

// TestMultiProcessSplitIdleDeath: a member of an idle child dies; the
// child's other members learn it from the child's own watch (joined after
// Split returned) within 3 s, naming the member by its rank in the child.
func TestMultiProcessSplitIdleDeath(t *testing.T) {
	const n, victim = 4, 3 // parent rank 3 is rank 1 of the odd child
	res := spawn(t, "splitidlekill", gocclEnvs(t, n, "GOCCL_TEST_VICTIM="+strconv.Itoa(victim)), nil)
	for _, r := range res {
		if r.rank == victim {
			require.NotEqual(t, 0, r.code)
			continue
		}
		require.Equal(t, 0, r.code, "rank %d:\n%s", r.rank, r.output)
		t.Logf("rank %d: %s", r.rank, strings.TrimSpace(r.output))
		if r.rank%2 == 1 {
			require.Contains(t, r.output, "child learned after", "rank %d", r.rank)
		}
	}
}

func childSplitIdleDeath(ctx context.Context, c *collective.Comm) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	victim, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_VICTIM"))
	child, err := c.Split(ctx, c.Rank()%2, c.Rank())
	if err != nil {
		return fail("split: %v", err)
	}
	defer child.Close()
	if err := child.Barrier(ctx); err != nil {
		return fail("barrier: %v", err)
	}
	if c.Rank() == victim {
		time.Sleep(200 * time.Millisecond)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if c.Rank()%2 != victim%2 {
		return 0 // the other child: nothing to learn
	}
	start := time.Now()
	select {
	case <-child.Context().Done():
	case <-time.After(20 * time.Second):
		return fail("no news of the victim's death on the child after 20 s")
	}
	cause := context.Cause(child.Context())
	want := fmt.Sprintf("rank %d", victim/2) // its rank in the odd child
	if !strings.Contains(cause.Error(), want) {
		return fail("the cause does not name %s: %v", want, cause)
	}
	if d := time.Since(start); d > 3*time.Second {
		return fail("learned after %v", d)
	}
	fmt.Printf("child learned after %v: %v\n", time.Since(start), cause)
	return 0
}

func childSplit(ctx context.Context, c *collective.Comm) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	start := time.Now()
	if err := c.Barrier(ctx); err != nil {
		return fail(err)
	}
	barrier := time.Since(start)
	start = time.Now()
	dp, err := splitCheck(ctx, c, func(q int) int { return q % 2 }, func(q int) int { return q })
	if err != nil {
		return fail(err)
	}
	took := time.Since(start)
	defer dp.Close()
	// Keys in reverse: each child's rank 0, whose root the child keeps,
	// is its higher parent rank.
	tp, err := splitCheck(ctx, c, func(q int) int { return q / 2 }, func(q int) int { return -q })
	if err != nil {
		return fail(err)
	}
	defer tp.Close()
	// Children of one rank each, and a child's child (the child's ranks
	// share a host, so it has no TCP listener: neither do these).
	solo, err := splitCheck(ctx, c, func(q int) int { return q }, func(int) int { return 0 })
	if err != nil {
		return fail(err)
	}
	defer solo.Close()
	grand, err := splitCheck(ctx, dp, func(int) int { return 0 }, func(q int) int { return -q })
	if err != nil {
		return fail(err)
	}
	defer grand.Close()
	for i := range 5 {
		for _, cc := range []*collective.Comm{tp, dp, c, solo, grand} {
			v := make([]float32, 1<<16)
			v[0] = float32(i)
			if err := collective.AllReduce(ctx, cc, v, v, collective.Sum); err != nil || v[0] != float32(i*cc.Size()) {
				return fail(errors.Join(err, fmt.Errorf("sum %v on a communicator of %d", v[0], cc.Size())))
			}
		}
	}
	fmt.Printf("split ok: barrier %v, split and check %v\n", barrier, took)
	return 0
}

// TestSplitRecordFitsTheBoard: on one host Split's exchange runs on the
// shared board (one post, one read of the others') only if a rank's
// record fits an entry.
func TestSplitRecordFitsTheBoard(t *testing.T) {
	if !shm.Supported {
		t.Skip("no shared-memory transport (and no board) on this platform")
	}
	require.LessOrEqual(t, collective.SplitRecord, shm.BoardMax)
}

// TestLocalRootAddr: a child's root on one host is found by its secret
// and its rank 0's pid alone; another job with the same secret (another
// pid) or another child (another secret) listens elsewhere, and the name
// does not give the secret away.
func TestLocalRootAddr(t *testing.T) {
	a, b := [16]byte{1, 2, 3}, [16]byte{1, 2, 4}
	require.Equal(t, collective.LocalRootAddr(a, 100), collective.LocalRootAddr(a, 100))
	require.NotEqual(t, collective.LocalRootAddr(a, 100), collective.LocalRootAddr(a, 101))
	require.NotEqual(t, collective.LocalRootAddr(a, 100), collective.LocalRootAddr(b, 100))
	require.True(t, strings.HasPrefix(collective.LocalRootAddr(a, 100), "@goccl-root-100-"))
	require.NotContains(t, collective.LocalRootAddr(a, 100), "010203")
}
