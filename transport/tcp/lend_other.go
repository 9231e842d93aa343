//go:build unix && !linux

package tcp

import "errors"

// Lending needs vmsplice(2), which only Linux has (lend_linux.go): other
// systems always copy.
const lendable = false

type lender struct {
	piped int
	off   bool
}

var errNoLending = errors.New("tcp: no page lending on this system")

func (l *lender) ready(int) bool           { return false }
func (l *lender) fill([]byte) (int, error) { return 0, errNoLending }
func (l *lender) drain(int) error          { return errNoLending }
func sendMore(int, []byte) (int, error)    { return 0, errNoLending }
func (l *lender) close()                   {}
