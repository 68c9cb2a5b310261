/* SPDX-License-Identifier: MIT */
/*
 * The TCP transport driven over loopback by two or more transports on one
 * loop, with real registered regions: ordered writes, reads and imm,
 * refusals, limits, authentication, garbage and silent peers, restarts, and
 * a raw requester that sends frames as a hostile or odd peer may. Part of
 * the "wire" suite (its "tcp" case); the frame codec itself is test_wire.c.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include "fixtures.h"
#include "log.h"
#include "planner.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "status.h"
#include "transport.h"
#include "wire.h"

struct node {
	struct rdmaxd d;
	struct transport *t;
};

struct tx {
	struct xfer x;
	int calls;
	int err;
	int order;
	char msg[256];
};

static uv_loop_t g_loop;
static pthread_t g_loop_thread; /* the thread that runs g_loop */
static int g_pending;
static int g_order;

static void no_fire(void *owner, uint32_t imm, uint64_t count, void *arg)
{
}

static void node_start(struct node *n, const char *name, const char *key, uint16_t port)
{
	memset(n, 0, sizeof(*n));
	n->d.loop = &g_loop;
	config_defaults(&n->d.cfg);
	copy_string(n->d.cfg.listen_addr, sizeof(n->d.cfg.listen_addr), "127.0.0.1");
	n->d.cfg.listen_port = port;
	n->d.cfg.connect_timeout_ms = 300;
	n->d.cfg.handshake_timeout_ms = 300;
	n->d.cfg.connect_retries = 2;
	n->d.cfg.retry_backoff_ms = 20;
	n->d.cfg.peer_timeout_ms = 600;
	n->d.cfg.idle_timeout_s = 0;
	n->d.instance_id = random_u64();
	copy_string(n->d.node_name, sizeof(n->d.node_name), name);
	ck_assert_int_eq(region_table_init(&n->d.regions, n->d.instance_id), 0);
	ck_assert_int_eq(imm_table_init(&n->d.imm, 16, no_fire, NULL), 0);
	/* Its regions are owned by n: landings count in that namespace. */
	ck_assert_int_eq(imm_space_open(&n->d.imm, n, NULL, 0), 0);
	if (key) {
		n->d.auth_key_len = strlen(key);
		memcpy(n->d.auth_key, key, n->d.auth_key_len);
	}
	ck_assert_int_eq(transport_tcp_create(&n->d, &n->t), 0);
	ck_assert(n->t->ordered);
}

static void node_stop(struct node *n)
{
	n->t->ops->shutdown(n->t);
}

static void node_free(struct node *n)
{
	n->t->ops->destroy(n->t);
	region_table_fini(&n->d.regions);
	imm_table_fini(&n->d.imm);
}

/* Stop two nodes, let their handles close, free them. */
static void nodes_end(struct node *a, struct node *b)
{
	node_stop(a);
	node_stop(b);
	uv_run(&g_loop, UV_RUN_DEFAULT);
	node_free(a);
	node_free(b);
}

static uint16_t node_port(struct node *n)
{
	struct endpoint ep;

	ck_assert_int_eq(n->t->ops->endpoints(n->t, NULL, &ep, 1), 1);
	ck_assert_int_eq(ep.transport, ENDPOINT_TCP);
	ck_assert_str_eq(ep.addr, "127.0.0.1");
	ck_assert_uint_ne(ep.port, 0);
	return ep.port;
}

static struct region *node_region(struct node *n, uint64_t len, uint32_t access)
{
	struct region *region;
	int fd = memfd_create("test", MFD_ALLOW_SEALING | MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(region_register_host_fd(&n->d.regions, n, fd, 0, len, access, &region), 0);
	close(fd);
	return region;
}

/* Nodes a and b, a local region on a and a writable one on b, both of len bytes. */
static void write_pair(struct node *a, struct node *b, uint64_t len, struct region **local,
		       struct region **remote)
{
	node_start(a, "a", NULL, 0);
	node_start(b, "b", NULL, 0);
	*local = node_region(a, len, RDMAX_ACCESS_LOCAL);
	*remote = node_region(b, len, RDMAX_ACCESS_REMOTE_WRITE);
}

static void tx_done(struct xfer *xfer, int err, const char *message)
{
	struct tx *t = container_of(xfer, struct tx, x);

	t->calls++;
	t->err = err;
	t->order = g_order++;
	copy_string(t->msg, sizeof(t->msg), message ? message : "");
	g_pending--;
}

/* An xfer from `local` to `remote` of peer (port 1, nothing listens there, when NULL). */
static void tx_prep(struct tx *t, enum xfer_op op, struct node *peer, const struct region *remote,
		    struct region *local, uint64_t remote_offset, uint64_t local_offset,
		    uint64_t length)
{
	memset(t, 0, sizeof(*t));
	t->x.op = op;
	t->x.peer.transport = ENDPOINT_TCP;
	copy_string(t->x.peer.addr, sizeof(t->x.peer.addr), "127.0.0.1");
	t->x.peer.port = peer ? node_port(peer) : 1;
	t->x.remote_instance = peer ? peer->d.instance_id : 1;
	t->x.remote_region = remote ? remote->id : 1;
	t->x.remote_key = remote ? remote->key : 1;
	t->x.remote_offset = remote_offset;
	t->x.local = local;
	t->x.local_offset = local_offset;
	t->x.length = length;
	t->x.done = tx_done;
}

static void tx_submit(struct node *n, struct tx *t)
{
	ck_assert_int_eq(n->t->ops->submit(n->t, &t->x), 0);
	ck_assert_int_eq(t->calls, 0); /* never from inside submit */
	g_pending++;
}

static void run_until_done(void)
{
	uint64_t start = now_ms();

	while (g_pending > 0) {
		uv_run(&g_loop, UV_RUN_ONCE);
		ck_assert_uint_lt(now_ms() - start, 8000);
	}
}

static void run_for(uint64_t ms)
{
	uint64_t start = now_ms();

	while (now_ms() - start < ms) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
}

static void tx_check(const struct tx *t, int err, const char *message)
{
	ck_assert_int_eq(t->calls, 1);
	ck_assert_msg(t->err == err, "err %d, want %d (%s)", t->err, err, t->msg);
	if (message) {
		ck_assert_str_eq(t->msg, message);
	}
}

static void tcp_setup(void)
{
	ck_assert_int_eq(uv_loop_init(&g_loop), 0);
	g_loop_thread = pthread_self();
	log_set_level(LOG_ERR);
	g_pending = 0;
	g_order = 0;
}

static void tcp_teardown(void)
{
	uv_run(&g_loop, UV_RUN_DEFAULT);
	ck_assert_int_eq(uv_loop_close(&g_loop), 0);
}

START_TEST(tcp_write_read_imm_in_order)
{
	struct node a, b;
	struct tx t[61];
	const uint64_t mib = 1 << 20;

	node_start(&a, "a", NULL, 0);
	node_start(&b, "b", NULL, 0);
	struct region *local = node_region(&a, 8 * mib, RDMAX_ACCESS_LOCAL);
	struct region *remote =
		node_region(&b, 8 * mib, RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ);
	for (uint64_t i = 0; i < 8 * mib; i++) {
		local->addr[i] = (uint8_t)(i * 31 + 7);
	}

	/* One large write at interior offsets, with imm; then read it back elsewhere. */
	tx_prep(&t[0], XFER_WRITE, &b, remote, local, 4096 + 3, 17, 3 * mib);
	t[0].x.has_imm = true;
	t[0].x.imm = 42;
	tx_submit(&a, &t[0]);
	run_until_done();
	tx_check(&t[0], 0, NULL);
	ck_assert_uint_eq(t[0].x.bytes_done, 3 * mib);
	ck_assert_int_eq(memcmp(remote->addr + 4096 + 3, local->addr + 17, 3 * mib), 0);
	ck_assert_uint_eq(imm_count(&b.d.imm, &b, 42), 1);

	tx_prep(&t[0], XFER_READ, &b, remote, local, 4096 + 3, 5 * mib, 3 * mib);
	tx_submit(&a, &t[0]);
	run_until_done();
	tx_check(&t[0], 0, NULL);
	ck_assert_uint_eq(t[0].x.bytes_done, 3 * mib);
	ck_assert_int_eq(memcmp(local->addr + 5 * mib, local->addr + 17, 3 * mib), 0);

	/* Many small xfers complete in submit order; the imm on the last counts once. */
	for (int i = 0; i < 60; i++) {
		enum xfer_op op = i % 3 == 1 ? XFER_READ : XFER_WRITE;
		tx_prep(&t[i], op, &b, remote, local, (uint64_t)i * 100,
			(uint64_t)i * 100 + (op == XFER_READ ? 4 * mib : 0), 100);
		t[i].x.has_imm = i == 59;
		t[i].x.imm = 43;
		tx_submit(&a, &t[i]);
	}
	/* A zero-length write with imm is the barrier case. */
	tx_prep(&t[60], XFER_WRITE, &b, remote, NULL, 0, 0, 0);
	t[60].x.has_imm = true;
	t[60].x.imm = 44;
	tx_submit(&a, &t[60]);
	run_until_done();
	for (int i = 0; i <= 60; i++) {
		tx_check(&t[i], 0, NULL);
		ck_assert_int_eq(t[i].order, t[0].order + i);
	}
	ck_assert_uint_eq(imm_count(&b.d.imm, &b, 43), 1);
	ck_assert_uint_eq(imm_count(&b.d.imm, &b, 44), 1);

	nodes_end(&a, &b);
}
END_TEST

/*
 * [metrics] job_stages: every request frame's xfer carries the sendmsg()
 * that sent its first bytes, also one that began inside an earlier frame;
 * frames go out in queue order, so their stamps do too. With the key off
 * nothing is stamped.
 */
START_TEST(tcp_sends_timed)
{
	struct node a, b;
	struct tx t[21];
	const uint64_t mib = 1 << 20;

	struct region *local, *remote;

	write_pair(&a, &b, 32 * mib, &local, &remote);
	for (int on = 1; on >= 0; on--) {
		a.d.cfg.metrics_job_stages = on;
		/* A frame of many sendmsg() calls, and small ones queued behind it. */
		uint64_t before = now_ns();
		tx_prep(&t[0], XFER_WRITE, &b, remote, local, 0, 0, 24 * mib);
		tx_submit(&a, &t[0]);
		for (int i = 1; i < 21; i++) {
			tx_prep(&t[i], XFER_WRITE, &b, remote, local, 24 * mib + (uint64_t)i * 64,
				(uint64_t)i * 64, 64);
			tx_submit(&a, &t[i]);
		}
		run_until_done();
		for (int i = 0; i < 21; i++) {
			tx_check(&t[i], 0, NULL);
			if (!on) {
				ck_assert_uint_eq(t[i].x.post_ns, 0);
				continue;
			}
			ck_assert_msg(t[i].x.post_ns >= before, "xfer %d: no send stamped", i);
			ck_assert_uint_ge(t[i].x.post_end_ns, t[i].x.post_ns);
			if (i > 0) {
				ck_assert_uint_ge(t[i].x.post_ns, t[i - 1].x.post_ns);
			}
		}
		ck_assert_int_eq(memcmp(remote->addr, local->addr, 24 * mib), 0);
	}
	nodes_end(&a, &b);
}
END_TEST

START_TEST(tcp_refusals)
{
	struct node a, b;
	struct tx t[8];

	node_start(&a, "a", NULL, 0);
	node_start(&b, "b", NULL, 0);
	struct region *local = node_region(&a, 65536, RDMAX_ACCESS_LOCAL);
	struct region *rw =
		node_region(&b, 65536, RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ);
	struct region *ro = node_region(&b, 65536, RDMAX_ACCESS_REMOTE_READ);
	char peer[64], want[256];
	snprintf(peer, sizeof(peer), "127.0.0.1:%u", node_port(&b));
	memset(rw->addr, 0x5a, 65536);

	tx_prep(&t[0], XFER_WRITE, &b, rw, local, 0, 0, 4096);
	t[0].x.remote_key ^= 1;
	tx_prep(&t[1], XFER_WRITE, &b, rw, local, 0, 0, 4096);
	t[1].x.remote_instance ^= 1;
	tx_prep(&t[2], XFER_WRITE, &b, ro, local, 0, 0, 4096);
	tx_prep(&t[3], XFER_WRITE, &b, rw, local, 65536 - 100, 0, 4096);
	tx_prep(&t[4], XFER_READ, &b, rw, local, UINT64_MAX - 10, 0, 4096);
	tx_prep(&t[5], XFER_WRITE, &b, rw, NULL, 0, 0, 0); /* imm-only, bad key */
	t[5].x.has_imm = true;
	t[5].x.imm = 9;
	t[5].x.remote_key ^= 1;
	tx_prep(&t[6], XFER_WRITE, &b, rw, local, 0, 0, 16); /* fine after all of that */
	for (int i = 0; i <= 6; i++) {
		tx_submit(&a, &t[i]);
	}
	run_until_done();
	tx_check(&t[0], RDMAX_E_NOT_FOUND, NULL);
	ck_assert_ptr_nonnull(strstr(t[0].msg, peer));
	tx_check(&t[1], RDMAX_E_NOT_FOUND, NULL);
	snprintf(want, sizeof(want), "%s: region %llu is not registered for remote write", peer,
		 (unsigned long long)ro->id);
	tx_check(&t[2], RDMAX_E_REMOTE_ACCESS, want);
	tx_check(&t[3], RDMAX_E_OUT_OF_RANGE, NULL);
	tx_check(&t[4], RDMAX_E_OUT_OF_RANGE, NULL);
	tx_check(&t[5], RDMAX_E_NOT_FOUND, NULL);
	tx_check(&t[6], 0, NULL);
	ck_assert_uint_eq(imm_count(&b.d.imm, &b, 9), 0);
	/* Refused writes never touched memory: only t[6]'s 16 bytes changed. */
	ck_assert_int_eq(memcmp(rw->addr, local->addr, 16), 0);
	for (int i = 16; i < 65536; i++) {
		ck_assert_uint_eq(rw->addr[i], 0x5a);
	}
	for (int i = 0; i < 4096; i++) {
		ck_assert_uint_eq(ro->addr[i], 0);
	}

	/* Bad xfers are refused by submit itself, without a callback. */
	tx_prep(&t[7], XFER_READ, &b, rw, local, 0, 0, 16);
	t[7].x.has_imm = true;
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[7].x), RDMAX_E_INVALID_ARGUMENT);
	tx_prep(&t[7], XFER_WRITE, &b, rw, local, 0, 65000, 4096);
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[7].x), RDMAX_E_OUT_OF_RANGE);
	tx_prep(&t[7], XFER_WRITE, &b, rw, local, 0, 0, 16);
	copy_string(t[7].x.peer.addr, sizeof(t[7].x.peer.addr), "localhost");
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[7].x), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(t[7].calls, 0);

	nodes_end(&a, &b);
}
END_TEST

