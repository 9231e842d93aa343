package algorithms

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden step tables in testdata/")

// TestSpansPartition checks that, for any count, piece count and minor
// count, the blocks of all pieces tile the buffer exactly once.
func TestSpansPartition(t *testing.T) {
	for _, majors := range []int{1, 3} {
		for k := 0; k <= 23; k++ {
			for pieces := 1; pieces <= 5; pieces++ {
				for minor := 1; minor <= 6; minor++ {
					l := Layout{Majors: majors, K: k, InHi: majors, OutHi: majors}
					seen := make([]int, majors*k)
					var spans []Span
					for p := 0; p < pieces; p++ {
						for b := 0; b < majors*minor; b++ {
							spans = l.Spans(spans[:0], Blocks(Input, b, 1), minor, p, pieces)
							for _, sp := range spans {
								require.Positive(t, sp.Len)
								for i := sp.Off; i < sp.Off+sp.Len; i++ {
									seen[i]++
								}
							}
						}
					}
					for i, c := range seen {
						require.Equal(t, 1, c, "k=%d pieces=%d minor=%d majors=%d: element %d covered %d times", k, pieces, minor, majors, i, c)
					}
					// A multi-block ref yields the same elements, merged.
					if majors == 1 && minor > 1 {
						spans = l.Spans(spans[:0], Blocks(Input, 0, minor), minor, 0, pieces)
						lo, hi := l.PieceRange(0, pieces)
						if hi > lo {
							require.Equal(t, []Span{{Off: lo, Len: hi - lo}}, spans)
						} else {
							require.Empty(t, spans)
						}
					}
				}
			}
		}
	}
}

// TestSpansUnevenBlocks: with per-block offsets (AllToAllv), every piece
// of every block lies inside that block, the pieces of a block tile it
// once, and a block of the same length on the other side (the peer's,
// with other offsets) is cut into pieces and minor blocks of the same
// lengths: sender and receiver see the same stream of slices.
func TestSpansUnevenBlocks(t *testing.T) {
	lens := [][]int{{0, 5, 23, 1}, {7, 0, 0, 19}, {3, 3, 3, 3}}
	for _, in := range lens {
		for _, out := range lens {
			offsOf := func(ls []int) []int {
				offs := []int{0}
				for _, k := range ls {
					offs = append(offs, offs[len(offs)-1]+k)
				}
				return offs
			}
			l := NewLayout(CollAllToAll, 4, 1, 0, 23)
			l.InOffs, l.OutOffs = offsOf(in), offsOf(out)
			require.Equal(t, l.InOffs[4], l.InLen())
			require.Equal(t, l.OutOffs[4], l.OutLen())
			for pieces := 1; pieces <= 4; pieces++ {
				for minor := 1; minor <= 3; minor++ {
					for _, side := range []struct {
						buf  Buf
						offs []int
						ls   []int
					}{{Input, l.InOffs, in}, {Output, l.OutOffs, out}} {
						seen := make([]int, side.offs[4])
						for m := range 4 {
							for p := range pieces {
								for j := range minor {
									spans := l.Spans(nil, Blocks(side.buf, m*minor+j, 1), minor, p, pieces)
									// The same length as a uniform block of this one's length.
									u := Layout{Majors: 1, K: side.ls[m], InHi: 1, OutHi: 1}
									require.Equal(t, SpansLen(u.Spans(nil, Blocks(Input, j, 1), minor, p, pieces)), SpansLen(spans))
									for _, sp := range spans {
										require.GreaterOrEqual(t, sp.Off, side.offs[m])
										require.LessOrEqual(t, sp.Off+sp.Len, side.offs[m+1], "inside block %d", m)
										for i := sp.Off; i < sp.Off+sp.Len; i++ {
											seen[i]++
										}
									}
								}
							}
						}
						for i, c := range seen {
							require.Equal(t, 1, c, "element %d of %v (lengths %v, %d pieces, minor %d)", i, side.buf, side.ls, pieces, minor)
						}
					}
				}
			}
		}
	}
}

