/* SPDX-License-Identifier: MIT */
/*
 * Connections of the verbs transport as pure logic: the per-peer state
 * machine (attempts, backoff, links, drain), the send-queue planner and the
 * private data of connection set-up. It owns the exactly-once rule for xfers:
 * an xfer leaves either through a retired send-queue slot or through the
 * pending queue, and every finish goes through the table's result list, which
 * only conn_table_deliver() empties. It never calls rdma-core or libuv: every
 * such step is a struct conn_ops call, so unit tests drive it with fakes.
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

#define REPLAY_MAX 8192 /* remembered connect requests (per CONN_AUTH_WINDOW_MS) */

/* ================================================================ helpers */

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

static uint32_t get_u32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++) {
		v |= (uint32_t)p[i] << (8 * i);
	}
	return v;
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++) {
		v |= (uint64_t)p[i] << (8 * i);
	}
	return v;
}

/* A message rides in an xfer with a non-zero wire id (conn_submit() clears it). */
static struct conn_msg *as_msg(struct xfer *xfer)
{
	return xfer->wire_id ? container_of(xfer, struct conn_msg, xfer) : NULL;
}

/* Constant time: a proof must not leak how many of its bytes were right. */
static bool same_bytes(const uint8_t *a, const uint8_t *b, size_t n)
{
	volatile uint8_t diff = 0;

	for (size_t i = 0; i < n; i++) {
		diff |= a[i] ^ b[i];
	}
	return diff == 0;
}

/* ================================================================ planner */

int sq_plan_init(struct sq_plan *plan, uint32_t depth, uint32_t signal_interval,
		 uint32_t max_inline, uint64_t max_wr_bytes)
{
	if (depth < 2 || max_wr_bytes == 0) {
		return -EINVAL;
	}
	memset(plan, 0, sizeof(*plan));
	plan->ring = calloc(depth, sizeof(*plan->ring));
	if (!plan->ring) {
		return -ENOMEM;
	}
	plan->depth = depth;
	plan->signal_interval = MAX(signal_interval, 1u);
	plan->max_inline = max_inline;
	plan->max_wr_bytes = max_wr_bytes;
	plan->cause_seq = UINT64_MAX;
	return 0;
}

void sq_plan_fini(struct sq_plan *plan)
{
	free(plan->ring);
	plan->ring = NULL;
}

uint32_t sq_plan_outstanding(const struct sq_plan *plan)
{
	return (uint32_t)(plan->next_seq - plan->done_seq);
}

uint32_t sq_plan_credits(const struct sq_plan *plan)
{
	uint32_t used = sq_plan_outstanding(plan);

	if (!plan->ring || plan->failed || plan->marker_posted || used + 1 >= plan->depth) {
		return 0;
	}
	return plan->depth - 1 - used;
}

uint64_t sq_plan_wrs_for(const struct sq_plan *plan, const struct xfer *xfer)
{
	if (xfer->wire_id) {
		return conn_msg_frames(xfer->length);
	}
	if (xfer->length == 0) {
		return 1;
	}
	return (xfer->length + plan->max_wr_bytes - 1) / plan->max_wr_bytes;
}

static void plan_wr(struct sq_plan *plan, struct wr_desc *wr, struct xfer *xfer, enum wr_kind kind,
		    uint64_t offset, uint64_t length, bool last)
{
	struct sq_slot *slot = &plan->ring[plan->next_seq % plan->depth];

	wr->xfer = xfer;
	wr->kind = kind;
	wr->seq = plan->next_seq++;
	wr->offset = offset;
	wr->length = length;
	wr->inline_data =
		kind != WR_READ && kind != WR_MARKER && length > 0 && length <= plan->max_inline;
	plan->since_signal++;
	wr->signaled = plan->since_signal >= plan->signal_interval;
	if (wr->signaled) {
		plan->since_signal = 0;
	}
	slot->xfer = xfer;
	slot->last = last;
	slot->signaled = wr->signaled;
}

size_t sq_plan_build(struct sq_plan *plan, struct list_node *queue, uint32_t *queued, size_t max,
		     struct wr_desc *out)
{
	size_t n = 0;

	while (!list_empty(queue)) {
		struct xfer *xfer = container_of(queue->next, struct xfer, link);
		uint64_t wrs = sq_plan_wrs_for(plan, xfer);
		if (wrs > sq_plan_credits(plan) || wrs > max - n) {
			break;
		}
		list_del(&xfer->link);
		(*queued)--;
		for (uint64_t i = 0; i < wrs; i++) {
			if (xfer->wire_id) {
				/* Frame i of a message, from its staging. */
				plan_wr(plan, &out[n++], xfer, WR_SEND, i * CONN_FRAME_MAX,
					conn_msg_frame_len(xfer->length, (uint32_t)i),
					i + 1 == wrs);
				continue;
			}
			uint64_t off = i * plan->max_wr_bytes;
			uint64_t len = MIN(plan->max_wr_bytes, xfer->length - off);
			bool last = i + 1 == wrs;
			enum wr_kind kind = xfer->op == XFER_READ ? WR_READ : WR_WRITE;
			if (last && xfer->op == XFER_WRITE && xfer->has_imm) {
				kind = WR_WRITE_IMM;
			}
			plan_wr(plan, &out[n++], xfer, kind, xfer->length ? off : 0,
				xfer->length ? len : 0, last);
		}
	}
	if (n > 0 && !out[n - 1].signaled) {
		/* Nothing may follow soon: an unsignaled tail would hold its xfers forever. */
		out[n - 1].signaled = true;
		plan->ring[out[n - 1].seq % plan->depth].signaled = true;
		plan->since_signal = 0;
	}
	return n;
}

void sq_plan_begin_drain(struct sq_plan *plan)
{
	if (!plan->failed) {
		plan->failed = true;
		plan->fail_seq = plan->done_seq;
	}
}

void sq_plan_marker(struct sq_plan *plan, struct wr_desc *out)
{
	struct sq_slot *slot = &plan->ring[plan->next_seq % plan->depth];

	memset(out, 0, sizeof(*out));
	out->kind = WR_MARKER;
	out->signaled = true;
	out->seq = plan->next_seq++;
	slot->xfer = NULL;
	slot->last = false;
	slot->signaled = true;
	plan->marker_posted = true;
	plan->marker_seq = out->seq;
	plan->since_signal = 0;
}

