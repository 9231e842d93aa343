package collective

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"

	"github.com/goccl/goccl/internal/bootstrap"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport/shm"
)

// NoColor is the color of a rank that takes part in Split but joins no
// new communicator (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR).
const NoColor = -1

// Split makes new communicators out of c's ranks, like MPI_Comm_split and
// ncclCommSplit: every rank of c calls it; the ranks that pass the same
// color form one communicator, ranked by (key, rank in c); a rank that
// passes NoColor gets (nil, nil).
//
// A child is a full communicator: every collective, Start*, the
// point-to-point lanes, the flight recorder, the heartbeat, failure
// propagation and Shrink work on it as on one made by Init. Between
// processes one all-gather over the parent carries what the child needs
// (each rank's color and key, its PeerInfo and the address of a bootstrap
// root; the child keeps its rank 0's), and each member takes
// the parent's view of its host: no trip to a root, no interface scan.
// Split returns once the child's transports are up; its board (one host)
// and its watch (the connection to its root) are joined in the
// background. Until the watch has come (a few milliseconds) a member that
// dies is seen on the child's connections only; after, a child learns of
// a member that dies, or stops answering, exactly as fast as a parent
// does. Parent and children may be used in turn, and from
// different goroutines, each in its own issue order. A failure in one
// does not abort the others: an Abort, a timeout or a mismatch on a child
// leaves the parent and its siblings usable, and the reverse; a rank
// whose process dies fails every communicator it belongs to, each on its
// own. Close each child as well as the parent.
//
// Split returns once this rank's child is ready, bounded by ctx and
// Config.InitTimeout.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	const name = "split"
	if c == nil {
		return nil, &ArgError{Rank: -1, Op: name, Err: ErrNilComm}
	}
	if ctx == nil {
		return nil, c.argError(name, "nil context")
	}
	if color < NoColor {
		return nil, c.argError(name, "color %d: want a color ≥ 0, or NoColor", color)
	}
	c.mu.Lock()
	seq := c.splits
	c.splits++
	c.mu.Unlock()
	if c.peers == nil {
		return c.splitLocal(ctx, seq, color, key)
	}
	return c.splitProcs(ctx, seq, color, key)
}

// splitMembers returns the parent ranks of color ordered by (key, rank),
// from each parent rank's color and key, and this rank's place among
// them.
func splitMembers(colors, keys []int64, color int, me int) (members []int, rank int) {
	for r := range colors {
		if int(colors[r]) == color {
			members = append(members, r)
		}
	}
	slices.SortStableFunc(members, func(a, b int) int {
		if ka, kb := keys[a], keys[b]; ka != kb {
			if ka < kb {
				return -1
			}
			return 1
		}
		return a - b
	})
	return members, slices.Index(members, me)
}

