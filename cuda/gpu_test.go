//go:build linux

package cuda

// Tests that need a GPU and its driver. Without one they skip, saying why.
// They are meant to run from a test binary built on a machine without a GPU:
//
//	CGO_ENABLED=0 go test -c -o cuda.test ./cuda
//	cd cuda && ./cuda.test -test.run GPU -test.bench GPU -test.benchtime 100x -test.v

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/cuda/ptx"
	"github.com/goccl/goccl/internal/half"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// gpuTimeout bounds every wait of these tests on the device.
const gpuTimeout = 30 * time.Second

// gpu opens device 0, or skips.
func gpu(t testing.TB) *Device {
	t.Helper()
	d, err := Load()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	dev, err := d.Open(0)
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

func gpuStream(t testing.TB, dev *Device) *Stream {
	t.Helper()
	s, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s.(*Stream)
}

func gpuAlloc(t testing.TB, dev *Device, n int) memory.Buffer {
	t.Helper()
	b, err := dev.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, dev.Free(b)) })
	return b
}

func syncCtx(t testing.TB, s *Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	require.NoError(t, s.Sync(ctx))
}

// toHost copies device memory back.
func toHost(t testing.TB, s *Stream, b memory.Buffer) []byte {
	t.Helper()
	out := make([]byte, b.Len())
	require.NoError(t, s.Copy(memory.HostBuffer(out), memory.Buffer{}, b))
	syncCtx(t, s)
	return out
}

func TestGPUModulesLoad(t *testing.T) {
	dev := gpu(t)
	info := dev.Info()
	t.Logf("%v; device 0: %+v", dev.Driver(), info)
	require.GreaterOrEqual(t, info.Major, 7)
	require.Regexp(t, `^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`, info.PCIBusID)
	for _, cc := range [][2]int{{7, 0}, {info.Major, info.Minor}} {
		image, arch := ptx.For(cc[0], cc[1])
		require.NotNil(t, image, "ptx.For(%d, %d)", cc[0], cc[1])
		start := time.Now()
		err := dev.st.do(func() error {
			m, err := dev.st.loadModule(image, arch)
			if err != nil {
				return err
			}
			return dev.st.drv.check("cuModuleUnload", callN(dev.st.drv.fn.moduleUnload, m.h))
		})
		require.NoError(t, err, "PTX for %s", arch)
		t.Logf("PTX for %s (%d bytes): loaded (JIT) in %v", arch, len(image), time.Since(start))
	}
	require.NoError(t, dev.st.do(func() error { _, err := dev.st.kernels(); return err }))
}

// Elements that must appear in the inputs, per element size (floats) and
// for the integers.
var (
	specials32 = []uint32{0x7fc00000, 0x7f800001, 0xffc00000, 0x7f800000, 0xff800000, 0, 0x80000000,
		0x7f7fffff, 0xff7fffff, 1, 0x80000001, 0x00800000, 0x3f800000, 0xbf800000}
	specials64 = []uint64{0x7ff8000000000000, 0x7ff0000000000001, 0xfff8000000000000, 0x7ff0000000000000,
		0xfff0000000000000, 0, 1 << 63, 0x7fefffffffffffff, 0xffefffffffffffff, 1, 1<<63 | 1, 0x0010000000000000}
	specialsF16  = []uint16{0x7e00, 0x7c01, 0xfe00, 0x7c00, 0xfc00, 0, 0x8000, 0x7bff, 0xfbff, 1, 0x8001, 0x0400, 0x3c00}
	specialsBF16 = []uint16{0x7fc0, 0x7f81, 0xffc0, 0x7f80, 0xff80, 0, 0x8000, 0x7f7f, 0xff7f, 1, 0x8001, 0x0080, 0x3f80}
)

// value returns a random float: small integers (ties, exact sums), wide
// magnitudes, or random bits.
func value(rng *rand.Rand) float64 {
	switch rng.IntN(4) {
	case 0:
		return float64(rng.IntN(17) - 8)
	case 1:
		return (rng.Float64()*2 - 1) * math.Pow(2, float64(rng.IntN(60)-30))
	default:
		return (rng.Float64()*2 - 1) * 1000
	}
}

