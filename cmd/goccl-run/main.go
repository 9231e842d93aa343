package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/goccl/goccl/internal/launch"
)

const usageText = `usage: goccl-run -np N [-grace D] [--] PROGRAM [ARGS...]

Starts N processes of PROGRAM on this host, one goccl rank each, with
GOCCL_RANK, GOCCL_WORLD_SIZE, GOCCL_LOCAL_RANK, GOCCL_LOCAL_SIZE,
GOCCL_ROOT (127.0.0.1 and a free port) and a fresh GOCCL_SECRET set.
Every output line is prefixed with "[rank] ". SIGINT and SIGTERM reach the
ranks as SIGTERM; when a rank fails, the others are stopped the same way,
and SIGKILL follows after the grace period.

Exit status: 0 if every rank exited 0; else the failing rank's exit status
(1 if it had none), 130/143 when interrupted by SIGINT/SIGTERM, 2 for bad
usage.

Examples:
  goccl-run -np 4 ./train -epochs 3
  go build -o train ./cmd/train && goccl-run -np 2 -grace 10s -- ./train -v

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
	grace := fs.Duration("grace", launch.DefaultGrace, "how long ranks have to exit after SIGTERM before SIGKILL")
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

	err := launch.Run(ctx, launch.Options{
		NP:      *np,
		Program: fs.Arg(0),
		Args:    fs.Args()[1:],
		Stdout:  stdout,
		Stderr:  stderr,
		Grace:   *grace,
	})
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "goccl-run: %v\n", err)
	return exitStatus(err)
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
