/* SPDX-License-Identifier: MIT */
/*
 * Case "harden": what a careless or hostile local client must not be able to
 * do to the daemon or to the other clients — flood it with failing jobs and
 * never read, hold every client slot, reuse job ids, send bytes that are not
 * messages, leave admin connections open — and the promise that a final
 * completion is final: no byte of a completed job moves afterwards, and the
 * deregistration of its source does not wait for the transport.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"

/* A normal client of the daemon registers memory and moves bytes on it. */
static void assert_serves(struct itest_daemon *d, const char *who)
{
	struct rdmax_client *c = itest_client(d, "itest-bystander");
	struct rdmax_region *src = itest_alloc(c, 8192, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(c, 8192, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);

	itest_fill(itest_bytes(src), 8192, 17);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 8192);
	struct rdmax_event ev = itest_run_job(c, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "a bystander cannot move bytes %s: %s ('%s')", who,
		      rdmax_err_name(ev.status), ev.reason);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 8192, who);
	rdmax_client_close(c);
}

/* Resident memory of a process in KiB, from /proc. */
static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) {
			break;
		}
	}
	fclose(f);
	return kib;
}

static bool valid_utf8(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p) {
		int n = *p < 0x80         ? 1
			: (*p >> 5) == 6  ? 2
			: (*p >> 4) == 14 ? 3
			: (*p >> 3) == 30 ? 4
					  : 0;
		if (n == 0 || (n == 2 && *p < 0xc2) || (n == 4 && *p > 0xf4)) {
			return false;
		}
		for (int i = 1; i < n; i++) {
			if ((p[i] & 0xc0) != 0x80) {
				return false;
			}
		}
		p += n;
	}
	return true;
}

/*
 * One encoded Submit (seq) of n WRITE jobs of len bytes from local region
 * `region` to the descriptor bytes desc; ids from `ids`, or first, first+1, ...
 * when ids is NULL. Returns its length in buf.
 */
static size_t pack_writes(uint8_t *buf, size_t size, uint64_t seq, const uint64_t *ids,
			  uint64_t first, size_t n, uint64_t region, const uint8_t *desc,
			  size_t desc_len, uint64_t len)
{
	Rdmax__V1__Job *jobs = calloc(n, sizeof(*jobs));
	Rdmax__V1__WriteJob *writes = calloc(n, sizeof(*writes));
	Rdmax__V1__Job **ptrs = calloc(n, sizeof(*ptrs));
	Rdmax__V1__Submit submit = RDMAX__V1__SUBMIT__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	ck_assert(jobs && writes && ptrs);
	for (size_t i = 0; i < n; i++) {
		Rdmax__V1__Job ji = RDMAX__V1__JOB__INIT;
		Rdmax__V1__WriteJob wi = RDMAX__V1__WRITE_JOB__INIT;
		jobs[i] = ji;
		writes[i] = wi;
		writes[i].local_region = region;
		writes[i].length = len;
		writes[i].remote_desc.data = (uint8_t *)desc;
		writes[i].remote_desc.len = desc_len;
		jobs[i].job_id = ids ? ids[i] : first + i;
		jobs[i].kind_case = RDMAX__V1__JOB__KIND_WRITE;
		jobs[i].write = &writes[i];
		ptrs[i] = &jobs[i];
	}
	submit.n_jobs = n;
	submit.jobs = ptrs;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_SUBMIT;
	msg.submit = &submit;
	size_t packed = rdmax__v1__client_msg__get_packed_size(&msg);
	ck_assert_uint_le(packed, size);
	rdmax__v1__client_msg__pack(&msg, buf);
	free(jobs);
	free(writes);
	free(ptrs);
	return packed;
}

/*
 * Issue item 1: a client submits 1200 x 1000 jobs that all fail at once and
 * never reads its socket. The daemon must neither recurse nor grow without
 * bound: it stops reading that client (back-pressure), serves everybody
 * else, and the flooding client gets every completion exactly once when it
 * finally reads.
 */
START_TEST(flood_never_reading)
{
	const size_t per_submit = 1000, submits = 1200;
	struct itest_daemon *a = itest_daemon_new("flood", itest_addr_a());
	uint8_t *buf = malloc(1 << 20);

	ck_assert_ptr_nonnull(buf);
	itest_daemon_start(a);
	int fd = raw_connect(a->socket_path);
	raw_hello(fd);
	size_t sent = 0;
	for (size_t k = 0; k < submits; k++) {
		/* Unknown local region, garbage descriptor: every job fails at once. */
		static const uint8_t junk_desc[] = {0x01, 0x02, 0x03, 0x04};
		size_t len = pack_writes(buf, 1 << 20, 2 + k, NULL, k * per_submit, per_submit,
					 424242, junk_desc, sizeof(junk_desc), 64);
		ssize_t n = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			/* The daemon stopped reading us: that is the back-pressure. */
			struct pollfd pfd = {.fd = fd, .events = POLLOUT};
			if (poll(&pfd, 1, 1000) == 1 && (pfd.revents & POLLOUT)) {
				k--;
				continue;
			}
			break;
		}
		ck_assert_msg(n == (ssize_t)len, "send() of Submit %zu failed: %s%s", k,
			      n < 0 ? strerror(errno) : "short", itest_daemon_deaths());
		sent += per_submit;
	}
	/* Everybody else is still served, by a daemon of bounded size. */
	assert_serves(a, "while a client floods and never reads");
	long rss = rss_kib(a->pid);
	ck_assert_msg(rss > 0 && rss < 512 * 1024,
		      "the daemon's resident memory is %ld KiB while one client does not read",
		      rss);

	/* The flooding client reads at last: one completion per job, none lost. */
	uint64_t *ids = calloc(sent, sizeof(*ids));
	int *statuses = calloc(sent, sizeof(*statuses));
	uint8_t *seen = calloc(sent, 1);
	ck_assert(ids && statuses && seen);
	size_t got = raw_collect(fd, ids, statuses, sent, 60000);
	ck_assert_msg(got == sent, "%zu of %zu completions after the flood%s", got, sent,
		      itest_daemon_deaths());
	for (size_t i = 0; i < got; i++) {
		ck_assert_uint_lt(ids[i], sent);
		ck_assert_msg(!seen[ids[i]]++, "job %" PRIu64 " completed twice", ids[i]);
		ck_assert_msg(statuses[i] != 0, "job %" PRIu64 " cannot have succeeded", ids[i]);
	}
	fprintf(stderr, "itest harden: %zu failing jobs submitted unread, daemon RSS %ld KiB\n",
		sent, rss);
	close(fd);
	free(ids);
	free(statuses);
	free(seen);
	free(buf);
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

