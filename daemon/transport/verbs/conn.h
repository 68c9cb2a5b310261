/* SPDX-License-Identifier: MIT */
/*
 * Connections of the verbs transport, as pure logic: the connection state
 * machine (conn.c) over the send-queue planner (sq_plan.h), the private-data
 * formats of connection set-up (conn_pd.c) and message framing (conn_msg.c). Nothing here
 * calls rdma-core: every rdma_cm or verbs step goes through struct conn_ops,
 * which the transport implements with real calls and the unit tests with
 * fakes, so every transition can be driven by synthetic events.
 *
 * A connection to a peer daemon is a set of links, one RC QP each
 * (cfg qps_per_peer; one for a latency lane, which latency-class xfers take
 * when [qos] is on); xfers are spread over the links round-robin and each
 * xfer completes exactly once, through conn_table_deliver(), never from
 * inside conn_submit().
 */
#ifndef RDMAXD_CONN_H
#define RDMAXD_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "hmap.h"
#include "rdmax.h"
#include "conn_msg.h"
#include "sq_plan.h"
#include "transport.h"
#include "uid_counts.h"
#include "util.h"

#define CONN_MAX_LINKS   64
#define CONN_REQUEUE_MAX 3 /* re-submissions of one xfer after other xfers' faults */
#define CONN_NAME_MAX    64

/* ============================================================ connections */

/* Life of a connection (a set of links to one peer daemon). */
enum conn_state {
	CONN_BACKOFF,     /* waiting for the next connection attempt (the first starts at once) */
	CONN_CONNECTING,  /* links resolving and connecting; xfers wait in the pending queue */
	CONN_ESTABLISHED, /* every link is up; xfers are posted */
	CONN_DRAINING,    /* links disconnected; waiting for posted WRs to flush */
	CONN_CLOSED,      /* links destroyed; released by the next conn_table_work() */
	CONN_STATE_MAX,   /* terminator */
};

/* Life of one link (one rdma_cm id and its QP). */
enum link_state {
	LINK_IDLE,            /* no rdma_cm id */
	LINK_RESOLVING_ADDR,  /* rdma_resolve_addr() in flight */
	LINK_RESOLVING_ROUTE, /* rdma_resolve_route() in flight */
	LINK_CONNECTING,      /* QP created, connect request sent */
	LINK_UP,              /* connected: WRs may be posted */
	LINK_DRAINING,        /* QP in error: waiting for the marker's completion */
	LINK_DRAINED,         /* nothing of it in flight: to be destroyed */
	LINK_STATE_MAX,       /* terminator */
};

/* What happened to a link (rdma_cm events and local failures). */
enum conn_event {
	CONN_EV_ADDR_RESOLVED,  /* RDMA_CM_EVENT_ADDR_RESOLVED */
	CONN_EV_ROUTE_RESOLVED, /* RDMA_CM_EVENT_ROUTE_RESOLVED */
	CONN_EV_ESTABLISHED,    /* RDMA_CM_EVENT_ESTABLISHED, with the accept's private data */
	CONN_EV_REJECTED,       /* RDMA_CM_EVENT_REJECTED, with private data and status */
	CONN_EV_ADDR_ERROR,     /* RDMA_CM_EVENT_ADDR_ERROR */
	CONN_EV_ROUTE_ERROR,    /* RDMA_CM_EVENT_ROUTE_ERROR */
	CONN_EV_UNREACHABLE,    /* RDMA_CM_EVENT_UNREACHABLE */
	CONN_EV_CONNECT_ERROR,  /* RDMA_CM_EVENT_CONNECT_ERROR */
	CONN_EV_DISCONNECTED,   /* RDMA_CM_EVENT_DISCONNECTED: the QP is in error already */
	CONN_EV_DEVICE_REMOVAL, /* RDMA_CM_EVENT_DEVICE_REMOVAL: only destroy calls remain */
	CONN_EV_ADDR_CHANGE,    /* RDMA_CM_EVENT_ADDR_CHANGE */
	CONN_EV_TIMEWAIT_EXIT,  /* RDMA_CM_EVENT_TIMEWAIT_EXIT */
	CONN_EV_QP_ERROR,       /* fatal async event on the link's QP */
	CONN_EV_MAX,            /* terminator */
};

struct conn_event_data {
	const uint8_t *private_data; /* copied before the event was acked */
	size_t private_len;
	int status; /* the event's status (REJECTED: a transport reason, not an errno) */
};

struct conn;
struct conn_table;

