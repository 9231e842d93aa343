package algorithms

import (
	"fmt"
	"math"
	"math/bits"
)

// LinkModel is what the tuner knows about the links between ranks. The
// engine derives it from the transports in use (and, later, the topology);
// all ranks must use the same model so that they choose the same plan.
type LinkModel struct {
	// Latency is the time one message hop costs, start to finish, for a
	// tiny message (α in Hockney's model): software overhead plus the
	// wake-up of the receiver.
	Latency float64 // seconds
	// Bandwidth is what one channel moves over one link (1/β).
	Bandwidth float64 // bytes per second
	// ReduceRate is how fast one rank reduces (1/γ): bytes of one input
	// vector per second. Zero means free.
	ReduceRate float64 // bytes per second
	// MaxChannels is the most channels worth running at once (≥ 1); more
	// channels add bandwidth (each channel its own connections) up to it.
	MaxChannels int
	// ChannelBytes is the smallest share of an operation worth a channel of
	// its own: an operation of S bytes uses at most S/ChannelBytes channels.
	ChannelBytes int64
	// ChunkBytes is the preferred block size of pipelined algorithms (ring,
	// tree, chain): big enough to amortise the per-step latency, small
	// enough that the pipeline fills quickly.
	ChunkBytes int64
	// MinSliceBytes is the smallest slice the engine cuts a small block
	// into (0: the engine's floor, 16 KiB). A link whose every slice has a
	// fixed cost well above a slot's handover (TCP: a writev and a read
	// with their wake-ups, on each end) raises it, so that a block that
	// would go as several small slices goes as one. Every rank of a job
	// has the same link model, so they cut alike.
	MinSliceBytes int64
	// PostCost is what one more message costs its sender, relative to
	// Latency (LogP's o/L): how much a rank pays to send the same message
	// to several peers, as OneShot does. Zero means DefaultPostCost.
	PostCost float64
	// OneShotHalves lets the tuner weigh the one-shot reduce-scatter and
	// all-gather on this link: they were measured ahead of the ring
	// between processes over shared memory and TCP, and behind it
	// (1.03-1.18 of its time) between the goroutines of the in-process
	// transport; over RDMA they are not measured.
	OneShotHalves bool
	// OneShotReduce lets the tuner weigh the one-shot reduce (every rank
	// sending straight to the root) on this link: measured ahead of the
	// chain for small messages on 4 ranks over TCP, where each of the
	// chain's hops is a wake-up on oversubscribed cores, and behind or
	// level with it over shared memory (docs/performance.md).
	OneShotReduce bool
	// ExchangeEfficiency is the bandwidth of the recursive-doubling
	// all-gather relative to the ring's on this link: its rounds exchange
	// whole groups of blocks and do not pipeline. Zero: the tuner does not
	// weigh it (unmeasured on that link).
	ExchangeEfficiency float64
}

// Validate reports a model the tuner cannot use.
func (m LinkModel) Validate() error {
	switch {
	case !(m.Latency >= 0) || !(m.Bandwidth > 0) || !(m.ReduceRate >= 0):
		return fmt.Errorf("algorithms: link model needs latency ≥ 0, bandwidth > 0, reduce rate ≥ 0: %+v", m)
	case !(m.PostCost >= 0):
		return fmt.Errorf("algorithms: link model needs PostCost ≥ 0: %+v", m)
	case !(m.ExchangeEfficiency >= 0) || math.IsInf(m.ExchangeEfficiency, 1):
		return fmt.Errorf("algorithms: link model needs a finite ExchangeEfficiency ≥ 0: %+v", m)
	case m.MaxChannels < 1 || m.ChannelBytes < 1 || m.ChunkBytes < 1:
		return fmt.Errorf("algorithms: link model needs MaxChannels, ChannelBytes and ChunkBytes ≥ 1: %+v", m)
	}
	return nil
}

// Problem is what the tuner chooses a plan for.
type Problem struct {
	Coll   Collective
	NRanks int
	// Bytes is the operation's size as nccl-tests counts it: the buffer of
	// all-reduce, broadcast, reduce, send and recv; the send buffer of
	// reduce-scatter; the receive buffer of all-gather and all-to-all.
	Bytes int64
	Link  LinkModel
	// Hosts and PerHost shape the communicator across hosts: Hosts hosts
	// of PerHost ranks each (PerHost 0: hosts of different sizes). Zero
	// Hosts means one. Intra models the links inside a host (shared
	// memory); Link, the slowest link of the job, models the network.
	Hosts, PerHost int
	Intra          LinkModel
}

