/* SPDX-License-Identifier: MIT */
/*
 * Case "ring": the shared-memory submission/completion ring between librdmax
 * and rdmaxd (docs/protocol.md). Jobs through the ring arrive byte for byte
 * with exactly one completion each; tiny rings overflow to the socket both
 * ways without losing or repeating a completion; ring and socket requests
 * keep their order; rdmax_client_fd() still wakes an event loop, and a
 * client asleep on its socket is woken for every completion; a client
 * that dies with jobs in flight leaves no mapping behind; a client that
 * keeps the daemon spinning on its ring leaves timers, the admin socket and
 * other clients served; and a raw client that lies in the shared memory
 * loses only its own session.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "rdmax_ring.h"

#define SLOT 4096u /* bytes per job slot in the regions below */

struct two {
	struct itest_daemon *a, *b;
	struct rdmax_client *c, *peer;
	struct rdmax_region *src, *dst;
	struct rdmax_desc desc;
};

/* busy_poll_us: a's engine.busy_poll_us, or 0 for its default. */
static void two_start_busy(struct two *t, uint64_t slots, uint32_t busy_poll_us)
{
	t->a = itest_daemon_new("a", itest_addr_a());
	t->b = itest_daemon_new("b", itest_addr_b());
	if (busy_poll_us) {
		itest_daemon_set(t->a, "engine.busy_poll_us=%u", busy_poll_us);
	}
	itest_daemon_start(t->a);
	itest_daemon_start(t->b);
	t->c = itest_client(t->a, "itest-ring");
	t->peer = itest_client(t->b, "itest-ring-peer");
	t->src = itest_alloc(t->c, slots * SLOT, RDMAX_ACCESS_LOCAL);
	t->dst = itest_alloc(t->peer, slots * SLOT,
			     RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ);
	t->desc = itest_desc(t->dst);
	itest_fill(itest_bytes(t->src), slots * SLOT, itest_seed());
}

static void two_start(struct two *t, uint64_t slots)
{
	two_start_busy(t, slots, 0);
}

static void two_stop(struct two *t)
{
	rdmax_client_close(t->c);
	rdmax_client_close(t->peer);
	itest_daemon_stop(t->a);
	itest_daemon_stop(t->b);
	itest_daemon_free(t->a);
	itest_daemon_free(t->b);
}

/* Collect `n` completions of ids base..base+n-1: each exactly once, OK, with its length. */
static void expect_each_once(struct rdmax_client *c, uint64_t base, size_t n, const uint64_t *len)
{
	struct rdmax_event *ev = calloc(n, sizeof(*ev));
	uint8_t *seen = calloc(n, 1);

	ck_assert(ev && seen);
	size_t got = itest_collect(c, ev, n, ITEST_WAIT_MS, NULL);
	ck_assert_msg(got == n, "%zu of %zu completions arrived", got, n);
	for (size_t i = 0; i < n; i++) {
		uint64_t k = ev[i].job_id - base;
		ck_assert_msg(ev[i].job_id >= base && k < n, "completion of unknown job %" PRIu64,
			      ev[i].job_id);
		ck_assert_msg(!seen[k], "job %" PRIu64 " completed twice", ev[i].job_id);
		seen[k] = 1;
		ck_assert_msg(ev[i].status == 0, "job %" PRIu64 ": %s ('%s')", ev[i].job_id,
			      rdmax_err_name(ev[i].status), ev[i].reason);
		ck_assert_uint_eq(ev[i].bytes, len[k]);
	}
	itest_assert_quiet(c, ITEST_QUIET_MS);
	free(ev);
	free(seen);
}

/* Jobs of slot i land at slot i: the destination must equal the source there. */
static void expect_slots(struct two *t, size_t n, const uint64_t *len)
{
	for (size_t i = 0; i < n; i++) {
		itest_assert_mem_eq(itest_bytes(t->dst) + i * SLOT, itest_bytes(t->src) + i * SLOT,
				    len[i], "a WRITE through the ring");
	}
}

