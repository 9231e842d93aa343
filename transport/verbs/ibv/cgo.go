//go:build verbs && cgo && linux

package ibv

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "verbs_wrap.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// libName is the library OpenLibrary loads: the soname of rdma-core's
// libibverbs1 package (ABI 1), as NCCL's ibvsymbols.cc loads it.
const libName = "libibverbs.so.1"

// OpenLibrary returns the provider of the machine's RDMA devices,
// libibverbs.
//
// Why a build tag and dlopen: the C half compiles against rdma-core's
// <infiniband/verbs.h>, which most machines lack, so it is built only
// with -tags verbs (and cgo, on Linux), and other builds get a stub that
// returns ErrNotBuilt. The tagged build links only -ldl and loads
// libibverbs.so.1 at run time, as NCCL's ibvwrap does, so that one binary
// runs on every machine and says why it cannot use RDMA.
//
// Obligations:
//
//  1. The library is loaded once per process, its functions resolved by
//     dlvsym at libibverbs' ABI version IBVERBS_1.1, and never closed; a
//     failure is remembered and returned again.
//  2. Where RDMA cannot be used the error matches ErrNoDevice and says
//     why: "ibv: libibverbs.so.1 not found (install rdma-core's
//     libibverbs1): ..." from OpenLibrary; "ibv_get_device_list: no RDMA
//     devices (ENOSYS: ...)" from Devices and Open when the kernel
//     offers none (it also matches the errno). Devices returns an empty
//     list without error only when libibverbs lists none.
//  3. Every object is safe for concurrent use. Destroy, Dereg and Close
//     are idempotent; other calls on a destroyed object return an error.
//     A Context's Close refuses, with an error naming what is left,
//     while regions, CQs or QPs made from it are not destroyed, and
//     wakes a WaitEvent in progress, which returns ok false.
//  4. PostSend, PostRecv and Poll make one cgo call each, whatever the
//     number of requests or completions.
//  5. Failed verbs return errors naming the verb and wrapping the errno
//     (a syscall.Errno): "ibv_modify_qp to RTR on QP 0x1a: invalid
//     argument".
//  6. DeviceInfo.GUID is in host order (printed with %#016x it reads as
//     ibv_devinfo's node GUID). Devices counts ports in sysfs, without
//     opening the device; an open Context's Info has ibv_query_device's
//     count.
func OpenLibrary() (Provider, error) {
	libOnce.Do(func() { libOnce.err = load(libName, true) })
	if libOnce.err != nil {
		return nil, libOnce.err
	}
	return library{}, nil
}

var libOnce struct {
	sync.Once
	err error
}

// load opens name and resolves the functions; commit installs them for
// the wrappers (once per process), else the library is closed again.
func load(name string, commit bool) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	msg := (*C.char)(C.calloc(1, 512))
	defer C.free(unsafe.Pointer(msg))
	c := C.int(0)
	if commit {
		c = 1
	}
	rc := C.goccl_ibv_resolve(cname, c, msg, 512)
	text := C.GoString(msg)
	switch rc {
	case 0:
		return nil
	case 1:
		if strings.Contains(text, "No such file") {
			return &noDeviceError{msg: fmt.Sprintf("ibv: %s not found (install rdma-core's libibverbs1): dlopen: %s", name, text)}
		}
		return &noDeviceError{msg: fmt.Sprintf("ibv: cannot load %s: dlopen: %s", name, text)}
	case 2:
		return &noDeviceError{msg: fmt.Sprintf("ibv: %s has no %s: not libibverbs, or not rdma-core's ABI", name, text)}
	}
	return fmt.Errorf("ibv: loading %s: %s", name, text)
}

// noDeviceError says why no RDMA device can be used. It matches
// ErrNoDevice and unwraps to the errno, if there is one.
type noDeviceError struct {
	msg string
	err error
}

func (e *noDeviceError) Error() string        { return e.msg }
func (e *noDeviceError) Is(target error) bool { return target == ErrNoDevice }
func (e *noDeviceError) Unwrap() error        { return e.err }

// verbErr is the error of a failed verb: what was called, and the errno.
func verbErr(what string, errno C.int) error {
	return fmt.Errorf("%s: %w", what, syscall.Errno(errno))
}

