/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory ring (proto/rdmax_ring.h): the library's side
 * (client-lib/ring.c) and the daemon's (daemon/ring.c) on one real sealed
 * memfd mapped twice, as the two processes map it. Index arithmetic, wrap,
 * full rings both ways, the wake flags, and a hostile client: indices moved
 * backwards or far forwards, lengths that do not fit a slot, entries rewritten
 * after the daemon copied them, files it could shrink or that are too small.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fixtures.h"
#include "../../client-lib/internal.h"
#include "rdmax.h"
#include "ring.h"

Suite *ring_suite(void);
void ring_codec_tcases(Suite *s); /* test_job_codec.c */

#define SQ  8u
#define SQE 256u
#define CQ  4u

struct pair {
	struct client_ring c;
	struct ring d;
	int fd;
};

static void pair_open(struct pair *p, uint32_t sq, uint32_t sqe, uint32_t cq)
{
	ck_assert_int_eq(client_ring_create(sq, sqe, cq, &p->c, &p->fd), 0);
	ck_assert_int_eq(ring_map(p->fd, sq, sqe, cq, &p->d), 0);
	close(p->fd);
	p->fd = -1;
}

static void pair_close(struct pair *p)
{
	ring_unmap(&p->d);
	client_ring_destroy(&p->c);
}

/* Publish one entry of `len` bytes of value `fill`, written with `after`. */
static bool push(struct pair *p, uint32_t len, uint8_t fill, uint64_t after)
{
	uint8_t *data = client_ring_sqe_prepare(&p->c, 0, len, after);
	memset(data, fill, len);
	return client_ring_sq_publish(&p->c, 1);
}

START_TEST(ring_sizes)
{
	ck_assert(rdmax_ring_sizes_ok(2, 128, 2));
	ck_assert(rdmax_ring_sizes_ok(256, 1024, 1024));
	ck_assert(!rdmax_ring_sizes_ok(0, 1024, 1024));
	ck_assert(!rdmax_ring_sizes_ok(1, 1024, 1024));
	ck_assert(!rdmax_ring_sizes_ok(3, 1024, 1024));
	ck_assert(!rdmax_ring_sizes_ok(256, 1000, 1024));
	ck_assert(!rdmax_ring_sizes_ok(256, 64, 1024));
	ck_assert(!rdmax_ring_sizes_ok(256, 1024, 131072));
	ck_assert(!rdmax_ring_sizes_ok(65536, 65536, 2)); /* 4 GiB: over the total */
	ck_assert(!rdmax_ring_sizes_ok(UINT32_MAX, 1024, 2));
	ck_assert_uint_eq(rdmax_ring_bytes(8, 256, 4), 4096 + 8 * 256 + 4 * 192);
}
END_TEST

