package topology

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// NCCL's topology XML (src/graph/xml.cc reads and writes it): <system
// version="1"> holding <cpu> elements, <pci> devices nested below them,
// <gpu> (with <nvlink> and <c2c>) and <nic> (with <net>) inside PCI
// devices. ReadXML accepts what NCCL accepts: partial files whose GPU and
// NIC slots are empty <pci> elements, attributes it does not know (kept in
// Extra and written back), several hosts told apart by host_hash, and
// NVLinks to NVSwitches or to targets that are not in the file. Elements
// it does not know, or values that do not parse, are errors naming the
// element and its line.

// element is a parsed XML element.
type element struct {
	name     string
	attrs    []xml.Attr
	children []*element
	line     int
}

// parseElements reads the XML into a tree, with line numbers.
func parseElements(r io.Reader) (*element, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	d := xml.NewDecoder(bytes.NewReader(data))
	var root *element
	var stack []*element
	for {
		line, _ := d.InputPos()
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("topology: XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			e := &element{name: t.Name.Local, attrs: t.Attr, line: line}
			if len(stack) == 0 {
				if root != nil {
					return nil, fmt.Errorf("topology: XML line %d: second root element <%s>", line, e.name)
				}
				root = e
			} else {
				p := stack[len(stack)-1]
				p.children = append(p.children, e)
			}
			stack = append(stack, e)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 && len(bytes.TrimSpace(t)) > 0 {
				return nil, fmt.Errorf("topology: XML line %d: text inside <%s>", line, stack[len(stack)-1].name)
			}
		}
	}
	if root == nil {
		return nil, errors.New("topology: XML: no root element")
	}
	return root, nil
}

// attrs reads an element's attributes into typed fields.
type attrs struct {
	e     *element
	known map[string]bool
	err   error
}

func newAttrs(e *element) *attrs { return &attrs{e: e, known: map[string]bool{}} }

func (a *attrs) fail(name, val, want string) {
	if a.err == nil {
		a.err = fmt.Errorf("topology: XML line %d: <%s %s=%q>: %s", a.e.line, a.e.name, name, val, want)
	}
}

func (a *attrs) get(name string) (string, bool) {
	a.known[name] = true
	for _, x := range a.e.attrs {
		if x.Name.Local == name {
			return x.Value, true
		}
	}
	return "", false
}

func (a *attrs) str(name string, dst *string) {
	if v, ok := a.get(name); ok {
		*dst = v
	}
}

func (a *attrs) num(name string, dst *int) {
	v, ok := a.get(name)
	if !ok || strings.TrimSpace(v) == "" {
		return
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 0, 64)
	if err != nil {
		a.fail(name, v, "want an integer")
		return
	}
	*dst = int(n)
}

func (a *attrs) float(name string, dst *float64) {
	v, ok := a.get(name)
	if !ok || strings.TrimSpace(v) == "" {
		return
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		a.fail(name, v, "want a number")
		return
	}
	*dst = f
}

func (a *attrs) flag(name string, dst *bool) {
	n := 0
	a.num(name, &n)
	*dst = n != 0
}

// extra returns the attributes not read.
func (a *attrs) extra() []Attr {
	var out []Attr
	for _, x := range a.e.attrs {
		if !a.known[x.Name.Local] {
			out = append(out, Attr{Name: x.Name.Local, Value: x.Value})
		}
	}
	return out
}

func unexpected(e, parent *element) error {
	return fmt.Errorf("topology: XML line %d: unexpected <%s> inside <%s>", e.line, e.name, parent.name)
}

// ReadXML parses NCCL's topology XML.
func ReadXML(r io.Reader) (*System, error) {
	root, err := parseElements(r)
	if err != nil {
		return nil, err
	}
	if root.name != "system" {
		return nil, fmt.Errorf("topology: XML line %d: root element <%s>, want <system>", root.line, root.name)
	}
	s := &System{}
	a := newAttrs(root)
	a.num("version", &s.Version)
	s.Extra = a.extra()
	if a.err != nil {
		return nil, a.err
	}
	for _, c := range root.children {
		if c.name != "cpu" {
			return nil, unexpected(c, root)
		}
		cpu, err := readCPU(c)
		if err != nil {
			return nil, err
		}
		s.CPUs = append(s.CPUs, cpu)
	}
	return s, nil
}

func readCPU(e *element) (*CPU, error) {
	c := &CPU{NUMA: -1, Line: e.line}
	a := newAttrs(e)
	a.num("numaid", &c.NUMA)
	a.str("affinity", &c.Affinity)
	a.str("arch", &c.Arch)
	a.str("vendor", &c.Vendor)
	a.num("familyid", &c.Family)
	a.num("modelid", &c.Model)
	a.str("host_hash", &c.HostHash)
	c.Extra = a.extra()
	if a.err != nil {
		return nil, a.err
	}
	for _, ch := range e.children {
		switch ch.name {
		case "pci":
			p, err := readPCI(ch)
			if err != nil {
				return nil, err
			}
			c.PCI = append(c.PCI, p)
		case "nic":
			n, err := readNIC(ch)
			if err != nil {
				return nil, err
			}
			c.NICs = append(c.NICs, n)
		default:
			return nil, unexpected(ch, e)
		}
	}
	return c, nil
}

