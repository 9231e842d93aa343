/*
 * A fake of a device's ops table for the tests of the cgo layer
 * (fakeops.go, cgo_test.go): a struct ibv_context, ibv_qp and ibv_cq whose
 * ops.post_send, post_recv and poll_cq record what the wrappers hand
 * them and return scripted results. It is not a device: nothing is sent.
 */
#ifndef GOCCL_FAKEOPS_H
#define GOCCL_FAKEOPS_H

#include "verbs_wrap.h"

#define GOCCL_FAKE_MAX 128

/* One work request as the fake saw it. */
typedef struct {
	uint64_t wr_id;
	int32_t opcode;
	uint32_t send_flags;
	uint8_t imm_raw[4]; /* imm_data's bytes in memory order: the wire's */
	uint64_t remote_addr;
	uint32_t rkey;
	int32_t num_sge;
	uint8_t sg_list_null;
	uint8_t posted; /* 0: the fake rejected it or one before it */
	uint64_t sge_addr;
	uint32_t sge_len;
	uint32_t sge_lkey;
	int32_t call; /* which post call carried it, from 1 */
	int32_t pos;  /* its position in that call's chain, from 0 */
} goccl_fake_wr;

typedef struct {
	/* An extended context, so that query_port takes the path of
	 * verbs_get_ctx_op; its context member is the ibv_context. */
	struct verbs_context vctx;
	struct ibv_qp qp;
	struct ibv_cq cq;

	/* Script. reject_*_at: the position in a chain to fail (-1: none),
	 * with reject_errno. poll_fail: what ibv_poll_cq returns once the
	 * scripted completions are gone (0: an empty queue). */
	int32_t reject_send_at, reject_recv_at, reject_errno;
	int32_t poll_fail;
	struct ibv_wc script[GOCCL_FAKE_MAX];
	int32_t nscript, next_wc;
	struct ibv_port_attr port; /* what query_port of port 1 gives */

	/* Records: the first GOCCL_FAKE_MAX requests; the counts go on. */
	goccl_fake_wr sends[GOCCL_FAKE_MAX], recvs[GOCCL_FAKE_MAX];
	int32_t nsends, nrecvs;
	int32_t send_calls, recv_calls, poll_calls;
	int32_t max_poll_entries;
	int32_t query_port_calls;
	int64_t query_port_len; /* the port_attr_len it was given */
	/* The first rule of the verbs API the caller broke; "" if none. */
	char violation[160];
} goccl_fake;

goccl_fake *goccl_fake_new(uint32_t qpn);
void goccl_fake_free(goccl_fake *f);
int goccl_fake_script_wc(goccl_fake *f, uint64_t id, int32_t status, int32_t opcode,
			 uint32_t byte_len, const uint8_t imm_raw[4], uint32_t wc_flags,
			 uint32_t qpn, uint32_t vendor);

void goccl_fake_set_port(goccl_fake *f, int32_t state, int32_t max_mtu, int32_t active_mtu,
			 int32_t gid_tbl_len, uint16_t lid, uint8_t link_layer, uint8_t width,
			 uint8_t speed);

#endif
