/* SPDX-License-Identifier: MIT */
/*
 * The peer port under attack (TCP transport): a relay between two keyed
 * daemons, a peer claiming the victim's own instance id, connections that
 * squat the slots or stall their handshake, frames trickled byte by byte,
 * a peer trickling into a region that is being deregistered, and accept()
 * at the fd limit. The attackers speak the wire format of docs/wire.md
 * directly from raw sockets, from loopback addresses of their own
 * (127.0.0.2 and up), so per-address limits can tell them from real peers.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdmax.pb-c.h"

#define ACCESS_RW     (RDMAX_ACCESS_LOCAL | RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)
#define HEADER_BYTES  64
#define HELLO_BYTES   112
#define T_HELLO       1
#define T_WRITE       3
#define T_ACK         6
#define T_ERROR       7
#define HELLO_F_AUTH  0x1u
#define HELLO_F_BOUND 0x2u
#define TEST_KEY      "peer-test-key-0123456789abcdef\n"

struct itest_target itest_target_of(const struct rdmax_desc *desc)
{
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, desc->len, desc->bytes);
	struct itest_target t;

	ck_assert_ptr_nonnull(m);
	ck_assert_uint_ge(m->n_endpoints, 1);
	t.instance = m->instance_id;
	t.region_id = m->region_id;
	t.region_key = m->region_key;
	snprintf(t.addr, sizeof(t.addr), "%s", m->endpoints[0]->addr);
	t.port = (uint16_t)m->endpoints[0]->port;
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	return t;
}

/* The descriptor with its one endpoint replaced by addr:port; the instance id is kept. */
struct rdmax_desc itest_via(const struct rdmax_desc *real, const char *addr, uint16_t port)
{
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, real->len, real->bytes);
	uint8_t buf[RDMAX_DESC_MAX];
	struct rdmax_desc out;

	ck_assert_ptr_nonnull(m);
	char *saved = m->endpoints[0]->addr;
	m->endpoints[0]->addr = (char *)addr;
	m->endpoints[0]->port = port;
	m->n_endpoints = 1;
	size_t len = rdmax__v1__region_desc__get_packed_size(m);
	ck_assert_uint_le(len, sizeof(buf));
	rdmax__v1__region_desc__pack(m, buf);
	m->endpoints[0]->addr = saved;
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	ck_assert_int_eq(rdmax_desc_import(buf, len, &out), 0);
	return out;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--) {
		v = v << 8 | p[i];
	}
	return v;
}

static struct sockaddr_in sin_of(const char *addr, uint16_t port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};

	ck_assert_msg(inet_pton(AF_INET, addr, &sin.sin_addr) == 1, "not IPv4: %s", addr);
	return sin;
}

/* A TCP connection from src (any port) to addr:port, or -errno; never asserts (children). */
static int dial(const char *src, const char *addr, uint16_t port)
{
	struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
	int one = 1;

	inet_pton(AF_INET, src, &from.sin_addr);
	inet_pton(AF_INET, addr, &to.sin_addr);
	to.sin_port = htons(port);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		return -errno;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&from, sizeof(from)) < 0 ||
	    connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

static void send_all(int fd, const void *buf, size_t len)
{
	ck_assert_msg(send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len, "send() failed: %s",
		      strerror(errno));
}

static void header(uint8_t *h, uint8_t type, uint64_t request_id, uint64_t instance,
		   uint64_t region_id, uint64_t key, uint64_t offset, uint64_t length)
{
	memset(h, 0, HEADER_BYTES);
	put_le(h, 0x57584452u, 4);
	h[4] = type;
	put_le(h + 16, request_id, 8);
	put_le(h + 24, instance, 8);
	put_le(h + 32, region_id, 8);
	put_le(h + 40, key, 8);
	put_le(h + 48, offset, 8);
	put_le(h + 56, length, 8);
}

/* Best effort: the daemon may already have closed a refused connection. */
static void send_hello(int fd, uint64_t instance, uint16_t flags)
{
	uint8_t buf[HEADER_BYTES + HELLO_BYTES];

	header(buf, T_HELLO, 0, 0, 0, 0, 0, HELLO_BYTES);
	memset(buf + HEADER_BYTES, 0, HELLO_BYTES);
	put_le(buf + HEADER_BYTES, 1, 2);
	put_le(buf + HEADER_BYTES + 2, flags, 2);
	put_le(buf + HEADER_BYTES + 8, instance, 8);
	itest_fill(buf + HEADER_BYTES + 16, 32, instance ^ 0x5a5a);
	memcpy(buf + HEADER_BYTES + 48, "mallory", 7);
	(void)send(fd, buf, sizeof(buf), MSG_NOSIGNAL);
}

