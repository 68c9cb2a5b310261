/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the client socket (ipc.c) against a daemon built in the test
 * process: region and imm tables, engine and client socket on a private
 * loop, no transport. Each test speaks raw datagrams to it; the ring test
 * drives the daemon's pass itself, so that what the client has read when
 * the pass looks is certain.
 */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../../client-lib/internal.h"
#include "engine.h"
#include "fixtures.h"
#include "ipc.h"
#include "log.h"
#include "pass_fds.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmax_ring.h"
#include "rdmaxd.h"

Suite *ipc_suite(void);

static struct rdmaxd g_d;
static uv_loop_t g_loop;
static char g_dir[64];

static void daemon_up(void)
{
	char err[CONFIG_ERR_MAX], path[108];

	memset(&g_d, 0, sizeof(g_d));
	snprintf(g_dir, sizeof(g_dir), "/tmp/rdmax-unit-ipc-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(g_dir));
	config_defaults(&g_d.cfg);
	snprintf(path, sizeof(path), "%s/rdmaxd.sock", g_dir);
	ck_assert_int_eq(config_set(&g_d.cfg, "daemon", "socket", path, err, sizeof(err)), 0);
	log_set_level(LOG_ERR);
	ck_assert_int_eq(uv_loop_init(&g_loop), 0);
	g_d.loop = &g_loop;
	g_d.instance_id = 77;
	ck_assert_int_eq(region_table_init(&g_d.regions, g_d.instance_id), 0);
	ck_assert_int_eq(imm_table_init(&g_d.imm, 64, ipc_imm_fired, NULL), 0);
	ck_assert_int_eq(engine_create(&g_d, ipc_job_completed, &g_d.engine), 0);
	ck_assert_int_eq(ipc_create(&g_d, &g_d.ipc), 0);
}

static void daemon_down(void)
{
	ipc_shutdown(g_d.ipc);
	for (int i = 0; i < 10; i++) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
	}
	ipc_destroy(g_d.ipc);
	engine_destroy(g_d.engine);
	imm_table_fini(&g_d.imm);
	region_table_fini(&g_d.regions);
	uv_run(&g_loop, UV_RUN_NOWAIT);
	uv_loop_close(&g_loop);
	rmdir(g_dir);
}

/* Run the loop until the daemon has `want` clients; false after 5 s. */
static bool clients_become(uint32_t want)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	time_t deadline = ts.tv_sec + 5;
	while (ipc_client_count(g_d.ipc) != want) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		if (ts.tv_sec > deadline) {
			return false;
		}
		usleep(1000);
	}
	return true;
}

/* How many of this process's fds are the memfd called `name`. */
static int fds_named(const char *name)
{
	char want[128], link[PATH_MAX], target[PATH_MAX];
	int n = 0;

	snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
	for (int fd = 0; fd < 4096; fd++) {
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		ssize_t len = readlink(link, target, sizeof(target) - 1);
		if (len > 0) {
			target[len] = '\0';
			n += strcmp(target, want) == 0;
		}
	}
	return n;
}

/* An empty datagram carrying fds: the session ends and the daemon keeps none of them. */
START_TEST(ipc_empty_datagram_closes_its_fds)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} control;
	int mfds[4];

	daemon_up();
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", g_d.cfg.socket_path);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	ck_assert(clients_become(1));
	for (int i = 0; i < 4; i++) {
		mfds[i] = memfd_create("unit-empty-datagram", MFD_CLOEXEC);
		ck_assert_int_ge(mfds[i], 0);
	}
	struct iovec iov = {.iov_base = "", .iov_len = 0};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = control.buf,
			    .msg_controllen = sizeof(control.buf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(mfds));
	memcpy(CMSG_DATA(c), mfds, sizeof(mfds));
	ck_assert_int_eq(sendmsg(fd, &mh, MSG_NOSIGNAL), 0);
	for (int i = 0; i < 4; i++) {
		close(mfds[i]);
	}
	/* The daemon reads 0 bytes and ends the session. */
	ck_assert(clients_become(0));
	close(fd);
	ck_assert_int_eq(fds_named("unit-empty-datagram"), 0);
	daemon_down();
}
END_TEST

