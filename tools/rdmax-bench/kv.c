/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench kv: the KV-cache serving pattern, prefill clients pushing paged
 * writes with per-request imm into one decode client that checks every byte.
 * Shares only the helpers of bench.h with the other modes; never uses their
 * options or rows. With --relay the same clients run over the raw relays of
 * kv_relay.c instead of two daemons (kv.h).
 */
#include "kv.h"

/*
 * ---- kv: the serving pattern ----
 *
 * Several prefill clients (processes, on the --socket daemon) push requests
 * into one decode client (on the --decode-socket daemon). A request is
 * `layers` PAGED_WRITE jobs of `blocks` blocks of block_len bytes, every
 * job carrying the request's imm (or, with --one-job, one PAGED_WRITE of
 * every layer's blocks: the layers are one region); the decode client
 * holds one standing claim per slot for that many landings (--claim-each:
 * claims each request anew), and when it fires checks every byte of the
 * request's blocks (the block's pattern and the request's sequence number
 * at both ends) and hands the slot back to its prefill client over a pipe.
 * Successive requests of a slot alternate between a pattern and its
 * complement, which differ in every byte, and the decode pool starts as the
 * complement: a byte that did not land again fails the check without the
 * decode client clearing anything (one pass over every byte, not two). The
 * decode side's block table is a permutation into a pool of twice as many
 * blocks, so no two blocks of a job are contiguous there. Each prefill
 * client keeps `window` requests in flight.
 */
#define KV_IMM(client, slot) (0x4b560000u | (uint32_t)(client) << 8 | (uint32_t)(slot))

/*
 * What a client spent since \p from: its CPU time and context switches, what
 * it costs the machine's CPUs per request where every process of the row
 * shares them (docs/benchmarks.md, Where the KV row's CPU goes).
 */
static struct bench_usage kv_usage_since(struct bench_usage from)
{
	struct bench_usage now = bench_self_usage();
	return (struct bench_usage){.cpu_s = now.cpu_s - from.cpu_s,
				    .switches = now.switches - from.switches};
}

/* What a prefill client tells the parent at the end. */
struct kv_result {
	uint64_t requests;
	uint64_t seconds_ns;
	uint64_t lat_ns_p50;
	uint64_t lat_ns_p99;
	struct bench_usage used; /* over its timed loop, not the sources' fill */
	int status;
};

static uint32_t kv_gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* What the decode client tells the parent at the end. */
struct kv_decode_result {
	uint64_t verified;
	uint64_t check_ns;       /* CPU time the checks took (CLOCK_THREAD_CPUTIME_ID) */
	struct bench_usage used; /* from the descriptor's hand-over (the pool filled) to the end */
};

static uint64_t kv_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Pool block of the decode side for block i of (client, slot, layer): a permutation. */
static uint32_t kv_dst_block(const struct kv_opts *k, uint32_t client, uint32_t slot,
			     uint32_t layer, uint32_t i)
{
	uint32_t pool = 2 * k->blocks; /* blocks of one (client, slot, layer) */
	uint32_t step = k->blocks + 1;

	while (kv_gcd(step, pool) != 1) {
		step++; /* coprime with the pool: i -> i * step % pool never repeats */
	}
	uint64_t area = (((uint64_t)client * k->window + slot) * k->layers + layer) * pool;
	return (uint32_t)(area + (uint64_t)i * step % pool);
}

/* PAGED_WRITE jobs per request, and so landings of its imm. */
static uint32_t kv_jobs_per_request(const struct kv_opts *k)
{
	return k->one_job ? 1 : k->layers;
}

/* Between two words of a block's pattern: odd, so no two words of a block are equal. */
#define KV_STEP 0xd1b54a32d192ed03ull

/* First word of the pattern of (client, layer, block): no two blocks share a pattern. */
static uint64_t kv_block_key(uint32_t client, uint32_t layer, uint32_t i)
{
	return (((uint64_t)client << 40) ^ ((uint64_t)layer << 20) ^ i) * 0x9e3779b97f4a7c15ull +
	       0x632be59bd9b4e019ull;
}

/*
 * Block content, in 8-byte words: word j is key + j * KV_STEP, except the
 * first and last (where each request stamps its sequence number), which are
 * 0; for variant 1 the complement of all of it. The check computes what it
 * expects instead of reading a stored copy: one read of the landed bytes.
 */
static void kv_fill_block(uint8_t *p, const struct kv_opts *k, uint32_t client, uint32_t layer,
			  uint32_t i, uint32_t variant)
{
	uint64_t n = k->block_len / 8, key = kv_block_key(client, layer, i);
	uint64_t mask = variant ? ~0ull : 0;

	for (uint64_t j = 0; j < n; j++) {
		uint64_t v = (j == 0 || j == n - 1 ? 0 : key + j * KV_STEP) ^ mask;
		memcpy(p + j * 8, &v, sizeof(v));
	}
}

