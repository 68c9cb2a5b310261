/* SPDX-License-Identifier: MIT */
/*
 * Raw protocol client for the abuse tests: a SOCK_SEQPACKET socket, the
 * generated protobuf-c code, and nothing of librdmax, so the tests can send
 * what the library never would. It never retries and never hides an error:
 * what the daemon answers is what the test sees.
 */
#include "raw.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

/* Large enough for any reply of a daemon whose message limit is the default or less. */
#define RAW_RX_MAX (1u << 20)

int raw_err_from_status(int status)
{
	return status == 0 ? 0 : -(RDMAX_ERR_BASE + status);
}

int raw_connect(const char *socket_path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	ck_assert_msg(fd >= 0, "socket(AF_UNIX, SOCK_SEQPACKET) failed: %s", strerror(errno));
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path);
	ck_assert_msg(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0,
		      "connect('%s') failed: %s", socket_path, strerror(errno));
	return fd;
}

int raw_send(int fd, const void *buf, size_t len, const int *fds, size_t n_fds)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	char *control = NULL;

	if (n_fds > 0) {
		size_t space = CMSG_SPACE(sizeof(int) * n_fds);
		control = calloc(1, space);
		ck_assert_ptr_nonnull(control);
		mh.msg_control = control;
		mh.msg_controllen = space;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
	}
	ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
	int err = errno;
	free(control);
	if (n < 0) {
		return -err;
	}
	ck_assert_msg((size_t)n == len, "sendmsg() sent %zd of %zu bytes", n, len);
	return 0;
}

int raw_try_send_msg(int fd, const Rdmax__V1__ClientMsg *msg, const int *fds, size_t n_fds)
{
	size_t len = rdmax__v1__client_msg__get_packed_size(msg);
	uint8_t *buf = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(buf);
	rdmax__v1__client_msg__pack(msg, buf);
	int ret = raw_send(fd, buf, len, fds, n_fds);
	free(buf);
	return ret;
}

void raw_send_msg(int fd, const Rdmax__V1__ClientMsg *msg, const int *fds, size_t n_fds)
{
	int ret = raw_try_send_msg(fd, msg, fds, n_fds);

	ck_assert_msg(ret == 0, "sendmsg() of a %zu-byte ClientMsg failed: %s",
		      rdmax__v1__client_msg__get_packed_size(msg), strerror(-ret));
}

Rdmax__V1__DaemonMsg *raw_recv(int fd, int timeout_ms, bool *ret_closed)
{
	static uint8_t *buf;
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;

	*ret_closed = false;
	if (!buf) {
		buf = malloc(RAW_RX_MAX);
		ck_assert_ptr_nonnull(buf);
	}
	for (;;) {
		uint64_t now = itest_now_ms();
		if (now >= deadline) {
			return NULL;
		}
		int r = poll(&pfd, 1, (int)(deadline - now));
		if (r < 0 && errno == EINTR) {
			continue;
		}
		ck_assert_msg(r >= 0, "poll() failed: %s", strerror(errno));
		if (r == 0) {
			return NULL;
		}
		ssize_t n = recv(fd, buf, RAW_RX_MAX, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			continue;
		}
		if (n == 0 || (n < 0 && errno == ECONNRESET)) {
			*ret_closed = true;
			return NULL;
		}
		ck_assert_msg(n > 0, "recv() failed: %s", strerror(errno));
		Rdmax__V1__DaemonMsg *m = rdmax__v1__daemon_msg__unpack(NULL, (size_t)n, buf);
		ck_assert_msg(m != NULL, "the daemon sent %zd bytes that are not a DaemonMsg", n);
		return m;
	}
}

static char g_last_message[512];

const char *raw_last_error_message(void)
{
	return g_last_message;
}

int raw_recv_status_at(const char *file, int line, int fd, uint64_t seq)
{
	bool closed;
	Rdmax__V1__DaemonMsg *m = raw_recv(fd, ITEST_WAIT_MS, &closed);

	ck_assert_msg(m != NULL, "%s:%d: expected an Error reply to seq %" PRIu64 ", got %s", file,
		      line, seq, closed ? "the connection closed" : "nothing");
	ck_assert_msg(m->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR,
		      "%s:%d: expected an Error reply to seq %" PRIu64 ", got DaemonMsg body %d",
		      file, line, seq, (int)m->body_case);
	int got = raw_err_from_status((int)m->error->status);
	snprintf(g_last_message, sizeof(g_last_message), "%s",
		 m->error->message ? m->error->message : "");
	if (got != 0) {
		ck_assert_msg(m->error->message && m->error->message[0],
			      "%s:%d: error reply %s has no message", file, line,
			      rdmax_err_name(got));
	}
	uint64_t got_seq = m->has_seq ? m->seq : 0;
	ck_assert_msg(got_seq == seq,
		      "%s:%d: reply with status %s ('%s') carries seq %" PRIu64
		      ", expected %" PRIu64,
		      file, line, rdmax_err_name(got), m->error->message ? m->error->message : "",
		      got_seq, seq);
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	return got;
}

