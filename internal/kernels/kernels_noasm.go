//go:build purego || !amd64

package kernels

// Without assembly every kernel is the portable Go one.

func archReduce(Type, Op) Func                 { return nil }
func archAvg(Type, int) Func                   { return nil }
func archPost(Type, int) func(dst, src []byte) { return nil }

// hasAsm reports whether this build and CPU have assembly kernels.
func hasAsm() bool { return false }

func archReduceStream(Type, Op) Func   { return nil }
func archAvgStream(Type, int) Func     { return nil }
func archReduceStream2(Type, Op) Func2 { return nil }
func archAvgStream2(Type, int) Func2   { return nil }
func archCopyStream(dst, src []byte)   { copy(dst, src) }

func archScaledSum(Type, float64) Func              { return nil }
func archScaledSumStream(Type, float64) Func        { return nil }
func archScaledSumStream2(Type, float64) Func2      { return nil }
func archScale(Type, float64) func(dst, src []byte) { return nil }

func archCopy(dst, src []byte) bool { return false }
