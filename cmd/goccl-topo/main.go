// Command goccl-topo shows the machine as goccl sees it: the GPU/NIC
// matrix in `nvidia-smi topo -m` style, each GPU's nearest NICs, and the
// rings and trees goccl would use; it can load a topology instead of
// discovering one, write one, and predict all-reduce bandwidth on it.
//
//	goccl-topo                               # discover (NVML + sysfs) and print
//	goccl-topo --file ndv4.xml               # an NCCL topology file (or a goccl JSON document)
//	goccl-topo --dump topo.xml               # write what was found (.xml for NCCL, .json)
//	goccl-topo --file dgx.xml --simulate 2x8 # predicted all-reduce busbw, 2 nodes × 8 GPUs
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/goccl/goccl/topology"
	"github.com/goccl/goccl/topology/gonvml"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("goccl-topo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "load this topology (NCCL XML, or goccl JSON) instead of discovering")
	dump := fs.String("dump", "", "write the topology to this file: .xml (NCCL_TOPO_FILE format) or .json")
	sysRoot := fs.String("sysfs", "/", "root of the sysfs and /proc to read (for tests and chroots)")
	sim := fs.String("simulate", "", "predict all-reduce on NODESxGPUS (e.g. 2x8), every node like the first host")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "goccl-topo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var sys *topology.System
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			return fail(stderr, err)
		}
		if strings.HasSuffix(strings.ToLower(*file), ".json") {
			sys, err = topology.ReadJSON(f)
		} else {
			sys, err = topology.ReadXML(f)
		}
		f.Close()
		if err != nil {
			return fail(stderr, fmt.Errorf("%s: %w", *file, err))
		}
		fmt.Fprintf(stdout, "Topology: %s\n", *file)
	} else {
		d, err := topology.Discover(*sysRoot, gonvml.System())
		if err != nil {
			return fail(stderr, err)
		}
		sys = d.System
		fmt.Fprintf(stdout, "Topology: discovered; NVML %s\n", d.NVML)
		for _, n := range d.Notes {
			fmt.Fprintf(stdout, "  note: %s\n", n)
		}
	}
	t, err := topology.Build(sys)
	if err != nil {
		return fail(stderr, err)
	}
	if v := os.Getenv("GOCCL_NET_GDR_LEVEL"); v != "" {
		if t.GDRLevel, err = topology.ParseGDRLevel(v); err != nil {
			return fail(stderr, fmt.Errorf("GOCCL_NET_GDR_LEVEL: %w", err))
		}
	}
	summary(stdout, t)
	for _, w := range t.Warnings {
		fmt.Fprintf(stdout, "  warning: %s\n", w)
	}
	fmt.Fprintln(stdout)
	t.WriteMatrix(stdout)
	if len(t.GPUs) > 0 {
		fmt.Fprintln(stdout)
		if err := t.WriteRings(stdout); err != nil {
			return fail(stderr, err)
		}
	}
	if *sim != "" {
		var l topology.Layout
		if _, err := fmt.Sscanf(strings.ToLower(*sim), "%dx%d", &l.Nodes, &l.GPUsPerNode); err != nil {
			return fail(stderr, fmt.Errorf("--simulate %q: want NODESxGPUS, e.g. 2x8", *sim))
		}
		m, err := topology.Simulate(t, l)
		if err != nil {
			return fail(stderr, err)
		}
		fmt.Fprintf(stdout, "\nPredicted all-reduce, %d node(s) × %d GPUs (NCCL's Simple-protocol model):\n", l.Nodes, l.GPUsPerNode)
		fmt.Fprintf(stdout, "  ring: %d channels, busbw up to %.4g GB/s", m.Channels, m.RingBus)
		if l.Nodes > 1 {
			fmt.Fprintf(stdout, " (%d network ports of %.4g GB/s each; %.4g GB/s per port)", m.NICs, m.NetBW, m.RingBus/float64(m.NICs))
		}
		fmt.Fprintln(stdout)
		if m.HierBus > 0 {
			fmt.Fprintf(stdout, "  tree: busbw up to %.4g GB/s; hier (goccl's hierarchical all-reduce): busbw up to %.4g GB/s\n", m.TreeBus, m.HierBus)
		}
		fmt.Fprintf(stdout, "  %12s %12s %10s %6s", "size (B)", "time (us)", "busbw", "algo")
		each := m.PredictEach(8)
		for _, p := range each {
			fmt.Fprintf(stdout, " %10s", p.Algo+" us")
		}
		fmt.Fprintln(stdout)
		for s := int64(8); s <= 8<<30; s *= 8 {
			// The best of the modelled algorithms, then each one's time.
			each := m.PredictEach(s)
			best := topology.Fastest(each)
			fmt.Fprintf(stdout, "  %12d %12.1f %10.2f %6s", s, best.TimeUs, best.BusBW, best.Algo)
			for _, p := range each {
				fmt.Fprintf(stdout, " %10.1f", p.TimeUs)
			}
			fmt.Fprintln(stdout)
		}
	}
	if *dump != "" {
		f, err := os.Create(*dump)
		if err != nil {
			return fail(stderr, err)
		}
		if strings.EqualFold(filepath.Ext(*dump), ".json") {
			err = sys.WriteJSON(f)
		} else {
			err = sys.WriteXML(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(stderr, err)
		}
		fmt.Fprintf(stdout, "\nWrote %s\n", *dump)
	}
	return 0
}

// summary says what was found: CPUs, GPUs, NICs.
func summary(w io.Writer, t *topology.Topo) {
	for _, h := range t.Sys.Hosts() {
		prefix := ""
		if h != "" {
			prefix = "host " + h + ": "
		}
		var cpus []string
		for _, c := range t.Sys.CPUs {
			if c.HostHash != h {
				continue
			}
			desc := fmt.Sprintf("NUMA %d", c.NUMA)
			if c.Vendor != "" {
				desc += fmt.Sprintf(" (%s family %d model %d)", strings.TrimSpace(c.Vendor), c.Family, c.Model)
			}
			cpus = append(cpus, desc)
		}
		fmt.Fprintf(w, "  %sCPUs: %s\n", prefix, strings.Join(cpus, ", "))
		gpus := t.GPUsOf(h)
		fmt.Fprintf(w, "  %sGPUs: %d\n", prefix, len(gpus))
		var nics []string
		for _, n := range t.NICs {
			if n.Host != h {
				continue
			}
			s := topology.NICName(n) + " at " + n.Name
			if len(n.NICs) > 0 && n.NICs[0].Net != nil && n.NICs[0].Net.Speed > 0 {
				s += fmt.Sprintf(", %d Mb/s", n.NICs[0].Net.Speed)
			}
			nics = append(nics, s)
		}
		if len(nics) == 0 {
			nics = []string{"none"}
		}
		fmt.Fprintf(w, "  %sNICs: %s\n", prefix, strings.Join(nics, "; "))
	}
}

func fail(w io.Writer, err error) int {
	fmt.Fprintln(w, "goccl-topo:", err)
	return 1
}
