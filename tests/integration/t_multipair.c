/* SPDX-License-Identifier: MIT */
/*
 * Case "multipair": paged jobs that carry several region pairs (every layer's
 * K and V of a KV cache, the same block ids) as one job. PAGED_WRITE and
 * PAGED_READ of random, non-contiguous blocks over 8 pairs land in every
 * pair byte for byte with one completion whose bytes are the sum and one
 * imm; pages not listed stay zero. A bad pair k (a malformed descriptor, a
 * region on another node, a region too short, too many pairs) is refused by
 * name before any byte moves.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { PAIRS = 8, BLOCKS = 96, MOVE = 40 };

/* Two daemons, a prefill and a decode client, PAIRS regions on each side. */
struct fixture {
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;
	struct rdmax_region *ra[PAIRS], *rb[PAIRS];
	struct rdmax_desc da[PAIRS], db[PAIRS];
	struct rdmax_region_pair pairs[PAIRS - 1];
	uint32_t a_ids[MOVE], b_ids[MOVE];
	uint64_t block, len;
};

/* Start d with env_old=1 set (NULL: none), a release without some TCP frame. */
static void start_as_old(struct itest_daemon *d, const char *env_old)
{
	if (env_old) {
		ck_assert_int_eq(setenv(env_old, "1", 1), 0);
	}
	itest_daemon_start(d);
	if (env_old) {
		unsetenv(env_old);
	}
}

/*
 * old_a, old_b: the prefill (decode) daemon behaves like a release without
 * WRITE_SEGS ("RDMAXD_TEST_NO_WRITE_SEGS") or READ_SEGS
 * ("RDMAXD_TEST_NO_READ_SEGS"); NULL: this release.
 */
static void fixture_start(struct fixture *f, uint64_t block, const char *old_a, const char *old_b)
{
	uint32_t perm[BLOCKS];

	memset(f, 0, sizeof(*f));
	f->block = block;
	f->len = BLOCKS * block;
	f->a = itest_daemon_new("prefill", itest_addr_a());
	f->b = itest_daemon_new("decode", itest_addr_b());
	/* Small chunks: each pair's pages travel as several xfers. */
	itest_daemon_set(f->a, "engine.chunk_bytes=65536");
	itest_daemon_set(f->a, "transport.tcp_chunk_bytes=65536");
	itest_daemon_set(f->b, "engine.chunk_bytes=65536");
	itest_daemon_set(f->b, "transport.tcp_chunk_bytes=65536");
	start_as_old(f->a, old_a);
	start_as_old(f->b, old_b);
	f->ca = itest_client(f->a, "prefill");
	f->cb = itest_client(f->b, "decode");
	ck_assert_uint_eq(rdmax_client_info(f->ca)->max_paged_pairs, RDMAX_PAGED_PAIRS_MAX);
	for (int r = 0; r < PAIRS; r++) {
		f->ra[r] = itest_alloc(f->ca, f->len,
				       RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE);
		f->rb[r] = itest_alloc(f->cb, f->len,
				       RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE);
		f->da[r] = itest_desc(f->ra[r]);
		f->db[r] = itest_desc(f->rb[r]);
	}
	/* Non-contiguous random blocks on both sides (some neighbours coalesce). */
	itest_permute(perm, BLOCKS, itest_seed() + 21);
	memcpy(f->a_ids, perm, sizeof(f->a_ids));
	itest_permute(perm, BLOCKS, itest_seed() + 22);
	memcpy(f->b_ids, perm, sizeof(f->b_ids));
}

static void fixture_stop(struct fixture *f)
{
	rdmax_client_close(f->ca);
	rdmax_client_close(f->cb);
	itest_daemon_stop(f->a);
	itest_daemon_stop(f->b);
	itest_daemon_free(f->a);
	itest_daemon_free(f->b);
}

