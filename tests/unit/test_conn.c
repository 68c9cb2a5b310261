/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the verbs transport's pure logic, without a device:
 *  - suite "conn": the connection state machine driven by synthetic rdma_cm
 *    events, work completions and timer firings through fake conn_ops, the
 *    private data of connection set-up, and the work-completion error map;
 *  - in suite "conn", SEND messages: frames planned as SENDs on one link, the
 *    answer completing them in either order with the send completion, answers
 *    from the wrong link or for unknown ids ignored, and messages waiting for
 *    an answer failed exactly once by a disconnect or the peer watchdog.
 *  - case "random interleavings": seeded runs of a modelled posting thread
 *    and QPs under conn.c, interleaved with failures of every kind.
 * The send-queue planner has its own suite in test_sq_plan.c.
 * Every xfer's done callback is counted: each must run exactly once, and
 * never from inside conn_submit().
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "log.h"
#include "rdmax.h"
#include "txfer.h"
#include "verbs.h"

Suite *conn_suite(void);

/* ------------------------------------------------------------- fake ops */

#define MAX_POSTED 4096

struct posted {
	uint32_t link;
	const struct conn *conn;
	struct wr_desc wr;
};

struct fake {
	int starts, routes, connects, disconnects, destroys, timer_starts, timer_stops, kicks;
	int posts;   /* link_post calls (post lists) */
	int settles; /* link_settle calls */
	size_t max_list;
	uint64_t timer_ms;
	bool timer_on;
	int fail_connect; /* link_connect returns this when non-zero */
	int fail_post;
	size_t n_posted;
	struct posted posted[MAX_POSTED];
	struct conn *released[16];
	size_t n_released;
	struct conn_probe *probe; /* the last probe started */
	int probes, probe_destroys;
};

static struct fake g_fake;

/* The random-interleaving model (conn_model_exactly_once) sees the link ops when set. */
struct model;
static struct model *g_model;
static bool model_post(struct conn_link *link, const struct wr_desc *wrs, size_t n);
static void model_settle(struct conn_link *link);
static void model_disconnect(struct conn_link *link);
static void model_destroy(struct conn_link *link);

static int f_link_start(void *ctx, struct conn_link *link, char *why, size_t why_size)
{
	g_fake.starts++;
	link->priv = &g_fake;
	return 0;
}

static int f_link_resolve_route(void *ctx, struct conn_link *link, char *why, size_t why_size)
{
	g_fake.routes++;
	return 0;
}

static int f_link_connect(void *ctx, struct conn_link *link, const uint8_t *pd, size_t pd_len,
			  char *why, size_t why_size)
{
	struct conn_table *t = link->conn->table;

	g_fake.connects++;
	ck_assert_uint_eq(pd_len, CONN_PD_REQ_LEN);
	if (g_fake.fail_connect) {
		snprintf(why, why_size, "fake connect failure");
		return g_fake.fail_connect;
	}
	sq_plan_fini(&link->sq);
	return sq_plan_init(&link->sq, t->policy.sq_depth, t->policy.signal_interval,
			    t->policy.inline_threshold, t->policy.max_wr_bytes);
}

static void f_link_disconnect(void *ctx, struct conn_link *link)
{
	g_fake.disconnects++;
	if (g_model) {
		model_disconnect(link);
	}
}

static int f_link_post(void *ctx, struct conn_link *link, const struct wr_desc *wrs, size_t n,
		       char *why, size_t why_size)
{
	g_fake.posts++;
	g_fake.max_list = MAX(g_fake.max_list, n);
	if (g_fake.fail_post) {
		snprintf(why, why_size, "fake post failure");
		return g_fake.fail_post;
	}
	if (g_model) {
		if (!model_post(link, wrs, n)) {
			snprintf(why, why_size, "no queue pair");
			return -EINVAL;
		}
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_lt(g_fake.n_posted, MAX_POSTED);
		g_fake.posted[g_fake.n_posted].link = link->index;
		g_fake.posted[g_fake.n_posted].conn = link->conn;
		g_fake.posted[g_fake.n_posted].wr = wrs[i];
		g_fake.n_posted++;
	}
	return 0;
}

static void f_link_settle(void *ctx, struct conn_link *link)
{
	g_fake.settles++;
	if (g_model) {
		model_settle(link);
	}
}

static void f_link_destroy(void *ctx, struct conn_link *link)
{
	g_fake.destroys++;
	if (g_model) {
		model_destroy(link);
	}
	link->priv = NULL;
}

static void f_timer_start(void *ctx, struct conn *conn, uint64_t ms)
{
	g_fake.timer_starts++;
	g_fake.timer_ms = ms;
	g_fake.timer_on = true;
}

static void f_timer_stop(void *ctx, struct conn *conn)
{
	g_fake.timer_stops++;
	g_fake.timer_on = false;
}

static void f_kick(void *ctx)
{
	g_fake.kicks++;
}

static void f_release(void *ctx, struct conn *conn)
{
	ck_assert_uint_lt(g_fake.n_released, ARRAY_SIZE(g_fake.released));
	g_fake.released[g_fake.n_released++] = conn;
}

static int f_probe_start(void *ctx, struct conn_probe *probe, char *why, size_t why_size)
{
	g_fake.probes++;
	g_fake.probe = probe;
	probe->priv = &g_fake;
	return 0;
}

static void f_probe_destroy(void *ctx, struct conn_probe *probe)
{
	g_fake.probe_destroys++;
	ck_assert_ptr_eq(probe->priv, &g_fake);
	probe->priv = NULL;
	if (g_fake.probe == probe) {
		g_fake.probe = NULL;
	}
}

static const struct conn_ops g_fake_ops = {
	.link_start = f_link_start,
	.link_resolve_route = f_link_resolve_route,
	.link_connect = f_link_connect,
	.link_disconnect = f_link_disconnect,
	.link_post = f_link_post,
	.link_settle = f_link_settle,
	.link_destroy = f_link_destroy,
	.timer_start = f_timer_start,
	.timer_stop = f_timer_stop,
	.kick = f_kick,
	.release = f_release,
	.probe_start = f_probe_start,
	.probe_destroy = f_probe_destroy,
};

static struct conn_policy test_policy(void)
{
	struct conn_policy p = {
		.links = 2,
		.sq_depth = 16,
		.signal_interval = 4,
		.inline_threshold = 64,
		.batch = 4,
		.max_wr_bytes = 1 << 20,
		.connect_timeout_ms = 1000,
		.connect_retries = 2,
		.retry_backoff_ms = 100,
		.drain_timeout_ms = 2000,
		.peer_timeout_ms = 5000,
		.idle_timeout_s = 10,
		.max_connections = 8,
	};
	return p;
}

#define PEER_INSTANCE 0x1111222233334444ull
#define SELF_INSTANCE 0xaaaabbbbccccddddull

static void table_setup(struct conn_table *t, const struct conn_policy *p, const char *key)
{
	memset(&g_fake, 0, sizeof(g_fake));
	log_set_level(LOG_ERR); /* the state machine narrates at info level */
	ck_assert_int_eq(conn_table_init(t, p, &g_fake_ops, NULL, SELF_INSTANCE,
					 (const uint8_t *)key, key ? strlen(key) : 0),
			 0);
}

static void table_teardown(struct conn_table *t)
{
	conn_table_work(t, 0);
	for (size_t i = 0; i < g_fake.n_released; i++) {
		conn_free(g_fake.released[i]);
	}
	g_fake.n_released = 0;
	conn_table_fini(t);
}

static struct conn *the_conn(struct conn_table *t)
{
	ck_assert_msg(!list_empty(&t->conns), "no connection");
	return container_of(t->conns.next, struct conn, link);
}

/* The accept a peer daemon would send for this link's request. */
static size_t peer_accept(uint8_t *buf, size_t size, const struct conn_link *link,
			  const char *peer_key, uint64_t instance)
{
	struct conn_table server;
	struct conn_policy p = test_policy();
	uint8_t addr[16];

	ck_assert_int_eq(conn_table_init(&server, &p, &g_fake_ops, NULL, instance,
					 (const uint8_t *)peer_key,
					 peer_key ? strlen(peer_key) : 0),
			 0);
	ck_assert_int_eq(conn_addr_parse(link->conn->peer.addr, addr), 0);
	int len = conn_pd_accept(buf, size, &server, link->request, addr, link->conn->peer.port);
	ck_assert_int_gt(len, 0);
	conn_table_fini(&server);
	return (size_t)len;
}

static void event(struct conn_link *link, enum conn_event ev, const uint8_t *pd, size_t len,
		  int status, uint64_t now)
{
	struct conn_event_data data = {.private_data = pd, .private_len = len, .status = status};

	conn_link_event(link, ev, &data, now);
}

static void connect_links(struct conn *conn, const char *peer_key, uint64_t instance, uint64_t now);

/* Drive one attempt of conn from BACKOFF to ESTABLISHED. */
static void connect_all(struct conn *conn, const char *peer_key, uint64_t instance, uint64_t now)
{
	ck_assert_int_eq(conn->state, CONN_BACKOFF);
	conn_timer_fired(conn, now);
	connect_links(conn, peer_key, instance, now);
}

/* The rest of an attempt already started (conn CONNECTING): every link established. */
static void connect_links(struct conn *conn, const char *peer_key, uint64_t instance, uint64_t now)
{
	uint8_t pd[128];

	ck_assert_int_eq(conn->state, CONN_CONNECTING);
	for (uint32_t i = 0; i < conn->n_links; i++) {
		event(&conn->links[i], CONN_EV_ADDR_RESOLVED, NULL, 0, 0, now);
		event(&conn->links[i], CONN_EV_ROUTE_RESOLVED, NULL, 0, 0, now);
		ck_assert_int_eq(conn->links[i].state, LINK_CONNECTING);
	}
	for (uint32_t i = 0; i < conn->n_links; i++) {
		size_t len = peer_accept(pd, sizeof(pd), &conn->links[i], peer_key, instance);
		event(&conn->links[i], CONN_EV_ESTABLISHED, pd, len, 0, now);
	}
}

/* Complete every posted WR of a link up to and including seq with status. */
static void wc(struct conn *conn, uint32_t link, uint64_t seq, int status)
{
	conn_link_wc(&conn->links[link], seq, status, 0, 1);
}

/* The posted WRs of one link, in order. */
static size_t posted_on(uint32_t link, struct wr_desc *out, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < g_fake.n_posted && n < max; i++) {
		if (g_fake.posted[i].link == link) {
			out[n++] = g_fake.posted[i].wr;
		}
	}
	return n;
}

/* ================================================================ conn */

