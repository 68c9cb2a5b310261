/* SPDX-License-Identifier: MIT */
/*
 * Case "imm": immediate counters. A receiver expects N writes carrying an
 * imm value; the sender's writes are split into many chunks (chunk size
 * 64 KiB). The receiver must get exactly one IMM_REACHED with count N, not
 * before the N-th write, and every byte of every write must be in place when
 * it fires. Landings that happen before the expectation are kept; a value
 * claimed by one client is refused to another until the first one leaves.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define CHUNK (64 * KiB)

/* Wait for one IMM_REACHED for imm; completions are not expected on the receiver. */
static struct rdmax_event wait_imm_event(struct rdmax_client *c, uint32_t imm, int timeout_ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;
	struct rdmax_event ev;

	for (;;) {
		uint64_t now = itest_now_ms();
		ck_assert_msg(now < deadline, "no IMM_REACHED for imm 0x%x within %d ms", imm,
			      timeout_ms);
		int got = rdmax_poll_events(c, &ev, 1, (int)(deadline - now));
		ck_assert_msg(got >= 0, "rdmax_poll_events() failed: %s", rdmax_err_name(got));
		if (got == 0) {
			continue;
		}
		ck_assert_msg(ev.type == RDMAX_EVENT_IMM_REACHED,
			      "receiver got event type %d (job %" PRIu64 ") instead of IMM_REACHED",
			      (int)ev.type, ev.job_id);
		ck_assert_msg(ev.imm == imm, "IMM_REACHED for imm 0x%x, expected 0x%x", ev.imm,
			      imm);
		return ev;
	}
}

static void expect_ok_completions(struct rdmax_client *c, size_t n, const struct rdmax_job *jobs)
{
	struct rdmax_event *evs = calloc(n, sizeof(*evs));
	bool *seen = calloc(n, sizeof(*seen));

	ck_assert(evs && seen);
	ck_assert_uint_eq(itest_collect(c, evs, n, 60000, NULL), n);
	for (size_t i = 0; i < n; i++) {
		size_t j = 0;
		while (j < n && jobs[j].id != evs[i].job_id) {
			j++;
		}
		ck_assert_msg(j < n, "completion for unknown job %" PRIu64, evs[i].job_id);
		ck_assert_msg(!seen[j], "job %" PRIu64 " completed twice", evs[i].job_id);
		seen[j] = true;
		ck_assert_msg(evs[i].status == 0, "imm WRITE %" PRIu64 " failed: %s ('%s')",
			      evs[i].job_id, rdmax_err_name(evs[i].status), evs[i].reason);
		ck_assert_uint_eq(evs[i].bytes, jobs[j].length);
	}
	free(evs);
	free(seen);
}

