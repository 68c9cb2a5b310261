/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport: one-sided RDMA (WRITE, READ, WRITE_WITH_IMM) over RC
 * queue pairs that librdmacm connects. It owns the rdma_cm event channel and
 * the listeners (one per device IP), the accepting side of connections
 * (private data checked before any QP exists), the memory registration of
 * regions on every device, and the glue that runs the conn state machine
 * with real rdma_cm and verbs calls. Payload bytes never pass through the
 * daemon: the NICs move them between registered regions. The one exception
 * is SEND messages (at most 64 KiB): their frames are copied into a
 * registered staging pool, sent two-sided on the same QPs, reassembled at the
 * owner of the mailbox and answered there with the mailbox's status.
 *
 * It never calls rdma-core except through verbs.h, never blocks the loop
 * (every fd is non-blocking and drained in bounded batches) and never calls
 * an xfer's done from inside submit.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include <sys/mman.h>

#include "auth.h"
#include "conn.h"
#include "gpu.h"
#include "hca.h"
#include "imm.h"
#include "log.h"
#include "mailbox.h"
#include "names.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "region.h"
#include "transport.h"
#include "verbs.h"

#define CM_BUDGET      64  /* rdma_cm events per readiness callback */
#define POLL_BUDGET    128 /* CQEs per device per loop turn */
#define SQ_DEPTH       128 /* send queue of an outgoing QP */
#define POST_BATCH     16  /* WRs per doorbell */
#define ACK_TIMEOUT    16  /* 4.096 us * 2^16 = 268 ms per retransmission */
#define RETRY_COUNT    7
#define RNR_RETRY      7 /* 7: retry for ever; the peer watchdog bounds it */
#define LISTEN_BACKLOG 128
#define MAX_WR_BYTES   (1ull << 30)
#define DRAIN_MIN_MS   2000
/* The region key picks the high bits of a region's iova (see region_iova()). */
#define IOVA_KEY_SHIFT 41
#define MSG_SLOTS      16   /* messages staged at once; more wait for a slot */
#define PASSIVE_SQ     16   /* answers in flight on one accepted QP */
#define ANSWER_SLOT    2048 /* staging of one answer (a lookup's carries a descriptor) */
#define ANSWERS_MAX    1024 /* answers one accepted QP may have waiting for its send queue */

_Static_assert(CONN_FRAME_MAX <= HCA_RECV_BYTES, "a frame must fit one receive buffer");
_Static_assert(CONN_ANSWER_DATA_FRAME_MAX <= ANSWER_SLOT, "an answer must fit its staging slot");
_Static_assert(CONN_MSG_FRAMES_MAX + 1 < SQ_DEPTH, "a message must fit a send queue");

/* What an rdma_cm id's context points to. */
enum obj_kind {
	OBJ_LISTENER, /* a listening id of one device */
	OBJ_LINK,     /* one link of an outgoing connection */
	OBJ_PASSIVE,  /* an accepted QP */
	OBJ_PROBE,    /* a connect request without a QP, asking an owner for its verdict */
	OBJ_KIND_MAX, /* terminator */
};

struct verbs_transport;

struct cm_obj {
	enum obj_kind kind;
};

struct listener {
	struct cm_obj obj;
	struct rdma_cm_id *id;
	struct hca *hca;
	char addr[INET6_ADDRSTRLEN];
	uint16_t port;
	uint8_t addr_bytes[16];
	struct sockaddr_storage ss;
	uint32_t prefix_len; /* of the interface address; 0 when not known */
};

struct link_ctx {
	struct cm_obj obj;
	struct verbs_transport *vt;
	struct conn_link *link;
	struct rdma_cm_id *id;
	struct hca *hca;
	uint32_t cqes; /* CQEs reserved on hca */
	uint32_t qp_num;
	bool indexed; /* in vt->qps */
};

struct probe_ctx {
	struct cm_obj obj;
	struct verbs_transport *vt;
	struct conn_probe *probe;
	struct rdma_cm_id *id;
};

/* An answer waiting for the send queue of its accepted QP. */
struct answer {
	struct list_node link;
	uint64_t id;
	int status;
	uint32_t len;                           /* bytes of data */
	uint8_t data[CONN_ANSWER_DATA_MAX + 1]; /* text (a NUL after it), or a descriptor */
};

/* State of an accepted QP. */
enum passive_state {
	PASSIVE_ACCEPTING, /* rdma_accept() sent, waiting for ESTABLISHED */
	PASSIVE_UP,        /* established: the peer may address our regions */
	PASSIVE_STATE_MAX, /* terminator */
};

struct passive {
	struct cm_obj obj;
	struct verbs_transport *vt;
	struct list_node link; /* in vt->passives */
	struct rdma_cm_id *id;
	struct hca *hca;
	enum passive_state state;
	uint64_t instance;
	uint32_t group;
	uint32_t cqes;
	uint32_t qp_num;
	bool indexed;
	char name[64];
	struct conn_msg_rx rx; /* the message arriving on this QP */
	uint8_t *ans_buf;      /* PASSIVE_SQ answer slots, registered on hca */
	struct ibv_mr *ans_mr;
	uint64_t ans_posted;        /* answers posted (each one's wr_id) */
	uint64_t ans_done;          /* answers completed: every one is signaled */
	struct list_node ans_queue; /* struct answer waiting for room in the send queue */
	uint32_t n_queued;
};

/* One staged SEND message: its frames, and the engine's xfer it carries. */
struct msg_slot {
	struct conn_msg msg;
	struct verbs_transport *vt;
	struct xfer *user; /* NULL while the slot is free */
	uint8_t *staging;  /* CONN_MSG_STAGING bytes of the pool */
};

struct conn_priv {
	uv_timer_t timer;
	struct verbs_transport *vt;
	struct conn *conn;
};

struct verbs_transport {
	struct transport base;
	struct rdmaxd *daemon;
	struct ibv_context **devices;
	struct hca_table hcas;
	struct listener *listeners[REGION_MAX_DEVICES]; /* by device index */
	struct rdma_event_channel *cm;
	uv_poll_t cm_poll;
	uv_check_t check;
	uv_idle_t kick;
	uv_timer_t tick;
	uint64_t busy_until_ns; /* end of the busy-poll window (now_ns()) */
	uint32_t handles;       /* our own loop handles not yet closed (conn timers included) */
	bool handles_open;
	struct conn_table conns;
	bool conns_ready;
	struct hmap qps; /* qp_num + 1 -> struct cm_obj */
	struct list_node passives;
	uint32_t sq_depth;
	bool bind_src;
	struct sockaddr_storage src;
	bool shut;
	struct log_ratelimit rl;
	struct ibv_send_wr wrs[SQ_DEPTH];
	struct ibv_sge sges[SQ_DEPTH];
	/* SEND messages: staging registered (local access only) on every device. */
	uint8_t *pool;
	struct ibv_mr *pool_mr[REGION_MAX_DEVICES];
	struct msg_slot slots[MSG_SLOTS];
	uint32_t free_slots[MSG_SLOTS];
	uint32_t n_free_slots;
	struct list_node msg_wait; /* engine xfers waiting for a slot (xfer->link) */
	uint64_t next_msg_id;
	char from[CONN_FROM_MAX + 1]; /* this node's name as frames carry it */
};

static void progress(struct verbs_transport *vt);

/* ------------------------------------------------------------ helpers */

static bool is_wildcard(const char *addr)
{
	struct in6_addr a6;
	struct in_addr a4;

	if (inet_pton(AF_INET, addr, &a4) == 1) {
		return a4.s_addr == 0;
	}
	return inet_pton(AF_INET6, addr, &a6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&a6);
}

static int parse_sockaddr(const char *addr, uint16_t port, struct sockaddr_storage *ret_ss)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, addr, &sin->sin_addr) == 1) {
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
	} else if (inet_pton(AF_INET6, addr, &sin6->sin6_addr) == 1) {
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(port);
	} else {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	*ret_ss = ss;
	return 0;
}

static void format_sockaddr(const struct sockaddr *sa, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
		snprintf(buf, size, "[%s]:%u", host, ntohs(sin6->sin6_port));
	} else if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
		snprintf(buf, size, "%s:%u", host, ntohs(sin->sin_port));
	} else {
		snprintf(buf, size, "?");
	}
}

/* True when a and b (same family) agree on their first prefix_len bits. */
static bool same_subnet(const struct sockaddr_storage *a, const struct sockaddr_storage *b,
			uint32_t prefix_len)
{
	const uint8_t *x, *y;
	uint32_t bits;

	if (a->ss_family != b->ss_family || prefix_len == 0) {
		return false;
	}
	if (a->ss_family == AF_INET) {
		x = (const uint8_t *)&((const struct sockaddr_in *)a)->sin_addr;
		y = (const uint8_t *)&((const struct sockaddr_in *)b)->sin_addr;
		bits = MIN(prefix_len, 32u);
	} else {
		x = (const uint8_t *)&((const struct sockaddr_in6 *)a)->sin6_addr;
		y = (const uint8_t *)&((const struct sockaddr_in6 *)b)->sin6_addr;
		bits = MIN(prefix_len, 128u);
	}
	for (uint32_t i = 0; i < bits / 8; i++) {
		if (x[i] != y[i]) {
			return false;
		}
	}
	uint8_t mask = (uint8_t)(0xff00u >> (bits % 8));
	return (bits % 8) == 0 || ((x[bits / 8] ^ y[bits / 8]) & mask) == 0;
}

/*
 * The local device (its listener) that carries traffic to dst: the one whose
 * interface subnet holds dst, so that with several devices each peer device
 * is reached through its own device pair (rail); the only one when there is
 * one. NULL: let routing choose (the source stays unbound).
 */
static const struct listener *source_for(const struct verbs_transport *vt,
					 const struct sockaddr_storage *dst)
{
	const struct listener *only = NULL;
	uint32_t n = 0;

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		const struct listener *l = vt->listeners[vt->hcas.hcas[i]->index];
		if (!l) {
			continue;
		}
		if (same_subnet(&l->ss, dst, l->prefix_len)) {
			return l;
		}
		only = l;
		n++;
	}
	return n == 1 ? only : NULL;
}

/*
 * The source address for rdma_resolve_addr() towards dst, in *buf: the device
 * chosen by source_for() (port 0), else the configured listen address. Two
 * nodes on one host must not loop inside a device.
 */
static struct sockaddr *source_addr(const struct verbs_transport *vt,
				    const struct sockaddr_storage *dst,
				    struct sockaddr_storage *buf)
{
	const struct listener *l = source_for(vt, dst);

	if (l) {
		*buf = l->ss;
		if (buf->ss_family == AF_INET) {
			((struct sockaddr_in *)buf)->sin_port = 0;
		} else {
			((struct sockaddr_in6 *)buf)->sin6_port = 0;
		}
		return (struct sockaddr *)buf;
	}
	return vt->bind_src ? (struct sockaddr *)&vt->src : NULL;
}

/*
 * The address peers use for a region: its mapping's low bits (so the page
 * offset is that of the memory) under high bits taken from the region's
 * random key. A descriptor whose key was changed no longer agrees with its
 * iova, and one that was changed consistently points where no MR is.
 */
static uint64_t region_iova(const struct region *region)
{
	const uint64_t low = (UINT64_C(1) << IOVA_KEY_SHIFT) - 1;

	/* Memory without a host mapping (GPU) gives the address of its page offset. */
	uint64_t addr = region->addr ? (uint64_t)(uintptr_t)region->addr : region->gpu_addr;

	return ((region->key >> (64 - (63 - IOVA_KEY_SHIFT))) << IOVA_KEY_SHIFT) | (addr & low);
}

static bool iova_matches_key(uint64_t iova, uint64_t key)
{
	return iova >> IOVA_KEY_SHIFT == key >> (64 - (63 - IOVA_KEY_SHIFT));
}