static uint32_t retire(struct sq_plan *plan, uint64_t upto, bool ok, sq_retire_cb cb, void *arg)
{
	uint32_t n = 0;

	while (plan->done_seq <= upto && plan->done_seq < plan->next_seq) {
		uint64_t s = plan->done_seq;
		struct sq_slot slot = plan->ring[s % plan->depth];
		plan->done_seq++;
		n++;
		if (s == plan->cause_seq) {
			plan->cause_xfer = slot.xfer;
		}
		if (!slot.xfer || !slot.last) {
			continue;
		}
		enum sq_outcome outcome = SQ_OK;
		if (!ok && plan->failed && s >= plan->fail_seq) {
			outcome = slot.xfer == plan->cause_xfer ? SQ_FAILED_CAUSE : SQ_FAILED_FLUSH;
		}
		cb(arg, slot.xfer, outcome);
	}
	return n;
}

uint32_t sq_plan_complete(struct sq_plan *plan, uint64_t seq, bool ok, bool flush, sq_retire_cb cb,
			  void *arg)
{
	if (seq < plan->done_seq || seq >= plan->next_seq) {
		return 0;
	}
	if (!ok && !plan->failed) {
		plan->failed = true;
		plan->fail_seq = seq;
		if (!flush) {
			plan->cause_seq = seq;
		}
	}
	/* A success confirms every WR before it (RC completes in order). */
	return retire(plan, seq, ok, cb, arg);
}

uint32_t sq_plan_fail_all(struct sq_plan *plan, sq_retire_cb cb, void *arg)
{
	sq_plan_begin_drain(plan);
	if (plan->next_seq == plan->done_seq) {
		return 0;
	}
	return retire(plan, plan->next_seq - 1, false, cb, arg);
}

/* ============================================================ names */

const char *conn_state_name(enum conn_state state)
{
	static const char *const names[CONN_STATE_MAX] = {
		[CONN_BACKOFF] = "backoff",         [CONN_CONNECTING] = "connecting",
		[CONN_ESTABLISHED] = "established", [CONN_DRAINING] = "draining",
		[CONN_CLOSED] = "closed",
	};
	return (unsigned)state < CONN_STATE_MAX ? names[state] : "?";
}

const char *link_state_name(enum link_state state)
{
	static const char *const names[LINK_STATE_MAX] = {
		[LINK_IDLE] = "idle",
		[LINK_RESOLVING_ADDR] = "resolving-addr",
		[LINK_RESOLVING_ROUTE] = "resolving-route",
		[LINK_CONNECTING] = "connecting",
		[LINK_UP] = "up",
		[LINK_DRAINING] = "draining",
		[LINK_DRAINED] = "drained",
	};
	return (unsigned)state < LINK_STATE_MAX ? names[state] : "?";
}

const char *conn_event_name(enum conn_event event)
{
	static const char *const names[CONN_EV_MAX] = {
		[CONN_EV_ADDR_RESOLVED] = "ADDR_RESOLVED",
		[CONN_EV_ROUTE_RESOLVED] = "ROUTE_RESOLVED",
		[CONN_EV_ESTABLISHED] = "ESTABLISHED",
		[CONN_EV_REJECTED] = "REJECTED",
		[CONN_EV_ADDR_ERROR] = "ADDR_ERROR",
		[CONN_EV_ROUTE_ERROR] = "ROUTE_ERROR",
		[CONN_EV_UNREACHABLE] = "UNREACHABLE",
		[CONN_EV_CONNECT_ERROR] = "CONNECT_ERROR",
		[CONN_EV_DISCONNECTED] = "DISCONNECTED",
		[CONN_EV_DEVICE_REMOVAL] = "DEVICE_REMOVAL",
		[CONN_EV_ADDR_CHANGE] = "ADDR_CHANGE",
		[CONN_EV_TIMEWAIT_EXIT] = "TIMEWAIT_EXIT",
		[CONN_EV_QP_ERROR] = "QP_ERROR",
	};
	return (unsigned)event < CONN_EV_MAX ? names[event] : "?";
}

static const char *op_name(enum xfer_op op)
{
	return op == XFER_READ ? "RDMA READ from" : "RDMA WRITE to";
}

/*
 * Out of line on purpose: inlined where every operand is a literal or a fixed
 * array, GCC proves that the longest message would be cut, which is intended
 * (the start names the operation, the peer and the cause).
 */
static int __attribute__((noinline)) wc_error(int wc_status, uint32_t vendor_err, const char *op,
					      const char *peer, char *message, size_t message_size)
{
	const char *what;
	int err;

	switch ((enum ibv_wc_status)wc_status) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
		err = RDMAX_E_REMOTE_ACCESS;
		what = "the peer's device refused the access (region not registered for it, "
		       "deregistered, or out of bounds)";
		break;
	case IBV_WC_REM_INV_REQ_ERR:
		err = RDMAX_E_INVALID_ARGUMENT;
		what = "the peer's device found the request invalid";
		break;
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_REM_ABORT_ERR:
	case IBV_WC_REM_INV_RD_REQ_ERR:
		err = RDMAX_E_TRANSPORT_ERROR;
		what = "the peer's device could not complete the operation";
		break;
	case IBV_WC_RETRY_EXC_ERR:
		err = RDMAX_E_UNREACHABLE;
		what = "no acknowledgement from the peer after all retries";
		break;
	case IBV_WC_RNR_RETRY_EXC_ERR:
		err = RDMAX_E_TRANSPORT_ERROR;
		what = "the peer had no receive posted after all retries";
		break;
	case IBV_WC_RESP_TIMEOUT_ERR:
		err = RDMAX_E_TIMEOUT;
		what = "the peer's response timed out";
		break;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		err = RDMAX_E_PERMISSION_DENIED;
		what = "the local region is not registered for this access";
		break;
	case IBV_WC_WR_FLUSH_ERR:
		err = RDMAX_E_TRANSPORT_ERROR;
		what = "flushed: the connection failed";
		break;
	default:
		err = RDMAX_E_INTERNAL;
		what = "local device error";
		break;
	}
	snprintf(message, message_size, "%s %s failed: %s (%s, vendor error %#x)", op, peer, what,
		 verbs_wc_status_str((enum ibv_wc_status)wc_status), vendor_err);
	return err;
}

int conn_wc_error(int wc_status, uint32_t vendor_err, enum xfer_op op, const char *peer,
		  char *message, size_t message_size)
{
	return wc_error(wc_status, vendor_err, op_name(op), peer, message, message_size);
}

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

