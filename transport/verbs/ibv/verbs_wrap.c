//go:build verbs && cgo && linux

/*
 * The C half of goccl's libibverbs provider; see verbs_wrap.h and cgo.go.
 *
 * No libibverbs symbol is linked: every library function is called
 * through fn, filled by goccl_ibv_resolve from dlopen/dlvsym. The header's
 * static inline functions that reach the library only through the
 * context's ops table (ibv_post_send, ibv_post_recv, ibv_poll_cq) are
 * called directly; the ones that call library symbols (the ibv_query_port
 * and ibv_reg_mr macros, ibv_query_gid_ex) are written out here over fn.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_wrap.h"

struct goccl_fns {
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	__be64 (*get_device_guid)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	/* The exported ibv_query_port takes the compat struct; the header's
	 * macro passes a full ibv_port_attr cast to it, as goccl_query_port
	 * does. */
	int (*query_port)(struct ibv_context *ctx, uint8_t port,
			  struct _compat_ibv_port_attr *attr);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
				    struct ibv_comp_channel *channel, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
	void (*ack_async_event)(struct ibv_async_event *ev);
	/* Optional: NULL in libraries older than their versions. */
	int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
			    struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				       unsigned int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
					uint64_t iova, int fd, int access);
};

/* Written once by a committing goccl_ibv_resolve (cgo.go calls it under a
 * sync.Once), read-only afterwards. */
static struct goccl_fns fn;
static int fn_loaded;

#define V11 "IBVERBS_1.1"
#define F(field) offsetof(struct goccl_fns, field)

static const struct {
	size_t off;
	const char *name;
	const char *version;
	int optional;
} syms[] = {
	{F(get_device_list), "ibv_get_device_list", V11, 0},
	{F(free_device_list), "ibv_free_device_list", V11, 0},
	{F(get_device_name), "ibv_get_device_name", V11, 0},
	{F(get_device_guid), "ibv_get_device_guid", V11, 0},
	{F(open_device), "ibv_open_device", V11, 0},
	{F(close_device), "ibv_close_device", V11, 0},
	{F(query_device), "ibv_query_device", V11, 0},
	{F(query_port), "ibv_query_port", V11, 0},
	{F(query_gid), "ibv_query_gid", V11, 0},
	{F(alloc_pd), "ibv_alloc_pd", V11, 0},
	{F(dealloc_pd), "ibv_dealloc_pd", V11, 0},
	{F(reg_mr), "ibv_reg_mr", V11, 0},
	{F(dereg_mr), "ibv_dereg_mr", V11, 0},
	{F(create_cq), "ibv_create_cq", V11, 0},
	{F(destroy_cq), "ibv_destroy_cq", V11, 0},
	{F(create_qp), "ibv_create_qp", V11, 0},
	{F(modify_qp), "ibv_modify_qp", V11, 0},
	{F(destroy_qp), "ibv_destroy_qp", V11, 0},
	{F(get_async_event), "ibv_get_async_event", V11, 0},
	{F(ack_async_event), "ibv_ack_async_event", V11, 0},
	{F(query_gid_ex), "_ibv_query_gid_ex", "IBVERBS_1.11", 1},
	{F(reg_mr_iova2), "ibv_reg_mr_iova2", "IBVERBS_1.8", 1},
	{F(reg_dmabuf_mr), "ibv_reg_dmabuf_mr", "IBVERBS_1.12", 1},
};

/* Most of these functions exist twice in libibverbs.so.1: IBVERBS_1.0
 * (the pre-2006 ABI, other structs) and IBVERBS_1.1. Ask for the version
 * the header describes, as NCCL's ibvsymbols.cc does; an unversioned
 * library (or a libc without dlvsym) gets the default symbol. */
static void *lookup(void *h, const char *name, const char *version)
{
	void *p = NULL;
#ifdef __GLIBC__
	p = dlvsym(h, name, version);
#else
	(void)version;
#endif
	if (!p)
		p = dlsym(h, name);
	return p;
}

