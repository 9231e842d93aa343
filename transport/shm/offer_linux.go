package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/connsetup"
	"github.com/goccl/goccl/internal/wire"
)

// Boards offered ahead (a split child's; docs/performance.md, "Split").
//
// Init's board is made by rank 0 and handed to every other rank, a
// connection and a few round trips between processes each. A split knows
// who the child's rank 0 is only once the ranks' colors and keys are in,
// in the very exchange that would have to say where its board is; so
// every member that may share one makes an offer before the exchange
// (OfferBoard: a sealed memfd, its header written, a random nonce), puts
// its BoardRef in the exchange, and after it rank 0's offer is the board
// (Options.Board) while the others close theirs.
//
// The others then open rank 0's memfd through /proc/<pid>/fd/<fd>
// (Options.BoardAt), which the kernel allows to a process that may read
// the owner's /proc entries: the same user (PTRACE_MODE_READ, which
// Yama's ptrace_scope leaves alone), nobody else. The file must be a
// memfd sealed against resizing, of an offer's size, with the header and
// the nonce the exchange named: a pid or descriptor number that has been
// reused since, or a process in another pid namespace, is refused, not
// mapped. No round trip to rank 0. Where the open is refused (another
// user in AllowUIDs, hidepid, another pid namespace) the member asks rank
// 0 for the board over rank 0's listener, a pull: a ConnSetup with
// ConnBoard from a higher rank, answered with the descriptor as Init's
// hand-over is.
//
// An offer is sized for capacity members and carries it in its header
// (where Init's board has its member count, which is its capacity): the
// child has at most as many members as the parent has ranks on this
// host, and lays out its members within.

// BoardOffer is a board made before it is known whether this rank will be
// the one whose board is used (OfferBoard). Only that one is mapped (by
// its endpoint): an offer is a descriptor and its header, written with
// pwrite, so that the offers nobody takes cost a few system calls.
type BoardOffer struct {
	fd       int
	capacity int
	nonce    [16]byte
	adopted  bool
}

// hdrNonce is where an offer's nonce is in the board's header page.
const hdrNonce = 32

// OfferBoard makes a board for up to capacity members.
func OfferBoard(capacity int) (*BoardOffer, error) {
	if capacity < 2 || capacity > maxBoardMembers {
		return nil, fmt.Errorf("shm: a board for %d members (want 2..%d)", capacity, maxBoardMembers)
	}
	fd, err := sealedMemfd("goccl-board", boardSize(capacity))
	if err != nil {
		return nil, fmt.Errorf("shm: offering a board: %w", err)
	}
	o := &BoardOffer{fd: fd, capacity: capacity}
	rand.Read(o.nonce[:])
	if _, err := unix.Pwrite(fd, boardHeaderBytes(capacity, o.nonce), 0); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: offering a board: writing its header: %w", err)
	}
	return o, nil
}

// maxBoardMembers bounds an offer: a board of 1024 members is 17 MiB
// (sparse: only the pages its members touch are memory).
const maxBoardMembers = 1024

// Ref is where the offer is, for the other members.
func (o *BoardOffer) Ref() BoardRef { return BoardRef{PID: os.Getpid(), FD: o.fd, Nonce: o.nonce} }

// Close lets go of the offer's descriptor (the board itself, once an
// endpoint has made the offer its board, is the endpoint's). An endpoint
// given the offer closes it.
func (o *BoardOffer) Close() {
	if o != nil && o.fd >= 0 {
		unix.Close(o.fd)
		o.fd = -1
	}
}

// adoptOffer maps the offer as this endpoint's board (rank 0's); its
// descriptor stays open while the endpoint does, for the others to open
// or pull.
func (e *Endpoint) adoptOffer() (*segment, error) {
	o := e.o.Board
	switch {
	case o.fd < 0 || o.adopted:
		return nil, errors.New("shm: the offered board was closed or adopted already")
	case e.o.NRanks > o.capacity:
		return nil, fmt.Errorf("shm: the offered board has room for %d members, not %d", o.capacity, e.o.NRanks)
	}
	mem, err := unix.Mmap(o.fd, 0, boardSize(o.capacity), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map board: %w", err)
	}
	o.adopted = true
	return &segment{mem: mem}, nil
}

// fetchBoard maps rank 0's offered board: opened through /proc, or
// pulled from rank 0 where that is refused.
func (e *Endpoint) fetchBoard(ctx context.Context) (*segment, error) {
	at := e.o.BoardAt
	seg, err := openOffer(at, e.o.NRanks)
	if err == nil {
		return seg, nil
	}
	e.log.Debug("goccl: shm: asking rank 0 for the board: it could not be opened through /proc", "rank", e.o.Rank, "err", err)
	s := wire.ConnSetup{From: uint32(e.o.Rank), To: 0, NSocks: 1, Flags: wire.ConnBoard}
	c, err := e.dialer.Dial(ctx, e.o.Peers[0], s, func(c net.Conn) error {
		if err := e.vetPeer(c); err != nil {
			return connsetup.Permanent(fmt.Errorf("the listener: %w", err))
		}
		var err error
		if seg, err = e.receiveBoard(c.(*net.UnixConn), at.Nonce); err != nil {
			return connsetup.Permanent(err) // the wrong board stays wrong
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("asking rank 0 for the board at %s: %w", e.o.Peers[0], err)
	}
	c.Close()
	return seg, nil
}

// openOffer opens and maps the board at, for n members.
func openOffer(at BoardRef, n int) (*segment, error) {
	if at.PID <= 0 || at.FD < 0 {
		return nil, fmt.Errorf("no board at pid %d, descriptor %d", at.PID, at.FD)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", at.PID, at.FD), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening descriptor %d of pid %d: %w", at.FD, at.PID, err)
	}
	defer unix.Close(fd)
	return mapBoard(fd, n, at.Nonce)
}

// servePull answers a higher rank's pull with the offered board (rank 0).
func (e *Endpoint) servePull(c *net.UnixConn) {
	o := e.o.Board
	if _, _, err := c.WriteMsgUnix(appendBoardMsg(nil, o.capacity), unix.UnixRights(o.fd), nil); err != nil {
		e.acc.Drop(c, fmt.Errorf("handing over the board: %w", err))
	}
}

// checkBoardMsg checks the message that comes with a board for n members
// and returns the board's capacity.
func checkBoardMsg(buf []byte, n int) (int, error) {
	c := int(binary.LittleEndian.Uint32(buf[8:]))
	if binary.LittleEndian.Uint64(buf) != magic || c < n || c > maxBoardMembers ||
		binary.LittleEndian.Uint32(buf[12:]) != uint32(boardSize(c)) {
		return 0, fmt.Errorf("the board is for %d ranks of %d bytes; this communicator has %d ranks",
			c, binary.LittleEndian.Uint32(buf[12:]), n)
	}
	return c, nil
}