START_TEST(ring_jobs_byte_exact)
{
	const size_t n = itest_scaled(600, 200);
	struct two t;
	uint64_t *len = calloc(n, sizeof(*len));

	two_start(&t, n);
	ck_assert_int_eq(rdmax_client_uses_ring(t.c), 1);
	ck_assert(rdmax_client_info(t.c)->capabilities & RDMAX_CAP_RING);
	/* Batches of 1..16, at most 64 in flight, lengths 1 B .. 4 KiB. */
	size_t sent = 0, done = 0;
	struct rdmax_job jobs[16];
	struct rdmax_event ev[64];
	uint8_t *seen = calloc(n, 1);
	while (done < n) {
		size_t k = 1 + sent % 16;
		if (k > n - sent) {
			k = n - sent;
		}
		if (k && sent - done + k <= 64) {
			for (size_t i = 0; i < k; i++) {
				size_t s = sent + i;
				len[s] = 1 + (s * 131) % SLOT;
				jobs[i] = itest_job(1000 + s, RDMAX_OP_WRITE, t.src, s * SLOT,
						    &t.desc, s * SLOT, len[s]);
			}
			ck_assert_int_eq(rdmax_submit(t.c, jobs, k), 0);
			sent += k;
			continue;
		}
		int got = rdmax_poll_events(t.c, ev, 64, ITEST_WAIT_MS);
		ck_assert_msg(got > 0, "waiting for completions: %s", rdmax_err_name(got));
		for (int i = 0; i < got; i++) {
			uint64_t s = ev[i].job_id - 1000;
			ck_assert_int_eq(ev[i].type, RDMAX_EVENT_COMPLETION);
			ck_assert_msg(s < sent && !seen[s], "job %" PRIu64 " unknown or repeated",
				      ev[i].job_id);
			seen[s] = 1;
			ck_assert_msg(ev[i].status == 0, "%s", ev[i].reason);
			ck_assert_uint_eq(ev[i].bytes, len[s]);
			done++;
		}
	}
	itest_assert_quiet(t.c, ITEST_QUIET_MS);
	expect_slots(&t, n, len);
	/* READ back through the ring into a fresh region. */
	struct rdmax_region *back = itest_alloc(t.c, SLOT, RDMAX_ACCESS_LOCAL);
	struct rdmax_job rd = itest_job(1, RDMAX_OP_READ, back, 0, &t.desc, 7 * SLOT, len[7]);
	struct rdmax_event e = itest_run_job(t.c, &rd, ITEST_WAIT_MS);
	ck_assert_int_eq(e.status, 0);
	itest_assert_mem_eq(itest_bytes(back), itest_bytes(t.src) + 7 * SLOT, len[7], "READ");
	free(seen);
	free(len);
	two_stop(&t);
}
END_TEST

/* Rings of two entries: batches overflow to the socket, completions too. */
START_TEST(ring_full_falls_back)
{
	const size_t n = 300;
	struct two t;
	uint64_t len[300];

	setenv("RDMAX_RING_SQ_ENTRIES", "2", 1);
	setenv("RDMAX_RING_CQ_ENTRIES", "2", 1);
	two_start(&t, n);
	ck_assert_int_eq(rdmax_client_uses_ring(t.c), 1);
	/* Nobody reads while 300 complete: 2 fit the ring, the rest take the socket. */
	for (size_t s = 0; s < n;) {
		struct rdmax_job jobs[5];
		size_t k = s % 3 == 0 ? 5 : 1; /* 5 never fits a 2-entry ring */
		k = k > n - s ? n - s : k;
		for (size_t i = 0; i < k; i++) {
			len[s + i] = 64 + s + i;
			jobs[i] = itest_job(5000 + s + i, RDMAX_OP_WRITE, t.src, (s + i) * SLOT,
					    &t.desc, (s + i) * SLOT, len[s + i]);
		}
		ck_assert_int_eq(rdmax_submit(t.c, jobs, k), 0);
		s += k;
	}
	itest_wait_status(t.a, "jobs_in_flight", 0); /* all done before anyone reads */
	expect_each_once(t.c, 5000, n, len);
	expect_slots(&t, n, len);
	two_stop(&t);
}
END_TEST

/*
 * A ring job, then socket requests about it: the daemon takes the entry
 * before it reads the later datagram, so the job is known to JobStatus and
 * Cancel; and a job too large for a slot goes by socket between ring jobs.
 */
