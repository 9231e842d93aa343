//go:build linux && cgo

package gonvml

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/goccl/goccl/topology"
)

// System is the driver's NVML (libnvidia-ml.so.1, loaded at Init).
func System() topology.NVML { return From(nvml.New()) }

// From adapts a go-nvml interface: the library, or one of go-nvml's
// mock servers (pkg/nvml/mock/dgxa100, dgxh100, ...).
func From(lib nvml.Interface) topology.NVML { return &goNVML{lib: lib} }

// goNVML guards every call: go-nvml aborts the process on calls into a
// library that failed to initialise, so nothing but Init is called until
// Init has succeeded, and nothing after Shutdown.
type goNVML struct {
	lib nvml.Interface
	up  bool
}

var errNotInit = errors.New("NVML is not initialised")

func ret(r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("%s", nvml.ErrorString(r))
}

func (g *goNVML) Init() (err error) {
	defer func() {
		// A library that cannot even be looked up panics in some go-nvml
		// versions; that is "absent", not a crash.
		if p := recover(); p != nil {
			err = fmt.Errorf("NVML init: %v", p)
		}
	}()
	if err := ret(g.lib.Init()); err != nil {
		return err
	}
	g.up = true
	return nil
}

func (g *goNVML) Shutdown() error {
	if !g.up {
		return errNotInit
	}
	g.up = false
	return ret(g.lib.Shutdown())
}

func (g *goNVML) DeviceCount() (int, error) {
	if !g.up {
		return 0, errNotInit
	}
	n, r := g.lib.DeviceGetCount()
	return n, ret(r)
}

func (g *goNVML) Device(i int) (topology.NVMLDevice, error) {
	if !g.up {
		return nil, errNotInit
	}
	d, r := g.lib.DeviceGetHandleByIndex(i)
	if err := ret(r); err != nil {
		return nil, err
	}
	return &goDevice{g: g, d: d}, nil
}

type goDevice struct {
	g *goNVML
	d nvml.Device
}

// busID turns NVML's C string into Go's.
func busID(p nvml.PciInfo) string {
	var b strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

func (d *goDevice) PCIBusID() (string, error) {
	if !d.g.up {
		return "", errNotInit
	}
	p, r := d.d.GetPciInfo()
	if err := ret(r); err != nil {
		return "", err
	}
	if s := busID(p); s != "" {
		return s, nil
	}
	return fmt.Sprintf("%08x:%02x:%02x.0", p.Domain, p.Bus, p.Device), nil
}

func (d *goDevice) ComputeCapability() (int, int, error) {
	if !d.g.up {
		return 0, 0, errNotInit
	}
	maj, mnr, r := d.d.GetCudaComputeCapability()
	return maj, mnr, ret(r)
}

func (d *goDevice) NVLinks() ([]topology.NVLinkInfo, error) {
	if !d.g.up {
		return nil, errNotInit
	}
	var out []topology.NVLinkInfo
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, r := d.d.GetNvLinkState(l)
		if r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_INVALID_ARGUMENT {
			break // no such link (or no NVLink at all)
		}
		if err := ret(r); err != nil {
			return nil, fmt.Errorf("link %d state: %w", l, err)
		}
		if st != nvml.FEATURE_ENABLED {
			continue
		}
		p, r := d.d.GetNvLinkRemotePciInfo(l)
		if err := ret(r); err != nil {
			return nil, fmt.Errorf("link %d remote: %w", l, err)
		}
		info := topology.NVLinkInfo{Link: l, Remote: busID(p), Kind: topology.RemoteUnknown}
		if t, r := d.d.GetNvLinkRemoteDeviceType(l); r == nvml.SUCCESS {
			switch t {
			case nvml.NVLINK_DEVICE_TYPE_GPU:
				info.Kind = topology.RemoteGPU
			case nvml.NVLINK_DEVICE_TYPE_SWITCH:
				info.Kind = topology.RemoteSwitch
			case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
				info.Kind = topology.RemoteCPU
			}
		}
		out = append(out, info)
	}
	return out, nil
}

func (d *goDevice) P2PNVLink(other topology.NVMLDevice) (bool, error) {
	o, ok := other.(*goDevice)
	if !ok {
		return false, fmt.Errorf("not a go-nvml device")
	}
	if !d.g.up {
		return false, errNotInit
	}
	st, r := d.d.GetP2PStatus(o.d, nvml.P2P_CAPS_INDEX_NVLINK)
	if err := ret(r); err != nil {
		return false, err
	}
	return st == nvml.P2P_STATUS_OK, nil
}

func (d *goDevice) CPUAffinity() ([]uint64, error) {
	if !d.g.up {
		return nil, errNotInit
	}
	words, r := d.d.GetCpuAffinity(4)
	if err := ret(r); err != nil {
		return nil, err
	}
	out := make([]uint64, len(words))
	for i, w := range words {
		out[i] = uint64(w)
	}
	return out, nil
}
