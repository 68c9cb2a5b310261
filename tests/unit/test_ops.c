/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the operations modules: the JSON writer of admin replies
 * (escaping of hostile strings, limits, structure errors), the metrics
 * counters and their Prometheus rendering, and where the admin socket goes.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "config.h"
#include "desc.h"
#include "json.h"
#include "metrics.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"

Suite *ops_suite(void);

static const char *finish(struct json *j)
{
	const char *text = NULL;
	size_t len = 0;

	ck_assert_int_eq(json_finish(j, &text, &len), 0);
	ck_assert_uint_eq(strlen(text), len);
	return text;
}

START_TEST(json_structure)
{
	struct json j;

	json_init(&j, 4096);
	json_obj_open(&j, NULL);
	json_bool(&j, "ok", true);
	json_u64(&j, "big", UINT64_MAX);
	json_i64(&j, "neg", -5);
	json_arr_open(&j, "list");
	json_str(&j, NULL, "a");
	json_obj_open(&j, NULL);
	json_null(&j, "x");
	json_obj_close(&j);
	json_arr_close(&j);
	json_arr_open(&j, "empty");
	json_arr_close(&j);
	json_double(&j, "half", 0.5);
	json_obj_close(&j);
	ck_assert_str_eq(finish(&j), "{\"ok\":true,\"big\":18446744073709551615,\"neg\":-5,"
				     "\"list\":[\"a\",{\"x\":null}],\"empty\":[],\"half\":0.5}");
	json_fini(&j);
}
END_TEST

START_TEST(json_escaping)
{
	struct json j;

	/* A client name is chosen by the client: quotes, newlines, bad UTF-8, NUL-free. */
	json_init(&j, 4096);
	json_obj_open(&j, NULL);
	json_str(&j, "name",
		 "a\"b\\c\nd\x01"
		 "e\x7f");
	json_str(&j, "utf8", "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80");
	json_str(&j, "bad",
		 "x\xff"
		 "y\xc3"
		 "z\xed\xa0\x80"
		 "w");
	json_str(&j, "key\"q", "v");
	json_obj_close(&j);
	ck_assert_str_eq(finish(&j),
			 "{\"name\":\"a\\\"b\\\\c\\nd\\u0001e\\u007f\","
			 "\"utf8\":\"gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80\","
			 "\"bad\":\"x\\ufffdy\\ufffdz\\ufffd\\ufffd\\ufffdw\","
			 "\"key\\\"q\":\"v\"}");
	json_fini(&j);
}
END_TEST

START_TEST(json_errors)
{
	struct json j;
	const char *text;
	size_t len;

	json_init(&j, 64);
	json_obj_open(&j, NULL);
	for (int i = 0; i < 20; i++) {
		json_str(&j, "k", "0123456789");
	}
	json_obj_close(&j);
	ck_assert_int_eq(json_finish(&j, &text, &len), -EMSGSIZE);
	json_fini(&j);

	json_init(&j, 4096);
	json_obj_open(&j, NULL);
	ck_assert_int_eq(json_finish(&j, &text, &len), -EINVAL); /* not closed */
	json_fini(&j);

	json_init(&j, 4096);
	json_arr_close(&j);
	ck_assert_int_eq(json_finish(&j, &text, &len), -EINVAL); /* closed without open */
	json_fini(&j);

	json_init(&j, 1 << 20);
	for (int i = 0; i < JSON_DEPTH_MAX + 1; i++) {
		json_arr_open(&j, NULL);
	}
	ck_assert_int_eq(json_finish(&j, &text, &len), -EOVERFLOW);
	json_fini(&j);
	json_fini(NULL);
}
END_TEST

struct metrics_fixture {
	struct rdmaxd d;
	struct metrics *m;
};

static void metrics_setup(struct metrics_fixture *f)
{
	memset(f, 0, sizeof(*f));
	config_defaults(&f->d.cfg);
	counters_init(&f->d.counters);
	snprintf(f->d.node_name, sizeof(f->d.node_name), "node\"1");
	f->d.loop = uv_default_loop();
	ck_assert_int_eq(region_table_init(&f->d.regions, 1), 0);
	ck_assert_int_eq(imm_table_init(&f->d.imm, 16, NULL, NULL), 0);
	ck_assert_int_eq(metrics_create(&f->d, &f->m), 0);
}

static void metrics_teardown(struct metrics_fixture *f)
{
	metrics_destroy(f->m);
	imm_table_fini(&f->d.imm);
	region_table_fini(&f->d.regions);
}

static bool has_line(const char *text, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = text; (p = strstr(p, line)); p += n) {
		if ((p == text || p[-1] == '\n') && p[n] == '\n') {
			return true;
		}
	}
	return false;
}

