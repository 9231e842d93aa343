package kernels

// Streaming kernels write their destination with non-temporal stores,
// which go to memory without first reading the destination's cache lines
// in (a plain store of a line not in the cache reads it from memory first:
// a third memory transfer on top of the two operands' reads) and without
// evicting the working set from the caches. That pays when the destination
// is larger than the caches and nobody reads it soon: the output of a
// large collective. It also pays where another core reads the destination
// next and still holds its lines from an earlier round (a shared-memory
// slot: the engine's sinkFar), since a plain store would first take each
// line back from that core. For small buffers, or where the CPU has no such
// kernels (16-bit float types, builds without assembly), they are the
// ordinary kernels.
//
// The memory arithmetic is in ../shared/baselines/RESULTS.md: one core
// streams c = a+b at 4.4 GB/s per vector from DRAM, and a memory copy at
// about 10 GB/s.

// Func2 computes dst[i] = dst2[i] = a[i] op b[i]: one pass writing two
// destinations. Buffer rules are those of Func, for both destinations.
type Func2 func(dst, dst2, a, b []byte)

// minStream is the shortest destination worth streaming stores.
const minStream = 4096

// ReduceStream is Reduce writing dst with streaming stores.
func ReduceStream(t Type, op Op) Func {
	mustValid(t, op)
	plain := Reduce(t, op)
	if op == Avg {
		op = Sum
	}
	if forcePortable {
		return plain
	}
	if nt := archReduceStream(t, op); nt != nil {
		return streamed(nt, plain, t.Size())
	}
	return plain
}

// ReduceFinalStream is ReduceFinal writing dst with streaming stores.
func ReduceFinalStream(t Type, op Op, n int) Func {
	mustValid(t, op)
	if op != Avg || n == 1 {
		return ReduceStream(t, op)
	}
	plain := ReduceFinal(t, op, n)
	if forcePortable {
		return plain
	}
	if nt := archAvgStream(t, n); nt != nil {
		return streamed(nt, plain, t.Size())
	}
	return plain
}

// ReduceStream2 is Reduce writing dst with streaming stores and dst2, in
// the same pass, with ordinary ones.
func ReduceStream2(t Type, op Op) Func2 {
	mustValid(t, op)
	plain := Reduce(t, op)
	if op == Avg {
		op = Sum
	}
	if !forcePortable {
		if nt := archReduceStream2(t, op); nt != nil {
			return streamed2(nt, plain, t.Size())
		}
	}
	return copied(plain)
}

// ReduceFinalStream2 is ReduceFinal writing dst with streaming stores and
// dst2, in the same pass, with ordinary ones.
func ReduceFinalStream2(t Type, op Op, n int) Func2 {
	mustValid(t, op)
	if op != Avg || n == 1 {
		return ReduceStream2(t, op)
	}
	plain := ReduceFinal(t, op, n)
	if !forcePortable {
		if nt := archAvgStream2(t, n); nt != nil {
			return streamed2(nt, plain, t.Size())
		}
	}
	return copied(plain)
}

// copied makes a Func2 of a Func and a copy.
func copied(f Func) Func2 {
	return func(dst, dst2, a, b []byte) {
		f(dst, a, b)
		copy(dst2, dst)
	}
}

// CopyStream copies src to dst (as copy, without overlap) with streaming
// stores, and returns the number of bytes copied.
func CopyStream(dst, src []byte) int {
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	h := streamHead(dst, 1)
	if h < 0 || forcePortable || !hasAsm() {
		return copy(dst, src)
	}
	copy(dst[:h], src[:h])
	archCopyStream(dst[h:], src[h:])
	return n
}

// streamHead returns how many bytes of dst precede its first 64-byte
// boundary (streaming vector stores need addresses aligned to the
// register: 32 bytes for AVX2, 64 for AVX-512), or -1 if dst is too short
// to stream or cannot be aligned on an element boundary.
func streamHead(dst []byte, esize int) int {
	if len(dst) < minStream {
		return -1
	}
	h := int(-uintptrOf(dst) & 63)
	if h%esize != 0 {
		return -1
	}
	return h
}

// streamed runs nt on the aligned part of dst and plain on the head before it.
func streamed(nt, plain Func, esize int) Func {
	return func(dst, a, b []byte) {
		h := streamHead(dst, esize)
		if h < 0 {
			plain(dst, a, b)
			return
		}
		plain(dst[:h], a[:h], b[:h])
		nt(dst[h:], a[h:], b[h:])
	}
}

func streamed2(nt Func2, plain Func, esize int) Func2 {
	return func(dst, dst2, a, b []byte) {
		h := streamHead(dst, esize)
		if h < 0 {
			plain(dst, a, b)
			copy(dst2, dst)
			return
		}
		plain(dst[:h], a[:h], b[:h])
		copy(dst2[:h], dst[:h])
		nt(dst[h:], dst2[h:], a[h:], b[h:])
	}
}
