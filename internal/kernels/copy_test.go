package kernels

import (
	"bytes"
	"fmt"
	"testing"
)

// TestCopyIsCopy checks Copy against copy at lengths about the REP MOVSB
// threshold, at offsets that misalign both buffers, with dst shorter or
// longer than src, and with buffers that overlap either way (where Copy
// must fall back to copy's memmove).
func TestCopyIsCopy(t *testing.T) {
	pattern := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7) + seed
		}
		return b
	}
	for _, n := range []int{0, 1, 63, repMovsbMin - 1, repMovsbMin, repMovsbMin + 1, 64<<10 + 5, 1<<20 + 3} {
		for _, off := range [][2]int{{0, 0}, {1, 0}, {0, 3}, {13, 61}} {
			for _, extra := range [][2]int{{0, 0}, {-1, 0}, {0, -1}, {7, 0}} {
				dn, sn := max(n+extra[0], 0), max(n+extra[1], 0)
				src := pattern(sn+off[1], 1)[off[1]:]
				got := pattern(dn+off[0], 2)[off[0]:]
				want := bytes.Clone(got)
				if g, w := Copy(got, src), copy(want, src); g != w || !bytes.Equal(got, want) {
					t.Fatalf("n %d offsets %v lengths %d/%d: Copy returned %d (copy %d), equal %v", n, off, dn, sn, g, w, bytes.Equal(got, want))
				}
			}
		}
	}
	for _, shift := range []int{-1, 1, -100, 100, -(repMovsbMin + 1), repMovsbMin + 1} {
		t.Run(fmt.Sprint("overlap", shift), func(t *testing.T) {
			n := 3 * repMovsbMin
			base := pattern(n+2*(repMovsbMin+100), 3)
			want := bytes.Clone(base)
			s0 := repMovsbMin + 100
			d0 := s0 + shift
			Copy(base[d0:d0+n], base[s0:s0+n])
			copy(want[d0:d0+n], want[s0:s0+n])
			if !bytes.Equal(base, want) {
				t.Fatalf("overlapping by %d: Copy differs from copy", shift)
			}
		})
	}
}

func BenchmarkCopy(b *testing.B) {
	for _, n := range []int{64 << 10, 512 << 10, 2 << 20} {
		src, dst := make([]byte, n), make([]byte, n)
		b.Run(fmt.Sprintf("copy/%dK", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for range b.N {
				copy(dst, src)
			}
		})
		b.Run(fmt.Sprintf("Copy/%dK", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for range b.N {
				Copy(dst, src)
			}
		})
	}
}
