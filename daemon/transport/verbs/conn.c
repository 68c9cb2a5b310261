/* SPDX-License-Identifier: MIT */
/*
 * Connections of the verbs transport as pure logic: the per-peer state
 * machine (attempts, backoff, links, drain) driving the send-queue planner
 * (sq_plan.c), the private data of connection set-up (conn_pd.c) and the
 * framing of mailbox messages (conn_msg.c). It owns the exactly-once rule for xfers:
 * an xfer leaves either through a retired send-queue slot or through the
 * pending queue, and every finish goes through the table's result list, which
 * only conn_table_deliver() empties. It never calls rdma-core or libuv: every
 * such step is a struct conn_ops call, so unit tests drive it with fakes.
 * What a link's rdma_cm events do is in conn_events.c (conn_internal.h holds
 * the steps both files take).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "conn.h"
#include "log.h"
#include "verbs.h"
#include "conn_internal.h"

/* ================================================================ helpers */

/* A message rides in an xfer with a non-zero wire id (conn_submit() clears it). */
static struct conn_msg *as_msg(struct xfer *xfer)
{
	return xfer->wire_id ? container_of(xfer, struct conn_msg, xfer) : NULL;
}

/* ============================================================ names */

/* ============================================================ results */

static void finish(struct conn_table *t, struct xfer *xfer, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* A message leaves the books: no answer can finish it any more. */
static void msg_detach(struct conn_table *t, struct xfer *xfer)
{
	struct conn_msg *msg = as_msg(xfer);

	if (!msg) {
		return;
	}
	if (msg->registered) {
		hmap_del(&t->msgs, xfer->wire_id);
		msg->registered = false;
	}
	if (msg->awaiting) {
		list_del(&msg->node);
		msg->awaiting = false;
		msg->link->n_awaiting--;
	}
}

/* Record an xfer's outcome; its done runs from conn_table_deliver(). */
static void finish(struct conn_table *t, struct xfer *xfer, int err, const char *fmt, ...)
{
	struct conn_result *r;

	msg_detach(t, xfer);
	if (t->n_results == t->cap_results) {
		size_t cap = t->cap_results ? t->cap_results * 2 : 64;
		struct conn_result *grown = realloc(t->results, cap * sizeof(*grown));
		if (!grown) {
			/* Losing a completion would hang a job forever; an early call is safer. */
			log_err("out of memory queueing a completion; completing it at once");
			xfer->done(xfer, err, err ? "out of memory" : NULL);
			return;
		}
		t->results = grown;
		t->cap_results = cap;
	}
	r = &t->results[t->n_results++];
	r->xfer = xfer;
	r->requeue = false;
	r->local_domain = 0;
	r->err = err;
	r->message[0] = '\0';
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->message, sizeof(r->message), fmt, ap);
		va_end(ap);
	}
	if (err == 0) {
		xfer->bytes_done = xfer->length;
	}
	t->ops->kick(t->ctx);
}

void conn_table_finish(struct conn_table *t, struct xfer *xfer, int err, const char *message)
{
	finish(t, xfer, err, "%s", message ? message : "");
}

uint64_t conn_realtime_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int submit(struct conn_table *t, struct xfer *xfer, uint32_t local_domain, uint64_t now);

void conn_table_deliver(struct conn_table *t)
{
	struct conn_result r;

	if (t->delivering) {
		return;
	}
	t->delivering = true;
	/* done may submit, and so finish, again: new results land behind the cursor. */
	for (size_t i = 0; i < t->n_results; i++) {
		r = t->results[i];
		if (r.requeue && !t->shut &&
		    (as_msg(r.xfer) ? conn_submit_message(t, as_msg(r.xfer), t->now_ms)
				    : submit(t, r.xfer, r.local_domain, t->now_ms)) == 0) {
			continue; /* on a new connection; done follows from there */
		}
		r.xfer->done(r.xfer, r.err, r.err ? r.message : NULL);
	}
	t->n_results = 0;
	t->delivering = false;
}

/* ============================================================ connections */

static const struct conn_policy *policy(const struct conn *conn)
{
	return &conn->table->policy;
}

static void mark_dirty(struct conn *conn)
{
	conn->dirty = true;
	conn->table->dirty = true;
	conn->table->ops->kick(conn->table->ctx);
}

/*
 * Which connection an xfer takes: the peer daemon, the domains on both sides,
 * and the lane (a latency-class xfer takes a connection of its own).
 */
struct conn_key {
	const struct endpoint *peer;
	uint32_t local_domain;
	uint32_t remote_domain;
	uint64_t remote_token;
	bool latency_lane;
};

static uint64_t peer_hash(const struct conn_key *k)
{
	uint64_t h = 1469598103934665603ull;

	for (const char *p = k->peer->addr; *p; p++) {
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	}
	h = (h ^ k->peer->port) * 1099511628211ull;
	h = (h ^ k->local_domain) * 1099511628211ull;
	h = (h ^ k->remote_domain) * 1099511628211ull;
	h = (h ^ (k->latency_lane ? 1u : 0u)) * 1099511628211ull;
	return h == 0 || h == UINT64_MAX ? 1 : h;
}

static void unindex(struct conn *conn)
{
	if (conn->hash) {
		hmap_del(&conn->table->by_peer, conn->hash);
		conn->hash = 0;
	}
}

static void start_probe(struct conn *conn, struct conn_link *link, struct xfer *xfer);

/*
 * A data xfer that failed only because another one's refused access broke the
 * connection goes again on a new connection (a WRITE or READ of the same bytes
 * to the same place: landing twice changes nothing). A message only when it
 * certainly never reached the peer (`unsent`). True when it is queued for
 * that; its done then runs only if the new submission fails.
 */
static bool requeue_collateral(struct conn *conn, struct xfer *xfer, bool unsent)
{
	struct conn_table *t = conn->table;
	size_t n = t->n_results;

	if (!conn->requeue || t->shut || (as_msg(xfer) && !unsent) ||
	    xfer->requeues >= CONN_REQUEUE_MAX ||
	    (xfer->remote_instance == conn->refused_instance &&
	     xfer->remote_region == conn->refused_region)) {
		return false;
	}
	xfer->requeues++;
	finish(t, xfer, conn->down_err ? conn->down_err : RDMAX_E_TRANSPORT_ERROR, "%s",
	       conn->down_msg[0] ? conn->down_msg : "connection failed");
	if (t->n_results > n) {
		t->results[n].requeue = true;
		t->results[n].local_domain = conn->local_domain;
	}
	return true;
}

/* An xfer that failed only because its connection did. */
static void collateral(struct conn *conn, struct xfer *xfer)
{
	int err = conn->down_err ? conn->down_err : RDMAX_E_TRANSPORT_ERROR;
	const char *msg = conn->down_msg[0] ? conn->down_msg : "connection failed";

	msg_detach(conn->table, xfer);
	if (conn->probe) {
		if (list_empty(&conn->probe->followers)) {
			conn->probe->follower_err = err;
			snprintf(conn->probe->follower_msg, sizeof(conn->probe->follower_msg), "%s",
				 msg);
		}
		list_add_tail(&conn->probe->followers, &xfer->link);
		return;
	}
	finish(conn->table, xfer, err, "%s", msg);
}