static void index_qp(struct verbs_transport *vt, uint32_t qp_num, struct cm_obj *obj, bool *indexed)
{
	*indexed = hmap_put(&vt->qps, (uint64_t)qp_num + 1, obj) == 0;
}

static void unindex_qp(struct verbs_transport *vt, uint32_t qp_num, bool *indexed)
{
	if (*indexed) {
		hmap_del(&vt->qps, (uint64_t)qp_num + 1);
		*indexed = false;
	}
}

/* ------------------------------------------------------- regions (MRs) */

static int region_added(void *ctx, struct region *region)
{
	struct verbs_transport *vt = ctx;
	int access = IBV_ACCESS_RELAXED_ORDERING; /* masked by devices without it */
	int ret = 0;
	uint32_t i;

	if (!region->addr && !region->gpu) {
		log_warn("region %" PRIu64 ": memory without a host mapping or GPU handle cannot "
			 "be registered with RDMA devices",
			 region->id);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/* Least privilege: each right only when the region needs it. */
	if (region->writable) {
		access |= IBV_ACCESS_LOCAL_WRITE;
	}
	if (region->access & RDMAX_ACCESS_REMOTE_READ) {
		access |= IBV_ACCESS_REMOTE_READ;
	}
	if (region->access & RDMAX_ACCESS_REMOTE_WRITE) {
		access |= IBV_ACCESS_REMOTE_WRITE;
	}
	uint64_t iova = region_iova(region);
	for (i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		struct ibv_mr *mr;
		if (region->gpu) {
			/* GPU memory and pool slices: gpu.c plans it, gpu_verbs.c logs failures. */
			ret = gpu_verbs_reg_mr(region, hca, iova, access, &mr);
			if (ret < 0) {
				goto out_dereg;
			}
			region->transport_data[hca->index] = mr;
			continue;
		}
		if (region->length > hca->attr.max_mr_size) {
			log_warn("region %" PRIu64 " of %" PRIu64 " bytes is larger than the "
				 "max_mr_size (%" PRIu64 " bytes) of device '%s'",
				 region->id, region->length, (uint64_t)hca->attr.max_mr_size,
				 hca->name);
			ret = RDMAX_E_RESOURCE_EXHAUSTED;
			goto out_dereg;
		}
		ret = verbs_reg_mr(hca->pd, region->addr, region->length, iova, access, &mr);
		if (ret < 0) {
			log_warn("ibv_reg_mr() of region %" PRIu64 " (%" PRIu64
				 " bytes) on '%s' failed: %s%s",
				 region->id, region->length, hca->name, strerror(-ret),
				 ret == -ENOMEM ? " (check the locked-memory limit, ulimit -l)"
						: "");
			goto out_dereg;
		}
		region->transport_data[hca->index] = mr;
	}
	return 0;

out_dereg:
	while (i-- > 0) {
		struct hca *hca = vt->hcas.hcas[i];
		if (region->gpu) {
			gpu_verbs_dereg_mr(region, hca, region->transport_data[hca->index]);
		} else {
			verbs_dereg_mr(region->transport_data[hca->index]);
		}
		region->transport_data[hca->index] = NULL;
	}
	return ret;
}

static void region_removed(void *ctx, struct region *region)
{
	struct verbs_transport *vt = ctx;

	if (!vt) {
		return;
	}
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		struct ibv_mr *mr = region->transport_data[hca->index];
		if (!mr) {
			continue;
		}
		if (region->gpu) {
			/* A pool slice's MR is its pool's: gpu_verbs.c leaves it alone. */
			gpu_verbs_dereg_mr(region, hca, mr);
			region->transport_data[hca->index] = NULL;
			continue;
		}
		int ret = verbs_dereg_mr(mr);
		if (ret < 0) {
			log_warn("ibv_dereg_mr() of region %" PRIu64 " on '%s' failed: %s",
				 region->id, hca->name, strerror(-ret));
		}
		region->transport_data[hca->index] = NULL;
	}
}

/* ------------------------------------------------------- conn_ops */

static int link_start(void *ctx, struct conn_link *link, char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct conn *conn = link->conn;
	struct sockaddr_storage dst;
	struct link_ctx *lc;
	int ret;

	ret = parse_sockaddr(conn->peer.addr, conn->peer.port, &dst);
	if (ret < 0) {
		snprintf(why, why_size, "'%s' is not a numeric address", conn->peer.addr);
		return ret;
	}
	lc = calloc(1, sizeof(*lc));
	if (!lc) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	lc->obj.kind = OBJ_LINK;
	lc->vt = vt;
	lc->link = link;
	ret = verbs_cm_create_id(vt->cm, lc, &lc->id);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_create_id() failed: %s", strerror(-ret));
		free(lc);
		return ret;
	}
	if (verbs_cm_set_ack_timeout(lc->id, ACK_TIMEOUT) < 0) {
		log_debug("rdma_set_option(ACK_TIMEOUT) failed; using the default timeout");
	}
	struct sockaddr_storage src;
	ret = verbs_cm_resolve_addr(lc->id, source_addr(vt, &dst, &src), (struct sockaddr *)&dst,
				    (int)vt->daemon->cfg.connect_timeout_ms);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_resolve_addr() to %s failed: %s", conn->name,
			 strerror(-ret));
		verbs_cm_destroy_id(lc->id);
		free(lc);
		return ret;
	}
	link->priv = lc;
	return 0;
}

static int link_resolve_route(void *ctx, struct conn_link *link, char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct link_ctx *lc = link->priv;

	lc->hca = hca_find(&vt->hcas, lc->id->verbs);
	if (!lc->hca) {
		snprintf(why, why_size,
			 "the route to %s uses device '%s', which this daemon "
			 "does not use",
			 link->conn->name, verbs_device_name(lc->id->verbs));
		return -ENODEV;
	}
	if (!hca_usable(lc->hca)) {
		snprintf(why, why_size, "device '%s' is not usable", lc->hca->name);
		return -ENODEV;
	}
	int ret = verbs_cm_resolve_route(lc->id, (int)vt->daemon->cfg.connect_timeout_ms);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_resolve_route() to %s failed: %s", link->conn->name,
			 strerror(-ret));
	}
	return ret;
}

static uint8_t rd_atom(int v)
{
	return (uint8_t)MAX(MIN(v, 255), 0);
}

static int link_connect(void *ctx, struct conn_link *link, const uint8_t *pd, size_t pd_len,
			char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	const struct config *cfg = &vt->daemon->cfg;
	struct link_ctx *lc = link->priv;
	struct hca *hca = lc->hca;
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param param;
	int ret;

	ret = hca_reserve_cqes(hca, vt->sq_depth);
	if (ret < 0) {
		snprintf(why, why_size, "the completion queue of '%s' has no room for another QP",
			 hca->name);
		return ret;
	}
	lc->cqes = vt->sq_depth;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = hca->cq;
	attr.recv_cq = hca->cq;
	attr.srq = hca->srq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = vt->sq_depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_inline_data = cfg->inline_threshold;
	ret = verbs_cm_create_qp(lc->id, hca->pd, &attr);
	if (ret < 0 && cfg->inline_threshold > 0) {
		/* The device may support less inline data than configured: go without. */
		attr.cap.max_inline_data = 0;
		ret = verbs_cm_create_qp(lc->id, hca->pd, &attr);
	}
	if (ret < 0) {
		snprintf(why, why_size, "rdma_create_qp() on '%s' failed: %s", hca->name,
			 strerror(-ret));
		return ret;
	}
	lc->qp_num = lc->id->qp->qp_num;
	index_qp(vt, lc->qp_num, &lc->obj, &lc->indexed);
	sq_plan_fini(&link->sq);
	ret = sq_plan_init(&link->sq, vt->sq_depth, cfg->signal_interval,
			   MIN(cfg->inline_threshold, attr.cap.max_inline_data),
			   vt->conns.policy.max_wr_bytes);
	if (ret < 0) {
		snprintf(why, why_size, "out of memory");
		return ret;
	}
	memset(&param, 0, sizeof(param));
	param.private_data = pd;
	param.private_data_len = (uint8_t)pd_len;
	param.responder_resources = rd_atom(hca->attr.max_qp_rd_atom);
	param.initiator_depth = rd_atom(hca->attr.max_qp_init_rd_atom);
	param.retry_count = RETRY_COUNT;
	param.rnr_retry_count = RNR_RETRY;
	param.flow_control = 1;
	ret = verbs_cm_connect(lc->id, &param);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_connect() to %s failed: %s", link->conn->name,
			 strerror(-ret));
	}
	return ret;
}

static void link_disconnect(void *ctx, struct conn_link *link)
{
	struct link_ctx *lc = link->priv;

	if (!lc || !lc->id) {
		return;
	}
	/* rdma_disconnect() moves the QP to error; if it cannot, do that much at least. */
	if (verbs_cm_disconnect(lc->id) < 0 && lc->id->qp) {
		verbs_qp_to_error(lc->id->qp);
	}
}

static int link_post(void *ctx, struct conn_link *link, const struct wr_desc *wrs, size_t n,
		     char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct link_ctx *lc = link->priv;
	struct hca *hca = lc->hca;

	if (!lc->id || !lc->id->qp || n > SQ_DEPTH) {
		snprintf(why, why_size, "no queue pair");
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		const struct wr_desc *d = &wrs[i];
		struct ibv_send_wr *w = &vt->wrs[i];
		struct ibv_sge *sge = &vt->sges[i];

		memset(w, 0, sizeof(*w));
		w->wr_id = d->seq;
		w->send_flags = d->signaled ? IBV_SEND_SIGNALED : 0;
		w->next = i + 1 < n ? &vt->wrs[i + 1] : NULL;
		if (d->kind == WR_MARKER) {
			w->opcode = IBV_WR_RDMA_WRITE;
			continue;
		}
		struct xfer *x = d->xfer;
		if (d->kind == WR_SEND) {
			/* A message frame, from the staging pool (host memory). */
			sge->addr = (uintptr_t)(x->payload + d->offset);
			sge->length = (uint32_t)d->length;
			sge->lkey = vt->pool_mr[hca->index]->lkey;
			w->sg_list = sge;
			w->num_sge = 1;
			w->opcode = IBV_WR_SEND;
			if (d->inline_data) {
				w->send_flags |= IBV_SEND_INLINE;
			}
			continue;
		}
		/* Inline data is copied by the CPU: GPU memory (no mapping) goes by DMA. */
		bool inline_data = d->inline_data && x->local && x->local->addr;
		if (d->length > 0) {
			struct ibv_mr *mr = x->local->transport_data[hca->index];
			if (!mr) {
				snprintf(why, why_size, "region %" PRIu64 " has no MR on '%s'",
					 x->local->id, hca->name);
				return -EINVAL;
			}
			/*
			 * The device addresses the MR by its iova; inline data is copied
			 * by the CPU at post time, from the mapping.
			 */
			if (inline_data) {
				sge->addr =
					(uintptr_t)(x->local->addr + x->local_offset + d->offset);
			} else {
				sge->addr = region_iova(x->local) + x->local_offset + d->offset;
			}
			sge->length = (uint32_t)d->length;
			sge->lkey = mr->lkey;
			w->sg_list = sge;
			w->num_sge = 1;
		}
		w->wr.rdma.remote_addr = x->peer.iova + x->remote_offset + d->offset;
		w->wr.rdma.rkey = x->peer.rkey;
		switch (d->kind) {
		case WR_READ:
			w->opcode = IBV_WR_RDMA_READ;
			break;
		case WR_WRITE_IMM:
			w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			w->imm_data = htonl(x->imm);
			break;
		default:
			w->opcode = IBV_WR_RDMA_WRITE;
			break;
		}
		if (inline_data) {
			w->send_flags |= IBV_SEND_INLINE;
		}
	}
	int ret = verbs_post_send(lc->id->qp, vt->wrs);
	if (ret < 0) {
		snprintf(why, why_size, "ibv_post_send() on '%s' failed: %s", hca->name,
			 strerror(-ret));
	}
	return ret;
}

