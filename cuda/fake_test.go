package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/cuda/ptx"
	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// The fake libcuda (testdata/fakecuda.c) is compiled by gcc into this
// directory, once per variant and test binary run.
var (
	fakeDir   string
	fakeMu    sync.Mutex
	fakeBuilt = map[string]string{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeDir != "" {
		os.RemoveAll(fakeDir)
	}
	os.Exit(code)
}

// fakeLib returns the path of the fake libcuda compiled with defs (-D
// flags), skipping the test where it cannot be built.
func fakeLib(t *testing.T, defs ...string) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the CUDA driver is loaded on Linux only")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the fake libcuda (testdata/fakecuda.c) is compiled with gcc when the tests run")
	}
	fakeMu.Lock()
	defer fakeMu.Unlock()
	key := strings.Join(defs, " ")
	if p, ok := fakeBuilt[key]; ok {
		return p
	}
	if fakeDir == "" {
		if fakeDir, err = os.MkdirTemp("", "goccl-fakecuda-"); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(fakeDir, fmt.Sprintf("libfakecuda%d.so", len(fakeBuilt)))
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", out, "testdata/fakecuda.c"}, defs...)
	if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	fakeBuilt[key] = out
	return out
}

// fakeDriver loads a fake libcuda variant.
func fakeDriver(t *testing.T, defs ...string) (*Driver, string) {
	t.Helper()
	path := fakeLib(t, defs...)
	d, err := loadLibrary(path)
	require.NoError(t, err)
	return d, path
}

// fakeCall calls one of the fake's test accessors. uintptrescapes, as
// callN: the callers pass the addresses of local arrays for the fake to
// write into, and without it fakeCall's own calls (dlopen, dlsym) could
// grow the goroutine's stack and move those arrays before the C call,
// which then wrote into the old stack while the test read the new copy
// (TestFakeStream read an empty kernel name so, once, under .ci/run's
// load). With it they are on the heap, which does not move.
//
//go:uintptrescapes
func fakeCall(t *testing.T, path, name string, args ...uintptr) uint32 {
	t.Helper()
	lib, err := dlopen(path)
	require.NoError(t, err)
	fn := dlsym(lib, name)
	require.NotZero(t, fn, name)
	return callN(fn, args...)
}

func fakeProcLog(t *testing.T, path string) string {
	var buf [8192]byte
	fakeCall(t, path, "fake_proc_log", uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	return cBytes(buf[:])
}

type launchInfo struct {
	name   string
	grid   [3]uint64
	block  [3]uint64
	shm    uint64
	stream uintptr
	params [6]uint64
}

func fakeLastLaunch(t *testing.T, path string) launchInfo {
	var info [16]uint64
	var name [128]byte
	fakeCall(t, path, "fake_last_launch", uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)))
	l := launchInfo{name: cBytes(name[:]), shm: info[6], stream: uintptr(info[7])}
	copy(l.grid[:], info[0:3])
	copy(l.block[:], info[3:6])
	copy(l.params[:], info[8:14])
	return l
}

func TestLoadWithoutDriver(t *testing.T) {
	d, err := loadLibrary(defaultLibrary)
	if err == nil {
		t.Skipf("a CUDA driver is installed here (%v)", d)
	}
	if errors.Is(err, ErrNoDevice) {
		t.Skipf("a CUDA driver without devices is installed here: %v", err)
	}
	require.ErrorIs(t, err, ErrNoDriver)
	require.Contains(t, err.Error(), "libcuda.so.1 not found")
	require.Contains(t, err.Error(), EnvLibrary)
	if os.Getenv(EnvLibrary) == "" {
		_, err2 := Load()
		require.ErrorIs(t, err2, ErrNoDriver)
		require.Equal(t, err.Error(), err2.Error())
	}

	_, err = loadLibrary("/nonexistent/libcuda.so.1")
	require.ErrorIs(t, err, ErrNoDriver)
	require.Contains(t, err.Error(), EnvLibrary+"=/nonexistent/libcuda.so.1")
}

func TestLoadNotCUDA(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the CUDA driver is loaded on Linux only")
	}
	_, err := loadLibrary("libc.so.6")
	require.ErrorIs(t, err, ErrNoDriver)
	require.Contains(t, err.Error(), "has no cuGetErrorName")
}

