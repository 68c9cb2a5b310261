/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the engine's job validation, chunking and exactly-once
 * completion, driven through a fake transport that records xfers and
 * completes them when the test says so.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine.h"
#include "fake_transport.h"
#include "fixtures.h"
#include "planner.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "transport.h"

Suite *validate_suite(void);

/* ------------------------------------------------------- engine / validate */

struct done_rec {
	uint64_t job_id;
	int err;
	char message[RDMAX_MESSAGE_MAX];
	uint64_t bytes;
};

static struct done_rec g_done[ENGINE_JOB_POOL_MAX + 16];
static int g_n_done;

static void on_complete(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes)
{
	ck_assert_int_lt(g_n_done, (int)ARRAY_SIZE(g_done));
	g_done[g_n_done].job_id = job_id;
	g_done[g_n_done].err = err;
	snprintf(g_done[g_n_done].message, sizeof(g_done[0].message), "%s", message ? message : "");
	g_done[g_n_done].bytes = bytes;
	g_n_done++;
}

static const struct transport_ops fake_ops = {
	.name = "fake",
	FAKE_TRANSPORT_OPS,
};

struct fixture {
	struct rdmaxd d;
	struct fake_transport ft;
	struct engine *engine;
	struct job_owner owner;
	struct region *local;
	struct region *target; /* same-daemon target */
	int fd;
	uint8_t desc[DESC_MAX_BYTES];
	size_t desc_len;
};

static struct fixture F;

static void fixture_setup(void)
{
	memset(&F, 0, sizeof(F));
	g_n_done = 0;
	config_defaults(&F.d.cfg);
	F.d.cfg.chunk_bytes = 4096;
	F.d.cfg.max_outstanding_jobs = 8;
	F.d.loop = uv_default_loop();
	F.d.instance_id = 1;
	ck_assert_int_eq(region_table_init(&F.d.regions, 1), 0);
	ck_assert_int_eq(imm_table_init(&F.d.imm, 16, NULL, NULL), 0);
	F.ft.base.ops = &fake_ops;
	F.ft.base.kind = ENDPOINT_TCP;
	F.ft.base.ordered = true;
	F.d.transports[ENDPOINT_TCP] = &F.ft.base;
	ck_assert_int_eq(engine_create(&F.d, on_complete, &F.engine), 0);
	ck_assert_int_eq(job_owner_init(&F.owner), 0);
	F.fd = unit_sealed_memfd(65536, F_SEAL_SHRINK);
	ck_assert_int_eq(region_register_host_fd(&F.d.regions, &F.owner, F.fd, 0, 65536,
						 RDMAX_ACCESS_REMOTE_WRITE, &F.local),
			 0);
	/* A remote descriptor (other instance) for 32 KiB. */
	struct remote_desc rd;
	memset(&rd, 0, sizeof(rd));
	rd.instance_id = 2;
	rd.region_id = 5;
	rd.region_key = 77;
	rd.length = 32768;
	rd.access = RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ;
	rd.n_endpoints = 1;
	rd.endpoints[0].transport = ENDPOINT_TCP;
	strcpy(rd.endpoints[0].addr, "127.0.0.1");
	rd.endpoints[0].port = 9;
	int len = desc_encode(&rd, F.desc, sizeof(F.desc));
	ck_assert_int_gt(len, 0);
	F.desc_len = (size_t)len;
}

static void fixture_teardown(void)
{
	close(F.fd);
	if (!F.owner.gone) {
		job_owner_leave(F.engine, &F.owner);
	}
	engine_destroy(F.engine);
	imm_table_fini(&F.d.imm);
	region_table_fini(&F.d.regions);
	uv_run(uv_default_loop(), UV_RUN_NOWAIT);
}

static void submit_write(uint64_t id, uint64_t local_off, uint64_t len, uint64_t remote_off,
			 int imm)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_WRITE;
	job.write = &w;
	w.local_region = F.local->id;
	w.local_offset = local_off;
	w.length = len;
	w.remote_desc.data = F.desc;
	w.remote_desc.len = F.desc_len;
	w.remote_offset = remote_off;
	if (imm >= 0) {
		w.has_imm = 1;
		w.imm = (uint32_t)imm;
	}
	engine_submit(F.engine, &F.owner, &job);
}

static void finish(int i, int err)
{
	fake_transport_finish(&F.ft, i, err);
}

START_TEST(engine_chunks_and_completes_once)
{
	submit_write(1, 0, 4096 * 3 + 100, 0, 9);
	ck_assert_int_eq(F.ft.n, 4);
	for (int i = 0; i < 4; i++) {
		ck_assert_uint_eq(F.ft.xfers[i]->remote_offset, 4096u * i);
		ck_assert_uint_eq(F.ft.xfers[i]->remote_region, 5);
		ck_assert_uint_eq(F.ft.xfers[i]->remote_key, 77);
		/* Ordered transport: imm rides on the last chunk only. */
		ck_assert_int_eq(F.ft.xfers[i]->has_imm, i == 3);
	}
	ck_assert_uint_eq(F.ft.xfers[3]->length, 100);
	ck_assert_uint_eq(F.owner.outstanding, 1);
	finish(0, 0);
	finish(1, 0);
	finish(2, 0);
	ck_assert_int_eq(g_n_done, 0);
	finish(3, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, 4096 * 3 + 100);
	ck_assert_uint_eq(F.owner.outstanding, 0);
	ck_assert_uint_eq(engine_outstanding(F.engine), 0);
}
END_TEST