static void link_destroy(void *ctx, struct conn_link *link)
{
	struct verbs_transport *vt = ctx;
	struct link_ctx *lc = link->priv;

	if (!lc) {
		return;
	}
	if (lc->id) {
		if (lc->id->qp) {
			unindex_qp(vt, lc->qp_num, &lc->indexed);
			verbs_cm_destroy_qp(lc->id);
		}
		/* Every event of the id was acked when it was read: this cannot block. */
		int ret = verbs_cm_destroy_id(lc->id);
		if (ret < 0) {
			log_warn("rdma_destroy_id() failed: %s", strerror(-ret));
		}
	}
	if (lc->hca && lc->cqes) {
		hca_release_cqes(lc->hca, lc->cqes);
	}
	free(lc);
	link->priv = NULL;
}

static void on_conn_timer(uv_timer_t *timer)
{
	struct conn_priv *cp = timer->data;

	conn_timer_fired(cp->conn, now_ms());
	progress(cp->vt);
}

static void timer_start(void *ctx, struct conn *conn, uint64_t ms)
{
	struct verbs_transport *vt = ctx;
	struct conn_priv *cp = conn->priv;

	if (!cp) {
		cp = calloc(1, sizeof(*cp));
		if (!cp) {
			/* Without a timer the connection cannot go on: fail it from the loop. */
			log_err("out of memory for a connection timer");
			return;
		}
		cp->vt = vt;
		cp->conn = conn;
		uv_timer_init(vt->daemon->loop, &cp->timer);
		cp->timer.data = cp;
		conn->priv = cp;
		vt->handles++;
	}
	uv_timer_start(&cp->timer, on_conn_timer, ms, 0);
}

static void timer_stop(void *ctx, struct conn *conn)
{
	struct conn_priv *cp = conn->priv;

	if (cp) {
		uv_timer_stop(&cp->timer);
	}
}

static void on_kick(uv_idle_t *idle)
{
	progress(idle->data);
}

static void kick(void *ctx)
{
	struct verbs_transport *vt = ctx;

	if (vt->handles_open && !uv_is_active((uv_handle_t *)&vt->kick)) {
		uv_idle_start(&vt->kick, on_kick);
	}
}

static void on_conn_timer_closed(uv_handle_t *handle)
{
	struct conn_priv *cp = handle->data;
	struct verbs_transport *vt = cp->vt;

	conn_free(cp->conn);
	free(cp);
	vt->handles--;
	progress(vt);
}

static void release(void *ctx, struct conn *conn)
{
	struct conn_priv *cp = conn->priv;

	if (!cp) {
		conn_free(conn);
		return;
	}
	uv_close((uv_handle_t *)&cp->timer, on_conn_timer_closed);
}

static int probe_start(void *ctx, struct conn_probe *probe, char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct sockaddr_storage dst;
	struct probe_ctx *pc;
	int ret;

	if (parse_sockaddr(probe->peer.addr, probe->peer.port, &dst) < 0) {
		snprintf(why, why_size, "bad address");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	pc = calloc(1, sizeof(*pc));
	if (!pc) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	pc->obj.kind = OBJ_PROBE;
	pc->vt = vt;
	pc->probe = probe;
	ret = verbs_cm_create_id(vt->cm, pc, &pc->id);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_create_id() failed: %s", strerror(-ret));
		free(pc);
		return ret;
	}
	struct sockaddr_storage src;
	ret = verbs_cm_resolve_addr(pc->id, source_addr(vt, &dst, &src), (struct sockaddr *)&dst,
				    (int)vt->daemon->cfg.connect_timeout_ms);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_resolve_addr() failed: %s", strerror(-ret));
		verbs_cm_destroy_id(pc->id);
		free(pc);
		return ret;
	}
	probe->priv = pc;
	return 0;
}

static void probe_destroy(void *ctx, struct conn_probe *probe)
{
	struct probe_ctx *pc = probe->priv;

	if (!pc) {
		return;
	}
	verbs_cm_destroy_id(pc->id);
	free(pc);
	probe->priv = NULL;
}

struct cm_copy;
static void on_probe_event(struct probe_ctx *pc, const struct cm_copy *ev);

static const struct conn_ops g_conn_ops = {
	.link_start = link_start,
	.link_resolve_route = link_resolve_route,
	.link_connect = link_connect,
	.link_disconnect = link_disconnect,
	.link_post = link_post,
	.link_destroy = link_destroy,
	.timer_start = timer_start,
	.timer_stop = timer_stop,
	.kick = kick,
	.release = release,
	.probe_start = probe_start,
	.probe_destroy = probe_destroy,
};

/* ------------------------------------------------------- accepting side */

static void passive_free(struct passive *p)
{
	struct verbs_transport *vt = p->vt;

	if (p->id) {
		if (p->id->qp) {
			unindex_qp(vt, p->qp_num, &p->indexed);
			verbs_cm_destroy_qp(p->id);
		}
		int err = verbs_cm_destroy_id(p->id);
		if (err < 0) {
			log_warn("rdma_destroy_id() failed: %s", strerror(-err));
		}
	}
	if (p->hca && p->cqes) {
		hca_release_cqes(p->hca, p->cqes);
	}
	/* The QP is gone: nothing reads the answer slots any more. */
	while (!list_empty(&p->ans_queue)) {
		struct answer *a = container_of(p->ans_queue.next, struct answer, link);
		list_del(&a->link);
		free(a);
	}
	conn_msg_rx_reset(&p->rx);
	int ret = verbs_dereg_mr(p->ans_mr);
	if (ret < 0) {
		log_warn("ibv_dereg_mr() of answer slots failed: %s", strerror(-ret));
	}
	free(p->ans_buf);
	conn_table_group_del(&vt->conns, p->instance, p->group);
	list_del(&p->link);
	free(p);
}

static void passive_close(struct passive *p, bool disconnect, const char *why)
{
	if (p->state == PASSIVE_UP) {
		log_debug("connection from %s closed: %s", p->name, why);
	}
	if (disconnect && p->id) {
		verbs_cm_disconnect(p->id);
	}
	passive_free(p);
}

static void refuse(struct verbs_transport *vt, struct rdma_cm_id *id, const char *name,
		   enum conn_reject_reason reason)
{
	uint8_t pd[56];
	int len = conn_pd_reject(pd, sizeof(pd), reason);

	log_ratelimited(&vt->rl, LOG_WARNING, "refused connection from %s: %s", name,
			conn_reject_reason_str(reason));
	if (verbs_cm_reject(id, pd, (uint8_t)MAX(len, 0)) < 0) {
		log_debug("rdma_reject() failed");
	}
	verbs_cm_destroy_id(id);
}

struct cm_copy {
	enum rdma_cm_event_type type;
	int status;
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	uint8_t pd[256];
	size_t pd_len;
	uint8_t initiator_depth;
	uint8_t responder_resources;
};

static void answer_query(struct verbs_transport *vt, struct listener *l, struct rdma_cm_id *id,
			 const char *name, const struct cm_copy *ev);