func TestFakeNoDevice(t *testing.T) {
	_, err := loadLibrary(fakeLib(t, "-DFAKE_NO_DEVICE"))
	require.ErrorIs(t, err, ErrNoDevice)
	require.NotErrorIs(t, err, ErrNoDriver)
	require.Equal(t, "cuda: no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)", err.Error())
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, Error{Call: "cuInit", Code: 100, Name: "CUDA_ERROR_NO_DEVICE", Text: "no CUDA-capable device is detected (fake)"}, *ce)
	require.Equal(t, "cuda: cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected (fake))", ce.Error())
}

func TestFakeSymbolResolution(t *testing.T) {
	t.Run("via=cuGetProcAddress", func(t *testing.T) {
		d, path := fakeDriver(t)
		require.True(t, d.viaProc)
		require.True(t, d.waitValueV2)
		require.Equal(t, 12080, d.Version())
		log := fakeProcLog(t, path)
		for _, s := range d.symbols() {
			require.Contains(t, log, s.base+"@12000/0;", "every function by its base name, for CUDA 12.0, default flags")
		}
		require.NotContains(t, log, "_v2@")
		dev, err := d.Open(1)
		require.NoError(t, err)
		defer dev.Close()
		require.Equal(t, "Fake GPU 1 (cuGetProcAddress)", dev.Info().Name)
		require.Equal(t, "0000:1a:00.0", dev.Info().PCIBusID)
		require.Equal(t, 7, dev.Info().Major)
		require.Equal(t, 0, dev.Info().Minor)
		require.Equal(t, int64(2<<30), dev.Info().Memory)
		require.False(t, dev.Info().Emulated)
	})
	t.Run("via=dlsym", func(t *testing.T) {
		d, _ := fakeDriver(t, "-DFAKE_NO_PROCADDR")
		require.False(t, d.viaProc)
		require.True(t, d.waitValueV2, "cuStreamWaitValue32_v2 is exported")
		dev, err := d.Open(0)
		require.NoError(t, err)
		defer dev.Close()
		require.Equal(t, "Fake GPU 0 (dlsym)", dev.Info().Name)
		require.Equal(t, "0000:19:00.0", dev.Info().PCIBusID)
		b, err := dev.Alloc(64)
		require.NoError(t, err)
		require.NoError(t, dev.Free(b))
	})
}

func TestFakeMissingSymbol(t *testing.T) {
	for _, defs := range [][]string{{"-DFAKE_OMIT_MEMALLOC"}, {"-DFAKE_OMIT_MEMALLOC", "-DFAKE_NO_PROCADDR"}} {
		t.Run(strings.Join(defs, ","), func(t *testing.T) {
			_, err := loadLibrary(fakeLib(t, defs...))
			require.ErrorIs(t, err, ErrNoDriver)
			require.Contains(t, err.Error(), "has no usable cuMemAlloc")
			t.Log(err)
		})
	}
}

func TestFakeIPCHandleByValue(t *testing.T) {
	d, _ := fakeDriver(t)
	dev, err := d.Open(0)
	require.NoError(t, err)
	defer dev.Close()
	b, err := dev.Alloc(4096)
	require.NoError(t, err)
	defer dev.Free(b)
	h, err := dev.IPCHandle(b)
	require.NoError(t, err)
	_, p := b.Device()
	for i := 8; i < 64; i++ {
		require.Equal(t, byte(i*37+11), h[i], "byte %d of the handle", i)
	}
	// The fake's cuIpcOpenMemHandle_v2 receives the handle by value and
	// checks bytes 8..63; bytes 0..7 carry the pointer back.
	o, err := dev.OpenIPC(h)
	require.NoError(t, err)
	od, op := o.Device()
	require.Equal(t, 0, od)
	require.Equal(t, p, op)
	require.Equal(t, 4096, o.Len(), "the whole allocation, from cuMemGetAddressRange")
	require.Error(t, dev.Free(o), "OpenIPC memory is closed with CloseIPC")
	require.NoError(t, dev.CloseIPC(o))
	for _, i := range []int{8, 35, 63} {
		bad := h
		bad[i] ^= 0x40
		_, err = dev.OpenIPC(bad)
		var ce *Error
		require.ErrorAs(t, err, &ce, "byte %d flipped", i)
		require.Equal(t, "cuIpcOpenMemHandle", ce.Call)
		require.Equal(t, 400, ce.Code, "the fake saw the flipped byte %d", i)
	}
	_, err = dev.IPCHandle(b.Slice(16, 32))
	require.ErrorContains(t, err, "offset 16")
}