/* A paged write of n pages of 1 KiB, destination pages reversed (no two merge). */
static void submit_paged(uint64_t id, uint32_t n, int imm)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__PagedWriteJob pw = RDMAX__V1__PAGED_WRITE_JOB__INIT;
	Rdmax__V1__PageList src = RDMAX__V1__PAGE_LIST__INIT, dst = RDMAX__V1__PAGE_LIST__INIT;
	uint32_t si[32], di[32];

	ck_assert_uint_le(n, 32);
	for (uint32_t i = 0; i < n; i++) {
		si[i] = i;
		di[i] = n - 1 - i;
	}
	src.indices = si;
	src.n_indices = n;
	dst.indices = di;
	dst.n_indices = n;
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_PAGED_WRITE;
	job.paged_write = &pw;
	pw.local_region = F.local->id;
	pw.remote_desc.data = F.desc;
	pw.remote_desc.len = F.desc_len;
	pw.page_len = 1024;
	pw.src = &src;
	pw.dst = &dst;
	if (imm >= 0) {
		pw.has_imm = 1;
		pw.imm = (uint32_t)imm;
	}
	engine_submit(F.engine, &F.owner, &job);
}

/*
 * A transport that takes several runs per xfer gets a paged write's pages
 * grouped: at most max_runs runs and chunk_bytes per xfer, the imm on the
 * last xfer only, every page once and in order.
 */
START_TEST(engine_groups_runs_per_xfer)
{
	F.ft.base.max_runs = 3;
	submit_paged(1, 10, 6); /* chunk 4096: at most 3 pages of 1 KiB per xfer */
	ck_assert_int_eq(F.ft.n, 4);
	uint32_t page = 0;
	for (int i = 0; i < 4; i++) {
		struct xfer *x = F.ft.xfers[i];
		uint32_t want = i < 3 ? 3 : 1;
		ck_assert_uint_eq(x->n_runs, i < 3 ? 3 : 0); /* a single run goes alone */
		ck_assert_uint_eq(x->length, 1024u * want);
		ck_assert_int_eq(x->has_imm, i == 3);
		for (uint32_t r = 0; r < want; r++, page++) {
			uint64_t local = x->n_runs ? x->runs[r].local_offset : x->local_offset;
			uint64_t remote = x->n_runs ? x->runs[r].remote_offset : x->remote_offset;
			ck_assert_uint_eq(local, 1024u * page);
			ck_assert_uint_eq(remote, 1024u * (9 - page));
		}
	}
	for (int i = 0; i < 3; i++) {
		finish(i, 0);
	}
	ck_assert_int_eq(g_n_done, 0);
	finish(3, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, 10 * 1024);

	/* Unordered: the imm's run is never grouped and waits for the others. */
	F.ft.base.ordered = false;
	F.ft.base.max_runs = 8;
	submit_paged(2, 5, 7);
	ck_assert_int_eq(F.ft.n, 5); /* one xfer of 4 runs; the last page held */
	ck_assert_uint_eq(F.ft.xfers[4]->n_runs, 4);
	ck_assert(!F.ft.xfers[4]->has_imm);
	finish(4, 0);
	ck_assert_int_eq(F.ft.n, 6);
	ck_assert_uint_eq(F.ft.xfers[5]->n_runs, 0);
	ck_assert(F.ft.xfers[5]->has_imm);
	ck_assert_uint_eq(F.ft.xfers[5]->remote_offset, 0);
	finish(5, 0);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, 0);
}
END_TEST

/*
 * A transport with a chunk size of its own (TCP: transport.tcp_chunk_bytes)
 * gets xfers of that size instead of engine.chunk_bytes, plain and paged;
 * one that has none gets engine.chunk_bytes.
 */
START_TEST(engine_transport_chunk_bytes)
{
	F.ft.base.chunk_bytes = 16384; /* four of engine.chunk_bytes (4096) */
	F.ft.base.max_runs = 32;
	submit_write(1, 0, 16384 + 4096 + 100, 0, 9);
	ck_assert_int_eq(F.ft.n, 2);
	ck_assert_uint_eq(F.ft.xfers[0]->length, 16384);
	ck_assert_uint_eq(F.ft.xfers[1]->length, 4096 + 100);
	ck_assert_uint_eq(F.ft.xfers[1]->remote_offset, 16384);
	ck_assert_int_eq(F.ft.xfers[1]->has_imm, 1);
	fake_transport_finish_all(&F.ft, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	/* 20 pages of 1 KiB: 16 in the first xfer (16 KiB), 4 in the second. */
	submit_paged(2, 20, 6);
	ck_assert_int_eq(F.ft.n, 4);
	ck_assert_uint_eq(F.ft.xfers[2]->n_runs, 16);
	ck_assert_uint_eq(F.ft.xfers[2]->length, 16384);
	ck_assert_uint_eq(F.ft.xfers[3]->n_runs, 4);
	fake_transport_finish_all(&F.ft, 2);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, 0);
	ck_assert_uint_eq(g_done[1].bytes, 20 * 1024);
	/* Without one: engine.chunk_bytes again. */
	F.ft.base.chunk_bytes = 0;
	submit_write(3, 0, 8192, 0, -1);
	ck_assert_int_eq(F.ft.n, 6);
	ck_assert_uint_eq(F.ft.xfers[4]->length, 4096);
	fake_transport_finish_all(&F.ft, 4);
	ck_assert_int_eq(g_n_done, 3);
}
END_TEST