func TestSpansOffsetsPerBuffer(t *testing.T) {
	// Reduce-scatter on rank 2 of 4 with 5 elements per rank: Output holds
	// only block 2, at offset 0.
	l := NewLayout(CollReduceScatter, 4, 2, 0, 5)
	require.Equal(t, 20, l.InLen())
	require.Equal(t, 5, l.OutLen())
	require.Equal(t, []Span{{Off: 0, Len: 5}}, l.Spans(nil, Blocks(Output, 2, 1), 1, 0, 1))
	require.Equal(t, []Span{{Off: 10, Len: 5}}, l.Spans(nil, Blocks(Input, 2, 1), 1, 0, 1))
	require.False(t, l.Covers(Blocks(Output, 1, 1), 1))
	require.Panics(t, func() { l.Spans(nil, Blocks(Output, 3, 1), 1, 0, 1) })
	// Two pieces of a two-major ref are not contiguous.
	l = NewLayout(CollAllGather, 2, 0, 0, 4)
	require.Equal(t, []Span{{Off: 0, Len: 2}, {Off: 4, Len: 2}}, l.Spans(nil, Blocks(Output, 0, 2), 1, 0, 2))
}

func TestSlicer(t *testing.T) {
	s := NewSlicer([]Span{{Off: 0, Len: 5}, {Off: 10, Len: 2}}, 2)
	var got [][2]int
	for {
		off, n, ok := s.Next()
		if !ok {
			break
		}
		got = append(got, [2]int{off, n})
	}
	require.Equal(t, [][2]int{{0, 2}, {2, 2}, {4, 1}, {10, 2}}, got)
	require.True(t, s.Done())
}

func TestMinPiecesKeepsMessagesInHalfTheSlots(t *testing.T) {
	for _, p := range []Params{
		{Coll: CollAllReduce, Algo: Ring, NRanks: 4},
		{Coll: CollAllReduce, Algo: Rabenseifner, NRanks: 8},
		{Coll: CollAllReduce, Algo: Tree, NRanks: 5},
		{Coll: CollBroadcast, Algo: Ring, NRanks: 3},
	} {
		s, err := Build(p)
		require.NoError(t, err)
		for _, k := range []int{0, 1, 7, 100, 4096, 1 << 20} {
			for _, slots := range []int{2, 3, 8} {
				for _, slice := range []int{1, 16, 1000} {
					pieces := MinPieces(s, k, slots, slice)
					if pieces > 2000 {
						continue // correct too, but slow to walk here
					}
					l := NewLayout(p.Coll, p.NRanks, 0, 0, k)
					for piece := 0; piece < pieces; piece++ {
						for _, st := range s.Steps {
							if !st.Kind.Sends() {
								continue
							}
							ref := st.Src
							if st.Kind.Exchange() {
								ref = st.Tx
							} else if ref.Buf == NoBuf {
								ref = st.Dst
							}
							n := SpansLen(l.Spans(nil, ref, s.Minor, piece, pieces))
							require.LessOrEqual(t, n, slots/2*slice, "%v k=%d slots=%d slice=%d pieces=%d", p, k, slots, slice, pieces)
						}
					}
				}
			}
		}
	}
}