struct conn_link {
	struct conn *conn;
	uint32_t index;
	enum link_state state;
	struct sq_plan sq;
	uint8_t request[56]; /* private data sent: the accept's proof covers it */
	void *priv;          /* the transport's (rdma_cm id, device) */
	char cause_msg[CONN_MSG_MAX];
	int cause_err;             /* error of the WR that failed first */
	struct list_node awaiting; /* struct conn_msg sent here, waiting for their answer */
	uint32_t n_awaiting;
};

struct conn {
	struct conn_table *table;
	struct list_node link; /* in table->conns until released */
	uint64_t hash;         /* key in table->by_peer, 0 when not indexed */
	enum conn_state state;
	struct endpoint peer; /* transport, addr, port of the peer daemon */
	/*
	 * Protection domains (per-uid isolation, docs/security.md): this side's
	 * QPs are in local_domain's PD (0: the device's shared PD), the peer's in
	 * remote_domain's, proved with remote_token. Part of the connection's key:
	 * one connection per (peer, local domain, remote domain, lane).
	 */
	uint32_t local_domain;
	uint32_t remote_domain;
	uint64_t remote_token;
	/*
	 * Carries only latency-class xfers (xfer.urgent, [qos] on), on one QP of
	 * its own: they never wait behind bulk WRs in a send queue, where a NIC
	 * (and rxe) works each QP's WRs in order. Part of the key too.
	 */
	bool latency_lane;
	bool lane_counted;        /* a latency lane, in table->lanes_open */
	char name[CONN_NAME_MAX]; /* "addr:port" for messages */
	uint32_t n_links;
	uint32_t links_up;
	uint32_t rr;         /* next link for round-robin */
	uint32_t attempts;   /* failed attempts since the last success */
	uint32_t attempt_id; /* random per attempt; groups the links at the peer */
	uint64_t peer_instance;
	bool has_uid; /* opened for an xfer of uid: counted in table->uid_conns until closed */
	uint32_t uid;
	bool ever_up;
	bool dirty;               /* pending xfers may be postable */
	struct list_node pending; /* xfers not yet posted (xfer->link) */
	uint32_t n_pending;       /* in both queues */
	/* Messages not yet posted: all go on links[0], so they arrive in order. */
	struct list_node msg_pending;
	uint32_t n_msg_pending;
	uint64_t bytes_sent;       /* written by completed xfers */
	uint64_t bytes_received;   /* read by completed xfers */
	uint64_t last_active_ms;   /* last post or completion */
	uint64_t last_progress_ms; /* last completion, or first post into an idle conn */
	/*
	 * Posted xfers whose job completed (conn_withdraw() -EINPROGRESS), and
	 * since when the oldest waits: without a completion on the connection
	 * for policy.withdraw_grace_ms the connection fails, so that its QPs
	 * flush them.
	 */
	uint32_t n_withdrawn;
	uint64_t withdrawn_ms;
	/*
	 * The peer's device refused one access (a region deregistered under a
	 * transfer) and so broke the connection: every other data xfer on it,
	 * flushed or never posted, goes again on a new connection (at most
	 * CONN_REQUEUE_MAX times), except those to the refused region.
	 */
	bool requeue;
	uint32_t refused_link; /* whose WR was refused */
	uint64_t refused_instance, refused_region;
	int down_err; /* error for flushed xfers once the conn fails */
	char down_msg[CONN_MSG_MAX];
	void *priv;               /* the transport's (timer) */
	struct conn_probe *probe; /* asking the peer about this conn's failure */
	struct conn_link *links;
};

/* Limits and tunables, from the configuration and the devices. */
struct conn_policy {
	uint32_t links;    /* QPs per peer */
	uint32_t sq_depth; /* send queue size of each QP */
	uint32_t signal_interval;
	uint32_t inline_threshold; /* capped by each QP's max_inline_data by the transport */
	uint32_t batch;            /* WRs per doorbell (post list) */
	uint64_t max_wr_bytes;
	uint32_t connect_timeout_ms; /* one attempt */
	uint32_t connect_retries;    /* attempts after the first */
	uint32_t retry_backoff_ms;   /* first backoff; doubles */
	uint32_t drain_timeout_ms;   /* give up waiting for flushes after this */
	uint32_t peer_timeout_ms;    /* no completion for this long with WRs out: fail */
	uint32_t withdraw_grace_ms;  /* the same, with WRs of a completed job out */
	uint32_t idle_timeout_s;     /* 0 = never */
	uint32_t max_connections;    /* outgoing conns + incoming groups */
};

