/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench: one row per size for run and local: rate and latency
 * percentiles from the job loop, the read-back check, the memcpy reference,
 * CPU per GB; the text and JSON output; and the requester that probes the op
 * kind and walks the sizes. Never moves bytes outside transfer.c's loop and
 * the read-back check.
 */
#include "bench.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double percentile_us(const uint64_t *sorted, uint64_t n, double p)
{
	if (n == 0) {
		return 0;
	}
	uint64_t idx = (uint64_t)ceil(p * (double)n);
	idx = idx == 0 ? 0 : idx - 1;
	return (double)sorted[MIN_U64(idx, n - 1)] / 1e3;
}

static void latency_stats(uint64_t *lat, uint64_t n, double out[5])
{
	double sum = 0;

	qsort(lat, n, sizeof(*lat), cmp_u64);
	for (uint64_t i = 0; i < n; i++) {
		sum += (double)lat[i];
	}
	out[0] = percentile_us(lat, n, 0.50);
	out[1] = percentile_us(lat, n, 0.99);
	out[2] = percentile_us(lat, n, 0.999);
	out[3] = n ? (double)lat[n - 1] / 1e3 : 0;
	out[4] = n ? sum / (double)n / 1e3 : 0;
}

static uint64_t iters_for(const struct opts *o, uint64_t size)
{
	if (o->iters) {
		return o->iters;
	}
	uint64_t n = o->lat ? DEFAULT_LAT_ITERS : DEFAULT_ITERS;
	return MAX_U64(MIN_DEFAULT_ITERS, MIN_U64(n, ITER_BYTES_CAP / size));
}

/* Check that the bytes of the last job are where they should be. */
static void verify_size(struct bench *b, uint64_t size, struct row *r)
{
	uint8_t *src = rdmax_region_addr(b->src), *dst = rdmax_region_addr(b->dst);
	int ret;

	if (!bench_op_reads(b->o->op)) {
		/* Read the destination back: it must hold this size's pattern. */
		memset(dst, 0, size);
		ret = bench_one_job(b, RDMAX_OP_READ, size, r->verify_msg, sizeof(r->verify_msg));
		if (ret < 0) {
			r->verify = "skipped";
			return;
		}
	}
	bool same = true;
	if (bench_op_paged(b->o->op)) {
		for (size_t i = 0; i < b->n_pages && same; i++) {
			same = memcmp(src + b->src_pages[i] * b->page_len,
				      dst + b->dst_pages[i] * b->page_len, b->page_len) == 0;
		}
	} else {
		same = memcmp(src, dst, size) == 0;
	}
	if (!same) {
		r->verify = "FAILED";
		snprintf(r->verify_msg, sizeof(r->verify_msg),
			 "the bytes at the destination differ from the source");
		return;
	}
	r->verify = "ok";
}

static double memcpy_gbytes_s(void *to, const void *from, uint64_t size, uint64_t count)
{
	uint64_t t0 = bench_now_ns();

	for (uint64_t i = 0; i < count; i++) {
		memcpy(to, from, size);
		/* Keep the compiler from eliding or merging the copies. */
		__asm__ __volatile__("" : : "r"(to) : "memory");
	}
	double secs = (double)(bench_now_ns() - t0) / 1e9;
	return secs > 0 ? (double)(size * count) / secs / 1e9 : 0;
}