// Plan is the tuner's choice.
type Plan struct {
	Algo     Algorithm
	Channels int
	// ChunkBytes is the target block size for pipelining; the engine cuts
	// each channel's share into pieces whose blocks are about this size
	// (never fewer pieces than MinPieces allows).
	ChunkBytes int64
}

func log2ceil(n int) int { return bits.Len(uint(n - 1)) }

// rabenseifnerEfficiency is the measured bandwidth of Rabenseifner's
// exchanges relative to the ring's (see Cost).
const rabenseifnerEfficiency = 0.85

// DefaultPostCost is LinkModel.PostCost when a model leaves it zero: the
// cost of one more message relative to the hop latency α, fitted to 8-byte
// all-reduce over TCP on loopback (docs/performance.md): 3 ranks ran 33 µs
// one-shot against 36 µs recursive doubling (with its fold), 4 ranks 50 µs
// against 40 µs. With 0.75 the tuner picks one-shot for 3 and 5 ranks,
// recursive doubling for 2, 4 and from 6 on.
const DefaultPostCost = 0.75

// postCost is m.PostCost, or DefaultPostCost where m leaves it zero.
func (m LinkModel) postCost() float64 {
	if m.PostCost == 0 {
		return DefaultPostCost
	}
	return m.PostCost
}

// Cost predicts the time of problem p run with algorithm a on c channels,
// in seconds, from the link model: latency α per hop, bytes over bandwidth,
// bytes over the reduction rate (Hockney's α-β model with the γ term of
// Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
// Communication Operations in MPICH", table 1; pipelined algorithms as in
// NCCL's src/graph/tuning.cc, which charges a ring 2(n-1) hops and
// 2(n-1)/n of the bytes). It returns +Inf for an algorithm that cannot run
// p.
func Cost(p Problem, a Algorithm, c int) float64 {
	if !a.Supports(p.Coll) || c < 1 || p.NRanks < 1 {
		return math.Inf(1)
	}
	n := float64(p.NRanks)
	S := float64(p.Bytes)
	m := p.Link
	alpha := m.Latency
	beta := 1 / (m.Bandwidth * float64(min(c, m.MaxChannels)))
	gamma := 0.0
	if m.ReduceRate > 0 {
		gamma = 1 / (m.ReduceRate * float64(c))
	}
	// Every extra channel costs a goroutine hand-off per operation.
	overhead := float64(c-1) * alpha / 2
	if p.NRanks == 1 {
		return S*beta/2 + overhead
	}
	// Pipelined algorithms pay their hop count once plus one hop per extra
	// chunk in flight.
	chunks := math.Max(1, S/float64(m.ChunkBytes)/float64(c))
	var t float64
	switch p.Coll {
	case CollAllReduce:
		pw := 1 << (bits.Len(uint(p.NRanks)) - 1)
		fold := 0.0
		if pw != p.NRanks {
			fold = 2*(alpha+S*beta) + S*gamma
		}
		L := float64(log2ceil(pw))
		switch a {
		case Ring:
			t = (2*(n-1)+chunks-1)*alpha + 2*(n-1)/n*S*beta + (n-1)/n*S*gamma
		case Tree:
			// Up and down each tree (depth log2 n); each tree carries half
			// the data, each rank sends about S in all and reduces S/2 per
			// child.
			// Across hosts of m ranks each the tree is HostTree's: a chain
			// of m in each host under a binary tree of h hosts.
			depth := log2ceil(p.NRanks)
			if p.Hosts > 1 && p.PerHost > 0 {
				depth = log2ceil(p.Hosts) + p.PerHost - 1
			}
			t = (2*float64(depth)+chunks-1)*alpha + 2*S*beta + S*gamma
		case RecDoubling:
			t = L*(alpha+S*beta+S*gamma) + fold
		case OneShot:
			// One hop; each message beyond the first costs its sender the
			// software overhead of a post (LogP's o), and every rank moves
			// and reduces n-1 whole vectors.
			// Where the link is slower than the reduction (TCP, RDMA), the
			// receiver reduces each slice while the next is on the wire and
			// only the link's time counts: measured over TCP with 2 ranks,
			// one-shot took 0.42–0.47 of the ring's time at 128–512 KiB and
			// 0.74–0.90 at 64 MiB, in place and out, level at 8 B
			// (docs/performance.md, "The tuner's crossovers"). On shared
			// memory copy and reduction share the memory and no such gain
			// was seen: both count.
			post := m.postCost()
			perByte := beta + gamma
			if beta > gamma {
				perByte = beta
			}
			t = alpha*(1+(n-2)*post) + (n-1)*S*perByte
		case Rabenseifner:
			// Its exchanges move the same bytes as a ring but measured about
			// 15% slower per byte than the ring's forwarding at 1 MiB and
			// above (docs/performance.md), as NCCL also scales each
			// algorithm's bandwidth by a measured factor (tuning.cc).
			pf := float64(pw)
			t = 2*L*alpha + (2*(pf-1)/pf*S*beta+(pf-1)/pf*S*gamma)/rabenseifnerEfficiency + fold
		case Hier:
			t = hierCost(p, c, S, chunks, gamma, false)
		case HierTree:
			t = hierCost(p, c, S, chunks, gamma, true)
		}
	case CollReduceScatter, CollAllGather:
		if p.Coll == CollAllGather {
			gamma = 0
		}
		switch a {
		case Hier:
			t = hierHalfCost(p, c, S, chunks, gamma)
		case OneShot:
			t = oneShotHalfCost(p, S, alpha, beta, gamma)
		case RecDoubling:
			t = recDoublingGatherCost(p, S, alpha, beta)
		default:
			t = (n-1+chunks-1)*alpha + (n-1)/n*S*(beta+gamma)
		}
	case CollBroadcast:
		t = (n-1+chunks-1)*alpha + S*beta
	case CollReduce:
		if a == OneShot {
			t = oneShotReduceCost(p, S, alpha, beta, gamma)
		} else {
			t = (n-1+chunks-1)*alpha + S*(beta+gamma)
		}
	case CollAllToAll:
		t = (n-1)*alpha + (n-1)/n*S*beta
	case CollSend, CollRecv:
		t = chunks*alpha + S*beta
	}
	return t + overhead
}