func errnoName(e syscall.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return fmt.Sprintf("errno %d", int(e))
}

// library is the Provider; its state is the C side's table of functions.
type library struct{}

// deviceList is ibv_get_device_list; the caller frees the list.
func deviceList() ([]*C.struct_ibv_device, **C.struct_ibv_device, error) {
	var n, e C.int
	list := C.goccl_get_device_list(&n, &e)
	if list == nil {
		errno := syscall.Errno(e)
		msg := fmt.Sprintf("ibv_get_device_list: no RDMA devices (%s: %v)", errnoName(errno), errno)
		if errno == syscall.ENOSYS {
			msg += ": the kernel offers none to user space (no /sys/class/infiniband_verbs: no RDMA NIC, or ib_uverbs not loaded)"
		}
		return nil, nil, &noDeviceError{msg: msg, err: errno}
	}
	return unsafe.Slice(list, int(n)), list, nil
}

func (library) Devices() ([]DeviceInfo, error) {
	devs, list, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.goccl_free_device_list(list)
	out := make([]DeviceInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, DeviceInfo{
			Name:  C.GoString(C.goccl_device_name(d)),
			GUID:  uint64(C.goccl_device_guid(d)),
			Ports: sysfsPorts(C.GoString(C.goccl_device_ibdev_path(d))),
		})
	}
	return out, nil
}

// sysfsPorts counts a device's ports in sysfs (/sys/class/infiniband/
// <dev>/ports), which needs no open device; 0 if unreadable.
func sysfsPorts(ibdevPath string) int {
	if ibdevPath == "" {
		return 0
	}
	ents, err := os.ReadDir(filepath.Join(ibdevPath, "ports"))
	if err != nil {
		return 0
	}
	return len(ents)
}

func (library) Open(name string) (Context, error) {
	devs, list, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.goccl_free_device_list(list)
	var names []string
	for _, d := range devs {
		n := C.GoString(C.goccl_device_name(d))
		if n == name {
			return openDevice(d, n)
		}
		names = append(names, n)
	}
	return nil, &noDeviceError{msg: fmt.Sprintf("ibv: no RDMA device %q (there are: %s)", name, strings.Join(names, ", "))}
}

func openDevice(d *C.struct_ibv_device, name string) (_ Context, err error) {
	var e C.int
	p := C.goccl_open_device(d, &e)
	if p == nil {
		return nil, verbErr("ibv_open_device "+name, e)
	}
	c := &libContext{
		info:      DeviceInfo{Name: name, GUID: uint64(C.goccl_device_guid(d))},
		ibdevPath: C.GoString(C.goccl_device_ibdev_path(d)),
		asyncFD:   int(C.goccl_async_fd(p)),
		wake:      -1,
	}
	defer func() {
		if err != nil {
			if c.pd != nil {
				C.goccl_dealloc_pd(c.pd)
			}
			C.goccl_close_device(p)
			if c.wake >= 0 {
				unix.Close(c.wake)
			}
		}
	}()
	var ports C.int
	if rc := C.goccl_port_count(p, &ports); rc != 0 {
		return nil, verbErr("ibv_query_device "+name, rc)
	}
	c.info.Ports = int(ports)
	if c.pd = C.goccl_alloc_pd(p, &e); c.pd == nil {
		return nil, verbErr("ibv_alloc_pd on "+name, e)
	}
	// WaitEvent polls the fd with a timeout and then reads it, which must
	// not block when another waiter took the event.
	if err := unix.SetNonblock(c.asyncFD, true); err != nil {
		return nil, fmt.Errorf("ibv: making %s's async event fd non-blocking: %w", name, err)
	}
	if c.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		c.wake = -1
		return nil, fmt.Errorf("ibv: eventfd for %s: %w", name, err)
	}
	c.p = p
	return c, nil
}

// libContext is an open device with its protection domain.
type libContext struct {
	info      DeviceInfo
	ibdevPath string // its sysfs directory, for GID types
	asyncFD   int

	// mu guards p, pd and the validity of wake: read-locked by every
	// call that uses them (WaitEvent for as long as it polls),
	// write-locked by Close, which sets p and pd nil.
	mu sync.RWMutex
	p  *C.struct_ibv_context
	pd *C.struct_ibv_pd

	// wakeMu guards wake, an eventfd that Close signals (before taking mu)
	// to end a WaitEvent; -1 once closed.
	wakeMu sync.Mutex
	wake   int

	// What is made from the context and not yet destroyed.
	mrs, cqs, qps atomic.Int64
}

var _ EventSource = (*libContext)(nil)

func (c *libContext) Info() DeviceInfo { return c.info }

func (c *libContext) closedErr(verb string) error {
	return fmt.Errorf("%s: device %s is closed", verb, c.info.Name)
}

func (c *libContext) QueryPort(port int) (PortAttr, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return PortAttr{}, c.closedErr("ibv_query_port")
	}
	if port < 1 || port > c.info.Ports {
		return PortAttr{}, fmt.Errorf("ibv_query_port: %s has ports 1 to %d, not %d", c.info.Name, c.info.Ports, port)
	}
	var a C.goccl_port_attr
	if rc := C.goccl_query_port(c.p, C.int(port), &a); rc != 0 {
		return PortAttr{}, verbErr(fmt.Sprintf("ibv_query_port %s port %d", c.info.Name, port), rc)
	}
	return portAttr(&a), nil
}

// portAttr is what goccl_query_port filled.
func portAttr(a *C.goccl_port_attr) PortAttr {
	return PortAttr{
		State:       PortState(a.state),
		MaxMTU:      MTU(a.max_mtu),
		ActiveMTU:   MTU(a.active_mtu),
		LID:         uint16(a.lid),
		LinkLayer:   LinkLayer(a.link_layer),
		GIDTblLen:   int(a.gid_tbl_len),
		ActiveWidth: uint8(a.active_width),
		ActiveSpeed: uint8(a.active_speed),
	}
}

func (c *libContext) QueryGID(port, index int) (GID, GIDType, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return GID{}, 0, c.closedErr("ibv_query_gid")
	}
	if port < 1 || port > c.info.Ports || index < 0 {
		return GID{}, 0, fmt.Errorf("ibv_query_gid: no GID %d on %s port %d (ports 1 to %d)", index, c.info.Name, port, c.info.Ports)
	}
	var raw [16]C.uint8_t
	var typ, known C.int
	if rc := C.goccl_query_gid(c.p, C.int(port), C.int(index), &raw[0], &typ, &known); rc != 0 {
		return GID{}, 0, verbErr(fmt.Sprintf("ibv_query_gid %s port %d index %d", c.info.Name, port, index), rc)
	}
	var g GID
	for i := range g {
		g[i] = byte(raw[i])
	}
	if known != 0 {
		if typ != 0 {
			return g, GIDRoCEv2, nil
		}
		return g, GIDIB, nil
	}
	// A library without _ibv_query_gid_ex (before rdma-core 32): the
	// kernel's own word, as NCCL reads it.
	path := filepath.Join(c.ibdevPath, "ports", fmt.Sprint(port), "gid_attrs", "types", fmt.Sprint(index))
	b, err := os.ReadFile(path)
	if err != nil {
		return g, 0, fmt.Errorf("ibv: type of GID %d on %s port %d: %w", index, c.info.Name, port, err)
	}
	switch t := strings.TrimSpace(string(b)); t {
	case "RoCE v2":
		return g, GIDRoCEv2, nil
	case "IB/RoCE v1":
		return g, GIDIB, nil
	default:
		return g, 0, fmt.Errorf("ibv: type of GID %d on %s port %d: %s says %q", index, c.info.Name, port, path, t)
	}
}

func (c *libContext) RegMR(mem []byte, access Access) (MR, error) {
	if len(mem) == 0 {
		return nil, errors.New("ibv_reg_mr: an empty region")
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return nil, c.closedErr("ibv_reg_mr")
	}
	var e C.int
	// The address crosses as an integer: the memory is not Go's (see
	// Alloc), and may not be host memory at all (a GPU's, through
	// nvidia-peermem).
	p := C.goccl_reg_mr(c.pd, C.uint64_t(Addr(mem)), C.size_t(len(mem)), C.uint32_t(access), &e)
	if p == nil {
		what := fmt.Sprintf("ibv_reg_mr of %d bytes at %#x on %s (access %#x)", len(mem), Addr(mem), c.info.Name, uint32(access))
		if syscall.Errno(e) == syscall.ENOMEM {
			what += " (is the locked-memory limit, ulimit -l, too low?)"
		}
		return nil, verbErr(what, e)
	}
	c.mrs.Add(1)
	return &libMR{
		ctx:  c,
		p:    p,
		lkey: uint32(p.lkey),
		rkey: uint32(p.rkey),
		addr: uint64(uintptr(p.addr)),
		n:    len(mem),
	}, nil
}

func (c *libContext) RegDeviceMR(m DeviceMem, access Access) (MR, error) {
	if m.Len <= 0 {
		return nil, errors.New("ibv_reg_dmabuf_mr: an empty region")
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return nil, c.closedErr("ibv_reg_dmabuf_mr")
	}
	var e C.int
	var p *C.struct_ibv_mr
	var what string
	if m.FD >= 0 {
		what = fmt.Sprintf("ibv_reg_dmabuf_mr of %d bytes at offset %d of dma-buf %d (iova %#x) on %s", m.Len, m.Offset, m.FD, m.IOVA, c.info.Name)
		p = C.goccl_reg_dmabuf_mr(c.pd, C.uint64_t(m.Offset), C.size_t(m.Len), C.uint64_t(m.IOVA), C.int(m.FD), C.uint32_t(access), &e)
	} else {
		what = fmt.Sprintf("ibv_reg_mr of %d bytes of device memory at %#x on %s", m.Len, m.IOVA, c.info.Name)
		p = C.goccl_reg_mr(c.pd, C.uint64_t(m.IOVA), C.size_t(m.Len), C.uint32_t(access), &e)
	}
	if p == nil {
		return nil, deviceMRErr(what, m.FD >= 0, syscall.Errno(e))
	}
	c.mrs.Add(1)
	return &libMR{ctx: c, p: p, lkey: uint32(p.lkey), rkey: uint32(p.rkey), addr: m.IOVA, n: m.Len}, nil
}

// deviceMRErr says what a failed registration of GPU memory usually
// means. dma-buf: EOPNOTSUPP or EPROTONOSUPPORT when the library, kernel
// (before 5.12) or driver lacks it (NCCL's ncclIbDmaBufSupport reads
// them so); by address: EFAULT or EINVAL when no peer-memory client
// knows the address (nvidia-peermem not loaded).
func deviceMRErr(what string, dmabuf bool, errno syscall.Errno) error {
	unsupported := errno == syscall.EOPNOTSUPP || errno == syscall.EPROTONOSUPPORT
	if !dmabuf {
		unsupported = unsupported || errno == syscall.EFAULT || errno == syscall.EINVAL
	}
	if unsupported {
		return fmt.Errorf("%s: %w: %w", what, ErrNotSupported, errno)
	}
	return fmt.Errorf("%s: %w", what, errno)
}

func (c *libContext) CreateCQ(cqe int) (CQ, error) {
	if cqe < 1 || cqe > 1<<30 {
		return nil, fmt.Errorf("ibv_create_cq: %d entries (want 1 or more)", cqe)
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return nil, c.closedErr("ibv_create_cq")
	}
	var e C.int
	p := C.goccl_create_cq(c.p, C.int(cqe), &e)
	if p == nil {
		return nil, verbErr(fmt.Sprintf("ibv_create_cq of %d entries on %s", cqe, c.info.Name), e)
	}
	c.cqs.Add(1)
	return &libCQ{ctx: c, p: p}, nil
}

func (c *libContext) CreateQP(cq CQ, qc QPCap) (QP, error) {
	q, ok := cq.(*libCQ)
	if !ok || q.ctx != c {
		return nil, fmt.Errorf("ibv_create_qp: the CQ (%T) was not made by %s", cq, c.info.Name)
	}
	for _, v := range []int{qc.MaxSendWR, qc.MaxRecvWR, qc.MaxSendSGE, qc.MaxRecvSGE, qc.MaxInlineData} {
		if v < 0 || v > 1<<30 {
			return nil, fmt.Errorf("ibv_create_qp: capabilities %+v out of range", qc)
		}
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return nil, c.closedErr("ibv_create_qp")
	}
	// The CQ must stay alive while the QP is made on it.
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p == nil {
		return nil, errors.New("ibv_create_qp: the CQ is destroyed")
	}
	var e C.int
	p := C.goccl_create_qp(c.pd, q.p, C.uint32_t(qc.MaxSendWR), C.uint32_t(qc.MaxRecvWR),
		C.uint32_t(qc.MaxSendSGE), C.uint32_t(qc.MaxRecvSGE), C.uint32_t(qc.MaxInlineData), &e)
	if p == nil {
		return nil, verbErr(fmt.Sprintf("ibv_create_qp (RC, %+v) on %s", qc, c.info.Name), e)
	}
	c.qps.Add(1)
	return &libQP{ctx: c, p: p, num: uint32(p.qp_num)}, nil
}

func (c *libContext) signalWake() {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	if c.wake >= 0 {
		one := [8]byte{1}
		unix.Write(c.wake, one[:]) // EAGAIN only when already signalled
	}
}

// drainWake resets the eventfd; called with mu held for writing.
func (c *libContext) drainWake() {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	if c.wake >= 0 {
		var b [8]byte
		unix.Read(c.wake, b[:]) // EAGAIN when not signalled
	}
}

func (c *libContext) Close() error {
	c.signalWake()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drainWake()
	if c.p == nil {
		return nil
	}
	if m, q, p := c.mrs.Load(), c.cqs.Load(), c.qps.Load(); m+q+p > 0 {
		return fmt.Errorf("ibv_close_device %s: %d memory regions, %d CQs and %d QPs made from it are not destroyed", c.info.Name, m, q, p)
	}
	var errs []error
	if rc := C.goccl_dealloc_pd(c.pd); rc != 0 {
		errs = append(errs, verbErr("ibv_dealloc_pd on "+c.info.Name, rc))
	}
	if rc := C.goccl_close_device(c.p); rc != 0 {
		errs = append(errs, verbErr("ibv_close_device "+c.info.Name, rc))
	}
	c.p, c.pd = nil, nil
	c.wakeMu.Lock()
	unix.Close(c.wake)
	c.wake = -1
	c.wakeMu.Unlock()
	return errors.Join(errs...)
}

// WaitEvent waits up to timeout (rounded up to a millisecond; 0 or less:
// only takes an event already there) for an asynchronous event, and
// acknowledges it. It returns ok false when none came, or when Close
// wants the context; an error once it is closed.
func (c *libContext) WaitEvent(timeout time.Duration) (Event, bool, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return Event{}, false, c.closedErr("ibv_get_async_event")
	}
	deadline := time.Now().Add(timeout)
	for {
		var e C.goccl_event
		switch rc := C.goccl_get_async_event(c.p, &e); syscall.Errno(rc) {
		case 0:
			return Event{Type: EventType(e._type), QPNum: uint32(e.qp_num), Port: int(e.port)}, true, nil
		case syscall.EAGAIN:
		default:
			return Event{}, false, verbErr("ibv_get_async_event on "+c.info.Name, rc)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return Event{}, false, nil
		}
		fds := []unix.PollFd{
			{Fd: int32(c.asyncFD), Events: unix.POLLIN},
			{Fd: int32(c.wake), Events: unix.POLLIN},
		}
		// poll(2) takes an int of milliseconds.
		ms := min((left+time.Millisecond-1)/time.Millisecond, math.MaxInt32)
		_, err := unix.Poll(fds, int(ms))
		if err == unix.EINTR { // the Go runtime's preemption signals
			continue
		}
		if err != nil {
			return Event{}, false, fmt.Errorf("ibv: poll on %s's async event fd: %w", c.info.Name, err)
		}
		if fds[1].Revents != 0 {
			return Event{}, false, nil
		}
	}
}

// libMR is a registered region.
type libMR struct {
	ctx        *libContext
	lkey, rkey uint32
	addr       uint64
	n          int
	mu         sync.Mutex // guards p
	p          *C.struct_ibv_mr
}

func (m *libMR) LKey() uint32 { return m.lkey }
func (m *libMR) RKey() uint32 { return m.rkey }
func (m *libMR) Addr() uint64 { return m.addr }
func (m *libMR) Len() int     { return m.n }

