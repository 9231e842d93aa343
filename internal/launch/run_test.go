//go:build unix

package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// testTimeout bounds every wait for an event in these tests. Children that
// should be stopped sleep for childSleep, far longer, so a test that ends
// within testTimeout shows that Run stopped them.
const (
	testTimeout = 30 * time.Second
	childSleep  = time.Hour
)

// childEnvVar makes the test binary act as a rank (see child); its value
// says how.
const childEnvVar = "GOCCL_LAUNCH_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode, ok := os.LookupEnv(childEnvVar); ok {
		os.Exit(child(mode))
	}
	goleak.VerifyTestMain(m)
}

// child is what the test binary does when Run starts it as a rank.
func child(mode string) int {
	rank, _ := strconv.Atoi(os.Getenv(VarRank))
	switch mode {
	case "ok":
		fmt.Printf("hello from %d\n", rank)
		return 0
	case "lines":
		x := strings.Repeat("x", 50)
		for i := range 200 {
			// Two writes per line, so that a launcher that copied bytes
			// rather than lines would interleave the ranks mid-line.
			fmt.Fprintf(os.Stdout, "rank=%d line=%d ", rank, i)
			fmt.Fprintf(os.Stdout, "%s\n", x)
			fmt.Fprintf(os.Stderr, "err rank=%d ", rank)
			fmt.Fprintf(os.Stderr, "line=%d\n", i)
		}
		fmt.Fprintf(os.Stdout, "tail rank=%d", rank) // no newline
		return 0
	case "long":
		os.Stdout.Write(bytes.Repeat([]byte("y"), 2*maxLine+100))
		os.Stdout.Write([]byte("\nafter\n"))
		return 0
	case "env":
		e, err := FromEnv(os.LookupEnv)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Printf("env rank=%d size=%d local=%d/%d root=%s secret=%s source=%s id=%q extra=%s\n",
			e.Rank, e.Size, e.LocalRank, e.LocalSize, e.Root, e.Secret, e.Source, e.ID, os.Getenv("GOCCL_LAUNCH_TEST_EXTRA"))
		return 0
	case "fail":
		if rank == 1 {
			fmt.Fprintln(os.Stderr, "failing")
			return 3
		}
		fmt.Println("ready")
		time.Sleep(childSleep)
		return 0
	case "failfast": // rank 1 fails at once, the others finish later
		if rank == 1 {
			return 3
		}
		time.Sleep(500 * time.Millisecond)
		fmt.Println("finished after rank 1 failed")
		return 0
	case "killself":
		if rank == 0 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		time.Sleep(childSleep)
		return 0
	case "sleep":
		fmt.Printf("ready pid=%d\n", os.Getpid())
		time.Sleep(childSleep)
		return 0
	case "ignoreterm":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		time.Sleep(childSleep)
		return 0
	case "grandchild":
		exe, err := os.Executable()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		gc := exec.Command(exe)
		gc.Env = append(os.Environ(), childEnvVar+"=sleep")
		gc.Stdout = os.Stdout // holds the rank's output pipe open too
		if err := gc.Start(); err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Println("rank ready")
		time.Sleep(childSleep)
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown %s=%q\n", childEnvVar, mode)
	return 2
}

// testOptions returns Options that start np copies of the test binary as
// children in the given mode.
func testOptions(t *testing.T, np int, mode string) Options {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	// A race-enabled child sleeps a second at exit unless told otherwise.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	return Options{NP: np, Program: exe, Env: []string{childEnvVar + "=" + mode, "GORACE=" + gorace}}
}

// watchBuffer is an io.Writer that lets a test wait for what was written.
type watchBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every Write
}

func newWatchBuffer() *watchBuffer { return &watchBuffer{changed: make(chan struct{})} }

func (w *watchBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.changed)
	w.changed = make(chan struct{})
	return w.buf.Write(p)
}

func (w *watchBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitCount waits until substr has been written at least n times.
func (w *watchBuffer) waitCount(t *testing.T, substr string, n int) {
	t.Helper()
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		got, changed := strings.Count(w.buf.String(), substr), w.changed
		w.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			require.FailNowf(t, "timed out", "waited %v for %d times %q; output so far:\n%s", testTimeout, n, substr, w.String())
		}
	}
}

// runAsync runs Run in a goroutine; the result arrives on the channel.
func runAsync(ctx context.Context, o Options) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, o) }()
	return errc
}

// await waits for Run's result.
func await(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(testTimeout):
		require.FailNow(t, "Run did not return", "waited %v", testTimeout)
		return nil
	}
}

