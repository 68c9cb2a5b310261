/* SPDX-License-Identifier: MIT */
/*
 * kv_cache_push: a prefill worker hands its KV cache to a decode worker,
 * layer by layer, with one PAGED_WRITE and one imm value per layer. The
 * decode side waits for layer 0, then layer 1, ... and could start decoding
 * layer L while layers L+1.. are still on the wire.
 *
 *   kv_cache_push decode  --socket B.sock --desc FILE   register the cache,
 *       write its descriptor to FILE, wait layer by layer, verify every byte
 *   kv_cache_push prefill --socket A.sock --desc FILE   fill the cache, push it
 *
 * Options on both sides (they must agree): --layers N (default 8),
 * --blocks N blocks per layer on the prefill side (default 256),
 * --block-bytes N (default 16384).
 *
 * Layout. Prefill: layer L's blocks are contiguous, block i at
 * (L * blocks + i) * block_bytes. Decode: every layer has a pool of
 * 2 * blocks blocks, and its block table (which pool block receives prefill
 * block i) is a permutation both sides compute here; a real deployment sends
 * it over its own control channel, or with a SEND job to a mailbox. Uses
 * only rdmax.h.
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

#define KV_IMM_BASE 0x4b560000u /* "KV" << 16 | layer */
#define TIMEOUT_MS  60000

struct kv {
	uint32_t layers;
	uint32_t blocks; /* per layer, prefill side */
	uint64_t block_bytes;
};