START_TEST(tcp_unreachable_and_limits)
{
	struct node a, b;
	struct tx t[3];

	node_start(&a, "a", NULL, 0);
	node_start(&b, "b", NULL, 0);
	tx_prep(&t[0], XFER_WRITE, NULL, NULL, NULL, 0, 0, 0);
	tx_prep(&t[1], XFER_WRITE, NULL, NULL, NULL, 0, 0, 0);
	tx_submit(&a, &t[0]);
	tx_submit(&a, &t[1]); /* queued on the same connecting peer */
	run_until_done();
	tx_check(&t[0], RDMAX_E_UNREACHABLE,
		 "connect to 127.0.0.1:1 failed after 3 attempts: Connection refused");
	tx_check(&t[1], RDMAX_E_UNREACHABLE, t[0].msg);

	/* One connection allowed: a second peer is refused at submit. */
	a.d.cfg.max_connections = 1;
	tx_prep(&t[0], XFER_WRITE, &b, NULL, NULL, 0, 0, 0);
	tx_submit(&a, &t[0]);
	tx_prep(&t[1], XFER_WRITE, NULL, NULL, NULL, 0, 0, 0);
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[1].x), RDMAX_E_RESOURCE_EXHAUSTED);
	run_until_done();
	tx_check(&t[0], RDMAX_E_NOT_FOUND, NULL); /* region 1 does not exist on b */

	/* Shutdown cancels queued xfers and refuses new ones. */
	a.d.cfg.max_connections = 8;
	tx_prep(&t[0], XFER_WRITE, NULL, NULL, NULL, 0, 0, 0);
	tx_prep(&t[1], XFER_WRITE, &b, NULL, NULL, 0, 0, 0);
	tx_submit(&a, &t[0]);
	tx_submit(&a, &t[1]);
	node_stop(&a);
	tx_check(&t[0], RDMAX_E_CANCELLED, NULL);
	tx_check(&t[1], RDMAX_E_CANCELLED, NULL);
	tx_prep(&t[2], XFER_WRITE, &b, NULL, NULL, 0, 0, 0);
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[2].x), RDMAX_E_CANCELLED);
	node_stop(&a); /* idempotent */
	node_stop(&b);
	uv_run(&g_loop, UV_RUN_DEFAULT);
	node_free(&a);
	node_free(&b);
}
END_TEST

START_TEST(tcp_authentication)
{
	struct node a, b, c, plain;
	struct tx t[4];
	char want[160];

	node_start(&a, "a", "shared secret key", 0);
	node_start(&b, "b", "shared secret key", 0);
	node_start(&c, "c", "some other key!!!", 0);
	node_start(&plain, "plain", NULL, 0);
	struct region *remote = node_region(&b, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct region *open = node_region(&plain, 4096, RDMAX_ACCESS_REMOTE_WRITE);

	tx_prep(&t[0], XFER_WRITE, &b, remote, NULL, 0, 0, 0);
	tx_submit(&a, &t[0]);
	tx_prep(&t[1], XFER_WRITE, &b, remote, NULL, 0, 0, 0);
	tx_submit(&c, &t[1]);
	tx_prep(&t[2], XFER_WRITE, &b, remote, NULL, 0, 0, 0);
	tx_submit(&plain, &t[2]);
	tx_prep(&t[3], XFER_WRITE, &plain, open, NULL, 0, 0, 0);
	tx_submit(&a, &t[3]);
	run_until_done();
	tx_check(&t[0], 0, NULL);
	snprintf(want, sizeof(want), "peer 127.0.0.1:%u refused authentication: %s", node_port(&b),
		 "authentication failed");
	tx_check(&t[1], RDMAX_E_PERMISSION_DENIED, want);
	snprintf(want, sizeof(want), "peer 127.0.0.1:%u refused authentication: %s", node_port(&b),
		 "authentication required");
	tx_check(&t[2], RDMAX_E_PERMISSION_DENIED, want);
	snprintf(want, sizeof(want), "peer 127.0.0.1:%u refused authentication: %s",
		 node_port(&plain), "authentication is not configured on this peer");
	tx_check(&t[3], RDMAX_E_PERMISSION_DENIED, want);

	node_stop(&a);
	node_stop(&b);
	node_stop(&c);
	node_stop(&plain);
	uv_run(&g_loop, UV_RUN_DEFAULT);
	node_free(&a);
	node_free(&b);
	node_free(&c);
	node_free(&plain);
}
END_TEST

static int raw_connect(uint16_t port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	return fd;
}

static size_t raw_hello(uint8_t *buf)
{
	struct wire_hello hello = {.version = WIRE_VERSION, .instance_id = 5, .node_name = "raw"};
	struct wire_header h = {.type = WIRE_HELLO, .length = WIRE_HELLO_BYTES};

	wire_header_encode(&h, buf);
	wire_hello_encode(&hello, buf + WIRE_HEADER_BYTES, WIRE_HELLO_BYTES);
	return WIRE_HEADER_BYTES + WIRE_HELLO_BYTES;
}

/* True when the daemon closed the connection (whatever it sent before). */
static bool raw_closed(int fd)
{
	uint8_t buf[512];

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET)) {
			return true;
		}
		if (n < 0) {
			return false;
		}
	}
}

