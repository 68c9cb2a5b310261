/* SPDX-License-Identifier: MIT */
/*
 * moe_dispatch: the all-to-all of a mixture-of-experts layer. Each of N
 * ranks (one process per node) routes its tokens to the N experts: one
 * SCATTER sends rank r's tokens for expert e into slot r of rank e's
 * receive buffer, then one BARRIER tells every rank that r is done. A rank
 * expects N barrier arrivals per round; when its ExpectImm fires, all N
 * senders' tokens are in its buffer.
 *
 *   moe_dispatch --socket PATH --dir DIR --rank R --world N
 *                [--rounds K] [--max-tokens T] [--token-bytes B]
 *
 * Ranks find each other through descriptor files DIR/rank-<r>.desc. They
 * put all ranks (themselves included) in one peer group, used by both the
 * scatter (destination = peer_index) and the barrier. Token counts vary per
 * (source, expert, round), as a router's would. The receive buffer has two
 * halves used in alternate rounds: a fast rank may already dispatch round
 * k+1 while a slow one still reads round k, but it cannot get further before
 * the slow one reaches barrier k+1. Uses only rdmax.h.
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

#define MOE_IMM_BASE 0x30E00000u /* + round */
#define MAX_WORLD    64
#define TIMEOUT_MS   60000

struct moe {
	uint32_t rank;
	uint32_t world;
	uint32_t rounds;
	uint32_t max_tokens;
	uint64_t token_bytes;
	uint64_t slot_bytes; /* max_tokens * token_bytes */
};

static int fail(uint32_t rank, const char *what, int err)
{
	fprintf(stderr, "moe_dispatch[%u]: %s failed: %s\n", rank, what, rdmax_strerror(err));
	return 1;
}

/* Tokens source s routes to expert e in a round: 1..max_tokens. */
static uint32_t tokens(const struct moe *m, uint32_t s, uint32_t e, uint32_t round)
{
	return 1 + (s * 7 + e * 3 + round * 5) % m->max_tokens;
}

/* Token t from source s for expert e: both sides compute it. */
static void token(uint8_t *buf, uint64_t len, uint32_t s, uint32_t e, uint32_t round, uint32_t t)
{
	uint64_t x = ((uint64_t)s << 48 | (uint64_t)e << 32 | (uint64_t)round << 16 | t) *
			     0x9e3779b97f4a7c15ull +
		     1;
	for (uint64_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
}

static int publish(const char *dir, uint32_t rank, const struct rdmax_desc *desc)
{
	char path[4096], tmp[4200];
	snprintf(path, sizeof(path), "%s/rank-%u.desc", dir, rank);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "wb");
	if (!f || fwrite(desc->bytes, 1, desc->len, f) != desc->len || fclose(f) != 0 ||
	    rename(tmp, path) != 0) {
		return -errno;
	}
	return 0;
}

