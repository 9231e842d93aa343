//go:build verbs && cgo && linux

package ibv

// Test helpers over fakeops.c, a fake of a device's ops table, for
// cgo_test.go (cgo is not allowed in test files). The fake is not a
// device and nothing here is reachable from the package's API.

/*
#include <stdlib.h>
#include "fakeops.h"
*/
import "C"

import (
	"fmt"
	"syscall"
)

// wcWithImm is IBV_WC_WITH_IMM, for scripting completions.
const wcWithImm = uint32(C.IBV_WC_WITH_IMM)

// fakeDevice is a fake context with one QP and one CQ.
type fakeDevice struct {
	f  *C.goccl_fake
	qp *libQP
	cq *libCQ
}

// newFakeDevice makes a fake whose QP has number qpn; free releases it.
func newFakeDevice(qpn uint32) *fakeDevice {
	f := C.goccl_fake_new(C.uint32_t(qpn))
	if f == nil {
		panic("ibv: out of C memory for a fake")
	}
	return &fakeDevice{
		f:  f,
		qp: &libQP{p: &f.qp, num: qpn},
		cq: &libCQ{p: &f.cq},
	}
}

// free releases the fake; its QP and CQ must not be used after.
func (d *fakeDevice) free() {
	d.qp.Destroy()
	d.cq.Destroy()
	C.goccl_fake_free(d.f)
}

// rejectSend makes the fake's post_send fail the request at position pos
// of every chain (-1: none) with errno; rejectRecv likewise.
func (d *fakeDevice) rejectSend(pos int, errno syscall.Errno) {
	d.f.reject_send_at, d.f.reject_errno = C.int32_t(pos), C.int32_t(errno)
}

func (d *fakeDevice) rejectRecv(pos int, errno syscall.Errno) {
	d.f.reject_recv_at, d.f.reject_errno = C.int32_t(pos), C.int32_t(errno)
}

// failPoll makes poll_cq return rc (negative) once the script is done.
func (d *fakeDevice) failPoll(rc int) { d.f.poll_fail = C.int32_t(rc) }

// fakeWC is a completion to script: Wire holds imm_data's bytes as the
// wire carries them, and Flags the raw wc_flags.
type fakeWC struct {
	ID      uint64
	Status  Status
	Opcode  WCOpcode
	ByteLen uint32
	Wire    [4]byte
	Flags   uint32
	QPNum   uint32
	Vendor  uint32
}

func (d *fakeDevice) script(wcs ...fakeWC) {
	for _, w := range wcs {
		var imm [4]C.uint8_t
		for i, b := range w.Wire {
			imm[i] = C.uint8_t(b)
		}
		if rc := C.goccl_fake_script_wc(d.f, C.uint64_t(w.ID), C.int32_t(w.Status), C.int32_t(w.Opcode),
			C.uint32_t(w.ByteLen), &imm[0], C.uint32_t(w.Flags), C.uint32_t(w.QPNum), C.uint32_t(w.Vendor)); rc != 0 {
			panic(fmt.Sprintf("ibv: the fake's script is full (%d completions)", C.GOCCL_FAKE_MAX))
		}
	}
}

// fakeWR is a work request as the fake's post_send or post_recv saw it.
type fakeWR struct {
	ID        uint64
	Op        Opcode
	Flags     SendFlags
	Wire      [4]byte // imm_data's bytes in memory order
	Remote    uint64
	RKey      uint32
	NumSGE    int
	SGListNil bool
	SGE       SGE // when NumSGE > 0
	Call, Pos int // which post call (from 1), where in its chain (from 0)
	Posted    bool
}

func (d *fakeDevice) sends() []fakeWR { return fakeRecords(d.f.sends[:], int(d.f.nsends)) }
func (d *fakeDevice) recvs() []fakeWR { return fakeRecords(d.f.recvs[:], int(d.f.nrecvs)) }

func fakeRecords(rs []C.goccl_fake_wr, n int) []fakeWR {
	out := make([]fakeWR, 0, min(n, len(rs)))
	for _, r := range rs[:min(n, len(rs))] {
		w := fakeWR{
			ID:        uint64(r.wr_id),
			Op:        Opcode(r.opcode),
			Flags:     SendFlags(r.send_flags),
			Remote:    uint64(r.remote_addr),
			RKey:      uint32(r.rkey),
			NumSGE:    int(r.num_sge),
			SGListNil: r.sg_list_null != 0,
			SGE:       SGE{Addr: uint64(r.sge_addr), Len: uint32(r.sge_len), LKey: uint32(r.sge_lkey)},
			Call:      int(r.call),
			Pos:       int(r.pos),
			Posted:    r.posted != 0,
		}
		for i := range w.Wire {
			w.Wire[i] = byte(r.imm_raw[i])
		}
		out = append(out, w)
	}
	return out
}