/* Steps the state machine asks for. Each returns 0 or a negative error and a reason. */
struct conn_ops {
	/* Create the id and start rdma_resolve_addr() (source address bound). */
	int (*link_start)(void *ctx, struct conn_link *link, char *why, size_t why_size);
	/* Start rdma_resolve_route(). */
	int (*link_resolve_route)(void *ctx, struct conn_link *link, char *why, size_t why_size);
	/*
	 * Create the QP on the device's PD/CQ/SRQ, size link->sq, and rdma_connect()
	 * with this private data.
	 */
	int (*link_connect)(void *ctx, struct conn_link *link, const uint8_t *pd, size_t pd_len,
			    char *why, size_t why_size);
	/* Move the QP to error and tell the peer (rdma_disconnect()). */
	void (*link_disconnect)(void *ctx, struct conn_link *link);
	/*
	 * Post planned WRs in order as one post list (at most policy.batch WRs).
	 * The transport may post later, off the loop: a failure then comes back
	 * through conn_link_post_failed().
	 */
	int (*link_post)(void *ctx, struct conn_link *link, const struct wr_desc *wrs, size_t n,
			 char *why, size_t why_size);
	/*
	 * Optional, with a link_post that posts later: after it returns no WR
	 * handed to link_post reaches the device any more (those not yet posted
	 * never will). Called before the link's WRs are failed without their
	 * completions, and before link_destroy.
	 */
	void (*link_settle)(void *ctx, struct conn_link *link);
	/* Destroy QP and id; no event of the link follows. */
	void (*link_destroy)(void *ctx, struct conn_link *link);
	/* (Re)start the connection's timer; ms 0 fires on the next loop turn. */
	void (*timer_start)(void *ctx, struct conn *conn, uint64_t ms);
	void (*timer_stop)(void *ctx, struct conn *conn);
	/* Ask for conn_table_work() soon (from the loop, never from here). */
	void (*kick)(void *ctx);
	/* The connection is gone; free it with conn_free() when its handles closed. */
	void (*release)(void *ctx, struct conn *conn);
	/*
	 * Optional: send probe->request to probe->peer in a connect request without a
	 * QP, then call conn_probe_answer() with the reject's private data.
	 */
	int (*probe_start)(void *ctx, struct conn_probe *probe, char *why, size_t why_size);
	/* Destroy what probe_start() created; no answer follows. */
	void (*probe_destroy)(void *ctx, struct conn_probe *probe);
};

/*
 * Asking the owner why its NIC refused an access: a connect request without a
 * QP, carrying the xfer's region, key, range and access, that the owner always
 * rejects with its verdict (region_get_remote()) as private data.
 */
struct conn_probe {
	struct conn_table *table;
	struct list_node link; /* in table->probes */
	struct xfer *xfer;     /* held until the verdict (or the fallback) */
	struct endpoint peer;
	char name[CONN_NAME_MAX];
	uint32_t remote_domain; /* the connection's protection domain at the owner */
	int fallback_err;       /* the NIC's verdict, used when the owner cannot say */
	char fallback_msg[CONN_MSG_MAX];
	uint8_t request[56]; /* the query's private data */
	uint64_t deadline_ms;
	void *priv;        /* the transport's (rdma_cm id) */
	struct conn *conn; /* whose failure it explains; NULL once released */
	/*
	 * Xfers the same failure flushed: finished after the probed one, so that a
	 * job's first error is the verdict and not the flush it caused.
	 */
	struct list_node followers;
	int follower_err;
	char follower_msg[CONN_MSG_MAX];
};

struct conn_result {
	struct xfer *xfer;
	bool requeue;          /* submitted again when delivered; done (err) only when that fails */
	uint32_t local_domain; /* requeue: the local protection domain it is submitted in */
	int err;
	char message[CONN_MSG_MAX];
};

