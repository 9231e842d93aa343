package cpuid

// CPUID executes CPUID for leaf and subleaf sub and returns EAX, EBX, ECX
// and EDX. Under a hypervisor every call exits to it (microseconds):
// call it once, at start-up.
//
//go:noescape
func CPUID(leaf, sub uint32) (a, b, c, d uint32)

// Bit reports whether bit is set in register reg ('a', 'b', 'c' or 'd')
// of leaf's answer (subleaf 0); false where the CPU's basic or extended
// range (0x80000000 and up) does not reach leaf.
func Bit(leaf uint32, reg byte, bit uint) bool {
	if leaf >= 0x80000000 {
		if max, _, _, _ := CPUID(0x80000000, 0); max < leaf {
			return false
		}
	} else if max, _, _, _ := CPUID(0, 0); max < leaf {
		return false
	}
	a, b, c, d := CPUID(leaf, 0)
	var v uint32
	switch reg {
	case 'a':
		v = a
	case 'b':
		v = b
	case 'c':
		v = c
	case 'd':
		v = d
	}
	return v&(1<<bit) != 0
}
