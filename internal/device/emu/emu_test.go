package emu_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var seedFlag = flag.Uint64("emu.seed", 0, "seed of the random inputs and the emulator's delays (0: from the clock)")

// waitLimit bounds every wait of these tests for something that must
// happen; holdFor is how long a test waits for something that must not.
const (
	waitLimit = 10 * time.Second
	holdFor   = 30 * time.Millisecond
)

var errHeld = errors.New("held, as it should be")

// testSeed returns the test's seed and prints it if the test fails.
func testSeed(t *testing.T) uint64 {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (rerun with -emu.seed=%d)", seed, seed)
		}
	})
	return seed
}

func newStream(t *testing.T, d *emu.Device) device.Stream {
	t.Helper()
	s, err := d.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func alloc(t *testing.T, d *emu.Device, n int) memory.Buffer {
	t.Helper()
	b, err := d.Alloc(n)
	require.NoError(t, err)
	return b
}

func allocHost(t *testing.T, d *emu.Device, n int) memory.Buffer {
	t.Helper()
	b, err := d.AllocHost(n)
	require.NoError(t, err)
	return b
}

func free(t *testing.T, d *emu.Device, bs ...memory.Buffer) {
	t.Helper()
	for _, b := range bs {
		require.NoError(t, d.Free(b))
	}
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func syncCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// heldCtx ends after holdFor with errHeld as its cause.
func heldCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeoutCause(context.Background(), holdFor, errHeld)
	t.Cleanup(cancel)
	return ctx
}

var allTypes = []kernels.Type{
	kernels.Int8, kernels.Uint8, kernels.Int32, kernels.Uint32, kernels.Int64, kernels.Uint64,
	kernels.Float16, kernels.Float32, kernels.Float64, kernels.BFloat16,
}

var allOps = []kernels.Op{kernels.Sum, kernels.Prod, kernels.Min, kernels.Max, kernels.Avg}

// sameElems compares elements of type t, allowing what kernels' contract
// leaves open (rule 6): which NaN, and which zero Min and Max return of
// -0 and +0. It returns the first element that differs, or -1.
func sameElems(t kernels.Type, op kernels.Op, got, want []byte) int {
	es := t.Size()
	zeros := op == kernels.Min || op == kernels.Max
	for i := 0; i < len(want); i += es {
		g, w := got[i:i+es], want[i:i+es]
		if bytes.Equal(g, w) {
			continue
		}
		var gNaN, wNaN, gZero, wZero bool
		switch t {
		case kernels.Float32:
			x := math.Float32frombits(le32(g))
			y := math.Float32frombits(le32(w))
			gNaN, wNaN, gZero, wZero = x != x, y != y, x == 0, y == 0
		case kernels.Float64:
			x := math.Float64frombits(le64(g))
			y := math.Float64frombits(le64(w))
			gNaN, wNaN, gZero, wZero = x != x, y != y, x == 0, y == 0
		case kernels.Float16, kernels.BFloat16:
			exp, man := uint16(0x7C00), uint16(0x03FF)
			if t == kernels.BFloat16 {
				exp, man = 0x7F80, 0x007F
			}
			x := uint16(g[0]) | uint16(g[1])<<8
			y := uint16(w[0]) | uint16(w[1])<<8
			gNaN, wNaN = x&exp == exp && x&man != 0, y&exp == exp && y&man != 0
			gZero, wZero = x&0x7FFF == 0, y&0x7FFF == 0
		}
		if gNaN && wNaN || zeros && gZero && wZero {
			continue
		}
		return i / es
	}
	return -1
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func le64(b []byte) uint64 { return uint64(le32(b)) | uint64(le32(b[4:]))<<32 }

func TestInfo(t *testing.T) {
	d := emu.New(3, emu.Options{})
	require.Equal(t, 3, d.Ordinal())
	info := d.Info()
	require.Equal(t, "emulated device (tests only)", info.Name)
	require.True(t, info.Emulated)
	require.Empty(t, info.PCIBusID)
}

// TestArithmetic checks Reduce (with and without dst2, and in place),
// Post and Copy against internal/kernels for every type, op and divisor.
func TestArithmetic(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	d := emu.New(0, emu.Options{Seed: seed, MaxDelay: 5 * time.Microsecond})
	s := newStream(t, d)
	ctx := syncCtx(t)
	for _, typ := range allTypes {
		for _, elems := range []int{1, 37, 1500} {
			n := elems * typ.Size()
			for _, op := range allOps {
				for _, div := range []int{0, 1, 3} {
					if div > 1 && op != kernels.Sum && op != kernels.Avg {
						continue
					}
					name := fmt.Sprintf("type=%v/op=%v/div=%d/elems=%d", typ, op, div, elems)
					ha, hb := randomBytes(rng, n), randomBytes(rng, n)
					a, b, dst, dst2 := alloc(t, d, n), alloc(t, d, n), alloc(t, d, n), allocHost(t, d, n)
					require.NoError(t, s.Copy(a, memory.Buffer{}, memory.HostBuffer(ha)))
					require.NoError(t, s.Copy(b, memory.Buffer{}, memory.HostBuffer(hb)))
					require.NoError(t, s.Reduce(dst, dst2, a, b, typ, op, div), name)
					require.NoError(t, s.Reduce(a, memory.Buffer{}, a, b, typ, op, div), name) // in place
					got, inPlace := make([]byte, n), make([]byte, n)
					require.NoError(t, s.Copy(memory.HostBuffer(got), memory.Buffer{}, dst))
					require.NoError(t, s.Copy(memory.HostBuffer(inPlace), memory.Buffer{}, a))
					require.NoError(t, s.Sync(ctx))

					want := make([]byte, n)
					f := kernels.Reduce(typ, op)
					if div > 1 {
						f = kernels.ReduceFinal(typ, kernels.Avg, div)
					}
					f(want, ha, hb)
					require.Equal(t, -1, sameElems(typ, op, got, want), "%s: dst", name)
					require.Equal(t, -1, sameElems(typ, op, dst2.Bytes(), want), "%s: dst2", name)
					require.Equal(t, -1, sameElems(typ, op, inPlace, want), "%s: in place", name)
					free(t, d, a, b, dst, dst2)
				}
			}
			for _, div := range []int{1, 3, 7} {
				name := fmt.Sprintf("post/type=%v/div=%d/elems=%d", typ, div, elems)
				hsrc := randomBytes(rng, n)
				src, dst := allocHost(t, d, n), alloc(t, d, n)
				copy(src.Bytes(), hsrc)
				require.NoError(t, s.Post(dst, src, typ, div), name)
				require.NoError(t, s.Post(src, src, typ, div), name) // in place
				got := make([]byte, n)
				require.NoError(t, s.Copy(memory.HostBuffer(got), memory.Buffer{}, dst))
				require.NoError(t, s.Sync(ctx))
				want := append([]byte(nil), hsrc...)
				if f := kernels.Post(typ, kernels.Avg, div); f != nil {
					f(want, hsrc)
				}
				require.Equal(t, -1, sameElems(typ, kernels.Avg, got, want), name)
				require.Equal(t, -1, sameElems(typ, kernels.Avg, src.Bytes(), want), "%s: in place", name)
				free(t, d, src, dst)
			}
		}
	}
	// Copy with two destinations, device to device and mapped.
	n := 10000
	hsrc := randomBytes(rng, n)
	src, dst, dst2 := alloc(t, d, n), alloc(t, d, n), allocHost(t, d, n)
	require.NoError(t, s.Copy(src, memory.Buffer{}, memory.HostBuffer(hsrc)))
	require.NoError(t, s.Copy(dst, dst2, src))
	require.NoError(t, s.Sync(ctx))
	require.Equal(t, hsrc, d.Bytes(dst))
	require.Equal(t, hsrc, dst2.Bytes())
	free(t, d, src, dst, dst2)
	require.Zero(t, d.Live())
}

func TestPoison(t *testing.T) {
	d := emu.New(0, emu.Options{})
	b, h := alloc(t, d, 100), allocHost(t, d, 100)
	require.Equal(t, bytes.Repeat([]byte{emu.Poison}, 100), d.Bytes(b))
	require.Equal(t, bytes.Repeat([]byte{emu.Poison}, 100), h.Bytes())
	free(t, d, b, h)

	d = emu.New(0, emu.Options{NoPoison: true})
	b = alloc(t, d, 100)
	require.Equal(t, make([]byte, 100), d.Bytes(b))
	free(t, d, b)

	require.Panics(t, func() { alloc(t, d, 8).Bytes() }, "memory.Buffer.Bytes of emulated device memory")
	require.Panics(t, func() { d.Bytes(memory.HostBuffer(make([]byte, 8))) })
}

// TestUnsyncedReads: a reader that does not wait for the stream sees
// poison or torn data; after Sync it sees the result.
func TestUnsyncedReads(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	ctx := syncCtx(t)
	const tries = 5

	t.Run("immediate", func(t *testing.T) {
		d := emu.New(0, emu.Options{Seed: seed, MaxDelay: 20 * time.Millisecond})
		s := newStream(t, d)
		n := 4096
		a, b, dst := alloc(t, d, n), alloc(t, d, n), allocHost(t, d, n)
		copy(d.Bytes(a), randomBytes(rng, n))
		copy(d.Bytes(b), randomBytes(rng, n))
		want := make([]byte, n)
		kernels.Reduce(kernels.Int32, kernels.Sum)(want, d.Bytes(a), d.Bytes(b))
		early := 0
		for range tries {
			copy(dst.Bytes(), bytes.Repeat([]byte{emu.Poison}, n))
			require.NoError(t, s.Reduce(dst, memory.Buffer{}, a, b, kernels.Int32, kernels.Sum, 0))
			if !bytes.Equal(dst.Bytes(), want) {
				early++
			}
			require.NoError(t, s.Sync(ctx))
			require.Equal(t, want, dst.Bytes())
		}
		require.NotZero(t, early, "every unsynchronised read saw the finished result")
		free(t, d, a, b, dst)
	})

	t.Run("torn", func(t *testing.T) {
		d := emu.New(0, emu.Options{Seed: seed})
		s := newStream(t, d)
		n := 64 << 10
		src, dst := alloc(t, d, n), allocHost(t, d, n)
		pattern := make([]byte, n)
		for i := range pattern {
			pattern[i] = byte(i % 251) // never Poison
		}
		copy(d.Bytes(src), pattern)
		torn := 0
		for range tries {
			copy(dst.Bytes(), bytes.Repeat([]byte{emu.Poison}, n))
			require.NoError(t, s.Copy(dst, memory.Buffer{}, src))
			deadline := time.Now().Add(waitLimit)
			sawTorn := false
			for {
				same := 0
				for i, c := range dst.Bytes() {
					if c == pattern[i] {
						same++
					}
				}
				if same == n {
					break
				}
				if same > 0 {
					sawTorn = true
				}
				require.True(t, time.Now().Before(deadline), "copy did not finish")
				runtime.Gosched()
			}
			if sawTorn {
				torn++
			}
			require.NoError(t, s.Sync(ctx))
		}
		require.NotZero(t, torn, "a reader polling the destination never saw it half written")
		free(t, d, src, dst)
	})
}

func storeFlag(flag memory.Buffer, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(unsafe.SliceData(flag.Bytes()))), v)
}

