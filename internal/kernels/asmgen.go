//go:build ignore

// asmgen writes zkernels_amd64.s and zkernels_amd64.go, the AVX2 kernels of
// package kernels and the AVX-512 forms of its streaming ones. Run it with
// `go generate ./internal/kernels/`.
//
// Every kernel has the same shape (a loop of U vectors per iteration, then a
// loop of one vector, then one element at a time), so it is cheaper to review
// this generator than 40 hand-written loops. The element formats (how a
// vector or one element is loaded and stored) and the operations (what is
// done to two registers) are described separately below and combined.
//
// Instruction semantics are from the Intel 64 and IA-32 Architectures
// Software Developer's Manual, Vol. 2 (order number 325383). Plan 9 syntax
// reverses Intel's operand order: "VOP src2, src1, dst" is Intel
// "VOP dst, src1, src2".
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"strings"
)

// elemFormat describes how elements of one type live in memory and in a vector
// register, where the arithmetic is done.
type elemFormat struct {
	name     string // Go-visible suffix: F32, F64, F16, BF16, I8, I32, I64
	size     int    // bytes per element in memory
	vecBytes int    // bytes of memory per vector register of work
	float    string // "PS"/"PD" for float formats (arithmetic suffix), "" for integers
	// bInMem: the second operand can be a memory operand of the vector
	// instruction (the memory layout is the register layout).
	bInMem bool
	// loadV/storeV move one vector of memory (vecBytes) between memory
	// and k Y registers (k = regs, 1 except for bfloat16); loadS/storeS
	// move one element into the lowest lane of an X register, zeroing the
	// other lanes so that they never hold slow denormals, and never touch
	// memory past the element. tmp are scratch registers the stores may
	// use (at least storeTemps of them).
	regs       int
	loadV      func(mem string, r []string) []string
	storeV     func(r []string, mem string, tmp []string) []string
	loadS      func(mem, reg string) []string
	storeS     func(reg, mem string, tmp []string) []string
	storeTemps int
	consts     []string // constant registers the format needs, set up by setup
	setup      []string
	// ntStore is the non-temporal store of one vector register (32-byte
	// aligned memory), for formats whose storeV is a plain move; "" for
	// the others, which get no streaming kernels.
	ntStore string
	// wideMove is the unaligned load and store of a 64-byte Z register,
	// for formats with AVX-512 streaming kernels ("" for none).
	wideMove string
	// roundTrip rounds the singles in register r to the format and widens
	// them back, exactly (nil: the arithmetic is in the format already),
	// with roundTemps scratch registers: what a product rounded in the
	// type is, for the scaled sum.
	roundTrip  func(r string, tmp []string) []string
	roundTemps int
}

func lines(s ...string) []string { return s }

func x(y string) string { return "X" + strings.TrimPrefix(strings.TrimPrefix(y, "Y"), "X") }

