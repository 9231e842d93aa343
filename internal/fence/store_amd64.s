//go:build amd64 && !race

#include "textflag.h"

// func store(p *uint32, v uint32)
// A plain store: x86-TSO orders it after every earlier load and store,
// and the call keeps the compiler from moving memory accesses across it.
TEXT ·store(SB), NOSPLIT|NOFRAME, $0-12
	MOVQ p+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, (AX)
	RET

// func store64(p *uint64, v uint64)
TEXT ·store64(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ p+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET
