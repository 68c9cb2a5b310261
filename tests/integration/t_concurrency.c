/* SPDX-License-Identifier: MIT */
/*
 * Case "concurrency": eight client processes of one daemon each submit a
 * thousand small WRITE and READ jobs in batches to regions of a second
 * daemon, and account for every completion: exactly one per job id, all OK,
 * with the right byte count. Reads are checked by the clients, writes by the
 * parent once all clients are done.
 *
 * The clients are forked processes: they report through their exit status
 * and stderr, never through check assertions.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define N_CLIENTS      8
#define SLOT           512 /* bytes reserved per job in every region */
#define MAX_BATCH      48  /* jobs per rdmax_submit, at most */
#define MAX_IN_FLIGHT  256 /* per client */
#define ID_BASE        0x100000000ull
#define CLIENT_WAIT_MS 90000

struct plan {
	const char *socket_path;
	const struct rdmax_desc *dst;    /* one slot per (client, job) */
	const struct rdmax_desc *origin; /* READ source, one slot per job */
	const uint8_t *origin_bytes;     /* the parent's mapping, inherited */
	uint64_t jobs;
};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static bool is_read(unsigned k, uint64_t i)
{
	return mix((uint64_t)k << 32 | i) % 3 == 0;
}

static uint64_t job_len(unsigned k, uint64_t i)
{
	return 1 + mix((uint64_t)k << 40 | i | 1ull << 63) % SLOT;
}

static uint64_t origin_slot(unsigned k, uint64_t i, uint64_t jobs)
{
	return (i * 7 + k * 131) % jobs;
}