// hierCost models the hierarchical all-reduce: 2(m-1) hops inside the
// host and 2(h-1) across, paid once, and then, pieces pipelining through
// the phases, the slower of the two byte streams: inside a host each rank
// moves 2(m-1)/m of the data; across, the m rings of a host share its
// link, which carries 2(h-1)/h of it (a flat ring's link carries
// 2(n-1)/n). Only for several hosts of several ranks each: otherwise it
// is a ring, and the ring's cost stands.
//
// With tree, the phase across hosts is a double binary tree of hosts
// (HierTree): 2·log2 h hops across instead of 2(h-1), and the host's link
// carries about 2 shards' worth per local rank, 2S in all, as the flat
// tree's cost counts it.
func hierCost(p Problem, c int, S, chunks, gamma float64, tree bool) float64 {
	h, m := float64(p.Hosts), float64(p.PerHost)
	if p.Hosts < 2 || p.PerHost < 2 {
		return math.Inf(1)
	}
	in, betaIn, betaNet := hierLinks(p, c)
	across, netBytes := 2*(h-1), 2*(h-1)/h*S
	if tree {
		across, netBytes = 2*float64(log2ceil(p.Hosts)), 2*S
	}
	hops := 2*(m-1)*in.Latency + across*p.Link.Latency + (chunks-1)*max(in.Latency, p.Link.Latency)
	bytes := max(2*(m-1)/m*S*betaIn, netBytes*betaNet)
	return hops + bytes + ((m-1)/m+(h-1)/(h*m))*S*gamma
}

// hierLinks returns the model of the links inside a host (p.Intra, or
// p.Link where it is unset) and the time per byte on c channels inside a
// host and across hosts, for the hierarchical schedules' costs.
func hierLinks(p Problem, c int) (in LinkModel, betaIn, betaNet float64) {
	in = p.Intra
	if in.Bandwidth <= 0 {
		in = p.Link
	}
	betaIn = 1 / (in.Bandwidth * float64(min(c, in.MaxChannels)))
	betaNet = 1 / (p.Link.Bandwidth * float64(min(c, p.Link.MaxChannels)))
	return in, betaIn, betaNet
}