var (
	f32 = &elemFormat{
		name: "F32", size: 4, vecBytes: 32, float: "PS", bInMem: true,
		loadV:   func(m string, r []string) []string { return lines("VMOVUPS " + m + ", " + r[0]) },
		storeV:  func(r []string, m string, _ []string) []string { return lines("VMOVUPS " + r[0] + ", " + m) },
		loadS:   func(m, r string) []string { return lines("VMOVSS " + m + ", " + r) },
		storeS:  func(r, m string, _ []string) []string { return lines("VMOVSS " + r + ", " + m) },
		ntStore: "VMOVNTPS", wideMove: "VMOVUPS",
	}
	f64 = &elemFormat{
		name: "F64", size: 8, vecBytes: 32, float: "PD", bInMem: true,
		loadV:   func(m string, r []string) []string { return lines("VMOVUPD " + m + ", " + r[0]) },
		storeV:  func(r []string, m string, _ []string) []string { return lines("VMOVUPD " + r[0] + ", " + m) },
		loadS:   func(m, r string) []string { return lines("VMOVSD " + m + ", " + r) },
		storeS:  func(r, m string, _ []string) []string { return lines("VMOVSD " + r + ", " + m) },
		ntStore: "VMOVNTPD", wideMove: "VMOVUPD",
	}
	// f16 uses F16C: VCVTPH2PS widens 8 halves to 8 singles exactly;
	// VCVTPS2PH with imm8 = 0 narrows rounding to nearest even (imm8 bit 2
	// clear selects the rounding mode in imm8[1:0], 00 = nearest, instead
	// of MXCSR.RC; SDM Vol. 2, VCVTPS2PH). Overflow gives Inf and NaN a
	// quiet NaN with the top payload bits, like half.F32ToF16
	// (TestNaNBitsMatchHalf checks all 65536 inputs).
	f16 = &elemFormat{
		name: "F16", size: 2, vecBytes: 16, float: "PS",
		loadV:  func(m string, r []string) []string { return lines("VCVTPH2PS " + m + ", " + r[0]) },
		storeV: func(r []string, m string, _ []string) []string { return lines("VCVTPS2PH $0, " + r[0] + ", " + m) },
		loadS: func(m, r string) []string {
			return lines("MOVWLZX "+m+", R8", "VMOVD R8, "+r, "VCVTPH2PS "+r+", "+r)
		},
		storeS: func(r, m string, _ []string) []string {
			return lines("VCVTPS2PH $0, "+r+", "+r, "VMOVD "+r+", R8", "MOVW R8, "+m)
		},
		roundTrip: func(r string, _ []string) []string {
			return lines("VCVTPS2PH $0, "+r+", "+x(r), "VCVTPH2PS "+x(r)+", "+r)
		},
	}
	// bf16 is the top half of a binary32. A vector is 16 elements (32
	// bytes) split into two registers of 8 singles: the even elements
	// (shifted up 16 bits) and the odd ones (low 16 bits masked off, they
	// are already in place). This needs no cross-lane shuffles, which all
	// compete for one execution port, neither to widen nor to narrow.
	// Narrowing is the round-to-nearest-even addition of half.F32ToBF16
	// (add 0x7fff plus bit 16, keep the top half) with NaNs taking the
	// truncated pattern with the quiet bit (bit 22) forced on; the even
	// results are shifted down and the odd ones blended in word-wise.
	bf16 = &elemFormat{
		name: "BF16", size: 2, vecBytes: 32, float: "PS", regs: 2,
		consts: []string{"Y12", "Y13", "Y14"},
		setup: lines(
			"MOVL $0xffff0000, R8", "VMOVD R8, X12", "VPBROADCASTD X12, Y12",
			"MOVL $0x7fff, R8", "VMOVD R8, X13", "VPBROADCASTD X13, Y13",
			"MOVL $0x400000, R8", "VMOVD R8, X14", "VPBROADCASTD X14, Y14",
		),
		storeTemps: 2,
		loadV: func(m string, r []string) []string {
			return lines(
				"VMOVDQU "+m+", "+r[1],
				"VPSLLD $16, "+r[1]+", "+r[0],
				"VPAND Y12, "+r[1]+", "+r[1],
			)
		},
		storeV: func(r []string, m string, tmp []string) []string {
			l := bf16Round(r[0], tmp[0], tmp[1], "Y13", "Y14")
			l = append(l, "VPSRLD $16, "+tmp[0]+", "+tmp[0]) // even results to the low words
			l = append(l, bf16Round(r[1], r[0], tmp[1], "Y13", "Y14")...)
			return append(l,
				"VPBLENDW $0xaa, "+r[0]+", "+tmp[0]+", "+tmp[0], // odd results: the high words
				"VMOVDQU "+tmp[0]+", "+m)
		},
		loadS: func(m, r string) []string {
			return lines("MOVWLZX "+m+", R8", "SHLL $16, R8", "VMOVD R8, "+r)
		},
		storeS: func(r, m string, tmp []string) []string {
			l := bf16Round(r, tmp[0], tmp[1], "X13", "X14")
			return append(l, "VPSRLD $16, "+tmp[0]+", "+tmp[0], "VMOVD "+tmp[0]+", R8", "MOVW R8, "+m)
		},
		// Rounded (bf16Round leaves the pattern in the upper half of each
		// lane), then the lower half cleared: the bfloat16 value as a
		// single.
		roundTrip: func(r string, tmp []string) []string {
			mask, bias, quiet := "Y12", "Y13", "Y14"
			if strings.HasPrefix(r, "X") {
				mask, bias, quiet = "X12", "X13", "X14"
			}
			l := bf16Round(r, tmp[0], tmp[1], bias, quiet)
			return append(l, "VPAND "+mask+", "+tmp[0]+", "+r)
		},
		roundTemps: 2,
	}
	i8 = &elemFormat{
		name: "I8", size: 1, vecBytes: 32, bInMem: true,
		loadV:   func(m string, r []string) []string { return lines("VMOVDQU " + m + ", " + r[0]) },
		storeV:  func(r []string, m string, _ []string) []string { return lines("VMOVDQU " + r[0] + ", " + m) },
		loadS:   func(m, r string) []string { return lines("MOVBLZX "+m+", R8", "VMOVD R8, "+r) },
		storeS:  func(r, m string, _ []string) []string { return lines("VMOVD "+r+", R8", "MOVB R8, "+m) },
		ntStore: "VMOVNTDQ", wideMove: "VMOVDQU64",
	}
	i32 = &elemFormat{
		name: "I32", size: 4, vecBytes: 32, bInMem: true,
		loadV:   func(m string, r []string) []string { return lines("VMOVDQU " + m + ", " + r[0]) },
		storeV:  func(r []string, m string, _ []string) []string { return lines("VMOVDQU " + r[0] + ", " + m) },
		loadS:   func(m, r string) []string { return lines("VMOVD " + m + ", " + r) },
		storeS:  func(r, m string, _ []string) []string { return lines("VMOVD " + r + ", " + m) },
		ntStore: "VMOVNTDQ", wideMove: "VMOVDQU64",
	}
	i64 = &elemFormat{
		name: "I64", size: 8, vecBytes: 32, bInMem: true,
		loadV:   func(m string, r []string) []string { return lines("VMOVDQU " + m + ", " + r[0]) },
		storeV:  func(r []string, m string, _ []string) []string { return lines("VMOVDQU " + r[0] + ", " + m) },
		loadS:   func(m, r string) []string { return lines("VMOVQ " + m + ", " + r) },
		storeS:  func(r, m string, _ []string) []string { return lines("VMOVQ " + r + ", " + m) },
		ntStore: "VMOVNTDQ", wideMove: "VMOVDQU64",
	}
)

