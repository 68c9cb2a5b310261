/* SPDX-License-Identifier: MIT */
/*
 * Case "raw": protocol abuse on the daemon's client socket by a raw client
 * that sends what librdmax never would. Each refusal is asserted by its
 * status, and after each test the daemon must still serve a normal client
 * and hold no more file descriptors than before (every fd a client sent is
 * closed, whatever happened to its message).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"

/* A normal client can still register memory and move bytes on this daemon. */
static void assert_serves(struct itest_daemon *d)
{
	struct rdmax_client *c = itest_client(d, "itest-after-abuse");
	struct rdmax_region *src = itest_alloc(c, 8192, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(c, 8192, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);

	itest_fill(itest_bytes(src), 8192, 71);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 8192);
	struct rdmax_event ev = itest_run_job(c, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "daemon no longer moves bytes after abuse: %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 8192, "WRITE after abuse");
	rdmax_client_close(c);
}

/* Start a daemon, check it serves, and note its fd count with no client connected. */
static struct itest_daemon *start_daemon(int *ret_fds, const char *set)
{
	struct itest_daemon *d = itest_daemon_new("raw", itest_addr_a());

	if (set) {
		itest_daemon_set(d, "%s", set);
	}
	itest_daemon_start(d);
	assert_serves(d);
	/* The closed client's session goes away asynchronously. */
	int n = itest_daemon_fd_count(d), prev = -1;
	for (int i = 0; i < 100 && n != prev; i++) {
		itest_sleep_ms(20);
		prev = n;
		n = itest_daemon_fd_count(d);
	}
	*ret_fds = n;
	return d;
}

static void finish(struct itest_daemon *d, int fds_before)
{
	assert_serves(d);
	uint64_t deadline = itest_now_ms() + 3000;
	int n;
	/*
	 * A leak shows as more fds; fewer is fine (the count before may still
	 * have held a closing session's socket on a loaded machine).
	 */
	while ((n = itest_daemon_fd_count(d)) > fds_before && itest_now_ms() < deadline) {
		itest_sleep_ms(20);
	}
	ck_assert_msg(n <= fds_before,
		      "the daemon holds %d file descriptors after the abuse, %d before", n,
		      fds_before);
	itest_daemon_stop(d);
	itest_daemon_free(d);
}

static void send_register(int fd, uint64_t seq, Rdmax__V1__RegionKind kind, uint32_t access,
			  uint64_t offset, uint64_t length, uint32_t fd_index, const int *fds,
			  size_t n_fds)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__RegisterRegion rr = RDMAX__V1__REGISTER_REGION__INIT;

	rr.kind = kind;
	rr.access = access;
	rr.offset = offset;
	rr.length = length;
	rr.has_fd_index = 1;
	rr.fd_index = fd_index;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION;
	msg.register_region = &rr;
	raw_send_msg(fd, &msg, fds, n_fds);
}

/* Receive a RegionReply for seq; returns the region id and copies the descriptor. */
static uint64_t expect_region(int fd, uint64_t seq, uint8_t *desc, size_t *desc_len)
{
	bool closed;
	Rdmax__V1__DaemonMsg *m = raw_recv(fd, ITEST_WAIT_MS, &closed);

	ck_assert_msg(m != NULL, "no reply to RegisterRegion (%s)", closed ? "closed" : "timeout");
	if (m->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR) {
		ck_abort_msg("RegisterRegion refused: %s ('%s')",
			     rdmax_err_name(raw_err_from_status((int)m->error->status)),
			     m->error->message ? m->error->message : "");
	}
	ck_assert_int_eq(m->body_case, RDMAX__V1__DAEMON_MSG__BODY_REGION);
	ck_assert(m->has_seq && m->seq == seq);
	uint64_t id = m->region->region_id;
	if (desc) {
		ck_assert_uint_le(m->region->desc.len, RDMAX_DESC_MAX);
		memcpy(desc, m->region->desc.data, m->region->desc.len);
		*desc_len = m->region->desc.len;
	}
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	return id;
}