START_TEST(ring_and_socket_in_order)
{
	struct two t;

	two_start(&t, 64);
	ck_assert_int_eq(rdmax_client_uses_ring(t.c), 1);
	if (itest_stopped_peer_stalls()) {
		/* Its own target: late bytes of cancelled jobs may still land after SIGCONT. */
		struct rdmax_region *dst2 =
			itest_alloc(t.peer, 64 * SLOT, RDMAX_ACCESS_REMOTE_WRITE);
		struct rdmax_desc desc2 = itest_desc(dst2);
		itest_daemon_pause(t.b);
		for (uint64_t id = 1; id <= 20; id++) {
			struct rdmax_job j =
				itest_job(id, RDMAX_OP_WRITE, t.src, 0, &desc2, 0, 64 * SLOT);
			ck_assert_int_eq(rdmax_submit(t.c, &j, 1), 0);
			uint64_t total = 0;
			ck_assert_int_eq(rdmax_job_status(t.c, id, NULL, &total), 0);
			ck_assert_uint_eq(total, 64 * SLOT);
			ck_assert_int_eq(rdmax_cancel(t.c, id), 0);
			itest_assert_err(rdmax_wait_job(t.c, id, ITEST_WAIT_MS), RDMAX_E_CANCELLED);
		}
		itest_daemon_resume(t.b);
	}
	/* Page lists past a slot's 1 KiB: those jobs take the socket. */
	uint32_t src_pages[512], dst_pages[512];
	for (uint32_t i = 0; i < 512; i++) {
		src_pages[i] = i;
		dst_pages[i] = 511 - i;
	}
	uint64_t len[24];
	struct rdmax_job jobs[24];
	for (size_t i = 0; i < 24; i++) {
		memset(&jobs[i], 0, sizeof(jobs[i]));
		if (i % 4 == 3) {
			jobs[i].id = 100 + i;
			jobs[i].op = RDMAX_OP_PAGED_WRITE;
			jobs[i].local = t.src;
			jobs[i].remote = &t.desc;
			jobs[i].u.paged.page_len = 8;
			jobs[i].u.paged.local_pages = (struct rdmax_pages){
				.offset = i * SLOT, .indices = src_pages, .count = 512};
			jobs[i].u.paged.remote_pages = (struct rdmax_pages){
				.offset = i * SLOT, .indices = dst_pages, .count = 512};
			len[i] = 512 * 8;
		} else {
			len[i] = 100 + i;
			jobs[i] = itest_job(100 + i, RDMAX_OP_WRITE, t.src, i * SLOT, &t.desc,
					    i * SLOT, len[i]);
		}
		/* Alone, so each job takes its own path. */
		ck_assert_int_eq(rdmax_submit(t.c, &jobs[i], 1), 0);
	}
	expect_each_once(t.c, 100, 24, len);
	for (size_t i = 0; i < 24; i++) {
		const uint8_t *d = itest_bytes(t.dst) + i * SLOT,
			      *s = itest_bytes(t.src) + i * SLOT;
		if (i % 4 == 3) {
			for (uint32_t p = 0; p < 512; p++) {
				itest_assert_mem_eq(d + (511 - p) * 8, s + p * 8, 8,
						    "a paged page");
			}
		} else {
			itest_assert_mem_eq(d, s, len[i], "a ring WRITE between socket jobs");
		}
	}
	two_stop(&t);
}
END_TEST

/* An event loop sleeping on rdmax_client_fd() is woken by a ring completion. */
START_TEST(ring_wakes_event_loop)
{
	struct two t;

	two_start(&t, 4);
	ck_assert_int_eq(rdmax_client_uses_ring(t.c), 1);
	for (uint64_t id = 1; id <= 5; id++) {
		struct rdmax_job j = itest_job(id, RDMAX_OP_WRITE, t.src, 0, &t.desc, 0, SLOT);
		ck_assert_int_eq(rdmax_submit(t.c, &j, 1), 0);
		struct pollfd pfd = {.fd = rdmax_client_fd(t.c), .events = POLLIN};
		int r = poll(&pfd, 1, ITEST_WAIT_MS);
		ck_assert_msg(r == 1, "rdmax_client_fd() did not become readable");
		struct rdmax_event ev[4];
		int n = 0;
		/* Readable means an event is there, or about to be read with it. */
		for (int tries = 0; tries < 100 && n == 0; tries++) {
			n = rdmax_poll_events(t.c, ev, 4, 0);
		}
		ck_assert_int_eq(n, 1);
		ck_assert_uint_eq(ev[0].job_id, id);
		ck_assert_int_eq(ev[0].status, 0);
	}
	two_stop(&t);
}
END_TEST

/*
 * A client that sleeps on its socket between completions, in the two ways
 * the library offers: rdmax_poll_events() with a timeout and no spin
 * (RDMAX_SPIN_US=0: ask for a RingNotify, look at the ring once more,
 * poll()), and an application's own poll() on rdmax_client_fd() followed by
 * rdmax_poll_events() with no wait. WAKE_WINDOW jobs stay in flight, so
 * completions keep landing while the client is between reading the ring and
 * falling asleep. Every completion must come, each once; a lost wake-up
 * leaves the client asleep past the bounded wait. The daemon sends at most
 * one RingNotify per completion.
 */
#define WAKE_WINDOW 8