START_TEST(conn_connect_success)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a, b;

	table_setup(&t, &p, NULL);
	unit_txfer_init(&a, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&b, XFER_READ, 100, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	ck_assert_int_eq(conn_submit(&t, &b.x, 0), 0);
	/* Nothing happens inside submit: the attempt starts from the timer. */
	ck_assert_int_eq(g_fake.starts, 0);
	ck_assert(g_fake.timer_on);
	ck_assert_uint_eq(g_fake.timer_ms, 0);
	struct conn *conn = the_conn(&t);
	ck_assert_uint_eq(conn->n_links, 2);

	connect_all(conn, NULL, PEER_INSTANCE, 1);
	ck_assert_int_eq(g_fake.starts, 2);
	ck_assert_int_eq(g_fake.routes, 2);
	ck_assert_int_eq(g_fake.connects, 2);
	ck_assert_int_eq(conn->state, CONN_ESTABLISHED);
	ck_assert_uint_eq(conn->peer_instance, PEER_INSTANCE);
	ck_assert(!g_fake.timer_on);
	ck_assert_int_eq(a.calls + b.calls, 0);

	conn_table_work(&t, 2);
	/* Round-robin: one xfer on each link, each its own signaled WR. */
	ck_assert_uint_eq(g_fake.n_posted, 2);
	ck_assert_uint_ne(g_fake.posted[0].link, g_fake.posted[1].link);
	for (size_t i = 0; i < 2; i++) {
		ck_assert(g_fake.posted[i].wr.signaled);
	}
	ck_assert_uint_eq(t.outstanding_wrs, 2);
	for (size_t i = 0; i < 2; i++) {
		wc(conn, g_fake.posted[i].link, g_fake.posted[i].wr.seq, IBV_WC_SUCCESS);
	}
	ck_assert_int_eq(a.calls + b.calls, 0); /* delivered from work, not from the WC */
	conn_table_work(&t, 3);
	ck_assert_int_eq(a.calls, 1);
	ck_assert_int_eq(b.calls, 1);
	ck_assert_int_eq(a.err, 0);
	ck_assert_int_eq(b.err, 0);
	ck_assert_uint_eq(a.x.bytes_done, 4096);
	ck_assert_uint_eq(t.outstanding_wrs, 0);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_reject_app_reason)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a;
	uint8_t pd[64];

	table_setup(&t, &p, "key-one-0123456789abcdef");
	unit_txfer_init(&a, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	struct conn *conn = the_conn(&t);
	conn_timer_fired(conn, 0);
	event(&conn->links[0], CONN_EV_ADDR_RESOLVED, NULL, 0, 0, 0);
	event(&conn->links[0], CONN_EV_ROUTE_RESOLVED, NULL, 0, 0, 0);
	/* The request carries a proof because this daemon has a key. */
	ck_assert_uint_eq(conn->links[0].request[6] & 1, 1);
	int len = conn_pd_reject(pd, sizeof(pd), CONN_REJ_AUTH_FAILED);
	ck_assert_int_gt(len, 0);
	int starts = g_fake.starts;
	event(&conn->links[0], CONN_EV_REJECTED, pd, (size_t)len, 28, 1);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	ck_assert_int_eq(g_fake.starts, starts); /* an application reject is not retried */
	ck_assert_int_eq(g_fake.destroys, 2);
	conn_table_work(&t, 2);
	ck_assert_int_eq(a.calls, 1);
	ck_assert_int_eq(a.err, RDMAX_E_PERMISSION_DENIED);
	ck_assert_msg(strstr(a.msg, "authentication failed"), "message: %s", a.msg);
	ck_assert_msg(strstr(a.msg, "192.0.2.2:7471"), "message: %s", a.msg);
	ck_assert_uint_eq(g_fake.n_released, 1);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_unreachable_retries)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a, b;

	p.connect_retries = 2;
	p.retry_backoff_ms = 100;
	table_setup(&t, &p, NULL);
	unit_txfer_init(&a, XFER_WRITE, 64, PEER_INSTANCE);
	unit_txfer_init(&b, XFER_READ, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	ck_assert_int_eq(conn_submit(&t, &b.x, 0), 0);
	struct conn *conn = the_conn(&t);

	/* Attempt 1: a reject from the peer's kernel (no listener), no private data. */
	conn_timer_fired(conn, 0);
	event(&conn->links[0], CONN_EV_ADDR_RESOLVED, NULL, 0, 0, 0);
	event(&conn->links[0], CONN_EV_ROUTE_RESOLVED, NULL, 0, 0, 0);
	event(&conn->links[0], CONN_EV_REJECTED, NULL, 0, 28, 0);
	ck_assert_int_eq(conn->state, CONN_BACKOFF);
	ck_assert_uint_eq(g_fake.timer_ms, 100);
	/* Attempt 2: unreachable; the backoff doubles. */
	conn_timer_fired(conn, 100);
	event(&conn->links[1], CONN_EV_UNREACHABLE, NULL, 0, -110, 100);
	ck_assert_int_eq(conn->state, CONN_BACKOFF);
	ck_assert_uint_eq(g_fake.timer_ms, 200);
	/* Attempt 3: the connect timer fires. */
	conn_timer_fired(conn, 300);
	ck_assert_int_eq(conn->state, CONN_CONNECTING);
	ck_assert_uint_eq(g_fake.timer_ms, p.connect_timeout_ms);
	ck_assert_int_eq(a.calls + b.calls, 0);
	conn_timer_fired(conn, 1300);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	ck_assert_int_eq(g_fake.starts, 6);
	ck_assert_int_eq(g_fake.destroys, 6);
	conn_table_work(&t, 1300);
	ck_assert_int_eq(a.calls, 1);
	ck_assert_int_eq(b.calls, 1);
	ck_assert_int_eq(a.err, RDMAX_E_UNREACHABLE);
	ck_assert_int_eq(b.err, RDMAX_E_UNREACHABLE);
	ck_assert_msg(strstr(a.msg, "after 3 attempts"), "message: %s", a.msg);
	conn_table_work(&t, 1301);
	ck_assert_int_eq(a.calls, 1);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_disconnect_mid_flight)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer x[12];
	struct wr_desc w0[16], w1[16];

	p.sq_depth = 6; /* 5 credits per link: 10 post, 2 wait */
	table_setup(&t, &p, NULL);
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		unit_txfer_init(&x[i], i % 3 ? XFER_WRITE : XFER_READ, 1000 + i, PEER_INSTANCE);
		ck_assert_int_eq(conn_submit(&t, &x[i].x, 0), 0);
	}
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);
	ck_assert_uint_eq(g_fake.n_posted, 10);
	ck_assert_uint_eq(conn->n_pending, 2);
	size_t n0 = posted_on(0, w0, 16), n1 = posted_on(1, w1, 16);
	ck_assert_uint_eq(n0, 5);
	ck_assert_uint_eq(n1, 5);

	/* Signaled: the 4th (interval 4) and the last of each list. */
	ck_assert(!w0[0].signaled && !w0[1].signaled && !w0[2].signaled);
	ck_assert(w0[3].signaled && w0[4].signaled);
	/* The 4th completes: its completion retires the three unsignaled ones too. */
	wc(conn, 0, w0[3].seq, IBV_WC_SUCCESS);
	conn_table_work(&t, 3);
	int done = 0;
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		done += x[i].calls;
	}
	/* Four xfers done, and their credits let the two pending ones go out on link 0. */
	ck_assert_int_eq(done, 4);
	ck_assert_uint_eq(conn->n_pending, 0);
	ck_assert_uint_eq(posted_on(0, w0, 16), 7);

	/* The peer disconnects: QPs in error, markers posted on both links. */
	int posted_before = (int)g_fake.n_posted;
	event(&conn->links[1], CONN_EV_DISCONNECTED, NULL, 0, 0, 4);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	ck_assert_int_eq(g_fake.disconnects, 2);
	ck_assert_int_eq((int)g_fake.n_posted, posted_before + 2);
	struct wr_desc m0 = g_fake.posted[posted_before].wr;
	struct wr_desc m1 = g_fake.posted[posted_before + 1].wr;
	ck_assert_int_eq(m0.kind, WR_MARKER);
	ck_assert_int_eq(m1.kind, WR_MARKER);
	ck_assert(m0.signaled && m1.signaled);
	/* A new submit goes to a new connection, not to the draining one. */
	struct txfer late;
	unit_txfer_init(&late, XFER_WRITE, 8, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &late.x, 4), 0);
	ck_assert_uint_eq(t.n_conns, 2);

	/* Link 0 flushes some WRs with completions (rxe does), link 1 none. */
	wc(conn, 0, w0[4].seq, IBV_WC_WR_FLUSH_ERR);
	wc(conn, 0, w0[5].seq, IBV_WC_WR_FLUSH_ERR);
	conn_table_work(&t, 5);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	wc(conn, 0, m0.seq, IBV_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	wc(conn, 1, m1.seq, IBV_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	/* Late or repeated completions change nothing. */
	wc(conn, 0, w0[5].seq, IBV_WC_WR_FLUSH_ERR);
	wc(conn, 1, w1[0].seq, IBV_WC_SUCCESS);
	conn_table_work(&t, 6);
	done = 0;
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		ck_assert_msg(x[i].calls == 1, "xfer %zu completed %d times", i, x[i].calls);
		if (x[i].err != 0) {
			ck_assert_int_eq(x[i].err, RDMAX_E_TRANSPORT_ERROR);
			ck_assert_msg(strstr(x[i].msg, "disconnected"), "message: %s", x[i].msg);
			done++;
		}
	}
	ck_assert_int_eq(done, 8);
	ck_assert_int_eq(late.calls, 0);
	ck_assert_uint_eq(g_fake.n_released, 1);
	ck_assert_uint_eq(t.outstanding_wrs, 0);
	conn_table_shutdown(&t);
	conn_table_work(&t, 7);
	ck_assert_int_eq(late.calls, 1);
	ck_assert_int_eq(late.err, RDMAX_E_CANCELLED);
	table_teardown(&t);
}
END_TEST

/* A table with policy p, n 512-byte WRITEs submitted, connected and posted. */
static struct conn *connected_writes(struct conn_table *t, const struct conn_policy *p,
				     struct txfer *x, size_t n)
{
	table_setup(t, p, NULL);
	for (size_t i = 0; i < n; i++) {
		unit_txfer_init(&x[i], XFER_WRITE, 512, PEER_INSTANCE);
		ck_assert_int_eq(conn_submit(t, &x[i].x, 0), 0);
	}
	struct conn *conn = the_conn(t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(t, 2);
	return conn;
}

START_TEST(conn_wc_error_fails_cause_and_flushes_rest)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer x[4];
	struct wr_desc w[8];

	p.links = 1;
	p.signal_interval = 16;
	struct conn *conn = connected_writes(&t, &p, x, ARRAY_SIZE(x));
	ck_assert_uint_eq(posted_on(0, w, 8), 4);
	/* One post list; only its last WR is signaled (interval 16). */
	ck_assert(!w[0].signaled && !w[1].signaled && !w[2].signaled && w[3].signaled);
	/* WR 1 fails: WR 0 completed before it (RC order), 2 and 3 flush. */
	wc(conn, 0, w[1].seq, IBV_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	wc(conn, 0, w[2].seq, IBV_WC_WR_FLUSH_ERR);
	wc(conn, 0, w[3].seq, IBV_WC_WR_FLUSH_ERR);
	struct wr_desc marker = g_fake.posted[g_fake.n_posted - 1].wr;
	ck_assert_int_eq(marker.kind, WR_MARKER);
	wc(conn, 0, marker.seq, IBV_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	conn_table_work(&t, 3);
	/* x1 waits for the owner's verdict, and x2, x3 wait behind it. */
	ck_assert_int_eq(g_fake.probes, 1);
	ck_assert_int_eq(x[0].calls, 1);
	ck_assert_int_eq(x[1].calls + x[2].calls + x[3].calls, 0);
	conn_probe_answer(g_fake.probe, NULL, 0); /* no answer: the NIC's verdict stands */
	ck_assert_int_eq(g_fake.probe_destroys, 1);
	conn_table_work(&t, 4);
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		ck_assert_int_eq(x[i].calls, 1);
	}
	ck_assert_int_lt(x[1].order, x[2].order);
	ck_assert_int_eq(x[0].err, 0);
	ck_assert_int_eq(x[1].err, RDMAX_E_REMOTE_ACCESS);
	ck_assert_msg(strstr(x[1].msg, "remote access error") && strstr(x[1].msg, "192.0.2.2:7471"),
		      "message: %s", x[1].msg);
	ck_assert_int_eq(x[2].err, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(x[3].err, RDMAX_E_TRANSPORT_ERROR);
	table_teardown(&t);
}
END_TEST

/*
 * What the collateral xfers of a failed connection say: the cause when a
 * completion named one (on any link), and where it is to be found when the
 * first failure was a flush (the QP went to error before any event or
 * completion said why).
 */
START_TEST(conn_collateral_message_names_the_cause)
{
	for (int flush_first = 0; flush_first < 2; flush_first++) {
		struct conn_table t;
		struct conn_policy p = test_policy();
		struct txfer x[4];
		struct wr_desc w0[8], w1[8];

		p.signal_interval = 1;
		struct conn *conn = connected_writes(&t, &p, x, ARRAY_SIZE(x));
		size_t n0 = posted_on(0, w0, 8), n1 = posted_on(1, w1, 8);
		ck_assert_uint_eq(n0 + n1, 4);
		ck_assert_uint_ge(n0, 1);
		ck_assert_uint_ge(n1, 1);
		/* Link 1's first WR: flushed, or refused by retries (the cause). */
		wc(conn, 1, w1[0].seq, flush_first ? IBV_WC_WR_FLUSH_ERR : IBV_WC_RETRY_EXC_ERR);
		ck_assert_int_eq(conn->state, CONN_DRAINING);
		for (size_t k = 1; k < n1; k++) {
			wc(conn, 1, w1[k].seq, IBV_WC_WR_FLUSH_ERR);
		}
		for (size_t k = 0; k < n0; k++) {
			wc(conn, 0, w0[k].seq, IBV_WC_WR_FLUSH_ERR);
		}
		size_t n_all = g_fake.n_posted;
		for (size_t k = 0; k < n_all; k++) {
			if (g_fake.posted[k].wr.kind == WR_MARKER) {
				wc(conn, g_fake.posted[k].link, g_fake.posted[k].wr.seq,
				   IBV_WC_WR_FLUSH_ERR);
			}
		}
		ck_assert_int_eq(conn->state, CONN_CLOSED);
		conn_table_work(&t, 3);
		for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
			ck_assert_int_eq(x[i].calls, 1);
			ck_assert_int_ne(x[i].err, 0);
			ck_assert_msg(strstr(x[i].msg, "192.0.2.2:7471"), "message: %s", x[i].msg);
			ck_assert_msg(!strstr(x[i].msg, "Work Request Flushed Error"),
				      "message: %s", x[i].msg);
			if (flush_first) {
				ck_assert_int_eq(x[i].err, RDMAX_E_TRANSPORT_ERROR);
				ck_assert_msg(strstr(x[i].msg, "flushed before any completion "
							       "named a cause"),
					      "message: %s", x[i].msg);
			} else {
				ck_assert_msg(strstr(x[i].msg, "no acknowledgement from the peer"),
					      "message: %s", x[i].msg);
			}
		}
		table_teardown(&t);
	}
}
END_TEST

/*
 * The peer's device refuses one access (its region was deregistered): that
 * xfer, and another to the same region, fail by name; xfers to other regions
 * on the broken connection, posted and flushed or never posted, go again on
 * a new connection and complete OK there, each done exactly once. One of them
 * withdrawn before it went again is done at once instead. An xfer goes again
 * at most CONN_REQUEUE_MAX times.
 */
START_TEST(conn_refused_access_requeues_others)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer bad, same, other, gone, q;

