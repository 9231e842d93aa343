// Package ibv is the seam between goccl's verbs transport and an RDMA
// device: the few verbs the transport uses (open a device, query a port
// and its GIDs, register memory, create completion queues and
// reliable-connected queue pairs, move a QP through its states, post work
// requests, poll completions), with the numbers libibverbs gives them, so
// that a provider maps them one to one.
//
// Two providers sit behind it:
//
//   - the real one (OpenLibrary, in cgo.go, built with -tags verbs): libibverbs
//     loaded with dlopen at run time, its inline post and poll calls
//     reached through small C wrappers, a whole chain of work requests
//     built and posted inside one C call;
//   - transport/verbs/ibemu: an emulated RC device for tests, which moves
//     bytes between real processes and is stricter than hardware where
//     hardware is allowed to be unkind. It is never reported as RDMA
//     hardware.
//
// The values of every enumeration (states, attribute masks, access
// flags, opcodes, completion statuses, MTUs) are libibverbs' own
// (infiniband/verbs.h, rdma-core), so that the cgo layer converts by a
// cast and an error message names what verbs documentation names.
//
// Byte order: the immediate of a work request and of a completion is a
// host-order uint32 here; the wire carries it big-endian, and the
// provider converts (verbs' imm_data is __be32).
//
// Memory given to RegMR must not be Go heap memory: the device writes to
// it while Go's collector may move or free Go memory, and cgo forbids
// handing such pointers to C for longer than a call. Alloc returns
// memory that is safe (a shared mapping of a memfd, which the emulator
// can also hand to another process).
package ibv

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// DeviceInfo names a device and says what it is.
type DeviceInfo struct {
	Name  string // "mlx5_0"; the emulator's are "emu0", ...
	GUID  uint64
	Ports int
	// Emulated is true for the test device (transport/verbs/ibemu): it is
	// not RDMA hardware and is never reported as such.
	Emulated bool
}

// Provider opens devices.
type Provider interface {
	// Devices lists the devices there are. None at all (no kernel
	// support, no driver) is an error wrapping ErrNoDevice.
	Devices() ([]DeviceInfo, error)
	// Open opens a device by name.
	Open(name string) (Context, error)
}

// Context is an open device with one protection domain, in which all of
// its memory regions and queue pairs live.
type Context interface {
	Info() DeviceInfo
	// QueryPort describes port (numbered from 1).
	QueryPort(port int) (PortAttr, error)
	// QueryGID returns entry index of port's GID table, with its type
	// (RoCE v1 or v2, IB); a zero GID is an empty entry.
	QueryGID(port, index int) (GID, GIDType, error)
	// RegMR registers mem (not Go heap memory: see Alloc) for the access
	// given.
	RegMR(mem []byte, access Access) (MR, error)
	// RegDeviceMR registers memory the CPU does not address, a GPU's, for
	// GPUDirect RDMA: through its dma-buf descriptor when m.FD ≥ 0
	// (ibv_reg_dmabuf_mr; the descriptor may be closed afterwards), by
	// its address otherwise (ibv_reg_mr on m.IOVA, which works only where
	// a peer-memory client such as nvidia-peermem is loaded). An error
	// wrapping ErrNotSupported means the library, kernel or device cannot
	// do it that way.
	RegDeviceMR(m DeviceMem, access Access) (MR, error)
	// CreateCQ makes a completion queue of at least cqe entries.
	CreateCQ(cqe int) (CQ, error)
	// CreateQP makes a reliable-connected queue pair in state Reset whose
	// send and receive completions go to cq.
	CreateQP(cq CQ, c QPCap) (QP, error)
	// Close releases the device. Everything made from it must have been
	// destroyed first.
	Close() error
}

// DeviceMem names GPU memory for RegDeviceMR: Len bytes at Offset of the
// dma-buf FD (cuMemGetHandleForAddressRange's), which peers and work
// requests address as IOVA, the memory's device address. FD < 0 names it
// by IOVA alone (peer memory).
type DeviceMem struct {
	FD     int
	Offset uint64
	Len    int
	IOVA   uint64
}

