package verbs

import (
	"context"
	"testing"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/transporttest"
	"github.com/goccl/goccl/transport/verbs/ibemu"
)

// BenchmarkPingPong measures a round trip of an 8-byte slice between two
// endpoints of this process over the emulated device (not adversarial):
// Reserve, Post, Wait, Release on each side.
func BenchmarkPingPong(b *testing.B) {
	eps := endpointsOn(b, 2, ibemu.New(ibemu.Options{Dir: b.TempDir()}), nil)
	a, c := transporttest.ConnectPair(b, eps[0], eps[1], 0, 1, 0)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		for range b.N {
			if _, _, err := c.Wait(ctx); err != nil {
				done <- err
				return
			}
			c.Release()
			buf, err := c.Reserve(ctx, 8)
			if err != nil {
				done <- err
				return
			}
			_ = buf
			if err := c.Post(8, transport.Tag{}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	b.ResetTimer()
	for range b.N {
		if _, err := a.Reserve(ctx, 8); err != nil {
			b.Fatal(err)
		}
		if err := a.Post(8, transport.Tag{}); err != nil {
			b.Fatal(err)
		}
		if _, _, err := a.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		a.Release()
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBoard is the board's all-reduce of two ranks without the
// engine: each rank posts 8 bytes for collective seq and reads the
// other's. Compare ibemu's BenchmarkRawExchange, the device's own floor
// for the same exchange.
func BenchmarkBoard(b *testing.B) {
	eps := endpointsOn(b, 2, ibemu.New(ibemu.Options{Dir: b.TempDir()}), nil)
	ctx := context.Background()
	joinBoards(b, eps)
	errc := make(chan error, 2)
	run := func(r int) error {
		brd := eps[r].Board()
		data := make([]byte, 8)
		for seq := range uint64(b.N) {
			if err := brd.Post(ctx, seq, 1, data); err != nil {
				return err
			}
			if _, _, _, err := brd.Read(ctx, 1-r, seq); err != nil {
				return err
			}
		}
		return nil
	}
	b.ResetTimer()
	go func() { errc <- run(1) }()
	if err := run(0); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEngineAllReduce8B is an 8-byte all-reduce of two ranks of
// this process through the engine, on the board.
func BenchmarkEngineAllReduce8B(b *testing.B) {
	eps := endpointsOn(b, 2, ibemu.New(ibemu.Options{Dir: b.TempDir()}), nil)
	ctx := context.Background()
	joinBoards(b, eps)
	errc := make(chan error, 2)
	link := algorithms.LinkModel{Latency: 5e-6, Bandwidth: 5e9, ReduceRate: 6e9, MaxChannels: 1, ChannelBytes: 1 << 20, ChunkBytes: 64 << 10}
	run := func(r int) error {
		e, err := engine.New(r, 2, eps[r], engine.Config{MaxChannels: 1, Link: link})
		if err != nil {
			return err
		}
		buf := make([]byte, 8)
		op := &engine.Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: 2,
			In: memory.HostBuffer(buf), Out: memory.HostBuffer(buf)}
		for range b.N {
			if _, err := e.Run(ctx, op); err != nil {
				return err
			}
		}
		return nil
	}
	b.ResetTimer()
	go func() { errc <- run(1) }()
	if err := run(0); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// joinBoards joins every endpoint's board.
func joinBoards(b *testing.B, eps []*Endpoint) {
	errc := make(chan error, len(eps))
	for _, e := range eps {
		go func() { errc <- e.JoinBoard(context.Background()) }()
	}
	for range eps {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
}