START_TEST(engine_unordered_holds_imm_chunk)
{
	F.ft.base.ordered = false;
	submit_write(1, 0, 4096 * 2 + 1, 0, 3);
	ck_assert_int_eq(F.ft.n, 2); /* last chunk held */
	ck_assert(!F.ft.xfers[0]->has_imm && !F.ft.xfers[1]->has_imm);
	finish(1, 0);
	ck_assert_int_eq(F.ft.n, 2);
	finish(0, 0);
	ck_assert_int_eq(F.ft.n, 3);
	ck_assert(F.ft.xfers[2]->has_imm);
	ck_assert_uint_eq(F.ft.xfers[2]->length, 1);
	finish(2, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
}
END_TEST

START_TEST(engine_error_completes_early_once)
{
	submit_write(4, 0, 4096 * 3, 0, -1);
	ck_assert_int_eq(F.ft.n, 3);
	finish(1, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_str_eq(g_done[0].message, "fake failure");
	finish(0, 0);
	finish(2, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(g_n_done, 1);
	/* The local region was held until the last xfer returned. */
	ck_assert_uint_eq(F.local->refs, 1);
}
END_TEST

/* Spin until the clock has passed t (now_ns()): stamps before it lie in the past. */
static void clock_past(uint64_t t)
{
	while (now_ns() <= t) {
	}
}

/*
 * [metrics] job_stages: a job's stages come from its xfers' post stamps (the
 * earliest post and its return, the latest return) and its completion; for
 * jobs that completed OK, with stamps, while the key is on.
 */
START_TEST(engine_job_stages_from_post_stamps)
{
	const struct histogram *st = F.d.counters.job_stage;
	F.d.cfg.metrics_job_stages = true;

	uint64_t before = now_ns();
	submit_write(1, 0, 4096 * 3, 0, -1);
	uint64_t after = now_ns();
	ck_assert_int_eq(F.ft.n, 3);
	/* xfer 1 was posted first (3 us), xfer 2's post returned last. */
	uint64_t post[3] = {after + 20000, after + 10000, after + 30000};
	uint64_t end[3] = {after + 60000, after + 13000, after + 90000};
	for (int i = 0; i < 3; i++) {
		F.ft.xfers[i]->post_ns = post[i];
		F.ft.xfers[i]->post_end_ns = end[i];
	}
	clock_past(after + 100000);
	finish(0, 0);
	finish(2, 0);
	uint64_t done_before = now_ns();
	finish(1, 0);
	uint64_t done_after = now_ns();
	ck_assert_int_eq(g_n_done, 1);
	for (int s = 0; s < COUNTERS_STAGE_MAX; s++) {
		ck_assert_uint_eq(st[s].count, 1);
	}
	ck_assert_double_ge(st[COUNTERS_STAGE_QUEUE].sum, (double)(post[1] - after) / 1e9);
	ck_assert_double_le(st[COUNTERS_STAGE_QUEUE].sum, (double)(post[1] - before) / 1e9);
	ck_assert_double_eq_tol(st[COUNTERS_STAGE_POST].sum, 3000 / 1e9, 1e-12);
	ck_assert_double_ge(st[COUNTERS_STAGE_COMPLETE].sum, (double)(done_before - end[2]) / 1e9);
	ck_assert_double_le(st[COUNTERS_STAGE_COMPLETE].sum, (double)(done_after - end[2]) / 1e9);

	/* Not recorded: a failed job, a job without stamps, any job with the key off. */
	submit_write(2, 0, 100, 0, -1);
	F.ft.xfers[3]->post_ns = now_ns();
	F.ft.xfers[3]->post_end_ns = F.ft.xfers[3]->post_ns + 1;
	finish(3, RDMAX_E_TRANSPORT_ERROR);
	submit_write(3, 0, 100, 0, -1);
	finish(4, 0);
	F.d.cfg.metrics_job_stages = false;
	submit_write(4, 0, 100, 0, -1);
	F.ft.xfers[5]->post_ns = now_ns();
	F.ft.xfers[5]->post_end_ns = F.ft.xfers[5]->post_ns + 1;
	finish(5, 0);
	ck_assert_int_eq(g_n_done, 4);
	for (int s = 0; s < COUNTERS_STAGE_MAX; s++) {
		ck_assert_uint_eq(st[s].count, 1);
	}
}
END_TEST

START_TEST(engine_validation_errors)
{
	/* Local range. */
	submit_write(1, 65000, 1000, 0, -1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_OUT_OF_RANGE);
	/* Remote range. */
	submit_write(2, 0, 100, 32700, -1);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_OUT_OF_RANGE);
	/* Malformed descriptor. */
	F.desc[0] ^= 0xff;
	F.desc_len = 3;
	submit_write(3, 0, 100, 0, -1);
	ck_assert_int_eq(g_done[2].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(F.ft.n, 0);

	/* Unknown region, job without kind, a barrier without peers. */
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__ReadJob r = RDMAX__V1__READ_JOB__INIT;
	job.job_id = 4;
	job.kind_case = RDMAX__V1__JOB__KIND_READ;
	job.read = &r;
	r.local_region = 12345;
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(g_done[3].err, RDMAX_E_NOT_FOUND);
	job.job_id = 5;
	job.kind_case = RDMAX__V1__JOB__KIND__NOT_SET;
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(g_done[4].err, RDMAX_E_INVALID_ARGUMENT);
	Rdmax__V1__BarrierJob b = RDMAX__V1__BARRIER_JOB__INIT;
	job.job_id = 6;
	job.kind_case = RDMAX__V1__JOB__KIND_BARRIER;
	job.barrier = &b;
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(g_done[5].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[5].message, "barrier"));
	job.job_id = UINT64_MAX;
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(g_done[6].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(g_n_done, 7);
	ck_assert_uint_eq(F.owner.outstanding, 0);
	ck_assert_uint_eq(F.local->refs, 1);
}
END_TEST

START_TEST(engine_duplicate_and_limits)
{
	submit_write(1, 0, 10, 0, -1);
	/* A second job with the id in flight is refused without a completion. */
	Rdmax__V1__Job dup = RDMAX__V1__JOB__INIT;
	dup.job_id = 1;
	ck_assert_int_eq(engine_submit(F.engine, &F.owner, &dup), RDMAX_E_INVALID_ARGUMENT);
	ck_assert(engine_job_in_flight(&F.owner, 1));
	ck_assert_int_eq(g_n_done, 0);
	ck_assert_uint_eq(F.owner.outstanding, 1);
	for (uint64_t id = 2; id <= 9; id++) {
		submit_write(id, 0, 10, 0, -1);
	}
	/* 8 allowed outstanding: ids 1..8 run, 9 refused. */
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_uint_eq(g_done[0].job_id, 9);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_RESOURCE_EXHAUSTED);
	/* No usable transport. */
	F.d.transports[ENDPOINT_TCP] = NULL;
	finish(0, 0);
	submit_write(10, 0, 10, 0, -1);
	ck_assert_int_eq(g_done[g_n_done - 1].err, RDMAX_E_UNREACHABLE);
	F.d.transports[ENDPOINT_TCP] = &F.ft.base;
	/* Submit failure. */
	F.ft.fail_submit = RDMAX_E_RESOURCE_EXHAUSTED;
	submit_write(11, 0, 10, 0, -1);
	ck_assert_int_eq(g_done[g_n_done - 1].err, RDMAX_E_RESOURCE_EXHAUSTED);
}
END_TEST

START_TEST(engine_cancel_progress_leave)
{
	uint64_t done, total;
	submit_write(1, 0, 4096 * 2, 0, -1);
	ck_assert_int_eq(engine_job_progress(F.engine, &F.owner, 1, &done, &total), 0);
	ck_assert_uint_eq(total, 8192);
	F.ft.xfers[0]->bytes_done = 1000;
	ck_assert_int_eq(engine_job_progress(F.engine, &F.owner, 1, &done, &total), 0);
	ck_assert_uint_eq(done, 1000);
	ck_assert_int_eq(engine_cancel(F.engine, &F.owner, 1), 0);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_CANCELLED);
	ck_assert_int_eq(engine_cancel(F.engine, &F.owner, 1), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(engine_job_progress(F.engine, &F.owner, 1, &done, &total),
			 RDMAX_E_NOT_FOUND);
	finish(0, 0);
	finish(1, 0);
	ck_assert_int_eq(g_n_done, 1);

	submit_write(2, 0, 10, 0, -1);
	job_owner_leave(F.engine, &F.owner);
	finish(2, 0);
	ck_assert_int_eq(g_n_done, 1); /* nobody to tell */
	ck_assert_uint_eq(engine_outstanding(F.engine), 0);
	ck_assert_uint_eq(F.local->refs, 1);
}
END_TEST

/*
 * Freed jobs go to a pool of at most ENGINE_JOB_POOL_MAX: after more jobs
 * than that were in flight at once, the pool holds exactly the bound; jobs
 * beyond it still run and complete once, and the next ones reuse pooled
 * memory with nothing left over from the jobs before.
 */
START_TEST(engine_job_pool_bounded)
{
	const uint32_t n = ENGINE_JOB_POOL_MAX + 8;
	uint32_t idle;
	uint64_t reused;

	F.d.cfg.max_outstanding_jobs = n;
	for (uint64_t id = 1; id <= n; id++) {
		submit_write(id, 0, 10, 0, (int)id);
	}
	ck_assert_int_eq(F.ft.n, (int)n);
	ck_assert_uint_eq(F.owner.outstanding, n);
	engine_job_pool_stats(F.engine, &idle, &reused);
	ck_assert_uint_eq(idle, 0);
	for (uint32_t i = 0; i < n; i++) {
		finish((int)i, 0);
	}
	ck_assert_int_eq(g_n_done, (int)n);
	for (uint32_t i = 0; i < n; i++) {
		ck_assert_uint_eq(g_done[i].job_id, i + 1);
		ck_assert_int_eq(g_done[i].err, 0);
		ck_assert_uint_eq(g_done[i].bytes, 10);
	}
	engine_job_pool_stats(F.engine, &idle, &reused);
	ck_assert_uint_eq(idle, ENGINE_JOB_POOL_MAX);
	ck_assert_uint_eq(reused, 0);
	/* Reused jobs: an imm-less write after imm writes, a refusal, a success. */
	submit_write(1000, 0, 20, 100, -1);
	ck_assert_int_eq(F.ft.n, (int)n + 1);
	ck_assert_int_eq(F.ft.xfers[n]->has_imm, 0);
	ck_assert_uint_eq(F.ft.xfers[n]->length, 20);
	ck_assert_uint_eq(F.ft.xfers[n]->remote_offset, 100);
	submit_write(1001, 0, 1u << 20, 0, -1); /* past the remote region */
	ck_assert_int_eq(g_n_done, (int)n + 1);
	ck_assert_uint_eq(g_done[n].job_id, 1001);
	ck_assert_int_eq(g_done[n].err, RDMAX_E_OUT_OF_RANGE);
	finish((int)n, 0);
	ck_assert_int_eq(g_n_done, (int)n + 2);
	ck_assert_uint_eq(g_done[n + 1].job_id, 1000);
	ck_assert_int_eq(g_done[n + 1].err, 0);
	ck_assert_uint_eq(g_done[n + 1].bytes, 20);
	engine_job_pool_stats(F.engine, &idle, &reused);
	ck_assert_uint_eq(reused, 2);
	ck_assert_uint_eq(idle, ENGINE_JOB_POOL_MAX);
	ck_assert_uint_eq(engine_outstanding(F.engine), 0);
	ck_assert_uint_eq(F.owner.outstanding, 0);
	ck_assert_uint_eq(F.local->refs, 1);
}
END_TEST

START_TEST(engine_local_copy)
{
	/* Descriptor of our own instance: local copy, no transport. */
	int fd2 = unit_sealed_memfd(4096, F_SEAL_SHRINK);
	struct region *target;
	int other_owner;
	ck_assert_int_eq(region_register_host_fd(&F.d.regions, &other_owner, fd2, 0, 4096,
						 RDMAX_ACCESS_REMOTE_WRITE, &target),
			 0);
	close(fd2);
	struct endpoint ep = {.transport = ENDPOINT_TCP, .addr = "127.0.0.1", .port = 9};
	int len = region_desc_encode(&F.d.regions, target, "n", &ep, 1, F.desc, sizeof(F.desc));
	ck_assert_int_gt(len, 0);
	F.desc_len = (size_t)len;
	memset(F.local->addr, 0x3c, 100);
	submit_write(1, 0, 100, 10, -1);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_int_eq(F.ft.n, 0);
	ck_assert_uint_eq(target->addr[10], 0x3c);
	ck_assert_uint_eq(target->addr[109], 0x3c);
	ck_assert_uint_eq(target->addr[110], 0);
}
END_TEST

START_TEST(engine_shutdown_cancels_once)
{
	submit_write(7, 0, 100, 0, -1);
	submit_write(8, 0, 100, 0, -1);
	engine_cancel_all(F.engine);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_CANCELLED);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_CANCELLED);
	finish(0, RDMAX_E_CANCELLED);
	finish(1, RDMAX_E_CANCELLED);
	ck_assert_int_eq(g_n_done, 2);
}
END_TEST