static uint64_t peer_hash(const struct endpoint *peer)
{
	uint64_t h = 1469598103934665603ull;

	for (const char *p = peer->addr; *p; p++) {
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	}
	h = (h ^ peer->port) * 1099511628211ull;
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
		collateral(conn, &msg->xfer);
		break;
	}
}

static void on_retire(void *arg, struct xfer *xfer, enum sq_outcome outcome)
{
	struct conn_link *link = arg;
	struct conn *conn = link->conn;
	struct conn_msg *msg = as_msg(xfer);

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
		    !conn->table->shut && !conn->probe) {
			start_probe(conn, link, xfer);
		} else {
			finish(conn->table, xfer, link->cause_err, "%s", link->cause_msg);
		}
		break;
	default:
		collateral(conn, xfer);
		break;
	}
}

static void retired(struct conn *conn, uint32_t n)
{
	struct conn_table *t = conn->table;

	t->outstanding_wrs -= MIN((uint64_t)n, t->outstanding_wrs);
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
		if (conn->probe) {
			collateral(conn, xfer);
		} else {
			finish(conn->table, xfer, err, "%s", message);
		}
	}
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
			retired(conn, sq_plan_fail_all(&link->sq, on_retire, link));
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
	conn->state = CONN_CLOSED;
	t->dirty = true;
	t->ops->kick(t->ctx);
}

/* Every link drained: destroy them and close. */
static void check_drained(struct conn *conn)
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
		retired(conn, sq_plan_fail_all(&link->sq, on_retire, link));
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
static void conn_down(struct conn *conn, int err, const char *message)
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
	check_drained(conn);
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
static void attempt_failed(struct conn *conn, int err, bool retryable, const char *reason)
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
			attempt_failed(conn, RDMAX_E_UNREACHABLE, true,
				       why[0] ? why : "cannot start");
			return;
		}
	}
}