/* Hostile or broken peers cost a connection, never the daemon. */
START_TEST(tcp_garbage_closes_connection)
{
	struct node a, b;
	struct tx t;
	uint8_t buf[1024];

	node_start(&a, "a", NULL, 0);
	node_start(&b, "b", NULL, 0);
	struct region *remote = node_region(&b, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	uint16_t port = node_port(&b);

	/* Garbage instead of a HELLO. */
	int fd = raw_connect(port);
	memset(buf, 'A', sizeof(buf));
	ck_assert_int_eq(send(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	run_for(50);
	ck_assert(raw_closed(fd));
	close(fd);

	/* A HELLO, then an answer the accepting side never expects. */
	fd = raw_connect(port);
	size_t len = raw_hello(buf);
	struct wire_header ack = {.type = WIRE_ACK};
	wire_header_encode(&ack, buf + len);
	ck_assert_int_eq(send(fd, buf, len + WIRE_HEADER_BYTES, 0),
			 (ssize_t)(len + WIRE_HEADER_BYTES));
	run_for(50);
	ck_assert(raw_closed(fd));
	close(fd);

	/* A newer wire version is refused with a reason. */
	fd = raw_connect(port);
	len = raw_hello(buf);
	buf[WIRE_HEADER_BYTES] = 9;
	ck_assert_int_eq(send(fd, buf, len, 0), (ssize_t)len);
	run_for(50);
	struct wire_header h;
	ck_assert_int_ge(recv(fd, buf, sizeof(buf), MSG_DONTWAIT), WIRE_HEADER_BYTES);
	ck_assert_int_eq(wire_header_decode(buf, WIRE_HEADER_BYTES, &h), 0);
	ck_assert_uint_eq(h.type, WIRE_ERROR);
	close(fd);

	/* The daemon still serves a well-behaved peer. */
	tx_prep(&t, XFER_WRITE, &b, remote, NULL, 0, 0, 0);
	tx_submit(&a, &t);
	run_until_done();
	tx_check(&t, 0, NULL);

	nodes_end(&a, &b);
}
END_TEST

/* A peer that accepts and then says nothing: first no HELLO, then no answers. */
START_TEST(tcp_silent_peer_times_out)
{
	struct node a;
	struct tx t[2];
	uint8_t buf[512];

	node_start(&a, "a", NULL, 0);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	struct sockaddr_in sin = {.sin_family = AF_INET};
	socklen_t sin_len = sizeof(sin);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(listen(lfd, 8), 0);
	getsockname(lfd, (struct sockaddr *)&sin, &sin_len);

	tx_prep(&t[0], XFER_WRITE, NULL, NULL, NULL, 0, 0, 0);
	t[0].x.peer.port = ntohs(sin.sin_port);
	tx_submit(&a, &t[0]);
	run_until_done();
	ck_assert_ptr_nonnull(strstr(t[0].msg, "failed after 3 attempts: handshake timed out"));
	tx_check(&t[0], RDMAX_E_UNREACHABLE, NULL);
	int fd;
	while ((fd = accept(lfd, NULL, NULL)) >= 0) {
		close(fd);
	}

	/* Now answer the HELLO, then stay silent with a request in flight. */
	tx_prep(&t[0], XFER_WRITE, NULL, NULL, NULL, 0, 0, 0);
	t[0].x.peer.port = ntohs(sin.sin_port);
	tx_prep(&t[1], XFER_READ, NULL, NULL, NULL, 0, 0, 0);
	t[1].x.peer.port = ntohs(sin.sin_port);
	tx_submit(&a, &t[0]);
	tx_submit(&a, &t[1]);
	while ((fd = accept(lfd, NULL, NULL)) < 0) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
	}
	size_t len = raw_hello(buf);
	ck_assert_int_eq(send(fd, buf, len, 0), (ssize_t)len);
	run_until_done();
	char want[128];
	snprintf(want, sizeof(want), "peer 127.0.0.1:%u stopped answering", ntohs(sin.sin_port));
	tx_check(&t[0], RDMAX_E_TIMEOUT, want);
	tx_check(&t[1], RDMAX_E_TIMEOUT, want);
	close(fd);
	close(lfd);

	node_stop(&a);
	uv_run(&g_loop, UV_RUN_DEFAULT);
	node_free(&a);
}
END_TEST

/* A peer that goes away fails what was in flight once; the next xfer reconnects. */
START_TEST(tcp_peer_restart)
{
	struct node a, b;
	struct tx t[2];
	const uint64_t len = 32 << 20;

	struct region *local, *remote;

	write_pair(&a, &b, len, &local, &remote);
	uint16_t port = node_port(&b);

	tx_prep(&t[0], XFER_WRITE, &b, remote, local, 0, 0, len);
	tx_prep(&t[1], XFER_WRITE, &b, remote, local, 0, 0, len);
	tx_submit(&a, &t[0]);
	tx_submit(&a, &t[1]);
	for (int i = 0; i < 4; i++) {
		uv_run(&g_loop, UV_RUN_ONCE);
	}
	node_stop(&b);
	run_until_done();
	ck_assert_int_eq(t[0].calls, 1);
	ck_assert_int_eq(t[1].calls, 1);
	ck_assert_int_eq(t[1].err, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_ptr_nonnull(strstr(t[1].msg, "connection to 127.0.0.1:"));
	uv_run(&g_loop, UV_RUN_NOWAIT);
	node_free(&b);

	node_start(&b, "b2", NULL, port);
	remote = node_region(&b, len, RDMAX_ACCESS_REMOTE_WRITE);
	tx_prep(&t[0], XFER_WRITE, &b, remote, local, 0, 0, 4096);
	tx_submit(&a, &t[0]);
	run_until_done();
	tx_check(&t[0], 0, NULL);

	nodes_end(&a, &b);
}
END_TEST

/* ---- a raw requester: frames as a hostile or odd peer may send them ---- */

struct raw_peer {
	int fd;
	uint8_t *in; /* everything received */
	size_t in_len, in_cap;
};

static void raw_pump(struct raw_peer *p)
{
	for (;;) {
		if (p->in_cap - p->in_len < 65536) {
			p->in_cap = p->in_cap * 2 + 65536;
			p->in = realloc(p->in, p->in_cap);
			ck_assert_ptr_nonnull(p->in);
		}
		ssize_t n = recv(p->fd, p->in + p->in_len, p->in_cap - p->in_len, MSG_DONTWAIT);
		if (n <= 0) {
			return;
		}
		p->in_len += (size_t)n;
	}
}

/*
 * Send buf from *off in pieces of the given sizes (cycled), running the
 * daemons' loop in between. Without reading the answers, stop once the
 * socket took nothing for 200 ms (the daemon stopped reading).
 */
static void raw_send_split(struct raw_peer *p, const uint8_t *buf, size_t len, size_t *off,
			   const size_t *pieces, size_t n_pieces, bool read_answers)
{
	uint64_t start = now_ms(), last = start;

	for (size_t i = 0; *off < len; i++) {
		size_t want = MIN(pieces[i % n_pieces], len - *off);
		ssize_t n = send(p->fd, buf + *off, want, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			*off += (size_t)n;
			last = now_ms();
		} else {
			ck_assert(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
			if (!read_answers && now_ms() - last > 200) {
				return;
			}
		}
		uv_run(&g_loop, UV_RUN_NOWAIT);
		if (read_answers) {
			raw_pump(p);
		}
		ck_assert_uint_lt(now_ms() - start, 8000);
	}
}

/* Run the loop and read until `len` bytes arrived in all. */
static void raw_expect(struct raw_peer *p, size_t len)
{
	uint64_t start = now_ms();

	while (p->in_len < len) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
		raw_pump(p);
		ck_assert_msg(now_ms() - start < 8000, "got %zu of %zu bytes", p->in_len, len);
	}
}

static void raw_open(struct raw_peer *p, uint16_t port, int rcvbuf)
{
	int one = 1;

	memset(p, 0, sizeof(*p));
	p->fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(p->fd, 0);
	if (rcvbuf > 0) {
		setsockopt(p->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	}
	setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(p->fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
}

static void raw_close(struct raw_peer *p)
{
	close(p->fd);
	free(p->in);
}

static size_t put_frame(uint8_t *buf, uint8_t type, uint64_t id, const struct node *n,
			const struct region *r, uint64_t offset, uint64_t length)
{
	struct wire_header h = {.type = type,
				.request_id = id,
				.instance = n->d.instance_id,
				.region_id = r->id,
				.region_key = r->key,
				.offset = offset,
				.length = length};

	wire_header_encode(&h, buf);
	return WIRE_HEADER_BYTES;
}

/* The answer at `off` in what the peer received; returns the offset after it. */
static size_t check_answer(const struct raw_peer *p, size_t off, uint8_t type, uint64_t id,
			   int status)
{
	struct wire_header h;

	ck_assert_uint_le(off + WIRE_HEADER_BYTES, p->in_len);
	ck_assert_int_eq(wire_header_decode(p->in + off, WIRE_HEADER_BYTES, &h), 0);
	ck_assert_uint_eq(h.type, type);
	ck_assert_uint_eq(h.request_id, id);
	ck_assert_int_eq((int)h.status, status);
	return off + WIRE_HEADER_BYTES +
	       (h.type == WIRE_READ_RESP && h.status == 0 ? h.length : 0) +
	       (h.type == WIRE_ACK ? h.length : 0);
}

/*
 * n READ_REQs from id first_id on into buf, read i asking for read_len bytes
 * of r from (i * 4096) % (region_len - read_len); check_read_answers() checks
 * their answers. Returns the bytes written.
 */
static size_t put_reads(uint8_t *buf, uint64_t first_id, uint64_t n, const struct node *node,
			const struct region *r, uint64_t region_len, uint64_t read_len)
{
	size_t len = 0;

	for (uint64_t i = 0; i < n; i++) {
		len += put_frame(buf + len, WIRE_READ_REQ, first_id + i, node, r,
				 (i * 4096) % (region_len - read_len), read_len);
	}
	return len;
}

/*
 * n READ_RESP answers from id first_id on, at off: answer i holds read_len
 * bytes of r from (i * 4096) % (region_len - read_len). Returns the offset after.
 */
static size_t check_read_answers(const struct raw_peer *p, size_t off, uint64_t first_id,
				 uint64_t n, const struct region *r, uint64_t region_len,
				 uint64_t read_len)
{
	for (uint64_t i = 0; i < n; i++) {
		off = check_answer(p, off, WIRE_READ_RESP, first_id + i, 0);
		ck_assert_int_eq(memcmp(p->in + off - read_len,
					r->addr + (i * 4096) % (region_len - read_len), read_len),
				 0);
	}
	return off;
}

/* The end of a raw-peer case: the peer and its frames gone, the node stopped and freed. */
static void raw_done(struct raw_peer *p, uint8_t *buf, struct node *n)
{
	raw_close(p);
	free(buf);
	node_stop(n);
	uv_run(&g_loop, UV_RUN_DEFAULT);
	node_free(n);
}

struct conn_seen {
	uint32_t max_queued;
};

static void note_conn(void *arg, const struct transport_conn_info *info)
{
	struct conn_seen *seen = arg;

	if (!info->outgoing) {
		seen->max_queued = MAX(seen->max_queued, info->queued);
	}
}

/*
 * Thousands of small WRITEs, then READ_REQs for far more than the socket
 * buffers hold, all pipelined behind the HELLO while the peer reads none of
 * the answers: the responder stops reading at its answer limit with
 * requests already received ahead, and must resume them once it can send
 * again, although no new byte arrives to wake it.
 */
START_TEST(tcp_pipelined_frames_resume_after_pause)
{
	enum { N_WRITE = 4000, LEN = 16, N_READ = 2000, READ_LEN = 16384 };
	const uint64_t region_len = 65536;
	struct node b;
	struct raw_peer p;
	struct conn_seen seen = {0};
	size_t cap = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES +
		     (size_t)N_WRITE * (WIRE_HEADER_BYTES + LEN) +
		     (size_t)N_READ * WIRE_HEADER_BYTES;
	uint8_t *buf = malloc(cap);

	node_start(&b, "b", NULL, 0);
	struct region *r =
		node_region(&b, region_len, RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ);
	size_t len = raw_hello(buf);
	for (uint64_t i = 0; i < N_WRITE; i++) {
		len += put_frame(buf + len, WIRE_WRITE, i + 1, &b, r, i * LEN, LEN);
		for (int k = 0; k < LEN; k++) {
			buf[len++] = (uint8_t)(i * 7 + (uint64_t)k);
		}
	}
	/* 32 MB of answers: more than any socket buffer, so the answers back up. */
	len += put_reads(buf + len, N_WRITE + 1, N_READ, &b, r, region_len, READ_LEN);

	raw_open(&p, node_port(&b), 4096);
	size_t sent = 0;
	raw_send_split(&p, buf, len, &sent, (size_t[]){len}, 1, false);
	for (uint64_t start = now_ms(); seen.max_queued < 256 && now_ms() - start < 3000;) {
		run_for(10);
		b.t->ops->list_conns(b.t, note_conn, &seen);
	}
	ck_assert_uint_ge(seen.max_queued, 256); /* it paused with answers queued */
	run_for(50);                             /* no new byte arrives while it is paused */
	raw_send_split(&p, buf, len, &sent, (size_t[]){len}, 1, true);

	size_t want = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES + (size_t)N_WRITE * WIRE_HEADER_BYTES +
		      (size_t)N_READ * (WIRE_HEADER_BYTES + READ_LEN);
	raw_expect(&p, want);
	for (uint64_t i = 0; i < N_WRITE; i++) {
		for (int k = 0; k < LEN; k++) {
			ck_assert_uint_eq(r->addr[i * LEN + (uint64_t)k],
					  (uint8_t)(i * 7 + (uint64_t)k));
		}
	}
	size_t off = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES;
	for (uint64_t i = 0; i < N_WRITE; i++) {
		off = check_answer(&p, off, WIRE_ACK, i + 1, 0);
	}
	off = check_read_answers(&p, off, N_WRITE + 1, N_READ, r, region_len, READ_LEN);
	ck_assert_uint_eq(off, want);
	raw_done(&p, buf, &b);
}
END_TEST

/*
 * A burst of small READ_REQs whose answers fit the socket buffers, the
 * answers read as they come: the responder pauses at its answer limit with
 * requests staged, and the answers drain from the loop's flush, not from a
 * writable event. It must resume the staged requests there: no new byte
 * arrives to wake it (a paged read cut into a READ_REQ per page for a peer
 * without READ_SEGS stalled this way until the frame deadline cut it off).
 */
START_TEST(tcp_staged_requests_resume_after_loop_flush)
{
	enum { N_READ = 4000, READ_LEN = 16 };
	const uint64_t region_len = 65536;
	struct node b;
	struct raw_peer p;
	uint8_t *buf = malloc(WIRE_HEADER_BYTES + WIRE_HELLO_BYTES + N_READ * WIRE_HEADER_BYTES);

	node_start(&b, "b", NULL, 0);
	struct region *r = node_region(&b, region_len, RDMAX_ACCESS_REMOTE_READ);
	for (uint64_t i = 0; i < region_len; i++) {
		r->addr[i] = (uint8_t)(i * 13 + 1);
	}
	size_t len = raw_hello(buf);
	len += put_reads(buf + len, 1, N_READ, &b, r, region_len, READ_LEN);
	raw_open(&p, node_port(&b), 0);
	size_t sent = 0;
	raw_send_split(&p, buf, len, &sent, (size_t[]){len}, 1, true);
	size_t want = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES +
		      (size_t)N_READ * (WIRE_HEADER_BYTES + READ_LEN);
	raw_expect(&p, want);
	size_t off = check_read_answers(&p, WIRE_HEADER_BYTES + WIRE_HELLO_BYTES, 1, N_READ, r,
					region_len, READ_LEN);
	ck_assert_uint_eq(off, want);
	raw_done(&p, buf, &b);
}
END_TEST

/*
 * The unit binary links with --wrap=sendmsg,--wrap=recvmsg (Makefile):
 * every sendmsg() it makes, counted; every recvmsg() the test's own
 * thread (the loop) makes on a socket while another thread (an I/O thread)
 * is inside sendmsg() on it; and the loop's recvmsg() calls per socket.
 */
ssize_t __real_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t __real_recvmsg(int fd, struct msghdr *msg, int flags);
ssize_t __wrap_recvmsg(int fd, struct msghdr *msg, int flags);
enum { WRAP_FDS = 1024 };
static uint64_t g_sendmsg_calls;
static uint32_t g_thread_sending[WRAP_FDS];
static uint64_t g_loop_reads_under_send;
static uint32_t g_loop_reads[WRAP_FDS];
static _Thread_local uint64_t g_recvmsg_eagain;

static bool on_loop_thread(void)
{
	return pthread_equal(pthread_self(), g_loop_thread);
}

ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags)
{
	bool mark = fd >= 0 && fd < WRAP_FDS && !on_loop_thread();

	__atomic_fetch_add(&g_sendmsg_calls, 1, __ATOMIC_RELAXED);
	if (mark) {
		__atomic_fetch_add(&g_thread_sending[fd], 1, __ATOMIC_SEQ_CST);
	}
	ssize_t n = __real_sendmsg(fd, msg, flags);
	if (mark) {
		__atomic_fetch_sub(&g_thread_sending[fd], 1, __ATOMIC_SEQ_CST);
	}
	return n;
}

ssize_t __wrap_recvmsg(int fd, struct msghdr *msg, int flags)
{
	if (fd >= 0 && fd < WRAP_FDS && on_loop_thread()) {
		g_loop_reads[fd]++;
		if (__atomic_load_n(&g_thread_sending[fd], __ATOMIC_SEQ_CST) > 0) {
			__atomic_fetch_add(&g_loop_reads_under_send, 1, __ATOMIC_RELAXED);
		}
	}
	ssize_t n = __real_recvmsg(fd, msg, flags);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		g_recvmsg_eagain++;
	}
	return n;
}

uint64_t unit_recvmsg_eagain(void)
{
	return g_recvmsg_eagain;
}

int (*unit_before_send)(int fd);
ssize_t __real_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags);

ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags)
{
	int err = unit_before_send ? unit_before_send(fd) : 0;
	if (err) {
		errno = err;
		return -1;
	}
	return __real_send(fd, buf, len, flags);
}

struct conn_sent {
	uint32_t queued;
	uint64_t bytes_sent;
};

static void note_sent(void *arg, const struct transport_conn_info *info)
{
	struct conn_sent *seen = arg;

	if (!info->outgoing) {
		seen->queued = info->queued;
		seen->bytes_sent = info->bytes_sent;
	}
}

/*
 * A responder whose socket is full (the requester reads none of 16 MiB of
 * READ answers): the spin's poll leaves the queued answers to the writable
 * event instead of calling sendmsg() on every pass, only to be refused; and
 * every answer goes out, byte for byte, once the requester reads.
 */
START_TEST(tcp_full_socket_waits_for_writable)
{
	enum { N_READ = 1024, READ_LEN = 16384, POLLS = 1000 };
	const uint64_t region_len = 65536;
	struct node b;
	struct raw_peer p;
	size_t cap = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES + (size_t)N_READ * WIRE_HEADER_BYTES;
	uint8_t *buf = malloc(cap);

	node_start(&b, "b", NULL, 0);
	struct region *r = node_region(&b, region_len, RDMAX_ACCESS_REMOTE_READ);
	for (uint64_t i = 0; i < region_len; i++) {
		r->addr[i] = (uint8_t)(i * 13 + 5);
	}
	size_t len = raw_hello(buf);
	len += put_reads(buf + len, 1, N_READ, &b, r, region_len, READ_LEN);
	raw_open(&p, node_port(&b), 4096);
	size_t sent = 0;
	raw_send_split(&p, buf, len, &sent, (size_t[]){len}, 1, false);
	/* Until answers are queued and nothing more leaves: the socket is full. */
	struct conn_sent seen = {0}, last = {0};
	int still = 0;
	for (uint64_t start = now_ms(); still < 5 && now_ms() - start < 3000;) {
		run_for(10);
		b.t->ops->list_conns(b.t, note_sent, &seen);
		still = seen.queued > 0 && seen.bytes_sent == last.bytes_sent ? still + 1 : 0;
		last = seen;
	}
	ck_assert_int_eq(still, 5);
	ck_assert_uint_lt(seen.bytes_sent, (uint64_t)N_READ * READ_LEN);

	uint64_t calls = __atomic_load_n(&g_sendmsg_calls, __ATOMIC_RELAXED);
	for (int i = 0; i < POLLS; i++) {
		b.t->ops->poll(b.t);
	}
	calls = __atomic_load_n(&g_sendmsg_calls, __ATOMIC_RELAXED) - calls;
	ck_assert_msg(calls <= 1, "%" PRIu64 " sendmsg() calls in %d polls of a full socket", calls,
		      POLLS);

	raw_send_split(&p, buf, len, &sent, (size_t[]){len}, 1, true);
	size_t want = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES +
		      (size_t)N_READ * (WIRE_HEADER_BYTES + READ_LEN);
	raw_expect(&p, want);
	size_t off = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES;
	off = check_read_answers(&p, off, 1, N_READ, r, region_len, READ_LEN);
	ck_assert_uint_eq(off, want);
	raw_done(&p, buf, &b);
}
END_TEST

/* Nodes a and b with every large TCP copy on the I/O threads. */
static void nodes_start_offloaded(struct node *a, struct node *b)
{
	setenv("RDMAXD_TEST_TCP_OFFLOAD", "1", 1);
	node_start(a, "a", NULL, 0);
	node_start(b, "b", NULL, 0);
	unsetenv("RDMAXD_TEST_TCP_OFFLOAD");
}

/*
 * Bulk writes whose sends run on I/O threads: the loop reads none of the
 * answers while a thread sends on the same socket (each call holds the
 * socket's lock, so the loop would wait in recvmsg() and serve nobody);
 * the answers are read once the thread's op is back, every write completes
 * once, and every byte lands.
 */
START_TEST(tcp_answers_wait_for_the_sending_thread)
{
	enum { N = 24 };
	const uint64_t mib = 1 << 20, len = 2 * mib + 4096;
	struct node a, b;
	struct tx t[N];

	nodes_start_offloaded(&a, &b);
	struct region *local = node_region(&a, 8 * mib, RDMAX_ACCESS_LOCAL);
	struct region *remote = node_region(&b, (uint64_t)N * len, RDMAX_ACCESS_REMOTE_WRITE);
	for (uint64_t i = 0; i < 8 * mib; i++) {
		local->addr[i] = (uint8_t)(i * 29 + 3);
	}
	__atomic_store_n(&g_loop_reads_under_send, 0, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++) {
		tx_prep(&t[i], XFER_WRITE, &b, remote, local, (uint64_t)i * len,
			(uint64_t)(i % 3) * mib, len);
		tx_submit(&a, &t[i]);
	}
	run_until_done();
	for (int i = 0; i < N; i++) {
		tx_check(&t[i], 0, NULL);
		ck_assert_uint_eq(t[i].x.bytes_done, len);
		ck_assert_int_eq(memcmp(remote->addr + (uint64_t)i * len,
					local->addr + (uint64_t)(i % 3) * mib, len),
				 0);
	}
	ck_assert_uint_ge(a.d.counters.tcp_io_thread_sent, (uint64_t)N * len / 2);
	uint64_t under = __atomic_load_n(&g_loop_reads_under_send, __ATOMIC_RELAXED);
	ck_assert_msg(under == 0, "the loop read %" PRIu64 " times while a thread was sending",
		      under);

	nodes_end(&a, &b);
}
END_TEST

/* b's end of a connection the loop read: the socket whose local port is b's listener. */
static int responder_fd(struct node *b)
{
	int fd_b = -1;

	for (int fd = 0; fd < WRAP_FDS; fd++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		if (g_loop_reads[fd] && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 &&
		    sa.sin_family == AF_INET && ntohs(sa.sin_port) == node_port(b)) {
			fd_b = fd;
		}
	}
	ck_assert_int_ge(fd_b, 0);
	return fd_b;
}

/*
 * libuv's epoll_ctl() calls, counted: this definition takes the place of
 * libc's for libuv too (an executable's symbol comes first).
 */
static uint64_t g_epoll_ctl_calls;

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)
{
	__atomic_fetch_add(&g_epoll_ctl_calls, 1, __ATOMIC_RELAXED);
	return (int)syscall(SYS_epoll_ctl, epfd, op, fd, event);
}