// splitProcs makes the child between processes, in one all-gather over
// the parent's connections (splitExchange): each rank's color and key,
// its PeerInfo for the child (with its new listeners), the port of a
// bootstrap root it started and the board it offers, so that the child's
// table is ready without a trip to a root. Which member is the child's
// rank 0, whose root and board the child keeps, is known only once the
// colors are in; every member starts a root and offers a board before,
// and the others close theirs after: in place of two more rounds over the
// parent and of rank 0's hand-overs of its board (docs/performance.md).
// Where the whole parent is on one host the exchange runs on the shared
// board, the root is rank 0's alone, started after the exchange on an
// abstract socket every member can name (localRootAddr), and the child
// has no TCP listener. Split returns once the child's transports are up;
// each member joins the root for the watch in the background
// (Comm.watchLater). The host facts (interfaces, their speeds, the host's
// id) are the parent's.
func (c *Comm) splitProcs(ctx context.Context, seq uint64, color, key int) (*Comm, error) {
	fail := func(err error) (*Comm, error) {
		return nil, fmt.Errorf("goccl: rank %d: split: %w", c.rank, err)
	}
	if color == NoColor {
		// No child here, but the exchange is the parent's.
		if _, err := c.splitExchange(ctx, splitPart{color: NoColor, key: key}); err != nil {
			return fail(err)
		}
		return nil, nil
	}
	id := UniqueID{secret: splitSecret(c.id.secret, seq, color), rootRank: 1}
	rootOpts := bootstrap.RootOptions{Secret: id.secret[:], Version: Version, Timeout: c.cfg.InitTimeout, Watch: true, TLS: c.cfg.tls, Heartbeat: heartbeatOf(c.cfg)}
	// Where every rank of the parent is on this host, the child's root
	// is its rank 0's on an abstract socket named after the child's
	// secret (localRoot), started once the exchange has said who rank 0
	// is, and the exchange carries port 0 for it: no listener each
	// beforehand, and the members' watches are Unix connections.
	// The child then has no TCP listener either (Config.localOnly).
	cfg := c.cfg
	cfg.localOnly = c.localRoot()
	var root *bootstrap.Root
	var rootErr error
	port := int64(0)
	if !cfg.localOnly {
		root, rootErr = bootstrap.StartRoot(net.JoinHostPort(c.dataHost(c.rank), "0"), rootOpts)
		port = -1 // the others hear of a failed start in the exchange
		if rootErr == nil {
			_, p, _ := net.SplitHostPort(root.Addr().String())
			fmt.Sscan(p, &port)
		}
	}
	closeRoot := func() {
		if root != nil {
			root.Close()
			root = nil
		}
	}
	// The child's board, offered in the same way: its rank 0's is used,
	// and the others open it (shm.OfferBoard), so that nobody hands one
	// over. Offered where the parent reaches other ranks over shared
	// memory, for as many members as it has here.
	offer, board := c.offerBoard()
	defer func() { offer.Close() }() // unless passed on (nil then)
	exchanged := false
	// Until the exchange, buildProcs knows this rank by its parent's rank
	// and size; then it takes the child's from the table.
	child, err := buildProcs(ctx, id, c.size, c.rank, cfg, c.lookup, c.facts, func(ctx context.Context, info wire.PeerInfo) (meeting, error) {
		exchanged = true
		parts, err := c.splitExchange(ctx, splitPart{color: color, key: key, port: port, info: info.Append(nil), board: board})
		if err != nil {
			return meeting{}, err
		}
		colors, keys := make([]int64, len(parts)), make([]int64, len(parts))
		for r, p := range parts {
			colors[r], keys[r] = int64(p.color), int64(p.key)
		}
		members, rank := splitMembers(colors, keys, color, c.rank)
		if rank != 0 {
			closeRoot() // the child's root is its rank 0's
		}
		for _, r := range members {
			if parts[r].failed {
				return meeting{}, fmt.Errorf("rank %d could not set up its part of the new communicator (its error is its own)", r)
			}
		}
		if rank == 0 && rootErr != nil {
			return meeting{}, fmt.Errorf("starting the new communicator's bootstrap root: %w", rootErr)
		}
		leader := members[0]
		var m meeting
		lp := parts[leader].port
		if lp < 0 {
			return meeting{}, fmt.Errorf("rank %d (the new communicator's rank 0) could not start its bootstrap root", leader)
		}
		for i, r := range members {
			p, _, err := wire.ParsePeerInfo(parts[r].info)
			if err != nil {
				return meeting{}, fmt.Errorf("rank %d's part of the exchange: %w", r, err)
			}
			p.Rank, p.NRanks = uint32(i), uint32(len(members))
			m.table.Peers = append(m.table.Peers, p)
		}
		if lp == 0 {
			m.rootAddr = localRootAddr(id.secret, m.table.Peers[0].PID)
			if rank == 0 {
				if root, err = bootstrap.StartRoot(m.rootAddr, rootOpts); err != nil {
					return meeting{}, fmt.Errorf("starting the new communicator's bootstrap root: %w", err)
				}
			}
		} else {
			m.rootAddr = net.JoinHostPort(c.dataHost(leader), fmt.Sprint(lp))
		}
		if rank == 0 {
			m.board, offer = offer, nil // buildProcs's now
		} else if at := parts[leader].board; at.FD >= 0 && m.table.Peers[0].HostID == info.HostID {
			m.boardAt = shm.BoardRef{PID: int(m.table.Peers[0].PID), FD: at.FD, Nonce: at.Nonce}
		}
		info.Rank, info.NRanks = uint32(rank), uint32(len(members))
		// The watched connection to the child's root, joined in the
		// background: the child is ready before (Comm.watchLater).
		joinCtx, cancel := context.WithTimeout(context.Background(), c.cfg.InitTimeout)
		type joined struct {
			t   wire.Table
			w   *bootstrap.Watch
			err error
		}
		done := make(chan joined, 1)
		go func() {
			t, w, err := bootstrap.JoinWatch(joinCtx, m.rootAddr, id.secret[:], info, bootstrap.WithTLS(c.cfg.tls))
			done <- joined{t, w, err}
		}()
		m.join = func() (*bootstrap.Watch, error) {
			defer cancel()
			j := <-done
			if j.err != nil {
				return nil, fmt.Errorf("joining the new communicator's bootstrap root: %w", j.err)
			}
			if !sameTable(j.t, m.table) {
				j.w.Close()
				return nil, errOtherTable
			}
			return j.w, nil
		}
		m.cancel = cancel
		m.abandon = func() {
			cancel()
			go func() {
				if j := <-done; j.w != nil {
					j.w.Close()
				}
			}()
		}
		return m, nil
	})
	if err != nil {
		if !exchanged {
			// Failed before the exchange (its listeners): take part in it
			// all the same, saying so, so that the parent's ranks stay in
			// step and this color's members fail at once.
			c.splitExchange(ctx, splitPart{color: color, key: key, port: port, failed: true})
		}
		closeRoot()
		return fail(err)
	}
	return child, nil
}