func (m *libMR) Dereg() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.p == nil {
		return nil
	}
	if rc := C.goccl_dereg_mr(m.p); rc != 0 {
		return verbErr(fmt.Sprintf("ibv_dereg_mr (lkey %#x)", m.lkey), rc)
	}
	m.p = nil
	m.ctx.mrs.Add(-1)
	return nil
}

// libCQ is a completion queue.
type libCQ struct {
	ctx *libContext // nil for a test fake (fakeops.go)
	mu  sync.Mutex  // guards p and wc
	p   *C.struct_ibv_cq
	wc  []C.goccl_wc // scratch for Poll, reused
}

func (q *libCQ) Poll(wc []WC) (int, error) {
	if len(wc) == 0 {
		return 0, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p == nil {
		return 0, errors.New("ibv_poll_cq: the CQ is destroyed")
	}
	if cap(q.wc) < len(wc) {
		q.wc = make([]C.goccl_wc, len(wc))
	}
	buf := q.wc[:len(wc)]
	k := int(C.goccl_poll_cq(q.p, &buf[0], C.int(len(buf))))
	if k < 0 {
		// Providers return -1, some a negative errno.
		if k < -1 {
			return 0, fmt.Errorf("ibv_poll_cq: the CQ failed: %w", syscall.Errno(-k))
		}
		return 0, fmt.Errorf("ibv_poll_cq: the CQ failed (%d)", k)
	}
	for i, w := range buf[:k] {
		wc[i] = WC{
			ID:      uint64(w.id),
			Status:  Status(w.status),
			Opcode:  WCOpcode(w.opcode),
			ByteLen: uint32(w.byte_len),
			Imm:     uint32(w.imm),
			HasImm:  w.has_imm != 0,
			QPNum:   uint32(w.qp_num),
			Vendor:  uint32(w.vendor_err),
		}
	}
	return k, nil
}

func (q *libCQ) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p == nil {
		return nil
	}
	if q.ctx == nil { // a test fake owns its memory
		q.p = nil
		return nil
	}
	if rc := C.goccl_destroy_cq(q.p); rc != 0 {
		return verbErr("ibv_destroy_cq (are its QPs destroyed?)", rc)
	}
	q.p = nil
	q.ctx.cqs.Add(-1)
	return nil
}

// libQP is an RC queue pair.
type libQP struct {
	ctx *libContext // nil for a test fake (fakeops.go)
	num uint32

	// mu guards p: read-locked by Modify and the posts, write-locked by
	// Destroy, which sets it nil. Verbs allow posting sends and receives
	// and modifying from different threads at once.
	mu sync.RWMutex
	p  *C.struct_ibv_qp

	// Scratch for the posts, reused so that a post allocates nothing.
	sendMu sync.Mutex // guards swr and sbad
	swr    []C.goccl_send_wr
	sbad   C.int
	recvMu sync.Mutex // guards rwr and rbad
	rwr    []C.goccl_recv_wr
	rbad   C.int
}

func (q *libQP) Num() uint32 { return q.num }

func (q *libQP) Modify(a *QPAttr, mask AttrMask) error {
	q.mu.RLock()
	defer q.mu.RUnlock()
	what := fmt.Sprintf("ibv_modify_qp (mask %#x) on QP %#x", uint32(mask), q.num)
	if mask&AttrState != 0 {
		what = fmt.Sprintf("ibv_modify_qp to %v on QP %#x", a.State, q.num)
	}
	if q.p == nil {
		return fmt.Errorf("%s: the QP is destroyed", what)
	}
	c := cQPAttr(a)
	if rc := C.goccl_modify_qp(q.p, &c, C.int(mask)); rc != 0 {
		return verbErr(what, rc)
	}
	return nil
}