// ErrNotSupported: the device, its kernel driver or the library lacks a
// verb (dma-buf registration before rdma-core 34 or Linux 5.12, peer
// memory without nvidia-peermem).
var ErrNotSupported = errors.New("not supported here")

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	// Addr is the address peers name in RDMA writes into it (the
	// region's virtual address, as in verbs).
	Addr() uint64
	Len() int
	Dereg() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll fills wc with up to len(wc) completions and returns how many;
	// 0 when there are none. An error means the queue itself failed
	// (overrun).
	Poll(wc []WC) (int, error)
	Destroy() error
}

// QP is a reliable-connected queue pair.
type QP interface {
	Num() uint32
	// Modify changes the attributes that mask names (ibv_modify_qp).
	Modify(a *QPAttr, mask AttrMask) error
	// PostSend posts a chain of work requests in order. On an error, bad
	// is the index of the first request not posted; those before it are.
	PostSend(wrs []SendWR) (bad int, err error)
	// PostRecv posts receives in order, as PostSend.
	PostRecv(wrs []RecvWR) (bad int, err error)
	Destroy() error
}

// PortAttr is what the transport needs of ibv_port_attr.
type PortAttr struct {
	State     PortState
	MaxMTU    MTU
	ActiveMTU MTU
	LID       uint16
	LinkLayer LinkLayer
	GIDTblLen int
	// ActiveWidth and ActiveSpeed are verbs' encodings (1x/4x/..., and
	// SDR/.../NDR); Rate decodes them.
	ActiveWidth uint8
	ActiveSpeed uint8
}

// Rate is the port's nominal rate in Gbit/s, as ibstat shows it (4x HDR
// is 200), decoded from its width and speed; 0 if unknown.
func (p PortAttr) Rate() float64 {
	lanes := map[uint8]float64{1: 1, 2: 4, 4: 8, 8: 12, 16: 2}[p.ActiveWidth]
	perLane := map[uint8]float64{1: 2.5, 2: 5, 4: 10, 8: 10, 16: 14, 32: 25, 64: 50, 128: 100}[p.ActiveSpeed]
	return lanes * perLane
}

// PortState is enum ibv_port_state.
type PortState int

const (
	PortDown   PortState = 1
	PortInit   PortState = 2
	PortArmed  PortState = 3
	PortActive PortState = 4
)

func (s PortState) String() string {
	switch s {
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	}
	return fmt.Sprintf("state %d", int(s))
}

// LinkLayer is IBV_LINK_LAYER_*.
type LinkLayer uint8

const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkInfiniBand, LinkUnspecified:
		return "InfiniBand"
	case LinkEthernet:
		return "RoCE"
	}
	return fmt.Sprintf("link layer %d", l)
}

// MTU is enum ibv_mtu.
type MTU int

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// GID is a port's global identifier (an IPv6 address in form).
type GID [16]byte

func (g GID) IsZero() bool { return g == GID{} }

// IPv4 returns the IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d,
// RoCE v2's for an IPv4 interface).
func (g GID) IPv4() (netip.Addr, bool) {
	a := netip.AddrFrom16(g)
	if a.Is4In6() {
		return a.Unmap(), true
	}
	return netip.Addr{}, false
}

// LinkLocal reports whether g is an fe80::/10 address (RoCE's GID of
// the interface's link-local address, which does not route).
func (g GID) LinkLocal() bool { return g[0] == 0xfe && g[1]&0xc0 == 0x80 }

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// GIDType is the kind of a GID table entry.
type GIDType int

const (
	GIDIB     GIDType = 0 // InfiniBand, or RoCE v1 on Ethernet
	GIDRoCEv2 GIDType = 1 // RoCE v2 (UDP/IP)
)

// Access is enum ibv_access_flags.
type Access uint32