/* Every frame of a message retired: it waits for its answer unless that came first. */
static void msg_retired(struct conn_link *link, struct conn_msg *msg, enum sq_outcome outcome)
{
	struct conn *conn = link->conn;

	if (outcome == SQ_OK) {
		conn->bytes_sent += msg->xfer.length;
	}
	if (msg->answered) {
		/* The peer delivered it, whatever our completion says. */
		finish(conn->table, &msg->xfer, msg->status, "%s", msg->text);
		return;
	}
	switch (outcome) {
	case SQ_OK:
		msg->sent = true;
		msg->link = link;
		msg->awaiting = true;
		list_add_tail(&link->awaiting, &msg->node);
		link->n_awaiting++;
		break;
	case SQ_FAILED_CAUSE:
		finish(conn->table, &msg->xfer, link->cause_err, "%s", link->cause_msg);
		break;
	default:
		/*
		 * Behind the refused WR on its own QP, a one-frame message never
		 * reached the peer (RC stops at the refusal): it may go again.
		 */
		if (!(link->index == conn->refused_link && conn_msg_frames(msg->xfer.length) == 1 &&
		      requeue_collateral(conn, &msg->xfer, true))) {
			collateral(conn, &msg->xfer);
		}
		break;
	}
}

/* A withdrawn xfer left the send queue: the grace is over for it. True when it was withdrawn. */
static bool withdrawn_retired(struct conn *conn, struct xfer *xfer)
{
	if (!xfer->withdrawn) {
		return false;
	}
	xfer->withdrawn = false;
	conn->n_withdrawn--;
	if (conn->n_withdrawn == 0 && conn->state == CONN_ESTABLISHED) {
		conn->table->ops->timer_stop(conn->table->ctx, conn);
	}
	return true;
}

void conn_on_retire(void *arg, struct xfer *xfer, enum sq_outcome outcome)
{
	struct conn_link *link = arg;
	struct conn *conn = link->conn;
	struct conn_msg *msg = as_msg(xfer);
	bool withdrawn = withdrawn_retired(conn, xfer);

	if (msg) {
		msg_retired(link, msg, outcome);
		return;
	}
	switch (outcome) {
	case SQ_OK:
		if (xfer->op == XFER_READ) {
			conn->bytes_received += xfer->length;
		} else {
			conn->bytes_sent += xfer->length;
		}
		finish(conn->table, xfer, 0, NULL);
		break;
	case SQ_FAILED_CAUSE:
		/* The NIC cannot say why; the owner can: bounds, key, access, deregistration. */
		if (link->cause_err == RDMAX_E_REMOTE_ACCESS && conn->table->ops->probe_start &&
		    !conn->table->shut && !conn->probe && !withdrawn) {
			start_probe(conn, link, xfer);
		} else if (link->cause_err == RDMAX_E_REMOTE_ACCESS && conn->probe && !withdrawn) {
			/*
			 * Another link refused one too while the first refusal is asked
			 * about (most likely the same region): it waits for that verdict.
			 */
			collateral(conn, xfer);
		} else {
			finish(conn->table, xfer, link->cause_err, "%s", link->cause_msg);
		}
		break;
	default:
		if (!withdrawn && requeue_collateral(conn, xfer, false)) {
			break;
		}
		collateral(conn, xfer);
		break;
	}
}

void conn_retired(struct conn *conn, uint32_t n)
{
	struct conn_table *t = conn->table;

	t->outstanding_wrs -= MIN((uint64_t)n, t->outstanding_wrs);
}

void conn_link_fail_all(struct conn *conn, struct conn_link *link)
{
	struct conn_table *t = conn->table;

	/* Failed means final: no WR of theirs may reach the device afterwards. */
	if (t->ops->link_settle) {
		t->ops->link_settle(t->ctx, link);
	}
	conn_retired(conn, sq_plan_fail_all(&link->sq, conn_on_retire, link));
}

uint32_t conn_outstanding(const struct conn *conn)
{
	uint32_t out = 0;

	for (uint32_t i = 0; i < conn->n_links; i++) {
		if (conn->links[i].sq.ring) {
			out += sq_plan_outstanding(&conn->links[i].sq);
		}
		out += conn->links[i].n_awaiting;
	}
	return out;
}

static void fail_queue(struct conn *conn, struct list_node *queue, uint32_t *count, int err,
		       const char *message)
{
	while (!list_empty(queue)) {
		struct xfer *xfer = container_of(queue->next, struct xfer, link);
		list_del(&xfer->link);
		conn->n_pending--;
		if (count) {
			(*count)--;
		}
		if (requeue_collateral(conn, xfer, true)) {
			continue;
		}
		if (conn->probe) {
			collateral(conn, xfer);
		} else {
			finish(conn->table, xfer, err, "%s", message);
		}
	}
}

/* The link whose send queue holds WRs of xfer, or NULL. */
static struct conn_link *posted_on(struct conn *conn, const struct xfer *xfer)
{
	for (uint32_t i = 0; i < conn->n_links; i++) {
		struct sq_plan *sq = &conn->links[i].sq;
		if (!sq->ring) {
			continue;
		}
		for (uint64_t seq = sq->done_seq; seq < sq->next_seq; seq++) {
			if (sq->ring[seq % sq->depth].xfer == xfer) {
				return &conn->links[i];
			}
		}
	}
	return NULL;
}

/* When a connection with withdrawn xfers out gives up on them. */
static uint64_t withdraw_deadline(const struct conn *conn)
{
	return MAX(conn->withdrawn_ms, conn->last_progress_ms) + policy(conn)->withdraw_grace_ms;
}

int conn_withdraw(struct conn_table *table, struct xfer *xfer, uint64_t now)
{
	for (size_t i = 0; i < table->n_results; i++) {
		if (table->results[i].xfer == xfer && table->results[i].requeue) {
			/* About to go again: it does not, and its done follows instead. */
			table->results[i].requeue = false;
			return -EINPROGRESS;
		}
	}
	for (struct list_node *c = table->conns.next; c != &table->conns; c = c->next) {
		struct conn *conn = container_of(c, struct conn, link);
		for (struct list_node *p = conn->pending.next; p != &conn->pending; p = p->next) {
			if (p == &xfer->link) {
				list_del(&xfer->link);
				conn->n_pending--;
				return 0;
			}
		}
		if (xfer->withdrawn || !posted_on(conn, xfer)) {
			continue;
		}
		/*
		 * The NIC may still read (or, for a READ, write) its memory: done
		 * follows its last WR's completion or flush. A draining connection
		 * flushes within its drain timer; an established one gets the grace.
		 */
		xfer->withdrawn = true;
		if (conn->n_withdrawn++ == 0) {
			conn->withdrawn_ms = now;
			if (conn->state == CONN_ESTABLISHED) {
				table->ops->timer_start(table->ctx, conn,
							withdraw_deadline(conn) - now);
			}
		}
		return -EINPROGRESS;
	}
	return -EBUSY;
}