// TestMsgBlocksIsGlobal checks that every rank's schedule carries the
// largest message of any rank, so that all ranks cut the same pieces.
func TestMsgBlocksIsGlobal(t *testing.T) {
	for _, ca := range []struct {
		c Collective
		a Algorithm
	}{{CollAllReduce, Ring}, {CollAllReduce, Tree}, {CollAllReduce, RecDoubling}, {CollAllReduce, Rabenseifner},
		{CollReduceScatter, Ring}, {CollAllGather, Ring}, {CollBroadcast, Ring}, {CollReduce, Ring}, {CollAllToAll, Pairwise},
		{CollReduceScatter, OneShot}, {CollAllGather, OneShot}, {CollAllGather, RecDoubling}, {CollReduce, OneShot}} {
		for n := 1; n <= 64; n++ {
			scheds, err := BuildAll(Params{Coll: ca.c, Algo: ca.a, NRanks: n, Root: n / 2})
			require.NoError(t, err)
			most := 0
			for _, s := range scheds {
				most = max(most, s.MaxMessageBlocks())
			}
			for _, s := range scheds {
				require.Equal(t, max(most, 1), s.MsgBlocks, "%v/%v n=%d rank %d", ca.c, ca.a, n, s.Rank)
			}
		}
	}
}

// TestDoubleBinaryTree checks the two trees: each spans all ranks with a
// single root, parent and child links agree, no node has more than two
// children, and (for even rank counts) no rank is an inner node of both.
func TestDoubleBinaryTree(t *testing.T) {
	for n := 1; n <= 130; n++ {
		inner := make([]int, n)
		for tree := 0; tree < 2; tree++ {
			parent := make([]int, n)
			roots := 0
			for r := 0; r < n; r++ {
				p, cs := DoubleBinaryTree(n, r, tree)
				parent[r] = p
				if p < 0 {
					roots++
				}
				require.LessOrEqual(t, len(cs), 2, "n=%d tree=%d rank %d", n, tree, r)
				if len(cs) > 0 {
					inner[r]++
				}
				for _, c := range cs {
					cp, _ := DoubleBinaryTree(n, c, tree)
					require.Equal(t, r, cp, "n=%d tree=%d: child %d of %d names parent %d", n, tree, c, r, cp)
				}
			}
			require.Equal(t, 1, roots, "n=%d tree=%d", n, tree)
			for r := 0; r < n; r++ { // every rank reaches the root without a cycle
				steps := 0
				for x := r; parent[x] >= 0; x = parent[x] {
					steps++
					require.Less(t, steps, n, "n=%d tree=%d: cycle from %d", n, tree, r)
				}
			}
		}
		if n%2 == 0 && n > 2 {
			for r, c := range inner {
				require.Less(t, c, 2, "n=%d: rank %d is an inner node of both trees", n, r)
			}
		}
	}
}

func TestBuildRejectsBadParams(t *testing.T) {
	for _, p := range []Params{
		{Coll: CollAllReduce, Algo: Ring, NRanks: 0},
		{Coll: CollAllReduce, Algo: Ring, NRanks: 4, Rank: 4},
		{Coll: CollAllReduce, Algo: Pairwise, NRanks: 4},
		{Coll: CollReduceScatter, Algo: Tree, NRanks: 4},
		{Coll: CollBroadcast, Algo: Ring, NRanks: 4, Root: 7},
		{Coll: CollSend, Algo: P2P, NRanks: 4, Rank: 1, Root: 1},
		{Coll: CollAllReduce, Algo: Ring, NRanks: 3, Ring: []int{0, 1, 1}},
		{Coll: CollAllReduce, Algo: AlgoAuto, NRanks: 2},
	} {
		_, err := Build(p)
		require.Error(t, err, "%+v", p)
	}
}

func TestCheckRejectsMalformedSteps(t *testing.T) {
	good := func() *Schedule {
		s, err := Build(Params{Coll: CollAllReduce, Algo: Ring, NRanks: 4, Rank: 1})
		require.NoError(t, err)
		require.NoError(t, s.Check())
		return s
	}
	for name, mutate := range map[string]func(*Schedule){
		"send to self":      func(s *Schedule) { s.Steps[0].SendPeer = 1 },
		"peer out of range": func(s *Schedule) { s.Steps[0].SendPeer = 9 },
		"write input":       func(s *Schedule) { s.Steps[3].Dst.Buf = Input },
		"block past end":    func(s *Schedule) { s.Steps[0].Src.Block = 4 },
		"stray recv peer":   func(s *Schedule) { s.Steps[0].RecvPeer = 2 },
		"final on send":     func(s *Schedule) { s.Steps[0].Final = true },
		"src/dst differ":    func(s *Schedule) { s.Steps[3].Dst.Block = (s.Steps[3].Src.Block + 1) % 4 },
	} {
		s := good()
		mutate(s)
		require.Error(t, s.Check(), name)
	}
}

