package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/goccl/goccl/flight"
	"github.com/goccl/goccl/internal/launch"
)

const usageText = `usage: goccl-run -np N [-grace D] [-keep-going] [--] PROGRAM [ARGS...]

Starts N processes of PROGRAM on this host, one goccl rank each, with
GOCCL_RANK, GOCCL_WORLD_SIZE, GOCCL_LOCAL_RANK, GOCCL_LOCAL_SIZE,
GOCCL_ROOT (127.0.0.1 and a free port) and a fresh GOCCL_SECRET set.
Every output line is prefixed with "[rank] ". SIGINT and SIGTERM reach the
ranks as SIGTERM; when a rank fails, the others are stopped the same way,
and SIGKILL follows after the grace period; with -keep-going they are left
to run, so that a job can Shrink its communicator and finish without the
failed rank.

Each rank writes its flight recorder (its last operations) to the -dump
directory when its communicator aborts or times out; when a rank fails,
the others get SIGUSR1 to write theirs before they are stopped, and
goccl-run prints what the recorders show: the first operation where the
ranks called different collectives, the rank that never arrived, or the
rank at the end of the chain of waits (one that wrote no recorder because
its process was stopped, say).
goccl-run -analyze DIR reads such a directory again (exit status 3 when
it finds a problem).

Exit status: 0 if every rank exited 0; else the failing rank's exit status
(1 if it had none), 130/143 when interrupted by SIGINT/SIGTERM, 2 for bad
usage.

Examples:
  goccl-run -np 4 ./train -epochs 3
  go build -o train ./cmd/train && goccl-run -np 2 -grace 10s -- ./train -v
  goccl-run -np 8 -dump /tmp/flight ./train; goccl-run -analyze /tmp/flight

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is goccl-run with its arguments and outputs; it returns the exit
// status.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("goccl-run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	np := fs.Int("np", 0, "number of ranks to start (required, at least 1)")
	dumpDir := fs.String("dump", "", "directory for the ranks' flight recorders (GOCCL_DEBUG_DUMP); default: $GOCCL_DEBUG_DUMP, else a temporary one kept only if the job fails")
	analyze := fs.String("analyze", "", "analyze the flight recorders in this directory and exit (no job is run)")
	grace := fs.Duration("grace", launch.DefaultGrace, "how long ranks have to exit after SIGTERM before SIGKILL")
	keepGoing := fs.Bool("keep-going", false, "when a rank fails, leave the others running (so that they can Shrink their communicator and finish without it); the exit status is still the failed rank's")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *analyze != "" {
		return analyzeDir(*analyze, stdout, stderr)
	}
	if *np < 1 {
		fmt.Fprintf(stderr, "goccl-run: -np is %d: expected the number of ranks, at least 1 (e.g. goccl-run -np 4 ./train); see goccl-run -h\n", *np)
		return 2
	}
	if *grace <= 0 {
		fmt.Fprintf(stderr, "goccl-run: -grace is %v: expected a positive duration such as 3s; see goccl-run -h\n", *grace)
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintf(stderr, "goccl-run: no program given: expected goccl-run -np %d PROGRAM [ARGS...]; see goccl-run -h\n", *np)
		return 2
	}

	// Forward SIGINT and SIGTERM by cancelling Run's context, with the
	// signal as the cause so that the exit status can tell which.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigc)
	go func() {
		select {
		case s := <-sigc:
			cancel(signalError{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()

	// Every rank writes its flight recorder here when its communicator
	// aborts, and on the SIGUSR1 sent to the survivors when a rank fails.
	dir, temp := *dumpDir, false
	if dir == "" {
		dir = os.Getenv("GOCCL_DEBUG_DUMP")
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "goccl-flight-")
		if err != nil {
			fmt.Fprintf(stderr, "goccl-run: %v\n", err)
			return 1
		}
		dir, temp = d, true
	}
	err := launch.Run(ctx, launch.Options{
		NP:         *np,
		Program:    fs.Arg(0),
		Args:       fs.Args()[1:],
		Env:        []string{"GOCCL_DEBUG_DUMP=" + dir},
		Stdout:     stdout,
		Stderr:     stderr,
		Grace:      *grace,
		DumpSignal: syscall.SIGUSR1,
		DumpWait:   500 * time.Millisecond,
		KeepGoing:  *keepGoing,
	})
	if err == nil {
		if temp {
			os.RemoveAll(dir)
		}
		return 0
	}
	fmt.Fprintf(stderr, "goccl-run: %v\n", err)
	if dumps, derr := flight.ReadDir(dir); derr == nil && len(dumps) > 0 {
		f := flight.Analyze(dumps)
		fmt.Fprintf(stderr, "goccl-run: flight recorders of %d ranks in %s: %s\n", len(dumps), dir, f.Summary)
	} else if temp {
		os.RemoveAll(dir)
	}
	return exitStatus(err)
}

// analyzeDir is goccl-run -analyze DIR.
func analyzeDir(dir string, stdout, stderr io.Writer) int {
	dumps, err := flight.ReadDir(dir)
	if err != nil {
		fmt.Fprintf(stderr, "goccl-run: %v\n", err)
		return 1
	}
	if len(dumps) == 0 {
		fmt.Fprintf(stderr, "goccl-run: no flight recorders (goccl-flight-rank*.json) in %s\n", dir)
		return 1
	}
	var ranks []string
	for _, d := range dumps {
		ranks = append(ranks, fmt.Sprintf("%d (%s, %d ops)", d.Rank, d.Reason, len(d.Ops)))
	}
	fmt.Fprintf(stdout, "flight recorders: ranks %s\n", strings.Join(ranks, ", "))
	f := flight.Analyze(dumps)
	fmt.Fprintln(stdout, f.Summary)
	if f.Kind != "none" {
		return 3
	}
	return 0
}

// exitStatus maps Run's error to goccl-run's exit status.
func exitStatus(err error) int {
	var se signalError
	if errors.As(err, &se) {
		return 128 + int(se.sig)
	}
	var ee *launch.ExitError
	if errors.As(err, &ee) && ee.Code > 0 {
		return ee.Code
	}
	return 1
}

// signalError is the cause of Run's context when goccl-run got a signal.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return e.sig.String() + " signal received" }