/* Word j of a block: its pattern, or seq at both ends, as a request of `variant` lands it. */
static uint64_t kv_word(uint64_t n, uint64_t j, uint64_t key, uint64_t mask, uint64_t seq)
{
	return j == 0 || j == n - 1 ? seq : (key + j * KV_STEP) ^ mask;
}

/* OR of (landed ^ expected) over the pattern words [from, to) of a block: 0 when they match. */
static uint64_t kv_diff_words(const uint8_t *p, uint64_t from, uint64_t to, uint64_t key,
			      uint64_t mask)
{
	uint64_t diff = 0, want = key + from * KV_STEP;

	for (uint64_t j = from; j < to; j++) {
		uint64_t v;
		memcpy(&v, p + j * 8, sizeof(v));
		diff |= v ^ want ^ mask;
		want += KV_STEP;
	}
	return diff;
}

/* Four words of a pattern at a time (two SSE2 registers, or one AVX2 register). */
typedef uint64_t kv_vec __attribute__((vector_size(32), aligned(8)));

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define KV_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef KV_CLONES
#define KV_CLONES
#endif

/*
 * The pattern words 1 .. n-2 of a block against what landed, 64 bytes per
 * pass from word 8 on (a cache line where the block is so aligned): two
 * XORs and an OR per 32 bytes, no branch and no per-byte work, so the
 * check costs about one read of the bytes (measured 1.75 x the scalar
 * loop's rate on 16 MiB of blocks, 2.3-3 x where they are cached,
 * docs/benchmarks.md). Any differing bit of any
 * word leaves the result non-zero.
 */
KV_CLONES static uint64_t kv_diff_block(const uint8_t *p, uint64_t n, uint64_t key, uint64_t mask)
{
	if (n < 17) {
		return kv_diff_words(p, 1, n - 1, key, mask);
	}
	uint64_t end = 8 + (n - 9) / 8 * 8; /* at most n - 1 */
	uint64_t diff = kv_diff_words(p, 1, 8, key, mask) | kv_diff_words(p, end, n - 1, key, mask);
	kv_vec a = {key + 8 * KV_STEP, key + 9 * KV_STEP, key + 10 * KV_STEP, key + 11 * KV_STEP};
	kv_vec b = a + 4 * KV_STEP, d = {0, 0, 0, 0}, e = d;

	for (uint64_t j = 8; j < end; j += 8) {
		kv_vec x, y;
		memcpy(&x, p + j * 8, sizeof(x));
		memcpy(&y, p + j * 8 + sizeof(x), sizeof(y));
		d |= x ^ a ^ mask;
		e |= y ^ b ^ mask;
		a += 8 * KV_STEP;
		b += 8 * KV_STEP;
	}
	d |= e;
	return diff | d[0] | d[1] | d[2] | d[3];
}

/* Whether a landed block holds request seq's variant of its pattern, every byte. */
static bool kv_block_ok(const uint8_t *p, const struct kv_opts *k, uint64_t key, uint32_t variant,
			uint64_t seq)
{
	uint64_t n = k->block_len / 8, head, tail;

	memcpy(&head, p, sizeof(head));
	memcpy(&tail, p + (n - 1) * 8, sizeof(tail));
	return head == seq && tail == seq && kv_diff_block(p, n, key, variant ? ~0ull : 0) == 0;
}

/* The first word of a block that kv_block_ok() refused, and what it expected there. */
static uint64_t kv_first_bad_word(const uint8_t *p, const struct kv_opts *k, uint64_t key,
				  uint32_t variant, uint64_t seq, uint64_t *got, uint64_t *want)
{
	uint64_t n = k->block_len / 8, j = 0;

	for (; j < n; j++) {
		*want = kv_word(n, j, key, variant ? ~0ull : 0, seq);
		memcpy(got, p + j * 8, sizeof(*got));
		if (*got != *want) {
			break;
		}
	}
	return j;
}

/* Request seq of a slot is its (seq / window)-th use: uses alternate the variant. */
static uint32_t kv_variant(const struct kv_opts *k, uint64_t seq)
{
	return (uint32_t)(seq / k->window) & 1;
}

/*
 * A client's memory of len bytes: with a relay (--relay, relay_fd) the relay's
 * memfd, otherwise a host region of the daemon at socket_path, opened as *ret_c.
 * \return its address, or NULL after saying why (what: the client's name)
 */
static uint8_t *kv_client_memory(const char *what, int relay_fd, const char *socket_path,
				 uint64_t len, uint32_t access, struct rdmax_client **ret_c,
				 struct rdmax_region **ret_region)
{
	char name[64];
	int ret;