static void established(struct conn *conn, uint64_t now)
{
	struct list_node *pos, *tmp;

	conn->state = CONN_ESTABLISHED;
	conn->attempts = 0;
	conn->ever_up = true;
	conn->last_active_ms = now;
	conn->last_progress_ms = now;
	conn->table->ops->timer_stop(conn->table->ctx, conn);
	log_info("connected to %s (%u QP%s, peer instance %016" PRIx64 ")", conn->name,
		 conn->n_links, conn->n_links == 1 ? "" : "s", conn->peer_instance);
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

static struct conn *conn_new(struct conn_table *t, const struct endpoint *peer, uint64_t now)
{
	const struct conn_policy *p = &t->policy;
	struct conn *conn = calloc(1, sizeof(*conn));

	if (!conn) {
		return NULL;
	}
	conn->links = calloc(p->links, sizeof(*conn->links));
	if (!conn->links) {
		free(conn);
		return NULL;
	}
	conn->table = t;
	conn->n_links = p->links;
	conn->peer = *peer;
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
	uint64_t hash = peer_hash(peer);
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

static struct conn *find_conn(struct conn_table *t, const struct endpoint *peer)
{
	struct conn *conn = hmap_get(&t->by_peer, peer_hash(peer));
	struct list_node *pos;

	if (conn && endpoint_same_peer(&conn->peer, peer)) {
		return conn;
	}
	/* A hash collision leaves a connection unindexed: look for it the slow way. */
	for (pos = t->conns.next; pos != &t->conns; pos = pos->next) {
		conn = container_of(pos, struct conn, link);
		if (conn->state != CONN_DRAINING && conn->state != CONN_CLOSED &&
		    endpoint_same_peer(&conn->peer, peer)) {
			return conn;
		}
	}
	return NULL;
}

static int submit(struct conn_table *t, struct xfer *xfer, uint64_t now)
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
	struct conn *conn = find_conn(t, &xfer->peer);
	if (!conn) {
		if (t->n_conns + t->n_groups >= p->max_connections) {
			return RDMAX_E_RESOURCE_EXHAUSTED;
		}
		conn = conn_new(t, &xfer->peer, now);
		if (!conn) {
			return -ENOMEM;
		}
		/* The attempt starts from the loop: nothing here may complete an xfer. */
		t->ops->timer_start(t->ctx, conn, 0);
	}
	xfer->bytes_done = 0;
	xfer->started_ms = now;
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
	xfer->wire_id = 0;
	return submit(t, xfer, now);
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
	int ret = submit(t, xfer, now);
	if (ret < 0) {
		hmap_del(&t->msgs, id);
		msg->registered = false;
	}
	return ret;
}

/* Post n WRs planned for link; false when that failed and took the connection down. */
static bool post_planned(struct conn *conn, struct conn_link *link, size_t n, uint64_t now)
{
	struct conn_table *t = conn->table;
	const struct conn_policy *p = policy(conn);
	char why[CONN_MSG_MAX];
	char message[CONN_MSG_MAX];

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
			snprintf(message, sizeof(message), "posting to %s failed: %s", conn->name,
				 why);
			log_warn("%s", message);
			conn_down(conn, RDMAX_E_TRANSPORT_ERROR, message);
			return false;
		}
	}
	return true;
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
	conn->last_progress_ms = now;
	conn->last_active_ms = now;
	if (!ok && !sq->failed && !flush) {
		struct sq_slot *slot = &sq->ring[seq % sq->depth];
		enum xfer_op op = slot->xfer ? slot->xfer->op : XFER_WRITE;
		const char *what = slot->xfer && slot->xfer->wire_id ? "SEND to" : op_name(op);
		link->cause_err = wc_error(wc_status, vendor_err, what, conn->name, link->cause_msg,
					   sizeof(link->cause_msg));
		log_info("connection to %s QP %u: %s", conn->name, link->index, link->cause_msg);
	}
	if (!ok) {
		char message[CONN_MSG_MAX];
		snprintf(message, sizeof(message), "connection to %s failed: %s", conn->name,
			 verbs_wc_status_str((enum ibv_wc_status)wc_status));
		set_down(conn, RDMAX_E_TRANSPORT_ERROR, "%s", message);
	}
	retired(conn, sq_plan_complete(sq, seq, ok, flush, on_retire, link));
	if (!ok && conn->state != CONN_DRAINING && conn->state != CONN_CLOSED) {
		conn_down(conn, conn->down_err, conn->down_msg);
	}
	if (link->state == LINK_DRAINING && sq->marker_posted && sq->done_seq > sq->marker_seq) {
		link->state = LINK_DRAINED;
		check_drained(conn);
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
			      ? (int)(int32_t)get_u32(pd + 8)
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

/* ---- rdma_cm events ---- */

static int reject_err(enum conn_reject_reason reason, bool *ret_retryable)
{
	*ret_retryable = false;
	switch (reason) {
	case CONN_REJ_AUTH_REQUIRED:
	case CONN_REJ_AUTH_FAILED:
	case CONN_REJ_AUTH_UNUSED:
	case CONN_REJ_CLOCK:
	case CONN_REJ_REPLAY:
		return RDMAX_E_PERMISSION_DENIED;
	case CONN_REJ_VERSION:
		return RDMAX_E_PROTOCOL_ERROR;
	case CONN_REJ_LIMIT:
	case CONN_REJ_RESOURCES:
		*ret_retryable = true;
		return RDMAX_E_RESOURCE_EXHAUSTED;
	case CONN_REJ_SHUTDOWN:
	default:
		*ret_retryable = true;
		return RDMAX_E_UNREACHABLE;
	}
}

static void transcript_for(struct auth_transcript *tr, const uint8_t *req,
			   const uint8_t server_addr[16], uint16_t server_port,
			   uint64_t server_instance);

static void on_rejected(struct conn_link *link, const struct conn_event_data *data)
{
	struct conn *conn = link->conn;
	const uint8_t *pd = data ? data->private_data : NULL;
	size_t len = data ? data->private_len : 0;
	char reason[CONN_MSG_MAX];
	bool retryable;

	if (pd && len >= 8 && get_u32(pd) == CONN_PD_MAGIC && pd[5] == CONN_PD_REJECT) {
		enum conn_reject_reason why = pd[6] < CONN_REJ_MAX ? pd[6] : CONN_REJ_MAX;
		int err = reject_err(why, &retryable);
		snprintf(reason, sizeof(reason), "peer refused: %s", conn_reject_reason_str(why));
		attempt_failed(conn, err, retryable, reason);
		return;
	}
	/* A reject from the fabric or the peer's kernel (no listener on the port...). */
	snprintf(reason, sizeof(reason), "connection rejected (rdma_cm status %d)",
		 data ? data->status : 0);
	attempt_failed(conn, RDMAX_E_UNREACHABLE, true, reason);
}

static void on_established(struct conn_link *link, const struct conn_event_data *data, uint64_t now)
{
	struct conn *conn = link->conn;
	struct conn_table *t = conn->table;
	const uint8_t *pd = data ? data->private_data : NULL;
	size_t len = data ? data->private_len : 0;

	if (!pd || len < 16 || get_u32(pd) != CONN_PD_MAGIC || pd[4] != CONN_PD_VERSION ||
	    pd[5] != CONN_PD_ACCEPT) {
		attempt_failed(conn, RDMAX_E_PROTOCOL_ERROR, false,
			       "the peer accepted without rdmaxd's private data");
		return;
	}
	uint64_t instance = get_u64(pd + 8);
	if (t->key) {
		struct auth_transcript tr;
		uint8_t mac[AUTH_MAC_BYTES];
		uint8_t addr[16];
		if (!(pd[6] & 1) || len < 16 + AUTH_MAC_BYTES ||
		    conn_addr_parse(conn->peer.addr, addr) < 0) {
			attempt_failed(conn, RDMAX_E_PERMISSION_DENIED, false,
				       "the peer did not prove that it holds the shared key");
			return;
		}
		transcript_for(&tr, link->request, addr, conn->peer.port, instance);
		if (auth_compute(t->key, t->key_len, AUTH_ROLE_SERVER, &tr, mac) < 0 ||
		    !same_bytes(mac, pd + 16, AUTH_MAC_BYTES)) {
			attempt_failed(conn, RDMAX_E_PERMISSION_DENIED, false,
				       "the peer's proof of the shared key is wrong");
			return;
		}
	}
	if (conn->links_up > 0 && instance != conn->peer_instance) {
		attempt_failed(conn, RDMAX_E_UNREACHABLE, true,
			       "the peer restarted while connecting");
		return;
	}
	conn->peer_instance = instance;
	link->state = LINK_UP;
	conn->links_up++;
	if (conn->links_up == conn->n_links) {
		established(conn, now);
	}
}

static void connecting_step(struct conn_link *link, enum conn_event event,
			    const struct conn_event_data *data, uint64_t now)
{
	struct conn *conn = link->conn;
	struct conn_table *t = conn->table;
	char why[CONN_MSG_MAX] = "";
	int ret;

	switch (event) {
	case CONN_EV_ADDR_RESOLVED:
		if (link->state != LINK_RESOLVING_ADDR) {
			break;
		}
		link->state = LINK_RESOLVING_ROUTE;
		ret = t->ops->link_resolve_route(t->ctx, link, why, sizeof(why));
		if (ret < 0) {
			attempt_failed(
				conn, ret == RDMAX_E_RESOURCE_EXHAUSTED ? ret : RDMAX_E_UNREACHABLE,
				ret != RDMAX_E_RESOURCE_EXHAUSTED, why);
		}
		break;
	case CONN_EV_ROUTE_RESOLVED: {
		uint8_t addr[16];
		if (link->state != LINK_RESOLVING_ROUTE) {
			break;
		}
		if (conn_addr_parse(conn->peer.addr, addr) < 0) {
			attempt_failed(conn, RDMAX_E_INVALID_ARGUMENT, false, "bad peer address");
			break;
		}
		random_bytes(link->request, sizeof(link->request));
		conn_pd_connect(link->request, (uint8_t)link->index, (uint8_t)conn->n_links,
				conn->attempt_id, t->instance, conn_realtime_ms(), t->key,
				t->key_len, addr, conn->peer.port);
		link->state = LINK_CONNECTING;
		ret = t->ops->link_connect(t->ctx, link, link->request, CONN_PD_REQ_LEN, why,
					   sizeof(why));
		if (ret < 0) {
			/* No QP or CQ space here is not the peer's fault: do not retry. */
			attempt_failed(
				conn, ret == RDMAX_E_RESOURCE_EXHAUSTED ? ret : RDMAX_E_UNREACHABLE,
				ret != RDMAX_E_RESOURCE_EXHAUSTED, why);
		}
		break;
	}
	case CONN_EV_ESTABLISHED:
		if (link->state == LINK_CONNECTING) {
			on_established(link, data, now);
		}
		break;
	case CONN_EV_REJECTED:
		on_rejected(link, data);
		break;
	case CONN_EV_ADDR_ERROR:
	case CONN_EV_ROUTE_ERROR:
	case CONN_EV_UNREACHABLE:
	case CONN_EV_CONNECT_ERROR:
	case CONN_EV_DISCONNECTED:
	case CONN_EV_DEVICE_REMOVAL:
	case CONN_EV_ADDR_CHANGE:
	case CONN_EV_QP_ERROR:
		snprintf(why, sizeof(why), "%s (status %d)", conn_event_name(event),
			 data ? data->status : 0);
		attempt_failed(conn, RDMAX_E_UNREACHABLE, true, why);
		break;
	default:
		break;
	}
}

void conn_link_event(struct conn_link *link, enum conn_event event,
		     const struct conn_event_data *data, uint64_t now)
{
	struct conn *conn = link->conn;
	char message[CONN_MSG_MAX];

	log_debug("connection to %s link %u (%s): %s", conn->name, link->index,
		  link_state_name(link->state), conn_event_name(event));
	if (event == CONN_EV_TIMEWAIT_EXIT || link->state == LINK_IDLE) {
		return;
	}
	switch (conn->state) {
	case CONN_CONNECTING:
		connecting_step(link, event, data, now);
		break;
	case CONN_ESTABLISHED:
		if (event == CONN_EV_DEVICE_REMOVAL) {
			/* Only destroy calls are allowed now: no marker, fail what was posted. */
			for (uint32_t i = 0; i < conn->n_links; i++) {
				struct conn_link *l = &conn->links[i];
				retired(conn, sq_plan_fail_all(&l->sq, on_retire, l));
				l->state = LINK_DRAINED;
			}
		}
		if (event == CONN_EV_DISCONNECTED || event == CONN_EV_DEVICE_REMOVAL ||
		    event == CONN_EV_ADDR_CHANGE || event == CONN_EV_QP_ERROR ||
		    event == CONN_EV_CONNECT_ERROR || event == CONN_EV_UNREACHABLE) {
			snprintf(message, sizeof(message), "connection to %s lost: %s", conn->name,
				 event == CONN_EV_DISCONNECTED ? "the peer disconnected"
							       : conn_event_name(event));
			log_info("%s", message);
			conn_down(conn, RDMAX_E_TRANSPORT_ERROR, message);
		}
		break;
	case CONN_DRAINING:
		if (event == CONN_EV_DEVICE_REMOVAL) {
			retired(conn, sq_plan_fail_all(&link->sq, on_retire, link));
			link->state = LINK_DRAINED;
			check_drained(conn);
		}
		break;
	default:
		break;
	}
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
		attempt_failed(conn, RDMAX_E_UNREACHABLE, true, why);
		break;
	case CONN_DRAINING:
		/* Flushes that never came: the QPs are in error, so nothing moves any more. */
		log_warn("connection to %s: drain not finished after %u ms; giving up on it",
			 conn->name, policy(conn)->drain_timeout_ms);
		for (uint32_t i = 0; i < conn->n_links; i++) {
			struct conn_link *link = &conn->links[i];
			if (link->state == LINK_DRAINING) {
				retired(conn, sq_plan_fail_all(&link->sq, on_retire, link));
				link->state = LINK_DRAINED;
			}
		}
		check_drained(conn);
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
		attempt_failed(conn, err, false, message);
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

/* ========================================================== private data */

/*
 * Connect request (CONN_PD_REQ_LEN bytes, little-endian):
 *   0 magic u32 | 4 version u8 | 5 type u8 | 6 flags u8 (bit 0: proof) | 7 n_links u8
 *   8 link_index u8 | 9..11 zero | 12 group u32 | 16 instance u64 | 24 time_ms u64
 *  32 nonce[8] | 40 proof[16]
 * Accept: 0 magic | 4 version | 5 type | 6 flags | 7 zero | 8 instance u64 | 16 proof[32]
 * Reject: 0 magic | 4 version | 5 type | 6 reason u8 | 7 zero | 8 text (NUL-padded)
 *
 * The proofs are auth_compute() over a transcript made of the request and
 * the address and port the requester connects to, so a request cannot be
 * replayed to another daemon; the accept's proof also covers the accepting
 * daemon's instance, which the requester then trusts for stale checks.
 */
static void transcript_for(struct auth_transcript *tr, const uint8_t *req,
			   const uint8_t server_addr[16], uint16_t server_port,
			   uint64_t server_instance)
{
	uint8_t *s = tr->server_nonce;

	memset(tr, 0, sizeof(*tr));
	memcpy(tr->client_nonce, req, 32);
	memcpy(s, "VRB1", 4);
	s[4] = (uint8_t)server_port;
	s[5] = (uint8_t)(server_port >> 8);
	memcpy(s + 8, req + 32, 8);
	memcpy(s + 16, server_addr, 16);
	tr->client_instance = get_u64(req + 16);
	tr->server_instance = server_instance;
}

int conn_addr_bytes(const struct sockaddr *sa, uint8_t ret_addr[16], uint16_t *ret_port)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
		memset(ret_addr, 0, 10);
		ret_addr[10] = ret_addr[11] = 0xff;
		memcpy(ret_addr + 12, &sin->sin_addr, 4);
		*ret_port = ntohs(sin->sin_port);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)sa;
		memcpy(ret_addr, &sin6->sin6_addr, 16);
		*ret_port = ntohs(sin6->sin6_port);
		return 0;
	}
	return -EAFNOSUPPORT;
}

