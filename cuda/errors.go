package cuda

import (
	"errors"
	"fmt"
)

// Sentinels, for errors.Is. The errors returned carry more: what was tried,
// and the driver's own *Error where there is one.
var (
	// ErrNoDriver: no usable CUDA driver library (libcuda.so.1 not found,
	// not loadable, the toolkit's stub, or lacking a function goccl needs).
	ErrNoDriver = errors.New("cuda: no CUDA driver")
	// ErrNoDevice: the driver loaded but reports no CUDA device.
	ErrNoDevice = errors.New("cuda: no CUDA device")
	// ErrNoStreamMemOps: the driver cannot make a stream wait on a 32-bit
	// value in memory (cuStreamWaitValue32); callers fall back to polling
	// the flag on the host and recording an event.
	ErrNoStreamMemOps = errors.New("cuda: stream memory operations (cuStreamWaitValue32) not supported")
	// ErrClosed: the Device, Stream or Event was closed.
	ErrClosed = errors.New("cuda: closed")
)

// Error is a CUDA driver call that failed: the function (its base name, as
// in the CUDA documentation: "cuMemAlloc"), the CUresult, and the driver's
// name and description of it (cuGetErrorName, cuGetErrorString).
type Error struct {
	Call string // "cuMemAlloc"
	Code int    // CUresult: 2
	Name string // "CUDA_ERROR_OUT_OF_MEMORY"; "" if the driver knows none
	Text string // "out of memory"; "" if the driver knows none
}

// Error reads "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if e.Text == "" {
		return fmt.Sprintf("cuda: %s: %s", e.Call, name)
	}
	return fmt.Sprintf("cuda: %s: %s (%s)", e.Call, name, e.Text)
}

// Is makes an Error with code CUDA_ERROR_NO_DEVICE match ErrNoDevice and one
// with CUDA_ERROR_NOT_SUPPORTED from cuStreamWaitValue32 match
// ErrNoStreamMemOps.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNoDevice:
		return e.Code == errNoDevice
	case ErrNoStreamMemOps:
		return e.Code == errNotSupported && e.Call == "cuStreamWaitValue32"
	}
	return false
}

// CUresult values this package acts on.
const (
	errInvalidValue = 1
	errNoDevice     = 100
	errStubLibrary  = 34
	errNotReady     = 600
	errNotSupported = 801
)

// wrapped is an error with its own message that matches several others
// (a sentinel and the driver's *Error) through errors.Is and errors.As.
type wrapped struct {
	msg  string
	errs []error
}

func (w *wrapped) Error() string   { return w.msg }
func (w *wrapped) Unwrap() []error { return w.errs }

func wrap(msg string, errs ...error) error { return &wrapped{msg: msg, errs: errs} }
