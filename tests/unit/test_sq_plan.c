/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the verbs transport's send-queue planner (suite "sq_plan"),
 * without a device: credits, selective signaling, the inline decision,
 * multi-WR xfers, retirement after errors and drains. Every outcome the
 * planner reports is logged and compared; nothing here posts a real WR.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "log.h"
#include "rdmax.h"
#include "txfer.h"
#include "verbs.h"

Suite *sq_plan_suite(void);

struct outcome_log {
	struct xfer *xfer[64];
	enum sq_outcome outcome[64];
	size_t n;
};

static void log_outcome(void *arg, struct xfer *xfer, enum sq_outcome outcome)
{
	struct outcome_log *log = arg;

	ck_assert_uint_lt(log->n, 64);
	log->xfer[log->n] = xfer;
	log->outcome[log->n] = outcome;
	log->n++;
}

static void queue_xfers(struct list_node *q, uint32_t *n, struct txfer *x, size_t count,
			enum xfer_op op, uint64_t length)
{
	for (size_t i = 0; i < count; i++) {
		unit_txfer_init(&x[i], op, length, 1);
		list_add_tail(q, &x[i].x.link);
		(*n)++;
	}
}

START_TEST(planner_credits)
{
	struct sq_plan plan;
	struct list_node q;
	uint32_t queued = 0;
	struct txfer x[12];
	struct wr_desc out[16];
	struct outcome_log log = {0};

	list_init(&q);
	ck_assert_int_eq(sq_plan_init(&plan, 8, 4, 0, 1 << 20), 0);
	ck_assert_uint_eq(sq_plan_credits(&plan), 7); /* one slot for the marker */
	queue_xfers(&q, &queued, x, 12, XFER_WRITE, 100);
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 16, out), 7);
	ck_assert_uint_eq(queued, 5);
	ck_assert_uint_eq(sq_plan_credits(&plan), 0);
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 16, out), 0);
	/* Signaled: the 4th (interval) and the last. */
	ck_assert(out[3].signaled && out[6].signaled);
	ck_assert(!out[0].signaled && !out[4].signaled);
	/* Unsignaled WRs give no completion: the 4th completing frees 4 slots at once. */
	ck_assert_uint_eq(sq_plan_complete(&plan, out[3].seq, true, false, log_outcome, &log), 4);
	ck_assert_uint_eq(log.n, 4);
	for (size_t i = 0; i < 4; i++) {
		ck_assert_ptr_eq(log.xfer[i], &x[i].x);
		ck_assert_int_eq(log.outcome[i], SQ_OK);
	}
	ck_assert_uint_eq(sq_plan_credits(&plan), 4);
	ck_assert_uint_eq(sq_plan_outstanding(&plan), 3);
	/* Stale and unknown seqs are ignored. */
	ck_assert_uint_eq(sq_plan_complete(&plan, out[1].seq, true, false, log_outcome, &log), 0);
	ck_assert_uint_eq(sq_plan_complete(&plan, 1000, true, false, log_outcome, &log), 0);
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 16, out), 4);
	ck_assert_uint_eq(queued, 1);
	sq_plan_fini(&plan);
}
END_TEST

START_TEST(planner_signal_interval)
{
	struct sq_plan plan;
	struct list_node q;
	uint32_t queued = 0;
	struct txfer x[12];
	struct wr_desc out[16];

	list_init(&q);
	ck_assert_int_eq(sq_plan_init(&plan, 64, 5, 0, 1 << 20), 0);
	queue_xfers(&q, &queued, x, 12, XFER_READ, 4096);
	/* Two post lists of 3: each ends signaled, so neither can stall. */
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 3, out), 3);
	ck_assert(!out[0].signaled && !out[1].signaled && out[2].signaled);
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 3, out), 3);
	ck_assert(!out[0].signaled && !out[1].signaled && out[2].signaled);
	/* A longer list: every 5th, then the tail. */
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 6, out), 6);
	for (size_t i = 0; i < 6; i++) {
		ck_assert_msg(out[i].signaled == (i == 4 || i == 5), "WR %zu", i);
		ck_assert_int_eq(out[i].kind, WR_READ);
		ck_assert(!out[i].inline_data);
	}
	sq_plan_fini(&plan);
}
END_TEST

START_TEST(planner_inline_and_split)
{
	struct sq_plan plan;
	struct list_node q;
	uint32_t queued = 0;
	struct txfer a, b, c, d, e;
	struct wr_desc out[16];

	list_init(&q);
	ck_assert_int_eq(sq_plan_init(&plan, 8, 16, 64, 1000), 0);
	unit_txfer_init(&a, XFER_WRITE, 64, 1);
	unit_txfer_init(&b, XFER_WRITE, 65, 1);
	unit_txfer_init(&c, XFER_WRITE, 0, 1);
	c.x.has_imm = true;
	c.x.imm = 7;
	unit_txfer_init(&d, XFER_WRITE, 2500, 1);
	d.x.has_imm = true;
	unit_txfer_init(&e, XFER_WRITE, 3000, 1);
	list_add_tail(&q, &a.x.link);
	list_add_tail(&q, &b.x.link);
	list_add_tail(&q, &c.x.link);
	list_add_tail(&q, &d.x.link);
	list_add_tail(&q, &e.x.link);
	queued = 5;
	/* 1 + 1 + 1 + 3 WRs fit the 7 credits; e needs 3 more and waits whole. */
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 16, out), 6);
	ck_assert_uint_eq(queued, 1);
	ck_assert(out[0].inline_data);  /* 64 bytes: at the threshold */
	ck_assert(!out[1].inline_data); /* 65: above it */
	ck_assert(!out[2].inline_data); /* empty imm-only write */
	ck_assert_int_eq(out[2].kind, WR_WRITE_IMM);
	ck_assert_uint_eq(out[2].length, 0);
	/* d is split at max_wr_bytes; only its last WR carries the imm. */
	ck_assert_int_eq(out[3].kind, WR_WRITE);
	ck_assert_int_eq(out[4].kind, WR_WRITE);
	ck_assert_int_eq(out[5].kind, WR_WRITE_IMM);
	ck_assert_uint_eq(out[3].offset, 0);
	ck_assert_uint_eq(out[4].offset, 1000);
	ck_assert_uint_eq(out[5].offset, 2000);
	ck_assert_uint_eq(out[5].length, 500);
	ck_assert_uint_eq(sq_plan_wrs_for(&plan, &e.x), 3);
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 16, out), 0);
	sq_plan_fini(&plan);
}
END_TEST