// bf16Round leaves in the upper 16 bits of each 32-bit lane of t the
// bfloat16 pattern of the single in the same lane of r (the lower bits are
// garbage). r and m are clobbered.
func bf16Round(r, t, m, bias, quiet string) []string {
	return lines(
		"VPSLLD $15, "+r+", "+t,             // bit 16 (lowest kept bit) to bit 31
		"VPSRLD $31, "+t+", "+t,             // ... and down to bit 0
		"VPADDD "+bias+", "+t+", "+t,        // 0x7fff + lsb
		"VPADDD "+r+", "+t+", "+t,           // rounded, carries into exponent/Inf
		"VCMPPS $3, "+r+", "+r+", "+m,       // m = r unordered with itself: NaN
		"VPOR "+quiet+", "+r+", "+r,         // quiet NaN
		"VBLENDVPS "+m+", "+r+", "+t+", "+t, // t = m ? r : t
	)
}

// operation combines register a with operand b (a register or, when the
// format allows and bReg is false, a memory operand) into a.
type operation struct {
	name   string
	temps  int      // scratch registers
	bReg   bool     // b must be a register (it is used twice or clobbered)
	consts []string // constant registers needed (set up by setup)
	setup  []string
	emit   func(f *elemFormat, a, b string, tmp []string, w string) []string
	// wide is the AVX-512 form where it differs (w is "Z"); nil when
	// emit serves, or when the operation has no AVX-512 kernel (noWide).
	wide   func(f *elemFormat, a, b string) []string
	noWide bool
	// scalar names the kernel's last argument, a float broadcast into
	// register 15 by the prologue: "n" (the divisor of avg and post) or
	// "s" (the scale of msum and mul); "" for none.
	scalar string
}

func simple(name, instr string) *operation {
	return &operation{name: name, emit: func(_ *elemFormat, a, b string, _ []string, _ string) []string {
		return lines(instr + " " + b + ", " + a + ", " + a)
	}}
}

func floatArith(name, base string) *operation {
	return &operation{name: name, emit: func(f *elemFormat, a, b string, _ []string, _ string) []string {
		return lines("V" + base + f.float + " " + b + ", " + a + ", " + a)
	}}
}