static void wake_stream(struct two *t, uint64_t n, bool own_poll)
{
	uint8_t *seen = calloc(n + 1, 1);
	uint64_t submitted = 0, done = 0;
	struct rdmax_event ev[WAKE_WINDOW];

	ck_assert_ptr_nonnull(seen);
	while (done < n) {
		while (submitted < n && submitted - done < WAKE_WINDOW) {
			uint64_t slot = submitted % 64;
			struct rdmax_job j = itest_job(submitted + 1, RDMAX_OP_WRITE, t->src,
						       slot * SLOT, &t->desc, slot * SLOT, 64);
			ck_assert_int_eq(rdmax_submit(t->c, &j, 1), 0);
			submitted++;
		}
		int got;
		if (own_poll) {
			struct pollfd pfd = {.fd = rdmax_client_fd(t->c), .events = POLLIN};
			int r = poll(&pfd, 1, ITEST_WAIT_MS);
			ck_assert_msg(r == 1,
				      "rdmax_client_fd() stayed unreadable for %d ms with %" PRIu64
				      " of %" PRIu64 " jobs completed",
				      ITEST_WAIT_MS, done, submitted);
			got = rdmax_poll_events(t->c, ev, WAKE_WINDOW, 0);
		} else {
			got = rdmax_poll_events(t->c, ev, WAKE_WINDOW, ITEST_WAIT_MS);
			ck_assert_msg(got > 0,
				      "no completion within %d ms (%s) with %" PRIu64 " of %" PRIu64
				      " jobs completed",
				      ITEST_WAIT_MS, got < 0 ? rdmax_err_name(got) : "timeout",
				      done, submitted);
		}
		ck_assert_int_ge(got, 0);
		for (int i = 0; i < got; i++) {
			ck_assert_int_eq(ev[i].type, RDMAX_EVENT_COMPLETION);
			ck_assert_msg(ev[i].job_id >= 1 && ev[i].job_id <= submitted,
				      "completion of unknown job %" PRIu64, ev[i].job_id);
			ck_assert_msg(!seen[ev[i].job_id], "job %" PRIu64 " completed twice",
				      ev[i].job_id);
			seen[ev[i].job_id] = 1;
			ck_assert_msg(ev[i].status == 0, "job %" PRIu64 ": %s ('%s')", ev[i].job_id,
				      rdmax_err_name(ev[i].status), ev[i].reason);
			ck_assert_uint_eq(ev[i].bytes, 64);
			done++;
		}
	}
	itest_assert_quiet(t->c, ITEST_QUIET_MS);
	free(seen);
}

START_TEST(ring_sleeping_client_woken)
{
	struct two t;
	uint64_t n = itest_scaled(400, 64);

	setenv("RDMAX_SPIN_US", "0", 1);
	two_start(&t, 64);
	unsetenv("RDMAX_SPIN_US");
	ck_assert_int_eq(rdmax_client_uses_ring(t.c), 1);
	wake_stream(&t, n, false);
	wake_stream(&t, n, true);
	for (size_t slot = 0; slot < 64; slot++) {
		itest_assert_mem_eq(itest_bytes(t.dst) + slot * SLOT,
				    itest_bytes(t.src) + slot * SLOT, 64,
				    "a WRITE of a sleeping client");
	}
	/* It slept, so RingNotifies woke it; never more than one per completion. */
	uint64_t sent = itest_stats_field(t.a, "ring_notifies_total");
	uint64_t spared = itest_stats_field(t.a, "ring_notifies_spared_total");
	ck_assert_msg(sent != UINT64_MAX && spared != UINT64_MAX, "stats lack the ring counters");
	ck_assert_uint_gt(sent, 0);
	ck_assert_uint_le(sent, 2 * n);
	two_stop(&t);
}
END_TEST