START_TEST(planner_error_and_drain)
{
	struct sq_plan plan;
	struct list_node q;
	uint32_t queued = 0;
	struct txfer x[6];
	struct wr_desc out[16], marker;
	struct outcome_log log = {0};

	list_init(&q);
	ck_assert_int_eq(sq_plan_init(&plan, 16, 16, 0, 1000), 0);
	queue_xfers(&q, &queued, x, 2, XFER_WRITE, 100);
	unit_txfer_init(&x[2], XFER_WRITE, 2500, 1); /* 3 WRs */
	list_add_tail(&q, &x[2].x.link);
	queued++;
	queue_xfers(&q, &queued, x + 3, 3, XFER_WRITE, 100);
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 16, out), 8);
	/* The middle WR of x[2] fails: x0, x1 completed; x2 is the cause; the rest flush. */
	ck_assert_uint_eq(sq_plan_complete(&plan, out[3].seq, false, false, log_outcome, &log), 4);
	ck_assert_uint_eq(log.n, 2);
	ck_assert_int_eq(log.outcome[0], SQ_OK);
	ck_assert_int_eq(log.outcome[1], SQ_OK);
	ck_assert_uint_eq(sq_plan_credits(&plan), 0); /* failed: nothing more is posted */
	/* x3 flushes with a completion; the others flush silently: the marker ends it. */
	ck_assert_uint_eq(sq_plan_complete(&plan, out[5].seq, false, true, log_outcome, &log), 2);
	ck_assert_uint_eq(log.n, 4);
	ck_assert_ptr_eq(log.xfer[2], &x[2].x);
	ck_assert_int_eq(log.outcome[2], SQ_FAILED_CAUSE);
	ck_assert_ptr_eq(log.xfer[3], &x[3].x);
	ck_assert_int_eq(log.outcome[3], SQ_FAILED_FLUSH);
	sq_plan_marker(&plan, &marker);
	ck_assert_int_eq(marker.kind, WR_MARKER);
	ck_assert(marker.signaled);
	ck_assert_uint_eq(marker.seq, out[7].seq + 1);
	ck_assert_uint_eq(sq_plan_complete(&plan, marker.seq, false, true, log_outcome, &log), 3);
	ck_assert_uint_eq(log.n, 6);
	ck_assert_int_eq(log.outcome[4], SQ_FAILED_FLUSH);
	ck_assert_int_eq(log.outcome[5], SQ_FAILED_FLUSH);
	ck_assert_uint_eq(sq_plan_outstanding(&plan), 0);
	ck_assert_uint_eq(sq_plan_fail_all(&plan, log_outcome, &log), 0);
	ck_assert_uint_eq(log.n, 6);
	sq_plan_fini(&plan);
}
END_TEST

START_TEST(planner_drain_keeps_confirmed_successes)
{
	struct sq_plan plan;
	struct list_node q;
	uint32_t queued = 0;
	struct txfer x[4];
	struct wr_desc out[8];
	struct outcome_log log = {0};

	list_init(&q);
	ck_assert_int_eq(sq_plan_init(&plan, 16, 2, 0, 1000), 0);
	queue_xfers(&q, &queued, x, 4, XFER_WRITE, 100);
	ck_assert_uint_eq(sq_plan_build(&plan, &q, &queued, 8, out), 4);
	/* Draining starts (peer disconnected); a success still arriving confirms x0, x1. */
	sq_plan_begin_drain(&plan);
	ck_assert_uint_eq(sq_plan_complete(&plan, out[1].seq, true, false, log_outcome, &log), 2);
	ck_assert_int_eq(log.outcome[0], SQ_OK);
	ck_assert_int_eq(log.outcome[1], SQ_OK);
	/* What no completion confirmed fails. */
	ck_assert_uint_eq(sq_plan_fail_all(&plan, log_outcome, &log), 2);
	ck_assert_int_eq(log.outcome[2], SQ_FAILED_FLUSH);
	ck_assert_int_eq(log.outcome[3], SQ_FAILED_FLUSH);
	sq_plan_fini(&plan);
}
END_TEST

Suite *sq_plan_suite(void)
{
	Suite *s = suite_create("sq_plan");
	TCase *tc = tcase_create("send queue");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, planner_credits);
	tcase_add_test(tc, planner_signal_interval);
	tcase_add_test(tc, planner_inline_and_split);
	tcase_add_test(tc, planner_error_and_drain);
	tcase_add_test(tc, planner_drain_keeps_confirmed_successes);
	suite_add_tcase(s, tc);
	return s;
}