func TestRunAllSucceed(t *testing.T) {
	o := testOptions(t, 3, "ok")
	var out bytes.Buffer
	o.Stdout = &out
	require.NoError(t, Run(context.Background(), o))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.ElementsMatch(t, []string{"[0] hello from 0", "[1] hello from 1", "[2] hello from 2"}, lines)
}

func TestRunPrefixesWholeLines(t *testing.T) {
	const np = 3
	o := testOptions(t, np, "lines")
	var stdout, stderr bytes.Buffer
	o.Stdout, o.Stderr = &stdout, &stderr
	require.NoError(t, Run(context.Background(), o))

	outLine := regexp.MustCompile(`^\[(\d+)\] rank=(\d+) line=(\d+) x{50}$`)
	tail := regexp.MustCompile(`^\[(\d+)\] tail rank=(\d+)$`)
	next := make([]int, np)
	tails := make([]bool, np)
	for _, l := range strings.Split(stdout.String(), "\n") {
		if l == "" {
			continue
		}
		if m := tail.FindStringSubmatch(l); m != nil {
			require.Equal(t, m[1], m[2], "line %q has another rank's prefix", l)
			r, _ := strconv.Atoi(m[1])
			require.False(t, tails[r], "rank %d's partial last line came twice", r)
			require.Equal(t, 200, next[r], "rank %d's partial last line came before its other lines", r)
			tails[r] = true
			continue
		}
		m := outLine.FindStringSubmatch(l)
		require.NotNil(t, m, "stdout line %q is not one whole prefixed line", l)
		require.Equal(t, m[1], m[2], "line %q has another rank's prefix", l)
		r, _ := strconv.Atoi(m[1])
		i, _ := strconv.Atoi(m[3])
		require.Equal(t, next[r], i, "rank %d's lines out of order", r)
		next[r]++
	}
	require.Equal(t, []int{200, 200, 200}, next)
	require.Equal(t, []bool{true, true, true}, tails)
	require.True(t, strings.HasSuffix(stdout.String(), "\n"))

	errLine := regexp.MustCompile(`^\[(\d+)\] err rank=(\d+) line=(\d+)$`)
	count := make([]int, np)
	for _, l := range strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n") {
		m := errLine.FindStringSubmatch(l)
		require.NotNil(t, m, "stderr line %q is not one whole prefixed line", l)
		require.Equal(t, m[1], m[2])
		r, _ := strconv.Atoi(m[1])
		count[r]++
	}
	require.Equal(t, []int{200, 200, 200}, count)
}

func TestRunCutsOverlongLines(t *testing.T) {
	o := testOptions(t, 1, "long")
	var out bytes.Buffer
	o.Stdout = &out
	require.NoError(t, Run(context.Background(), o))
	y := strings.Repeat("y", maxLine)
	require.Equal(t, "[0] "+y+"\n[0] "+y+"\n[0] "+strings.Repeat("y", 100)+"\n[0] after\n", out.String())
}

func TestRunEnvironment(t *testing.T) {
	// An outer job's rendezvous must not reach the ranks.
	t.Setenv(VarID, "outer-job-id")
	t.Setenv(VarRank, "7")
	t.Setenv(VarSecret, "not-hex")
	const np = 4
	o := testOptions(t, np, "env")
	o.Env = append(o.Env, "GOCCL_LAUNCH_TEST_EXTRA=passed", VarRoot+"=elsewhere:1")
	var out, errs bytes.Buffer
	o.Stdout, o.Stderr = &out, &errs
	require.NoError(t, Run(context.Background(), o), "stdout:\n%s\nstderr:\n%s", &out, &errs)

	re := regexp.MustCompile(`^\[(\d+)\] env rank=(\d+) size=(\d+) local=(-?\d+)/(-?\d+) root=(\S+) secret=(\S*) source=(\S+) id="(.*)" extra=(\S*)$`)
	seen := map[int]bool{}
	var root, secret string
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		require.NotNil(t, m, "unexpected line %q", l)
		r, _ := strconv.Atoi(m[1])
		require.Equal(t, m[1], m[2], "prefix and GOCCL_RANK disagree")
		require.False(t, seen[r], "rank %d twice", r)
		seen[r] = true
		require.Equal(t, strconv.Itoa(np), m[3])
		require.Equal(t, m[1], m[4], "local rank")
		require.Equal(t, strconv.Itoa(np), m[5], "local size")
		require.Equal(t, "goccl", m[8])
		require.Empty(t, m[9], "GOCCL_ID leaked into the ranks")
		require.Equal(t, "passed", m[10])
		if root == "" {
			root, secret = m[6], m[7]
		}
		require.Equal(t, root, m[6], "ranks disagree about the root")
		require.Equal(t, secret, m[7], "ranks disagree about the secret")
	}
	require.Len(t, seen, np)
	host, port, err := net.SplitHostPort(root)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	require.Positive(t, p)
	require.Regexp(t, `^[0-9a-f]{32}$`, secret)
}