	*ret_c = NULL;
	if (relay_fd >= 0) {
		uint8_t *base = kv_relay_map(relay_fd, len);
		if (!base) {
			snprintf(name, sizeof(name), "kv %s: mapping the relay's memory", what);
			bench_fail(name, -errno);
		}
		return base;
	}
	snprintf(name, sizeof(name), "rdmax-bench-kv-%s", what);
	ret = rdmax_client_open(socket_path, name, ret_c);
	if (ret == 0) {
		ret = rdmax_region_alloc_host(*ret_c, len, access, ret_region);
	}
	if (ret < 0) {
		snprintf(name, sizeof(name), "kv %s: %s", what,
			 *ret_c ? "rdmax_region_alloc_host" : "rdmax_client_open");
		bench_fail(name, ret);
		return NULL;
	}
	return rdmax_region_addr(*ret_region);
}

/*
 * The decode client. With a relay (--relay, r) instead of a daemon its pool
 * is the relay's memfd and the relay's socket brings the imms.
 */
static int kv_decode(const struct kv_opts *k, const struct kv_relay *r, int desc_fd, int *token_fds,
		     int result_fd)
{
	uint64_t pool_blocks = kv_pool_blocks(k);
	struct kv_decode_result res = {0};
	uint64_t next_seq[KV_CLIENTS_MAX][KV_WINDOW_MAX];
	struct rdmax_event ev[EVENTS_MAX];
	uint32_t imms[EVENTS_MAX];
	struct rdmax_client *c = NULL;
	struct rdmax_region *pool;
	struct rdmax_desc desc = {0};
	uint8_t *base;
	int ret;

	/*
	 * --decode-sleep: poll() between imms instead of the library's 1 ms
	 * spin (unless RDMAX_SPIN_US says otherwise); on two CPUs the spin's
	 * sched_yield() calls took CPU time the daemons' TCP copies need
	 * (docs/benchmarks.md, KV over TCP).
	 */
	if (k->decode_sleep) {
		setenv("RDMAX_SPIN_US", "0", 0);
	}
	base = kv_client_memory("decode", r ? r->pool_fd : -1, k->decode_socket,
				pool_blocks * k->block_len, RDMAX_ACCESS_REMOTE_WRITE, &c, &pool);
	if (!base) {
		return 1;
	}
	for (uint32_t cl = 0; cl < k->clients; cl++) {
		for (uint32_t w = 0; w < k->window; w++) {
			next_seq[cl][w] = w;
			/* The first request of a slot (variant 0) lands on variant 1. */
			for (uint32_t l = 0; l < k->layers; l++) {
				for (uint32_t i = 0; i < k->blocks; i++) {
					kv_fill_block(
						base + (uint64_t)kv_dst_block(k, cl, w, l, i) *
								k->block_len,
						k, cl, l, i, 1);
				}
			}
			if (r) {
				continue; /* the relay tells every imm */
			}
			/* One standing claim per slot fires for each of its requests. */
			ret = rdmax_expect_imm_flags(c, KV_IMM(cl, w), kv_jobs_per_request(k),
						     k->claim_each ? 0 : RDMAX_EXPECT_STANDING);
			if (ret < 0) {
				return bench_fail("kv decode: rdmax_expect_imm", ret);
			}
		}
	}
	if (c) {
		rdmax_region_desc(pool, &desc);
	}
	if (write(desc_fd, &desc, sizeof(desc)) != (ssize_t)sizeof(desc)) {
		return bench_fail("kv decode: handing over the descriptor", -errno);
	}
	close(desc_fd);
	struct bench_usage from = bench_self_usage();
	while (!bench_stop) {
		int n = r ? kv_relay_poll(r->decode_sock[0], imms, EVENTS_MAX, 100)
			  : rdmax_poll_events(c, ev, EVENTS_MAX, 100);
		if (n == -EINTR) {
			continue;
		}
		if (n < 0) {
			return bench_fail("kv decode: waiting for imms", n);
		}
		int n_imms = r ? n : 0;
		for (int e = 0; !r && e < n; e++) {
			if (ev[e].type == RDMAX_EVENT_IMM_REACHED) {
				imms[n_imms++] = ev[e].imm;
			}
		}
		for (int e = 0; e < n_imms; e++) {
			uint32_t cl = (imms[e] >> 8) & 0xff, w = imms[e] & 0xff;
			if (cl >= k->clients || w >= k->window) {
				return bench_fail("kv decode: imm", -EPROTO);
			}
			uint64_t seq = next_seq[cl][w];
			uint32_t variant = kv_variant(k, seq);
			/*
			 * Every layer landed: every byte of every block must be this
			 * request's. The slot's previous request (or the pool's first
			 * fill) left the other variant there, which differs in every
			 * byte, so nothing needs clearing.
			 */
			uint64_t t0 = k->verify ? kv_cpu_ns() : 0;
			for (uint32_t l = 0; k->verify && l < k->layers; l++) {
				for (uint32_t i = 0; i < k->blocks; i++) {
					uint8_t *got =
						base + (uint64_t)kv_dst_block(k, cl, w, l, i) *
							       k->block_len;
					uint64_t key = kv_block_key(cl, l, i), g = 0, x = 0;
					if (!kv_block_ok(got, k, key, variant, seq)) {
						uint64_t j = kv_first_bad_word(got, k, key, variant,
									       seq, &g, &x);
						fprintf(stderr,
							"rdmax-bench kv: client %u request %" PRIu64
							" layer %u block %u: bytes differ from "
							"byte "
							"%" PRIu64 " (word 0x%016" PRIx64
							", expected 0x%016" PRIx64 ")\n",
							cl, seq, l, i, j * 8, g, x);
						return 1;
					}
				}
			}
			res.check_ns += k->verify ? kv_cpu_ns() - t0 : 0;
			res.verified++;
			next_seq[cl][w] = seq + k->window;
			/*
			 * The slot goes back first: landings before a claim are
			 * counted, so with --claim-each the next request's transfer
			 * overlaps this claim's round trip to the daemon.
			 */
			if (write(token_fds[cl], &w, sizeof(w)) != (ssize_t)sizeof(w)) {
				return bench_fail("kv decode: handing back a slot", -errno);
			}
			if (!k->claim_each) {
				continue;
			}
			ret = rdmax_expect_imm(c, imms[e], kv_jobs_per_request(k));
			if (ret < 0) {
				return bench_fail("kv decode: rdmax_expect_imm", ret);
			}
		}
	}
	res.used = kv_usage_since(from);
	if (write(result_fd, &res, sizeof(res)) != (ssize_t)sizeof(res)) {
		return 1;
	}
	if (c) {
		rdmax_client_close(c);
	}
	return 0;
}

