package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/fence"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

// The board (transport.Board): one segment that all the communicator's
// ranks map, when all of them share this host. Rank 0 makes it in
// JoinBoard and hands it to every other rank the way a pair's segment is
// handed over (ConnSetup with wire.ConnBoard), or, for a board offered
// ahead (a split child's, Options.Board), the others open rank 0's
// descriptor themselves (offer_linux.go).
//
// A collective of at most BoardMax bytes is then one post per rank: each
// rank writes its contribution into its own entry and reads everyone
// else's from theirs, where the connections would take n-1 posts and n-1
// waits per rank, each on another segment. On 4 ranks sharing 2 cores,
// where every wait is a context switch and what a rank does per turn on a
// core sets the time (docs/performance.md), that is most of the work.
//
// Layout. Page 0 is the header; then a block per member; then a reason
// area per member. Every field one side writes while others poll has a
// 128-byte block to itself (Intel's adjacent-line prefetcher fetches lines
// in pairs):
//
//	0                   magic, version, members (an offer's capacity)
//	32                  an offer's nonce (zero in Init's board)
//	128                 sleepers: members sleeping on wake
//	256                 wake: futex word, bumped by posts that find sleepers
//	page + m*memberLen  member m's block:
//	  +0                last: the latest collective m marked (seq+1, 8
//	                    bytes), its signature (4); m's flags at +64
//	                    (gone, aborted)
//	  +128 + e*256      boardEntries entries, e = seq mod boardEntries:
//	                    seq+1 (8 bytes, written last), signature (4),
//	                    size (4), data (up to BoardMax bytes)
//	...                 reasons: reasonLen bytes per member, why it aborted
//
// An entry is reused boardEntries collectives later. Before a member
// writes it again it makes sure that every member has reached the
// collective after its previous contents' (posted or marked it), which a
// member does only after it has finished reading those. With 64 entries
// a broadcast's root (or a reduce's posters) runs up to 63 collectives
// ahead of its slowest reader before it waits: where ranks outnumber
// cores, a rank then does many collectives per turn on a core instead of
// waiting for the others' turns every few (8 entries: 4 ranks on 2 cores
// took twice as long per broadcast, docs/performance.md). The symmetric
// collectives read every member's entry before they post the next, so for
// them one would do. A member that runs
// collectives on the board does know that from its reads (every member
// of an all-reduce, all-gather or reduce-scatter reads every other's
// entry; a broadcast's readers mark it, since its root reads nobody's,
// and so do a reduce's root and posters, each only where the collective's
// number is a multiple of markEvery, which is often enough);
// after collectives that ran elsewhere, which every member marks, it
// reads the others' last words. So a post writes its entry only, not
// last: readers poll the entry, and a store to last, a line they poll
// too, cost the poster a cross-core ownership transfer per collective
// (docs/performance.md).

// BoardMax is the largest contribution the board carries: an entry is
// four cache lines.
const BoardMax = boardEntryLen - entryData

const (
	boardVersion  = 3 // 2: boardEntries entries per member; 3: 64 of them
	boardSleepers = 128
	boardWake     = 256

	memberLast    = 0
	memberLastSig = 8
	memberFlags   = 64
	memberEntry   = 128
	boardEntryLen = 256
	boardEntries  = 64
	memberLen     = memberEntry + boardEntries*boardEntryLen

	entrySeq  = 0
	entrySig  = 8
	entrySize = 12
	entryData = 16

	flagGone    = 1
	flagAborted = 2
	// flagBarrier: the member's process is registered for
	// fence.SharedHeavy, and the member runs one before it sleeps on the
	// board, so a post may publish its entry with a plain store when
	// every member has it (Post).
	flagBarrier = 4

	boardReasonLen = 512
)

func boardSize(n int) int {
	return pageSize + roundPage(n*memberLen) + roundPage(n*boardReasonLen)
}

