// Package gonvml adapts NVIDIA's go-nvml to topology.NVML: System is the
// driver's NVML (libnvidia-ml.so.1, loaded when discovery calls Init),
// From wraps any go-nvml interface, go-nvml's mock servers included.
//
// It is a leaf package of its own because go-nvml needs cgo on Linux:
// package topology stays pure Go, so the library's core (the collective
// package, which reads the PCI topology for GPUDirect decisions) builds
// without cgo, and only what asks NVML for GPUs (cmd/goccl-topo) links
// it. Without cgo System reports NVML as absent, saying why.
package gonvml