// floatMinMax propagates NaN from either side. When either input is NaN,
// VMINPS/VMAXPS write the second source operand (Intel order; b here), NaN
// or not (SDM Vol. 2, MINPS/MAXPS, Operation: MIN(SRC1, SRC2) returns SRC2
// unless SRC1 < SRC2), so b's NaNs come out already; a's are restored with
// a blend under an unordered self-compare of a (VCMPPS predicate 3,
// UNORD_Q).
//
// AVX-512 has no VBLENDVPS on Z registers; there a mask of a's ordered
// lanes (VCMPPS predicate 7, ORD_Q) limits the min/max to them, and a's
// NaN lanes keep their value.
func floatMinMax(name, base string) *operation {
	return &operation{name: name, temps: 2, emit: func(f *elemFormat, a, b string, t []string, _ string) []string {
		p := f.float
		return lines(
			"V"+base+p+" "+b+", "+a+", "+t[0],
			"VCMP"+p+" $3, "+a+", "+a+", "+t[1],
			"VBLENDV"+p+" "+t[1]+", "+a+", "+t[0]+", "+a,
		)
	}, wide: func(f *elemFormat, a, b string) []string {
		p := f.float
		return lines(
			"VCMP"+p+" $7, "+a+", "+a+", K1",
			"V"+base+p+" "+b+", "+a+", K1, "+a,
		)
	}}
}

// avgFinal adds and divides by n (broadcast into Y15 by the prologue).
func avgFinal() *operation {
	return &operation{name: "avg", scalar: "n", consts: []string{"Y15"}, emit: func(f *elemFormat, a, b string, _ []string, w string) []string {
		return lines(
			"VADD"+f.float+" "+b+", "+a+", "+a,
			"VDIV"+f.float+" "+w+"15, "+a+", "+a,
		)
	}}
}

// postDiv is the unary a /= n of Post.
func postDiv() *operation {
	return &operation{name: "post", scalar: "n", consts: []string{"Y15"}, emit: func(f *elemFormat, a, _ string, _ []string, w string) []string {
		return lines("VDIV" + f.float + " " + w + "15, " + a + ", " + a)
	}}
}

// scaledSum is a pre-multiplied sum's step, a + b*s, with b (this rank's
// input) scaled by s (broadcast into Y15) first and the product rounded
// to the format (f.roundTrip, for the 16-bit floats): separate
// instructions, each rounded, never a fused multiply-add, so that the
// result is what scaling the input first and summing it then gives, on
// every rank alike. b is clobbered.
func scaledSum(f *elemFormat) *operation {
	return &operation{name: "msum", scalar: "s", bReg: true, temps: f.roundTemps, consts: []string{"Y15"}, emit: func(f *elemFormat, a, b string, t []string, w string) []string {
		l := lines("VMUL" + f.float + " " + w + "15, " + b + ", " + b)
		if f.roundTrip != nil {
			l = append(l, f.roundTrip(b, t)...)
		}
		return append(l, "VADD"+f.float+" "+b+", "+a+", "+a)
	}}
}

// scaleMul is the unary a *= s of Scale.
func scaleMul() *operation {
	return &operation{name: "mul", scalar: "s", consts: []string{"Y15"}, emit: func(f *elemFormat, a, _ string, _ []string, w string) []string {
		return lines("VMUL" + f.float + " " + w + "15, " + a + ", " + a)
	}}
}

// copyOp is the unary identity: with a streaming store, a copy that
// bypasses the caches.
var copyOp = &operation{name: "copy", emit: func(*elemFormat, string, string, []string, string) []string { return nil }}

// mul64 is the low 64 bits of a 64x64 product (AVX2 has no VPMULLQ): with
// a = ah*2^32 + al, b = bh*2^32 + bl, a*b mod 2^64 = al*bl + (ah*bl + al*bh)*2^32.
// AVX-512DQ has VPMULLQ.
var mul64 = &operation{name: "prod", temps: 2, bReg: true, wide: wideSimple("VPMULLQ"), emit: func(_ *elemFormat, a, b string, t []string, _ string) []string {
	return lines(
		"VPMULUDQ "+b+", "+a+", "+t[0], // al*bl
		"VPSRLQ $32, "+a+", "+t[1],
		"VPMULUDQ "+b+", "+t[1]+", "+t[1], // ah*bl
		"VPSRLQ $32, "+b+", "+b,
		"VPMULUDQ "+a+", "+b+", "+b, // al*bh
		"VPADDQ "+b+", "+t[1]+", "+t[1],
		"VPSLLQ $32, "+t[1]+", "+t[1],
		"VPADDQ "+t[1]+", "+t[0]+", "+a,
	)
}}