static void on_connect_request(struct verbs_transport *vt, struct listener *l,
			       const struct cm_copy *ev)
{
	struct rdma_cm_id *id = ev->id;
	struct conn_request req;
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param param;
	uint8_t accept_pd[64];
	char name[64];
	int ret;

	format_sockaddr(&id->route.addr.dst_addr, name, sizeof(name));
	if (vt->shut) {
		refuse(vt, id, name, CONN_REJ_SHUTDOWN);
		return;
	}
	if (conn_pd_type(ev->pd, ev->pd_len) == CONN_PD_QUERY) {
		answer_query(vt, l, id, name, ev);
		return;
	}
	/* Everything about the request is checked before a QP exists. */
	enum conn_reject_reason reason = conn_pd_check(
		&vt->conns, ev->pd, ev->pd_len, l->addr_bytes, l->port, conn_realtime_ms(), &req);
	if (reason != CONN_REJ_NONE) {
		refuse(vt, id, name, reason);
		return;
	}
	struct hca *hca = hca_find(&vt->hcas, id->verbs);
	if (!hca || !hca_usable(hca)) {
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	ret = conn_table_group_add(&vt->conns, req.instance, req.group);
	if (ret < 0) {
		refuse(vt, id, name,
		       ret == RDMAX_E_RESOURCE_EXHAUSTED ? CONN_REJ_LIMIT : CONN_REJ_RESOURCES);
		return;
	}
	struct passive *p = calloc(1, sizeof(*p));
	if (!p) {
		conn_table_group_del(&vt->conns, req.instance, req.group);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	p->obj.kind = OBJ_PASSIVE;
	p->vt = vt;
	p->hca = hca;
	p->instance = req.instance;
	p->group = req.group;
	list_init(&p->ans_queue);
	copy_string(p->name, sizeof(p->name), name);
	list_add_tail(&vt->passives, &p->link);
	/* The accepting QP only sends answers to messages, every one signaled. */
	if (hca_reserve_cqes(hca, PASSIVE_SQ) < 0) {
		p->id = NULL;
		passive_free(p);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	p->cqes = PASSIVE_SQ;
	p->ans_buf = aligned_alloc(ANSWER_SLOT, PASSIVE_SQ * ANSWER_SLOT);
	ret = p->ans_buf ? verbs_reg_mr(hca->pd, p->ans_buf, PASSIVE_SQ * ANSWER_SLOT,
					(uintptr_t)p->ans_buf, 0, &p->ans_mr)
			 : -ENOMEM;
	if (ret < 0) {
		log_warn("cannot register answer slots on '%s' for %s: %s", hca->name, name,
			 strerror(-ret));
		passive_free(p);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = hca->cq;
	attr.recv_cq = hca->cq;
	attr.srq = hca->srq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = PASSIVE_SQ;
	attr.cap.max_send_sge = 1;
	ret = verbs_cm_create_qp(id, hca->pd, &attr);
	if (ret < 0) {
		log_warn("rdma_create_qp() on '%s' for %s failed: %s", hca->name, name,
			 strerror(-ret));
		passive_free(p);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	p->id = id;
	id->context = p;
	p->qp_num = id->qp->qp_num;
	index_qp(vt, p->qp_num, &p->obj, &p->indexed);
	int len = conn_pd_accept(accept_pd, sizeof(accept_pd), &vt->conns, ev->pd, l->addr_bytes,
				 l->port);
	memset(&param, 0, sizeof(param));
	param.private_data = accept_pd;
	param.private_data_len = (uint8_t)MAX(len, 0);
	param.responder_resources = MIN(rd_atom(hca->attr.max_qp_rd_atom), ev->initiator_depth);
	param.initiator_depth =
		MIN(rd_atom(hca->attr.max_qp_init_rd_atom), ev->responder_resources);
	param.retry_count = RETRY_COUNT;
	param.rnr_retry_count = RNR_RETRY;
	param.flow_control = 1;
	ret = verbs_cm_accept(id, &param);
	if (ret < 0) {
		log_warn("rdma_accept() of %s failed: %s", name, strerror(-ret));
		passive_free(p);
		return;
	}
	p->state = PASSIVE_ACCEPTING;
	log_debug("accepting QP %u from %s (link %u of %u, instance %016" PRIx64 ")", p->qp_num,
		  name, req.link_index + 1, req.n_links, req.instance);
}

static void on_passive_event(struct passive *p, const struct cm_copy *ev)
{
	switch (ev->type) {
	case RDMA_CM_EVENT_ESTABLISHED:
		p->state = PASSIVE_UP;
		log_debug("connection from %s established (QP %u)", p->name, p->qp_num);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		passive_close(p, true, "the peer disconnected");
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_ADDR_CHANGE:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		passive_close(p, ev->type != RDMA_CM_EVENT_DEVICE_REMOVAL,
			      verbs_cm_event_str(ev->type));
		break;
	default:
		break;
	}
}

/* ------------------------------------------------------- messages, owner's side */

/* data: text for the answer (NUL-terminated), or len descriptor bytes when status is 0. */
static int answer_post(struct passive *p, uint64_t id, int status, const uint8_t *data,
		       uint32_t data_len)
{
	uint8_t *buf = p->ans_buf + (p->ans_posted % PASSIVE_SQ) * ANSWER_SLOT;
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	int len = status == 0 && data_len
			  ? conn_answer_encode_data(buf, ANSWER_SLOT, id, data, data_len)
			  : conn_answer_encode(buf, ANSWER_SLOT, id, status, (const char *)data);

	if (len < 0) {
		return len;
	}
	sge.addr = (uintptr_t)buf;
	sge.length = (uint32_t)len;
	sge.lkey = p->ans_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = p->ans_posted;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	/* Every answer signaled: its completion frees its slot, in order (RC). */
	wr.send_flags = IBV_SEND_SIGNALED;
	int ret = verbs_post_send(p->id->qp, &wr);
	if (ret == 0) {
		p->ans_posted++;
	}
	return ret;
}

static bool answer_room(const struct passive *p)
{
	return p->ans_posted - p->ans_done < PASSIVE_SQ;
}

/* Post waiting answers while the send queue has room; false when p had to close. */
static bool answers_flush(struct passive *p)
{
	while (!list_empty(&p->ans_queue) && answer_room(p)) {
		struct answer *a = container_of(p->ans_queue.next, struct answer, link);
		int ret = answer_post(p, a->id, a->status, a->data, a->len);
		if (ret < 0) {
			log_ratelimited(&p->vt->rl, LOG_WARNING,
					"connection from %s closed: ibv_post_send() of an answer "
					"failed: %s",
					p->name, strerror(-ret));
			passive_close(p, true, "an answer could not be posted");
			return false;
		}
		list_del(&a->link);
		p->n_queued--;
		free(a);
	}
	return true;
}

static void answer(struct passive *p, uint64_t id, int status, const uint8_t *data,
		   uint32_t data_len)
{
	struct answer *a;

	if (list_empty(&p->ans_queue) && answer_room(p)) {
		int ret = answer_post(p, id, status, data, data_len);
		if (ret < 0) {
			log_ratelimited(&p->vt->rl, LOG_WARNING,
					"connection from %s closed: ibv_post_send() of an answer "
					"failed: %s",
					p->name, strerror(-ret));
			passive_close(p, true, "an answer could not be posted");
		}
		return;
	}
	/* A requester keeps few messages in flight: this many means it takes no answers. */
	if (p->n_queued >= ANSWERS_MAX || !(a = calloc(1, sizeof(*a)))) {
		log_ratelimited(&p->vt->rl, LOG_WARNING,
				"connection from %s closed: %u answers wait for its send queue",
				p->name, p->n_queued);
		passive_close(p, true, "too many answers waiting");
		return;
	}
	a->id = id;
	a->status = status;
	a->len = MIN(data_len, (uint32_t)CONN_ANSWER_DATA_MAX);
	memcpy(a->data, data, a->len);
	list_add_tail(&p->ans_queue, &a->link);
	p->n_queued++;
}

/* The daemon's own errors become statuses a peer understands. */
static int wire_status(int err)
{
	if (err == 0 || (err <= RDMAX_E_INVALID_ARGUMENT && err >= RDMAX_E_DISCONNECTED)) {
		return err;
	}
	return err == -ENOMEM ? RDMAX_E_RESOURCE_EXHAUSTED : RDMAX_E_INTERNAL;
}

/*
 * A zero-length WRITE_WITH_IMM is not checked against any rkey by the NIC
 * (nothing is written), so a barrier's imm travels as a message to this
 * reserved name instead: the region it names is checked here, as the TCP
 * transport checks it, before the imm is counted. The space makes it a name
 * no client can open.
 */
#define IMM_MAILBOX    " imm"
#define IMM_RECORD_LEN 28 /* instance, region id, key (u64 each), imm (u32), little-endian */

/* An imm record from a peer: the region must exist, match its key and take writes. */
static int imm_record_land(struct rdmaxd *d, const uint8_t *rec, size_t len, char *text,
			   size_t text_size)
{
	struct region *region;

	if (len != IMM_RECORD_LEN) {
		snprintf(text, text_size, "malformed imm record of %zu bytes", len);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	uint64_t instance = get_le64(rec), id = get_le64(rec + 8), key = get_le64(rec + 16);
	uint32_t imm = (uint32_t)rec[24] | (uint32_t)rec[25] << 8 | (uint32_t)rec[26] << 16 |
		       (uint32_t)rec[27] << 24;
	int err = region_get_remote(&d->regions, instance, id, key, 0, 0, RDMAX_ACCESS_REMOTE_WRITE,
				    &region);
	if (err == 0 && !region->writable) {
		err = RDMAX_E_PERMISSION_DENIED;
	}
	if (err == 0) {
		/* The imm counts in the namespace of the region's client (imm.h). */
		imm_landed(&d->imm, region_imm_owner(region), imm);
		region_put(&d->regions, region);
		return 0;
	}
	if (err == RDMAX_E_PERMISSION_DENIED) {
		snprintf(text, text_size,
			 "region %" PRIu64 " of node '%s' does not take remote writes", id,
			 d->node_name);
		return RDMAX_E_REMOTE_ACCESS;
	}
	snprintf(text, text_size,
		 "unknown region %" PRIu64 " on node '%s': stale or forged descriptor", id,
		 d->node_name);
	return err == RDMAX_E_NOT_FOUND ? RDMAX_E_NOT_FOUND : wire_status(err);
}

/* A frame landed on an accepted QP: reassemble, deliver, answer. */
static void passive_recv(struct passive *p, const uint8_t *buf, uint32_t len)
{
	struct rdmaxd *d = p->vt->daemon;
	char name[TRANSPORT_MAILBOX_NAME_MAX + 1];
	char from[CONN_FROM_MAX + 1];
	char text[CONN_MSG_MAX] = "";
	struct conn_frame f;
	int status;

	int ret = conn_frame_decode(buf, len, &f);
	if (ret == 0) {
		ret = f.type == CONN_FRAME_MESSAGE ? conn_msg_rx_feed(&p->rx, &f)
						   : RDMAX_E_PROTOCOL_ERROR;
	}
	if (ret == 0) {
		return; /* more frames follow */
	}
	if (ret < 0) {
		/* A peer that breaks the format is not trusted with another frame. */
		log_ratelimited(&p->vt->rl, LOG_WARNING, "connection from %s closed: %s", p->name,
				ret == -ENOMEM ? "out of memory for an incoming message"
					       : "malformed message frame");
		passive_close(p, true, "malformed message frame");
		return;
	}
	const struct conn_msg_rx *rx = &p->rx;
	const uint8_t *payload = rx->body + rx->name_len + rx->from_len;
	memcpy(name, rx->body, rx->name_len);
	name[rx->name_len] = '\0';
	memcpy(from, rx->body + rx->name_len, rx->from_len);
	from[rx->from_len] = '\0';
	if (rx->name_len == sizeof(IMM_MAILBOX) - 1 && strcmp(name, IMM_MAILBOX) == 0) {
		status = imm_record_land(d, payload, rx->payload_len, text, sizeof(text));
	} else if (rx->name_len == sizeof(TRANSPORT_LOOKUP_MAILBOX) - 1 &&
		   strcmp(name, TRANSPORT_LOOKUP_MAILBOX) == 0) {
		uint8_t desc[CONN_ANSWER_DATA_MAX];
		uint64_t id = rx->id;
		int n = names_serve(d->names, d->node_name, payload, rx->payload_len, desc,
				    sizeof(desc), text, sizeof(text));
		conn_msg_rx_reset(&p->rx);
		if (n > 0) {
			answer(p, id, 0, desc, (uint32_t)n);
		} else {
			answer(p, id, wire_status(n), (const uint8_t *)text,
			       (uint32_t)strlen(text));
		}
		return;
	} else if (memchr(rx->body, '\0', rx->name_len) ||
		   mailbox_name_check(name, rx->name_len) < 0) {
		status = RDMAX_E_INVALID_ARGUMENT;
		snprintf(text, sizeof(text),
			 "mailbox name is not valid (1 to %u printable characters without spaces)",
			 TRANSPORT_MAILBOX_NAME_MAX);
	} else {
		status = wire_status(
			mailbox_deliver(d->mailboxes, name, payload, rx->payload_len, from));
		if (status == RDMAX_E_NOT_FOUND) {
			snprintf(text, sizeof(text), "no mailbox '%s' is open on node '%s'", name,
				 d->node_name);
		} else if (status < 0) {
			snprintf(text, sizeof(text), "mailbox '%s' refused the message: %s", name,
				 rdmax_strerror(status));
		}
	}
	if (status < 0) {
		log_ratelimited(&p->vt->rl, LOG_INFO, "refused message from %s: %s", p->name, text);
	}
	uint64_t id = rx->id;
	conn_msg_rx_reset(&p->rx);
	answer(p, id, status, (const uint8_t *)text, (uint32_t)strlen(text));
}

/* An answer's send completed (or failed: then the connection is gone). */
static void passive_send_wc(struct passive *p, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS) {
		if (wc->status != IBV_WC_WR_FLUSH_ERR) {
			log_ratelimited(&p->vt->rl, LOG_INFO, "answer to %s failed: %s", p->name,
					verbs_wc_status_str(wc->status));
		}
		passive_close(p, true, "an answer could not be sent");
		return;
	}
	p->ans_done++;
	answers_flush(p);
}

static void on_probe_event(struct probe_ctx *pc, const struct cm_copy *ev)
{
	struct verbs_transport *vt = pc->vt;
	struct rdma_conn_param param;
	int ret = 0;

	switch (ev->type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		ret = verbs_cm_resolve_route(pc->id, (int)vt->daemon->cfg.connect_timeout_ms);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		/* No QP: the owner always rejects a query, so none is ever needed. */
		memset(&param, 0, sizeof(param));
		param.private_data = pc->probe->request;
		param.private_data_len = CONN_PD_REQ_LEN;
		param.qp_num = 1;
		param.retry_count = RETRY_COUNT;
		param.rnr_retry_count = RNR_RETRY;
		ret = verbs_cm_connect(pc->id, &param);
		break;
	case RDMA_CM_EVENT_REJECTED:
		conn_probe_answer(pc->probe, ev->pd, ev->pd_len);
		return;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		return;
	default:
		/* Errors, and an accept that a daemon of this kind never sends. */
		conn_probe_answer(pc->probe, NULL, 0);
		return;
	}
	if (ret < 0) {
		log_debug("probe of %s: %s failed: %s", pc->probe->name,
			  verbs_cm_event_str(ev->type), strerror(-ret));
		conn_probe_answer(pc->probe, NULL, 0);
	}
}

/* The owner's side of a probe: its verdict on the access, in a reject. */
static void answer_query(struct verbs_transport *vt, struct listener *l, struct rdma_cm_id *id,
			 const char *name, const struct cm_copy *ev)
{
	struct conn_query q;
	struct region *region;
	uint8_t pd[16];

	enum conn_reject_reason reason =
		conn_pd_check_query(&vt->conns, ev->pd, ev->pd_len, l->addr_bytes, l->port, &q);
	if (reason != CONN_REJ_NONE) {
		refuse(vt, id, name, reason);
		return;
	}
	int verdict = region_get_remote(&vt->daemon->regions, vt->daemon->instance_id, q.region_id,
					q.region_key, q.offset, q.length, q.access, &region);
	if (verdict == 0) {
		region_put(&vt->daemon->regions, region);
	}
	log_debug("verdict for %s on region %" PRIu64 " [%" PRIu64 ", +%" PRIu64 "): %s", name,
		  q.region_id, q.offset, q.length, verdict ? rdmax_strerror(verdict) : "allowed");
	int len = conn_pd_verdict(pd, sizeof(pd), verdict);
	if (verbs_cm_reject(id, pd, (uint8_t)MAX(len, 0)) < 0) {
		log_debug("rdma_reject() of a query failed");
	}
	verbs_cm_destroy_id(id);
}

/* ------------------------------------------------------- listeners */

static void listener_free(struct listener *l)
{
	if (!l) {
		return;
	}
	if (l->id) {
		verbs_cm_destroy_id(l->id);
	}
	free(l);
}

static int listener_bind(struct verbs_transport *vt, struct listener *l)
{
	int ret = verbs_cm_create_id(vt->cm, l, &l->id);

	if (ret < 0) {
		log_err("rdma_create_id() failed: %s", strerror(-ret));
		return ret;
	}
	ret = verbs_cm_bind_addr(l->id, (struct sockaddr *)&l->ss);
	if (ret < 0) {
		log_debug("rdma_bind_addr() to '%s' failed: %s", l->addr, strerror(-ret));
		verbs_cm_destroy_id(l->id);
		l->id = NULL;
	}
	return ret;
}

/* Bind a listener on addr; keep it when the address belongs to a device we use. */
static void try_listener(struct verbs_transport *vt, const char *addr, uint32_t prefix_len,
			 int prio)
{
	const struct config *cfg = &vt->daemon->cfg;
	struct listener *l = calloc(1, sizeof(*l));
	struct hca *hca;
	uint16_t port;
	int ret;

	if (!l) {
		return;
	}
	l->obj.kind = OBJ_LISTENER;
	l->prefix_len = prefix_len;
	copy_string(l->addr, sizeof(l->addr), addr);
	if (parse_sockaddr(addr, cfg->listen_port, &l->ss) < 0) {
		log_msg(prio, "verbs: '%s' is not a numeric address", addr);
		goto out_free;
	}
	ret = listener_bind(vt, l);
	if (ret < 0) {
		log_msg(prio, "verbs: rdma_bind_addr() to '%s' port %u failed: %s", addr,
			cfg->listen_port, strerror(-ret));
		goto out_free;
	}
	if (!l->id->verbs) {
		log_msg(prio, "verbs: address '%s' is not on an RDMA device", addr);
		goto out_free;
	}
	const char *dev = verbs_device_name(l->id->verbs);
	if (!hca_selected(cfg->devices, dev)) {
		log_msg(prio,
			"verbs: address '%s' is on device '%s', which [verbs] devices does "
			"not select",
			addr, dev);
		goto out_free;
	}
	hca = hca_find(&vt->hcas, l->id->verbs);
	if (!hca) {
		ret = hca_open(&vt->hcas, l->id->verbs, &hca);
		if (ret < 0) {
			log_msg(prio, "verbs: device '%s' (address '%s') is not usable: %s", dev,
				addr, rdmax_strerror(ret));
			goto out_free;
		}
	}
	if (vt->listeners[hca->index]) {
		log_debug("verbs: device '%s' already listens on '%s'; not on '%s'", dev,
			  vt->listeners[hca->index]->addr, addr);
		goto out_free;
	}
	ret = verbs_cm_listen(l->id, LISTEN_BACKLOG);
	if (ret < 0) {
		log_err("rdma_listen() on '%s' port %u failed: %s", addr, cfg->listen_port,
			strerror(-ret));
		goto out_free;
	}
	port = verbs_cm_src_port(l->id);
	l->port = port;
	l->hca = hca;
	conn_addr_bytes((struct sockaddr *)&l->ss, l->addr_bytes, &port);
	vt->listeners[hca->index] = l;
	log_info("verbs: listening on %s port %u (device '%s')", addr, l->port, hca->name);
	return;

out_free:
	listener_free(l);
}

/* Leading one bits of an interface's netmask (its prefix length). */
static uint32_t netmask_bits(const struct sockaddr *mask)
{
	const uint8_t *b;
	size_t n;
	uint32_t bits = 0;

	if (!mask) {
		return 0;
	}
	if (mask->sa_family == AF_INET) {
		b = (const uint8_t *)&((const struct sockaddr_in *)mask)->sin_addr;
		n = 4;
	} else if (mask->sa_family == AF_INET6) {
		b = (const uint8_t *)&((const struct sockaddr_in6 *)mask)->sin6_addr;
		n = 16;
	} else {
		return 0;
	}
	for (size_t i = 0; i < n && b[i] == 0xff; i++) {
		bits += 8;
	}
	for (size_t i = bits / 8; i < n && bits % 8 == 0; i++) {
		for (uint8_t m = 0x80; m && (b[i] & m); m >>= 1) {
			bits++;
		}
		break;
	}
	return bits;
}

static void open_listeners(struct verbs_transport *vt, int prio)
{
	const struct config *cfg = &vt->daemon->cfg;
	struct ifaddrs *ifa, *i;

	if (!is_wildcard(cfg->listen_addr)) {
		try_listener(vt, cfg->listen_addr, 0, prio);
		return;
	}
	if (getifaddrs(&ifa) < 0) {
		log_err("getifaddrs() failed: %s", strerror(errno));
		return;
	}
	for (i = ifa; i; i = i->ifa_next) {
		char host[INET6_ADDRSTRLEN];
		if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) {
			continue;
		}
		if (i->ifa_addr->sa_family == AF_INET) {
			inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host,
				  sizeof(host));
		} else if (i->ifa_addr->sa_family == AF_INET6 &&
			   !IN6_IS_ADDR_LINKLOCAL(
				   &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr)) {
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, host,
				  sizeof(host));
		} else {
			continue;
		}
		try_listener(vt, host, netmask_bits(i->ifa_netmask), LOG_DEBUG);
	}
	freeifaddrs(ifa);
}

/* The address changed under a listener: bind and listen again (SPDK does the same). */
static void relisten(struct verbs_transport *vt, struct listener *l)
{
	if (l->id) {
		verbs_cm_destroy_id(l->id);
		l->id = NULL;
	}
	if (listener_bind(vt, l) < 0 || verbs_cm_listen(l->id, LISTEN_BACKLOG) < 0) {
		log_err("verbs: cannot listen on '%s' again after an address change", l->addr);
		return;
	}
	log_notice("verbs: listening on '%s' again after an address change", l->addr);
}

/* ------------------------------------------------------- event dispatch */

static enum conn_event conn_event_of(enum rdma_cm_event_type type, bool *ret_ok)
{
	*ret_ok = true;
	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		return CONN_EV_ADDR_RESOLVED;
	case RDMA_CM_EVENT_ADDR_ERROR:
		return CONN_EV_ADDR_ERROR;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		return CONN_EV_ROUTE_RESOLVED;
	case RDMA_CM_EVENT_ROUTE_ERROR:
		return CONN_EV_ROUTE_ERROR;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return CONN_EV_CONNECT_ERROR;
	case RDMA_CM_EVENT_UNREACHABLE:
		return CONN_EV_UNREACHABLE;
	case RDMA_CM_EVENT_REJECTED:
		return CONN_EV_REJECTED;
	case RDMA_CM_EVENT_ESTABLISHED:
		return CONN_EV_ESTABLISHED;
	case RDMA_CM_EVENT_DISCONNECTED:
		return CONN_EV_DISCONNECTED;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		return CONN_EV_DEVICE_REMOVAL;
	case RDMA_CM_EVENT_ADDR_CHANGE:
		return CONN_EV_ADDR_CHANGE;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		return CONN_EV_TIMEWAIT_EXIT;
	default:
		*ret_ok = false;
		return CONN_EV_MAX;
	}
}

static void dispatch(struct verbs_transport *vt, const struct cm_copy *ev)
{
	if (ev->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		on_connect_request(vt, ev->listen_id->context, ev);
		return;
	}
	struct cm_obj *obj = ev->id ? ev->id->context : NULL;
	if (!obj) {
		return;
	}
	switch (obj->kind) {
	case OBJ_LISTENER: {
		struct listener *l = (struct listener *)obj;
		if (ev->type == RDMA_CM_EVENT_ADDR_CHANGE && !vt->shut) {
			relisten(vt, l);
		} else if (ev->type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
			log_err("verbs: device '%s' was removed; no longer listening on '%s'",
				l->hca->name, l->addr);
			l->hca->dead = true;
		}
		break;
	}
	case OBJ_LINK: {
		struct link_ctx *lc = (struct link_ctx *)obj;
		struct conn_event_data data = {
			.private_data = ev->pd,
			.private_len = ev->pd_len,
			.status = ev->status,
		};
		bool known;
		enum conn_event cev = conn_event_of(ev->type, &known);
		if (known) {
			conn_link_event(lc->link, cev, &data, now_ms());
		}
		break;
	}
	case OBJ_PASSIVE:
		on_passive_event((struct passive *)obj, ev);
		break;
	case OBJ_PROBE:
		on_probe_event((struct probe_ctx *)obj, ev);
		break;
	default:
		break;
	}
}

static void on_cm(uv_poll_t *handle, int status, int events)
{
	struct verbs_transport *vt = handle->data;
	struct rdma_cm_event *event;
	struct cm_copy ev;

	for (int i = 0; i < CM_BUDGET; i++) {
		int ret = verbs_cm_get_event(vt->cm, &event);
		if (ret < 0) {
			if (ret != -EAGAIN && ret != -EWOULDBLOCK && ret != -EINTR) {
				log_ratelimited(&vt->rl, LOG_ERR, "rdma_get_cm_event() failed: %s",
						strerror(-ret));
			}
			break;
		}
		/* Ack first (after copying what the handlers need): a destroy may follow. */
		memset(&ev, 0, sizeof(ev));
		ev.type = event->event;
		ev.status = event->status;
		ev.id = event->id;
		ev.listen_id = event->listen_id;
		if (event->param.conn.private_data && event->param.conn.private_data_len > 0) {
			ev.pd_len = MIN((size_t)event->param.conn.private_data_len, sizeof(ev.pd));
			memcpy(ev.pd, event->param.conn.private_data, ev.pd_len);
		}
		ev.initiator_depth = event->param.conn.initiator_depth;
		ev.responder_resources = event->param.conn.responder_resources;
		ret = verbs_cm_ack_event(event);
		if (ret < 0) {
			log_ratelimited(&vt->rl, LOG_ERR, "rdma_ack_cm_event() failed: %s",
					strerror(-ret));
		}
		dispatch(vt, &ev);
	}
	progress(vt);
}

/* ------------------------------------------------------- completions */

static void on_send_wc(void *ctx, struct hca *hca, const struct ibv_wc *wc)
{
	struct verbs_transport *vt = ctx;
	struct cm_obj *obj = hmap_get(&vt->qps, (uint64_t)wc->qp_num + 1);

	if (obj && obj->kind == OBJ_PASSIVE) {
		passive_send_wc((struct passive *)obj, wc);
		return;
	}
	if (!obj || obj->kind != OBJ_LINK) {
		/* A QP destroyed after a drain that gave up: its late completions mean nothing. */
		return;
	}
	struct link_ctx *lc = (struct link_ctx *)obj;
	conn_link_wc(lc->link, wc->wr_id, wc->status, wc->vendor_err, now_ms());
}

/*
 * A WRITE_WITH_IMM: its immediate names no region, so it cannot be counted
 * in any client's namespace (imm.h). This daemon sends imm records instead
 * (IMM_MAILBOX); a peer that sends this is older or hostile.
 */
static void on_imm(void *ctx, struct hca *hca, uint32_t imm)
{
	struct verbs_transport *vt = ctx;
	static struct log_ratelimit rl;

	vt->daemon->imm.dropped++;
	log_ratelimited(&rl, LOG_WARNING,
			"WRITE_WITH_IMM %u on device '%s' not counted: an imm must name the "
			"region it lands in (imm record)",
			imm, hca->name);
}

/* A SEND landed: a message frame at an accepted QP, an answer at one of ours. */
static void on_recv(void *ctx, struct hca *hca, uint32_t qp_num, const uint8_t *buf, uint32_t len)
{
	struct verbs_transport *vt = ctx;
	struct cm_obj *obj = hmap_get(&vt->qps, (uint64_t)qp_num + 1);
	struct conn_frame f;

	if (!obj) {
		return; /* its QP is gone */
	}
	if (obj->kind == OBJ_PASSIVE) {
		passive_recv((struct passive *)obj, buf, len);
		return;
	}
	if (obj->kind != OBJ_LINK) {
		return;
	}
	struct conn_link *link = ((struct link_ctx *)obj)->link;
	if (conn_frame_decode(buf, len, &f) < 0 || f.type != CONN_FRAME_ANSWER) {
		log_ratelimited(&vt->rl, LOG_WARNING,
				"connection to %s closed: the peer sent a malformed answer (%u "
				"bytes)",
				link->conn->name, len);
		conn_close(link->conn, RDMAX_E_PROTOCOL_ERROR,
			   "the peer sent a malformed answer to a message");
		return;
	}
	conn_link_answer(link, &f, now_ms());
}

/* Close every connection and accepted group with a QP on hca. */
static void close_on_device(struct verbs_transport *vt, const struct hca *hca, const char *why)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &vt->conns.conns)
	{
		struct conn *conn = container_of(pos, struct conn, link);
		for (uint32_t i = 0; i < conn->n_links; i++) {
			struct link_ctx *lc = conn->links[i].priv;
			if (lc && lc->hca == hca) {
				conn_close(conn, RDMAX_E_TRANSPORT_ERROR, why);
				break;
			}
		}
	}
	list_for_each_safe(pos, tmp, &vt->passives)
	{
		struct passive *p = container_of(pos, struct passive, link);
		if (p->hca == hca) {
			passive_close(p, false, why);
		}
	}
}