START_TEST(ring_map_refuses)
{
	size_t need = rdmax_ring_bytes(SQ, SQE, CQ);
	struct ring r;
	int fd, pipefd[2];

	/* A client that could shrink or grow the file under the daemon's mapping. */
	fd = unit_sealed_memfd(need, 0);
	ck_assert_int_eq(ring_map(fd, SQ, SQE, CQ, &r), RDMAX_E_PERMISSION_DENIED);
	close(fd);
	fd = unit_sealed_memfd(need, F_SEAL_SHRINK);
	ck_assert_int_eq(ring_map(fd, SQ, SQE, CQ, &r), RDMAX_E_PERMISSION_DENIED);
	close(fd);
	/* Truncated before sealing: smaller than the sizes need. */
	fd = unit_sealed_memfd(need - 1, F_SEAL_SHRINK | F_SEAL_GROW);
	ck_assert_int_eq(ring_map(fd, SQ, SQE, CQ, &r), RDMAX_E_OUT_OF_RANGE);
	close(fd);
	/* Sealed against writes: the daemon could not post completions. */
	fd = unit_sealed_memfd(need, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
	ck_assert_int_eq(ring_map(fd, SQ, SQE, CQ, &r), RDMAX_E_PERMISSION_DENIED);
	close(fd);
	/* Read-only fd of a good file. */
	fd = unit_sealed_memfd(need, F_SEAL_SHRINK | F_SEAL_GROW);
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	int ro = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(ro, 0);
	ck_assert_int_eq(ring_map(ro, SQ, SQE, CQ, &r), RDMAX_E_PERMISSION_DENIED);
	close(ro);
	/* Sizes that are not powers of two, or past the limits. */
	ck_assert_int_eq(ring_map(fd, SQ + 1, SQE, CQ, &r), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(ring_map(fd, SQ, 100000, CQ, &r), RDMAX_E_INVALID_ARGUMENT);
	/* The same file, right sizes: accepted. */
	ck_assert_int_eq(ring_map(fd, SQ, SQE, CQ, &r), 0);
	ring_unmap(&r);
	ring_unmap(&r); /* twice is harmless */
	close(fd);
	/* Not a regular file. */
	ck_assert_int_eq(pipe(pipefd), 0);
	ck_assert_int_eq(ring_map(pipefd[0], SQ, SQE, CQ, &r), RDMAX_E_INVALID_ARGUMENT);
	close(pipefd[0]);
	close(pipefd[1]);
}
END_TEST

START_TEST(ring_submissions_wrap)
{
	struct pair p;
	uint8_t buf[SQE];

	pair_open(&p, SQ, SQE, CQ);
	ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, sizeof(buf)), -EAGAIN);
	/* Five laps of the ring, in bursts that leave it full then empty. */
	uint32_t sent = 0, got = 0;
	for (int lap = 0; lap < 5; lap++) {
		while (client_ring_sq_space(&p.c) > 0) {
			uint32_t len = 1 + (sent * 37) % client_ring_sqe_max(&p.c);
			push(&p, len, (uint8_t)sent, 0);
			sent++;
		}
		ck_assert_uint_eq(ring_sq_pending(&p.d), SQ);
		ck_assert_uint_eq(client_ring_sq_space(&p.c), 0);
		for (;;) {
			int len = ring_sq_peek(&p.d, 0, buf, sizeof(buf));
			if (len == -EAGAIN) {
				break;
			}
			ck_assert_int_eq(len, 1 + (got * 37) % (SQE - RDMAX_RING_SQE_HDR));
			for (int i = 0; i < len; i++) {
				ck_assert_uint_eq(buf[i], (uint8_t)got);
			}
			ring_sq_consume(&p.d);
			got++;
		}
		ck_assert_uint_eq(client_ring_sq_space(&p.c), SQ);
	}
	ck_assert_uint_eq(sent, 5 * SQ);
	ck_assert_uint_eq(got, sent);
	/* A full-size payload fits; the daemon returns all of it. */
	push(&p, client_ring_sqe_max(&p.c), 0xab, 0);
	ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, sizeof(buf)), (int)(SQE - RDMAX_RING_SQE_HDR));
	ring_sq_consume(&p.d);
	pair_close(&p);
}
END_TEST

START_TEST(ring_submission_waits_for_socket)
{
	struct pair p;
	uint8_t buf[SQE];

	pair_open(&p, SQ, SQE, CQ);
	/* Written after the client's 5th datagram: not before the daemon read it. */
	push(&p, 10, 1, 5);
	ck_assert_int_eq(ring_sq_peek(&p.d, 4, buf, sizeof(buf)), -EAGAIN);
	ck_assert_int_eq(ring_sq_peek(&p.d, 5, buf, sizeof(buf)), 10);
	ring_sq_consume(&p.d);
	pair_close(&p);
}
END_TEST