// minMax64 selects with a signed 64-bit compare (VPCMPGTQ). Unsigned
// compares flip the sign bit of both sides first (Y12 holds 1<<63), which
// maps unsigned order onto signed order.
// AVX-512F has the 64-bit minimum and maximum (VPMINSQ and its kin).
func minMax64(name string, isMax, unsigned bool) *operation {
	instr := map[[2]bool]string{{false, false}: "VPMINSQ", {false, true}: "VPMINUQ", {true, false}: "VPMAXSQ", {true, true}: "VPMAXUQ"}[[2]bool{isMax, unsigned}]
	op := &operation{name: name, temps: 2, bReg: true, wide: wideSimple(instr)}
	if unsigned {
		op.consts = []string{"Y12"}
		op.setup = lines("MOVQ $0x8000000000000000, R8", "VMOVQ R8, X12", "VPBROADCASTQ X12, Y12")
	}
	op.emit = func(_ *elemFormat, a, b string, t []string, w string) []string {
		var l []string
		ca, cb := a, b
		if unsigned {
			l = append(l, "VPXOR "+w+"12, "+a+", "+t[0], "VPXOR "+w+"12, "+b+", "+t[1])
			ca, cb = t[0], t[1]
		}
		l = append(l, "VPCMPGTQ "+cb+", "+ca+", "+t[1]) // t1 = a > b
		if isMax {
			l = append(l, "VPBLENDVB "+t[1]+", "+a+", "+b+", "+a) // a > b ? a : b
		} else {
			l = append(l, "VPBLENDVB "+t[1]+", "+b+", "+a+", "+a) // a > b ? b : a
		}
		return l
	}
	return op
}

func wideSimple(instr string) func(*elemFormat, string, string) []string {
	return func(_ *elemFormat, a, b string) []string { return lines(instr + " " + b + ", " + a + ", " + a) }
}

type kernel struct {
	f     *elemFormat
	op    *operation
	unary bool // Post: dst = op(src)
	// nt: whole vectors go to dst with non-temporal stores, which bypass
	// the caches (dst must be 32-byte aligned; the Go wrappers see to it),
	// and the kernel ends with SFENCE. dual: the result also goes to a
	// second destination, dst2, with ordinary stores.
	nt, dual bool
	// wide: an AVX-512 streaming kernel on Z registers. It runs only the
	// unrolled loop over whole blocks of wideBlock bytes (dst 64-byte
	// aligned); the Go side hands the rest to the AVX2 kernel.
	wide bool
}

// wideBlock is what a wide kernel's loop takes per iteration: four Z
// registers. kernels_amd64.go has the same constant.
const wideBlock = 256

func (k *kernel) fname() string {
	n := k.op.name + k.f.name
	if k.nt {
		n += "NT"
	}
	if k.dual {
		n += "2"
	}
	if k.wide {
		return n + "AVX512"
	}
	return n + "AVX2"
}

func (k *kernel) nType() string {
	if k.f.float == "PD" {
		return "float64"
	}
	return "float32"
}

// header returns a kernel's Go arguments and its frame size, with the
// frame offsets of its scalar (operation.scalar, if hasN) and of a.
// Every slice takes 24 bytes of the frame: dst [, dst2], a [, b] (or
// src) [, n or s].
func (k *kernel) header() (args, frame string, nOff, in int, hasN bool) {
	in = 24
	switch {
	case k.unary:
		args, nOff = "dst, src []byte", 48
	case k.dual:
		args, nOff, in = "dst, dst2, a, b []byte", 96, 48
	default:
		args, nOff = "dst, a, b []byte", 72
	}
	frame = fmt.Sprint(nOff)
	hasN = k.op.scalar != ""
	if hasN {
		args += ", " + k.op.scalar + " " + k.nType()
		if k.nType() == "float64" {
			frame = fmt.Sprint(nOff + 8)
		} else {
			frame = fmt.Sprint(nOff + 4)
		}
	}
	return args, frame, nOff, in, hasN
}

// broadcastN fills reg with the kernel's scalar (at frame offset nOff):
// the divisor of avg and post, the scale of msum and mul.
func (g *gen) broadcastN(k *kernel, nOff int, reg string) {
	if k.nType() == "float64" {
		g.p("\tVBROADCASTSD %s+%d(FP), %s", k.op.scalar, nOff, reg)
	} else {
		g.p("\tVBROADCASTSS %s+%d(FP), %s", k.op.scalar, nOff, reg)
	}
}

type gen struct {
	s  bytes.Buffer
	gd bytes.Buffer
}

