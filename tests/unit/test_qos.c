/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the traffic-class scheduler (daemon/jobs/qos.c): the order
 * of picks by weight, round robin over clients inside a class, no
 * starvation of bulk; and of the engine with [qos] enabled, driven through
 * the fake transport: credits, the latency reserve, urgent chunks, a bad
 * class refused by name, and a reload that changes the limits.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fake_transport.h"
#include "fixtures.h"
#include "qos.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "transport.h"

Suite *qos_suite(void);

/* ------------------------------------------------------------ scheduler */

struct item {
	struct qos_waiter w;
	int id;
};

/* Pick n times, charging `charge` bytes each; the ids picked go to out (waiters stay). */
static void pick_n(struct qos_sched *s, const uint32_t weight[QOS_CLASS_MAX], int n,
		   uint64_t charge, int *out)
{
	for (int i = 0; i < n; i++) {
		struct qos_waiter *w = qos_pick(s, weight, 100, 3);
		ck_assert_ptr_nonnull(w);
		out[i] = container_of(w, struct item, w)->id;
		qos_charge(s, (enum qos_class)w->flow->cls, charge);
	}
}

START_TEST(qos_picks_by_weight)
{
	struct qos_sched s;
	struct qos_flow lat, bulk;
	struct item l = {.id = 0}, b = {.id = 1};
	const uint32_t weight[QOS_CLASS_MAX] = {3, 1};
	int got[40];

	qos_sched_init(&s);
	qos_flow_init(&lat, QOS_LATENCY);
	qos_flow_init(&bulk, QOS_BULK);
	qos_waiter_init(&l.w);
	qos_waiter_init(&b.w);
	qos_wait(&s, &bulk, &b.w);
	qos_wait(&s, &lat, &l.w);
	/* Each pick issues one quantum unit: three latency picks for every bulk pick. */
	pick_n(&s, weight, 40, 100, got);
	int n_lat = 0;
	for (int i = 0; i < 40; i++) {
		n_lat += got[i] == 0;
	}
	ck_assert_int_eq(n_lat, 30);
	/* Steady state: never more than three latency picks in a row, never two bulk. */
	for (int i = 4; i < 40; i++) {
		bool four_lat =
			got[i] == 0 && got[i - 1] == 0 && got[i - 2] == 0 && got[i - 3] == 0;
		ck_assert(!four_lat);
		ck_assert(!(got[i] == 1 && got[i - 1] == 1));
	}
	/* Small latency chunks (a quarter of the quantum) get four picks per unit of weight. */
	qos_sched_init(&s);
	qos_waiter_init(&l.w);
	qos_waiter_init(&b.w);
	qos_flow_init(&lat, QOS_LATENCY);
	qos_flow_init(&bulk, QOS_BULK);
	qos_wait(&s, &lat, &l.w);
	qos_wait(&s, &bulk, &b.w);
	n_lat = 0;
	for (int i = 0; i < 26; i++) {
		struct qos_waiter *w = qos_pick(&s, weight, 100, 3);
		bool is_lat = w == &l.w;
		n_lat += is_lat;
		qos_charge(&s, is_lat ? QOS_LATENCY : QOS_BULK, is_lat ? 25 : 100);
	}
	ck_assert_int_eq(n_lat, 24);
}
END_TEST