/*
 * Small writes one at a time (a latency client's pattern) cost no system
 * call that does nothing for them: a request on a socket with room goes out
 * from the next loop iteration without watching for the writable event (which
 * cost two epoll_ctl() calls per request, to start watching and to stop), and
 * the responder reads each request with one recvmsg() and answers, without a
 * second call that would only hear EAGAIN. A frame that fills the socket
 * still waits for that event and lands whole, in order.
 */
START_TEST(tcp_small_requests_one_at_a_time)
{
	enum { N = 64 };
	struct node a, b;
	struct tx t[2];
	const uint64_t mib = 1 << 20;
	struct region *local, *remote;

	write_pair(&a, &b, 32 * mib, &local, &remote);
	for (uint64_t i = 0; i < 32 * mib; i++) {
		local->addr[i] = (uint8_t)(i * 7 + 3);
	}
	/* The connection first: its set-up watches the socket as it must. */
	tx_prep(&t[0], XFER_WRITE, &b, remote, local, 0, 0, 64);
	tx_submit(&a, &t[0]);
	run_until_done();
	tx_check(&t[0], 0, NULL);

	memset(g_loop_reads, 0, sizeof(g_loop_reads));
	uint64_t calls = __atomic_load_n(&g_epoll_ctl_calls, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++) {
		tx_prep(&t[0], XFER_WRITE, &b, remote, local, (uint64_t)i * 64, (uint64_t)i * 64,
			64);
		tx_submit(&a, &t[0]);
		run_until_done();
		tx_check(&t[0], 0, NULL);
	}
	calls = __atomic_load_n(&g_epoll_ctl_calls, __ATOMIC_RELAXED) - calls;
	ck_assert_msg(calls <= 4, "%" PRIu64 " epoll_ctl() calls for %d small writes", calls, N);
	int fd_b = responder_fd(&b);
	ck_assert_msg(g_loop_reads[fd_b] <= N + N / 8, "b read its socket %u times for %d requests",
		      g_loop_reads[fd_b], N);
	ck_assert_int_eq(memcmp(remote->addr, local->addr, N * 64), 0);

	/* 24 MiB fill both sockets' buffers: the rest waits for room, then lands. */
	tx_prep(&t[0], XFER_WRITE, &b, remote, local, mib, mib, 24 * mib);
	tx_submit(&a, &t[0]);
	tx_prep(&t[1], XFER_WRITE, &b, remote, local, 0, 0, 64);
	tx_submit(&a, &t[1]);
	run_until_done();
	tx_check(&t[0], 0, NULL);
	tx_check(&t[1], 0, NULL);
	ck_assert_int_lt(t[0].order, t[1].order);
	ck_assert_int_eq(memcmp(remote->addr + mib, local->addr + mib, 24 * mib), 0);
	nodes_end(&a, &b);
}
END_TEST

