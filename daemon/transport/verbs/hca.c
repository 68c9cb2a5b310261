/* SPDX-License-Identifier: MIT */
/*
 * RDMA devices: the PD, CQ, completion channel, SRQ and async event fd of
 * each device the verbs transport uses, watched on the loop. Completions are
 * drained in bounded batches and the CQ is re-armed the race-free way (poll,
 * arm, poll again); the SRQ is refilled as receives are consumed. Each
 * receive owns one buffer of a registered pool, and a buffer is on the SRQ at
 * most once: it goes back only after its completion was handed out. Async
 * events are always acked (ibv_destroy_qp waits for that) and logged.
 * Never decides anything about connections or jobs: it reports to callbacks.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "hca.h"
#include "rdmax.h"

#define WC_BATCH     32 /* completions per ibv_poll_cq() call */
#define EVENT_BUDGET 32 /* channel / async events per callback */
#define RECV_CHAIN   64 /* receives per ibv_post_srq_recv() */
#define ACK_EVERY    64 /* CQ notifications acked together */
#define COMP_BUDGET  256

void hca_table_init(struct hca_table *table, uv_loop_t *loop, const struct hca_callbacks *cb)
{
	memset(table, 0, sizeof(*table));
	table->loop = loop;
	table->cb = *cb;
}

bool hca_selected(const char *devices, const char *name)
{
	/* The config parser stores the list as "a,b" without blanks. */
	return strcmp(devices, "auto") == 0 || name_in_list(devices, name);
}

struct hca *hca_find(struct hca_table *table, const struct ibv_context *ctx)
{
	for (uint32_t i = 0; i < table->n; i++) {
		if (table->hcas[i]->ctx == ctx) {
			return table->hcas[i];
		}
	}
	return NULL;
}

bool hca_usable(const struct hca *hca)
{
	if (hca->dead) {
		return false;
	}
	for (uint8_t p = 1; p <= hca->n_ports; p++) {
		if (hca->port_state[p] == IBV_PORT_ACTIVE) {
			return true;
		}
	}
	return false;
}

int hca_reserve_cqes(struct hca *hca, uint32_t n)
{
	if (hca->dead || hca->cq_reserved + n > hca->cq_size) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	hca->cq_reserved += n;
	return 0;
}

void hca_release_cqes(struct hca *hca, uint32_t n)
{
	hca->cq_reserved -= MIN(n, hca->cq_reserved);
}

static void srq_fill(struct hca *hca)
{
	struct ibv_recv_wr wrs[RECV_CHAIN];
	struct ibv_sge sges[RECV_CHAIN];

	while (!hca->dead && hca->n_recv_free > 0) {
		uint32_t n = MIN(hca->n_recv_free, (uint32_t)RECV_CHAIN);
		uint32_t *idx = &hca->recv_free[hca->n_recv_free - n];
		memset(wrs, 0, n * sizeof(wrs[0]));
		for (uint32_t i = 0; i < n; i++) {
			/*
			 * A WRITE_WITH_IMM places its payload by rkey and leaves the buffer
			 * alone; a SEND (one message frame) lands in it.
			 */
			sges[i].addr = (uintptr_t)(hca->recv_buf + (size_t)idx[i] * HCA_RECV_BYTES);
			sges[i].length = HCA_RECV_BYTES;
			sges[i].lkey = hca->recv_mr->lkey;
			wrs[i].wr_id = HCA_RECV_TAG | idx[i];
			wrs[i].sg_list = &sges[i];
			wrs[i].num_sge = 1;
			wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
		}
		int ret = verbs_post_srq_recv(hca->srq, wrs);
		if (ret < 0) {
			log_ratelimited(&hca->table->rl, LOG_ERR,
					"ibv_post_srq_recv() on '%s' failed: %s", hca->name,
					strerror(-ret));
			return;
		}
		/* The posted ones are the first ret of the chain: the top of the stack stays. */
		if ((uint32_t)ret < n) {
			memmove(idx, idx + ret, (n - (uint32_t)ret) * sizeof(*idx));
		}
		hca->n_recv_free -= (uint32_t)ret;
		hca->srq_posted += (uint32_t)ret;
		if ((uint32_t)ret < n) {
			log_ratelimited(&hca->table->rl, LOG_ERR,
					"ibv_post_srq_recv() on '%s' posted %d of %u receives",
					hca->name, ret, n);
			return;
		}
	}
}