/*
 * In a child that became uid: connect, say Hello, and exit 0 when welcomed,
 * 2 when refused, 3 on anything else.
 */
static int other_uid_hello(const char *socket_path, uid_t uid)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	uint8_t buf[4096];

	if (setgid(uid) < 0 || setuid(uid) < 0) {
		return 4;
	}
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		return 5;
	}
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__Hello hello = RDMAX__V1__HELLO__INIT;
	hello.protocol_version = RDMAX_PROTOCOL_VERSION;
	hello.client_name = "other-uid";
	msg.has_seq = 1;
	msg.seq = 1;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_HELLO;
	msg.hello = &hello;
	size_t len = rdmax__v1__client_msg__pack(&msg, buf);
	if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len) {
		return 3;
	}
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	if (poll(&pfd, 1, ITEST_WAIT_MS) != 1) {
		return 3;
	}
	ssize_t n = recv(fd, buf, sizeof(buf), 0);
	Rdmax__V1__DaemonMsg *m =
		n > 0 ? rdmax__v1__daemon_msg__unpack(NULL, (size_t)n, buf) : NULL;
	int ret = !m ? 3 : m->body_case == RDMAX__V1__DAEMON_MSG__BODY_WELCOME ? 0 : 2;
	if (m) {
		rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	}
	close(fd);
	return ret;
}

/* A refused connection: the daemon's first message is RESOURCE_EXHAUSTED, then it closes. */
static void expect_refused(const char *socket_path)
{
	int fd = raw_connect(socket_path);
	raw_expect_status(fd, 0, RDMAX_E_RESOURCE_EXHAUSTED);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);
}

/*
 * Issue item 3: one uid holding silent connections takes only its share of
 * the client slots, silent connections are closed after hello_timeout_ms, and
 * the regions of one uid's clients together stay within their share.
 */