int conn_addr_parse(const char *addr, uint8_t ret_addr[16])
{
	struct in_addr a4;
	struct in6_addr a6;

	if (inet_pton(AF_INET, addr, &a4) == 1) {
		memset(ret_addr, 0, 10);
		ret_addr[10] = ret_addr[11] = 0xff;
		memcpy(ret_addr + 12, &a4, 4);
		return 0;
	}
	if (inet_pton(AF_INET6, addr, &a6) == 1) {
		memcpy(ret_addr, &a6, 16);
		return 0;
	}
	return -EINVAL;
}

int conn_pd_connect(uint8_t *buf, uint8_t link_index, uint8_t n_links, uint32_t group,
		    uint64_t instance, uint64_t time_ms, const uint8_t *key, size_t key_len,
		    const uint8_t server_addr[16], uint16_t server_port)
{
	struct auth_transcript tr;
	uint8_t mac[AUTH_MAC_BYTES];
	uint8_t nonce[8];

	/* The nonce makes every request distinct, which the replay check relies on. */
	random_bytes(nonce, sizeof(nonce));
	memset(buf, 0, CONN_PD_REQ_LEN);
	put_u32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_CONNECT;
	buf[6] = key && key_len ? 1 : 0;
	buf[7] = n_links;
	buf[8] = link_index;
	put_u32(buf + 12, group);
	put_u64(buf + 16, instance);
	put_u64(buf + 24, time_ms);
	memcpy(buf + 32, nonce, sizeof(nonce));
	if (key && key_len) {
		transcript_for(&tr, buf, server_addr, server_port, 0);
		if (auth_compute(key, key_len, AUTH_ROLE_CLIENT, &tr, mac) == 0) {
			memcpy(buf + 40, mac, CONN_PD_MAC_LEN);
		}
	}
	return CONN_PD_REQ_LEN;
}