static void on_async(void *ctx, struct hca *hca, enum ibv_event_type type, uint32_t qp_num)
{
	struct verbs_transport *vt = ctx;
	char why[128];

	switch (type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR: {
		struct cm_obj *obj = hmap_get(&vt->qps, (uint64_t)qp_num + 1);
		if (obj && obj->kind == OBJ_LINK) {
			conn_link_event(((struct link_ctx *)obj)->link, CONN_EV_QP_ERROR, NULL,
					now_ms());
		}
		/* An accepting QP in error: the requester sees it and disconnects. */
		break;
	}
	case IBV_EVENT_PORT_ERR:
		/*
		 * Its QPs would only notice after the transport's retries ran out
		 * (seconds): fail them now, so that the engine re-issues their
		 * chunks on the other devices at once.
		 */
		if (hca_usable(hca)) {
			break;
		}
		snprintf(why, sizeof(why), "device '%s' has no active port any more", hca->name);
		close_on_device(vt, hca, why);
		break;
	case IBV_EVENT_DEVICE_FATAL:
	case IBV_EVENT_CQ_ERR:
	case IBV_EVENT_SRQ_ERR:
		snprintf(why, sizeof(why), "the RDMA device '%s' failed", hca->name);
		close_on_device(vt, hca, why);
		break;
	default:
		break;
	}
}

