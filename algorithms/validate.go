package algorithms

import (
	"errors"
	"fmt"
)

// Check verifies one schedule on its own: every step uses exactly the
// fields its kind needs, peers are other ranks that exist, Dst is always
// Output (Input is never written), every Ref lies inside its buffer on this
// rank, and the local refs of a lockstep step cover the same blocks.
func (s *Schedule) Check() error {
	if s.NRanks < 1 || s.Rank < 0 || s.Rank >= s.NRanks || s.Minor < 1 {
		return fmt.Errorf("algorithms: bad schedule header %s", s)
	}
	l := NewLayout(s.Coll, s.NRanks, s.Rank, s.Root, 1)
	for i := range s.Steps {
		if err := s.checkStep(&s.Steps[i], l); err != nil {
			return fmt.Errorf("algorithms: %v/%v rank %d step %d (%v): %w", s.Coll, s.Algo, s.Rank, i, s.Steps[i], err)
		}
	}
	return nil
}

func (s *Schedule) checkStep(st *Step, l Layout) error {
	if st.Kind >= numKinds {
		return errors.New("unknown kind")
	}
	info := kinds[st.Kind]
	peer := func(p int32, used bool, what string) error {
		switch {
		case !used && p != -1:
			return fmt.Errorf("%s peer %d set on a step that has none", what, p)
		case used && (p < 0 || int(p) >= s.NRanks):
			return fmt.Errorf("%s peer %d out of range [0,%d)", what, p, s.NRanks)
		case used && int(p) == s.Rank:
			return fmt.Errorf("%s peer is the rank itself", what)
		}
		return nil
	}
	ref := func(r Ref, used bool, want Buf, what string) error {
		switch {
		case !used && r != (Ref{}):
			return fmt.Errorf("%s %v set on a step that has none", what, r)
		case !used:
			return nil
		case r.Buf != want:
			return fmt.Errorf("%s is %v, want buffer %v", what, r, want)
		case !l.Covers(r, s.Minor) || int(r.Block+r.N) > s.Blocks():
			return fmt.Errorf("%s %v outside the %v buffer on this rank", what, r, r.Buf)
		}
		return nil
	}
	srcBuf := Input
	if st.Src.Buf == Output {
		srcBuf = Output // reading a running value back from Output is fine
	}
	txBuf := Input
	if st.Tx.Buf == Output {
		txBuf = Output
	}
	for _, err := range []error{
		peer(st.RecvPeer, info.recv, "recv"),
		peer(st.SendPeer, info.send, "send"),
		ref(st.Src, info.src, srcBuf, "src"),
		ref(st.Dst, info.dst, Output, "dst"),
		ref(st.Tx, info.tx, txBuf, "tx"),
	} {
		if err != nil {
			return err
		}
	}
	if info.src && info.dst && (st.Src.Block != st.Dst.Block || st.Src.N != st.Dst.N) {
		return fmt.Errorf("src %v and dst %v cover different blocks", st.Src, st.Dst)
	}
	if st.Final && !info.red && st.Kind != Copy {
		return errors.New("final set on a step that computes nothing")
	}
	return nil
}

// Validate checks a whole communicator's schedules for one collective:
// each schedule on its own (Check), and that every send has its receive:
// for every ordered pair of ranks, the sequence of messages one sends the
// other matches, message by message, the sequence the other receives from
// it, in block count. The simulator in package algotest goes further and
// proves the data each element ends up with.
func Validate(scheds []*Schedule) error {
	n := len(scheds)
	for r, s := range scheds {
		if s == nil || s.NRanks != n || s.Rank != r {
			return fmt.Errorf("algorithms: schedule %d of %d is not rank %d's", r, n, r)
		}
		if s.Coll != scheds[0].Coll || s.Algo != scheds[0].Algo || s.Minor != scheds[0].Minor {
			return fmt.Errorf("algorithms: rank %d runs %v/%v minor %d, rank 0 %v/%v minor %d",
				r, s.Coll, s.Algo, s.Minor, scheds[0].Coll, scheds[0].Algo, scheds[0].Minor)
		}
		if err := s.Check(); err != nil {
			return err
		}
	}
	type pair struct{ from, to int }
	sent := map[pair][]int32{}
	recvd := map[pair][]int32{}
	for r, s := range scheds {
		for _, st := range s.Steps {
			if st.Kind.Sends() {
				n := st.Src.N
				switch {
				case st.Kind.Exchange():
					n = st.Tx.N
				case st.Src.Buf == NoBuf:
					n = st.Dst.N
				}
				k := pair{r, int(st.SendPeer)}
				sent[k] = append(sent[k], n)
			}
			if st.Kind.Receives() {
				n := st.Dst.N
				if st.Dst.Buf == NoBuf {
					n = st.Src.N
				}
				k := pair{int(st.RecvPeer), r}
				recvd[k] = append(recvd[k], n)
			}
		}
	}
	for k, ss := range sent {
		rs := recvd[k]
		if len(ss) != len(rs) {
			return fmt.Errorf("algorithms: rank %d sends %d messages to rank %d, which receives %d", k.from, len(ss), k.to, len(rs))
		}
		for i := range ss {
			if ss[i] != rs[i] {
				return fmt.Errorf("algorithms: message %d from rank %d to rank %d: %d blocks sent, %d received", i, k.from, k.to, ss[i], rs[i])
			}
		}
	}
	for k, rs := range recvd {
		if len(sent[k]) == 0 {
			return fmt.Errorf("algorithms: rank %d receives %d messages from rank %d, which sends none", k.to, len(rs), k.from)
		}
	}
	return nil
}

// BuildAll builds and validates every rank's schedule for one collective.
func BuildAll(p Params) ([]*Schedule, error) {
	out := make([]*Schedule, p.NRanks)
	for r := range out {
		q := p
		q.Rank = r
		s, err := Build(q)
		if err != nil {
			return nil, err
		}
		out[r] = s
	}
	if p.Coll == CollSend || p.Coll == CollRecv {
		return out, nil // one-sided: the other half lives in the peer's op
	}
	return out, Validate(out)
}