func readPCI(e *element) (*PCI, error) {
	p := &PCI{Line: e.line}
	a := newAttrs(e)
	a.str("busid", &p.BusID)
	a.str("class", &p.Class)
	a.str("vendor", &p.Vendor)
	a.str("device", &p.Device)
	a.str("subsystem_vendor", &p.SubVendor)
	a.str("subsystem_device", &p.SubDevice)
	a.str("link_speed", &p.LinkSpeed)
	a.num("link_width", &p.LinkWidth)
	p.Extra = a.extra()
	if a.err != nil {
		return nil, a.err
	}
	if p.BusID == "" {
		return nil, fmt.Errorf("topology: XML line %d: <pci> without busid", e.line)
	}
	if !validBusID(p.BusID) {
		return nil, fmt.Errorf("topology: XML line %d: <pci busid=%q>: want dddd:bb:dd.f", e.line, p.BusID)
	}
	for _, ch := range e.children {
		switch ch.name {
		case "pci":
			c, err := readPCI(ch)
			if err != nil {
				return nil, err
			}
			p.Children = append(p.Children, c)
		case "gpu":
			if p.GPU != nil {
				return nil, fmt.Errorf("topology: XML line %d: second <gpu> in <pci busid=%q>", ch.line, p.BusID)
			}
			g, err := readGPU(ch)
			if err != nil {
				return nil, err
			}
			p.GPU = g
		case "nic":
			if p.NIC != nil {
				return nil, fmt.Errorf("topology: XML line %d: second <nic> in <pci busid=%q>", ch.line, p.BusID)
			}
			n, err := readNIC(ch)
			if err != nil {
				return nil, err
			}
			p.NIC = n
		default:
			return nil, unexpected(ch, e)
		}
	}
	return p, nil
}

// validBusID accepts PCI bus ids as NCCL and sysfs write them:
// [domain:]bus:device.function in hex.
func validBusID(s string) bool {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return false
	}
	last := parts[len(parts)-1]
	df := strings.Split(last, ".")
	if len(df) != 2 {
		return false
	}
	for _, f := range append(parts[:len(parts)-1], df...) {
		if f == "" {
			return false
		}
		if _, err := strconv.ParseUint(f, 16, 32); err != nil {
			return false
		}
	}
	return true
}

func readGPU(e *element) (*GPU, error) {
	g := &GPU{Rank: -1, Line: e.line}
	a := newAttrs(e)
	a.num("dev", &g.Dev)
	a.num("sm", &g.SM)
	a.num("rank", &g.Rank)
	a.flag("gdr", &g.GDR)
	g.Extra = a.extra()
	if a.err != nil {
		return nil, a.err
	}
	for _, ch := range e.children {
		switch ch.name {
		case "nvlink":
			l := &NVLink{Line: ch.line}
			a := newAttrs(ch)
			a.str("target", &l.Target)
			a.num("count", &l.Count)
			a.str("tclass", &l.TClass)
			l.Extra = a.extra()
			if a.err != nil {
				return nil, a.err
			}
			if l.Target == "" {
				return nil, fmt.Errorf("topology: XML line %d: <nvlink> without target", ch.line)
			}
			g.NVLinks = append(g.NVLinks, l)
		case "c2c":
			c := &C2C{}
			a := newAttrs(ch)
			a.float("bw", &c.BW)
			a.num("count", &c.Count)
			c.Extra = a.extra()
			if a.err != nil {
				return nil, a.err
			}
			g.C2C = append(g.C2C, c)
		default:
			return nil, unexpected(ch, e)
		}
	}
	return g, nil
}

func readNIC(e *element) (*NIC, error) {
	n := &NIC{Line: e.line}
	a := newAttrs(e)
	n.Extra = a.extra()
	for _, ch := range e.children {
		if ch.name != "net" {
			return nil, unexpected(ch, e)
		}
		t := &Net{Line: ch.line}
		a := newAttrs(ch)
		a.str("name", &t.Name)
		a.num("dev", &t.Dev)
		a.num("speed", &t.Speed)
		a.num("port", &t.Port)
		a.float("latency", &t.Latency)
		a.str("guid", &t.GUID)
		a.num("maxconn", &t.MaxConn)
		a.flag("gdr", &t.GDR)
		a.flag("coll", &t.Coll)
		t.Extra = a.extra()
		if a.err != nil {
			return nil, a.err
		}
		n.Nets = append(n.Nets, t)
	}
	return n, nil
}

// xmlWriter writes elements with two-space indentation, as NCCL's dump.
type xmlWriter struct {
	b     strings.Builder
	depth int
}

type kv struct{ k, v string }

