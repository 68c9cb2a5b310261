/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the verbs transport's posting thread (suite "post_thread"),
 * with a fake post call in place of ibv_post_send(): every WR the thread
 * posts is recorded, a post can be made to fail or to block until the test
 * releases it. They check that lists are posted in the order handed over,
 * from copies; that a QP's failure comes back to the loop once and drops the
 * QP's later lists but its drain marker; and that settling a QP withdraws
 * what was not posted, waits for the post in progress and forgets the QP's
 * unreported failure.
 */
#include <check.h>
#include <stdio.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sched.h>
#include <time.h>

#include "fixtures.h"
#include "log.h"
#include "post_thread.h"

Suite *post_thread_suite(void);

#define MAX_SEEN 64

struct seen_wr {
	void *qp;
	uint64_t wr_id;
	uint64_t addr;
	uint32_t length;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct seen_wr seen[MAX_SEEN]; /* every WR of every post call, in call order */
	size_t n_seen;
	size_t calls;
	uint64_t fail_wr_id; /* a list whose first WR has this id fails; 0: none */
	/* A list whose first WR has block_wr_id[i] waits for release(i) (0: none). */
	uint64_t block_wr_id[2];
	bool blocked[2]; /* that post call has started */
	bool released[2];
	bool block_returned[2]; /* that post call is about to return */
	bool settling;          /* the settling thread is about to settle */
	/* failed() calls, on the loop */
	void *failed_owner[8];
	bool failed_marker[8];
	int failed_err[8];
	size_t n_failed;
	bool closed;
} g;

static int fake_post(void *qp, struct ibv_send_wr *wrs)
{
	pthread_mutex_lock(&g.lock);
	g.calls++;
	for (struct ibv_send_wr *w = wrs; w; w = w->next) {
		ck_assert_uint_lt(g.n_seen, MAX_SEEN);
		struct seen_wr *s = &g.seen[g.n_seen++];
		s->qp = qp;
		s->wr_id = w->wr_id;
		s->addr = w->num_sge ? w->sg_list[0].addr : 0;
		s->length = w->num_sge ? w->sg_list[0].length : 0;
	}
	int ret = wrs->wr_id == g.fail_wr_id ? -EIO : 0;
	for (int i = 0; i < 2; i++) {
		if (wrs->wr_id != g.block_wr_id[i]) {
			continue;
		}
		g.blocked[i] = true;
		pthread_cond_broadcast(&g.cond);
		while (!g.released[i]) {
			pthread_cond_wait(&g.cond, &g.lock);
		}
		g.block_returned[i] = true;
	}
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
	return ret;
}

static void fake_failed(void *arg, void *owner, bool marker, int err)
{
	ck_assert_uint_lt(g.n_failed, 8);
	g.failed_owner[g.n_failed] = owner;
	g.failed_marker[g.n_failed] = marker;
	g.failed_err[g.n_failed] = err;
	g.n_failed++;
}

static void on_closed(void *arg)
{
	g.closed = true;
}

/* Wait (bounded) until the thread has made `calls` post calls in all. */
static void wait_calls(size_t calls)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&g.lock);
	while (g.calls < calls) {
		ck_assert_msg(pthread_cond_timedwait(&g.cond, &g.lock, &until) == 0 ||
				      g.calls >= calls,
			      "%zu post calls, waited for %zu", g.calls, calls);
	}
	pthread_mutex_unlock(&g.lock);
}

/* Until *flag (one of g's, under its lock) is set. */
static void wait_flag(const bool *flag)
{
	pthread_mutex_lock(&g.lock);
	while (!*flag) {
		pthread_cond_wait(&g.cond, &g.lock);
	}
	pthread_mutex_unlock(&g.lock);
}

static void set_flag(bool *flag)
{
	pthread_mutex_lock(&g.lock);
	*flag = true;
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
}

