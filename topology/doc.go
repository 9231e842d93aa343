// Package topology reads the machine into a document, the document into a
// graph, and the graph into paths, rings and trees, as NCCL does in
// src/graph (topo.cc, paths.cc, search.cc), so that the tuner's link model
// comes from the hardware.
//
// The document (System) has the shape of NCCL's topology XML: CPUs (NUMA
// nodes) holding PCI trees, GPUs and NICs in PCI devices, NVLinks in GPUs.
// It round-trips through JSON and through the XML that NCCL_TOPO_FILE reads
// and NCCL_TOPO_DUMP_FILE writes (ReadXML, WriteXML), and discovery fills
// it from NVML (behind the small NVML interface, so that go-nvml's mock
// servers can stand in for a driver) and sysfs.
//
// Build turns a document into a gonum graph: one node per GPU, PCI switch,
// NUMA node, NIC and network port, one NVSwitch node per host, links with
// NCCL's bandwidths (NVLink per link by compute capability, PCI by speed
// and width, CPU to CPU by vendor). Paths follow NCCL's rules: a path is
// as good as its worst hop, LOC < NVL < NVB < C2C < PIX < PXB < P2C < PXN <
// PHB < SYS < NET < DIS, a path may pass through a GPU only over one
// NVLink relay (NVB), and between equals the wider, then the shorter,
// wins.
//
// Search finds ring orders and trees over a host's GPUs that maximise the
// bottleneck bandwidth, and channel counts from NCCL's per-channel speeds;
// Simulate predicts all-reduce bus bandwidth by size with NCCL's latency
// and bandwidth model (tuning.cc) for the ring and the tree, and beside
// them goccl's hierarchical all-reduce (inside each host, then across).
package topology