static void send_simple(int fd, uint64_t seq, Rdmax__V1__ClientMsg__BodyCase body, void *payload)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	msg.has_seq = seq != 0;
	msg.seq = seq;
	msg.body_case = body;
	switch (body) {
	case RDMAX__V1__CLIENT_MSG__BODY_HELLO:
		msg.hello = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION:
		msg.deregister_region = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_SUBMIT:
		msg.submit = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM:
		msg.expect_imm = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_IMM_RELEASE:
		msg.imm_release = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_CANCEL:
		msg.cancel = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS:
		msg.job_status = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE:
		msg.peer_group_create = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_DESTROY:
		msg.peer_group_destroy = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN:
		msg.mailbox_open = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_CLOSE:
		msg.mailbox_close = payload;
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_POOL_ALLOC:
		msg.pool_alloc = payload;
		break;
	default:
		break;
	}
	raw_send_msg(fd, &msg, NULL, 0);
}

static void send_jobs(int fd, uint64_t seq, Rdmax__V1__Job **jobs, size_t n)
{
	Rdmax__V1__Submit submit = RDMAX__V1__SUBMIT__INIT;

	submit.n_jobs = n;
	submit.jobs = jobs;
	send_simple(fd, seq, RDMAX__V1__CLIENT_MSG__BODY_SUBMIT, &submit);
}

static void assert_no_message(int fd, int ms)
{
	bool closed;
	Rdmax__V1__DaemonMsg *m = raw_recv(fd, ms, &closed);

	ck_assert_msg(!closed, "the daemon closed the connection");
	ck_assert_msg(m == NULL, "unexpected DaemonMsg body %d", m ? (int)m->body_case : 0);
}

/* ------------------------------------------------------------------- tests */

START_TEST(garbage_bytes)
{
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
				       0xff, 0xff, 0x01, 0x0a, 0xfe, 0x00, 0x13};
	int fds_before;
	struct itest_daemon *d = start_daemon(&fds_before, NULL);

	/* Before Hello... */
	int fd = raw_connect(d->socket_path);
	ck_assert_int_eq(raw_send(fd, junk, sizeof(junk), NULL, 0), 0);
	raw_expect_status(fd, 0, RDMAX_E_PROTOCOL_ERROR);
	close(fd);

	/* ...and after it; with an fd attached, which must not leak. */
	fd = raw_connect(d->socket_path);
	raw_hello(fd);
	ck_assert_int_eq(raw_send(fd, junk, sizeof(junk), NULL, 0), 0);
	raw_expect_status(fd, 0, RDMAX_E_PROTOCOL_ERROR);
	int memfd = raw_memfd("itest-garbage", 4096, true);
	if (raw_send(fd, junk, sizeof(junk), &memfd, 1) == 0) {
		bool closed;
		Rdmax__V1__DaemonMsg *m = raw_recv(fd, ITEST_WAIT_MS, &closed);
		if (m) {
			ck_assert_int_eq(m->body_case, RDMAX__V1__DAEMON_MSG__BODY_ERROR);
			itest_assert_err(raw_err_from_status((int)m->error->status),
					 RDMAX_E_PROTOCOL_ERROR);
			rdmax__v1__daemon_msg__free_unpacked(m, NULL);
		}
	}
	close(memfd);
	close(fd);

	/* A well-formed message without a body. */
	fd = raw_connect(d->socket_path);
	raw_hello(fd);
	Rdmax__V1__ClientMsg empty = RDMAX__V1__CLIENT_MSG__INIT;
	empty.has_seq = 1;
	empty.seq = 9;
	raw_send_msg(fd, &empty, NULL, 0);
	raw_expect_status(fd, 9, RDMAX_E_PROTOCOL_ERROR);
	close(fd);
	finish(d, fds_before);
}
END_TEST

START_TEST(before_hello)
{
	int fds_before;
	struct itest_daemon *d = start_daemon(&fds_before, NULL);

	/* Registration with an fd before Hello: refused, connection closed, fd not kept. */
	int fd = raw_connect(d->socket_path);
	int memfd = raw_memfd("itest-before-hello", 65536, true);
	send_register(fd, 3, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 0, &memfd, 1);
	close(memfd);
	raw_expect_status(fd, 3, RDMAX_E_PROTOCOL_ERROR);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);

	/* A Submit before Hello. */
	fd = raw_connect(d->socket_path);
	send_jobs(fd, 4, NULL, 0);
	raw_expect_status(fd, 4, RDMAX_E_PROTOCOL_ERROR);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);

	/* A Hello of a protocol version the daemon does not speak. */
	fd = raw_connect(d->socket_path);
	Rdmax__V1__Hello hello = RDMAX__V1__HELLO__INIT;
	hello.protocol_version = 99;
	send_simple(fd, 5, RDMAX__V1__CLIENT_MSG__BODY_HELLO, &hello);
	raw_expect_status(fd, 5, RDMAX_E_PROTOCOL_ERROR);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);

	/* Hello twice. */
	fd = raw_connect(d->socket_path);
	raw_hello(fd);
	hello.protocol_version = RDMAX_PROTOCOL_VERSION;
	send_simple(fd, 6, RDMAX__V1__CLIENT_MSG__BODY_HELLO, &hello);
	raw_expect_status(fd, 6, RDMAX_E_PROTOCOL_ERROR);
	close(fd);
	finish(d, fds_before);
}
END_TEST