/* Region r on `to` equals `from`'s blocks at the moved ids, zero elsewhere. */
static void check_moved(const struct fixture *f, struct rdmax_region *const *from,
			const uint32_t *from_ids, struct rdmax_region *const *to,
			const uint32_t *to_ids)
{
	uint8_t *zero = calloc(1, f->block);
	ck_assert(zero);
	for (int r = 0; r < PAIRS; r++) {
		uint8_t moved[BLOCKS] = {0};
		for (int i = 0; i < MOVE; i++) {
			itest_assert_mem_eq(itest_bytes(to[r]) + to_ids[i] * f->block,
					    itest_bytes(from[r]) + from_ids[i] * f->block, f->block,
					    "moved block");
			moved[to_ids[i]] = 1;
		}
		for (int p = 0; p < BLOCKS; p++) {
			if (!moved[p]) {
				itest_assert_mem_eq(itest_bytes(to[r]) + p * f->block, zero,
						    f->block, "block not listed");
			}
		}
	}
	free(zero);
}

static void assert_untouched(const struct fixture *f, struct rdmax_region *const *regions)
{
	uint8_t *zero = calloc(1, f->len);
	ck_assert(zero);
	for (int r = 0; r < PAIRS; r++) {
		itest_assert_mem_eq(itest_bytes(regions[r]), zero, f->len, "refused job");
	}
	free(zero);
}

static struct rdmax_job paged(const struct fixture *f, uint64_t id, enum rdmax_op op,
			      struct rdmax_region *const *local, const struct rdmax_desc *remote,
			      const uint32_t *local_ids, const uint32_t *remote_ids,
			      struct rdmax_region_pair *pairs)
{
	struct rdmax_job job = itest_job(id, op, local[0], 0, &remote[0], 0, 0);
	job.u.paged.page_len = f->block;
	job.u.paged.local_pages = (struct rdmax_pages){.indices = local_ids, .count = MOVE};
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = remote_ids, .count = MOVE};
	for (int k = 1; k < PAIRS; k++) {
		pairs[k - 1] = (struct rdmax_region_pair){.local = local[k], .remote = &remote[k]};
	}
	job.pairs = pairs;
	job.n_pairs = PAIRS - 1;
	return job;
}