/*
 * Something happened (a completion, a post): busy-poll for busy_poll_us from
 * now. busy_poll_us = 0: no spinning, every completion comes through the
 * channel.
 */
static void busy_renew(struct verbs_transport *vt)
{
	if (vt->daemon->cfg.busy_poll_us > 0) {
		vt->busy_until_ns = now_ns() + (uint64_t)vt->daemon->cfg.busy_poll_us * 1000;
		vt->hcas.busy = true;
	}
}

static void on_progress(void *ctx)
{
	struct verbs_transport *vt = ctx;

	/* A completion event: the next completions may follow closely. */
	busy_renew(vt);
	progress(vt);
}

static int poll_devices(struct verbs_transport *vt)
{
	int n = 0;

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		if (hca->open_handles > 0 && !hca->closing) {
			n += hca_poll(hca, POLL_BUDGET);
		}
	}
	return n;
}

/*
 * Busy-poll within busy_poll_us of the last completion or post, not for as
 * long as WRs are out: the WRs of a large transfer complete milliseconds
 * apart, and spinning through that costs a core (with Soft-RoCE, the very CPU
 * the emulated NIC needs). Once the window has passed, the CQs are armed and
 * the loop may sleep.
 */
static void on_check(uv_check_t *check)
{
	struct verbs_transport *vt = check->data;
	bool backlog = false;

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		backlog |= vt->hcas.hcas[i]->backlog;
	}
	/* The clock only while it matters: without a TSC (emulation) a read is a syscall. */
	if (vt->hcas.busy &&
	    ((vt->conns.outstanding_wrs == 0 && !backlog) || now_ns() >= vt->busy_until_ns)) {
		/* Busy-polling ends: completions must wake the loop again. */
		vt->hcas.busy = false;
	}
	/* Polling when the loop turns anyway costs little and finds completions early. */
	if ((vt->conns.outstanding_wrs > 0 || backlog) && poll_devices(vt) > 0) {
		busy_renew(vt);
	}
	if (!vt->hcas.busy) {
		/*
		 * Not spinning: every CQ must be armed, also one whose poll stopped at its
		 * budget (left unarmed then) once its backlog is gone, or its next
		 * completions (message frames, answers) would wait for an event that
		 * never comes. A no-op for an armed CQ.
		 */
		for (uint32_t i = 0; i < vt->hcas.n; i++) {
			if (!vt->hcas.hcas[i]->backlog) {
				hca_arm(vt->hcas.hcas[i]);
			}
		}
	}
	progress(vt);
}

static void on_tick(uv_timer_t *timer)
{
	struct verbs_transport *vt = timer->data;

	conn_table_tick(&vt->conns, now_ms());
	progress(vt);
}

static void on_handle_closed(uv_handle_t *handle)
{
	struct verbs_transport *vt = handle->data;

	vt->handles--;
}

/* Once shut down and every connection is gone, the loop handles go too. */
static void maybe_close(struct verbs_transport *vt)
{
	if (!vt->shut || !vt->handles_open || !conn_table_idle(&vt->conns) ||
	    !list_empty(&vt->passives)) {
		return;
	}
	vt->handles_open = false;
	uv_close((uv_handle_t *)&vt->cm_poll, on_handle_closed);
	uv_close((uv_handle_t *)&vt->check, on_handle_closed);
	uv_close((uv_handle_t *)&vt->kick, on_handle_closed);
	uv_close((uv_handle_t *)&vt->tick, on_handle_closed);
	hca_table_close(&vt->hcas);
}

static void progress(struct verbs_transport *vt)
{
	if (!vt->conns_ready) {
		return;
	}
	uint64_t posted = vt->conns.outstanding_wrs;
	conn_table_work(&vt->conns, now_ms());
	if (vt->conns.outstanding_wrs > posted) {
		/* Just posted: small WRs complete within the window. */
		busy_renew(vt);
	}
	bool backlog = false;
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		backlog |= vt->hcas.hcas[i]->backlog;
	}
	/*
	 * While busy-polling with WRs out the loop must not sleep: the CQs are not
	 * re-armed then (see on_check), and WRs can outlive their job (deadline,
	 * cancel, drain), so the engine's own busy-poll does not cover them.
	 */
	bool busy = backlog || (vt->hcas.busy && vt->conns.outstanding_wrs > 0);
	if (vt->handles_open && !vt->conns.dirty && vt->conns.n_results == 0 && !busy &&
	    uv_is_active((uv_handle_t *)&vt->kick)) {
		uv_idle_stop(&vt->kick);
	} else if (busy) {
		kick(vt);
	}
	maybe_close(vt);
}

/* ------------------------------------------------------- transport ops */