static void run_loop_once_ms(uint64_t ms)
{
	uint64_t end = now_ms() + ms;
	while (now_ms() < end) {
		uv_run(uv_default_loop(), UV_RUN_NOWAIT);
	}
}

START_TEST(engine_deadline)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;
	job.job_id = 3;
	job.has_deadline_ms = 1;
	job.deadline_ms = 20;
	job.kind_case = RDMAX__V1__JOB__KIND_WRITE;
	job.write = &w;
	w.local_region = F.local->id;
	w.length = 10;
	w.remote_desc.data = F.desc;
	w.remote_desc.len = F.desc_len;
	uint64_t submitted = now_ms();
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(g_n_done, 0);
	/* Wait for the deadline's completion (bounded), not for a fixed time. */
	while (g_n_done == 0 && now_ms() - submitted < 5000) {
		uv_run(uv_default_loop(), UV_RUN_NOWAIT);
	}
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_TIMEOUT);
	finish(0, 0);
	ck_assert_int_eq(g_n_done, 1);
	run_loop_once_ms(10);
}
END_TEST

/* Descriptor bytes of a TCP region like the fixture's, with its own id, key and port. */
static size_t encode_desc(uint64_t region_id, uint64_t key, uint16_t port, uint8_t *buf,
			  size_t size)
{
	struct remote_desc rd;

	memset(&rd, 0, sizeof(rd));
	rd.instance_id = 2;
	rd.region_id = region_id;
	rd.region_key = key;
	rd.length = 32768;
	rd.access = RDMAX_ACCESS_REMOTE_WRITE;
	snprintf(rd.node_name, sizeof(rd.node_name), "node-%u", (unsigned)port);
	rd.n_endpoints = 1;
	rd.endpoints[0].transport = ENDPOINT_TCP;
	strcpy(rd.endpoints[0].addr, "10.0.0.1");
	rd.endpoints[0].port = port;
	int len = desc_encode(&rd, buf, size);
	ck_assert_int_gt(len, 0);
	return (size_t)len;
}