// localRoot reports whether a child's root may be on an abstract Unix
// socket: every rank of c reaches the others over shared memory (so all
// share this host and its network namespace, as shm's listeners do), and
// no TLS is asked for (whose certificates name hosts).
func (c *Comm) localRoot() bool {
	if !shm.Supported || c.cfg.tls != nil || len(c.routes) == 0 {
		return false
	}
	for _, r := range c.routes {
		if r != "self" && r != "shm" {
			return false
		}
	}
	return true
}

// localRootAddr is the abstract socket of the root of the child whose
// secret is secret, in its rank 0's process pid: named after a hash of
// both, so that its members find it without being told, nobody without
// the secret can foresee the name to take it first, and two jobs started
// with the same GOCCL_SECRET on one host do not meet at one name.
func localRootAddr(secret [16]byte, pid uint32) string {
	h := sha256.Sum256(binary.LittleEndian.AppendUint32(append([]byte("goccl split root "), secret[:]...), pid))
	return fmt.Sprintf("@goccl-root-%d-%s", pid, hex.EncodeToString(h[:12]))
}

// offerBoard offers a board for the child where the parent reaches other
// ranks over shared memory, and says where it is for the exchange (FD -1:
// none offered).
func (c *Comm) offerBoard() (*shm.BoardOffer, shm.BoardRef) {
	here := 1
	for _, r := range c.routes {
		if r == "shm" {
			here++
		}
	}
	if here < 2 {
		return nil, shm.BoardRef{FD: -1}
	}
	o, err := shm.OfferBoard(here)
	if err != nil {
		// The child's rank 0 then hands its board over, as Init's does.
		slog.Debug("goccl: split: no board offered", "rank", c.rank, "err", err)
		return nil, shm.BoardRef{FD: -1}
	}
	return o, o.Ref()
}

// splitPart is what a parent rank tells the others in a Split.
type splitPart struct {
	color, key int
	port       int64        // the port of the root it started; -1: none
	board      shm.BoardRef // the board it offers (its FD and nonce); FD -1: none
	info       []byte       // its PeerInfo for the child (none with NoColor)
	failed     bool         // it failed before the exchange
}

// A rank's record in the exchange is splitRecord bytes: a header of
// splitHeader (color, key, port, PeerInfo length, the offered board's
// descriptor and nonce) and up to splitInline bytes of PeerInfo (142 on
// one host here, 113 over TCP); a longer one takes a second all-gather.
// 240 bytes is what a rank posts on the shared board (shm.BoardMax), so
// that on one host the exchange is one post and one read of the others'
// (TestSplitRecordFitsTheBoard).
const (
	splitRecord = 240
	splitHeader = 56
	splitInline = splitRecord - splitHeader
)

// splitExchange all-gathers every parent rank's splitPart over c and
// returns them by parent rank: one fixed-size record per rank, with a
// second all-gather only when some PeerInfo is longer than splitInline.
func (c *Comm) splitExchange(ctx context.Context, me splitPart) ([]splitPart, error) {
	const hdr = splitHeader
	ilen := int64(len(me.info))
	if me.failed {
		ilen = -1
	}
	rec := make([]byte, splitRecord)
	if me.color == NoColor || me.failed {
		me.board = shm.BoardRef{FD: -1}
	}
	for i, v := range []int64{int64(me.color), int64(me.key), me.port, ilen, int64(me.board.FD)} {
		binary.LittleEndian.PutUint64(rec[8*i:], uint64(v))
	}
	copy(rec[40:56], me.board.Nonce[:])
	if ilen <= splitInline {
		copy(rec[hdr:], me.info)
	}
	all := make([]byte, c.size*len(rec))
	if err := AllGather(ctx, c, rec, all); err != nil {
		return nil, err
	}
	parts := make([]splitPart, c.size)
	longest := int64(0)
	for r := range parts {
		b := all[r*len(rec) : (r+1)*len(rec)]
		v := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
		color, key, port, l, fd := v(0), v(1), v(2), v(3), v(4)
		switch {
		case color < NoColor || color > math.MaxInt32:
			return nil, fmt.Errorf("rank %d's color in the exchange is %d", r, color)
		case l < -1 || l > wire.MaxFrame:
			return nil, fmt.Errorf("rank %d's PeerInfo would be %d bytes", r, l)
		case fd < -1 || fd > math.MaxInt32:
			return nil, fmt.Errorf("rank %d's board descriptor in the exchange is %d", r, fd)
		}
		parts[r] = splitPart{color: int(color), key: int(key), port: port, failed: l == -1,
			board: shm.BoardRef{FD: int(fd), Nonce: [16]byte(b[40:56])}}
		if l > splitInline {
			longest = max(longest, l)
		} else if l > 0 {
			parts[r].info = b[hdr : hdr+l]
		}
	}
	if longest > 0 {
		blob := make([]byte, longest)
		if ilen > splitInline {
			copy(blob, me.info)
		}
		blobs := make([]byte, c.size*int(longest))
		if err := AllGather(ctx, c, blob, blobs); err != nil {
			return nil, err
		}
		for r := range parts {
			if l := int64(binary.LittleEndian.Uint64(all[r*len(rec)+24:])); l > splitInline {
				parts[r].info = blobs[r*int(longest) : r*int(longest)+int(l)]
			}
		}
	}
	return parts, nil
}

