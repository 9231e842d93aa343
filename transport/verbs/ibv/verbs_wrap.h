/*
 * The C half of goccl's libibverbs provider (cgo.go): flat structs that Go
 * fills and reads without touching verbs' unions, and wrappers that call
 * libibverbs through a table of functions resolved with dlopen/dlsym.
 *
 * Every wrapper that can fail returns 0 or a positive errno (verbs mixes
 * "return errno", "return -1 and set errno" and "return NULL and set
 * errno"; the wrappers give one convention).
 */
#ifndef GOCCL_VERBS_WRAP_H
#define GOCCL_VERBS_WRAP_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* A send work request with at most one SGE (len 0: none). imm is host
 * order; the C side stores htonl(imm). */
typedef struct {
	uint64_t id;
	uint64_t addr;
	uint32_t len;
	uint32_t lkey;
	uint64_t remote;
	uint32_t rkey;
	uint32_t imm;
	int32_t opcode;
	uint32_t flags;
} goccl_send_wr;

typedef struct {
	uint64_t id;
	uint64_t addr;
	uint32_t len;
	uint32_t lkey;
} goccl_recv_wr;

/* A work completion; imm is host order, valid when has_imm. */
typedef struct {
	uint64_t id;
	int32_t status;
	int32_t opcode;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t qp_num;
	uint32_t vendor_err;
	uint8_t has_imm;
} goccl_wc;

typedef struct {
	int32_t state;
	int32_t path_mtu;
	uint32_t access;
	uint32_t dest_qpn;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint16_t pkey_index;
	uint8_t port;
	uint8_t max_dest_rd_atomic;
	uint8_t max_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	/* ah_attr */
	uint8_t ah_is_global;
	uint8_t ah_sl;
	uint8_t ah_port;
	uint16_t ah_dlid;
	uint8_t ah_sgid_index;
	uint8_t ah_hop_limit;
	uint8_t ah_traffic_class;
	uint8_t ah_dgid[16];
} goccl_qp_attr;

typedef struct {
	int32_t state;
	int32_t max_mtu;
	int32_t active_mtu;
	int32_t gid_tbl_len;
	uint16_t lid;
	uint8_t link_layer;
	uint8_t active_width;
	uint8_t active_speed;
} goccl_port_attr;

typedef struct {
	int32_t type;
	uint32_t qp_num;
	int32_t port;
} goccl_event;

/* Loading. goccl_ibv_resolve opens lib and resolves every function; with
 * commit set and success it installs them for the wrappers below (once:
 * a second commit is refused with EALREADY), else it closes the library
 * again. It returns 0, 1 (dlopen failed) or 2 (a function is missing);
 * msg gets dlerror's text or the missing function's name. */
int goccl_ibv_resolve(const char *lib, int commit, char *msg, size_t msglen);

struct ibv_device **goccl_get_device_list(int *num, int *err);
void goccl_free_device_list(struct ibv_device **list);
const char *goccl_device_name(struct ibv_device *dev);
uint64_t goccl_device_guid(struct ibv_device *dev); /* host order */
const char *goccl_device_ibdev_path(struct ibv_device *dev);

struct ibv_context *goccl_open_device(struct ibv_device *dev, int *err);
int goccl_close_device(struct ibv_context *ctx);
int goccl_async_fd(struct ibv_context *ctx);
int goccl_port_count(struct ibv_context *ctx, int *ports);
int goccl_query_port(struct ibv_context *ctx, int port, goccl_port_attr *out);
/* *type_known is 0 when the library cannot say (no _ibv_query_gid_ex):
 * the caller reads sysfs. type is 0 for IB/RoCE v1, 1 for RoCE v2. */
int goccl_query_gid(struct ibv_context *ctx, int port, int index, uint8_t gid[16],
		    int *type, int *type_known);

struct ibv_pd *goccl_alloc_pd(struct ibv_context *ctx, int *err);
int goccl_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *goccl_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t len, uint32_t access,
			    int *err);
/* ibv_reg_dmabuf_mr; *err is EOPNOTSUPP where the library lacks it. */
struct ibv_mr *goccl_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
				   uint64_t iova, int fd, uint32_t access, int *err);
int goccl_dereg_mr(struct ibv_mr *mr);
struct ibv_cq *goccl_create_cq(struct ibv_context *ctx, int cqe, int *err);
int goccl_destroy_cq(struct ibv_cq *cq);
struct ibv_qp *goccl_create_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t max_send_wr,
			       uint32_t max_recv_wr, uint32_t max_send_sge,
			       uint32_t max_recv_sge, uint32_t max_inline, int *err);
int goccl_destroy_qp(struct ibv_qp *qp);
int goccl_modify_qp(struct ibv_qp *qp, const goccl_qp_attr *a, int mask);
/* The ibv_qp_attr that goccl_modify_qp passes (zero where a says nothing). */
void goccl_fill_qp_attr(const goccl_qp_attr *in, struct ibv_qp_attr *out);

/* Post n requests as one chain in one ibv_post_send / ibv_post_recv. On
 * an error *bad is the index of the first request not posted; on success
 * it is n. */
int goccl_post_send(struct ibv_qp *qp, const goccl_send_wr *w, int n, int *bad);
int goccl_post_recv(struct ibv_qp *qp, const goccl_recv_wr *w, int n, int *bad);
/* Poll up to n completions into out; returns how many, or a negative
 * value if the CQ failed before any was polled. */
int goccl_poll_cq(struct ibv_cq *cq, goccl_wc *out, int n);

/* Take one asynchronous event (the context's async fd must be
 * non-blocking): 0 with *e filled, EAGAIN if there is none, or an errno.
 * The event is acknowledged before returning. */
int goccl_get_async_event(struct ibv_context *ctx, goccl_event *e);

#endif