static int kv_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* A prefill client; with a relay (--relay, r) its sources are the relay's memfd. */
static int kv_prefill(const struct kv_opts *k, const struct kv_relay *r, uint32_t client,
		      const struct rdmax_desc *peer, int token_fd, int result_fd)
{
	struct kv_result res = {0};
	struct rdmax_event ev[EVENTS_MAX];
	struct rdmax_job *jobs = calloc(k->layers, sizeof(*jobs));
	/* Source blocks: both variants of every slot's request, one after the other. */
	uint32_t *src_idx = calloc((size_t)2 * k->window * k->layers * k->blocks, sizeof(uint32_t));
	uint32_t *dst_idx = calloc((size_t)k->window * k->layers * k->blocks, sizeof(uint32_t));
	uint64_t *t_sent = calloc(k->window, sizeof(uint64_t));
	uint64_t lat_cap = 1 << 16, n_lat = 0;
	uint64_t *lat = malloc(lat_cap * sizeof(*lat));
	uint32_t free_slots[KV_WINDOW_MAX], n_free = k->window, outstanding = 0;
	struct rdmax_client *c = NULL;
	struct rdmax_region *src = NULL;
	uint64_t seq_of[KV_WINDOW_MAX], job_id = 1, last_token;
	uint32_t done[EVENTS_MAX];
	int sock = r ? r->prefill_sock[client][0] : -1;
	uint8_t *base;
	int ret;

	if (!jobs || !src_idx || !dst_idx || !t_sent || !lat) {
		return bench_fail("kv prefill: calloc", -ENOMEM);
	}
	base = kv_client_memory("prefill", r ? r->src_fd[client] : -1, k->socket_path,
				kv_src_bytes(k), RDMAX_ACCESS_LOCAL, &c, &src);
	if (!base) {
		return 1;
	}
	for (uint32_t w = 0; w < k->window; w++) {
		free_slots[w] = k->window - 1 - w;
		seq_of[w] = w;
		for (uint32_t v = 0; v < 2; v++) {
			for (uint32_t l = 0; l < k->layers; l++) {
				for (uint32_t i = 0; i < k->blocks; i++) {
					size_t at =
						(((size_t)w * 2 + v) * k->layers + l) * k->blocks +
						i;
					src_idx[at] = (uint32_t)at;
					dst_idx[((size_t)w * k->layers + l) * k->blocks + i] =
						kv_dst_block(k, client, w, l, i);
					kv_fill_block(base + at * k->block_len, k, client, l, i, v);
				}
			}
		}
	}
	struct bench_usage from = bench_self_usage();
	uint64_t t0 = bench_now_ns(), until = t0 + (uint64_t)(k->duration_s * 1e9);
	last_token = t0;
	while (!bench_stop && (outstanding > 0 || bench_now_ns() < until)) {
		while (n_free > 0 && bench_now_ns() < until) {
			uint32_t w = free_slots[--n_free];
			/* Slot w carries requests w, w + window, ...: the decode side expects that.
			 */
			uint64_t seq = seq_of[w];
			seq_of[w] += k->window;
			size_t src_at =
				((size_t)w * 2 + kv_variant(k, seq)) * k->layers * k->blocks;
			for (uint32_t b = 0; b < k->layers * k->blocks; b++) {
				uint8_t *p = base + (src_at + b) * k->block_len;
				memcpy(p, &seq, sizeof(seq));
				memcpy(p + k->block_len - sizeof(seq), &seq, sizeof(seq));
			}
			uint32_t n_jobs = kv_jobs_per_request(k);
			uint32_t per_job = k->layers * k->blocks / n_jobs;
			for (uint32_t l = 0; l < n_jobs; l++) {
				size_t at = (size_t)l * per_job;
				size_t dst_at = (size_t)w * k->layers * k->blocks + at;
				jobs[l] = (struct rdmax_job){
					.id = job_id++,
					.op = RDMAX_OP_PAGED_WRITE,
					.flags = RDMAX_JOB_IMM,
					.imm = KV_IMM(client, w),
					.local = src,
					.remote = peer,
					.u.paged = {.page_len = k->block_len,
						    .local_pages = {.indices =
									    src_idx + src_at + at,
								    .count = per_job},
						    .remote_pages = {.indices = dst_idx + dst_at,
								     .count = per_job}},
				};
			}
			t_sent[w] = bench_now_ns();
			ret = r ? kv_relay_submit(sock, w, KV_IMM(client, w), per_job,
						  src_idx + src_at,
						  dst_idx + w * k->layers * k->blocks)
				: rdmax_submit(c, jobs, n_jobs);
			if (ret < 0) {
				return bench_fail("kv prefill: submitting a request", ret);
			}
			outstanding++;
		}
		int n = r ? kv_relay_poll(sock, done, EVENTS_MAX, 0)
			  : rdmax_poll_events(c, ev, EVENTS_MAX, 0);
		if (n < 0) {
			return bench_fail("kv prefill: polling for completions", n);
		}
		for (int e = 0; !r && e < n; e++) {
			if (ev[e].type == RDMAX_EVENT_COMPLETION && ev[e].status != 0) {
				fprintf(stderr, "rdmax-bench kv: paged write failed: %s: %s\n",
					rdmax_strerror(ev[e].status), ev[e].reason);
				return 1;
			}
		}
		uint32_t w;
		int tokens = 0;
		if (outstanding > 0 && bench_now_ns() - last_token > (uint64_t)WAIT_MS * 1000000) {
			return bench_fail("kv prefill: no request verified for 30 s",
					  RDMAX_E_TIMEOUT);
		}
		while (read(token_fd, &w, sizeof(w)) == (ssize_t)sizeof(w)) {
			last_token = bench_now_ns();
			if (w >= k->window || outstanding == 0) {
				return bench_fail("kv prefill: slot token", -EPROTO);
			}
			if (n_lat == lat_cap) {
				lat_cap *= 2;
				uint64_t *nl = realloc(lat, lat_cap * sizeof(*lat));
				if (!nl) {
					return bench_fail("kv prefill: realloc", -ENOMEM);
				}
				lat = nl;
			}
			lat[n_lat++] = bench_now_ns() - t_sent[w];
			free_slots[n_free++] = w;
			outstanding--;
			res.requests++;
			tokens++;
		}
		if (n == 0 && tokens == 0 && outstanding > 0) {
			/* Nothing to do: sleep until a completion or a slot comes back. */
			struct pollfd pfd[2] = {
				{.fd = token_fd, .events = POLLIN},
				{.fd = r ? sock : rdmax_client_fd(c), .events = POLLIN}};
			poll(pfd, 2, 100);
		}
	}
	res.seconds_ns = bench_now_ns() - t0;
	res.used = kv_usage_since(from);
	if (n_lat > 0) {
		qsort(lat, n_lat, sizeof(*lat), kv_cmp_u64);
		res.lat_ns_p50 = lat[(n_lat - 1) / 2];
		res.lat_ns_p99 = lat[(uint64_t)((double)(n_lat - 1) * 0.99)];
	}
	if (write(result_fd, &res, sizeof(res)) != (ssize_t)sizeof(res)) {
		return 1;
	}
	if (c) {
		rdmax_client_close(c);
	}
	return 0;
}