/* A receive completed: its buffer may go back on the SRQ. */
static void recv_release(struct hca *hca, uint64_t wr_id)
{
	uint64_t i = wr_id & ~HCA_RECV_TAG;

	if (i >= hca->srq_depth || hca->n_recv_free >= hca->srq_depth) {
		return;
	}
	hca->recv_free[hca->n_recv_free++] = (uint32_t)i;
	hca->srq_posted -= MIN(1u, hca->srq_posted);
}

int hca_poll(struct hca *hca, int budget)
{
	const struct hca_callbacks *cb = &hca->table->cb;
	struct ibv_wc wc[WC_BATCH];
	int done = 0;
	bool recv = false;

	hca->backlog = false;
	while (done < budget) {
		int n = verbs_poll_cq(hca->cq, MIN(budget - done, WC_BATCH), wc);
		if (n < 0) {
			log_ratelimited(&hca->table->rl, LOG_ERR, "ibv_poll_cq() on '%s' failed",
					hca->name);
			break;
		}
		for (int i = 0; i < n; i++) {
			if (!(wc[i].wr_id & HCA_RECV_TAG)) {
				cb->send_wc(cb->ctx, hca, &wc[i]);
				continue;
			}
			uint64_t idx = wc[i].wr_id & ~HCA_RECV_TAG;
			recv = true;
			if (wc[i].status == IBV_WC_SUCCESS &&
			    wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				hca->n_imm++;
				cb->imm(cb->ctx, hca, ntohl(wc[i].imm_data));
			} else if (wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV &&
				   idx < hca->srq_depth && wc[i].byte_len <= HCA_RECV_BYTES) {
				hca->n_recv++;
				cb->recv(cb->ctx, hca, wc[i].qp_num,
					 hca->recv_buf + idx * HCA_RECV_BYTES, wc[i].byte_len);
			} else if (wc[i].status != IBV_WC_SUCCESS &&
				   wc[i].status != IBV_WC_WR_FLUSH_ERR) {
				log_ratelimited(&hca->table->rl, LOG_WARNING,
						"receive on '%s' (QP %u) failed: %s", hca->name,
						wc[i].qp_num, verbs_wc_status_str(wc[i].status));
			}
			recv_release(hca, wc[i].wr_id);
		}
		done += n;
		hca->n_wc += (uint64_t)n;
		if (n < WC_BATCH && done < budget) {
			break;
		}
	}
	hca->backlog = done >= budget;
	if (recv) {
		srq_fill(hca);
	}
	return done;
}

/* Arm, then poll again: a completion between the last poll and the arm raises no event. */
static int arm(struct hca *hca)
{
	if (hca->armed || hca->dead) {
		return 0;
	}
	int ret = verbs_req_notify_cq(hca->cq);
	if (ret < 0) {
		log_ratelimited(&hca->table->rl, LOG_ERR, "ibv_req_notify_cq() on '%s' failed: %s",
				hca->name, strerror(-ret));
		return 0;
	}
	hca->armed = true;
	return hca_poll(hca, COMP_BUDGET);
}

static void on_comp(uv_poll_t *handle, int status, int events)
{
	struct hca *hca = handle->data;
	const struct hca_callbacks *cb = &hca->table->cb;
	struct ibv_cq *cq;

	for (int i = 0; i < EVENT_BUDGET; i++) {
		if (verbs_get_cq_event(hca->channel, &cq) < 0) {
			break; /* EAGAIN: readiness can be spurious */
		}
		hca->cq_events++;
		hca->armed = false;
		if (hca->table->events) {
			(*hca->table->events)++;
		}
	}
	if (hca->cq_events >= ACK_EVERY) {
		verbs_ack_cq_events(hca->cq, hca->cq_events);
		hca->cq_events = 0;
	}
	int n = hca_poll(hca, COMP_BUDGET);
	/* While the user busy-polls, an armed CQ only costs a wake-up per completion. */
	if (!hca->table->busy && !hca->backlog) {
		n += arm(hca);
	}
	if (n > 0 || hca->backlog) {
		cb->progress(cb->ctx);
	}
}