	p.links = 1;
	p.sq_depth = 5; /* 4 credits: bad, same, other, gone post; q waits */
	table_setup(&t, &p, NULL);
	unit_txfer_init(&bad, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&same, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&other, XFER_READ, 4096, PEER_INSTANCE);
	unit_txfer_init(&gone, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&q, XFER_WRITE, 4096, PEER_INSTANCE);
	bad.x.remote_region = same.x.remote_region = 5;
	other.x.remote_region = 6;
	gone.x.remote_region = 7;
	q.x.remote_region = 8;
	struct txfer *all[] = {&bad, &same, &other, &gone, &q};
	for (size_t i = 0; i < ARRAY_SIZE(all); i++) {
		ck_assert_int_eq(conn_submit(&t, &all[i]->x, 0), 0);
	}
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);
	ck_assert_uint_eq(g_fake.n_posted, 4);
	ck_assert_uint_eq(conn->n_pending, 1);

	wc(conn, 0, g_fake.posted[0].wr.seq, IBV_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	struct wr_desc marker = g_fake.posted[g_fake.n_posted - 1].wr;
	ck_assert_int_eq(marker.kind, WR_MARKER);
	wc(conn, 0, marker.seq, IBV_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	/* gone's job completes before it went again: done follows, nothing is sent. */
	ck_assert_int_eq(conn_withdraw(&t, &gone.x, 3), -EINPROGRESS);
	conn_table_work(&t, 3);
	ck_assert_int_eq(gone.calls, 1);
	ck_assert_int_eq(gone.err, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(bad.calls + same.calls + other.calls + q.calls, 0);
	conn_probe_answer(g_fake.probe, NULL, 0);
	conn_table_work(&t, 4);
	ck_assert_int_eq(bad.calls, 1);
	ck_assert_int_eq(bad.err, RDMAX_E_REMOTE_ACCESS);
	ck_assert_int_eq(same.calls, 1);
	ck_assert_int_eq(same.err, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(other.calls + q.calls, 0);

	/* A new connection carries the other two. */
	ck_assert_uint_eq(t.n_conns, 1);
	struct conn *again = the_conn(&t);
	ck_assert_ptr_ne(again, conn);
	connect_all(again, NULL, PEER_INSTANCE, 5);
	size_t before = g_fake.n_posted;
	conn_table_work(&t, 6);
	ck_assert_uint_eq(g_fake.n_posted, before + 2);
	wc(again, 0, g_fake.posted[g_fake.n_posted - 1].wr.seq, IBV_WC_SUCCESS);
	conn_table_work(&t, 7);
	ck_assert_int_eq(other.calls, 1);
	ck_assert_int_eq(other.err, 0);
	ck_assert_int_eq(q.calls, 1);
	ck_assert_int_eq(q.err, 0);
	ck_assert_int_eq(gone.calls, 1);
	ck_assert_int_eq(bad.calls + same.calls, 2);

	/* Faults of other regions, again and again: q goes again at most 3 times. */
	struct txfer faults[CONN_REQUEUE_MAX + 1];
	for (int round = 0; round <= CONN_REQUEUE_MAX; round++) {
		unit_txfer_init(&faults[round], XFER_WRITE, 64, PEER_INSTANCE);
		faults[round].x.remote_region = 100 + (uint64_t)round;
	}
	unit_txfer_init(&q, XFER_WRITE, 64, PEER_INSTANCE);
	q.x.remote_region = 8;
	ck_assert_int_eq(conn_submit(&t, &faults[0].x, 10), 0);
	ck_assert_int_eq(conn_submit(&t, &q.x, 10), 0);
	for (int round = 0; round <= CONN_REQUEUE_MAX; round++) {
		struct conn *c = container_of(t.conns.prev, struct conn, link);
		if (c->state == CONN_BACKOFF) {
			connect_all(c, NULL, PEER_INSTANCE, 10);
		}
		before = g_fake.n_posted;
		conn_table_work(&t, 11);
		ck_assert_uint_eq(g_fake.n_posted, before + 2);
		/* The fault is posted first: q, behind it, flushes. */
		ck_assert_ptr_eq(g_fake.posted[before].wr.xfer, &faults[round].x);
		wc(c, 0, g_fake.posted[before].wr.seq, IBV_WC_REM_ACCESS_ERR);
		marker = g_fake.posted[g_fake.n_posted - 1].wr;
		wc(c, 0, marker.seq, IBV_WC_WR_FLUSH_ERR);
		conn_probe_answer(g_fake.probe, NULL, 0);
		if (round < CONN_REQUEUE_MAX) {
			/* The next fault goes to the next connection ahead of q. */
			ck_assert_int_eq(conn_submit(&t, &faults[round + 1].x, 12), 0);
		}
		conn_table_work(&t, 12);
		ck_assert_int_eq(faults[round].calls, 1);
		ck_assert_msg(q.calls == (round == CONN_REQUEUE_MAX ? 1 : 0), "round %d: %d calls",
			      round, q.calls);
	}
	ck_assert_int_eq(q.err, RDMAX_E_TRANSPORT_ERROR);
	table_teardown(&t);
}
END_TEST

/*
 * A refused access on one link does not cut the others short: the xfer the
 * other link carries completes OK after the refusal, then that link drains
 * too and the connection closes; nothing new is posted on it meanwhile.
 */
START_TEST(conn_refused_access_other_link_finishes)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer bad, good, late;

	table_setup(&t, &p, NULL); /* two links */
	unit_txfer_init(&bad, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&good, XFER_WRITE, 4096, PEER_INSTANCE);
	bad.x.remote_region = 5;
	good.x.remote_region = 6;
	ck_assert_int_eq(conn_submit(&t, &bad.x, 0), 0);
	ck_assert_int_eq(conn_submit(&t, &good.x, 0), 0);
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);
	ck_assert_uint_eq(g_fake.n_posted, 2);
	struct posted pb = g_fake.posted[0], pg = g_fake.posted[1];
	ck_assert_ptr_eq(pb.wr.xfer, &bad.x);
	ck_assert_uint_ne(pb.link, pg.link);

	int disconnects = g_fake.disconnects;
	wc(conn, pb.link, pb.wr.seq, IBV_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	ck_assert_int_eq(g_fake.disconnects, disconnects + 1); /* the refused link only */
	ck_assert_int_eq(conn->links[pg.link].state, LINK_UP);
	/* A new xfer goes to a new connection. */
	unit_txfer_init(&late, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &late.x, 3), 0);
	ck_assert_uint_eq(t.n_conns, 2);

	/* Nothing was behind the refused WR: its link is drained already. */
	ck_assert_int_eq(conn->links[pb.link].state, LINK_DRAINED);
	wc(conn, pg.link, pg.wr.seq, IBV_WC_SUCCESS);
	ck_assert_int_eq(g_fake.disconnects, disconnects + 2);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	conn_table_work(&t, 4);
	ck_assert_int_eq(good.calls, 1);
	ck_assert_int_eq(good.err, 0);
	conn_probe_answer(g_fake.probe, NULL, 0);
	conn_table_work(&t, 5);
	ck_assert_int_eq(bad.calls, 1);
	ck_assert_int_eq(bad.err, RDMAX_E_REMOTE_ACCESS);
	ck_assert_int_eq(late.calls, 0);
	conn_table_shutdown(&t);
	conn_table_work(&t, 6);
	ck_assert_int_eq(late.calls, 1);
	table_teardown(&t);
}
END_TEST

/*
 * Both links refuse writes to one deregistered region: the first refusal is
 * asked about, the second waits for that verdict, so the first error of the
 * job is the owner's NOT_FOUND; the second link drains too.
 */
START_TEST(conn_refused_access_on_both_links)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer x0, x1;
	uint8_t pd[16];

	table_setup(&t, &p, NULL);
	unit_txfer_init(&x0, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&x1, XFER_WRITE, 4096, PEER_INSTANCE);
	x0.x.remote_region = x1.x.remote_region = 9;
	ck_assert_int_eq(conn_submit(&t, &x0.x, 0), 0);
	ck_assert_int_eq(conn_submit(&t, &x1.x, 0), 0);
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);
	ck_assert_uint_eq(g_fake.n_posted, 2);
	struct posted p0 = g_fake.posted[0], p1 = g_fake.posted[1];
	wc(conn, p0.link, p0.wr.seq, IBV_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(g_fake.probes, 1);
	ck_assert_int_eq(conn->links[p1.link].state, LINK_UP);
	wc(conn, p1.link, p1.wr.seq, IBV_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(g_fake.probes, 1);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	conn_table_work(&t, 3);
	ck_assert_int_eq(x0.calls + x1.calls, 0);
	int len = conn_pd_verdict(pd, sizeof(pd), RDMAX_E_NOT_FOUND);
	conn_probe_answer(g_fake.probe, pd, (size_t)len);
	conn_table_work(&t, 4);
	struct txfer *first = p0.wr.xfer == &x0.x ? &x0 : &x1;
	struct txfer *second = first == &x0 ? &x1 : &x0;
	ck_assert_int_eq(first->calls, 1);
	ck_assert_int_eq(first->err, RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(second->calls, 1);
	ck_assert_int_lt(first->order, second->order);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_probe_verdicts)
{
	static const struct {
		int verdict;
		int err;
		const char *text;
		uint32_t domain; /* the descriptor's protection domain at the owner */
	} cases[] = {
		{RDMAX_E_NOT_FOUND, RDMAX_E_NOT_FOUND, "not registered", 0},
		{RDMAX_E_OUT_OF_RANGE, RDMAX_E_OUT_OF_RANGE, "outside region 42", 0},
		{RDMAX_E_PERMISSION_DENIED, RDMAX_E_REMOTE_ACCESS, "does not grant remote write",
		 0},
		{0, RDMAX_E_REMOTE_ACCESS, "rkey or address is wrong", 0},
		/* The owner grants it, yet its NIC refused: the rkey is not in that domain. */
		{0, RDMAX_E_REMOTE_ACCESS, "region 42 is not in protection domain 9", 9},
	};
	struct conn_policy p = test_policy();

	p.links = 1;
	for (size_t k = 0; k < ARRAY_SIZE(cases); k++) {
		struct conn_table t, owner;
		struct txfer a, b;
		struct conn_query q;
		uint8_t addr[16], pd[16];

		table_setup(&t, &p, NULL);
		unit_txfer_init(&a, XFER_WRITE, 4096, PEER_INSTANCE);
		a.x.remote_region = 42;
		a.x.remote_key = 0x1234;
		a.x.remote_offset = 100;
		unit_txfer_init(&b, XFER_WRITE, 4096, PEER_INSTANCE);
		b.x.remote_region = 42; /* to the same region: not sent again */
		a.x.peer.domain = b.x.peer.domain = cases[k].domain;
		a.x.peer.domain_token = b.x.peer.domain_token = cases[k].domain ? 77 : 0;
		ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
		ck_assert_int_eq(conn_submit(&t, &b.x, 0), 0);
		struct conn *conn = the_conn(&t);
		connect_all(conn, NULL, PEER_INSTANCE, 1);
		conn_table_work(&t, 2);
		ck_assert_uint_eq(g_fake.n_posted, 2);
		wc(conn, 0, g_fake.posted[0].wr.seq, IBV_WC_REM_ACCESS_ERR);
		ck_assert_ptr_nonnull(g_fake.probe);
		/* The owner reads the question it was asked. */
		ck_assert_int_eq(
			conn_table_init(&owner, &p, &g_fake_ops, NULL, PEER_INSTANCE, NULL, 0), 0);
		ck_assert_int_eq(conn_addr_parse("192.0.2.2", addr), 0);
		ck_assert_int_eq(conn_pd_check_query(&owner, g_fake.probe->request, CONN_PD_REQ_LEN,
						     addr, 7471, &q),
				 CONN_REJ_NONE);
		ck_assert_uint_eq(q.region_id, 42);
		ck_assert_uint_eq(q.region_key, 0x1234);
		ck_assert_uint_eq(q.offset, 100);
		ck_assert_uint_eq(q.length, 4096);
		ck_assert_uint_eq(q.access, RDMAX_ACCESS_REMOTE_WRITE);
		conn_table_fini(&owner);
		/* The second xfer was flushed: it waits behind the probed one. */
		conn_timer_fired(conn, 5000);
		conn_table_work(&t, 5000);
		ck_assert_int_eq(a.calls + b.calls, 0);
		int len = conn_pd_verdict(pd, sizeof(pd), cases[k].verdict);
		conn_probe_answer(g_fake.probe, pd, (size_t)len);
		conn_table_work(&t, 5001);
		ck_assert_int_eq(a.calls, 1);
		ck_assert_int_eq(b.calls, 1);
		ck_assert_int_lt(a.order, b.order);
		ck_assert_msg(a.err == cases[k].err, "verdict %d: got %d", cases[k].verdict, a.err);
		ck_assert_msg(strstr(a.msg, cases[k].text), "message: %s", a.msg);
		ck_assert_int_eq(b.err, RDMAX_E_TRANSPORT_ERROR);
		ck_assert(conn_table_idle(&t));
		table_teardown(&t);
	}
}
END_TEST

START_TEST(conn_idle_eviction)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a, b;

	p.idle_timeout_s = 10;
	table_setup(&t, &p, NULL);
	unit_txfer_init(&a, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1000);
	conn_table_work(&t, 1000);
	wc(conn, g_fake.posted[0].link, g_fake.posted[0].wr.seq, IBV_WC_SUCCESS);
	conn_table_work(&t, 1000);
	ck_assert_int_eq(a.calls, 1);
	uint64_t active = conn->last_active_ms;

	conn_table_tick(&t, active + 9999);
	ck_assert_int_eq(conn->state, CONN_ESTABLISHED);
	conn_table_tick(&t, active + 10000);
	/* Nothing in flight: no marker, the links go at once. */
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	ck_assert_int_eq(g_fake.disconnects, 2);
	ck_assert_int_eq(g_fake.destroys, 2);
	conn_table_work(&t, active + 10000);
	ck_assert_uint_eq(g_fake.n_released, 1);
	ck_assert_uint_eq(t.n_conns, 0);
	ck_assert_int_eq(a.calls, 1);

	/* The next xfer connects again. */
	unit_txfer_init(&b, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &b.x, active + 10001), 0);
	ck_assert_uint_eq(t.n_conns, 1);
	ck_assert_int_eq(the_conn(&t)->state, CONN_BACKOFF);
	conn_table_shutdown(&t);
	conn_table_work(&t, active + 10002);
	ck_assert_int_eq(b.calls, 1);
	ck_assert_int_eq(b.err, RDMAX_E_CANCELLED);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_peer_timeout)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a;

	p.peer_timeout_ms = 500;
	table_setup(&t, &p, NULL);
	unit_txfer_init(&a, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 0);
	conn_table_work(&t, 100);
	conn_table_tick(&t, 599);
	ck_assert_int_eq(conn->state, CONN_ESTABLISHED);
	conn_table_tick(&t, 600);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	/* The drain gives up when no flush ever comes. */
	conn_timer_fired(conn, 3000);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	conn_table_work(&t, 3000);
	ck_assert_int_eq(a.calls, 1);
	ck_assert_int_eq(a.err, RDMAX_E_TIMEOUT);
	ck_assert_msg(strstr(a.msg, "stopped answering"), "message: %s", a.msg);
	table_teardown(&t);
}
END_TEST

