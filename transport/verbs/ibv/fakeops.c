//go:build verbs && cgo && linux

/* The fake ops table of fakeops.h. It is stricter than a provider where a
 * provider may be: it checks every link of a chain, the SGE count against
 * a QP made with one SGE per request, and leaves garbage in the fields of
 * a completion that its flags say are not valid. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakeops.h"

/* Longer chains are taken for a cycle. */
#define GOCCL_FAKE_CHAIN_MAX 4096

#define container_of_fake(p, field) ((goccl_fake *)((char *)(p) - offsetof(goccl_fake, field)))

static void violate(goccl_fake *f, const char *what, int pos)
{
	if (!f->violation[0])
		snprintf(f->violation, sizeof f->violation, "%s (request %d)", what, pos);
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	goccl_fake *f = container_of_fake(qp, qp);
	int pos = 0, rc = 0;
	struct ibv_send_wr *reject = NULL;

	f->send_calls++;
	if (qp->context != &f->vctx.context)
		violate(f, "post_send on a QP of another context", 0);
	if (!wr)
		violate(f, "post_send of an empty chain", 0);
	for (; wr; wr = wr->next, pos++) {
		goccl_fake_wr *r;

		if (pos >= GOCCL_FAKE_CHAIN_MAX) {
			violate(f, "a chain of 4096 or more requests (a cycle?)", pos);
			reject = wr;
			rc = ENOMEM;
			break;
		}
		if (!reject) {
			if (pos == f->reject_send_at) {
				reject = wr;
				rc = f->reject_errno;
			} else if (wr->num_sge < 0 || wr->num_sge > 1) {
				/* The QP has max_send_sge 1, as the transport makes it. */
				reject = wr;
				rc = EINVAL;
			} else if (wr->opcode > IBV_WR_RDMA_READ) {
				reject = wr;
				rc = EINVAL;
			}
		}
		if (wr->num_sge > 0 && !wr->sg_list)
			violate(f, "num_sge > 0 with no sg_list", pos);
		if (f->nsends >= GOCCL_FAKE_MAX) {
			f->nsends++;
			continue;
		}
		r = &f->sends[f->nsends++];
		memset(r, 0, sizeof *r);
		r->wr_id = wr->wr_id;
		r->opcode = wr->opcode;
		r->send_flags = wr->send_flags;
		memcpy(r->imm_raw, &wr->imm_data, 4);
		r->remote_addr = wr->wr.rdma.remote_addr;
		r->rkey = wr->wr.rdma.rkey;
		r->num_sge = wr->num_sge;
		r->sg_list_null = wr->sg_list == NULL;
		if (wr->num_sge > 0 && wr->sg_list) {
			r->sge_addr = wr->sg_list[0].addr;
			r->sge_len = wr->sg_list[0].length;
			r->sge_lkey = wr->sg_list[0].lkey;
		}
		r->call = f->send_calls;
		r->pos = pos;
		r->posted = reject == NULL;
	}
	if (reject)
		*bad = reject;
	return rc;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	goccl_fake *f = container_of_fake(qp, qp);
	int pos = 0, rc = 0;
	struct ibv_recv_wr *reject = NULL;

	f->recv_calls++;
	if (qp->context != &f->vctx.context)
		violate(f, "post_recv on a QP of another context", 0);
	if (!wr)
		violate(f, "post_recv of an empty chain", 0);
	for (; wr; wr = wr->next, pos++) {
		goccl_fake_wr *r;

		if (pos >= GOCCL_FAKE_CHAIN_MAX) {
			violate(f, "a chain of 4096 or more requests (a cycle?)", pos);
			reject = wr;
			rc = ENOMEM;
			break;
		}
		if (!reject) {
			if (pos == f->reject_recv_at) {
				reject = wr;
				rc = f->reject_errno;
			} else if (wr->num_sge < 0 || wr->num_sge > 1) {
				reject = wr;
				rc = EINVAL;
			}
		}
		if (wr->num_sge > 0 && !wr->sg_list)
			violate(f, "num_sge > 0 with no sg_list", pos);
		if (f->nrecvs >= GOCCL_FAKE_MAX) {
			f->nrecvs++;
			continue;
		}
		r = &f->recvs[f->nrecvs++];
		memset(r, 0, sizeof *r);
		r->wr_id = wr->wr_id;
		r->num_sge = wr->num_sge;
		r->sg_list_null = wr->sg_list == NULL;
		if (wr->num_sge > 0 && wr->sg_list) {
			r->sge_addr = wr->sg_list[0].addr;
			r->sge_len = wr->sg_list[0].length;
			r->sge_lkey = wr->sg_list[0].lkey;
		}
		r->call = f->recv_calls;
		r->pos = pos;
		r->posted = reject == NULL;
	}
	if (reject)
		*bad = reject;
	return rc;
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	goccl_fake *f = container_of_fake(cq, cq);
	int k = 0;

	f->poll_calls++;
	if (n > f->max_poll_entries)
		f->max_poll_entries = n;
	if (cq->context != &f->vctx.context)
		violate(f, "poll_cq on a CQ of another context", 0);
	if (n <= 0 || !wc) {
		violate(f, "poll_cq for no entries", 0);
		return -1;
	}
	if (f->next_wc >= f->nscript && f->poll_fail)
		return f->poll_fail;
	while (k < n && f->next_wc < f->nscript)
		wc[k++] = f->script[f->next_wc++];
	return k;
}