void hca_arm(struct hca *hca)
{
	if (!hca->armed && !hca->closing) {
		arm(hca);
	}
}

static void update_port(struct hca *hca, uint8_t port)
{
	struct ibv_port_attr pa;

	if (port == 0 || port > hca->n_ports) {
		return;
	}
	if (verbs_query_port(hca->ctx, port, &pa) == 0) {
		hca->port_state[port] = pa.state;
	}
}

static void on_async(uv_poll_t *handle, int status, int events)
{
	struct hca *hca = handle->data;
	const struct hca_callbacks *cb = &hca->table->cb;
	struct ibv_async_event ev;

	for (int i = 0; i < EVENT_BUDGET; i++) {
		if (verbs_get_async_event(hca->ctx, &ev) < 0) {
			break;
		}
		enum ibv_event_type type = ev.event_type;
		uint32_t qp_num = 0;
		uint8_t port = 0;
		switch (type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_PATH_MIG_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
		case IBV_EVENT_PATH_MIG:
		case IBV_EVENT_QP_LAST_WQE_REACHED:
			qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
			break;
		case IBV_EVENT_PORT_ACTIVE:
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_LID_CHANGE:
		case IBV_EVENT_PKEY_CHANGE:
		case IBV_EVENT_SM_CHANGE:
		case IBV_EVENT_CLIENT_REREGISTER:
		case IBV_EVENT_GID_CHANGE:
			port = (uint8_t)ev.element.port_num;
			break;
		default:
			break;
		}
		/* Ack before acting: destroying the QP it names waits for this ack. */
		verbs_ack_async_event(&ev);

		switch (type) {
		case IBV_EVENT_PORT_ACTIVE:
		case IBV_EVENT_PORT_ERR:
			update_port(hca, port);
			log_notice("device '%s' port %u: %s (now %s)", hca->name, port,
				   verbs_event_type_str(type),
				   port <= hca->n_ports
					   ? verbs_port_state_str(hca->port_state[port])
					   : "?");
			break;
		case IBV_EVENT_DEVICE_FATAL:
		case IBV_EVENT_CQ_ERR:
		case IBV_EVENT_SRQ_ERR:
			hca->dead = true;
			log_err("device '%s': %s; its connections are closed and no new ones "
				"are made",
				hca->name, verbs_event_type_str(type));
			break;
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_PATH_MIG_ERR:
			log_ratelimited(&hca->table->rl, LOG_WARNING, "device '%s' QP %u: %s",
					hca->name, qp_num, verbs_event_type_str(type));
			break;
		default:
			log_debug("device '%s': async event %s (QP %u, port %u)", hca->name,
				  verbs_event_type_str(type), qp_num, port);
			break;
		}
		cb->async(cb->ctx, hca, type, qp_num);
	}
	cb->progress(cb->ctx);
}

static void hca_destroy(struct hca *hca)
{
	int ret;

	if (!hca) {
		return;
	}
	if (hca->cq) {
		verbs_ack_cq_events(hca->cq, hca->cq_events);
		hca->cq_events = 0;
	}
	/* Failures here leak device objects until exit; there is nothing else to do. */
	if ((ret = verbs_destroy_srq(hca->srq)) < 0) {
		log_warn("ibv_destroy_srq() on '%s' failed: %s", hca->name, strerror(-ret));
	}
	if ((ret = verbs_destroy_cq(hca->cq)) < 0) {
		log_warn("ibv_destroy_cq() on '%s' failed: %s", hca->name, strerror(-ret));
	}
	if ((ret = verbs_destroy_comp_channel(hca->channel)) < 0) {
		log_warn("ibv_destroy_comp_channel() on '%s' failed: %s", hca->name,
			 strerror(-ret));
	}
	if ((ret = verbs_dereg_mr(hca->recv_mr)) < 0) {
		log_warn("ibv_dereg_mr() of the receive buffers on '%s' failed: %s", hca->name,
			 strerror(-ret));
	}
	if ((ret = verbs_dealloc_pd(hca->pd)) < 0) {
		log_warn("ibv_dealloc_pd() on '%s' failed: %s", hca->name, strerror(-ret));
	}
	if (hca->recv_buf) {
		munmap(hca->recv_buf, (size_t)hca->srq_depth * HCA_RECV_BYTES);
	}
	free(hca->recv_free);
	free(hca);
}