static void replay_sweep(struct conn_table *t, uint64_t now)
{
	uint64_t key;
	void *value;
	size_t iter = 0;
	uint64_t dead[64];
	size_t n = 0;

	while (n < ARRAY_SIZE(dead) && hmap_next(&t->replay, &iter, &key, &value)) {
		if ((uint64_t)(uintptr_t)value <= now) {
			dead[n++] = key;
		}
	}
	for (size_t i = 0; i < n; i++) {
		hmap_del(&t->replay, dead[i]);
	}
}

enum conn_reject_reason conn_pd_check(struct conn_table *t, const uint8_t *pd, size_t len,
				      const uint8_t server_addr[16], uint16_t server_port,
				      uint64_t now_real_ms, struct conn_request *ret_req)
{
	struct conn_request req;

	if (!pd || len < CONN_PD_REQ_LEN || get_u32(pd) != CONN_PD_MAGIC ||
	    pd[4] != CONN_PD_VERSION || pd[5] != CONN_PD_CONNECT) {
		return CONN_REJ_VERSION;
	}
	memset(&req, 0, sizeof(req));
	req.has_mac = pd[6] & 1;
	req.n_links = pd[7];
	req.link_index = pd[8];
	req.group = get_u32(pd + 12);
	req.instance = get_u64(pd + 16);
	req.time_ms = get_u64(pd + 24);
	if (req.n_links == 0 || req.link_index >= req.n_links) {
		return CONN_REJ_VERSION;
	}
	if (!t->key) {
		if (req.has_mac) {
			return CONN_REJ_AUTH_UNUSED;
		}
		*ret_req = req;
		return CONN_REJ_NONE;
	}
	if (!req.has_mac) {
		return CONN_REJ_AUTH_REQUIRED;
	}
	struct auth_transcript tr;
	uint8_t mac[AUTH_MAC_BYTES];
	transcript_for(&tr, pd, server_addr, server_port, 0);
	if (auth_compute(t->key, t->key_len, AUTH_ROLE_CLIENT, &tr, mac) < 0 ||
	    !same_bytes(mac, pd + 40, CONN_PD_MAC_LEN)) {
		return CONN_REJ_AUTH_FAILED;
	}
	/* Only a request with a valid proof reaches the clock and replay checks. */
	uint64_t skew =
		req.time_ms > now_real_ms ? req.time_ms - now_real_ms : now_real_ms - req.time_ms;
	if (skew > CONN_AUTH_WINDOW_MS) {
		return CONN_REJ_CLOCK;
	}
	uint64_t key = get_u64(pd + 40);
	if (key == 0 || key == UINT64_MAX) {
		key = 1;
	}
	if (hmap_get(&t->replay, key)) {
		return CONN_REJ_REPLAY;
	}
	if (t->replay.count >= REPLAY_MAX) {
		replay_sweep(t, now_real_ms);
		if (t->replay.count >= REPLAY_MAX) {
			return CONN_REJ_RESOURCES;
		}
	}
	/* Remembered until a replay would fail the clock check anyway. */
	uint64_t expiry = req.time_ms + CONN_AUTH_WINDOW_MS + 1;
	if (hmap_put(&t->replay, key, (void *)(uintptr_t)expiry) < 0) {
		return CONN_REJ_RESOURCES;
	}
	*ret_req = req;
	return CONN_REJ_NONE;
}

int conn_pd_accept(uint8_t *buf, size_t size, const struct conn_table *t, const uint8_t *request,
		   const uint8_t server_addr[16], uint16_t server_port)
{
	size_t len = 16 + (t->key ? AUTH_MAC_BYTES : 0);

	if (size < len) {
		return -ENOSPC;
	}
	memset(buf, 0, len);
	put_u32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_ACCEPT;
	put_u64(buf + 8, t->instance);
	if (t->key) {
		struct auth_transcript tr;
		transcript_for(&tr, request, server_addr, server_port, t->instance);
		if (auth_compute(t->key, t->key_len, AUTH_ROLE_SERVER, &tr, buf + 16) < 0) {
			return -EINVAL;
		}
		buf[6] = 1;
	}
	return (int)len;
}

const char *conn_reject_reason_str(enum conn_reject_reason reason)
{
	static const char *const names[CONN_REJ_MAX] = {
		[CONN_REJ_NONE] = "accepted",
		[CONN_REJ_AUTH_REQUIRED] = "authentication required (it has a shared key)",
		[CONN_REJ_AUTH_FAILED] = "authentication failed (different shared key)",
		[CONN_REJ_AUTH_UNUSED] = "it has no shared key but the request carried a proof",
		[CONN_REJ_CLOCK] = "request time outside the allowed clock skew",
		[CONN_REJ_REPLAY] = "replayed connect request",
		[CONN_REJ_VERSION] = "unsupported protocol version or malformed request",
		[CONN_REJ_LIMIT] = "connection limit reached",
		[CONN_REJ_RESOURCES] = "no resources for another queue pair",
		[CONN_REJ_SHUTDOWN] = "shutting down",
	};
	return (unsigned)reason < CONN_REJ_MAX ? names[reason] : "unknown reason";
}

int conn_pd_reject(uint8_t *buf, size_t size, enum conn_reject_reason reason)
{
	const char *text = conn_reject_reason_str(reason);
	size_t len = 56;

	if (size < len) {
		return -ENOSPC;
	}
	memset(buf, 0, len);
	put_u32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_REJECT;
	buf[6] = (uint8_t)reason;
	memcpy(buf + 8, text, MIN(strlen(text), len - 9));
	return (int)len;
}