START_TEST(metrics_counts_and_renders)
{
	struct metrics_fixture f;
	struct endpoint peer = {.transport = ENDPOINT_TCP, .addr = "10.0.0.2", .port = 7471};
	struct endpoint peer6 = {.transport = ENDPOINT_TCP, .addr = "fd00::2", .port = 7471};
	char *text;
	size_t len;

	metrics_setup(&f);
	struct counters *c = &f.d.counters;
	counters_job_done(c, XFER_WRITE, 0, 4096, 20000, peer.addr, peer.port, true); /* 20 us */
	counters_job_done(c, XFER_WRITE, 0, 1 << 20, 3000000, peer.addr, peer.port,
			  false); /* 3 ms */
	counters_job_done(c, XFER_READ, RDMAX_E_TIMEOUT, 100, 2000000000ull, peer6.addr, peer6.port,
			  false);
	counters_job_done(c, XFER_WRITE, -ENOMEM, 0, 1000, NULL, 0, false);
	counters_conn_event(c, "tcp", COUNTERS_CONN_ESTABLISHED);
	counters_conn_event(c, "tcp", COUNTERS_CONN_FAILED);
	counters_conn_event(c, "carrier-pigeon", COUNTERS_CONN_CLOSED);
	counters_imm_fired(c);

	ck_assert_uint_eq(c->total_jobs, 4);
	ck_assert_uint_eq(c->total_bytes, 4096 + (1 << 20) + 100);

	ck_assert_int_eq(metrics_prometheus(f.m, &text, &len), 0);
	ck_assert_uint_eq(strlen(text), len);
	ck_assert(has_line(text, "# TYPE rdmaxd_jobs_total counter"));
	ck_assert(has_line(text, "rdmaxd_jobs_total{op=\"write\",status=\"ok\"} 2"));
	ck_assert(has_line(text, "rdmaxd_jobs_total{op=\"read\",status=\"timeout\"} 1"));
	ck_assert(
		has_line(text, "rdmaxd_jobs_total{op=\"write\",status=\"resource_exhausted\"} 1"));
	ck_assert(has_line(text, "rdmaxd_job_bytes_total{op=\"write\",status=\"ok\"} 1052672"));
	/* Buckets are cumulative: 20 us is below 50 us, 3 ms below 5 ms. */
	ck_assert(
		has_line(text, "rdmaxd_job_duration_seconds_bucket{op=\"write\",le=\"5e-05\"} 2"));
	ck_assert(
		has_line(text, "rdmaxd_job_duration_seconds_bucket{op=\"write\",le=\"0.0025\"} 2"));
	ck_assert(
		has_line(text, "rdmaxd_job_duration_seconds_bucket{op=\"write\",le=\"0.005\"} 3"));
	ck_assert(has_line(text, "rdmaxd_job_duration_seconds_bucket{op=\"write\",le=\"+Inf\"} 3"));
	ck_assert(has_line(text, "rdmaxd_job_duration_seconds_count{op=\"write\"} 3"));
	ck_assert(has_line(text, "rdmaxd_job_duration_seconds_bucket{op=\"read\",le=\"1\"} 0"));
	ck_assert(has_line(text, "rdmaxd_job_duration_seconds_bucket{op=\"read\",le=\"2.5\"} 1"));
	ck_assert(has_line(text, "rdmaxd_job_size_bytes_count{op=\"write\"} 2"));
	ck_assert(has_line(text, "rdmaxd_local_jobs_total 1"));
	ck_assert(has_line(
		text,
		"rdmaxd_peer_jobs_total{peer=\"10.0.0.2:7471\",op=\"write\",result=\"ok\"} 2"));
	ck_assert(has_line(
		text,
		"rdmaxd_peer_jobs_total{peer=\"[fd00::2]:7471\",op=\"read\",result=\"error\"} 1"));
	ck_assert(has_line(text,
			   "rdmaxd_peer_bytes_total{peer=\"10.0.0.2:7471\",op=\"write\"} 1052672"));
	ck_assert(has_line(
		text, "rdmaxd_connection_events_total{transport=\"tcp\",event=\"established\"} 1"));
	ck_assert(has_line(text,
			   "rdmaxd_connection_events_total{transport=\"tcp\",event=\"failed\"} 1"));
	ck_assert(has_line(
		text, "rdmaxd_connection_events_total{transport=\"other\",event=\"closed\"} 1"));
	ck_assert(has_line(text, "rdmaxd_imm_writes_total 1"));
	ck_assert(has_line(text, "rdmaxd_imm_fired_total 1"));
	ck_assert(strstr(text, "node=\"node\\\"1\"") != NULL); /* label value escaped */
	ck_assert_ptr_null(strstr(text, "\n\n"));
	free(text);
	metrics_teardown(&f);
}
END_TEST