/* Until the QP has nothing on the thread (its lists posted or dropped). */
static void wait_idle(struct post_qp *q)
{
	while (post_qp_busy(q)) {
		sched_yield();
	}
}

/* A thread with the fake post call, and two QPs a and b whose owners are themselves. */
struct fixture {
	uv_loop_t loop;
	struct post_thread *pt;
	struct post_qp a, b;
	int qa, qb; /* what the QPs' post calls are given */
};

static void init_qp(struct post_qp *q, void *qp)
{
	memset(q, 0, sizeof(*q));
	q->qp = qp;
	q->owner = q;
}

static void setup(struct fixture *f)
{
	memset(&g, 0, sizeof(g));
	pthread_mutex_init(&g.lock, NULL);
	pthread_cond_init(&g.cond, NULL);
	ck_assert_int_eq(uv_loop_init(&f->loop), 0);
	ck_assert_int_eq(post_thread_create(&f->loop, fake_post, fake_failed, NULL, &f->pt), 0);
	init_qp(&f->a, &f->qa);
	init_qp(&f->b, &f->qb);
}

static void teardown(struct fixture *f)
{
	post_thread_stop(f->pt, on_closed);
	while (!g.closed) {
		uv_run(&f->loop, UV_RUN_ONCE);
	}
	ck_assert_int_eq(uv_loop_close(&f->loop), 0);
	pthread_cond_destroy(&g.cond);
	pthread_mutex_destroy(&g.lock);
}

/* Run the loop until failed() was called `calls` times in all. */
static void wait_failed(struct fixture *f, size_t calls)
{
	while (g.n_failed < calls) {
		uv_run(&f->loop, UV_RUN_ONCE);
	}
	uv_run(&f->loop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(g.n_failed, calls);
}

/* A list of n WRs with ids from first on, each with one SGE at addr 0x1000 * id. */
static void make_list(struct ibv_send_wr *wrs, struct ibv_sge *sges, size_t n, uint64_t first)
{
	memset(wrs, 0, n * sizeof(*wrs));
	for (size_t i = 0; i < n; i++) {
		wrs[i].wr_id = first + i;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
		sges[i].addr = 0x1000 * (first + i);
		sges[i].length = (uint32_t)(first + i);
		wrs[i].sg_list = &sges[i];
		wrs[i].num_sge = 1;
	}
}

START_TEST(post_thread_order_and_copies)
{
	struct fixture f;
	struct ibv_send_wr wrs[4];
	struct ibv_sge sges[4];

	setup(&f);
	/* Hold the thread in the first call, so the next lists queue behind it. */
	g.block_wr_id[0] = 1;
	make_list(wrs, sges, 1, 1);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	wait_flag(&g.blocked[0]);
	make_list(wrs, sges, 3, 2);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	/* The caller's scratch is reused at once: the thread must have copied it. */
	make_list(wrs, sges, 4, 90);
	make_list(wrs, sges, 2, 5);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.b, wrs, false), 0);
	make_list(wrs, sges, 4, 90);
	make_list(wrs, sges, 1, 7);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, true), 0);
	ck_assert(post_qp_busy(&f.a));
	ck_assert(post_qp_busy(&f.b));
	set_flag(&g.released[0]);
	wait_calls(4);
	wait_idle(&f.a);
	wait_idle(&f.b);
	ck_assert_uint_eq(g.n_seen, 7);
	for (size_t i = 0; i < 7; i++) {
		ck_assert_uint_eq(g.seen[i].wr_id, i + 1);
		ck_assert_uint_eq(g.seen[i].addr, 0x1000 * (i + 1));
		ck_assert_uint_eq(g.seen[i].length, i + 1);
		ck_assert_ptr_eq(g.seen[i].qp, i == 4 || i == 5 ? (void *)&f.qb : (void *)&f.qa);
	}
	ck_assert_uint_eq(post_qp_settle(&f.a), 0);
	uv_run(&f.loop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(g.n_failed, 0);
	teardown(&f);
}
END_TEST