static int bench_size(struct bench *b, uint64_t size, struct row *ret_row)
{
	struct opts *o = b->o;
	struct row row, *r = &row;
	uint64_t seed = size * 7919 + (uint64_t)o->op;
	uint64_t count = o->duration_s > 0 ? 0 : iters_for(o, size);
	uint64_t jobs = 0, t1 = 0, warm = 0;
	char msg[RDMAX_MESSAGE_MAX + 64] = "";
	int ret;

	memset(r, 0, sizeof(*r));
	ret = bench_shape_jobs(b, size);
	if (ret < 0) {
		return ret;
	}
	r->size = bench_job_bytes(b, size);
	r->peer_cpu_s = -1;
	r->verify = "off";
	bench_fill_pattern(rdmax_region_addr(b->src), size, seed);
	if (bench_op_reads(o->op)) {
		/* The remote region must hold the pattern the reads will bring back. */
		ret = bench_one_job(b, RDMAX_OP_WRITE, size, msg, sizeof(msg));
		if (ret < 0) {
			fprintf(stderr,
				"rdmax-bench: cannot seed the remote region for reads: %s\n", msg);
			return ret;
		}
		memset(rdmax_region_addr(b->dst), 0, size);
	}
	if (o->warmup) {
		ret = bench_run_jobs(b, o->op, size, o->warmup, 0, &warm, &t1);
		if (ret < 0) {
			return ret;
		}
	}
	double d0 = bench_proc_cpu_s(o->daemon_pid), p0 = bench_proc_cpu_s(o->peer_pid);
	double c0 = bench_self_cpu_s();
	struct bench_sched ds0, ps0, ds1, ps1;
	bool dsched = bench_proc_sched(o->daemon_pid, &ds0);
	bool psched = bench_proc_sched(o->peer_pid, &ps0);
	double idle0 = bench_host_idle_s();
	uint64_t t0 = bench_now_ns();
	uint64_t until = t0 + (uint64_t)(o->duration_s * 1e9);
	ret = bench_run_jobs(b, o->op, size, count, until, &jobs, &t1);
	if (ret < 0) {
		return ret;
	}
	double d1 = bench_proc_cpu_s(o->daemon_pid), p1 = bench_proc_cpu_s(o->peer_pid);
	r->client_cpu_s = bench_self_cpu_s() - c0;
	double idle1 = bench_host_idle_s();
	dsched = dsched && bench_proc_sched(o->daemon_pid, &ds1);
	psched = psched && bench_proc_sched(o->peer_pid, &ps1);
	r->daemon_run_s = dsched ? ds1.run_s - ds0.run_s : -1;
	r->daemon_wait_s = dsched ? ds1.wait_s - ds0.wait_s : -1;
	r->peer_run_s = psched ? ps1.run_s - ps0.run_s : -1;
	r->peer_wait_s = psched ? ps1.wait_s - ps0.wait_s : -1;
	r->jobs = jobs;
	r->seconds = (double)(t1 - t0) / 1e9;
	if (r->seconds > 0) {
		r->gbytes_s = (double)(r->size * jobs) / r->seconds / 1e9;
		r->gbits_s = r->gbytes_s * 8;
		r->jobs_s = (double)jobs / r->seconds;
	}
	r->host_idle =
		idle0 >= 0 && idle1 >= 0 && r->seconds > 0
			? (idle1 - idle0) / (r->seconds * (double)sysconf(_SC_NPROCESSORS_ONLN))
			: -1;
	r->daemon_cpu_s = d0 >= 0 && d1 >= 0 ? d1 - d0 : -1;
	r->peer_cpu_s = p0 >= 0 && p1 >= 0 ? p1 - p0 : -1;
	latency_stats(b->t, jobs, r->lat_us);
	if (o->verify) {
		verify_size(b, size, r);
	}
	if (o->mode == MODE_LOCAL) {
		/* Reference: the same copies by the CPU in this process, between two mappings. */
		uint8_t *from = rdmax_region_addr(b->src);
		uint8_t *to = rdmax_region_addr(b->dst);
		memcpy_gbytes_s(to, from, size, MIN_U64(o->warmup, jobs));
		r->ref_gbytes_s = memcpy_gbytes_s(to, from, size, MAX_U64(jobs, 1));
	}
	*ret_row = row;
	return 0;
}

static double per_gb(double cpu_s, const struct row *r)
{
	double gb = (double)(r->size * r->jobs) / 1e9;
	return cpu_s >= 0 && gb > 0 ? cpu_s / gb : -1;
}

void bench_print_num(FILE *f, double v, int decimals)
{
	if (v < 0 || isnan(v) || isinf(v)) {
		fprintf(f, "null");
	} else {
		fprintf(f, "%.*f", decimals, v);
	}
}

/* A JSON string: quotes and backslashes escaped, control characters dropped. */
void bench_json_string(FILE *f, const char *str)
{
	fputc('"', f);
	for (const char *p = str ? str : ""; *p; p++) {
		if (*p == '"' || *p == '\\') {
			fputc('\\', f);
		}
		if ((unsigned char)*p >= 0x20) {
			fputc(*p, f);
		}
	}
	fputc('"', f);
}