static int kv_usage(FILE *out, int ret)
{
	fprintf(out,
		"Usage: rdmax-bench kv --socket PREFILL.sock --decode-socket DECODE.sock\n"
		"                      [--clients N] [--layers N] [--blocks N] [--block-len "
		"BYTES]\n"
		"                      [--window N] [-D SECS] [--label TEXT] [--json=FILE]\n"
		"                      [--daemon-pid PID] [--peer-daemon-pid PID] [--one-job]\n"
		"                      [--no-verify] [--decode-sleep] [--claim-each]\n"
		"       rdmax-bench kv --relay --one-job [--relay-spin US] [the same options but "
		"the\n"
		"                      sockets and pids]\n"
		"N prefill clients (processes) on the first daemon push requests of LAYERS\n"
		"paged writes of BLOCKS blocks each, with one imm per request, into one decode\n"
		"client on the second daemon, which checks every byte. Defaults: 2 clients, 8\n"
		"layers, 16 blocks of 16 KiB, 4 requests in flight per client, 2 s.\n"
		"--one-job: one paged write of every layer's blocks per request (the layers\n"
		"are one region) instead of one per layer.\n"
		"--decode-sleep: the decode client sleeps between imms instead of the\n"
		"library's spin (RDMAX_SPIN_US=0 unless the environment sets it).\n"
		"--claim-each: the decode client claims each request's imm when the one\n"
		"before it in the slot fired, instead of one standing claim per slot.\n"
		"--relay: the same clients over two raw relay processes and one TCP connection\n"
		"where the daemons stand (the row's raw reference; needs --one-job).\n"
		"--relay-spin US: the relays poll without sleeping for up to US after the last\n"
		"message, as rdmaxd's loop does for [engine] busy_poll_us (default 0: they\n"
		"sleep in the kernel, the stronger reference on two CPUs).\n"
		"--no-verify: the decode client hands slots back without checking (transport\n"
		"only; the check costs the decode client one read of every byte). BYTES: a\n"
		"multiple of 8.\n");
	return ret;
}