START_TEST(post_thread_failure_drops_all_but_the_marker)
{
	struct fixture f;
	struct ibv_send_wr wrs[2];
	struct ibv_sge sges[2];

	setup(&f);
	g.block_wr_id[0] = 1;
	g.fail_wr_id = 10;
	make_list(wrs, sges, 1, 1);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.b, wrs, false), 0);
	wait_flag(&g.blocked[0]);
	make_list(wrs, sges, 2, 10); /* fails */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	make_list(wrs, sges, 2, 12); /* after a's failure: must not reach the device */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	make_list(wrs, sges, 1, 14); /* another QP: unaffected */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.b, wrs, false), 0);
	make_list(wrs, sges, 1, 15); /* a's drain marker: still posted */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, true), 0);
	set_flag(&g.released[0]);
	wait_calls(4);
	wait_idle(&f.a);
	wait_idle(&f.b);
	uint64_t want[] = {1, 10, 11, 14, 15};
	ck_assert_uint_eq(g.n_seen, ARRAY_SIZE(want));
	for (size_t i = 0; i < ARRAY_SIZE(want); i++) {
		ck_assert_uint_eq(g.seen[i].wr_id, want[i]);
	}
	/* The failure reaches the loop once, as a data list's. */
	wait_failed(&f, 1);
	ck_assert_ptr_eq(g.failed_owner[0], &f.a);
	ck_assert(!g.failed_marker[0]);
	ck_assert_int_eq(g.failed_err[0], -EIO);

	/* A marker that fails is reported as the marker's. */
	g.fail_wr_id = 16;
	make_list(wrs, sges, 1, 16);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, true), 0);
	wait_failed(&f, 2);
	ck_assert_ptr_eq(g.failed_owner[1], &f.a);
	ck_assert(g.failed_marker[1]);
	ck_assert_int_eq(g.failed_err[1], -EIO);
	teardown(&f);
}
END_TEST

struct settler {
	struct post_qp *q;
	pid_t tid;
	uint32_t withdrawn;
	bool in_progress_returned; /* the blocked post had returned when settle did */
	bool returned;             /* (g.lock) */
};

static void *settle_main(void *arg)
{
	struct settler *s = arg;

	s->tid = (pid_t)syscall(SYS_gettid);
	set_flag(&g.settling);
	s->withdrawn = post_qp_settle(s->q);
	pthread_mutex_lock(&g.lock);
	s->in_progress_returned = g.block_returned[0];
	s->returned = true;
	pthread_mutex_unlock(&g.lock);
	return NULL;
}

START_TEST(post_thread_settle_withdraws_and_waits)
{
	struct fixture f;
	struct ibv_send_wr wrs[2];
	struct ibv_sge sges[2];
	struct settler s = {0};
	pthread_t settle_thread;

	setup(&f);
	s.q = &f.a;
	g.block_wr_id[0] = 1;
	g.block_wr_id[1] = 4;
	make_list(wrs, sges, 1, 1); /* a's, being posted when a is settled */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	wait_flag(&g.blocked[0]);
	make_list(wrs, sges, 1, 4); /* b's: next, and held there, so a's below wait behind it */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.b, wrs, false), 0);
	make_list(wrs, sges, 2, 2); /* a's, not yet posted: withdrawn */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	make_list(wrs, sges, 1, 5); /* a's marker: withdrawn too */
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, true), 0);
	ck_assert_int_eq(pthread_create(&settle_thread, NULL, settle_main, &s), 0);
	/*
	 * The settle must not return before the post call of a's it found in
	 * progress: released only once the settling thread sleeps in the settle
	 * (or, settling wrongly, has returned without waiting).
	 */
	wait_flag(&g.settling);
	for (;;) {
		pthread_mutex_lock(&g.lock);
		bool returned = s.returned;
		pthread_mutex_unlock(&g.lock);
		if (returned || unit_thread_sleeps(s.tid)) {
			break;
		}
		sched_yield();
	}
	set_flag(&g.released[0]);
	ck_assert_int_eq(pthread_join(settle_thread, NULL), 0);
	ck_assert(s.in_progress_returned);
	ck_assert_uint_eq(s.withdrawn, 2);
	ck_assert(!post_qp_busy(&f.a));
	set_flag(&g.released[1]);
	wait_calls(2);
	wait_idle(&f.b);
	ck_assert_uint_eq(g.n_seen, 2);
	ck_assert_uint_eq(g.seen[0].wr_id, 1);
	ck_assert_uint_eq(g.seen[1].wr_id, 4);
	ck_assert_ptr_eq(g.seen[1].qp, &f.qb);
	teardown(&f);
}
END_TEST

