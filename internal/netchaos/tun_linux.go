//go:build linux

package netchaos

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// inNetns calls f on a new goroutine locked to an OS thread that has
// joined the network namespace ns, and returns f's error. What f creates
// there, sockets and TUN devices, belongs to ns for its whole life and may
// be used from any goroutine afterwards; but goroutines that f starts run
// on other threads, outside ns. The thread is never unlocked, so the
// runtime ends it when f returns instead of running other goroutines in ns.
func inNetns(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			path := nsPath(ns)
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("netchaos: network namespace %q: %w", path, err)
			}
			defer unix.Close(fd)
			if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("netchaos: joining network namespace %q: %w", path, err)
			}
			return f()
		}()
	}()
	return <-errc
}

// nsPath is where the namespace ns is: ns itself if it is a path, else
// where `ip netns add` put it.
func nsPath(ns string) string {
	if strings.Contains(ns, "/") {
		return ns
	}
	p := "/run/netns/" + ns
	if _, err := os.Stat(p); err != nil {
		if _, err := os.Stat("/var/run/netns/" + ns); err == nil {
			return "/var/run/netns/" + ns
		}
	}
	return p
}

// openTUN creates e's TUN device inside e's namespace, with address e.Addr
// and peer (the other end's address), and returns it open for reading and
// writing packets. The device lives as long as the file.
func openTUN(e End, peer netip.Addr) (*os.File, error) {
	var f *os.File
	err := inNetns(e.Netns, func() error {
		// The device belongs to the namespace of the thread that opens
		// /dev/net/tun (tun_chr_open takes current's net namespace).
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("netchaos: opening /dev/net/tun in %q: %w", e.Netns, err)
		}
		ifr, err := unix.NewIfreq(e.Dev)
		if err == nil {
			ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err == nil {
			err = configure(e.Dev, e.Addr, peer)
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("netchaos: TUN device %q in %q: %w", e.Dev, e.Netns, err)
		}
		// Non-blocking, so the file goes into the runtime's poller and
		// Close wakes a blocked Read.
		f = os.NewFile(uintptr(fd), e.Netns+"/"+e.Dev)
		return nil
	})
	return f, err
}

// configure sets up the device dev of the calling thread's namespace:
// IPv6 off, MTU, a point-to-point IPv4 address (a /32 with a route to
// peer), up; and loopback up. It uses the classic interface ioctls, which
// need no netlink and no `ip` command.
func configure(dev string, addr, peer netip.Addr) error {
	// /proc/sys/net shows the namespace of the thread that looks.
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1\n"), 0)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("disabling IPv6: %w", err)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	ioctl := func(what, name string, req uint, set func(*unix.Ifreq) error) error {
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			err = set(ifr)
		}
		if err == nil {
			err = unix.IoctlIfreq(s, req, ifr)
		}
		if err != nil {
			return fmt.Errorf("%s of %s: %w", what, name, err)
		}
		return nil
	}
	up := func(name string) error {
		return ioctl("setting up", name, unix.SIOCSIFFLAGS, func(ifr *unix.Ifreq) error {
			if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
				return err
			}
			ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
			return nil
		})
	}
	// On a point-to-point device (a TUN is one) SIOCSIFADDR makes a /32
	// and SIOCSIFDSTADDR names the peer, which gets a route via dev.
	if err := ioctl("MTU", dev, unix.SIOCSIFMTU, func(ifr *unix.Ifreq) error { ifr.SetUint32(mtu); return nil }); err != nil {
		return err
	}
	if err := ioctl("address", dev, unix.SIOCSIFADDR, func(ifr *unix.Ifreq) error { return ifr.SetInet4Addr(addr.AsSlice()) }); err != nil {
		return err
	}
	if err := ioctl("peer address", dev, unix.SIOCSIFDSTADDR, func(ifr *unix.Ifreq) error { return ifr.SetInet4Addr(peer.AsSlice()) }); err != nil {
		return err
	}
	if err := up(dev); err != nil {
		return err
	}
	return up("lo")
}
