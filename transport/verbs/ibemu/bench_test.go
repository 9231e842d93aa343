//go:build linux

package ibemu

import (
	"testing"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// BenchmarkRawPingPong is the emulated device's own floor for small
// messages, with no transport above it: two QPs of this process bounce
// an 8-byte write with immediate, each side posting a receive, polling
// its CQ for the peer's message and answering (signaled every 8, as the
// transport signals). The verbs transport's 8-byte latency cannot go
// below it.
func BenchmarkRawPingPong(b *testing.B) { rawBounce(b, false) }

// BenchmarkRawExchange is the same with both sides sending first and then
// waiting for the other's message, as the board's all-reduce of two ranks
// does: a collective's floor on the emulated device.
func BenchmarkRawExchange(b *testing.B) { rawBounce(b, true) }

func rawBounce(b *testing.B, exchange bool) {
	p := New(Options{Dir: b.TempDir()})
	a, c := newEnd(b, p, endOpts{recvWR: 64, sendWR: 64, cqe: 256}), newEnd(b, p, endOpts{recvWR: 64, sendWR: 64, cqe: 256})
	ga, _, err := a.ctx.QueryGID(1, 2)
	if err != nil {
		b.Fatal(err)
	}
	gc, _, err := c.ctx.QueryGID(1, 2)
	if err != nil {
		b.Fatal(err)
	}
	connectTo(b, a, gc, c.qp.Num(), nil)
	connectTo(b, c, ga, a.qp.Num(), nil)
	side := func(e, peer *end, n int, first bool, done chan<- error) {
		wc := make([]ibv.WC, 16)
		recvs := make([]ibv.RecvWR, 32)
		if _, err := e.qp.PostRecv(recvs); err != nil {
			done <- err
			return
		}
		owed, got := 0, 0
		send := func(i int) error {
			w := ibv.SendWR{ID: uint64(i), Op: ibv.OpWriteImm, Imm: uint32(i), SGE: ibv.SGE{Addr: ibv.Addr(e.mem.B), Len: 8, LKey: e.mr.LKey()},
				Remote: peer.mr.Addr(), RKey: peer.mr.RKey()}
			if i%8 == 7 {
				w.Flags = ibv.SendSignaled
			}
			_, err := e.qp.PostSend([]ibv.SendWR{w})
			return err
		}
		for i := range n {
			if first {
				if err := send(i); err != nil {
					done <- err
					return
				}
			}
			for got <= i {
				k, err := e.cq.Poll(wc)
				if err != nil {
					done <- err
					return
				}
				for _, w := range wc[:k] {
					if w.Opcode == ibv.WCRecvWriteImm {
						got++
						owed++
					}
				}
			}
			if owed >= 8 {
				if _, err := e.qp.PostRecv(recvs[:owed]); err != nil {
					done <- err
					return
				}
				owed = 0
			}
			if !first {
				if err := send(i); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}
	done := make(chan error, 2)
	b.ResetTimer()
	go side(c, a, b.N, exchange, done)
	side(a, c, b.N, true, done)
	for range 2 {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