int conn_pd_type(const uint8_t *pd, size_t len)
{
	if (!pd || len < 8 || get_u32(pd) != CONN_PD_MAGIC || pd[4] != CONN_PD_VERSION ||
	    pd[5] == 0 || pd[5] >= CONN_PD_TYPE_MAX) {
		return 0;
	}
	return pd[5];
}

/*
 * Probe query (CONN_PD_REQ_LEN bytes):
 *   0 magic | 4 version | 5 type | 6 flags (bit 0: proof) | 7 access u8
 *   8 region_id u64 | 16 region_key u64 | 24 offset u64 | 32 length u64 | 40 proof[16]
 * Verdict (in the reject): 0 magic | 4 version | 5 type | 6..7 zero | 8 verdict i32
 * The query's proof has no nonce: a replayed query only repeats an answer to
 * whoever sent the original, and allocates nothing.
 */
static void query_transcript(struct auth_transcript *tr, const uint8_t *req,
			     const uint8_t server_addr[16], uint16_t server_port)
{
	uint8_t *s = tr->server_nonce;

	memset(tr, 0, sizeof(*tr));
	memcpy(tr->client_nonce, req, 32);
	memcpy(s, "VRQ1", 4);
	s[4] = (uint8_t)server_port;
	s[5] = (uint8_t)(server_port >> 8);
	memcpy(s + 8, req + 32, 8);
	memcpy(s + 16, server_addr, 16);
}

int conn_pd_query(uint8_t *buf, const struct conn_query *q, const uint8_t *key, size_t key_len,
		  const uint8_t server_addr[16], uint16_t server_port)
{
	struct auth_transcript tr;
	uint8_t mac[AUTH_MAC_BYTES];

	memset(buf, 0, CONN_PD_REQ_LEN);
	put_u32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_QUERY;
	buf[6] = key && key_len ? 1 : 0;
	buf[7] = (uint8_t)q->access;
	put_u64(buf + 8, q->region_id);
	put_u64(buf + 16, q->region_key);
	put_u64(buf + 24, q->offset);
	put_u64(buf + 32, q->length);
	if (key && key_len) {
		query_transcript(&tr, buf, server_addr, server_port);
		if (auth_compute(key, key_len, AUTH_ROLE_CLIENT, &tr, mac) == 0) {
			memcpy(buf + 40, mac, CONN_PD_MAC_LEN);
		}
	}
	return CONN_PD_REQ_LEN;
}

enum conn_reject_reason conn_pd_check_query(const struct conn_table *t, const uint8_t *pd,
					    size_t len, const uint8_t server_addr[16],
					    uint16_t server_port, struct conn_query *ret_query)
{
	struct conn_query q;

	if (len < CONN_PD_REQ_LEN || conn_pd_type(pd, len) != CONN_PD_QUERY) {
		return CONN_REJ_VERSION;
	}
	bool has_mac = pd[6] & 1;
	if (!t->key && has_mac) {
		return CONN_REJ_AUTH_UNUSED;
	}
	if (t->key) {
		struct auth_transcript tr;
		uint8_t mac[AUTH_MAC_BYTES];
		if (!has_mac) {
			return CONN_REJ_AUTH_REQUIRED;
		}
		query_transcript(&tr, pd, server_addr, server_port);
		if (auth_compute(t->key, t->key_len, AUTH_ROLE_CLIENT, &tr, mac) < 0 ||
		    !same_bytes(mac, pd + 40, CONN_PD_MAC_LEN)) {
			return CONN_REJ_AUTH_FAILED;
		}
	}
	q.access = pd[7];
	if (q.access != RDMAX_ACCESS_REMOTE_READ && q.access != RDMAX_ACCESS_REMOTE_WRITE) {
		return CONN_REJ_VERSION;
	}
	q.region_id = get_u64(pd + 8);
	q.region_key = get_u64(pd + 16);
	q.offset = get_u64(pd + 24);
	q.length = get_u64(pd + 32);
	*ret_query = q;
	return CONN_REJ_NONE;
}

int conn_pd_verdict(uint8_t *buf, size_t size, int verdict)
{
	if (size < 12) {
		return -ENOSPC;
	}
	memset(buf, 0, 12);
	put_u32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_VERDICT;
	put_u32(buf + 8, (uint32_t)verdict);
	return 12;
}

/* ============================================================== messages */

#define FRAME_VERSION 1
/* Statuses an answer may carry: 0 and the RDMAX_E_* range. */
#define STATUS_LOWEST  (-1199)
#define STATUS_HIGHEST (-1001)

uint32_t conn_msg_frames(uint64_t body_len)
{
	if (body_len == 0) {
		return 1;
	}
	return (uint32_t)((body_len + CONN_FRAME_DATA - 1) / CONN_FRAME_DATA);
}

uint32_t conn_msg_frame_len(uint64_t body_len, uint32_t index)
{
	uint64_t off = (uint64_t)index * CONN_FRAME_DATA;

	if (off >= body_len) {
		return CONN_FRAME_HDR;
	}
	return CONN_FRAME_HDR + (uint32_t)MIN((uint64_t)CONN_FRAME_DATA, body_len - off);
}

static void frame_header(uint8_t *p, enum conn_frame_type type, uint8_t name_len, uint8_t from_len,
			 uint64_t id, uint32_t a, uint32_t b)
{
	memset(p, 0, CONN_FRAME_HDR);
	put_u32(p, CONN_FRAME_MAGIC);
	p[4] = FRAME_VERSION;
	p[5] = (uint8_t)type;
	p[6] = name_len;
	p[7] = from_len;
	put_u64(p + 8, id);
	put_u32(p + 16, a);
	put_u32(p + 20, b);
}

