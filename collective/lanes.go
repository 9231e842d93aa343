package collective

import (
	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Point-to-point lanes. Operations on a communicator run one at a time
// in issue order, which is what collectives need (every rank runs them in
// the same order) and what point-to-point must not have: MPI promises
// that any set of matched Isend and Irecv calls completes whatever order
// each rank starts them in, and a ring shift that starts its receive
// first would otherwise wait for a send queued behind it. So a send or
// receive on host memory runs in a lane of its own peer and direction:
// after the previous operation of that lane (messages between two ranks
// do not overtake each other), beside every other lane and beside the
// collectives (engine.RunP2P, on connections of their own). Device
// point-to-point stays in issue order, as on a CUDA stream.

// laneKey is a peer and a direction.
type laneKey struct {
	peer int
	recv bool
}

// laneOf returns the lane of a host send or receive, nil for anything
// else.
func laneOf(k *call) *laneKey {
	op := &k.op
	if op.Coll != algorithms.CollSend && op.Coll != algorithms.CollRecv {
		return nil
	}
	if op.Ready != nil || op.In.Kind() == memory.Device || op.Out.Kind() == memory.Device {
		return nil
	}
	return &laneKey{peer: op.Root, recv: op.Coll == algorithms.CollRecv}
}

// laneChannel is the channel a lane's data travels on.
func laneChannel(rank int, l *laneKey) int {
	if l.recv {
		return transport.P2PDataChannel(l.peer, rank)
	}
	return transport.P2PDataChannel(rank, l.peer)
}

func laneKind(l *laneKey) algorithms.Kind {
	if l.recv {
		return algorithms.Recv
	}
	return algorithms.Send
}