static void assert_same_desc(const struct remote_desc *a, const struct remote_desc *b)
{
	ck_assert_uint_eq(a->instance_id, b->instance_id);
	ck_assert_uint_eq(a->region_id, b->region_id);
	ck_assert_uint_eq(a->region_key, b->region_key);
	ck_assert_uint_eq(a->length, b->length);
	ck_assert_uint_eq(a->access, b->access);
	ck_assert_str_eq(a->node_name, b->node_name);
	ck_assert_uint_eq(a->n_endpoints, b->n_endpoints);
	for (uint32_t i = 0; i < a->n_endpoints; i++) {
		ck_assert_int_eq(a->endpoints[i].transport, b->endpoints[i].transport);
		ck_assert_str_eq(a->endpoints[i].addr, b->endpoints[i].addr);
		ck_assert_uint_eq(a->endpoints[i].port, b->endpoints[i].port);
	}
}

START_TEST(engine_desc_cache_same_result)
{
	struct remote_desc plain, cached;
	uint64_t hits, misses;
	uint32_t entries;

	ck_assert_int_eq(desc_decode(F.desc, F.desc_len, &plain), 0);
	for (int i = 0; i < 3; i++) {
		memset(&cached, 0xa5, sizeof(cached));
		ck_assert_int_eq(engine_desc_decode(F.engine, F.desc, F.desc_len, &cached), 0);
		assert_same_desc(&cached, &plain);
	}
	engine_desc_cache_stats(F.engine, &hits, &misses, &entries);
	ck_assert_uint_eq(misses, 1);
	ck_assert_uint_eq(hits, 2);
	ck_assert_uint_eq(entries, 1);

	/* Bytes differing only in the key are another descriptor, never the cached one. */
	uint8_t other[DESC_MAX_BYTES];
	size_t other_len = encode_desc(5, 78, 9, other, sizeof(other));
	ck_assert_int_eq(engine_desc_decode(F.engine, other, other_len, &cached), 0);
	ck_assert_uint_eq(cached.region_key, 78);
	ck_assert_int_eq(engine_desc_decode(F.engine, F.desc, F.desc_len, &cached), 0);
	ck_assert_uint_eq(cached.region_key, 77);

	/* Malformed bytes fail every time, are not kept, and leave ret_desc alone. */
	uint8_t bad[DESC_MAX_BYTES];
	memcpy(bad, F.desc, F.desc_len);
	bad[0] ^= 0xff;
	for (int i = 0; i < 2; i++) {
		memset(&cached, 0x5a, sizeof(cached));
		ck_assert_int_eq(engine_desc_decode(F.engine, bad, F.desc_len, &cached),
				 RDMAX_E_INVALID_ARGUMENT);
		ck_assert_uint_eq(cached.region_id, 0x5a5a5a5a5a5a5a5aull);
		ck_assert_int_eq(engine_desc_decode(F.engine, F.desc, F.desc_len - 1, &cached),
				 desc_decode(F.desc, F.desc_len - 1, &plain));
	}
	ck_assert_int_eq(engine_desc_decode(F.engine, NULL, 0, &cached), RDMAX_E_INVALID_ARGUMENT);
	engine_desc_cache_stats(F.engine, &hits, &misses, &entries);
	ck_assert_uint_eq(entries, 2);
}
END_TEST