const (
	AccessLocalWrite         Access = 1
	AccessRemoteWrite        Access = 1 << 1
	AccessRemoteRead         Access = 1 << 2
	AccessRelaxedOrdering    Access = 1 << 20 // IBV_ACCESS_OPTIONAL_FIRST
	AccessRemoteWriteAll            = AccessLocalWrite | AccessRemoteWrite
	AccessRemoteReadWriteAll        = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
)

// QPState is enum ibv_qp_state.
type QPState int

const (
	QPReset QPState = 0
	QPInit  QPState = 1
	QPRTR   QPState = 2
	QPRTS   QPState = 3
	QPSQD   QPState = 4
	QPSQE   QPState = 5
	QPErr   QPState = 6
)

func (s QPState) String() string {
	names := [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}
	if s >= 0 && int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("state %d", int(s))
}

// AttrMask is enum ibv_qp_attr_mask.
type AttrMask uint32

const (
	AttrState           AttrMask = 1 << 0
	AttrCurState        AttrMask = 1 << 1
	AttrAccessFlags     AttrMask = 1 << 3
	AttrPKeyIndex       AttrMask = 1 << 4
	AttrPort            AttrMask = 1 << 5
	AttrQKey            AttrMask = 1 << 6
	AttrAV              AttrMask = 1 << 7
	AttrPathMTU         AttrMask = 1 << 8
	AttrTimeout         AttrMask = 1 << 9
	AttrRetryCnt        AttrMask = 1 << 10
	AttrRNRRetry        AttrMask = 1 << 11
	AttrRQPSN           AttrMask = 1 << 12
	AttrMaxQPRdAtomic   AttrMask = 1 << 13
	AttrMinRNRTimer     AttrMask = 1 << 15
	AttrSQPSN           AttrMask = 1 << 16
	AttrMaxDestRdAtomic AttrMask = 1 << 17
	AttrCap             AttrMask = 1 << 19
	AttrDestQPN         AttrMask = 1 << 20
)

// The attributes an RC QP's transitions require (IB spec vol. 1, table
// 91 "QP State Transition Properties"; ibv_modify_qp(3)). Others may be
// given with them where the table allows.
const (
	MaskResetToInit = AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags
	MaskInitToRTR   = AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	MaskRTRToRTS    = AttrState | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic
)

// QPCap sizes a queue pair's work queues.
type QPCap struct {
	MaxSendWR, MaxRecvWR   int
	MaxSendSGE, MaxRecvSGE int
	MaxInlineData          int
}

// AH is the address vector of a connected QP's peer (ibv_ah_attr).
type AH struct {
	DLID     uint16
	SL       uint8
	IsGlobal bool // a GRH: RoCE always, IB across subnets
	DGID     GID
	SGIDIdx  uint8
	HopLimit uint8
	TClass   uint8 // traffic class (NCCL_IB_TC)
	Port     uint8
}

// QPAttr is what the transport sets of ibv_qp_attr.
type QPAttr struct {
	State           QPState
	PKeyIndex       uint16
	Port            uint8
	Access          Access
	PathMTU         MTU
	DestQPN         uint32
	RQPSN           uint32
	SQPSN           uint32
	MaxDestRdAtomic uint8
	MaxRdAtomic     uint8
	MinRNRTimer     uint8
	Timeout         uint8 // 4.096 µs × 2^Timeout per try
	RetryCnt        uint8
	RNRRetry        uint8 // 7 means retry forever
	AH              AH
}

// Opcode is enum ibv_wr_opcode.
type Opcode int

const (
	OpWrite    Opcode = 0
	OpWriteImm Opcode = 1
	OpSend     Opcode = 2
	OpSendImm  Opcode = 3
	OpRead     Opcode = 4
)

func (o Opcode) String() string {
	switch o {
	case OpWrite:
		return "RDMA_WRITE"
	case OpWriteImm:
		return "RDMA_WRITE_WITH_IMM"
	case OpSend:
		return "SEND"
	case OpSendImm:
		return "SEND_WITH_IMM"
	case OpRead:
		return "RDMA_READ"
	}
	return fmt.Sprintf("opcode %d", int(o))
}