START_TEST(ring_client_dies_in_flight)
{
	struct two t;
	pid_t parent = getpid();

	two_start(&t, 4);
	if (itest_stopped_peer_stalls()) {
		itest_daemon_pause(t.b);
	}
	pid_t child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		itest_child_setup(parent);
		struct rdmax_client *c;
		struct rdmax_region *src;
		if (rdmax_client_open(t.a->socket_path, "itest-ring-victim", &c) < 0 ||
		    rdmax_client_uses_ring(c) != 1 ||
		    rdmax_region_alloc_host(c, 1 * MiB, RDMAX_ACCESS_LOCAL, &src) < 0) {
			_exit(2);
		}
		for (uint64_t id = 1; id <= 64; id++) {
			struct rdmax_job j = {.id = id,
					      .op = RDMAX_OP_WRITE,
					      .local = src,
					      .length = SLOT,
					      .remote = &t.desc};
			if (rdmax_submit(c, &j, 1) < 0) {
				_exit(3);
			}
		}
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	int status;
	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		      "the victim did not get to submit its jobs (status %d)", status);
	if (itest_stopped_peer_stalls()) {
		itest_daemon_resume(t.b);
	}
	/* Its ring is unmapped once the daemon saw it go (ours too: close it first). */
	rdmax_client_close(t.c);
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	while (itest_daemon_maps(t.a, "rdmax-ring") && itest_now_ms() < deadline) {
		itest_sleep_ms(50);
	}
	ck_assert_msg(!itest_daemon_maps(t.a, "rdmax-ring"), "a dead client's ring stays mapped");
	/* The daemon serves the next client through its ring. */
	t.c = itest_client(t.a, "itest-ring-after");
	struct rdmax_region *src = itest_alloc(t.c, SLOT, RDMAX_ACCESS_LOCAL);
	itest_fill(itest_bytes(src), SLOT, 5);
	struct rdmax_job j = itest_job(9, RDMAX_OP_WRITE, src, 0, &t.desc, 0, SLOT);
	ck_assert_int_eq(itest_run_job(t.c, &j, ITEST_WAIT_MS).status, 0);
	itest_assert_mem_eq(itest_bytes(t.dst), itest_bytes(src), SLOT, "WRITE after the victim");
	two_stop(&t);
}
END_TEST

/*
 * A child that keeps a's ring busy with 64 B writes into `sink`, a region
 * of another client of the same daemon (copied by the daemon itself, so no
 * peer's wake-up slows the stream down), 8 in flight, until told to stop:
 * writes 'g' to `go` after its first 64 completions, and its count of
 * completions to `done` at the end. Exit 0 only if every job completed OK.
 */
#define STREAM_WINDOW 8
static void stream_small_jobs(const struct two *t, const struct rdmax_desc *sink, pid_t parent,
			      int go, int stop, int done)
{
	struct rdmax_client *c;
	struct rdmax_region *src;
	uint64_t submitted = 0, n = 0;

	itest_child_setup(parent);
	if (rdmax_client_open(t->a->socket_path, "itest-ring-streamer", &c) < 0 ||
	    rdmax_client_uses_ring(c) != 1 ||
	    rdmax_region_alloc_host(c, SLOT, RDMAX_ACCESS_LOCAL, &src) < 0) {
		_exit(2);
	}
	for (bool stopping = false; !stopping || n < submitted;) {
		while (!stopping && submitted - n < STREAM_WINDOW) {
			struct rdmax_job j = {.id = submitted + 1,
					      .op = RDMAX_OP_WRITE,
					      .local = src,
					      .length = 64,
					      .remote = sink};
			if (rdmax_submit(c, &j, 1) < 0) {
				_exit(3);
			}
			submitted++;
		}
		struct rdmax_event ev[STREAM_WINDOW];
		int got = rdmax_poll_events(c, ev, STREAM_WINDOW, ITEST_WAIT_MS);
		if (got <= 0) {
			_exit(4);
		}
		for (int i = 0; i < got; i++) {
			if (ev[i].type != RDMAX_EVENT_COMPLETION || ev[i].status != 0) {
				_exit(5);
			}
			if (++n == 64 && write(go, "g", 1) != 1) {
				_exit(6);
			}
		}
		struct pollfd pfd = {.fd = stop, .events = POLLIN};
		stopping = stopping || (n >= 64 && poll(&pfd, 1, 0) == 1);
	}
	if (write(done, &n, sizeof(n)) != sizeof(n)) {
		_exit(7);
	}
	_exit(0);
}

/*
 * While one client keeps the daemon spinning on its ring, the loop still
 * turns: a job's deadline (a timer) fires on time, the admin socket answers,
 * and a socket client's jobs complete; the streamer completes throughout.
 */