START_TEST(ring_hostile_indices)
{
	struct pair p;
	uint8_t buf[SQE];

	pair_open(&p, SQ, SQE, CQ);
	push(&p, 8, 7, 0);
	ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, sizeof(buf)), 8);
	ring_sq_consume(&p.d);
	/* Tail moved backwards, far forwards, to garbage: never read past a slot. */
	uint32_t head = p.d.sq_head;
	const uint32_t bad_tails[] = {head - 1, head + SQ + 1, head + 0x80000000u, 0xdeadbeefu};
	for (size_t i = 0; i < sizeof(bad_tails) / sizeof(bad_tails[0]); i++) {
		atomic_store(&p.c.v.ctl->sq_tail, bad_tails[i]);
		ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, sizeof(buf)), RDMAX_E_PROTOCOL_ERROR);
		ck_assert_uint_eq(ring_sq_pending(&p.d), 0);
		ck_assert_uint_eq(p.d.sq_head, head);
	}
	/* A full ring is still fine: exactly sq_entries ahead. */
	atomic_store(&p.c.v.ctl->sq_tail, head + SQ);
	ck_assert_uint_eq(ring_sq_pending(&p.d), SQ);
	/* Lengths that do not fit the slot (or the buffer). */
	atomic_store(&p.c.v.ctl->sq_tail, head + 1);
	uint8_t *slot = p.c.v.sq + (size_t)(head & (SQ - 1)) * SQE;
	const uint32_t bad_lens[] = {SQE - RDMAX_RING_SQE_HDR + 1, SQE, 0x7fffffffu, UINT32_MAX};
	for (size_t i = 0; i < sizeof(bad_lens) / sizeof(bad_lens[0]); i++) {
		memcpy(slot, &bad_lens[i], sizeof(uint32_t));
		ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, sizeof(buf)), RDMAX_E_PROTOCOL_ERROR);
	}
	/* A buffer smaller than the claimed length. */
	uint32_t len = 100;
	memcpy(slot, &len, sizeof(len));
	ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, 99), RDMAX_E_PROTOCOL_ERROR);
	ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, sizeof(buf)), 100);
	/* The daemon's shared indices are reports: overwriting them changes nothing it uses. */
	atomic_store(&p.c.v.ctl->sq_head, 12345);
	atomic_store(&p.c.v.ctl->cq_tail, 999);
	ck_assert_int_eq(ring_sq_peek(&p.d, 0, buf, sizeof(buf)), 100);
	ring_sq_consume(&p.d);
	ck_assert_uint_eq(atomic_load(&p.c.v.ctl->sq_head), head + 1);
	/* Completion head moved backwards or past the tail: the post is refused. */
	atomic_store(&p.c.v.ctl->cq_head, 5);
	ck_assert_int_eq(ring_cq_post(&p.d, 1, 0, 0, NULL, 0), RDMAX_E_PROTOCOL_ERROR);
	atomic_store(&p.c.v.ctl->cq_head, UINT32_MAX - CQ);
	ck_assert_int_eq(ring_cq_post(&p.d, 1, 0, 0, NULL, 0), RDMAX_E_PROTOCOL_ERROR);
	atomic_store(&p.c.v.ctl->cq_head, 0);
	ck_assert_int_eq(ring_cq_post(&p.d, 1, 0, 0, NULL, 0), 0);
	pair_close(&p);
}
END_TEST

START_TEST(ring_completions_full_and_wrap)
{
	struct pair p;
	char long_msg[400];

	memset(long_msg, 'x', sizeof(long_msg) - 1);
	long_msg[sizeof(long_msg) - 1] = '\0';
	pair_open(&p, SQ, SQE, CQ);
	uint64_t posted = 0, taken = 0;
	for (int lap = 0; lap < 6; lap++) {
		int ret;
		while ((ret = ring_cq_post(&p.d, 1000 + posted, (int)(posted % 3), posted * 10,
					   posted % 2 ? long_msg : "short", posted + 7)) == 0) {
			posted++;
		}
		ck_assert_int_eq(ret, -ENOSPC);
		ck_assert_uint_eq(posted - taken, CQ);
		const struct rdmax_ring_cqe *e;
		while ((e = client_ring_cq_peek(&p.c)) != NULL) {
			ck_assert_uint_eq(e->job_id, 1000 + taken);
			ck_assert_int_eq(e->status, (int)(taken % 3));
			ck_assert_uint_eq(e->bytes, taken * 10);
			ck_assert_uint_eq(e->after, taken + 7);
			if (taken % 2) {
				ck_assert_uint_eq(e->msg_len, RDMAX_RING_CQE_MESSAGE);
				ck_assert_int_eq(
					memcmp(e->message, long_msg, RDMAX_RING_CQE_MESSAGE), 0);
			} else {
				ck_assert_uint_eq(e->msg_len, 5);
				ck_assert_int_eq(memcmp(e->message, "short", 5), 0);
			}
			client_ring_cq_advance(&p.c);
			taken++;
			/* Slots come back only when released. */
			ck_assert_int_eq(ring_cq_post(&p.d, 0, 0, 0, NULL, 0), -ENOSPC);
		}
		client_ring_cq_release(&p.c);
	}
	ck_assert_uint_eq(taken, 6 * CQ);
	pair_close(&p);
}
END_TEST