START_TEST(engine_desc_cache_bounded)
{
	uint8_t buf[DESC_MAX_BYTES];
	struct remote_desc d;
	uint64_t hits, misses;
	uint32_t entries;

	/* Many more descriptors than entries: every answer is still that descriptor's. */
	for (int round = 0; round < 2; round++) {
		for (uint64_t i = 1; i <= 1000; i++) {
			size_t len = encode_desc(i, i * 3, (uint16_t)(1000 + i), buf, sizeof(buf));
			ck_assert_int_eq(engine_desc_decode(F.engine, buf, len, &d), 0);
			ck_assert_uint_eq(d.region_id, i);
			ck_assert_uint_eq(d.region_key, i * 3);
			ck_assert_uint_eq(d.endpoints[0].port, 1000 + i);
		}
	}
	engine_desc_cache_stats(F.engine, &hits, &misses, &entries);
	ck_assert_uint_le(entries, 256);
	ck_assert_uint_gt(entries, 128);
	ck_assert_uint_eq(hits + misses, 2000);

	/* The one in use stays: a hot descriptor between many cold ones keeps hitting. */
	uint8_t hot[DESC_MAX_BYTES];
	size_t hot_len = encode_desc(7, 7, 7, hot, sizeof(hot));
	ck_assert_int_eq(engine_desc_decode(F.engine, hot, hot_len, &d), 0);
	engine_desc_cache_stats(F.engine, &hits, &misses, &entries);
	uint64_t hits0 = hits;
	for (uint64_t i = 1; i <= 1000; i++) {
		size_t len = encode_desc(5000 + i, 1, (uint16_t)i, buf, sizeof(buf));
		ck_assert_int_eq(engine_desc_decode(F.engine, buf, len, &d), 0);
		ck_assert_int_eq(engine_desc_decode(F.engine, hot, hot_len, &d), 0);
		ck_assert_uint_eq(d.region_id, 7);
	}
	engine_desc_cache_stats(F.engine, &hits, &misses, &entries);
	ck_assert_uint_eq(hits - hits0, 1000);
}
END_TEST