// fill writes n random elements of type t into b, with the type's special
// values among them.
func fill(rng *rand.Rand, t kernels.Type, b []byte) {
	es := t.Size()
	for i := 0; i < len(b)/es; i++ {
		e := b[i*es : (i+1)*es]
		special := rng.IntN(8) == 0
		bits := rng.IntN(8) == 0
		switch t {
		case kernels.Float32:
			v := math.Float32bits(float32(value(rng)))
			if special {
				v = specials32[rng.IntN(len(specials32))]
			} else if bits {
				v = rng.Uint32()
			}
			binary.LittleEndian.PutUint32(e, v)
		case kernels.Float64:
			v := math.Float64bits(value(rng))
			if special {
				v = specials64[rng.IntN(len(specials64))]
			} else if bits {
				v = rng.Uint64()
			}
			binary.LittleEndian.PutUint64(e, v)
		case kernels.Float16, kernels.BFloat16:
			conv, sp := half.F32ToF16, specialsF16
			if t == kernels.BFloat16 {
				conv, sp = half.F32ToBF16, specialsBF16
			}
			v := conv(float32(value(rng) / 16))
			if special {
				v = sp[rng.IntN(len(sp))]
			} else if bits {
				v = uint16(rng.Uint32())
			}
			binary.LittleEndian.PutUint16(e, v)
		default: // integers
			v := rng.Uint64()
			if special {
				// 0, 1, -1, the minimum and maximum of the signed types.
				v = []uint64{0, 1, math.MaxUint64, 1 << (8*es - 1), 1<<(8*es-1) - 1}[rng.IntN(5)]
			}
			for j := range e {
				e[j] = byte(v >> (8 * j))
			}
		}
	}
}

// isNaN and isZero read element i of b as type t.
func isNaN(t kernels.Type, e []byte) bool {
	switch t {
	case kernels.Float32:
		return math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(e))))
	case kernels.Float64:
		return math.IsNaN(math.Float64frombits(binary.LittleEndian.Uint64(e)))
	case kernels.Float16:
		h := binary.LittleEndian.Uint16(e)
		return h&0x7c00 == 0x7c00 && h&0x3ff != 0
	case kernels.BFloat16:
		h := binary.LittleEndian.Uint16(e)
		return h&0x7f80 == 0x7f80 && h&0x7f != 0
	}
	return false
}

func isZero(t kernels.Type, e []byte) bool {
	for i, c := range e {
		if i == len(e)-1 {
			c &= 0x7f // the sign bit
		}
		if c != 0 {
			return false
		}
	}
	return true
}

// mismatch returns the first element where got differs from want beyond
// the freedoms of internal/kernels rule 6 (which NaN; which zero from Min
// and Max of -0 and +0), or -1.
func mismatch(t kernels.Type, op kernels.Op, got, want []byte) int {
	es := t.Size()
	float := t == kernels.Float16 || t == kernels.Float32 || t == kernels.Float64 || t == kernels.BFloat16
	for i := 0; i < len(want)/es; i++ {
		g, w := got[i*es:(i+1)*es], want[i*es:(i+1)*es]
		if string(g) == string(w) {
			continue
		}
		if float && isNaN(t, g) && isNaN(t, w) {
			continue
		}
		if float && (op == kernels.Min || op == kernels.Max) && isZero(t, g) && isZero(t, w) {
			continue
		}
		return i
	}
	return -1
}

func describe(t kernels.Type, a, b, got, want []byte, i int) string {
	es := t.Size()
	el := func(x []byte) string { return fmt.Sprintf("%x", x[i*es:(i+1)*es]) }
	s := fmt.Sprintf("element %d: got %s, want %s", i, el(got), el(want))
	if a != nil {
		s += fmt.Sprintf(" (a %s", el(a))
		if b != nil {
			s += fmt.Sprintf(", b %s", el(b))
		}
		s += ")"
	}
	return s
}