START_TEST(ring_wake_flags)
{
	struct pair p;

	pair_open(&p, SQ, SQE, CQ);
	/* A new ring asks for a RingNotify (the library is outside any call)... */
	uint32_t flags = atomic_load(&p.c.v.ctl->client_flags);
	ck_assert_uint_eq(flags, RDMAX_RING_CLIENT_WAKE);
	/* ...but nothing was posted: nothing to wake it for, and the request stays. */
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_SPARED);
	ck_assert_int_eq(ring_cq_post(&p.d, 1, 0, 0, NULL, 0), 0);
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_TAKEN);
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_NONE); /* once per request */
	/* Withdrawing after the daemon took it: a RingNotify is on its way. */
	ck_assert(client_ring_set_wake(&p.c, false));
	client_ring_set_wake(&p.c, true);
	ck_assert(!client_ring_set_wake(&p.c, false)); /* not taken: nothing to read */
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_NONE);

	/* An idle daemon sleeps; the next publish says to ring the doorbell. */
	ck_assert(ring_sleep(&p.d));
	ck_assert(p.d.sleeping);
	ck_assert(push(&p, 4, 1, 0));
	ring_wake(&p.d);
	ck_assert(!p.d.sleeping);
	ck_assert(!push(&p, 4, 2, 0));
	/* Entries waiting: the daemon does not go to sleep (no lost doorbell). */
	ck_assert(!ring_sleep(&p.d));
	ck_assert(!p.d.sleeping);
	ck_assert_uint_eq(atomic_load(&p.c.v.ctl->daemon_flags), 0);
	pair_close(&p);
}
END_TEST

/* A RingNotify only for completions the client has not read; its request stays until then. */
START_TEST(ring_wake_only_when_unread)
{
	struct pair p;

	pair_open(&p, SQ, SQE, CQ);
	for (uint64_t round = 0; round < 3 * CQ; round++) {
		/* The client read the completion before the daemon looked: no datagram. */
		ck_assert_int_eq(ring_cq_post(&p.d, 10 + round, 0, 64, NULL, 0), 0);
		ck_assert_uint_eq(unit_ring_consume(&p.c), 1);
		ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_SPARED);
		uint32_t flags = atomic_load(&p.c.v.ctl->client_flags);
		ck_assert_uint_eq(flags, RDMAX_RING_CLIENT_WAKE);
	}
	/* The request left standing wakes the client for the next one it has not read. */
	ck_assert_int_eq(ring_cq_post(&p.d, 100, 0, 64, NULL, 0), 0);
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_TAKEN);
	uint32_t flags = atomic_load(&p.c.v.ctl->client_flags);
	ck_assert_uint_eq(flags, 0);
	ck_assert(client_ring_set_wake(&p.c, false)); /* the library sees a RingNotify coming */
	ck_assert_uint_eq(unit_ring_consume(&p.c), 1);

	/* One of two read: the other is unread, so the client is woken. */
	client_ring_set_wake(&p.c, true);
	ck_assert_int_eq(ring_cq_post(&p.d, 101, 0, 64, NULL, 0), 0);
	ck_assert_int_eq(ring_cq_post(&p.d, 102, 0, 64, NULL, 0), 0);
	ck_assert_ptr_nonnull(client_ring_cq_peek(&p.c));
	client_ring_cq_advance(&p.c);
	client_ring_cq_release(&p.c);
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_TAKEN);
	ck_assert_uint_eq(unit_ring_consume(&p.c), 1);

	/* Read but not released: the daemon cannot tell, so it wakes the client. */
	client_ring_set_wake(&p.c, true);
	ck_assert_int_eq(ring_cq_post(&p.d, 103, 0, 64, NULL, 0), 0);
	ck_assert_ptr_nonnull(client_ring_cq_peek(&p.c));
	client_ring_cq_advance(&p.c);
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_TAKEN);
	client_ring_cq_release(&p.c);

	/* A head the client made up (ahead of the tail) costs it a datagram, nothing else. */
	client_ring_set_wake(&p.c, true);
	ck_assert_int_eq(ring_cq_post(&p.d, 104, 0, 64, NULL, 0), 0);
	atomic_store(&p.c.v.ctl->cq_head, p.d.cq_tail + 7);
	ck_assert_int_eq(ring_take_wake_request(&p.d), RING_WAKE_TAKEN);
	pair_close(&p);
}
END_TEST

/*
 * Two threads on one ring, a socketpair for the RingNotify: the daemon posts
 * WAKE_JOBS completions at uneven pace and runs the wake check after each,
 * a little later (as its pass does); the client follows the library's
 * sequence for rdmax_client_fd() users: withdraw the request, read the ring,
 * ask again, read the ring once more, then sleep in poll() on the socket.
 * Every completion must arrive; a wake-up lost on any path (the client
 * between its last read and poll(), the daemon between post and check)
 * leaves the client asleep until the bounded wait fails the test.
 */
#define WAKE_JOBS    4000u
#define WAKE_WAIT_MS 3000

struct wake_race {
	struct pair p;
	int sv[2]; /* [0] the daemon's end, [1] the client's */
	_Atomic uint32_t taken;
	_Atomic bool stop;
	uint64_t sent;
};