START_TEST(engine_desc_cache_jobs_still_checked)
{
	uint64_t hits, misses;
	uint32_t entries;

	/* The second job hits the cache, and its range is still checked against the region. */
	submit_write(1, 0, 100, 0, -1);
	ck_assert_int_eq(F.ft.n, 1);
	finish(0, 0);
	submit_write(2, 0, 100, 32768 - 50, -1);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_OUT_OF_RANGE);
	ck_assert_int_eq(F.ft.n, 1);
	engine_desc_cache_stats(F.engine, &hits, &misses, &entries);
	ck_assert_uint_eq(misses, 1);
	ck_assert_uint_eq(hits, 1);
}
END_TEST

/* ------------------------------------------------------------------ rails */

/* Two device pairs: endpoint 10.0.0.N is reached through local device "devN". */
static char g_down_addr[46]; /* the local device of this peer address is down */

static int fake_route(struct transport *transport, const struct endpoint *peer, char *ret_device,
		      size_t size)
{
	snprintf(ret_device, size, "dev%c", peer->addr[strlen(peer->addr) - 1]);
	return strcmp(peer->addr, g_down_addr) == 0 ? RDMAX_E_UNREACHABLE : 0;
}

static const struct transport_ops fake_rail_ops = {
	.name = "fake",
	FAKE_TRANSPORT_OPS,
	.route = fake_route,
};

/* F.desc with two endpoints of the transport (two devices at the peer). */
static void two_rails(void)
{
	struct remote_desc rd;
	ck_assert_int_eq(desc_decode(F.desc, F.desc_len, &rd), 0);
	rd.n_endpoints = 2;
	for (int i = 0; i < 2; i++) {
		rd.endpoints[i].transport = ENDPOINT_TCP;
		snprintf(rd.endpoints[i].addr, sizeof(rd.endpoints[i].addr), "10.0.0.%d", i + 1);
		rd.endpoints[i].port = 9;
	}
	int len = desc_encode(&rd, F.desc, sizeof(F.desc));
	ck_assert_int_gt(len, 0);
	F.desc_len = (size_t)len;
	F.ft.base.ops = &fake_rail_ops;
	F.ft.base.ordered = false;
	g_down_addr[0] = '\0';
}

START_TEST(engine_stripes_over_rails)
{
	two_rails();
	submit_write(1, 0, 4096 * 4, 0, -1);
	ck_assert_int_eq(F.ft.n, 4);
	int on[2] = {0, 0};
	for (int i = 0; i < 4; i++) {
		on[strcmp(F.ft.xfers[i]->peer.addr, "10.0.0.1") == 0 ? 0 : 1]++;
	}
	ck_assert_int_eq(on[0], 2);
	ck_assert_int_eq(on[1], 2);
	for (int i = 0; i < 4; i++) {
		finish(i, 0);
	}
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);

	/* A device without an active port takes no chunks. */
	strcpy(g_down_addr, "10.0.0.1");
	submit_write(2, 0, 4096 * 4, 0, -1);
	ck_assert_int_eq(F.ft.n, 8);
	for (int i = 4; i < 8; i++) {
		ck_assert_str_eq(F.ft.xfers[i]->peer.addr, "10.0.0.2");
		finish(i, 0);
	}
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, 0);
}
END_TEST

