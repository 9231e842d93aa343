package ptx

import (
	_ "embed"
	"sync"

	"github.com/goccl/goccl/internal/kernels"
)

//go:generate go run gen.go

//go:embed reduce_sm70.ptx
var sm70 string

//go:embed reduce_sm90.ptx
var sm90 string

// The modules as cuModuleLoadData takes them, NUL-terminated; built on
// first use, so that programs that never load a module do not copy them.
var (
	image70 = sync.OnceValue(func() []byte { return nulTerminated(sm70) })
	image90 = sync.OnceValue(func() []byte { return nulTerminated(sm90) })
)

func nulTerminated(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// For returns the PTX module for a device of compute capability
// major.minor, and the architecture it was compiled for: the sm_90 module
// ("sm_90") for 9.0 and later (the driver JIT-compiles it for newer
// architectures), the sm_70 one ("sm_70") for 7.x and 8.x, and nil, ""
// below 7.0, which goccl does not support.
//
// The module is PTX text followed by one NUL byte, as cuModuleLoadData
// requires of PTX images; it is shared, and the caller must not modify it.
// For is safe for concurrent use.
func For(major, minor int) (ptx []byte, arch string) {
	switch {
	case major >= 9:
		return image90(), "sm_90"
	case major >= 7:
		return image70(), "sm_70"
	}
	return nil, ""
}

// BlockThreads is the number of threads per block to launch every kernel
// with: NCCL's largest block for its Simple protocol (NCCL_SIMPLE_MAX_NTHREADS).
// The kernels are correct for any block and grid size.
const BlockThreads = 512

// CopyName is the entry point of the copy kernel.
const CopyName = "goccl_copy"

const (
	// unroll is the number of 16-byte units each thread loads per step
	// of a kernel's main loop (UNROLL in reduce.cu).
	unroll = 4
	// blockBytes is what one block covers in one step of the main loop:
	// 512 threads x 16 bytes x 4 = 32 KiB of each buffer.
	blockBytes = BlockThreads * 16 * unroll
	// maxGrid bounds the grid: see Grid.
	maxGrid = 1024
)

// Grid returns the number of blocks to launch for buffers of nbytes bytes
// each (the output's length): one block per 32 KiB, so that every thread
// has one full step of the main loop (4 loads of 16 bytes from each
// input) when it can, between 1 and 1024 blocks.
//
// Why those numbers: an H200 needs about its bandwidth times memory
// latency in flight to stay busy, about 4.8 TB/s x 1 us = 5 MB; 128 blocks
// of 512 threads with 128 bytes of loads each hold 8 MB. A 4 MiB buffer
// gets those 128 blocks, about one per SM (the H200 has 132). Past that,
// more blocks than the GPU holds at once (4 per SM, 528, at most, by
// threads) only queue; 1024 blocks, just under two rounds of 528, keep
// every SM busy to the end (97% of the ideal for equal blocks) and each
// thread loops over the rest of a large buffer (grid-stride). Smaller
// buffers get fewer blocks, because a block with nothing to do still
// costs its launch.
func Grid(nbytes int) int {
	if nbytes <= 0 {
		return 1
	}
	g := nbytes / blockBytes
	if nbytes%blockBytes != 0 {
		g++
	}
	return min(g, maxGrid)
}

// typeNames are the entry points' names of internal/kernels' types.
var typeNames = [...]string{
	kernels.Int8:     "i8",
	kernels.Uint8:    "u8",
	kernels.Int32:    "i32",
	kernels.Uint32:   "u32",
	kernels.Int64:    "i64",
	kernels.Uint64:   "u64",
	kernels.Float16:  "f16",
	kernels.Float32:  "f32",
	kernels.Float64:  "f64",
	kernels.BFloat16: "bf16",
}

// opNames are the entry points' names of the reduction operations (Avg
// uses the sum kernel, with a divisor).
var opNames = [...]string{
	kernels.Sum:  "sum",
	kernels.Prod: "prod",
	kernels.Min:  "min",
	kernels.Max:  "max",
	kernels.Avg:  "sum",
}

// ReduceName returns the entry point of the reduction kernel for elements
// of type t and operation op ("goccl_reduce_f32_sum"); for Avg it is the
// sum kernel, launched with div = n for the final step. It returns "" if t
// or op is not Valid.
func ReduceName(t kernels.Type, op kernels.Op) string {
	if !t.Valid() || !op.Valid() || int(t) >= len(typeNames) || int(op) >= len(opNames) {
		return ""
	}
	return "goccl_reduce_" + typeNames[t] + "_" + opNames[op]
}

// HasKernels reports whether the modules have kernels for elements of
// type t: every type but the float8 ones, which have none yet (goccl
// refuses float8 collectives on device memory).
func HasKernels(t kernels.Type) bool {
	return t.Valid() && int(t) < len(typeNames) && typeNames[t] != ""
}

// PostName returns the entry point of the division kernel for elements of
// type t ("goccl_post_f32"), or "" if t is not Valid.
func PostName(t kernels.Type) string {
	if !t.Valid() || int(t) >= len(typeNames) {
		return ""
	}
	return "goccl_post_" + typeNames[t]
}

// Names returns every entry point of both modules, for a launcher that
// resolves them all when it loads a module: the 40 reductions, the 10
// divisions and the copy. The slice is new on every call.
func Names() []string {
	names := make([]string, 0, len(typeNames)*5+1)
	for t := range typeNames {
		for op := kernels.Sum; op <= kernels.Max; op++ {
			names = append(names, ReduceName(kernels.Type(t), op))
		}
		names = append(names, PostName(kernels.Type(t)))
	}
	return append(names, CopyName)
}
