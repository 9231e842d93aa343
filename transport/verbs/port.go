package verbs

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// HCASpec is a parsed NCCL_IB_HCA: a list of devices, each optionally
// with a port ("mlx5_0:1,mlx5_1"); a leading "^" excludes the listed
// devices instead, a leading "=" matches names exactly (otherwise a name
// matches every device it is a prefix of, as NCCL does).
type HCASpec struct {
	Exclude bool
	Exact   bool
	Entries []HCAEntry
}

// HCAEntry is one device of an HCASpec; Port 0 means any port.
type HCAEntry struct {
	Name string
	Port int
}

// ParseHCA parses s (GOCCL_IB_HCA).
func ParseHCA(s string) (HCASpec, error) {
	var h HCASpec
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "^") {
		h.Exclude, s = true, s[1:]
	}
	if strings.HasPrefix(s, "=") {
		h.Exact, s = true, s[1:]
	}
	if s == "" {
		if h.Exclude || h.Exact {
			return h, errors.New("GOCCL_IB_HCA: a ^ or = with no device after it")
		}
		return h, nil
	}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		name, port, hasPort := strings.Cut(f, ":")
		e := HCAEntry{Name: name}
		if name == "" {
			return h, fmt.Errorf("GOCCL_IB_HCA %q: an empty device name", s)
		}
		if hasPort {
			p, err := strconv.Atoi(port)
			if err != nil || p < 1 || p > 255 {
				return h, fmt.Errorf("GOCCL_IB_HCA %q: port %q of %s is not a number from 1 to 255", s, port, name)
			}
			e.Port = p
		}
		h.Entries = append(h.Entries, e)
	}
	return h, nil
}

// Allows reports whether the spec lets port of device name be used.
func (h HCASpec) Allows(name string, port int) bool {
	if len(h.Entries) == 0 {
		return true
	}
	match := false
	for _, e := range h.Entries {
		nameOK := e.Name == name || !h.Exact && strings.HasPrefix(name, e.Name)
		if nameOK && (e.Port == 0 || e.Port == port) {
			match = true
		}
	}
	return match != h.Exclude
}

// Port is the device port an endpoint uses.
type Port struct {
	Ctx    ibv.Context
	Device ibv.DeviceInfo
	Num    int
	Attr   ibv.PortAttr
	GID    ibv.GID
	GIDIdx int // -1 on InfiniBand without a GRH
}

// String describes the port for logs and the INFO line.
func (p *Port) String() string {
	s := fmt.Sprintf("%s:%d %v", p.Device.Name, p.Num, p.Attr.LinkLayer)
	if r := p.Attr.Rate(); r > 0 {
		s += fmt.Sprintf(" %.0f Gbit/s", r)
	}
	if p.GIDIdx >= 0 {
		s += fmt.Sprintf(" GID %d (%v)", p.GIDIdx, p.GID)
	} else {
		s += fmt.Sprintf(" LID %d", p.Attr.LID)
	}
	if p.Device.Emulated {
		s += " [emulated test device, not RDMA hardware]"
	}
	return s
}

// OpenPort opens the first active port that spec allows, and chooses its
// GID (gidIndex ≥ 0 forces one).
func OpenPort(pr ibv.Provider, spec HCASpec, gidIndex int) (*Port, error) {
	return OpenPortPreferring(pr, spec, gidIndex, nil)
}

// OpenPortPreferring is OpenPort trying the devices in the order of
// rank (lower first; ties in the provider's order): the one nearest the
// rank's GPU first, say. A nil rank keeps the provider's order.
func OpenPortPreferring(pr ibv.Provider, spec HCASpec, gidIndex int, rank func(name string) int) (*Port, error) {
	devs, err := pr.Devices()
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, ibv.ErrNoDevice
	}
	devs = preferDevices(devs, rank)
	var why []string
	for _, d := range devs {
		allowed := false
		for p := 1; p <= d.Ports; p++ {
			allowed = allowed || spec.Allows(d.Name, p)
		}
		if !allowed {
			why = append(why, d.Name+": excluded by GOCCL_IB_HCA")
			continue
		}
		ctx, err := pr.Open(d.Name)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", d.Name, err))
			continue
		}
		for p := 1; p <= d.Ports; p++ {
			if !spec.Allows(d.Name, p) {
				continue
			}
			a, err := ctx.QueryPort(p)
			if err != nil {
				why = append(why, fmt.Sprintf("%s:%d: %v", d.Name, p, err))
				continue
			}
			if a.State != ibv.PortActive {
				why = append(why, fmt.Sprintf("%s:%d is %v", d.Name, p, a.State))
				continue
			}
			port := &Port{Ctx: ctx, Device: ctx.Info(), Num: p, Attr: a, GIDIdx: -1}
			if err := port.chooseGID(gidIndex); err != nil {
				why = append(why, fmt.Sprintf("%s:%d: %v", d.Name, p, err))
				continue
			}
			return port, nil
		}
		ctx.Close()
	}
	return nil, fmt.Errorf("%w usable: %s", ibv.ErrNoDevice, strings.Join(why, "; "))
}

// chooseGID picks the port's GID as NCCL does: on RoCE the RoCE v2 entry
// of an IPv4 address (::ffff:a.b.c.d), else a RoCE v2 entry that is not
// link-local, else any non-empty one that is not link-local; on
// InfiniBand entry 0, used only across subnets (the LID addresses it).
func (p *Port) chooseGID(force int) error {
	if force >= 0 {
		if force >= p.Attr.GIDTblLen {
			return fmt.Errorf("GOCCL_IB_GID_INDEX %d: the GID table has %d entries", force, p.Attr.GIDTblLen)
		}
		g, _, err := p.Ctx.QueryGID(p.Num, force)
		if err != nil {
			return err
		}
		if g.IsZero() {
			return fmt.Errorf("GOCCL_IB_GID_INDEX %d is an empty entry", force)
		}
		p.GID, p.GIDIdx = g, force
		return nil
	}
	if p.Attr.LinkLayer != ibv.LinkEthernet {
		g, _, err := p.Ctx.QueryGID(p.Num, 0)
		if err == nil && !g.IsZero() {
			p.GID = g // the GRH is used only where DLIDs do not reach
		}
		return nil
	}
	best, bestRank := -1, 0
	for i := 0; i < p.Attr.GIDTblLen; i++ {
		g, t, err := p.Ctx.QueryGID(p.Num, i)
		if err != nil || g.IsZero() || g.LinkLocal() {
			continue
		}
		rank := 1
		if t == ibv.GIDRoCEv2 {
			rank = 2
			if _, v4 := g.IPv4(); v4 {
				rank = 3
			}
		}
		if rank > bestRank {
			best, bestRank = i, rank
			p.GID = g
		}
	}
	if best < 0 {
		return errors.New("no GID that routes (only link-local or empty entries): set GOCCL_IB_GID_INDEX")
	}
	p.GIDIdx = best
	return nil
}

// preferDevices returns devs sorted by rank, stably; devs itself when
// rank is nil.
func preferDevices(devs []ibv.DeviceInfo, rank func(name string) int) []ibv.DeviceInfo {
	if rank == nil {
		return devs
	}
	out := slices.Clone(devs)
	slices.SortStableFunc(out, func(a, b ibv.DeviceInfo) int { return rank(a.Name) - rank(b.Name) })
	return out
}