func (g *gen) p(format string, a ...any) { fmt.Fprintf(&g.s, format+"\n", a...) }

func (g *gen) kernel(k *kernel) {
	if k.wide {
		g.wideKernel(k)
		return
	}
	f, op := k.f, k.op
	consts := append(append([]string{}, f.consts...), op.consts...)
	avail := 16 - len(consts)
	kr := f.regs
	if kr == 0 {
		kr = 1
	}
	// Per vector: kr registers for a, kr for b, the operation's scratch
	// registers; the store may reuse b's registers once the operation is
	// done.
	temps := op.temps
	if st := f.storeTemps - kr; st > temps {
		temps = st
	}
	per := 2*kr + temps
	unroll := 4
	for unroll*per > avail {
		unroll /= 2
	}
	var free []string
	used := map[string]bool{}
	for _, c := range consts {
		used[c] = true
	}
	for i := 0; i < 16; i++ {
		r := fmt.Sprintf("Y%d", i)
		if !used[r] {
			free = append(free, r)
		}
	}

	name := k.fname()
	args, frame, nOff, in, hasN := k.header()
	fmt.Fprintf(&g.gd, "//go:noescape\nfunc %s(%s)\n\n", name, args)

	vb := f.vecBytes
	g.p("// func %s(%s)", name, args)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-%s", name, frame)
	g.p("\tMOVQ dst_base+0(FP), DI")
	g.p("\tMOVQ dst_len+8(FP), CX")
	// The caller guarantees equal lengths, a multiple of the element
	// size; if it does not, process only the whole elements common to all
	// slices rather than touch memory outside them.
	if k.unary {
		g.p("\tMOVQ src_base+24(FP), SI")
		g.p("\tMOVQ src_len+32(FP), R9")
		g.p("\tCMPQ R9, CX")
		g.p("\tCMOVQLT R9, CX")
	} else {
		if k.dual {
			g.p("\tMOVQ dst2_base+24(FP), R10")
			g.p("\tMOVQ dst2_len+32(FP), R9")
			g.p("\tCMPQ R9, CX")
			g.p("\tCMOVQLT R9, CX")
		}
		g.p("\tMOVQ a_base+%d(FP), SI", in)
		g.p("\tMOVQ b_base+%d(FP), DX", in+24)
		g.p("\tMOVQ a_len+%d(FP), R9", in+8)
		g.p("\tCMPQ R9, CX")
		g.p("\tCMOVQLT R9, CX")
		g.p("\tMOVQ b_len+%d(FP), R9", in+32)
		g.p("\tCMPQ R9, CX")
		g.p("\tCMOVQLT R9, CX")
	}
	if f.size > 1 {
		g.p("\tANDQ $-%d, CX", f.size)
	}
	for _, l := range append(append([]string{}, f.setup...), op.setup...) {
		g.p("\t%s", l)
	}
	if hasN {
		g.broadcastN(k, nOff, "Y15")
	}
	g.p("\tXORQ AX, AX")

	body := func(n int, scalar bool) {
		for i := 0; i < n; i++ {
			regs := free[i*per : (i+1)*per]
			a, b := regs[:kr], regs[kr:2*kr]
			t := append([]string{}, regs[2*kr:]...)
			off := i * vb
			ma := fmt.Sprintf("%d(SI)(AX*1)", off)
			mb := fmt.Sprintf("%d(DX)(AX*1)", off)
			md := fmt.Sprintf("%d(DI)(AX*1)", off)
			md2 := fmt.Sprintf("%d(R10)(AX*1)", off)
			var l []string
			if scalar {
				// One element in the lowest lane of X registers; every
				// register but a is scratch for the store.
				xa, xb := x(a[0]), x(b[0])
				var xt, rest []string
				for _, r := range t {
					xt = append(xt, x(r))
				}
				for _, r := range append(append([]string{}, a[1:]...), b[1:]...) {
					rest = append(rest, x(r))
				}
				l = append(l, f.loadS(ma, xa)...)
				if !k.unary {
					l = append(l, f.loadS(mb, xb)...)
				}
				l = append(l, op.emit(f, xa, xb, xt, "X")...)
				st := append(append([]string{xb}, xt...), rest...)
				l = append(l, f.storeS(xa, md, st)...)
				if k.dual {
					l = append(l, f.storeS(xa, md2, st)...)
				}
			} else {
				l = append(l, f.loadV(ma, a)...)
				bop := b
				if !k.unary {
					if kr == 1 && f.bInMem && !op.bReg {
						bop = []string{mb} // memory operand, no load
					} else {
						l = append(l, f.loadV(mb, b)...)
					}
				}
				for j := range kr {
					l = append(l, op.emit(f, a[j], bop[j], t, "Y")...)
				}
				st := append(append([]string{}, b...), t...)
				if bop[0] == mb {
					st = t
				}
				if k.nt {
					l = append(l, f.ntStore+" "+a[0]+", "+md)
				} else {
					l = append(l, f.storeV(a, md, st)...)
				}
				if k.dual {
					l = append(l, f.storeV(a, md2, st)...)
				}
			}
			for _, s := range l {
				g.p("\t%s", s)
			}
		}
	}
	block := unroll * vb
	g.p("\tMOVQ CX, BX")
	g.p("\tANDQ $-%d, BX", block)
	g.p("\tJZ vec1")
	g.p("loop%d:", unroll)
	body(unroll, false)
	g.p("\tADDQ $%d, AX", block)
	g.p("\tCMPQ AX, BX")
	g.p("\tJB loop%d", unroll)
	g.p("vec1:")
	g.p("\tMOVQ CX, BX")
	g.p("\tANDQ $-%d, BX", vb)
	g.p("\tCMPQ AX, BX")
	g.p("\tJAE tail")
	g.p("loop1:")
	body(1, false)
	g.p("\tADDQ $%d, AX", vb)
	g.p("\tCMPQ AX, BX")
	g.p("\tJB loop1")
	g.p("tail:")
	g.p("\tCMPQ AX, CX")
	g.p("\tJAE done")
	g.p("loopS:")
	body(1, true)
	g.p("\tADDQ $%d, AX", f.size)
	g.p("\tCMPQ AX, CX")
	g.p("\tJB loopS")
	g.p("done:")
	if k.nt {
		// Streaming stores are weakly ordered: make them visible before
		// anything the caller stores next (a flag publishing the data).
		g.p("\tSFENCE")
	}
	g.p("\tVZEROUPPER")
	g.p("\tRET")
	g.p("")
}

