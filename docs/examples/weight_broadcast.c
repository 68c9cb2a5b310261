/* SPDX-License-Identifier: MIT */
/*
 * weight_broadcast: a trainer pushes a new version of its weights to several
 * inference nodes. Each receiver waits on one imm value (the version) and
 * knows the whole tensor has landed when it fires.
 *
 *   weight_broadcast receive --socket B.sock --desc FILE [--bytes N]
 *       register a weight buffer, write its descriptor to FILE, wait, verify
 *   weight_broadcast send --socket A.sock [--bytes N] [--writes] FILE...
 *       read the receivers' descriptors and broadcast
 *
 * The sender puts the receivers in a peer group (descriptors decoded once by
 * the daemon) and submits one SCATTER with one destination per receiver and
 * the imm: every receiving node counts it once. With --writes it submits one
 * WRITE per receiver instead, all in one batch. While the broadcast runs it
 * polls rdmax_job_status() to show progress. Uses only rdmax.h.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdmax.h>

#define WEIGHTS_VERSION 0x57000001u /* the imm: "W", version 1 */
#define TIMEOUT_MS      120000
#define MAX_RECEIVERS   64

static int fail(const char *what, int err)
{
	fprintf(stderr, "weight_broadcast: %s failed: %s\n", what, rdmax_strerror(err));
	return 1;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The weights of version WEIGHTS_VERSION: both sides compute them. */
static void weights(uint8_t *buf, uint64_t len)
{
	uint64_t x = WEIGHTS_VERSION * 0x9e3779b97f4a7c15ull + 1;
	for (uint64_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
}

static uint64_t checksum(const uint8_t *p, uint64_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (uint64_t i = 0; i < len; i++) {
		h = (h ^ p[i]) * 0x100000001b3ull;
	}
	return h;
}

static int read_desc(const char *path, struct rdmax_desc *ret_desc)
{
	uint8_t buf[RDMAX_DESC_MAX];

	for (int waited = 0;; waited += 10) {
		FILE *f = fopen(path, "rb");
		if (f) {
			size_t n = fread(buf, 1, sizeof(buf), f);
			fclose(f);
			return rdmax_desc_import(buf, n, ret_desc);
		}
		if (waited > TIMEOUT_MS) {
			return -ENOENT;
		}
		usleep(10000);
	}
}

static int run_receive(const char *socket_path, const char *desc_path, uint64_t bytes)
{
	struct rdmax_client *client;
	struct rdmax_region *buf;
	struct rdmax_desc desc;
	char tmp[4096];
	int ret;

	ret = rdmax_client_open(socket_path, "weights-receiver", &client);
	if (ret < 0) {
		return fail("rdmax_client_open", ret);
	}
	ret = rdmax_region_alloc_host(client, bytes, RDMAX_ACCESS_REMOTE_WRITE, &buf);
	if (ret < 0) {
		return fail("rdmax_region_alloc_host", ret);
	}
	ret = rdmax_expect_imm(client, WEIGHTS_VERSION, 1);
	if (ret < 0) {
		return fail("rdmax_expect_imm", ret);
	}
	rdmax_region_desc(buf, &desc);
	snprintf(tmp, sizeof(tmp), "%s.tmp", desc_path);
	FILE *f = fopen(tmp, "wb");
	if (!f || fwrite(desc.bytes, 1, desc.len, f) != desc.len || fclose(f) != 0 ||
	    rename(tmp, desc_path) != 0) {
		fprintf(stderr, "weight_broadcast: cannot write '%s': %s\n", desc_path,
			strerror(errno));
		return 1;
	}
	ret = rdmax_wait_imm(client, WEIGHTS_VERSION, TIMEOUT_MS);
	if (ret < 0) {
		return fail("rdmax_wait_imm", ret);
	}
	uint8_t *expect = malloc(bytes);
	if (!expect) {
		return fail("malloc", -ENOMEM);
	}
	weights(expect, bytes);
	const uint8_t *got = rdmax_region_addr(buf);
	if (memcmp(got, expect, bytes) != 0) {
		fprintf(stderr, "weight_broadcast: received weights differ\n");
		return 1;
	}
	printf("receive: version 0x%x landed, %" PRIu64 " bytes verified, checksum %016" PRIx64
	       "\n",
	       WEIGHTS_VERSION, bytes, checksum(got, bytes));
	free(expect);
	rdmax_client_close(client);
	return 0;
}

static int run_send(const char *socket_path, uint64_t bytes, bool writes, char **paths, int n)
{
	struct rdmax_desc descs[MAX_RECEIVERS];
	struct rdmax_scatter_dest dests[MAX_RECEIVERS];
	struct rdmax_job jobs[MAX_RECEIVERS];
	struct rdmax_peer_group *group = NULL;
	struct rdmax_client *client;
	struct rdmax_region *src;
	int ret, n_jobs;

	for (int i = 0; i < n; i++) {
		ret = read_desc(paths[i], &descs[i]);
		if (ret < 0) {
			fprintf(stderr, "weight_broadcast: descriptor '%s': %s\n", paths[i],
				rdmax_strerror(ret));
			return 1;
		}
	}
	ret = rdmax_client_open(socket_path, "weights-sender", &client);
	if (ret < 0) {
		return fail("rdmax_client_open", ret);
	}
	ret = rdmax_region_alloc_host(client, bytes, RDMAX_ACCESS_LOCAL, &src);
	if (ret < 0) {
		return fail("rdmax_region_alloc_host", ret);
	}
	weights(rdmax_region_addr(src), bytes);

	if (writes) {
		/* One WRITE per receiver, all in one Submit. */
		for (int i = 0; i < n; i++) {
			jobs[i] = (struct rdmax_job){.id = (uint64_t)i + 1,
						     .op = RDMAX_OP_WRITE,
						     .flags = RDMAX_JOB_IMM,
						     .imm = WEIGHTS_VERSION,
						     .local = src,
						     .length = bytes,
						     .remote = &descs[i]};
		}
		n_jobs = n;
	} else {
		/* One SCATTER to a peer group: repeated broadcasts reuse the group. */
		ret = rdmax_peer_group_create(client, descs, (size_t)n, &group);
		if (ret < 0) {
			return fail("rdmax_peer_group_create", ret);
		}
		for (int i = 0; i < n; i++) {
			dests[i] = (struct rdmax_scatter_dest){.peer_index = (uint32_t)i,
							       .length = bytes};
		}
		jobs[0] = (struct rdmax_job){.id = 1,
					     .op = RDMAX_OP_SCATTER,
					     .flags = RDMAX_JOB_IMM,
					     .imm = WEIGHTS_VERSION,
					     .local = src};
		jobs[0].u.scatter.dests = dests;
		jobs[0].u.scatter.count = (size_t)n;
		jobs[0].u.scatter.group = group;
		n_jobs = 1;
	}
	double t0 = now_ms();
	ret = rdmax_submit(client, jobs, (size_t)n_jobs);
	if (ret < 0) {
		return fail("rdmax_submit", ret);
	}
	int left = n_jobs, last_pct = -1;
	while (left > 0) {
		struct rdmax_event ev;
		int got = rdmax_poll_events(client, &ev, 1, 10);
		if (got < 0) {
			return fail("rdmax_poll_events", got);
		}
		if (got == 1 && ev.type == RDMAX_EVENT_COMPLETION) {
			if (ev.status != 0) {
				fprintf(stderr,
					"weight_broadcast: job %" PRIu64 " failed: %s (%s)\n",
					ev.job_id, rdmax_strerror(ev.status), ev.reason);
				return 1;
			}
			left--;
			continue;
		}
		/* Nothing finished within 10 ms: show how far the first job got. */
		uint64_t done, total;
		if (rdmax_job_status(client, jobs[0].id, &done, &total) == 0 && total > 0) {
			int pct = (int)(done * 100 / total);
			if (pct / 10 != last_pct / 10) {
				printf("send: %3d%% of job %" PRIu64 "\n", pct, jobs[0].id);
				last_pct = pct;
			}
		}
		if (now_ms() - t0 > TIMEOUT_MS) {
			fprintf(stderr, "weight_broadcast: timed out\n");
			return 1;
		}
	}
	double ms = now_ms() - t0;
	printf("send: %" PRIu64 " bytes to %d receivers by %s in %.1f ms (%.2f GB/s out), checksum "
	       "%016" PRIx64 "\n",
	       bytes, n, writes ? "per-peer writes" : "one scatter", ms,
	       (double)bytes * n / (ms * 1e6), checksum(rdmax_region_addr(src), bytes));
	rdmax_peer_group_destroy(client, group);
	rdmax_client_close(client);
	return 0;
}

static void usage(FILE *out)
{
	fprintf(out, "Usage: weight_broadcast receive --socket PATH --desc FILE [--bytes N]\n"
		     "       weight_broadcast send --socket PATH [--bytes N] [--writes] FILE...\n");
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"socket", required_argument, NULL, 's'}, {"desc", required_argument, NULL, 'd'},
		{"bytes", required_argument, NULL, 'b'},  {"writes", no_argument, NULL, 'w'},
		{"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
	};
	const char *socket_path = NULL, *desc_path = NULL;
	uint64_t bytes = 64ull << 20;
	bool writes = false;
	int opt;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "s:d:b:wh", options, NULL)) != -1) {
		switch (opt) {
		case 's':
			socket_path = optarg;
			break;
		case 'd':
			desc_path = optarg;
			break;
		case 'b':
			bytes = strtoull(optarg, NULL, 0);
			break;
		case 'w':
			writes = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (bytes == 0) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "receive") == 0 && desc_path) {
		return run_receive(socket_path, desc_path, bytes);
	}
	int n = argc - optind;
	if (strcmp(argv[1], "send") == 0 && n > 0 && n <= MAX_RECEIVERS) {
		return run_send(socket_path, bytes, writes, argv + optind, n);
	}
	usage(stderr);
	return 2;
}
