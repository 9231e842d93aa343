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
// processes each child has a bootstrap root of its own, hosted by its
// rank 0's process (the parent's connections carry the exchange of colors
// and of the root's address, then the child connects on its own), so a
// child learns of a member that dies, or stops answering, exactly as fast
// as a parent does. Parent and children may be used in turn, and from
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
	return c.splitProcs(ctx, seq, color, all, members, rank)
}

// splitProcs makes the child between processes: its rank 0 starts a root,
// the parent's ranks all-gather the roots' ports, and every member joins
// its root as Init does.
func (c *Comm) splitProcs(ctx context.Context, seq uint64, color int, all []int64, members []int, rank int) (*Comm, error) {
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
			port = -1 // the members hear of it below
		} else {
			_, p, _ := net.SplitHostPort(root.Addr().String())
			fmt.Sscan(p, &port)
		}
	}
	ports := make([]int64, c.size)
	if err := AllGather(ctx, c, []int64{port}, ports); err != nil {
		if root != nil {
			root.Close()
		}
		return fail(err)
	}
	if color == NoColor {
		return nil, nil
	}
	if rootErr != nil {
		return fail(fmt.Errorf("starting the new communicator's bootstrap root: %w", rootErr))
	}
	leader := members[0]
	if ports[leader] <= 0 {
		return fail(fmt.Errorf("rank %d (the new communicator's rank 0) could not start its bootstrap root", leader))
	}
	id.addr = net.JoinHostPort(c.dataHost(leader), fmt.Sprint(ports[leader]))
	child, err := initProcs(ctx, id, len(members), rank, c.cfg, c.lookup)
	if err != nil {
		if root != nil {
			root.Close()
		}
		return fail(err)
	}
	return child, nil
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
