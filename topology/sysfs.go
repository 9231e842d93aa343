package topology

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// busIDPattern matches a PCI device directory name in sysfs.
var busIDPattern = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// sysfs reads a sysfs tree rooted at root ("/" on a live system; a fake
// tree in tests).
type sysfs struct {
	root string
	// devs maps a bus id to its directory (below root), from a walk of
	// /sys/devices/pci*.
	devs map[string]string
}

func (s *sysfs) path(p string) string { return filepath.Join(s.root, p) }

func (s *sysfs) read(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// index walks the PCI device tree.
func (s *sysfs) index() error {
	s.devs = map[string]string{}
	tops, _ := filepath.Glob(s.path("sys/devices/pci*"))
	for _, top := range tops {
		err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // unreadable corners of sysfs are skipped
			}
			if !d.IsDir() {
				return nil
			}
			name := d.Name()
			if p != top && !busIDPattern.MatchString(name) {
				return fs.SkipDir
			}
			if busIDPattern.MatchString(name) {
				s.devs[normBusID(name)] = p
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// deviceOf resolves a class device's "device" link (net, infiniband) to
// its PCI device: the nearest enclosing directory named by a bus id
// (virtio NICs sit one level below theirs).
func (s *sysfs) deviceOf(classDir string) (string, bool) {
	p, err := filepath.EvalSymlinks(filepath.Join(classDir, "device"))
	if err != nil {
		return "", false
	}
	for d := p; d != filepath.Dir(d); d = filepath.Dir(d) {
		if busIDPattern.MatchString(filepath.Base(d)) {
			return normBusID(filepath.Base(d)), true
		}
		if !strings.HasPrefix(d, s.root) {
			break
		}
	}
	return "", false
}

// DiscoverSysfs reads the machine's PCI topology from sysfs below root:
// the NUMA nodes and their CPU masks, the CPU model, every InfiniBand
// device and physical network interface, the GPUs whose bus ids are given
// (NVML's; nil means every NVIDIA display or 3D controller found), and the
// chain of PCI bridges above each, with link speed and width.
func DiscoverSysfs(root string, gpuBusIDs []string) (*System, error) {
	s := &sysfs{root: root}
	if err := s.index(); err != nil {
		return nil, err
	}
	sys := &System{Version: 1}
	cpus := map[int]*CPU{}
	vendor, family, model := s.cpuModel()
	arch := map[string]string{"amd64": "x86_64", "arm64": "arm64", "ppc64le": "ppc64"}[runtime.GOARCH]
	nodes, _ := filepath.Glob(s.path("sys/devices/system/node/node[0-9]*"))
	for _, n := range nodes {
		id, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(n), "node"))
		if err != nil {
			continue
		}
		cpus[id] = &CPU{NUMA: id, Affinity: s.read(n, "cpumap"), Arch: arch, Vendor: vendor, Family: family, Model: model}
	}
	cpuFor := func(numa int) *CPU {
		if numa < 0 {
			numa = 0
		}
		if c := cpus[numa]; c != nil {
			return c
		}
		c := &CPU{NUMA: numa, Arch: arch, Vendor: vendor, Family: family, Model: model}
		cpus[numa] = c
		return c
	}
	if len(cpus) == 0 {
		cpuFor(0)
	}

	// The devices to place, with what goes inside their PCI node.
	type dev struct {
		bus string
		gpu *GPU
		nic *NIC
	}
	var devs []dev
	if gpuBusIDs == nil {
		for bus, dir := range s.devs {
			if s.read(dir, "vendor") == "0x10de" && (strings.HasPrefix(s.read(dir, "class"), "0x0302") || strings.HasPrefix(s.read(dir, "class"), "0x0300")) {
				gpuBusIDs = append(gpuBusIDs, bus)
			}
		}
		sort.Strings(gpuBusIDs)
	}
	for i, b := range gpuBusIDs {
		bus := normBusID(b)
		if _, ok := s.devs[bus]; !ok {
			return nil, fmt.Errorf("topology: GPU %s is not in %s", bus, s.path("sys/devices"))
		}
		devs = append(devs, dev{bus: bus, gpu: &GPU{Dev: i, Rank: -1}})
	}
	nics := map[string]*NIC{}
	netDev := 0
	addNet := func(bus string, n *Net) {
		nic := nics[bus]
		if nic == nil {
			nic = &NIC{}
			nics[bus] = nic
			devs = append(devs, dev{bus: bus, nic: nic})
		}
		n.Dev = netDev
		netDev++
		nic.Nets = append(nic.Nets, n)
	}
	ibs, _ := filepath.Glob(s.path("sys/class/infiniband/*"))
	sort.Strings(ibs)
	for _, ib := range ibs {
		bus, ok := s.deviceOf(ib)
		if !ok {
			continue
		}
		ports, _ := filepath.Glob(filepath.Join(ib, "ports", "*"))
		sort.Strings(ports)
		for _, p := range ports {
			port, _ := strconv.Atoi(filepath.Base(p))
			addNet(bus, &Net{Name: filepath.Base(ib), Port: port, Speed: ibRate(s.read(p, "rate")), GUID: s.read(ib, "node_guid"), GDR: true})
		}
	}
	netIfs, _ := filepath.Glob(s.path("sys/class/net/*"))
	sort.Strings(netIfs)
	for _, ifc := range netIfs {
		bus, ok := s.deviceOf(ifc)
		if !ok {
			continue // virtual: lo, veth, bridges
		}
		if nics[bus] != nil && len(ibs) > 0 {
			continue // the IPoIB face of an InfiniBand device already listed
		}
		speed, _ := strconv.Atoi(s.read(ifc, "speed"))
		addNet(bus, &Net{Name: filepath.Base(ifc), Speed: max(speed, 0)})
	}

	// Place each device under its chain of bridges.
	placed := map[string]*PCI{}
	for _, d := range devs {
		dir := s.devs[d.bus]
		rel, err := filepath.Rel(s.path("sys/devices"), dir)
		if err != nil {
			return nil, err
		}
		parts := strings.Split(rel, string(filepath.Separator))
		var parent *PCI
		var cpu *CPU
		cur := s.path("sys/devices")
		for i, part := range parts {
			cur = filepath.Join(cur, part)
			if i == 0 {
				continue // pciDDDD:BB, the host bridge
			}
			bus := normBusID(part)
			p := placed[bus]
			if p == nil {
				p = s.pciNode(cur, bus)
				placed[bus] = p
				if parent == nil {
					numa, err := strconv.Atoi(s.read(cur, "numa_node"))
					if err != nil {
						numa = -1
					}
					cpu = cpuFor(numa)
					cpu.PCI = append(cpu.PCI, p)
				} else {
					parent.Children = append(parent.Children, p)
				}
			}
			parent = p
		}
		if d.gpu != nil {
			parent.GPU = d.gpu
		} else {
			parent.NIC = d.nic
		}
	}
	var ids []int
	for id := range cpus {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		sys.CPUs = append(sys.CPUs, cpus[id])
	}
	return sys, nil
}

func (s *sysfs) pciNode(dir, bus string) *PCI {
	w, _ := strconv.Atoi(s.read(dir, "current_link_width"))
	return &PCI{BusID: bus, Class: s.read(dir, "class"), Vendor: s.read(dir, "vendor"), Device: s.read(dir, "device"),
		SubVendor: s.read(dir, "subsystem_vendor"), SubDevice: s.read(dir, "subsystem_device"),
		LinkSpeed: s.read(dir, "current_link_speed"), LinkWidth: w}
}

// cpuModel reads the CPU vendor, family and model from /proc/cpuinfo.
func (s *sysfs) cpuModel() (vendor string, family, model int) {
	f, err := os.Open(s.path("proc/cpuinfo"))
	if err != nil {
		return "", 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "vendor_id":
			vendor = v
		case "cpu family":
			family, _ = strconv.Atoi(v)
		case "model":
			model, _ = strconv.Atoi(v)
		case "":
		}
		if k == "processor" && vendor != "" {
			break
		}
	}
	return vendor, family, model
}

// ibRate turns an InfiniBand port rate ("400 Gb/sec (4X NDR)") into Mb/s.
func ibRate(s string) int {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	g, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return int(g * 1000)
}