START_TEST(qos_round_robin_within_class)
{
	struct qos_sched s;
	struct qos_flow f[3];
	struct item it[4] = {{.id = 0}, {.id = 1}, {.id = 2}, {.id = 3}};
	const uint32_t weight[QOS_CLASS_MAX] = {8, 1};
	int got[12];

	qos_sched_init(&s);
	for (int i = 0; i < 3; i++) {
		qos_flow_init(&f[i], QOS_LATENCY);
	}
	for (int i = 0; i < 4; i++) {
		qos_waiter_init(&it[i].w);
	}
	/* Client 0 marks two jobs latency, clients 1 and 2 one each: one pick per client per turn.
	 */
	qos_wait(&s, &f[0], &it[0].w);
	qos_wait(&s, &f[0], &it[3].w);
	qos_wait(&s, &f[1], &it[1].w);
	qos_wait(&s, &f[2], &it[2].w);
	ck_assert_uint_eq(s.n_waiting[QOS_LATENCY], 4);
	pick_n(&s, weight, 9, 10, got);
	for (int i = 0; i < 9; i++) {
		ck_assert_int_eq(got[i], i % 3); /* job 3 waits behind job 0 of its client */
	}
	/* Job 0 done: client 0's next job takes its place in the rotation. */
	qos_unwait(&s, &it[0].w);
	pick_n(&s, weight, 3, 10, got);
	ck_assert_int_eq(got[0], 3);
	ck_assert_int_eq(got[1], 1);
	ck_assert_int_eq(got[2], 2);
	qos_unwait(&s, &it[1].w);
	qos_unwait(&s, &it[1].w); /* twice: nothing */
	qos_unwait(&s, &it[2].w);
	qos_unwait(&s, &it[3].w);
	ck_assert_uint_eq(s.n_waiting[QOS_LATENCY], 0);
	ck_assert_ptr_null(qos_pick(&s, weight, 100, 3));
}
END_TEST

START_TEST(qos_bulk_never_starves)
{
	struct qos_sched s;
	struct qos_flow lat, bulk;
	struct item l = {.id = 0}, b = {.id = 1};
	const uint32_t weight[QOS_CLASS_MAX] = {1000, 1};
	int got[3003];

	qos_sched_init(&s);
	qos_flow_init(&lat, QOS_LATENCY);
	qos_flow_init(&bulk, QOS_BULK);
	qos_waiter_init(&l.w);
	qos_waiter_init(&b.w);
	qos_wait(&s, &lat, &l.w);
	qos_wait(&s, &bulk, &b.w);
	pick_n(&s, weight, 3003, 100, got);
	int n_bulk = 0;
	for (int i = 0; i < 3003; i++) {
		n_bulk += got[i] == 1;
	}
	ck_assert_int_eq(n_bulk, 3);
	/* Only bulk eligible (latency has no credit): bulk is picked, latency keeps waiting. */
	ck_assert_ptr_eq(qos_pick(&s, weight, 100, 1u << QOS_BULK), &b.w);
	ck_assert_ptr_eq(qos_pick(&s, weight, 100, 1u << QOS_LATENCY), &l.w);
	ck_assert_ptr_null(qos_pick(&s, weight, 100, 0));
	/* An idle class saves nothing: after latency idled, bulk is not owed a backlog. */
	qos_unwait(&s, &l.w);
	for (int i = 0; i < 50; i++) {
		ck_assert_ptr_eq(qos_pick(&s, weight, 100, 3), &b.w);
		qos_charge(&s, QOS_BULK, 100);
	}
	qos_wait(&s, &lat, &l.w);
	int n_lat = 0;
	for (int i = 0; i < 10; i++) {
		struct qos_waiter *w = qos_pick(&s, weight, 100, 3);
		n_lat += w == &l.w;
		qos_charge(&s, (enum qos_class)w->flow->cls, 100);
	}
	ck_assert_int_ge(n_lat, 9);
}
END_TEST

