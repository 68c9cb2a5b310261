/* SPDX-License-Identifier: MIT */
/*
 * Case "jobs": the job kinds beyond WRITE/READ, end to end over real
 * daemons. A paged write of 10 000 pages (RDMAX_TEST_SCALE, at least 1000)
 * lands byte-exact with its imm counted once; a scatter reaches three nodes
 * and counts its imm once per node; a barrier across three nodes fires each
 * receiver's ExpectImm only when all three senders arrived; mailboxes carry
 * messages both ways and a missing mailbox fails the sender with NOT_FOUND;
 * deadlines and Cancel are provoked against a stopped peer; one Submit
 * mixes every kind.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define IMM_PAGED   0x9A6ED001u
#define IMM_SCATTER 0x5CA77E00u
#define IMM_BARRIER 0xBA221E00u
#define IMM_MIXED   0x313ED000u

static void expect_ok(struct rdmax_client *c, const struct rdmax_job *job, uint64_t bytes)
{
	struct rdmax_event ev = itest_run_job(c, job, 60000);
	ck_assert_msg(ev.status == 0, "job %" PRIu64 " (op %d) failed: %s ('%s')", job->id,
		      (int)job->op, rdmax_err_name(ev.status), ev.reason);
	ck_assert_uint_eq(ev.bytes, bytes);
}

/* Wait for one job's completion (other events are kept) and assert its status. */
static void expect_job_status(struct rdmax_client *c, uint64_t id, int want)
{
	int ret = rdmax_wait_job(c, id, 60000);
	ck_assert_msg(ret == want, "job %" PRIu64 ": got %s, expected %s%s", id,
		      rdmax_err_name(ret), rdmax_err_name(want), itest_daemon_deaths());
}

static void expect_imm(struct rdmax_client *c, uint32_t imm)
{
	int ret = rdmax_wait_imm(c, imm, 60000);
	ck_assert_msg(ret == 0, "imm 0x%x did not fire: %s%s", imm, rdmax_err_name(ret),
		      itest_daemon_deaths());
}

/* ------------------------------------------------------------ paged write */

