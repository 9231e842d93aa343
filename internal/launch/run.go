package launch

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultGrace is how long Run waits after SIGTERM before SIGKILL when
// Options.Grace is zero.
const DefaultGrace = 3 * time.Second

// maxLine is the longest line Run keeps whole; a longer run of bytes
// without a newline is cut into lines of this length.
const maxLine = 64 << 10

// Options says what Run starts.
type Options struct {
	// NP is the number of ranks (processes) to start, at least 1.
	NP int
	// Program is the executable, a path or a name looked up in PATH; Args
	// are its arguments (without the program name).
	Program string
	Args    []string
	// Env is extra environment for every rank, "KEY=value", on top of
	// os.Environ(). The variables Run sets (GOCCL_RANK, GOCCL_WORLD_SIZE,
	// GOCCL_LOCAL_RANK, GOCCL_LOCAL_SIZE, GOCCL_ROOT, GOCCL_SECRET) win
	// over both, and GOCCL_ID is removed, so that an outer job's
	// rendezvous never leaks into this one.
	Env []string
	// Stdout and Stderr receive the ranks' output, each line prefixed
	// with "[rank] ". Nil discards. Run writes whole lines, one Write call
	// per line, never two at once across both writers, so they need not be
	// safe for concurrent use. Write errors are ignored: the ranks' output
	// is still drained, so that no rank blocks on a full pipe.
	Stdout, Stderr io.Writer
	// PlainStdout leaves standard output lines without the prefix, for
	// programs where only one rank prints (goccl-perf's rank 0).
	PlainStdout bool
	// Grace is how long to wait after SIGTERM before SIGKILL; zero means
	// DefaultGrace.
	Grace time.Duration
	// DumpSignal, when not zero, is sent to every rank still running when
	// another fails or the job is interrupted (ctx ends), DumpWait before
	// they are stopped, so that they can
	// write diagnostics (goccl's flight recorder dumps on SIGUSR1).
	DumpSignal syscall.Signal
	DumpWait   time.Duration
	// KeepGoing leaves the other ranks running when one fails, so that
	// they can Shrink their communicator and finish without it (as
	// torchrun's elastic agent lets a job outlive a worker). Run waits
	// for every rank and returns the first failure; an interrupt (ctx)
	// still stops them all.
	KeepGoing bool
}

// ExitError is Run's error when a rank failed: the first rank, by time, to
// exit with a non-zero status or to be killed by a signal Run did not send.
type ExitError struct {
	Rank, Size int
	Program    string
	// Code is the exit status, or -1 when a signal ended the rank.
	Code int
	// Signal is the signal that ended the rank, 0 if it exited.
	Signal syscall.Signal
}

