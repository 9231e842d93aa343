package collective

import (
	"errors"
	"fmt"

	"github.com/goccl/goccl/internal/bootstrap"
	"github.com/goccl/goccl/transport"
)

// Failure propagation over the bootstrap connection. The root keeps every
// rank's connection after the table (bootstrap.RootOptions.Watch): a rank
// that aborts tells the root, which tells every other rank, and the root
// reports a rank whose connection closes without a goodbye as dead. So a
// failure reaches ranks that are idle, or that do not talk to the failed
// rank, in milliseconds, instead of at their next operation that needs
// it or at its timeout.

// startWatch takes over a rank's watched connection to the root.
func (c *Comm) startWatch(w *bootstrap.Watch) {
	c.rootWatch = w
	c.watchExit = make(chan struct{})
	go func() {
		defer close(c.watchExit)
		for {
			a, err := w.Next()
			if err != nil {
				// The root went away (its process ended) or Close closed
				// the connection: failures travel on the data path only
				// from now on.
				return
			}
			var cause error
			if a.Died {
				cause = &transport.PeerError{Peer: int(a.Rank), Op: "watch", Err: fmt.Errorf("rank %d died: %s", a.Rank, a.Reason)}
			} else {
				cause = &transport.PeerAbortedError{Peer: int(a.Rank), Cause: errors.New(a.Reason)}
			}
			c.notified.Store(true)
			c.abort(cause)
		}
	}()
}

// tellRoot tells the root this rank aborts, unless the abort came from the
// root's own notice.
func (c *Comm) tellRoot(cause error) {
	if c.rootWatch == nil || c.notified.Load() {
		return
	}
	c.rootWatch.Abort(cause.Error()) // best effort: at most a second
}

// leaveWatch says goodbye to the root and waits for the watcher to end.
func (c *Comm) leaveWatch() {
	if c.rootWatch == nil {
		return
	}
	c.rootWatch.Bye()
	<-c.watchExit
}