START_TEST(qos_class_values)
{
	enum qos_class c = QOS_CLASS_MAX;

	ck_assert_int_eq(qos_class_from_wire(0, QOS_BULK, &c), 0);
	ck_assert_int_eq(c, QOS_BULK);
	ck_assert_int_eq(qos_class_from_wire(1, QOS_BULK, &c), 0);
	ck_assert_int_eq(c, QOS_LATENCY);
	ck_assert_int_eq(qos_class_from_wire(2, QOS_LATENCY, &c), 0);
	ck_assert_int_eq(c, QOS_BULK);
	c = QOS_CLASS_MAX;
	ck_assert_int_eq(qos_class_from_wire(3, QOS_BULK, &c), -EINVAL);
	ck_assert_int_eq(c, QOS_CLASS_MAX);
	ck_assert_str_eq(qos_class_name(QOS_LATENCY), "latency");
	ck_assert_str_eq(qos_class_name(QOS_BULK), "bulk");
	ck_assert_str_eq(qos_class_name(7), "unknown");

	struct config cfg;
	char err[256];
	config_defaults(&cfg);
	ck_assert(!cfg.qos_enabled);
	ck_assert_int_eq(config_set(&cfg, "qos", "enabled", "true", err, sizeof(err)), 0);
	ck_assert(cfg.qos_enabled);
	ck_assert_int_eq(config_set(&cfg, "qos", "default_class", "latency", err, sizeof(err)), 0);
	ck_assert_uint_eq(cfg.qos_default_class, QOS_LATENCY);
	ck_assert_int_eq(config_set(&cfg, "qos", "latency_weight", "5", err, sizeof(err)), 0);
	ck_assert_uint_eq(cfg.qos_weight[QOS_LATENCY], 5);
	ck_assert_int_lt(config_set(&cfg, "qos", "default_class", "fast", err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(strstr(err, "expected latency or bulk"));
	ck_assert_int_lt(config_set(&cfg, "qos", "enabled", "yes", err, sizeof(err)), 0);
	ck_assert_int_lt(config_set(&cfg, "qos", "bulk_weight", "0", err, sizeof(err)), 0);
	cfg.qos_latency_reserve = cfg.qos_max_in_flight;
	ck_assert_int_lt(config_validate(&cfg, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(strstr(err, "latency_reserve"));
}
END_TEST

/* ------------------------------------------------------------ engine with [qos] */

#define N_DONE 64

struct done_rec {
	void *owner;
	uint64_t job_id;
	int err;
	char message[RDMAX_MESSAGE_MAX];
};

static struct done_rec g_done[N_DONE];
static int g_n_done;

static void on_complete(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes)
{
	(void)bytes;
	ck_assert_int_lt(g_n_done, N_DONE);
	g_done[g_n_done].owner = owner;
	g_done[g_n_done].job_id = job_id;
	g_done[g_n_done].err = err;
	snprintf(g_done[g_n_done].message, sizeof(g_done[0].message), "%s", message ? message : "");
	g_n_done++;
}

static const struct transport_ops fake_ops = {
	.name = "fake",
	FAKE_TRANSPORT_OPS,
};

#define CLIENTS 2

struct fixture {
	struct rdmaxd d;
	struct fake_transport ft;
	struct engine *engine;
	struct job_owner owner[CLIENTS];
	struct region *local[CLIENTS];
	int fd[CLIENTS];
	uint8_t desc[DESC_MAX_BYTES];
	size_t desc_len;
};

static struct fixture F;

static void setup(void)
{
	memset(&F, 0, sizeof(F));
	g_n_done = 0;
	config_defaults(&F.d.cfg);
	F.d.cfg.chunk_bytes = 4096;
	F.d.cfg.qos_enabled = true;
	F.d.cfg.qos_max_in_flight = 4;
	F.d.cfg.qos_latency_reserve = 1;
	F.d.loop = uv_default_loop();
	F.d.instance_id = 1;
	ck_assert_int_eq(region_table_init(&F.d.regions, 1), 0);
	ck_assert_int_eq(imm_table_init(&F.d.imm, 16, NULL, NULL), 0);
	F.ft.base.ops = &fake_ops;
	F.ft.base.kind = ENDPOINT_TCP;
	F.ft.base.ordered = true;
	F.d.transports[ENDPOINT_TCP] = &F.ft.base;
	ck_assert_int_eq(engine_create(&F.d, on_complete, &F.engine), 0);
	for (int c = 0; c < CLIENTS; c++) {
		ck_assert_int_eq(job_owner_init(&F.owner[c]), 0);
		F.fd[c] = unit_sealed_memfd(65536, F_SEAL_SHRINK);
		ck_assert_int_eq(region_register_host_fd(&F.d.regions, &F.owner[c], F.fd[c], 0,
							 65536, RDMAX_ACCESS_REMOTE_WRITE,
							 &F.local[c]),
				 0);
	}
	struct remote_desc rd;
	memset(&rd, 0, sizeof(rd));
	rd.instance_id = 2;
	rd.region_id = 5;
	rd.region_key = 77;
	rd.length = 65536;
	rd.access = RDMAX_ACCESS_REMOTE_WRITE;
	rd.n_endpoints = 1;
	rd.endpoints[0].transport = ENDPOINT_TCP;
	strcpy(rd.endpoints[0].addr, "127.0.0.1");
	rd.endpoints[0].port = 9;
	int len = desc_encode(&rd, F.desc, sizeof(F.desc));
	ck_assert_int_gt(len, 0);
	F.desc_len = (size_t)len;
}

static void teardown(void)
{
	for (int c = 0; c < CLIENTS; c++) {
		close(F.fd[c]);
		job_owner_leave(F.engine, &F.owner[c]);
	}
	engine_destroy(F.engine);
	imm_table_fini(&F.d.imm);
	region_table_fini(&F.d.regions);
	uv_run(uv_default_loop(), UV_RUN_NOWAIT);
}

/* A write of len bytes by client c, in traffic class `wire` (0: the session's). */
static void submit(int c, uint64_t id, uint64_t len, uint32_t wire)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_WRITE;
	job.write = &w;
	if (wire) {
		job.has_traffic_class = 1;
		job.traffic_class = wire;
	}
	w.local_region = F.local[c]->id;
	w.length = len;
	w.remote_desc.data = F.desc;
	w.remote_desc.len = F.desc_len;
	ck_assert_int_eq(engine_submit(F.engine, &F.owner[c], &job), 0);
}

/* Which client's region the i-th recorded xfer reads. */
static int client_of(int i)
{
	for (int c = 0; c < CLIENTS; c++) {
		if (F.ft.snap[i].local == F.local[c]) {
			return c;
		}
	}
	ck_abort_msg("xfer %d of no client", i);
	return -1;
}

static int done_index(void *owner, uint64_t id)
{
	for (int i = 0; i < g_n_done; i++) {
		if (g_done[i].owner == owner && g_done[i].job_id == id) {
			return i;
		}
	}
	return -1;
}

START_TEST(qos_engine_latency_passes_bulk_backlog)
{
	struct engine_qos_stats st;

	/* 16 bulk chunks: 3 credits (4 minus the latency reserve), the rest wait. */
	submit(0, 1, 16 * 4096, 2);
	ck_assert_int_eq(F.ft.n, 3);
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.in_flight[QOS_BULK], 3);
	ck_assert_uint_eq(st.waiting[QOS_BULK], 1);
	for (int i = 0; i < 3; i++) {
		ck_assert(!F.ft.snap[i].urgent);
	}
	/* A latency write goes at once on the reserve, marked urgent. */
	submit(1, 2, 4096, 1);
	ck_assert_int_eq(F.ft.n, 4);
	ck_assert(F.ft.snap[3].urgent);
	ck_assert_int_eq(client_of(3), 1);
	/* A second latency write finds no credit: it waits, and is granted before bulk. */
	submit(1, 3, 4096, 1);
	ck_assert_int_eq(F.ft.n, 4);
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.waiting[QOS_LATENCY], 1);
	fake_transport_finish(&F.ft, 0, 0); /* a bulk chunk returns */
	ck_assert_int_eq(F.ft.n, 5);
	ck_assert(F.ft.snap[4].urgent);
	fake_transport_finish(&F.ft, 3, 0);
	fake_transport_finish(&F.ft, 4, 0);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(done_index(&F.owner[1], 2), 0);
	ck_assert_int_eq(done_index(&F.owner[1], 3), 1);
	/* Bulk goes on alone and completes last, never over its 3 credits. */
	for (int i = 1; i < F.ft.n; i++) {
		if (i == 3 || i == 4) {
			continue;
		}
		engine_qos_stats(F.engine, &st);
		ck_assert_uint_le(st.in_flight[QOS_BULK], 3);
		fake_transport_finish(&F.ft, i, 0);
	}
	ck_assert_int_eq(F.ft.n, 5 + 13);
	ck_assert_int_eq(g_n_done, 3);
	ck_assert_int_eq(done_index(&F.owner[0], 1), 2);
	ck_assert_int_eq(g_done[2].err, 0);
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.in_flight[QOS_BULK] + st.in_flight[QOS_LATENCY], 0);
	ck_assert_uint_eq(st.waiting[QOS_BULK] + st.waiting[QOS_LATENCY], 0);
	ck_assert_uint_ge(st.grants[QOS_BULK], 10);
	ck_assert_uint_eq(st.grants[QOS_LATENCY], 1);
	ck_assert_uint_eq(F.d.counters.class_ok[QOS_LATENCY], 2);
	ck_assert_uint_eq(F.d.counters.class_ok[QOS_BULK], 1);
	ck_assert_uint_eq(F.d.counters.class_bytes[QOS_BULK], 16 * 4096);
}
END_TEST

