/* SPDX-License-Identifier: MIT */
/*
 * rdmax-demo: push a KV-cache-like set of pages from one node's rdmaxd to
 * another's, the way a prefill worker hands its cache to a decode worker.
 *
 *   rdmax-demo receive --socket B.sock --desc FILE   registers the destination,
 *       writes its descriptor to FILE, waits for the imm counter, verifies bytes
 *   rdmax-demo send --socket A.sock --desc FILE      fills pages and pushes them
 *
 * Both sides derive the page contents from the same generator, so the
 * receiver checks every byte without a side channel. Uses only the public
 * library.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdmax.h>

#define PAGE_BYTES    (64u << 10)
#define DEFAULT_PAGES 256u
#define BIG_WRITES    3u
#define BIG_BYTES     (4u << 20)
#define DEMO_IMM      0x4b56u /* "KV" */

struct layout {
	uint32_t pages;
	uint64_t pages_bytes; /* pages * PAGE_BYTES */
	uint64_t total;       /* pages plus the big writes */
	uint32_t jobs;
};

static struct layout layout_of(uint32_t pages)
{
	struct layout l = {.pages = pages};
	l.pages_bytes = (uint64_t)pages * PAGE_BYTES;
	l.total = l.pages_bytes + (uint64_t)BIG_WRITES * BIG_BYTES;
	l.jobs = pages + BIG_WRITES;
	return l;
}

