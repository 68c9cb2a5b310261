/* SPDX-License-Identifier: MIT */
/*
 * Thin wrappers over libibverbs and librdmacm. This file owns the conversion
 * of rdma-core's error conventions to 0 / -errno and nothing else: no policy,
 * no logging, no state. It must never return -1 or a positive errno, and it
 * must never let a NULL from rdma-core escape as success.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "verbs.h"

/* errno after a failed call, never 0: some paths fail without setting it. */
static int neg_errno(void)
{
	return errno > 0 ? -errno : -EIO;
}

/* A positive errno (ibv_post_send, ibv_modify_qp...) as -errno. */
static int neg_pos(int ret)
{
	if (ret == 0) {
		return 0;
	}
	return ret > 0 ? -ret : (errno > 0 ? -errno : -EIO);
}

/* librdmacm: -1 and errno. */
static int neg_cm(int ret)
{
	return ret == 0 ? 0 : neg_errno();
}

int verbs_get_devices(struct ibv_context ***ret_list)
{
	int n = 0;

	errno = 0;
	struct ibv_context **list = rdma_get_devices(&n);
	if (!list) {
		return errno == ENODEV || errno == 0 ? 0 : neg_errno();
	}
	*ret_list = list;
	return n;
}

void verbs_free_devices(struct ibv_context **list)
{
	if (list) {
		rdma_free_devices(list);
	}
}

const char *verbs_device_name(const struct ibv_context *ctx)
{
	const char *name = ctx && ctx->device ? ibv_get_device_name(ctx->device) : NULL;

	return name ? name : "?";
}

int verbs_query_device(struct ibv_context *ctx, struct ibv_device_attr *ret_attr)
{
	struct ibv_device_attr attr;

	int ret = neg_pos(ibv_query_device(ctx, &attr));
	if (ret == 0) {
		*ret_attr = attr;
	}
	return ret;
}

int verbs_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *ret_attr)
{
	struct ibv_port_attr attr;

	int ret = neg_pos(ibv_query_port(ctx, port, &attr));
	if (ret == 0) {
		*ret_attr = attr;
	}
	return ret;
}

const char *verbs_port_state_str(enum ibv_port_state state)
{
	return ibv_port_state_str(state);
}

int verbs_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max)
{
	ssize_t n = ibv_query_gid_table(ctx, entries, max, 0);

	if (n < 0) {
		return n < -1 ? (int)n : neg_errno();
	}
	return (int)n;
}

bool verbs_dmabuf_supported(struct ibv_pd *pd)
{
	/* fd -1 fails with EBADF where the call exists, EOPNOTSUPP where it does not. */
	errno = 0;
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
	if (mr) {
		ibv_dereg_mr(mr);
		return true;
	}
	return errno == EBADF;
}

int verbs_alloc_pd(struct ibv_context *ctx, struct ibv_pd **ret_pd)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);

	if (!pd) {
		return neg_errno();
	}
	*ret_pd = pd;
	return 0;
}

int verbs_dealloc_pd(struct ibv_pd *pd)
{
	return pd ? neg_pos(ibv_dealloc_pd(pd)) : 0;
}

int verbs_create_comp_channel(struct ibv_context *ctx, struct ibv_comp_channel **ret_channel)
{
	struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);

	if (!channel) {
		return neg_errno();
	}
	*ret_channel = channel;
	return 0;
}

int verbs_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	return channel ? neg_pos(ibv_destroy_comp_channel(channel)) : 0;
}

int verbs_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *channel,
		    struct ibv_cq **ret_cq)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, cqe, NULL, channel, 0);

	if (!cq) {
		return neg_errno();
	}
	*ret_cq = cq;
	return 0;
}

int verbs_destroy_cq(struct ibv_cq *cq)
{
	return cq ? neg_pos(ibv_destroy_cq(cq)) : 0;
}

int verbs_req_notify_cq(struct ibv_cq *cq)
{
	return neg_pos(ibv_req_notify_cq(cq, 0));
}

int verbs_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **ret_cq)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	if (ibv_get_cq_event(channel, &cq, &cq_ctx) != 0) {
		return neg_errno();
	}
	*ret_cq = cq;
	return 0;
}

void verbs_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	if (cq && n > 0) {
		ibv_ack_cq_events(cq, n);
	}
}

int verbs_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int got = ibv_poll_cq(cq, n, wc);

	/* ibv_poll_cq returns a negative value without a reliable errno. */
	return got >= 0 ? got : -EIO;
}

const char *verbs_wc_status_str(enum ibv_wc_status status)
{
	return ibv_wc_status_str(status);
}

int verbs_create_srq(struct ibv_pd *pd, uint32_t max_wr, struct ibv_srq **ret_srq)
{
	struct ibv_srq_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.attr.max_wr = max_wr;
	attr.attr.max_sge = 1;
	struct ibv_srq *srq = ibv_create_srq(pd, &attr);
	if (!srq) {
		return neg_errno();
	}
	*ret_srq = srq;
	return 0;
}

int verbs_destroy_srq(struct ibv_srq *srq)
{
	return srq ? neg_pos(ibv_destroy_srq(srq)) : 0;
}