int conn_msg_encode(uint8_t *staging, size_t size, uint64_t id, const char *name, const char *from,
		    const uint8_t *payload, uint32_t payload_len)
{
	size_t name_len = name ? strnlen(name, TRANSPORT_MAILBOX_NAME_MAX + 1) : 0;
	size_t from_len = from ? strnlen(from, CONN_FROM_MAX + 1) : 0;

	if (id == 0 || id == UINT64_MAX || name_len == 0 || name_len > TRANSPORT_MAILBOX_NAME_MAX ||
	    from_len > CONN_FROM_MAX || payload_len > TRANSPORT_MESSAGE_PAYLOAD_MAX ||
	    (payload_len > 0 && !payload)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	const uint8_t *src[3] = {(const uint8_t *)name, (const uint8_t *)from, payload};
	const uint32_t len[3] = {(uint32_t)name_len, (uint32_t)from_len, payload_len};
	uint32_t body_len = len[0] + len[1] + len[2];
	uint32_t frames = conn_msg_frames(body_len);
	if (size <
	    (size_t)(frames - 1) * CONN_FRAME_MAX + conn_msg_frame_len(body_len, frames - 1)) {
		return -ENOSPC;
	}
	for (uint32_t i = 0; i < frames; i++) {
		uint8_t *f = staging + (size_t)i * CONN_FRAME_MAX;
		uint32_t off = i * CONN_FRAME_DATA;
		uint32_t end = off + conn_msg_frame_len(body_len, i) - CONN_FRAME_HDR;
		uint32_t base = 0;

		frame_header(f, CONN_FRAME_MESSAGE, (uint8_t)name_len, (uint8_t)from_len, id,
			     payload_len, off);
		/* The body is name | from | payload: copy the part of each piece in [off, end). */
		for (int k = 0; k < 3; k++) {
			uint32_t s = MAX(off, base), e = MIN(end, base + len[k]);
			if (s < e) {
				memcpy(f + CONN_FRAME_HDR + (s - off), src[k] + (s - base), e - s);
			}
			base += len[k];
		}
	}
	return (int)body_len;
}

int conn_answer_encode(uint8_t *buf, size_t size, uint64_t id, int status, const char *text)
{
	size_t n = text ? strnlen(text, CONN_ANSWER_TEXT_MAX) : 0;

	if (size < CONN_FRAME_HDR + n) {
		return -ENOSPC;
	}
	frame_header(buf, CONN_FRAME_ANSWER, 0, 0, id, (uint32_t)status, (uint32_t)n);
	memcpy(buf + CONN_FRAME_HDR, text, n);
	return (int)(CONN_FRAME_HDR + n);
}

int conn_answer_encode_data(uint8_t *buf, size_t size, uint64_t id, const uint8_t *data, size_t len)
{
	if (len > CONN_ANSWER_DATA_MAX || size < CONN_FRAME_HDR + len) {
		return -ENOSPC;
	}
	frame_header(buf, CONN_FRAME_ANSWER, 0, 0, id, 0, (uint32_t)len);
	memcpy(buf + CONN_FRAME_HDR, data, len);
	return (int)(CONN_FRAME_HDR + len);
}

int conn_frame_decode(const uint8_t *buf, size_t len, struct conn_frame *ret_frame)
{
	struct conn_frame f;

	if (!buf || len < CONN_FRAME_HDR || len > CONN_FRAME_MAX ||
	    get_u32(buf) != CONN_FRAME_MAGIC || buf[4] != FRAME_VERSION) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	for (size_t i = 24; i < CONN_FRAME_HDR; i++) {
		if (buf[i]) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
	}
	memset(&f, 0, sizeof(f));
	f.id = get_u64(buf + 8);
	f.data = buf + CONN_FRAME_HDR;
	f.data_len = (uint32_t)(len - CONN_FRAME_HDR);
	if (f.id == 0 || f.id == UINT64_MAX) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	switch (buf[5]) {
	case CONN_FRAME_MESSAGE: {
		f.type = CONN_FRAME_MESSAGE;
		f.name_len = buf[6];
		f.from_len = buf[7];
		f.payload_len = get_u32(buf + 16);
		f.offset = get_u32(buf + 20);
		if (f.name_len == 0 || f.name_len > TRANSPORT_MAILBOX_NAME_MAX ||
		    f.from_len > CONN_FROM_MAX || f.payload_len > TRANSPORT_MESSAGE_PAYLOAD_MAX) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		/* Each term is bounded above, so the sum cannot wrap. */
		uint32_t body_len = (uint32_t)f.name_len + f.from_len + f.payload_len;
		if (f.offset >= body_len || f.offset % CONN_FRAME_DATA != 0 ||
		    f.data_len != MIN((uint32_t)CONN_FRAME_DATA, body_len - f.offset)) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		break;
	}
	case CONN_FRAME_ANSWER:
		f.type = CONN_FRAME_ANSWER;
		f.status = (int)(int32_t)get_u32(buf + 16);
		if (buf[6] || buf[7] || get_u32(buf + 20) != f.data_len ||
		    f.data_len > (f.status == 0 ? CONN_ANSWER_DATA_MAX : CONN_ANSWER_TEXT_MAX) ||
		    (f.status != 0 && (f.status < STATUS_LOWEST || f.status > STATUS_HIGHEST))) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		break;
	default:
		return RDMAX_E_PROTOCOL_ERROR;
	}
	*ret_frame = f;
	return 0;
}

void conn_msg_rx_reset(struct conn_msg_rx *rx)
{
	free(rx->owned);
	memset(rx, 0, sizeof(*rx));
}

int conn_msg_rx_feed(struct conn_msg_rx *rx, const struct conn_frame *f)
{
	uint32_t body_len = (uint32_t)f->name_len + f->from_len + f->payload_len;

	/* Checked again: a frame here need not come from conn_frame_decode(). */
	if (f->type != CONN_FRAME_MESSAGE || f->data_len == 0 || f->offset > body_len ||
	    f->data_len > body_len - f->offset || f->payload_len > TRANSPORT_MESSAGE_PAYLOAD_MAX ||
	    rx->body) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if (!rx->owned) {
		if (f->offset != 0) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		rx->id = f->id;
		rx->name_len = f->name_len;
		rx->from_len = f->from_len;
		rx->payload_len = f->payload_len;
		if (f->data_len == body_len) {
			/* One frame: used where it landed. */
			rx->got = body_len;
			rx->body = f->data;
			goto complete;
		}
		rx->owned = malloc(body_len);
		if (!rx->owned) {
			return -ENOMEM;
		}
	} else if (f->id != rx->id || f->name_len != rx->name_len || f->from_len != rx->from_len ||
		   f->payload_len != rx->payload_len || f->offset != rx->got) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	memcpy(rx->owned + rx->got, f->data, f->data_len);
	rx->got += f->data_len;
	if (rx->got < body_len) {
		return 0;
	}
	rx->body = rx->owned;
complete:
	for (uint32_t i = 0; i < rx->from_len; i++) {
		uint8_t c = rx->body[rx->name_len + i];
		if (c < 0x20 || c > 0x7e) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
	}
	return 1;
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
		return;
	}
	/* Before our completion: the last frame's retirement finishes it. */
	msg->answered = true;
	msg->status = status;
	memcpy(msg->text, text, sizeof(msg->text));
}
