package topology

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMatrixOfAzureNDv4(t *testing.T) {
	tp := build(t, load(t, "azure-ndv4.xml"))
	var b bytes.Buffer
	tp.WriteMatrix(&b)
	out := b.String()
	t.Log("\n" + out)
	lines := strings.Split(out, "\n")
	head := strings.Fields(lines[0])
	require.Equal(t, "GPU0", head[0])
	require.Equal(t, "NIC7", head[15])
	// GPU0 is 0003:00:00.0: X to itself, PIX to GPU1 (0004) and to NIC0,
	// NIC1 (0103, 0104), SYS elsewhere; CPU affinity 0-23, NUMA 0.
	row := strings.Fields(lines[1])
	require.Equal(t, []string{"GPU0", "X", "PIX", "SYS", "SYS", "SYS", "SYS", "SYS", "SYS", "PIX", "PIX", "SYS", "SYS", "SYS", "SYS", "SYS", "SYS", "0-23", "0"}, row)
	require.Contains(t, out, "  GPU0: NIC0, NIC1 (PIX)")
	require.Equal(t, "20-39", cpulist("000000ff,fff00000"))
	require.Equal(t, "0-3,8", cpulist("10f"))
}

func TestParseGDRLevel(t *testing.T) {
	for in, want := range map[string]PathType{"LOC": LOC, "pix": PIX, " PXB ": PXB, "PHB": PHB, "SYS": SYS, "0": LOC, "2": PXB, "5": SYS} {
		got, err := ParseGDRLevel(in)
		if err != nil || got != want {
			t.Errorf("ParseGDRLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "NVL", "6", "-1", "near"} {
		if _, err := ParseGDRLevel(in); err == nil {
			t.Errorf("ParseGDRLevel(%q) accepted", in)
		}
	}
}
