package topology

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzXMLToSearch feeds documents through everything that reads them: a
// document ReadXML accepts must build, search, model and print without a
// panic (errors are fine), and write back to XML that reads again.
func FuzzXMLToSearch(f *testing.F) {
	for _, dir := range []string{"testdata", "../../shared/testdata/topology"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.xml"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte(selfNVLink))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ReadXML(bytes.NewReader(b))
		if err != nil {
			return
		}
		var out bytes.Buffer
		require.NoError(t, s.WriteXML(&out))
		_, err = ReadXML(&out)
		require.NoError(t, err, "what WriteXML wrote must read back:\n%s", out.String())
		tp, err := Build(s)
		if err != nil {
			return
		}
		for _, h := range s.Hosts() {
			gpus := tp.GPUsOf(h)
			if len(gpus) > 6 {
				gpus = gpus[:6] // the exhaustive search grows as (n-1)!: keep each run fast
			}
			if r, err := tp.SearchRing(gpus); err == nil {
				TreeFor(r, 2)
			}
			for _, g := range gpus {
				tp.NearestNICs(g)
			}
		}
		if len(tp.GPUs) <= 6 {
			Simulate(tp, Layout{Nodes: 2, GPUsPerNode: max(1, len(tp.GPUs))})
		}
		var txt strings.Builder
		tp.WriteMatrix(&txt)
		tp.WriteRings(&txt)
	})
}

// selfNVLink is a GPU whose NVLink names the GPU's own bus id, as real
// NCCL dumps contain.
const selfNVLink = `<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:1a:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:1b:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="90" rank="0" gdr="1">
          <nvlink target="0000:1b:00.0" count="18" tclass="0x030200"/>
        </gpu>
      </pci>
      <pci busid="0000:1c:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="90" rank="1" gdr="1">
          <nvlink target="0000:1b:00.0" count="18" tclass="0x030200"/>
        </gpu>
      </pci>
    </pci>
  </cpu>
</system>`

func TestSelfNVLinkIsAccepted(t *testing.T) {
	s, err := ReadXML(strings.NewReader(selfNVLink))
	require.NoError(t, err)
	tp, err := Build(s)
	require.NoError(t, err)
	require.NotEmpty(t, tp.Warnings)
	require.Contains(t, strings.Join(tp.Warnings, "\n"), "its own bus id")
	r, err := tp.SearchRing(tp.GPUs)
	require.NoError(t, err)
	require.Len(t, r.Order, 2)
	// GPU 1's NVLink to GPU 0 still counts.
	require.Equal(t, NVL, tp.Path(tp.GPUs[1], tp.GPUs[0]).Type)
}