START_TEST(ring_spin_serves_loop)
{
	struct two t;
	pid_t parent = getpid();
	int go[2], stop[2], done[2];

	/*
	 * A window far longer than a spin's budget: a ring that a descheduled
	 * streamer leaves idle for a while stays awake, and the daemon keeps
	 * spinning for the whole case.
	 */
	two_start_busy(&t, 4, 500000);
	struct itest_daemon *c = itest_daemon_new("c", itest_addr_b());
	itest_daemon_start(c);
	struct rdmax_client *cc = itest_client(c, "itest-ring-stalled");
	struct rdmax_region *far = itest_alloc(cc, SLOT, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc far_desc = itest_desc(far);
	struct rdmax_region *sink = itest_alloc(t.c, SLOT, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc sink_desc = itest_desc(sink);
	/* Connected first, so that the paused peer stalls the next job, not a connect. */
	struct rdmax_job j = itest_job(1, RDMAX_OP_WRITE, t.src, 0, &far_desc, 0, SLOT);
	ck_assert_int_eq(itest_run_job(t.c, &j, ITEST_WAIT_MS).status, 0);

	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(stop), 0);
	ck_assert_int_eq(pipe(done), 0);
	pid_t child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		stream_small_jobs(&t, &sink_desc, parent, go[1], stop[0], done[1]);
	}
	struct pollfd pfd = {.fd = go[0], .events = POLLIN};
	ck_assert_msg(poll(&pfd, 1, ITEST_WAIT_MS) == 1, "the streamer did not get going");
	/* Before the pause: over verbs the stall may silence every link of the test. */
	j = itest_job(3, RDMAX_OP_WRITE, t.src, SLOT, &t.desc, SLOT, SLOT);
	ck_assert_int_eq(itest_run_job(t.c, &j, ITEST_WAIT_MS).status, 0);
	itest_assert_mem_eq(itest_bytes(t.dst) + SLOT, itest_bytes(t.src) + SLOT, SLOT,
			    "a WRITE beside a busy ring");

	itest_daemon_pause(c);
	j = itest_job(2, RDMAX_OP_WRITE, t.src, 0, &far_desc, 0, SLOT);
	j.deadline_ms = 300;
	uint64_t t0 = itest_now_ms();
	itest_expect_job_error(t.c, &j, RDMAX_E_TIMEOUT, ITEST_WAIT_MS);
	uint64_t took = itest_now_ms() - t0;
	ck_assert_msg(took >= 250 && took < 3000,
		      "a deadline of 300 ms fired after %" PRIu64 " ms beside a busy ring", took);
	t0 = itest_now_ms();
	itest_wait_status(t.a, "clients", 2);
	took = itest_now_ms() - t0;
	ck_assert_msg(took < 3000, "the admin socket took %" PRIu64 " ms beside a busy ring", took);

	ck_assert_int_eq(write(stop[1], "s", 1), 1);
	uint64_t streamed = 0;
	pfd.fd = done[0];
	ck_assert_msg(poll(&pfd, 1, ITEST_WAIT_MS) == 1, "the streamer did not stop");
	ck_assert_int_eq(read(done[0], &streamed, sizeof(streamed)), sizeof(streamed));
	int status;
	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the streamer failed (status %d)", status);
	/* It kept going while the deadline ran (300 ms of 64 B jobs). */
	ck_assert_msg(streamed > 128, "only %" PRIu64 " streamed jobs completed", streamed);
	itest_daemon_resume(c);
	itest_assert_quiet(t.c, ITEST_QUIET_MS);
	for (int i = 0; i < 2; i++) {
		close(go[i]);
		close(stop[i]);
		close(done[i]);
	}
	rdmax_client_close(cc);
	itest_daemon_stop(c);
	itest_daemon_free(c);
	two_stop(&t);
}
END_TEST

/* A raw client's ring memfd of the given size and seals. */
static int ring_memfd(size_t size, int seals)
{
	int fd = memfd_create("rdmax-ring-raw", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	if (seals) {
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
	}
	return fd;
}

static void send_ring_setup(int fd, uint64_t seq, uint32_t sq, uint32_t sqe, uint32_t cq, int memfd)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__RingSetup rs = RDMAX__V1__RING_SETUP__INIT;

	rs.sq_entries = sq;
	rs.sq_entry_bytes = sqe;
	rs.cq_entries = cq;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP;
	msg.ring_setup = &rs;
	raw_send_msg(fd, &msg, memfd >= 0 ? &memfd : NULL, memfd >= 0 ? 1 : 0);
}

/* A doorbell datagram; 0 or -errno as raw_send(). */
static int try_doorbell(int fd)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__RingDoorbell db = RDMAX__V1__RING_DOORBELL__INIT;

	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_DOORBELL;
	msg.ring_doorbell = &db;
	return raw_try_send_msg(fd, &msg, NULL, 0);
}

static void send_doorbell(int fd)
{
	int ret = try_doorbell(fd);

	ck_assert_msg(ret == 0, "sendmsg() of a doorbell failed: %s", strerror(-ret));
}

/*
 * A doorbell for a ring just made invalid. The daemon polls a ring that was
 * active a moment ago, so it may have read the bad entry and closed the
 * session before this is sent: a send to the closed socket is fine here,
 * raw_expect_closed() checks the close itself.
 */