// board is this rank's view of the board.
type board struct {
	e    *Endpoint
	seg  *segment // for its lifetime: acquire, release, detach
	me   int
	n    int
	seen []uint64 // per member: collectives known reached (seq+1), from this rank's reads
	// held: between Begin and End. pinned: this rank holds the segment,
	// from its first Begin until Unpin (transport.BoardPinner), so that
	// Begin, End and Mark take no reference each; both are this rank's
	// collectives' own (they run one at a time).
	held   bool
	pinned bool
	// plain: every member has flagBarrier (it stays set), so Post
	// publishes with a plain store; until then a sequentially consistent
	// one.
	plain bool
	// barrier: this member has flagBarrier and runs fence.SharedHeavy
	// before it sleeps.
	barrier bool
	// slice: the longest it sleeps at a time (sleepSlice; tests lengthen
	// it to make a missed wake-up show).
	slice time.Duration

	sleeps atomic.Int32 // futex sleeps so far (tests look)
	// waiting is the member a post or read waits for, plus one (0: none),
	// for Waiting; written only by wait, so a post or read that need not
	// wait stores nothing.
	waiting atomic.Int32
}

var (
	_ transport.Board          = (*board)(nil)
	_ transport.BoardWaiter    = (*board)(nil)
	_ transport.BoardMarkEvery = (*board)(nil)
	_ transport.BoardPinner    = (*board)(nil)
)

// markEvery is MarkEvery: a post waits for every member to have reached
// the collective boardEntries-2 before it (Post), and any boardEntries-1
// consecutive collectives hold a multiple of 16, so a member that marks
// only those is waited for no longer than it takes to reach the next
// one. A reader's mark is a store to a line its root polls: marking every
// collective cost an 8-byte broadcast's reader a fifth of its time
// (docs/performance.md).
const markEvery = 16

// MarkEvery implements transport.BoardMarkEvery.
func (b *board) MarkEvery() int { return markEvery }

// Waiting implements transport.BoardWaiter.
func (b *board) Waiting() int { return int(b.waiting.Load()) - 1 }

func (b *board) member(m int) []byte {
	off := pageSize + m*memberLen
	return b.seg.mem[off : off+memberLen : off+memberLen]
}

func (b *board) u64(m, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b.member(m)[off]))
}

func (b *board) u32(m, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b.member(m)[off]))
}

func (b *board) entry(m int, seq uint64) []byte {
	off := memberEntry + int(seq%boardEntries)*boardEntryLen
	return b.member(m)[off : off+boardEntryLen : off+boardEntryLen]
}

func (b *board) reasonArea(m int) []byte {
	off := pageSize + roundPage(b.n*memberLen) + m*boardReasonLen
	return b.seg.mem[off : off+boardReasonLen : off+boardReasonLen]
}

func (b *board) sleepers() *atomic.Uint32 { return b.seg.u32(boardSleepers) }
func (b *board) wake() *atomic.Uint32     { return b.seg.u32(boardWake) }

// Max implements transport.Board.
func (b *board) Max() int { return BoardMax }

// Begin implements transport.Board.
func (b *board) Begin() error {
	if b.held {
		return errors.New("shm: board Begin twice without End")
	}
	if !b.pinned {
		if !b.seg.enter(&b.e.down) {
			return b.e.closedErr()
		}
		b.pinned = true
	} else if b.e.down.Load() {
		// Pinned, the mapping stays (detach puts private pages in its
		// place), so a Begin that races the close reads harmless zeros.
		return b.e.closedErr()
	}
	b.held = true
	return nil
}

// End implements transport.Board. The segment stays pinned.
func (b *board) End() { b.held = false }

// Unpin implements transport.BoardPinner.
func (b *board) Unpin() {
	if b.pinned {
		b.pinned = false
		b.seg.release()
	}
}

// errNotHeld is a Post or Read outside Begin and End.
var errNotHeld = errors.New("shm: the board is used outside Begin and End")

