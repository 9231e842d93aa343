package tcp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// Congestion control on the data sockets.
//
// A kernel whose default congestion control paces (BBR sets every
// socket's pacing on when it starts on it) sends a socket's data no faster
// than its estimate of the path's bandwidth, arming a high-resolution
// timer whenever the next segment's departure time is still ahead. Over
// loopback there is no path to protect: no queue, no loss. On the VM
// where goccl is measured (net.ipv4.tcp_congestion_control = bbr), a
// 1 MiB TCP broadcast of 2 ranks took 143-257 µs with the system's BBR
// and 122-142 with Reno (docs/performance.md, "BBR's pacing over
// loopback"): the root's samples at the timer's interrupt-off exit
// (_raw_spin_unlock_irqrestore under tcp_write_xmit) were 75 µs an
// operation, Open MPI's 20, its single socket's estimate being larger.
//
// So a data socket of a connection inside one host, which over TCP is a
// loopback one (a job whose root is on loopback listens and dials there
// only), uses Reno: loss-based, so without loss it never paces nor
// shrinks its window, and every kernel lets any process choose it (it is
// built in and non-restricted). The choice must be made before the
// connection starts: BBR turns pacing on when it is initialised on an
// established socket, and a later switch keeps the pacing. A dialed
// socket gets it between socket(2) and connect(2); an accepted one
// inherits its listener's, so the listener is made with it (Listen).
// Sockets between hosts keep the system's choice, which is the operator's
// to make for the network they run; Options.Congestion (the
// GOCCL_TCP_CONGESTION setting) names one for every data socket instead,
// or CongestionSystem for none.

// CongestionSystem, as Options.Congestion, leaves every data socket with
// the system's congestion control.
const CongestionSystem = "system"

// loopbackCongestion is what a loopback data socket uses by default.
const loopbackCongestion = "reno"

// congestionFor is the congestion control a data socket to or at ip uses
// under setting ("": loopback ones Reno, the others the system's;
// CongestionSystem: the system's; otherwise that name), "" for the
// system's.
func congestionFor(setting string, ip netip.Addr) string {
	switch setting {
	case "":
		if ip.IsLoopback() {
			return loopbackCongestion
		}
		return ""
	case CongestionSystem:
		return ""
	}
	return setting
}

// ValidCongestion checks a congestion-control setting's form: empty,
// CongestionSystem, or a name as the kernel spells them (1 to 15
// lower-case letters, digits, '_' and '-'). Whether the kernel has it is
// known only when a socket asks.
func ValidCongestion(setting string) error {
	if setting == "" || setting == CongestionSystem {
		return nil
	}
	if len(setting) > 15 {
		return fmt.Errorf("congestion control %q: longer than 15 bytes", setting)
	}
	for _, r := range setting {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("congestion control %q: %q is not a letter, digit, '_' or '-'", setting, r)
		}
	}
	return nil
}

// control returns the net.Dialer and net.ListenConfig Control function
// that applies setting to a socket for address (the peer's when dialing,
// its own when listening). Reno by default on loopback is best effort (a
// kernel whose administrator restricted it keeps its own); a named one
// that the kernel refuses is an error.
func control(setting string) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return nil // not an IP socket: nothing to choose
		}
		name := congestionFor(setting, ap.Addr().Unmap())
		if name == "" {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) { serr = setCongestion(int(fd), name) }); err != nil {
			return err
		}
		if serr != nil && setting != "" {
			return fmt.Errorf("tcp: congestion control %q on a socket for %s: %w", name, address, serr)
		}
		return nil
	}
}

// Listen opens a data listener on addr ("host:port") whose accepted
// sockets use the congestion control setting chooses for addr's host (see
// Options.Congestion).
func Listen(addr, setting string) (net.Listener, error) {
	if err := ValidCongestion(setting); err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	lc := net.ListenConfig{Control: control(setting)}
	return lc.Listen(context.Background(), "tcp", addr)
}
