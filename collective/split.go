package collective

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/goccl/goccl/internal/bootstrap"
	"github.com/goccl/goccl/internal/wire"
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
// processes the parent's connections carry what the child needs (the
// colors, then each member's PeerInfo and the address of the child's
// bootstrap root, hosted by its rank 0's process), and each member takes
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
	n := c.size
	mine := []int64{int64(color), int64(key)}
	all := make([]int64, 2*n)
	if err := AllGather(ctx, c, mine, all); err != nil {
		return nil, err
	}
	c.mu.Lock()
	seq := c.splits
	c.splits++
	c.mu.Unlock()
	// The members of this rank's color, by (key, rank).
	var members []int
	for r := range n {
		if int(all[2*r]) == color {
			members = append(members, r)
		}
	}
	slices.SortStableFunc(members, func(a, b int) int {
		if ka, kb := all[2*a+1], all[2*b+1]; ka != kb {
			if ka < kb {
				return -1
			}
			return 1
		}
		return a - b
	})
	rank := slices.Index(members, c.rank)
	if c.peers == nil {
		return c.splitLocal(ctx, seq, color, members, rank)
	}
	return c.splitProcs(ctx, seq, color, members, rank)
}

// splitProcs makes the child between processes. The parent's ranks
// trade what a child needs over the parent's own connections (two small
// all-gathers: each rank's PeerInfo with its new listeners, and the port
// of the root that each child's rank 0 starts), so the child's table is
// ready without a trip to a root. Split returns once the child's
// transports are up; each member joins the root for the watch in the
// background (Comm.watchLater). The host facts (interfaces, their
// speeds, the host's id) are the parent's.
func (c *Comm) splitProcs(ctx context.Context, seq uint64, color int, members []int, rank int) (*Comm, error) {
	fail := func(err error) (*Comm, error) {
		return nil, fmt.Errorf("goccl: rank %d: split: %w", c.rank, err)
	}
	id := UniqueID{secret: splitSecret(c.id.secret, seq, color), rootRank: 1}
	var root *bootstrap.Root
	var rootErr error
	port := int64(0)
	if color != NoColor && rank == 0 {
		root, rootErr = bootstrap.StartRoot(net.JoinHostPort(c.dataHost(c.rank), "0"), bootstrap.RootOptions{
			Secret: id.secret[:], Version: Version, Timeout: c.cfg.InitTimeout, Watch: true, TLS: c.cfg.tls, Heartbeat: heartbeatOf(c.cfg)})
		if rootErr != nil {
			port = -1 // the members hear of it in the exchange
		} else {
			_, p, _ := net.SplitHostPort(root.Addr().String())
			fmt.Sscan(p, &port)
		}
	}
	if color == NoColor {
		// No child here, but the members' exchange is the parent's.
		if _, _, _, err := c.splitExchange(ctx, port, nil, false); err != nil {
			return fail(err)
		}
		return nil, nil
	}
	exchanged := false
	child, err := buildProcs(ctx, id, len(members), rank, c.cfg, c.lookup, c.facts, func(ctx context.Context, info wire.PeerInfo) (meeting, error) {
		exchanged = true
		ports, infos, failed, err := c.splitExchange(ctx, port, info.Append(nil), false)
		if err != nil {
			return meeting{}, err
		}
		for _, r := range members {
			if failed[r] {
				return meeting{}, fmt.Errorf("rank %d could not set up its part of the new communicator (its error is its own)", r)
			}
		}
		if rootErr != nil {
			return meeting{}, fmt.Errorf("starting the new communicator's bootstrap root: %w", rootErr)
		}
		leader := members[0]
		if ports[leader] <= 0 {
			return meeting{}, fmt.Errorf("rank %d (the new communicator's rank 0) could not start its bootstrap root", leader)
		}
		m := meeting{rootAddr: net.JoinHostPort(c.dataHost(leader), fmt.Sprint(ports[leader]))}
		for i, r := range members {
			p, _, err := wire.ParsePeerInfo(infos[r])
			if err == nil && (int(p.Rank) != i || int(p.NRanks) != len(members)) {
				err = fmt.Errorf("it says rank %d of %d, want %d of %d", p.Rank, p.NRanks, i, len(members))
			}
			if err != nil {
				return meeting{}, fmt.Errorf("rank %d's part of the exchange: %w", r, err)
			}
			m.table.Peers = append(m.table.Peers, p)
		}
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
			c.splitExchange(ctx, port, nil, true)
		}
		if root != nil {
			root.Close()
		}
		return fail(err)
	}
	return child, nil
}

// splitExchange all-gathers every parent rank's root port and its
// PeerInfo for the child (empty from a rank with no child) over c, and
// returns them by parent rank, with the ranks that failed before it
// (failed: this one did).
func (c *Comm) splitExchange(ctx context.Context, port int64, info []byte, failed bool) ([]int64, [][]byte, []bool, error) {
	mine := []int64{port, int64(len(info))}
	if failed {
		mine[1] = -1
	}
	all := make([]int64, 2*c.size)
	if err := AllGather(ctx, c, mine, all); err != nil {
		return nil, nil, nil, err
	}
	most := int64(0)
	gone := make([]bool, c.size)
	for r := range c.size {
		switch l := all[2*r+1]; {
		case l == -1:
			gone[r], all[2*r+1] = true, 0
		case l < 0 || l > wire.MaxFrame:
			return nil, nil, nil, fmt.Errorf("rank %d's PeerInfo would be %d bytes", r, l)
		default:
			most = max(most, l)
		}
	}
	blob := make([]byte, int(most))
	copy(blob, info)
	blobs := make([]byte, c.size*int(most))
	if most > 0 {
		if err := AllGather(ctx, c, blob, blobs); err != nil {
			return nil, nil, nil, err
		}
	}
	ports := make([]int64, c.size)
	infos := make([][]byte, c.size)
	for r := range c.size {
		ports[r] = all[2*r]
		infos[r] = blobs[r*int(most) : r*int(most)+int(all[2*r+1])]
	}
	return ports, infos, gone, nil
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

func (c *Comm) splitLocal(ctx context.Context, seq uint64, color int, members []int, rank int) (*Comm, error) {
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