START_TEST(jobs_paged_write_many_pages)
{
	const size_t n = (size_t)itest_scaled(10000, 1000);
	const uint64_t page = 1024;
	/* Source: KV blocks with a 64-byte header each (stride page + 64), at offset 128. */
	const uint64_t src_off = 128, src_stride = page + 64,
		       src_len = src_off + 2 * n * src_stride;
	const uint64_t dst_len = 2 * n * page;
	uint32_t *si = malloc(n * sizeof(*si)), *di = malloc(2 * n * sizeof(*di));
	uint32_t *run = malloc(n * sizeof(*run));
	uint8_t *expect = calloc(1, dst_len);
	ck_assert(si && di && run && expect);

	struct itest_daemon *a = itest_daemon_new("prefill", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("decode", itest_addr_b());
	itest_daemon_set(a, "engine.chunk_bytes=65536");
	itest_daemon_set(a, "transport.tcp_chunk_bytes=65536");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *sender = itest_client(a, "prefill");
	struct rdmax_client *recv = itest_client(b, "decode");
	struct rdmax_region *src = itest_alloc(sender, src_len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(recv, dst_len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	itest_fill(itest_bytes(src), src_len, itest_seed());
	ck_assert_int_eq(rdmax_expect_imm(recv, IMM_PAGED, 2), 0);

	/* Job 1: n scattered source blocks to n of 2n destination pages, in random order. */
	itest_permute(si, n, itest_seed() + 1);
	itest_permute(di, 2 * n, itest_seed() + 2);
	struct rdmax_job job = itest_job(1, RDMAX_OP_PAGED_WRITE, src, 0, &desc, 0, 0);
	job.flags = RDMAX_JOB_IMM;
	job.imm = IMM_PAGED;
	job.u.paged.page_len = page;
	job.u.paged.local_pages = (struct rdmax_pages){
		.offset = src_off, .stride = src_stride, .indices = si, .count = n};
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = di, .count = n};
	uint64_t t0 = itest_now_ms();
	expect_ok(sender, &job, n * page);
	fprintf(stderr,
		"itest jobs: paged write of %zu pages of %" PRIu64 " bytes in %" PRIu64 " ms\n", n,
		page, itest_now_ms() - t0);
	for (size_t i = 0; i < n; i++) {
		memcpy(expect + (uint64_t)di[i] * page,
		       itest_bytes(src) + src_off + (uint64_t)si[i] * src_stride, page);
	}
	/* The imm counts whole jobs: not yet. */
	itest_assert_quiet(recv, 100);

	/* Job 2: contiguous source pages into the pages job 1 left empty (runs coalesce). */
	for (size_t i = 0; i < n; i++) {
		run[i] = di[n + i];
	}
	struct rdmax_job job2 = job;
	job2.id = 2;
	job2.u.paged.local_pages =
		(struct rdmax_pages){.offset = 0, .stride = page, .indices = si, .count = n};
	for (size_t i = 0; i < n; i++) {
		si[i] = (uint32_t)i;
	}
	job2.u.paged.remote_pages = (struct rdmax_pages){.indices = run, .count = n};
	expect_ok(sender, &job2, n * page);
	for (size_t i = 0; i < n; i++) {
		memcpy(expect + (uint64_t)run[i] * page, itest_bytes(src) + i * page, page);
	}
	expect_imm(recv, IMM_PAGED);
	itest_assert_mem_eq(itest_bytes(dst), expect, dst_len, "paged writes");

	/* The status of a finished job, and of one that never existed. */
	uint64_t done = 1, total = 1;
	itest_assert_err(rdmax_job_status(sender, 1, &done, &total), RDMAX_E_NOT_FOUND);
	ck_assert_uint_eq(done, 1);

	itest_pair_end(sender, recv, a, b);
	free(si);
	free(di);
	free(run);
	free(expect);
}
END_TEST

START_TEST(jobs_paged_write_errors)
{
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;
	itest_pair_start(&a, &b, &ca, "sender", &cb, "receiver");
	struct rdmax_region *src = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	const uint32_t ok[] = {0, 1, 2}, dup[] = {5, 9, 5}, far[] = {0, 1, 16};
	struct rdmax_event ev;

	struct rdmax_job job = itest_job(10, RDMAX_OP_PAGED_WRITE, src, 0, &desc, 0, 0);
	job.u.paged.page_len = 4096;
	job.u.paged.local_pages = (struct rdmax_pages){.indices = ok, .count = 3};
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = dup, .count = 3};
	itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	/* The same job again, to read its message. */
	job.id = 11;
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	ck_assert_msg(
		strstr(ev.reason, "destination page 5 is listed twice (list entries 0 and 2)"),
		"message: '%s'", ev.reason);

	job.id = 12;
	job.u.paged.remote_pages.indices = far;
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_OUT_OF_RANGE);
	ck_assert_msg(strstr(ev.reason, "destination page 16 (list entry 2)"), "message: '%s'",
		      ev.reason);

	job.id = 13;
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = ok, .count = 2};
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_msg(strstr(ev.reason, "3 pages but the destination list has 2"), "message: '%s'",
		      ev.reason);

	job.id = 14;
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = ok, .count = 3, .stride = 100};
	itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	job.id = 15;
	job.u.paged.remote_pages.stride = 0;
	job.u.paged.page_len = 0;
	itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);

	/* After all that the same job, fixed, works. */
	job.id = 16;
	job.u.paged.page_len = 4096;
	itest_fill(itest_bytes(src), 64 * KiB, 3);
	expect_ok(ca, &job, 3 * 4096);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 3 * 4096, "fixed paged write");

	/*
	 * Pages that do not merge travel as one segment list (WRITE_SEGS over
	 * TCP); once the destination is deregistered its owner refuses the whole
	 * list (the NIC, over verbs), and the job fails with that reason.
	 */
	const uint32_t rot[] = {2, 0, 1};
	struct rdmax_region *dst2 = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc2 = itest_desc(dst2);
	job.id = 17;
	job.remote = &desc2;
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = rot, .count = 3};
	expect_ok(ca, &job, 3 * 4096);
	itest_assert_mem_eq(itest_bytes(dst2) + 2 * 4096, itest_bytes(src), 4096, "page 0");
	itest_assert_mem_eq(itest_bytes(dst2), itest_bytes(src) + 4096, 2 * 4096, "pages 1, 2");
	ck_assert_int_eq(rdmax_region_free(cb, dst2), 0);
	job.id = 18;
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	if (strcmp(itest_transport(), "tcp") == 0) {
		itest_assert_err(ev.status, RDMAX_E_NOT_FOUND);
		ck_assert_msg(strstr(ev.reason, "not found"), "message: '%s'", ev.reason);
	} else {
		/* Over verbs the NIC refuses the stale key. */
		ck_assert_msg(ev.status == RDMAX_E_REMOTE_ACCESS || ev.status == RDMAX_E_NOT_FOUND,
			      "status %d: '%s'", ev.status, ev.reason);
	}

	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* ---------------------------------------------------------------- scatter */

