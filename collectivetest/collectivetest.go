// Package collectivetest runs a function on every rank of a goccl
// communicator from a Go test, the way a distributed job would: on N
// ranks in this process (Run), or on N processes that re-execute the test
// binary (RunProcesses), with a deadline, every rank's error reported and
// every communicator closed. It is what goccl's own tests do, offered to
// code built on goccl:
//
//	func TestAverage(t *testing.T) {
//		collectivetest.Run(t, 4, func(ctx context.Context, c *collective.Comm) error {
//			v := []float64{float64(c.Rank())}
//			if err := collective.AllReduce(ctx, c, v, v, collective.Avg); err != nil {
//				return err
//			}
//			if v[0] != 1.5 {
//				return fmt.Errorf("rank %d: average %v", c.Rank(), v[0])
//			}
//			return nil
//		})
//	}
//
// RunProcesses takes the same function; each rank is a process of its
// own, joined over shared memory or TCP as under goccl-run, so that what
// only processes have (separate address spaces, the transports between
// them, a rank that dies) is tested too. It needs the test binary to
// re-run the calling test alone: no state from earlier tests, and no
// work before RunProcesses that must not happen N more times.
package collectivetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/launch"
)

// DefaultTimeout bounds a run when the test has no deadline of its own.
const DefaultTimeout = 2 * time.Minute

// Func is what every rank runs; ctx ends at the run's deadline.
type Func func(ctx context.Context, c *collective.Comm) error

// Option configures a run.
type Option func(*options)

type options struct {
	timeout time.Duration
	comm    []collective.Option
	env     []string
}

// WithTimeout bounds the run (every rank's function and the setup).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithCommOptions passes options to every rank's communicator.
func WithCommOptions(opts ...collective.Option) Option {
	return func(o *options) { o.comm = append(o.comm, opts...) }
}

// WithEnv adds KEY=VALUE variables to every rank's process (RunProcesses
// only), GOCCL_TRANSPORT=tcp say.
func WithEnv(kv ...string) Option { return func(o *options) { o.env = append(o.env, kv...) } }

func newOptions(t testing.TB, opts []Option) options {
	o := options{timeout: DefaultTimeout}
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			// Leave the test time to report, but never less than a second.
			o.timeout = max(min(o.timeout, time.Until(dl)-5*time.Second), time.Second)
		}
	}
	if v, err := time.ParseDuration(os.Getenv(envTimeout)); err == nil && v > 0 {
		o.timeout = v // a rank's process: its parent's deadline
	}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Run runs fn on n ranks of a communicator made in this process
// (collective.NewLocalGroup), each on its own goroutine, and fails t with
// every rank's error. A rank that has not returned by the deadline fails
// the test too, naming it; the communicators are then aborted (so that
// their operations fail). Run closes them before it returns.
func Run(t testing.TB, n int, fn Func, opts ...Option) {
	t.Helper()
	o := newOptions(t, opts)
	comms, err := collective.NewLocalGroup(n, o.comm...)
	if err != nil {
		t.Fatalf("collectivetest: %d ranks: %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	errs := make([]error, n)
	done := make([]bool, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			err := fn(ctx, c)
			mu.Lock()
			errs[r], done[r] = err, true
			mu.Unlock()
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		var late []string
		for r := range n {
			if !done[r] {
				late = append(late, strconv.Itoa(r))
			}
		}
		mu.Unlock()
		if len(late) > 0 {
			for _, c := range comms {
				c.Abort(fmt.Errorf("collectivetest: the %v deadline passed", o.timeout))
			}
			t.Errorf("collectivetest: ranks %s had not returned after %v", strings.Join(late, ", "), o.timeout)
		}
		select {
		case <-all: // aborted: their operations fail now (or all returned just then)
		case <-time.After(10 * time.Second):
			// A function that waits on neither ctx nor the communicator:
			// leave it running rather than hang the test.
			t.Errorf("collectivetest: ranks %s still had not returned 10 s after the abort (does the function ignore ctx?)", strings.Join(late, ", "))
			return
		}
	}
	for _, c := range comms {
		if err := c.Close(); err != nil {
			t.Errorf("collectivetest: rank %d: close: %v", c.Rank(), err)
		}
	}
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// Environment of a rank process.
const (
	envTest    = "GOCCL_COLLECTIVETEST"         // the test a child runs, by name
	envTimeout = "GOCCL_COLLECTIVETEST_TIMEOUT" // and its deadline
)

// RunProcesses runs fn on n ranks, each in a process of its own: it
// re-executes the test binary for the calling test only, with the
// variables collective.InitFromEnv reads (as goccl-run sets them, on
// loopback, with a fresh secret), and fails t with every rank's exit
// status and output. In a rank's process the call runs fn on the rank's
// communicator and exits the process. Extra variables come from WithEnv.
func RunProcesses(t testing.TB, n int, fn Func, opts ...Option) {
	t.Helper()
	o := newOptions(t, opts)
	if os.Getenv(envTest) == t.Name() {
		os.Exit(child(o, fn))
	}
	if n < 1 {
		t.Fatalf("collectivetest: %d ranks", n)
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("collectivetest: %v", err)
	}
	var sec [16]byte
	rand.Read(sec[:])
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+10*time.Second)
	defer cancel()
	type result struct {
		out  string
		err  error
		code int
	}
	res := make([]result, n)
	var wg sync.WaitGroup
	for r := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+runPattern(t.Name()), "-test.count=1")
		cmd.Env = append(os.Environ(), envTest+"="+t.Name(), envTimeout+"="+o.timeout.String(), "GOCCL_RANK="+strconv.Itoa(r), "GOCCL_WORLD_SIZE="+strconv.Itoa(n),
			"GOCCL_ROOT=127.0.0.1:"+strconv.Itoa(port), "GOCCL_SECRET="+hex.EncodeToString(sec[:]))
		cmd.Env = append(cmd.Env, o.env...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("collectivetest: starting rank %d: %v", r, err)
		}
		wg.Go(func() {
			err := cmd.Wait()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code, err = ee.ExitCode(), nil
			}
			res[r] = result{out: out.String(), err: err, code: code}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Errorf("collectivetest: the ranks had not exited after %v", o.timeout)
	}
	for r, x := range res {
		switch {
		case x.err != nil:
			t.Errorf("rank %d: %v\n%s", r, x.err, x.out)
		case x.code != 0:
			t.Errorf("rank %d exited %d:\n%s", r, x.code, x.out)
		case !strings.Contains(x.out, doneLine(r, n)):
			// It exited 0 without running fn: the test binary did not
			// re-run this test (another name, or work that exits first).
			t.Errorf("rank %d did not run the function (the test binary, run with -test.run=%s, exited without it):\n%s", r, runPattern(t.Name()), x.out)
		case testing.Verbose():
			t.Logf("rank %d:\n%s", r, x.out)
		}
	}
}

func doneLine(rank, n int) string { return fmt.Sprintf("collectivetest: rank %d of %d done", rank, n) }

// child is a rank's process: it joins, runs fn and says how it went.
func child(o options, fn Func) int {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	c, err := collective.InitFromEnv(ctx, o.comm...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "collectivetest: init: %v\n", err)
		return 1
	}
	err = fn(ctx, c)
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "collectivetest: rank %d: %v\n", c.Rank(), err)
		return 1
	}
	fmt.Println(doneLine(c.Rank(), c.Size()))
	return 0
}

// runPattern is the -test.run pattern that selects exactly the test (or
// subtest) named name.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func freePort() (int, error) { return launch.FreePort() }