static void send_doorbell_may_be_closed(int fd)
{
	int ret = try_doorbell(fd);

	ck_assert_msg(ret == 0 || ret == -EPIPE || ret == -ECONNRESET,
		      "sendmsg() of a doorbell failed: %s", strerror(-ret));
}

START_TEST(ring_hostile_client)
{
	struct itest_daemon *d = itest_daemon_new("raw", itest_addr_a());
	const uint32_t sq = 4, sqe = 256, cq = 4;
	size_t need = rdmax_ring_bytes(sq, sqe, cq);

	itest_daemon_start(d);
	struct rdmax_client *good = itest_client(d, "itest-bystander");
	struct rdmax_region *gsrc = itest_alloc(good, SLOT, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *gdst = itest_alloc(good, SLOT, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc gdesc = itest_desc(gdst);

	int fd = raw_connect(d->socket_path);
	raw_hello(fd);
	/* Refused: no fd, unsealed, shrink-sealed only, truncated, bad sizes. */
	send_ring_setup(fd, 2, sq, sqe, cq, -1);
	raw_expect_status(fd, 2, RDMAX_E_INVALID_ARGUMENT);
	int m = ring_memfd(need, 0);
	send_ring_setup(fd, 3, sq, sqe, cq, m);
	raw_expect_status(fd, 3, RDMAX_E_PERMISSION_DENIED);
	close(m);
	m = ring_memfd(need, F_SEAL_SHRINK);
	send_ring_setup(fd, 4, sq, sqe, cq, m);
	raw_expect_status(fd, 4, RDMAX_E_PERMISSION_DENIED);
	close(m);
	m = ring_memfd(need - 64, F_SEAL_SHRINK | F_SEAL_GROW);
	send_ring_setup(fd, 5, sq, sqe, cq, m);
	raw_expect_status(fd, 5, RDMAX_E_OUT_OF_RANGE);
	close(m);
	m = ring_memfd(need, F_SEAL_SHRINK | F_SEAL_GROW);
	send_ring_setup(fd, 6, 3, sqe, cq, m);
	raw_expect_status(fd, 6, RDMAX_E_INVALID_ARGUMENT);
	/* Accepted, once. */
	send_ring_setup(fd, 7, sq, sqe, cq, m);
	raw_expect_status(fd, 7, 0);
	send_ring_setup(fd, 8, sq, sqe, cq, m);
	raw_expect_status(fd, 8, RDMAX_E_ALREADY_EXISTS);
	uint8_t *base = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	ck_assert(base != MAP_FAILED);
	close(m);
	struct rdmax_ring_ctl *ctl = (struct rdmax_ring_ctl *)base;

	/* An entry that waits for a datagram never sent: only this client stalls. */
	struct rdmax_ring_sqe hdr = {.len = 0, .after = UINT64_MAX};
	memcpy(base + rdmax_ring_sq_offset(), &hdr, sizeof(hdr));
	atomic_store(&ctl->sq_tail, 1);
	send_doorbell(fd);
	itest_fill(itest_bytes(gsrc), SLOT, 3);
	struct rdmax_job j = itest_job(1, RDMAX_OP_WRITE, gsrc, 0, &gdesc, 0, SLOT);
	ck_assert_int_eq(itest_run_job(good, &j, ITEST_WAIT_MS).status, 0);

	/* The tail moved far past the head: the daemon closes this session only. */
	atomic_store(&ctl->sq_tail, 0x7fffffffu);
	send_doorbell_may_be_closed(fd);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);
	j.id = 2;
	ck_assert_int_eq(itest_run_job(good, &j, ITEST_WAIT_MS).status, 0);
	itest_assert_mem_eq(itest_bytes(gdst), itest_bytes(gsrc), SLOT, "the bystander's WRITE");

	/* A second liar: a length past its slot. */
	fd = raw_connect(d->socket_path);
	raw_hello(fd);
	m = ring_memfd(need, F_SEAL_SHRINK | F_SEAL_GROW);
	send_ring_setup(fd, 2, sq, sqe, cq, m);
	raw_expect_status(fd, 2, 0);
	uint8_t *base2 = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	ck_assert(base2 != MAP_FAILED);
	close(m);
	hdr.len = sqe; /* header + sqe bytes cannot fit one slot */
	hdr.after = 0;
	memcpy(base2 + rdmax_ring_sq_offset(), &hdr, sizeof(hdr));
	atomic_store(&((struct rdmax_ring_ctl *)base2)->sq_tail, 1);
	send_doorbell_may_be_closed(fd);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);
	/* And garbage bytes where a Job belongs: closed too. */
	fd = raw_connect(d->socket_path);
	raw_hello(fd);
	m = ring_memfd(need, F_SEAL_SHRINK | F_SEAL_GROW);
	send_ring_setup(fd, 2, sq, sqe, cq, m);
	raw_expect_status(fd, 2, 0);
	uint8_t *base3 = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	ck_assert(base3 != MAP_FAILED);
	close(m);
	hdr.len = 40;
	memcpy(base3 + rdmax_ring_sq_offset(), &hdr, sizeof(hdr));
	memset(base3 + rdmax_ring_sq_offset() + sizeof(hdr), 0xff, 40);
	atomic_store(&((struct rdmax_ring_ctl *)base3)->sq_tail, 1);
	send_doorbell_may_be_closed(fd);
	raw_expect_closed(fd, ITEST_WAIT_MS);
	close(fd);

	j.id = 3;
	ck_assert_int_eq(itest_run_job(good, &j, ITEST_WAIT_MS).status, 0);
	munmap(base, need);
	munmap(base2, need);
	munmap(base3, need);
	rdmax_client_close(good);
	itest_daemon_stop(d);
	itest_daemon_free(d);
}
END_TEST