START_TEST(uid_shares_and_hello_timeout)
{
	enum { SHARE = 4 };
	struct itest_daemon *a = itest_daemon_new("shares", itest_addr_a());
	int silent[SHARE];

	itest_daemon_set(a, "limits.max_clients=16");
	itest_daemon_set(a, "limits.per_uid_clients=%d", SHARE);
	itest_daemon_set(a, "limits.hello_timeout_ms=1500");
	itest_daemon_set(a, "limits.per_uid_regions=3");
	itest_daemon_start(a);

	for (int i = 0; i < SHARE; i++) {
		silent[i] = raw_connect(a->socket_path);
	}
	/* This uid's share is taken: its next connection is refused by name. */
	expect_refused(a->socket_path);
	/* Another uid still gets in. */
	if (geteuid() == 0) {
		itest_open_socket_dirs(a);
		pid_t parent = getpid(), child = fork();
		ck_assert_int_ge(child, 0);
		if (child == 0) {
			itest_child_setup(parent);
			_exit(other_uid_hello(a->socket_path, 65534));
		}
		int status;
		ck_assert_int_eq(waitpid(child, &status, 0), child);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "a client of uid 65534 was not welcomed while uid 0 held its share "
			      "(status 0x%x)",
			      status);
	} else {
		fprintf(stderr, "itest harden: not root, so no second uid: the other-uid part of "
				"uid_shares_and_hello_timeout did not run\n");
	}
	/* Connections that never say Hello are closed with a named error. */
	uint64_t t0 = itest_now_ms();
	for (int i = 0; i < SHARE; i++) {
		raw_expect_status(silent[i], 0, RDMAX_E_TIMEOUT);
		raw_expect_closed(silent[i], ITEST_WAIT_MS);
		close(silent[i]);
	}
	ck_assert_msg(itest_now_ms() - t0 < 6000, "silent connections lasted %" PRIu64 " ms",
		      itest_now_ms() - t0);

	/* The slots are free again; regions count over all clients of the uid. */
	struct rdmax_client *c1 = itest_client(a, "share-1");
	struct rdmax_client *c2 = itest_client(a, "share-2");
	struct rdmax_region *r1 = itest_alloc(c1, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *r2 = itest_alloc(c1, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *r3 = itest_alloc(c2, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *r4 = NULL;
	int ret = rdmax_region_alloc_host(c2, 4096, RDMAX_ACCESS_LOCAL, &r4);
	itest_assert_err(ret, RDMAX_E_RESOURCE_EXHAUSTED);
	/* Given back when a client leaves. */
	rdmax_client_close(c1);
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	while ((ret = rdmax_region_alloc_host(c2, 4096, RDMAX_ACCESS_LOCAL, &r4)) ==
		       RDMAX_E_RESOURCE_EXHAUSTED &&
	       itest_now_ms() < deadline) {
		itest_sleep_ms(20);
	}
	itest_assert_err(ret, 0);
	(void)r1;
	(void)r2;
	(void)r3;
	rdmax_client_close(c2);
	assert_serves(a, "after the shares were used");
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

/* Submit raw WRITE jobs (ids given) of len bytes from region to desc; no reply expected. */
static void raw_submit_writes(int fd, uint64_t seq, const uint64_t *ids, size_t n, uint64_t region,
			      const struct rdmax_desc *desc, uint64_t len)
{
	uint8_t buf[4096];
	size_t packed =
		pack_writes(buf, sizeof(buf), seq, ids, 0, n, region, desc->bytes, desc->len, len);

	ck_assert_int_eq(raw_send(fd, buf, packed, NULL, 0), 0);
}

/*
 * Issue item 5: a job id in flight submitted again is refused by its
 * Submit's reply, never by a second completion for that id; so is a Submit
 * naming one id twice (none of its jobs starts).
 */
START_TEST(duplicate_job_id_one_completion)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *dst = itest_alloc(cb, 1 * MiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);

	int fd = raw_connect(a->socket_path);
	raw_hello(fd);
	int memfd = raw_memfd("itest-dup", 1 * MiB, true);
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__RegisterRegion rr = RDMAX__V1__REGISTER_REGION__INIT;
	rr.kind = RDMAX__V1__REGION_KIND__REGION_HOST_FD;
	rr.length = 1 * MiB;
	rr.has_fd_index = 1;
	msg.has_seq = 1;
	msg.seq = 2;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION;
	msg.register_region = &rr;
	raw_send_msg(fd, &msg, &memfd, 1);
	close(memfd);
	bool closed;
	Rdmax__V1__DaemonMsg *m = raw_recv(fd, ITEST_WAIT_MS, &closed);
	ck_assert_msg(m && m->body_case == RDMAX__V1__DAEMON_MSG__BODY_REGION,
		      "RegisterRegion was not answered with a region");
	uint64_t region = m->region->region_id;
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);

	/* Job 7 stays in flight against a stopped peer. */
	itest_daemon_pause(b);
	uint64_t ids[2] = {7, 7};
	raw_submit_writes(fd, 3, ids, 1, region, &desc, 1 * MiB);
	/* Again: refused by the Submit's reply. */
	raw_submit_writes(fd, 4, ids, 1, region, &desc, 4096);
	raw_expect_status(fd, 4, RDMAX_E_INVALID_ARGUMENT);
	/* One Submit naming id 8 twice: refused as a whole. */
	uint64_t twice[2] = {8, 8};
	raw_submit_writes(fd, 5, twice, 2, region, &desc, 4096);
	raw_expect_status(fd, 5, RDMAX_E_INVALID_ARGUMENT);
	itest_daemon_resume(b);

	/* Exactly one completion for 7 (OK), none for 8. */
	uint64_t got_ids[4];
	int statuses[4];
	size_t got = raw_collect(fd, got_ids, statuses, 1, ITEST_WAIT_MS);
	ck_assert_uint_eq(got, 1);
	ck_assert_uint_eq(got_ids[0], 7);
	itest_assert_err(statuses[0], 0);
	got = raw_collect(fd, got_ids, statuses, 1, ITEST_QUIET_MS);
	ck_assert_msg(got == 0, "a second completion arrived: job %" PRIu64 " status %d",
		      got_ids[0], statuses[0]);
	close(fd);
	rdmax_client_close(cb);
	itest_daemon_stop(a);
	itest_daemon_stop(b);
	itest_daemon_free(a);
	itest_daemon_free(b);
}
END_TEST

/*
 * Issue item 5: undecodable bytes and empty datagrams before Hello close the
 * session with a named error; after Hello an empty datagram is answered and
 * the session stays; Error.message never carries bytes that are not UTF-8.
 */
START_TEST(bad_datagrams_named)
{
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
				       0xff, 0xff, 0x01, 0x0a, 0xfe, 0x00, 0x13};
	struct itest_daemon *a = itest_daemon_new("bad", itest_addr_a());

	itest_daemon_start(a);
	/* Undecodable bytes before Hello. */
	int fd = raw_connect(a->socket_path);
	ck_assert_int_eq(raw_send(fd, junk, sizeof(junk), NULL, 0), 0);
	raw_expect_status(fd, 0, RDMAX_E_PROTOCOL_ERROR);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);

	/* An empty datagram before Hello. */
	fd = raw_connect(a->socket_path);
	ck_assert_int_eq(raw_send(fd, "", 0, NULL, 0), 0);
	raw_expect_status(fd, 0, RDMAX_E_PROTOCOL_ERROR);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);

	/* After Hello: answered, and the session goes on. */
	fd = raw_connect(a->socket_path);
	raw_hello(fd);
	ck_assert_int_eq(raw_send(fd, "", 0, NULL, 0), 0);
	raw_expect_status(fd, 0, RDMAX_E_PROTOCOL_ERROR);

	/* A mailbox name of bytes that are not UTF-8 is refused without echoing them. */
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__MailboxOpen open_req = RDMAX__V1__MAILBOX_OPEN__INIT;
	open_req.name = "bad\xff\xfe\xc3(name\xed\xa0\x80";
	msg.has_seq = 1;
	msg.seq = 11;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN;
	msg.mailbox_open = &open_req;
	raw_send_msg(fd, &msg, NULL, 0);
	bool closed;
	Rdmax__V1__DaemonMsg *m = raw_recv(fd, ITEST_WAIT_MS, &closed);
	ck_assert_msg(m && m->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR,
		      "MailboxOpen with a bad name was not answered");
	itest_assert_err(raw_err_from_status((int)m->error->status), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(m->error->message);
	ck_assert_msg(valid_utf8(m->error->message), "Error.message is not UTF-8: '%s'",
		      m->error->message);
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	close(fd);
	assert_serves(a, "after bad datagrams");
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

static int admin_connect(const struct itest_daemon *d)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "%.*s/admin.sock",
			 (int)(sizeof(addr.sun_path) - 12), d->dir);
	ck_assert_int_lt(n, (int)sizeof(addr.sun_path));
	ck_assert_msg(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0,
		      "connect('%s') failed: %s", addr.sun_path, strerror(errno));
	return fd;
}

/* Send one admin command; the reply (NUL-terminated) into buf; false when closed. */
static bool admin_ask(int fd, const char *cmd, char *buf, size_t size)
{
	ck_assert_int_eq(send(fd, cmd, strlen(cmd), MSG_NOSIGNAL), (ssize_t)strlen(cmd));
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	ck_assert_int_eq(poll(&pfd, 1, ITEST_WAIT_MS), 1);
	ssize_t n = recv(fd, buf, size - 1, 0);
	if (n <= 0) {
		return false;
	}
	buf[n] = '\0';
	return true;
}