func (w *xmlWriter) open(name string, attrs []kv, extra []Attr, empty bool) {
	w.b.WriteString(strings.Repeat("  ", w.depth))
	w.b.WriteString("<" + name)
	for _, a := range attrs {
		w.attr(a.k, a.v)
	}
	for _, a := range extra {
		w.attr(a.Name, a.Value)
	}
	if empty {
		w.b.WriteString("/>\n")
		return
	}
	w.b.WriteString(">\n")
	w.depth++
}

func (w *xmlWriter) attr(k, v string) {
	var esc bytes.Buffer
	xml.EscapeText(&esc, []byte(v))
	fmt.Fprintf(&w.b, " %s=\"%s\"", k, strings.ReplaceAll(esc.String(), `"`, "&quot;"))
}

func (w *xmlWriter) close(name string) {
	w.depth--
	w.b.WriteString(strings.Repeat("  ", w.depth) + "</" + name + ">\n")
}

// set appends k=v when v is not empty.
func set(attrs []kv, k, v string) []kv {
	if v != "" {
		attrs = append(attrs, kv{k, v})
	}
	return attrs
}

func nz(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

func b01(b bool) string {
	if b {
		return "1"
	}
	return ""
}

// WriteXML writes s as NCCL topology XML, which NCCL_TOPO_FILE accepts.
func (s *System) WriteXML(out io.Writer) error {
	var w xmlWriter
	w.open("system", []kv{{"version", strconv.Itoa(max(s.Version, 1))}}, s.Extra, len(s.CPUs) == 0)
	for _, c := range s.CPUs {
		var at []kv
		if c.HostHash != "" {
			at = append(at, kv{"host_hash", c.HostHash})
		}
		at = append(at, kv{"numaid", strconv.Itoa(c.NUMA)})
		at = set(at, "affinity", c.Affinity)
		at = set(at, "arch", c.Arch)
		at = set(at, "vendor", c.Vendor)
		at = set(at, "familyid", nz(c.Family))
		at = set(at, "modelid", nz(c.Model))
		w.open("cpu", at, c.Extra, len(c.PCI) == 0 && len(c.NICs) == 0)
		for _, p := range c.PCI {
			w.pci(p)
		}
		for _, n := range c.NICs {
			w.nic(n)
		}
		if len(c.PCI) > 0 || len(c.NICs) > 0 {
			w.close("cpu")
		}
	}
	if len(s.CPUs) > 0 {
		w.close("system")
	}
	_, err := io.WriteString(out, w.b.String())
	return err
}

func (w *xmlWriter) pci(p *PCI) {
	at := []kv{{"busid", p.BusID}}
	at = set(at, "class", p.Class)
	at = set(at, "vendor", p.Vendor)
	at = set(at, "device", p.Device)
	at = set(at, "subsystem_vendor", p.SubVendor)
	at = set(at, "subsystem_device", p.SubDevice)
	at = set(at, "link_speed", p.LinkSpeed)
	at = set(at, "link_width", nz(p.LinkWidth))
	empty := len(p.Children) == 0 && p.GPU == nil && p.NIC == nil
	w.open("pci", at, p.Extra, empty)
	if empty {
		return
	}
	if g := p.GPU; g != nil {
		gat := []kv{{"dev", strconv.Itoa(g.Dev)}, {"sm", strconv.Itoa(g.SM)}}
		if g.Rank >= 0 {
			gat = append(gat, kv{"rank", strconv.Itoa(g.Rank)})
		}
		gat = set(gat, "gdr", b01(g.GDR))
		gEmpty := len(g.NVLinks) == 0 && len(g.C2C) == 0
		w.open("gpu", gat, g.Extra, gEmpty)
		for _, l := range g.NVLinks {
			w.open("nvlink", set([]kv{{"target", l.Target}, {"count", strconv.Itoa(l.Count)}}, "tclass", l.TClass), l.Extra, true)
		}
		for _, c := range g.C2C {
			w.open("c2c", []kv{{"bw", strconv.FormatFloat(c.BW, 'g', -1, 64)}, {"count", strconv.Itoa(c.Count)}}, c.Extra, true)
		}
		if !gEmpty {
			w.close("gpu")
		}
	}
	if p.NIC != nil {
		w.nic(p.NIC)
	}
	for _, c := range p.Children {
		w.pci(c)
	}
	w.close("pci")
}

func (w *xmlWriter) nic(n *NIC) {
	w.open("nic", nil, n.Extra, len(n.Nets) == 0)
	if len(n.Nets) == 0 {
		return
	}
	for _, t := range n.Nets {
		at := []kv{{"name", t.Name}, {"dev", strconv.Itoa(t.Dev)}}
		at = set(at, "speed", nz(t.Speed))
		at = set(at, "port", nz(t.Port))
		if t.Latency != 0 {
			at = append(at, kv{"latency", strconv.FormatFloat(t.Latency, 'g', -1, 64)})
		}
		at = set(at, "guid", t.GUID)
		at = set(at, "maxconn", nz(t.MaxConn))
		at = set(at, "gdr", b01(t.GDR))
		at = set(at, "coll", b01(t.Coll))
		w.open("net", at, t.Extra, true)
	}
	w.close("nic")
}