static void fail_pending(struct conn *conn, int err, const char *message)
{
	fail_queue(conn, &conn->pending, NULL, err, message);
	fail_queue(conn, &conn->msg_pending, &conn->n_msg_pending, err, message);
}

static void set_down(struct conn *conn, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The first reason a connection went down is the one its xfers report. */
static void set_down(struct conn *conn, int err, const char *fmt, ...)
{
	va_list ap;

	if (conn->down_err) {
		return;
	}
	conn->down_err = err;
	va_start(ap, fmt);
	vsnprintf(conn->down_msg, sizeof(conn->down_msg), fmt, ap);
	va_end(ap);
}

static void destroy_links(struct conn *conn)
{
	struct conn_table *t = conn->table;

	for (uint32_t i = 0; i < conn->n_links; i++) {
		struct conn_link *link = &conn->links[i];
		if (link->state != LINK_IDLE) {
			/* Only a drained link can have outstanding WRs here: they are failed. */
			conn_link_fail_all(conn, link);
			t->ops->link_destroy(t->ctx, link);
			link->state = LINK_IDLE;
		}
		/* Answers already polled were applied during the drain; no other can come. */
		while (!list_empty(&link->awaiting)) {
			collateral(conn,
				   &container_of(link->awaiting.next, struct conn_msg, node)->xfer);
		}
		sq_plan_fini(&link->sq);
	}
	conn->links_up = 0;
}

static void to_closed(struct conn *conn)
{
	struct conn_table *t = conn->table;

	unindex(conn);
	destroy_links(conn);
	t->ops->timer_stop(t->ctx, conn);
	if (conn->lane_counted) {
		conn->lane_counted = false;
		t->lanes_open--;
	}
	conn->state = CONN_CLOSED;
	t->dirty = true;
	t->ops->kick(t->ctx);
}

/* Every link drained: destroy them and close. */
void conn_check_drained(struct conn *conn)
{
	if (conn->state != CONN_DRAINING) {
		return;
	}
	for (uint32_t i = 0; i < conn->n_links; i++) {
		if (conn->links[i].state != LINK_DRAINED && conn->links[i].state != LINK_IDLE) {
			return;
		}
	}
	log_debug("connection to %s closed (%s)", conn->name,
		  conn->down_msg[0] ? conn->down_msg : "idle");
	to_closed(conn);
}

static void link_begin_drain(struct conn_link *link)
{
	struct conn *conn = link->conn;
	struct conn_table *t = conn->table;
	struct wr_desc marker;
	char why[CONN_MSG_MAX];

	if (link->state == LINK_DRAINING || link->state == LINK_DRAINED ||
	    link->state == LINK_IDLE) {
		return;
	}
	if (link->state != LINK_UP) {
		link->state = LINK_DRAINED;
		return;
	}
	t->ops->link_disconnect(t->ctx, link);
	sq_plan_begin_drain(&link->sq);
	if (sq_plan_outstanding(&link->sq) == 0 && link->n_awaiting == 0) {
		link->state = LINK_DRAINED;
		return;
	}
	/*
	 * Unsignaled WRs may flush without a completion: the marker's completion ends
	 * it. It also comes after any answer the peer sent before the QP failed.
	 */
	sq_plan_marker(&link->sq, &marker);
	t->outstanding_wrs++;
	if (t->ops->link_post(t->ctx, link, &marker, 1, why, sizeof(why)) < 0) {
		log_debug("connection to %s: drain marker not posted (%s)", conn->name, why);
		conn_link_fail_all(conn, link);
		link->state = LINK_DRAINED;
		return;
	}
	link->state = LINK_DRAINING;
}

/*
 * The connection failed (or is closed) while established: no new xfers, the
 * pending ones fail now (they never reached the wire), posted ones fail as
 * their flushes arrive.
 */
void conn_down(struct conn *conn, int err, const char *message)
{
	if (conn->state == CONN_DRAINING || conn->state == CONN_CLOSED) {
		return;
	}
	set_down(conn, err, "%s", message);
	unindex(conn);
	conn->state = CONN_DRAINING;
	fail_pending(conn, conn->down_err, conn->down_msg);
	conn->table->ops->timer_start(conn->table->ctx, conn, policy(conn)->drain_timeout_ms);
	for (uint32_t i = 0; i < conn->n_links; i++) {
		link_begin_drain(&conn->links[i]);
	}
	conn_check_drained(conn);
}

/*
 * A link whose peer refused one access (conn->requeue): the connection takes
 * nothing new, its unsent xfers go again on a new one, the refused link
 * drains (its flushed data xfers go again too), and the other links finish
 * what they carry, then drain (conn_link_quiet()), within the drain timer.
 */
static void conn_down_gently(struct conn *conn, struct conn_link *refused)
{
	unindex(conn);
	conn->state = CONN_DRAINING;
	fail_pending(conn, conn->down_err, conn->down_msg);
	conn->table->ops->timer_start(conn->table->ctx, conn, policy(conn)->drain_timeout_ms);
	link_begin_drain(refused);
	for (uint32_t i = 0; i < conn->n_links; i++) {
		conn_link_quiet(&conn->links[i]);
	}
	conn_check_drained(conn);
}

void conn_link_quiet(struct conn_link *link)
{
	struct conn *conn = link->conn;

	if (conn->state == CONN_DRAINING && link->state == LINK_UP &&
	    sq_plan_outstanding(&link->sq) == 0 && link->n_awaiting == 0) {
		link_begin_drain(link);
	}
}

/* Close a connection that never came up (or gave up): its pending xfers fail. */
static void conn_give_up(struct conn *conn, int err, const char *message)
{
	set_down(conn, err, "%s", message);
	fail_pending(conn, conn->down_err, conn->down_msg);
	to_closed(conn);
}

static void attempt_start(struct conn *conn, uint64_t now);

/* One connection attempt failed; retry after backoff or give up. */
void conn_attempt_failed(struct conn *conn, int err, bool retryable, const char *reason)
{
	const struct conn_policy *p = policy(conn);
	struct conn_table *t = conn->table;
	char message[CONN_MSG_MAX];

	for (uint32_t i = 0; i < conn->n_links; i++) {
		struct conn_link *link = &conn->links[i];
		if (link->state != LINK_IDLE) {
			t->ops->link_destroy(t->ctx, link);
			link->state = LINK_IDLE;
		}
		/* Nothing was posted before the connection was up. */
		sq_plan_fini(&link->sq);
	}
	conn->links_up = 0;
	conn->attempts++;
	if (!retryable || conn->attempts > p->connect_retries || t->shut) {
		if (retryable) {
			snprintf(message, sizeof(message),
				 "connect to %s failed after %u attempt%s: %s", conn->name,
				 conn->attempts, conn->attempts == 1 ? "" : "s", reason);
		} else {
			snprintf(message, sizeof(message), "connect to %s refused: %s", conn->name,
				 reason);
		}
		log_info("%s", message);
		conn_give_up(conn, t->shut ? RDMAX_E_CANCELLED : err, message);
		return;
	}
	uint64_t delay = (uint64_t)p->retry_backoff_ms << MIN(conn->attempts - 1, 16u);
	log_debug("connect to %s: %s; attempt %u in %" PRIu64 " ms", conn->name, reason,
		  conn->attempts + 1, delay);
	conn->state = CONN_BACKOFF;
	t->ops->timer_start(t->ctx, conn, delay);
}

static void attempt_start(struct conn *conn, uint64_t now)
{
	struct conn_table *t = conn->table;
	char why[CONN_MSG_MAX];

	conn->state = CONN_CONNECTING;
	if (conn->latency_lane && !conn->lane_counted) {
		/* From its first attempt on: its set-up waits for the loop as its WRs will. */
		conn->lane_counted = true;
		t->lanes_open++;
	}
	if (conn->latency_lane) {
		t->lane_used_ms = now;
	}
	conn->links_up = 0;
	conn->peer_instance = 0;
	random_bytes(&conn->attempt_id, sizeof(conn->attempt_id));
	t->ops->timer_start(t->ctx, conn, policy(conn)->connect_timeout_ms);
	for (uint32_t i = 0; i < conn->n_links; i++) {
		struct conn_link *link = &conn->links[i];
		memset(link->cause_msg, 0, sizeof(link->cause_msg));
		link->cause_err = 0;
		why[0] = '\0';
		link->state = LINK_RESOLVING_ADDR;
		int ret = t->ops->link_start(t->ctx, link, why, sizeof(why));
		if (ret < 0) {
			link->state = LINK_IDLE;
			conn_attempt_failed(conn, RDMAX_E_UNREACHABLE, true,
					    why[0] ? why : "cannot start");
			return;
		}
	}
}

void conn_established(struct conn *conn, uint64_t now)
{
	struct list_node *pos, *tmp;

	conn->state = CONN_ESTABLISHED;
	conn->attempts = 0;
	conn->ever_up = true;
	conn->last_active_ms = now;
	conn->last_progress_ms = now;
	conn->table->ops->timer_stop(conn->table->ctx, conn);
	log_info("connected to %s (%u QP%s%s, peer instance %016" PRIx64 ")", conn->name,
		 conn->n_links, conn->n_links == 1 ? "" : "s",
		 conn->latency_lane ? " for latency-class transfers" : "", conn->peer_instance);
	/* Xfers queued while connecting may name an older start of this peer. */
	for (int q = 0; q < 2; q++) {
		struct list_node *queue = q ? &conn->msg_pending : &conn->pending;
		list_for_each_safe(pos, tmp, queue)
		{
			struct xfer *xfer = container_of(pos, struct xfer, link);
			if (xfer->remote_instance == conn->peer_instance ||
			    (xfer->remote_instance == 0 && transport_is_lookup(xfer))) {
				continue;
			}
			list_del(pos);
			conn->n_pending--;
			if (q) {
				conn->n_msg_pending--;
			}
			finish(conn->table, xfer, RDMAX_E_NOT_FOUND,
			       "stale descriptor: it names daemon instance %016" PRIx64
			       ", the peer at %s is instance %016" PRIx64,
			       xfer->remote_instance, conn->name, conn->peer_instance);
		}
	}
	mark_dirty(conn);
}

/*
 * Whether conn serves key. The token is part of it: a descriptor naming the
 * domain with another token gets a connection of its own, whose attempt the
 * peer refuses, and never rides on one that proved the right token.
 */
static bool conn_matches(const struct conn *conn, const struct conn_key *k)
{
	return endpoint_same_peer(&conn->peer, k->peer) && conn->local_domain == k->local_domain &&
	       conn->remote_domain == k->remote_domain && conn->remote_token == k->remote_token &&
	       conn->latency_lane == k->latency_lane;
}

static struct conn *conn_new(struct conn_table *t, const struct conn_key *k, uint64_t now)
{
	const struct endpoint *peer = k->peer;
	const struct conn_policy *p = &t->policy;
	struct conn *conn = calloc(1, sizeof(*conn));

	if (!conn) {
		return NULL;
	}
	/* A latency lane holds few WRs at a time: one QP keeps them in order. */
	uint32_t n_links = k->latency_lane ? 1 : p->links;
	conn->links = calloc(n_links, sizeof(*conn->links));
	if (!conn->links) {
		free(conn);
		return NULL;
	}
	conn->table = t;
	conn->n_links = n_links;
	conn->latency_lane = k->latency_lane;
	conn->peer = *peer;
	conn->local_domain = k->local_domain;
	conn->remote_domain = k->remote_domain;
	conn->remote_token = k->remote_token;
	if (strchr(peer->addr, ':')) {
		snprintf(conn->name, sizeof(conn->name), "[%s]:%u", peer->addr, peer->port);
	} else {
		snprintf(conn->name, sizeof(conn->name), "%s:%u", peer->addr, peer->port);
	}
	list_init(&conn->pending);
	list_init(&conn->msg_pending);
	for (uint32_t i = 0; i < conn->n_links; i++) {
		conn->links[i].conn = conn;
		conn->links[i].index = i;
		list_init(&conn->links[i].awaiting);
	}
	conn->last_active_ms = now;
	conn->state = CONN_BACKOFF;
	uint64_t hash = peer_hash(k);
	if (!hmap_get(&t->by_peer, hash) && hmap_put(&t->by_peer, hash, conn) == 0) {
		conn->hash = hash;
	}
	list_add_tail(&t->conns, &conn->link);
	t->n_conns++;
	return conn;
}

void conn_free(struct conn *conn)
{
	if (!conn) {
		return;
	}
	for (uint32_t i = 0; i < conn->n_links; i++) {
		sq_plan_fini(&conn->links[i].sq);
	}
	free(conn->links);
	free(conn);
}

static struct conn *find_conn(struct conn_table *t, const struct conn_key *k)
{
	struct conn *conn = hmap_get(&t->by_peer, peer_hash(k));
	struct list_node *pos;

	if (conn && conn_matches(conn, k)) {
		return conn;
	}
	/* A hash collision leaves a connection unindexed: look for it the slow way. */
	for (pos = t->conns.next; pos != &t->conns; pos = pos->next) {
		conn = container_of(pos, struct conn, link);
		if (conn->state != CONN_DRAINING && conn->state != CONN_CLOSED &&
		    conn_matches(conn, k)) {
			return conn;
		}
	}
	return NULL;
}

static int submit(struct conn_table *t, struct xfer *xfer, uint32_t local_domain, uint64_t now)
{
	const struct conn_policy *p = &t->policy;

	if (t->shut) {
		return RDMAX_E_CANCELLED;
	}
	/* Every WR of an xfer goes in one post; it must fit a send queue. */
	uint64_t wrs =
		xfer->length == 0 ? 1 : (xfer->length + p->max_wr_bytes - 1) / p->max_wr_bytes;
	if (xfer->wire_id) {
		wrs = conn_msg_frames(xfer->length);
	}
	if (wrs + 1 >= p->sq_depth) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/*
	 * Messages go between the daemons' shared domains (their receive buffers
	 * are there), on the bulk lane, the one their ordering is kept on.
	 */
	struct conn_key key = {.peer = &xfer->peer};
	if (!xfer->wire_id) {
		key.local_domain = local_domain;
		key.remote_domain = xfer->peer.domain;
		key.remote_token = xfer->peer.domain ? xfer->peer.domain_token : 0;
		key.latency_lane = xfer->urgent;
	}
	struct conn *conn = find_conn(t, &key);
	if (!conn) {
		if (t->n_conns + t->n_groups >= p->max_connections) {
			return RDMAX_E_RESOURCE_EXHAUSTED;
		}
		/* A connection opened for a client's xfer counts in its uid's share. */
		bool charge = xfer->has_uid && t->uid_conns && t->uid_conn_limit;
		int err = charge ? uid_counts_take(t->uid_conns, xfer->uid, *t->uid_conn_limit) : 0;
		if (err < 0) {
			return err;
		}
		conn = conn_new(t, &key, now);
		if (!conn) {
			if (charge) {
				uid_counts_put(t->uid_conns, xfer->uid);
			}
			return -ENOMEM;
		}
		conn->has_uid = charge;
		conn->uid = xfer->uid;
		/* The attempt starts from the loop: nothing here may complete an xfer. */
		t->ops->timer_start(t->ctx, conn, 0);
	}
	if (conn->latency_lane) {
		t->lane_used_ms = now; /* latency traffic flows (verbs_link: lanes_active) */
	}
	xfer->bytes_done = 0;
	xfer->started_ms = now;
	xfer->withdrawn = false;
	if (conn->state == CONN_ESTABLISHED && xfer->remote_instance != conn->peer_instance &&
	    !(xfer->remote_instance == 0 && transport_is_lookup(xfer))) {
		finish(t, xfer, RDMAX_E_NOT_FOUND,
		       "stale descriptor: it names daemon instance %016" PRIx64
		       ", the peer at %s is instance %016" PRIx64,
		       xfer->remote_instance, conn->name, conn->peer_instance);
		return 0;
	}
	if (xfer->wire_id) {
		list_add_tail(&conn->msg_pending, &xfer->link);
		conn->n_msg_pending++;
	} else {
		list_add_tail(&conn->pending, &xfer->link);
	}
	conn->n_pending++;
	if (conn->state == CONN_ESTABLISHED) {
		mark_dirty(conn);
	}
	return 0;
}

int conn_submit(struct conn_table *t, struct xfer *xfer, uint64_t now)
{
	return conn_submit_domain(t, xfer, 0, now);
}

int conn_submit_domain(struct conn_table *t, struct xfer *xfer, uint32_t local_domain, uint64_t now)
{
	xfer->wire_id = 0;
	xfer->requeues = 0;
	return submit(t, xfer, local_domain, now);
}

int conn_submit_message(struct conn_table *t, struct conn_msg *msg, uint64_t now)
{
	struct xfer *xfer = &msg->xfer;
	uint64_t id = xfer->wire_id;

	if (id == 0 || id == UINT64_MAX || xfer->length == 0 || xfer->length > CONN_MSG_BODY_MAX ||
	    !xfer->payload) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (hmap_get(&t->msgs, id)) {
		return -EEXIST;
	}
	msg->link = NULL;
	msg->sent = msg->awaiting = msg->answered = false;
	msg->status = 0;
	msg->text[0] = '\0';
	list_init(&msg->node);
	if (hmap_put(&t->msgs, id, msg) < 0) {
		return -ENOMEM;
	}
	msg->registered = true;
	int ret = submit(t, xfer, 0, now);
	if (ret < 0) {
		hmap_del(&t->msgs, id);
		msg->registered = false;
	}
	return ret;
}

/* A post of the link failed: the connection goes down (its first failure is the one named). */
static void post_failed(struct conn *conn, const char *why)
{
	char message[CONN_MSG_MAX];

	snprintf(message, sizeof(message), "posting to %s failed: %s", conn->name, why);
	log_warn("%s", message);
	conn_down(conn, RDMAX_E_TRANSPORT_ERROR, message);
}

/* Post n WRs planned for link; false when that failed and took the connection down. */
static bool post_planned(struct conn *conn, struct conn_link *link, size_t n, uint64_t now)
{
	struct conn_table *t = conn->table;
	const struct conn_policy *p = policy(conn);
	char why[CONN_MSG_MAX];

	for (size_t i = 0; i < n; i++) {
		struct conn_msg *msg = t->wrbuf[i].xfer ? as_msg(t->wrbuf[i].xfer) : NULL;
		if (msg) {
			/* Only this link's peer may answer it. */
			msg->link = link;
		}
	}
	t->outstanding_wrs += n;
	conn->last_active_ms = now;
	/* One post list (one doorbell) per policy.batch WRs. */
	for (size_t i = 0; i < n; i += p->batch) {
		why[0] = '\0';
		if (t->ops->link_post(t->ctx, link, t->wrbuf + i, MIN(n - i, p->batch), why,
				      sizeof(why)) < 0) {
			post_failed(conn, why);
			return false;
		}
	}
	return true;
}

void conn_link_post_failed(struct conn_link *link, bool marker, const char *why)
{
	struct conn *conn = link->conn;

	if (marker) {
		/* Nothing else will end the drain: what the link holds fails now. */
		if (link->state == LINK_DRAINING) {
			log_debug("connection to %s: drain marker not posted (%s)", conn->name,
				  why);
			conn_link_fail_all(conn, link);
			link->state = LINK_DRAINED;
			conn_check_drained(conn);
		}
		return;
	}
	if (conn->state == CONN_ESTABLISHED) {
		post_failed(conn, why);
	} else if (conn->state == CONN_DRAINING && link->state == LINK_UP) {
		/* A link finishing its work after another's refusal: its unposted WRs never
		 * complete. */
		link_begin_drain(link);
		conn_check_drained(conn);
	}
	/* Otherwise the link drains already: its marker's flush fails what never went. */
}

/* Post pending xfers, spread over the links with credits; messages on the first link. */
static void conn_pump(struct conn *conn, uint64_t now)
{
	struct conn_table *t = conn->table;
	const struct conn_policy *p = policy(conn);
	struct conn_link *first = &conn->links[0];

	if (conn->state == CONN_ESTABLISHED && conn->n_pending > 0 && conn_outstanding(conn) == 0) {
		/* The no-progress clock starts with the first WR of a busy period. */
		conn->last_progress_ms = now;
	}
	/* RC orders one QP only: messages to a peer arrive in order because they share one. */
	if (conn->state == CONN_ESTABLISHED && conn->n_msg_pending > 0 && first->state == LINK_UP) {
		uint32_t before = conn->n_msg_pending;
		size_t max = MIN(sq_plan_credits(&first->sq), p->sq_depth);
		size_t n = sq_plan_build(&first->sq, &conn->msg_pending, &conn->n_msg_pending, max,
					 t->wrbuf);
		conn->n_pending -= before - conn->n_msg_pending;
		if (n > 0 && !post_planned(conn, first, n, now)) {
			return;
		}
	}
	uint32_t data = conn->n_pending - conn->n_msg_pending;
	while (conn->state == CONN_ESTABLISHED && data > 0) {
		bool progressed = false;
		uint32_t share = (data + conn->n_links - 1) / conn->n_links;
		for (uint32_t k = 0; k < conn->n_links && data > 0; k++) {
			struct conn_link *link = &conn->links[(conn->rr + k) % conn->n_links];
			struct xfer *head = container_of(conn->pending.next, struct xfer, link);
			uint32_t credits = sq_plan_credits(&link->sq);
			if (link->state != LINK_UP || credits == 0) {
				continue;
			}
			/* A share is counted in xfers; the head xfer always fits whole. */
			uint64_t want = MAX((uint64_t)share, sq_plan_wrs_for(&link->sq, head));
			size_t max =
				(size_t)MIN(MIN((uint64_t)credits, want), (uint64_t)p->sq_depth);
			uint32_t before = data;
			size_t n = sq_plan_build(&link->sq, &conn->pending, &data, max, t->wrbuf);
			conn->n_pending -= before - data;
			if (n == 0) {
				continue;
			}
			if (!post_planned(conn, link, n, now)) {
				return;
			}
			progressed = true;
		}
		conn->rr = (conn->rr + 1) % conn->n_links;
		if (!progressed) {
			break;
		}
	}
}

void conn_link_wc(struct conn_link *link, uint64_t seq, int wc_status, uint32_t vendor_err,
		  uint64_t now)
{
	struct conn *conn = link->conn;
	struct sq_plan *sq = &link->sq;
	bool ok = wc_status == IBV_WC_SUCCESS;
	bool flush = wc_status == IBV_WC_WR_FLUSH_ERR;

	if (!sq->ring || seq < sq->done_seq || seq >= sq->next_seq) {
		return;
	}
	conn->table->now_ms = now;
	conn->last_progress_ms = now;
	conn->last_active_ms = now;
	if (!ok && !sq->failed && !flush) {
		struct sq_slot *slot = &sq->ring[seq % sq->depth];
		enum xfer_op op = slot->xfer ? slot->xfer->op : XFER_WRITE;
		const char *what = slot->xfer && slot->xfer->wire_id ? "SEND to" : conn_op_name(op);
		link->cause_err = conn_wc_error_named(wc_status, vendor_err, what, conn->name,
						      link->cause_msg, sizeof(link->cause_msg));
		log_notice("connection to %s QP %u: %s", conn->name, link->index, link->cause_msg);
		if (link->cause_err == RDMAX_E_REMOTE_ACCESS && !conn->requeue && slot->xfer &&
		    conn->state == CONN_ESTABLISHED) {
			/* One transfer's fault, not the peer's: the others go again. */
			conn->requeue = true;
			conn->refused_link = link->index;
			conn->refused_instance = slot->xfer->remote_instance;
			conn->refused_region = slot->xfer->remote_region;
			log_info("connection to %s: its other transfers go again on a new "
				 "connection",
				 conn->name);
		}
	}
	if (!ok && flush) {
		/*
		 * The queue pair went to the error state before any completion
		 * said why: an event not read yet (the peer disconnected, the
		 * device failed it) is the cause, and names itself in the log.
		 */
		set_down(conn, RDMAX_E_TRANSPORT_ERROR,
			 "connection to %s failed: its work requests were flushed before any "
			 "completion named a cause (the peer disconnected or the device failed "
			 "the queue pair; see the daemon log)",
			 conn->name);
	} else if (!ok) {
		set_down(conn, RDMAX_E_TRANSPORT_ERROR, "connection to %s failed: %s", conn->name,
			 link->cause_msg[0] ? link->cause_msg
					    : verbs_wc_status_str((enum ibv_wc_status)wc_status));
	}
	conn_retired(conn, sq_plan_complete(sq, seq, ok, flush, conn_on_retire, link));
	if (!ok && conn->state != CONN_DRAINING && conn->state != CONN_CLOSED) {
		if (conn->requeue) {
			conn_down_gently(conn, link);
		} else {
			conn_down(conn, conn->down_err, conn->down_msg);
		}
	}
	if (link->state == LINK_DRAINING && sq->marker_posted && sq->done_seq > sq->marker_seq) {
		link->state = LINK_DRAINED;
		conn_check_drained(conn);
		return;
	}
	if (!ok && link->state == LINK_UP && conn->state == CONN_DRAINING) {
		/* A link still finishing after another's refusal failed too: it drains. */
		link_begin_drain(link);
		conn_check_drained(conn);
		return;
	}
	if (link->state == LINK_UP && conn->state == CONN_DRAINING) {
		conn_link_quiet(link);
		conn_check_drained(conn);
		return;
	}
	if (conn->state == CONN_ESTABLISHED && conn->n_pending > 0) {
		mark_dirty(conn);
	}
}

/* ---- probes ---- */

static void start_probe(struct conn *conn, struct conn_link *link, struct xfer *xfer)
{
	struct conn_table *t = conn->table;
	struct conn_probe *probe = calloc(1, sizeof(*probe));
	char why[CONN_MSG_MAX] = "";
	uint8_t addr[16];

	if (!probe || conn_addr_parse(conn->peer.addr, addr) < 0) {
		free(probe);
		finish(t, xfer, link->cause_err, "%s", link->cause_msg);
		return;
	}
	probe->table = t;
	probe->conn = conn;
	probe->xfer = xfer;
	probe->peer = conn->peer;
	probe->remote_domain = conn->remote_domain;
	list_init(&probe->followers);
	memcpy(probe->name, conn->name, sizeof(probe->name));
	probe->fallback_err = link->cause_err;
	memcpy(probe->fallback_msg, link->cause_msg, sizeof(probe->fallback_msg));
	struct conn_query q = {
		.access = xfer->op == XFER_READ ? RDMAX_ACCESS_REMOTE_READ
						: RDMAX_ACCESS_REMOTE_WRITE,
		.region_id = xfer->remote_region,
		.region_key = xfer->remote_key,
		.offset = xfer->remote_offset,
		.length = xfer->length,
	};
	conn_pd_query(probe->request, &q, t->key, t->key_len, addr, conn->peer.port);
	probe->deadline_ms = conn->last_active_ms + t->policy.connect_timeout_ms;
	list_add_tail(&t->probes, &probe->link);
	conn->probe = probe;
	if (t->ops->probe_start(t->ctx, probe, why, sizeof(why)) < 0) {
		log_debug("cannot ask %s about the refused access: %s", conn->name, why);
		conn_probe_answer(probe, NULL, 0);
	}
}

void conn_probe_answer(struct conn_probe *probe, const uint8_t *pd, size_t len)
{
	struct conn_table *t = probe->table;
	struct xfer *xfer = probe->xfer;
	const char *op = xfer->op == XFER_READ ? "RDMA READ from" : "RDMA WRITE to";
	const char *right = xfer->op == XFER_READ ? "read" : "write";
	uint64_t region = xfer->remote_region;

	list_del(&probe->link);
	if (probe->conn) {
		probe->conn->probe = NULL;
	}
	t->ops->probe_destroy(t->ctx, probe);
	int verdict = pd && conn_pd_type(pd, len) == CONN_PD_VERDICT && len >= 12
			      ? (int)(int32_t)get_le32(pd + 8)
			      : 1;
	switch (verdict) {
	case RDMAX_E_NOT_FOUND:
		finish(t, xfer, RDMAX_E_NOT_FOUND,
		       "%s %s refused: region %" PRIu64 " is not registered there (deregistered, "
		       "or a stale or forged descriptor)",
		       op, probe->name, region);
		break;
	case RDMAX_E_OUT_OF_RANGE:
		finish(t, xfer, RDMAX_E_OUT_OF_RANGE,
		       "%s %s refused: [%" PRIu64 ", +%" PRIu64 ") is outside region %" PRIu64, op,
		       probe->name, xfer->remote_offset, xfer->length, region);
		break;
	case RDMAX_E_PERMISSION_DENIED:
		finish(t, xfer, RDMAX_E_REMOTE_ACCESS,
		       "%s %s refused: region %" PRIu64 " does not grant remote %s", op,
		       probe->name, region, right);
		break;
	case 0:
		if (probe->remote_domain) {
			/* Per-uid isolation: the rkey is checked in the named domain's PD only. */
			finish(t, xfer, RDMAX_E_REMOTE_ACCESS,
			       "%s %s refused by the device: region %" PRIu64
			       " is not in protection domain %u, which the descriptor names "
			       "(another uid's region, or a wrong rkey or address)",
			       op, probe->name, region, probe->remote_domain);
			break;
		}
		finish(t, xfer, RDMAX_E_REMOTE_ACCESS,
		       "%s %s refused by the device although region %" PRIu64
		       " grants it: the descriptor's rkey or address is wrong",
		       op, probe->name, region);
		break;
	default:
		finish(t, xfer, probe->fallback_err, "%s", probe->fallback_msg);
		break;
	}
	while (!list_empty(&probe->followers)) {
		struct xfer *f = container_of(probe->followers.next, struct xfer, link);
		list_del(&f->link);
		finish(t, f, probe->follower_err, "%s", probe->follower_msg);
	}
	free(probe);
}

void conn_timer_fired(struct conn *conn, uint64_t now)
{
	char why[CONN_MSG_MAX];

	switch (conn->state) {
	case CONN_BACKOFF:
		attempt_start(conn, now);
		break;
	case CONN_CONNECTING:
		snprintf(why, sizeof(why), "no connection within %u ms",
			 policy(conn)->connect_timeout_ms);
		conn_attempt_failed(conn, RDMAX_E_UNREACHABLE, true, why);
		break;
	case CONN_ESTABLISHED:
		/* Work requests of completed jobs are out: the grace without a completion. */
		if (conn->n_withdrawn == 0) {
			break;
		}
		if (now < withdraw_deadline(conn)) {
			conn->table->ops->timer_start(conn->table->ctx, conn,
						      withdraw_deadline(conn) - now);
			break;
		}
		snprintf(why, sizeof(why),
			 "stalled peer %.48s: no completion for %" PRIu64
			 " ms with WRs of completed jobs out; QPs moved to error",
			 conn->name, now - MAX(conn->withdrawn_ms, conn->last_progress_ms));
		log_warn("%s", why);
		conn_down(conn, RDMAX_E_TIMEOUT, why);
		break;
	case CONN_DRAINING:
		/* Flushes that never came: the QPs are in error, so nothing moves any more. */
		log_warn("connection to %s: drain not finished after %u ms; giving up on it",
			 conn->name, policy(conn)->drain_timeout_ms);
		for (uint32_t i = 0; i < conn->n_links; i++) {
			struct conn_link *link = &conn->links[i];
			if (link->state == LINK_UP) {
				/* Still finishing after another link's refusal: no more. */
				conn->table->ops->link_disconnect(conn->table->ctx, link);
				link->state = LINK_DRAINING;
			}
			if (link->state == LINK_DRAINING) {
				conn_link_fail_all(conn, link);
				link->state = LINK_DRAINED;
			}
		}
		conn_check_drained(conn);
		break;
	default:
		break;
	}
}

void conn_close(struct conn *conn, int err, const char *message)
{
	switch (conn->state) {
	case CONN_BACKOFF:
	case CONN_CONNECTING:
		conn_attempt_failed(conn, err, false, message);
		break;
	case CONN_ESTABLISHED:
		conn_down(conn, err, message);
		break;
	default:
		break;
	}
}

void conn_table_tick(struct conn_table *t, uint64_t now)
{
	const struct conn_policy *p = &t->policy;
	struct list_node *pos, *tmp;
	char message[CONN_MSG_MAX];

	list_for_each_safe(pos, tmp, &t->probes)
	{
		struct conn_probe *probe = container_of(pos, struct conn_probe, link);
		if (now >= probe->deadline_ms) {
			log_debug("no verdict from %s within %u ms", probe->name,
				  p->connect_timeout_ms);
			conn_probe_answer(probe, NULL, 0);
		}
	}

	list_for_each_safe(pos, tmp, &t->conns)
	{
		struct conn *conn = container_of(pos, struct conn, link);
		if (conn->state != CONN_ESTABLISHED) {
			continue;
		}
		uint32_t out = conn_outstanding(conn);
		if (out > 0 && now - conn->last_progress_ms >= p->peer_timeout_ms) {
			snprintf(message, sizeof(message),
				 "peer %s stopped answering: no completion for %" PRIu64 " ms",
				 conn->name, now - conn->last_progress_ms);
			log_warn("%s", message);
			conn_down(conn, RDMAX_E_TIMEOUT, message);
		} else if (out == 0 && conn->n_pending == 0 && p->idle_timeout_s > 0 &&
			   now - conn->last_active_ms >= (uint64_t)p->idle_timeout_s * 1000) {
			log_info("connection to %s closed: idle for %u s", conn->name,
				 p->idle_timeout_s);
			conn_down(conn, RDMAX_E_CANCELLED, "connection closed while idle");
		}
	}
}

void conn_table_work(struct conn_table *t, uint64_t now)
{
	struct list_node *pos, *tmp;

	t->now_ms = now;
	for (int round = 0; round < 4 && (t->dirty || t->n_results > 0); round++) {
		if (t->dirty) {
			t->dirty = false;
			list_for_each_safe(pos, tmp, &t->conns)
			{
				struct conn *conn = container_of(pos, struct conn, link);
				if (conn->dirty) {
					conn->dirty = false;
					conn_pump(conn, now);
				}
			}
		}
		conn_table_deliver(t);
		list_for_each_safe(pos, tmp, &t->conns)
		{
			struct conn *conn = container_of(pos, struct conn, link);
			if (conn->state == CONN_CLOSED) {
				list_del(&conn->link);
				t->n_conns--;
				if (conn->has_uid) {
					conn->has_uid = false;
					uid_counts_put(t->uid_conns, conn->uid);
				}
				if (conn->probe) {
					conn->probe->conn = NULL;
					conn->probe = NULL;
				}
				t->ops->release(t->ctx, conn);
			}
		}
	}
	if (t->dirty || t->n_results > 0) {
		t->ops->kick(t->ctx);
	}
}

void conn_table_shutdown(struct conn_table *t)
{
	struct list_node *pos, *tmp;

	t->shut = true;
	list_for_each_safe(pos, tmp, &t->probes)
	{
		conn_probe_answer(container_of(pos, struct conn_probe, link), NULL, 0);
	}
	list_for_each_safe(pos, tmp, &t->conns)
	{
		struct conn *conn = container_of(pos, struct conn, link);
		switch (conn->state) {
		case CONN_BACKOFF:
		case CONN_CONNECTING:
			conn_give_up(conn, RDMAX_E_CANCELLED, "daemon shutting down");
			break;
		case CONN_ESTABLISHED:
			conn_down(conn, RDMAX_E_CANCELLED, "daemon shutting down");
			break;
		default:
			break;
		}
	}
	t->dirty = true;
}

bool conn_table_idle(const struct conn_table *t)
{
	return list_empty(&t->conns) && list_empty(&t->probes) && t->n_results == 0;
}

int conn_table_init(struct conn_table *t, const struct conn_policy *policy,
		    const struct conn_ops *ops, void *ctx, uint64_t instance, const uint8_t *key,
		    size_t key_len)
{
	int ret;

	memset(t, 0, sizeof(*t));
	if (policy->links == 0 || policy->links > CONN_MAX_LINKS || policy->sq_depth < 4 ||
	    policy->max_wr_bytes == 0 || policy->batch == 0) {
		return -EINVAL;
	}
	t->policy = *policy;
	t->ops = ops;
	t->ctx = ctx;
	t->instance = instance;
	t->key = key_len ? key : NULL;
	t->key_len = key_len;
	list_init(&t->conns);
	list_init(&t->probes);
	t->wrbuf = calloc(policy->sq_depth, sizeof(*t->wrbuf));
	if (!t->wrbuf) {
		return -ENOMEM;
	}
	if ((ret = hmap_init(&t->by_peer, 64)) < 0) {
		goto out_wrbuf;
	}
	if ((ret = hmap_init(&t->groups, 64)) < 0) {
		goto out_by_peer;
	}
	if ((ret = hmap_init(&t->replay, 64)) < 0) {
		goto out_groups;
	}
	if ((ret = hmap_init(&t->msgs, 64)) < 0) {
		goto out_replay;
	}
	return 0;

out_replay:
	hmap_fini(&t->replay);
out_groups:
	hmap_fini(&t->groups);
out_by_peer:
	hmap_fini(&t->by_peer);
out_wrbuf:
	free(t->wrbuf);
	t->wrbuf = NULL;
	return ret;
}

void conn_table_fini(struct conn_table *t)
{
	struct list_node *pos, *tmp;

	while (!list_empty(&t->probes)) {
		struct conn_probe *probe = container_of(t->probes.next, struct conn_probe, link);
		list_del(&probe->link);
		free(probe);
	}
	/* Connections still listed were never released: the transport is going away. */
	list_for_each_safe(pos, tmp, &t->conns)
	{
		struct conn *conn = container_of(pos, struct conn, link);
		list_del(&conn->link);
		conn_free(conn);
	}
	hmap_fini(&t->msgs);
	hmap_fini(&t->replay);
	hmap_fini(&t->groups);
	hmap_fini(&t->by_peer);
	free(t->wrbuf);
	free(t->results);
	t->wrbuf = NULL;
	t->results = NULL;
}

/* ==================================================== incoming groups */

static uint64_t group_key(uint64_t instance, uint32_t group)
{
	uint64_t k = (instance ^ ((uint64_t)group << 17) ^ group) * 0x9e3779b97f4a7c15ull;

	return k == 0 || k == UINT64_MAX ? 1 : k;
}

int conn_table_group_add(struct conn_table *t, uint64_t instance, uint32_t group)
{
	uint64_t key = group_key(instance, group);
	uintptr_t count = (uintptr_t)hmap_get(&t->groups, key);

	if (count == 0 && t->n_conns + t->n_groups >= t->policy.max_connections) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	if (hmap_put(&t->groups, key, (void *)(count + 1)) < 0) {
		return -ENOMEM;
	}
	if (count == 0) {
		t->n_groups++;
	}
	return 0;
}

void conn_table_group_del(struct conn_table *t, uint64_t instance, uint32_t group)
{
	uint64_t key = group_key(instance, group);
	uintptr_t count = (uintptr_t)hmap_get(&t->groups, key);

	if (count == 0) {
		return;
	}
	if (count == 1) {
		hmap_del(&t->groups, key);
		t->n_groups--;
	} else {
		hmap_put(&t->groups, key, (void *)(count - 1));
	}
}

void conn_link_answer(struct conn_link *link, const struct conn_frame *a, uint64_t now)
{
	struct conn *conn = link->conn;
	struct conn_table *t = conn->table;
	struct conn_msg *msg = a->type == CONN_FRAME_ANSWER ? hmap_get(&t->msgs, a->id) : NULL;
	char text[CONN_MSG_MAX];
	uint32_t n = MIN(a->data_len, (uint32_t)CONN_ANSWER_TEXT_MAX);

	/* Only the peer a message went to may finish it, and only once. */
	if (!msg || msg->link != link || msg->answered) {
		log_debug("connection to %s: answer to message %" PRIu64 " that is not waiting "
			  "there; ignored",
			  conn->name, a->id);
		return;
	}
	conn->last_progress_ms = now;
	conn->last_active_ms = now;
	int status = a->status;
	if (status == 0 && msg->xfer.reply) {
		/* A lookup's descriptor; the asker checks it before use. */
		if (a->data_len == 0 || a->data_len > msg->xfer.reply_size) {
			status = RDMAX_E_PROTOCOL_ERROR;
		} else {
			memcpy(msg->xfer.reply, a->data, a->data_len);
			msg->xfer.reply_len = a->data_len;
		}
		n = 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint8_t c = a->data[i];
		text[i] = c >= 0x20 && c <= 0x7e ? (char)c : '?';
	}
	text[n] = '\0';
	if (status != 0 && n == 0) {
		snprintf(text, sizeof(text), "%s refused the message: %s", conn->name,
			 rdmax_strerror(status));
	}
	if (msg->sent) {
		finish(t, &msg->xfer, status, "%s", text);
		conn_link_quiet(link);
		conn_check_drained(conn);
		return;
	}
	/* Before our completion: the last frame's retirement finishes it. */
	msg->answered = true;
	msg->status = status;
	memcpy(msg->text, text, sizeof(msg->text));
}