/* One PAGED_WRITE of every pair with an imm: one completion, the sum of bytes, one imm. */
static void write_all_pairs(struct fixture *f, uint64_t id, uint32_t imm, uint64_t seed)
{
	struct rdmax_event ev;

	for (int r = 0; r < PAIRS; r++) {
		itest_fill(itest_bytes(f->ra[r]), f->len, seed + (uint64_t)r);
	}
	ck_assert_int_eq(rdmax_expect_imm(f->cb, imm, 1), 0);
	struct rdmax_job job =
		paged(f, id, RDMAX_OP_PAGED_WRITE, f->ra, f->db, f->a_ids, f->b_ids, f->pairs);
	job.flags = RDMAX_JOB_IMM;
	job.imm = imm;
	ck_assert_int_eq(rdmax_submit(f->ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(f->ca, &ev, 1, 60000, NULL), 1);
	ck_assert_msg(ev.status == 0, "multi-pair write: %s ('%s')", rdmax_err_name(ev.status),
		      ev.reason);
	ck_assert_uint_eq(ev.bytes, (uint64_t)PAIRS * MOVE * f->block);
	/* One imm for the whole job, counted once every pair landed. */
	ck_assert_int_eq(rdmax_wait_imm(f->cb, imm, 10000), 0);
	check_moved(f, f->ra, f->a_ids, f->rb, f->b_ids);
	itest_assert_quiet(f->cb, 100);
}

START_TEST(multipair_write)
{
	struct fixture f;

	fixture_start(&f, 16 * KiB, NULL, NULL);
	write_all_pairs(&f, 1, 77, itest_seed() + 30);
	fixture_stop(&f);
}
END_TEST

/* One PAGED_READ of every pair: the decode side pulls the prefill side's blocks. */
static void read_all_pairs(struct fixture *f, uint64_t id, uint64_t seed)
{
	for (int r = 0; r < PAIRS; r++) {
		itest_fill(itest_bytes(f->ra[r]), f->len, seed + (uint64_t)r);
	}
	struct rdmax_job job =
		paged(f, id, RDMAX_OP_PAGED_READ, f->rb, f->da, f->b_ids, f->a_ids, f->pairs);
	struct rdmax_event ev = itest_run_job(f->cb, &job, 60000);
	ck_assert_msg(ev.status == 0, "multi-pair read: %s ('%s')", rdmax_err_name(ev.status),
		      ev.reason);
	ck_assert_uint_eq(ev.bytes, (uint64_t)PAIRS * MOVE * f->block);
	check_moved(f, f->ra, f->a_ids, f->rb, f->b_ids);
}

START_TEST(multipair_read)
{
	struct fixture f;

	fixture_start(&f, 8 * KiB, NULL, NULL);
	read_all_pairs(&f, 2, itest_seed() + 40);
	fixture_stop(&f);
}
END_TEST

START_TEST(multipair_errors)
{
	struct rdmax_region_pair many[RDMAX_PAGED_PAIRS_MAX];
	struct fixture f;
	struct rdmax_event ev;

	fixture_start(&f, 4 * KiB, NULL, NULL);
	for (int r = 0; r < PAIRS; r++) {
		itest_fill(itest_bytes(f.ra[r]), f.len, itest_seed() + 50 + (uint64_t)r);
	}
	struct rdmax_job job =
		paged(&f, 10, RDMAX_OP_PAGED_WRITE, f.ra, f.db, f.a_ids, f.b_ids, f.pairs);

	/* Pair 3's descriptor cut short: malformed, refused by the daemon by pair. */
	struct rdmax_desc cut = f.db[3];
	cut.len /= 2;
	f.pairs[2].remote = &cut;
	ck_assert_int_eq(rdmax_submit(f.ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(f.ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_msg(strstr(ev.reason, "pair 3: remote descriptor is malformed"), "reason: '%s'",
		      ev.reason);
	ck_assert_uint_eq(ev.bytes, 0);

	/* Pair 5 names a region of the writer's own node: one node per job. */
	job.id = 11;
	f.pairs[2].remote = &f.db[3];
	f.pairs[4].remote = &f.da[5];
	ck_assert_int_eq(rdmax_submit(f.ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(f.ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_msg(strstr(ev.reason, "pair 5: its region is on node 'prefill'") &&
			      strstr(ev.reason, "one node"),
		      "reason: '%s'", ev.reason);

	/* Pair 7's remote region is shorter than the pages reach. */
	job.id = 12;
	f.pairs[4].remote = &f.db[5];
	struct rdmax_region *small = itest_alloc(f.cb, 4 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc small_desc = itest_desc(small);
	f.pairs[6].remote = &small_desc;
	ck_assert_int_eq(rdmax_submit(f.ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(f.ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_OUT_OF_RANGE);
	ck_assert_msg(strstr(ev.reason, "pair 7: the pages reach byte") &&
			      strstr(ev.reason, "remote region"),
		      "reason: '%s'", ev.reason);
	/* Nothing of any refused job moved. */
	assert_untouched(&f, f.rb);

	/* Pair 2's local region is shorter than the pages reach (a PAGED_READ into it). */
	struct rdmax_region *short_local = itest_alloc(f.cb, 4 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_job rd =
		paged(&f, 13, RDMAX_OP_PAGED_READ, f.rb, f.da, f.b_ids, f.a_ids, f.pairs);
	f.pairs[1].local = short_local;
	ck_assert_int_eq(rdmax_submit(f.cb, &rd, 1), 0);
	ck_assert_uint_eq(itest_collect(f.cb, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_OUT_OF_RANGE);
	ck_assert_msg(strstr(ev.reason, "pair 2: the pages reach byte") &&
			      strstr(ev.reason, "local region"),
		      "reason: '%s'", ev.reason);
	assert_untouched(&f, f.rb);

	/* Limits: the library refuses more pairs than the daemon announced, and pairs on
	 * another op. */
	for (size_t k = 0; k < RDMAX_PAGED_PAIRS_MAX; k++) {
		many[k] = (struct rdmax_region_pair){.local = f.ra[0], .remote = &f.db[0]};
	}
	job.id = 14;
	job.pairs = many;
	job.n_pairs = RDMAX_PAGED_PAIRS_MAX;
	itest_assert_err(rdmax_submit(f.ca, &job, 1), RDMAX_E_RESOURCE_EXHAUSTED);
	job.n_pairs = 0;
	itest_assert_err(rdmax_submit(f.ca, &job, 1), RDMAX_E_INVALID_ARGUMENT);
	struct rdmax_job wr = itest_job(15, RDMAX_OP_WRITE, f.ra[0], 0, &f.db[0], 0, 4096);
	wr.pairs = f.pairs;
	wr.n_pairs = 1;
	itest_assert_err(rdmax_submit(f.ca, &wr, 1), RDMAX_E_INVALID_ARGUMENT);

	/* Two pairs into the same destination region would overlap. */
	job = paged(&f, 16, RDMAX_OP_PAGED_WRITE, f.ra, f.db, f.a_ids, f.b_ids, f.pairs);
	f.pairs[1].local = f.ra[2]; /* a repeated source region is fine */
	f.pairs[3].remote = &f.db[0];
	ck_assert_int_eq(rdmax_submit(f.ca, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(f.ca, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_msg(strstr(ev.reason, "pair 4: its destination region is pair 0's"),
		      "reason: '%s'", ev.reason);
	assert_untouched(&f, f.rb);

	/* The most pairs a job may carry: 256 destination regions, one job. */
	static struct rdmax_region *dst[RDMAX_PAGED_PAIRS_MAX];
	static struct rdmax_desc dst_desc[RDMAX_PAGED_PAIRS_MAX];
	const uint32_t from[] = {7, 3}, to[] = {1, 0};
	for (size_t k = 0; k < RDMAX_PAGED_PAIRS_MAX; k++) {
		dst[k] = itest_alloc(f.cb, 2 * f.block, RDMAX_ACCESS_REMOTE_WRITE);
		dst_desc[k] = itest_desc(dst[k]);
		if (k > 0) {
			many[k - 1] = (struct rdmax_region_pair){.local = f.ra[k % PAIRS],
								 .remote = &dst_desc[k]};
		}
	}
	job.id = 17;
	job.remote = &dst_desc[0];
	job.pairs = many;
	job.n_pairs = RDMAX_PAGED_PAIRS_MAX - 1;
	job.u.paged.local_pages = (struct rdmax_pages){.indices = from, .count = 2};
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = to, .count = 2};
	ev = itest_run_job(f.ca, &job, 60000);
	ck_assert_msg(ev.status == 0, "%s ('%s')", rdmax_err_name(ev.status), ev.reason);
	ck_assert_uint_eq(ev.bytes, (uint64_t)RDMAX_PAGED_PAIRS_MAX * 2 * f.block);
	for (size_t k = 0; k < RDMAX_PAGED_PAIRS_MAX; k++) {
		for (int i = 0; i < 2; i++) {
			itest_assert_mem_eq(itest_bytes(dst[k]) + to[i] * f.block,
					    itest_bytes(f.ra[k % PAIRS]) + from[i] * f.block,
					    f.block, "block of pair k of 256");
		}
	}
	fixture_stop(&f);
}
END_TEST

/*
 * Against a peer that cuts grouped pages into one frame per run: pair 3's
 * remote region lacks the access `op` needs (made on `owner`), so a part in
 * the middle of a cut group is refused; the job fails once, by name. The
 * connection lives on: a plain paged job of the same op still lands.
 */
static void cut_part_refused(struct fixture *f, enum rdmax_op op, const char *why)
{
	bool write = op == RDMAX_OP_PAGED_WRITE;
	struct rdmax_client *c = write ? f->ca : f->cb;
	struct rdmax_region *const *local = write ? f->ra : f->rb;
	const struct rdmax_desc *remote = write ? f->db : f->da;
	const uint32_t *local_ids = write ? f->a_ids : f->b_ids;
	const uint32_t *remote_ids = write ? f->b_ids : f->a_ids;
	struct rdmax_region *bad =
		itest_alloc(write ? f->cb : f->ca, f->len,
			    write ? RDMAX_ACCESS_REMOTE_READ : RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc bad_desc = itest_desc(bad);
	struct rdmax_event ev;

	struct rdmax_job job = paged(f, 20, op, local, remote, local_ids, remote_ids, f->pairs);
	f->pairs[3].remote = &bad_desc;
	ck_assert_int_eq(rdmax_submit(c, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(c, &ev, 1, 60000, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_REMOTE_ACCESS);
	ck_assert_msg(strstr(ev.reason, why), "reason: '%s'", ev.reason);
	itest_assert_quiet(c, 200);

	job = paged(f, 21, op, local, remote, local_ids, remote_ids, f->pairs);
	job.n_pairs = 0;
	job.pairs = NULL;
	memset(itest_bytes(f->rb[0]), 0, f->len); /* both ops land in the decode side's regions */
	ev = itest_run_job(c, &job, 60000);
	ck_assert_msg(ev.status == 0, "%s ('%s')", rdmax_err_name(ev.status), ev.reason);
	for (int i = 0; i < MOVE; i++) {
		itest_assert_mem_eq(itest_bytes(f->rb[0]) + f->b_ids[i] * f->block,
				    itest_bytes(f->ra[0]) + f->a_ids[i] * f->block, f->block,
				    "block after the refusal");
	}
}

/*
 * A peer that predates WRITE_SEGS (it closes the connection on one) does not
 * announce them in its HELLO: the sender cuts its grouped pages into WRITEs.
 */
START_TEST(multipair_write_to_peer_without_segs)
{
	struct fixture f;

	fixture_start(&f, 16 * KiB, NULL, "RDMAXD_TEST_NO_WRITE_SEGS");
	write_all_pairs(&f, 1, 78, itest_seed() + 60);

	cut_part_refused(&f, RDMAX_OP_PAGED_WRITE, "not registered for remote write");
	fixture_stop(&f);
}
END_TEST

/*
 * A peer that predates READ_SEGS does not announce them in its HELLO: the
 * reader cuts its grouped pages into READ_REQs, each answer landing in its
 * own local page.
 */
START_TEST(multipair_read_from_peer_without_read_segs)
{
	struct fixture f;

	fixture_start(&f, 16 * KiB, "RDMAXD_TEST_NO_READ_SEGS", NULL);
	read_all_pairs(&f, 2, itest_seed() + 70);
	cut_part_refused(&f, RDMAX_OP_PAGED_READ, "not registered for remote read");
	fixture_stop(&f);
}
END_TEST

TCase *itest_tcase_multipair(void)
{
	TCase *tc = tcase_create("multipair");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, multipair_write);
	tcase_add_test(tc, multipair_read);
	tcase_add_test(tc, multipair_errors);
	ITEST_ADD_TEST_IF(tc, multipair_write_to_peer_without_segs,
			  strcmp(itest_transport(), "tcp") == 0, "WRITE_SEGS is a TCP frame");
	ITEST_ADD_TEST_IF(tc, multipair_read_from_peer_without_read_segs,
			  strcmp(itest_transport(), "tcp") == 0, "READ_SEGS is a TCP frame");
	return tc;
}