START_TEST(qos_engine_fair_share_between_clients)
{
	/* Both clients bulk (the daemon's default class), 8 chunks each. */
	submit(0, 1, 8 * 4096, 0);
	submit(1, 1, 8 * 4096, 0);
	ck_assert_int_eq(F.ft.n, 3);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(client_of(i), 0); /* client 1 came when the credits were gone */
	}
	/*
	 * Every returned chunk frees one credit; the grants alternate between the
	 * clients (client 0's flow was first in line).
	 */
	for (int i = 0; i < 8; i++) {
		fake_transport_finish(&F.ft, i, 0);
		ck_assert_int_eq(F.ft.n, 4 + i);
		ck_assert_int_eq(client_of(3 + i), i % 2);
	}
	fake_transport_finish_all(&F.ft, 8); /* and every chunk issued meanwhile */
	ck_assert_int_eq(F.ft.n, 16);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_int_eq(g_done[1].err, 0);
}
END_TEST

START_TEST(qos_engine_bad_class_and_session_default)
{
	submit(0, 1, 4096, 7);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[0].message, "unknown traffic class 7"));
	ck_assert_int_eq(F.ft.n, 0);
	/* The session's class applies to jobs that name none; a job's own class wins. */
	F.owner[1].traffic_class = 1;
	submit(1, 2, 4096, 0);
	ck_assert_int_eq(F.ft.n, 1);
	ck_assert(F.ft.snap[0].urgent);
	submit(1, 3, 4096, 2);
	ck_assert_int_eq(F.ft.n, 2);
	ck_assert(!F.ft.snap[1].urgent);
	fake_transport_finish_all(&F.ft, 0);
	ck_assert_int_eq(g_n_done, 3);
	ck_assert_uint_eq(F.d.counters.class_ok[QOS_LATENCY], 1);
	ck_assert_uint_eq(F.d.counters.class_ok[QOS_BULK], 1);
	ck_assert_uint_eq(F.d.counters.class_failed[QOS_BULK], 1); /* the refused one */
}
END_TEST