static void print_json(FILE *f, const struct opts *o, const struct rdmax_daemon_info *info,
		       const struct row *rows, uint32_t n_rows, const char *status,
		       const char *status_msg)
{
	char caps[96];

	bench_caps_string(info ? info->capabilities : 0, caps, sizeof(caps));
	fprintf(f, "{\"tool\": \"rdmax-bench\", \"mode\": \"%s\", \"label\": ",
		o->mode == MODE_LOCAL ? "local" : "run");
	bench_json_string(f, o->label);
	fprintf(f, ", \"op\": \"%s\", \"status\": \"%s\", \"message\": ", o->op_name, status);
	bench_json_string(f, status_msg);
	fprintf(f, ", \"daemon\": {\"node\": ");
	bench_json_string(f, info ? info->node_name : NULL);
	fprintf(f, ", \"version\": ");
	bench_json_string(f, info ? info->daemon_version : NULL);
	fprintf(f, ", \"capabilities\": \"%s\", \"pid\": %d, \"peer_pid\": %d}, ", caps,
		o->daemon_pid, o->peer_pid);
	fprintf(f, "\"ring\": %s, ", o->no_ring ? "false" : "true");
	fprintf(f,
		"\"params\": {\"window\": %u, \"batch\": %u, \"iters\": %" PRIu64
		", \"duration_s\": %g, \"warmup\": %u, \"imm\": %s, \"lat\": %s, \"page_len\": "
		"%" PRIu64 ", \"dests\": %u}, \"results\": [",
		o->window, o->batch, o->iters, o->duration_s, o->warmup,
		o->has_imm ? "true" : "false", o->lat ? "true" : "false",
		bench_op_paged(o->op) ? o->page_len : 0, o->op == RDMAX_OP_SCATTER ? o->dests : 0);
	for (uint32_t i = 0; i < n_rows; i++) {
		const struct row *r = &rows[i];
		fprintf(f,
			"%s\n  {\"bytes\": %" PRIu64 ", \"jobs\": %" PRIu64
			", \"seconds\": %.6f, \"GBps\": %.6f, \"Gbps\": %.6f, \"jobs_per_s\": "
			"%.1f, ",
			i ? "," : "", r->size, r->jobs, r->seconds, r->gbytes_s, r->gbits_s,
			r->jobs_s);
		fprintf(f,
			"\"lat_us\": {\"p50\": %.3f, \"p99\": %.3f, \"p999\": %.3f, \"max\": %.3f, "
			"\"mean\": %.3f}, ",
			r->lat_us[0], r->lat_us[1], r->lat_us[2], r->lat_us[3], r->lat_us[4]);
		fprintf(f, "\"daemon_cpu_s\": ");
		bench_print_num(f, r->daemon_cpu_s, 3);
		fprintf(f, ", \"daemon_cpu_s_per_GB\": ");
		bench_print_num(f, per_gb(r->daemon_cpu_s, r), 4);
		fprintf(f, ", \"peer_cpu_s\": ");
		bench_print_num(f, r->peer_cpu_s, 3);
		fprintf(f, ", \"peer_cpu_s_per_GB\": ");
		bench_print_num(f, per_gb(r->peer_cpu_s, r), 4);
		fprintf(f, ", \"client_cpu_s_per_GB\": ");
		bench_print_num(f, per_gb(r->client_cpu_s, r), 4);
		fprintf(f, ", \"daemon_run_s\": ");
		bench_print_num(f, r->daemon_run_s, 4);
		fprintf(f, ", \"daemon_wait_s\": ");
		bench_print_num(f, r->daemon_wait_s, 4);
		fprintf(f, ", \"peer_run_s\": ");
		bench_print_num(f, r->peer_run_s, 4);
		fprintf(f, ", \"peer_wait_s\": ");
		bench_print_num(f, r->peer_wait_s, 4);
		fprintf(f, ", \"host_idle\": ");
		bench_print_num(f, r->host_idle, 4);
		if (o->mode == MODE_LOCAL) {
			fprintf(f, ", \"memcpy_GBps\": %.6f", r->ref_gbytes_s);
		}
		fprintf(f, ", \"verify\": \"%s\"}", r->verify);
	}
	fprintf(f, "\n]}\n");
}