func TestWaitEvent(t *testing.T) {
	seed := testSeed(t)
	d := emu.New(0, emu.Options{Seed: seed})
	s1, s2 := newStream(t, d), newStream(t, d)
	n := 8192
	src, x, y := alloc(t, d, n), alloc(t, d, n), alloc(t, d, n)
	pattern := randomBytes(rand.New(rand.NewPCG(seed, 3)), n)
	copy(d.Bytes(src), pattern)
	flag := allocHost(t, d, 4)
	storeFlag(flag, 0)

	require.NoError(t, s1.WaitValue(flag, 1))
	require.NoError(t, s1.Copy(x, memory.Buffer{}, src))
	ev, err := s1.Record()
	require.NoError(t, err)
	require.NoError(t, s2.WaitEvent(ev))
	require.NoError(t, s2.Copy(y, memory.Buffer{}, x))
	ev2, err := s2.Record()
	require.NoError(t, err)

	require.ErrorIs(t, s2.Sync(heldCtx(t)), errHeld)
	require.Equal(t, bytes.Repeat([]byte{emu.Poison}, n), d.Bytes(y), "s2 copied before s1's event")
	done, err := ev.Done()
	require.NoError(t, err)
	require.False(t, done)
	_, err = ev2.Since(ev)
	require.Error(t, err, "Since of events not completed")

	storeFlag(flag, 1)
	require.NoError(t, s2.Sync(syncCtx(t)))
	require.Equal(t, pattern, d.Bytes(y))
	require.NoError(t, ev.Sync(syncCtx(t)))
	done, err = ev.Done()
	require.NoError(t, err)
	require.True(t, done)
	dt, err := ev2.Since(ev)
	require.NoError(t, err)
	require.GreaterOrEqual(t, dt, time.Duration(0))

	require.NoError(t, ev.Close())
	_, err = ev.Done()
	require.Error(t, err)
	require.Error(t, s2.WaitEvent(ev), "WaitEvent of a closed event")
	require.NoError(t, ev2.Close())
	require.NoError(t, s1.Sync(syncCtx(t)))
	free(t, d, src, x, y, flag)
}