START_TEST(jobs_scatter_three_nodes)
{
	const uint64_t len = 256 * KiB;
	struct itest_daemon *d[3];
	struct rdmax_client *recv[3];
	struct rdmax_region *dst[3];
	struct rdmax_desc desc[3];
	const char *names[3] = {"n0", "n1", "n2"};

	for (int i = 0; i < 3; i++) {
		d[i] = itest_daemon_new(names[i], i == 0 ? itest_addr_a() : itest_addr_b());
		itest_daemon_set(d[i], "engine.chunk_bytes=16384");
		itest_daemon_set(d[i], "transport.tcp_chunk_bytes=16384");
		itest_daemon_start(d[i]);
		recv[i] = itest_client(d[i], "receiver");
		dst[i] = itest_alloc(recv[i], len, RDMAX_ACCESS_REMOTE_WRITE);
		desc[i] = itest_desc(dst[i]);
		/* Every node sees both scatters: once each, whatever the number of destinations. */
		ck_assert_int_eq(rdmax_expect_imm(recv[i], IMM_SCATTER, 2), 0);
	}
	/* The sender lives on node 0 beside a receiver: one destination is local. */
	struct rdmax_client *sender = itest_client(d[0], "sender");
	struct rdmax_region *src = itest_alloc(sender, len, RDMAX_ACCESS_LOCAL);
	itest_fill(itest_bytes(src), len, itest_seed());

	/* By descriptors: node 1 twice (two ranges), node 2 once, node 0 once. */
	struct rdmax_scatter_dest dests[4] = {
		{.remote = &desc[1], .remote_offset = 0, .local_offset = 0, .length = 100 * KiB},
		{.remote = &desc[2],
		 .remote_offset = 1,
		 .local_offset = 100 * KiB,
		 .length = 50 * KiB},
		{.remote = &desc[1],
		 .remote_offset = 128 * KiB,
		 .local_offset = 150 * KiB,
		 .length = 77},
		{.remote = &desc[0],
		 .remote_offset = 5,
		 .local_offset = 200 * KiB,
		 .length = 56 * KiB},
	};
	struct rdmax_job job = itest_job(1, RDMAX_OP_SCATTER, src, 0, NULL, 0, 0);
	job.flags = RDMAX_JOB_IMM;
	job.imm = IMM_SCATTER;
	job.u.scatter.dests = dests;
	job.u.scatter.count = 4;
	expect_ok(sender, &job, 100 * KiB + 50 * KiB + 77 + 56 * KiB);
	itest_assert_mem_eq(itest_bytes(dst[1]), itest_bytes(src), 100 * KiB, "node 1 range 0");
	itest_assert_mem_eq(itest_bytes(dst[1]) + 128 * KiB, itest_bytes(src) + 150 * KiB, 77,
			    "node 1 range 1");
	itest_assert_mem_eq(itest_bytes(dst[2]) + 1, itest_bytes(src) + 100 * KiB, 50 * KiB,
			    "node 2");
	itest_assert_mem_eq(itest_bytes(dst[0]) + 5, itest_bytes(src) + 200 * KiB, 56 * KiB,
			    "node 0 (local)");
	for (int i = 0; i < 3; i++) {
		itest_assert_quiet(recv[i], 50);
	}

	/* Through a peer group: members in another order, destinations by index. */
	struct rdmax_desc members[3] = {desc[2], desc[0], desc[1]};
	struct rdmax_peer_group *group;
	ck_assert_int_eq(rdmax_peer_group_create(sender, members, 3, &group), 0);
	ck_assert_uint_eq(rdmax_peer_group_size(group), 3);
	itest_fill(itest_bytes(src), len, itest_seed() + 1);
	struct rdmax_scatter_dest by_index[3];
	for (uint32_t i = 0; i < 3; i++) {
		by_index[i] = (struct rdmax_scatter_dest){.peer_index = i,
							  .remote_offset = 64 * KiB,
							  .local_offset = i * 64 * KiB,
							  .length = 64 * KiB};
	}
	job.id = 2;
	job.u.scatter.dests = by_index;
	job.u.scatter.count = 3;
	job.u.scatter.group = group;
	expect_ok(sender, &job, 3 * 64 * KiB);
	for (int i = 0; i < 3; i++) {
		expect_imm(recv[i], IMM_SCATTER);
	}
	itest_assert_mem_eq(itest_bytes(dst[2]) + 64 * KiB, itest_bytes(src), 64 * KiB, "member 0");
	itest_assert_mem_eq(itest_bytes(dst[0]) + 64 * KiB, itest_bytes(src) + 64 * KiB, 64 * KiB,
			    "member 1");
	itest_assert_mem_eq(itest_bytes(dst[1]) + 64 * KiB, itest_bytes(src) + 128 * KiB, 64 * KiB,
			    "member 2");

	/* Errors name the destination; a destroyed group is gone. */
	by_index[1].peer_index = 3;
	job.id = 3;
	itest_expect_job_error(sender, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);
	ck_assert_int_eq(rdmax_peer_group_destroy(sender, group), 0);

	/* Two regions of one node in one job: each lands through its own keys. */
	struct rdmax_region *dst1b = itest_alloc(recv[1], len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc1b = itest_desc(dst1b);
	itest_fill(itest_bytes(src), len, itest_seed() + 2);
	struct rdmax_scatter_dest two[2] = {
		{.remote = &desc[1], .remote_offset = 0, .local_offset = 0, .length = 96 * KiB},
		{.remote = &desc1b,
		 .remote_offset = 3,
		 .local_offset = 96 * KiB,
		 .length = 96 * KiB},
	};
	job = itest_job(4, RDMAX_OP_SCATTER, src, 0, NULL, 0, 0);
	job.u.scatter.dests = two;
	job.u.scatter.count = 2;
	expect_ok(sender, &job, 192 * KiB);
	itest_assert_mem_eq(itest_bytes(dst[1]), itest_bytes(src), 96 * KiB, "node 1 region a");
	itest_assert_mem_eq(itest_bytes(dst1b) + 3, itest_bytes(src) + 96 * KiB, 96 * KiB,
			    "node 1 region b");

	rdmax_client_close(sender);
	for (int i = 0; i < 3; i++) {
		rdmax_client_close(recv[i]);
		itest_daemon_stop(d[i]);
		itest_daemon_free(d[i]);
	}
}
END_TEST

/* ---------------------------------------------------------------- barrier */

START_TEST(jobs_barrier_three_nodes)
{
	struct itest_daemon *d[3];
	struct rdmax_client *c[3];
	struct rdmax_region *r[3];
	struct rdmax_desc desc[3];
	struct rdmax_peer_group *group[3];
	const char *names[3] = {"w0", "w1", "w2"};

	for (int i = 0; i < 3; i++) {
		d[i] = itest_daemon_new(names[i], i == 1 ? itest_addr_b() : itest_addr_a());
		itest_daemon_start(d[i]);
		c[i] = itest_client(d[i], names[i]);
		r[i] = itest_alloc(c[i], 4096, RDMAX_ACCESS_REMOTE_WRITE);
		desc[i] = itest_desc(r[i]);
	}
	for (int round = 0; round < 2; round++) {
		uint32_t imm = IMM_BARRIER + (uint32_t)round;
		for (int i = 0; i < 3; i++) {
			/* Every node's group holds all three nodes, itself included: 3 senders. */
			if (round == 0) {
				ck_assert_int_eq(rdmax_peer_group_create(c[i], desc, 3, &group[i]),
						 0);
			}
			ck_assert_int_eq(rdmax_expect_imm(c[i], imm, 3), 0);
		}
		for (int i = 0; i < 3; i++) {
			struct rdmax_job job =
				itest_job(100 + (uint64_t)i, RDMAX_OP_BARRIER, NULL, 0, NULL, 0, 0);
			job.imm = imm;
			if (round == 0) {
				job.u.barrier.group = group[i];
			} else {
				job.u.barrier.remotes = desc;
				job.u.barrier.count = 3;
			}
			ck_assert_int_eq(rdmax_submit(c[i], &job, 1), 0);
			if (i < 2) {
				/* Not everybody arrived yet: the last node's ExpectImm must stay
				 * quiet. */
				expect_job_status(c[i], 100 + (uint64_t)i, 0);
				ck_assert_int_eq(rdmax_wait_imm(c[2], imm, 100), RDMAX_E_TIMEOUT);
			}
		}
		expect_job_status(c[2], 102, 0);
		for (int i = 0; i < 3; i++) {
			expect_imm(c[i], imm);
			itest_assert_quiet(c[i], 50);
		}
	}
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(rdmax_peer_group_destroy(c[i], group[i]), 0);
		rdmax_client_close(c[i]);
		itest_daemon_stop(d[i]);
		itest_daemon_free(d[i]);
	}
}
END_TEST

