package topology

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// System is the topology document: what discovery finds and what NCCL's
// topology XML (NCCL_TOPO_FILE, NCCL_TOPO_DUMP_FILE) describes. It keeps
// the XML's shape, a tree rooted at CPUs (NUMA nodes) with PCI devices
// below them, GPUs and NICs inside PCI devices, NVLinks inside GPUs, so
// that XML → System → XML keeps everything, including attributes goccl
// does not interpret (Extra).
type System struct {
	Version int    `json:"version"`
	CPUs    []*CPU `json:"cpus"`
	Extra   []Attr `json:"extra,omitempty"`
}

// Attr is an attribute goccl keeps but does not interpret.
type Attr struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// CPU is one NUMA node of one host.
type CPU struct {
	NUMA     int    `json:"numaid"`
	HostHash string `json:"hostHash,omitempty"` // distinguishes hosts in a multi-host file
	Affinity string `json:"affinity,omitempty"` // cpumask, as in sysfs
	Arch     string `json:"arch,omitempty"`     // x86_64, arm64, ppc64
	Vendor   string `json:"vendor,omitempty"`   // GenuineIntel, AuthenticAMD
	Family   int    `json:"familyid,omitempty"`
	Model    int    `json:"modelid,omitempty"`
	PCI      []*PCI `json:"pci,omitempty"`
	// NICs attached to the CPU without a PCI device (NCCL's <nic> under
	// <cpu>, e.g. virtual or unknown placement).
	NICs  []*NIC `json:"nics,omitempty"`
	Extra []Attr `json:"extra,omitempty"`
	Line  int    `json:"-"` // in the XML it came from
}

// PCI is a PCI device or bridge.
type PCI struct {
	BusID     string `json:"busid"` // dddd:bb:dd.f, lower case
	Class     string `json:"class,omitempty"`
	Vendor    string `json:"vendor,omitempty"`
	Device    string `json:"device,omitempty"`
	SubVendor string `json:"subsystemVendor,omitempty"`
	SubDevice string `json:"subsystemDevice,omitempty"`
	LinkSpeed string `json:"linkSpeed,omitempty"` // "16.0 GT/s PCIe", as sysfs says
	LinkWidth int    `json:"linkWidth,omitempty"`
	Children  []*PCI `json:"children,omitempty"`
	GPU       *GPU   `json:"gpu,omitempty"`
	NIC       *NIC   `json:"nic,omitempty"`
	Extra     []Attr `json:"extra,omitempty"`
	Line      int    `json:"-"`
}

// GPU is a GPU inside a PCI device.
type GPU struct {
	Dev     int       `json:"dev"`            // CUDA/NVML device index
	SM      int       `json:"sm"`             // compute capability × 10 (90 for H100)
	Rank    int       `json:"rank,omitempty"` // NCCL rank in a dump; -1 unknown
	GDR     bool      `json:"gdr,omitempty"`
	NVLinks []*NVLink `json:"nvlinks,omitempty"`
	C2C     []*C2C    `json:"c2c,omitempty"`
	Extra   []Attr    `json:"extra,omitempty"`
	Line    int       `json:"-"`
}

// NVLink is a group of NVLinks from a GPU to one target: another GPU, an
// NVSwitch, or a CPU (by the target's PCI bus id and class).
type NVLink struct {
	Target string `json:"target"` // bus id
	Count  int    `json:"count"`
	TClass string `json:"tclass"` // 0x030200 GPU, 0x068000 NVSwitch, 0x060400 CPU (POWER)
	Extra  []Attr `json:"extra,omitempty"`
	Line   int    `json:"-"`
}

// C2C is a chip-to-chip link from a GPU to its CPU (Grace Hopper).
type C2C struct {
	BW    float64 `json:"bw"` // GB/s per link
	Count int     `json:"count"`
	Extra []Attr  `json:"extra,omitempty"`
}

// NIC is a network device; its ports are Nets.
type NIC struct {
	Nets  []*Net `json:"nets,omitempty"`
	Extra []Attr `json:"extra,omitempty"`
	Line  int    `json:"-"`
}

// Net is one network port.
type Net struct {
	Name    string  `json:"name"`              // mlx5_0, eth0
	Dev     int     `json:"dev"`               // NCCL's net device index
	Speed   int     `json:"speed,omitempty"`   // Mb/s
	Port    int     `json:"port,omitempty"`    // IB port number
	Latency float64 `json:"latency,omitempty"` // µs
	GUID    string  `json:"guid,omitempty"`
	MaxConn int     `json:"maxconn,omitempty"`
	GDR     bool    `json:"gdr,omitempty"`
	Coll    bool    `json:"coll,omitempty"`
	Extra   []Attr  `json:"extra,omitempty"`
	Line    int     `json:"-"`
}

// WriteJSON writes s as indented JSON.
func (s *System) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(s)
}

// ReadJSON reads a System written by WriteJSON.
func ReadJSON(r io.Reader) (*System, error) {
	var s System
	d := json.NewDecoder(r)
	d.DisallowUnknownFields()
	if err := d.Decode(&s); err != nil {
		return nil, fmt.Errorf("topology: JSON: %w", err)
	}
	return &s, nil
}

// Hosts returns the distinct host hashes in s, in order of appearance
// ("" for a single-host file without them).
func (s *System) Hosts() []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range s.CPUs {
		if !seen[c.HostHash] {
			seen[c.HostHash] = true
			out = append(out, c.HostHash)
		}
	}
	return out
}

// GPUByBusID finds the GPU at PCI bus id busID in any spelling: CUDA's
// cuDeviceGetPCIBusId ("0000:19:00.0"), NVML's ("00000000:19:00.0") or a
// topology file's. It is how a rank's CUDA device is matched to the
// topology's view of it (CUDA and NVML number devices differently when
// CUDA_VISIBLE_DEVICES reorders them). In a document of several hosts,
// host (a CPU's HostHash) says which; "" matches any.
func (s *System) GPUByBusID(host, busID string) (Located[*GPU], bool) {
	want := normBusID(busID)
	for _, g := range s.GPUs() {
		if (host == "" || g.CPU.HostHash == host) && normBusID(g.PCI.BusID) == want {
			return g, true
		}
	}
	return Located[*GPU]{}, false
}

// walk calls f for every PCI device under c, depth first, with its parent
// (nil at the top).
func (c *CPU) walk(f func(p, parent *PCI)) {
	var rec func(p, parent *PCI)
	rec = func(p, parent *PCI) {
		f(p, parent)
		for _, ch := range p.Children {
			rec(ch, p)
		}
	}
	for _, p := range c.PCI {
		rec(p, nil)
	}
}

// GPUs returns every GPU in s with its PCI device and CPU, in document
// order.
func (s *System) GPUs() []Located[*GPU] {
	var out []Located[*GPU]
	for _, c := range s.CPUs {
		c.walk(func(p, _ *PCI) {
			if p.GPU != nil {
				out = append(out, Located[*GPU]{Item: p.GPU, PCI: p, CPU: c})
			}
		})
	}
	return out
}

// Located is a device with where it sits.
type Located[T any] struct {
	Item T
	PCI  *PCI // nil for a NIC directly under a CPU
	CPU  *CPU
}

// normBusID lower-cases a bus id and gives it a domain: NCCL writes
// "0000:17:00.0"; NVML says "00000000:17:00.0".
func normBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := strings.IndexByte(s, ':'); i > 4 && strings.Count(s, ":") == 2 {
		s = s[i-4:]
	} else if strings.Count(s, ":") == 1 {
		s = "0000:" + s
	}
	return s
}