/* Whether the kernel ACKs what fd receives at once: not in delayed-ACK ping-pong mode. */
static bool acks_at_once(int fd)
{
	int val = -1;
	socklen_t len = sizeof(val);

	ck_assert_int_eq(getsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &val, &len), 0);
	return val != 0;
}

/* n writes of len bytes from a to b, one at a time, each landing; urgent: on the latency lane. */
static void writes_one_at_a_time(struct node *a, struct node *b, struct region *remote,
				 struct region *local, int n, uint64_t len, bool urgent)
{
	struct tx t;

	for (int i = 0; i < n; i++) {
		tx_prep(&t, XFER_WRITE, b, remote, local, 0, 0, len);
		t.x.urgent = urgent;
		tx_submit(a, &t);
		run_until_done();
		tx_check(&t, 0, NULL);
	}
}

/*
 * Linux puts a socket that sends data soon after it received some into
 * delayed-ACK "ping-pong" mode, as each answer does; a responder to bulk
 * writes in that mode delays its TCP ACKs and stalls the writer. After
 * answering large writes the responder leaves it (TCP_QUICKACK, which
 * getsockopt() reads back as "not in ping-pong mode"); answers to small
 * writes leave the kernel's choice, ACKs riding on the answers, alone.
 */
START_TEST(tcp_bulk_responder_acks_at_once)
{
	const uint64_t mib = 1 << 20;
	struct node a, b;
	struct region *local, *remote;

	write_pair(&a, &b, mib, &local, &remote);
	memset(g_loop_reads, 0, sizeof(g_loop_reads));
	writes_one_at_a_time(&a, &b, remote, local, 8, 64, false);
	int fd_b = responder_fd(&b);
	ck_assert_msg(!acks_at_once(fd_b), "answers to small writes: ping-pong mode expected");
	writes_one_at_a_time(&a, &b, remote, local, 4, mib, false);
	ck_assert_msg(acks_at_once(fd_b), "the responder to 1 MiB writes delays its ACKs");
	nodes_end(&a, &b);

	/*
	 * While latency-class traffic flows the kernel keeps its choice: on the
	 * lane, and on a bulk connection whose payloads go to the I/O threads,
	 * the call would wait for a thread's copy and hold the loop that serves
	 * the lane (docs/benchmarks.md, "Quick ACKs beside latency traffic").
	 */
	write_pair(&a, &b, mib, &local, &remote);
	memset(g_loop_reads, 0, sizeof(g_loop_reads));
	writes_one_at_a_time(&a, &b, remote, local, 8, 64 << 10, true);
	fd_b = responder_fd(&b);
	ck_assert_msg(!acks_at_once(fd_b), "the latency lane's responder left ping-pong mode");
	nodes_end(&a, &b);

	nodes_start_offloaded(&a, &b);
	local = node_region(&a, mib, RDMAX_ACCESS_LOCAL);
	remote = node_region(&b, mib, RDMAX_ACCESS_REMOTE_WRITE);
	memset(g_loop_reads, 0, sizeof(g_loop_reads));
	writes_one_at_a_time(&a, &b, remote, local, 4, mib, false);
	ck_assert_uint_gt(b.d.counters.tcp_io_thread_received, 0);
	fd_b = responder_fd(&b);
	ck_assert_msg(!acks_at_once(fd_b),
		      "a responder receiving on I/O threads left ping-pong mode");
	nodes_end(&a, &b);
}
END_TEST

/*
 * A stream of large writes received on I/O threads: the thread that reads
 * a payload's last bytes also takes what is there of the next frame's
 * header, so the receiving loop parses most headers without a recvmsg() of
 * its own on the socket (each would process the socket's backlog on the
 * loop's CPU); every write completes once and every byte lands.
 */
START_TEST(tcp_receiving_thread_reads_the_next_header)
{
	enum { N = 24 };
	const uint64_t len = 512 * 1024;
	struct node a, b;
	struct tx t[N];

	nodes_start_offloaded(&a, &b);
	struct region *local = node_region(&a, (uint64_t)N * len, RDMAX_ACCESS_LOCAL);
	struct region *remote = node_region(&b, (uint64_t)N * len, RDMAX_ACCESS_REMOTE_WRITE);
	for (uint64_t i = 0; i < (uint64_t)N * len; i++) {
		local->addr[i] = (uint8_t)(i * 31 + 7);
	}
	memset(g_loop_reads, 0, sizeof(g_loop_reads));
	for (int i = 0; i < N; i++) {
		tx_prep(&t[i], XFER_WRITE, &b, remote, local, (uint64_t)i * len, (uint64_t)i * len,
			len);
		tx_submit(&a, &t[i]);
	}
	run_until_done();
	for (int i = 0; i < N; i++) {
		tx_check(&t[i], 0, NULL);
		ck_assert_uint_eq(t[i].x.bytes_done, len);
	}
	ck_assert_int_eq(memcmp(remote->addr, local->addr, (uint64_t)N * len), 0);
	ck_assert_uint_ge(b.d.counters.tcp_io_thread_received, (uint64_t)N * len / 2);
	int fd_b = responder_fd(&b);
	/* Without the read-ahead the receiving loop reads each of the N headers itself. */
	ck_assert_msg(g_loop_reads[fd_b] < N / 2, "b's loop read its socket %u times for %d frames",
		      g_loop_reads[fd_b], N);

	nodes_end(&a, &b);
}
END_TEST

/* One xfer of runs[0..n) (total bytes) between a's local and b's remote, run to a success. */
static void xfer_runs(struct node *a, struct tx *t, enum xfer_op op, struct node *b,
		      const struct region *remote, struct region *local,
		      const struct plan_run *runs, uint32_t n, uint64_t total)
{
	tx_prep(t, op, b, remote, local, 0, 0, total);
	t->x.runs = runs;
	t->x.n_runs = n;
	tx_submit(a, t);
	run_until_done();
	tx_check(t, 0, NULL);
	ck_assert_uint_eq(t->x.bytes_done, total);
}

/*
 * Segment lists received on I/O threads, a WRITE_SEGS at its owner and a
 * READ_SEGS answer at its reader, with more segments than one operation
 * takes: every run lands where it says and nothing between the runs is
 * touched, one done per xfer, and the threads received the payloads.
 */
START_TEST(tcp_segs_received_on_threads)
{
	enum { RUNS = 200, RUN = 20000, GAP = 7 };
	const uint64_t total = (uint64_t)RUNS * RUN, span = 8 << 20;
	static struct plan_run wruns[RUNS], rruns[RUNS];
	struct node a, b;
	struct tx t[2];

	nodes_start_offloaded(&a, &b);
	struct region *local = node_region(&a, span, RDMAX_ACCESS_LOCAL);
	struct region *remote =
		node_region(&b, span, RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ);
	for (uint64_t i = 0; i < span; i++) {
		local->addr[i] = (uint8_t)(i * 29 + 3);
	}
	memset(remote->addr, 0x5a, span);
	/* Written in reverse order with gaps; read back into the local upper half. */
	for (int i = 0; i < RUNS; i++) {
		uint64_t at = (uint64_t)(RUNS - 1 - i) * (RUN + GAP) + 3;
		wruns[i] = (struct plan_run){
			.local_offset = (uint64_t)i * RUN, .remote_offset = at, .length = RUN};
		rruns[i] = (struct plan_run){.local_offset = span / 2 + (uint64_t)i * RUN,
					     .remote_offset = at,
					     .length = RUN};
	}
	xfer_runs(&a, &t[0], XFER_WRITE, &b, remote, local, wruns, RUNS, total);
	ck_assert_uint_ge(b.d.counters.tcp_io_thread_received, total / 2);
	for (int i = 0; i < RUNS; i++) {
		ck_assert_int_eq(memcmp(remote->addr + wruns[i].remote_offset,
					local->addr + wruns[i].local_offset, RUN),
				 0);
		for (int g = 0; g < GAP; g++) {
			ck_assert_uint_eq(remote->addr[wruns[i].remote_offset + RUN + g], 0x5a);
		}
	}

	memset(local->addr + span / 2, 0, span / 2);
	xfer_runs(&a, &t[1], XFER_READ, &b, remote, local, rruns, RUNS, total);
	ck_assert_uint_ge(a.d.counters.tcp_io_thread_received, total / 2);
	ck_assert_int_eq(memcmp(local->addr + span / 2, local->addr, total), 0);
	for (uint64_t i = span / 2 + total; i < span; i++) {
		ck_assert_uint_eq(local->addr[i], 0);
	}

	nodes_end(&a, &b);
}
END_TEST

/*
 * Frames cut at every kind of boundary (inside headers, payloads, between
 * frames): small payloads, one large enough to go straight to memory, a
 * refused one larger than the discard sink, a zero-length one with imm.
 */