struct conn_table {
	struct conn_policy policy;
	const struct conn_ops *ops;
	void *ctx;
	uint64_t instance;  /* this daemon start */
	const uint8_t *key; /* shared key, NULL when authentication is off */
	size_t key_len;
	struct list_node conns;  /* outgoing connections not yet released */
	struct list_node probes; /* struct conn_probe waiting for a verdict */
	struct hmap by_peer;     /* peer hash -> conn (those that take new xfers) */
	uint32_t n_conns;
	struct uid_counts *uid_conns;   /* per-uid outgoing connections; NULL: not counted */
	const uint32_t *uid_conn_limit; /* their limit, read at each new connection (reloads) */
	uint32_t n_groups;              /* incoming connections (link groups) */
	struct hmap groups;             /* group key -> count of live incoming links */
	struct hmap replay;             /* MAC prefix -> expiry (ms) of seen connect requests */
	struct hmap msgs;         /* message id -> struct conn_msg an answer may still finish */
	uint64_t outstanding_wrs; /* posted and not retired, all links */
	uint32_t lanes_open;      /* latency lanes from their first attempt until closed */
	uint64_t lane_used_ms;    /* when one of them last started an attempt or took an xfer */
	bool dirty;
	bool shut;
	struct conn_result *results; /* finished xfers not yet delivered */
	size_t n_results;
	size_t cap_results;
	bool delivering;
	uint64_t now_ms;       /* of the last work or completion (for re-submissions) */
	struct wr_desc *wrbuf; /* policy.sq_depth entries */
};

int conn_table_init(struct conn_table *table, const struct conn_policy *policy,
		    const struct conn_ops *ops, void *ctx, uint64_t instance, const uint8_t *key,
		    size_t key_len);
void conn_table_fini(struct conn_table *table);

/*
 * Queue an xfer for its peer (xfer->peer), connecting first when needed.
 * Returns 0 (done follows later, exactly once) or RDMAX_E_CANCELLED (shut
 * down), RDMAX_E_RESOURCE_EXHAUSTED (connection limit), -ENOMEM,
 * RDMAX_E_INVALID_ARGUMENT (an xfer no send queue can hold).
 */
int conn_submit(struct conn_table *table, struct xfer *xfer, uint64_t now_ms);

/*
 * conn_submit() on the connection whose QPs are in local_domain's PD here
 * and in the domain the xfer's endpoint names (peer.domain, peer.domain_token)
 * at the peer; conn_submit() is local domain 0. Messages always take the
 * connection of domains 0 and 0.
 */
int conn_submit_domain(struct conn_table *table, struct xfer *xfer, uint32_t local_domain,
		       uint64_t now_ms);

/*
 * The xfer's job completed. Queued by conn_submit() and not yet posted: taken
 * back, 0, and done never runs for it. Posted (the NIC holds its WRs):
 * -EINPROGRESS; done runs once every WR of it completed or flushed, and when
 * the connection sees no completion for policy.withdraw_grace_ms meanwhile,
 * it fails (its QPs go to error and flush). -EBUSY when it is finishing
 * already (done follows as usual).
 */
int conn_withdraw(struct conn_table *table, struct xfer *xfer, uint64_t now_ms);

/* Finish an xfer that never reached a connection; done runs from conn_table_deliver(). */
void conn_table_finish(struct conn_table *table, struct xfer *xfer, int err, const char *message);

/* Wall-clock milliseconds, as carried in connect requests. */
uint64_t conn_realtime_ms(void);

/* Post what can be posted, deliver finished xfers, release closed connections. */
void conn_table_work(struct conn_table *table, uint64_t now_ms);

/* Run the done callbacks of finished xfers (re-entrant calls return at once). */
void conn_table_deliver(struct conn_table *table);

/* An rdma_cm event (or local failure) of a link. */
void conn_link_event(struct conn_link *link, enum conn_event event,
		     const struct conn_event_data *data, uint64_t now_ms);

/*
 * A send completion of the link: wr_id seq, wc_status 0 for success or an
 * ibv_wc_status value.
 */
void conn_link_wc(struct conn_link *link, uint64_t seq, int wc_status, uint32_t vendor_err,
		  uint64_t now_ms);

/*
 * A post list handed to link_post earlier failed (why says how). marker: it
 * was the drain marker, so nothing will end the link's drain but this.
 */
void conn_link_post_failed(struct conn_link *link, bool marker, const char *why);

/* The connection's timer fired. */
void conn_timer_fired(struct conn *conn, uint64_t now_ms);

/* Idle eviction and the no-progress watchdog; call about once a second. */
void conn_table_tick(struct conn_table *table, uint64_t now_ms);

/* Close a connection; its xfers fail with err / message. */
void conn_close(struct conn *conn, int err, const char *message);

/*
 * WRs posted on a connection and not yet retired, plus messages waiting for
 * their answer (both keep the no-progress watchdog running).
 */
uint32_t conn_outstanding(const struct conn *conn);

/* Fail everything with RDMAX_E_CANCELLED and close every connection. */
void conn_table_shutdown(struct conn_table *table);

/* True when no connection is left (after shutdown: safe to free the devices). */
bool conn_table_idle(const struct conn_table *table);