int bench_kv_main(int argc, char **argv)
{
	static const struct option options[] = {
		{"socket", required_argument, NULL, 'S'},
		{"decode-socket", required_argument, NULL, 'T'},
		{"clients", required_argument, NULL, 'c'},
		{"layers", required_argument, NULL, 'L'},
		{"blocks", required_argument, NULL, 'B'},
		{"block-len", required_argument, NULL, 'l'},
		{"window", required_argument, NULL, 'w'},
		{"duration", required_argument, NULL, 'D'},
		{"label", required_argument, NULL, 'a'},
		{"json", optional_argument, NULL, 'j'},
		{"daemon-pid", required_argument, NULL, 'p'},
		{"peer-daemon-pid", required_argument, NULL, 'P'},
		{"no-verify", no_argument, NULL, 'V'},
		{"one-job", no_argument, NULL, 'O'},
		{"decode-sleep", no_argument, NULL, 'Z'},
		{"claim-each", no_argument, NULL, 'E'},
		{"relay", no_argument, NULL, 'R'},
		{"relay-spin", required_argument, NULL, 'Y'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct kv_opts k = {.clients = 2,
			    .layers = 8,
			    .blocks = 16,
			    .window = 4,
			    .block_len = 16 << 10,
			    .duration_s = 2,
			    .verify = true};
	uint64_t v;
	int opt;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "D:h", options, NULL)) != -1) {
		switch (opt) {
		case 'S':
			k.socket_path = optarg;
			break;
		case 'T':
			k.decode_socket = optarg;
			break;
		case 'c':
		case 'L':
		case 'B':
		case 'w':
			if (bench_parse_u64(optarg, &v) < 0 || v == 0 || v > 1u << 20 ||
			    ((opt == 'c') && v > KV_CLIENTS_MAX) ||
			    ((opt == 'w') && v > KV_WINDOW_MAX)) {
				fprintf(stderr, "rdmax-bench kv: bad value '%s'\n", optarg);
				return 2;
			}
			*(opt == 'c'   ? &k.clients
			  : opt == 'L' ? &k.layers
			  : opt == 'B' ? &k.blocks
				       : &k.window) = (uint32_t)v;
			break;
		case 'l':
			if (bench_parse_size(optarg, &k.block_len) < 0 || k.block_len < 16 ||
			    k.block_len % 8 != 0) {
				fprintf(stderr, "rdmax-bench kv: bad --block-len '%s'\n", optarg);
				return 2;
			}
			break;
		case 'D':
			k.duration_s = strtod(optarg, NULL);
			break;
		case 'a':
			k.label = optarg;
			break;
		case 'j':
			k.json_path = optarg ? optarg : "-";
			break;
		case 'p':
			k.daemon_pid = atoi(optarg);
			break;
		case 'P':
			k.peer_pid = atoi(optarg);
			break;
		case 'V':
			k.verify = false;
			break;
		case 'O':
			k.one_job = true;
			break;
		case 'Z':
			k.decode_sleep = true;
			break;
		case 'E':
			k.claim_each = true;
			break;
		case 'R':
			k.relay = true;
			break;
		case 'Y':
			if (bench_parse_u64(optarg, &v) < 0 || v > 1000000) {
				fprintf(stderr, "rdmax-bench kv: bad --relay-spin '%s'\n", optarg);
				return 2;
			}
			k.relay_spin_us = (uint32_t)v;
			break;
		case 'h':
			return kv_usage(stdout, 0);
		default:
			return kv_usage(stderr, 2);
		}
	}
	if (k.relay_spin_us > 0 && !k.relay) {
		fprintf(stderr, "rdmax-bench kv: --relay-spin takes --relay\n");
		return 2;
	}
	if ((!k.relay && (!k.socket_path || !k.decode_socket)) || k.duration_s <= 0) {
		return kv_usage(stderr, 2);
	}
	struct kv_relay relay = {0}, *r = NULL;
	if (k.relay) {
		int ret = kv_relay_start(&k, &relay);
		if (ret < 0) {
			kv_relay_stop(&relay);
			return ret == -EINVAL ? 2 : bench_fail("kv: starting the relays", ret);
		}
		r = &relay;
		k.daemon_pid = relay.sender;
		k.peer_pid = relay.receiver;
	}

	int desc_pipe[2], result_pipe[2], tokens[KV_CLIENTS_MAX][2];
	if (pipe(desc_pipe) < 0 || pipe(result_pipe) < 0) {
		return bench_fail("kv: pipe", -errno);
	}
	for (uint32_t i = 0; i < k.clients; i++) {
		if (pipe2(tokens[i], O_NONBLOCK) < 0) {
			return bench_fail("kv: pipe", -errno);
		}
	}
	double cpu0 = bench_proc_cpu_s(k.daemon_pid), peer0 = bench_proc_cpu_s(k.peer_pid);
	struct bench_sched ds0, ps0, ds1, ps1;
	bool dsched = bench_proc_sched(k.daemon_pid, &ds0);
	bool psched = bench_proc_sched(k.peer_pid, &ps0);
	double idle0 = bench_host_idle_s();
	uint64_t wall0 = bench_now_ns();
	pid_t decode = fork();
	if (decode < 0) {
		return bench_fail("kv: fork", -errno);
	}
	if (decode == 0) {
		int w[KV_CLIENTS_MAX];
		close(desc_pipe[0]);
		for (uint32_t i = 0; i < k.clients; i++) {
			w[i] = tokens[i][1];
			close(tokens[i][0]);
		}
		_exit(kv_decode(&k, r, desc_pipe[1], w, result_pipe[1]));
	}
	close(desc_pipe[1]);
	struct rdmax_desc peer;
	if (read(desc_pipe[0], &peer, sizeof(peer)) != (ssize_t)sizeof(peer)) {
		kill(decode, SIGKILL);
		waitpid(decode, NULL, 0);
		fprintf(stderr, "rdmax-bench kv: the decode client did not start\n");
		return 1;
	}
	pid_t prefill[KV_CLIENTS_MAX];
	for (uint32_t i = 0; i < k.clients; i++) {
		prefill[i] = fork();
		if (prefill[i] < 0) {
			return bench_fail("kv: fork", -errno);
		}
		if (prefill[i] == 0) {
			_exit(kv_prefill(&k, r, i, &peer, tokens[i][0], result_pipe[1]));
		}
	}
	int failed = 0, status;
	struct kv_result sum = {0};
	uint64_t p50 = 0, p99 = 0;
	for (uint32_t i = 0; i < k.clients; i++) {
		if (waitpid(prefill[i], &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0) {
			failed = 1;
			continue;
		}
		struct kv_result one;
		if (read(result_pipe[0], &one, sizeof(one)) != (ssize_t)sizeof(one)) {
			failed = 1;
			continue;
		}
		sum.requests += one.requests;
		sum.seconds_ns = MAX_U64(sum.seconds_ns, one.seconds_ns);
		sum.used.cpu_s += one.used.cpu_s;
		sum.used.switches += one.used.switches;
		p50 = MAX_U64(p50, one.lat_ns_p50);
		p99 = MAX_U64(p99, one.lat_ns_p99);
	}
	double cpu = bench_proc_cpu_s(k.daemon_pid) - cpu0,
	       peer_cpu = bench_proc_cpu_s(k.peer_pid) - peer0;
	double idle1 = bench_host_idle_s(), wall = (double)(bench_now_ns() - wall0) / 1e9;
	dsched = dsched && bench_proc_sched(k.daemon_pid, &ds1);
	psched = psched && bench_proc_sched(k.peer_pid, &ps1);
	if (r && kv_relay_stop(r) < 0) {
		fprintf(stderr, "rdmax-bench kv: a relay failed\n");
		failed = 1;
	}
	kill(decode, SIGTERM);
	struct kv_decode_result dec = {0};
	if (waitpid(decode, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
	    read(result_pipe[0], &dec, sizeof(dec)) != (ssize_t)sizeof(dec)) {
		failed = 1;
	}
	if (!failed && dec.verified != sum.requests) {
		fprintf(stderr,
			"rdmax-bench kv: %" PRIu64 " requests completed but %" PRIu64
			" were verified\n",
			sum.requests, dec.verified);
		failed = 1;
	}
	uint64_t req = kv_slot_bytes(&k);
	double secs = (double)sum.seconds_ns / 1e9;
	double gb = (double)(req * sum.requests) / 1e9;
	double gbps = secs > 0 ? gb * 8 / secs : 0;
	FILE *f = stdout;
	if (k.json_path && strcmp(k.json_path, "-") != 0 && !(f = fopen(k.json_path, "w"))) {
		return bench_fail("kv: --json file", -errno);
	}
	if (k.json_path) {
		fprintf(f, "{\"tool\": \"rdmax-bench\", \"mode\": \"kv\", \"label\": ");
		bench_json_string(f, k.label);
		fprintf(f,
			", \"op\": \"paged\", \"status\": \"%s\", \"params\": {\"clients\": %u, "
			"\"layers\": %u, \"blocks\": %u, \"block_len\": %" PRIu64
			", \"window\": %u, \"jobs_per_request\": %u, \"claims\": \"%s\", "
			"\"transport\": \"%s\", \"relay_spin_us\": %u, \"duration_s\": %g}, "
			"\"results\": [\n",
			failed ? "failed" : "ok", k.clients, k.layers, k.blocks, k.block_len,
			k.window, kv_jobs_per_request(&k), k.claim_each ? "each" : "standing",
			k.relay ? "relay" : "rdmaxd", k.relay_spin_us, k.duration_s);
		fprintf(f,
			"  {\"bytes\": %" PRIu64 ", \"jobs\": %" PRIu64
			", \"seconds\": %.6f, \"GBps\": %.6f, \"Gbps\": %.6f, \"jobs_per_s\": "
			"%.1f, "
			"\"lat_us\": {\"p50\": %.3f, \"p99\": %.3f, \"p999\": 0, \"max\": 0, "
			"\"mean\": 0}, \"daemon_cpu_s_per_GB\": ",
			req, sum.requests, secs, gbps / 8, gbps, secs > 0 ? sum.requests / secs : 0,
			(double)p50 / 1e3, (double)p99 / 1e3);
		bench_print_num(f, cpu >= 0 && gb > 0 ? cpu / gb : -1, 4);
		fprintf(f, ", \"peer_cpu_s_per_GB\": ");
		bench_print_num(f, k.peer_pid > 0 && peer_cpu >= 0 && gb > 0 ? peer_cpu / gb : -1,
				4);
		fprintf(f, ", \"check_cpu_s_per_GB\": ");
		bench_print_num(f, k.verify && gb > 0 ? (double)dec.check_ns / 1e9 / gb : -1, 4);
		/*
		 * The clients' share of the machine, per GB and per request: on a
		 * machine whose CPUs every process of the row shares, what they
		 * take comes out of the transfer's rate.
		 */
		fprintf(f, ", \"prefill_cpu_s_per_GB\": ");
		bench_print_num(f, gb > 0 ? sum.used.cpu_s / gb : -1, 4);
		fprintf(f, ", \"decode_cpu_s_per_GB\": ");
		bench_print_num(f, gb > 0 ? dec.used.cpu_s / gb : -1, 4);
		double nreq = (double)MAX_U64(sum.requests, 1);
		fprintf(f, ", \"runs_per_request\": {\"prefill\": ");
		bench_print_num(f, sum.used.switches / nreq, 2);
		fprintf(f, ", \"decode\": ");
		bench_print_num(f, dec.used.switches / nreq, 2);
		fprintf(f, ", \"daemon\": ");
		bench_print_num(f, dsched ? (ds1.runs - ds0.runs) / nreq : -1, 2);
		fprintf(f, ", \"peer\": ");
		bench_print_num(f, psched ? (ps1.runs - ps0.runs) / nreq : -1, 2);
		fprintf(f, "}, \"sleeps_per_request\": {\"daemon\": ");
		bench_print_num(f, dsched ? (ds1.sleeps - ds0.sleeps) / nreq : -1, 2);
		fprintf(f, ", \"peer\": ");
		bench_print_num(f, psched ? (ps1.sleeps - ps0.sleeps) / nreq : -1, 2);
		fprintf(f, "}, \"host_idle\": ");
		bench_print_num(f,
				idle0 >= 0 && idle1 >= 0 && wall > 0
					? (idle1 - idle0) /
						  (wall * (double)sysconf(_SC_NPROCESSORS_ONLN))
					: -1,
				4);
		fprintf(f, ", \"verify\": \"%s\"}\n]}\n",
			failed     ? "FAILED"
			: k.verify ? "ok"
				   : "skipped");
	} else {
		printf("kv: %u prefill clients -> 1 decode client, requests of %u layers x %u "
		       "blocks x %" PRIu64 " B (%" PRIu64 " B)\n"
		       "%9s %8s %8s %9s %11s %11s %9s\n%9" PRIu64 " %8.3f %8.2f %9.1f %11.1f "
		       "%11.1f %9s\n",
		       k.clients, k.layers, k.blocks, k.block_len, req, "requests", "seconds",
		       "Gb/s", "req/s", "p50_us", "p99_us", "verify", sum.requests, secs, gbps,
		       secs > 0 ? sum.requests / secs : 0, (double)p50 / 1e3, (double)p99 / 1e3,
		       failed     ? "FAILED"
		       : k.verify ? "ok"
				  : "skipped");
	}
	if (f != stdout) {
		fclose(f);
	}
	return failed;
}