func TestRunFreshSecretEachJob(t *testing.T) {
	a, b := NewSecret(), NewSecret()
	require.Regexp(t, `^[0-9a-f]{32}$`, a)
	require.NotEqual(t, a, b)
	require.NoError(t, checkSecret(a))
}

func TestRunFailingRankStopsTheOthers(t *testing.T) {
	o := testOptions(t, 4, "fail")
	o.Stdout, o.Stderr = newWatchBuffer(), newWatchBuffer()
	start := time.Now()
	err := await(t, runAsync(context.Background(), o))
	var ee *ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 1, ee.Rank)
	require.Equal(t, 4, ee.Size)
	require.Equal(t, 3, ee.Code)
	require.Zero(t, ee.Signal)
	require.Contains(t, err.Error(), "rank 1 of 4")
	require.Contains(t, err.Error(), "exited with status 3")
	// The other ranks sleep for childSleep unless stopped.
	require.Less(t, time.Since(start), testTimeout)
	require.Contains(t, o.Stderr.(*watchBuffer).String(), "[1] failing\n")
}

// With KeepGoing the others run to their end: the first failure is
// still the result.
func TestRunKeepGoingLeavesTheOthersRunning(t *testing.T) {
	o := testOptions(t, 3, "failfast")
	o.KeepGoing = true
	out := newWatchBuffer()
	o.Stdout = out
	err := await(t, runAsync(context.Background(), o))
	var ee *ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 1, ee.Rank)
	for _, r := range []int{0, 2} {
		require.Contains(t, out.String(), fmt.Sprintf("[%d] finished after rank 1 failed\n", r))
	}
}

func TestRunRankKilledBySignal(t *testing.T) {
	o := testOptions(t, 2, "killself")
	err := await(t, runAsync(context.Background(), o))
	var ee *ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 0, ee.Rank)
	require.Equal(t, -1, ee.Code)
	require.Equal(t, syscall.SIGKILL, ee.Signal)
	require.ErrorContains(t, err, "rank 0 of 2")
	require.ErrorContains(t, err, "killed by signal 9")
}

func TestRunCancelStopsAll(t *testing.T) {
	o := testOptions(t, 3, "sleep")
	out := newWatchBuffer()
	o.Stdout = out
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	errc := runAsync(ctx, o)
	out.waitCount(t, "ready pid=", 3)
	cause := errors.New("operator pressed ^C")
	cancel(cause)
	err := await(t, errc)
	require.ErrorIs(t, err, cause)
	require.ErrorContains(t, err, "stopped the 3 ranks")
}

func TestRunGraceThenKill(t *testing.T) {
	o := testOptions(t, 2, "ignoreterm")
	o.Grace = 100 * time.Millisecond
	out := newWatchBuffer()
	o.Stdout = out
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := runAsync(ctx, o)
	out.waitCount(t, "ready", 2)
	cancel()
	require.ErrorIs(t, await(t, errc), context.Canceled)
}

func TestRunBadOptions(t *testing.T) {
	ctx := context.Background()
	require.ErrorContains(t, Run(ctx, Options{NP: 0, Program: "true"}), "0 processes requested: expected at least 1")
	require.ErrorContains(t, Run(ctx, Options{NP: 1}), "no program to run")

	err := Run(ctx, Options{NP: 2, Program: "/nonexistent/goccl-test-program"})
	require.ErrorContains(t, err, "starting rank 0 of 2")
	require.ErrorContains(t, err, "/nonexistent/goccl-test-program")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = Run(cctx, testOptions(t, 2, "ok"))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "started no ranks")
}

func TestFreePort(t *testing.T) {
	p, err := FreePort()
	require.NoError(t, err)
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	require.NoError(t, err, "port %d from FreePort is not free", p)
	require.NoError(t, l.Close())
	// Below the range the kernel hands out for connections and port-0
	// listeners, where one is known.
	if lo, ok := ephemeralLow(); ok && lo > freePortMin+1024 {
		require.GreaterOrEqual(t, p, freePortMin)
		require.Less(t, p, lo, "port %d is in the kernel's own range", p)
	} else {
		t.Logf("the kernel's port range is unknown or low here (%d, %v): FreePort took the kernel's pick", lo, ok)
	}
}