func TestGPUKernelsMatchHost(t *testing.T) {
	dev := gpu(t)
	s := gpuStream(t, dev)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	sizes := []int{1, 7, 1000, 65536 + 3} // elements
	const maxBytes = (65536 + 3 + 8) * 8
	A, B := gpuAlloc(t, dev, maxBytes), gpuAlloc(t, dev, maxBytes)
	D, D2 := gpuAlloc(t, dev, maxBytes), gpuAlloc(t, dev, maxBytes)
	none := memory.Buffer{}
	launches := 0
	for typ := kernels.Type(0); ptx.HasKernels(typ); typ++ {
		es := typ.Size()
		for _, n := range sizes {
			for _, off := range []int{0, 1, 3} {
				// Different misalignments for each buffer, in elements.
				aOff, bOff, dOff, d2Off := off, (2*off)%5, (off+1)%4, (3*off)%7
				nb := n * es
				a, b := A.Slice(aOff*es, aOff*es+nb), B.Slice(bOff*es, bOff*es+nb)
				dst, dst2 := D.Slice(dOff*es, dOff*es+nb), D2.Slice(d2Off*es, d2Off*es+nb)
				ha, hb := make([]byte, nb), make([]byte, nb)
				fill(rng, typ, ha)
				fill(rng, typ, hb)
				require.NoError(t, s.Copy(a, none, memory.HostBuffer(ha)))
				require.NoError(t, s.Copy(b, none, memory.HostBuffer(hb)))
				name := fmt.Sprintf("type=%v/n=%d/off=%d", typ, n, off)
				for op := kernels.Op(0); op.Valid(); op++ {
					for _, div := range []int{0, 3} {
						err := s.Reduce(dst, dst2, a, b, typ, op, div)
						if div > 1 && op != kernels.Sum && op != kernels.Avg {
							require.Error(t, err, "%s/op=%v/div=%d", name, op, div)
							continue
						}
						require.NoError(t, err)
						launches++
						want := make([]byte, nb)
						if div > 1 {
							kernels.ReduceFinal(typ, kernels.Avg, div)(want, ha, hb)
						} else {
							kernels.Reduce(typ, op)(want, ha, hb)
						}
						got, got2 := toHost(t, s, dst), toHost(t, s, dst2)
						if i := mismatch(typ, op, got, want); i >= 0 {
							t.Fatalf("seed %d: %s/op=%v/div=%d: dst %s", seed, name, op, div, describe(typ, ha, hb, got, want, i))
						}
						if i := mismatch(typ, op, got2, want); i >= 0 {
							t.Fatalf("seed %d: %s/op=%v/div=%d: dst2 %s", seed, name, op, div, describe(typ, ha, hb, got2, want, i))
						}
						// In place: dst = dst op b.
						require.NoError(t, s.Reduce(dst, none, dst, b, typ, op, div))
						launches++
						want2 := make([]byte, nb)
						if div > 1 {
							kernels.ReduceFinal(typ, kernels.Avg, div)(want2, got, hb)
						} else {
							kernels.Reduce(typ, op)(want2, got, hb)
						}
						if g := toHost(t, s, dst); mismatch(typ, op, g, want2) >= 0 {
							i := mismatch(typ, op, g, want2)
							t.Fatalf("seed %d: %s/op=%v/div=%d: in place %s", seed, name, op, div, describe(typ, got, hb, g, want2, i))
						}
					}
				}
				for _, div := range []int{1, 3} {
					require.NoError(t, s.Post(dst, a, typ, div))
					launches++
					want := append([]byte(nil), ha...)
					if f := kernels.Post(typ, kernels.Avg, div); f != nil {
						f(want, ha)
					}
					if g := toHost(t, s, dst); mismatch(typ, kernels.Avg, g, want) >= 0 {
						i := mismatch(typ, kernels.Avg, g, want)
						t.Fatalf("seed %d: %s: post /%d %s", seed, name, div, describe(typ, ha, nil, g, want, i))
					}
				}
				// Post in place, then Copy with and without dst2.
				require.NoError(t, s.Copy(dst, none, a))
				require.NoError(t, s.Post(dst, dst, typ, 3))
				want := append([]byte(nil), ha...)
				kernels.Post(typ, kernels.Avg, 3)(want, ha)
				if g := toHost(t, s, dst); mismatch(typ, kernels.Avg, g, want) >= 0 {
					i := mismatch(typ, kernels.Avg, g, want)
					t.Fatalf("seed %d: %s: post in place %s", seed, name, describe(typ, ha, nil, g, want, i))
				}
				require.NoError(t, s.Copy(dst, dst2, b))
				launches++
				require.Equal(t, hb, toHost(t, s, dst), "%s: copy to dst", name)
				require.Equal(t, hb, toHost(t, s, dst2), "%s: copy to dst2", name)
			}
		}
	}
	t.Logf("%d kernel launches checked against internal/kernels", launches)
}

func TestGPUMemory(t *testing.T) {
	dev := gpu(t)
	s := gpuStream(t, dev)
	none := memory.Buffer{}

	// Mapped memory: the host writes, a kernel (Copy with dst2) reads.
	h, err := dev.AllocHost(1 << 20)
	require.NoError(t, err)
	defer dev.Free(h)
	for i := range h.Bytes() {
		h.Bytes()[i] = byte(i * 7)
	}
	d1, d2 := gpuAlloc(t, dev, 1<<20), gpuAlloc(t, dev, 1<<20)
	require.NoError(t, s.Copy(d1, d2, h))
	require.Equal(t, h.Bytes(), toHost(t, s, d2))

	// Registered memory: an mmap'd segment, as the shm transport's.
	seg, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer syscall.Munmap(seg)
	r, err := dev.Register(seg)
	require.NoError(t, err)
	require.NoError(t, s.Copy(r, none, d1))
	syncCtx(t, s)
	require.Equal(t, h.Bytes(), seg)
	require.NoError(t, dev.Unregister(r))

	for _, c := range []struct {
		what  string
		ptr   uintptr
		ord   int
		isDev bool
	}{
		{"device", uintptr(devPtr(d1.Slice(100, 200))), 0, true},
		{"mapped", uintptr(devPtr(h)), 0, false},
		{"pageable", uintptr(unsafe.Pointer(&c0)), -1, false},
	} {
		ord, isDev, err := dev.PointerDevice(c.ptr)
		require.NoError(t, err, c.what)
		require.Equal(t, c.ord, ord, c.what)
		require.Equal(t, c.isDev, isDev, c.what)
	}
	can, err := dev.CanAccessPeer(dev)
	require.NoError(t, err)
	require.False(t, can)
}