int verbs_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr)
{
	struct ibv_recv_wr *bad = NULL;
	int n = 0;
	int ret = ibv_post_srq_recv(srq, wr, &bad);

	if (ret != 0 && !bad) {
		return neg_pos(ret); /* cannot tell which were posted: assume none */
	}
	for (struct ibv_recv_wr *w = wr; w && (ret == 0 || w != bad); w = w->next) {
		n++;
	}
	return ret != 0 && n == 0 ? neg_pos(ret) : n;
}

int verbs_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access,
		 struct ibv_mr **ret_mr)
{
	struct ibv_mr *mr = ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);

	if (!mr) {
		return neg_errno();
	}
	*ret_mr = mr;
	return 0;
}

int verbs_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
			int access, struct ibv_mr **ret_mr)
{
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access);

	if (!mr) {
		return neg_errno();
	}
	*ret_mr = mr;
	return 0;
}

int verbs_dereg_mr(struct ibv_mr *mr)
{
	return mr ? neg_pos(ibv_dereg_mr(mr)) : 0;
}

int verbs_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;

	return neg_pos(ibv_post_send(qp, wr, &bad));
}

int verbs_qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_ERR;
	return neg_pos(ibv_modify_qp(qp, &attr, IBV_QP_STATE));
}

int verbs_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ret_event)
{
	struct ibv_async_event event;

	if (ibv_get_async_event(ctx, &event) != 0) {
		return neg_errno();
	}
	*ret_event = event;
	return 0;
}

void verbs_ack_async_event(struct ibv_async_event *event)
{
	ibv_ack_async_event(event);
}

const char *verbs_event_type_str(enum ibv_event_type type)
{
	return ibv_event_type_str(type);
}

int verbs_set_nonblock(int fd)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		return neg_errno();
	}
	return 0;
}

int verbs_cm_create_channel(struct rdma_event_channel **ret_channel)
{
	struct rdma_event_channel *channel = rdma_create_event_channel();

	if (!channel) {
		return neg_errno();
	}
	*ret_channel = channel;
	return 0;
}

void verbs_cm_destroy_channel(struct rdma_event_channel *channel)
{
	if (channel) {
		rdma_destroy_event_channel(channel);
	}
}

int verbs_cm_create_id(struct rdma_event_channel *channel, void *context,
		       struct rdma_cm_id **ret_id)
{
	struct rdma_cm_id *id = NULL;

	int ret = neg_cm(rdma_create_id(channel, &id, context, RDMA_PS_TCP));
	if (ret == 0) {
		*ret_id = id;
	}
	return ret;
}

int verbs_cm_destroy_id(struct rdma_cm_id *id)
{
	return id ? neg_cm(rdma_destroy_id(id)) : 0;
}

int verbs_cm_bind_addr(struct rdma_cm_id *id, const struct sockaddr *addr)
{
	return neg_cm(rdma_bind_addr(id, (struct sockaddr *)addr));
}

int verbs_cm_listen(struct rdma_cm_id *id, int backlog)
{
	return neg_cm(rdma_listen(id, backlog));
}

uint16_t verbs_cm_src_port(struct rdma_cm_id *id)
{
	return ntohs(rdma_get_src_port(id));
}

int verbs_cm_set_ack_timeout(struct rdma_cm_id *id, uint8_t timeout)
{
	return neg_cm(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout,
				      sizeof(timeout)));
}

int verbs_cm_resolve_addr(struct rdma_cm_id *id, const struct sockaddr *src,
			  const struct sockaddr *dst, int timeout_ms)
{
	return neg_cm(
		rdma_resolve_addr(id, (struct sockaddr *)src, (struct sockaddr *)dst, timeout_ms));
}

int verbs_cm_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	return neg_cm(rdma_resolve_route(id, timeout_ms));
}

int verbs_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return neg_cm(rdma_create_qp(id, pd, attr));
}

void verbs_cm_destroy_qp(struct rdma_cm_id *id)
{
	if (id && id->qp) {
		rdma_destroy_qp(id);
	}
}

int verbs_cm_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	return neg_cm(rdma_connect(id, param));
}

int verbs_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	return neg_cm(rdma_accept(id, param));
}

int verbs_cm_reject(struct rdma_cm_id *id, const void *data, uint8_t len)
{
	return neg_cm(rdma_reject(id, data, len));
}

int verbs_cm_disconnect(struct rdma_cm_id *id)
{
	return neg_cm(rdma_disconnect(id));
}

int verbs_cm_get_event(struct rdma_event_channel *channel, struct rdma_cm_event **ret_event)
{
	struct rdma_cm_event *event = NULL;

	int ret = neg_cm(rdma_get_cm_event(channel, &event));
	if (ret == 0) {
		*ret_event = event;
	}
	return ret;
}

int verbs_cm_ack_event(struct rdma_cm_event *event)
{
	return neg_cm(rdma_ack_cm_event(event));
}

const char *verbs_cm_event_str(enum rdma_cm_event_type type)
{
	return rdma_event_str(type);
}
