/* SPDX-License-Identifier: MIT */
/*
 * The one layer between rdmaxd and rdma-core. libibverbs and librdmacm use
 * three error conventions (NULL + errno, a positive errno, -1 + errno); every
 * wrapper here returns 0 (or a count) or a negative errno, and writes its
 * ret_* out-parameters only on success. Other modules use the rdma-core types
 * and constants from these headers but call rdma-core only through here.
 */
#ifndef RDMAXD_VERBS_H
#define RDMAXD_VERBS_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- devices ---- */

/*
 * Devices as librdmacm opened them: rdma_cm ids report these same contexts in
 * id->verbs, so a PD made on one of them can carry an rdma_cm QP.
 * \return the number of devices (possibly 0), or -errno
 */
int verbs_get_devices(struct ibv_context ***ret_list);
void verbs_free_devices(struct ibv_context **list);
const char *verbs_device_name(const struct ibv_context *ctx);
int verbs_query_device(struct ibv_context *ctx, struct ibv_device_attr *ret_attr);
int verbs_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *ret_attr);
const char *verbs_port_state_str(enum ibv_port_state state);

/* Valid GID entries of every port; returns how many were written, or -errno. */
int verbs_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max);
/* Whether the kernel and device support ibv_reg_dmabuf_mr() (probed without memory). */
bool verbs_dmabuf_supported(struct ibv_pd *pd);

int verbs_alloc_pd(struct ibv_context *ctx, struct ibv_pd **ret_pd);
int verbs_dealloc_pd(struct ibv_pd *pd);

/* ---- completion queues ---- */

int verbs_create_comp_channel(struct ibv_context *ctx, struct ibv_comp_channel **ret_channel);
int verbs_destroy_comp_channel(struct ibv_comp_channel *channel);
int verbs_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *channel,
		    struct ibv_cq **ret_cq);
int verbs_destroy_cq(struct ibv_cq *cq);
/* Arm the CQ for its next completion (any, not only solicited). */
int verbs_req_notify_cq(struct ibv_cq *cq);
/* One notification from a non-blocking channel; -EAGAIN when there is none. */
int verbs_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **ret_cq);
void verbs_ack_cq_events(struct ibv_cq *cq, unsigned int n);
/* Up to n completions; returns how many, or -errno. */
int verbs_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
const char *verbs_wc_status_str(enum ibv_wc_status status);

/* ---- shared receive queue ---- */

int verbs_create_srq(struct ibv_pd *pd, uint32_t max_wr, struct ibv_srq **ret_srq);
int verbs_destroy_srq(struct ibv_srq *srq);
/*
 * Post a chain of receives. Returns how many were posted: all of them, or the
 * ones before a WR the device refused; -errno when it refused the first.
 */
int verbs_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr);

/* ---- memory ---- */

/* Register [addr, addr+length) so that peers address it at iova. */
int verbs_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access,
		 struct ibv_mr **ret_mr);
/* Register length bytes at offset of a dma-buf fd (GPU memory), addressed at iova. */
int verbs_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
			int access, struct ibv_mr **ret_mr);
int verbs_dereg_mr(struct ibv_mr *mr);

/* ---- queue pairs ---- */

int verbs_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr);
/* Move the QP to the error state: posted WRs flush, new ones complete with a flush error. */
int verbs_qp_to_error(struct ibv_qp *qp);

/* ---- async events ---- */

/* One async event from the (non-blocking) context fd; -EAGAIN when there is none. */
int verbs_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ret_event);
void verbs_ack_async_event(struct ibv_async_event *event);
const char *verbs_event_type_str(enum ibv_event_type type);

/* O_NONBLOCK on an rdma-core fd (completion channel, async fd, rdma_cm channel). */
int verbs_set_nonblock(int fd);

/* ---- rdma_cm ---- */

int verbs_cm_create_channel(struct rdma_event_channel **ret_channel);
void verbs_cm_destroy_channel(struct rdma_event_channel *channel);
int verbs_cm_create_id(struct rdma_event_channel *channel, void *context,
		       struct rdma_cm_id **ret_id);
/* Every event of the id must have been acked. */
int verbs_cm_destroy_id(struct rdma_cm_id *id);
int verbs_cm_bind_addr(struct rdma_cm_id *id, const struct sockaddr *addr);
int verbs_cm_listen(struct rdma_cm_id *id, int backlog);
uint16_t verbs_cm_src_port(struct rdma_cm_id *id);
/* RC retransmission timeout exponent (4.096 us * 2^timeout) for this id's QP. */
int verbs_cm_set_ack_timeout(struct rdma_cm_id *id, uint8_t timeout);
int verbs_cm_resolve_addr(struct rdma_cm_id *id, const struct sockaddr *src,
			  const struct sockaddr *dst, int timeout_ms);
int verbs_cm_resolve_route(struct rdma_cm_id *id, int timeout_ms);
int verbs_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
void verbs_cm_destroy_qp(struct rdma_cm_id *id);
int verbs_cm_connect(struct rdma_cm_id *id, struct rdma_conn_param *param);
int verbs_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param);
int verbs_cm_reject(struct rdma_cm_id *id, const void *data, uint8_t len);
int verbs_cm_disconnect(struct rdma_cm_id *id);
/* One event from the (non-blocking) channel; -EAGAIN when there is none. */
int verbs_cm_get_event(struct rdma_event_channel *channel, struct rdma_cm_event **ret_event);
int verbs_cm_ack_event(struct rdma_cm_event *event);
const char *verbs_cm_event_str(enum rdma_cm_event_type type);

#endif