// hierHalfCost models the hierarchical reduce-scatter and all-gather
// (hierReduceScatter): n-1 steps, of which h-1 cross hosts and the rest
// stay inside one, paid once, and then the slower of the two byte
// streams: each rank sends (n-h)/n of the data inside its host, and each
// host's link carries (h-1)/h of it (the ring's crossing carries
// (n-1)/n); a reduce-scatter reduces (n-1)/n of it on every rank
// (gamma 0 for all-gather). Only for several hosts of several ranks
// each: otherwise it is the ring.
func hierHalfCost(p Problem, c int, S, chunks, gamma float64) float64 {
	h, m := float64(p.Hosts), float64(p.PerHost)
	if p.Hosts < 2 || p.PerHost < 2 {
		return math.Inf(1)
	}
	n := h * m
	in, betaIn, betaNet := hierLinks(p, c)
	hops := (n-h)*in.Latency + (h-1)*p.Link.Latency + (chunks-1)*max(in.Latency, p.Link.Latency)
	bytes := max((n-h)/n*S*betaIn, (h-1)/h*S*betaNet)
	return hops + bytes + (n-1)/n*S*gamma
}

// The one-shot reduce-scatter and all-gather (oneShotReduceScatter),
// fitted to their crossovers with the ring on one host, 3, 4 and 8 ranks
// over shared memory and TCP, 64 KiB to 64 MiB (docs/performance.md, "The
// one-shot reduce-scatter and all-gather"): over TCP and for all-gather
// on shared memory they took 0.69-1.06 of the ring's time at every size
// with 3 and 4 ranks; the reduce-scatter on shared memory 0.77-0.89 at
// 64 KiB, 0.98-1.05 from 256 KiB to 16 MiB and 1.08-1.15 at 64 MiB. With
// 8 ranks on the two cores the shared-memory forms lost from 1-4 MiB on
// (up to 1.36), so beyond oneShotHalvesMaxRanks the ring keeps them.
const (
	oneShotHalvesMaxRanks = 4
	// oneShotReduceEfficiency is the one-shot reduce-scatter's bandwidth
	// relative to the ring's where copies and reductions share the
	// memory (shared memory), from its 1.04-1.15 of the ring's time at
	// 4-64 MiB on 4 ranks. Not profiled; a guess at the cause: each
	// incoming block is reduced into the output, which is read back for
	// the next, where the ring's partial sums go out through the slots.
	oneShotReduceEfficiency = 0.9
	// oneShotRootedMaxRanks bounds the one-shot reduce: measured on 4
	// ranks over TCP only (docs/performance.md, "The one-shot reduce
	// over TCP"), and its root takes in n-1 inputs one after another.
	oneShotRootedMaxRanks = 4
)

// oneShotHalfCost models the one-shot reduce-scatter and all-gather: one
// hop, a post per extra peer (as the one-shot all-reduce), and the ring's
// bytes, (n-1)/n of the data in and out of every rank. As for the
// all-reduce, over a link slower than the reduction only the link's time
// counts. Only on links that allow it (LinkModel.OneShotHalves); on two
// ranks, where it is the ring's one step without the ring's pieces, only
// for a reduce-scatter over a link slower than the reduction (the case
// the one-shot all-reduce's pick on two ranks rests on) and of at most
// one chunk: over TCP it took 0.65-0.87 of the ring's time at 256 KiB-1
// MiB in four runs, and was level from 4 MiB (0.70-1.11), while the
// all-gather (nothing to reduce) was level with the ring and up to 1.2
// times slower at 64 KiB and 64 MiB (docs/performance.md, "The 2-rank
// one-shot reduce-scatter over TCP"). Not across hosts, where Hier moves
// less over the network, nor beyond oneShotHalvesMaxRanks.
func oneShotHalfCost(p Problem, S, alpha, beta, gamma float64) float64 {
	pair := p.NRanks == 2 && gamma > 0 && beta > gamma && S <= float64(p.Link.ChunkBytes)
	if !p.Link.OneShotHalves || p.NRanks < 3 && !pair || p.NRanks > oneShotHalvesMaxRanks || p.Hosts > 1 {
		return math.Inf(1)
	}
	n := float64(p.NRanks)
	post := p.Link.postCost()
	perByte := beta
	if gamma >= beta {
		perByte = (beta + gamma) / oneShotReduceEfficiency
	}
	return alpha*(1+(n-2)*post) + (n-1)/n*S*perByte
}