/* A request that is not a job: an unpublish of a name never published (any reply will do). */
static void send_unpublish(int fd, uint64_t seq)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__RegionUnpublish up = RDMAX__V1__REGION_UNPUBLISH__INIT;

	up.name = "never-published";
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGION_UNPUBLISH;
	msg.region_unpublish = &up;
	raw_send_msg(fd, &msg, NULL, 0);
}

static uint32_t daemon_flags(struct rdmax_ring_ctl *ctl)
{
	return atomic_load(&ctl->daemon_flags);
}

/*
 * A sleeping ring is woken by a doorbell (or jobs), not by the client's
 * other requests: a client that sleeps between events and claims each one
 * (ExpectImm) must not keep its daemon spinning on its ring. The window is
 * a second, so the ring cannot fall asleep again before it is looked at.
 */
START_TEST(ring_woken_by_jobs_only)
{
	struct itest_daemon *d = itest_daemon_new("wake", itest_addr_a());
	const uint32_t sq = 4, sqe = 256, cq = 4;
	size_t need = rdmax_ring_bytes(sq, sqe, cq);

	itest_daemon_set(d, "engine.busy_poll_us=1000000");
	itest_daemon_start(d);
	int fd = raw_connect(d->socket_path);
	raw_hello(fd);
	int m = ring_memfd(need, F_SEAL_SHRINK | F_SEAL_GROW);
	send_ring_setup(fd, 2, sq, sqe, cq, m);
	raw_expect_status(fd, 2, 0);
	uint8_t *base = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	ck_assert(base != MAP_FAILED);
	close(m);
	struct rdmax_ring_ctl *ctl = (struct rdmax_ring_ctl *)base;

	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	while (!(daemon_flags(ctl) & RDMAX_RING_DAEMON_SLEEPING)) {
		ck_assert_msg(itest_now_ms() < deadline, "the idle ring never went to sleep");
		usleep(10000);
	}
	for (uint64_t seq = 3; seq < 6; seq++) {
		send_unpublish(fd, seq);
		(void)raw_recv_status(fd, seq);
		ck_assert_msg(daemon_flags(ctl) & RDMAX_RING_DAEMON_SLEEPING,
			      "request %" PRIu64 " (not a job) woke the sleeping ring", seq);
	}
	send_doorbell(fd);
	send_unpublish(fd, 6);
	(void)raw_recv_status(fd, 6);
	ck_assert_msg(!(daemon_flags(ctl) & RDMAX_RING_DAEMON_SLEEPING),
		      "a doorbell did not wake the ring");
	munmap(base, need);
	close(fd);
	itest_daemon_stop(d);
	itest_daemon_free(d);
}
END_TEST

TCase *itest_tcase_ring(void)
{
	TCase *tc = tcase_create("ring");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, ring_jobs_byte_exact);
	tcase_add_test(tc, ring_full_falls_back);
	tcase_add_test(tc, ring_and_socket_in_order);
	tcase_add_test(tc, ring_wakes_event_loop);
	tcase_add_test(tc, ring_sleeping_client_woken);
	tcase_add_test(tc, ring_client_dies_in_flight);
	ITEST_ADD_STALLING_TEST(tc, ring_spin_serves_loop);
	tcase_add_test(tc, ring_hostile_client);
	tcase_add_test(tc, ring_woken_by_jobs_only);
	return tc;
}