static int check_xfer(const struct xfer *xfer)
{
	if ((unsigned)xfer->op >= XFER_OP_MAX || xfer->peer.transport != ENDPOINT_VERBS ||
	    !xfer->done || (xfer->op == XFER_READ && xfer->has_imm) ||
	    !memchr(xfer->peer.addr, '\0', sizeof(xfer->peer.addr))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (xfer->length == 0) {
		return 0;
	}
	if (!xfer->local || (!xfer->local->addr && !xfer->local->gpu)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (xfer->op == XFER_READ && !xfer->local->writable) {
		return RDMAX_E_PERMISSION_DENIED;
	}
	return region_check_range(xfer->local, xfer->local_offset, xfer->length);
}

static int verbs_send_message(struct transport *transport, struct xfer *xfer);

/* A barrier's imm on its way as an imm record (see IMM_MAILBOX). */
struct imm_check {
	struct xfer msg;   /* the message carrying the record */
	struct xfer *user; /* the engine's zero-length write */
	uint8_t record[IMM_RECORD_LEN];
};

static void imm_check_done(struct xfer *msg, int err, const char *message)
{
	struct imm_check *ic = msg->ctx;
	struct xfer *user = ic->user;

	free(ic);
	user->done(user, err, message);
}

static int submit_imm_check(struct verbs_transport *vt, struct xfer *xfer)
{
	struct imm_check *ic = calloc(1, sizeof(*ic));

	if (!ic) {
		return -ENOMEM;
	}
	ic->user = xfer;
	put_le64(ic->record, xfer->remote_instance);
	put_le64(ic->record + 8, xfer->remote_region);
	put_le64(ic->record + 16, xfer->remote_key);
	for (int i = 0; i < 4; i++) {
		ic->record[24 + i] = (uint8_t)(xfer->imm >> (8 * i));
	}
	ic->msg.op = XFER_WRITE;
	ic->msg.peer = xfer->peer;
	ic->msg.remote_instance = xfer->remote_instance;
	ic->msg.length = IMM_RECORD_LEN;
	ic->msg.mailbox = IMM_MAILBOX;
	ic->msg.payload = ic->record;
	ic->msg.done = imm_check_done;
	ic->msg.ctx = ic;
	int ret = verbs_send_message(&vt->base, &ic->msg);
	if (ret < 0) {
		free(ic);
	}
	return ret;
}

/*
 * A write carrying bytes and an imm: the bytes as a plain RDMA WRITE, then,
 * once the NIC acknowledged them (they are in the peer's memory), the imm as
 * an imm record naming the region, so the peer counts it in the namespace of
 * that region's client.
 */
struct imm_write {
	struct xfer data;
	struct xfer *user;
	struct verbs_transport *vt;
};

static void imm_write_data_done(struct xfer *data, int err, const char *message)
{
	struct imm_write *iw = data->ctx;
	struct xfer *user = iw->user;
	struct verbs_transport *vt = iw->vt;

	user->bytes_done = data->bytes_done;
	free(iw);
	if (err == 0) {
		err = submit_imm_check(vt, user);
		message = err < 0 ? "cannot send the imm record after the write" : NULL;
	}
	if (err < 0) {
		user->done(user, err, message);
	}
}

static int submit_write_then_record(struct verbs_transport *vt, struct xfer *xfer)
{
	struct imm_write *iw = malloc(sizeof(*iw));

	if (!iw) {
		return -ENOMEM;
	}
	iw->data = *xfer;
	iw->data.has_imm = false;
	iw->data.done = imm_write_data_done;
	iw->data.ctx = iw;
	iw->user = xfer;
	iw->vt = vt;
	int ret = conn_submit(&vt->conns, &iw->data, now_ms());
	if (ret < 0) {
		free(iw);
	}
	return ret;
}

/*
 * transport_ops.withdraw: a data xfer still queued (while its connection is
 * set up, or behind the send queue's credits) is taken back. What the NIC
 * already holds cannot be: it finishes or flushes, and done follows. An imm
 * or message xfer travels inside a wrapper and is left to finish too.
 */
static int verbs_withdraw(struct transport *transport, struct xfer *xfer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);

	if (xfer->has_imm || xfer->mailbox) {
		return -EBUSY;
	}
	return conn_withdraw(&vt->conns, xfer);
}

static int verbs_submit(struct transport *transport, struct xfer *xfer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	char message[RDMAX_MESSAGE_MAX];

	if (vt->shut) {
		return RDMAX_E_CANCELLED;
	}
	int ret = check_xfer(xfer);
	if (ret < 0) {
		return ret;
	}
	xfer->wire_id = 0; /* a one-sided xfer, not a message */
	if (!iova_matches_key(xfer->peer.iova, xfer->remote_key)) {
		/* Caught here, so a forged key never reaches the wire. */
		snprintf(message, sizeof(message),
			 "unknown region: the descriptor's key does not match its address on "
			 "device '%s' (forged or corrupted descriptor)",
			 xfer->peer.device);
		conn_table_finish(&vt->conns, xfer, RDMAX_E_NOT_FOUND, message);
		return 0;
	}
	if (xfer->length == 0 && xfer->has_imm) {
		return submit_imm_check(vt, xfer);
	}
	if (xfer->has_imm) {
		return submit_write_then_record(vt, xfer);
	}
	return conn_submit(&vt->conns, xfer, now_ms());
}

/* ------------------------------------------------------- messages, sender's side */

static void msg_done(struct xfer *wire, int err, const char *message);

static void slot_free(struct verbs_transport *vt, struct msg_slot *s)
{
	s->user = NULL;
	vt->free_slots[vt->n_free_slots++] = (uint32_t)(s - vt->slots);
}

/* Stage a message into a free slot and hand it to its connection. */
static int msg_start(struct verbs_transport *vt, struct xfer *user)
{
	struct msg_slot *s = &vt->slots[vt->free_slots[--vt->n_free_slots]];
	struct xfer *wire = &s->msg.xfer;
	uint64_t id = ++vt->next_msg_id;
	int ret;

	s->user = user;
	int body = conn_msg_encode(s->staging, CONN_MSG_STAGING, id, user->mailbox, vt->from,
				   user->payload, (uint32_t)user->length);
	if (body < 0) {
		ret = body;
		goto out_free;
	}
	memset(wire, 0, sizeof(*wire));
	wire->op = XFER_WRITE;
	wire->peer = user->peer;
	wire->remote_instance = user->remote_instance;
	wire->length = (uint64_t)body;
	wire->mailbox = user->mailbox;
	wire->payload = s->staging;
	wire->reply = user->reply; /* a lookup's answer lands in the asker's buffer */
	wire->reply_size = user->reply_size;
	wire->wire_id = id;
	wire->done = msg_done;
	wire->ctx = s;
	ret = conn_submit_message(&vt->conns, &s->msg, now_ms());
	if (ret < 0) {
		goto out_free;
	}
	return 0;

out_free:
	slot_free(vt, s);
	return ret;
}

/* Start waiting messages while slots are free (never from inside send_message). */
static void msg_pump(struct verbs_transport *vt)
{
	char text[RDMAX_MESSAGE_MAX];

	while (vt->n_free_slots > 0 && !list_empty(&vt->msg_wait)) {
		struct xfer *user = container_of(vt->msg_wait.next, struct xfer, link);
		list_del(&user->link);
		int ret = vt->shut ? RDMAX_E_CANCELLED : msg_start(vt, user);
		if (ret < 0) {
			snprintf(text, sizeof(text), "%s",
				 ret == RDMAX_E_CANCELLED ? "daemon shutting down"
							  : rdmax_strerror(ret));
			user->done(user, ret, text);
		}
	}
}

/* The connection finished a message: free its slot, then tell the engine. */
static void msg_done(struct xfer *wire, int err, const char *message)
{
	struct msg_slot *s = wire->ctx;
	struct verbs_transport *vt = s->vt;
	struct xfer *user = s->user;

	user->reply_len = err ? 0 : wire->reply_len;
	slot_free(vt, s);
	user->bytes_done = err ? 0 : user->length;
	msg_pump(vt);
	user->done(user, err, message);
}

/* SEND: a message to a mailbox of the peer daemon, answered with its status. */
static int verbs_send_message(struct transport *transport, struct xfer *xfer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	size_t name_len =
		xfer->mailbox ? strnlen(xfer->mailbox, TRANSPORT_MAILBOX_NAME_MAX + 1) : 0;

	if (vt->shut) {
		return RDMAX_E_CANCELLED;
	}
	if (xfer->op != XFER_WRITE || xfer->peer.transport != ENDPOINT_VERBS || !xfer->done ||
	    name_len == 0 || name_len > TRANSPORT_MAILBOX_NAME_MAX ||
	    xfer->length > TRANSPORT_MESSAGE_PAYLOAD_MAX || (xfer->length > 0 && !xfer->payload) ||
	    !memchr(xfer->peer.addr, '\0', sizeof(xfer->peer.addr))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	xfer->bytes_done = 0;
	/* In order: a message never overtakes one that waits for a slot. */
	if (vt->n_free_slots == 0 || !list_empty(&vt->msg_wait)) {
		list_add_tail(&vt->msg_wait, &xfer->link);
		return 0;
	}
	return msg_start(vt, xfer);
}

/* The staging pool: MSG_SLOTS messages, registered for local reads on every device. */
static int pool_open(struct verbs_transport *vt)
{
	size_t len = (size_t)MSG_SLOTS * CONN_MSG_STAGING;
	void *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int ret;

	if (buf == MAP_FAILED) {
		ret = -errno;
		log_err("mmap() of %zu bytes of message staging failed: %s", len, strerror(-ret));
		return ret;
	}
	vt->pool = buf;
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		ret = verbs_reg_mr(hca->pd, buf, len, (uintptr_t)buf, 0, &vt->pool_mr[hca->index]);
		if (ret < 0) {
			log_err("ibv_reg_mr() of %zu bytes of message staging on '%s' failed: %s%s",
				len, hca->name, strerror(-ret),
				ret == -ENOMEM ? " (check the locked-memory limit, ulimit -l)"
					       : "");
			return ret;
		}
	}
	for (uint32_t i = 0; i < MSG_SLOTS; i++) {
		vt->slots[i].vt = vt;
		vt->slots[i].staging = vt->pool + (size_t)i * CONN_MSG_STAGING;
		vt->free_slots[i] = MSG_SLOTS - 1 - i;
	}
	vt->n_free_slots = MSG_SLOTS;
	/* Frames carry printable names only: the owner refuses anything else. */
	const char *name = vt->daemon->node_name;
	size_t n = strnlen(name, CONN_FROM_MAX);
	for (size_t i = 0; i < n; i++) {
		vt->from[i] = name[i] >= 0x20 && name[i] <= 0x7e ? name[i] : '?';
	}
	vt->from[n] = '\0';
	return 0;
}

static void pool_close(struct verbs_transport *vt)
{
	for (uint32_t i = 0; i < REGION_MAX_DEVICES; i++) {
		int ret = verbs_dereg_mr(vt->pool_mr[i]);
		if (ret < 0) {
			log_warn("ibv_dereg_mr() of message staging failed: %s", strerror(-ret));
		}
		vt->pool_mr[i] = NULL;
	}
	if (vt->pool) {
		munmap(vt->pool, (size_t)MSG_SLOTS * CONN_MSG_STAGING);
		vt->pool = NULL;
	}
}

static int verbs_endpoints(struct transport *transport, const struct region *region,
			   struct endpoint *ret_endpoints, uint32_t max)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	uint32_t n = 0;

	for (uint32_t i = 0; i < vt->hcas.n && n < max; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		struct listener *l = vt->listeners[hca->index];
		struct endpoint ep = {.transport = ENDPOINT_VERBS};
		if (!l || hca->dead) {
			continue;
		}
		copy_string(ep.addr, sizeof(ep.addr), l->addr);
		ep.port = l->port;
		copy_string(ep.device, sizeof(ep.device), hca->name);
		if (region) {
			struct ibv_mr *mr = region->transport_data[hca->index];
			if (!mr) {
				continue;
			}
			ep.iova = region_iova(region);
			ep.rkey = mr->rkey;
		}
		ret_endpoints[n++] = ep;
	}
	/*
	 * Peers use the first endpoint they can reach: for GPU memory, list the
	 * NICs nearest the GPU first (same PCIe switch, root port, host bridge,
	 * NUMA node), so that the NIC that moves its bytes is the closest one.
	 */
	const char *bus_id = gpu_region_bus_id(region);
	if (bus_id && bus_id[0] && n > 1 && n <= REGION_MAX_DEVICES) {
		const char *names[REGION_MAX_DEVICES];
		struct endpoint sorted[REGION_MAX_DEVICES];
		uint32_t order[REGION_MAX_DEVICES];
		for (uint32_t i = 0; i < n; i++) {
			names[i] = ret_endpoints[i].device;
		}
		if (gpu_nearest_devices(vt->daemon->gpu, bus_id, names, n, order) > 0) {
			for (uint32_t i = 0; i < n; i++) {
				sorted[i] = ret_endpoints[order[i]];
			}
			memcpy(ret_endpoints, sorted, n * sizeof(*sorted));
		}
	}
	return (int)n;
}

static int verbs_route(struct transport *transport, const struct endpoint *peer, char *ret_device,
		       size_t device_size)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct sockaddr_storage dst;

	if (parse_sockaddr(peer->addr, peer->port, &dst) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	const struct listener *l = source_for(vt, &dst);
	if (!l) {
		copy_string(ret_device, device_size, "");
		return 0;
	}
	if (!hca_usable(l->hca)) {
		return RDMAX_E_UNREACHABLE;
	}
	copy_string(ret_device, device_size, l->hca->name);
	return 0;
}

static void verbs_shutdown(struct transport *transport)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct list_node *pos, *tmp;

	if (vt->shut) {
		return;
	}
	vt->shut = true;
	for (uint32_t i = 0; i < REGION_MAX_DEVICES; i++) {
		listener_free(vt->listeners[i]);
		vt->listeners[i] = NULL;
	}
	list_for_each_safe(pos, tmp, &vt->passives)
	{
		passive_close(container_of(pos, struct passive, link), true,
			      "daemon shutting down");
	}
	conn_table_shutdown(&vt->conns);
	progress(vt);
	/* Messages still waiting for a slot never reached a connection. */
	while (!list_empty(&vt->msg_wait)) {
		struct xfer *user = container_of(vt->msg_wait.next, struct xfer, link);
		list_del(&user->link);
		user->done(user, RDMAX_E_CANCELLED, "daemon shutting down");
	}
}

static void verbs_list_conns(struct transport *transport, transport_conn_cb cb, void *arg)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct list_node *pos;
	uint64_t now = now_ms();

	for (pos = vt->conns.conns.next; pos != &vt->conns.conns; pos = pos->next) {
		const struct conn *conn = container_of(pos, struct conn, link);
		struct transport_conn_info info = {
			.peer = conn->name,
			.node_name = "",
			/* "ready" is the name the admin views count, whatever the fabric. */
			.state = conn->state == CONN_ESTABLISHED ? "ready"
								 : conn_state_name(conn->state),
			.outgoing = true,
			.in_flight = conn_outstanding(conn),
			.queued = conn->n_pending,
			.bytes_sent = conn->bytes_sent,
			.bytes_received = conn->bytes_received,
			.idle_ms = now - MIN(now, conn->last_active_ms),
		};
		cb(arg, &info);
	}
	/* The accepting side moves no bytes itself: the peer's NIC reads and writes. */
	for (pos = vt->passives.next; pos != &vt->passives; pos = pos->next) {
		const struct passive *p = container_of(pos, struct passive, link);
		struct transport_conn_info info = {
			.peer = p->name,
			.node_name = "",
			.state = p->state == PASSIVE_UP ? "ready" : "accepting",
			.outgoing = false,
			.in_flight = (uint32_t)(p->ans_posted - p->ans_done),
			.queued = p->n_queued,
		};
		cb(arg, &info);
	}
}