/* A short busy wait of 0 to `spins` iterations, uneven from one call to the next. */
static void jitter(uint32_t *seed, uint32_t spins)
{
	*seed = *seed * 1103515245u + 12345u;
	uint32_t n = (*seed >> 16) % (spins + 1);
	for (volatile uint32_t i = 0; i < n; i++) {
	}
}

static void *wake_race_daemon(void *arg)
{
	struct wake_race *w = arg;
	uint32_t seed = 7;

	for (uint32_t i = 0; i < WAKE_JOBS && !atomic_load(&w->stop); i++) {
		int ret;
		while ((ret = ring_cq_post(&w->p.d, i, 0, 64, NULL, 0)) == -ENOSPC) {
			if (atomic_load(&w->stop)) {
				return NULL;
			}
			sched_yield();
		}
		ck_assert_int_eq(ret, 0);
		/* The check runs later than the post, in the daemon's next pass. */
		jitter(&seed, 20000);
		if (ring_take_wake_request(&w->p.d) == RING_WAKE_TAKEN) {
			ck_assert_int_eq(send(w->sv[0], "n", 1, MSG_DONTWAIT), 1);
			w->sent++;
		}
		/* Now and then the client has time to fall asleep. */
		if (seed % 5 == 0) {
			sched_yield();
		}
	}
	return NULL;
}

/* Read the ring, checking that ids come in order; how many. */
static uint32_t wake_race_take(struct wake_race *w)
{
	const struct rdmax_ring_cqe *e;
	uint32_t n = 0;

	while ((e = client_ring_cq_peek(&w->p.c)) != NULL) {
		ck_assert_uint_eq(e->job_id, atomic_load(&w->taken) + n);
		client_ring_cq_advance(&w->p.c);
		n++;
	}
	if (n) {
		client_ring_cq_release(&w->p.c);
		atomic_fetch_add(&w->taken, n);
	}
	return n;
}

START_TEST(ring_wake_race_loses_none)
{
	struct wake_race w = {0};
	pthread_t daemon;
	uint32_t seed = 3;
	char buf[64];

	pair_open(&w.p, SQ, SQE, CQ);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, w.sv), 0);
	ck_assert_int_eq(pthread_create(&daemon, NULL, wake_race_daemon, &w), 0);
	while (atomic_load(&w.taken) < WAKE_JOBS) {
		/* rdmax_poll_events(): withdraw, read, ask again, read once more. */
		client_ring_set_wake(&w.p.c, false);
		wake_race_take(&w);
		client_ring_set_wake(&w.p.c, true);
		wake_race_take(&w);
		if (atomic_load(&w.taken) == WAKE_JOBS) {
			break;
		}
		/* Sometimes straight to sleep, sometimes after some work of its own. */
		jitter(&seed, 1000);
		struct pollfd pfd = {.fd = w.sv[1], .events = POLLIN};
		int r = poll(&pfd, 1, WAKE_WAIT_MS);
		if (r != 1) {
			atomic_store(&w.stop, true);
			pthread_join(daemon, NULL);
		}
		ck_assert_msg(
			r == 1,
			"asleep with completions unread: %u of %u taken, %u posted; a wake-up "
			"was lost",
			atomic_load(&w.taken), WAKE_JOBS, w.p.d.cq_tail);
		while (recv(w.sv[1], buf, sizeof(buf), MSG_DONTWAIT) > 0) {
		}
	}
	ck_assert_int_eq(pthread_join(daemon, NULL), 0);
	ck_assert_uint_eq(atomic_load(&w.taken), WAKE_JOBS);
	ck_assert_ptr_null(client_ring_cq_peek(&w.p.c));
	ck_assert_uint_le(w.sent, WAKE_JOBS); /* one RingNotify per completion at most */
	close(w.sv[0]);
	close(w.sv[1]);
	pair_close(&w.p);
}
END_TEST

Suite *ring_suite(void)
{
	Suite *s = suite_create("ring");
	TCase *tc = tcase_create("ring");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, ring_sizes);
	tcase_add_test(tc, ring_map_refuses);
	tcase_add_test(tc, ring_submissions_wrap);
	tcase_add_test(tc, ring_submission_waits_for_socket);
	tcase_add_test(tc, ring_hostile_indices);
	tcase_add_test(tc, ring_completions_full_and_wrap);
	tcase_add_test(tc, ring_wake_flags);
	tcase_add_test(tc, ring_wake_only_when_unread);
	tcase_add_test(tc, ring_wake_race_loses_none);
	suite_add_tcase(s, tc);
	ring_codec_tcases(s);
	return s;
}