int goccl_ibv_resolve(const char *lib, int commit, char *msg, size_t msglen)
{
	struct goccl_fns t;
	void *h;
	size_t i;

	/* dlerror's state is per thread: dlopen, dlvsym and dlerror run in
	 * this one call, on one thread. */
	msg[0] = 0;
	if (commit && fn_loaded) {
		snprintf(msg, msglen, "libibverbs is already loaded");
		return EALREADY;
	}
	dlerror();
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(msg, msglen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	memset(&t, 0, sizeof t);
	for (i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		void *p = lookup(h, syms[i].name, syms[i].version);
		if (!p && !syms[i].optional) {
			snprintf(msg, msglen, "%s@%s", syms[i].name, syms[i].version);
			dlclose(h);
			return 2;
		}
		/* POSIX lets a data pointer from dlsym hold a function. */
		memcpy((char *)&t + syms[i].off, &p, sizeof p);
	}
	if (!commit) {
		dlclose(h);
		return 0;
	}
	/* The library stays open for the life of the process: its providers
	 * keep threads and state. */
	fn = t;
	fn_loaded = 1;
	return 0;
}

/* errno of a verb that returned rc: verbs return an errno value, or -1
 * with errno set (or not). */
static int norm(int rc)
{
	if (rc == 0)
		return 0;
	if (rc > 0)
		return rc;
	return errno ? errno : EIO;
}

static int perr(void)
{
	return errno ? errno : EIO;
}

struct ibv_device **goccl_get_device_list(int *num, int *err)
{
	struct ibv_device **l;

	*num = 0;
	*err = 0;
	if (!fn_loaded) {
		*err = ENOSYS;
		return NULL;
	}
	errno = 0;
	l = fn.get_device_list(num);
	if (!l)
		*err = errno ? errno : ENODEV;
	return l;
}

void goccl_free_device_list(struct ibv_device **list)
{
	fn.free_device_list(list);
}

const char *goccl_device_name(struct ibv_device *dev)
{
	const char *n = fn.get_device_name(dev);
	return n ? n : "";
}

uint64_t goccl_device_guid(struct ibv_device *dev)
{
	return be64toh(fn.get_device_guid(dev));
}

const char *goccl_device_ibdev_path(struct ibv_device *dev)
{
	return dev->ibdev_path;
}

struct ibv_context *goccl_open_device(struct ibv_device *dev, int *err)
{
	struct ibv_context *c;

	errno = 0;
	c = fn.open_device(dev);
	*err = c ? 0 : perr();
	return c;
}

int goccl_close_device(struct ibv_context *ctx)
{
	errno = 0;
	return norm(fn.close_device(ctx));
}

int goccl_async_fd(struct ibv_context *ctx)
{
	return ctx->async_fd;
}

int goccl_port_count(struct ibv_context *ctx, int *ports)
{
	struct ibv_device_attr a;
	int rc;

	memset(&a, 0, sizeof a);
	errno = 0;
	rc = norm(fn.query_device(ctx, &a));
	*ports = a.phys_port_cnt;
	return rc;
}

int goccl_query_port(struct ibv_context *ctx, int port, goccl_port_attr *out)
{
	struct ibv_port_attr a;
	struct verbs_context *vctx;
	int rc;

	memset(&a, 0, sizeof a);
	errno = 0;
	/* What the header's ibv_query_port macro (___ibv_query_port) does:
	 * the extended context's query_port with the struct's size where the
	 * provider has one, else the exported compat entry point. */
	vctx = verbs_get_ctx_op(ctx, query_port);
	if (vctx)
		rc = vctx->query_port(ctx, (uint8_t)port, &a, sizeof a);
	else
		rc = fn.query_port(ctx, (uint8_t)port, (struct _compat_ibv_port_attr *)&a);
	if (rc)
		return norm(rc);
	out->state = a.state;
	out->max_mtu = a.max_mtu;
	out->active_mtu = a.active_mtu;
	out->gid_tbl_len = a.gid_tbl_len;
	out->lid = a.lid;
	out->link_layer = a.link_layer;
	out->active_width = a.active_width;
	out->active_speed = a.active_speed;
	return 0;
}

int goccl_query_gid(struct ibv_context *ctx, int port, int index, uint8_t gid[16],
		    int *type, int *type_known)
{
	static const uint8_t zero[16];
	union ibv_gid g;
	struct ibv_gid_entry e;
	int rc;

	*type = 0;
	*type_known = 0;
	errno = 0;
	rc = fn.query_gid(ctx, (uint8_t)port, index, &g);
	if (rc)
		return norm(rc);
	memcpy(gid, g.raw, 16);
	if (memcmp(g.raw, zero, 16) == 0) {
		*type_known = 1; /* an empty entry */
		return 0;
	}
	if (fn.query_gid_ex) {
		memset(&e, 0, sizeof e);
		if (fn.query_gid_ex(ctx, (uint32_t)port, (uint32_t)index, &e, 0, sizeof e) == 0) {
			*type = e.gid_type == IBV_GID_TYPE_ROCE_V2;
			*type_known = 1;
		}
	}
	return 0;
}

struct ibv_pd *goccl_alloc_pd(struct ibv_context *ctx, int *err)
{
	struct ibv_pd *pd;

	errno = 0;
	pd = fn.alloc_pd(ctx);
	*err = pd ? 0 : perr();
	return pd;
}

int goccl_dealloc_pd(struct ibv_pd *pd)
{
	errno = 0;
	return norm(fn.dealloc_pd(pd));
}

struct ibv_mr *goccl_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t len, uint32_t access,
			    int *err)
{
	struct ibv_mr *mr;
	void *p = (void *)(uintptr_t)addr;

	errno = 0;
	/* The header's ibv_reg_mr macro: flags from the optional range (relaxed
	 * ordering) need ibv_reg_mr_iova2, which masks them off where the
	 * kernel lacks them; a library without it gets them masked here, as
	 * "optional" allows. */
	if (access & IBV_ACCESS_OPTIONAL_RANGE) {
		if (fn.reg_mr_iova2)
			mr = fn.reg_mr_iova2(pd, p, len, addr, access);
		else
			mr = fn.reg_mr(pd, p, len, (int)(access & ~IBV_ACCESS_OPTIONAL_RANGE));
	} else {
		mr = fn.reg_mr(pd, p, len, (int)access);
	}
	*err = mr ? 0 : perr();
	return mr;
}