/*
 * A completed job's xfers: one still queued is taken back (done never runs);
 * one the NIC holds answers -EINPROGRESS and is done only when its WRs
 * completed; one whose peer takes nothing within the grace brings the
 * connection down, and is done once its QP flushed, together with the
 * connection's other xfers, which name the cause.
 */
START_TEST(conn_withdraw_posted)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a, b, c, q;

	p.links = 1;
	p.sq_depth = 4; /* 3 credits: a, b and c post, q waits */
	p.withdraw_grace_ms = 300;
	table_setup(&t, &p, NULL);
	unit_txfer_init(&a, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&b, XFER_READ, 4096, PEER_INSTANCE);
	unit_txfer_init(&c, XFER_WRITE, 4096, PEER_INSTANCE);
	unit_txfer_init(&q, XFER_WRITE, 4096, PEER_INSTANCE);
	struct txfer *all[] = {&a, &b, &c, &q};
	for (size_t i = 0; i < ARRAY_SIZE(all); i++) {
		ck_assert_int_eq(conn_submit(&t, &all[i]->x, 0), 0);
	}
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);
	ck_assert_uint_eq(g_fake.n_posted, 3);
	ck_assert_uint_eq(conn->n_pending, 1);

	/* Queued: taken back at once; posted: finishing; unknown: -EBUSY. */
	ck_assert_int_eq(conn_withdraw(&t, &q.x, 10), 0);
	ck_assert_uint_eq(conn->n_pending, 0);
	int stops = g_fake.timer_stops;
	ck_assert_int_eq(conn_withdraw(&t, &a.x, 10), -EINPROGRESS);
	ck_assert(g_fake.timer_on);
	ck_assert_uint_eq(g_fake.timer_ms, 300);
	ck_assert_int_eq(conn_withdraw(&t, &a.x, 11), -EBUSY);
	ck_assert_uint_eq(conn->n_withdrawn, 1);

	/* a's WR completes (its bytes were out): done, and the grace is over. */
	wc(conn, 0, g_fake.posted[0].wr.seq, IBV_WC_SUCCESS);
	conn_table_work(&t, 20);
	ck_assert_int_eq(a.calls, 1);
	ck_assert_int_eq(a.err, 0);
	ck_assert_uint_eq(conn->n_withdrawn, 0);
	ck_assert_int_eq(g_fake.timer_stops, stops + 1);
	ck_assert(!g_fake.timer_on);
	ck_assert_int_eq(b.calls + c.calls + q.calls, 0);

	/* b is withdrawn and the peer goes quiet: the grace counts from then. */
	ck_assert_int_eq(conn_withdraw(&t, &b.x, 100), -EINPROGRESS);
	ck_assert_uint_eq(g_fake.timer_ms, 300);
	conn_timer_fired(conn, 250);
	ck_assert_int_eq(conn->state, CONN_ESTABLISHED);
	ck_assert_uint_eq(g_fake.timer_ms, 150);
	int disconnects = g_fake.disconnects;
	size_t before = g_fake.n_posted;
	conn_timer_fired(conn, 400);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	ck_assert_int_eq(g_fake.disconnects, disconnects + 1);
	ck_assert_uint_eq(g_fake.n_posted, before + 1);
	struct wr_desc marker = g_fake.posted[before].wr;
	ck_assert_int_eq(marker.kind, WR_MARKER);
	conn_table_work(&t, 401);
	ck_assert_int_eq(b.calls + c.calls, 0); /* until the QP flushed them */

	wc(conn, 0, marker.seq, IBV_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	conn_table_work(&t, 402);
	ck_assert_int_eq(b.calls, 1);
	ck_assert_int_eq(c.calls, 1);
	ck_assert_int_eq(c.err, RDMAX_E_TIMEOUT);
	ck_assert_msg(strstr(c.msg, "completed jobs") && strstr(c.msg, "moved to error"),
		      "message: %s", c.msg);
	ck_assert_int_eq(q.calls, 0);
	ck_assert_uint_eq(t.outstanding_wrs, 0);
	table_teardown(&t);
	ck_assert_int_eq(q.calls, 0);
}
END_TEST