// Post implements transport.Board.
func (b *board) Post(ctx context.Context, seq uint64, sig uint32, data []byte) error {
	if len(data) > BoardMax {
		return fmt.Errorf("shm: a %d-byte post to the board, which holds %d", len(data), BoardMax)
	}
	if !b.held {
		return errNotHeld
	}
	if b.e.down.Load() {
		return b.e.closedErr()
	}
	if seq >= boardEntries {
		// The entry held seq-boardEntries: every member must have reached
		// the collective after it (seen holds seq+1 of the latest reached).
		need := seq - boardEntries + 2
		for m := range b.n {
			if m == b.me || b.seen[m] >= need {
				continue
			}
			reached := func() bool {
				b.seen[m] = max(b.seen[m], b.u64(m, memberLast).Load())
				return b.seen[m] >= need
			}
			if !reached() {
				if err := b.wait(ctx, m, reached); err != nil {
					return err
				}
			}
		}
	}
	e := b.entry(b.me, seq)
	binary.LittleEndian.PutUint32(e[entrySig:], sig)
	binary.LittleEndian.PutUint32(e[entrySize:], uint32(len(data)))
	copy(e[entryData:], data)
	if b.plain || b.allBarrier() {
		// Readers poll this line: a locked instruction here (or at the
		// next one the caller runs) waits for it to come back from their
		// cores, a third of an 8-byte broadcast's time on 2 ranks
		// (docs/performance.md). A plain store is ordered after the
		// entry's contents all the same (x86-TSO, or a release store
		// elsewhere), and a member that would sleep first runs a barrier
		// that makes it visible, or makes wakeSleepers see the sleeper.
		fence.Store64((*uint64)(unsafe.Pointer(&e[entrySeq])), seq+1)
	} else {
		(*atomic.Uint64)(unsafe.Pointer(&e[entrySeq])).Store(seq + 1)
	}
	b.wakeSleepers()
	// The next post's entry was read by the others boardEntries-1
	// collectives ago: have its first line taken from their caches now,
	// while the caller goes on, rather than under the next post's store.
	if hasPrefetchw {
		prefetchw(unsafe.Pointer(&b.entry(b.me, seq+1)[entrySeq]))
	}
	return nil
}

// allBarrier reports whether every member has flagBarrier, and from then
// on says so without looking (the flag is never cleared).
func (b *board) allBarrier() bool {
	for m := range b.n {
		if b.u32(m, memberFlags).Load()&flagBarrier == 0 {
			return false
		}
	}
	b.plain = true
	return true
}

// Mark implements transport.Board.
func (b *board) Mark(seq uint64, sig uint32) {
	if b.pinned {
		b.setLast(seq, sig)
		return
	}
	if !b.seg.acquire() {
		return
	}
	b.setLast(seq, sig)
	b.seg.release()
}

// setLast records seq as this member's latest collective and wakes the
// sleepers. Either a member going to sleep sees the store, or this sees
// the sleeper: the store is sequentially consistent (an exchange on x86)
// until every member has flagBarrier, and then plain, as Post's is, each
// sleeper's barrier making it visible. A broadcast's root polls its
// readers' marks once it is a board's length ahead (a reduce's posters
// the root's): with exchanges a 2-rank 8-byte broadcast took 0.165 µs,
// with plain stores 0.144 (docs/performance.md, "Marks as plain
// stores").
func (b *board) setLast(seq uint64, sig uint32) {
	m := b.member(b.me)
	if b.plain || b.allBarrier() {
		// Both in order (x86-TSO, or release stores elsewhere): a reader
		// that sees last sees its signature.
		fence.Store((*uint32)(unsafe.Pointer(&m[memberLastSig])), sig)
		fence.Store64((*uint64)(unsafe.Pointer(&m[memberLast])), seq+1)
	} else {
		(*atomic.Uint32)(unsafe.Pointer(&m[memberLastSig])).Store(sig)
		(*atomic.Uint64)(unsafe.Pointer(&m[memberLast])).Store(seq + 1)
	}
	b.wakeSleepers()
}

// wakeSleepers wakes the members sleeping on the board, if any, after a
// sequentially consistent store (setLast's or Post's, until every member
// has flagBarrier), or a plain one that the sleeper's barrier backs:
// either a member going to sleep sees that store, or this sees the
// sleeper.
func (b *board) wakeSleepers() {
	if b.sleepers().Load() != 0 {
		b.wake().Add(1)
		futexWake(b.wake())
	}
}

