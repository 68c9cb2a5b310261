/* SPDX-License-Identifier: MIT */
/*
 * Private to daemon/transport/verbs/: the verbs transport's object and the
 * types and functions its files (transport_verbs.c, verbs_link.c,
 * verbs_accept.c, verbs_listen.c, verbs_completions.c, verbs_msg.c) share.
 * Nothing outside this folder includes it; the transport's public face is
 * transport_verbs_create() in transport.h.
 */
#ifndef RDMAXD_TRANSPORT_VERBS_INTERNAL_H
#define RDMAXD_TRANSPORT_VERBS_INTERNAL_H

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
#include "post_thread.h"
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
/*
 * Work requests of a completed job get this long without a completion on
 * their connection before its QPs go to error (a few ACK timeouts: a peer
 * that lost packets gets its retransmissions).
 */
#define WITHDRAW_GRACE_MS 1500
/* The region key picks the high bits of a region's iova (see vt_region_iova()). */
#define IOVA_KEY_SHIFT 41
#define MSG_SLOTS      16   /* messages staged at once; more wait for a slot */
#define PASSIVE_SQ     16   /* answers in flight on one accepted QP */
#define ANSWER_SLOT    2048 /* staging of one answer (a lookup's carries a descriptor) */
#define ANSWERS_MAX    1024 /* answers one accepted QP may have waiting for its send queue */

/*
 * A zero-length WRITE_WITH_IMM is not checked against any rkey by the NIC
 * (nothing is written), so a barrier's imm travels as a message to this
 * reserved name instead: the region it names is checked by the owner (verbs_accept.c), as the TCP
 * transport checks it, before the imm is counted. The space makes it a name
 * no client can open.
 */
#define IMM_MAILBOX    " imm"
#define IMM_RECORD_LEN 28 /* instance, region id, key (u64 each), imm (u32), little-endian */

_Static_assert(CONN_FRAME_MAX <= HCA_RECV_BYTES, "a frame must fit one receive buffer");
_Static_assert(CONN_ANSWER_DATA_FRAME_MAX <= ANSWER_SLOT, "an answer must fit its staging slot");
_Static_assert(CONN_MSG_FRAMES_MAX + 1 < SQ_DEPTH, "a message must fit a send queue");

/* A local uid's protection domains ([verbs] isolation = per-uid; verbs_domain.c). */
struct vt_domain {
	uint32_t number; /* in descriptors and connect requests; 1..DESC_DOMAIN_MAX */
	uint32_t uid;
	uint64_t token; /* secret of the domain's descriptors; proves a connect request */
	struct ibv_pd *pd[REGION_MAX_DEVICES]; /* by device index; allocated on first use */
	uint32_t refs;                         /* regions registered in it, QPs created in it */
};

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
	bool indexed;             /* in vt->qps */
	struct vt_domain *domain; /* held while its QP exists; NULL: the shared PD */
	struct post_qp post;      /* its share of vt->poster */
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
	struct vt_domain *domain; /* the QP's PD when the requester proved one; held */
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
	/* Per-uid isolation (verbs_domain.c); per_uid false: no domains, every PD shared. */
	bool per_uid;
	struct hmap domains_by_uid;    /* uid + 1 -> struct vt_domain */
	struct hmap domains_by_number; /* number -> struct vt_domain */
	uint32_t n_domains;
	uint32_t next_domain;
	struct list_node passives;
	uint32_t sq_depth;
	bool bind_src;
	struct sockaddr_storage src;
	bool shut;
	struct log_ratelimit rl;
	struct ibv_send_wr wrs[SQ_DEPTH];
	struct ibv_sge sges[SQ_DEPTH];
	/*
	 * Bulk post lists off the loop (post_thread.h): started on first use,
	 * used on software devices while a latency lane is open, or always
	 * (RDMAXD_TEST_VERBS_POST_THREAD=1, for the tests).
	 */
	struct post_thread *poster;
	bool post_thread_always;
	bool poster_unavailable; /* it could not be started: the loop posts */
	/* SEND messages: staging registered (local access only) on every device. */
	uint8_t *pool;
	struct ibv_mr *pool_mr[REGION_MAX_DEVICES];
	struct msg_slot slots[MSG_SLOTS];
	uint32_t free_slots[MSG_SLOTS];
	uint32_t n_free_slots;
	struct list_node msg_wait;   /* engine xfers waiting for a slot (xfer->link) */
	struct list_node imm_writes; /* struct imm_write whose write is not done */
	uint64_t next_msg_id;
	char from[CONN_FROM_MAX + 1]; /* this node's name as frames carry it */
};