/*
 * A barrier names regions too: the node that counts its imm checks the
 * region first (a zero-byte RDMA write is checked by no NIC, so over verbs
 * the imm travels as a record the daemon checks). A deregistered region
 * and one without remote write are refused by name, and nothing is counted.
 */
START_TEST(jobs_barrier_checks_region)
{
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;
	itest_pair_start(&a, &b, &ca, "sender", &cb, "receiver");
	struct rdmax_region *gone = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *ro = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *ok = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc d_gone = itest_desc(gone), d_ro = itest_desc(ro), d_ok = itest_desc(ok);
	const uint32_t imm = IMM_BARRIER + 40;

	ck_assert_int_eq(rdmax_region_free(cb, gone), 0);
	ck_assert_int_eq(rdmax_expect_imm(cb, imm, 1), 0);
	struct rdmax_job job = itest_job(1, RDMAX_OP_BARRIER, NULL, 0, NULL, 0, 0);
	job.imm = imm;
	job.u.barrier.remotes = &d_gone;
	job.u.barrier.count = 1;
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_NOT_FOUND);
	job.id = 2;
	job.u.barrier.remotes = &d_ro;
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_REMOTE_ACCESS);
	/* Neither refused barrier counted: the expectation is still waiting. */
	ck_assert_int_eq(rdmax_wait_imm(cb, imm, 200), RDMAX_E_TIMEOUT);
	job.id = 3;
	job.u.barrier.remotes = &d_ok;
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "barrier to a good region failed: %s", ev.reason);
	expect_imm(cb, imm);
	itest_assert_quiet(cb, 50);

	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* -------------------------------------------------------------- mailboxes */