static int lookup(const char *dir, uint32_t rank, struct rdmax_desc *ret_desc)
{
	char path[4096];
	uint8_t buf[RDMAX_DESC_MAX];

	snprintf(path, sizeof(path), "%s/rank-%u.desc", dir, rank);
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

static int run(const char *socket_path, const char *dir, const struct moe *m)
{
	struct rdmax_desc descs[MAX_WORLD];
	struct rdmax_scatter_dest dests[MAX_WORLD];
	struct rdmax_peer_group *group;
	struct rdmax_client *client;
	struct rdmax_region *send_buf, *recv_buf;
	char name[64];
	int ret;

	snprintf(name, sizeof(name), "moe-rank-%u", m->rank);
	ret = rdmax_client_open(socket_path, name, &client);
	if (ret < 0) {
		return fail(m->rank, "rdmax_client_open", ret);
	}
	/* Slot e of send_buf: tokens for expert e. Slot s of a recv_buf half: tokens from rank s.
	 */
	uint64_t half = m->world * m->slot_bytes;
	ret = rdmax_region_alloc_host(client, half, RDMAX_ACCESS_LOCAL, &send_buf);
	if (ret == 0) {
		ret = rdmax_region_alloc_host(client, 2 * half, RDMAX_ACCESS_REMOTE_WRITE,
					      &recv_buf);
	}
	if (ret < 0) {
		return fail(m->rank, "rdmax_region_alloc_host", ret);
	}
	rdmax_region_desc(recv_buf, &descs[m->rank]);
	ret = publish(dir, m->rank, &descs[m->rank]);
	if (ret < 0) {
		return fail(m->rank, "writing the descriptor file", ret);
	}
	for (uint32_t r = 0; r < m->world; r++) {
		ret = r == m->rank ? 0 : lookup(dir, r, &descs[r]);
		if (ret < 0) {
			return fail(m->rank, "reading a peer's descriptor", ret);
		}
	}
	ret = rdmax_peer_group_create(client, descs, m->world, &group);
	if (ret < 0) {
		return fail(m->rank, "rdmax_peer_group_create", ret);
	}

	uint8_t *out = rdmax_region_addr(send_buf);
	const uint8_t *in = rdmax_region_addr(recv_buf);
	uint8_t *expect = malloc(m->token_bytes);
	if (!expect) {
		return fail(m->rank, "malloc", -ENOMEM);
	}
	for (uint32_t round = 0; round < m->rounds; round++) {
		uint32_t imm = MOE_IMM_BASE + round;
		uint64_t base = (round & 1) * half;
		/* Peers may already have arrived: landings before the claim are kept. */
		ret = rdmax_expect_imm(client, imm, m->world);
		if (ret < 0) {
			return fail(m->rank, "rdmax_expect_imm", ret);
		}
		for (uint32_t e = 0; e < m->world; e++) {
			uint32_t n = tokens(m, m->rank, e, round);
			for (uint32_t t = 0; t < n; t++) {
				token(out + e * m->slot_bytes + t * m->token_bytes, m->token_bytes,
				      m->rank, e, round, t);
			}
			dests[e] = (struct rdmax_scatter_dest){
				.peer_index = e,
				.remote_offset = base + m->rank * m->slot_bytes,
				.local_offset = e * m->slot_bytes,
				.length = n * m->token_bytes,
			};
		}
		/* Dispatch; the barrier only once every byte landed, so it never overtakes the
		 * data. */
		struct rdmax_job scatter = {
			.id = 2 * (uint64_t)round + 1, .op = RDMAX_OP_SCATTER, .local = send_buf};
		scatter.u.scatter.dests = dests;
		scatter.u.scatter.count = m->world;
		scatter.u.scatter.group = group;
		ret = rdmax_submit(client, &scatter, 1);
		if (ret == 0) {
			ret = rdmax_wait_job(client, scatter.id, TIMEOUT_MS);
		}
		if (ret < 0) {
			return fail(m->rank, "scatter", ret);
		}
		struct rdmax_job barrier = {
			.id = 2 * (uint64_t)round + 2, .op = RDMAX_OP_BARRIER, .imm = imm};
		barrier.u.barrier.group = group;
		ret = rdmax_submit(client, &barrier, 1);
		if (ret == 0) {
			ret = rdmax_wait_job(client, barrier.id, TIMEOUT_MS);
		}
		if (ret < 0) {
			return fail(m->rank, "barrier", ret);
		}
		/* Every rank passed its barrier: every slot of recv_buf is complete. */
		ret = rdmax_wait_imm(client, imm, TIMEOUT_MS);
		if (ret < 0) {
			return fail(m->rank, "waiting for the barrier", ret);
		}
		uint32_t received = 0;
		for (uint32_t s = 0; s < m->world; s++) {
			uint32_t n = tokens(m, s, m->rank, round);
			for (uint32_t t = 0; t < n; t++) {
				token(expect, m->token_bytes, s, m->rank, round, t);
				if (memcmp(in + base + s * m->slot_bytes + t * m->token_bytes,
					   expect, m->token_bytes) != 0) {
					fprintf(stderr,
						"moe_dispatch[%u]: round %u token %u from rank %u "
						"differs\n",
						m->rank, round, t, s);
					return 1;
				}
			}
			received += n;
		}
		printf("moe_dispatch[%u]: round %u: %u tokens from %u ranks verified\n", m->rank,
		       round, received, m->world);
		fflush(stdout);
	}
	free(expect);
	rdmax_peer_group_destroy(client, group);
	rdmax_client_close(client);
	return 0;
}

static void usage(FILE *out)
{
	fprintf(out, "Usage: moe_dispatch --socket PATH --dir DIR --rank R --world N [--rounds K] "
		     "[--max-tokens T] [--token-bytes B]\n");
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"socket", required_argument, NULL, 's'},
		{"dir", required_argument, NULL, 'd'},
		{"rank", required_argument, NULL, 'r'},
		{"world", required_argument, NULL, 'w'},
		{"rounds", required_argument, NULL, 'k'},
		{"max-tokens", required_argument, NULL, 't'},
		{"token-bytes", required_argument, NULL, 'b'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct moe m = {.world = 0, .rounds = 3, .max_tokens = 64, .token_bytes = 4096};
	const char *socket_path = NULL, *dir = NULL;
	int opt;

	m.rank = UINT32_MAX;
	while ((opt = getopt_long(argc, argv, "s:d:r:w:k:t:b:h", options, NULL)) != -1) {
		switch (opt) {
		case 's':
			socket_path = optarg;
			break;
		case 'd':
			dir = optarg;
			break;
		case 'r':
			m.rank = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'w':
			m.world = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'k':
			m.rounds = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 't':
			m.max_tokens = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'b':
			m.token_bytes = strtoull(optarg, NULL, 0);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!dir || m.world == 0 || m.world > MAX_WORLD || m.rank >= m.world || m.max_tokens == 0 ||
	    m.token_bytes == 0) {
		usage(stderr);
		return 2;
	}
	m.slot_bytes = m.max_tokens * m.token_bytes;
	return run(socket_path, dir, &m);
}