// Read implements transport.Board.
func (b *board) Read(ctx context.Context, r int, seq uint64) (uint32, []byte, bool, error) {
	if r < 0 || r >= b.n || r == b.me {
		return 0, nil, false, fmt.Errorf("shm: no board member %d to read", r)
	}
	if !b.held {
		return 0, nil, false, errNotHeld
	}
	if b.e.down.Load() {
		return 0, nil, false, b.e.closedErr()
	}
	e := b.entry(r, seq)
	posted := (*atomic.Uint64)(unsafe.Pointer(&e[entrySeq]))
	if posted.Load() != seq+1 {
		var last uint64
		ready := func() bool {
			if posted.Load() == seq+1 {
				return true
			}
			// Entries are written before last: once last says r is
			// there, the entry is final.
			last = b.u64(r, memberLast).Load()
			return last >= seq+1
		}
		if !ready() {
			if err := b.wait(ctx, r, ready); err != nil {
				return 0, nil, false, err
			}
		}
		if posted.Load() != seq+1 {
			b.seen[r] = max(b.seen[r], last)
			var sig uint32
			if last == seq+1 {
				sig = b.u32(r, memberLastSig).Load()
			}
			return sig, nil, false, nil
		}
	}
	b.seen[r] = max(b.seen[r], seq+1)
	size := min(int(binary.LittleEndian.Uint32(e[entrySize:])), BoardMax)
	sig := binary.LittleEndian.Uint32(e[entrySig:])
	return sig, e[entryData : entryData+size], true, nil
}

// wait waits until ready holds, polling like conn.await (yielding after
// every failed poll when ranks outnumber cores), then sleeping on the
// board's wake word. It fails when this endpoint closes, ctx ends, or
// member r (whom it waits for) aborted or left; any member's abort ends
// it too, since the collective cannot complete.
func (b *board) wait(ctx context.Context, r int, ready func() bool) error {
	check := func() error {
		err := b.check(ctx, r)
		if errors.Is(err, transport.ErrPeerClosed) && ready() {
			return nil // r left, but not before it got there
		}
		return err
	}
	b.waiting.Store(int32(r) + 1)
	defer b.waiting.Store(0)
	every := 256 // polls between checks: with PAUSE, about 10 µs
	if b.e.o.YieldWhenIdle {
		every = 32 // each poll a sched_yield: about 30 µs or more
	}
	var start time.Time
	for i := 1; ; i++ {
		if ready() {
			return nil
		}
		if b.e.o.YieldWhenIdle {
			yieldCPU()
		} else {
			pause()
		}
		if i%every != 0 {
			continue
		}
		if err := check(); err != nil {
			return err
		}
		now := time.Now()
		if start.IsZero() {
			start = now
		}
		if now.Sub(start) >= b.e.o.SpinFor {
			break
		}
		if !b.e.o.YieldWhenIdle {
			yieldCPU()
		}
	}
	for {
		b.sleepers().Add(1)
		if b.barrier && !fence.SharedHeavy() {
			// Posts may be plain stores still in their cores' store
			// buffers: the barrier makes this see them, or their posters'
			// reads of sleepers see this one (fence). Refused since the
			// board was joined (a seccomp filter installed later), a
			// wake-up may be missed: the sleep slice bounds what that
			// costs.
			b.barrier = false
		}
		v := b.wake().Load()
		if ready() {
			b.sleepers().Add(^uint32(0))
			return nil
		}
		if err := check(); err != nil {
			b.sleepers().Add(^uint32(0))
			return err
		}
		b.sleeps.Add(1)
		futexWait(b.wake(), v, b.slice)
		b.sleepers().Add(^uint32(0))
	}
}

func (b *board) check(ctx context.Context, r int) error {
	if b.e.down.Load() {
		return b.e.closedErr()
	}
	for m := range b.n {
		if m != b.me && b.u32(m, memberFlags).Load()&flagAborted != 0 {
			return &transport.PeerError{Peer: m, Op: "recv", Err: &transport.PeerAbortedError{Peer: m, Cause: errors.New(b.reason(m))}}
		}
	}
	if b.u32(r, memberFlags).Load()&flagGone != 0 {
		return &transport.PeerError{Peer: r, Op: "recv", Err: transport.ErrPeerClosed}
	}
	if err := ctx.Err(); err != nil {
		return &transport.PeerError{Peer: r, Op: "recv", Err: context.Cause(ctx)}
	}
	return nil
}