START_TEST(engine_reissues_failed_rail_once)
{
	two_rails();
	submit_write(1, 0, 4096 * 2, 0, -1);
	ck_assert_int_eq(F.ft.n, 2);
	struct xfer *x = F.ft.xfers[0];
	char first[46];
	strcpy(first, x->peer.addr);
	/* Its device pair fails: the same chunk goes again, over the other pair. */
	finish(0, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(F.ft.n, 3);
	ck_assert_ptr_eq(F.ft.xfers[2], x);
	ck_assert_str_ne(x->peer.addr, first);
	ck_assert_uint_eq(x->remote_offset, 0);
	ck_assert_uint_eq(engine_reissued_chunks(F.engine), 1);
	ck_assert_int_eq(g_n_done, 0);
	/* It fails there too: no third try, the job fails once, with that error. */
	finish(2, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(F.ft.n, 3);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_TRANSPORT_ERROR);
	finish(1, 0);
	ck_assert_int_eq(g_n_done, 1);

	/* The failed pair is avoided by new chunks for rail_retry_ms. */
	submit_write(2, 0, 4096 * 2, 0, -1);
	ck_assert_int_eq(F.ft.n, 5);
	ck_assert_str_ne(F.ft.xfers[3]->peer.addr, first);
	ck_assert_str_ne(F.ft.xfers[4]->peer.addr, first);
	finish(3, 0);
	finish(4, 0);
	ck_assert_int_eq(g_done[1].err, 0);

	/* Errors of the job itself are not the device's: no re-issue. */
	submit_write(3, 0, 4096, 0, -1);
	ck_assert_int_eq(F.ft.n, 6);
	finish(5, RDMAX_E_REMOTE_ACCESS);
	ck_assert_int_eq(F.ft.n, 6);
	ck_assert_int_eq(g_done[2].err, RDMAX_E_REMOTE_ACCESS);
	ck_assert_uint_eq(engine_reissued_chunks(F.engine), 1);
}
END_TEST

/* Scatter destinations stripe and fail over like single-node jobs. */
START_TEST(engine_scatter_stripes_over_rails)
{
	two_rails();
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__ScatterJob sj = RDMAX__V1__SCATTER_JOB__INIT;
	Rdmax__V1__ScatterDest d[2] = {RDMAX__V1__SCATTER_DEST__INIT,
				       RDMAX__V1__SCATTER_DEST__INIT};
	Rdmax__V1__ScatterDest *ptrs[2] = {&d[0], &d[1]};
	for (int i = 0; i < 2; i++) {
		d[i].has_remote_desc = 1;
		d[i].remote_desc.data = F.desc;
		d[i].remote_desc.len = F.desc_len;
		d[i].local_offset = d[i].remote_offset = (uint64_t)i * 8192;
		d[i].length = 8192;
	}
	sj.local_region = F.local->id;
	sj.dests = ptrs;
	sj.n_dests = 2;
	job.job_id = 1;
	job.kind_case = RDMAX__V1__JOB__KIND_SCATTER;
	job.scatter = &sj;
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(F.ft.n, 4);
	int on1 = 0;
	for (int i = 0; i < 4; i++) {
		on1 += strcmp(F.ft.xfers[i]->peer.addr, "10.0.0.1") == 0;
	}
	ck_assert_int_eq(on1, 2);
	/* A failed rail: its chunk goes over the other one. */
	struct xfer *x = F.ft.xfers[0];
	char first[46];
	strcpy(first, x->peer.addr);
	finish(0, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(F.ft.n, 5);
	ck_assert_str_ne(F.ft.xfers[4]->peer.addr, first);
	for (int i = 1; i < 5; i++) {
		finish(i, 0);
	}
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, 16384);
}
END_TEST

START_TEST(engine_imm_chunk_not_reissued)
{
	two_rails();
	submit_write(1, 0, 100, 0, 7);
	ck_assert_int_eq(F.ft.n, 1);
	ck_assert(F.ft.xfers[0]->has_imm);
	/* Whether it landed is unknown: a second landing would count twice. */
	finish(0, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(F.ft.n, 1);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_TRANSPORT_ERROR);
}
END_TEST

START_TEST(engine_pinned_client)
{
	two_rails();
	strcpy(F.owner.pinned_devices, "dev2");
	submit_write(1, 0, 4096 * 3, 0, -1);
	ck_assert_int_eq(F.ft.n, 3);
	for (int i = 0; i < 3; i++) {
		ck_assert_str_eq(F.ft.xfers[i]->peer.addr, "10.0.0.2");
		finish(i, 0);
	}
	ck_assert_int_eq(g_done[0].err, 0);
	/* A pinned chunk has nowhere else to go. */
	submit_write(2, 0, 4096, 0, -1);
	finish(3, RDMAX_E_TRANSPORT_ERROR);
	ck_assert_int_eq(F.ft.n, 4);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_TRANSPORT_ERROR);

	strcpy(F.owner.pinned_devices, "dev7,dev9");
	submit_write(3, 0, 4096, 0, -1);
	ck_assert_int_eq(F.ft.n, 4);
	ck_assert_int_eq(g_done[2].err, RDMAX_E_UNREACHABLE);
	ck_assert_msg(strstr(g_done[2].message, "pinned"), "%s", g_done[2].message);
}
END_TEST

Suite *validate_suite(void)
{
	Suite *s = suite_create("validate");
	TCase *tc = tcase_create("engine");
	tcase_set_timeout(tc, 10);
	tcase_add_checked_fixture(tc, fixture_setup, fixture_teardown);
	tcase_add_test(tc, engine_chunks_and_completes_once);
	tcase_add_test(tc, engine_transport_chunk_bytes);
	tcase_add_test(tc, engine_unordered_holds_imm_chunk);
	tcase_add_test(tc, engine_groups_runs_per_xfer);
	tcase_add_test(tc, engine_error_completes_early_once);
	tcase_add_test(tc, engine_job_stages_from_post_stamps);
	tcase_add_test(tc, engine_validation_errors);
	tcase_add_test(tc, engine_duplicate_and_limits);
	tcase_add_test(tc, engine_cancel_progress_leave);
	tcase_add_test(tc, engine_local_copy);
	tcase_add_test(tc, engine_job_pool_bounded);
	tcase_add_test(tc, engine_shutdown_cancels_once);
	tcase_add_test(tc, engine_deadline);
	tcase_add_test(tc, engine_desc_cache_same_result);
	tcase_add_test(tc, engine_desc_cache_bounded);
	tcase_add_test(tc, engine_desc_cache_jobs_still_checked);
	tcase_add_test(tc, engine_stripes_over_rails);
	tcase_add_test(tc, engine_reissues_failed_rail_once);
	tcase_add_test(tc, engine_imm_chunk_not_reissued);
	tcase_add_test(tc, engine_scatter_stripes_over_rails);
	tcase_add_test(tc, engine_pinned_client);
	suite_add_tcase(s, tc);
	return s;
}