/*
 * The owner's answer to a probe (the private data of its reject), or NULL
 * when none came (error event, timeout): the xfer finishes with the owner's
 * verdict or, failing that, the NIC's. The probe is freed.
 */
void conn_probe_answer(struct conn_probe *probe, const uint8_t *pd, size_t len);

/* Free a released connection. */
void conn_free(struct conn *conn);

const char *conn_state_name(enum conn_state state);
const char *link_state_name(enum link_state state);
const char *conn_event_name(enum conn_event event);

/*
 * The one mapping from a work completion status to a job error, with a
 * message naming the verbs status, the operation and the peer.
 * \return 0 for IBV_WC_SUCCESS, else an RDMAX_E_* code
 */
int conn_wc_error(int wc_status, uint32_t vendor_err, enum xfer_op op, const char *peer,
		  char *message, size_t message_size);

/* ========================================================== private data */

#define CONN_PD_MAGIC   0x31445852u /* "RXD1" little-endian */
#define CONN_PD_VERSION 1
#define CONN_PD_REQ_LEN 56 /* the connect request's private data limit */
#define CONN_PD_MAC_LEN 16 /* truncated HMAC-SHA256 in requests */
/* Requests older or newer than this (by the sender's clock) are refused. */
#define CONN_AUTH_WINDOW_MS 300000

/* Kinds of private data. */
enum conn_pd_type {
	CONN_PD_CONNECT = 1, /* connect request of one link */
	CONN_PD_ACCEPT = 2,  /* the accepting daemon's instance (and proof) */
	CONN_PD_REJECT = 3,  /* application reject with a reason */
	CONN_PD_QUERY = 4,   /* probe: why did your NIC refuse this access? */
	CONN_PD_VERDICT = 5, /* the owner's answer to a probe (in a reject) */
	CONN_PD_TYPE_MAX,    /* terminator */
};

/* Why a daemon refused a connection (in the reject's private data). */
enum conn_reject_reason {
	CONN_REJ_NONE,          /* not a reject */
	CONN_REJ_AUTH_REQUIRED, /* this daemon requires the shared key */
	CONN_REJ_AUTH_FAILED,   /* the proof is wrong: a different key */
	CONN_REJ_AUTH_UNUSED,   /* the requester sent a proof, this daemon has no key */
	CONN_REJ_CLOCK,         /* the request's time is outside the window */
	CONN_REJ_REPLAY,        /* the request was seen before */
	CONN_REJ_VERSION,       /* unknown magic or version */
	CONN_REJ_LIMIT,         /* max_connections reached */
	CONN_REJ_RESOURCES,     /* no QP or CQ space on the device */
	CONN_REJ_SHUTDOWN,      /* the daemon is shutting down */
	CONN_REJ_DOMAIN,        /* the request does not prove the protection domain's token */
	CONN_REJ_DOMAIN_GONE,   /* no such protection domain (any more): its regions are gone */
	CONN_REJ_MAX,           /* terminator */
};

/* A checked connect request. */
struct conn_request {
	uint8_t link_index;
	uint8_t n_links;
	uint32_t group;    /* attempt id of the requester */
	uint64_t instance; /* requester's daemon start */
	uint64_t time_ms;
	bool has_mac;
	uint32_t domain; /* protection domain asked for (0: the shared one) */
};

/*
 * The transcript both proofs of a connect request cover: the request, the
 * address and port the requester dialled, and the accepting daemon's
 * instance, so a request cannot be replayed to another daemon.
 */
struct auth_transcript;
void conn_pd_transcript(struct auth_transcript *tr, const uint8_t *req,
			const uint8_t server_addr[16], uint16_t server_port,
			uint64_t server_instance);

/* The 16-byte (IPv4-mapped) address and port of a sockaddr; -EAFNOSUPPORT otherwise. */
int conn_addr_bytes(const struct sockaddr *sa, uint8_t ret_addr[16], uint16_t *ret_port);
/* Same from a numeric address string. */
int conn_addr_parse(const char *addr, uint8_t ret_addr[16]);

/*
 * Encode a connect request for the daemon at server_addr:server_port.
 * \param key NULL/0: no proof
 * \return CONN_PD_REQ_LEN
 */
int conn_pd_connect(uint8_t *buf, uint8_t link_index, uint8_t n_links, uint32_t group,
		    uint64_t instance, uint64_t time_ms, const uint8_t *key, size_t key_len,
		    const uint8_t server_addr[16], uint16_t server_port, uint32_t domain,
		    uint64_t domain_token);

