package collective

import (
	"context"
	"net"
	"time"

	"github.com/goccl/goccl/internal/netif"
)

// Where listeners bind (issue 19, finding 7): what was asked, not every
// interface. A root at GOCCL_ROOT=127.0.0.1:P listens on loopback alone,
// and so do the data listeners of a job whose root is on loopback, since
// every rank of such a job is on this host.

// rootListenAddr is where rank 0 listens for a root at root ("host:port"):
// on the host itself when it is one of this machine's addresses (loopback
// for 127.0.0.1 or localhost), on the first of this machine's non-loopback
// addresses a host name resolves to, and on every interface otherwise: a
// name that resolves to an address this machine does not have (a NAT, a
// service address), or only to loopback here (Debian and Ubuntu map the
// hostname to 127.0.1.1 in /etc/hosts, while the other hosts resolve it
// through DNS to a routable address).
func rootListenAddr(root string, ifs []netif.Iface) string {
	host, port, err := net.SplitHostPort(root)
	if err != nil || host == "" {
		return net.JoinHostPort("", port)
	}
	local := func(ip net.IP) bool {
		if ip.IsLoopback() {
			return true
		}
		for _, ifc := range ifs {
			for _, a := range ifc.Addrs {
				if a.Equal(ip) {
					return true
				}
			}
		}
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		if local(ip) {
			return net.JoinHostPort(host, port)
		}
		return net.JoinHostPort("", port)
	}
	if host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err == nil {
		for _, a := range ips {
			if !a.IP.IsLoopback() && local(a.IP) {
				return net.JoinHostPort(a.IP.String(), port)
			}
		}
	}
	return net.JoinHostPort("", port)
}

// loopbackRoot reports whether the root address is a loopback one: then
// every rank is on this host.
func loopbackRoot(root string) bool {
	host, _, err := net.SplitHostPort(root)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return host == "localhost"
}

// loopbackAddrs is the loopback address of the family the root uses.
func loopbackAddrs(root string) []netif.Addr {
	host, _, _ := net.SplitHostPort(root)
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return []netif.Addr{{Iface: "lo", IP: net.IPv6loopback}}
	}
	return []netif.Addr{{Iface: "lo", IP: net.IPv4(127, 0, 0, 1)}}
}
