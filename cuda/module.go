package cuda

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/goccl/goccl/cuda/ptx"
	"github.com/goccl/goccl/internal/kernels"
)

// JIT options (CUjit_option).
const (
	jitErrorLogBuffer          = 5 // CU_JIT_ERROR_LOG_BUFFER
	jitErrorLogBufferSizeBytes = 6 // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
	jitLogSize                 = 16 << 10
)

// Table bounds for the kernels: above the number of kernels.Types and
// kernels.Ops (checked when a module is loaded).
const (
	maxTypes = 16
	maxOps   = 8
)

// module is goccl's PTX loaded into a device's primary context, with its
// kernels by type and op. It does not change once loaded.
type module struct {
	h      uintptr // CUmodule
	arch   string  // what ptx.For said the PTX targets
	reduce [maxTypes][maxOps]uintptr
	post   [maxTypes]uintptr
	copy   uintptr
}

// kernels returns the device's module, loading it on first use: the
// caller has entered the context. A failure is remembered, not retried.
func (st *devState) kernels() (*module, error) {
	if m := st.mod.Load(); m != nil {
		return m, nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if m := st.mod.Load(); m != nil {
		return m, nil
	}
	if st.modErr != nil {
		return nil, st.modErr
	}
	image, arch := ptx.For(st.info.Major, st.info.Minor)
	if image == nil {
		st.modErr = fmt.Errorf("cuda: device %d (%s) has compute capability %d.%d: goccl's kernels need 7.0 or later", st.ordinal, st.info.Name, st.info.Major, st.info.Minor)
		return nil, st.modErr
	}
	m, err := st.loadModule(image, arch)
	if err != nil {
		st.modErr = err
		return nil, err
	}
	st.mod.Store(m)
	return m, nil
}

// loadModule JIT-compiles image (cuModuleLoadDataEx, the error log
// captured) and resolves every kernel of ptx.Names. The caller has entered
// the context.
func (st *devState) loadModule(image []byte, arch string) (*module, error) {
	d := st.drv
	// The driver reads PTX as a C string.
	if len(image) == 0 || image[len(image)-1] != 0 {
		image = append(image[:len(image):len(image)], 0)
	}
	log := make([]byte, jitLogSize)
	opts := []uint32{jitErrorLogBuffer, jitErrorLogBufferSizeBytes} // CUjit_option is a C enum
	vals := []uintptr{uintptr(unsafe.Pointer(&log[0])), uintptr(len(log))}
	// opts and vals are passed as pointers, and vals holds log's address:
	// pinned, so that the driver may read and write all three during the
	// call (the cgo rule for Go memory holding Go pointers).
	var pin runtime.Pinner
	pin.Pin(&log[0])
	pin.Pin(&opts[0])
	pin.Pin(&vals[0])
	var h uintptr
	r := callN(d.fn.moduleLoadDataEx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&image[0])),
		uintptr(len(opts)), uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])))
	pin.Unpin()
	if r != 0 {
		n := min(int(vals[1]), len(log)) // the driver writes back the log's length
		text := cBytes(log[:n])
		if text == "" {
			text = "(no JIT log)"
		}
		return nil, fmt.Errorf("cuda: loading goccl's PTX for %s on device %d (%s, compute capability %d.%d): %w\n%s",
			arch, st.ordinal, st.info.Name, st.info.Major, st.info.Minor, d.newError("cuModuleLoadDataEx", r), text)
	}
	m := &module{h: h, arch: arch}
	fail := func(err error) (*module, error) {
		callN(d.fn.moduleUnload, h)
		return nil, err
	}
	byName := map[string]uintptr{}
	for _, name := range ptx.Names() {
		var f uintptr
		if r := callN(d.fn.moduleGetFunction, uintptr(unsafe.Pointer(&f)), h, uintptr(unsafe.Pointer(cString(name)))); r != 0 {
			return fail(fmt.Errorf("cuda: goccl's PTX for %s: kernel %s: %w", arch, name, d.newError("cuModuleGetFunction", r)))
		}
		byName[name] = f
	}
	lookup := func(name string) (uintptr, error) {
		if f, ok := byName[name]; ok {
			return f, nil
		}
		return 0, fmt.Errorf("cuda: goccl's PTX for %s has no kernel %q (not in ptx.Names)", arch, name)
	}
	var err error
	if m.copy, err = lookup(ptx.CopyName); err != nil {
		return fail(err)
	}
	for t := kernels.Type(0); ptx.HasKernels(t); t++ {
		if int(t) >= maxTypes {
			return fail(fmt.Errorf("cuda: kernel table too small for type %v", t))
		}
		if m.post[t], err = lookup(ptx.PostName(t)); err != nil {
			return fail(err)
		}
		for op := kernels.Op(0); op.Valid(); op++ {
			if int(op) >= maxOps {
				return fail(fmt.Errorf("cuda: kernel table too small for op %v", op))
			}
			if m.reduce[t][op], err = lookup(ptx.ReduceName(t, op)); err != nil {
				return fail(err)
			}
		}
	}
	return m, nil
}