START_TEST(conn_stale_descriptor)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer early, late, good;

	table_setup(&t, &p, NULL);
	unit_txfer_init(&early, XFER_WRITE, 64, PEER_INSTANCE + 1);
	ck_assert_int_eq(conn_submit(&t, &early.x, 0), 0);
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	unit_txfer_init(&late, XFER_READ, 64, PEER_INSTANCE - 1);
	unit_txfer_init(&good, XFER_READ, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &late.x, 2), 0);
	ck_assert_int_eq(conn_submit(&t, &good.x, 2), 0);
	ck_assert_int_eq(late.calls, 0); /* never from inside submit */
	conn_table_work(&t, 3);
	ck_assert_int_eq(early.calls, 1);
	ck_assert_int_eq(late.calls, 1);
	ck_assert_int_eq(early.err, RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(late.err, RDMAX_E_NOT_FOUND);
	ck_assert_msg(strstr(late.msg, "stale descriptor"), "message: %s", late.msg);
	/* Only the good one touched the wire. */
	ck_assert_uint_eq(g_fake.n_posted, 1);
	ck_assert_ptr_eq(g_fake.posted[0].wr.xfer, &good.x);
	conn_table_shutdown(&t);
	conn_table_work(&t, 4);
	wc(conn, g_fake.posted[0].link, g_fake.posted[0].wr.seq, IBV_WC_WR_FLUSH_ERR);
	struct wr_desc marker = g_fake.posted[g_fake.n_posted - 1].wr;
	wc(conn, g_fake.posted[g_fake.n_posted - 1].link, marker.seq, IBV_WC_WR_FLUSH_ERR);
	conn_table_work(&t, 5);
	ck_assert_int_eq(good.calls, 1);
	ck_assert_int_eq(good.err, RDMAX_E_CANCELLED);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_mutual_auth)
{
	const char *key = "shared-key-0123456789abcdef";
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a, b;

	/* Right key on both sides: the accept's proof is checked and accepted. */
	table_setup(&t, &p, key);
	unit_txfer_init(&a, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	connect_all(the_conn(&t), key, PEER_INSTANCE, 1);
	ck_assert_int_eq(the_conn(&t)->state, CONN_ESTABLISHED);
	conn_table_shutdown(&t);
	conn_table_work(&t, 2);
	ck_assert_int_eq(a.calls, 1);
	table_teardown(&t);

	/* An accepting daemon that cannot prove the key is refused, without retries. */
	table_setup(&t, &p, key);
	unit_txfer_init(&b, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &b.x, 0), 0);
	struct conn *conn = the_conn(&t);
	connect_all(conn, "some-other-key-0123456789", PEER_INSTANCE, 1);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	conn_table_work(&t, 2);
	ck_assert_int_eq(b.calls, 1);
	ck_assert_int_eq(b.err, RDMAX_E_PERMISSION_DENIED);
	ck_assert_msg(strstr(b.msg, "proof"), "message: %s", b.msg);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_private_data_checks)
{
	const char *key = "shared-key-0123456789abcdef";
	struct conn_table server, open;
	struct conn_policy p = test_policy();
	struct conn_request req;
	uint8_t addr[16], other[16], pd[CONN_PD_REQ_LEN];
	uint64_t now = 1700000000000ull;

	ck_assert_int_eq(conn_addr_parse("192.0.2.2", addr), 0);
	ck_assert_int_eq(conn_addr_parse("192.0.2.3", other), 0);
	ck_assert_int_eq(conn_table_init(&server, &p, &g_fake_ops, NULL, PEER_INSTANCE,
					 (const uint8_t *)key, strlen(key)),
			 0);
	ck_assert_int_eq(conn_table_init(&open, &p, &g_fake_ops, NULL, PEER_INSTANCE, NULL, 0), 0);

	/* Good request, then the same bytes again: a replay. */
	conn_pd_connect(pd, 1, 2, 77, SELF_INSTANCE, now, (const uint8_t *)key, strlen(key), addr,
			7471, 0, 0);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now + 10, &req),
			 CONN_REJ_NONE);
	ck_assert_uint_eq(req.link_index, 1);
	ck_assert_uint_eq(req.n_links, 2);
	ck_assert_uint_eq(req.group, 77);
	ck_assert_uint_eq(req.instance, SELF_INSTANCE);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now + 20, &req),
			 CONN_REJ_REPLAY);
	/* Bound to the daemon it was meant for: another address or port fails. */
	conn_pd_connect(pd, 0, 2, 78, SELF_INSTANCE, now, (const uint8_t *)key, strlen(key), addr,
			7471, 0, 0);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), other, 7471, now, &req),
			 CONN_REJ_AUTH_FAILED);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7472, now, &req),
			 CONN_REJ_AUTH_FAILED);
	/* Tampering with any field breaks the proof. */
	pd[8] ^= 1;
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_AUTH_FAILED);
	/* A different key. */
	conn_pd_connect(pd, 0, 1, 79, SELF_INSTANCE, now, (const uint8_t *)"another-key-012345", 18,
			addr, 7471, 0, 0);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_AUTH_FAILED);
	/* The clock window. */
	conn_pd_connect(pd, 0, 1, 80, SELF_INSTANCE, now - CONN_AUTH_WINDOW_MS - 1,
			(const uint8_t *)key, strlen(key), addr, 7471, 0, 0);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_CLOCK);
	/* No proof for a daemon with a key; a proof for a daemon without one. */
	conn_pd_connect(pd, 0, 1, 81, SELF_INSTANCE, now, NULL, 0, addr, 7471, 0, 0);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_AUTH_REQUIRED);
	ck_assert_int_eq(conn_pd_check(&open, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_NONE);
	conn_pd_connect(pd, 0, 1, 82, SELF_INSTANCE, now, (const uint8_t *)key, strlen(key), addr,
			7471, 0, 0);
	ck_assert_int_eq(conn_pd_check(&open, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_AUTH_UNUSED);
	/* Garbage, short data, a bad link index. */
	ck_assert_int_eq(conn_pd_check(&open, pd, 20, addr, 7471, now, &req), CONN_REJ_VERSION);
	ck_assert_int_eq(conn_pd_check(&open, NULL, 0, addr, 7471, now, &req), CONN_REJ_VERSION);
	conn_pd_connect(pd, 3, 2, 83, SELF_INSTANCE, now, NULL, 0, addr, 7471, 0, 0);
	ck_assert_int_eq(conn_pd_check(&open, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_VERSION);
	/* A reject names its reason. */
	uint8_t rej[64];
	ck_assert_int_eq(conn_pd_reject(rej, sizeof(rej), CONN_REJ_LIMIT), 56);
	ck_assert_uint_eq(rej[6], CONN_REJ_LIMIT);
	ck_assert_ptr_nonnull(strstr((const char *)rej + 8, "limit"));
	conn_table_fini(&server);
	conn_table_fini(&open);
}
END_TEST

/*
 * Per-uid isolation: xfers to one peer take one connection per (local
 * domain, remote domain, token); the connect request of a domain connection
 * names the domain and proves its token without carrying it, the proof holds
 * with and without a shared key, and any other token, a tampered request or
 * a missing domain flag does not prove it. A domain the peer refuses fails
 * the waiting xfers with PERMISSION_DENIED at once (no retry).
 */
/* The connection of t with these domains, or NULL. */
static struct conn *conn_of_domains(struct conn_table *t, uint32_t local, uint32_t remote,
				    uint64_t token)
{
	for (struct list_node *pos = t->conns.next; pos != &t->conns; pos = pos->next) {
		struct conn *c = container_of(pos, struct conn, link);
		if (c->local_domain == local && c->remote_domain == remote &&
		    c->remote_token == token) {
			return c;
		}
	}
	return NULL;
}

/* Start conn's attempt and have its first link rejected with a domain refusal. */
static void domain_refused(struct conn *conn, enum conn_reject_reason reason, uint64_t instance,
			   uint64_t now)
{
	uint8_t rej[64];

	conn_timer_fired(conn, now);
	event(&conn->links[0], CONN_EV_ADDR_RESOLVED, NULL, 0, 0, now);
	event(&conn->links[0], CONN_EV_ROUTE_RESOLVED, NULL, 0, 0, now);
	int rlen = conn_pd_reject_domain(rej, sizeof(rej), reason, instance);
	ck_assert_int_eq(rlen, 56);
	event(&conn->links[0], CONN_EV_REJECTED, rej, (size_t)rlen, 28, now);
	conn_table_work(conn->table, now);
}

START_TEST(conn_domains)
{
	const char *key = "shared-key-0123456789";
	const uint64_t token = 0x0123456789abcdefull;
	struct conn_table t, server;
	struct conn_policy p = test_policy();
	struct conn_request req;
	struct txfer shared, own, own2, other_local, other_token;
	uint8_t addr[16];

	table_setup(&t, &p, NULL);
	unit_txfer_init(&shared, XFER_WRITE, 64, PEER_INSTANCE);
	unit_txfer_init(&own, XFER_WRITE, 64, PEER_INSTANCE);
	unit_txfer_init(&own2, XFER_READ, 64, PEER_INSTANCE);
	unit_txfer_init(&other_local, XFER_WRITE, 64, PEER_INSTANCE);
	unit_txfer_init(&other_token, XFER_WRITE, 64, PEER_INSTANCE);
	own.x.peer.domain = own2.x.peer.domain = other_local.x.peer.domain = 7;
	own.x.peer.domain_token = own2.x.peer.domain_token = token;
	other_local.x.peer.domain_token = token;
	other_token.x.peer.domain = 7;
	other_token.x.peer.domain_token = token ^ 1;
	ck_assert_int_eq(conn_submit(&t, &shared.x, 0), 0);
	ck_assert_int_eq(conn_submit_domain(&t, &own.x, 3, 0), 0);
	ck_assert_int_eq(conn_submit_domain(&t, &own2.x, 3, 0), 0);
	ck_assert_int_eq(conn_submit_domain(&t, &other_local.x, 4, 0), 0);
	ck_assert_int_eq(conn_submit_domain(&t, &other_token.x, 3, 0), 0);
	/* shared (0,0), own and own2 together (3,7), other_local (4,7), other_token. */
	ck_assert_uint_eq(t.n_conns, 4);
	struct conn *dom_conn = conn_of_domains(&t, 3, 7, token);
	ck_assert_ptr_nonnull(dom_conn);
	ck_assert_uint_eq(dom_conn->n_pending, 2);

	/* Its connect request names domain 7 and proves the token. */
	conn_timer_fired(dom_conn, 1);
	event(&dom_conn->links[0], CONN_EV_ADDR_RESOLVED, NULL, 0, 0, 1);
	event(&dom_conn->links[0], CONN_EV_ROUTE_RESOLVED, NULL, 0, 0, 1);
	const uint8_t *rq = dom_conn->links[0].request;
	ck_assert_int_eq(conn_addr_parse(dom_conn->peer.addr, addr), 0);
	ck_assert_int_eq(conn_table_init(&server, &p, &g_fake_ops, NULL, PEER_INSTANCE, NULL, 0),
			 0);
	ck_assert_int_eq(conn_pd_check(&server, rq, CONN_PD_REQ_LEN, addr, dom_conn->peer.port,
				       conn_realtime_ms(), &req),
			 CONN_REJ_NONE);
	ck_assert_uint_eq(req.domain, 7);
	ck_assert(conn_pd_domain_ok(rq, CONN_PD_REQ_LEN, token));
	ck_assert(!conn_pd_domain_ok(rq, CONN_PD_REQ_LEN, token ^ 1));
	/* The token itself is nowhere in the request. */
	uint8_t tok[8];
	put_le64(tok, token);
	ck_assert_ptr_null(memmem(rq, CONN_PD_REQ_LEN, tok, sizeof(tok)));

	/* With a shared key: both proofs hold; tampering breaks the domain proof. */
	uint8_t pd[CONN_PD_REQ_LEN];
	conn_table_fini(&server);
	ck_assert_int_eq(conn_table_init(&server, &p, &g_fake_ops, NULL, PEER_INSTANCE,
					 (const uint8_t *)key, strlen(key)),
			 0);
	uint64_t now = conn_realtime_ms();
	conn_pd_connect(pd, 0, 1, 90, SELF_INSTANCE, now, (const uint8_t *)key, strlen(key), addr,
			7471, 0x123456, token);
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_NONE);
	ck_assert_uint_eq(req.domain, 0x123456);
	ck_assert(conn_pd_domain_ok(pd, sizeof(pd), token));
	pd[13] ^= 1; /* the attempt id: the nonce no longer proves the token */
	ck_assert(!conn_pd_domain_ok(pd, sizeof(pd), token));
	/* No domain: no proof of any token; a domain flag without a number is malformed. */
	conn_pd_connect(pd, 0, 1, 91, SELF_INSTANCE, now, NULL, 0, addr, 7471, 0, 0);
	ck_assert(!conn_pd_domain_ok(pd, sizeof(pd), 0));
	pd[6] |= 2;
	ck_assert_int_eq(conn_pd_check(&server, pd, sizeof(pd), addr, 7471, now, &req),
			 CONN_REJ_VERSION);
	conn_table_fini(&server);

	/* The peer refuses the domain: final, the xfers fail once with PERMISSION_DENIED. */
	uint8_t rej[64];
	int rlen = conn_pd_reject_domain(rej, sizeof(rej), CONN_REJ_DOMAIN, PEER_INSTANCE);
	ck_assert_int_eq(rlen, 56);
	ck_assert_uint_eq(conn_pd_reject_instance(rej, (size_t)rlen), PEER_INSTANCE);
	ck_assert_uint_eq(conn_pd_reject_instance(rej, 40), 0);
	event(&dom_conn->links[0], CONN_EV_REJECTED, rej, (size_t)rlen, 28, 2);
	conn_table_work(&t, 3);
	ck_assert_int_eq(own.calls, 1);
	ck_assert_int_eq(own2.calls, 1);
	ck_assert_int_eq(own.err, RDMAX_E_PERMISSION_DENIED);
	ck_assert_msg(strstr(own.msg, "protection domain") != NULL, "message: %s", own.msg);
	ck_assert_int_eq(shared.calls + other_local.calls + other_token.calls, 0);
	/*
	 * Refused by a later start of the peer (same address, new instance): the
	 * descriptor is stale, NOT_FOUND as over an established connection.
	 */
	struct conn *tok_conn = conn_of_domains(&t, 3, 7, token ^ 1);
	ck_assert_ptr_nonnull(tok_conn);
	domain_refused(tok_conn, CONN_REJ_DOMAIN, PEER_INSTANCE + 1, 5);
	ck_assert_int_eq(other_token.calls, 1);
	ck_assert_int_eq(other_token.err, RDMAX_E_NOT_FOUND);
	ck_assert_msg(strstr(other_token.msg, "stale descriptor") != NULL, "message: %s",
		      other_token.msg);
	/* A domain the peer (same start) no longer has: its regions are gone, NOT_FOUND. */
	struct conn *other_conn = conn_of_domains(&t, 4, 7, token);
	ck_assert_ptr_nonnull(other_conn);
	domain_refused(other_conn, CONN_REJ_DOMAIN_GONE, PEER_INSTANCE, 6);
	ck_assert_int_eq(other_local.calls, 1);
	ck_assert_int_eq(other_local.err, RDMAX_E_NOT_FOUND);
	ck_assert_msg(strstr(other_local.msg, "protection domain gone") != NULL, "message: %s",
		      other_local.msg);
	conn_table_shutdown(&t);
	conn_table_work(&t, 7);
	ck_assert_int_eq(shared.calls, 1);
	ck_assert_int_eq(other_local.calls, 1);
	ck_assert_int_eq(other_token.calls, 1);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_limit)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer a, b, c;

	p.max_connections = 2;
	table_setup(&t, &p, NULL);
	unit_txfer_init(&a, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	/* An incoming group takes the second slot (its links count once). */
	ck_assert_int_eq(conn_table_group_add(&t, 5, 9), 0);
	ck_assert_int_eq(conn_table_group_add(&t, 5, 9), 0);
	ck_assert_uint_eq(t.n_groups, 1);
	ck_assert_int_eq(conn_table_group_add(&t, 6, 9), RDMAX_E_RESOURCE_EXHAUSTED);
	unit_txfer_init(&b, XFER_WRITE, 64, PEER_INSTANCE);
	snprintf(b.x.peer.addr, sizeof(b.x.peer.addr), "192.0.2.9");
	ck_assert_int_eq(conn_submit(&t, &b.x, 0), RDMAX_E_RESOURCE_EXHAUSTED);
	/* The same peer reuses its connection. */
	unit_txfer_init(&c, XFER_WRITE, 64, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit(&t, &c.x, 0), 0);
	ck_assert_uint_eq(t.n_conns, 1);
	conn_table_group_del(&t, 5, 9);
	conn_table_group_del(&t, 5, 9);
	ck_assert_uint_eq(t.n_groups, 0);
	ck_assert_int_eq(conn_submit(&t, &b.x, 0), 0);
	ck_assert_uint_eq(t.n_conns, 2);
	ck_assert_int_eq(a.calls + b.calls + c.calls, 0);
	conn_table_shutdown(&t);
	conn_table_work(&t, 1);
	ck_assert_int_eq(a.calls + b.calls + c.calls, 3);
	table_teardown(&t);
}
END_TEST

/* Connections opened for a uid's xfers count in its share until they close. */
START_TEST(conn_uid_share)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct uid_counts counts;
	const uint32_t limit = 1;
	struct txfer a, b, c, d;

	table_setup(&t, &p, NULL);
	ck_assert_int_eq(uid_counts_init(&counts), 0);
	t.uid_conns = &counts;
	t.uid_conn_limit = &limit;
	unit_txfer_init(&a, XFER_WRITE, 64, PEER_INSTANCE);
	a.x.has_uid = true;
	a.x.uid = 1000;
	ck_assert_int_eq(conn_submit(&t, &a.x, 0), 0);
	ck_assert_uint_eq(uid_counts_get(&counts, 1000), 1);
	/* A second peer for the same uid is past its share; another uid's xfer is not. */
	unit_txfer_init(&b, XFER_WRITE, 64, PEER_INSTANCE);
	snprintf(b.x.peer.addr, sizeof(b.x.peer.addr), "192.0.2.9");
	b.x.has_uid = true;
	b.x.uid = 1000;
	ck_assert_int_eq(conn_submit(&t, &b.x, 0), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_uint_eq(t.n_conns, 1);
	b.x.uid = 1001;
	ck_assert_int_eq(conn_submit(&t, &b.x, 0), 0);
	ck_assert_uint_eq(uid_counts_get(&counts, 1001), 1);
	/* The same peer reuses the connection, whoever asks; an xfer with no uid is free. */
	unit_txfer_init(&c, XFER_WRITE, 64, PEER_INSTANCE);
	c.x.has_uid = true;
	c.x.uid = 1001;
	ck_assert_int_eq(conn_submit(&t, &c.x, 0), 0);
	ck_assert_uint_eq(uid_counts_get(&counts, 1001), 1);
	unit_txfer_init(&d, XFER_WRITE, 64, PEER_INSTANCE);
	snprintf(d.x.peer.addr, sizeof(d.x.peer.addr), "192.0.2.10");
	ck_assert_int_eq(conn_submit(&t, &d.x, 0), 0);
	ck_assert_uint_eq(t.n_conns, 3);
	/* Closed and released: every share is given back. */
	conn_table_shutdown(&t);
	conn_table_work(&t, 1);
	ck_assert_int_eq(a.calls + b.calls + c.calls + d.calls, 4);
	ck_assert_uint_eq(t.n_conns, 0);
	ck_assert_uint_eq(uid_counts_get(&counts, 1000), 0);
	ck_assert_uint_eq(uid_counts_get(&counts, 1001), 0);
	table_teardown(&t);
	uid_counts_fini(&counts);
}
END_TEST

/* n small writes on a connection of one link, connected and posted (post lists of 4). */
static struct conn *one_link_posted(struct conn_table *t, struct txfer *x, size_t n)
{
	struct conn_policy p = test_policy();

	p.links = 1;
	p.batch = 4;
	table_setup(t, &p, NULL);
	for (size_t i = 0; i < n; i++) {
		unit_txfer_init(&x[i], XFER_WRITE, 128, PEER_INSTANCE);
		ck_assert_int_eq(conn_submit(t, &x[i].x, 0), 0);
	}
	struct conn *conn = the_conn(t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(t, 2);
	return conn;
}

START_TEST(conn_post_failure_and_lists)
{
	struct conn_table t;
	struct txfer x[10];
	struct conn *conn = one_link_posted(&t, x, ARRAY_SIZE(x));

	/* Ten WRs in post lists of at most four. */
	ck_assert_uint_eq(g_fake.n_posted, 10);
	ck_assert_int_eq(g_fake.posts, 3);
	ck_assert_uint_eq(g_fake.max_list, 4);
	/* Signaled: every 4th (interval) and the last one. */
	for (size_t i = 0; i < 10; i++) {
		bool want = (i + 1) % 4 == 0 || i == 9;
		ck_assert_msg(g_fake.posted[i].wr.signaled == want, "WR %zu signaled %d", i,
			      g_fake.posted[i].wr.signaled);
	}
	/* A later post fails: the conn goes down, everything fails once. */
	struct txfer y;
	unit_txfer_init(&y, XFER_WRITE, 128, PEER_INSTANCE);
	g_fake.fail_post = -ENOMEM;
	ck_assert_int_eq(conn_submit(&t, &y.x, 3), 0);
	conn_table_work(&t, 3);
	/* Not even the drain marker can be posted: nothing will flush, so it closes now. */
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	g_fake.fail_post = 0;
	conn_table_work(&t, 5000);
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		ck_assert_int_eq(x[i].calls, 1);
		ck_assert_int_eq(x[i].err, RDMAX_E_TRANSPORT_ERROR);
	}
	ck_assert_int_eq(y.calls, 1);
	ck_assert_msg(strstr(y.msg, "fake post failure"), "message: %s", y.msg);
	table_teardown(&t);
}
END_TEST

START_TEST(conn_wc_error_map)
{
	static const struct {
		int status;
		int err;
	} map[] = {
		{IBV_WC_REM_ACCESS_ERR, RDMAX_E_REMOTE_ACCESS},
		{IBV_WC_RETRY_EXC_ERR, RDMAX_E_UNREACHABLE},
		{IBV_WC_RNR_RETRY_EXC_ERR, RDMAX_E_TRANSPORT_ERROR},
		{IBV_WC_LOC_PROT_ERR, RDMAX_E_PERMISSION_DENIED},
		{IBV_WC_LOC_ACCESS_ERR, RDMAX_E_PERMISSION_DENIED},
		{IBV_WC_WR_FLUSH_ERR, RDMAX_E_TRANSPORT_ERROR},
		{IBV_WC_REM_INV_REQ_ERR, RDMAX_E_INVALID_ARGUMENT},
		{IBV_WC_REM_OP_ERR, RDMAX_E_TRANSPORT_ERROR},
		{IBV_WC_LOC_LEN_ERR, RDMAX_E_INTERNAL},
		{IBV_WC_GENERAL_ERR, RDMAX_E_INTERNAL},
	};
	char msg[RDMAX_MESSAGE_MAX];

	ck_assert_int_eq(conn_wc_error(IBV_WC_SUCCESS, 0, XFER_WRITE, "x", msg, sizeof(msg)), 0);
	for (size_t i = 0; i < ARRAY_SIZE(map); i++) {
		int err = conn_wc_error(map[i].status, 0x42, XFER_READ, "192.0.2.2:7471", msg,
					sizeof(msg));
		ck_assert_msg(err == map[i].err, "status %d: got %d", map[i].status, err);
		ck_assert_msg(strstr(msg, verbs_wc_status_str((enum ibv_wc_status)map[i].status)),
			      "message lacks the status: %s", msg);
		ck_assert_msg(strstr(msg, "192.0.2.2:7471") && strstr(msg, "READ"),
			      "message lacks peer or op: %s", msg);
	}
}
END_TEST

/* ================================================================ messages */

struct tmsg {
	struct conn_msg m;
	int calls;
	int err;
	char msg[RDMAX_MESSAGE_MAX];
	uint8_t staging[CONN_MSG_STAGING];
};

static void mdone(struct xfer *x, int err, const char *msg)
{
	struct tmsg *t = container_of(x, struct tmsg, m.xfer);

	t->calls++;
	t->err = err;
	snprintf(t->msg, sizeof(t->msg), "%s", msg ? msg : "");
}

static struct tmsg *tmsg_new(uint64_t id, uint32_t payload_len, uint64_t instance)
{
	struct tmsg *t = calloc(1, sizeof(*t));
	uint8_t *payload = malloc(payload_len + 1);

	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(payload);
	for (uint32_t i = 0; i < payload_len; i++) {
		payload[i] = (uint8_t)(i * 7 + 3);
	}
	int body = conn_msg_encode(t->staging, sizeof(t->staging), id, "inbox", 0, "alpha", payload,
				   payload_len);
	free(payload);
	ck_assert_int_eq(body, 5 + 5 + (int)payload_len);
	t->m.xfer.op = XFER_WRITE;
	t->m.xfer.peer.transport = ENDPOINT_VERBS;
	snprintf(t->m.xfer.peer.addr, sizeof(t->m.xfer.peer.addr), "192.0.2.2");
	t->m.xfer.peer.port = 7471;
	t->m.xfer.remote_instance = instance;
	t->m.xfer.length = (uint64_t)body;
	t->m.xfer.payload = t->staging;
	t->m.xfer.wire_id = id;
	t->m.xfer.done = mdone;
	t->err = 12345;
	return t;
}

/* The peer's answer to message id, arriving on link. */
static void answer_on(struct conn *conn, uint32_t link, uint64_t id, int status, const char *text)
{
	uint8_t buf[CONN_ANSWER_MAX];
	struct conn_frame f;
	int len = conn_answer_encode(buf, sizeof(buf), id, status, text);

	ck_assert_int_gt(len, 0);
	ck_assert_int_eq(conn_frame_decode(buf, (size_t)len, &f), 0);
	conn_link_answer(&conn->links[link], &f, 1);
}

START_TEST(conn_message_frames_and_answer)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct tmsg *big = tmsg_new(7, TRANSPORT_MESSAGE_PAYLOAD_MAX, PEER_INSTANCE);
	struct tmsg *small = tmsg_new(8, 13, PEER_INSTANCE);
	struct wr_desc w[64];
	struct txfer d[3];

	p.sq_depth = 64;
	table_setup(&t, &p, NULL);
	ck_assert_int_eq(conn_submit_message(&t, &big->m, 0), 0);
	for (int i = 0; i < 3; i++) {
		unit_txfer_init(&d[i], XFER_WRITE, 100, PEER_INSTANCE);
		ck_assert_int_eq(conn_submit(&t, &d[i].x, 0), 0);
	}
	ck_assert_int_eq(conn_submit_message(&t, &small->m, 0), 0);
	/* An id may be in flight once only. */
	ck_assert_int_eq(conn_submit_message(&t, &small->m, 0), -EEXIST);
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);

	/*
	 * Both on the first link, in order (RC orders one QP): the big one's 17
	 * SENDs, frame i at i * CONN_FRAME_MAX of its staging, then the small one.
	 */
	uint32_t big_link = 0;
	ck_assert_uint_eq(g_fake.n_posted, CONN_MSG_FRAMES_MAX + 1 + 3);
	/* One-sided xfers still spread over both links. */
	size_t n = posted_on(1, w, ARRAY_SIZE(w));
	ck_assert_uint_gt(n, 0);
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(w[i].kind, WR_WRITE);
	}
	n = 0;
	for (size_t i = 0; i < g_fake.n_posted; i++) {
		if (g_fake.posted[i].link == big_link && g_fake.posted[i].wr.kind == WR_SEND) {
			w[n++] = g_fake.posted[i].wr;
		}
	}
	ck_assert_uint_eq(n, CONN_MSG_FRAMES_MAX + 1);
	n--;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(w[i].kind, WR_SEND);
		ck_assert_ptr_eq(w[i].xfer, &big->m.xfer);
		ck_assert_uint_eq(w[i].offset, i * CONN_FRAME_MAX);
		ck_assert_uint_eq(w[i].length, conn_msg_frame_len(big->m.xfer.length, (uint32_t)i));
		total += w[i].length - CONN_FRAME_HDR;
	}
	ck_assert_uint_eq(total, big->m.xfer.length);
	struct wr_desc s1 = w[n];
	ck_assert_ptr_eq(s1.xfer, &small->m.xfer);
	ck_assert_uint_eq(s1.length, CONN_FRAME_HDR + small->m.xfer.length);
	ck_assert(s1.signaled);

	/* The small one's answer comes before its completion: it waits for that. */
	answer_on(conn, big_link, 8, 0, "");
	conn_table_work(&t, 3);
	ck_assert_int_eq(small->calls, 0);
	/* Every WR completes (the signaled ones retire the rest). */
	for (size_t i = 0; i < g_fake.n_posted; i++) {
		if (g_fake.posted[i].wr.signaled) {
			wc(conn, g_fake.posted[i].link, g_fake.posted[i].wr.seq, IBV_WC_SUCCESS);
		}
	}
	conn_table_work(&t, 4);
	ck_assert_int_eq(small->calls, 1);
	ck_assert_int_eq(small->err, 0);
	ck_assert_uint_eq(small->m.xfer.bytes_done, small->m.xfer.length);
	ck_assert_int_eq(d[0].calls + d[1].calls + d[2].calls, 3);
	/* Sent is not done: the big one waits for its answer. */
	ck_assert_int_eq(big->calls, 0);
	ck_assert_uint_eq(conn_outstanding(conn), 1);
	/* Answers from the wrong link, for unknown ids: ignored. */
	answer_on(conn, 1, 7, 0, "");
	answer_on(conn, big_link, 99, 0, "");
	conn_table_work(&t, 5);
	ck_assert_int_eq(big->calls, 0);
	answer_on(conn, big_link, 7, RDMAX_E_NOT_FOUND, "no mailbox 'inbox' is open on node 'b'");
	conn_table_work(&t, 6);
	ck_assert_int_eq(big->calls, 1);
	ck_assert_int_eq(big->err, RDMAX_E_NOT_FOUND);
	ck_assert_str_eq(big->msg, "no mailbox 'inbox' is open on node 'b'");
	/* A repeated answer finds nothing. */
	answer_on(conn, big_link, 7, 0, "");
	conn_table_work(&t, 7);
	ck_assert_int_eq(big->calls, 1);
	ck_assert_int_eq(small->calls, 1);
	ck_assert_uint_eq(conn_outstanding(conn), 0);
	ck_assert_uint_eq(t.msgs.count, 0);
	conn_table_shutdown(&t);
	table_teardown(&t);
	free(big);
	free(small);
}
END_TEST

