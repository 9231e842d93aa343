//go:build !linux

package shm

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/goccl/goccl/transport"
)

// ErrUnsupported: this platform has no shared-memory transport.
var ErrUnsupported = errors.New("shm: the shared-memory transport needs Linux (memfd, futex)")

// Supported reports whether this platform has the transport.
const Supported = false

// Listen fails with ErrUnsupported.
func Listen() (*net.UnixListener, error) { return nil, ErrUnsupported }

// Endpoint is the shared-memory transport, absent on this platform.
type Endpoint struct{}

// New fails with ErrUnsupported.
func New(o Options) (*Endpoint, error) { return nil, ErrUnsupported }

func (e *Endpoint) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	return nil, ErrUnsupported
}

func (e *Endpoint) Caps() transport.Caps { return transport.Caps{} }

func (e *Endpoint) Close(cause error) error { return nil }

// BoardOffer is an offered board, absent on this platform.
type BoardOffer struct{}

// OfferBoard fails with ErrUnsupported.
func OfferBoard(capacity int) (*BoardOffer, error) { return nil, ErrUnsupported }

// Ref returns the zero BoardRef.
func (o *BoardOffer) Ref() BoardRef { return BoardRef{} }

// Close does nothing.
func (o *BoardOffer) Close() {}

// StartBoard fails with ErrUnsupported.
func (e *Endpoint) StartBoard(time.Duration) error { return ErrUnsupported }

// JoinBoard fails with ErrUnsupported.
func (e *Endpoint) JoinBoard(ctx context.Context) error { return ErrUnsupported }

// Board returns nil: there is no board on this platform.
func (e *Endpoint) Board() transport.Board { return nil }

// BoardMax is the largest contribution the board carries (none here).
const BoardMax = 0

// BlocksReceived is 0: there is no shared memory transport here.
func BlocksReceived() int64 { return 0 }

// SharedSlicesReceived is 0: there is no shared memory transport here.
func SharedSlicesReceived() int64 { return 0 }