// oneShotReduceCost models the one-shot reduce (oneShotReduce): one hop,
// the root taking in n-1 messages one after another (a post's cost each
// beyond the first, as the one-shot all-reduce's sends), and all n-1
// inputs through the root's link and reduction. Only on links that allow
// it (LinkModel.OneShotReduce), on one host, up to oneShotRootedMaxRanks
// ranks: what was measured.
func oneShotReduceCost(p Problem, S, alpha, beta, gamma float64) float64 {
	if !p.Link.OneShotReduce || p.NRanks > oneShotRootedMaxRanks || p.Hosts > 1 {
		return math.Inf(1)
	}
	n := float64(p.NRanks)
	return alpha*(1+(n-2)*p.Link.postCost()) + (n-1)*S*(beta+gamma)
}

// recDoublingGatherCost models the recursive-doubling all-gather
// (recDoublingAllGather): log2 p rounds, each one hop, and the ring's
// bytes at the link's ExchangeEfficiency; a rank count that is not a
// power of two adds the fold's two hops and a whole output more. Only on
// links that give an efficiency, on one host (across hosts its exchanges
// at the larger distances would all cross, where Hier crosses once per
// block), and from 3 ranks (on 2 it is the ring).
func recDoublingGatherCost(p Problem, S, alpha, beta float64) float64 {
	eff := p.Link.ExchangeEfficiency
	if eff <= 0 || p.NRanks < 3 || p.Hosts > 1 {
		return math.Inf(1)
	}
	n := float64(p.NRanks)
	pw := 1 << (bits.Len(uint(p.NRanks)) - 1)
	t := float64(log2ceil(pw))*alpha + (n-1)/n*S*beta/eff
	if pw != p.NRanks {
		t += 2*alpha + S*beta
	}
	return t
}

// candidates lists the algorithms the tuner weighs for c, in order of
// preference when costs tie.
func candidates(c Collective) []Algorithm {
	switch c {
	case CollAllReduce:
		return []Algorithm{Ring, Tree, Rabenseifner, RecDoubling, OneShot, Hier, HierTree}
	case CollReduceScatter:
		return []Algorithm{Ring, Hier, OneShot}
	case CollAllGather:
		return []Algorithm{Ring, Hier, OneShot, RecDoubling}
	case CollReduce:
		return []Algorithm{Ring, OneShot}
	case CollAllToAll:
		return []Algorithm{Pairwise}
	case CollSend, CollRecv:
		return []Algorithm{P2P}
	}
	return []Algorithm{Ring}
}

// Tune chooses the plan with the lowest predicted cost. force, when not
// AlgoAuto, fixes the algorithm for the collectives it supports (others
// keep their own choice); channels and chunk, when positive, fix those.
// Tune is a pure function of its arguments, so every rank that asks the
// same question gets the same plan.
func Tune(p Problem, force Algorithm, channels int, chunk int64) Plan {
	maxC := channels
	if maxC <= 0 {
		maxC = int(min(int64(p.Link.MaxChannels), max(1, p.Bytes/p.Link.ChannelBytes)))
	}
	minC := 1
	if channels > 0 {
		minC = channels
	}
	algos := candidates(p.Coll)
	if force != AlgoAuto && force.Supports(p.Coll) {
		algos = []Algorithm{force}
	}
	best := Plan{Algo: algos[0], Channels: minC}
	bestCost := math.Inf(1)
	for _, a := range algos {
		for c := minC; c <= maxC; c++ {
			if cost := Cost(p, a, c); cost < bestCost {
				best, bestCost = Plan{Algo: a, Channels: c}, cost
			}
		}
	}
	best.ChunkBytes = p.Link.ChunkBytes
	if chunk > 0 {
		best.ChunkBytes = chunk
	}
	if best.Algo == RecDoubling || best.Algo == Rabenseifner || best.Algo == Pairwise || best.Algo == OneShot {
		best.ChunkBytes = 0 // not pipelined: one piece per channel unless slots demand more
	}
	return best
}

// Pieces returns how many pieces the engine cuts each major block into for
// plan pl and schedule s: at least one per channel, enough that blocks are
// about pl.ChunkBytes, never fewer than MinPieces, and a multiple of the
// channel count so channels get equal shares.
func Pieces(s *Schedule, pl Plan, k, elemSize, slots, sliceElems int) int {
	p := MinPieces(s, k, slots, sliceElems)
	if pl.ChunkBytes > 0 && k > 0 {
		blockBytes := int64(k) * int64(elemSize) / int64(s.Minor)
		p = max(p, int((blockBytes+pl.ChunkBytes-1)/pl.ChunkBytes))
	}
	c := max(pl.Channels, 1)
	return (max(p, c) + c - 1) / c * c
}