struct ibv_mr *goccl_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
				   uint64_t iova, int fd, uint32_t access, int *err)
{
	struct ibv_mr *mr;

	if (!fn.reg_dmabuf_mr) {
		*err = EOPNOTSUPP; /* a library older than rdma-core 34 */
		return NULL;
	}
	errno = 0;
	mr = fn.reg_dmabuf_mr(pd, offset, len, iova, fd, (int)(access & ~IBV_ACCESS_OPTIONAL_RANGE));
	*err = mr ? 0 : perr();
	return mr;
}

int goccl_dereg_mr(struct ibv_mr *mr)
{
	errno = 0;
	return norm(fn.dereg_mr(mr));
}

struct ibv_cq *goccl_create_cq(struct ibv_context *ctx, int cqe, int *err)
{
	struct ibv_cq *cq;

	errno = 0;
	cq = fn.create_cq(ctx, cqe, NULL, NULL, 0);
	*err = cq ? 0 : perr();
	return cq;
}

int goccl_destroy_cq(struct ibv_cq *cq)
{
	errno = 0;
	return norm(fn.destroy_cq(cq));
}

struct ibv_qp *goccl_create_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t max_send_wr,
			       uint32_t max_recv_wr, uint32_t max_send_sge,
			       uint32_t max_recv_sge, uint32_t max_inline, int *err)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_recv_sge = max_recv_sge;
	a.cap.max_inline_data = max_inline;
	errno = 0;
	qp = fn.create_qp(pd, &a);
	*err = qp ? 0 : perr();
	return qp;
}

