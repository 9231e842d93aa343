package shm

import (
	"fmt"
	"net"
	"slices"

	"golang.org/x/sys/unix"
)

// vetPeer refuses c unless the process at its other end runs as this
// process's user or one of Options.AllowUIDs. Abstract sockets have no
// permissions and /proc/net/unix lists their names to every user, so any
// process on the host can connect to a listener, or take its name once it
// has gone (issue 19, finding 4). The secret would keep such a process
// out of the setup, but only once it had held a connection, one of the
// few that may be setting up at a time, for the whole setup timeout; and
// no other user's process should see this rank's shared memory, secret or
// not. The acceptor calls it before it reads a byte (Acceptor.Vet), the
// dialer before it hands over a descriptor.
func (e *Endpoint) vetPeer(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("a %T, not a Unix socket, so its peer's credentials are unknown", c)
	}
	cred, err := peerCred(uc)
	if err != nil {
		return err
	}
	uid := int(cred.Uid)
	if uid == e.uid || slices.Contains(e.o.AllowUIDs, uid) {
		return nil
	}
	return fmt.Errorf("the process at the other end (pid %d) runs as uid %d; this rank runs as uid %d and allows only that uid and Options.AllowUIDs %v",
		cred.Pid, uid, e.uid, e.o.AllowUIDs)
}

// peerCred returns the credentials of the process at the other end of c
// as they were when it connected or listened (SO_PEERCRED; the uid is
// its effective one).
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, fmt.Errorf("reading the peer's credentials (SO_PEERCRED): %w", err)
	}
	return cred, nil
}