/*
 * Issue item 5: admin connections are bounded by admin_max_connections and
 * the silent ones close after admin_idle_timeout_ms, so that rdmaxctl gets in
 * again.
 */
START_TEST(admin_bounded_idle)
{
	enum { MAX = 4 };
	struct itest_daemon *a = itest_daemon_new("admin", itest_addr_a());
	char reply[8192];
	int fds[MAX];

	itest_daemon_set(a, "limits.admin_max_connections=%d", MAX);
	itest_daemon_set(a, "limits.admin_idle_timeout_ms=1000");
	itest_daemon_start(a);
	for (int i = 0; i < MAX; i++) {
		fds[i] = admin_connect(a);
		/* Each is accepted: it answers. */
		ck_assert(admin_ask(fds[i], "help", reply, sizeof(reply)));
		ck_assert_ptr_nonnull(strstr(reply, "\"ok\":true"));
	}
	/* One more is refused by name. */
	int extra = admin_connect(a);
	struct pollfd pfd = {.fd = extra, .events = POLLIN};
	ck_assert_int_eq(poll(&pfd, 1, ITEST_WAIT_MS), 1);
	ssize_t n = recv(extra, reply, sizeof(reply) - 1, 0);
	ck_assert_int_gt(n, 0);
	reply[n] = '\0';
	ck_assert_msg(strstr(reply, "RESOURCE_EXHAUSTED") != NULL, "refusal: %s", reply);
	close(extra);
	/* The silent ones are closed after the idle timeout... */
	uint64_t t0 = itest_now_ms();
	for (int i = 0; i < MAX; i++) {
		pfd.fd = fds[i];
		ck_assert_int_eq(poll(&pfd, 1, ITEST_WAIT_MS), 1);
		ck_assert_int_eq(recv(fds[i], reply, sizeof(reply), 0), 0);
		close(fds[i]);
	}
	ck_assert_uint_ge(itest_now_ms() - t0, 500);
	/* ...and a new one gets in. */
	int fd = admin_connect(a);
	ck_assert(admin_ask(fd, "help", reply, sizeof(reply)));
	ck_assert_ptr_nonnull(strstr(reply, "\"ok\":true"));
	close(fd);
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

/* A pattern no job below writes: which bytes came from the reused source. */
#define REUSED 0xa5

/*
 * Issue item 2: jobs completed TIMEOUT and CANCELLED while their peer's
 * connection was still being set up (the peer is stopped) never send their
 * bytes when it comes up, and the deregistration of their source does not
 * wait for the transport. The application reuses the source right after the
 * completions; no reused byte may reach the peer.
 */
START_TEST(final_completion_connecting)
{
	const uint64_t len = 256 * KiB;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_set(a, "peers.connect_timeout_ms=20000");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "writer");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *dst = itest_alloc(cb, 4 * len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *src = itest_alloc(ca, 2 * len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *src2 = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc desc = itest_desc(dst);
	memset(itest_bytes(dst), 0, 4 * len);
	itest_fill(itest_bytes(src), 2 * len, 5);

	/* No connection from a to b exists yet: the jobs wait for its handshake. */
	itest_daemon_pause(b);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, len);
	job.deadline_ms = 300;
	itest_expect_job_error(ca, &job, RDMAX_E_TIMEOUT, ITEST_WAIT_MS);
	job = itest_job(2, RDMAX_OP_WRITE, src, len, &desc, len, len);
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	ck_assert_int_eq(rdmax_cancel(ca, 2), 0);
	struct rdmax_event ev;
	ck_assert_uint_eq(itest_collect(ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	ck_assert_uint_eq(ev.job_id, 2);
	itest_assert_err(ev.status, RDMAX_E_CANCELLED);

	/* The application reuses the memory and gives it back: nothing waits. */
	memset(itest_bytes(src), REUSED, 2 * len);
	uint64_t t0 = itest_now_ms();
	int ret = rdmax_region_free(ca, src);
	uint64_t took = itest_now_ms() - t0;
	itest_assert_err(ret, 0);
	ck_assert_msg(took < 1000, "deregistering the source of completed jobs took %" PRIu64 " ms",
		      took);

	/* The connection comes up; a new job goes behind whatever was queued. */
	itest_daemon_resume(b);
	itest_fill(itest_bytes(src2), len, 6);
	job = itest_job(3, RDMAX_OP_WRITE, src2, 0, &desc, 2 * len, len);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "WRITE after the peer resumed failed: %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
	itest_assert_mem_eq(itest_bytes(dst) + 2 * len, itest_bytes(src2), len, "third job");
	const uint8_t *d = itest_bytes(dst);
	for (uint64_t i = 0; i < 2 * len; i++) {
		if (d[i] != 0) { /* not ck_assert: it costs a message to check's parent per call */
			ck_abort_msg("byte %" PRIu64
				     " of a completed job reached the peer (0x%02x)",
				     i, d[i]);
		}
	}
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/*
 * A job after the peer resumed must succeed; the first one after an aborted
 * connection may meet its failure once.
 */
static void run_after_abort(struct rdmax_client *c, const struct rdmax_job *job)
{
	struct rdmax_event ev = itest_run_job(c, job, ITEST_WAIT_MS);
	if (ev.status != 0) {
		ev = itest_run_job(c, job, ITEST_WAIT_MS);
	}
	ck_assert_msg(ev.status == 0, "WRITE after the peer resumed failed: %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
}

/*
 * Issue item 2 on a live connection: a large write to a peer stopped mid-
 * stream completes TIMEOUT; its source is reused at once. Whatever was still
 * queued or half sent must not be read from the source any more: no reused
 * byte reaches the peer, the source's deregistration does not wait, and the
 * next job to the peer works.
 */
START_TEST(final_completion_mid_stream)
{
	const uint64_t len = itest_scaled(32 * MiB, 16 * MiB);
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	itest_pair_start(&a, &b, &ca, "writer", &cb, "target");
	struct rdmax_region *dst = itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *src = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *src2 = itest_alloc(ca, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc desc = itest_desc(dst);
	memset(itest_bytes(dst), 0, len);
	itest_fill(itest_bytes(src), len, 9);
	/* Connected first. */
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src2, 0, &desc, 0, 4096);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_int_eq(ev.status, 0);
	memset(itest_bytes(dst), 0, 4096);

	itest_daemon_pause(b);
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &desc, 0, len);
	job.deadline_ms = 300;
	itest_expect_job_error(ca, &job, RDMAX_E_TIMEOUT, ITEST_WAIT_MS);
	memset(itest_bytes(src), REUSED, len);
	uint64_t t0 = itest_now_ms();
	int ret = rdmax_region_free(ca, src);
	uint64_t took = itest_now_ms() - t0;
	itest_assert_err(ret, 0);
	ck_assert_msg(took < 1000,
		      "deregistering the source of a completed job took %" PRIu64 " ms", took);
	itest_daemon_resume(b);

	/* The next job works (on the same connection or a new one). */
	itest_fill(itest_bytes(src2), 4096, 10);
	job = itest_job(3, RDMAX_OP_WRITE, src2, 0, &desc, 0, 4096);
	run_after_abort(ca, &job);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src2), 4096, "next job");
	/* The bytes of job 2 that landed are the original ones, never the reused ones. */
	uint8_t *orig = malloc(len);
	ck_assert_ptr_nonnull(orig);
	itest_fill(orig, len, 9);
	const uint8_t *d = itest_bytes(dst);
	uint64_t landed = 0;
	for (uint64_t i = 4096; i < len; i++) {
		if (d[i] != 0 && d[i] != orig[i]) {
			ck_abort_msg("byte %" PRIu64 " of the timed-out job was read from the "
				     "reused source (0x%02x)",
				     i, d[i]);
		}
		landed += d[i] != 0;
	}
	fprintf(stderr,
		"itest harden: %" PRIu64 " of %" PRIu64 " bytes of the timed-out write "
		"landed, none of them reused\n",
		landed, len);
	free(orig);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/*
 * Over verbs a write that carries an imm is a WRITE, then an imm record once
 * the NIC acknowledged the bytes. Such a job timed out while its write is
 * stalled at the NIC: it completes TIMEOUT only once the write is over (the
 * QP flushed), and its imm never counts at the peer, not even after the peer
 * resumes; a later job with the same imm does count (the claim was live).
 * Over TCP a frame the kernel already took may still land (docs/protocol.md),
 * so this runs over verbs only.
 */
START_TEST(final_completion_imm_write)
{
	const uint64_t len = 256 * KiB;
	const uint32_t imm = 77;
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	itest_pair_start(&a, &b, &ca, "writer", &cb, "target");
	struct rdmax_region *dst = itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *src = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc desc = itest_desc(dst);
	itest_fill(itest_bytes(src), len, 31);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	ck_assert_int_eq(itest_run_job(ca, &job, ITEST_WAIT_MS).status, 0);
	itest_assert_err(rdmax_expect_imm(cb, imm, 1), 0);

	itest_daemon_pause(b);
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &desc, 0, len);
	job.flags = RDMAX_JOB_IMM;
	job.imm = imm;
	job.deadline_ms = 300;
	itest_expect_job_error(ca, &job, RDMAX_E_TIMEOUT, ITEST_WAIT_MS);
	itest_daemon_resume(b);

	/* The next job works; the timed-out one's imm never counted. */
	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	run_after_abort(ca, &job);
	int ret = rdmax_wait_imm(cb, imm, 1000);
	ck_assert_msg(ret == RDMAX_E_TIMEOUT,
		      "the imm of the timed-out write counted at the peer: %s",
		      rdmax_err_name(ret));
	job = itest_job(4, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	job.flags = RDMAX_JOB_IMM;
	job.imm = imm;
	ck_assert_int_eq(itest_run_job(ca, &job, ITEST_WAIT_MS).status, 0);
	itest_assert_err(rdmax_wait_imm(cb, imm, ITEST_WAIT_MS), 0);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/*
 * A client of another uid, in a child: a writable region whose descriptor
 * goes to the parent on `out`; after a byte on `in` it claims imm 7 once,
 * says so on `out`, and waits for it. Exit 0 when it fired, else the step.
 */
static int other_uid_imm_client(const char *socket_path, uid_t uid, int out, int in)
{
	struct rdmax_client *c;
	struct rdmax_region *r;
	struct rdmax_desc d;
	char byte;

	if (setgid(uid) < 0 || setuid(uid) < 0) {
		return 2;
	}
	if (rdmax_client_open(socket_path, "tenant", &c) < 0) {
		return 3;
	}
	if (rdmax_region_alloc_host(c, 4096, RDMAX_ACCESS_REMOTE_WRITE, &r) < 0 ||
	    rdmax_region_desc(r, &d) < 0) {
		return 4;
	}
	if (write(out, &d, sizeof(d)) != (ssize_t)sizeof(d) || read(in, &byte, 1) != 1) {
		return 5;
	}
	if (rdmax_expect_imm(c, 7, 1) != 0) {
		return 6;
	}
	if (write(out, "k", 1) != 1) {
		return 5;
	}
	return rdmax_wait_imm(c, 7, ITEST_WAIT_MS) == 0 ? 0 : 7;
}

/*
 * Issue item 4: imm counters are bound to the region written through. A
 * flood of zero-byte WRITE+imm of distinct values through one client's
 * descriptor fills only that uid's share of counters; it fires no other
 * client's claim of the same value, and a client of another uid still
 * claims and is fired. A claim by the flooded client itself still works.
 */
START_TEST(imm_scoped_to_region)
{
	enum { FLOOD = 200 };
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	static struct rdmax_job jobs[FLOOD];
	static struct rdmax_event evs[FLOOD];

	itest_daemon_set(b, "limits.max_imm_counters=64");
	itest_daemon_set(b, "limits.per_uid_imm_counters=32");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *sender = itest_client(a, "sender");
	struct rdmax_client *flooded = itest_client(b, "flooded");
	struct rdmax_client *bystander = itest_client(b, "bystander");
	struct rdmax_region *src = itest_alloc(sender, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *rx = itest_alloc(flooded, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *rv = itest_alloc(bystander, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc dx = itest_desc(rx), dv = itest_desc(rv);

	/* The bystander claims a value the flood will use. */
	itest_assert_err(rdmax_expect_imm(bystander, 1000, 1), 0);

	int to_child[2], from_child[2];
	pid_t child = -1;
	struct rdmax_desc dt;
	if (geteuid() == 0) {
		itest_open_socket_dirs(b);
		ck_assert_int_eq(pipe2(to_child, O_CLOEXEC), 0);
		ck_assert_int_eq(pipe2(from_child, O_CLOEXEC), 0);
		pid_t parent = getpid();
		child = fork();
		ck_assert_int_ge(child, 0);
		if (child == 0) {
			itest_child_setup(parent);
			_exit(other_uid_imm_client(b->socket_path, 65534, from_child[1],
						   to_child[0]));
		}
		struct pollfd pfd = {.fd = from_child[0], .events = POLLIN};
		ck_assert_msg(poll(&pfd, 1, ITEST_WAIT_MS) == 1, "the tenant did not report");
		ck_assert_int_eq(read(from_child[0], &dt, sizeof(dt)), (ssize_t)sizeof(dt));
	} else {
		fprintf(stderr, "itest harden: not root, so no second uid: the other-uid part of "
				"imm_scoped_to_region did not run\n");
	}

	/* The flood: distinct values, zero bytes, through the flooded client's descriptor. */
	for (int i = 0; i < FLOOD; i++) {
		jobs[i] = itest_job(100 + (uint64_t)i, RDMAX_OP_WRITE, src, 0, &dx, 0, 0);
		jobs[i].flags = RDMAX_JOB_IMM;
		jobs[i].imm = 1000 + (uint32_t)i;
	}
	ck_assert_int_eq(rdmax_submit(sender, jobs, FLOOD), 0);
	size_t got = itest_collect(sender, evs, FLOOD, 30000, NULL);
	ck_assert_uint_eq(got, FLOOD);
	for (int i = 0; i < FLOOD; i++) {
		ck_assert_msg(evs[i].status == 0, "flood write %" PRIu64 ": %s", evs[i].job_id,
			      rdmax_err_name(evs[i].status));
	}
	/* It fired nobody else's claim of the same value... */
	itest_assert_quiet(bystander, ITEST_QUIET_MS);
	/* ...it counted in the flooded client's namespace... */
	itest_assert_err(rdmax_expect_imm(flooded, 1000, 1), 0);
	itest_assert_err(rdmax_wait_imm(flooded, 1000, ITEST_WAIT_MS), 0);
	/* ...and the bystander's claim fires for its own region. */
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &dv, 0, 1);
	job.flags = RDMAX_JOB_IMM;
	job.imm = 1000;
	struct rdmax_event ev = itest_run_job(sender, &job, ITEST_WAIT_MS);
	ck_assert_int_eq(ev.status, 0);
	itest_assert_err(rdmax_wait_imm(bystander, 1000, ITEST_WAIT_MS), 0);

	if (child > 0) {
		/* Another uid claims and is fired, whatever the flood took. */
		char byte = 'g';
		ck_assert_int_eq(write(to_child[1], &byte, 1), 1);
		struct pollfd pfd = {.fd = from_child[0], .events = POLLIN};
		ck_assert_msg(poll(&pfd, 1, ITEST_WAIT_MS) == 1 &&
				      read(from_child[0], &byte, 1) == 1,
			      "the tenant of uid 65534 could not claim imm 7 after the flood");
		job = itest_job(2, RDMAX_OP_WRITE, src, 0, &dt, 0, 16);
		job.flags = RDMAX_JOB_IMM;
		job.imm = 7;
		ev = itest_run_job(sender, &job, ITEST_WAIT_MS);
		ck_assert_int_eq(ev.status, 0);
		int status;
		ck_assert_int_eq(waitpid(child, &status, 0), child);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "the tenant of uid 65534 failed at step %d (status 0x%x)",
			      WIFEXITED(status) ? WEXITSTATUS(status) : -1, status);
	}
	rdmax_client_close(sender);
	itest_pair_end(flooded, bystander, a, b);
}
END_TEST

/*
 * One client's cancels must not cost another client anything: jobs of client A
 * are cancelled while their frames are on the wire (over verbs: while the NIC
 * holds their work requests) to the same peer that client B writes to. Every
 * job of B completes OK with its bytes, every job of A completes exactly once
 * (OK or CANCELLED), and A's completions come only after the bytes of frames
 * already half sent are out (the WRs completed). Over TCP the target is
 * stopped so that a frame stays half sent; over verbs the jobs run and are
 * cancelled once one of A's jobs is part done.
 */
START_TEST(cancel_mid_frame_spares_other_clients)
{
	const size_t na = 16, nb = 32;
	/*
	 * Over verbs a job's progress shows when a signaled WR completes (every
	 * 16 WRs): with 3 chunks per job some job is part done in between.
	 */
	const bool tcp = strcmp(itest_transport(), "tcp") == 0;
	const uint64_t alen = (tcp ? 4 : 3) * MiB, blen = MiB;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "canceller");
	struct rdmax_client *cc = itest_client(a, "bystander");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *dst =
		itest_alloc(cb, na * alen + nb * blen, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_region *srca = itest_alloc(ca, na * alen, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *srcc = itest_alloc(cc, nb * blen, RDMAX_ACCESS_LOCAL);
	itest_fill(itest_bytes(srca), na * alen, 21);
	itest_fill(itest_bytes(srcc), nb * blen, 22);
	struct rdmax_job ja[16], jc[32];
	struct rdmax_event eva[16], evc[32];

	for (size_t i = 0; i < na; i++) {
		ja[i] = itest_job(1 + i, RDMAX_OP_WRITE, srca, i * alen, &desc, i * alen, alen);
	}
	for (size_t i = 0; i < nb; i++) {
		jc[i] = itest_job(100 + i, RDMAX_OP_WRITE, srcc, i * blen, &desc,
				  na * alen + i * blen, blen);
	}
	/* Connected first, then (TCP) the target stops so a frame of A stays half sent. */
	struct rdmax_job warm = itest_job(99, RDMAX_OP_WRITE, srcc, 0, &desc, na * alen, 4096);
	ck_assert_int_eq(itest_run_job(cc, &warm, ITEST_WAIT_MS).status, 0);
	if (tcp) {
		itest_daemon_pause(b);
	}
	ck_assert_int_eq(rdmax_submit(ca, ja, na), 0);
	if (tcp) {
		/*
		 * A's jobs are in flight (their frames queued first) before B's
		 * arrive: a daemon that takes both clients' rings in one pass
		 * could otherwise fill the stopped peer's socket with B's frames.
		 */
		itest_wait_status(a, "jobs_in_flight", na);
	}
	ck_assert_int_eq(rdmax_submit(cc, jc, nb), 0);
	if (tcp) {
		itest_wait_status(a, "jobs_in_flight", na + nb);
	}
	bool half = false;
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	while (!half && itest_now_ms() < deadline) {
		for (size_t i = 0; i < na && !half; i++) {
			uint64_t done = 0, total = 0;
			if (rdmax_job_status(ca, 1 + i, &done, &total) == 0) {
				half = done > 0 && done < total;
			}
		}
	}
	ck_assert_msg(half, "no job of the canceller was seen part done");
	for (size_t i = 0; i < na; i++) {
		int ret = rdmax_cancel(ca, 1 + i);
		ck_assert_msg(ret == 0 || ret == RDMAX_E_NOT_FOUND, "cancel: %s",
			      rdmax_err_name(ret));
	}
	if (tcp) {
		itest_daemon_resume(b);
	}
	ck_assert_uint_eq(itest_collect(ca, eva, na, ITEST_WAIT_MS, NULL), na);
	ck_assert_uint_eq(itest_collect(cc, evc, nb, ITEST_WAIT_MS, NULL), nb);
	uint8_t seen[16] = {0};
	for (size_t i = 0; i < na; i++) {
		ck_assert_msg(eva[i].job_id >= 1 && eva[i].job_id <= na && !seen[eva[i].job_id - 1],
			      "job %" PRIu64 " of the canceller completed twice or was unknown",
			      eva[i].job_id);
		seen[eva[i].job_id - 1] = 1;
		ck_assert_msg(eva[i].status == 0 || eva[i].status == RDMAX_E_CANCELLED,
			      "cancelled job %" PRIu64 ": %s ('%s')", eva[i].job_id,
			      rdmax_err_name(eva[i].status), eva[i].reason);
	}
	for (size_t i = 0; i < nb; i++) {
		ck_assert_msg(evc[i].status == 0, "bystander job %" PRIu64 " failed: %s ('%s')",
			      evc[i].job_id, rdmax_err_name(evc[i].status), evc[i].reason);
	}
	itest_assert_mem_eq(itest_bytes(dst) + na * alen, itest_bytes(srcc), nb * blen,
			    "the bystander's bytes");
	itest_assert_quiet(ca, ITEST_QUIET_MS);
	rdmax_client_close(ca);
	itest_pair_end(cc, cb, a, b);
}
END_TEST

/*
 * A client that leaves with jobs in flight gives its uid's share back: the
 * uid's next client may fill the share again. A keeper client holds the share
 * open meanwhile.
 */
START_TEST(leaving_client_returns_uid_share)
{
	const size_t k = 8;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_set(a, "limits.per_uid_outstanding_jobs=%zu", k);
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *keeper = itest_client(a, "keeper");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *dst = itest_alloc(cb, k * 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_region *ksrc = itest_alloc(keeper, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_job warm = itest_job(1, RDMAX_OP_WRITE, ksrc, 0, &desc, 0, 4096);
	ck_assert_int_eq(itest_run_job(keeper, &warm, ITEST_WAIT_MS).status, 0);

	for (int round = 0; round < 3; round++) {
		struct rdmax_client *c = itest_client(a, "leaver");
		struct rdmax_region *src = itest_alloc(c, k * 4096, RDMAX_ACCESS_LOCAL);
		struct rdmax_job jobs[8];
		itest_daemon_pause(b);
		for (size_t i = 0; i < k; i++) {
			jobs[i] = itest_job(10 + i, RDMAX_OP_WRITE, src, i * 4096, &desc, i * 4096,
					    4096);
		}
		ck_assert_int_eq(rdmax_submit(c, jobs, k), 0);
		itest_wait_status(a, "jobs_in_flight", k);
		rdmax_client_close(c);
		itest_wait_status(a, "clients", 1);
		itest_daemon_resume(b);
		itest_wait_status(a, "jobs_in_flight", 0);
	}
	/* The share is whole again: the keeper may have k jobs at once. */
	struct rdmax_job jobs[8];
	struct rdmax_event evs[8];
	struct rdmax_region *src = itest_alloc(keeper, k * 4096, RDMAX_ACCESS_LOCAL);
	for (size_t i = 0; i < k; i++) {
		jobs[i] = itest_job(100 + i, RDMAX_OP_WRITE, src, i * 4096, &desc, i * 4096, 4096);
	}
	ck_assert_int_eq(rdmax_submit(keeper, jobs, k), 0);
	ck_assert_uint_eq(itest_collect(keeper, evs, k, ITEST_WAIT_MS, NULL), k);
	for (size_t i = 0; i < k; i++) {
		ck_assert_msg(evs[i].status == 0,
			      "job %" PRIu64 " of the uid's next client: %s ('%s')", evs[i].job_id,
			      rdmax_err_name(evs[i].status), evs[i].reason);
	}
	itest_pair_end(keeper, cb, a, b);
}
END_TEST

/* In a child that became uid: WRITE 4 KiB to desc from a client of socket_path; exit 0 on OK. */
static int other_uid_writes(const char *socket_path, uid_t uid, const struct rdmax_desc *desc)
{
	struct rdmax_client *c;
	struct rdmax_region *r;

	if (setgid(uid) < 0 || setuid(uid) < 0) {
		return 2;
	}
	if (rdmax_client_open(socket_path, "tenant", &c) < 0 ||
	    rdmax_region_alloc_host(c, 4096, RDMAX_ACCESS_LOCAL, &r) < 0) {
		return 3;
	}
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, r, 0, desc, 0, 4096);
	if (rdmax_submit(c, &job, 1) != 0) {
		return 4;
	}
	int status = rdmax_wait_job(c, 1, ITEST_WAIT_MS);
	rdmax_client_close(c);
	return status == 0 ? 0 : 5;
}

/*
 * Issue 12 item 2: descriptors carry endpoints, so a client can make its
 * daemon open connections to many peers. per_uid_peer_connections=2: a uid's
 * jobs open two, the third peer is refused with RESOURCE_EXHAUSTED naming the
 * limit, while its jobs keep using the two it has and another uid still
 * connects; once the connections are evicted, the share is back.
 */
START_TEST(uid_peer_connection_share)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *t[3];
	struct rdmax_desc d[3];
	struct rdmax_region *dst[3];
	struct rdmax_client *ct[3];

	itest_daemon_set(a, "limits.per_uid_peer_connections=2");
	itest_daemon_set(a, "peers.idle_timeout_s=2");
	itest_daemon_start(a);
	for (int i = 0; i < 3; i++) {
		char name[8];
		snprintf(name, sizeof(name), "t%d", i);
		t[i] = itest_daemon_new(name, itest_addr_b());
		itest_daemon_start(t[i]);
		ct[i] = itest_client(t[i], "target");
		dst[i] = itest_alloc(ct[i], 4096, RDMAX_ACCESS_REMOTE_WRITE);
		d[i] = itest_desc(dst[i]);
	}
	struct rdmax_client *c = itest_client(a, "spreader");
	struct rdmax_region *src = itest_alloc(c, 4096, RDMAX_ACCESS_LOCAL);
	itest_fill(itest_bytes(src), 4096, 31);

	for (int i = 0; i < 2; i++) {
		struct rdmax_job job =
			itest_job(1 + (uint64_t)i, RDMAX_OP_WRITE, src, 0, &d[i], 0, 4096);
		struct rdmax_event ev = itest_run_job(c, &job, ITEST_WAIT_MS);
		ck_assert_msg(ev.status == 0, "write to peer %d: %s ('%s')", i,
			      rdmax_err_name(ev.status), ev.reason);
		itest_assert_mem_eq(itest_bytes(dst[i]), itest_bytes(src), 4096, "write");
	}
	struct rdmax_job job = itest_job(3, RDMAX_OP_WRITE, src, 0, &d[2], 0, 4096);
	struct rdmax_event ev = itest_run_job(c, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_msg(strstr(ev.reason, "per_uid_peer_connections"), "reason: '%s'", ev.reason);
	/* A second client of the uid shares the share; existing connections still serve. */
	struct rdmax_client *c2 = itest_client(a, "spreader-2");
	struct rdmax_region *src2 = itest_alloc(c2, 4096, RDMAX_ACCESS_LOCAL);
	job = itest_job(4, RDMAX_OP_WRITE, src2, 0, &d[2], 0, 4096);
	itest_assert_err(itest_run_job(c2, &job, ITEST_WAIT_MS).status, RDMAX_E_RESOURCE_EXHAUSTED);
	job = itest_job(5, RDMAX_OP_WRITE, src, 0, &d[0], 0, 4096);
	itest_assert_err(itest_run_job(c, &job, ITEST_WAIT_MS).status, 0);

	if (geteuid() == 0) {
		itest_open_socket_dirs(a);
		pid_t parent = getpid();
		pid_t child = fork();
		ck_assert_int_ge(child, 0);
		if (child == 0) {
			itest_child_setup(parent);
			_exit(other_uid_writes(a->socket_path, 65534, &d[2]));
		}
		int status;
		ck_assert_int_eq(waitpid(child, &status, 0), child);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "a client of uid 65534 could not reach the third peer (step %d)",
			      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	} else {
		fprintf(stderr, "itest harden: not root, so no second uid: the other-uid part of "
				"uid_peer_connection_share did not run\n");
	}
	/* Idle connections are evicted and counted back: the uid reaches the third peer. */
	itest_wait_status(a, "connections", 0);
	job = itest_job(6, RDMAX_OP_WRITE, src, 0, &d[2], 0, 4096);
	ev = itest_run_job(c, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "write to peer 2 after eviction: %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
	itest_assert_mem_eq(itest_bytes(dst[2]), itest_bytes(src), 4096, "write after eviction");

	rdmax_client_close(c);
	rdmax_client_close(c2);
	itest_daemon_stop(a);
	itest_daemon_free(a);
	for (int i = 0; i < 3; i++) {
		rdmax_client_close(ct[i]);
		itest_daemon_stop(t[i]);
		itest_daemon_free(t[i]);
	}
}
END_TEST

TCase *itest_tcase_harden(void)
{
	TCase *tc = tcase_create("harden");

	tcase_set_timeout(tc, 180);
	tcase_add_test(tc, flood_never_reading);
	tcase_add_test(tc, uid_shares_and_hello_timeout);
	tcase_add_test(tc, bad_datagrams_named);
	tcase_add_test(tc, admin_bounded_idle);
	tcase_add_test(tc, imm_scoped_to_region);
	tcase_add_test(tc, uid_peer_connection_share);
	ITEST_ADD_STALLING_TEST(tc, duplicate_job_id_one_completion);
	ITEST_ADD_STALLING_TEST(tc, final_completion_connecting);
	ITEST_ADD_STALLING_TEST(tc, final_completion_mid_stream);
	ITEST_ADD_TEST_IF(tc, final_completion_imm_write,
			  strcmp(itest_transport(), "verbs") == 0 && itest_stopped_peer_stalls(),
			  "over TCP a frame the kernel took may still land; over verbs it needs "
			  "RDMAX_TEST_FABRIC_STALL");
	ITEST_ADD_STALLING_TEST(tc, leaving_client_returns_uid_share);
	tcase_add_test(tc, cancel_mid_frame_spares_other_clients);
	return tc;
}