// SendFlags is enum ibv_send_flags.
type SendFlags uint32

const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// SGE is one scatter/gather element: Len bytes at Addr in the region
// whose local key is LKey.
type SGE struct {
	Addr uint64
	Len  uint32
	LKey uint32
}

// SendWR is a work request on a send queue, with at most one SGE (all
// goccl needs; a zero-length request has none).
type SendWR struct {
	ID     uint64
	Op     Opcode
	Flags  SendFlags
	SGE    SGE
	Imm    uint32 // host order; for OpWriteImm and OpSendImm
	Remote uint64 // RDMA: where in the peer's region
	RKey   uint32
}

// RecvWR is a posted receive. A write with immediate consumes one and
// writes nothing into its SGE; goccl's receives have none.
type RecvWR struct {
	ID  uint64
	SGE SGE
}

// WCOpcode is enum ibv_wc_opcode.
type WCOpcode int

const (
	WCSend         WCOpcode = 0
	WCWrite        WCOpcode = 1
	WCRead         WCOpcode = 2
	WCRecv         WCOpcode = 1 << 7
	WCRecvWriteImm WCOpcode = 1<<7 + 1
)

// WC is a work completion.
type WC struct {
	ID      uint64
	Status  Status
	Opcode  WCOpcode // valid only when Status is Success
	ByteLen uint32
	Imm     uint32 // host order; valid when HasImm
	HasImm  bool
	QPNum   uint32
	Vendor  uint32 // vendor_err
}

// Status is enum ibv_wc_status.
type Status int

const (
	Success        Status = 0
	LocLenErr      Status = 1
	LocQPOpErr     Status = 2
	LocProtErr     Status = 4
	WRFlushErr     Status = 5
	BadRespErr     Status = 7
	LocAccessErr   Status = 8
	RemInvReqErr   Status = 9
	RemAccessErr   Status = 10
	RemOpErr       Status = 11
	RetryExcErr    Status = 12
	RNRRetryExcErr Status = 13
	RemAbortErr    Status = 16
	FatalErr       Status = 19
	RespTimeoutErr Status = 20
	GeneralErr     Status = 21
)

var statusNames = map[Status]string{
	Success: "SUCCESS", LocLenErr: "LOC_LEN_ERR", LocQPOpErr: "LOC_QP_OP_ERR", 3: "LOC_EEC_OP_ERR",
	LocProtErr: "LOC_PROT_ERR", WRFlushErr: "WR_FLUSH_ERR", 6: "MW_BIND_ERR", BadRespErr: "BAD_RESP_ERR",
	LocAccessErr: "LOC_ACCESS_ERR", RemInvReqErr: "REM_INV_REQ_ERR", RemAccessErr: "REM_ACCESS_ERR",
	RemOpErr: "REM_OP_ERR", RetryExcErr: "RETRY_EXC_ERR", RNRRetryExcErr: "RNR_RETRY_EXC_ERR",
	14: "LOC_RDD_VIOL_ERR", 15: "REM_INV_RD_REQ_ERR", RemAbortErr: "REM_ABORT_ERR", 17: "INV_EECN_ERR",
	18: "INV_EEC_STATE_ERR", FatalErr: "FATAL_ERR", RespTimeoutErr: "RESP_TIMEOUT_ERR", GeneralErr: "GENERAL_ERR",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", int(s))
}