static size_t varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

/*
 * An ExpectImm request of exactly `size` bytes: the message followed by an
 * unknown length-delimited field (number 99) as padding, which decoders skip.
 */
static uint8_t *padded_expect_imm(uint64_t seq, size_t size)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__ExpectImm ei = RDMAX__V1__EXPECT_IMM__INIT;
	uint8_t *buf = calloc(1, size);

	ck_assert_ptr_nonnull(buf);
	ei.imm = 77;
	ei.count = 1;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM;
	msg.expect_imm = &ei;
	size_t base = rdmax__v1__client_msg__pack(&msg, buf);
	size_t room = size - base - 2; /* 2: tag of field 99, wire type 2 */
	size_t pad = room - varint_len(room);
	if (varint_len(pad) + pad != room) {
		pad--;
	}
	ck_assert_uint_eq(varint_len(pad) + pad, room);
	uint8_t *p = buf + base;
	p += put_varint(p, (99u << 3) | 2u);
	p += put_varint(p, pad);
	ck_assert_uint_eq((size_t)(p - buf) + pad, size);
	return buf;
}

START_TEST(oversized_message)
{
	const size_t limit = 64 * KiB;
	int fds_before;
	struct itest_daemon *d = start_daemon(&fds_before, "limits.max_message_bytes=64K");

	/* A message of exactly the limit is served. */
	int fd = raw_connect(d->socket_path);
	raw_hello(fd);
	uint8_t *msg = padded_expect_imm(7, limit);
	ck_assert_int_eq(raw_send(fd, msg, limit, NULL, 0), 0);
	raw_expect_status(fd, 7, 0);
	free(msg);

	/* One byte more is refused, and the connection closed. */
	msg = padded_expect_imm(8, limit + 1);
	ck_assert_int_eq(raw_send(fd, msg, limit + 1, NULL, 0), 0);
	raw_expect_status(fd, 0, RDMAX_E_RESOURCE_EXHAUSTED);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);
	free(msg);

	/* Far larger, with an fd attached. */
	fd = raw_connect(d->socket_path);
	raw_hello(fd);
	msg = calloc(1, 100 * KiB);
	ck_assert_ptr_nonnull(msg);
	int memfd = raw_memfd("itest-oversize", 4096, true);
	ck_assert_int_eq(raw_send(fd, msg, 100 * KiB, &memfd, 1), 0);
	close(memfd);
	raw_expect_status(fd, 0, RDMAX_E_RESOURCE_EXHAUSTED);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);
	free(msg);
	finish(d, fds_before);
}
END_TEST

START_TEST(too_many_fds)
{
	int fds_before, memfds[8];
	struct itest_daemon *d = start_daemon(&fds_before, "limits.max_fds_per_message=4");

	for (int i = 0; i < 8; i++) {
		memfds[i] = raw_memfd("itest-many-fds", 65536, true);
	}
	/* Exactly the limit: the region uses the last of the four. */
	int fd = raw_connect(d->socket_path);
	raw_hello(fd);
	send_register(fd, 2, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 3, memfds, 4);
	expect_region(fd, 2, NULL, NULL);

	/* Six: refused and closed; none of the six is kept. */
	send_register(fd, 3, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 0, memfds, 6);
	raw_expect_status(fd, 0, RDMAX_E_RESOURCE_EXHAUSTED);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);

	/* Eight, on a fresh connection. */
	fd = raw_connect(d->socket_path);
	raw_hello(fd);
	send_register(fd, 4, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 0, memfds, 8);
	raw_expect_status(fd, 0, RDMAX_E_RESOURCE_EXHAUSTED);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);
	for (int i = 0; i < 8; i++) {
		close(memfds[i]);
	}
	finish(d, fds_before);
}
END_TEST

