package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/transporttest"
	"github.com/goccl/goccl/transport/verbs/ibemu"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// endpoints makes n endpoints on one emulated fabric (adversarial, with
// a seed per test run that the log shows).
func endpoints(t *testing.T, n int, mod func(r int, o *Options)) []*Endpoint {
	t.Helper()
	return endpointsOn(t, n, ibemu.New(ibemu.Options{Dir: t.TempDir(), Adversarial: true, TimeScale: 0.001}), mod)
}

func endpointsOn(t testing.TB, n int, pr ibv.Provider, mod func(r int, o *Options)) []*Endpoint {
	t.Helper()
	lns := make([]net.Listener, n)
	peers := make([]string, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns[i], peers[i] = ln, ln.Addr().String()
	}
	eps := make([]*Endpoint, n)
	for r := range eps {
		o := Options{Rank: r, NRanks: n, Peers: peers, Secret: secret, Listener: lns[r], Provider: pr,
			GIDIndex: -1, Slots: 4, SlotSize: 64 << 10}
		if mod != nil {
			mod(r, &o)
		}
		e, err := New(o)
		require.NoError(t, err)
		eps[r] = e
		t.Cleanup(func() { e.Close(nil) })
	}
	return eps
}

func TestContract(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(r int, o *Options)
	}{
		{"default", nil},
		{"qps3", func(_ int, o *Options) { o.QPs = 3; o.Slots = 5 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			transporttest.Contract(t, func(t *testing.T, n int) []transport.Endpoint {
				return transporttest.Endpoints(endpoints(t, n, c.mod))
			}, transporttest.ContractOptions{})
		})
	}
}

func TestAllReduce(t *testing.T) {
	link := algorithms.LinkModel{Latency: 5e-6, Bandwidth: 5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 1 << 20, ChunkBytes: 64 << 10}
	for _, qps := range []int{1, 2} {
		t.Run("", func(t *testing.T) {
			transporttest.AllReduceEveryAlgorithm(t, link, func(t *testing.T, n int) []transport.Endpoint {
				return transporttest.Endpoints(endpoints(t, n, func(_ int, o *Options) { o.QPs = qps }))
			})
		})
	}
}

func TestPortIsTheEmulatedDevice(t *testing.T) {
	eps := endpoints(t, 1, nil)
	p := eps[0].Port()
	require.True(t, p.Device.Emulated)
	require.Equal(t, 2, p.GIDIdx, "the IPv4-mapped RoCE v2 GID, link-local entries skipped")
	require.Contains(t, p.String(), "emulated test device, not RDMA hardware")
}

func TestMismatchedQPCountsAreRefused(t *testing.T) {
	eps := endpoints(t, 2, func(r int, o *Options) { o.QPs = r + 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := eps[1].Connect(ctx, 0, 0)
		errc <- err
	}()
	_, err := eps[0].Connect(ctx, 1, 0)
	require.ErrorContains(t, err, "GOCCL_IB_QPS_PER_CONNECTION")
	cancel()
	<-errc
}

// Two ranks that call all-reduces of different counts over RDMA fail at
// once, one of them with the engine's MismatchError, instead of mixing
// each other's data or waiting for the timeout.
func TestMismatchedCollectivesFail(t *testing.T) {
	eps := endpoints(t, 2, nil)
	link := algorithms.LinkModel{Latency: 5e-6, Bandwidth: 5e9, ReduceRate: 6e9, MaxChannels: 1, ChannelBytes: 1 << 20, ChunkBytes: 64 << 10}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := time.Now()
	for r, ep := range eps {
		e, err := engine.New(r, 2, ep, engine.Config{Algo: algorithms.Ring, MaxChannels: 1, Link: link})
		require.NoError(t, err)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			n := 1000 + 5000*r
			buf := make([]byte, 4*n)
			_, errs[r] = e.Run(ctx, &engine.Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: n,
				In: memory.HostBuffer(buf), Out: memory.HostBuffer(buf)})
			if errs[r] != nil {
				ep.Close(errs[r]) // as a communicator aborts
			}
		})
	}
	wg.Wait()
	require.Less(t, time.Since(start), 10*time.Second)
	mismatch := false
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		var me *engine.MismatchError
		mismatch = mismatch || errors.As(err, &me)
		t.Logf("rank %d: %v", r, err)
	}
	require.True(t, mismatch, "some rank names the mismatch")
}

// On InfiniBand ports the connections address their peers by LID,
// without a GRH: every algorithm's all-reduce still comes out exact.
func TestAllReduceOverInfiniBandLIDs(t *testing.T) {
	link := algorithms.LinkModel{Latency: 5e-6, Bandwidth: 5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 1 << 20, ChunkBytes: 64 << 10}
	transporttest.AllReduceEveryAlgorithm(t, link, func(t *testing.T, n int) []transport.Endpoint {
		pr := ibemu.New(ibemu.Options{Dir: t.TempDir(), Adversarial: true, InfiniBand: true})
		eps := endpointsOn(t, n, pr, nil)
		p := eps[0].Port()
		require.Equal(t, -1, p.GIDIdx, "InfiniBand: no GRH within the subnet")
		require.Contains(t, p.String(), fmt.Sprintf("InfiniBand LID %d", p.Attr.LID))
		return transporttest.Endpoints(eps)
	})
}

// An authenticated peer that asks for a channel no communicator uses is
// refused (issue 19, finding 10).
func TestUnusedChannelsAreRefused(t *testing.T) {
	eps := endpoints(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := wire.ConnSetup{From: 0, To: 1, Channel: 1 << 20, NSocks: 1}
	_, err := eps[0].dialer.Dial(ctx, eps[0].o.Peers[1], s, nil)
	require.ErrorContains(t, err, "no channel 1048576 here")
}