int goccl_destroy_qp(struct ibv_qp *qp)
{
	errno = 0;
	return norm(fn.destroy_qp(qp));
}

void goccl_fill_qp_attr(const goccl_qp_attr *in, struct ibv_qp_attr *a)
{
	memset(a, 0, sizeof *a);
	a->qp_state = (enum ibv_qp_state)in->state;
	a->pkey_index = in->pkey_index;
	a->port_num = in->port;
	a->qp_access_flags = in->access;
	a->path_mtu = (enum ibv_mtu)in->path_mtu;
	a->dest_qp_num = in->dest_qpn;
	a->rq_psn = in->rq_psn;
	a->sq_psn = in->sq_psn;
	a->max_dest_rd_atomic = in->max_dest_rd_atomic;
	a->max_rd_atomic = in->max_rd_atomic;
	a->min_rnr_timer = in->min_rnr_timer;
	a->timeout = in->timeout;
	a->retry_cnt = in->retry_cnt;
	a->rnr_retry = in->rnr_retry;
	a->ah_attr.is_global = in->ah_is_global;
	a->ah_attr.dlid = in->ah_dlid;
	a->ah_attr.sl = in->ah_sl;
	a->ah_attr.port_num = in->ah_port;
	memcpy(a->ah_attr.grh.dgid.raw, in->ah_dgid, 16);
	a->ah_attr.grh.sgid_index = in->ah_sgid_index;
	a->ah_attr.grh.hop_limit = in->ah_hop_limit;
	a->ah_attr.grh.traffic_class = in->ah_traffic_class;
}

int goccl_modify_qp(struct ibv_qp *qp, const goccl_qp_attr *in, int mask)
{
	struct ibv_qp_attr a;

	goccl_fill_qp_attr(in, &a);
	errno = 0;
	return norm(fn.modify_qp(qp, &a, mask));
}

/* Chains up to this long are built on the C stack (about 4.5 KiB);
 * longer ones in malloc'd memory. */
#define GOCCL_STACK_WRS 32

int goccl_post_send(struct ibv_qp *qp, const goccl_send_wr *w, int n, int *bad)
{
	struct ibv_send_wr stack_wr[GOCCL_STACK_WRS];
	struct ibv_sge stack_sge[GOCCL_STACK_WRS];
	struct ibv_send_wr *wr = stack_wr, *badwr = NULL;
	struct ibv_sge *sge = stack_sge;
	int i, rc;

	*bad = 0;
	if (n <= 0)
		return 0;
	if (n > GOCCL_STACK_WRS) {
		wr = calloc((size_t)n, sizeof *wr);
		sge = calloc((size_t)n, sizeof *sge);
		if (!wr || !sge) {
			free(wr);
			free(sge);
			return ENOMEM;
		}
	} else {
		memset(wr, 0, (size_t)n * sizeof *wr);
	}
	for (i = 0; i < n; i++) {
		struct ibv_send_wr *r = &wr[i];

		r->wr_id = w[i].id;
		r->next = i + 1 < n ? &wr[i + 1] : NULL;
		if (w[i].len > 0) {
			sge[i].addr = w[i].addr;
			sge[i].length = w[i].len;
			sge[i].lkey = w[i].lkey;
			r->sg_list = &sge[i];
			r->num_sge = 1;
		}
		r->opcode = (enum ibv_wr_opcode)w[i].opcode;
		r->send_flags = w[i].flags;
		switch (r->opcode) {
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_SEND_WITH_IMM:
			r->imm_data = htonl(w[i].imm);
			break;
		default:
			break;
		}
		switch (r->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			r->wr.rdma.remote_addr = w[i].remote;
			r->wr.rdma.rkey = w[i].rkey;
			break;
		default:
			break;
		}
	}
	errno = 0;
	rc = ibv_post_send(qp, wr, &badwr);
	if (rc) {
		rc = norm(rc);
		/* A provider that fails without naming the request leaves the
		 * caller to assume none was posted. */
		*bad = badwr >= wr && badwr < wr + n ? (int)(badwr - wr) : 0;
	} else {
		*bad = n;
	}
	if (wr != stack_wr) {
		free(wr);
		free(sge);
	}
	return rc;
}