/* An rdma_cm event, copied before it is acked. */
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

/* transport_verbs.c */
uint64_t vt_region_iova(const struct region *region);
bool vt_is_wildcard(const char *addr);
int vt_parse_sockaddr(const char *addr, uint16_t port, struct sockaddr_storage *ret_ss);
void vt_format_sockaddr(const struct sockaddr *sa, char *buf, size_t size);
struct sockaddr *vt_source_addr(const struct verbs_transport *vt,
				const struct sockaddr_storage *dst, struct sockaddr_storage *buf);
void vt_index_qp(struct verbs_transport *vt, uint32_t qp_num, struct cm_obj *obj, bool *indexed);
void vt_unindex_qp(struct verbs_transport *vt, uint32_t qp_num, bool *indexed);

/* verbs_link.c */
extern const struct conn_ops vt_conn_ops;
uint8_t vt_rd_atom(int v);
void vt_kick(void *ctx);
/* Stop the posting thread, if one runs (every link destroyed); counts as a handle. */
void vt_poster_stop(struct verbs_transport *vt);

/* verbs_accept.c */
void vt_on_probe_event(struct probe_ctx *pc, const struct cm_copy *ev);
void vt_passive_close(struct passive *p, bool disconnect, const char *why);
void vt_on_connect_request(struct verbs_transport *vt, struct listener *l,
			   const struct cm_copy *ev);
void vt_on_passive_event(struct passive *p, const struct cm_copy *ev);
void vt_passive_recv(struct passive *p, const uint8_t *buf, uint32_t len);
void vt_passive_send_wc(struct passive *p, const struct ibv_wc *wc);

/* verbs_listen.c */
void vt_listener_free(struct listener *l);
void vt_open_listeners(struct verbs_transport *vt, int prio);
void vt_on_cm(uv_poll_t *handle, int status, int events);

/* verbs_completions.c */
void vt_progress(struct verbs_transport *vt);
void vt_on_send_wc(void *ctx, struct hca *hca, const struct ibv_wc *wc);
void vt_on_imm(void *ctx, struct hca *hca, uint32_t imm);
void vt_on_recv(void *ctx, struct hca *hca, uint32_t qp_num, const uint8_t *buf, uint32_t len);
void vt_on_async(void *ctx, struct hca *hca, enum ibv_event_type type, uint32_t qp_num);
void vt_on_progress(void *ctx);
void vt_on_check(uv_check_t *check);
int vt_poll(struct transport *transport);
void vt_on_tick(uv_timer_t *timer);

/* verbs_msg.c */
int vt_send_message(struct transport *transport, struct xfer *xfer);
int vt_pool_open(struct verbs_transport *vt);
void vt_pool_close(struct verbs_transport *vt);

/* verbs_domain.c */
int vt_domains_init(struct verbs_transport *vt);
void vt_domains_fini(struct verbs_transport *vt);
/* The live domain with this number, or NULL (also for 0). */
struct vt_domain *vt_domain_find(struct verbs_transport *vt, uint32_t number);
/* The uid's domain, NULL when it has none or isolation is shared. */
struct vt_domain *vt_domain_of_uid(struct verbs_transport *vt, uint32_t uid);
/* Hold the uid's domain, creating it (RDMAX_E_RESOURCE_EXHAUSTED past the limit). */
int vt_domain_hold_uid(struct verbs_transport *vt, uint32_t uid, struct vt_domain **ret_dom);
void vt_domain_hold(struct vt_domain *dom);
/* Drop a hold; the last one frees the domain's PDs. NULL is fine. */
void vt_domain_put(struct verbs_transport *vt, struct vt_domain *dom);
/* The domain's PD on hca, allocated on first use; dom NULL: the device's shared PD. */
int vt_domain_pd(struct vt_domain *dom, struct hca *hca, struct ibv_pd **ret_pd);
/* The domain whose PD holds the region's MR on hca, or NULL (the shared PD). */
struct vt_domain *vt_region_domain(struct verbs_transport *vt, const struct region *region,
				   const struct hca *hca);

#endif /* RDMAXD_TRANSPORT_VERBS_INTERNAL_H */