/* Read exactly len bytes within timeout_ms; false on close, error or timeout. */
static bool read_full(int fd, uint8_t *buf, size_t len, int timeout_ms)
{
	uint64_t end = itest_now_ms() + (uint64_t)timeout_ms;
	size_t got = 0;

	while (got < len) {
		int64_t left = (int64_t)(end - itest_now_ms());
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
			return false;
		}
		ssize_t n = recv(fd, buf + got, len - got, 0);
		if (n <= 0) {
			return false;
		}
		got += (size_t)n;
	}
	return true;
}

/* Type of the next frame (its body skipped), or -1 when the daemon closed or said nothing. */
static int next_frame(int fd, uint32_t *ret_status)
{
	uint8_t h[HEADER_BYTES], body[4096];

	if (!read_full(fd, h, sizeof(h), ITEST_WAIT_MS)) {
		return -1;
	}
	uint64_t len = get_le(h + 56, 8);
	ck_assert_uint_le(len, sizeof(body));
	if (len && !read_full(fd, body, len, ITEST_WAIT_MS)) {
		return -1;
	}
	if (ret_status) {
		*ret_status = (uint32_t)get_le(h + 8, 4);
	}
	return h[4];
}

/* Milliseconds until the daemon closes fd (anything it sends is read and dropped), or -1. */
static int64_t closed_after(int fd, int timeout_ms)
{
	uint64_t t0 = itest_now_ms();
	uint8_t sink[4096];

	for (;;) {
		int64_t left = (int64_t)(t0 + (uint64_t)timeout_ms - itest_now_ms());
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
			return -1;
		}
		ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			return (int64_t)(itest_now_ms() - t0);
		}
	}
}

/* Open a connection from src and finish the unauthenticated handshake; -1 if refused. */
static int handshaken(const char *src, const struct itest_target *t, uint64_t my_instance)
{
	int fd = dial(src, t->addr, t->port);

	ck_assert_msg(fd >= 0, "connect from %s failed: %s", src, strerror(-fd));
	send_hello(fd, my_instance, 0);
	if (next_frame(fd, NULL) != T_HELLO) {
		close(fd);
		return -1;
	}
	return fd;
}

static void run_ok(struct rdmax_client *c, const struct rdmax_job *job, const char *what)
{
	struct rdmax_event ev = itest_run_job(c, job, ITEST_WAIT_MS);

	ck_assert_msg(ev.status == 0, "%s failed with %s ('%s')", what, rdmax_err_name(ev.status),
		      ev.reason);
}

/* --------------------------------------------------------------- relay */

/*
 * Child: relay every connection to addr:port, byte for byte, both ways; with
 * capture >= 0 every relayed byte is also appended there (a sniffer).
 */
void itest_relay(int lfd, const char *addr, uint16_t port, int capture)
{
	uint8_t buf[65536];

	for (;;) {
		int a = accept(lfd, NULL, NULL);
		if (a < 0) {
			_exit(1);
		}
		int b = dial("127.0.0.1", addr, port);
		if (b < 0) {
			close(a);
			continue;
		}
		for (bool open = true; open;) {
			struct pollfd p[2] = {{.fd = a, .events = POLLIN},
					      {.fd = b, .events = POLLIN}};
			if (poll(p, 2, -1) < 0) {
				break;
			}
			for (int i = 0; i < 2 && open; i++) {
				if (!p[i].revents) {
					continue;
				}
				ssize_t n = recv(p[i].fd, buf, sizeof(buf), 0);
				/*
				 * Captured before it is forwarded: once the other side has
				 * a byte, the capture holds it, so a test may kill the
				 * relay as soon as its transfer completed.
				 */
				if (n > 0 && capture >= 0 && write(capture, buf, (size_t)n) != n) {
					_exit(1);
				}
				open = n > 0 &&
				       send(p[1 - i].fd, buf, (size_t)n, MSG_NOSIGNAL) == n;
			}
		}
		close(a);
		close(b);
	}
}

