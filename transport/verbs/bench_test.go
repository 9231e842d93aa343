package verbs

import (
	"context"
	"testing"

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