// Meaning says what a status usually means in a job, for error messages
// (NCCL's experience: NVIDIA/nccl issues 426 and 769 for RETRY_EXC_ERR).
func (s Status) Meaning() string {
	switch s {
	case RetryExcErr:
		return "the peer's NIC did not answer: is the peer's process gone, the GID index wrong (GOCCL_IB_GID_INDEX), or the RoCE fabric lossy or misconfigured (GOCCL_IB_TC)?"
	case RNRRetryExcErr:
		return "the peer had no receive posted for too long: a protocol error, or the peer stopped draining its queue"
	case RemAccessErr:
		return "the peer refused the write: its memory key or bounds did not match (the ranks disagree about the connection's memory)"
	case LocProtErr, LocAccessErr:
		return "local memory was not registered for this access"
	case LocLenErr:
		return "a message was longer than the posted buffer"
	case WRFlushErr:
		return "the queue pair failed earlier; this request was flushed"
	case RemOpErr, RemInvReqErr:
		return "the peer could not perform the request"
	case FatalErr, GeneralErr:
		return "the device reported a fatal error"
	}
	return ""
}

// WCError is a failed work completion.
type WCError struct {
	Status Status
	Op     WCOpcode
	Vendor uint32
}

func (e *WCError) Error() string {
	msg := fmt.Sprintf("work completion %v (vendor error %#x)", e.Status, e.Vendor)
	if m := e.Status.Meaning(); m != "" {
		msg += ": " + m
	}
	return msg
}

// Errors of the providers.
var (
	// ErrNoDevice: there is no RDMA device (or none usable).
	ErrNoDevice = errors.New("no RDMA device")
	// ErrNotBuilt: this binary was built without the verbs layer.
	ErrNotBuilt = errors.New("this goccl was built without the verbs layer: rebuild with `-tags verbs` (needs cgo and libibverbs-dev)")
)

// Event is an asynchronous event of a device (ibv_get_async_event): a
// QP or CQ failed, a port went down.
type Event struct {
	Type  EventType
	QPNum uint32 // for QP events
	Port  int    // for port events
}

func (e Event) String() string {
	switch e.Type {
	case EventQPFatal, EventQPReqErr, EventQPAccessErr, EventCommEst, EventSQDrained, EventLastWQE:
		return fmt.Sprintf("%v on QP %#x", e.Type, e.QPNum)
	case EventPortActive, EventPortErr, EventLIDChange, EventGIDChange:
		return fmt.Sprintf("%v on port %d", e.Type, e.Port)
	}
	return e.Type.String()
}

// Fatal reports whether the event ends the connections it touches.
func (e Event) Fatal() bool {
	switch e.Type {
	case EventCQErr, EventQPFatal, EventQPReqErr, EventQPAccessErr, EventDeviceFatal, EventPortErr:
		return true
	}
	return false
}

// EventType is enum ibv_event_type.
type EventType int

const (
	EventCQErr       EventType = 0
	EventQPFatal     EventType = 1
	EventQPReqErr    EventType = 2
	EventQPAccessErr EventType = 3
	EventCommEst     EventType = 4
	EventSQDrained   EventType = 5
	EventDeviceFatal EventType = 8
	EventPortActive  EventType = 9
	EventPortErr     EventType = 10
	EventLIDChange   EventType = 11
	EventLastWQE     EventType = 16
	EventGIDChange   EventType = 18
)

func (t EventType) String() string {
	names := map[EventType]string{EventCQErr: "CQ_ERR", EventQPFatal: "QP_FATAL", EventQPReqErr: "QP_REQ_ERR",
		EventQPAccessErr: "QP_ACCESS_ERR", EventCommEst: "COMM_EST", EventSQDrained: "SQ_DRAINED",
		EventDeviceFatal: "DEVICE_FATAL", EventPortActive: "PORT_ACTIVE", EventPortErr: "PORT_ERR",
		EventLIDChange: "LID_CHANGE", EventLastWQE: "QP_LAST_WQE_REACHED", EventGIDChange: "GID_CHANGE"}
	if n, ok := names[t]; ok {
		return n
	}
	return fmt.Sprintf("event %d", int(t))
}

// EventSource is implemented by contexts that report asynchronous
// events.
type EventSource interface {
	// WaitEvent returns the next event, or ok false if none came within
	// timeout (so that a watcher can notice that it should stop).
	WaitEvent(timeout time.Duration) (e Event, ok bool, err error)
}