int itest_listen_any(const char *addr, uint16_t *ret_port)
{
	struct sockaddr_in sin = sin_of(addr, 0);
	socklen_t len = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(listen(fd, 64), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
	*ret_port = ntohs(sin.sin_port);
	return fd;
}

/*
 * Both daemons hold the key; a client of `d` is handed a descriptor of v's
 * region whose endpoint is the attacker's relay. The relay forwards every
 * byte between d's connection and one it opens to v, so nonces, instance
 * ids and proofs all pass through unchanged: only a proof that covers the
 * connection's own ends tells the two connections apart.
 */
START_TEST(peer_relay_refused)
{
	struct itest_daemon *v = itest_daemon_new("victim", itest_addr_a());
	struct itest_daemon *d = itest_daemon_new("dialer", itest_addr_b());
	uint16_t rport;

	itest_daemon_auth_key(v, TEST_KEY);
	itest_daemon_auth_key(d, TEST_KEY);
	itest_daemon_set(d, "peers.connect_retries=0");
	itest_daemon_start(v);
	itest_daemon_start(d);
	struct rdmax_client *cv = itest_client(v, "victim-app");
	struct rdmax_client *cd = itest_client(d, "dialer-app");
	struct rdmax_region *dst = itest_alloc(cv, 64 * KiB, ACCESS_RW);
	struct rdmax_region *src = itest_alloc(cd, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc real = itest_desc(dst);
	struct itest_target t = itest_target_of(&real);
	itest_fill(itest_bytes(src), 64 * KiB, 61);

	/* The two keyed daemons talk directly. */
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &real, 0, 4096);
	run_ok(cd, &job, "direct WRITE between keyed daemons");
	memset(itest_bytes(dst), 0, 64 * KiB);

	int lfd = itest_listen_any(itest_addr_b(), &rport);
	pid_t parent = getpid(), child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		itest_child_setup(parent);
		itest_relay(lfd, t.addr, t.port, -1);
	}
	close(lfd);
	struct rdmax_desc relayed = itest_via(&real, itest_addr_b(), rport);
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &relayed, 0, 64 * KiB);
	struct rdmax_event ev = itest_run_job(cd, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == RDMAX_E_PERMISSION_DENIED,
		      "WRITE through a relay completed with %s ('%s'), expected "
		      "RDMAX_E_PERMISSION_DENIED",
		      rdmax_err_name(ev.status), ev.reason);
	for (uint64_t i = 0; i < 64 * KiB; i++) {
		ck_assert_msg(itest_bytes(dst)[i] == 0, "the relayed WRITE changed byte %" PRIu64,
			      i);
	}
	job = itest_job(3, RDMAX_OP_READ, src, 0, &relayed, 0, 4096);
	ev = itest_run_job(cd, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_PERMISSION_DENIED);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);

	/* The direct path still works after the refusals. */
	job = itest_job(4, RDMAX_OP_WRITE, src, 0, &real, 0, 64 * KiB);
	run_ok(cd, &job, "direct WRITE after the relay");
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 64 * KiB, "direct WRITE");
	itest_pair_end(cv, cd, v, d);
}
END_TEST

/*
 * A HELLO that carries the victim's own instance id is a reflection or a
 * relay of the victim's own connection; a HELLO of the keyed kind that does
 * not bind the connection (wire v1) can be relayed. Both are refused with an
 * ERROR before the victim sends anything of its own.
 */
START_TEST(peer_handshake_refusals)
{
	struct itest_daemon *v = itest_daemon_new("victim", itest_addr_a());

	itest_daemon_auth_key(v, TEST_KEY);
	itest_daemon_start(v);
	struct rdmax_client *cv = itest_client(v, "victim-app");
	struct rdmax_region *dst = itest_alloc(cv, 4096, ACCESS_RW);
	struct rdmax_desc real = itest_desc(dst);
	struct itest_target t = itest_target_of(&real);
	uint32_t status = 0;

	int fd = dial(itest_addr_a(), t.addr, t.port);
	ck_assert_int_ge(fd, 0);
	send_hello(fd, t.instance, HELLO_F_AUTH | HELLO_F_BOUND);
	int type = next_frame(fd, &status);
	ck_assert_msg(type == T_ERROR, "a HELLO with the victim's own instance id got frame %d",
		      type);
	ck_assert_int_ge(closed_after(fd, ITEST_WAIT_MS), 0);
	close(fd);

	fd = dial(itest_addr_a(), t.addr, t.port);
	ck_assert_int_ge(fd, 0);
	send_hello(fd, t.instance ^ 0x77, HELLO_F_AUTH);
	type = next_frame(fd, &status);
	ck_assert_msg(type == T_ERROR, "a keyed HELLO without channel binding got frame %d", type);
	close(fd);

	/* A well-formed keyed HELLO is answered with the victim's HELLO. */
	fd = dial(itest_addr_a(), t.addr, t.port);
	ck_assert_int_ge(fd, 0);
	send_hello(fd, t.instance ^ 0x77, HELLO_F_AUTH | HELLO_F_BOUND);
	ck_assert_int_eq(next_frame(fd, NULL), T_HELLO);
	close(fd);
	rdmax_client_close(cv);
	itest_daemon_stop(v);
	itest_daemon_free(v);
}
END_TEST