// TestGolden compares schedules with the step tables in testdata/, so that
// a change of schedule shows up in review. Run with -update to rewrite.
func TestGolden(t *testing.T) {
	cases := []Params{
		{Coll: CollAllReduce, Algo: Ring, NRanks: 4},
		{Coll: CollAllReduce, Algo: Ring, NRanks: 4, Ring: []int{0, 2, 1, 3}},
		{Coll: CollAllReduce, Algo: Tree, NRanks: 4},
		{Coll: CollAllReduce, Algo: Tree, NRanks: 7},
		{Coll: CollAllReduce, Algo: RecDoubling, NRanks: 4},
		{Coll: CollAllReduce, Algo: RecDoubling, NRanks: 5},
		{Coll: CollAllReduce, Algo: Rabenseifner, NRanks: 4},
		{Coll: CollAllReduce, Algo: Rabenseifner, NRanks: 6},
		{Coll: CollAllReduce, Algo: OneShot, NRanks: 4},
		{Coll: CollAllReduce, Algo: OneShot, NRanks: 5},
		{Coll: CollReduceScatter, Algo: Ring, NRanks: 4},
		{Coll: CollAllGather, Algo: Ring, NRanks: 4},
		{Coll: CollReduceScatter, Algo: OneShot, NRanks: 4},
		{Coll: CollAllGather, Algo: OneShot, NRanks: 4},
		{Coll: CollAllGather, Algo: RecDoubling, NRanks: 4},
		{Coll: CollAllGather, Algo: RecDoubling, NRanks: 6},
		{Coll: CollBroadcast, Algo: Ring, NRanks: 4, Root: 1},
		{Coll: CollReduce, Algo: Ring, NRanks: 4, Root: 2},
		{Coll: CollReduce, Algo: OneShot, NRanks: 4, Root: 2},
		{Coll: CollAllToAll, Algo: Pairwise, NRanks: 3},
		{Coll: CollReduceScatter, Algo: Hier, NRanks: 4, Hosts: []int{0, 1, 0, 1}},
		{Coll: CollAllGather, Algo: Hier, NRanks: 6, Hosts: []int{0, 0, 0, 1, 1, 1}},
	}
	for _, p := range cases {
		name := fmt.Sprintf("%v_%v_n%d", p.Coll, p.Algo, p.NRanks)
		if p.Coll == CollBroadcast || p.Coll == CollReduce {
			name += fmt.Sprintf("_root%d", p.Root)
		}
		if p.Ring != nil {
			name += "_ring" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(p.Ring)), "-"), "[]")
		}
		if p.Hosts != nil {
			name += "_hosts" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(p.Hosts)), "-"), "[]")
		}
		t.Run(name, func(t *testing.T) {
			scheds, err := BuildAll(p)
			require.NoError(t, err)
			var b strings.Builder
			for _, s := range scheds {
				b.WriteString(s.String())
			}
			path := filepath.Join("testdata", name+".txt")
			if *update {
				require.NoError(t, os.MkdirAll("testdata", 0o755))
				require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "run go test ./algorithms -run TestGolden -update to create it")
			require.Equal(t, string(want), b.String())
		})
	}
}

func TestParseAlgorithm(t *testing.T) {
	for a := AlgoAuto; a < numAlgorithms; a++ {
		got, err := ParseAlgorithm(strings.ToUpper(a.String()))
		require.NoError(t, err)
		require.Equal(t, a, got)
	}
	_, err := ParseAlgorithm("bogus")
	require.ErrorContains(t, err, "ring")
}