static int fail(const char *what, int err)
{
	fprintf(stderr, "kv_cache_push: %s failed: %s\n", what, rdmax_strerror(err));
	return 1;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Contents of prefill block `block` of `layer`: both sides compute it. */
static void block_pattern(uint8_t *buf, uint64_t len, uint32_t layer, uint32_t block)
{
	uint64_t x = ((uint64_t)layer << 32 | block) * 0x9e3779b97f4a7c15ull + 1;
	for (uint64_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
}

static uint32_t gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/*
 * Decode-side pool block that receives prefill block i of layer L: a
 * scattered but collision-free choice (i -> i * step mod blocks is a
 * permutation when gcd(step, blocks) == 1), in even pool blocks for even
 * layers and odd ones for odd layers.
 */
static uint32_t block_table(const struct kv *kv, uint32_t layer, uint32_t i)
{
	uint32_t step = kv->blocks / 2 + 1;
	while (gcd(step, kv->blocks) != 1) {
		step++;
	}
	return (uint32_t)((uint64_t)i * step % kv->blocks) * 2 + (layer & 1);
}

static int run_decode(const char *socket_path, const char *desc_path, const struct kv *kv)
{
	uint64_t layer_bytes = 2ull * kv->blocks * kv->block_bytes;
	struct rdmax_client *client;
	struct rdmax_region *cache;
	struct rdmax_desc desc;
	uint8_t *expect = malloc(kv->block_bytes);
	int ret;

	if (!expect) {
		return fail("malloc", -ENOMEM);
	}
	ret = rdmax_client_open(socket_path, "kv-decode", &client);
	if (ret < 0) {
		return fail("rdmax_client_open", ret);
	}
	ret = rdmax_region_alloc_host(client, kv->layers * layer_bytes, RDMAX_ACCESS_REMOTE_WRITE,
				      &cache);
	if (ret < 0) {
		return fail("rdmax_region_alloc_host", ret);
	}
	/* Claim every layer's imm first: landings that come earlier are kept anyway. */
	for (uint32_t layer = 0; layer < kv->layers; layer++) {
		ret = rdmax_expect_imm(client, KV_IMM_BASE + layer, 1);
		if (ret < 0) {
			return fail("rdmax_expect_imm", ret);
		}
	}
	rdmax_region_desc(cache, &desc);
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", desc_path);
	FILE *f = fopen(tmp, "wb");
	if (!f || fwrite(desc.bytes, 1, desc.len, f) != desc.len || fclose(f) != 0 ||
	    rename(tmp, desc_path) != 0) {
		fprintf(stderr, "kv_cache_push: cannot write '%s': %s\n", desc_path,
			strerror(errno));
		return 1;
	}
	printf("decode: KV cache of %u layers registered, waiting layer by layer\n", kv->layers);
	fflush(stdout);

	const uint8_t *base = rdmax_region_addr(cache);
	double t0 = now_ms();
	uint64_t sum = 0xcbf29ce484222325ull;
	for (uint32_t layer = 0; layer < kv->layers; layer++) {
		ret = rdmax_wait_imm(client, KV_IMM_BASE + layer, TIMEOUT_MS);
		if (ret < 0) {
			return fail("rdmax_wait_imm", ret);
		}
		/* The imm fired: every page of this layer is in place. Check them. */
		for (uint32_t i = 0; i < kv->blocks; i++) {
			const uint8_t *got = base + layer * layer_bytes +
					     block_table(kv, layer, i) * kv->block_bytes;
			block_pattern(expect, kv->block_bytes, layer, i);
			if (memcmp(got, expect, kv->block_bytes) != 0) {
				fprintf(stderr, "decode: layer %u block %u differs\n", layer, i);
				return 1;
			}
			for (uint64_t k = 0; k < kv->block_bytes; k++) {
				sum = (sum ^ got[k]) * 0x100000001b3ull;
			}
		}
		printf("decode: layer %u ready after %.1f ms\n", layer, now_ms() - t0);
	}
	printf("decode: all %u layers verified, checksum %016" PRIx64 "\n", kv->layers, sum);
	rdmax_client_close(client);
	free(expect);
	return 0;
}

static int run_prefill(const char *socket_path, const char *desc_path, const struct kv *kv)
{
	uint64_t layer_bytes = (uint64_t)kv->blocks * kv->block_bytes;
	uint32_t *src_pages = calloc(kv->blocks, sizeof(*src_pages));
	uint32_t *dst_pages = calloc(kv->blocks, sizeof(*dst_pages));
	struct rdmax_client *client;
	struct rdmax_region *cache;
	struct rdmax_desc peer;
	uint8_t buf[RDMAX_DESC_MAX];
	size_t n = 0;
	int ret;

	if (!src_pages || !dst_pages) {
		return fail("calloc", -ENOMEM);
	}
	/* The decode side writes its descriptor once its cache is registered. */
	for (int waited = 0; n == 0; waited += 10) {
		FILE *f = fopen(desc_path, "rb");
		if (f) {
			n = fread(buf, 1, sizeof(buf), f);
			fclose(f);
		} else if (waited > TIMEOUT_MS) {
			fprintf(stderr, "kv_cache_push: no descriptor at '%s'\n", desc_path);
			return 1;
		} else {
			usleep(10000);
		}
	}
	ret = rdmax_desc_import(buf, n, &peer);
	if (ret < 0) {
		return fail("rdmax_desc_import", ret);
	}
	ret = rdmax_client_open(socket_path, "kv-prefill", &client);
	if (ret < 0) {
		return fail("rdmax_client_open", ret);
	}
	ret = rdmax_region_alloc_host(client, kv->layers * layer_bytes, RDMAX_ACCESS_LOCAL, &cache);
	if (ret < 0) {
		return fail("rdmax_region_alloc_host", ret);
	}
	uint8_t *base = rdmax_region_addr(cache);
	uint64_t sum = 0xcbf29ce484222325ull;
	for (uint32_t layer = 0; layer < kv->layers; layer++) {
		for (uint32_t i = 0; i < kv->blocks; i++) {
			uint8_t *block = base + layer * layer_bytes + i * kv->block_bytes;
			block_pattern(block, kv->block_bytes, layer, i);
			for (uint64_t k = 0; k < kv->block_bytes; k++) {
				sum = (sum ^ block[k]) * 0x100000001b3ull;
			}
		}
	}

	/* One PAGED_WRITE per layer, as a model would produce them; each carries its layer's imm.
	 */
	double t0 = now_ms();
	for (uint32_t i = 0; i < kv->blocks; i++) {
		src_pages[i] = i;
	}
	for (uint32_t layer = 0; layer < kv->layers; layer++) {
		for (uint32_t i = 0; i < kv->blocks; i++) {
			dst_pages[i] = block_table(kv, layer, i);
		}
		struct rdmax_job job = {
			.id = layer,
			.op = RDMAX_OP_PAGED_WRITE,
			.flags = RDMAX_JOB_IMM,
			.imm = KV_IMM_BASE + layer,
			.local = cache,
			.remote = &peer,
		};
		job.u.paged.page_len = kv->block_bytes;
		job.u.paged.local_pages = (struct rdmax_pages){
			.offset = layer * layer_bytes, .indices = src_pages, .count = kv->blocks};
		job.u.paged.remote_pages = (struct rdmax_pages){.offset = layer * 2 * layer_bytes,
								.indices = dst_pages,
								.count = kv->blocks};
		/* The library encodes the lists at once: the arrays can be reused for the next
		 * layer. */
		ret = rdmax_submit(client, &job, 1);
		if (ret < 0) {
			return fail("rdmax_submit", ret);
		}
	}
	for (uint32_t layer = 0; layer < kv->layers; layer++) {
		ret = rdmax_wait_job(client, layer, TIMEOUT_MS);
		if (ret < 0) {
			return fail("layer push", ret);
		}
	}
	double ms = now_ms() - t0;
	printf("prefill: pushed %u layers x %u blocks of %" PRIu64 " bytes in %.1f ms (%.2f GB/s), "
	       "checksum %016" PRIx64 "\n",
	       kv->layers, kv->blocks, kv->block_bytes, ms,
	       (double)kv->layers * layer_bytes / (ms * 1e6), sum);
	rdmax_client_close(client);
	free(src_pages);
	free(dst_pages);
	return 0;
}

static void usage(FILE *out)
{
	fprintf(out, "Usage: kv_cache_push decode|prefill --socket PATH --desc FILE "
		     "[--layers N] [--blocks N] [--block-bytes N]\n");
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"socket", required_argument, NULL, 's'},
		{"desc", required_argument, NULL, 'd'},
		{"layers", required_argument, NULL, 'l'},
		{"blocks", required_argument, NULL, 'b'},
		{"block-bytes", required_argument, NULL, 'B'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct kv kv = {.layers = 8, .blocks = 256, .block_bytes = 16384};
	const char *socket_path = NULL, *desc_path = NULL;
	int opt;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "s:d:l:b:B:h", options, NULL)) != -1) {
		switch (opt) {
		case 's':
			socket_path = optarg;
			break;
		case 'd':
			desc_path = optarg;
			break;
		case 'l':
			kv.layers = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'b':
			kv.blocks = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'B':
			kv.block_bytes = strtoull(optarg, NULL, 0);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!desc_path || kv.layers == 0 || kv.blocks == 0 || kv.block_bytes == 0) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "decode") == 0) {
		return run_decode(socket_path, desc_path, &kv);
	}
	if (strcmp(argv[1], "prefill") == 0) {
		return run_prefill(socket_path, desc_path, &kv);
	}
	usage(stderr);
	return 2;
}
