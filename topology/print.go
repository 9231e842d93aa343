package topology

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteMatrix prints, per host, the GPU/NIC matrix in `nvidia-smi topo -m`
// style (X, NV<n>, NVB, PIX, PXB, PHB, SYS ...; NIC names as column
// heads, with a legend naming them), each GPU's CPU affinity and NUMA
// node, and its nearest NICs.
func (t *Topo) WriteMatrix(w io.Writer) {
	for hi, host := range t.Sys.Hosts() {
		if len(t.Sys.Hosts()) > 1 {
			if hi > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "Host %s\n", host)
		}
		gpus := t.GPUsOf(host)
		var nics []*Node
		for _, n := range t.NICs {
			if n.Host == host {
				nics = append(nics, n)
			}
		}
		if len(gpus) == 0 {
			fmt.Fprintln(w, "No GPUs.")
		}
		tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
		head := []string{""}
		for _, g := range gpus {
			head = append(head, t.Label(g))
		}
		for _, n := range nics {
			head = append(head, t.Label(n))
		}
		head = append(head, "CPU Affinity", "NUMA Affinity")
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		rows := append(append([]*Node(nil), gpus...), nics...)
		for _, a := range rows {
			cells := []string{t.Label(a)}
			for _, b := range gpus {
				cells = append(cells, t.Cell(a, b))
			}
			for _, b := range nics {
				cells = append(cells, t.Cell(a, b))
			}
			aff := "N/A"
			if c := t.cpuDoc(a); c.Affinity != "" {
				aff = cpulist(c.Affinity)
			}
			numa := "N/A"
			if a.NUMA >= 0 {
				numa = fmt.Sprint(a.NUMA)
			}
			cells = append(cells, aff, numa)
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
		tw.Flush()
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Legend:")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "  X    = Self")
		fmt.Fprintln(w, "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)")
		fmt.Fprintln(w, "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)")
		fmt.Fprintln(w, "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)")
		fmt.Fprintln(w, "  PIX  = Connection traversing at most a single PCIe bridge")
		fmt.Fprintln(w, "  NVB  = Connection through NVLink using an intermediate GPU")
		fmt.Fprintln(w, "  NV#  = Connection traversing a bonded set of # NVLinks")
		if len(gpus) > 0 || len(nics) > 0 {
			fmt.Fprintln(w)
		}
		for _, g := range gpus {
			if g.Slot {
				fmt.Fprintf(w, "  %s: %s (empty GPU slot: a partial topology)\n", t.Label(g), g.Name)
			} else {
				fmt.Fprintf(w, "  %s: %s (dev %d, sm %d)\n", t.Label(g), g.Name, g.GPU.Dev, g.GPU.SM)
			}
		}
		if len(nics) > 0 {
			fmt.Fprintln(w)
			fmt.Fprintln(w, "NIC Legend:")
			fmt.Fprintln(w)
			for _, n := range nics {
				desc := n.Name
				if len(n.NICs) > 0 {
					var ports []string
					for _, p := range n.NICs {
						s := p.Name
						if p.Net != nil && p.Net.Port > 0 {
							s = fmt.Sprintf("%s:%d RDMA port", p.Name, p.Net.Port)
						}
						if p.Net != nil && p.Net.Speed > 0 {
							s += fmt.Sprintf(" %d Gb/s", p.Net.Speed/1000)
						}
						if p.Net != nil && p.Net.GUID != "" {
							s += " GUID " + p.Net.GUID
						}
						ports = append(ports, s)
					}
					desc = fmt.Sprintf("%s (%s)", strings.Join(ports, ", "), n.Name)
				} else if n.Slot {
					desc += " (empty NIC slot)"
				}
				fmt.Fprintf(w, "  %s: %s\n", t.Label(n), desc)
			}
		}
		if len(gpus) > 0 && len(nics) > 0 {
			fmt.Fprintln(w)
			fmt.Fprintln(w, "Nearest NICs:")
			for _, g := range gpus {
				var names []string
				var typ PathType
				for _, n := range t.NearestNICs(g) {
					names = append(names, t.Label(n))
					typ = t.Path(g, n).Type
				}
				if len(names) == 0 {
					fmt.Fprintf(w, "  %s: none\n", t.Label(g))
					continue
				}
				fmt.Fprintf(w, "  %s: %s (%v)\n", t.Label(g), strings.Join(names, ", "), typ)
			}
			t.writeGDR(w, gpus)
		}
	}
}