// wideKernel writes an AVX-512 streaming kernel: four Z registers of a
// (and b from memory) per iteration, the result to dst with a streaming
// store (and, dual, to dst2 with an ordinary one), over the whole blocks
// of wideBlock bytes only.
func (g *gen) wideKernel(k *kernel) {
	f, op := k.f, k.op
	name := k.fname()
	args, frame, nOff, in, hasN := k.header()
	fmt.Fprintf(&g.gd, "//go:noescape\nfunc %s(%s)\n\n", name, args)
	g.p("// func %s(%s)", name, args)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-%s", name, frame)
	g.p("\tMOVQ dst_base+0(FP), DI")
	g.p("\tMOVQ dst_len+8(FP), CX")
	if k.unary {
		g.p("\tMOVQ src_base+24(FP), SI")
	} else {
		if k.dual {
			g.p("\tMOVQ dst2_base+24(FP), R10")
		}
		g.p("\tMOVQ a_base+%d(FP), SI", in)
		g.p("\tMOVQ b_base+%d(FP), DX", in+24)
	}
	// The Go side passes equal lengths, a multiple of wideBlock.
	g.p("\tANDQ $-%d, CX", wideBlock)
	g.p("\tJZ done")
	if hasN {
		g.broadcastN(k, nOff, "Z15")
	}
	g.p("\tXORQ AX, AX")
	g.p("loop:")
	for i := 0; i < wideBlock/64; i++ {
		a := fmt.Sprintf("Z%d", i)
		off := i * 64
		var l []string
		l = append(l, fmt.Sprintf("%s %d(SI)(AX*1), %s", f.wideMove, off, a))
		b := fmt.Sprintf("%d(DX)(AX*1)", off)
		if !k.unary {
			if op.bReg {
				bz := fmt.Sprintf("Z%d", i+4)
				l = append(l, fmt.Sprintf("%s %s, %s", f.wideMove, b, bz))
				b = bz
			}
			if op.wide != nil {
				l = append(l, op.wide(f, a, b)...)
			} else {
				l = append(l, op.emit(f, a, b, nil, "Z")...)
			}
		}
		l = append(l, fmt.Sprintf("%s %s, %d(DI)(AX*1)", f.ntStore, a, off))
		if k.dual {
			l = append(l, fmt.Sprintf("%s %s, %d(R10)(AX*1)", f.wideMove, a, off))
		}
		for _, s := range l {
			g.p("\t%s", s)
		}
	}
	g.p("\tADDQ $%d, AX", wideBlock)
	g.p("\tCMPQ AX, CX")
	g.p("\tJB loop")
	g.p("\tSFENCE")
	g.p("\tVZEROUPPER")
	g.p("done:")
	g.p("\tRET")
	g.p("")
}