START_TEST(conn_message_fails_once)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct tmsg *m[3];
	struct wr_desc w0[8], w1[8];

	p.links = 1;
	table_setup(&t, &p, NULL);
	for (int i = 0; i < 3; i++) {
		m[i] = tmsg_new(10 + (uint64_t)i, 100, PEER_INSTANCE);
		ck_assert_int_eq(conn_submit_message(&t, &m[i]->m, 0), 0);
	}
	struct conn *conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);
	ck_assert_uint_eq(posted_on(0, w0, 8), 3);
	/* All three sent; only the first is answered before the peer disconnects. */
	wc(conn, 0, w0[2].seq, IBV_WC_SUCCESS);
	answer_on(conn, 0, 10, 0, "");
	conn_table_work(&t, 3);
	ck_assert_int_eq(m[0]->calls, 1);
	ck_assert_int_eq(m[0]->err, 0);
	int posted = (int)g_fake.n_posted;
	event(&conn->links[0], CONN_EV_DISCONNECTED, NULL, 0, 0, 4);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	/* Nothing on the send queue, yet a marker: answers polled before it still count. */
	ck_assert_int_eq((int)g_fake.n_posted, posted + 1);
	struct wr_desc marker = g_fake.posted[posted].wr;
	ck_assert_int_eq(marker.kind, WR_MARKER);
	answer_on(conn, 0, 11, RDMAX_E_RESOURCE_EXHAUSTED, "");
	conn_table_work(&t, 5);
	ck_assert_int_eq(m[1]->calls, 1);
	ck_assert_int_eq(m[1]->err, RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_msg(strstr(m[1]->msg, "refused the message"), "message: %s", m[1]->msg);
	ck_assert_int_eq(m[2]->calls, 0);
	wc(conn, 0, marker.seq, IBV_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	/* A late answer finds nothing to finish. */
	answer_on(conn, 0, 12, 0, "");
	conn_table_work(&t, 6);
	for (int i = 0; i < 3; i++) {
		ck_assert_msg(m[i]->calls == 1, "message %d finished %d times", i, m[i]->calls);
	}
	ck_assert_int_eq(m[2]->err, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_msg(strstr(m[2]->msg, "disconnected"), "message: %s", m[2]->msg);
	ck_assert_uint_eq(t.msgs.count, 0);
	table_teardown(&t);

	/* The peer watchdog covers unanswered messages; a failed SEND names the operation. */
	p.peer_timeout_ms = 500;
	table_setup(&t, &p, NULL);
	struct tmsg *a = tmsg_new(20, 10, PEER_INSTANCE), *b = tmsg_new(21, 10, PEER_INSTANCE);
	ck_assert_int_eq(conn_submit_message(&t, &a->m, 0), 0);
	conn = the_conn(&t);
	connect_all(conn, NULL, PEER_INSTANCE, 0);
	conn_table_work(&t, 0);
	ck_assert_uint_eq(posted_on(0, w1, 8), 1);
	conn_link_wc(&conn->links[0], w1[0].seq, IBV_WC_SUCCESS, 0, 0);
	conn_table_tick(&t, 499);
	ck_assert_int_eq(conn->state, CONN_ESTABLISHED);
	ck_assert_uint_eq(conn_outstanding(conn), 1);
	conn_table_tick(&t, 501);
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	conn_timer_fired(conn, 3000);
	conn_table_work(&t, 3000);
	ck_assert_int_eq(a->calls, 1);
	ck_assert_int_eq(a->err, RDMAX_E_TIMEOUT);
	ck_assert_msg(strstr(a->msg, "stopped answering"), "message: %s", a->msg);
	ck_assert_int_eq(conn_submit_message(&t, &b->m, 3001), 0);
	conn = container_of(t.conns.prev, struct conn, link);
	conn_table_work(&t, 3001);
	connect_all(conn, NULL, PEER_INSTANCE, 3002);
	conn_table_work(&t, 3003);
	size_t n = g_fake.n_posted;
	ck_assert_int_eq(g_fake.posted[n - 1].wr.kind, WR_SEND);
	conn_link_wc(&conn->links[0], g_fake.posted[n - 1].wr.seq, IBV_WC_REM_INV_REQ_ERR, 0, 3004);
	conn_table_work(&t, 3005);
	ck_assert_int_eq(b->calls, 1);
	ck_assert_int_eq(b->err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_msg(strstr(b->msg, "SEND to 192.0.2.2:7471"), "message: %s", b->msg);
	conn_table_shutdown(&t);
	table_teardown(&t);
	for (int i = 0; i < 3; i++) {
		free(m[i]);
	}
	free(a);
	free(b);
}
END_TEST

START_TEST(conn_message_stale_and_checks)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct tmsg *m = tmsg_new(30, 1, PEER_INSTANCE + 1);
	struct tmsg *bad = tmsg_new(31, 1, PEER_INSTANCE);

	table_setup(&t, &p, NULL);
	bad->m.xfer.wire_id = 0;
	ck_assert_int_eq(conn_submit_message(&t, &bad->m, 0), RDMAX_E_INVALID_ARGUMENT);
	bad->m.xfer.wire_id = 31;
	bad->m.xfer.length = CONN_MSG_BODY_MAX + 1;
	ck_assert_int_eq(conn_submit_message(&t, &bad->m, 0), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(conn_submit_message(&t, &m->m, 0), 0);
	connect_all(the_conn(&t), NULL, PEER_INSTANCE, 1);
	conn_table_work(&t, 2);
	ck_assert_int_eq(m->calls, 1);
	ck_assert_int_eq(m->err, RDMAX_E_NOT_FOUND);
	ck_assert_msg(strstr(m->msg, "stale descriptor"), "message: %s", m->msg);
	ck_assert_uint_eq(t.msgs.count, 0);
	ck_assert_uint_eq(g_fake.n_posted, 0);
	conn_table_shutdown(&t);
	table_teardown(&t);
	free(m);
	free(bad);
}
END_TEST

/* The connection of t on this lane, or NULL. */
static struct conn *conn_of_lane(struct conn_table *t, bool latency_lane)
{
	for (struct list_node *pos = t->conns.next; pos != &t->conns; pos = pos->next) {
		struct conn *c = container_of(pos, struct conn, link);
		if (c->latency_lane == latency_lane) {
			return c;
		}
	}
	return NULL;
}

/* The connection the first WR of xfer was posted on, or NULL. */
static const struct conn *posted_conn(const struct xfer *xfer)
{
	for (size_t i = 0; i < g_fake.n_posted; i++) {
		if (g_fake.posted[i].wr.xfer == xfer) {
			return g_fake.posted[i].conn;
		}
	}
	return NULL;
}

/*
 * Latency-class xfers (urgent) take a connection of their own to the peer,
 * of one QP: with bulk xfers filling both links of the bulk connection and
 * more waiting, a latency xfer is posted at once on its lane and completes
 * while the bulk ones still wait. Messages stay on the bulk connection even
 * when marked urgent, no bulk xfer rides on the lane, and the lane counts as
 * a connection against the limit.
 */
/*
 * A transport that posts off the loop reports a failed post list later
 * (conn_link_post_failed): the connection goes down as for a failure at the
 * call, its drain marker ends the drain, and a marker that fails too fails
 * what the link holds, settled first, each xfer once.
 */
START_TEST(conn_post_failure_reported_later)
{
	struct conn_table t;
	struct txfer x[6];
	struct conn *conn = one_link_posted(&t, x, ARRAY_SIZE(x));

	ck_assert_uint_eq(g_fake.n_posted, 6);
	ck_assert_int_eq(conn->state, CONN_ESTABLISHED);

	/* The second list failed on its way to the device. */
	conn_link_post_failed(&conn->links[0], false, "fake late failure");
	ck_assert_int_eq(conn->state, CONN_DRAINING);
	ck_assert_int_eq(g_fake.disconnects, 1);
	ck_assert_uint_eq(g_fake.n_posted, 7);
	ck_assert_int_eq(g_fake.posted[6].wr.kind, WR_MARKER);
	ck_assert_int_eq(conn->links[0].state, LINK_DRAINING);
	/* A later list's failure (dropped after the first) changes nothing. */
	conn_link_post_failed(&conn->links[0], false, "fake later failure");
	ck_assert_uint_eq(g_fake.n_posted, 7);
	conn_table_work(&t, 3);
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		ck_assert_int_eq(x[i].calls, 0);
	}

	/* The marker failed as well: nothing will flush, so the link's WRs fail now. */
	int settles = g_fake.settles;
	conn_link_post_failed(&conn->links[0], true, "fake marker failure");
	ck_assert_int_gt(g_fake.settles, settles);
	ck_assert_int_eq(conn->links[0].state, LINK_IDLE);
	ck_assert_int_eq(conn->state, CONN_CLOSED);
	ck_assert_uint_eq(t.outstanding_wrs, 0);
	conn_table_work(&t, 4);
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		ck_assert_int_eq(x[i].calls, 1);
		ck_assert_int_eq(x[i].err, RDMAX_E_TRANSPORT_ERROR);
		ck_assert_msg(strstr(x[i].msg, "fake late failure"), "message: %s", x[i].msg);
	}
	/* Reported after the link is gone: ignored. */
	conn_link_post_failed(&conn->links[0], true, "fake stray failure");
	conn_table_work(&t, 5);
	for (size_t i = 0; i < ARRAY_SIZE(x); i++) {
		ck_assert_int_eq(x[i].calls, 1);
	}
	table_teardown(&t);
}
END_TEST

START_TEST(conn_latency_lane)
{
	struct conn_table t;
	struct conn_policy p = test_policy();
	struct txfer bulk[40], lat, other;
	struct tmsg *msg = tmsg_new(9, 13, PEER_INSTANCE);

	p.max_connections = 2;
	table_setup(&t, &p, NULL);
	for (size_t i = 0; i < ARRAY_SIZE(bulk); i++) {
		unit_txfer_init(&bulk[i], XFER_WRITE, 1 << 20, PEER_INSTANCE);
		ck_assert_int_eq(conn_submit(&t, &bulk[i].x, 0), 0);
	}
	ck_assert_uint_eq(t.n_conns, 1);
	unit_txfer_init(&lat, XFER_WRITE, 65536, PEER_INSTANCE);
	lat.x.urgent = true;
	ck_assert_int_eq(conn_submit(&t, &lat.x, 0), 0);
	msg->m.xfer.urgent = true;
	ck_assert_int_eq(conn_submit_message(&t, &msg->m, 0), 0);
	ck_assert_uint_eq(t.n_conns, 2);
	struct conn *bulk_conn = conn_of_lane(&t, false);
	struct conn *lane = conn_of_lane(&t, true);
	ck_assert_ptr_nonnull(bulk_conn);
	ck_assert_ptr_nonnull(lane);
	ck_assert_uint_eq(bulk_conn->n_links, 2);
	ck_assert_uint_eq(lane->n_links, 1);
	ck_assert_uint_eq(bulk_conn->n_msg_pending, 1);
	ck_assert_uint_eq(lane->n_pending, 1);
	/* The limit is reached: a third connection (another peer) is refused. */
	unit_txfer_init(&other, XFER_WRITE, 64, PEER_INSTANCE);
	snprintf(other.x.peer.addr, sizeof(other.x.peer.addr), "192.0.2.9");
	ck_assert_int_eq(conn_submit(&t, &other.x, 0), RDMAX_E_RESOURCE_EXHAUSTED);

	ck_assert_uint_eq(t.lanes_open, 0);
	connect_all(bulk_conn, NULL, PEER_INSTANCE, 1);
	ck_assert_uint_eq(t.lanes_open, 0);
	/* A lane counts from its first attempt on, before it is established. */
	conn_timer_fired(lane, 1);
	ck_assert_uint_eq(t.lanes_open, 1);
	connect_links(lane, NULL, PEER_INSTANCE, 1);
	ck_assert_uint_eq(t.lanes_open, 1);
	conn_table_work(&t, 2);
	ck_assert_ptr_eq(posted_conn(&lat.x), lane);
	ck_assert_ptr_eq(posted_conn(&msg->m.xfer), bulk_conn);
	size_t on_lane = 0;
	uint64_t lat_seq = 0;
	for (size_t i = 0; i < g_fake.n_posted; i++) {
		if (g_fake.posted[i].conn == lane) {
			ck_assert_ptr_eq(g_fake.posted[i].wr.xfer, &lat.x);
			lat_seq = g_fake.posted[i].wr.seq;
			on_lane++;
		}
	}
	ck_assert_uint_eq(on_lane, 1);
	ck_assert_uint_gt(bulk_conn->n_pending, 0); /* bulk still waits for send queue room */
	conn_link_wc(&lane->links[0], lat_seq, IBV_WC_SUCCESS, 0, 3);
	conn_table_work(&t, 3);
	ck_assert_int_eq(lat.calls, 1);
	ck_assert_int_eq(lat.err, 0);
	ck_assert_uint_eq(lat.x.bytes_done, 65536);
	for (size_t i = 0; i < ARRAY_SIZE(bulk); i++) {
		ck_assert_int_eq(bulk[i].calls, 0);
	}

	/* Shut down: each link's marker flushes what it still holds; everything ends once. */
	conn_table_shutdown(&t);
	for (size_t i = 0; i < g_fake.n_posted; i++) {
		if (g_fake.posted[i].wr.kind == WR_MARKER) {
			struct conn *c = (struct conn *)g_fake.posted[i].conn;
			conn_link_wc(&c->links[g_fake.posted[i].link], g_fake.posted[i].wr.seq,
				     IBV_WC_WR_FLUSH_ERR, 0, 4);
		}
	}
	conn_table_work(&t, 4);
	for (size_t i = 0; i < ARRAY_SIZE(bulk); i++) {
		ck_assert_int_eq(bulk[i].calls, 1);
	}
	ck_assert_int_eq(lat.calls, 1);
	ck_assert_int_eq(msg->calls, 1);
	ck_assert_int_eq(other.calls, 0);
	ck_assert_uint_eq(t.lanes_open, 0);
	table_teardown(&t);
	free(msg);
}
END_TEST

/* ------------------------------------------------- random interleavings */

/*
 * A model of what lies under conn.c in the daemon: a posting thread (one
 * FIFO of post lists, a QP's lists after its first failure dropped unless a
 * drain marker, each QP's failure reported later, settle withdrawing a QP's
 * lists and its report), and per QP a send queue that completes in order:
 * signaled WRs complete, every WR flushes once the QP is in error, nothing
 * completes once it is destroyed. Random steps interleave all of it with
 * port failures, rdma_cm events, fatal completions, timers and new xfers.
 */
#define MODEL_LISTS 512
#define MODEL_WRS   1024
#define MODEL_XFERS 48
#define MODEL_SEEDS 1000

struct model_list {
	struct conn_link *link;
	bool marker;
	size_t n;
	struct wr_desc wrs[16];
};

struct model_qp {
	struct conn_link *link;
	bool error, destroyed, failed, report, report_marker;
	size_t head, n;
	struct wr_desc wrs[MODEL_WRS];
};

struct model {
	uint64_t rng;
	bool thread; /* post lists go through the thread (else straight to the QP) */
	size_t n_lists;
	struct model_list lists[MODEL_LISTS];
	size_t n_qps;
	struct model_qp qps[8];
};

static uint32_t model_rand(struct model *m, uint32_t n)
{
	m->rng = m->rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((m->rng >> 33) % n);
}

static struct model_qp *model_qp(struct conn_link *link)
{
	for (size_t i = 0; i < g_model->n_qps; i++) {
		if (g_model->qps[i].link == link) {
			return &g_model->qps[i];
		}
	}
	ck_assert_uint_lt(g_model->n_qps, ARRAY_SIZE(g_model->qps));
	struct model_qp *q = &g_model->qps[g_model->n_qps++];
	memset(q, 0, sizeof(*q));
	q->link = link;
	return q;
}

static void qp_push(struct model_qp *q, const struct wr_desc *wrs, size_t n)
{
	ck_assert_msg(!q->destroyed, "a WR posted to a destroyed QP");
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_lt(q->head + q->n, MODEL_WRS);
		q->wrs[q->head + q->n++] = wrs[i];
	}
}

