package device

import (
	"fmt"

	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// The argument rules of obligation 2 (and of Reduce's and Post's
// operands), which every implementation checks before it enqueues
// anything: one copy of them, so that the CUDA layer and the emulated
// device refuse exactly the same calls. The memory kinds and devices of
// obligation 1 are each implementation's to check. The errors name the
// call; implementations prefix their own name.

// CheckReduce checks a Reduce call's type, operator, divisor, lengths and
// overlaps.
func CheckReduce(dst, dst2, a, b memory.Buffer, t kernels.Type, op kernels.Op, div int) error {
	if !t.Valid() || !op.Valid() {
		return fmt.Errorf("Reduce of type %v, op %v: not a valid type and op", t, op)
	}
	if div < 0 || (div > 1 && op != kernels.Sum && op != kernels.Avg) {
		return fmt.Errorf("Reduce %v %v with div %d: want div >= 0, and div > 1 only with sum or avg", t, op, div)
	}
	n, es := dst.Len(), t.Size()
	has2 := dst2.Len() > 0
	if a.Len() != n || b.Len() != n || (has2 && dst2.Len() != n) {
		return fmt.Errorf("Reduce lengths differ: dst %d, dst2 %d, a %d, b %d bytes", n, dst2.Len(), a.Len(), b.Len())
	}
	if n%es != 0 {
		return fmt.Errorf("Reduce of %d bytes: not a multiple of the %d-byte %v", n, es, t)
	}
	if (dst.Overlaps(a) && !dst.Same(a)) || (dst.Overlaps(b) && !dst.Same(b)) {
		return fmt.Errorf("Reduce: dst overlaps a or b without being exactly it")
	}
	if has2 && (dst2.Overlaps(dst) || dst2.Overlaps(a) || dst2.Overlaps(b)) {
		return fmt.Errorf("Reduce: dst2 overlaps dst, a or b")
	}
	return nil
}

// CheckPost checks a Post call's type, divisor, lengths and overlap.
func CheckPost(dst, src memory.Buffer, t kernels.Type, div int) error {
	if !t.Valid() {
		return fmt.Errorf("Post of type %v: not a valid type", t)
	}
	if div < 1 {
		return fmt.Errorf("Post %v with div %d: want at least 1", t, div)
	}
	n, es := dst.Len(), t.Size()
	if src.Len() != n {
		return fmt.Errorf("Post lengths differ: dst %d, src %d bytes", n, src.Len())
	}
	if n%es != 0 {
		return fmt.Errorf("Post of %d bytes: not a multiple of the %d-byte %v", n, es, t)
	}
	if dst.Overlaps(src) && !dst.Same(src) {
		return fmt.Errorf("Post: dst overlaps src without being exactly it")
	}
	return nil
}

// CheckCopy checks a Copy call's lengths, overlaps, and that host memory
// is on one side at most.
func CheckCopy(dst, dst2, src memory.Buffer) error {
	n := src.Len()
	has2 := dst2.Len() > 0
	if dst.Len() != n || (has2 && dst2.Len() != n) {
		return fmt.Errorf("Copy lengths differ: dst %d, dst2 %d, src %d bytes", dst.Len(), dst2.Len(), n)
	}
	if src.Kind() == memory.Host && (dst.Kind() == memory.Host || (has2 && dst2.Kind() == memory.Host)) {
		return fmt.Errorf("Copy from host to host memory: one side must be the device's")
	}
	if dst.Overlaps(src) && !dst.Same(src) {
		return fmt.Errorf("Copy: dst overlaps src without being exactly it")
	}
	if has2 && (dst2.Overlaps(dst) || dst2.Overlaps(src)) {
		return fmt.Errorf("Copy: dst2 overlaps dst or src")
	}
	return nil
}
