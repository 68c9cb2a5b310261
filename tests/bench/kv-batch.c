/* SPDX-License-Identifier: MIT */
/*
 * The C side of tests/bench/python_vs_c.py: the same two measurements the
 * script makes through the rdmax Python package, here straight on librdmax.
 *   kv-batch push SOCKET DESC_FILE LAYERS BLOCKS BLOCK_BYTES ITERS
 *     one batch of LAYERS PAGED_WRITE jobs (BLOCKS scattered blocks each),
 *     submitted and waited for ITERS times: microseconds per batch;
 *   kv-batch push1 SOCKET DESC_FILE LAYERS BLOCKS BLOCK_BYTES ITERS
 *     the same pages as ONE PAGED_WRITE job of LAYERS x BLOCKS pages (what
 *     one job over every layer's region pair would carry);
 *   kv-batch small SOCKET DESC_FILE JOBS WINDOW
 *     JOBS 64-byte WRITEs with WINDOW in flight: jobs per second.
 * Prints one JSON object.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdmax.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "kv-batch: %s: %s\n", what, rdmax_err_name(err));
	exit(1);
}

static int read_desc(const char *path, struct rdmax_desc *d)
{
	uint8_t buf[RDMAX_DESC_MAX];
	FILE *f = fopen(path, "rb");
	if (!f) {
		return -1;
	}
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	return rdmax_desc_import(buf, n, d);
}

static void wait_all(struct rdmax_client *c, size_t n)
{
	struct rdmax_event ev[64];
	while (n) {
		int got = rdmax_poll_events(c, ev, 64, 10000);
		if (got <= 0) {
			die("rdmax_poll_events", got ? got : RDMAX_E_TIMEOUT);
		}
		for (int i = 0; i < got; i++) {
			if (ev[i].type == RDMAX_EVENT_COMPLETION && ev[i].status) {
				die(ev[i].reason, ev[i].status);
			}
		}
		n -= (size_t)got;
	}
}

int main(int argc, char **argv)
{
	struct rdmax_client *c;
	struct rdmax_region *src;
	struct rdmax_desc desc;
	int r;

	if (argc < 4 || read_desc(argv[3], &desc) < 0) {
		fprintf(stderr, "usage: kv-batch push|small SOCKET DESC_FILE ...\n");
		return 2;
	}
	if ((r = rdmax_client_open(argv[2], "kv-batch", &c)) < 0) {
		die("rdmax_client_open", r);
	}
	bool one = strcmp(argv[1], "push1") == 0;
	if ((one || strcmp(argv[1], "push") == 0) && argc == 8) {
		size_t layers = strtoul(argv[4], NULL, 0), blocks = strtoul(argv[5], NULL, 0);
		uint64_t bb = strtoull(argv[6], NULL, 0);
		unsigned iters = (unsigned)strtoul(argv[7], NULL, 0);
		uint32_t *idx = malloc(blocks * sizeof(*idx));
		uint32_t *lall = malloc(layers * blocks * sizeof(*lall));
		uint32_t *rall = malloc(layers * blocks * sizeof(*rall));
		struct rdmax_job *jobs = calloc(layers, sizeof(*jobs));
		if ((r = rdmax_region_alloc_host(c, 2 * blocks * bb, 0, &src)) < 0) {
			die("rdmax_region_alloc_host", r);
		}
		for (size_t i = 0; i < blocks; i++) {
			idx[i] = (uint32_t)(2 * i); /* every other block: no two merge */
		}
		/*
		 * One job: layer l's blocks go to page l * 2 * blocks + idx[i] of the target,
		 * from the same source blocks every layer (as the per-layer jobs do).
		 */
		for (size_t l = 0; l < layers; l++) {
			for (size_t i = 0; i < blocks; i++) {
				lall[l * blocks + i] = idx[i];
				rall[l * blocks + i] = (uint32_t)(l * 2 * blocks) + idx[i];
			}
		}
		double best = 1e9;
		for (unsigned it = 0; it < iters; it++) {
			for (size_t l = 0; l < layers; l++) {
				jobs[l] = (struct rdmax_job){.id = it * layers + l + 1,
							     .op = RDMAX_OP_PAGED_WRITE,
							     .local = src,
							     .remote = &desc};
				jobs[l].u.paged.page_len = bb;
				jobs[l].u.paged.local_pages =
					(struct rdmax_pages){.indices = idx, .count = blocks};
				jobs[l].u.paged.remote_pages =
					(struct rdmax_pages){.offset = l * 2 * blocks * bb,
							     .indices = idx,
							     .count = blocks};
			}
			size_t n_jobs = layers;
			if (one) {
				jobs[0].u.paged.local_pages = (struct rdmax_pages){
					.indices = lall, .count = layers * blocks};
				jobs[0].u.paged.remote_pages = (struct rdmax_pages){
					.indices = rall, .count = layers * blocks};
				n_jobs = 1;
			}
			double t0 = now_s();
			if ((r = rdmax_submit(c, jobs, n_jobs)) < 0) {
				die("rdmax_submit", r);
			}
			wait_all(c, n_jobs);
			double dt = now_s() - t0;
			best = dt < best ? dt : best;
		}
		printf("{\"mode\": \"%s\", \"best_us\": %.1f}\n", argv[1], best * 1e6);
	} else if (strcmp(argv[1], "small") == 0 && argc == 6) {
		unsigned long n = strtoul(argv[4], NULL, 0), window = strtoul(argv[5], NULL, 0);
		if ((r = rdmax_region_alloc_host(c, 1 << 16, 0, &src)) < 0) {
			die("rdmax_region_alloc_host", r);
		}
		unsigned long sent = 0, done = 0;
		struct rdmax_event ev[64];
		double t0 = now_s();
		while (done < n) {
			while (sent < n && sent - done < window) {
				struct rdmax_job j = {.id = sent + 1,
						      .op = RDMAX_OP_WRITE,
						      .local = src,
						      .length = 64,
						      .remote = &desc};
				if ((r = rdmax_submit(c, &j, 1)) < 0) {
					die("rdmax_submit", r);
				}
				sent++;
			}
			int got = rdmax_poll_events(c, ev, 64, 10000);
			if (got <= 0) {
				die("rdmax_poll_events", got ? got : RDMAX_E_TIMEOUT);
			}
			done += (unsigned long)got;
		}
		printf("{\"mode\": \"small\", \"jobs_per_s\": %.0f}\n", (double)n / (now_s() - t0));
	} else {
		fprintf(stderr, "kv-batch: bad arguments\n");
		return 2;
	}
	rdmax_client_close(c);
	return 0;
}
