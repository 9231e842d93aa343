package collective_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

func sizeName(b int) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

var benchSizes = []int{8, 64 << 10, 1 << 20, 64 << 20}

// BenchmarkAllReduce times an out-of-place float32 sum all-reduce on n
// in-process ranks, per algorithm and size. ns/op is the time of one
// all-reduce on all ranks (the slowest rank); MB/s counts the buffer once
// (nccl-tests' algbw); busbw-GB/s is algbw × 2(n-1)/n, nccl-tests' bus
// bandwidth for all-reduce.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, a := range []algorithms.Algorithm{algorithms.AlgoAuto, algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot} {
			for _, size := range benchSizes {
				b.Run(fmt.Sprintf("nranks=%d/algo=%v/bytes=%s", n, a, sizeName(size)), func(b *testing.B) {
					benchAllReduce(b, n, size, collective.WithAlgorithm(a))
				})
			}
		}
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("nranks=%d/algo=naive/bytes=%s", n, sizeName(size)), func(b *testing.B) {
				benchNaive(b, n, size)
			})
		}
	}
}

// benchGroup makes n ranks in this process for one run of a benchmark;
// done closes them (at the end of the run, not of the benchmark, as
// newGroup's cleanup would: a benchmark's function runs several times).
func benchGroup(b *testing.B, n int, opts ...collective.Option) ([]*collective.Comm, func()) {
	comms, err := collective.NewLocalGroup(n, append([]collective.Option{collective.WithEnv(nil)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return comms, func() {
		for _, c := range comms {
			c.Close()
		}
	}
}

func benchAllReduce(b *testing.B, n, size int, opts ...collective.Option) {
	comms, done := benchGroup(b, n, opts...)
	defer done()
	count := size / 4
	sends := make([][]float32, n)
	recvs := make([][]float32, n)
	for r := range sends {
		sends[r] = make([]float32, count)
		recvs[r] = make([]float32, count)
		for i := range sends[r] {
			sends[r][i] = float32(r + i%7)
		}
	}
	ctx := context.Background()
	ops := make([]func() error, n)
	for r, c := range comms {
		ops[r] = func() error { return collective.AllReduce(ctx, c, sends[r], recvs[r], collective.Sum) }
	}
	run := func(iters int) { runEach(b, ops, iters) }
	run(2) // warm up: connections, slots, schedules
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	run(b.N)
	elapsed := time.Since(start)
	b.ReportMetric(float64(size)/(elapsed.Seconds()/float64(b.N))*2*float64(n-1)/float64(n)/1e9, "busbw-GB/s")
}

// benchNaive is the dumb baseline: with every rank's input in shared
// memory, each rank computes the whole sum itself, reading all n inputs,
// between two barriers. No schedule, no slots, n times the arithmetic.
func benchNaive(b *testing.B, n, size int) {
	count := size / 4
	sends := make([][]float32, n)
	recvs := make([][]float32, n)
	for r := range sends {
		sends[r] = make([]float32, count)
		recvs[r] = make([]float32, count)
	}
	var bar sync.WaitGroup
	round := func() {
		bar.Add(n)
		for r := 0; r < n; r++ {
			go func() {
				defer bar.Done()
				out := recvs[r]
				copy(out, sends[0])
				for j := 1; j < n; j++ {
					in := sends[j]
					for i := range out {
						out[i] += in[i]
					}
				}
			}()
		}
		bar.Wait()
	}
	round()
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		round()
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(size)/(elapsed.Seconds()/float64(b.N))*2*float64(n-1)/float64(n)/1e9, "busbw-GB/s")
}

// BenchmarkCollectives times the other collectives at 1 MiB and 64 MiB on 4
// ranks, with nccl-tests' bus bandwidth factors.
func BenchmarkCollectives(b *testing.B) {
	const n = 4
	for _, size := range []int{1 << 20, 64 << 20} {
		for _, coll := range []algorithms.Collective{algorithms.CollReduceScatter, algorithms.CollAllGather, algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllToAll} {
			b.Run(fmt.Sprintf("nranks=%d/coll=%v/bytes=%s", n, coll, sizeName(size)), func(b *testing.B) {
				benchCollective(b, n, size, coll)
			})
		}
	}
}

func benchCollective(b *testing.B, n, size int, coll algorithms.Collective) {
	comms, done := benchGroup(b, n)
	defer done()
	count := size / 4 // nccl-tests' size: see algorithms.Problem.Bytes
	factor := 1.0
	ctx := context.Background()
	ops := make([]func() error, n)
	for r, c := range comms {
		switch coll {
		case algorithms.CollReduceScatter:
			send, recv := make([]float32, count), make([]float32, count/n)
			ops[r] = func() error { return collective.ReduceScatter(ctx, c, send, recv, collective.Sum) }
			factor = float64(n-1) / float64(n)
		case algorithms.CollAllGather:
			send, recv := make([]float32, count/n), make([]float32, count)
			ops[r] = func() error { return collective.AllGather(ctx, c, send, recv) }
			factor = float64(n-1) / float64(n)
		case algorithms.CollBroadcast:
			buf := make([]float32, count)
			ops[r] = func() error { return collective.Broadcast(ctx, c, buf, buf, 0) }
		case algorithms.CollReduce:
			send, recv := make([]float32, count), make([]float32, count)
			ops[r] = func() error { return collective.Reduce(ctx, c, send, recv, collective.Sum, 0) }
		case algorithms.CollAllToAll:
			send, recv := make([]float32, count), make([]float32, count)
			ops[r] = func() error { return collective.AllToAll(ctx, c, send, recv) }
			factor = float64(n-1) / float64(n)
		}
	}
	run := func(iters int) { runEach(b, ops, iters) }
	run(2)
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	run(b.N)
	elapsed := time.Since(start)
	b.ReportMetric(float64(size)/(elapsed.Seconds()/float64(b.N))*factor/1e9, "busbw-GB/s")
}

// BenchmarkPreMulSum is a pre-multiplied sum against a plain one, in
// place and out of place: what DDP's averaging costs on top of the sum.
func BenchmarkPreMulSum(b *testing.B) {
	const n = 2
	for _, size := range []int{1 << 20, 64 << 20} {
		for _, inPlace := range []bool{false, true} {
			for _, premul := range []bool{false, true} {
				b.Run(fmt.Sprintf("bytes=%s/inplace=%v/premul=%v", sizeName(size), inPlace, premul), func(b *testing.B) {
					comms, done := benchGroup(b, n)
					defer done()
					count := size / 4
					ctx := context.Background()
					ops := make([]func() error, n)
					for r, c := range comms {
						op := collective.Sum
						if premul {
							var err error
							if op, err = c.PreMulSum(0.5); err != nil {
								b.Fatal(err)
							}
						}
						send := make([]float32, count)
						recv := send
						if !inPlace {
							recv = make([]float32, count)
						}
						ops[r] = func() error { return collective.AllReduce(ctx, c, send, recv, op) }
					}
					runEach(b, ops, 2)
					b.SetBytes(int64(size))
					b.ResetTimer()
					runEach(b, ops, b.N)
				})
			}
		}
	}
}

// runEach runs ops[r] iters times on rank r's goroutine, all ranks at
// once, and returns when every rank is done (or has failed).
func runEach(b *testing.B, ops []func() error, iters int) {
	var wg sync.WaitGroup
	for _, op := range ops {
		wg.Go(func() {
			for range iters {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