static void print_header(FILE *f, const struct opts *o, const struct rdmax_daemon_info *info)
{
	char caps[96];

	bench_caps_string(info->capabilities, caps, sizeof(caps));
	fprintf(f, "rdmax-bench %s%s%s: window %u, batch %u%s%s, daemon '%s' %s (pid %d, %s)",
		o->op_name, o->lat ? " --lat" : "", o->mode == MODE_LOCAL ? " same-node" : "",
		o->window, o->batch, o->has_imm ? ", imm" : "", o->no_ring ? ", no ring" : "",
		info->node_name, info->daemon_version, o->daemon_pid, caps);
	if (bench_op_paged(o->op)) {
		fprintf(f, ", pages of %" PRIu64 " bytes", o->page_len);
	} else if (o->op == RDMAX_OP_SCATTER) {
		fprintf(f, ", %u destinations per job", o->dests);
	}
	if (o->peer_pid > 0) {
		fprintf(f, ", peer pid %d", o->peer_pid);
	}
	fprintf(f, "\n%9s %8s %8s %8s %8s %10s %9s %9s %9s %9s %9s%s %s\n", "bytes", "jobs",
		"seconds", "GB/s", "Gb/s", "jobs/s", "p50_us", "p99_us", "p99.9_us", "max_us",
		"dCPU_s/GB", o->mode == MODE_LOCAL ? "  memcpy_GB/s" : "", "verify");
	fflush(f);
}

static void print_row(FILE *f, const struct opts *o, const struct row *r)
{
	double cpu = per_gb(r->daemon_cpu_s, r);

	fprintf(f, "%9" PRIu64 " %8" PRIu64 " %8.3f %8.3f %8.3f %10.0f %9.1f %9.1f %9.1f %9.1f ",
		r->size, r->jobs, r->seconds, r->gbytes_s, r->gbits_s, r->jobs_s, r->lat_us[0],
		r->lat_us[1], r->lat_us[2], r->lat_us[3]);
	if (cpu >= 0) {
		fprintf(f, "%9.3f", cpu);
	} else {
		fprintf(f, "%9s", "-");
	}
	if (o->mode == MODE_LOCAL) {
		fprintf(f, " %13.3f", r->ref_gbytes_s);
	}
	fprintf(f, " %s%s%s\n", r->verify, r->verify_msg[0] ? ": " : "", r->verify_msg);
	fflush(f);
}

/*
 * Paged and scatter jobs are newer than write and read: try one first and,
 * when the library or the daemon refuses the kind, say clearly which of the
 * two answered and what, instead of failing inside a timed loop.
 * \return 0 when the op works, else the refusal (RDMAX_E_UNIMPLEMENTED when
 *         the daemon does not know the kind)
 */
static int probe_op(struct bench *b, const struct rdmax_daemon_info *info)
{
	struct opts *o = b->o;
	char msg[RDMAX_MESSAGE_MAX + 64] = "";
	int ret = bench_shape_jobs(b, o->sizes[0]);

	if (ret == 0) {
		ret = bench_one_job(b, o->op, o->sizes[0], msg, sizeof(msg));
	}
	if (ret == 0) {
		return 0;
	}
	fprintf(stderr, "rdmax-bench: op '%s' is not available: %s\n", o->op_name, msg);
	if (o->json) {
		FILE *f = stdout;
		if (o->json_path && strcmp(o->json_path, "-") != 0) {
			f = fopen(o->json_path, "w");
		}
		if (f) {
			print_json(f, o, info, NULL, 0,
				   ret == RDMAX_E_UNIMPLEMENTED ? "unimplemented" : "failed", msg);
			if (f != stdout) {
				fclose(f);
			}
		}
	}
	return ret;
}

