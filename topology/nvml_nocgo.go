//go:build !(linux && cgo)

package topology

import "fmt"

// SystemNVML reports NVML as absent: go-nvml needs cgo on Linux.
func SystemNVML() NVML { return noNVML{} }

type noNVML struct{}

func (noNVML) Init() error {
	return fmt.Errorf("%w: this build has no cgo (go-nvml needs it)", ErrNoNVML)
}
func (noNVML) Shutdown() error                { return nil }
func (noNVML) DeviceCount() (int, error)      { return 0, ErrNoNVML }
func (noNVML) Device(int) (NVMLDevice, error) { return nil, ErrNoNVML }