/* One registered buffer per receive; each starts on the free stack. */
static int recv_buffers(struct hca *hca)
{
	size_t len = (size_t)hca->srq_depth * HCA_RECV_BYTES;
	void *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int ret;

	if (buf == MAP_FAILED) {
		ret = -errno;
		log_err("mmap() of %zu bytes of receive buffers for '%s' failed: %s", len,
			hca->name, strerror(-ret));
		return ret;
	}
	hca->recv_buf = buf;
	hca->recv_free = calloc(hca->srq_depth, sizeof(*hca->recv_free));
	if (!hca->recv_free) {
		return -ENOMEM;
	}
	ret = verbs_reg_mr(hca->pd, buf, len, (uintptr_t)buf, IBV_ACCESS_LOCAL_WRITE,
			   &hca->recv_mr);
	if (ret < 0) {
		log_err("ibv_reg_mr() of %zu bytes of receive buffers on '%s' failed: %s%s", len,
			hca->name, strerror(-ret),
			ret == -ENOMEM ? " (check the locked-memory limit, ulimit -l)" : "");
		return ret;
	}
	/* Popped from the top: buffer 0 goes first. */
	for (uint32_t i = 0; i < hca->srq_depth; i++) {
		hca->recv_free[i] = hca->srq_depth - 1 - i;
	}
	hca->n_recv_free = hca->srq_depth;
	return 0;
}

static int query(struct hca *hca)
{
	struct ibv_port_attr pa;
	int ret = verbs_query_device(hca->ctx, &hca->attr);

	if (ret < 0) {
		log_warn("ibv_query_device() on '%s' failed: %s", hca->name, strerror(-ret));
		return ret;
	}
	hca->n_ports = (uint8_t)MIN(hca->attr.phys_port_cnt, HCA_MAX_PORTS);
	hca->software =
		hca->attr.vendor_id == HCA_VENDOR_RXE || hca->attr.vendor_id == HCA_VENDOR_SIW;
	for (uint8_t p = 1; p <= hca->n_ports; p++) {
		ret = verbs_query_port(hca->ctx, p, &pa);
		hca->port_state[p] = ret == 0 ? pa.state : IBV_PORT_NOP;
		if (ret == 0 && pa.max_msg_sz > 0 &&
		    (hca->max_msg_sz == 0 || pa.max_msg_sz < hca->max_msg_sz)) {
			hca->max_msg_sz = pa.max_msg_sz;
		}
	}
	if (!hca_usable(hca)) {
		log_info("device '%s': no port is ACTIVE; not used", hca->name);
		return -ENODEV;
	}
	if (hca->attr.max_srq == 0 || hca->attr.max_srq_wr == 0) {
		log_info("device '%s' has no shared receive queues; not used", hca->name);
		return -ENODEV;
	}
	return 0;
}

static void on_failed_closed(uv_handle_t *handle)
{
	hca_destroy(handle->data);
}