static bool model_post(struct conn_link *link, const struct wr_desc *wrs, size_t n)
{
	struct model_qp *q = model_qp(link);
	bool marker = n == 1 && wrs[0].kind == WR_MARKER;

	if (q->destroyed) {
		return false;
	}
	if (!g_model->thread) {
		qp_push(q, wrs, n);
		return true;
	}
	ck_assert_uint_lt(g_model->n_lists, MODEL_LISTS);
	ck_assert_uint_le(n, ARRAY_SIZE(g_model->lists[0].wrs));
	struct model_list *l = &g_model->lists[g_model->n_lists++];
	l->link = link;
	l->marker = marker;
	l->n = n;
	memcpy(l->wrs, wrs, n * sizeof(*wrs));
	return true;
}

static void model_settle(struct conn_link *link)
{
	struct model_qp *q = model_qp(link);
	size_t k = 0;

	for (size_t i = 0; i < g_model->n_lists; i++) {
		if (g_model->lists[i].link != link) {
			g_model->lists[k++] = g_model->lists[i];
		}
	}
	g_model->n_lists = k;
	q->report = q->report_marker = false;
}

static void model_disconnect(struct conn_link *link)
{
	model_qp(link)->error = true;
}

static void model_destroy(struct conn_link *link)
{
	struct model_qp *q = model_qp(link);

	model_settle(link);
	q->destroyed = q->error = true;
	q->n = 0;
}

