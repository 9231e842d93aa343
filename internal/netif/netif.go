// Package netif chooses the network interfaces goccl listens and connects
// on, and names the host a process runs on.
//
// Interface choice follows NCCL_SOCKET_IFNAME (GOCCL_SOCKET_IFNAME here):
// a comma-separated list of interface-name prefixes to use; a leading ^
// turns the list into prefixes to avoid; a leading = (after any ^) makes
// the names exact instead of prefixes. Without a spec, every interface that
// is up is a candidate except loopback and container bridges (docker*,
// virbr*, veth* host ends... see defaultExclude), and loopback is used only
// when nothing else is. IPv4 addresses come before IPv6 ones, global
// before link-local; link-local IPv6 addresses carry their zone.
package netif

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
)

// Iface is what Select needs to know about an interface.
type Iface struct {
	Name     string
	Up       bool
	Loopback bool
	Addrs    []net.IP
}

// Addr is a chosen address.
type Addr struct {
	Iface string
	IP    net.IP
}

// Host returns the address as a host for net.JoinHostPort (with the zone
// of a link-local IPv6 address).
func (a Addr) Host() string {
	if a.IP.To4() == nil && a.IP.IsLinkLocalUnicast() {
		return a.IP.String() + "%" + a.Iface
	}
	return a.IP.String()
}

// defaultExclude lists interface prefixes skipped without a spec, as NCCL
// skips docker and loopback by default (src/misc/socket.cc).
var defaultExclude = []string{"docker", "virbr", "lo"}

// System lists this host's interfaces.
func System() ([]Iface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]Iface, 0, len(ifs))
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		x := Iface{Name: ifc.Name, Up: ifc.Flags&net.FlagUp != 0, Loopback: ifc.Flags&net.FlagLoopback != 0}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				x.Addrs = append(x.Addrs, ipn.IP)
			}
		}
		out = append(out, x)
	}
	return out, nil
}

type spec struct {
	exclude, exact bool
	names          []string
}

func parseSpec(s string) (spec, error) {
	var sp spec
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "^") {
		sp.exclude, s = true, s[1:]
	}
	if strings.HasPrefix(s, "=") {
		sp.exact, s = true, s[1:]
	}
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			sp.names = append(sp.names, n)
		}
	}
	if len(sp.names) == 0 {
		return sp, fmt.Errorf("interface spec %q names no interface (want e.g. eth0, ^docker, =ib0,ib1)", s)
	}
	return sp, nil
}

func (sp spec) matches(name string) bool {
	for _, n := range sp.names {
		if (sp.exact && name == n) || (!sp.exact && strings.HasPrefix(name, n)) {
			return true
		}
	}
	return false
}

// Select returns the usable addresses of ifs under spec (GOCCL_SOCKET_IFNAME
// syntax; "" for the default), best first. It fails, listing what it saw,
// when nothing matches.
func Select(ifs []Iface, specStr string) ([]Addr, error) {
	var sp spec
	if specStr != "" {
		var err error
		if sp, err = parseSpec(specStr); err != nil {
			return nil, err
		}
	}
	var picked, loop []Addr
	for _, ifc := range ifs {
		if !ifc.Up {
			continue
		}
		ok := true
		switch {
		case specStr != "":
			ok = sp.matches(ifc.Name) != sp.exclude
		case ifc.Loopback:
			ok = false
		default:
			for _, p := range defaultExclude {
				if strings.HasPrefix(ifc.Name, p) {
					ok = false
				}
			}
		}
		for _, ip := range ifc.Addrs {
			if ip.IsUnspecified() || ip.IsMulticast() {
				continue
			}
			a := Addr{Iface: ifc.Name, IP: ip}
			if ok {
				picked = append(picked, a)
			} else if specStr == "" && ifc.Loopback {
				loop = append(loop, a)
			}
		}
	}
	if len(picked) == 0 {
		picked = loop // loopback when it is all there is
	}
	if len(picked) == 0 {
		var seen []string
		for _, ifc := range ifs {
			state := "down"
			if ifc.Up {
				state = "up"
			}
			seen = append(seen, fmt.Sprintf("%s(%s,%d addrs)", ifc.Name, state, len(ifc.Addrs)))
		}
		return nil, fmt.Errorf("no usable network interface for GOCCL_SOCKET_IFNAME=%q among %s", specStr, strings.Join(seen, " "))
	}
	rank := func(a Addr) int {
		switch {
		case a.IP.To4() != nil && !a.IP.IsLinkLocalUnicast():
			return 0
		case a.IP.To4() == nil && !a.IP.IsLinkLocalUnicast():
			return 1
		case a.IP.To4() != nil:
			return 2
		}
		return 3
	}
	sort.SliceStable(picked, func(i, j int) bool { return rank(picked[i]) < rank(picked[j]) })
	return picked, nil
}

// PerInterface keeps the first (best) address of each interface in addrs,
// in order: the addresses a rank listens on when it uses several NICs.
func PerInterface(addrs []Addr) []Addr {
	seen := map[string]bool{}
	var out []Addr
	for _, a := range addrs {
		if !seen[a.Iface] {
			seen[a.Iface] = true
			out = append(out, a)
		}
	}
	return out
}

// Speed returns interface name's link speed in bytes per second as its
// driver reports it (/sys/class/net/NAME/speed, in megabits per second),
// or false where it reports none: loopback and some virtual NICs cannot
// be read, others say -1.
func Speed(name string) (float64, bool) { return speedIn("/sys/class/net", name) }

func speedIn(root, name string) (float64, bool) {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return 0, false
	}
	b, err := os.ReadFile(root + "/" + name + "/speed")
	if err != nil {
		return 0, false
	}
	var mbps int64
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &mbps); err != nil || mbps <= 0 {
		return 0, false
	}
	return float64(mbps) * 1e6 / 8, true
}

// HostID names the host this process runs on: GOCCL_HOSTID when set (so
// that network namespaces on one machine can count as hosts), else the
// hostname and machine, the kernel's boot id (MachineID), so that two
// machines cloned from one image with the same hostname still differ.
func HostID(lookup func(string) (string, bool), machine string) (string, error) {
	if v, ok := lookup("GOCCL_HOSTID"); ok && v != "" {
		return v, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("host identity: %w", err)
	}
	if machine != "" {
		return h + "/" + machine, nil
	}
	return h, nil
}

// MachineID names the kernel this process runs under, its boot id, or ""
// where the system has none. Processes with one machine id share its CPUs
// whatever host ids they were given: network namespaces or containers of
// one machine counted as hosts (GOCCL_HOSTID) still compete for its cores.
func MachineID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
