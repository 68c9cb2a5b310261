/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the verbs transport's connection set-up and message frames
 * (daemon/transport/verbs/conn.c), which is pure logic behind an ops table.
 * The first byte picks the side and whether this daemon has a shared key:
 *  - accepting: the bytes are a connect request's (or probe's) private data
 *    and must be accepted or refused with a named reason;
 *  - connecting: an outgoing connection is driven to the point where the
 *    peer answers, and the bytes are the private data of its accept or
 *    reject, link by link; its xfer must complete exactly once;
 *  - messages: the bytes are SEND frames off the shared receive queue,
 *    decoded and reassembled the way the transport does.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "fuzz.h"
#include "log.h"
#include "rdmax.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SELF_INSTANCE 0xaaaabbbbccccddddull
#define PEER_INSTANCE 0x1111222233334444ull
#define KEY           "0123456789abcdef0123456789abcdef"

static struct conn *g_released[8];
static size_t g_n_released;
uint8_t g_sink;

static int f_ok(void *ctx, struct conn_link *link, char *why, size_t why_size)
{
	return 0;
}

static int f_connect(void *ctx, struct conn_link *link, const uint8_t *pd, size_t pd_len, char *why,
		     size_t why_size)
{
	return 0;
}

static void f_link(void *ctx, struct conn_link *link)
{
}

static int f_post(void *ctx, struct conn_link *link, const struct wr_desc *wrs, size_t n, char *why,
		  size_t why_size)
{
	return 0;
}

static void f_timer_start(void *ctx, struct conn *conn, uint64_t ms)
{
}

static void f_timer_stop(void *ctx, struct conn *conn)
{
}

static void f_kick(void *ctx)
{
}

static void f_release(void *ctx, struct conn *conn)
{
	if (g_n_released == sizeof(g_released) / sizeof(g_released[0])) {
		abort();
	}
	g_released[g_n_released++] = conn;
}

static const struct conn_ops g_ops = {
	.link_start = f_ok,
	.link_resolve_route = f_ok,
	.link_connect = f_connect,
	.link_disconnect = f_link,
	.link_post = f_post,
	.link_destroy = f_link,
	.timer_start = f_timer_start,
	.timer_stop = f_timer_stop,
	.kick = f_kick,
	.release = f_release,
};

static struct conn_policy policy(uint32_t links)
{
	struct conn_policy p = {
		.links = links,
		.sq_depth = 16,
		.signal_interval = 4,
		.inline_threshold = 64,
		.batch = 4,
		.max_wr_bytes = 1 << 20,
		.connect_timeout_ms = 1000,
		.connect_retries = 0,
		.retry_backoff_ms = 100,
		.drain_timeout_ms = 2000,
		.peer_timeout_ms = 5000,
		.idle_timeout_s = 10,
		.max_connections = 8,
	};
	return p;
}

static void table_init(struct conn_table *t, uint32_t links, bool keyed)
{
	struct conn_policy p = policy(links);
	if (conn_table_init(t, &p, &g_ops, NULL, SELF_INSTANCE, keyed ? (const uint8_t *)KEY : NULL,
			    keyed ? strlen(KEY) : 0) < 0) {
		abort();
	}
}

static void table_fini(struct conn_table *t)
{
	conn_table_work(t, 0);
	for (size_t i = 0; i < g_n_released; i++) {
		conn_free(g_released[i]);
	}
	g_n_released = 0;
	conn_table_fini(t);
}

/* A connect request or probe arriving at this daemon. */
static void accepting(const uint8_t *pd, size_t len, bool keyed)
{
	static const uint8_t addr[16] = {[10] = 0xff, [11] = 0xff, 192, 0, 2, 1};
	struct conn_table t;
	struct conn_request req;
	struct conn_query q;
	uint8_t out[256];

	table_init(&t, 1, keyed);
	int type = conn_pd_type(pd, len);
	if (type < 0 || type >= CONN_PD_TYPE_MAX) {
		abort();
	}
	for (int round = 0; round < 2; round++) { /* the second one is a replay */
		enum conn_reject_reason why =
			conn_pd_check(&t, pd, len, addr, 7471, conn_realtime_ms(), &req);
		if (why >= CONN_REJ_MAX || !conn_reject_reason_str(why)) {
			abort();
		}
		if (why == CONN_REJ_NONE) {
			if (len < CONN_PD_REQ_LEN || req.link_index >= req.n_links ||
			    req.domain > 0xffffff) {
				abort();
			}
			/* A domain's proof holds for one token at most; none without a domain. */
			if (!req.domain && conn_pd_domain_ok(pd, len, get_le64(pd + 32))) {
				abort();
			}
			if (conn_pd_accept(out, sizeof(out), &t, pd, addr, 7471) <= 0) {
				abort();
			}
		} else if (conn_pd_reject(out, sizeof(out), why) <= 0) {
			abort();
		}
	}
	enum conn_reject_reason why = conn_pd_check_query(&t, pd, len, addr, 7471, &q);
	if (why >= CONN_REJ_MAX) {
		abort();
	}
	if (why == CONN_REJ_NONE && q.access != RDMAX_ACCESS_REMOTE_READ &&
	    q.access != RDMAX_ACCESS_REMOTE_WRITE) {
		abort();
	}
	table_fini(&t);
}