static int child_fail(unsigned k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int child_fail(unsigned k, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "itest concurrency client %u: ", k);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

static int handle(unsigned k, const struct plan *p, const struct rdmax_event *ev, uint8_t *seen,
		  uint64_t *done)
{
	if (ev->type != RDMAX_EVENT_COMPLETION) {
		return child_fail(k, "unexpected event type %d", (int)ev->type);
	}
	/* Ids are not the job index, so the daemon cannot get away with echoing a counter. */
	uint64_t i = (ev->job_id - ID_BASE * (k + 1)) / 3;
	if (ev->job_id < ID_BASE * (k + 1) || (ev->job_id - ID_BASE * (k + 1)) % 3 != 0 ||
	    i >= p->jobs) {
		return child_fail(k, "completion for unknown job id %" PRIu64, ev->job_id);
	}
	if (seen[i]++) {
		return child_fail(k, "job %" PRIu64 " completed twice", i);
	}
	if (ev->status != 0) {
		return child_fail(k, "job %" PRIu64 " (%s) failed: %s ('%s')", i,
				  is_read(k, i) ? "READ" : "WRITE", rdmax_err_name(ev->status),
				  ev->reason);
	}
	if (ev->bytes != job_len(k, i)) {
		return child_fail(k, "job %" PRIu64 " moved %" PRIu64 " bytes, expected %" PRIu64,
				  i, ev->bytes, job_len(k, i));
	}
	(*done)++;
	return 0;
}

static int run_client(unsigned k, const struct plan *p)
{
	struct rdmax_client *c = NULL;
	struct rdmax_region *local = NULL;
	struct rdmax_job batch[MAX_BATCH];
	struct rdmax_event evs[64];
	uint64_t deadline = itest_now_ms() + CLIENT_WAIT_MS;
	uint64_t next = 0, done = 0;
	char name[32];
	int ret;

	snprintf(name, sizeof(name), "itest-conc-%u", k);
	ret = rdmax_client_open(p->socket_path, name, &c);
	if (ret < 0) {
		return child_fail(k, "rdmax_client_open() failed: %s", rdmax_err_name(ret));
	}
	/* First half: write sources; second half: read sinks. */
	ret = rdmax_region_alloc_host(c, 2 * p->jobs * SLOT, RDMAX_ACCESS_LOCAL, &local);
	if (ret < 0) {
		return child_fail(k, "rdmax_region_alloc_host() failed: %s", rdmax_err_name(ret));
	}
	uint8_t *mem = rdmax_region_addr(local);
	itest_fill(mem, p->jobs * SLOT, 500 + k);
	uint8_t *seen = calloc(p->jobs, 1);
	if (!seen) {
		return child_fail(k, "out of memory");
	}

	while (done < p->jobs) {
		if (itest_now_ms() > deadline) {
			return child_fail(k, "%" PRIu64 " of %" PRIu64 " jobs completed in %d ms",
					  done, p->jobs, CLIENT_WAIT_MS);
		}
		/* Batches of varying size, keeping at most MAX_IN_FLIGHT outstanding. */
		size_t n = 0, want = 1 + mix(next ^ k) % MAX_BATCH;
		while (n < want && next < p->jobs && next - done < MAX_IN_FLIGHT) {
			uint64_t i = next++;
			uint64_t id = ID_BASE * (k + 1) + 3 * i;
			if (is_read(k, i)) {
				batch[n++] = itest_job(
					id, RDMAX_OP_READ, local, (p->jobs + i) * SLOT, p->origin,
					origin_slot(k, i, p->jobs) * SLOT, job_len(k, i));
			} else {
				batch[n++] = itest_job(id, RDMAX_OP_WRITE, local, i * SLOT, p->dst,
						       (k * p->jobs + i) * SLOT, job_len(k, i));
			}
		}
		if (n > 0) {
			ret = rdmax_submit(c, batch, n);
			if (ret < 0) {
				return child_fail(k, "rdmax_submit(%zu jobs) failed: %s", n,
						  rdmax_err_name(ret));
			}
		}
		int got = rdmax_poll_events(c, evs, 64, next < p->jobs ? 0 : 1000);
		if (got < 0) {
			return child_fail(k, "rdmax_poll_events() failed: %s", rdmax_err_name(got));
		}
		for (int e = 0; e < got; e++) {
			if (handle(k, p, &evs[e], seen, &done)) {
				return 1;
			}
		}
	}
	/* Nothing more may come: no duplicates after the last expected completion. */
	ret = rdmax_poll_events(c, evs, 64, ITEST_QUIET_MS);
	if (ret != 0) {
		return child_fail(k, "%d events after all jobs completed (first: job %" PRIu64 ")",
				  ret, ret > 0 ? evs[0].job_id : 0);
	}
	for (uint64_t i = 0; i < p->jobs; i++) {
		if (!is_read(k, i)) {
			continue;
		}
		const uint8_t *got = mem + (p->jobs + i) * SLOT;
		const uint8_t *want = p->origin_bytes + origin_slot(k, i, p->jobs) * SLOT;
		if (memcmp(got, want, job_len(k, i)) != 0) {
			return child_fail(k, "READ job %" PRIu64 " delivered wrong bytes", i);
		}
	}
	free(seen);
	rdmax_client_close(c);
	return 0;
}

START_TEST(many_clients_many_jobs)
{
	const uint64_t jobs = itest_scaled(1000, 100);
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	pid_t pids[N_CLIENTS];

	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *dst =
		itest_alloc(cb, N_CLIENTS * jobs * SLOT, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *origin = itest_alloc(cb, jobs * SLOT, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_desc ddst = itest_desc(dst), dorigin = itest_desc(origin);
	itest_fill(itest_bytes(origin), jobs * SLOT, 499);
	memset(itest_bytes(dst), 0, N_CLIENTS * jobs * SLOT);
	struct plan plan = {
		.socket_path = a->socket_path,
		.dst = &ddst,
		.origin = &dorigin,
		.origin_bytes = itest_bytes(origin),
		.jobs = jobs,
	};

	uint64_t t0 = itest_now_ms();
	pid_t parent = getpid();
	for (unsigned k = 0; k < N_CLIENTS; k++) {
		pids[k] = fork();
		ck_assert_int_ge(pids[k], 0);
		if (pids[k] == 0) {
			itest_child_setup(parent);
			_exit(run_client(k, &plan));
		}
	}
	int failed = 0;
	for (unsigned k = 0; k < N_CLIENTS; k++) {
		int status;
		ck_assert_int_eq(waitpid(pids[k], &status, 0), pids[k]);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "itest concurrency: client %u ended with status 0x%x\n", k,
				status);
			failed++;
		}
	}
	ck_assert_msg(failed == 0, "%d of %d clients failed (see their messages above)", failed,
		      N_CLIENTS);
	fprintf(stderr, "itest concurrency: %d clients x %" PRIu64 " jobs in %" PRIu64 " ms\n",
		N_CLIENTS, jobs, itest_now_ms() - t0);

	/* Every written slot holds its client's bytes, and nothing past the job's length. */
	uint8_t *expect = malloc(jobs * SLOT);
	ck_assert_ptr_nonnull(expect);
	for (unsigned k = 0; k < N_CLIENTS; k++) {
		itest_fill(expect, jobs * SLOT, 500 + k);
		for (uint64_t i = 0; i < jobs; i++) {
			const uint8_t *slot = itest_bytes(dst) + (k * jobs + i) * SLOT;
			uint64_t len = is_read(k, i) ? 0 : job_len(k, i);
			ck_assert_msg(memcmp(slot, expect + i * SLOT, len) == 0,
				      "client %u WRITE job %" PRIu64 ": wrong bytes at the target",
				      k, i);
			for (uint64_t b2 = len; b2 < SLOT; b2++) {
				ck_assert_msg(slot[b2] == 0,
					      "client %u job %" PRIu64 ": byte %" PRIu64
					      " past the job's end was written",
					      k, i, b2);
			}
		}
	}
	free(expect);
	rdmax_client_close(cb);
	itest_daemon_stop(a);
	itest_daemon_stop(b);
	itest_daemon_free(a);
	itest_daemon_free(b);
}
END_TEST

/*
 * With the smallest message limit, completions (half of them failures with
 * a message, all with ids and byte counts that need long varints) must be
 * split over many messages, none over the limit, none lost or repeated; and
 * a Submit too large for the limit is refused as a whole.
 */
START_TEST(completion_batching)
{
	const size_t total = 600, per_submit = 12;
	const uint64_t base = (UINT64_C(1) << 62) + 12345;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());

	itest_daemon_set(a, "limits.max_message_bytes=4K");
	itest_daemon_start(a);
	struct rdmax_client *c = itest_client(a, "batcher");
	ck_assert_uint_eq(rdmax_client_info(c)->max_message_bytes, 4096);
	struct rdmax_region *src = itest_alloc(c, total * 64, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(c, total * 64, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_job *jobs = calloc(total, sizeof(*jobs));
	struct rdmax_event *evs = calloc(total, sizeof(*evs));
	uint8_t *seen = calloc(total, 1);
	ck_assert(jobs && evs && seen);
	itest_fill(itest_bytes(src), total * 64, 121);

	for (size_t i = 0; i < total; i++) {
		/* Odd jobs reach past the target's end: OUT_OF_RANGE with a message. */
		uint64_t roff = i % 2 ? rdmax_region_length(dst) - 8 : i * 64;
		jobs[i] =
			itest_job(base + i * 1000003, RDMAX_OP_WRITE, src, i * 64, &desc, roff, 64);
	}
	/* Far more than 4 KiB in one Submit. */
	itest_assert_err(rdmax_submit(c, jobs, 100), RDMAX_E_RESOURCE_EXHAUSTED);
	itest_assert_quiet(c, 100);

	for (size_t i = 0; i < total; i += per_submit) {
		int ret = rdmax_submit(c, jobs + i, per_submit);
		ck_assert_msg(ret == 0, "rdmax_submit(%zu jobs) failed: %s%s", per_submit,
			      rdmax_err_name(ret), itest_daemon_deaths());
	}
	ck_assert_uint_eq(itest_collect(c, evs, total, 30000, NULL), total);
	for (size_t e = 0; e < total; e++) {
		uint64_t i = (evs[e].job_id - base) / 1000003;
		ck_assert_msg(evs[e].job_id >= base && i < total &&
				      evs[e].job_id == base + i * 1000003,
			      "completion for unknown job %" PRIu64, evs[e].job_id);
		ck_assert_msg(!seen[i]++, "job %" PRIu64 " completed twice", i);
		if (i % 2) {
			itest_assert_err(evs[e].status, RDMAX_E_OUT_OF_RANGE);
			ck_assert(evs[e].reason[0]);
		} else {
			itest_assert_err(evs[e].status, 0);
			ck_assert_uint_eq(evs[e].bytes, 64);
		}
	}
	itest_assert_quiet(c, ITEST_QUIET_MS);
	for (size_t i = 0; i < total; i += 2) {
		itest_assert_mem_eq(itest_bytes(dst) + i * 64, itest_bytes(src) + i * 64, 64,
				    "batched same-node WRITE");
	}
	free(jobs);
	free(evs);
	free(seen);
	rdmax_client_close(c);
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

/*
 * A client that submits much and reads nothing for a while: the daemon's
 * socket to it fills up, so completions wait in the daemon's queue, and all
 * of them must arrive once the client reads again.
 */
START_TEST(slow_reader)
{
	const size_t total = 1200, per_submit = 12;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());

	itest_daemon_set(a, "limits.max_message_bytes=4K");
	itest_daemon_start(a);
	struct rdmax_client *c = itest_client(a, "sleeper");
	struct rdmax_region *src = itest_alloc(c, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(c, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_job jobs[12];
	struct rdmax_event *evs = calloc(total, sizeof(*evs));
	uint8_t *seen = calloc(total, 1);
	ck_assert(evs && seen);

	for (size_t i = 0; i < total; i += per_submit) {
		for (size_t j = 0; j < per_submit; j++) {
			/* Failures carry a message: bigger completions fill the socket sooner. */
			jobs[j] = itest_job(i + j, RDMAX_OP_WRITE, src, 0, &desc, 4000, 200);
		}
		int ret = rdmax_submit(c, jobs, per_submit);
		ck_assert_msg(ret == 0, "rdmax_submit() of jobs %zu.. failed: %s%s", i,
			      rdmax_err_name(ret), itest_daemon_deaths());
	}
	/* Every job done while nobody reads: the completions wait in the socket. */
	itest_wait_status(a, "jobs_in_flight", 0);
	size_t got = itest_collect(c, evs, total, 30000, NULL);
	ck_assert_msg(got == total, "%zu of %zu completions%s", got, total, itest_daemon_deaths());
	for (size_t e = 0; e < total; e++) {
		ck_assert_uint_lt(evs[e].job_id, total);
		ck_assert_msg(!seen[evs[e].job_id]++, "job %" PRIu64 " completed twice",
			      evs[e].job_id);
		itest_assert_err(evs[e].status, RDMAX_E_OUT_OF_RANGE);
	}
	itest_assert_quiet(c, ITEST_QUIET_MS);
	free(evs);
	free(seen);
	rdmax_client_close(c);
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

TCase *itest_tcase_concurrency(void)
{
	TCase *tc = tcase_create("concurrency");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, many_clients_many_jobs);
	tcase_add_test(tc, completion_batching);
	tcase_add_test(tc, slow_reader);
	return tc;
}