START_TEST(qos_engine_reload_applies)
{
	struct engine_qos_stats st;

	submit(0, 1, 12 * 4096, 2);
	ck_assert_int_eq(F.ft.n, 3);
	/* More room: the waiting job takes it at the reload, without a returned chunk. */
	F.d.cfg.qos_max_in_flight = 6;
	engine_qos_reconfigure(F.engine);
	ck_assert_int_eq(F.ft.n, 5);
	/* QoS off: only the job's own window (8 chunks) limits it. */
	F.d.cfg.qos_enabled = false;
	engine_qos_reconfigure(F.engine);
	ck_assert_int_eq(F.ft.n, 8);
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.waiting[QOS_BULK], 0);
	ck_assert_uint_eq(st.in_flight[QOS_BULK], 8);
	fake_transport_finish_all(&F.ft, 0);
	ck_assert_int_eq(F.ft.n, 12);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
}
END_TEST

/*
 * A job's lane is fixed when it is admitted: a reload that turns [qos] off
 * mid-job leaves its later chunks on the latency lane (an ordered transport
 * keeps a job's imm behind its data only within one lane), and a job
 * admitted after it takes the default lane.
 */
START_TEST(qos_engine_lane_fixed_at_admission)
{
	submit(1, 1, 12 * 4096, 1);
	int first = F.ft.n;
	ck_assert_int_gt(first, 0);
	ck_assert_int_lt(first, 12);
	F.d.cfg.qos_enabled = false;
	engine_qos_reconfigure(F.engine);
	submit(0, 2, 4096, 1);
	int later = F.ft.n - 1;
	ck_assert_int_eq(client_of(later), 0);
	ck_assert(!F.ft.snap[later].urgent);
	fake_transport_finish_all(&F.ft, 0);
	ck_assert_int_eq(g_n_done, 2);
	int of_job = 0;
	for (int i = 0; i < F.ft.n; i++) {
		if (client_of(i) == 1) {
			ck_assert_msg(F.ft.snap[i].urgent,
				      "chunk %d of the latency job left its lane", i);
			of_job++;
		}
	}
	ck_assert_int_eq(of_job, 12);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_int_eq(g_done[1].err, 0);
}
END_TEST