func TestFakeMemory(t *testing.T) {
	d, _ := fakeDriver(t)
	dev, err := d.Open(0)
	require.NoError(t, err)
	defer dev.Close()

	b, err := dev.Alloc(1 << 10)
	require.NoError(t, err)
	require.Equal(t, memory.Device, b.Kind())
	ord, p := b.Device()
	require.Equal(t, 0, ord)
	o, isDev, err := dev.PointerDevice(p + 10)
	require.NoError(t, err)
	require.Equal(t, 0, o)
	require.True(t, isDev)
	require.ErrorContains(t, dev.Free(b.Slice(0, 512)), "Alloc returned 1024 bytes there")
	require.ErrorContains(t, dev.Free(b.Slice(512, 1024)), "not an allocation Alloc returned")
	require.NoError(t, dev.Free(b))
	require.ErrorContains(t, dev.Free(b), "freed already")

	z, err := dev.Alloc(0)
	require.NoError(t, err)
	require.Zero(t, z.Len())
	require.NoError(t, dev.Free(z))
	_, err = dev.Alloc(-1)
	require.Error(t, err)

	h, err := dev.AllocHost(100)
	require.NoError(t, err)
	require.Equal(t, memory.Mapped, h.Kind())
	require.Len(t, h.Bytes(), 100)
	for i := range h.Bytes() {
		h.Bytes()[i] = byte(i)
	}
	_, hp := h.Device()
	require.Equal(t, uintptr(unsafe.Pointer(&h.Bytes()[0])), hp, "the fake maps host memory at its host address")
	_, isDev, err = dev.PointerDevice(hp)
	require.NoError(t, err)
	require.False(t, isDev)
	require.Error(t, dev.Unregister(h), "AllocHost memory is freed with Free")
	require.NoError(t, dev.Free(h))

	o, isDev, err = dev.PointerDevice(uintptr(unsafe.Pointer(&h)))
	require.NoError(t, err)
	require.Equal(t, -1, o, "pageable memory is no device's")
	require.False(t, isDev)

	seg := make([]byte, 256) // stands in for an mmap'd segment
	r, err := dev.Register(seg)
	require.NoError(t, err)
	require.Equal(t, memory.Mapped, r.Kind())
	require.Error(t, dev.Free(r), "registered memory is released with Unregister")
	require.NoError(t, dev.Unregister(r))
	runtime.KeepAlive(seg)

	require.Error(t, dev.Free(memory.HostBuffer(seg)))
}

