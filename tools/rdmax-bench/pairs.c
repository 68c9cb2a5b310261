/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench pairs: the same pages of every layer's K and V regions moved
 * three ways, interleaved round by round in one run so that the machine's
 * load hits all three alike:
 *   one   ONE paged job carrying every (K, V) region of every layer as region pairs;
 *   layer one job per layer (its K and V as two pairs), LAYERS jobs in one submit;
 *   pair  one job per region (no pairs), 2 x LAYERS jobs in one submit.
 * Both ends are clients of this process (one on each daemon), so the bytes are
 * checked in place after each shape's first round. Shares only bench.h's
 * helpers with the other modes.
 */
#include "bench.h"

#define PAIRS_SHAPES     3
#define PAIRS_ROUNDS_MAX 10000

struct pairs_opts {
	const char *socket_path;
	const char *peer_socket;
	uint32_t layers;
	uint32_t blocks;
	uint64_t block_len;
	uint32_t rounds;
	uint32_t op; /* RDMAX_OP_PAGED_WRITE or RDMAX_OP_PAGED_READ */
};

static const char *const g_shape_names[PAIRS_SHAPES] = {"one", "layer", "pair"};

static int pairs_usage(FILE *out, int ret)
{
	fprintf(out,
		"Usage: rdmax-bench pairs --socket A.sock --peer-socket B.sock [--layers N]\n"
		"                         [--blocks N] [--block-len BYTES] [--rounds N] [--read]\n"
		"Moves BLOCKS scattered blocks of every layer's K and V regions (2 x LAYERS\n"
		"region pairs, the same block ids) from A's client to B's (or, with --read,\n"
		"reads them from B) as one job of region pairs, as one job per layer, and as\n"
		"one job per region, interleaved round by round; prints the best and median\n"
		"microseconds per request of each. Defaults: 32 layers, 32 blocks of 16 KiB\n"
		"(2 048 pages, 32 MiB per request), 30 rounds.\n");
	return ret;
}