/* Destination slot of source page i: a fixed permutation, like a block table. */
static uint32_t block_table(uint32_t i, uint32_t pages)
{
	return (uint32_t)(((uint64_t)i * 97 + 13) % pages);
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* Contents of destination byte range [dst_off, +len) once the push is done. */
static void fill_expected(uint8_t *buf, uint64_t dst_off, uint64_t len)
{
	for (uint64_t i = 0; i < len; i += 8) {
		uint64_t v = mix((dst_off + i) / 8 + 0x5eed);
		memcpy(buf + i, &v, len - i < 8 ? len - i : 8);
	}
}

static uint64_t fnv1a(const uint8_t *p, uint64_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (uint64_t i = 0; i < len; i++) {
		h = (h ^ p[i]) * 0x100000001b3ull;
	}
	return h;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int fail(const char *what, int err)
{
	fprintf(stderr, "rdmax-demo: %s: %s\n", what, rdmax_strerror(err));
	return 1;
}

static int run_receive(const char *socket_path, const char *desc_path, struct layout l,
		       int timeout_ms)
{
	struct rdmax_client *c;
	struct rdmax_region *dst;
	struct rdmax_desc desc;
	int ret;

	ret = rdmax_client_open(socket_path, "demo-decode", &c);
	if (ret < 0) {
		return fail("connect", ret);
	}
	ret = rdmax_region_alloc_host(c, l.total, RDMAX_ACCESS_REMOTE_WRITE, &dst);
	if (ret < 0) {
		return fail("allocate destination", ret);
	}
	ret = rdmax_expect_imm(c, DEMO_IMM, l.jobs);
	if (ret < 0) {
		return fail("expect imm", ret);
	}
	rdmax_region_desc(dst, &desc);
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", desc_path);
	FILE *f = fopen(tmp, "wb");
	if (!f || fwrite(desc.bytes, 1, desc.len, f) != desc.len || fclose(f) != 0 ||
	    rename(tmp, desc_path) != 0) {
		fprintf(stderr, "rdmax-demo: cannot write '%s': %s\n", desc_path, strerror(errno));
		return 1;
	}
	printf("decode: registered %.1f MiB, waiting for %u jobs carrying imm 0x%x\n",
	       (double)l.total / (1 << 20), l.jobs, DEMO_IMM);
	fflush(stdout);
	ret = rdmax_wait_imm(c, DEMO_IMM, timeout_ms);
	if (ret < 0) {
		return fail("wait for imm", ret);
	}
	uint8_t *got = rdmax_region_addr(dst);
	uint8_t *want = malloc(l.total);
	if (!want) {
		return fail("allocate", -ENOMEM);
	}
	fill_expected(want, 0, l.total);
	uint64_t bad = 0;
	for (uint64_t i = 0; i < l.total; i++) {
		bad += got[i] != want[i];
	}
	printf("decode: imm 0x%x reached %u; verified %" PRIu64 " bytes, %" PRIu64
	       " wrong; checksum %016" PRIx64 "\n",
	       DEMO_IMM, l.jobs, l.total, bad, fnv1a(got, l.total));
	free(want);
	rdmax_region_free(c, dst);
	rdmax_client_close(c);
	return bad == 0 ? 0 : 1;
}

static int read_desc(const char *path, struct rdmax_desc *ret_desc, int timeout_ms)
{
	uint8_t buf[RDMAX_DESC_MAX];
	double deadline = now_s() + timeout_ms / 1000.0;
	FILE *f;

	while (!(f = fopen(path, "rb"))) {
		if (now_s() > deadline) {
			fprintf(stderr, "rdmax-demo: no descriptor at '%s'\n", path);
			return RDMAX_E_TIMEOUT;
		}
		usleep(10000);
	}
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	return rdmax_desc_import(buf, n, ret_desc);
}

static int run_send(const char *socket_path, const char *desc_path, struct layout l, int timeout_ms)
{
	struct rdmax_client *c;
	struct rdmax_region *src;
	struct rdmax_desc peer;
	int ret;

	ret = read_desc(desc_path, &peer, timeout_ms);
	if (ret < 0) {
		return fail("import descriptor", ret);
	}
	ret = rdmax_client_open(socket_path, "demo-prefill", &c);
	if (ret < 0) {
		return fail("connect", ret);
	}
	ret = rdmax_region_alloc_host(c, l.total, RDMAX_ACCESS_LOCAL, &src);
	if (ret < 0) {
		return fail("allocate source", ret);
	}
	/* Source page i goes to destination slot block_table(i): fill it with what that slot
	 * expects. */
	uint8_t *s = rdmax_region_addr(src);
	for (uint32_t i = 0; i < l.pages; i++) {
		fill_expected(s + (uint64_t)i * PAGE_BYTES,
			      (uint64_t)block_table(i, l.pages) * PAGE_BYTES, PAGE_BYTES);
	}
	fill_expected(s + l.pages_bytes, l.pages_bytes, (uint64_t)BIG_WRITES * BIG_BYTES);

	struct rdmax_job *jobs = calloc(l.jobs, sizeof(*jobs));
	if (!jobs) {
		return fail("allocate", -ENOMEM);
	}
	for (uint32_t i = 0; i < l.jobs; i++) {
		struct rdmax_job *j = &jobs[i];
		j->id = i + 1;
		j->op = RDMAX_OP_WRITE;
		j->flags = RDMAX_JOB_IMM;
		j->imm = DEMO_IMM;
		j->local = src;
		j->remote = &peer;
		if (i < l.pages) {
			j->local_offset = (uint64_t)i * PAGE_BYTES;
			j->remote_offset = (uint64_t)block_table(i, l.pages) * PAGE_BYTES;
			j->length = PAGE_BYTES;
		} else {
			j->local_offset = l.pages_bytes + (uint64_t)(i - l.pages) * BIG_BYTES;
			j->remote_offset = j->local_offset;
			j->length = BIG_BYTES;
		}
	}
	double t0 = now_s();
	uint32_t batch = rdmax_client_info(c)->max_jobs_per_submit;
	for (uint32_t i = 0; i < l.jobs; i += batch) {
		uint32_t n = l.jobs - i < batch ? l.jobs - i : batch;
		ret = rdmax_submit(c, jobs + i, n);
		if (ret < 0) {
			return fail("submit", ret);
		}
	}
	uint32_t done = 0, failed = 0;
	struct rdmax_event ev[64];
	while (done < l.jobs) {
		int n = rdmax_poll_events(c, ev, 64, timeout_ms);
		if (n <= 0) {
			return fail("wait for completions", n == 0 ? RDMAX_E_TIMEOUT : n);
		}
		for (int k = 0; k < n; k++) {
			if (ev[k].type != RDMAX_EVENT_COMPLETION) {
				continue;
			}
			done++;
			if (ev[k].status != 0) {
				failed++;
				fprintf(stderr, "rdmax-demo: job %" PRIu64 ": %s: %s\n",
					ev[k].job_id, rdmax_strerror(ev[k].status), ev[k].reason);
			}
		}
	}
	double secs = now_s() - t0;
	/* What the destination must now hold: the source pages placed through the block table. */
	uint8_t *image = malloc(l.total);
	if (!image) {
		return fail("allocate", -ENOMEM);
	}
	for (uint32_t i = 0; i < l.pages; i++) {
		memcpy(image + (uint64_t)block_table(i, l.pages) * PAGE_BYTES,
		       s + (uint64_t)i * PAGE_BYTES, PAGE_BYTES);
	}
	memcpy(image + l.pages_bytes, s + l.pages_bytes, (uint64_t)BIG_WRITES * BIG_BYTES);
	uint64_t checksum = fnv1a(image, l.total);
	free(image);
	printf("prefill: pushed %u pages x %u KiB + %u x %u MiB = %.1f MiB in %u jobs, %.1f ms: "
	       "%.0f MiB/s (%.2f Gb/s), %u failed; checksum %016" PRIx64 "\n",
	       l.pages, PAGE_BYTES >> 10, BIG_WRITES, BIG_BYTES >> 20, (double)l.total / (1 << 20),
	       l.jobs, secs * 1e3, (double)l.total / (1 << 20) / secs,
	       (double)l.total * 8 / secs / 1e9, failed, checksum);
	free(jobs);
	rdmax_region_free(c, src);
	rdmax_client_close(c);
	return failed == 0 ? 0 : 1;
}

static void usage(FILE *out)
{
	fprintf(out, "Usage: rdmax-demo send|receive --socket PATH --desc FILE [--pages N] "
		     "[--timeout-ms MS]\n");
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"socket", required_argument, NULL, 's'},
		{"desc", required_argument, NULL, 'd'},
		{"pages", required_argument, NULL, 'p'},
		{"timeout-ms", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *socket_path = NULL, *desc_path = NULL;
	uint32_t pages = DEFAULT_PAGES;
	int timeout_ms = 60000;
	int opt;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *mode = argv[1];
	optind = 2;
	while ((opt = getopt_long(argc, argv, "s:d:p:t:h", options, NULL)) != -1) {
		switch (opt) {
		case 's':
			socket_path = optarg;
			break;
		case 'd':
			desc_path = optarg;
			break;
		case 'p':
			pages = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 't':
			timeout_ms = atoi(optarg);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!desc_path || pages == 0) {
		usage(stderr);
		return 2;
	}
	struct layout l = layout_of(pages);
	if (strcmp(mode, "receive") == 0) {
		return run_receive(socket_path, desc_path, l, timeout_ms);
	}
	if (strcmp(mode, "send") == 0) {
		return run_send(socket_path, desc_path, l, timeout_ms);
	}
	usage(stderr);
	return 2;
}