/* Send one client message, with at most one fd. */
static void send_msg(int fd, const Rdmax__V1__ClientMsg *msg, int pass_fd)
{
	union test_fd_control control;
	uint8_t buf[256];
	size_t len = rdmax__v1__client_msg__get_packed_size(msg);

	ck_assert_uint_le(len, sizeof(buf));
	rdmax__v1__client_msg__pack(msg, buf);
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (pass_fd >= 0) {
		test_attach_fd(&mh, &control, pass_fd);
	}
	ck_assert_int_eq(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

/* Run the daemon's loop until a datagram is there for the client; it, decoded (5 s at most). */
static Rdmax__V1__DaemonMsg *recv_msg(int fd)
{
	uint8_t buf[4096];
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	time_t deadline = ts.tv_sec + 5;
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			Rdmax__V1__DaemonMsg *m =
				rdmax__v1__daemon_msg__unpack(NULL, (size_t)n, buf);
			ck_assert_ptr_nonnull(m);
			return m;
		}
		uv_run(&g_loop, UV_RUN_NOWAIT);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ck_assert_msg(ts.tv_sec <= deadline, "the daemon did not answer within 5 s");
		usleep(1000);
	}
}

static void take_owner(void *arg, const struct ipc_client_info *info)
{
	*(const void **)arg = info->owner;
}

/* The body of the next datagram for the client, or 0 when there is none now. */
static int next_body(int fd)
{
	uint8_t buf[4096];
	ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

	if (n <= 0) {
		return 0;
	}
	Rdmax__V1__DaemonMsg *m = rdmax__v1__daemon_msg__unpack(NULL, (size_t)n, buf);
	ck_assert_ptr_nonnull(m);
	int body = (int)m->body_case;
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	return body;
}

/*
 * A client of the daemon built by daemon_up() with a ring of 8 entries (its
 * socket in *fd, its session's job owner in *owner), asleep as a new ring
 * starts: it asks for a RingNotify.
 */
static void ring_client_up(int *fd, struct client_ring *ring, const void **owner)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__Hello hello = RDMAX__V1__HELLO__INIT;
	Rdmax__V1__RingSetup rs = RDMAX__V1__RING_SETUP__INIT;
	int memfd;

	*fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", g_d.cfg.socket_path);
	ck_assert_int_eq(connect(*fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	hello.protocol_version = RDMAX_PROTOCOL_VERSION;
	msg.has_seq = 1;
	msg.seq = 1;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_HELLO;
	msg.hello = &hello;
	send_msg(*fd, &msg, -1);
	Rdmax__V1__DaemonMsg *m = recv_msg(*fd);
	ck_assert_int_eq(m->body_case, RDMAX__V1__DAEMON_MSG__BODY_WELCOME);
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);

	ck_assert_int_eq(client_ring_create(8, 256, 8, ring, &memfd), 0);
	rs.sq_entries = 8;
	rs.sq_entry_bytes = 256;
	rs.cq_entries = 8;
	msg.seq = 2;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP;
	msg.ring_setup = &rs;
	send_msg(*fd, &msg, memfd);
	close(memfd);
	m = recv_msg(*fd);
	ck_assert_int_eq(m->body_case, RDMAX__V1__DAEMON_MSG__BODY_ERROR);
	ck_assert_int_eq(m->error->status, RDMAX__V1__STATUS__OK);
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	*owner = NULL;
	ipc_for_each_client(g_d.ipc, take_owner, owner);
	ck_assert_ptr_nonnull(*owner);
}

/*
 * Watching the daemon's send() calls to a ring client: each must find its
 * datagram counted already (msgs_sent or notifies_sent), or a client it
 * wakes may find nothing counted and poll() a readable socket.
 */