static int verbs_reset_peer(struct transport *transport, const char *peer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct list_node *pos, *tmp;
	int closed = 0;

	list_for_each_safe(pos, tmp, &vt->conns.conns)
	{
		struct conn *conn = container_of(pos, struct conn, link);
		if (strcmp(conn->name, peer) == 0 && conn->state != CONN_DRAINING &&
		    conn->state != CONN_CLOSED) {
			log_notice("connection to %s reset by the administrator", conn->name);
			conn_close(conn, RDMAX_E_TRANSPORT_ERROR,
				   "connection reset by the administrator (rdmaxctl peer reset)");
			closed++;
		}
	}
	list_for_each_safe(pos, tmp, &vt->passives)
	{
		struct passive *p = container_of(pos, struct passive, link);
		if (strcmp(p->name, peer) == 0) {
			log_notice("connection from %s reset by the administrator", p->name);
			passive_close(p, true, "reset by the administrator");
			closed++;
		}
	}
	progress(vt);
	return closed;
}

static uint32_t mtu_bytes(enum ibv_mtu mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 0;
}

static bool peermem_loaded(void)
{
	return access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
	       access("/sys/module/nvidia_peermem/version", F_OK) == 0;
}

static void verbs_list_ports(struct transport *transport, transport_port_cb cb, void *arg)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct ibv_gid_entry gids[64];
	bool peermem = peermem_loaded();

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		int n_gids = verbs_query_gid_table(hca->ctx, gids, ARRAY_SIZE(gids));
		for (uint8_t port = 1; port <= hca->n_ports; port++) {
			struct transport_port_info info;
			struct ibv_port_attr pa;
			char netdev[IF_NAMESIZE] = "";
			memset(&info, 0, sizeof(info));
			if (verbs_query_port(hca->ctx, port, &pa) < 0) {
				continue;
			}
			info.device = hca->name;
			info.port = port;
			info.state = verbs_port_state_str(pa.state);
			info.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
										   : "InfiniBand";
			info.active_mtu = mtu_bytes(pa.active_mtu);
			info.max_mtu = mtu_bytes(pa.max_mtu);
			info.dmabuf = hca->dmabuf;
			info.peermem = peermem;
			info.netdev = netdev;
			for (int g = 0; g < n_gids && info.n_gids < TRANSPORT_PORT_GIDS_MAX; g++) {
				if (gids[g].port_num != port) {
					continue;
				}
				if (!netdev[0] && gids[g].ndev_ifindex) {
					if_indextoname(gids[g].ndev_ifindex, netdev);
				}
				info.gids[info.n_gids].index = gids[g].gid_index;
				inet_ntop(AF_INET6, gids[g].gid.raw, info.gids[info.n_gids].gid,
					  sizeof(info.gids[info.n_gids].gid));
				info.gids[info.n_gids].type =
					gids[g].gid_type == IBV_GID_TYPE_ROCE_V2   ? "RoCE v2"
					: gids[g].gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
										   : "IB";
				info.n_gids++;
			}
			cb(arg, &info);
		}
	}
}

static void unhook(struct verbs_transport *vt)
{
	struct region_table *table = &vt->daemon->regions;

	/* Regions that outlive the transport must not reach it through the hooks. */
	for (uint32_t i = 0; i < table->n_hooks; i++) {
		if (table->hooks[i].ctx == vt) {
			table->hooks[i].ctx = NULL;
		}
	}
}

static void verbs_destroy(struct transport *transport)
{
	struct region *region;
	size_t iter = 0;

	if (!transport) {
		return;
	}
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	if (!vt->shut || vt->handles > 0 || vt->hcas.handles > 0) {
		log_err("transport_verbs: destroy() before shutdown completed (%u handles open)",
			vt->handles + vt->hcas.handles);
		return;
	}
	/* MRs of regions still held (jobs that never returned) go with the devices. */
	while (hmap_next(&vt->daemon->regions.by_id, &iter, NULL, (void **)&region)) {
		region_removed(vt, region);
	}
	unhook(vt);
	conn_table_fini(&vt->conns);
	hmap_fini(&vt->qps);
	pool_close(vt);
	hca_table_free(&vt->hcas);
	verbs_cm_destroy_channel(vt->cm);
	verbs_free_devices(vt->devices);
	free(vt);
}

static const struct transport_ops g_verbs_ops = {
	.name = "verbs",
	.submit = verbs_submit,
	.endpoints = verbs_endpoints,
	.shutdown = verbs_shutdown,
	.destroy = verbs_destroy,
	.list_conns = verbs_list_conns,
	.reset_peer = verbs_reset_peer,
	.list_ports = verbs_list_ports,
	.send_message = verbs_send_message,
	.withdraw = verbs_withdraw,
	.route = verbs_route,
};

/* Everything create() built before it failed, in reverse. */
static void create_undo(struct verbs_transport *vt)
{
	for (uint32_t i = 0; i < REGION_MAX_DEVICES; i++) {
		listener_free(vt->listeners[i]);
	}
	pool_close(vt);
	/* Device handles were never run by the loop: close and forget them. */
	hca_table_close(&vt->hcas);
	uv_run(vt->daemon->loop, UV_RUN_NOWAIT);
	hca_table_free(&vt->hcas);
	verbs_cm_destroy_channel(vt->cm);
	verbs_free_devices(vt->devices);
	free(vt);
}

static void build_policy(struct verbs_transport *vt, struct conn_policy *p)
{
	const struct config *cfg = &vt->daemon->cfg;
	uint64_t max_wr = MAX_WR_BYTES;

	vt->sq_depth = SQ_DEPTH;
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		if (hca->max_msg_sz > 0) {
			max_wr = MIN(max_wr, hca->max_msg_sz);
		}
		vt->sq_depth = MIN(vt->sq_depth, (uint32_t)MAX(hca->attr.max_qp_wr, 4));
	}
	memset(p, 0, sizeof(*p));
	p->links = cfg->qps_per_peer;
	p->sq_depth = vt->sq_depth;
	p->signal_interval = cfg->signal_interval;
	p->inline_threshold = cfg->inline_threshold;
	p->batch = POST_BATCH;
	p->max_wr_bytes = max_wr;
	p->connect_timeout_ms = cfg->connect_timeout_ms;
	p->connect_retries = cfg->connect_retries;
	p->retry_backoff_ms = cfg->retry_backoff_ms;
	p->drain_timeout_ms = MAX((uint32_t)DRAIN_MIN_MS, cfg->connect_timeout_ms);
	p->peer_timeout_ms = cfg->peer_timeout_ms;
	p->idle_timeout_s = cfg->idle_timeout_s;
	p->max_connections = cfg->max_connections;
}

int transport_verbs_create(struct rdmaxd *daemon, struct transport **ret_transport)
{
	const struct config *cfg = &daemon->cfg;
	/* Under "auto" a missing device is normal: say why at info level only. */
	int prio = cfg->transport == CONFIG_TRANSPORT_VERBS ? LOG_ERR : LOG_INFO;
	struct hca_callbacks cb = {
		.send_wc = on_send_wc,
		.imm = on_imm,
		.recv = on_recv,
		.async = on_async,
		.progress = on_progress,
	};
	struct conn_policy policy;
	struct verbs_transport *vt;
	int ret;

	if ((ret = auth_init()) < 0) {
		log_err("sodium_init() failed");
		return ret;
	}
	vt = calloc(1, sizeof(*vt));
	if (!vt) {
		return -ENOMEM;
	}
	vt->base.ops = &g_verbs_ops;
	vt->base.kind = ENDPOINT_VERBS;
	vt->base.daemon = daemon;
	vt->daemon = daemon;
	list_init(&vt->passives);
	list_init(&vt->msg_wait);
	cb.ctx = vt;
	hca_table_init(&vt->hcas, daemon->loop, &cb);

	ret = verbs_get_devices(&vt->devices);
	if (ret <= 0) {
		log_msg(prio, "verbs: no RDMA device found%s%s", ret < 0 ? ": " : "",
			ret < 0 ? strerror(-ret) : "");
		free(vt);
		return ret < 0 ? ret : -ENODEV;
	}
	ret = verbs_cm_create_channel(&vt->cm);
	if (ret < 0) {
		log_msg(prio, "verbs: rdma_create_event_channel() failed: %s", strerror(-ret));
		verbs_free_devices(vt->devices);
		free(vt);
		return -ENODEV;
	}
	if ((ret = verbs_set_nonblock(vt->cm->fd)) < 0) {
		log_err("fcntl(O_NONBLOCK) on the rdma_cm channel failed: %s", strerror(-ret));
		create_undo(vt);
		return ret;
	}
	if ((ret = hmap_init(&vt->qps, 256)) < 0) {
		create_undo(vt);
		return ret;
	}
	open_listeners(vt, prio);
	if (vt->hcas.n == 0) {
		log_msg(prio, "verbs: no usable RDMA device has the listen address '%s'",
			cfg->listen_addr);
		hmap_fini(&vt->qps);
		create_undo(vt);
		return -ENODEV;
	}
	if (!is_wildcard(cfg->listen_addr) && parse_sockaddr(cfg->listen_addr, 0, &vt->src) == 0) {
		vt->bind_src = true;
	}
	if ((ret = pool_open(vt)) < 0) {
		hmap_fini(&vt->qps);
		create_undo(vt);
		return ret;
	}
	build_policy(vt, &policy);
	ret = conn_table_init(&vt->conns, &policy, &g_conn_ops, vt, daemon->instance_id,
			      daemon->auth_key, daemon->auth_key_len);
	if (ret < 0) {
		log_err("verbs: cannot set up the connection table: %s", strerror(-ret));
		hmap_fini(&vt->qps);
		create_undo(vt);
		return ret;
	}
	vt->conns_ready = true;
	struct region_hooks hooks = {.added = region_added, .removed = region_removed, .ctx = vt};
	if ((ret = region_table_add_hooks(&daemon->regions, &hooks)) < 0) {
		log_err("verbs: cannot install the region hooks: %s", strerror(-ret));
		conn_table_fini(&vt->conns);
		hmap_fini(&vt->qps);
		create_undo(vt);
		return ret;
	}
	uv_poll_init(daemon->loop, &vt->cm_poll, vt->cm->fd);
	uv_check_init(daemon->loop, &vt->check);
	uv_idle_init(daemon->loop, &vt->kick);
	uv_timer_init(daemon->loop, &vt->tick);
	vt->cm_poll.data = vt->check.data = vt->kick.data = vt->tick.data = vt;
	vt->handles = 4;
	vt->handles_open = true;
	uv_poll_start(&vt->cm_poll, UV_READABLE, on_cm);
	uv_check_start(&vt->check, on_check);
	uint64_t tick = MIN(MAX(cfg->peer_timeout_ms / 4, 10u), 1000u);
	uv_timer_start(&vt->tick, on_tick, tick, tick);

	char devs[256] = "";
	size_t used = 0;
	for (uint32_t i = 0; i < vt->hcas.n && used < sizeof(devs); i++) {
		const struct hca *hca = vt->hcas.hcas[i];
		const struct listener *l = vt->listeners[hca->index];
		int n = snprintf(devs + used, sizeof(devs) - used, "%s%s (%s port %u)",
				 i ? ", " : "", hca->name, l ? l->addr : "?", l ? l->port : 0);
		used += n > 0 ? (size_t)n : 0;
	}
	log_notice("verbs transport on %s: %u QP%s per peer, SQ %u, inline up to %u bytes, "
		   "signal every %u WRs%s",
		   devs, policy.links, policy.links == 1 ? "" : "s", policy.sq_depth,
		   policy.inline_threshold, policy.signal_interval,
		   daemon->auth_key_len ? ", authentication on" : "");
	vt->base.ordered = policy.links == 1;
	*ret_transport = &vt->base;
	return 0;
}