func TestWaitValue(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: testSeed(t)})
	s := newStream(t, d)
	flag := allocHost(t, d, 4)
	src, dst := alloc(t, d, 64), alloc(t, d, 64)
	copy(d.Bytes(src), bytes.Repeat([]byte{7}, 64))

	// Wrap-around: 0xFFFFFFFD is before 0xFFFFFFFE, 1 is after it.
	storeFlag(flag, 0xFFFFFFFD)
	require.NoError(t, s.WaitValue(flag, 0xFFFFFFFE))
	require.NoError(t, s.Copy(dst, memory.Buffer{}, src))
	require.ErrorIs(t, s.Sync(heldCtx(t)), errHeld, "Sync returns the context's cause")
	require.Equal(t, bytes.Repeat([]byte{emu.Poison}, 64), d.Bytes(dst), "work after WaitValue ran early")
	storeFlag(flag, 1)
	require.NoError(t, s.Sync(syncCtx(t)))
	require.Equal(t, bytes.Repeat([]byte{7}, 64), d.Bytes(dst))
	free(t, d, flag, src, dst)
}

// TestClose: Close waits for queued work, ends a WaitValue that still
// waits by failing the stream, and is idempotent.
func TestClose(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: testSeed(t), MaxDelay: time.Millisecond})
	s, err := d.NewStream()
	require.NoError(t, err)
	n := 1 << 20
	src, dst := alloc(t, d, n), alloc(t, d, n)
	copy(d.Bytes(src), bytes.Repeat([]byte{3}, n))
	require.NoError(t, s.Copy(dst, memory.Buffer{}, src))
	require.NoError(t, s.Close())
	require.Equal(t, d.Bytes(src), d.Bytes(dst))
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Sync(syncCtx(t)), emu.ErrClosed)
	require.ErrorIs(t, s.Copy(dst, memory.Buffer{}, src), emu.ErrClosed)
	_, err = s.Record()
	require.ErrorIs(t, err, emu.ErrClosed)

	s, err = d.NewStream()
	require.NoError(t, err)
	flag := allocHost(t, d, 4)
	storeFlag(flag, 0)
	require.NoError(t, s.WaitValue(flag, 1))
	require.NoError(t, s.Copy(dst, memory.Buffer{}, src))
	require.ErrorContains(t, s.Close(), "closed while waiting")
	free(t, d, src, dst, flag)
	require.Zero(t, d.Live())
}

