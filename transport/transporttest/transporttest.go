// Package transporttest holds tests every transport must pass, for the
// transports' own test files.
package transporttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// AllReduceEveryAlgorithm runs a 3-rank float64 all-reduce of 300,007
// elements through the engine, with every all-reduce algorithm, out of
// place and in place, over the endpoints newEndpoints makes (3 of them),
// and checks every element on every rank. link is the engine's model of
// the transport.
func AllReduceEveryAlgorithm(t *testing.T, link algorithms.LinkModel, newEndpoints func(t *testing.T, n int) []transport.Endpoint) {
	for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner} {
		for _, inPlace := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/inplace=%v", a, inPlace), func(t *testing.T) {
				allReduce(t, newEndpoints(t, 3), link, a, inPlace)
			})
		}
	}
}

func allReduce(t *testing.T, eps []transport.Endpoint, link algorithms.LinkModel, a algorithms.Algorithm, inPlace bool) {
	const count = 300_007
	n := len(eps)
	es := make([]*engine.Engine, n)
	for r, ep := range eps {
		e, err := engine.New(r, n, ep, engine.Config{Algo: a, MaxChannels: 2, Link: link})
		require.NoError(t, err)
		es[r] = e
	}
	outs := make([][]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, e := range es {
		wg.Go(func() {
			in := make([]float64, count)
			for i := range in {
				in[i] = float64(r*1000 + i%977)
			}
			outs[r] = make([]float64, count)
			if inPlace {
				outs[r] = in
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, errs[r] = e.Run(ctx, &engine.Op{Coll: algorithms.CollAllReduce, Type: kernels.Float64, Red: kernels.Sum, Count: count,
				In: memory.HostBuffer(f64bytes(in)), Out: memory.HostBuffer(f64bytes(outs[r]))})
			if errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
				eps[r].Close(errs[r]) // as a communicator aborts: the others fail now, not at their timeout
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	for r := range es {
		for i, v := range outs[r] {
			want := float64(n*(i%977) + 1000*n*(n-1)/2)
			if v != want {
				t.Fatalf("rank %d element %d = %v, want %v", r, i, v, want)
			}
		}
	}
}

func f64bytes(v []float64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*8)
}

// ConnectPair connects endpoint a (rank ra) and b (rank rb) on channel ch,
// both sides at once, as two ranks do, and returns a's and b's ends.
func ConnectPair(t testing.TB, a, b transport.Endpoint, ra, rb, ch int) (transport.Conn, transport.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cb transport.Conn
	var errB error
	done := make(chan struct{})
	go func() {
		cb, errB = b.Connect(ctx, ra, ch)
		close(done)
	}()
	ca, err := a.Connect(ctx, rb, ch)
	require.NoError(t, err)
	<-done
	require.NoError(t, errB)
	return ca, cb
}

// WaitHonoursContext checks that a.Wait, with nothing coming from rank
// peer, returns once its context expires, with an error that names the
// peer and wraps context.DeadlineExceeded.
func WaitHonoursContext(t *testing.T, a transport.Conn, peer int) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := a.Wait(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, peer, pe.Peer)
	require.Less(t, time.Since(start), time.Second)
}