// TestFakeContextPerThread: the fake fails every call made without the
// primary context current on the calling thread; goroutines on many
// threads must never see that.
func TestFakeContextPerThread(t *testing.T) {
	d, path := fakeDriver(t)
	dev0, err := d.Open(0)
	require.NoError(t, err)
	dev1, err := d.Open(1)
	require.NoError(t, err)
	again, err := d.Open(0)
	require.NoError(t, err)
	require.EqualValues(t, 1, fakeCall(t, path, "fake_ctx_refs", 0), "one retain per ordinal")

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		dev := []*Device{dev0, dev1, again}[g%3]
		wg.Go(func() {
			for range 1000 {
				b, err := dev.Alloc(64)
				if err == nil {
					runtime.Gosched()
					err = dev.Free(b)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	require.NoError(t, dev0.Close())
	require.NoError(t, dev0.Close())
	_, err = dev0.Alloc(1)
	require.ErrorIs(t, err, ErrClosed)
	require.EqualValues(t, 1, fakeCall(t, path, "fake_ctx_refs", 0), "again still holds it")
	require.NoError(t, again.Close())
	require.EqualValues(t, 0, fakeCall(t, path, "fake_ctx_refs", 0), "released with the last Device")
	require.NoError(t, dev1.Close())
}

func f32s(b []byte) []float32 { return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4) }

func TestFakeStream(t *testing.T) {
	d, path := fakeDriver(t)
	dev, err := d.Open(0)
	require.NoError(t, err)
	defer dev.Close()
	ds, err := dev.NewStream()
	require.NoError(t, err)
	s := ds.(*Stream)
	defer s.Close()
	ctx := context.Background()

	const n = 1000
	host := make([]byte, 4*n)
	for i := range f32s(host) {
		f32s(host)[i] = float32(i)
	}
	bufs := make([]memory.Buffer, 4)
	for i := range bufs {
		if bufs[i], err = dev.Alloc(4 * n); err != nil {
			t.Fatal(err)
		}
		defer dev.Free(bufs[i])
	}
	a, b, dst, dst2 := bufs[0], bufs[1], bufs[2], bufs[3]
	require.NoError(t, s.Copy(a, memory.Buffer{}, memory.HostBuffer(host)))
	require.NoError(t, s.Copy(b, memory.Buffer{}, a))

	require.NoError(t, s.Reduce(dst, dst2, a, b, kernels.Float32, kernels.Sum, 0))
	l := fakeLastLaunch(t, path)
	require.Equal(t, ptx.ReduceName(kernels.Float32, kernels.Sum), l.name)
	require.Equal(t, [3]uint64{uint64(ptx.Grid(4 * n)), 1, 1}, l.grid)
	require.Equal(t, [3]uint64{ptx.BlockThreads, 1, 1}, l.block)
	require.Zero(t, l.shm)
	require.Equal(t, s.Handle(), l.stream)
	require.Equal(t, [6]uint64{devPtr(dst), devPtr(dst2), devPtr(a), devPtr(b), n, 0}, l.params)
	require.NoError(t, s.Sync(ctx))
	out := make([]byte, 4*n)
	require.NoError(t, s.Copy(memory.HostBuffer(out), memory.Buffer{}, dst2))
	for i, x := range f32s(out) {
		require.Equal(t, float32(2*i), x)
	}

	// div 3 with Avg is Avg's last step: the sum kernel with div, the 6th parameter.
	require.NoError(t, s.Reduce(dst, memory.Buffer{}, a, b, kernels.Float32, kernels.Avg, 3))
	l = fakeLastLaunch(t, path)
	require.Equal(t, ptx.ReduceName(kernels.Float32, kernels.Sum), l.name)
	require.Equal(t, [6]uint64{devPtr(dst), 0, devPtr(a), devPtr(b), n, 3}, l.params)
	require.NoError(t, s.Copy(memory.HostBuffer(out), memory.Buffer{}, dst))
	require.NoError(t, s.Sync(ctx))
	require.Equal(t, float32(2*7)/3, f32s(out)[7])

	require.NoError(t, s.Post(dst, dst, kernels.Float32, 2))
	l = fakeLastLaunch(t, path)
	require.Equal(t, ptx.PostName(kernels.Float32), l.name)
	require.Equal(t, []uint64{devPtr(dst), devPtr(dst), n, 2}, l.params[:4])

	require.NoError(t, s.Copy(dst, dst2, a))
	l = fakeLastLaunch(t, path)
	require.Equal(t, ptx.CopyName, l.name)
	require.Equal(t, []uint64{devPtr(dst), devPtr(dst2), devPtr(a), 4 * n}, l.params[:4])

	// Work that launches nothing.
	before := l
	require.NoError(t, s.Copy(dst, memory.Buffer{}, a))
	require.NoError(t, s.Reduce(dst.Slice(0, 0), memory.Buffer{}, a.Slice(0, 0), b.Slice(0, 0), kernels.Float32, kernels.Sum, 0))
	require.NoError(t, s.Post(dst, dst, kernels.Float32, 1))
	require.Equal(t, before, fakeLastLaunch(t, path))

	// The fake loaded the PTX as a C string: its length is the image's.
	img, _ := ptx.For(7, 0)
	img = []byte(strings.TrimRight(string(img), "\x00"))
	require.EqualValues(t, len(img), fakeCall(t, path, "fake_last_image_len"))

	// Obligations 1 and 2: errors, nothing enqueued.
	hb := memory.HostBuffer(host)
	for name, err := range map[string]error{
		"host a":          s.Reduce(dst, memory.Buffer{}, hb, b, kernels.Float32, kernels.Sum, 0),
		"lengths":         s.Reduce(dst, memory.Buffer{}, a.Slice(0, 8), b, kernels.Float32, kernels.Sum, 0),
		"element size":    s.Reduce(dst.Slice(0, 6), memory.Buffer{}, a.Slice(0, 6), b.Slice(0, 6), kernels.Float32, kernels.Sum, 0),
		"dst2 overlaps":   s.Reduce(dst, dst, a, b, kernels.Float32, kernels.Sum, 0),
		"dst partly a":    s.Reduce(a.Slice(4, 4*n), memory.Buffer{}, a.Slice(0, 4*n-4), b.Slice(0, 4*n-4), kernels.Float32, kernels.Sum, 0),
		"min with div":    s.Reduce(dst, memory.Buffer{}, a, b, kernels.Float32, kernels.Min, 3),
		"bad op":          s.Reduce(dst, memory.Buffer{}, a, b, kernels.Float32, kernels.Op(99), 0),
		"post div 0":      s.Post(dst, a, kernels.Float32, 0),
		"post host":       s.Post(dst, hb, kernels.Float32, 2),
		"copy host-host":  s.Copy(memory.HostBuffer(out), memory.Buffer{}, hb),
		"copy dst2 = src": s.Copy(dst, a, a),
		"other device":    s.Copy(dst, memory.Buffer{}, memory.DeviceBuffer(1, 0x1000, 4*n)),
		"wait value size": s.WaitValue(a.Slice(0, 8), 1),
		"wait value host": s.WaitValue(memory.HostBuffer(out[:4]), 1),
	} {
		require.Error(t, err, name)
		t.Logf("%s: %v", name, err)
	}
	require.Equal(t, before, fakeLastLaunch(t, path))
}

func TestFakeJITLog(t *testing.T) {
	d, _ := fakeDriver(t)
	dev, err := d.Open(0)
	require.NoError(t, err)
	defer dev.Close()
	err = dev.st.do(func() error {
		_, err := dev.st.loadModule([]byte("// FAKE_JIT_FAIL"), "sm_70")
		return err
	})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cuModuleLoadDataEx", ce.Call)
	require.Contains(t, err.Error(), "CUDA_ERROR_INVALID_PTX")
	require.Contains(t, err.Error(), "ptxas fatal   : fake: FAKE_JIT_FAIL in line 1")
}

func TestFakeEvents(t *testing.T) {
	d, path := fakeDriver(t)
	dev, err := d.Open(0)
	require.NoError(t, err)
	defer dev.Close()
	ds, err := dev.NewStream()
	require.NoError(t, err)
	s := ds.(*Stream)
	ctx := context.Background()

	ev, err := s.Record()
	require.NoError(t, err)
	done, err := ev.Done()
	require.NoError(t, err)
	require.False(t, done, "the fake's events complete after two queries")
	require.NoError(t, ev.Sync(ctx))
	done, err = ev.Done()
	require.NoError(t, err)
	require.True(t, done)

	t0, err := s.RecordTiming()
	require.NoError(t, err)
	t1, err := s.RecordTiming()
	require.NoError(t, err)
	require.NoError(t, t0.Sync(ctx))
	require.NoError(t, t1.Sync(ctx))
	dt, err := t1.Since(t0)
	require.NoError(t, err)
	require.Equal(t, 1500*1000, int(dt.Nanoseconds()))
	_, err = t1.Since(ev)
	require.ErrorContains(t, err, "RecordTiming")

	require.NoError(t, s.WaitEvent(ev))
	for _, e := range []interface{ Close() error }{ev, t0, t1} {
		require.NoError(t, e.Close())
		require.NoError(t, e.Close())
	}
	require.ErrorIs(t, s.WaitEvent(ev), ErrClosed)

	flag, err := dev.AllocHost(4)
	require.NoError(t, err)
	defer dev.Free(flag)
	require.NoError(t, s.WaitValue(flag, 0xfffffffe))
	var w [4]uint64
	fakeCall(t, path, "fake_last_wait", uintptr(unsafe.Pointer(&w[0])))
	_, fp := flag.Device()
	require.Equal(t, [4]uint64{uint64(s.Handle()), uint64(fp), 0xfffffffe, 0}, w)

	// Sync polls; a context that ends first gives its cause.
	cause := errors.New("test cause")
	cctx, cancel := context.WithCancelCause(ctx)
	cancel(cause)
	require.NoError(t, s.WaitValue(flag, 1)) // new work: NOT_READY twice
	require.ErrorIs(t, s.Sync(cctx), cause)
	require.NoError(t, s.Sync(ctx))

	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Sync(ctx), ErrClosed)
	_, err = s.Record()
	require.ErrorIs(t, err, ErrClosed)
}

func TestFakeNoStreamMemOps(t *testing.T) {
	d, _ := fakeDriver(t, "-DFAKE_NO_MEMOPS")
	dev, err := d.Open(0)
	require.NoError(t, err)
	defer dev.Close()
	ds, err := dev.NewStream()
	require.NoError(t, err)
	defer ds.Close()
	flag, err := dev.AllocHost(4)
	require.NoError(t, err)
	defer dev.Free(flag)
	err = ds.WaitValue(flag, 1)
	require.ErrorIs(t, err, ErrNoStreamMemOps)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, errNotSupported, ce.Code)

	// Without the v2 entry point, v1 is used only where the device
	// attribute allows it; the fake's says no.
	d.waitValueV2 = false
	d.mu.Lock()
	v1 := d.devs[0].v1MemOp
	d.mu.Unlock()
	require.False(t, v1)
	require.ErrorIs(t, ds.WaitValue(flag, 1), ErrNoStreamMemOps)
}

func TestErrorText(t *testing.T) {
	e := &Error{Call: "cuMemAlloc", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Text: "out of memory"}
	require.Equal(t, "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)", e.Error())
	require.Equal(t, "cuda: cuFoo: CUresult 12345", (&Error{Call: "cuFoo", Code: 12345}).Error())
	require.ErrorIs(t, &Error{Call: "cuInit", Code: 100}, ErrNoDevice)
	require.NotErrorIs(t, &Error{Call: "cuInit", Code: 1}, ErrNoDevice)
}

// DMABuf passes the pages to cuMemGetHandleForAddressRange with the
// context current and the dma-buf handle type, and hands back the
// driver's descriptor; without the attribute it says so.
func TestFakeDMABuf(t *testing.T) {
	for _, variant := range [][]string{nil, {"-DFAKE_NO_PROCADDR"}} {
		d, _ := fakeDriver(t, variant...)
		dev, err := d.Open(0)
		require.NoError(t, err)
		b, err := dev.Alloc(3 * 4096)
		require.NoError(t, err)
		fd, off, err := dev.DMABuf(b.Slice(4096, 3*4096))
		require.NoError(t, err, "variant %v", variant)
		require.Zero(t, off)
		var what [16]byte
		_, err = unix.Pread(fd, what[:], 0)
		require.NoError(t, err)
		require.NoError(t, unix.Close(fd))
		_, p := b.Device()
		require.Equal(t, uint64(p)+4096, binary.LittleEndian.Uint64(what[:]))
		require.Equal(t, uint64(2*4096), binary.LittleEndian.Uint64(what[8:]))
		_, _, err = dev.DMABuf(b.Slice(100, 4196))
		require.ErrorContains(t, err, "whole pages")
		require.NoError(t, dev.Free(b))
		require.NoError(t, dev.Close())
	}
	d, _ := fakeDriver(t, "-DFAKE_NO_DMABUF")
	dev, err := d.Open(0)
	require.NoError(t, err)
	defer dev.Close()
	b, err := dev.Alloc(4096)
	require.NoError(t, err)
	defer dev.Free(b)
	_, _, err = dev.DMABuf(b)
	require.ErrorIs(t, err, device.ErrNotSupported)
	require.ErrorContains(t, err, "DMA_BUF_SUPPORTED")
}
