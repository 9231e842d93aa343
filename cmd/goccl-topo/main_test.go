package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/topology"
)

func topo(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestSharedFilesPrintTheirMatrix(t *testing.T) {
	out, errs, code := topo(t, "--file", "../../topology/testdata/azure-ndv4.xml")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "GPUs: 8")
	// GPU0 is the slot at 0003:00:00.0, which shares a switch with GPU1
	// and NIC0/NIC1 (0103, 0104).
	var row []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "GPU0 ") {
			row = strings.Fields(l)
		}
	}
	require.Equal(t, []string{"GPU0", "X", "PIX", "SYS"}, row[:4])
	require.Contains(t, out, "GPU0: NIC0, NIC1 (PIX)")
	require.Contains(t, out, "Ring: ")

	out, errs, code = topo(t, "--file", "../../topology/testdata/azure-ndv2.xml")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "GPU0: NIC0 (PHB)")
	require.Contains(t, out, "GPU4: NIC0 (SYS)")
}

func TestDumpAndReloadAndSimulate(t *testing.T) {
	dir := t.TempDir()
	for _, ext := range []string{".xml", ".json"} {
		path := filepath.Join(dir, "t"+ext)
		out, errs, code := topo(t, "--file", "../../topology/testdata/multihost.xml", "--dump", path)
		require.Equal(t, 0, code, errs)
		require.Contains(t, out, "Wrote "+path)
		require.Contains(t, out, "warning: GPU 0000:11:00.0: NVLink to 0000:99:00.0")
		out2, errs, code := topo(t, "--file", path)
		require.Equal(t, 0, code, errs)
		require.Contains(t, out2, "Host 0x5678")
		require.Contains(t, out2, "NV4")
	}
	f, err := os.Open("../../topology/testdata/multihost.xml")
	require.NoError(t, err)
	_, err = topology.ReadXML(f)
	f.Close()
	require.NoError(t, err)
	out, errs, code := topo(t, "--file", "../../topology/testdata/multihost.xml", "--simulate", "1x2")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "Predicted all-reduce, 1 node(s) × 2 GPUs")
	_, errs, code = topo(t, "--file", "../../topology/testdata/multihost.xml", "--simulate", "lots")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "want NODESxGPUS")
}

func TestThisMachine(t *testing.T) {
	out, errs, code := topo(t)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "Topology: discovered; NVML ")
	require.Contains(t, out, "CPUs: NUMA")
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.xml")
	require.NoError(t, os.WriteFile(bad, []byte("<system>\n<cpu numaid=\"0\">\n<gpu/>\n</cpu></system>"), 0o644))
	_, errs, code := topo(t, "--file", bad)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "line 3: unexpected <gpu> inside <cpu>")
	_, errs, code = topo(t, "--file", filepath.Join(dir, "missing.xml"))
	require.Equal(t, 1, code)
	require.Contains(t, errs, "missing.xml")
}

// The RDMA ports and, for each GPU, whether its nearest port would move
// its memory directly (GPUDirect RDMA) at the default level and at one
// that forbids it.
func TestRDMAPortsAndGDR(t *testing.T) {
	out, errs, code := topo(t, "--file", "../../topology/testdata/multihost.xml")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "mlx5_0:1 RDMA port 400 Gb/s GUID 0xb83fd20300a1b2c3")
	require.Contains(t, out, "GPUDirect RDMA (GOCCL_NET_GDR_LEVEL=PXB")
	require.Contains(t, out, "GPU2 - mlx5_0:1 (PIX): GPUDirect RDMA")
	t.Setenv("GOCCL_NET_GDR_LEVEL", "LOC")
	out, errs, code = topo(t, "--file", "../../topology/testdata/multihost.xml")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "GPU2 - mlx5_0:1 (PIX): staged through host memory")
	t.Setenv("GOCCL_NET_GDR_LEVEL", "nearby")
	_, errs, code = topo(t, "--file", "../../topology/testdata/multihost.xml")
	require.NotEqual(t, 0, code)
	require.Contains(t, errs, "want LOC, PIX, PXB, PHB or SYS")
}