static int pairs_parse(int argc, char **argv, struct pairs_opts *p)
{
	static const struct option long_opts[] = {
		{"socket", required_argument, NULL, 'S'},
		{"peer-socket", required_argument, NULL, 'P'},
		{"layers", required_argument, NULL, 'L'},
		{"blocks", required_argument, NULL, 'B'},
		{"block-len", required_argument, NULL, 'l'},
		{"rounds", required_argument, NULL, 'r'},
		{"read", no_argument, NULL, 'R'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	uint64_t v;
	int c;

	while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (c) {
		case 'S':
			p->socket_path = optarg;
			break;
		case 'P':
			p->peer_socket = optarg;
			break;
		case 'L':
		case 'B':
		case 'r':
			if (bench_parse_u64(optarg, &v) < 0 || v == 0 ||
			    v > (c == 'r' ? PAIRS_ROUNDS_MAX : 1u << 20)) {
				fprintf(stderr, "rdmax-bench pairs: bad count '%s'\n", optarg);
				return -1;
			}
			*(c == 'L' ? &p->layers : c == 'B' ? &p->blocks : &p->rounds) = (uint32_t)v;
			break;
		case 'l':
			if (bench_parse_size(optarg, &p->block_len) < 0 || p->block_len == 0) {
				fprintf(stderr, "rdmax-bench pairs: bad size '%s'\n", optarg);
				return -1;
			}
			break;
		case 'R':
			p->op = RDMAX_OP_PAGED_READ;
			break;
		case 'h':
			exit(pairs_usage(stdout, 0));
		default:
			return -1;
		}
	}
	if (!p->socket_path || !p->peer_socket || optind != argc) {
		return -1;
	}
	if (2 * p->layers > RDMAX_PAGED_PAIRS_MAX) {
		fprintf(stderr, "rdmax-bench pairs: %u regions exceed %u pairs per job\n",
			2 * p->layers, RDMAX_PAGED_PAIRS_MAX);
		return -1;
	}
	return 0;
}

static int pairs_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The jobs of one request in `shape`, into jobs; returns how many. */
static size_t pairs_shape(const struct pairs_opts *p, int shape, struct rdmax_region **local,
			  const struct rdmax_desc *remote, struct rdmax_region_pair *pairs,
			  const uint32_t *local_idx, const uint32_t *remote_idx, uint64_t *next_id,
			  struct rdmax_job *jobs)
{
	uint32_t regions = 2 * p->layers;
	uint32_t per_job = shape == 0 ? regions : shape == 1 ? 2 : 1;
	size_t n = 0;

	for (uint32_t first = 0; first < regions; first += per_job) {
		jobs[n] = (struct rdmax_job){.id = (*next_id)++,
					     .op = (enum rdmax_op)p->op,
					     .local = local[first],
					     .remote = &remote[first]};
		jobs[n].u.paged.page_len = p->block_len;
		jobs[n].u.paged.local_pages =
			(struct rdmax_pages){.indices = local_idx, .count = p->blocks};
		jobs[n].u.paged.remote_pages =
			(struct rdmax_pages){.indices = remote_idx, .count = p->blocks};
		for (uint32_t k = 1; k < per_job; k++) {
			pairs[first + k] = (struct rdmax_region_pair){.local = local[first + k],
								      .remote = &remote[first + k]};
		}
		if (per_job > 1) {
			jobs[n].pairs = &pairs[first + 1];
			jobs[n].n_pairs = per_job - 1;
		}
		n++;
	}
	return n;
}

static int pairs_wait(struct rdmax_client *c, size_t n, uint64_t bytes)
{
	struct rdmax_event ev[EVENTS_MAX];
	uint64_t got_bytes = 0;

	while (n > 0) {
		int got = rdmax_poll_events(c, ev, EVENTS_MAX, WAIT_MS);
		if (got <= 0) {
			return bench_fail("pairs: rdmax_poll_events", got ? got : RDMAX_E_TIMEOUT);
		}
		for (int i = 0; i < got; i++) {
			if (ev[i].type != RDMAX_EVENT_COMPLETION) {
				continue;
			}
			if (ev[i].status != 0) {
				fprintf(stderr, "rdmax-bench pairs: job failed: %s: %s\n",
					rdmax_err_name(ev[i].status), ev[i].reason);
				return 1;
			}
			got_bytes += ev[i].bytes;
			n--;
		}
	}
	if (got_bytes != bytes) {
		fprintf(stderr,
			"rdmax-bench pairs: %" PRIu64 " bytes completed, %" PRIu64 " moved\n",
			got_bytes, bytes);
		return 1;
	}
	return 0;
}

int bench_pairs_main(int argc, char **argv)
{
	struct pairs_opts p = {.layers = 32,
			       .blocks = 32,
			       .block_len = 16 << 10,
			       .rounds = 30,
			       .op = RDMAX_OP_PAGED_WRITE};
	if (pairs_parse(argc, argv, &p) < 0) {
		return pairs_usage(stderr, 2);
	}
	uint32_t regions = 2 * p.layers;
	uint64_t region_len = 2ull * p.blocks * p.block_len;
	uint64_t request_bytes = (uint64_t)regions * p.blocks * p.block_len;
	struct rdmax_client *ca, *cb;
	struct rdmax_region **ra = calloc(regions, sizeof(*ra)),
			    **rb = calloc(regions, sizeof(*rb));
	struct rdmax_desc *da = calloc(regions, sizeof(*da)), *db = calloc(regions, sizeof(*db));
	struct rdmax_region_pair *pairs = calloc(regions, sizeof(*pairs));
	struct rdmax_job *jobs = calloc(regions, sizeof(*jobs));
	uint32_t *a_idx = calloc(p.blocks, sizeof(*a_idx)),
		 *b_idx = calloc(p.blocks, sizeof(*b_idx));
	uint64_t *t[PAIRS_SHAPES];
	uint64_t next_id = 1;
	int ret;

	for (int s = 0; s < PAIRS_SHAPES; s++) {
		t[s] = calloc(p.rounds, sizeof(uint64_t));
		if (!t[s]) {
			return bench_fail("pairs: calloc", -ENOMEM);
		}
	}
	if (!ra || !rb || !da || !db || !pairs || !jobs || !a_idx || !b_idx) {
		return bench_fail("pairs: calloc", -ENOMEM);
	}
	if ((ret = rdmax_client_open(p.socket_path, "rdmax-bench-pairs", &ca)) < 0 ||
	    (ret = rdmax_client_open(p.peer_socket, "rdmax-bench-pairs-peer", &cb)) < 0) {
		return bench_fail("pairs: rdmax_client_open", ret);
	}
	if (rdmax_client_info(ca)->max_paged_pairs < regions) {
		fprintf(stderr,
			"rdmax-bench pairs: the daemon takes %u region pairs per job, %u needed\n",
			rdmax_client_info(ca)->max_paged_pairs, regions);
		return 69;
	}
	uint32_t access = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	for (uint32_t r = 0; r < regions; r++) {
		if ((ret = rdmax_region_alloc_host(ca, region_len, access, &ra[r])) < 0 ||
		    (ret = rdmax_region_alloc_host(cb, region_len, access, &rb[r])) < 0 ||
		    (ret = rdmax_region_desc(ra[r], &da[r])) < 0 ||
		    (ret = rdmax_region_desc(rb[r], &db[r])) < 0) {
			return bench_fail("pairs: regions", ret);
		}
		bench_fill_pattern(rdmax_region_addr(p.op == RDMAX_OP_PAGED_WRITE ? ra[r] : rb[r]),
				   region_len, r + 1);
	}
	/* Every other block on one side, reversed on the other: no two pages merge. */
	for (uint32_t i = 0; i < p.blocks; i++) {
		a_idx[i] = 2 * i;
		b_idx[i] = 2 * (p.blocks - 1 - i) + 1;
	}
	bool write = p.op == RDMAX_OP_PAGED_WRITE;
	struct rdmax_client *submitter = write ? ca : cb;
	struct rdmax_region **local = write ? ra : rb, **target = write ? rb : ra;
	const struct rdmax_desc *remote = write ? db : da;
	const uint32_t *l_idx = write ? a_idx : b_idx, *r_idx = write ? b_idx : a_idx;

	/* A warm-up request opens the daemon-to-daemon connection. */
	size_t n = pairs_shape(&p, 2, local, remote, pairs, l_idx, r_idx, &next_id, jobs);
	if ((ret = rdmax_submit(submitter, jobs, n)) < 0) {
		return bench_fail("pairs: rdmax_submit", ret);
	}
	if (pairs_wait(submitter, n, request_bytes)) {
		return 1;
	}
	for (uint32_t round = 0; round < p.rounds && !bench_stop; round++) {
		for (int k = 0; k < PAIRS_SHAPES; k++) {
			int shape =
				(int)((round + (uint32_t)k) % PAIRS_SHAPES); /* rotate the order */
			bool check = round < PAIRS_SHAPES; /* each shape's first round */
			if (check) {
				for (uint32_t r = 0; r < regions; r++) {
					memset(rdmax_region_addr(target[r]), 0, region_len);
				}
			}
			n = pairs_shape(&p, shape, local, remote, pairs, l_idx, r_idx, &next_id,
					jobs);
			uint64_t t0 = bench_now_ns();
			if ((ret = rdmax_submit(submitter, jobs, n)) < 0) {
				return bench_fail("pairs: rdmax_submit", ret);
			}
			if (pairs_wait(submitter, n, request_bytes)) {
				return 1;
			}
			t[shape][round] = bench_now_ns() - t0;
			for (uint32_t r = 0; check && r < regions; r++) {
				/* The target's pages hold the source's, pair by pair. */
				const uint8_t *from = rdmax_region_addr(write ? ra[r] : rb[r]);
				const uint8_t *to = rdmax_region_addr(target[r]);
				const uint32_t *f_idx = write ? a_idx : b_idx,
					       *t_idx = write ? b_idx : a_idx;
				for (uint32_t i = 0; i < p.blocks; i++) {
					if (memcmp(to + t_idx[i] * p.block_len,
						   from + f_idx[i] * p.block_len,
						   p.block_len) != 0) {
						fprintf(stderr,
							"rdmax-bench pairs: shape %s: region %u "
							"block "
							"%u differs\n",
							g_shape_names[shape], r, i);
						return 1;
					}
				}
			}
		}
	}
	printf("rdmax-bench pairs: %s, %u layers x K,V = %u regions, %u blocks of %" PRIu64
	       " bytes each (%" PRIu64 " bytes per request), %u rounds\n",
	       write ? "PAGED_WRITE" : "PAGED_READ", p.layers, regions, p.blocks, p.block_len,
	       request_bytes, p.rounds);
	printf("%-6s %6s %12s %12s %10s %10s\n", "shape", "jobs", "best_us", "median_us", "GB/s",
	       "vs_one");
	double median_one = 0;
	for (int s = 0; s < PAIRS_SHAPES; s++) {
		qsort(t[s], p.rounds, sizeof(uint64_t), pairs_cmp_u64);
		double best = (double)t[s][0] / 1e3,
		       median = (double)t[s][(p.rounds - 1) / 2] / 1e3;
		if (s == 0) {
			median_one = median;
		}
		uint32_t n_jobs = s == 0 ? 1 : s == 1 ? p.layers : regions;
		printf("%-6s %6u %12.1f %12.1f %10.2f %10.2f\n", g_shape_names[s], n_jobs, best,
		       median, (double)request_bytes / (median * 1e3), median / median_one);
	}
	rdmax_client_close(ca);
	rdmax_client_close(cb);
	return 0;
}