var c0 [64]byte // pageable memory for TestGPUMemory

// TestGPUStreamOrdering: a WaitValue holds a stream until the host writes
// the flag; an event orders a second stream after the first.
func TestGPUStreamOrdering(t *testing.T) {
	dev := gpu(t)
	none := memory.Buffer{}
	const n = 64 << 20
	// Memory first, streams next, then the flag's release: cleanups run
	// in reverse, so a failed test releases the waiting stream, then
	// closes the streams, then frees what they used.
	flag, err := dev.AllocHost(4)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Free(flag) })
	word := (*uint32)(unsafe.Pointer(&flag.Bytes()[0]))
	atomic.StoreUint32(word, 0)
	src, mid, out := gpuAlloc(t, dev, n), gpuAlloc(t, dev, n), gpuAlloc(t, dev, n)
	s1, s2 := gpuStream(t, dev), gpuStream(t, dev)
	t.Cleanup(func() { atomic.StoreUint32(word, 1) })

	host := make([]byte, n)
	for i := range n / 4 {
		binary.LittleEndian.PutUint32(host[4*i:], math.Float32bits(float32(i%1000)))
	}
	require.NoError(t, s1.Copy(src, none, memory.HostBuffer(host)))
	syncCtx(t, s1)

	err = s1.WaitValue(flag, 1)
	if errors.Is(err, ErrNoStreamMemOps) {
		t.Fatalf("this driver has no stream memory operations: %v", err)
	}
	require.NoError(t, err)
	require.NoError(t, s1.Reduce(mid, none, src, src, kernels.Float32, kernels.Sum, 0))
	e1, err := s1.Record()
	require.NoError(t, err)
	defer e1.Close()
	require.NoError(t, s2.WaitEvent(e1))
	require.NoError(t, s2.Copy(out, none, mid))
	e2, err := s2.Record()
	require.NoError(t, err)
	defer e2.Close()

	// Held: the flag is 0.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = e2.Sync(ctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the copy ran before the flag was set")
	for _, e := range []interface{ Done() (bool, error) }{e1, e2} {
		done, err := e.Done()
		require.NoError(t, err)
		require.False(t, done)
	}
	atomic.StoreUint32(word, 1)
	ctx, cancel = context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	require.NoError(t, e2.Sync(ctx))
	got := toHost(t, s2, out)
	for i := 0; i < n/4; i += 4099 {
		require.Equal(t, float32(2*(i%1000)), math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])), "element %d", i)
	}

	// Wrap-around: 5 is "at least" 0xfffffff0 (int32(5-0xfffffff0) = 21).
	atomic.StoreUint32(word, 5)
	require.NoError(t, s1.WaitValue(flag, 0xfffffff0))
	syncCtx(t, s1)

	// Timing events.
	t0, err := s1.RecordTiming()
	require.NoError(t, err)
	defer t0.Close()
	require.NoError(t, s1.Reduce(mid, none, src, src, kernels.Float32, kernels.Sum, 0))
	t1, err := s1.RecordTiming()
	require.NoError(t, err)
	defer t1.Close()
	require.NoError(t, t1.Sync(ctx))
	dt, err := t1.Since(t0)
	require.NoError(t, err)
	require.Greater(t, dt, time.Duration(0))
	t.Logf("float32 sum of 2×64 MiB: %v", dt)
}