// counts returns how many requests the fake saw and how often each op
// was called.
func (d *fakeDevice) counts() (sends, recvs, sendCalls, recvCalls, pollCalls int) {
	return int(d.f.nsends), int(d.f.nrecvs), int(d.f.send_calls), int(d.f.recv_calls), int(d.f.poll_calls)
}

// maxPollEntries is the most entries one poll_cq call asked for.
func (d *fakeDevice) maxPollEntries() int { return int(d.f.max_poll_entries) }

// violation is the first rule of the verbs API the wrappers broke; "" if
// none.
func (d *fakeDevice) violation() string { return C.GoString(&d.f.violation[0]) }

// checkLoad resolves libibverbs' functions from name without installing
// them, as OpenLibrary would.
func checkLoad(name string) error { return load(name, false) }

// context is a libContext over the fake, with one port, for QueryPort
// (through the extended context's query_port). Only QueryPort may be
// called on it: the rest needs libibverbs.
func (d *fakeDevice) context() *libContext {
	return &libContext{p: &d.f.vctx.context, info: DeviceInfo{Name: "fake0", Ports: 1}, wake: -1}
}

// setPort scripts what query_port of port 1 returns; the other fields of
// ibv_port_attr hold garbage.
func (d *fakeDevice) setPort(a PortAttr) {
	C.goccl_fake_set_port(d.f, C.int32_t(a.State), C.int32_t(a.MaxMTU), C.int32_t(a.ActiveMTU),
		C.int32_t(a.GIDTblLen), C.uint16_t(a.LID), C.uint8_t(a.LinkLayer), C.uint8_t(a.ActiveWidth), C.uint8_t(a.ActiveSpeed))
}

// queryPortSeen is how often query_port was called and the
// port_attr_len of the last call.
func (d *fakeDevice) queryPortSeen() (calls int, attrLen int) {
	return int(d.f.query_port_calls), int(d.f.query_port_len)
}

// modifyAttr is the struct ibv_qp_attr that Modify would pass for a,
// read back into a QPAttr, and whether every field QPAttr does not name
// is zero.
func modifyAttr(a *QPAttr) (QPAttr, bool) {
	in := cQPAttr(a)
	var c C.struct_ibv_qp_attr
	C.goccl_fill_qp_attr(&in, &c)
	out := QPAttr{
		State:           QPState(c.qp_state),
		PKeyIndex:       uint16(c.pkey_index),
		Port:            uint8(c.port_num),
		Access:          Access(c.qp_access_flags),
		PathMTU:         MTU(c.path_mtu),
		DestQPN:         uint32(c.dest_qp_num),
		RQPSN:           uint32(c.rq_psn),
		SQPSN:           uint32(c.sq_psn),
		MaxDestRdAtomic: uint8(c.max_dest_rd_atomic),
		MaxRdAtomic:     uint8(c.max_rd_atomic),
		MinRNRTimer:     uint8(c.min_rnr_timer),
		Timeout:         uint8(c.timeout),
		RetryCnt:        uint8(c.retry_cnt),
		RNRRetry:        uint8(c.rnr_retry),
		AH: AH{
			DLID:     uint16(c.ah_attr.dlid),
			SL:       uint8(c.ah_attr.sl),
			IsGlobal: c.ah_attr.is_global != 0,
			DGID:     GID(c.ah_attr.grh.dgid),
			SGIDIdx:  uint8(c.ah_attr.grh.sgid_index),
			HopLimit: uint8(c.ah_attr.grh.hop_limit),
			TClass:   uint8(c.ah_attr.grh.traffic_class),
			Port:     uint8(c.ah_attr.port_num),
		},
	}
	rest := c.cur_qp_state == 0 && c.path_mig_state == 0 && c.qkey == 0 && c.cap == (C.struct_ibv_qp_cap{}) &&
		c.alt_ah_attr == (C.struct_ibv_ah_attr{}) && c.alt_pkey_index == 0 && c.en_sqd_async_notify == 0 &&
		c.sq_draining == 0 && c.alt_port_num == 0 && c.alt_timeout == 0 && c.rate_limit == 0 &&
		c.ah_attr.grh.flow_label == 0 && c.ah_attr.src_path_bits == 0 && c.ah_attr.static_rate == 0
	return out, rest
}