func (b *board) reason(m int) string {
	a := b.reasonArea(m)
	n := min(int(binary.LittleEndian.Uint32(a)), boardReasonLen-4)
	if n == 0 {
		return "no reason given"
	}
	return string(a[4 : 4+n])
}

// leave marks this member gone (cause nil) or aborted, wakes everyone
// and lets go of the board.
func (b *board) leave(cause error) {
	if b.seg.acquire() {
		flag := uint32(flagGone)
		if cause != nil {
			a := b.reasonArea(b.me)
			n := copy(a[4:], cause.Error())
			binary.LittleEndian.PutUint32(a, uint32(n))
			flag = flagAborted
		}
		b.u32(b.me, memberFlags).Or(flag)
		b.wake().Add(1)
		futexWake(b.wake())
		b.seg.release()
	}
	b.seg.detach()
}

// boardMsg is what rank 0 sends with the board's descriptor.
const boardMsgLen = 16

func appendBoardMsg(b []byte, n int) []byte {
	b = binary.LittleEndian.AppendUint64(b, magic)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	return binary.LittleEndian.AppendUint32(b, uint32(boardSize(n)))
}

// boardKey files the board among the pending segments.
var boardKey = connKey{peer: 0, ch: -1}

// Board implements transport.BoardHolder: the board JoinBoard made, the
// one StartBoard is joining (a transport.BoardJoiner), or nil.
func (e *Endpoint) Board() transport.Board {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.board != nil:
		return e.board
	case e.joining != nil:
		return e.joining
	}
	return nil
}

// JoinBoard makes the board every rank of the communicator shares, when
// all of them are this endpoint's peers (Options.Peers has no gaps):
// rank 0 creates it and hands it to the others, who wait for it. Every
// rank must call it (or StartBoard), once, before its first operation.
func (e *Endpoint) JoinBoard(ctx context.Context) error {
	if err := e.boardPeers(); err != nil || e.o.NRanks < 2 {
		return err
	}
	_, err := e.joinBoard(ctx)
	return err
}