// TestGPUIPCInProcess: CUDA refuses to open a handle in the process that
// exported it; the error must be a clean *Error, and the device usable
// afterwards. Should a driver accept it, the mapping must show the memory.
func TestGPUIPCInProcess(t *testing.T) {
	dev := gpu(t)
	s := gpuStream(t, dev)
	b := gpuAlloc(t, dev, 1<<20)
	h, err := dev.IPCHandle(b)
	require.NoError(t, err)
	o, err := dev.OpenIPC(h)
	if err != nil {
		var ce *Error
		require.ErrorAs(t, err, &ce)
		t.Logf("in-process OpenIPC fails cleanly: %v", err)
	} else {
		t.Logf("in-process OpenIPC works on this driver: %d bytes", o.Len())
		host := make([]byte, 1<<20)
		for i := range host {
			host[i] = byte(i)
		}
		require.NoError(t, s.Copy(b, memory.Buffer{}, memory.HostBuffer(host)))
		require.Equal(t, host, toHost(t, s, o.Slice(0, 1<<20)))
		require.NoError(t, dev.CloseIPC(o))
	}
	x := gpuAlloc(t, dev, 4096)
	require.NoError(t, s.Copy(x, memory.Buffer{}, b.Slice(0, 4096)))
	syncCtx(t, s)
}

// BenchmarkGPUReduceBandwidth: float32 sum of 256 MiB buffers against
// cuMemcpyDtoDAsync of the same bytes, timed with events, in bytes read
// and written per second.
func BenchmarkGPUReduceBandwidth(b *testing.B) {
	dev := gpu(b)
	s := gpuStream(b, dev)
	none := memory.Buffer{}
	const n = 256 << 20
	x, y, dst, cp := gpuAlloc(b, dev, n), gpuAlloc(b, dev, n), gpuAlloc(b, dev, n), gpuAlloc(b, dev, n)
	host := make([]byte, n)
	require.NoError(b, s.Copy(x, none, memory.HostBuffer(host))) // zeros: no NaN slow paths
	require.NoError(b, s.Copy(y, none, x))
	require.NoError(b, s.Reduce(dst, none, x, y, kernels.Float32, kernels.Sum, 0)) // JIT, warm-up
	syncCtx(b, s)
	var reduceT, copyT time.Duration
	iters := 0
	ctx := context.Background()
	b.SetBytes(3 * n)
	for b.Loop() {
		e0, err := s.RecordTiming()
		require.NoError(b, err)
		require.NoError(b, s.Reduce(dst, none, x, y, kernels.Float32, kernels.Sum, 0))
		e1, err := s.RecordTiming()
		require.NoError(b, err)
		require.NoError(b, s.Copy(cp, none, x))
		e2, err := s.RecordTiming()
		require.NoError(b, err)
		require.NoError(b, e2.Sync(ctx))
		r, err := e1.Since(e0)
		require.NoError(b, err)
		c, err := e2.Since(e1)
		require.NoError(b, err)
		reduceT += r
		copyT += c
		iters++
		e0.Close()
		e1.Close()
		e2.Close()
	}
	reduce := float64(3*n*iters) / reduceT.Seconds() / 1e9
	copied := float64(2*n*iters) / copyT.Seconds() / 1e9
	b.ReportMetric(reduce, "reduce-GB/s")
	b.ReportMetric(copied, "copy-GB/s")
	b.ReportMetric(reduce/copied, "reduce/copy")
}

// TestMismatchFreedoms checks the GPU tests' comparison: exact bits but for
// which NaN, and which zero from Min and Max.
func TestMismatchFreedoms(t *testing.T) {
	f32 := func(v ...uint32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], x)
		}
		return b
	}
	require.Equal(t, -1, mismatch(kernels.Float32, kernels.Sum, f32(1, 0x7fc00000), f32(1, 0xffc00001)))
	require.Equal(t, 1, mismatch(kernels.Float32, kernels.Sum, f32(1, 0x80000000), f32(1, 0)))
	require.Equal(t, -1, mismatch(kernels.Float32, kernels.Min, f32(1, 0x80000000), f32(1, 0)))
	require.Equal(t, 0, mismatch(kernels.Float32, kernels.Max, f32(0x7f800000), f32(0x7fc00000)), "Inf is not NaN")
	require.Equal(t, 0, mismatch(kernels.Int32, kernels.Min, f32(0x80000000), f32(0)), "integers have one zero")
	h := []byte{0x01, 0x7c} // a float16 NaN
	require.Equal(t, -1, mismatch(kernels.Float16, kernels.Sum, h, []byte{0x00, 0x7e}))
	require.Equal(t, 0, mismatch(kernels.BFloat16, kernels.Sum, []byte{0x80, 0x7f}, []byte{0xc0, 0x7f}), "bf16 0x7f80 is Inf")
	rng := rand.New(rand.NewPCG(1, 2))
	for typ := kernels.Type(0); ptx.HasKernels(typ); typ++ {
		b := make([]byte, 64*typ.Size())
		fill(rng, typ, b)
		require.Equal(t, -1, mismatch(typ, kernels.Sum, b, b))
	}
}