/*
 * Whether a checked connect request asking for a protection domain
 * (conn_request.domain) proves the domain's token: its nonce must be
 * conn_pd_domain_proof() over the request's first 32 bytes. Constant time.
 */
bool conn_pd_domain_ok(const uint8_t *pd, size_t len, uint64_t domain_token);

/* The 8-byte proof of domain_token over a request's first 32 bytes. */
void conn_pd_domain_proof(const uint8_t *req, uint64_t domain_token, uint8_t ret_proof[8]);

/*
 * Check a connect request at the accepting side before any QP exists:
 * magic, version, proof (when this daemon has a key), clock window, replay.
 * \return 0, or the reject reason (> 0)
 */
enum conn_reject_reason conn_pd_check(struct conn_table *table, const uint8_t *pd, size_t len,
				      const uint8_t server_addr[16], uint16_t server_port,
				      uint64_t now_real_ms, struct conn_request *ret_req);

/*
 * The accept's private data: this daemon's instance and, with a key, its
 * proof over the request.
 */
int conn_pd_accept(uint8_t *buf, size_t size, const struct conn_table *table,
		   const uint8_t *request, const uint8_t server_addr[16], uint16_t server_port);

/* A reject's private data naming the reason. */
int conn_pd_reject(uint8_t *buf, size_t size, enum conn_reject_reason reason);

/*
 * The reject of a request whose protection domain is gone or not proven
 * (reason CONN_REJ_DOMAIN_GONE or CONN_REJ_DOMAIN), with the refusing
 * daemon's instance: a descriptor of an earlier start of that daemon then
 * fails as stale (NOT_FOUND), as it would once connected.
 */
int conn_pd_reject_domain(uint8_t *buf, size_t size, enum conn_reject_reason reason,
			  uint64_t instance);
/* The instance in such a reject, 0 when there is none. */
uint64_t conn_pd_reject_instance(const uint8_t *pd, size_t len);
const char *conn_reject_reason_str(enum conn_reject_reason reason);

/* A checked probe query. */
struct conn_query {
	uint32_t access; /* RDMAX_ACCESS_REMOTE_READ or _WRITE */
	uint64_t region_id;
	uint64_t region_key;
	uint64_t offset;
	uint64_t length;
};

/* The kind of private data (enum conn_pd_type), 0 when it is not ours. */
int conn_pd_type(const uint8_t *pd, size_t len);

/* Encode a probe query for the daemon at server_addr:server_port (CONN_PD_REQ_LEN bytes). */
int conn_pd_query(uint8_t *buf, const struct conn_query *query, const uint8_t *key, size_t key_len,
		  const uint8_t server_addr[16], uint16_t server_port);

/* Check a probe query at the owner (proof when it has a key); 0 or the reject reason. */
enum conn_reject_reason conn_pd_check_query(const struct conn_table *table, const uint8_t *pd,
					    size_t len, const uint8_t server_addr[16],
					    uint16_t server_port, struct conn_query *ret_query);

/* The owner's verdict: 0 or the RDMAX_E_* of region_get_remote(). */
int conn_pd_verdict(uint8_t *buf, size_t size, int verdict);

/* Incoming link groups for the connection limit. */
int conn_table_group_add(struct conn_table *table, uint64_t instance, uint32_t group);
void conn_table_group_del(struct conn_table *table, uint64_t instance, uint32_t group);

/* ============================================================== messages */

/*
 * A message as the connection carries it: the transport stages its frames
 * and fills xfer (peer, remote_instance, length = body bytes, payload = the
 * staging, wire_id = a unique id, done); done runs once, with the peer's
 * answer or the failure that prevented it.
 */
struct conn_msg {
	struct xfer xfer;
	struct conn_link *link; /* the link its frames went out on */
	struct list_node node;  /* in link->awaiting while sent and unanswered */
	bool registered;        /* in table->msgs: an answer may still finish it */
	bool sent;              /* every frame completed */
	bool awaiting;          /* on link->awaiting */
	bool answered;          /* the answer came before the frames' completion */
	int status;
	char text[CONN_MSG_MAX];
};

/* Queue a message like conn_submit() queues an xfer (same contract and errors). */
int conn_submit_message(struct conn_table *table, struct conn_msg *msg, uint64_t now_ms);

/*
 * An answer frame arrived on link: completes its message when the message
 * went out on that link (anything else is ignored).
 */
void conn_link_answer(struct conn_link *link, const struct conn_frame *answer, uint64_t now_ms);

#endif
