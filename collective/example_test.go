package collective_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/goccl/goccl/collective"
)

// Four ranks in one process average their gradients. Each rank runs on its
// own goroutine, as it would in its own process.
func ExampleAllReduce() {
	comms, err := collective.NewLocalGroup(4)
	if err != nil {
		panic(err)
	}
	results := make([][]float32, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			grad := []float32{float32(r), 1, 10}
			if err := collective.AllReduce(context.Background(), c, grad, grad, collective.Avg); err != nil {
				panic(err)
			}
			results[r] = grad
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	fmt.Println(results[0], results[3])
	// Output: [1.5 1 10] [1.5 1 10]
}

// StartAllReduce overlaps communication with work: the all-reduce of one
// layer's gradients runs while the next layer computes.
func ExampleStartAllReduce() {
	comms, err := collective.NewLocalGroup(2)
	if err != nil {
		panic(err)
	}
	sums := make([]int64, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			layer1 := []int64{int64(r + 1)}
			req, err := collective.StartAllReduce(ctx, c, layer1, layer1, collective.Sum)
			if err != nil {
				panic(err)
			}
			layer2 := []int64{int64(10 * (r + 1))} // "computed" meanwhile
			if err := req.Wait(ctx); err != nil {
				panic(err)
			}
			if err := collective.AllReduce(ctx, c, layer2, layer2, collective.Sum); err != nil {
				panic(err)
			}
			sums[r] = layer1[0] + layer2[0]
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	fmt.Println(sums)
	// Output: [33 33]
}

// ReduceScatter leaves each rank one block of the sum; AllGather puts the
// blocks back together: together they are an all-reduce.
func ExampleReduceScatter() {
	comms, err := collective.NewLocalGroup(3)
	if err != nil {
		panic(err)
	}
	out := make([][]float64, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			data := []float64{1, 2, 3, 4, 5, 6} // 2 elements per rank
			block := make([]float64, 2)
			if err := collective.ReduceScatter(ctx, c, data, block, collective.Sum); err != nil {
				panic(err)
			}
			if err := collective.AllGather(ctx, c, block, data); err != nil {
				panic(err)
			}
			out[r] = data
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	fmt.Println(out[1])
	// Output: [3 6 9 12 15 18]
}

// Broadcast copies the root's buffer to every rank; send is only read on
// the root.
func ExampleBroadcast() {
	comms, err := collective.NewLocalGroup(3)
	if err != nil {
		panic(err)
	}
	got := make([][]collective.BFloat16, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			var send []collective.BFloat16
			if r == 2 {
				send = []collective.BFloat16{collective.BFloat16From(0.5), collective.BFloat16From(-3)}
			}
			recv := make([]collective.BFloat16, 2)
			if err := collective.Broadcast(context.Background(), c, send, recv, 2); err != nil {
				panic(err)
			}
			got[r] = recv
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	fmt.Println(got[0])
	// Output: [0.5 -3]
}