/* A SEND to the mailbox at address `addr`; `box`, when not NULL, must be its name. */
static struct rdmax_job send_job(uint64_t id, const struct rdmax_desc *addr, const char *box,
				 const void *payload, size_t len)
{
	struct rdmax_job job = itest_job(id, RDMAX_OP_SEND, NULL, 0, addr, 0, 0);
	job.u.send.mailbox = box;
	job.u.send.payload = payload;
	job.u.send.length = len;
	return job;
}

/* SEND between nodes needs a transport with send_message (TCP and verbs). */
static bool remote_send_works(const char *func)
{
	if (strcmp(itest_transport(), "tcp") == 0 || strcmp(itest_transport(), "verbs") == 0) {
		return true;
	}
	fprintf(stderr, "itest: SKIP %s (SEND between nodes): transport '%s' carries no messages\n",
		func, itest_transport());
	return false;
}

START_TEST(jobs_mailbox_round_trip)
{
	if (!remote_send_works(__func__)) {
		return;
	}
	struct itest_daemon *a = itest_daemon_new("alpha", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("beta", itest_addr_b());
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "prefill");
	struct rdmax_client *cb = itest_client(b, "decode");
	struct rdmax_client *cb2 = itest_client(b, "other");
	struct rdmax_region *rb = itest_alloc(cb, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc region_b = itest_desc(rb), box_b, box_a, box_b2, stale;
	static uint8_t big[RDMAX_MESSAGE_PAYLOAD_MAX + 8], got[RDMAX_MESSAGE_PAYLOAD_MAX + 8];
	char from[RDMAX_NODE_NAME_MAX];
	struct rdmax_event ev;
	itest_fill(big, sizeof(big), itest_seed());

	ck_assert_int_eq(rdmax_mailbox_open_addr(cb, "decode.ctl", &box_b), 0);
	ck_assert_uint_gt(box_b.len, 0);
	/* One namespace per uid: another client of the same uid finds the name taken. */
	itest_assert_err(rdmax_mailbox_open(cb2, "decode.ctl"), RDMAX_E_ALREADY_EXISTS);
	itest_assert_err(rdmax_mailbox_open(cb2, "no spaces"), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_mailbox_open_addr(ca, "prefill.ctl", &box_a), 0);

	/* a -> b: empty, small and largest messages, in order; with and without the name. */
	const size_t sizes[] = {0, 1, 1000, RDMAX_MESSAGE_PAYLOAD_MAX};
	for (size_t i = 0; i < 4; i++) {
		struct rdmax_job job =
			send_job(10 + i, &box_b, i % 2 ? "decode.ctl" : NULL, big + i, sizes[i]);
		expect_ok(ca, &job, sizes[i]);
	}
	for (size_t i = 0; i < 4; i++) {
		memset(got, 0, sizeof(got));
		int n = rdmax_mailbox_recv(cb, "decode.ctl", got, sizeof(got), from, ITEST_WAIT_MS);
		ck_assert_msg(n == (int)sizes[i], "message %zu: %s (%d bytes), expected %zu", i,
			      rdmax_err_name(n < 0 ? n : 0), n, sizes[i]);
		itest_assert_mem_eq(got, big + i, sizes[i], "message payload");
		ck_assert_str_eq(from, "alpha");
	}
	/* b -> a through rdmax_poll_events: the payload pointer and the sender. */
	struct rdmax_job reply = send_job(20, &box_a, NULL, "layer 7 ready", 13);
	expect_ok(cb, &reply, 13);
	ck_assert_int_eq(rdmax_poll_events(ca, &ev, 1, ITEST_WAIT_MS), 1);
	ck_assert_int_eq(ev.type, RDMAX_EVENT_MESSAGE);
	ck_assert_str_eq(ev.mailbox, "prefill.ctl");
	ck_assert_str_eq(ev.from_node, "beta");
	ck_assert_uint_eq(ev.bytes, 13);
	ck_assert_mem_eq(ev.payload, "layer 7 ready", 13);

	/* A region descriptor is no address: refused before anything leaves. */
	struct rdmax_job lost = send_job(30, &region_b, "decode.ctl", "x", 1);
	itest_expect_job_error(ca, &lost, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	/* A name that is not the address's. */
	lost = send_job(31, &box_b, "prefill.ctl", "x", 1);
	itest_expect_job_error(ca, &lost, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	/* Same node: delivered locally. */
	struct rdmax_job local = send_job(32, &box_b, NULL, "local", 5);
	expect_ok(cb2, &local, 5);
	ck_assert_int_eq(rdmax_mailbox_recv(cb, NULL, got, sizeof(got), from, ITEST_WAIT_MS), 5);
	ck_assert_mem_eq(got, "local", 5);
	ck_assert_str_eq(from, "beta");

	/* Oversized payloads are refused by the library. */
	struct rdmax_job bad = send_job(41, &box_b, NULL, big, sizeof(big));
	itest_assert_err(rdmax_submit(ca, &bad, 1), RDMAX_E_RESOURCE_EXHAUSTED);

	/* Closed: its address reaches nothing, remote or local, named NOT_FOUND. */
	ck_assert_int_eq(rdmax_mailbox_close(cb, "decode.ctl"), 0);
	itest_assert_err(rdmax_mailbox_close(cb, "decode.ctl"), RDMAX_E_NOT_FOUND);
	lost = send_job(50, &box_b, NULL, "x", 1);
	itest_expect_job_error(ca, &lost, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	lost = send_job(51, &box_b, NULL, "x", 1);
	ck_assert_int_eq(rdmax_submit(cb2, &lost, 1), 0);
	ck_assert_uint_eq(itest_collect(cb2, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_NOT_FOUND);
	ck_assert_msg(strstr(ev.reason, ":decode.ctl' with this key is open on node 'beta'"),
		      "message: '%s'", ev.reason);
	/* Reopened: a new key, the old address stays refused; the owner leaves, the name is free.
	 */
	stale = box_b;
	ck_assert_int_eq(rdmax_mailbox_open_addr(cb, "decode.ctl", &box_b), 0);
	lost = send_job(52, &stale, NULL, "x", 1);
	itest_expect_job_error(ca, &lost, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	rdmax_client_close(cb);
	ck_assert_int_eq(rdmax_mailbox_open_addr(cb2, "decode.ctl", &box_b2), 0);
	lost = send_job(53, &box_b, NULL, "x", 1);
	itest_expect_job_error(ca, &lost, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	struct rdmax_job again = send_job(54, &box_b2, "decode.ctl", "again", 5);
	expect_ok(ca, &again, 5);
	ck_assert_int_eq(rdmax_mailbox_recv(cb2, "decode.ctl", got, 2, NULL, ITEST_WAIT_MS), 5);
	ck_assert_mem_eq(got, "ag", 2);
	itest_assert_quiet(cb2, ITEST_QUIET_MS);

	itest_pair_end(ca, cb2, a, b);
}
END_TEST

/* ------------------------------------------------------ deadline, cancel */

START_TEST(jobs_deadline_cancel_progress)
{
	const uint64_t len = 256 * KiB;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	/* The stopped peer must outlast the test, not time out. */
	itest_daemon_set(a, "peers.peer_timeout_ms=60000");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "sender");
	struct rdmax_client *cb = itest_client(b, "receiver");
	struct rdmax_region *src = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	uint32_t pages[64];
	for (uint32_t i = 0; i < 64; i++) {
		pages[i] = i;
	}
	/* Warm the connection, then freeze the peer: nothing it should answer will be. */
	struct rdmax_job warm = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 64);
	expect_ok(ca, &warm, 64);
	itest_daemon_pause(b);

	/* Deadlines, on two kinds. */
	struct rdmax_job paged = itest_job(2, RDMAX_OP_PAGED_WRITE, src, 0, &desc, 0, 0);
	paged.u.paged.page_len = 4096;
	paged.u.paged.local_pages = (struct rdmax_pages){.indices = pages, .count = 64};
	paged.u.paged.remote_pages = (struct rdmax_pages){.indices = pages, .count = 64};
	paged.deadline_ms = 300;
	struct rdmax_job barrier = itest_job(3, RDMAX_OP_BARRIER, NULL, 0, NULL, 0, 0);
	barrier.imm = 77;
	barrier.u.barrier.remotes = &desc;
	barrier.u.barrier.count = 1;
	barrier.deadline_ms = 300;
	struct rdmax_job both[2] = {paged, barrier};
	uint64_t t0 = itest_now_ms();
	ck_assert_int_eq(rdmax_submit(ca, both, 2), 0);
	expect_job_status(ca, 2, RDMAX_E_TIMEOUT);
	expect_job_status(ca, 3, RDMAX_E_TIMEOUT);
	uint64_t took = itest_now_ms() - t0;
	ck_assert_msg(took >= 250 && took < 5000, "deadline of 300 ms fired after %" PRIu64 " ms",
		      took);

	/* Cancel, with progress before it. */
	paged.id = 4;
	paged.deadline_ms = 0;
	ck_assert_int_eq(rdmax_submit(ca, &paged, 1), 0);
	uint64_t done = UINT64_MAX, total = 0;
	ck_assert_int_eq(rdmax_job_status(ca, 4, &done, &total), 0);
	ck_assert_uint_eq(total, 64 * 4096);
	ck_assert_uint_le(done, total);
	ck_assert_int_eq(rdmax_cancel(ca, 4), 0);
	expect_job_status(ca, 4, RDMAX_E_CANCELLED);
	itest_assert_err(rdmax_cancel(ca, 4), RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_job_status(ca, 4, &done, &total), RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_cancel(ca, 999), RDMAX_E_NOT_FOUND);
	itest_assert_quiet(ca, 100);

	itest_daemon_resume(b);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* ------------------------------------------------------------ mixed batch */

START_TEST(jobs_mixed_batch)
{
	const uint64_t len = 128 * KiB;
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;
	itest_pair_start(&a, &b, &ca, "sender", &cb, "receiver");
	struct rdmax_region *src = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *back = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst =
		itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_desc desc = itest_desc(dst);
	itest_fill(itest_bytes(src), len, itest_seed());
	itest_fill(itest_bytes(dst), len, itest_seed() + 9);
	uint8_t before[4096];
	memcpy(before, itest_bytes(dst) + 120 * KiB, sizeof(before));
	struct rdmax_desc inbox;
	ck_assert_int_eq(rdmax_mailbox_open_addr(cb, "inbox", &inbox), 0);
	/* WRITE, PAGED_WRITE, SCATTER and BARRIER carry the imm: 4 landings. */
	ck_assert_int_eq(rdmax_expect_imm(cb, IMM_MIXED, 4), 0);

	const uint32_t si[] = {3, 2, 1, 0}, di[] = {4, 5, 6, 7};
	struct rdmax_scatter_dest sd[2] = {
		{.remote = &desc,
		 .remote_offset = 64 * KiB,
		 .local_offset = 64 * KiB,
		 .length = 8 * KiB},
		{.remote = &desc,
		 .remote_offset = 80 * KiB,
		 .local_offset = 80 * KiB,
		 .length = 8 * KiB},
	};
	struct rdmax_job jobs[6];
	jobs[0] = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 16 * KiB);
	jobs[1] = itest_job(2, RDMAX_OP_PAGED_WRITE, src, 0, &desc, 0, 0);
	jobs[1].u.paged.page_len = 4096;
	jobs[1].u.paged.local_pages = (struct rdmax_pages){.indices = si, .count = 4};
	jobs[1].u.paged.remote_pages = (struct rdmax_pages){.indices = di, .count = 4};
	jobs[2] = itest_job(3, RDMAX_OP_SCATTER, src, 0, NULL, 0, 0);
	jobs[2].u.scatter.dests = sd;
	jobs[2].u.scatter.count = 2;
	jobs[3] = itest_job(4, RDMAX_OP_BARRIER, NULL, 0, NULL, 0, 0);
	jobs[3].u.barrier.remotes = &desc;
	jobs[3].u.barrier.count = 1;
	/* Over a transport without messages, the SEND goes to a mailbox of the sender's node. */
	struct rdmax_desc own;
	struct rdmax_client *inbox_owner = cb;
	jobs[4] = send_job(5, &inbox, "inbox", "batch done", 10);
	if (!remote_send_works(__func__)) {
		ck_assert_int_eq(rdmax_mailbox_open_addr(ca, "inbox-a", &own), 0);
		jobs[4] = send_job(5, &own, "inbox-a", "batch done", 10);
		inbox_owner = ca;
	}
	/* Reads the part of the region no other job of the batch touches. */
	jobs[5] = itest_job(6, RDMAX_OP_READ, back, 0, &desc, 120 * KiB, 4096);
	for (int i = 0; i < 4; i++) {
		jobs[i].flags = i == 3 ? 0 : RDMAX_JOB_IMM;
		jobs[i].imm = IMM_MIXED;
	}
	ck_assert_int_eq(rdmax_submit(ca, jobs, 6), 0);
	const uint64_t bytes[6] = {16 * KiB, 4 * 4096, 16 * KiB, 0, 10, 4096};
	struct rdmax_event ev[6];
	ck_assert_uint_eq(itest_collect(ca, ev, 6, 60000, NULL), 6);
	for (int i = 0; i < 6; i++) {
		uint64_t k = ev[i].job_id - 1;
		ck_assert_uint_lt(k, 6);
		ck_assert_msg(ev[i].status == 0, "job %" PRIu64 " failed: %s ('%s')", ev[i].job_id,
			      rdmax_err_name(ev[i].status), ev[i].reason);
		ck_assert_uint_eq(ev[i].bytes, bytes[k]);
	}
	expect_imm(cb, IMM_MIXED);
	char msg[16];
	ck_assert_int_eq(rdmax_mailbox_recv(inbox_owner, jobs[4].u.send.mailbox, msg, sizeof(msg),
					    NULL, ITEST_WAIT_MS),
			 10);
	ck_assert_mem_eq(msg, "batch done", 10);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 16 * KiB, "write");
	for (int i = 0; i < 4; i++) {
		itest_assert_mem_eq(itest_bytes(dst) + di[i] * 4096,
				    itest_bytes(src) + si[i] * 4096, 4096, "paged write");
	}
	itest_assert_mem_eq(itest_bytes(dst) + 64 * KiB, itest_bytes(src) + 64 * KiB, 8 * KiB,
			    "scatter 0");
	itest_assert_mem_eq(itest_bytes(dst) + 80 * KiB, itest_bytes(src) + 80 * KiB, 8 * KiB,
			    "scatter 1");
	itest_assert_mem_eq(itest_bytes(back), before, 4096, "read");

	itest_pair_end(ca, cb, a, b);
}
END_TEST

TCase *itest_tcase_jobs(void)
{
	TCase *tc = tcase_create("jobs");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, jobs_paged_write_many_pages);
	tcase_add_test(tc, jobs_paged_write_errors);
	tcase_add_test(tc, jobs_scatter_three_nodes);
	tcase_add_test(tc, jobs_barrier_three_nodes);
	tcase_add_test(tc, jobs_barrier_checks_region);
	tcase_add_test(tc, jobs_mailbox_round_trip);
	ITEST_ADD_STALLING_TEST(tc, jobs_deadline_cancel_progress);
	tcase_add_test(tc, jobs_mixed_batch);
	return tc;
}