// cQPAttr is a as goccl_modify_qp takes it.
func cQPAttr(a *QPAttr) C.goccl_qp_attr {
	c := C.goccl_qp_attr{
		state:              C.int32_t(a.State),
		path_mtu:           C.int32_t(a.PathMTU),
		access:             C.uint32_t(a.Access),
		dest_qpn:           C.uint32_t(a.DestQPN),
		rq_psn:             C.uint32_t(a.RQPSN),
		sq_psn:             C.uint32_t(a.SQPSN),
		pkey_index:         C.uint16_t(a.PKeyIndex),
		port:               C.uint8_t(a.Port),
		max_dest_rd_atomic: C.uint8_t(a.MaxDestRdAtomic),
		max_rd_atomic:      C.uint8_t(a.MaxRdAtomic),
		min_rnr_timer:      C.uint8_t(a.MinRNRTimer),
		timeout:            C.uint8_t(a.Timeout),
		retry_cnt:          C.uint8_t(a.RetryCnt),
		rnr_retry:          C.uint8_t(a.RNRRetry),
		ah_sl:              C.uint8_t(a.AH.SL),
		ah_port:            C.uint8_t(a.AH.Port),
		ah_dlid:            C.uint16_t(a.AH.DLID),
		ah_sgid_index:      C.uint8_t(a.AH.SGIDIdx),
		ah_hop_limit:       C.uint8_t(a.AH.HopLimit),
		ah_traffic_class:   C.uint8_t(a.AH.TClass),
	}
	if a.AH.IsGlobal {
		c.ah_is_global = 1
	}
	for i, b := range a.AH.DGID {
		c.ah_dgid[i] = C.uint8_t(b)
	}
	return c
}

func (q *libQP) PostSend(wrs []SendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.p == nil {
		return 0, fmt.Errorf("ibv_post_send: QP %#x is destroyed", q.num)
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	if cap(q.swr) < len(wrs) {
		q.swr = make([]C.goccl_send_wr, len(wrs))
	}
	buf := q.swr[:len(wrs)]
	for i := range wrs {
		w := &wrs[i]
		buf[i] = C.goccl_send_wr{
			id:     C.uint64_t(w.ID),
			addr:   C.uint64_t(w.SGE.Addr),
			len:    C.uint32_t(w.SGE.Len),
			lkey:   C.uint32_t(w.SGE.LKey),
			remote: C.uint64_t(w.Remote),
			rkey:   C.uint32_t(w.RKey),
			imm:    C.uint32_t(w.Imm),
			opcode: C.int32_t(w.Op),
			flags:  C.uint32_t(w.Flags),
		}
	}
	if rc := C.goccl_post_send(q.p, &buf[0], C.int(len(buf)), &q.sbad); rc != 0 {
		b := int(q.sbad)
		return b, fmt.Errorf("ibv_post_send on QP %#x, request %d of %d (%v, id %#x): %w",
			q.num, b, len(wrs), wrs[b].Op, wrs[b].ID, syscall.Errno(rc))
	}
	return len(wrs), nil
}

func (q *libQP) PostRecv(wrs []RecvWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.p == nil {
		return 0, fmt.Errorf("ibv_post_recv: QP %#x is destroyed", q.num)
	}
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	if cap(q.rwr) < len(wrs) {
		q.rwr = make([]C.goccl_recv_wr, len(wrs))
	}
	buf := q.rwr[:len(wrs)]
	for i := range wrs {
		w := &wrs[i]
		buf[i] = C.goccl_recv_wr{
			id:   C.uint64_t(w.ID),
			addr: C.uint64_t(w.SGE.Addr),
			len:  C.uint32_t(w.SGE.Len),
			lkey: C.uint32_t(w.SGE.LKey),
		}
	}
	if rc := C.goccl_post_recv(q.p, &buf[0], C.int(len(buf)), &q.rbad); rc != 0 {
		b := int(q.rbad)
		return b, fmt.Errorf("ibv_post_recv on QP %#x, request %d of %d (id %#x): %w",
			q.num, b, len(wrs), wrs[b].ID, syscall.Errno(rc))
	}
	return len(wrs), nil
}

func (q *libQP) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p == nil {
		return nil
	}
	if q.ctx == nil { // a test fake owns its memory
		q.p = nil
		return nil
	}
	if rc := C.goccl_destroy_qp(q.p); rc != 0 {
		return verbErr(fmt.Sprintf("ibv_destroy_qp %#x", q.num), rc)
	}
	q.p = nil
	q.ctx.qps.Add(-1)
	return nil
}