/* The stages of verbs jobs: µs-scale buckets, a histogram per stage, and the JSON summary. */
START_TEST(metrics_job_stages_render)
{
	struct metrics_fixture f;
	struct json j;
	char *text;
	size_t len;

	metrics_setup(&f);
	uint64_t ns[COUNTERS_STAGE_MAX] = {3000, 40000, 2000};
	counters_job_stages(&f.d.counters, ns);
	ns[COUNTERS_STAGE_POST] = 150000;
	counters_job_stages(&f.d.counters, ns);
	ck_assert_int_eq(metrics_prometheus(f.m, &text, &len), 0);
	ck_assert(has_line(text, "# TYPE rdmaxd_job_stage_seconds histogram"));
	ck_assert(
		has_line(text, "rdmaxd_job_stage_seconds_bucket{stage=\"queue\",le=\"2e-06\"} 0"));
	ck_assert(
		has_line(text, "rdmaxd_job_stage_seconds_bucket{stage=\"queue\",le=\"5e-06\"} 2"));
	ck_assert(has_line(text, "rdmaxd_job_stage_seconds_bucket{stage=\"post\",le=\"5e-05\"} 1"));
	ck_assert(
		has_line(text, "rdmaxd_job_stage_seconds_bucket{stage=\"post\",le=\"0.0001\"} 1"));
	ck_assert(
		has_line(text, "rdmaxd_job_stage_seconds_bucket{stage=\"post\",le=\"0.0002\"} 2"));
	ck_assert(has_line(text,
			   "rdmaxd_job_stage_seconds_bucket{stage=\"complete\",le=\"+Inf\"} 2"));
	ck_assert(has_line(text, "rdmaxd_job_stage_seconds_sum{stage=\"post\"} 0.00019"));
	ck_assert(has_line(text, "rdmaxd_job_stage_seconds_count{stage=\"complete\"} 2"));
	free(text);

	json_init(&j, 1 << 20);
	metrics_json(f.m, &j, NULL);
	const char *doc = finish(&j);
	ck_assert_ptr_nonnull(strstr(doc, "\"job_stages\":[{\"stage\":\"queue\",\"count\":2,"
					  "\"mean_s\":3e-06,\"p50_le_s\":5e-06"));
	ck_assert_ptr_nonnull(strstr(doc, "{\"stage\":\"post\",\"count\":2,\"mean_s\":9.5e-05,"
					  "\"p50_le_s\":5e-05,\"p99_le_s\":0.0002}"));
	json_fini(&j);
	metrics_teardown(&f);
}
END_TEST

START_TEST(metrics_peer_labels_bounded)
{
	struct metrics_fixture f;
	char *text;
	size_t len;

	metrics_setup(&f);
	for (int i = 0; i < 100; i++) {
		struct endpoint peer = {.transport = ENDPOINT_TCP, .port = (uint16_t)(1000 + i)};
		snprintf(peer.addr, sizeof(peer.addr), "10.1.0.%d", i);
		counters_job_done(&f.d.counters, XFER_WRITE, 0, 10, 1000, peer.addr, peer.port,
				  false);
	}
	ck_assert_int_eq(metrics_prometheus(f.m, &text, &len), 0);
	ck_assert(has_line(
		text,
		"rdmaxd_peer_jobs_total{peer=\"10.1.0.63:1063\",op=\"write\",result=\"ok\"} 1"));
	ck_assert_ptr_null(strstr(text, "peer=\"10.1.0.64:1064\""));
	ck_assert(has_line(text,
			   "rdmaxd_peer_jobs_total{peer=\"other\",op=\"write\",result=\"ok\"} 36"));
	free(text);
	metrics_teardown(&f);
}
END_TEST

START_TEST(admin_path_rules)
{
	struct config cfg;
	char path[108];

	config_defaults(&cfg);
	ck_assert_int_eq(admin_path_for(&cfg, path, sizeof(path)), 0);
	ck_assert_str_eq(path, "/run/rdmaxd-admin.sock");
	/* A moved client socket takes its admin socket along. */
	snprintf(cfg.socket_path, sizeof(cfg.socket_path), "/tmp/x/prefill.sock");
	ck_assert_int_eq(admin_path_for(&cfg, path, sizeof(path)), 0);
	ck_assert_str_eq(path, "/tmp/x/prefill-admin.sock");
	snprintf(cfg.socket_path, sizeof(cfg.socket_path), "/tmp/x/sock");
	ck_assert_int_eq(admin_path_for(&cfg, path, sizeof(path)), 0);
	ck_assert_str_eq(path, "/tmp/x/sock-admin.sock");
	/* An explicit admin path wins. */
	snprintf(cfg.admin_socket_path, sizeof(cfg.admin_socket_path), "/run/a.sock");
	ck_assert_int_eq(admin_path_for(&cfg, path, sizeof(path)), 0);
	ck_assert_str_eq(path, "/run/a.sock");
	/* A derived path that does not fit is an error, not a truncation. */
	config_defaults(&cfg);
	memset(cfg.socket_path, 'a', 100);
	cfg.socket_path[0] = '/';
	cfg.socket_path[100] = '\0';
	ck_assert_int_eq(admin_path_for(&cfg, path, sizeof(path)), -ENAMETOOLONG);
}
END_TEST

Suite *ops_suite(void)
{
	Suite *s = suite_create("ops");
	TCase *tc = tcase_create("ops");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, json_structure);
	tcase_add_test(tc, json_escaping);
	tcase_add_test(tc, json_errors);
	tcase_add_test(tc, metrics_counts_and_renders);
	tcase_add_test(tc, metrics_job_stages_render);
	tcase_add_test(tc, metrics_peer_labels_bounded);
	tcase_add_test(tc, admin_path_rules);
	suite_add_tcase(s, tc);
	return s;
}