func (e *ExitError) Error() string {
	if e.Signal != 0 {
		return fmt.Sprintf("rank %d of %d (%s) was killed by signal %d (%v); stopped the other ranks",
			e.Rank, e.Size, e.Program, int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("rank %d of %d (%s) exited with status %d; stopped the other ranks",
		e.Rank, e.Size, e.Program, e.Code)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago:
// another process may take it before the caller listens on it. Where the
// kernel says which ports it hands out on its own (Linux's
// ip_local_port_range: the ports of every outgoing connection and of
// every listener on port 0), the port comes from below that range, so
// that only a process that asks for it by number can take it in the
// meantime: a port of the range, free a moment ago, is the next
// connection's source port as often as not on a busy host.
func FreePort() (int, error) {
	if lo, ok := ephemeralLow(); ok && lo > freePortMin+1024 {
		for range 64 {
			port := freePortMin + mrand.IntN(lo-freePortMin)
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free TCP port on 127.0.0.1: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("finding a free TCP port on 127.0.0.1: %w", err)
	}
	return port, nil
}

// freePortMin is the lowest port FreePort picks below the kernel's range
// (above the registered services most hosts run).
const freePortMin = 20000

// ephemeralLow returns the lowest port of the kernel's own range.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	return lo, err == nil
}

// NewSecret returns a fresh GOCCL_SECRET: 128 bits from crypto/rand as 32
// lower-case hex digits.
func NewSecret() string {
	var b [SecretHexDigits / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand crashes the program instead)
	return hex.EncodeToString(b[:])
}

// Run starts o.NP processes of o.Program on this host, rank r with
// GOCCL_RANK=r, GOCCL_WORLD_SIZE=NP, GOCCL_LOCAL_RANK=r, GOCCL_LOCAL_SIZE=NP,
// GOCCL_ROOT=127.0.0.1:<a free port> and GOCCL_SECRET=<fresh 32 hex
// digits>, the last two the same for every rank. Each rank runs in its own
// process group with stdin from the null device; every line it writes to
// stdout or stderr goes to o.Stdout or o.Stderr with "[r] " in front (a
// partial last line is completed with a newline when the rank's output
// closes; lines from different ranks never interleave mid-line).
//
// Run blocks until every rank has exited. When ctx is done, or when a rank
// fails (exits non-zero or is killed by a signal), Run sends SIGTERM to
// every rank's process group, so that processes a rank started get it too,
// and SIGKILL to those groups Grace later. Once every rank has exited Run
// sends SIGKILL to every rank's process group, so nothing a rank started
// in its group outlives Run, and waits for the ranks' output to close (at
// most Grace more, for a process that left its group but kept the output
// open). On Linux each rank also gets SIGKILL if the launching process dies.
// On systems without process groups Run kills only the ranks themselves.
//
// Run returns nil when every rank exited with status 0. When a rank failed
// first, it returns an *ExitError naming it; when ctx was done first, an
// error wrapping context.Cause(ctx); when a rank could not be started, an
// error naming the rank and the reason, after stopping those that were.
// Run's errors are sentences meant to follow the launcher's own name. It
// is safe to call Run concurrently; each call owns its processes.
func Run(ctx context.Context, o Options) error {
	if o.NP < 1 {
		return fmt.Errorf("%d processes requested: expected at least 1", o.NP)
	}
	if o.Program == "" {
		return errors.New("no program to run: expected a program name or path")
	}
	if ctx.Err() != nil {
		return fmt.Errorf("started no ranks: %w", context.Cause(ctx))
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	j := &job{
		o:     o,
		env:   jobEnv(o, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), NewSecret()),
		exits: make(chan exit, o.NP),
	}
	return j.run(ctx)
}

// launchVars are the variables Run owns in a rank's environment.
var launchVars = []string{VarID, VarRoot, VarSecret, VarRank, VarWorldSize, VarLocalRank, VarLocalSize}

// jobEnv returns the environment every rank shares: os.Environ() and
// o.Env without launchVars, then the job's own variables.
func jobEnv(o Options, root, secret string) []string {
	var env []string
	for _, kv := range append(os.Environ(), o.Env...) {
		k, _, _ := strings.Cut(kv, "=")
		owned := false
		for _, v := range launchVars {
			owned = owned || k == v
		}
		if !owned {
			env = append(env, kv)
		}
	}
	n := strconv.Itoa(o.NP)
	return append(env, VarWorldSize+"="+n, VarLocalSize+"="+n, VarRoot+"="+root, VarSecret+"="+secret)
}

// job is one call of Run. Its fields are owned by Run's goroutine except
// where noted.
type job struct {
	o   Options
	env []string // shared environment; each rank appends its own

	cmds    []*exec.Cmd // the ranks started, by rank
	readers []*os.File  // read ends of the ranks' output pipes; pumps close them

	// outMu serialises Writes to o.Stdout and o.Stderr, so that each line
	// is written whole. Held by pump goroutines.
	outMu sync.Mutex
	pumps sync.WaitGroup // one per output pipe

	exits chan exit // one per started rank, from its waiter goroutine
}

// exit is how one rank ended.
type exit struct {
	rank  int
	state *os.ProcessState // nil when waiting failed
	err   error
}

func (j *job) run(ctx context.Context) error {
	// Pdeathsig (Linux) fires when the thread that started a child exits,
	// not the process (go.dev/issue/27505), and the runtime ends threads
	// whose goroutine exits locked. So start the ranks from a thread locked
	// to a goroutine that lives until Run returns.
	startErr := make(chan error, 1)
	release := make(chan struct{})
	starterDone := make(chan struct{})
	go func() {
		defer close(starterDone)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		startErr <- j.startAll()
		<-release
	}()
	defer func() {
		close(release)
		<-starterDone
	}()
	err := <-startErr

	var (
		result   error
		stopping bool
		kill     *time.Timer
		killC    <-chan time.Time
		done     = ctx.Done()
	)
	stop := func(cause error) {
		result = cause
		stopping = true
		// Interrupted too: a job stopped with Ctrl-C because it hung is
		// the one whose recorders say why.
		if j.o.DumpSignal != 0 && done != nil {
			for _, c := range j.cmds {
				c.Process.Signal(j.o.DumpSignal) // ranks that have exited just refuse it
			}
			time.Sleep(j.o.DumpWait)
		}
		done = nil
		j.signalAll(syscall.SIGTERM)
		kill = time.NewTimer(j.o.Grace)
		killC = kill.C
	}
	if err != nil {
		stop(err)
	}
	for running := len(j.cmds); running > 0; {
		select {
		case <-done:
			stop(fmt.Errorf("stopped the %d ranks: %w", j.o.NP, context.Cause(ctx)))
		case <-killC:
			j.signalAll(syscall.SIGKILL)
			killC = nil
		case x := <-j.exits:
			running--
			var failure error
			switch {
			case stopping:
				// Ended by our signal, or failing because its peers were.
			case x.state == nil:
				failure = fmt.Errorf("waiting for rank %d of %d (%s): %w", x.rank, j.o.NP, j.o.Program, x.err)
			case !x.state.Success():
				code, sig := exitStatus(x.state)
				failure = &ExitError{Rank: x.rank, Size: j.o.NP, Program: j.o.Program, Code: code, Signal: sig}
			}
			switch {
			case failure == nil:
			case j.o.KeepGoing:
				if result == nil {
					result = failure // the survivors go on
				}
			default:
				stop(failure)
			}
		}
	}
	if kill != nil {
		kill.Stop()
	}
	// Whatever a rank left running in its group goes with it.
	j.signalAll(syscall.SIGKILL)
	j.drain()
	return result
}

// startAll starts the ranks in order and stops at the first that fails to
// start. Each started rank has two pump goroutines and one waiter.
func (j *job) startAll() error {
	for r := range j.o.NP {
		if err := j.start(r); err != nil {
			return fmt.Errorf("starting rank %d of %d: %w", r, j.o.NP, err)
		}
	}
	return nil
}

func (j *job) start(r int) error {
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return err
	}
	cmd := exec.Command(j.o.Program, j.o.Args...)
	rs := strconv.Itoa(r)
	cmd.Env = append(j.env[:len(j.env):len(j.env)], VarRank+"="+rs, VarLocalRank+"="+rs)
	// *os.File outputs go straight to the child: exec starts no copying
	// goroutine and Wait does not wait for the pipes, only for the process.
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return err
	}
	j.cmds = append(j.cmds, cmd)
	j.readers = append(j.readers, outR, errR)
	prefix := "[" + rs + "] "
	j.pumps.Add(2)
	outPrefix := prefix
	if j.o.PlainStdout {
		outPrefix = ""
	}
	go j.pump(outR, j.o.Stdout, outPrefix)
	go j.pump(errR, j.o.Stderr, prefix)
	go func() {
		err := cmd.Wait()
		j.exits <- exit{rank: r, state: cmd.ProcessState, err: err}
	}()
	return nil
}

// signalAll sends sig to every started rank's process group, including the
// groups of ranks that have exited, whose members may still run. The
// kernel does not reuse a process ID while it names a live group, so a
// group that still has members is still ours.
func (j *job) signalAll(sig syscall.Signal) {
	for _, c := range j.cmds {
		signalGroup(c.Process, sig)
	}
}

// drain waits for every output pipe to close, at most Grace; then it
// closes the read ends, which ends the pumps.
func (j *job) drain() {
	drained := make(chan struct{})
	go func() {
		j.pumps.Wait()
		close(drained)
	}()
	t := time.NewTimer(j.o.Grace)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
		// A process outside the ranks' groups holds an output pipe open.
		for _, r := range j.readers {
			r.Close()
		}
		<-drained
	}
}

// pump copies one output pipe of one rank to w, line by line, each line
// prefixed, until the pipe is closed at the other end (or at ours).
func (j *job) pump(r *os.File, w io.Writer, prefix string) {
	defer j.pumps.Done()
	defer r.Close()
	br := bufio.NewReaderSize(r, maxLine)
	line := make([]byte, 0, len(prefix)+256)
	for {
		b, err := br.ReadSlice('\n')
		if len(b) > 0 {
			line = append(append(line[:0], prefix...), b...)
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			j.outMu.Lock()
			_, _ = w.Write(line)
			j.outMu.Unlock()
		}
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}