// StartBoard is JoinBoard in the background: it returns at once, and
// Board returns a board whose Joined waits for the join to finish
// (rank 0's hand-overs, a few round trips between processes each, would
// otherwise be on the path of making every communicator). The join is
// bounded by timeout (the setup timeout if 0; a communicator passes its
// init timeout, as the ranks may reach it that far apart) and ends when
// the endpoint closes; a join that fails is logged when it does.
func (e *Endpoint) StartBoard(timeout time.Duration) error {
	if err := e.boardPeers(); err != nil || e.o.NRanks < 2 {
		return err
	}
	j := &joiningBoard{done: make(chan struct{})}
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return transport.ErrClosed
	case e.board != nil || e.joining != nil:
		e.mu.Unlock()
		return errors.New("shm: StartBoard called twice")
	}
	e.joining = j
	e.mu.Unlock()
	go func() {
		defer close(j.done)
		if timeout <= 0 {
			timeout = setupTimeout
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		go func() { // Close ends the join
			select {
			case <-e.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		b, err := e.joinBoard(ctx)
		if err == nil {
			j.b.Store(b)
		}
		j.err = err
		if j.err != nil && !e.down.Load() {
			e.log.Warn("goccl: shm: no board: small collectives will fail at their first use", "rank", e.o.Rank, "err", j.err)
		}
	}()
	return nil
}

func (e *Endpoint) boardPeers() error {
	for r, p := range e.o.Peers {
		if p == "" && r != e.o.Rank {
			return fmt.Errorf("shm: rank %d is not a shared-memory peer, so there is no board", r)
		}
	}
	return nil
}

func (e *Endpoint) joinBoard(ctx context.Context) (*board, error) {
	var seg *segment
	var err error
	switch {
	case e.o.Rank == 0 && e.o.Board != nil:
		seg, err = e.adoptOffer() // the others fetch it (offer_linux.go)
	case e.o.Rank == 0:
		seg, err = e.makeBoard(ctx)
	case e.o.BoardAt.PID != 0:
		seg, err = e.fetchBoard(ctx)
	default:
		var p pendingSeg
		p, err = e.awaitIncoming(ctx, boardKey)
		seg = p.seg
	}
	if err != nil {
		return nil, fmt.Errorf("shm: board: %w", err)
	}
	b := &board{e: e, seg: seg, me: e.o.Rank, n: e.o.NRanks, seen: make([]uint64, e.o.NRanks), slice: sleepSlice}
	if fence.SharedReady() {
		// Set before anything is posted here: the member barriers from its
		// first sleep on.
		b.barrier = true
		b.u32(b.me, memberFlags).Or(flagBarrier)
	}
	e.mu.Lock()
	closed, cause, twice := e.closed, e.cause, e.board != nil
	if !closed && !twice {
		e.board = b
	}
	e.mu.Unlock()
	switch {
	case closed:
		// Closed meanwhile: the others may have it, and learn from it
		// that this rank has gone, as from Close.
		b.leave(cause)
		return nil, transport.ErrClosed
	case twice:
		seg.detach()
		return nil, errors.New("shm: JoinBoard called twice")
	}
	return b, nil
}

// joiningBoard is the board StartBoard is joining.
type joiningBoard struct {
	done chan struct{} // closed when the join has finished; then b or err
	// b is the board once joined: an atomic load for every call after,
	// where a select on done cost an 8-byte broadcast 4%
	// (docs/performance.md).
	b   atomic.Pointer[board]
	err error
}

var _ transport.BoardJoiner = (*joiningBoard)(nil)

// Joined implements transport.BoardJoiner.
func (j *joiningBoard) Joined(ctx context.Context) error {
	select {
	case <-j.done: // first: a board that has come is used, even on an ended context
		return j.err
	default:
	}
	select {
	case <-j.done:
		return j.err
	case <-ctx.Done():
		return fmt.Errorf("shm: waiting for the board: %w", context.Cause(ctx))
	}
}

// joined is the board, once Joined has succeeded.
func (j *joiningBoard) joined() (*board, error) {
	if b := j.b.Load(); b != nil {
		return b, nil
	}
	select {
	case <-j.done:
		if j.err != nil {
			return nil, j.err
		}
		return nil, errors.New("shm: the board's join ended with no board")
	default:
		return nil, errors.New("shm: the board is used before it is joined (call Joined first)")
	}
}

// JoinedBoard implements transport.BoardJoiner: the board once joined,
// else the joiner itself.
func (j *joiningBoard) JoinedBoard() transport.Board {
	if b := j.b.Load(); b != nil {
		return b
	}
	return j
}

func (j *joiningBoard) Max() int { return BoardMax }

// MarkEvery implements transport.BoardMarkEvery (a constant: callable
// before Joined).
func (j *joiningBoard) MarkEvery() int { return markEvery }

// Waiting implements transport.BoardWaiter: -1 until the board is joined.
func (j *joiningBoard) Waiting() int {
	if b, err := j.joined(); err == nil {
		return b.Waiting()
	}
	return -1
}

func (j *joiningBoard) Begin() error {
	b, err := j.joined()
	if err != nil {
		return err
	}
	return b.Begin()
}

func (j *joiningBoard) End() {
	if b := j.b.Load(); b != nil {
		b.End()
	}
}

func (j *joiningBoard) Post(ctx context.Context, seq uint64, sig uint32, data []byte) error {
	b, err := j.joined()
	if err != nil {
		return err
	}
	return b.Post(ctx, seq, sig, data)
}

// Unpin implements transport.BoardPinner.
func (j *joiningBoard) Unpin() {
	if b := j.b.Load(); b != nil {
		b.Unpin()
	}
}

func (j *joiningBoard) Mark(seq uint64, sig uint32) {
	if b, err := j.joined(); err == nil {
		b.Mark(seq, sig)
	}
}

func (j *joiningBoard) Read(ctx context.Context, r int, seq uint64) (uint32, []byte, bool, error) {
	b, err := j.joined()
	if err != nil {
		return 0, nil, false, err
	}
	return b.Read(ctx, r, seq)
}

// createBoard makes a new board for n members and returns its descriptor
// (to hand to the others) and this rank's mapping, its header written.
func createBoard(n int) (int, *segment, error) {
	size := boardSize(n)
	fd, err := sealedMemfd("goccl-board", size)
	if err != nil {
		return -1, nil, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("map board: %w", err)
	}
	copy(mem, boardHeaderBytes(n, [16]byte{}))
	return fd, &segment{mem: mem}, nil
}

// boardHeaderBytes is the start of the header page of a board for n members
// (an offer's capacity) with nonce (an offer's; zero for Init's board).
func boardHeaderBytes(n int, nonce [16]byte) []byte {
	hdr := make([]byte, hdrNonce+len(nonce))
	binary.LittleEndian.PutUint64(hdr[hdrMagic:], magic)
	binary.LittleEndian.PutUint32(hdr[hdrVersion:], boardVersion)
	binary.LittleEndian.PutUint32(hdr[hdrSlots:], uint32(n))
	copy(hdr[hdrNonce:], nonce[:])
	return hdr
}

// makeBoard creates the board and hands it to every other rank.
func (e *Endpoint) makeBoard(ctx context.Context) (*segment, error) {
	n := e.o.NRanks
	fd, seg, err := createBoard(n)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// To every peer at once: each hand-over is a few round trips between
	// processes, and a board for n ranks would otherwise take n-1 of them
	// in turn.
	errs := make(chan error, n-1)
	for peer := 1; peer < n; peer++ {
		go func() {
			s := wire.ConnSetup{From: uint32(e.o.Rank), To: uint32(peer), NSocks: 1, Flags: wire.ConnBoard}
			c, err := e.handOver(ctx, peer, s, appendBoardMsg(nil, n), fd)
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	var first error
	for range n - 1 {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		seg.detach()
		return nil, first
	}
	return seg, nil
}

// receiveBoard reads the board message and its descriptor, and maps it
// (nonce: an offer's, or zero for Init's board).
func (e *Endpoint) receiveBoard(c *net.UnixConn, nonce [16]byte) (*segment, error) {
	buf := make([]byte, boardMsgLen)
	fd, err := readWithFD(c, buf)
	if err != nil {
		return nil, fmt.Errorf("reading the board: %w", err)
	}
	defer unix.Close(fd)
	if _, err := checkBoardMsg(buf, e.o.NRanks); err != nil {
		return nil, err
	}
	return mapBoard(fd, e.o.NRanks, nonce)
}

// mapBoard maps a board that another rank made, for n members: a sealed
// memfd of the size its header's capacity (at least n) gives, with the
// nonce its maker put there (an offer's; zero for Init's board).
func mapBoard(fd, n int, nonce [16]byte) (*segment, error) {
	got, err := sealedSize(fd)
	if err != nil {
		return nil, fmt.Errorf("refusing to map the board: %w", err)
	}
	if got < int64(boardSize(n)) || got > int64(boardSize(maxBoardMembers)) {
		return nil, fmt.Errorf("board is %d bytes, want %d for %d ranks", got, boardSize(n), n)
	}
	mem, err := unix.Mmap(fd, 0, int(got), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map board: %w", err)
	}
	c := int(binary.LittleEndian.Uint32(mem[hdrSlots:]))
	if binary.LittleEndian.Uint64(mem[hdrMagic:]) != magic || binary.LittleEndian.Uint32(mem[hdrVersion:]) != boardVersion ||
		c < n || int64(boardSize(c)) != got || [16]byte(mem[hdrNonce:hdrNonce+16]) != nonce {
		unix.Munmap(mem)
		return nil, errors.New("not a goccl board of this version and size, or not the one offered")
	}
	return &segment{mem: mem}, nil
}

// readWithFD reads len(buf) bytes from c and the one descriptor that
// comes with them.
func readWithFD(c *net.UnixConn, buf []byte) (int, error) {
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	var fds []int
	if oobn > 0 {
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if f, perr := unix.ParseUnixRights(&m); perr == nil {
					fds = append(fds, f...)
				}
			}
		}
	}
	if err == nil && n < len(buf) {
		_, err = io.ReadFull(c, buf[n:])
	}
	if err == nil && len(fds) != 1 {
		err = fmt.Errorf("expected one descriptor, got %d", len(fds))
	}
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, err
	}
	return fds[0], nil
}