static int fake_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
			   size_t len)
{
	goccl_fake *f = container_of_fake(ctx, vctx.context);

	f->query_port_calls++;
	f->query_port_len = (int64_t)len;
	if (len != sizeof *attr)
		violate(f, "query_port with a port_attr_len that is not sizeof(struct ibv_port_attr)", 0);
	if (port != 1)
		return EINVAL;
	*attr = f->port;
	return 0;
}

goccl_fake *goccl_fake_new(uint32_t qpn)
{
	goccl_fake *f = calloc(1, sizeof *f);

	if (!f)
		return NULL;
	f->vctx.sz = sizeof f->vctx;
	f->vctx.query_port = fake_query_port;
	f->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	f->vctx.context.ops.post_send = fake_post_send;
	f->vctx.context.ops.post_recv = fake_post_recv;
	f->vctx.context.ops.poll_cq = fake_poll_cq;
	f->vctx.context.async_fd = -1;
	f->vctx.context.cmd_fd = -1;
	f->qp.context = &f->vctx.context;
	f->qp.qp_num = qpn;
	f->qp.qp_type = IBV_QPT_RC;
	f->qp.send_cq = &f->cq;
	f->qp.recv_cq = &f->cq;
	f->cq.context = &f->vctx.context;
	memset(&f->port, 0xa5, sizeof f->port);
	f->cq.cqe = GOCCL_FAKE_MAX;
	f->reject_send_at = -1;
	f->reject_recv_at = -1;
	return f;
}

void goccl_fake_free(goccl_fake *f)
{
	free(f);
}

int goccl_fake_script_wc(goccl_fake *f, uint64_t id, int32_t status, int32_t opcode,
			 uint32_t byte_len, const uint8_t imm_raw[4], uint32_t wc_flags,
			 uint32_t qpn, uint32_t vendor)
{
	struct ibv_wc *w;

	if (f->nscript >= GOCCL_FAKE_MAX)
		return ENOMEM;
	w = &f->script[f->nscript++];
	/* Garbage where the completion's flags say nothing is valid. */
	memset(w, 0xa5, sizeof *w);
	w->wr_id = id;
	w->status = (enum ibv_wc_status)status;
	w->opcode = (enum ibv_wc_opcode)opcode;
	w->byte_len = byte_len;
	w->wc_flags = wc_flags;
	if (wc_flags & IBV_WC_WITH_IMM)
		memcpy(&w->imm_data, imm_raw, 4);
	w->qp_num = qpn;
	w->vendor_err = vendor;
	return 0;
}

void goccl_fake_set_port(goccl_fake *f, int32_t state, int32_t max_mtu, int32_t active_mtu,
			 int32_t gid_tbl_len, uint16_t lid, uint8_t link_layer, uint8_t width,
			 uint8_t speed)
{
	f->port.state = (enum ibv_port_state)state;
	f->port.max_mtu = (enum ibv_mtu)max_mtu;
	f->port.active_mtu = (enum ibv_mtu)active_mtu;
	f->port.gid_tbl_len = gid_tbl_len;
	f->port.lid = lid;
	f->port.link_layer = link_layer;
	f->port.active_width = width;
	f->port.active_speed = speed;
}