START_TEST(tcp_frames_split_anywhere)
{
	const uint64_t big = 20000, refused = 200000;
	struct node b;
	struct raw_peer p;
	uint8_t *buf = malloc(400000);
	static const size_t pieces[] = {1, 7, 63, 64, 65, 3, 4096, 13, 100, 9000, 2};

	node_start(&b, "b", NULL, 0);
	struct region *r = node_region(&b, 65536, RDMAX_ACCESS_REMOTE_WRITE);
	size_t len = raw_hello(buf);
	len += put_frame(buf + len, WIRE_WRITE, 1, &b, r, 5, 100);
	for (int k = 0; k < 100; k++) {
		buf[len++] = (uint8_t)(k + 1);
	}
	len += put_frame(buf + len, WIRE_WRITE, 2, &b, r, 1000, big);
	for (uint64_t k = 0; k < big; k++) {
		buf[len++] = (uint8_t)(k * 13 + 5);
	}
	len += put_frame(buf + len, WIRE_WRITE, 3, &b, r, 0, refused); /* beyond the region */
	memset(buf + len, 0xee, refused);
	len += refused;
	struct wire_header imm = {.type = WIRE_WRITE,
				  .flags = WIRE_F_HAS_IMM,
				  .imm = 77,
				  .request_id = 4,
				  .instance = b.d.instance_id,
				  .region_id = r->id,
				  .region_key = r->key};
	wire_header_encode(&imm, buf + len);
	len += WIRE_HEADER_BYTES;

	raw_open(&p, node_port(&b), 0);
	size_t sent = 0;
	raw_send_split(&p, buf, len, &sent, pieces, sizeof(pieces) / sizeof(pieces[0]), true);
	size_t want = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES + 4 * WIRE_HEADER_BYTES;
	raw_expect(&p, want); /* the refusal's message comes on top */
	size_t off = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES;
	off = check_answer(&p, off, WIRE_ACK, 1, 0);
	off = check_answer(&p, off, WIRE_ACK, 2, 0);
	raw_expect(&p, off + WIRE_HEADER_BYTES);
	off = check_answer(&p, off, WIRE_ACK, 3, status_from_err(RDMAX_E_OUT_OF_RANGE));
	raw_expect(&p, off + WIRE_HEADER_BYTES);
	off = check_answer(&p, off, WIRE_ACK, 4, 0);
	ck_assert_uint_eq(off, p.in_len);
	for (int k = 0; k < 100; k++) {
		ck_assert_uint_eq(r->addr[5 + k], (uint8_t)(k + 1));
	}
	for (uint64_t k = 0; k < big; k++) {
		ck_assert_uint_eq(r->addr[1000 + k], (uint8_t)(k * 13 + 5));
	}
	ck_assert_uint_eq(r->addr[0], 0); /* the refused write touched nothing */
	ck_assert_uint_eq(r->addr[65535], 0);
	ck_assert_uint_eq(imm_count(&b.d.imm, &b, 77), 1);
	raw_done(&p, buf, &b);
}
END_TEST

/* A region of n that is only read (a GPU-less read-only mapping): no read may land in it. */
static struct region *ro_local(struct node *n)
{
	struct region *region = node_region(n, 65536, RDMAX_ACCESS_LOCAL);

	region->writable = false;
	return region;
}

/*
 * Xfers of several runs travel as one WRITE_SEGS frame: every segment lands
 * where its run says, the imm counts once after all of them, one done per
 * xfer; every access is checked per segment on the receiving side.
 */
START_TEST(tcp_write_segs)
{
	enum { PAGES = 40, PAGE = 4096 };
	struct node a, b;
	struct tx t[8];
	struct plan_run runs[WIRE_SEGS_MAX + 1];
	struct plan_run odd[3] = {
		{.local_offset = 3, .remote_offset = 260000, .length = 5000},
		{.local_offset = 9000, .remote_offset = 11, .length = 1},
		{.local_offset = 20000, .remote_offset = 230001, .length = 20000}};

	node_start(&a, "a", NULL, 0);
	node_start(&b, "b", NULL, 0);
	ck_assert_uint_ge(a.t->max_runs, 2);
	struct region *local = node_region(&a, 1 << 20, RDMAX_ACCESS_LOCAL);
	struct region *rw = node_region(&b, 1 << 20, RDMAX_ACCESS_REMOTE_WRITE);
	struct region *ro = node_region(&b, 65536, RDMAX_ACCESS_REMOTE_READ);
	for (uint64_t i = 0; i < (1 << 20); i++) {
		local->addr[i] = (uint8_t)(i * 29 + 3);
	}
	memset(rw->addr, 0x5a, 1 << 20);

	/* Reversed pages: source page i goes to destination page PAGES + 7 - i. */
	uint64_t total = 0;
	for (int i = 0; i < PAGES; i++) {
		runs[i] = (struct plan_run){.local_offset = (uint64_t)i * PAGE,
					    .remote_offset = (uint64_t)(PAGES + 7 - i) * PAGE,
					    .length = PAGE};
		total += PAGE;
	}
	tx_prep(&t[0], XFER_WRITE, &b, rw, local, 0, 0, total);
	t[0].x.runs = runs;
	t[0].x.n_runs = PAGES;
	t[0].x.has_imm = true;
	t[0].x.imm = 51;
	tx_prep(&t[1], XFER_WRITE, &b, rw, local, 0, 0, 25001);
	t[1].x.runs = odd;
	t[1].x.n_runs = 3;
	tx_submit(&a, &t[0]);
	tx_submit(&a, &t[1]);
	run_until_done();
	tx_check(&t[0], 0, NULL);
	tx_check(&t[1], 0, NULL);
	ck_assert_uint_eq(t[0].x.bytes_done, total);
	ck_assert_uint_eq(t[1].x.bytes_done, 25001);
	ck_assert_uint_eq(imm_count(&b.d.imm, &b, 51), 1);
	for (int i = 0; i < PAGES; i++) {
		ck_assert_int_eq(memcmp(rw->addr + (uint64_t)(PAGES + 7 - i) * PAGE,
					local->addr + (uint64_t)i * PAGE, PAGE),
				 0);
	}
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(memcmp(rw->addr + odd[i].remote_offset,
					local->addr + odd[i].local_offset, odd[i].length),
				 0);
	}
	ck_assert_uint_eq(rw->addr[10], 0x5a); /* around the 1-byte segment */
	ck_assert_uint_eq(rw->addr[12], 0x5a);
	for (uint64_t i = 12; i < 8 * PAGE; i++) {
		ck_assert_uint_eq(rw->addr[i], 0x5a); /* between segments: untouched */
	}
	for (uint64_t i = 48 * PAGE; i < 230001; i++) {
		ck_assert_uint_eq(rw->addr[i], 0x5a);
	}

	/* WIRE_SEGS_MAX one-byte segments, every other byte. */
	memset(rw->addr, 0, 1024);
	for (int i = 0; i < WIRE_SEGS_MAX; i++) {
		runs[i] = (struct plan_run){
			.local_offset = (uint64_t)i, .remote_offset = (uint64_t)i * 2, .length = 1};
	}
	tx_prep(&t[2], XFER_WRITE, &b, rw, local, 0, 0, WIRE_SEGS_MAX);
	t[2].x.runs = runs;
	t[2].x.n_runs = WIRE_SEGS_MAX;
	tx_submit(&a, &t[2]);
	run_until_done();
	tx_check(&t[2], 0, NULL);
	for (int i = 0; i < WIRE_SEGS_MAX; i++) {
		ck_assert_uint_eq(rw->addr[i * 2], local->addr[i]);
		ck_assert_uint_eq(rw->addr[i * 2 + 1], 0);
	}

	/* Refusals by the owner: a read-only region, a segment past the end, a wrong key. */
	char peer[64], want[256];
	snprintf(peer, sizeof(peer), "127.0.0.1:%u", node_port(&b));
	struct plan_run past[2] = {
		{.local_offset = 0, .remote_offset = 0, .length = 100},
		{.local_offset = 100, .remote_offset = (1 << 20) - 50, .length = 100}};
	memset(rw->addr, 0x5a, 200);
	tx_prep(&t[3], XFER_WRITE, &b, ro, local, 0, 0, 200);
	t[3].x.runs = past;
	t[3].x.n_runs = 2;
	t[3].x.has_imm = true;
	t[3].x.imm = 52;
	tx_prep(&t[4], XFER_WRITE, &b, rw, local, 0, 0, 200);
	t[4].x.runs = past;
	t[4].x.n_runs = 2;
	t[4].x.has_imm = true;
	t[4].x.imm = 52;
	tx_prep(&t[5], XFER_WRITE, &b, rw, local, 0, 0, 200);
	t[5].x.runs = past;
	t[5].x.n_runs = 1; /* lengths do not add up: refused by submit */
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[5].x), RDMAX_E_INVALID_ARGUMENT);
	t[5].x.length = 100;
	t[5].x.remote_key ^= 1;
	for (int i = 3; i <= 5; i++) {
		tx_submit(&a, &t[i]);
	}
	run_until_done();
	snprintf(want, sizeof(want), "%s: region %llu is not registered for remote write", peer,
		 (unsigned long long)ro->id);
	tx_check(&t[3], RDMAX_E_REMOTE_ACCESS, want);
	snprintf(want, sizeof(want), "%s: segment 1: range %u+100 is outside region %llu", peer,
		 (1 << 20) - 50, (unsigned long long)rw->id);
	tx_check(&t[4], RDMAX_E_OUT_OF_RANGE, want);
	tx_check(&t[5], RDMAX_E_NOT_FOUND, NULL);
	ck_assert_uint_eq(imm_count(&b.d.imm, &b, 52), 0);
	for (int i = 0; i < 200; i++) {
		ck_assert_uint_eq(rw->addr[i], 0x5a); /* the first, valid segment did not land */
	}

	/* Bad run lists are refused by submit itself. */
	for (int i = 0; i <= WIRE_SEGS_MAX; i++) {
		runs[i] = (struct plan_run){.local_offset = 0, .remote_offset = 0, .length = 1};
	}
	tx_prep(&t[6], XFER_WRITE, &b, rw, local, 0, 0, WIRE_SEGS_MAX + 1);
	t[6].x.runs = runs;
	t[6].x.n_runs = WIRE_SEGS_MAX + 1;
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[6].x), RDMAX_E_INVALID_ARGUMENT);
	runs[1].length = 0;
	t[6].x.n_runs = 2;
	t[6].x.length = 1;
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[6].x), RDMAX_E_INVALID_ARGUMENT);
	runs[1] = (struct plan_run){.local_offset = (1 << 20) - 1, .length = 2};
	t[6].x.length = 3;
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[6].x), RDMAX_E_OUT_OF_RANGE);
	runs[1] = (struct plan_run){.remote_offset = UINT64_MAX, .length = 2};
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[6].x), RDMAX_E_INVALID_ARGUMENT);
	t[6].x.op = XFER_READ;
	t[6].x.local = ro_local(&a);
	runs[1] = (struct plan_run){.length = 2};
	ck_assert_int_eq(a.t->ops->submit(a.t, &t[6].x), RDMAX_E_PERMISSION_DENIED);
	ck_assert_int_eq(t[6].calls, 0);

	nodes_end(&a, &b);
}
END_TEST

static void note_requests_sent(void *arg, const struct transport_conn_info *info)
{
	uint64_t *sent = arg;

	if (info->outgoing) {
		*sent += info->bytes_sent;
	}
}

/* Bytes n's outgoing connections sent: its requests (and HELLOs). */
static uint64_t requests_sent(struct node *n)
{
	uint64_t sent = 0;

	n->t->ops->list_conns(n->t, note_requests_sent, &sent);
	return sent;
}

/* Read runs[0..n) of remote into local on a, as one xfer; run it and check its bytes. */
static void read_runs(struct node *a, struct node *b, struct region *remote, struct region *local,
		      const struct plan_run *runs, uint32_t n)
{
	struct tx t;
	uint64_t total = 0;

	for (uint32_t i = 0; i < n; i++) {
		total += runs[i].length;
	}
	memset(local->addr, 0x5a, local->length);
	xfer_runs(a, &t, XFER_READ, b, remote, local, runs, n, total);
	uint8_t *landed = calloc(1, local->length);
	ck_assert_ptr_nonnull(landed);
	for (uint32_t i = 0; i < n; i++) {
		ck_assert_int_eq(memcmp(local->addr + runs[i].local_offset,
					remote->addr + runs[i].remote_offset, runs[i].length),
				 0);
		memset(landed + runs[i].local_offset, 1, runs[i].length);
	}
	/* Nothing else of the local region was written. */
	uint64_t i = 0;
	while (i < local->length && (landed[i] || local->addr[i] == 0x5a)) {
		i++;
	}
	ck_assert_msg(i == local->length, "byte %" PRIu64 " outside the runs was written", i);
	free(landed);
}

