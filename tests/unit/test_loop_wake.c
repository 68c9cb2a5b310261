/* SPDX-License-Identifier: MIT */
/*
 * Wake-ups of the loop from other threads (loop_wake.h): a callback after
 * every send, whatever the interleaving; sends that come before the
 * callback ran fold into it; closing closes the fd.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

#include "loop_wake.h"

Suite *loop_wake_suite(void);

#define SENDERS 4
#define SENDS   20000

static atomic_uint_fast64_t g_published;
static atomic_uint g_finished;
static uint64_t g_seen;
static unsigned g_seen_finished;
static uint64_t g_calls;
static atomic_bool g_timed_out;

static void on_wake(struct loop_wake *w)
{
	(void)w;
	g_calls++;
	/* What the senders published before their send is visible here. */
	g_seen_finished = atomic_load(&g_finished);
	g_seen = atomic_load(&g_published);
}

static void *sender(void *arg)
{
	struct loop_wake *w = arg;

	for (int i = 0; i < SENDS; i++) {
		atomic_fetch_add(&g_published, 1);
		loop_wake_send(w);
	}
	atomic_fetch_add(&g_finished, 1);
	loop_wake_send(w);
	return NULL;
}

static void on_deadline(uv_timer_t *timer)
{
	(void)timer;
	g_timed_out = true;
}

/*
 * Rounds of two sends in a row, the second while the loop is likely inside
 * the callback for the first: the second must not be lost.
 */
#define ROUNDS 20000
static atomic_uint_fast64_t g_acked;

static void on_wake_ack(struct loop_wake *w)
{
	(void)w;
	g_calls++;
	g_seen = atomic_load(&g_published);
	if (g_seen % 2 == 0) {
		atomic_store(&g_acked, g_seen);
	}
}

static void *round_sender(void *arg)
{
	struct loop_wake *w = arg;

	for (uint64_t r = 0; r < ROUNDS && !g_timed_out; r++) {
		atomic_store(&g_published, 2 * r + 1);
		loop_wake_send(w);
		atomic_store(&g_published, 2 * r + 2);
		loop_wake_send(w);
		while (atomic_load(&g_acked) < 2 * r + 2 && !g_timed_out) {
		}
	}
	return NULL;
}

static void on_closed(uv_handle_t *handle)
{
	*(int *)handle->data += 1;
}

/* A loop with a wake-up handle and, with deadline_ms, a deadline timer. */
struct fixture {
	uv_loop_t loop;
	uv_timer_t deadline;
	struct loop_wake w;
	int closed;
};

static void fixture_open(struct fixture *f, loop_wake_cb cb, uint64_t deadline_ms)
{
	/* Each test starts from nothing seen, forked by check or not. */
	atomic_store(&g_published, 0);
	atomic_store(&g_finished, 0);
	atomic_store(&g_acked, 0);
	atomic_store(&g_timed_out, false);
	g_seen = g_calls = 0;
	g_seen_finished = 0;
	ck_assert_int_eq(uv_loop_init(&f->loop), 0);
	ck_assert_int_eq(loop_wake_init(&f->loop, &f->w, cb), 0);
	f->w.poll.data = &f->closed;
	uv_timer_init(&f->loop, &f->deadline);
	if (deadline_ms) {
		uv_timer_start(&f->deadline, on_deadline, deadline_ms, 0);
	}
}

/* Close the handle: its callback runs once, and the loop is left with nothing. */
static void fixture_close(struct fixture *f)
{
	loop_wake_close(&f->w, on_closed);
	uv_close((uv_handle_t *)&f->deadline, NULL);
	ck_assert_int_eq(uv_run(&f->loop, UV_RUN_DEFAULT), 0);
	ck_assert_int_eq(f->closed, 1);
	ck_assert_int_eq(uv_loop_close(&f->loop), 0);
}

START_TEST(loop_wake_runs_after_every_send)
{
	struct fixture f = {0};
	pthread_t threads[SENDERS];

	fixture_open(&f, on_wake, 20000);
	for (int i = 0; i < SENDERS; i++) {
		ck_assert_int_eq(pthread_create(&threads[i], NULL, sender, &f.w), 0);
	}
	/*
	 * Each sender's last send comes after it counted itself finished: a
	 * wake-up lost between the senders and the loop leaves the loop asleep
	 * with something unseen, until the deadline.
	 */
	while (!g_timed_out && (g_seen_finished < SENDERS || g_seen < (uint64_t)SENDERS * SENDS)) {
		uv_run(&f.loop, UV_RUN_ONCE);
	}
	for (int i = 0; i < SENDERS; i++) {
		pthread_join(threads[i], NULL);
	}
	ck_assert_msg(!g_timed_out, "the loop saw %lu of %d sends and %u of %d senders finish",
		      (unsigned long)g_seen, SENDERS * SENDS, g_seen_finished, SENDERS);
	ck_assert_uint_eq(g_seen, (uint64_t)SENDERS * SENDS);
	ck_assert_uint_ge(g_calls, 1);
	ck_assert_uint_le(g_calls, (uint64_t)SENDERS * (SENDS + 1));
	fixture_close(&f);
}
END_TEST

START_TEST(loop_wake_sees_a_send_during_its_callback)
{
	struct fixture f = {0};
	pthread_t thread;

	fixture_open(&f, on_wake_ack, 20000);
	ck_assert_int_eq(pthread_create(&thread, NULL, round_sender, &f.w), 0);
	while (!g_timed_out && atomic_load(&g_acked) < 2 * ROUNDS) {
		uv_run(&f.loop, UV_RUN_ONCE);
	}
	pthread_join(thread, NULL);
	ck_assert_msg(!g_timed_out, "a send was lost in round %lu of %d",
		      (unsigned long)atomic_load(&g_acked) / 2 + 1, ROUNDS);
	ck_assert_uint_le(g_calls, 2 * ROUNDS);
	fixture_close(&f);
}
END_TEST

START_TEST(loop_wake_folds_sends_before_the_callback)
{
	struct fixture f = {0};

	fixture_open(&f, on_wake, 0);
	uv_run(&f.loop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(g_calls, 0); /* nothing sent, nothing called */
	loop_wake_send(&f.w);
	loop_wake_send(&f.w);
	loop_wake_send(&f.w);
	uv_run(&f.loop, UV_RUN_ONCE);
	ck_assert_uint_eq(g_calls, 1);
	uv_run(&f.loop, UV_RUN_NOWAIT);
	ck_assert_uint_eq(g_calls, 1); /* the three folded into one */
	loop_wake_send(&f.w);          /* after the callback: called again */
	uv_run(&f.loop, UV_RUN_ONCE);
	ck_assert_uint_eq(g_calls, 2);

	int fd = f.w.fd;
	fixture_close(&f);
	ck_assert_int_eq(f.w.fd, -1);
	ck_assert_int_eq(fcntl(fd, F_GETFD), -1); /* closed with the handle */
	ck_assert_int_eq(errno, EBADF);
}
END_TEST

Suite *loop_wake_suite(void)
{
	Suite *s = suite_create("loop_wake");
	TCase *tc = tcase_create("loop_wake");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, loop_wake_runs_after_every_send);
	tcase_add_test(tc, loop_wake_sees_a_send_during_its_callback);
	tcase_add_test(tc, loop_wake_folds_sends_before_the_callback);
	suite_add_tcase(s, tc);
	return s;
}
