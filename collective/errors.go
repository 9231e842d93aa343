package collective

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/goccl/goccl/internal/engine"
)

// Sentinel errors; test for them with errors.Is.
var (
	// ErrClosed: the communicator was closed.
	ErrClosed = errors.New("goccl: communicator closed")
	// ErrAborted: the communicator was aborted; the error also wraps the
	// cause.
	ErrAborted = errors.New("goccl: communicator aborted")
	// ErrInvalidArgument: bad input, caught before any data moved; the
	// communicator is still usable.
	ErrInvalidArgument = errors.New("goccl: invalid argument")
	// ErrTimeout: an operation ran past the communicator's timeout.
	ErrTimeout = errors.New("goccl: operation timed out")
	// ErrMismatch: ranks disagree about an operation (different
	// collectives, counts, roots or order).
	ErrMismatch = errors.New("goccl: ranks disagree about the operation")
	// ErrNilComm: a nil *Comm was passed.
	ErrNilComm = errors.New("goccl: nil communicator")
	// ErrNoSecret: InitFromEnv found launcher variables but no
	// GOCCL_SECRET (and no GOCCL_INSECURE=1): it does not start a job
	// that anyone who reaches the root could join.
	ErrNoSecret = errors.New("goccl: GOCCL_SECRET is not set")
)

// OpError is the failure of one operation on one rank, after it was
// accepted. Its communicator is aborted by then.
type OpError struct {
	Rank  int    // the rank reporting
	Op    string // collective name, e.g. "allreduce"
	Seq   uint64 // the operation's number on this communicator, from 0
	Algo  string // algorithm, when one was chosen
	Bytes int64  // the operation's size as nccl-tests counts it
	// Peer is the rank this rank was waiting for or sending to when it
	// failed, or -1.
	Peer int
	// Where says which channel, piece and step, when known.
	Where string
	Err   error
}

func (e *OpError) Error() string {
	s := fmt.Sprintf("goccl: rank %d: %s#%d", e.Rank, e.Op, e.Seq)
	if e.Algo != "" {
		s += fmt.Sprintf(" (%s, %d bytes)", e.Algo, e.Bytes)
	}
	if e.Where != "" {
		s += " " + e.Where
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrMismatch) hold for mismatches the engine
// detects.
func (e *OpError) Is(target error) bool {
	if target == ErrMismatch {
		var m *engine.MismatchError
		return errors.As(e.Err, &m)
	}
	return false
}

// ArgError is bad input to an operation, caught before any data moved:
// errors.Is(err, ErrInvalidArgument) holds for it, and also errors.Is(err,
// ErrNilComm) or errors.Is(err, ErrClosed) when that is what was wrong.
type ArgError struct {
	Rank int // -1 when the communicator is nil
	Op   string
	Msg  string
	Err  error // ErrNilComm, ErrClosed, or nil
}

func (e *ArgError) Error() string {
	msg := e.Msg
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Rank < 0 {
		return fmt.Sprintf("goccl: %s: invalid argument: %s", e.Op, msg)
	}
	return fmt.Sprintf("goccl: rank %d: %s: invalid argument: %s", e.Rank, e.Op, msg)
}

func (e *ArgError) Is(target error) bool { return target == ErrInvalidArgument }

func (e *ArgError) Unwrap() error { return e.Err }

// timeoutError is the cause of an operation's context when it runs past the
// timeout. It is formatted only when reported.
type timeoutError struct {
	op       string
	seq      uint64
	bytes    int64
	device   bool // the operation's buffers are in device memory
	d        time.Duration
	progress []engine.Progress // where each channel was
}

func (e *timeoutError) Error() string {
	var b strings.Builder
	where := "host"
	if e.device {
		where = "device"
	}
	// The placement, so that ranks that placed one operation's buffers
	// differently (which waits for the timeout: each kind runs on
	// connections of its own) show it in their errors.
	fmt.Fprintf(&b, "%v: %s#%d (%d bytes in %s memory) ran past the %v timeout", ErrTimeout, e.op, e.seq, e.bytes, where, e.d)
	for i, p := range e.progress {
		if i == 0 {
			b.WriteString(";")
		} else {
			b.WriteString(",")
		}
		if p.Done {
			fmt.Fprintf(&b, " channel %d done", p.Channel)
			continue
		}
		if p.Step < 0 {
			fmt.Fprintf(&b, " channel %d not started", p.Channel)
			continue
		}
		fmt.Fprintf(&b, " channel %d at piece %d step %d (%v", p.Channel, p.Piece, p.Step, p.Kind)
		if p.Peer >= 0 {
			fmt.Fprintf(&b, " with rank %d", p.Peer)
		}
		b.WriteString(")")
	}
	return b.String()
}

func (e *timeoutError) Unwrap() error { return ErrTimeout }

// abortedError wraps the cause of an abort.
type abortedError struct{ cause error }

func (e *abortedError) Error() string   { return fmt.Sprintf("%v: %v", ErrAborted, e.cause) }
func (e *abortedError) Unwrap() []error { return []error{ErrAborted, e.cause} }
