//go:build !(linux && cgo)

package gonvml

import (
	"fmt"

	"github.com/goccl/goccl/topology"
)

// System reports NVML as absent: go-nvml needs cgo on Linux.
func System() topology.NVML { return noNVML{} }

type noNVML struct{}

func (noNVML) Init() error {
	return fmt.Errorf("%w: this build has no cgo (go-nvml needs it)", topology.ErrNoNVML)
}
func (noNVML) Shutdown() error                         { return nil }
func (noNVML) DeviceCount() (int, error)               { return 0, topology.ErrNoNVML }
func (noNVML) Device(int) (topology.NVMLDevice, error) { return nil, topology.ErrNoNVML }