START_TEST(qos_engine_cancel_while_waiting)
{
	struct engine_qos_stats st;

	submit(0, 1, 8 * 4096, 2);
	submit(1, 2, 8 * 4096, 2);
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.waiting[QOS_BULK], 2);
	/* A waiting job cancelled leaves the queue; its client leaving too. */
	ck_assert_int_eq(engine_cancel(F.engine, &F.owner[1], 2), 0);
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.waiting[QOS_BULK], 1);
	fake_transport_finish(&F.ft, 0, 0);
	ck_assert_int_eq(F.ft.n, 4);
	ck_assert_int_eq(client_of(3), 0);
	job_owner_leave(F.engine, &F.owner[0]);
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.waiting[QOS_BULK], 0);
	ck_assert_int_eq(g_n_done, 1); /* a client that left is told nothing */
	fake_transport_finish_all(&F.ft, 1);
	ck_assert_int_eq(F.ft.n, 4); /* nothing more was issued for the jobs that ended */
	engine_qos_stats(F.engine, &st);
	ck_assert_uint_eq(st.in_flight[QOS_BULK], 0);
	ck_assert_int_eq(job_owner_init(&F.owner[0]), 0); /* teardown leaves it again */
}
END_TEST

Suite *qos_suite(void)
{
	Suite *s = suite_create("qos");
	TCase *tc = tcase_create("scheduler");
	tcase_add_test(tc, qos_picks_by_weight);
	tcase_add_test(tc, qos_round_robin_within_class);
	tcase_add_test(tc, qos_bulk_never_starves);
	tcase_add_test(tc, qos_class_values);
	suite_add_tcase(s, tc);
	tc = tcase_create("engine");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, qos_engine_latency_passes_bulk_backlog);
	tcase_add_test(tc, qos_engine_fair_share_between_clients);
	tcase_add_test(tc, qos_engine_bad_class_and_session_default);
	tcase_add_test(tc, qos_engine_reload_applies);
	tcase_add_test(tc, qos_engine_lane_fixed_at_admission);
	tcase_add_test(tc, qos_engine_cancel_while_waiting);
	suite_add_tcase(s, tc);
	return s;
}