type fakeEvent struct{ device.Event }

func TestValidation(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: testSeed(t)})
	other := emu.New(1, emu.Options{})
	twin := emu.New(0, emu.Options{}) // same ordinal, another device
	s := newStream(t, d)
	n := 256
	a, b, dst := alloc(t, d, n), alloc(t, d, n), alloc(t, d, n)
	mapped := allocHost(t, d, n)
	foreign, twinBuf := alloc(t, other, n), alloc(t, twin, n)
	host := memory.HostBuffer(make([]byte, n))
	_, aPtr := a.Device()
	none := memory.Buffer{}
	f32, sum := kernels.Float32, kernels.Sum

	otherStream := newStream(t, other)
	otherEv, err := otherStream.Record()
	require.NoError(t, err)

	cases := []struct {
		name string
		err  error
		want string
	}{
		{"host in Reduce", s.Reduce(dst, none, host, b, f32, sum, 0), "pageable host memory"},
		{"host dst in Reduce", s.Reduce(host, none, a, b, f32, sum, 0), "pageable host memory"},
		{"host in Post", s.Post(dst, host, f32, 1), "pageable host memory"},
		{"wrong ordinal", s.Reduce(dst, none, foreign, b, f32, sum, 0), "of device 1 used on device 0"},
		{"another device, same ordinal", s.Reduce(dst, none, twinBuf, b, f32, sum, 0), "not inside a live allocation"},
		{"length mismatch", s.Reduce(dst, none, a.Slice(0, 128), b, f32, sum, 0), "lengths differ"},
		{"dst2 length", s.Reduce(dst, mapped.Slice(0, 8), a, b, f32, sum, 0), "lengths differ"},
		{"element size", s.Reduce(dst.Slice(0, 6), none, a.Slice(0, 6), b.Slice(0, 6), f32, sum, 0), "not a multiple"},
		{"dst2 overlaps dst", s.Reduce(dst.Slice(0, 128), dst.Slice(64, 192), a.Slice(0, 128), b.Slice(0, 128), f32, sum, 0), "dst2 overlaps"},
		{"dst2 is a", s.Reduce(dst, a, a, b, f32, sum, 0), "dst2 overlaps"},
		{"dst partly a", s.Reduce(a.Slice(4, 132), none, a.Slice(0, 128), b.Slice(0, 128), f32, sum, 0), "dst overlaps"},
		{"out of allocation", s.Reduce(memory.DeviceBuffer(0, aPtr+uintptr(n)-4, 8), none, b.Slice(0, 8), dst.Slice(0, 8), f32, sum, 0), "not inside a live allocation"},
		{"div with max", s.Reduce(dst, none, a, b, f32, kernels.Max, 2), "only with sum or avg"},
		{"negative div", s.Reduce(dst, none, a, b, f32, sum, -1), "want div >= 0"},
		{"invalid type", s.Reduce(dst, none, a, b, kernels.Type(99), sum, 0), "not a valid type"},
		{"invalid op", s.Reduce(dst, none, a, b, f32, kernels.Op(99), 0), "not a valid type and op"},
		{"post div 0", s.Post(dst, a, f32, 0), "want at least 1"},
		{"post overlap", s.Post(a.Slice(4, 132), a.Slice(0, 128), f32, 2), "dst overlaps src"},
		{"copy host to host", s.Copy(host, none, memory.HostBuffer(make([]byte, n))), "host to host"},
		{"copy length", s.Copy(dst, none, a.Slice(0, 8)), "lengths differ"},
		{"copy overlap", s.Copy(a.Slice(1, 129), none, a.Slice(0, 128)), "dst overlaps src"},
		{"copy dst2 overlap", s.Copy(dst, dst, a), "dst2 overlaps"},
		{"copy wrong device", s.Copy(foreign, none, host), "of device 1 used on device 0"},
		{"mapped as device", s.Copy(memory.DeviceBuffer(0, mappedPtr(mapped), n), none, host), "lies in mapped memory"},
		{"wait on device memory", s.WaitValue(a.Slice(0, 4), 1), "must be mapped memory"},
		{"wait unaligned", s.WaitValue(mapped.Slice(2, 6), 1), "4-byte aligned"},
		{"wait length", s.WaitValue(mapped.Slice(0, 8), 1), "want 4 bytes"},
		{"wait other device", s.WaitEvent(otherEv), "another emulated device"},
		{"wait foreign event", s.WaitEvent(fakeEvent{}), "not an emulated event"},
	}
	for _, c := range cases {
		require.ErrorContains(t, c.err, c.want, c.name)
	}
	require.NoError(t, s.Sync(syncCtx(t)), "validation errors are not sticky")
	require.NoError(t, otherEv.Close())

	// Allocation and Free.
	_, err = d.Alloc(0)
	require.Error(t, err)
	small := emu.New(0, emu.Options{Memory: 4096})
	_, err = small.Alloc(4097)
	require.ErrorContains(t, err, "out of device memory")
	sb := alloc(t, small, 4096)
	_, err = small.Alloc(1)
	require.ErrorContains(t, err, "out of device memory")
	free(t, small, sb)

	require.ErrorContains(t, d.Free(a.Slice(8, 16)), "free the whole allocation")
	require.ErrorContains(t, d.Free(a.Slice(0, 16)), "free the whole allocation")
	require.ErrorContains(t, d.Free(twinBuf), "not allocated by this device")
	require.ErrorContains(t, d.Free(foreign), "device 1")
	require.ErrorContains(t, d.Free(host), "host memory")
	require.ErrorContains(t, d.Free(memory.DeviceBuffer(0, mappedPtr(mapped), n)), "mapped memory")
	free(t, d, a)
	require.ErrorContains(t, d.Free(a), "double free")
	require.ErrorContains(t, s.Copy(a, none, host), "were freed")
	free(t, d, b, dst, mapped)
	free(t, other, foreign)
	free(t, twin, twinBuf)
	require.Zero(t, d.Live())
}