// sameTable reports whether two tables name the same ranks in the same
// order.
func sameTable(a, b wire.Table) bool {
	return slices.EqualFunc(a.Peers, b.Peers, func(p, q wire.PeerInfo) bool {
		return p.Rank == q.Rank && p.PID == q.PID && p.HostID == q.HostID && p.DataAddr == q.DataAddr
	})
}

// dataHost is the address rank r's data listener is on: where this rank
// reaches its process.
func (c *Comm) dataHost(r int) string {
	host, _, err := net.SplitHostPort(c.peers[r].DataAddr)
	if err != nil {
		return "127.0.0.1"
	}
	return host
}

// splitSecret is a child's secret: every member derives it from the
// parent's, the split's number and the color, so that none travels.
func splitSecret(parent [16]byte, seq uint64, color int) [16]byte {
	m := hmac.New(sha256.New, parent[:])
	var b [16]byte
	binary.BigEndian.PutUint64(b[:], seq)
	binary.BigEndian.PutUint64(b[8:], uint64(color))
	m.Write([]byte("goccl split"))
	m.Write(b[:])
	var out [16]byte
	copy(out[:], m.Sum(nil))
	return out
}

// A local group's splits meet here: the last member of a color to arrive
// makes the child group, as NewLocalGroup would, and each member takes
// its rank's communicator.
type localFamily struct {
	mu      sync.Mutex
	pending map[[2]uint64]*localSplit // by split number and color
}

type localSplit struct {
	devs   []Device
	joined int
	comms  []*Comm
	err    error
	ready  chan struct{}
}

func (c *Comm) splitLocal(ctx context.Context, seq uint64, color, key int) (*Comm, error) {
	n := c.size
	mine := []int64{int64(color), int64(key)}
	all := make([]int64, 2*n)
	if err := AllGather(ctx, c, mine, all); err != nil {
		return nil, err
	}
	colors, keys := make([]int64, n), make([]int64, n)
	for r := range n {
		colors[r], keys[r] = all[2*r], all[2*r+1]
	}
	members, rank := splitMembers(colors, keys, color, c.rank)
	if color == NoColor {
		return nil, nil
	}
	f := c.family
	k := [2]uint64{seq, uint64(color)}
	f.mu.Lock()
	s := f.pending[k]
	if s == nil {
		s = &localSplit{devs: make([]Device, len(members)), ready: make(chan struct{})}
		f.pending[k] = s
	}
	if c.dev != nil {
		s.devs[rank] = c.dev.dev
	}
	s.joined++
	if s.joined == len(members) {
		delete(f.pending, k)
		cfg := c.cfg
		cfg.devices = nil
		if c.dev != nil {
			cfg.devices = s.devs
		}
		s.comms, _, s.err = newLocalGroupCfg(len(members), cfg)
		close(s.ready)
	}
	f.mu.Unlock()
	select {
	case <-s.ready:
	default:
		select {
		case <-s.ready:
		case <-ctx.Done():
			f.mu.Lock()
			built := s.comms != nil || s.err != nil
			if !built {
				s.joined-- // the others still wait for this rank, or give up too
			}
			f.mu.Unlock()
			if built && s.err == nil {
				s.comms[rank].Close() // made just as this rank gave up: nobody else holds it
			}
			return nil, fmt.Errorf("goccl: rank %d: split: waiting for the other members of color %d: %w", c.rank, color, context.Cause(ctx))
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	return s.comms[rank], nil
}