START_TEST(post_thread_settle_forgets_the_failure)
{
	struct fixture f;
	struct ibv_send_wr wrs[1];
	struct ibv_sge sges[1];

	setup(&f);
	g.fail_wr_id = 1;
	make_list(wrs, sges, 1, 1);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	wait_calls(1);
	wait_idle(&f.a);
	/* Settled (its WRs failed, or it is destroyed) before the loop took the report. */
	ck_assert_uint_eq(post_qp_settle(&f.a), 0);
	g.fail_wr_id = 2;
	make_list(wrs, sges, 1, 2);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.b, wrs, false), 0);
	wait_failed(&f, 1);
	ck_assert_ptr_eq(g.failed_owner[0], &f.b);
	teardown(&f);
}
END_TEST

/*
 * A settle whose post call does not return within the threshold is counted
 * (and logged), and still waits for it: the loop never returns from a settle
 * while the post is in progress.
 */
START_TEST(post_thread_settle_counts_a_long_wait)
{
	struct fixture f;
	struct ibv_send_wr wrs[1];
	struct ibv_sge sges[1];
	struct settler s = {0};
	pthread_t settle_thread;

	setup(&f);
	int level = log_get_level();
	log_set_level(LOG_ERR); /* the two warnings are expected */
	post_thread_set_settle_warn_ms(f.pt, 20);
	g.block_wr_id[0] = 1;
	make_list(wrs, sges, 1, 1);
	ck_assert_int_eq(post_thread_submit(f.pt, &f.a, wrs, false), 0);
	wait_flag(&g.blocked[0]);
	s.q = &f.a;
	ck_assert_int_eq(pthread_create(&settle_thread, NULL, settle_main, &s), 0);
	while (post_thread_slow_settles(f.pt) == 0) {
		sched_yield();
	}
	pthread_mutex_lock(&g.lock);
	ck_assert(!s.returned);
	pthread_mutex_unlock(&g.lock);
	set_flag(&g.released[0]);
	ck_assert_int_eq(pthread_join(settle_thread, NULL), 0);
	ck_assert(s.in_progress_returned);
	ck_assert_uint_eq(post_thread_slow_settles(f.pt), 1);
	/* A settle with nothing in progress waits for nothing. */
	ck_assert_uint_eq(post_qp_settle(&f.a), 0);
	ck_assert_uint_eq(post_thread_slow_settles(f.pt), 1);
	log_set_level(level);
	teardown(&f);
}
END_TEST

Suite *post_thread_suite(void)
{
	Suite *s = suite_create("post_thread");
	TCase *tc = tcase_create("posting thread");

	tcase_add_test(tc, post_thread_order_and_copies);
	tcase_add_test(tc, post_thread_failure_drops_all_but_the_marker);
	tcase_add_test(tc, post_thread_settle_withdraws_and_waits);
	tcase_add_test(tc, post_thread_settle_forgets_the_failure);
	tcase_add_test(tc, post_thread_settle_counts_a_long_wait);
	suite_add_tcase(s, tc);
	return s;
}