/* A daemon with one 64 KiB remote-writable region of its client; peers never go idle. */
static struct itest_daemon *victim_with_region(const char *peer_timeout_ms,
					       struct rdmax_client **ret_client,
					       struct rdmax_region **ret_region,
					       struct itest_target *ret_target)
{
	struct itest_daemon *v = itest_daemon_new("victim", itest_addr_a());

	itest_daemon_set(v, "peers.peer_timeout_ms=%s", peer_timeout_ms);
	itest_daemon_set(v, "peers.idle_timeout_s=0");
	itest_daemon_start(v);
	*ret_client = itest_client(v, "victim-app");
	*ret_region = itest_alloc(*ret_client, 64 * KiB, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(*ret_region);
	*ret_target = itest_target_of(&desc);
	return v;
}

/* ------------------------------------------------------------- slots */

/*
 * Hosts that fill the victim's connection slots (handshaken, or stalled in
 * the handshake) neither stop it from connecting out nor lock out a peer
 * at another address, and stalled handshakes end at the handshake deadline.
 */
START_TEST(peer_slots)
{
	static const char *const squatters[] = {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"};
	struct itest_daemon *v = itest_daemon_new("victim", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	int held[64], n_held = 0;

	itest_daemon_set(v, "limits.max_connections=16");
	itest_daemon_set(v, "peers.reserved_outgoing=4");
	itest_daemon_set(v, "peers.max_connections_per_host=3");
	itest_daemon_set(v, "peers.max_handshakes_per_host=2");
	itest_daemon_set(v, "peers.handshake_timeout_ms=800");
	itest_daemon_set(v, "peers.idle_timeout_s=0");
	itest_daemon_start(v);
	itest_daemon_start(b);
	struct rdmax_client *cv = itest_client(v, "victim-app");
	struct rdmax_client *cb = itest_client(b, "b-app");
	struct rdmax_region *vbuf = itest_alloc(cv, 64 * KiB, ACCESS_RW);
	struct rdmax_region *bbuf = itest_alloc(cb, 64 * KiB, ACCESS_RW);
	struct rdmax_desc vdesc = itest_desc(vbuf), bdesc = itest_desc(bbuf);
	struct itest_target t = itest_target_of(&vdesc);

	/* Each squatter opens 6 handshaken connections: 3 per address are kept. */
	for (size_t s = 0; s < 4; s++) {
		int kept = 0;
		for (int i = 0; i < 6; i++) {
			int fd = handshaken(squatters[s], &t, 0x1000 + s * 16 + (unsigned)i);
			if (fd >= 0) {
				held[n_held++] = fd;
				kept++;
			}
		}
		ck_assert_msg(kept <= 3, "%s kept %d connections (limit 3 per address)",
			      squatters[s], kept);
	}
	/* 12 incoming slots (16 less 4 kept for outgoing) are now taken. */
	ck_assert_int_eq(n_held, 12);
	itest_fill(itest_bytes(vbuf), 64 * KiB, 7);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, vbuf, 0, &bdesc, 0, 64 * KiB);
	run_ok(cv, &job, "outgoing WRITE while every incoming slot is taken");
	itest_assert_mem_eq(itest_bytes(bbuf), itest_bytes(vbuf), 64 * KiB, "outgoing WRITE");
	for (int i = 0; i < 4; i++) {
		close(held[--n_held]);
	}
	ck_assert_int_eq(closed_after(held[0], ITEST_QUIET_MS), -1); /* the others stay */

	/* Stalled handshakes from one address take at most 2 slots and end at the deadline. */
	int stalled[8];
	for (int i = 0; i < 8; i++) {
		stalled[i] = dial("127.0.0.6", t.addr, t.port);
		ck_assert_int_ge(stalled[i], 0);
	}
	/* A real peer at another address still gets in (through the slots freed above). */
	itest_fill(itest_bytes(bbuf), 64 * KiB, 8);
	job = itest_job(2, RDMAX_OP_WRITE, bbuf, 0, &vdesc, 0, 64 * KiB);
	run_ok(cb, &job, "incoming WRITE while a host stalls handshakes");
	itest_assert_mem_eq(itest_bytes(vbuf), itest_bytes(bbuf), 64 * KiB, "incoming WRITE");
	int open_after_deadline = 0;
	for (int i = 0; i < 8; i++) {
		int64_t ms = closed_after(stalled[i], 3000);
		open_after_deadline += ms < 0;
		close(stalled[i]);
	}
	ck_assert_msg(open_after_deadline == 0,
		      "%d stalled handshakes still open 3 s after a deadline of 800 ms",
		      open_after_deadline);
	while (n_held > 0) {
		close(held[--n_held]);
	}
	itest_pair_end(cv, cb, v, b);
}
END_TEST

/* -------------------------------------------------- trickled frames */

/* Child: send len bytes of buf, `step` every gap_ms, then hold the socket until killed. */
static void trickle(int fd, const uint8_t *buf, size_t len, size_t step, unsigned gap_ms)
{
	for (size_t i = 0; i < len; i += step) {
		size_t n = len - i < step ? len - i : step;
		if (send(fd, buf + i, n, MSG_NOSIGNAL) != (ssize_t)n) {
			_exit(0);
		}
		itest_sleep_ms(gap_ms);
	}
	pause();
	_exit(0);
}

static pid_t fork_paced(int fd, const uint8_t *buf, size_t len, size_t step, unsigned gap_ms)
{
	pid_t parent = getpid(), child = fork();

	ck_assert_int_ge(child, 0);
	if (child == 0) {
		itest_child_setup(parent);
		trickle(fd, buf, len, step, gap_ms);
	}
	return child;
}

static pid_t fork_trickle(int fd, const uint8_t *buf, size_t len, unsigned gap_ms)
{
	return fork_paced(fd, buf, len, 1, gap_ms);
}

static void reap(pid_t child)
{
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
}

/*
 * A peer that sends a frame a byte at a time keeps the no-progress clock
 * from ever firing; the per-frame deadline (peer_timeout_ms plus the size
 * at min_frame_rate_kib_s) cuts it off. A refused WRITE too large to skip
 * ends the connection at once.
 */
START_TEST(peer_trickled_frames)
{
	uint8_t frame[HEADER_BYTES + 4096];
	struct rdmax_client *cv;
	struct rdmax_region *dst;
	struct itest_target t;
	struct itest_daemon *v = victim_with_region("1000", &cv, &dst, &t);

	/* A header, a byte every 200 ms. */
	int fd = handshaken("127.0.0.2", &t, 0x2001);
	ck_assert_int_ge(fd, 0);
	header(frame, T_WRITE, 1, t.instance, t.region_id, t.region_key, 0, 16);
	pid_t child = fork_trickle(fd, frame, HEADER_BYTES, 200);
	int64_t ms = closed_after(fd, 6000);
	reap(child);
	close(fd);
	ck_assert_msg(ms >= 0, "a header trickled at 5 B/s still open after 6 s");

	/* A 4 KiB WRITE into a real region, a byte every 100 ms after its header. */
	fd = handshaken("127.0.0.2", &t, 0x2002);
	ck_assert_int_ge(fd, 0);
	header(frame, T_WRITE, 1, t.instance, t.region_id, t.region_key, 0, 4096);
	send_all(fd, frame, HEADER_BYTES);
	memset(frame + HEADER_BYTES, 0xee, 4096);
	child = fork_trickle(fd, frame + HEADER_BYTES, 4096, 100);
	ms = closed_after(fd, 6000);
	reap(child);
	close(fd);
	ck_assert_msg(ms >= 0, "a WRITE trickled at 10 B/s still open after 6 s");

	/* A refused WRITE of 2^62 bytes: nobody waits for its payload. */
	fd = handshaken("127.0.0.2", &t, 0x2003);
	ck_assert_int_ge(fd, 0);
	header(frame, T_WRITE, 1, t.instance, t.region_id, t.region_key ^ 1, 0, UINT64_C(1) << 62);
	send_all(fd, frame, HEADER_BYTES + 16);
	ms = closed_after(fd, 2000);
	close(fd);
	ck_assert_msg(ms >= 0, "a refused WRITE of 2^62 bytes kept the connection open");

	/* The victim still serves a well-behaved peer. */
	fd = handshaken("127.0.0.2", &t, 0x2004);
	ck_assert_int_ge(fd, 0);
	header(frame, T_WRITE, 7, t.instance, t.region_id, t.region_key, 0, 4096);
	itest_fill(frame + HEADER_BYTES, 4096, 99);
	send_all(fd, frame, sizeof(frame));
	uint32_t status = 1;
	ck_assert_int_eq(next_frame(fd, &status), T_ACK);
	ck_assert_uint_eq(status, 0);
	itest_assert_mem_eq(itest_bytes(dst), frame + HEADER_BYTES, 4096, "raw WRITE");
	close(fd);
	rdmax_client_close(cv);
	itest_daemon_stop(v);
	itest_daemon_free(v);
}
END_TEST

/*
 * A peer trickling into a region holds it; deregistration must not wait
 * for the peer (the rest of its WRITE is dropped and refused), and a client
 * that dies loses its mapping just as fast.
 */
START_TEST(peer_trickle_dereg)
{
	uint8_t frame[HEADER_BYTES + 4096];
	struct rdmax_client *cv;
	struct rdmax_region *dst;
	struct itest_target t;
	/* Deadlines far away: only deregistration may end the trickle. */
	struct itest_daemon *v = victim_with_region("60000", &cv, &dst, &t);

	int fd = handshaken("127.0.0.2", &t, 0x3001);
	ck_assert_int_ge(fd, 0);
	header(frame, T_WRITE, 1, t.instance, t.region_id, t.region_key, 0, 4096);
	send_all(fd, frame, HEADER_BYTES + 8);
	memset(frame + HEADER_BYTES, 0xab, 4096);
	pid_t child = fork_trickle(fd, frame + HEADER_BYTES + 8, 4096 - 8, 100);
	itest_sleep_ms(300); /* the WRITE is under way */
	uint64_t t0 = itest_now_ms();
	ck_assert_int_eq(rdmax_region_free(cv, dst), 0);
	uint64_t took = itest_now_ms() - t0;
	ck_assert_msg(took < 3000, "deregistration waited %" PRIu64 " ms for a trickling peer",
		      took);
	reap(child);
	close(fd);

	/* A client process dies while a peer trickles into its region. */
	char name[64];
	snprintf(name, sizeof(name), "itest-doomed-%d", (int)getpid());
	int pipefd[2];
	ck_assert_int_eq(pipe(pipefd), 0);
	pid_t parent = getpid(), owner = fork();
	ck_assert_int_ge(owner, 0);
	if (owner == 0) {
		itest_child_setup(parent);
		struct rdmax_client *c = NULL;
		struct rdmax_region *r = NULL;
		struct rdmax_desc od;
		int mfd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (mfd < 0 || ftruncate(mfd, 64 * KiB) < 0 ||
		    fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0 ||
		    rdmax_client_open(v->socket_path, "doomed", &c) != 0) {
			_exit(1);
		}
		void *mem = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
		if (mem == MAP_FAILED ||
		    rdmax_region_register_fd(c, mfd, 0, 64 * KiB, mem, ACCESS_RW, &r) != 0 ||
		    rdmax_region_desc(r, &od) != 0 ||
		    write(pipefd[1], &od, sizeof(od)) != (ssize_t)sizeof(od)) {
			_exit(1);
		}
		pause();
		_exit(0);
	}
	close(pipefd[1]);
	struct rdmax_desc od;
	ck_assert_int_eq(read(pipefd[0], &od, sizeof(od)), (ssize_t)sizeof(od));
	close(pipefd[0]);
	struct itest_target ot = itest_target_of(&od);
	fd = handshaken("127.0.0.2", &ot, 0x3002);
	ck_assert_int_ge(fd, 0);
	header(frame, T_WRITE, 1, ot.instance, ot.region_id, ot.region_key, 0, 4096);
	send_all(fd, frame, HEADER_BYTES + 8);
	child = fork_trickle(fd, frame + HEADER_BYTES + 8, 4096 - 8, 100);
	itest_wait_maps(v, name, true);
	kill(owner, SIGKILL);
	waitpid(owner, NULL, 0);
	t0 = itest_now_ms();
	while (itest_daemon_maps(v, name) && itest_now_ms() - t0 < 5000) {
		itest_sleep_ms(20);
	}
	ck_assert_msg(!itest_daemon_maps(v, name),
		      "the dead client's region is still mapped %" PRIu64
		      " ms after it died, while a peer trickles into it",
		      itest_now_ms() - t0);
	reap(child);
	close(fd);
	rdmax_client_close(cv);
	itest_daemon_stop(v);
	itest_daemon_free(v);
}
END_TEST

/*
 * A raw peer sends one 1 MiB WRITE into a fresh victim (peer_timeout_ms as
 * given), `step` bytes every gap_ms; the ACK must be OK and the region
 * byte-exact. \return milliseconds from the first byte sent to the ACK.
 */
static uint64_t paced_write(const char *peer_timeout_ms, size_t step, unsigned gap_ms)
{
	enum { LEN = 1024 * KiB };
	struct itest_daemon *v = itest_daemon_new("victim", itest_addr_a());

	itest_daemon_set(v, "peers.peer_timeout_ms=%s", peer_timeout_ms);
	itest_daemon_set(v, "peers.min_frame_rate_kib_s=64");
	itest_daemon_set(v, "peers.idle_timeout_s=0");
	itest_daemon_start(v);
	struct rdmax_client *cv = itest_client(v, "victim-app");
	struct rdmax_region *dst = itest_alloc(cv, LEN, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);
	struct itest_target t = itest_target_of(&desc);
	uint8_t *frame = malloc(HEADER_BYTES + LEN);
	ck_assert_ptr_nonnull(frame);

	int fd = handshaken("127.0.0.2", &t, 0x3101);
	ck_assert_int_ge(fd, 0);
	header(frame, T_WRITE, 9, t.instance, t.region_id, t.region_key, 0, LEN);
	itest_fill(frame + HEADER_BYTES, LEN, step ^ gap_ms);
	uint64_t t0 = itest_now_ms();
	pid_t child = fork_paced(fd, frame, HEADER_BYTES + LEN, step, gap_ms);
	uint32_t status = 1;
	int type = next_frame(fd, &status);
	uint64_t took = itest_now_ms() - t0;
	reap(child);
	ck_assert_msg(type == T_ACK,
		      "no ACK for a 1 MiB WRITE paced at %zu B per %u ms (frame %d after "
		      "%" PRIu64 " ms): the daemon cut a peer that kept sending",
		      step, gap_ms, type, took);
	ck_assert_uint_eq(status, 0);
	ck_assert_uint_ge(took, (LEN / step - 1) * gap_ms); /* it was paced */
	itest_assert_mem_eq(itest_bytes(dst), frame + HEADER_BYTES, LEN, "paced WRITE");
	close(fd);
	free(frame);
	rdmax_client_close(cv);
	itest_daemon_stop(v);
	itest_daemon_free(v);
	return took;
}

/*
 * A large WRITE from a slow but steady peer (32 KiB every 60 ms, each gap
 * well inside peer_timeout_ms) lands whole. While 512 KiB or more of a
 * payload is to come the daemon asks the kernel to wake it only once
 * RX_LOWAT_MAX bytes are queued, longer than peer_timeout_ms at this pace:
 * the no-progress clock must count the bytes waiting in the socket as
 * progress, not cut the peer.
 */
START_TEST(peer_slow_payload_lands)
{
	paced_write("300", 32 * KiB, 60);
}
END_TEST

/*
 * The receive low-water mark never exceeds what the frame still has to
 * come: a 1 MiB WRITE paced at 64 KiB per 20 ms is answered soon after its
 * last byte, not when the no-progress clock (5 s here) finds bytes waiting
 * below a mark too high for the frame's tail.
 */
START_TEST(peer_paced_payload_answered_promptly)
{
	/* Paced over about 340 ms; a mark above the tail waits for the 5 s clock. */
	uint64_t took = paced_write("5000", 64 * KiB, 20);
	ck_assert_msg(took < 2500, "a paced 1 MiB WRITE was answered after %" PRIu64 " ms", took);
}
END_TEST

/* ------------------------------------------------------------- EMFILE */

/* CPU ticks (user + system) the process used so far. */
static uint64_t cpu_ticks(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long utime = 0, stime = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
	fclose(f);
	const char *p = strrchr(buf, ')');
	ck_assert_ptr_nonnull(p);
	/* Fields after the name: state is 3, utime 14, stime 15. */
	ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
				&utime, &stime),
			 2);
	return utime + stime;
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_uint_lt(strlen(path), sizeof(sun.sun_path));
	memcpy(sun.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 && errno != EINPROGRESS &&
	    errno != EAGAIN) {
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * At its fd limit the daemon cannot accept; the pending connections keep
 * the listeners readable. It must back off instead of spinning, and serve
 * again once fds are free.
 */
START_TEST(peer_emfile_backoff)
{
	struct itest_daemon *v = itest_daemon_new("victim", itest_addr_a());
	int conns[64], n = 0;
	long hz = sysconf(_SC_CLK_TCK);

	itest_daemon_start(v);
	struct rdmax_client *cv = itest_client(v, "victim-app");
	struct rdmax_region *dst = itest_alloc(cv, 4096, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);
	struct itest_target t = itest_target_of(&desc);
	struct rlimit old, low;

	ck_assert_int_eq(prlimit(v->pid, RLIMIT_NOFILE, NULL, &old), 0);
	low = old;
	low.rlim_cur = (rlim_t)itest_daemon_fd_count(v) + 4;
	ck_assert_int_eq(prlimit(v->pid, RLIMIT_NOFILE, &low, NULL), 0);
	for (int i = 0; i < 24; i++) {
		int fd = dial("127.0.0.2", t.addr, t.port);
		ck_assert_int_ge(fd, 0);
		conns[n++] = fd;
	}
	int ufd[8];
	for (int i = 0; i < 8; i++) {
		ufd[i] = unix_connect(v->socket_path);
	}
	itest_sleep_ms(200); /* the daemon reaches its limit */
	uint64_t c0 = cpu_ticks(v->pid), t0 = itest_now_ms();
	itest_sleep_ms(1500);
	uint64_t used = cpu_ticks(v->pid) - c0, wall = itest_now_ms() - t0;
	uint64_t pct = used * 1000 * 100 / ((uint64_t)hz * wall);
	ck_assert_msg(pct < 30, "at its fd limit the daemon used %" PRIu64 "%% of a core", pct);

	for (int i = 0; i < n; i++) {
		close(conns[i]);
	}
	for (int i = 0; i < 8; i++) {
		if (ufd[i] >= 0) {
			close(ufd[i]);
		}
	}
	ck_assert_int_eq(prlimit(v->pid, RLIMIT_NOFILE, &old, NULL), 0);
	/* Serving again: a new client and a new peer connection. */
	struct rdmax_client *again = itest_client(v, "after");
	int fd = handshaken("127.0.0.3", &t, 0x4001);
	ck_assert_msg(fd >= 0, "no handshake after the fds were freed");
	close(fd);
	rdmax_client_close(again);
	rdmax_client_close(cv);
	itest_daemon_stop(v);
	itest_daemon_free(v);
}
END_TEST

TCase *itest_tcase_peer(void)
{
	TCase *tc = tcase_create("peer");
	bool tcp = strcmp(itest_transport(), "tcp") == 0;
	bool loopback = strcmp(itest_addr_a(), "127.0.0.1") == 0 &&
			strcmp(itest_addr_b(), "127.0.0.1") == 0;
	const char *why = "the attackers speak the TCP wire from 127.0.0.x addresses";

	tcase_set_timeout(tc, 60);
	ITEST_ADD_TEST_IF(tc, peer_relay_refused, tcp && loopback, why);
	ITEST_ADD_TEST_IF(tc, peer_handshake_refusals, tcp && loopback, why);
	ITEST_ADD_TEST_IF(tc, peer_slots, tcp && loopback, why);
	ITEST_ADD_TEST_IF(tc, peer_trickled_frames, tcp && loopback, why);
	ITEST_ADD_TEST_IF(tc, peer_trickle_dereg, tcp && loopback, why);
	ITEST_ADD_TEST_IF(tc, peer_slow_payload_lands, tcp && loopback, why);
	ITEST_ADD_TEST_IF(tc, peer_paced_payload_answered_promptly, tcp && loopback, why);
	ITEST_ADD_TEST_IF(tc, peer_emfile_backoff, tcp && loopback, why);
	return tc;
}
