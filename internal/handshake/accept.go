package handshake

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"
)

// Admission says what an accept loop does with a new connection.
type Admission int

const (
	Serve Admission = iota // hand it to serve
	Drop                   // close it and go on (too many still authenticating)
	Stop                   // close it and stop accepting (the owner is closing)
)

// MaxPending caps the connections a listener lets authenticate at once;
// more are dropped on arrival, so that strangers cannot exhaust file
// descriptors.
const MaxPending = 128

// AcceptLoop accepts connections on ln until ln is closed. Other accept
// errors (out of file descriptors and the like) go to onError, and the
// loop keeps accepting once the condition passes, backing off up to a
// second, rather than leaving a listener that accepts nothing. admit
// decides what happens to each connection; serve gets those admitted and
// must not block (it starts the goroutine that authenticates them).
func AcceptLoop(ln net.Listener, onError func(error), admit func(net.Conn) Admission, serve func(net.Conn)) {
	backoff := time.Millisecond
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			onError(fmt.Errorf("accept: %w", err))
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		switch admit(c) {
		case Serve:
			serve(c)
		case Drop:
			c.Close()
		case Stop:
			c.Close()
			return
		}
	}
}

// Admit is the admission of an endpoint that keeps the connections still
// authenticating in pending: Stop once it is closing, Drop while
// MaxPending are pending, else Serve, with c filed in pending. The caller
// holds the lock that guards closed and pending.
func Admit(closed bool, pending map[net.Conn]struct{}, c net.Conn) Admission {
	switch {
	case closed:
		return Stop
	case len(pending) >= MaxPending:
		return Drop
	}
	pending[c] = struct{}{}
	return Serve
}

// DropLog counts refused connections and logs the first few, then one in
// a hundred, so that a stranger hammering a port cannot flood the log.
type DropLog struct{ n atomic.Int64 }

// Log counts one refusal and logs msg with args and the count so far, if
// this one is due.
func (d *DropLog) Log(log *slog.Logger, msg string, args ...any) {
	n := d.n.Add(1)
	if n > 5 && n%100 != 0 {
		return
	}
	log.Warn(msg, append(args, "dropped so far", n)...)
}