/* \return the process exit status: 0, 1, or EXIT_UNAVAILABLE */
int bench_run_requester(struct opts *o)
{
	struct bench b = {.o = o, .next_id = 1};
	struct rdmax_client *target_client = NULL;
	struct rdmax_region *target = NULL;
	struct row rows[MAX_SIZES];
	uint32_t n_rows = 0;
	uint64_t max_size = 0;
	int ret, status = 1;

	for (uint32_t i = 0; i < o->n_sizes; i++) {
		max_size = MAX_U64(max_size, o->sizes[i]);
	}
	if (o->mode == MODE_RUN) {
		ret = o->desc_hex ? bench_import_hex(o->desc_hex, &b.peer)
				  : bench_read_desc_file(o->desc_path, &b.peer);
		if (ret < 0) {
			return bench_fail("import descriptor", ret);
		}
	}
	ret = rdmax_client_open(o->socket_path, "bench", &b.c);
	if (ret < 0) {
		return bench_fail("connect", ret);
	}
	/* What the connection does, not what was asked: an older daemon offers no ring. */
	o->no_ring = rdmax_client_uses_ring(b.c) != 1;
	const struct rdmax_daemon_info *info = rdmax_client_info(b.c);
	if (o->daemon_pid == 0) {
		int pid = bench_daemon_pid_of(b.c);
		o->daemon_pid = pid > 0 ? pid : -1;
	}
	if (o->batch > info->max_jobs_per_submit) {
		o->batch = info->max_jobs_per_submit;
	}
	if (o->window > info->max_outstanding_jobs) {
		o->window = info->max_outstanding_jobs;
	}
	if (o->mode == MODE_LOCAL) {
		/* The target belongs to a second client of the same daemon: a same-node copy. */
		ret = rdmax_client_open(o->socket_path, "bench-target", &target_client);
		if (ret < 0) {
			bench_fail("connect the target client", ret);
			goto out_close;
		}
		ret = rdmax_region_alloc_host(target_client, max_size,
					      RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE,
					      &target);
		if (ret < 0) {
			bench_fail("allocate the target region", ret);
			goto out_close;
		}
		rdmax_region_desc(target, &b.peer);
	}
	ret = rdmax_region_alloc_host(b.c, max_size, RDMAX_ACCESS_LOCAL, &b.src);
	if (ret < 0) {
		bench_fail("allocate the source region", ret);
		goto out_close;
	}
	ret = rdmax_region_alloc_host(b.c, max_size, RDMAX_ACCESS_LOCAL, &b.dst);
	if (ret < 0) {
		bench_fail("allocate the destination region", ret);
		goto out_close;
	}
	/* Fault the pages in now, not inside the first timed job. */
	memset(rdmax_region_addr(b.src), 0, max_size);
	memset(rdmax_region_addr(b.dst), 0, max_size);
	b.jobs = calloc(o->batch, sizeof(*b.jobs));
	if (!b.jobs) {
		bench_fail("allocate", -ENOMEM);
		goto out_close;
	}
	if (bench_op_paged(o->op) || o->op == RDMAX_OP_SCATTER) {
		ret = probe_op(&b, info);
		if (ret < 0) {
			status = ret == RDMAX_E_UNIMPLEMENTED ? EXIT_UNAVAILABLE : 1;
			goto out_close;
		}
	}
	bool table = !o->json || (o->json_path && strcmp(o->json_path, "-") != 0);
	if (table) {
		print_header(stdout, o, info);
	}
	for (uint32_t i = 0; i < o->n_sizes; i++) {
		ret = bench_size(&b, o->sizes[i], &rows[n_rows]);
		if (ret < 0) {
			goto out_report;
		}
		/* Row by row, so a long sweep shows progress. */
		if (table) {
			print_row(stdout, o, &rows[n_rows]);
		}
		n_rows++;
	}
	status = 0;
out_report:
	for (uint32_t i = 0; i < n_rows; i++) {
		if (strcmp(rows[i].verify, "FAILED") == 0) {
			status = 1;
		}
	}
	if (o->json) {
		FILE *f = stdout;
		if (o->json_path && strcmp(o->json_path, "-") != 0) {
			f = fopen(o->json_path, "w");
			if (!f) {
				fprintf(stderr, "rdmax-bench: cannot write '%s': %s\n",
					o->json_path, strerror(errno));
				status = 1;
			}
		}
		if (f) {
			print_json(f, o, info, rows, n_rows, status == 0 ? "ok" : "failed",
				   status == 0 ? "" : "see stderr");
			if (f != stdout) {
				fclose(f);
			}
		}
	}
out_close:
	free(b.jobs);
	free(b.t);
	free(b.src_pages);
	free(b.dst_pages);
	free(b.dests);
	rdmax_client_close(b.c);
	rdmax_client_close(target_client);
	return status;
}