func main() {
	outS := flag.String("s", "zkernels_amd64.s", "assembly output")
	outGo := flag.String("go", "zkernels_amd64.go", "Go declarations output")
	flag.Parse()

	var ks []*kernel
	for _, f := range []*elemFormat{f32, f64, f16, bf16} {
		ks = append(ks,
			&kernel{f: f, op: floatArith("sum", "ADD")},
			&kernel{f: f, op: floatArith("prod", "MUL")},
			&kernel{f: f, op: floatMinMax("min", "MIN")},
			&kernel{f: f, op: floatMinMax("max", "MAX")},
			&kernel{f: f, op: avgFinal()},
			&kernel{f: f, op: postDiv(), unary: true},
			&kernel{f: f, op: scaledSum(f)},
			&kernel{f: f, op: scaleMul(), unary: true},
		)
	}
	ks = append(ks,
		&kernel{f: i8, op: simple("sum", "VPADDB")},
		&kernel{f: i8, op: simple("minS", "VPMINSB")},
		&kernel{f: i8, op: simple("minU", "VPMINUB")},
		&kernel{f: i8, op: simple("maxS", "VPMAXSB")},
		&kernel{f: i8, op: simple("maxU", "VPMAXUB")},
		&kernel{f: i32, op: simple("sum", "VPADDD")},
		&kernel{f: i32, op: simple("prod", "VPMULLD")},
		&kernel{f: i32, op: simple("minS", "VPMINSD")},
		&kernel{f: i32, op: simple("minU", "VPMINUD")},
		&kernel{f: i32, op: simple("maxS", "VPMAXSD")},
		&kernel{f: i32, op: simple("maxU", "VPMAXUD")},
		&kernel{f: i64, op: simple("sum", "VPADDQ")},
		&kernel{f: i64, op: mul64},
		&kernel{f: i64, op: minMax64("minS", false, false)},
		&kernel{f: i64, op: minMax64("minU", false, true)},
		&kernel{f: i64, op: minMax64("maxS", true, false)},
		&kernel{f: i64, op: minMax64("maxU", true, true)},
	)

	// Streaming variants, for destinations too large to keep in the
	// caches: every reduction of the formats with a streaming store,
	// alone (nt) and with a cached second destination (nt, dual: the
	// engine's reduce-and-forward, whose forwarded copy goes to the
	// next rank through the caches), and a streaming copy.
	var streams []*kernel
	for _, k := range ks {
		if k.f.ntStore == "" || k.unary {
			continue
		}
		streams = append(streams, &kernel{f: k.f, op: k.op, nt: true}, &kernel{f: k.f, op: k.op, nt: true, dual: true})
	}
	// AVX-512 forms of the streaming reductions: at 256 MiB a 2-rank
	// all-reduce ran 16% faster with them (docs/performance.md). A wide
	// streaming copy made no difference there, so there is none. Every
	// such kernel needs one Z register per vector of a (b stays in
	// memory or takes one more), so four fit per iteration.
	var wides []*kernel
	for _, k := range streams {
		if k.f.wideMove != "" && !k.op.noWide {
			wides = append(wides, &kernel{f: k.f, op: k.op, nt: true, dual: k.dual, wide: true})
		}
	}
	ks = append(ks, streams...)
	ks = append(ks, &kernel{f: i8, op: copyOp, unary: true, nt: true})
	ks = append(ks, wides...)

	var g gen
	g.p("// Code generated by asmgen.go; DO NOT EDIT.")
	g.p("")
	g.p("//go:build !purego")
	g.p("")
	g.p("#include \"textflag.h\"")
	g.p("")
	fmt.Fprintf(&g.gd, "// Code generated by asmgen.go; DO NOT EDIT.\n\n//go:build !purego\n\npackage kernels\n\n")
	for _, k := range ks {
		g.kernel(k)
	}
	src, err := format.Source(g.gd.Bytes())
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*outS, g.s.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*outGo, src, 0o644); err != nil {
		log.Fatal(err)
	}
}