START_TEST(bad_register)
{
	int fds_before, pipefd[2];
	uint8_t desc[RDMAX_DESC_MAX];
	size_t desc_len = 0;
	struct itest_daemon *d = start_daemon(&fds_before, NULL);
	int fd = raw_connect(d->socket_path);

	raw_hello(fd);
	/* A memfd its owner could still shrink under the daemon's mapping. */
	int unsealed = raw_memfd("itest-unsealed", 65536, false);
	send_register(fd, 10, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 0, &unsealed, 1);
	raw_expect_status(fd, 10, RDMAX_E_PERMISSION_DENIED);
	close(unsealed);

	/* Not a file at all. */
	ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
	send_register(fd, 11, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 4096, 0, pipefd, 1);
	raw_expect_status(fd, 11, RDMAX_E_INVALID_ARGUMENT);
	close(pipefd[0]);
	close(pipefd[1]);

	int sealed = raw_memfd("itest-sealed", 65536, true);
	/* fd_index past the fds the message carries, and no fd at all. */
	send_register(fd, 12, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 1, &sealed, 1);
	raw_expect_status(fd, 12, RDMAX_E_INVALID_ARGUMENT);
	send_register(fd, 13, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 0, NULL, 0);
	raw_expect_status(fd, 13, RDMAX_E_INVALID_ARGUMENT);

	/* Ranges past the end of the file. */
	send_register(fd, 14, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65537, 0, &sealed, 1);
	raw_expect_status(fd, 14, RDMAX_E_OUT_OF_RANGE);
	send_register(fd, 15, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 65536, 4096, 0, &sealed,
		      1);
	raw_expect_status(fd, 15, RDMAX_E_OUT_OF_RANGE);
	send_register(fd, 16, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 8192, 61440, 0, &sealed,
		      1);
	raw_expect_status(fd, 16, RDMAX_E_OUT_OF_RANGE);

	/* Zero length, unknown access bits, and a memfd passed off as GPU memory. */
	send_register(fd, 17, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 0, 0, &sealed, 1);
	raw_expect_status(fd, 17, RDMAX_E_INVALID_ARGUMENT);
	send_register(fd, 18, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0x80, 0, 4096, 0, &sealed, 1);
	raw_expect_status(fd, 18, RDMAX_E_INVALID_ARGUMENT);
	/* A kind this daemon does not know is named by its number. */
	send_register(fd, 30, (Rdmax__V1__RegionKind)99, 0, 0, 4096, 0, &sealed, 1);
	raw_expect_status(fd, 30, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_msg(strstr(raw_last_error_message(), "unknown region kind 99"),
		      "unknown kind answered '%s'", raw_last_error_message());
	send_register(fd, 19, RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF, 0, 0, 4096, 0, &sealed, 1);
	/* TCP: no RDMA device; Soft-RoCE: no dma-buf; a real NIC: not a dma-buf. */
	int status = raw_recv_status(fd, 19);
	ck_assert_msg(status == RDMAX_E_GPU_NEEDS_RDMA || status == RDMAX_E_GPU_NO_DMABUF ||
			      status == RDMAX_E_INVALID_ARGUMENT,
		      "GPU_DMABUF region from a memfd: %s", rdmax_err_name(status));

	/* Remote write access to memory the client only let the daemon read. */
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", sealed);
	int readonly = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_msg(readonly >= 0, "open('%s') failed: %s", path, strerror(errno));
	send_register(fd, 20, RDMAX__V1__REGION_KIND__REGION_HOST_FD,
		      RDMAX__V1__ACCESS__ACCESS_REMOTE_WRITE, 0, 4096, 0, &readonly, 1);
	raw_expect_status(fd, 20, RDMAX_E_PERMISSION_DENIED);
	close(readonly);

	/* The same fd, used properly, registers; a sub-range at a page offset too. */
	send_register(fd, 21, RDMAX__V1__REGION_KIND__REGION_HOST_FD,
		      RDMAX__V1__ACCESS__ACCESS_REMOTE_WRITE, 0, 65536, 0, &sealed, 1);
	uint64_t id = expect_region(fd, 21, desc, &desc_len);
	struct rdmax_desc imported;
	ck_assert_int_eq(rdmax_desc_import(desc, desc_len, &imported), 0);
	send_register(fd, 22, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 4096, 8192, 0, &sealed, 1);
	expect_region(fd, 22, NULL, NULL);
	close(sealed);

	/* Deregistration: the region once, then it is unknown. */
	Rdmax__V1__DeregisterRegion dr = RDMAX__V1__DEREGISTER_REGION__INIT;
	dr.region_id = id;
	send_simple(fd, 23, RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION, &dr);
	raw_expect_status(fd, 23, 0);
	send_simple(fd, 24, RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION, &dr);
	raw_expect_status(fd, 24, RDMAX_E_NOT_FOUND);
	dr.region_id = 987654321;
	send_simple(fd, 25, RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION, &dr);
	raw_expect_status(fd, 25, RDMAX_E_NOT_FOUND);
	close(fd);
	finish(d, fds_before);
}
END_TEST

START_TEST(bad_jobs)
{
	int fds_before;
	uint8_t desc[RDMAX_DESC_MAX];
	size_t desc_len = 0;
	struct itest_daemon *d = start_daemon(&fds_before, "limits.max_jobs_per_submit=8");
	int fd = raw_connect(d->socket_path);

	raw_hello(fd);
	int memfd = raw_memfd("itest-jobs", 65536, true);
	send_register(fd, 2, RDMAX__V1__REGION_KIND__REGION_HOST_FD,
		      RDMAX__V1__ACCESS__ACCESS_REMOTE_WRITE, 0, 65536, 0, &memfd, 1);
	uint64_t region = expect_region(fd, 2, desc, &desc_len);

	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;
	w.local_region = region;
	w.local_offset = 0;
	w.length = 4096;
	w.remote_desc.data = desc;
	w.remote_desc.len = desc_len;
	w.remote_offset = 8192;
	Rdmax__V1__Job jobs[9], *ptrs[9];
	for (int i = 0; i < 9; i++) {
		Rdmax__V1__Job init = RDMAX__V1__JOB__INIT;
		jobs[i] = init;
		jobs[i].job_id = 100 + (uint64_t)i;
		jobs[i].kind_case = RDMAX__V1__JOB__KIND_WRITE;
		jobs[i].write = &w;
		ptrs[i] = &jobs[i];
	}
	/* Too many jobs in one Submit: the whole message is refused, no job runs. */
	send_jobs(fd, 3, ptrs, 9);
	raw_expect_status(fd, 3, RDMAX_E_RESOURCE_EXHAUSTED);
	assert_no_message(fd, 200);

	uint8_t *mem = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	ck_assert(mem != MAP_FAILED);

	/*
	 * Job kinds beyond WRITE and READ: implemented or not, each gets exactly
	 * one completion, and when it claims success the pages are there.
	 */
	Rdmax__V1__PagedWriteJob pw = RDMAX__V1__PAGED_WRITE_JOB__INIT;
	Rdmax__V1__PageList src = RDMAX__V1__PAGE_LIST__INIT, dst = RDMAX__V1__PAGE_LIST__INIT;
	uint32_t pages[] = {0, 1};
	src.n_indices = dst.n_indices = 2;
	src.indices = dst.indices = pages;
	dst.has_offset = 1;
	dst.offset = 32768;
	itest_fill(mem, 8192, 82);
	memset(mem + 32768, 0, 8192);
	pw.local_region = region;
	pw.page_len = 4096;
	pw.src = &src;
	pw.dst = &dst;
	pw.remote_desc = w.remote_desc;
	jobs[0].kind_case = RDMAX__V1__JOB__KIND_PAGED_WRITE;
	jobs[0].paged_write = &pw;
	send_jobs(fd, 4, ptrs, 1);
	int status = raw_wait_completion(fd, 100, ITEST_WAIT_MS);
	ck_assert_msg(status == 0 || status == RDMAX_E_UNIMPLEMENTED,
		      "PAGED_WRITE completed with %s", rdmax_err_name(status));
	if (status == 0) {
		itest_assert_mem_eq(mem + 32768, mem, 8192, "PAGED_WRITE by the raw client");
	}
	Rdmax__V1__SendJob sj = RDMAX__V1__SEND_JOB__INIT;
	sj.remote_desc = w.remote_desc;
	sj.mailbox = "itest";
	sj.payload.data = desc;
	sj.payload.len = 16;
	jobs[0].job_id = 101;
	jobs[0].kind_case = RDMAX__V1__JOB__KIND_SEND;
	jobs[0].send = &sj;
	send_jobs(fd, 5, ptrs, 1);
	/* A region descriptor is no mailbox address: a name alone reaches nothing. */
	status = raw_wait_completion(fd, 101, ITEST_WAIT_MS);
	ck_assert_msg(status == RDMAX_E_INVALID_ARGUMENT,
		      "SEND to a region descriptor completed with %s", rdmax_err_name(status));

	/* A job without a kind. */
	jobs[0].job_id = 102;
	jobs[0].kind_case = RDMAX__V1__JOB__KIND__NOT_SET;
	send_jobs(fd, 6, ptrs, 1);
	itest_assert_err(raw_wait_completion(fd, 102, ITEST_WAIT_MS), RDMAX_E_INVALID_ARGUMENT);

	/* Garbage where the descriptor goes. */
	static uint8_t junk[] = {0x08, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x22, 0x40};
	Rdmax__V1__WriteJob wg = w;
	wg.remote_desc.data = junk;
	wg.remote_desc.len = sizeof(junk);
	jobs[0].job_id = 103;
	jobs[0].kind_case = RDMAX__V1__JOB__KIND_WRITE;
	jobs[0].write = &wg;
	send_jobs(fd, 7, ptrs, 1);
	itest_assert_err(raw_wait_completion(fd, 103, ITEST_WAIT_MS), RDMAX_E_INVALID_ARGUMENT);
	wg.remote_desc.len = 0;
	jobs[0].job_id = 104;
	send_jobs(fd, 8, ptrs, 1);
	itest_assert_err(raw_wait_completion(fd, 104, ITEST_WAIT_MS), RDMAX_E_INVALID_ARGUMENT);

	/* A local region id that does not exist. */
	Rdmax__V1__WriteJob wu = w;
	wu.local_region = 424242;
	jobs[0].job_id = 105;
	jobs[0].write = &wu;
	send_jobs(fd, 9, ptrs, 1);
	itest_assert_err(raw_wait_completion(fd, 105, ITEST_WAIT_MS), RDMAX_E_NOT_FOUND);

	/* A job id the daemon cannot track. */
	jobs[0].job_id = UINT64_MAX;
	jobs[0].write = &w;
	send_jobs(fd, 10, ptrs, 1);
	itest_assert_err(raw_wait_completion(fd, UINT64_MAX, ITEST_WAIT_MS),
			 RDMAX_E_INVALID_ARGUMENT);

	/*
	 * Requests beyond regions and jobs, in forms that are wrong whether or
	 * not this daemon implements them: a clear refusal, never silence.
	 */
	Rdmax__V1__PoolAlloc pa = RDMAX__V1__POOL_ALLOC__INIT;
	pa.pool_id = 987654;
	pa.length = 4096;
	send_simple(fd, 11, RDMAX__V1__CLIENT_MSG__BODY_POOL_ALLOC, &pa);
	status = raw_recv_status(fd, 11);
	ck_assert_msg(status == RDMAX_E_NOT_FOUND || status == RDMAX_E_UNIMPLEMENTED,
		      "PoolAlloc from a pool that does not exist: %s", rdmax_err_name(status));
	Rdmax__V1__PeerGroupDestroy pgd = RDMAX__V1__PEER_GROUP_DESTROY__INIT;
	pgd.peer_group = 777;
	send_simple(fd, 12, RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_DESTROY, &pgd);
	status = raw_recv_status(fd, 12);
	ck_assert_msg(status == RDMAX_E_NOT_FOUND || status == RDMAX_E_UNIMPLEMENTED,
		      "PeerGroupDestroy of an unknown group: %s", rdmax_err_name(status));
	Rdmax__V1__PeerGroupCreate pg = RDMAX__V1__PEER_GROUP_CREATE__INIT;
	ProtobufCBinaryData bad_desc = {.len = sizeof(junk), .data = junk};
	pg.n_remote_descs = 1;
	pg.remote_descs = &bad_desc;
	send_simple(fd, 13, RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE, &pg);
	status = raw_recv_status(fd, 13);
	ck_assert_msg(status == RDMAX_E_INVALID_ARGUMENT || status == RDMAX_E_UNIMPLEMENTED,
		      "PeerGroupCreate with a garbage descriptor: %s", rdmax_err_name(status));
	Rdmax__V1__MailboxOpen mo = RDMAX__V1__MAILBOX_OPEN__INIT;
	mo.name = "bad name\x01";
	send_simple(fd, 14, RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN, &mo);
	status = raw_recv_status(fd, 14);
	ck_assert_msg(status == RDMAX_E_INVALID_ARGUMENT || status == RDMAX_E_UNIMPLEMENTED,
		      "MailboxOpen with a control character in the name: %s",
		      rdmax_err_name(status));
	/* Without want_address (a library from before addresses): opened, answered OK. */
	mo.name = "raw-box";
	send_simple(fd, 40, RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN, &mo);
	raw_expect_status(fd, 40, 0);
	mo.has_want_address = 1;
	mo.want_address = 1;
	send_simple(fd, 41, RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN, &mo);
	raw_expect_status(fd, 41, RDMAX_E_ALREADY_EXISTS);
	Rdmax__V1__MailboxClose mc = RDMAX__V1__MAILBOX_CLOSE__INIT;
	mc.name = "never-opened";
	send_simple(fd, 15, RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_CLOSE, &mc);
	status = raw_recv_status(fd, 15);
	ck_assert_msg(status == RDMAX_E_NOT_FOUND || status == RDMAX_E_UNIMPLEMENTED,
		      "MailboxClose of a mailbox never opened: %s", rdmax_err_name(status));

	/* Cancel and status of a job that is not in flight. */
	Rdmax__V1__Cancel cancel = RDMAX__V1__CANCEL__INIT;
	cancel.job_id = 5555;
	send_simple(fd, 16, RDMAX__V1__CLIENT_MSG__BODY_CANCEL, &cancel);
	raw_expect_status(fd, 16, RDMAX_E_NOT_FOUND);
	Rdmax__V1__JobStatusQuery q = RDMAX__V1__JOB_STATUS_QUERY__INIT;
	q.job_id = 5555;
	send_simple(fd, 17, RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS, &q);
	bool closed;
	Rdmax__V1__DaemonMsg *m = raw_recv(fd, ITEST_WAIT_MS, &closed);
	ck_assert_ptr_nonnull(m);
	ck_assert_int_eq(m->body_case, RDMAX__V1__DAEMON_MSG__BODY_JOB_STATUS);
	ck_assert(m->has_seq && m->seq == 17);
	ck_assert(!m->job_status->in_flight);
	rdmax__v1__daemon_msg__free_unpacked(m, NULL);

	/* ExpectImm with count 0 is meaningless. */
	Rdmax__V1__ExpectImm ei = RDMAX__V1__EXPECT_IMM__INIT;
	ei.imm = 3;
	ei.count = 0;
	send_simple(fd, 18, RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM, &ei);
	raw_expect_status(fd, 18, RDMAX_E_INVALID_ARGUMENT);
	/* Standing or not; and a value nobody claimed cannot be released. */
	ei.has_standing = 1;
	ei.standing = 1;
	send_simple(fd, 18, RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM, &ei);
	raw_expect_status(fd, 18, RDMAX_E_INVALID_ARGUMENT);
	Rdmax__V1__ImmRelease ir = RDMAX__V1__IMM_RELEASE__INIT;
	ir.imm = 3;
	send_simple(fd, 18, RDMAX__V1__CLIENT_MSG__BODY_IMM_RELEASE, &ir);
	raw_expect_status(fd, 18, RDMAX_E_NOT_FOUND);

	/* After all that, the session still moves bytes: a write within the region. */
	itest_fill(mem, 4096, 81);
	jobs[0].job_id = 106;
	send_jobs(fd, 19, ptrs, 1);
	itest_assert_err(raw_wait_completion(fd, 106, ITEST_WAIT_MS), 0);
	itest_assert_mem_eq(mem + 8192, mem, 4096, "WRITE by the raw client");
	munmap(mem, 65536);
	close(memfd);
	close(fd);
	finish(d, fds_before);
}
END_TEST

/* The daemon's own count of outstanding jobs, which librdmax also enforces before sending. */
START_TEST(outstanding_limit)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	uint64_t ids[8];
	int statuses[8];

	itest_daemon_set(a, "limits.max_outstanding_jobs=4");
	itest_daemon_set(a, "limits.max_jobs_per_submit=4");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *dst = itest_alloc(cb, 65536, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc ddst = itest_desc(dst);

	int fd = raw_connect(a->socket_path);
	raw_hello(fd);
	int memfd = raw_memfd("itest-outstanding", 65536, true);
	send_register(fd, 2, RDMAX__V1__REGION_KIND__REGION_HOST_FD, 0, 0, 65536, 0, &memfd, 1);
	uint64_t region = expect_region(fd, 2, NULL, NULL);
	close(memfd);

	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;
	w.local_region = region;
	w.length = 4096;
	w.remote_desc.data = ddst.bytes;
	w.remote_desc.len = ddst.len;
	Rdmax__V1__Job jobs[4], *ptrs[4];
	for (int i = 0; i < 4; i++) {
		Rdmax__V1__Job init = RDMAX__V1__JOB__INIT;
		jobs[i] = init;
		jobs[i].kind_case = RDMAX__V1__JOB__KIND_WRITE;
		jobs[i].write = &w;
		ptrs[i] = &jobs[i];
	}
	/* Connect to the peer first. */
	jobs[0].job_id = 1;
	send_jobs(fd, 3, ptrs, 1);
	itest_assert_err(raw_wait_completion(fd, 1, ITEST_WAIT_MS), 0);

	itest_daemon_pause(b);
	for (int i = 0; i < 4; i++) {
		jobs[i].job_id = 10 + (uint64_t)i;
	}
	send_jobs(fd, 4, ptrs, 4);
	assert_no_message(fd, 100);
	/* A fifth job, and two more in one Submit: each refused on its own. */
	jobs[0].job_id = 20;
	send_jobs(fd, 5, ptrs, 1);
	ck_assert_uint_eq(raw_collect(fd, ids, statuses, 1, ITEST_WAIT_MS), 1);
	ck_assert_uint_eq(ids[0], 20);
	itest_assert_err(statuses[0], RDMAX_E_RESOURCE_EXHAUSTED);
	jobs[0].job_id = 21;
	jobs[1].job_id = 22;
	send_jobs(fd, 6, ptrs, 2);
	ck_assert_uint_eq(raw_collect(fd, ids, statuses, 2, ITEST_WAIT_MS), 2);
	for (int i = 0; i < 2; i++) {
		ck_assert(ids[i] == 21 || ids[i] == 22);
		itest_assert_err(statuses[i], RDMAX_E_RESOURCE_EXHAUSTED);
	}
	ck_assert_uint_ne(ids[0], ids[1]);
	/* A refused id was never in flight: reusing it later is fine. */
	itest_daemon_resume(b);
	ck_assert_uint_eq(raw_collect(fd, ids, statuses, 4, 30000), 4);
	for (int i = 0; i < 4; i++) {
		ck_assert_msg(ids[i] >= 10 && ids[i] < 14, "completion for job %" PRIu64, ids[i]);
		itest_assert_err(statuses[i], 0);
		for (int j = 0; j < i; j++) {
			ck_assert_uint_ne(ids[i], ids[j]);
		}
	}
	assert_no_message(fd, ITEST_QUIET_MS);
	/* The window is free again. */
	for (int i = 0; i < 4; i++) {
		jobs[i].job_id = 20 + (uint64_t)i;
	}
	send_jobs(fd, 7, ptrs, 4);
	ck_assert_uint_eq(raw_collect(fd, ids, statuses, 4, ITEST_WAIT_MS), 4);
	for (int i = 0; i < 4; i++) {
		itest_assert_err(statuses[i], 0);
	}
	close(fd);
	rdmax_client_close(cb);
	itest_daemon_stop(a);
	itest_daemon_stop(b);
	itest_daemon_free(a);
	itest_daemon_free(b);
}
END_TEST

TCase *itest_tcase_raw(void)
{
	TCase *tc = tcase_create("raw");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, garbage_bytes);
	tcase_add_test(tc, before_hello);
	tcase_add_test(tc, oversized_message);
	tcase_add_test(tc, too_many_fds);
	tcase_add_test(tc, bad_register);
	tcase_add_test(tc, bad_jobs);
	ITEST_ADD_STALLING_TEST(tc, outstanding_limit);
	return tc;
}