/*
 * Reads of several runs travel as one READ_SEGS frame, answered by one
 * READ_RESP whose bytes land run by run; nothing between the runs is
 * touched, one done per xfer. The owner checks every segment first: a
 * refusal names the first bad one and nothing of the frame lands. A peer
 * without READ_SEGS (a release before them) gets one READ_REQ per run, and
 * the xfer completes once, with the first refusal among them.
 */
START_TEST(tcp_read_segs)
{
	enum { PAGES = 40, PAGE = 4096 };
	struct node a, b, c;
	struct tx t[4];
	struct plan_run runs[WIRE_SEGS_MAX];
	struct plan_run odd[3] = {
		{.local_offset = 3, .remote_offset = 260000, .length = 5000},
		{.local_offset = 9000, .remote_offset = 11, .length = 1},
		{.local_offset = 20000, .remote_offset = 230001, .length = 20000}};

	node_start(&a, "a", NULL, 0);
	node_start(&b, "b", NULL, 0);
	ck_assert_int_eq(setenv("RDMAXD_TEST_NO_READ_SEGS", "1", 1), 0);
	node_start(&c, "c", NULL, 0);
	unsetenv("RDMAXD_TEST_NO_READ_SEGS");
	struct region *local = node_region(&a, 1 << 20, RDMAX_ACCESS_LOCAL);
	struct region *rb = node_region(&b, 1 << 20, RDMAX_ACCESS_REMOTE_READ);
	struct region *rc = node_region(&c, 1 << 20, RDMAX_ACCESS_REMOTE_READ);
	struct region *wo = node_region(&b, 65536, RDMAX_ACCESS_REMOTE_WRITE);
	for (uint64_t i = 0; i < (1 << 20); i++) {
		rb->addr[i] = (uint8_t)(i * 29 + 3);
		rc->addr[i] = (uint8_t)(i * 17 + 1);
	}

	/* Reversed pages: remote page i lands in local page PAGES + 7 - i. */
	for (int i = 0; i < PAGES; i++) {
		runs[i] = (struct plan_run){.local_offset = (uint64_t)(PAGES + 7 - i) * PAGE,
					    .remote_offset = (uint64_t)i * PAGE,
					    .length = PAGE};
	}
	for (int round = 0; round < 2; round++) {
		struct node *peer = round == 0 ? &b : &c;
		struct region *remote = round == 0 ? rb : rc;
		read_runs(&a, peer, remote, local, runs, 1); /* the connection is up */
		uint64_t before = requests_sent(&a);
		read_runs(&a, peer, remote, local, runs, PAGES);
		uint64_t frames = round == 0 ? 1 : PAGES;
		uint64_t table = round == 0 ? PAGES * WIRE_SEG_BYTES : 0;
		/* b: one header and the table; c: one READ_REQ per page */
		ck_assert_uint_eq(requests_sent(&a) - before, frames * WIRE_HEADER_BYTES + table);
		read_runs(&a, peer, remote, local, odd, 3);
	}

	/* WIRE_SEGS_MAX one-byte runs, every other byte. */
	for (int i = 0; i < WIRE_SEGS_MAX; i++) {
		runs[i] = (struct plan_run){.local_offset = (uint64_t)i * 2,
					    .remote_offset = (uint64_t)i * 3,
					    .length = 1};
	}
	read_runs(&a, &b, rb, local, runs, WIRE_SEGS_MAX);
	read_runs(&a, &c, rc, local, runs, WIRE_SEGS_MAX);

	/* Refusals by the owner: a write-only region, a segment past the end, a wrong key. */
	char peer[64], want[256];
	struct plan_run past[2] = {
		{.local_offset = 0, .remote_offset = 0, .length = 100},
		{.local_offset = 100, .remote_offset = (1 << 20) - 50, .length = 100}};
	memset(local->addr, 0x5a, 65536);
	tx_prep(&t[0], XFER_READ, &b, wo, local, 0, 0, 200);
	tx_prep(&t[1], XFER_READ, &b, rb, local, 0, 0, 200);
	tx_prep(&t[2], XFER_READ, &b, rb, local, 0, 0, 200);
	t[2].x.remote_key ^= 1;
	/* cut in two READ_REQs, the second refused: the first lands (elsewhere), done once */
	struct region *cut_local = node_region(&a, 65536, RDMAX_ACCESS_LOCAL);
	tx_prep(&t[3], XFER_READ, &c, rc, cut_local, 0, 0, 200);
	for (int i = 0; i < 4; i++) {
		t[i].x.runs = past;
		t[i].x.n_runs = 2;
		tx_submit(&a, &t[i]);
	}
	run_until_done();
	snprintf(peer, sizeof(peer), "127.0.0.1:%u", node_port(&b));
	snprintf(want, sizeof(want), "%s: region %llu is not registered for remote read", peer,
		 (unsigned long long)wo->id);
	tx_check(&t[0], RDMAX_E_REMOTE_ACCESS, want);
	snprintf(want, sizeof(want), "%s: segment 1: range %u+100 is outside region %llu", peer,
		 (1 << 20) - 50, (unsigned long long)rb->id);
	tx_check(&t[1], RDMAX_E_OUT_OF_RANGE, want);
	tx_check(&t[2], RDMAX_E_NOT_FOUND, NULL);
	snprintf(peer, sizeof(peer), "127.0.0.1:%u", node_port(&c));
	snprintf(want, sizeof(want), "%s: range %u+100 is outside region %llu", peer,
		 (1 << 20) - 50, (unsigned long long)rc->id);
	tx_check(&t[3], RDMAX_E_OUT_OF_RANGE, want);
	for (int i = 0; i < 100; i++) {
		ck_assert_uint_eq(local->addr[i], 0x5a); /* b's valid first segment did not land */
	}
	for (int i = 200; i < 65536; i++) {
		ck_assert_uint_eq(local->addr[i], 0x5a);
	}
	ck_assert_int_eq(memcmp(cut_local->addr, rc->addr, 100), 0);

	node_stop(&c);
	nodes_end(&a, &b);
	node_free(&c);
}
END_TEST

static size_t put_segs(uint8_t *buf, uint64_t id, const struct node *n, const struct region *r,
		       uint64_t key_xor, const struct wire_seg *segs, uint32_t n_segs,
		       uint64_t length, uint8_t fill)
{
	struct wire_header h = {.type = WIRE_WRITE_SEGS,
				.request_id = id,
				.instance = n->d.instance_id,
				.region_id = r->id,
				.region_key = r->key ^ key_xor,
				.offset = n_segs,
				.length = length};
	size_t len = WIRE_HEADER_BYTES + (size_t)n_segs * WIRE_SEG_BYTES;

	wire_header_encode(&h, buf);
	wire_segs_encode(segs, n_segs, buf + WIRE_HEADER_BYTES);
	for (uint64_t k = 0; k < length; k++) {
		buf[len++] = (uint8_t)(fill + k * 11);
	}
	return len;
}

/*
 * A raw requester sends WRITE_SEGS frames cut anywhere: a good one lands,
 * refused ones (a segment past the region, a wrong key) are answered and
 * touch nothing, and a malformed table closes the connection.
 */
START_TEST(tcp_hostile_segs)
{
	struct node b;
	struct raw_peer p;
	uint8_t *buf = malloc(200000);
	static const size_t pieces[] = {1, 7, 63, 64, 65, 3, 4096, 13, 100, 9000, 2, 17};
	struct wire_seg good[3] = {{.offset = 100, .length = 10},
				   {.offset = 5000, .length = 20000},
				   {.offset = 10, .length = 3}};
	struct wire_seg past[2] = {{.offset = 0, .length = 10}, {.offset = 65530, .length = 10}};

	node_start(&b, "b", NULL, 0);
	struct region *r = node_region(&b, 65536, RDMAX_ACCESS_REMOTE_WRITE);
	size_t len = raw_hello(buf);
	len += put_segs(buf + len, 1, &b, r, 0, good, 3, 20013, 1);
	len += put_segs(buf + len, 2, &b, r, 0, past, 2, 20, 2);
	len += put_segs(buf + len, 3, &b, r, 1, good, 3, 20013, 3);

	raw_open(&p, node_port(&b), 0);
	size_t sent = 0;
	raw_send_split(&p, buf, len, &sent, pieces, sizeof(pieces) / sizeof(pieces[0]), true);
	size_t off = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES;
	raw_expect(&p, off + WIRE_HEADER_BYTES);
	off = check_answer(&p, off, WIRE_ACK, 1, 0);
	raw_expect(&p, off + WIRE_HEADER_BYTES);
	off = check_answer(&p, off, WIRE_ACK, 2, status_from_err(RDMAX_E_OUT_OF_RANGE));
	raw_expect(&p, off + WIRE_HEADER_BYTES);
	off = check_answer(&p, off, WIRE_ACK, 3, status_from_err(RDMAX_E_NOT_FOUND));
	raw_expect(&p, off);
	uint64_t k = 0;
	for (int s = 0; s < 3; s++) {
		for (uint64_t i = 0; i < good[s].length; i++, k++) {
			ck_assert_uint_eq(r->addr[good[s].offset + i], (uint8_t)(1 + k * 11));
		}
	}
	ck_assert_uint_eq(r->addr[0], 0); /* the refused frames touched nothing */
	ck_assert_uint_eq(r->addr[65535], 0);
	raw_close(&p);

	/* Malformed tables: an empty segment, lengths that do not add up, too many entries. */
	struct wire_seg empty[2] = {{.offset = 0, .length = 10}, {.offset = 20, .length = 0}};
	for (int c = 0; c < 3; c++) {
		len = raw_hello(buf);
		if (c == 0) {
			len += put_segs(buf + len, 1, &b, r, 0, empty, 2, 10, 0);
		} else if (c == 1) {
			len += put_segs(buf + len, 1, &b, r, 0, past, 2, 19, 0);
		} else {
			struct wire_header h = {.type = WIRE_WRITE_SEGS,
						.request_id = 1,
						.instance = b.d.instance_id,
						.region_id = r->id,
						.region_key = r->key,
						.offset = WIRE_SEGS_MAX + 1,
						.length = WIRE_SEGS_MAX + 1};
			wire_header_encode(&h, buf + len);
			len += WIRE_HEADER_BYTES;
		}
		int fd = raw_connect(node_port(&b));
		ck_assert_int_eq(send(fd, buf, len, 0), (ssize_t)len);
		bool closed = false;
		for (uint64_t start = now_ms(); !closed && now_ms() - start < 3000;) {
			run_for(10);
			closed = raw_closed(fd);
		}
		ck_assert_msg(closed, "malformed table %d kept the connection", c);
		close(fd);
	}
	ck_assert_uint_eq(r->addr[0], 0);
	ck_assert_uint_eq(r->addr[20], 0);
	free(buf);
	node_stop(&b);
	uv_run(&g_loop, UV_RUN_DEFAULT);
	node_free(&b);
}
END_TEST

static size_t put_read_segs(uint8_t *buf, uint64_t id, const struct node *n, const struct region *r,
			    uint64_t key_xor, const struct wire_seg *segs, uint32_t n_segs,
			    uint64_t length)
{
	struct wire_header h = {.type = WIRE_READ_SEGS,
				.request_id = id,
				.instance = n->d.instance_id,
				.region_id = r->id,
				.region_key = r->key ^ key_xor,
				.offset = n_segs,
				.length = length};

	wire_header_encode(&h, buf);
	wire_segs_encode(segs, n_segs, buf + WIRE_HEADER_BYTES);
	return WIRE_HEADER_BYTES + (size_t)n_segs * WIRE_SEG_BYTES;
}

