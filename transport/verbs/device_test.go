package verbs

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// Device operations over the emulated RDMA device, with each rank's own
// emulated GPU (as in separate processes): GPUDirect through dma-buf,
// with and without the flush read, staged through registered host
// memory, and a pair that mixes the two. The results must be exact, and
// the flush read must happen exactly where the compute capability needs
// it.
func TestDeviceAllReduce(t *testing.T) {
	// This machine has no nvidia-peermem; make sure the probe agrees.
	old := peerMemFiles
	peerMemFiles = []string{filepath.Join(t.TempDir(), "no-peermem")}
	t.Cleanup(func() { peerMemFiles = old })
	link := algorithms.LinkModel{Latency: 5e-6, Bandwidth: 5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 1 << 20, ChunkBytes: 64 << 10}
	for _, c := range []struct {
		name   string
		gdr    [2]bool
		dmabuf [2]bool
		major  int
		kind   [2]memory.Kind
		flush  [2]bool
		path   [2]string
	}{
		{"dma-buf,flush", [2]bool{true, true}, [2]bool{true, true}, 8, [2]memory.Kind{memory.Device, memory.Device}, [2]bool{true, true},
			[2]string{"GPUDirect RDMA (dma-buf), with a flush read", "GPUDirect RDMA (dma-buf), with a flush read"}},
		{"dma-buf,hopper", [2]bool{true, true}, [2]bool{true, true}, 9, [2]memory.Kind{memory.Device, memory.Device}, [2]bool{},
			[2]string{"GPUDirect RDMA (dma-buf)", "GPUDirect RDMA (dma-buf)"}},
		{"staged", [2]bool{false, false}, [2]bool{true, true}, 8, [2]memory.Kind{memory.Mapped, memory.Mapped}, [2]bool{},
			[2]string{"staged through registered host memory: GPUDirect RDMA not allowed", "staged"}},
		{"mixed", [2]bool{true, true}, [2]bool{true, false}, 8, [2]memory.Kind{memory.Device, memory.Mapped}, [2]bool{true, false},
			[2]string{"GPUDirect RDMA (dma-buf)", "staged through registered host memory: no GPUDirect RDMA: dma-buf: emu: DMABuf: this emulated device was made without Options.DMABuf"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			devs := make([]*emu.Device, 2)
			for r := range devs {
				devs[r] = emu.New(r, emu.Options{Seed: uint64(r + 1), MaxDelay: 20e3, DMABuf: c.dmabuf[r], Major: c.major})
			}
			eps := endpoints(t, 2, func(r int, o *Options) { o.Device, o.GDR = devs[r], c.gdr[r] })
			es := make([]*engine.Engine, 2)
			for r, ep := range eps {
				require.Equal(t, c.kind[r], ep.Caps().DeviceSlots, "rank %d", r)
				require.Contains(t, ep.DevicePath(), c.path[r], "rank %d", r)
				var err error
				es[r], err = engine.New(r, 2, ep, engine.Config{Algo: algorithms.Ring, MaxChannels: 2, Link: link, Device: devs[r]})
				require.NoError(t, err)
			}
			// 5 elements: a payload the host path would inline; 100003: many
			// slices of 64 KiB slots.
			for _, count := range []int{5, 100_003} {
				outs := make([][]byte, 2)
				var wg sync.WaitGroup
				errs := make([]error, 2)
				for r := range es {
					d := devs[r]
					in, err := d.Alloc(4 * count)
					require.NoError(t, err)
					out, err := d.Alloc(4 * count)
					require.NoError(t, err)
					for i := range count {
						binary.LittleEndian.PutUint32(d.Bytes(in)[4*i:], math.Float32bits(float32(i%1000+r*7)))
					}
					wg.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						_, errs[r] = es[r].Run(ctx, &engine.Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: count, In: in, Out: out})
						outs[r] = append([]byte(nil), d.Bytes(out)...)
						d.Free(in)
						d.Free(out)
					})
				}
				wg.Wait()
				for r := range es {
					require.NoError(t, errs[r], "rank %d, %d elements", r, count)
					for i := range count {
						want := float32(2*(i%1000) + 7)
						got := math.Float32frombits(binary.LittleEndian.Uint32(outs[r][4*i:]))
						if got != want {
							t.Fatalf("rank %d, %d elements: element %d = %v, want %v", r, count, i, got, want)
						}
					}
				}
			}
			for r, ep := range eps {
				if c.flush[r] {
					require.NotZero(t, ep.flushes.Load(), "rank %d: GPUDirect below compute capability 9.0 flushes", r)
				} else {
					require.Zero(t, ep.flushes.Load(), "rank %d flushes nothing", r)
				}
			}
			for r := range es {
				require.NoError(t, es[r].Close())
				require.NoError(t, eps[r].Close(nil))
				require.Zero(t, devs[r].Live(), fmt.Sprintf("rank %d: device memory left allocated", r))
			}
		})
	}
}