static const struct client_ring *g_watched;
static uint64_t g_counted_base, g_sends, g_sent_uncounted;
static int g_fail_sends; /* an errno the watched send() calls fail with, or 0 */

static uint64_t daemon_counted(const struct client_ring *ring)
{
	return client_ring_daemon_sent(ring) + client_ring_daemon_notifies(ring);
}

static int check_counted(int fd)
{
	(void)fd; /* every send() of this test's thread is the daemon's, to the one client */
	g_sends++;
	if (daemon_counted(g_watched) - g_counted_base < g_sends) {
		g_sent_uncounted++;
	}
	return g_fail_sends;
}

/* Watch the daemon's send() calls, failing each with `fail_errno` (0: none). */
static void watch_counts(const struct client_ring *ring, int fail_errno)
{
	g_watched = ring;
	g_counted_base = daemon_counted(ring);
	g_sends = 0;
	g_sent_uncounted = 0;
	g_fail_sends = fail_errno;
	unit_before_send = check_counted;
}

/* Stop watching; how many send() calls came before their count. */
static uint64_t unwatch_counts(void)
{
	unit_before_send = NULL;
	return g_sent_uncounted;
}

/*
 * The daemon's pass sends a RingNotify only for ring completions the client
 * has not read when the pass looks: a client that read them first (it spun
 * on the ring) gets no datagram, and its request stays for the next one.
 */
START_TEST(ipc_ring_notify_only_when_unread)
{
	struct client_ring ring;
	const void *owner;
	int fd;

	daemon_up();
	ring_client_up(&fd, &ring, &owner);
	const struct counters *k = &g_d.counters;
	ck_assert_uint_eq(k->ring_notifies, 0);

	/* Asleep (the request a new ring starts with), completion unread: one RingNotify. */
	ipc_job_completed((void *)owner, 1, 0, NULL, 64);
	watch_counts(&ring, 0);
	ipc_poll_pass(g_d.ipc, 0);
	ck_assert_uint_eq(g_sends, 1);
	ck_assert_uint_eq(unwatch_counts(), 0); /* counted before it was sent */
	ck_assert_int_eq(next_body(fd), RDMAX__V1__DAEMON_MSG__BODY_RING_NOTIFY);
	ck_assert_int_eq(next_body(fd), 0);
	ck_assert_uint_eq(k->ring_notifies, 1);
	ck_assert_uint_eq(client_ring_daemon_notifies(&ring), 1); /* counted for the client */
	ck_assert(client_ring_set_wake(&ring, false)); /* taken: that was its RingNotify */
	ck_assert_uint_eq(unit_ring_consume(&ring), 1);

	/* Read before the pass looks, with the request set again: no datagram. */
	for (uint64_t id = 2; id < 20; id++) {
		client_ring_set_wake(&ring, true);
		ipc_job_completed((void *)owner, id, 0, NULL, 64);
		ck_assert_uint_eq(unit_ring_consume(&ring), 1);
		ipc_poll_pass(g_d.ipc, 0);
		ck_assert_int_eq(next_body(fd), 0);
		/* The request stands: withdrawing it finds it untaken. */
		ck_assert(!client_ring_set_wake(&ring, false));
	}
	ck_assert_uint_eq(k->ring_notifies, 1);
	ck_assert_uint_eq(k->ring_notifies_spared, 18);
	ck_assert_uint_eq(client_ring_daemon_notifies(&ring), 1); /* spared ones are not */

	/* Two posted, one read: the other is waited for. */
	client_ring_set_wake(&ring, true);
	ipc_job_completed((void *)owner, 20, 0, NULL, 64);
	ck_assert_uint_eq(unit_ring_consume(&ring), 1);
	ipc_job_completed((void *)owner, 21, 0, NULL, 64);
	ipc_poll_pass(g_d.ipc, 0);
	ck_assert_int_eq(next_body(fd), RDMAX__V1__DAEMON_MSG__BODY_RING_NOTIFY);
	ck_assert_uint_eq(k->ring_notifies, 2);
	ck_assert_uint_eq(client_ring_daemon_notifies(&ring), 2);
	ck_assert_uint_eq(unit_ring_consume(&ring), 1);

	/* A RingNotify that cannot be sent is taken back out of the count. */
	client_ring_set_wake(&ring, true);
	ipc_job_completed((void *)owner, 22, 0, NULL, 64);
	watch_counts(&ring, EAGAIN);
	ipc_poll_pass(g_d.ipc, 0);
	ck_assert_uint_eq(g_sends, 1);
	ck_assert_uint_eq(unwatch_counts(), 0);
	ck_assert_int_eq(next_body(fd), 0);
	ck_assert_uint_eq(k->ring_notifies, 2);
	ck_assert_uint_eq(client_ring_daemon_notifies(&ring), 2);
	ck_assert_uint_eq(unit_ring_consume(&ring), 1);

	close(fd);
	ck_assert(clients_become(0));
	client_ring_destroy(&ring);
	daemon_down();
}
END_TEST