struct fxfer {
	struct xfer x;
	int calls;
};

static void fx_done(struct xfer *x, int err, const char *message)
{
	struct fxfer *f = container_of(x, struct fxfer, x);
	f->calls++;
	if (err == 0 || !message) {
		abort(); /* nothing was moved: only a named failure can finish it */
	}
}

/* An outgoing connection; the peer answers each link with the input's bytes. */
static void connecting(struct fuzz_in *in, bool keyed)
{
	struct conn_table t;
	struct fxfer fx = {0};
	uint32_t links = 1 + fuzz_u8(in) % 3;

	table_init(&t, links, keyed);
	fx.x.op = XFER_WRITE;
	fx.x.peer.transport = ENDPOINT_VERBS;
	snprintf(fx.x.peer.addr, sizeof(fx.x.peer.addr), "192.0.2.2");
	fx.x.peer.port = 7471;
	fx.x.remote_instance = PEER_INSTANCE;
	fx.x.length = 4096;
	fx.x.done = fx_done;
	if (conn_submit(&t, &fx.x, 0) < 0) {
		abort();
	}
	struct conn *conn = container_of(t.conns.next, struct conn, link);
	conn_timer_fired(conn, 1);
	for (uint32_t i = 0; i < conn->n_links; i++) {
		struct conn_event_data none = {0};
		conn_link_event(&conn->links[i], CONN_EV_ADDR_RESOLVED, &none, 1);
		conn_link_event(&conn->links[i], CONN_EV_ROUTE_RESOLVED, &none, 1);
	}
	for (uint32_t i = 0; i < links && in->n && !list_empty(&t.conns); i++) {
		uint8_t what = fuzz_u8(in);
		struct conn_event_data ev = {.status = (int8_t)fuzz_u8(in)};
		ev.private_len = fuzz_bytes(in, fuzz_u8(in), &ev.private_data);
		if (conn->links[i].state != LINK_CONNECTING) {
			break;
		}
		conn_link_event(&conn->links[i],
				(what & 1) ? CONN_EV_REJECTED : CONN_EV_ESTABLISHED, &ev, 2);
	}
	conn_table_work(&t, 3);
	conn_table_deliver(&t);
	if (fx.calls > 1) {
		abort();
	}
	conn_table_shutdown(&t);
	conn_table_work(&t, 4);
	conn_table_deliver(&t);
	if (fx.calls != 1) {
		fprintf(stderr, "fuzz_conn: xfer completed %d times\n", fx.calls);
		abort();
	}
	table_fini(&t);
}

/* SEND frames as the shared receive queue hands them over. */
static void messages(struct fuzz_in *in)
{
	struct conn_msg_rx rx = {0};

	while (in->n) {
		const uint8_t *frame;
		size_t len = fuzz_bytes(in, fuzz_u16(in) % (CONN_FRAME_MAX + 64), &frame);
		struct conn_frame f;
		if (conn_frame_decode(frame, len, &f) < 0) {
			continue;
		}
		if (len > CONN_FRAME_MAX || f.data + f.data_len > frame + len) {
			abort();
		}
		if (f.type != CONN_FRAME_MESSAGE) {
			continue;
		}
		int ret = conn_msg_rx_feed(&rx, &f);
		if (ret == 1) {
			/* The body is whole: name, sender, payload, as announced. */
			if (rx.got != (uint32_t)rx.name_len + rx.from_len + rx.payload_len) {
				abort();
			}
			uint8_t sum = 0;
			for (uint32_t i = 0; i < rx.got; i++) {
				sum ^= rx.body[i]; /* every byte readable (ASan) */
			}
			g_sink ^= sum;
			conn_msg_rx_reset(&rx);
		} else if (ret < 0) {
			if (ret != RDMAX_E_PROTOCOL_ERROR && ret != -ENOMEM) {
				abort();
			}
			conn_msg_rx_reset(&rx);
		}
	}
	conn_msg_rx_reset(&rx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = {data, size};
	static bool quiet;

	if (!quiet) {
		log_init(LOG_ERR, false); /* the state machine narrates at info level */
		quiet = true;
	}
	uint8_t mode = fuzz_u8(&in);
	switch (mode % 3) {
	case 0:
		accepting(in.p, in.n, mode & 4);
		break;
	case 1:
		connecting(&in, mode & 4);
		break;
	default:
		messages(&in);
		break;
	}
	return 0;
}
