//go:build !unix

package tcp

import (
	"errors"

	"github.com/goccl/goccl/transport"
)

// Endpoint is unavailable off Unix.
type Endpoint struct{ transport.Endpoint }

// New fails: the TCP transport drives its sockets with Unix system calls.
func New(o Options) (*Endpoint, error) {
	return nil, errors.New("tcp: the TCP transport needs a Unix system")
}