/* Send `n` JobStatusQuery datagrams (seq from *seq on), each a request the daemon answers. */
static void send_queries(int fd, int n, uint64_t *seq)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__JobStatusQuery q = RDMAX__V1__JOB_STATUS_QUERY__INIT;

	q.job_id = 12345;
	msg.has_seq = 1;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS;
	msg.job_status = &q;
	for (int i = 0; i < n; i++) {
		msg.seq = (*seq)++;
		send_msg(fd, &msg, -1);
	}
}

/* Run the loop until `n` JobStatusReply datagrams came; how many calls of the loop's that took. */
static int answers_come(int fd, int n)
{
	int turns = 0;

	for (int got = 0; got < n && turns < 5000; turns++) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
		for (int body; (body = next_body(fd)) != 0; got++) {
			ck_assert_int_eq(body, RDMAX__V1__DAEMON_MSG__BODY_JOB_STATUS);
		}
	}
	ck_assert_int_lt(turns, 5000);
	return turns;
}

/*
 * A ring session reads as many datagrams as its client says it sent, with no
 * read that hears EAGAIN; a client whose count is wrong (behind or ahead)
 * still has every datagram read and answered, at one read more (ahead) or
 * one datagram per turn of the loop (behind).
 */
START_TEST(ipc_session_reads_what_the_client_counts)
{
	struct client_ring ring;
	const void *owner;
	uint64_t seq = 10;
	int fd;

	daemon_up();
	ring_client_up(&fd, &ring, &owner);
	/* Hello and RingSetup read: the client's count says so. */
	client_ring_publish_sent(&ring, 2);
	for (int i = 0; i < 10; i++) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
	}

	/* Counted: one turn reads all three, and no read hears EAGAIN. */
	uint64_t eagain = unit_recvmsg_eagain();
	client_ring_publish_sent(&ring, 5);
	send_queries(fd, 3, &seq);
	watch_counts(&ring, 0);
	ck_assert_int_eq(answers_come(fd, 3), 1);
	ck_assert_uint_eq(g_sends, 3);
	ck_assert_uint_eq(unwatch_counts(), 0); /* each answer counted before it was sent */
	ck_assert_uint_eq(unit_recvmsg_eagain() - eagain, 0);

	/* Ahead: the daemon reads on to EAGAIN, as without a count. */
	eagain = unit_recvmsg_eagain();
	client_ring_publish_sent(&ring, 1000);
	send_queries(fd, 3, &seq);
	answers_come(fd, 3);
	ck_assert_uint_ge(unit_recvmsg_eagain() - eagain, 1);

	/* Behind (says nothing more was sent): every datagram is still read. */
	client_ring_publish_sent(&ring, 8);
	send_queries(fd, 4, &seq);
	ck_assert_int_ge(answers_come(fd, 4), 1);

	/*
	 * An answer the socket cannot take now is queued, and stays counted:
	 * a client that reads its count waits for it, and it comes.
	 */
	uint64_t counted = client_ring_daemon_sent(&ring);
	client_ring_publish_sent(&ring, 13);
	send_queries(fd, 1, &seq);
	watch_counts(&ring, EAGAIN);
	uv_run(&g_loop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(unwatch_counts(), 0);
	ck_assert_uint_ge(g_sends, 1);
	ck_assert_uint_eq(client_ring_daemon_sent(&ring), counted + 1);
	ck_assert_int_eq(next_body(fd), 0);
	answers_come(fd, 1);
	ck_assert_uint_eq(client_ring_daemon_sent(&ring), counted + 1);

	close(fd);
	ck_assert(clients_become(0));
	client_ring_destroy(&ring);
	daemon_down();
}
END_TEST