func mappedPtr(b memory.Buffer) uintptr {
	_, p := b.Device()
	return p
}

// TestFreeWithPendingWork: freeing memory that queued work uses fails the
// stream, stickily, and the streams that wait for its events.
func TestFreeWithPendingWork(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: testSeed(t)})
	s, s2 := newStream(t, d), newStream(t, d)
	flag := allocHost(t, d, 4)
	storeFlag(flag, 0)
	src, dst, other := alloc(t, d, 64), alloc(t, d, 64), alloc(t, d, 64)
	require.NoError(t, s.WaitValue(flag, 1))
	require.NoError(t, s.Copy(dst, memory.Buffer{}, src))
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, s2.WaitEvent(ev))
	require.NoError(t, s2.Copy(other, memory.Buffer{}, src))

	require.ErrorIs(t, d.Free(dst), emu.ErrInUse)
	require.Equal(t, 3, d.Live(), "Free released the memory all the same")
	storeFlag(flag, 1)
	err = s.Sync(syncCtx(t))
	require.ErrorIs(t, err, emu.ErrInUse)
	require.ErrorContains(t, err, "freed before the work ran")
	require.ErrorIs(t, s.Copy(other, memory.Buffer{}, src), emu.ErrInUse, "the failure is sticky")
	_, err = s.Record()
	require.ErrorIs(t, err, emu.ErrInUse)
	require.ErrorIs(t, s.Sync(syncCtx(t)), emu.ErrInUse)
	require.ErrorIs(t, ev.Sync(syncCtx(t)), emu.ErrInUse)
	require.ErrorIs(t, s2.Sync(syncCtx(t)), emu.ErrInUse, "WaitEvent on a failed event fails the waiter")
	require.Equal(t, bytes.Repeat([]byte{emu.Poison}, 64), d.Bytes(other))
	require.ErrorIs(t, s.Close(), emu.ErrInUse)
	free(t, d, flag, src, other)
	require.Zero(t, d.Live())
}

