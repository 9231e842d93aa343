package tcp

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// setCongestion sets fd's TCP congestion control (TCP_CONGESTION, tcp(7)),
// saying what the kernel's refusal means.
func setCongestion(fd int, name string) error {
	err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, name)
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: this kernel has no such congestion control (it has those in /proc/sys/net/ipv4/tcp_available_congestion_control)", err)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w: a process without CAP_NET_ADMIN may choose only those in /proc/sys/net/ipv4/tcp_allowed_congestion_control", err)
	}
	return err
}

// congestionOf reads fd's TCP congestion control.
func congestionOf(fd int) (string, error) {
	return unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
}

// systemCongestion is the default congestion control of this process's
// network namespace, "" if unknown.
func systemCongestion() string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