static void complete_job_1(uv_timer_t *timer)
{
	ipc_job_completed(timer->data, 1, 0, NULL, 64);
}

static void note_readable(uv_poll_t *poll, int status, int events)
{
	(void)status;
	(void)events;
	*(bool *)poll->data = true;
	uv_poll_stop(poll);
}

static void nothing(uv_timer_t *timer)
{
	(void)timer;
}

/*
 * A completion delivered after the turn's flush (here from a timer; in the
 * daemon also from the verbs transport's check handle, which libuv runs after
 * the client socket's) reaches a sleeping client before the loop sleeps: its
 * RingNotify makes the client's socket readable while the loop polls, not
 * after the loop's next event (here a timer 2 s later).
 */
START_TEST(ipc_ring_notify_before_the_loop_sleeps)
{
	struct client_ring ring;
	const void *owner;
	uv_timer_t deliver, later;
	uv_poll_t client_readable;
	bool readable = false;
	int fd;

	daemon_up();
	ring_client_up(&fd, &ring, &owner);
	ck_assert_int_eq(next_body(fd), 0);
	ck_assert_int_eq(uv_timer_init(&g_loop, &deliver), 0);
	ck_assert_int_eq(uv_timer_init(&g_loop, &later), 0);
	ck_assert_int_eq(uv_poll_init(&g_loop, &client_readable, fd), 0);
	deliver.data = (void *)owner;
	client_readable.data = &readable;
	uv_timer_start(&deliver, complete_job_1, 0, 0);
	uv_timer_start(&later, nothing, 2000, 0);
	uv_poll_start(&client_readable, UV_READABLE, note_readable);

	uv_run(&g_loop, UV_RUN_ONCE);
	ck_assert_msg(readable, "the RingNotify waited for the loop's next event");
	ck_assert_int_eq(next_body(fd), RDMAX__V1__DAEMON_MSG__BODY_RING_NOTIFY);
	ck_assert_uint_eq(g_d.counters.ring_notifies, 1);
	ck_assert_uint_eq(unit_ring_consume(&ring), 1);

	uv_timer_stop(&later);
	uv_close((uv_handle_t *)&deliver, NULL);
	uv_close((uv_handle_t *)&later, NULL);
	uv_close((uv_handle_t *)&client_readable, NULL);
	close(fd);
	ck_assert(clients_become(0));
	client_ring_destroy(&ring);
	daemon_down();
}
END_TEST

Suite *ipc_suite(void)
{
	Suite *s = suite_create("ipc");
	TCase *tc = tcase_create("ipc");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, ipc_empty_datagram_closes_its_fds);
	tcase_add_test(tc, ipc_ring_notify_only_when_unread);
	tcase_add_test(tc, ipc_ring_notify_before_the_loop_sleeps);
	tcase_add_test(tc, ipc_session_reads_what_the_client_counts);
	suite_add_tcase(s, tc);
	return s;
}