int goccl_post_recv(struct ibv_qp *qp, const goccl_recv_wr *w, int n, int *bad)
{
	struct ibv_recv_wr stack_wr[GOCCL_STACK_WRS];
	struct ibv_sge stack_sge[GOCCL_STACK_WRS];
	struct ibv_recv_wr *wr = stack_wr, *badwr = NULL;
	struct ibv_sge *sge = stack_sge;
	int i, rc;

	*bad = 0;
	if (n <= 0)
		return 0;
	if (n > GOCCL_STACK_WRS) {
		wr = calloc((size_t)n, sizeof *wr);
		sge = calloc((size_t)n, sizeof *sge);
		if (!wr || !sge) {
			free(wr);
			free(sge);
			return ENOMEM;
		}
	} else {
		memset(wr, 0, (size_t)n * sizeof *wr);
	}
	for (i = 0; i < n; i++) {
		wr[i].wr_id = w[i].id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		if (w[i].len > 0) {
			sge[i].addr = w[i].addr;
			sge[i].length = w[i].len;
			sge[i].lkey = w[i].lkey;
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
		}
	}
	errno = 0;
	rc = ibv_post_recv(qp, wr, &badwr);
	if (rc) {
		rc = norm(rc);
		*bad = badwr >= wr && badwr < wr + n ? (int)(badwr - wr) : 0;
	} else {
		*bad = n;
	}
	if (wr != stack_wr) {
		free(wr);
		free(sge);
	}
	return rc;
}

#define GOCCL_POLL_BATCH 32

int goccl_poll_cq(struct ibv_cq *cq, goccl_wc *out, int n)
{
	struct ibv_wc wc[GOCCL_POLL_BATCH];
	int got = 0;

	while (got < n) {
		int want = n - got, k, j;

		if (want > GOCCL_POLL_BATCH)
			want = GOCCL_POLL_BATCH;
		k = ibv_poll_cq(cq, want, wc);
		if (k < 0)
			/* Hand over what was polled; the next call reports the
			 * failure. */
			return got > 0 ? got : k;
		for (j = 0; j < k; j++) {
			goccl_wc *o = &out[got + j];

			o->id = wc[j].wr_id;
			o->status = wc[j].status;
			o->opcode = wc[j].opcode;
			o->byte_len = wc[j].byte_len;
			o->qp_num = wc[j].qp_num;
			o->vendor_err = wc[j].vendor_err;
			o->has_imm = (wc[j].wc_flags & IBV_WC_WITH_IMM) != 0;
			o->imm = o->has_imm ? ntohl(wc[j].imm_data) : 0;
		}
		got += k;
		if (k < want)
			break;
	}
	return got;
}

int goccl_get_async_event(struct ibv_context *ctx, goccl_event *e)
{
	struct ibv_async_event ev;

	errno = 0;
	if (fn.get_async_event(ctx, &ev))
		return perr(); /* EAGAIN: none (the fd is non-blocking) */
	e->type = ev.event_type;
	e->qp_num = 0;
	e->port = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		/* The QP outlives the event: ibv_destroy_qp waits for its
		 * events to be acknowledged, below. */
		if (ev.element.qp)
			e->qp_num = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		e->port = ev.element.port_num;
		break;
	default:
		break;
	}
	fn.ack_async_event(&ev);
	return 0;
}