// WriteRings prints the ring and tree of each host's GPUs.
func (t *Topo) WriteRings(w io.Writer) error {
	for _, host := range t.Sys.Hosts() {
		gpus := t.GPUsOf(host)
		if len(gpus) == 0 {
			continue
		}
		r, err := t.SearchRing(gpus)
		if err != nil {
			return err
		}
		label := ""
		if host != "" {
			label = " (host " + host + ")"
		}
		var order []string
		for _, g := range r.Order {
			order = append(order, t.Label(g))
		}
		fmt.Fprintf(w, "Ring%s: %s -> %s\n", label, strings.Join(order, " -> "), order[0])
		fmt.Fprintf(w, "  %d channels × %.4g GB/s = %.4g GB/s, worst hop %v\n", r.Channels, r.BW, r.Total(), r.Type)
		fmt.Fprintf(w, "Tree%s: chain %s (each channel; across hosts a double binary tree of hosts)\n", label, strings.Join(order, " -> "))
	}
	return nil
}

// cpulist turns a sysfs cpumask ("000000ff,fff00000") into a list
// ("20-39").
func cpulist(mask string) string {
	hex := strings.ReplaceAll(strings.TrimSpace(mask), ",", "")
	var bits []int
	for i := 0; i < len(hex); i++ {
		c := hex[len(hex)-1-i]
		var v int
		switch {
		case c >= '0' && c <= '9':
			v = int(c - '0')
		case c >= 'a' && c <= 'f':
			v = int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			v = int(c-'A') + 10
		default:
			return mask
		}
		for b := 0; b < 4; b++ {
			if v&(1<<b) != 0 {
				bits = append(bits, i*4+b)
			}
		}
	}
	if len(bits) == 0 {
		return "none"
	}
	var parts []string
	for i := 0; i < len(bits); {
		j := i
		for j+1 < len(bits) && bits[j+1] == bits[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprint(bits[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", bits[i], bits[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// writeGDR says, for each GPU and the RDMA ports nearest it, whether the
// port would move the GPU's memory directly (GPUDirect RDMA) at the
// default level, or stage it through host memory.
func (t *Topo) writeGDR(w io.Writer, gpus []*Node) {
	var lines []string
	for _, g := range gpus {
		for _, n := range t.NearestNICs(g) {
			for _, p := range n.NICs {
				if p.Net == nil || p.Net.Port == 0 {
					continue // not an RDMA port
				}
				ok, typ := t.GDR(g, n, p.Net, t.GDRLevel)
				how := "GPUDirect RDMA"
				if !ok {
					how = "staged through host memory"
					if !p.Net.GDR {
						how += " (the port does not support GPUDirect)"
					}
				}
				lines = append(lines, fmt.Sprintf("  %s - %s:%d (%v): %s", t.Label(g), p.Name, p.Net.Port, typ, how))
			}
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "GPUDirect RDMA (GOCCL_NET_GDR_LEVEL=%v: %s):\n", t.GDRLevel, gdrMeaning[t.GDRLevel])
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

var gdrMeaning = map[PathType]string{
	LOC: "never",
	PIX: "a GPU and a NIC behind one PCIe switch",
	PXB: "a GPU and a NIC under common PCIe switches, not across the CPU",
	PHB: "a GPU and a NIC under one CPU",
	SYS: "a GPU and a NIC anywhere in the host",
}
