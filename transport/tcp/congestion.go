package tcp

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
)

// Congestion control on the data sockets: they do not pace.
//
// BBR, the one congestion control in Linux that paces on its own
// (tcp_bbr.c's bbr_init turns the socket's pacing on), sends a socket's
// data no faster than its estimate of the path's bandwidth, arming a
// high-resolution timer whenever the next segment's departure time is
// still ahead. goccl's connections already bound what they have in
// flight (the credits' window, credit.go), and the timers cost the CPU a
// collective needs: on the VM where goccl is measured, whose default is
// BBR, the root of a 1 MiB loopback broadcast of 2 ranks spent 75 µs an
// operation returning from them (interrupts off under tcp_write_xmit;
// Open MPI's one socket, 20), and the broadcast took 143-257 µs against
// 122-142 with Reno; between two namespaces joined by two 10 Gbit/s
// veths, two rails gave a 64 MiB broadcast 1.64 times one rail's
// bandwidth under BBR and 1.98 under Reno, an all-reduce 1.76 and 2.00
// (docs/performance.md, "BBR's pacing").
//
// So a data socket that would run BBR runs Reno: loss-based and built
// into every kernel, where any process may choose it (it is
// non-restricted), and without loss it neither paces nor shrinks its
// window. Other congestion controls (Cubic, DCTCP) are left as the
// system chose them. The choice is made before the connection starts:
// BBR turns pacing on when it is initialised on an established socket,
// and a later switch keeps the pacing (a build that switched after
// connect(2) gave 140-200 µs). A dialed socket gets it between socket(2)
// and connect(2) (connsetup.Dialer.Control), an accepted one inherits its
// listener's (Listen). Options.Congestion (GOCCL_TCP_CONGESTION) names
// one for every data socket instead, or is CongestionSystem for the
// system's everywhere.

// CongestionSystem, as Options.Congestion, leaves every data socket with
// the system's congestion control.
const CongestionSystem = "system"

// unpaced is what a data socket that would pace uses by default.
const unpaced = "reno"

// congestionFor is the congestion control a data socket whose kernel
// default is current uses under setting ("": Reno for BBR, current
// otherwise; CongestionSystem: current; otherwise that name), "" to leave
// it.
func congestionFor(setting, current string) string {
	switch setting {
	case "":
		if strings.HasPrefix(current, "bbr") {
			return unpaced
		}
		return ""
	case CongestionSystem:
		return ""
	}
	return setting
}

// Congestion is the congestion control the data sockets use under
// setting, as far as this process can tell without making one (the INFO
// summary's tcp_cc): the name setting gives, Reno in place of a BBR
// default, or the system's default; "" where the system does not say.
func Congestion(setting string) string {
	sys := systemCongestion()
	if setting == "" && sys == "" {
		return ""
	}
	if name := congestionFor(setting, sys); name != "" {
		return name
	}
	return sys
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
// that applies setting to a socket. Reno in place of BBR by default is
// best effort (a kernel whose administrator restricted it keeps BBR); a
// named one that the kernel refuses is an error.
func control(setting string) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if setting == CongestionSystem || !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			current := ""
			if setting == "" {
				if current, serr = congestionOf(int(fd)); serr != nil {
					return
				}
			}
			if name := congestionFor(setting, current); name != "" {
				serr = setCongestion(int(fd), name)
			}
		})
		if err != nil {
			return err
		}
		if serr != nil && setting != "" {
			return fmt.Errorf("tcp: congestion control %q on a socket for %s: %w", setting, address, serr)
		}
		return nil
	}
}

// Listen opens a data listener on addr ("host:port") whose accepted
// sockets use the congestion control setting chooses (see
// Options.Congestion).
func Listen(addr, setting string) (net.Listener, error) {
	if err := ValidCongestion(setting); err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	lc := net.ListenConfig{Control: control(setting)}
	return lc.Listen(context.Background(), "tcp", addr)
}