void raw_expect_status_at(const char *file, int line, int fd, uint64_t seq, int err)
{
	int got = raw_recv_status_at(file, line, fd, seq);

	ck_assert_msg(got == err, "%s:%d: reply to seq %" PRIu64 ": status %s, expected %s", file,
		      line, seq, rdmax_err_name(got), rdmax_err_name(err));
}

void raw_expect_closed(int fd, int timeout_ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;
	bool closed = false;

	while (!closed) {
		uint64_t now = itest_now_ms();
		ck_assert_msg(now < deadline, "the daemon kept the connection open for %d ms",
			      timeout_ms);
		Rdmax__V1__DaemonMsg *m = raw_recv(fd, (int)(deadline - now), &closed);
		if (m) {
			rdmax__v1__daemon_msg__free_unpacked(m, NULL);
		}
	}
}

void raw_hello(int fd)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__Hello hello = RDMAX__V1__HELLO__INIT;
	bool closed;

	hello.protocol_version = RDMAX_PROTOCOL_VERSION;
	hello.client_name = "itest-raw";
	msg.has_seq = 1;
	msg.seq = 1;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_HELLO;
	msg.hello = &hello;
	raw_send_msg(fd, &msg, NULL, 0);
	Rdmax__V1__DaemonMsg *m = raw_recv(fd, ITEST_WAIT_MS, &closed);
	ck_assert_msg(m != NULL, "no Welcome (%s)", closed ? "closed" : "timeout");
	ck_assert_msg(m->body_case == RDMAX__V1__DAEMON_MSG__BODY_WELCOME,
		      "expected Welcome, got body %d", (int)m->body_case);
	ck_assert_uint_eq(m->welcome->protocol_version, RDMAX_PROTOCOL_VERSION);
	ck_assert(m->has_seq && m->seq == 1);
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);
}

int raw_wait_completion(int fd, uint64_t job_id, int timeout_ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;
	bool closed;

	for (;;) {
		uint64_t now = itest_now_ms();
		ck_assert_msg(now < deadline, "job %" PRIu64 " got no completion within %d ms",
			      job_id, timeout_ms);
		Rdmax__V1__DaemonMsg *m = raw_recv(fd, (int)(deadline - now), &closed);
		ck_assert_msg(!closed,
			      "the daemon closed the connection before job %" PRIu64 " completed",
			      job_id);
		if (!m) {
			continue;
		}
		ck_assert_msg(m->body_case == RDMAX__V1__DAEMON_MSG__BODY_COMPLETIONS,
			      "expected Completions for job %" PRIu64 ", got body %d", job_id,
			      (int)m->body_case);
		int status = 1;
		for (size_t i = 0; i < m->completions->n_completions; i++) {
			const Rdmax__V1__Completion *c = m->completions->completions[i];
			ck_assert_msg(c->job_id == job_id, "completion for unexpected job %" PRIu64,
				      c->job_id);
			ck_assert_msg(status == 1, "two completions for job %" PRIu64, job_id);
			status = raw_err_from_status((int)c->status);
			if (status != 0) {
				ck_assert_msg(c->message && c->message[0],
					      "job %" PRIu64 " failed with %s but no message",
					      job_id, rdmax_err_name(status));
			}
		}
		rdmax__v1__daemon_msg__free_unpacked(m, NULL);
		if (status != 1) {
			return status;
		}
	}
}

size_t raw_collect(int fd, uint64_t *ret_ids, int *ret_statuses, size_t n, int timeout_ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;
	size_t got = 0;
	bool closed;

	while (got < n) {
		uint64_t now = itest_now_ms();
		if (now >= deadline) {
			break;
		}
		Rdmax__V1__DaemonMsg *m = raw_recv(fd, (int)(deadline - now), &closed);
		ck_assert_msg(!closed,
			      "the daemon closed the connection after %zu of %zu "
			      "completions",
			      got, n);
		if (!m) {
			continue;
		}
		ck_assert_msg(m->body_case == RDMAX__V1__DAEMON_MSG__BODY_COMPLETIONS,
			      "expected Completions, got body %d", (int)m->body_case);
		for (size_t i = 0; i < m->completions->n_completions; i++) {
			const Rdmax__V1__Completion *c = m->completions->completions[i];
			ck_assert_msg(got < n, "more than %zu completions (job %" PRIu64 ")", n,
				      c->job_id);
			ret_ids[got] = c->job_id;
			ret_statuses[got] = raw_err_from_status((int)c->status);
			got++;
		}
		rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	}
	return got;
}

int raw_memfd(const char *name, size_t size, bool seal)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_msg(fd >= 0, "memfd_create() failed: %s", strerror(errno));
	ck_assert_msg(ftruncate(fd, (off_t)size) == 0, "ftruncate() failed: %s", strerror(errno));
	if (seal) {
		ck_assert_msg(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, "F_ADD_SEALS failed: %s",
			      strerror(errno));
	}
	return fd;
}