/* The thread takes its next list: posts it, drops it, or its post fails. */
static void model_thread_step(struct model *m, bool may_fail)
{
	if (m->n_lists == 0) {
		return;
	}
	struct model_list l = m->lists[0];
	memmove(m->lists, m->lists + 1, (m->n_lists - 1) * sizeof(m->lists[0]));
	m->n_lists--;
	struct model_qp *q = model_qp(l.link);
	if (q->failed && !l.marker) {
		return;
	}
	if (may_fail && model_rand(m, 8) == 0) {
		q->failed = true;
		q->report = true;
		q->report_marker |= l.marker;
		return;
	}
	qp_push(q, l.wrs, l.n);
}

/* The loop reads a QP's failure report (the marker's when both failed). */
static void model_report(struct model *m, struct model_qp *q)
{
	if (!q->report) {
		return;
	}
	bool marker = q->report_marker;
	q->report = q->report_marker = false;
	conn_link_post_failed(q->link, marker, "model post failure");
}

/* The QP's next WR completes: a signaled one, or any once the QP is in error. */
static void model_qp_step(struct model_qp *q, uint64_t now)
{
	if (q->n == 0 || q->destroyed) {
		return;
	}
	struct wr_desc wr = q->wrs[q->head++];
	q->n--;
	if (q->error) {
		conn_link_wc(q->link, wr.seq, IBV_WC_WR_FLUSH_ERR, 0, now);
	} else if (wr.signaled) {
		conn_link_wc(q->link, wr.seq, IBV_WC_SUCCESS, 0, now);
	}
}

static void model_check_once(const struct txfer *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(x[i].calls <= 1, "xfer %zu done %d times", i, x[i].calls);
	}
}

START_TEST(conn_model_exactly_once)
{
	static struct model m;
	static struct txfer x[MODEL_XFERS];

	for (uint64_t seed = 1; seed <= MODEL_SEEDS; seed++) {
		struct conn_table t;
		struct conn_policy p = test_policy();
		size_t n_x = 0;
		uint64_t now = 1;

		memset(&m, 0, sizeof(m));
		m.rng = seed;
		m.thread = seed % 4 != 0;
		g_model = &m;
		table_setup(&t, &p, NULL);
		for (; n_x < 8; n_x++) {
			unit_txfer_init(&x[n_x], XFER_WRITE, 4096, PEER_INSTANCE);
			ck_assert_int_eq(conn_submit(&t, &x[n_x].x, now), 0);
		}
		struct conn *conn = the_conn(&t);
		connect_all(conn, NULL, PEER_INSTANCE, now);
		for (int step = 0; step < 200; step++) {
			now += model_rand(&m, 50);
			uint32_t l = model_rand(&m, conn->n_links);
			struct model_qp *q = model_qp(&conn->links[l]);
			switch (model_rand(&m, 12)) {
			case 0:
			case 1:
				model_thread_step(&m, true);
				break;
			case 2:
				model_report(&m, q);
				break;
			case 3:
			case 4:
				model_qp_step(q, now);
				break;
			case 5:
				if (model_rand(&m, 4) == 0 && conn->state != CONN_CLOSED) {
					/* The device's port went down (verbs_completions.c). */
					conn_close(conn, RDMAX_E_TRANSPORT_ERROR,
						   "model port down");
				}
				break;
			case 6:
				if (model_rand(&m, 4) == 0 && conn->state != CONN_CLOSED) {
					static const enum conn_event evs[] = {
						CONN_EV_DISCONNECTED, CONN_EV_DEVICE_REMOVAL,
						CONN_EV_QP_ERROR, CONN_EV_ADDR_CHANGE};
					q->error = true;
					conn_link_event(&conn->links[l], evs[model_rand(&m, 4)],
							NULL, now);
				}
				break;
			case 7:
				if (model_rand(&m, 4) == 0 && q->n > 0 && !q->error) {
					/* A WR fails on its own: the QP goes to error behind it. */
					struct wr_desc wr = q->wrs[q->head++];
					q->n--;
					q->error = true;
					conn_link_wc(q->link, wr.seq, IBV_WC_RETRY_EXC_ERR, 0, now);
				}
				break;
			case 8:
				if (g_fake.timer_on && conn->state != CONN_CLOSED) {
					now += g_fake.timer_ms;
					conn_timer_fired(conn, now);
				}
				break;
			case 9:
				if (n_x < MODEL_XFERS && conn->state == CONN_ESTABLISHED) {
					unit_txfer_init(&x[n_x], XFER_WRITE,
							(model_rand(&m, 3) + 1) << 20,
							PEER_INSTANCE);
					ck_assert_int_eq(conn_submit(&t, &x[n_x].x, now), 0);
					n_x++;
				}
				break;
			default:
				conn_table_work(&t, now);
				break;
			}
			model_check_once(x, n_x);
		}
		/* Then whatever is left runs out: no failure may strand an xfer. */
		for (int round = 0; round < 10000; round++) {
			bool busy = m.n_lists > 0;
			model_thread_step(&m, false);
			for (size_t i = 0; i < m.n_qps; i++) {
				busy |= m.qps[i].report || (m.qps[i].n > 0 && !m.qps[i].destroyed);
				model_report(&m, &m.qps[i]);
				model_qp_step(&m.qps[i], now);
			}
			if (!busy && g_fake.timer_on && conn->state != CONN_CLOSED) {
				now += g_fake.timer_ms;
				conn_timer_fired(conn, now);
				busy = true;
			}
			conn_table_work(&t, now);
			if (!busy) {
				break;
			}
		}
		model_check_once(x, n_x);
		for (size_t i = 0; i < n_x; i++) {
			ck_assert_msg(x[i].calls == 1,
				      "seed %" PRIu64 ": xfer %zu of %zu never done (conn %s)",
				      seed, i, n_x, conn_state_name(conn->state));
		}
		g_model = NULL;
		table_teardown(&t);
	}
}
END_TEST

Suite *conn_suite(void)
{
	Suite *s = suite_create("conn");
	TCase *tc = tcase_create("state machine");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, conn_connect_success);
	tcase_add_test(tc, conn_reject_app_reason);
	tcase_add_test(tc, conn_unreachable_retries);
	tcase_add_test(tc, conn_disconnect_mid_flight);
	tcase_add_test(tc, conn_wc_error_fails_cause_and_flushes_rest);
	tcase_add_test(tc, conn_collateral_message_names_the_cause);
	tcase_add_test(tc, conn_probe_verdicts);
	tcase_add_test(tc, conn_refused_access_requeues_others);
	tcase_add_test(tc, conn_refused_access_other_link_finishes);
	tcase_add_test(tc, conn_refused_access_on_both_links);
	tcase_add_test(tc, conn_idle_eviction);
	tcase_add_test(tc, conn_peer_timeout);
	tcase_add_test(tc, conn_withdraw_posted);
	tcase_add_test(tc, conn_stale_descriptor);
	tcase_add_test(tc, conn_mutual_auth);
	tcase_add_test(tc, conn_limit);
	tcase_add_test(tc, conn_uid_share);
	tcase_add_test(tc, conn_latency_lane);
	tcase_add_test(tc, conn_post_failure_and_lists);
	tcase_add_test(tc, conn_post_failure_reported_later);
	suite_add_tcase(s, tc);
	tc = tcase_create("random interleavings");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, conn_model_exactly_once);
	suite_add_tcase(s, tc);
	tc = tcase_create("private data and errors");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, conn_private_data_checks);
	tcase_add_test(tc, conn_domains);
	tcase_add_test(tc, conn_wc_error_map);
	suite_add_tcase(s, tc);
	tc = tcase_create("messages");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, conn_message_frames_and_answer);
	tcase_add_test(tc, conn_message_fails_once);
	tcase_add_test(tc, conn_message_stale_and_checks);
	suite_add_tcase(s, tc);
	return s;
}