int hca_open(struct hca_table *table, struct ibv_context *ctx, struct hca **ret_hca)
{
	struct hca *hca;
	int ret;

	if (table->n >= REGION_MAX_DEVICES) {
		log_warn("device '%s' not used: at most %d devices", verbs_device_name(ctx),
			 REGION_MAX_DEVICES);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	hca = calloc(1, sizeof(*hca));
	if (!hca) {
		return -ENOMEM;
	}
	hca->table = table;
	hca->ctx = ctx;
	hca->index = table->n;
	copy_string(hca->name, sizeof(hca->name), verbs_device_name(ctx));
	ret = query(hca);
	if (ret < 0) {
		goto out_free;
	}
	hca->cq_size = (uint32_t)MIN(hca->attr.max_cqe, HCA_CQ_MAX);
	hca->srq_depth = MIN((uint32_t)hca->attr.max_srq_wr, (uint32_t)HCA_SRQ_DEPTH);
	hca->srq_depth = MIN(hca->srq_depth, hca->cq_size / 4);
	if ((ret = verbs_alloc_pd(ctx, &hca->pd)) < 0) {
		log_err("ibv_alloc_pd() on '%s' failed: %s", hca->name, strerror(-ret));
		goto out_free;
	}
	hca->dmabuf = verbs_dmabuf_supported(hca->pd);
	if ((ret = verbs_create_comp_channel(ctx, &hca->channel)) < 0) {
		log_err("ibv_create_comp_channel() on '%s' failed: %s", hca->name, strerror(-ret));
		goto out_free;
	}
	if ((ret = verbs_create_cq(ctx, (int)hca->cq_size, hca->channel, &hca->cq)) < 0) {
		log_err("ibv_create_cq(%u) on '%s' failed: %s", hca->cq_size, hca->name,
			strerror(-ret));
		goto out_free;
	}
	if ((ret = verbs_create_srq(hca->pd, hca->srq_depth, &hca->srq)) < 0) {
		log_err("ibv_create_srq(%u) on '%s' failed: %s", hca->srq_depth, hca->name,
			strerror(-ret));
		goto out_free;
	}
	/* Every receive can complete once: the CQ must hold them all. */
	hca->cq_reserved = hca->srq_depth;
	if ((ret = recv_buffers(hca)) < 0) {
		goto out_free;
	}
	if ((ret = verbs_set_nonblock(hca->channel->fd)) < 0 ||
	    (ret = verbs_set_nonblock(ctx->async_fd)) < 0) {
		log_err("fcntl(O_NONBLOCK) on a '%s' fd failed: %s", hca->name, strerror(-ret));
		goto out_free;
	}
	srq_fill(hca);
	if (hca->srq_posted < hca->srq_depth) {
		ret = -ENOMEM;
		goto out_free;
	}
	if ((ret = verbs_req_notify_cq(hca->cq)) < 0) {
		log_err("ibv_req_notify_cq() on '%s' failed: %s", hca->name, strerror(-ret));
		goto out_free;
	}
	hca->armed = true;
	ret = uv_poll_init(table->loop, &hca->comp_poll, hca->channel->fd);
	if (ret < 0) {
		log_err("uv_poll_init() on the completion channel of '%s' failed: %s", hca->name,
			uv_strerror(ret));
		goto out_free;
	}
	hca->comp_poll.data = hca;
	ret = uv_poll_init(table->loop, &hca->async_poll, ctx->async_fd);
	if (ret < 0) {
		log_err("uv_poll_init() on the async fd of '%s' failed: %s", hca->name,
			uv_strerror(ret));
		/* The first handle exists now: the device goes once the loop closed it. */
		uv_close((uv_handle_t *)&hca->comp_poll, on_failed_closed);
		return ret;
	}
	hca->async_poll.data = hca;
	uv_poll_start(&hca->comp_poll, UV_READABLE, on_comp);
	uv_poll_start(&hca->async_poll, UV_READABLE, on_async);
	hca->open_handles = 2;
	table->handles += 2;
	table->hcas[table->n++] = hca;
	log_info("device '%s': CQ %u entries, SRQ %u receives of %u bytes, max_qp_rd_atom %d, "
		 "max_mr_size %#llx",
		 hca->name, hca->cq_size, hca->srq_depth, HCA_RECV_BYTES, hca->attr.max_qp_rd_atom,
		 (unsigned long long)hca->attr.max_mr_size);
	*ret_hca = hca;
	return 0;

out_free:
	hca_destroy(hca);
	return ret;
}

static void on_handle_closed(uv_handle_t *handle)
{
	struct hca *hca = handle->data;

	hca->open_handles--;
	hca->table->handles--;
}

void hca_table_close(struct hca_table *table)
{
	for (uint32_t i = 0; i < table->n; i++) {
		struct hca *hca = table->hcas[i];
		if (!hca->closing) {
			hca->closing = true;
			uv_close((uv_handle_t *)&hca->comp_poll, on_handle_closed);
			uv_close((uv_handle_t *)&hca->async_poll, on_handle_closed);
		}
	}
}

void hca_table_free(struct hca_table *table)
{
	for (uint32_t i = 0; i < table->n; i++) {
		struct hca *hca = table->hcas[i];
		if (hca->open_handles > 0) {
			log_err("device '%s' freed with loop handles open; leaking it", hca->name);
			continue;
		}
		hca_destroy(hca);
	}
	table->n = 0;
}