// TestConcurrentUse: a Stream's methods called by two goroutines at once
// return ErrConcurrentUse.
func TestConcurrentUse(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: testSeed(t)})
	s := newStream(t, d)
	flag := allocHost(t, d, 4)
	storeFlag(flag, 0)
	require.NoError(t, s.WaitValue(flag, 1))
	errc := make(chan error, 1)
	go func() {
		for {
			err := s.Sync(context.Background())
			if !errors.Is(err, emu.ErrConcurrentUse) {
				errc <- err
				return
			}
		}
	}()
	deadline := time.Now().Add(waitLimit)
	for {
		err := s.WaitValue(flag, 0)
		if errors.Is(err, emu.ErrConcurrentUse) {
			break
		}
		require.NoError(t, err)
		require.True(t, time.Now().Before(deadline), "a call during Sync never failed")
		runtime.Gosched()
	}
	storeFlag(flag, 1)
	require.NoError(t, <-errc)
	require.NoError(t, s.Close())
	free(t, d, flag)
}

func TestRegisterExistingMemory(t *testing.T) {
	d := emu.New(0, emu.Options{Seed: 1})
	raw, err := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	defer unix.Munmap(raw)
	for i := range raw {
		raw[i] = byte(i)
	}
	m, err := d.Register(raw)
	require.NoError(t, err)
	require.Equal(t, memory.Mapped, m.Kind())
	require.Equal(t, byte(5), raw[5], "registration keeps the contents")
	_, err = d.Register(raw[100:200])
	require.ErrorContains(t, err, "overlaps")
	require.ErrorContains(t, d.Free(m), "use Unregister")
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	// A kernel writes the registered memory, which the host then reads.
	require.NoError(t, s.Copy(m.Slice(4096, 8192), memory.Buffer{}, m.Slice(0, 4096)))
	require.NoError(t, s.Sync(context.Background()))
	require.Equal(t, raw[:4096], raw[4096:])
	require.NoError(t, d.Unregister(m))
	require.Zero(t, d.Live())
	require.Equal(t, byte(5), raw[5], "unregistering leaves the memory alone")
	require.Error(t, d.Unregister(m), "twice")
}