/*
 * A raw requester sends READ_SEGS frames cut anywhere: a good one is
 * answered by one READ_RESP with the segments' bytes in table order;
 * refused ones (a segment past the region, a wrong key, a region without
 * remote read) by a READ_RESP that names why and carries no data; a
 * malformed table, or an imm on a read, closes the connection.
 */
START_TEST(tcp_hostile_read_segs)
{
	struct node b;
	struct raw_peer p;
	uint8_t *buf = malloc(65536);
	static const size_t pieces[] = {1, 7, 63, 64, 65, 3, 4096, 13, 100, 2, 17};
	struct wire_seg good[3] = {{.offset = 100, .length = 10},
				   {.offset = 5000, .length = 20000},
				   {.offset = 10, .length = 3}};
	struct wire_seg past[2] = {{.offset = 0, .length = 10}, {.offset = 65530, .length = 10}};

	node_start(&b, "b", NULL, 0);
	struct region *r = node_region(&b, 65536, RDMAX_ACCESS_REMOTE_READ);
	struct region *wo = node_region(&b, 65536, RDMAX_ACCESS_REMOTE_WRITE);
	for (int i = 0; i < 65536; i++) {
		r->addr[i] = (uint8_t)(i * 7 + 1);
	}
	size_t len = raw_hello(buf);
	len += put_read_segs(buf + len, 1, &b, r, 0, good, 3, 20013);
	len += put_read_segs(buf + len, 2, &b, r, 0, past, 2, 20);
	len += put_read_segs(buf + len, 3, &b, r, 1, good, 3, 20013);
	len += put_read_segs(buf + len, 4, &b, wo, 0, good, 3, 20013);
	len += put_read_segs(buf + len, 5, &b, r, 0, good + 2, 1, 3);

	raw_open(&p, node_port(&b), 0);
	size_t sent = 0;
	raw_send_split(&p, buf, len, &sent, pieces, sizeof(pieces) / sizeof(pieces[0]), true);
	size_t off = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES;
	raw_expect(&p, off + WIRE_HEADER_BYTES + 20013);
	off = check_answer(&p, off, WIRE_READ_RESP, 1, 0);
	const uint8_t *data = p.in + off - 20013;
	for (int s = 0; s < 3; s++) {
		ck_assert_int_eq(memcmp(data, r->addr + good[s].offset, good[s].length), 0);
		data += good[s].length;
	}
	static const int refused[3] = {RDMAX_E_OUT_OF_RANGE, RDMAX_E_NOT_FOUND,
				       RDMAX_E_PERMISSION_DENIED};
	static const char *const why[3] = {"segment 1: range 65530+10 is outside region",
					   "not found", "is not registered for remote read"};
	for (int i = 0; i < 3; i++) {
		raw_expect(&p, off + WIRE_HEADER_BYTES);
		struct wire_header h;
		ck_assert_int_eq(wire_header_decode(p.in + off, WIRE_HEADER_BYTES, &h), 0);
		off = check_answer(&p, off, WIRE_READ_RESP, 2 + (uint64_t)i,
				   status_from_err(refused[i]));
		raw_expect(&p, off + h.length);
		char text[WIRE_MESSAGE_MAX + 1];
		wire_text_copy(text, sizeof(text), p.in + off, h.length);
		ck_assert_msg(strstr(text, why[i]), "answer %d: '%s'", i, text);
		off += h.length;
	}
	raw_expect(&p, off + WIRE_HEADER_BYTES + 3);
	off = check_answer(&p, off, WIRE_READ_RESP, 5, 0);
	ck_assert_int_eq(memcmp(p.in + off - 3, r->addr + 10, 3), 0);
	raw_close(&p);

	/* Malformed: an empty segment, lengths that do not add up, too many entries, an imm. */
	struct wire_seg empty[2] = {{.offset = 0, .length = 10}, {.offset = 20, .length = 0}};
	for (int c = 0; c < 4; c++) {
		len = raw_hello(buf);
		if (c == 0) {
			len += put_read_segs(buf + len, 1, &b, r, 0, empty, 2, 10);
		} else if (c == 1) {
			len += put_read_segs(buf + len, 1, &b, r, 0, past, 2, 19);
		} else {
			struct wire_header h = {.type = WIRE_READ_SEGS,
						.request_id = 1,
						.instance = b.d.instance_id,
						.region_id = r->id,
						.region_key = r->key,
						.offset = c == 2 ? WIRE_SEGS_MAX + 1 : 1,
						.length = c == 2 ? WIRE_SEGS_MAX + 1 : 3};
			if (c == 3) {
				h.flags = WIRE_F_HAS_IMM;
				h.imm = 9;
			}
			wire_header_encode(&h, buf + len);
			len += WIRE_HEADER_BYTES;
			if (c == 3) {
				wire_segs_encode(good + 2, 1, buf + len);
				len += WIRE_SEG_BYTES;
			}
		}
		int fd = raw_connect(node_port(&b));
		ck_assert_int_eq(send(fd, buf, len, 0), (ssize_t)len);
		bool closed = false;
		for (uint64_t start = now_ms(); !closed && now_ms() - start < 3000;) {
			run_for(10);
			closed = raw_closed(fd);
		}
		ck_assert_msg(closed, "malformed READ_SEGS %d kept the connection", c);
		close(fd);
	}
	free(buf);
	node_stop(&b);
	uv_run(&g_loop, UV_RUN_DEFAULT);
	node_free(&b);
}
END_TEST

static void note_released(struct region *region, void *arg)
{
	(void)region;
	*(bool *)arg = true;
}

/*
 * The region a WRITE_SEGS lands in is deregistered while the frame's second
 * segment arrives: the rest of the frame (the rest of that segment and every
 * later one) is dropped to the byte, the WRITE is answered NOT_FOUND, and the
 * next frame on the connection is read as a frame and lands. The same with
 * the segments arriving through an I/O thread.
 */
START_TEST(tcp_segs_region_deregistered_midway)
{
	/* Cut anywhere; the 300 KB frames in larger pieces, within the frame deadline. */
	static const size_t small[] = {1000, 7, 4096, 13}, large[] = {16384, 7, 65536, 13};

	/* On the loop; then on an I/O thread, which is inside the segment when it goes. */
	for (int threads = 0; threads < 2; threads++) {
		const uint64_t big = threads ? 300000 : 20000;
		struct node b;
		struct raw_peer p;
		struct wire_seg segs[4] = {{.offset = 100, .length = 10},
					   {.offset = 5000, .length = big},
					   {.offset = 5000 + big + 100, .length = 3000},
					   {.offset = 10, .length = 3}};
		const uint64_t total = 3013 + big, landed = 10 + 4000; /* frame 1 before the cut */
		const uint64_t region_len = 1 << 20;
		const size_t *pieces = threads ? large : small;
		const size_t n_pieces = 4;
		uint8_t *buf = malloc(2 * total + 4096);

		if (threads) {
			ck_assert_int_eq(setenv("RDMAXD_TEST_TCP_OFFLOAD", "1", 1), 0);
		}
		node_start(&b, "b", NULL, 0);
		unsetenv("RDMAXD_TEST_TCP_OFFLOAD");
		struct region *r = node_region(&b, region_len, RDMAX_ACCESS_REMOTE_WRITE);
		struct region *r2 = node_region(&b, region_len, RDMAX_ACCESS_REMOTE_WRITE);
		size_t len = raw_hello(buf);
		size_t cut = len + WIRE_HEADER_BYTES + 4 * WIRE_SEG_BYTES + landed;
		len += put_segs(buf + len, 1, &b, r, 0, segs, 4, total, 1);
		len += put_segs(buf + len, 2, &b, r2, 0, segs, 4, total, 5);

		raw_open(&p, node_port(&b), 0);
		size_t sent = 0;
		raw_send_split(&p, buf, cut, &sent, pieces, n_pieces, true);
		/* Until the last byte before the cut is in the region: segment 2 is under way. */
		uint8_t last = (uint8_t)(1 + (landed - 1) * 11);
		ck_assert_uint_ne(last, 0);
		for (uint64_t start = now_ms(); r->addr[segs[1].offset + landed - 11] != last;) {
			uv_run(&g_loop, UV_RUN_NOWAIT);
			raw_pump(&p);
			ck_assert_msg(now_ms() - start < 8000, "segment 2 did not start landing");
		}
		bool released = false;
		region_deregister(&b.d.regions, r, threads ? note_released : NULL, &released);
		/* The loop notices on its tick, once the thread's receive is back, and lets the
		 * region go. */
		for (uint64_t start = now_ms(); threads && !released;) {
			uv_run(&g_loop, UV_RUN_NOWAIT);
			ck_assert_msg(now_ms() - start < 3000, "the region was never let go");
		}

		raw_send_split(&p, buf, len, &sent, pieces, n_pieces, true);
		size_t off = WIRE_HEADER_BYTES + WIRE_HELLO_BYTES;
		raw_expect(&p, off + WIRE_HEADER_BYTES);
		off = check_answer(&p, off, WIRE_ACK, 1, status_from_err(RDMAX_E_NOT_FOUND));
		raw_expect(&p, off + WIRE_HEADER_BYTES);
		off = check_answer(&p, off, WIRE_ACK, 2, 0);
		uint64_t k = 0;
		for (int s = 0; s < 4; s++) {
			for (uint64_t i = 0; i < segs[s].length; i++, k++) {
				ck_assert_uint_eq(r2->addr[segs[s].offset + i],
						  (uint8_t)(5 + k * 11));
			}
		}
		if (threads) {
			ck_assert_uint_ge(b.d.counters.tcp_io_thread_received, big / 2);
		}
		raw_done(&p, buf, &b);
	}
}
END_TEST

TCase *unit_tcp_transport_tcase(void)
{
	TCase *tc = tcase_create("tcp");
	tcase_set_timeout(tc, 15);
	tcase_add_checked_fixture(tc, tcp_setup, tcp_teardown);
	tcase_add_test(tc, tcp_write_read_imm_in_order);
	tcase_add_test(tc, tcp_sends_timed);
	tcase_add_test(tc, tcp_small_requests_one_at_a_time);
	tcase_add_test(tc, tcp_bulk_responder_acks_at_once);
	tcase_add_test(tc, tcp_refusals);
	tcase_add_test(tc, tcp_unreachable_and_limits);
	tcase_add_test(tc, tcp_authentication);
	tcase_add_test(tc, tcp_garbage_closes_connection);
	tcase_add_test(tc, tcp_silent_peer_times_out);
	tcase_add_test(tc, tcp_peer_restart);
	tcase_add_test(tc, tcp_pipelined_frames_resume_after_pause);
	tcase_add_test(tc, tcp_staged_requests_resume_after_loop_flush);
	tcase_add_test(tc, tcp_full_socket_waits_for_writable);
	tcase_add_test(tc, tcp_answers_wait_for_the_sending_thread);
	tcase_add_test(tc, tcp_receiving_thread_reads_the_next_header);
	tcase_add_test(tc, tcp_segs_received_on_threads);
	tcase_add_test(tc, tcp_frames_split_anywhere);
	tcase_add_test(tc, tcp_write_segs);
	tcase_add_test(tc, tcp_read_segs);
	tcase_add_test(tc, tcp_hostile_segs);
	tcase_add_test(tc, tcp_hostile_read_segs);
	tcase_add_test(tc, tcp_segs_region_deregistered_midway);
	return tc;
}