START_TEST(imm_counts_whole_jobs)
{
	/* Single bytes, one chunk exactly, one byte over, and many chunks. */
	const uint64_t sizes[] = {
		1,
		100,
		CHUNK,
		CHUNK + 1,
		5 * CHUNK + 17,
		MiB + 5,
		itest_scaled(4 * MiB, MiB) + 3,
		3 * CHUNK,
		2,
		CHUNK - 1,
		17 * CHUNK,
		4096,
	};
	const size_t n = sizeof(sizes) / sizeof(sizes[0]);
	const uint32_t imm = 0xC0FFEE01, imm_late = 0x00000007, imm_plain = 0xFFFFFFFF;
	uint64_t offs[sizeof(sizes) / sizeof(sizes[0])], total = 0;
	struct rdmax_job jobs[sizeof(sizes) / sizeof(sizes[0])];

	for (size_t i = 0; i < n; i++) {
		offs[i] = total;
		total += sizes[i] + 1;
	}
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	itest_daemon_set(a, "engine.chunk_bytes=%" PRIu64, CHUNK);
	itest_daemon_set(a, "transport.tcp_chunk_bytes=%" PRIu64, CHUNK);
	itest_daemon_set(b, "engine.chunk_bytes=%" PRIu64, CHUNK);
	itest_daemon_set(b, "transport.tcp_chunk_bytes=%" PRIu64, CHUNK);
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *sender = itest_client(a, "sender");
	struct rdmax_client *recv = itest_client(b, "receiver");
	struct rdmax_client *other = itest_client(b, "other");
	struct rdmax_region *src = itest_alloc(sender, total, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(recv, total, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	itest_fill(itest_bytes(src), total, 11);

	int ret = rdmax_expect_imm(recv, imm, n);
	ck_assert_msg(ret == 0, "rdmax_expect_imm() failed: %s", rdmax_err_name(ret));
	/* Each client counts in its own namespace: the same value is free for another. */
	ret = rdmax_expect_imm(other, imm, 1);
	itest_assert_err(ret, 0);

	for (size_t i = 0; i < n; i++) {
		jobs[i] =
			itest_job(1000 + i, RDMAX_OP_WRITE, src, offs[i], &desc, offs[i], sizes[i]);
		jobs[i].flags = RDMAX_JOB_IMM;
		jobs[i].imm = imm;
	}
	/* All but the last: the counter must not fire yet. */
	ck_assert_int_eq(rdmax_submit(sender, jobs, n - 1), 0);
	expect_ok_completions(sender, n - 1, jobs);
	/* A write without imm (into the spare byte of job 0) must not count. */
	struct rdmax_job plain = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, offs[0] + sizes[0], 1);
	struct rdmax_event ev = itest_run_job(sender, &plain, ITEST_WAIT_MS);
	ck_assert_int_eq(ev.status, 0);
	/* Nor a write carrying another imm value. */
	plain.id = 2;
	plain.flags = RDMAX_JOB_IMM;
	plain.imm = imm_plain;
	ev = itest_run_job(sender, &plain, ITEST_WAIT_MS);
	ck_assert_int_eq(ev.status, 0);
	itest_assert_quiet(recv, ITEST_QUIET_MS);

	ck_assert_int_eq(rdmax_submit(sender, &jobs[n - 1], 1), 0);
	ev = wait_imm_event(recv, imm, 30000);
	ck_assert_msg(ev.count == n, "IMM_REACHED count %" PRIu64 ", expected %zu", ev.count, n);
	/* When it fires, every write that carried the imm has fully landed. */
	for (size_t i = 0; i < n; i++) {
		char what[64];
		snprintf(what, sizeof(what), "imm write %zu (%" PRIu64 " bytes)", i, sizes[i]);
		itest_assert_mem_eq(itest_bytes(dst) + offs[i], itest_bytes(src) + offs[i],
				    sizes[i], what);
	}
	expect_ok_completions(sender, 1, &jobs[n - 1]);
	itest_assert_quiet(recv, ITEST_QUIET_MS);
	/* Landings in the receiver's region never fire another client's claim. */
	itest_assert_quiet(other, ITEST_QUIET_MS);

	/* Landings before the expectation are kept: it fires at once. */
	const size_t late = 5;
	for (size_t i = 0; i < late; i++) {
		jobs[i].id = 2000 + i;
		jobs[i].imm = imm_late;
	}
	ck_assert_int_eq(rdmax_submit(sender, jobs, late), 0);
	expect_ok_completions(sender, late, jobs);
	itest_assert_quiet(recv, 100);
	ret = rdmax_expect_imm(recv, imm_late, late);
	ck_assert_msg(ret == 0, "rdmax_expect_imm() failed: %s", rdmax_err_name(ret));
	ev = wait_imm_event(recv, imm_late, 2000);
	ck_assert_uint_eq(ev.count, late);
	itest_assert_quiet(recv, ITEST_QUIET_MS);

	/* The other client's claim, renewed, fires for writes into its own region only. */
	rdmax_client_close(recv);
	ret = rdmax_expect_imm(other, imm, 2);
	ck_assert_msg(ret == 0, "imm 0x%x refused: %s", imm, rdmax_err_name(ret));
	struct rdmax_region *dst2 = itest_alloc(other, 2 * MiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc2 = itest_desc(dst2);
	for (size_t i = 0; i < 2; i++) {
		jobs[i] = itest_job(3000 + i, RDMAX_OP_WRITE, src, 0, &desc2, i * MiB, MiB);
		jobs[i].flags = RDMAX_JOB_IMM;
		jobs[i].imm = imm;
	}
	ck_assert_int_eq(rdmax_submit(sender, jobs, 2), 0);
	ev = wait_imm_event(other, imm, 30000);
	ck_assert_uint_eq(ev.count, 2);
	itest_assert_mem_eq(itest_bytes(dst2) + MiB, itest_bytes(src), MiB, "second round");
	expect_ok_completions(sender, 2, jobs);
	itest_assert_quiet(other, ITEST_QUIET_MS);

	itest_pair_end(other, sender, a, b);
}
END_TEST

/* Same-node writes count too: the imm is per node, not per transport. */
START_TEST(imm_same_node)
{
	const uint32_t imm = 0x5eed;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());

	itest_daemon_set(a, "engine.chunk_bytes=%" PRIu64, CHUNK);

	itest_daemon_set(a, "transport.tcp_chunk_bytes=%" PRIu64, CHUNK);
	itest_daemon_start(a);
	struct rdmax_client *sender = itest_client(a, "sender");
	struct rdmax_client *recv = itest_client(a, "receiver");
	struct rdmax_region *src = itest_alloc(sender, 3 * MiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(recv, 3 * MiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_job jobs[3];

	itest_fill(itest_bytes(src), 3 * MiB, 12);
	ck_assert_int_eq(rdmax_expect_imm(recv, imm, 3), 0);
	for (size_t i = 0; i < 3; i++) {
		jobs[i] = itest_job(10 + i, RDMAX_OP_WRITE, src, i * MiB, &desc, i * MiB, MiB);
		jobs[i].flags = RDMAX_JOB_IMM;
		jobs[i].imm = imm;
	}
	ck_assert_int_eq(rdmax_submit(sender, jobs, 3), 0);
	struct rdmax_event ev = wait_imm_event(recv, imm, ITEST_WAIT_MS);
	ck_assert_uint_eq(ev.count, 3);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 3 * MiB, "same-node imm writes");
	expect_ok_completions(sender, 3, jobs);
	itest_assert_quiet(recv, ITEST_QUIET_MS);
	rdmax_client_close(sender);
	rdmax_client_close(recv);
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

/*
 * A standing claim fires once per round of count landings without being
 * claimed again, each round's bytes in place when it fires; released, it
 * fires no more, and what landed meanwhile stays counted for the next claim.
 */
START_TEST(imm_standing_claim)
{
	const uint32_t imm = 0x51a7d, per_round = 3, rounds = 4;
	const uint64_t len = 256 * KiB + 3;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_set(a, "engine.chunk_bytes=%" PRIu64, CHUNK);

	itest_daemon_set(a, "transport.tcp_chunk_bytes=%" PRIu64, CHUNK);
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *sender = itest_client(a, "sender");
	struct rdmax_client *recv = itest_client(b, "receiver");
	struct rdmax_client *other = itest_client(b, "other");
	ck_assert_msg(rdmax_client_info(recv)->capabilities & RDMAX_CAP_IMM_STANDING,
		      "the daemon does not offer RDMAX_CAP_IMM_STANDING");
	struct rdmax_region *src =
		itest_alloc(sender, (rounds + 1) * per_round * len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(recv, per_round * len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_job jobs[3];
	struct rdmax_event ev;

	itest_fill(itest_bytes(src), (rounds + 1) * per_round * len, 13);
	itest_assert_err(rdmax_expect_imm_flags(recv, imm, per_round, 0x80),
			 RDMAX_E_INVALID_ARGUMENT);
	itest_assert_err(rdmax_expect_imm_flags(recv, imm, 0, RDMAX_EXPECT_STANDING),
			 RDMAX_E_INVALID_ARGUMENT);
	itest_assert_err(rdmax_release_imm(recv, imm), RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_expect_imm_flags(recv, imm, per_round, RDMAX_EXPECT_STANDING), 0);
	/* Another client of the same uid can neither release nor see the claim. */
	itest_assert_err(rdmax_release_imm(other, imm), RDMAX_E_NOT_FOUND);
	for (uint32_t r = 0; r <= rounds; r++) {
		/* Each round writes other source bytes over the same destination. */
		for (uint32_t i = 0; i < per_round; i++) {
			jobs[i] = itest_job(100 * (r + 1) + i, RDMAX_OP_WRITE, src,
					    (r * per_round + i) * len, &desc, i * len, len);
			jobs[i].flags = RDMAX_JOB_IMM;
			jobs[i].imm = imm;
		}
		if (r == rounds) {
			itest_assert_err(rdmax_release_imm(recv, imm), 0);
		}
		ck_assert_int_eq(rdmax_submit(sender, jobs, per_round), 0);
		expect_ok_completions(sender, per_round, jobs);
		if (r == rounds) {
			break;
		}
		ev = wait_imm_event(recv, imm, 30000);
		ck_assert_msg(ev.count == per_round, "round %u: IMM_REACHED count %" PRIu64, r,
			      ev.count);
		itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src) + r * per_round * len,
				    per_round * len, "a standing claim's round");
	}
	/* Released: the last round landed without firing, and stays counted. */
	itest_assert_quiet(recv, ITEST_QUIET_MS);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src) + rounds * per_round * len,
			    per_round * len, "the round after the release");
	itest_assert_err(rdmax_release_imm(recv, imm), RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_expect_imm(recv, imm, per_round), 0);
	ev = wait_imm_event(recv, imm, 2000);
	ck_assert_uint_eq(ev.count, per_round);
	itest_assert_quiet(recv, ITEST_QUIET_MS);
	ck_assert_int_eq(rdmax_poll_events(other, &ev, 1, 0), 0);
	rdmax_client_close(other);
	itest_pair_end(recv, sender, a, b);
}
END_TEST

TCase *itest_tcase_imm(void)
{
	TCase *tc = tcase_create("imm");

	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, imm_counts_whole_jobs);
	tcase_add_test(tc, imm_same_node);
	tcase_add_test(tc, imm_standing_claim);
	return tc;
}
