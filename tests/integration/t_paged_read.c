/* SPDX-License-Identifier: MIT */
/*
 * Case "paged_read": PAGED_READ end to end over real daemons, the way a
 * decode worker pulls KV-cache blocks from a prefill worker. Thousands of
 * random blocks read from a strided remote layout (with a head-slice offset
 * inside each block) into random local pages equal a model built page by page
 * and leave unlisted pages zero; contiguous pages coalesce; one Submit of one
 * PAGED_READ per layer (K and V of several layers, the same block ids)
 * lands every layer byte for byte; full 4 MiB frames of 256 pages each way
 * land every byte; bad page lists and a region without remote read access are
 * refused by name.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void expect_ok(struct rdmax_client *c, const struct rdmax_job *job, uint64_t bytes)
{
	struct rdmax_event ev = itest_run_job(c, job, 60000);
	ck_assert_msg(ev.status == 0, "job %" PRIu64 " failed: %s ('%s')", job->id,
		      rdmax_err_name(ev.status), ev.reason);
	ck_assert_uint_eq(ev.bytes, bytes);
}

static struct rdmax_job paged_read(uint64_t id, struct rdmax_region *local,
				   const struct rdmax_desc *remote, uint64_t page_len)
{
	struct rdmax_job job = itest_job(id, RDMAX_OP_PAGED_READ, local, 0, remote, 0, 0);
	job.u.paged.page_len = page_len;
	return job;
}

START_TEST(paged_read_many_pages)
{
	const size_t n = (size_t)itest_scaled(10000, 1000);
	const uint64_t page = 1024;
	/* Remote: blocks of 4 head slices (stride 4 pages), the reader takes slice 2. */
	const uint64_t r_stride = 4 * page, r_off = 2 * page, r_len = 2 * n * r_stride;
	const uint64_t l_len = 2 * n * page;
	uint32_t *ri = malloc(2 * n * sizeof(*ri)), *li = malloc(2 * n * sizeof(*li));
	uint8_t *expect = calloc(1, l_len);
	ck_assert(ri && li && expect);

	struct itest_daemon *a = itest_daemon_new("prefill", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("decode", itest_addr_b());
	itest_daemon_set(b, "engine.chunk_bytes=65536");
	itest_daemon_set(b, "transport.tcp_chunk_bytes=65536");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *owner = itest_client(a, "prefill");
	struct rdmax_client *reader = itest_client(b, "decode");
	struct rdmax_region *src = itest_alloc(owner, r_len, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *dst = itest_alloc(reader, l_len, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc desc = itest_desc(src);
	itest_fill(itest_bytes(src), r_len, itest_seed());

	/* Job 1: n random remote blocks into n of 2n local pages, in random order. */
	itest_permute(ri, 2 * n, itest_seed() + 1);
	itest_permute(li, 2 * n, itest_seed() + 2);
	struct rdmax_job job = paged_read(1, dst, &desc, page);
	job.u.paged.remote_pages = (struct rdmax_pages){
		.offset = r_off, .stride = r_stride, .indices = ri, .count = n};
	job.u.paged.local_pages = (struct rdmax_pages){.indices = li, .count = n};
	uint64_t t0 = itest_now_ms();
	expect_ok(reader, &job, n * page);
	fprintf(stderr, "itest paged_read: %zu pages of %" PRIu64 " bytes in %" PRIu64 " ms\n", n,
		page, itest_now_ms() - t0);
	for (size_t i = 0; i < n; i++) {
		memcpy(expect + (uint64_t)li[i] * page,
		       itest_bytes(src) + r_off + (uint64_t)ri[i] * r_stride, page);
	}
	itest_assert_mem_eq(itest_bytes(dst), expect, l_len, "paged read of random pages");

	/* Job 2: remote pages contiguous (stride page_len) into the other local pages. */
	for (size_t i = 0; i < n; i++) {
		ri[i] = (uint32_t)i;
	}
	struct rdmax_job job2 = paged_read(2, dst, &desc, page);
	job2.u.paged.remote_pages = (struct rdmax_pages){.indices = ri, .count = n};
	job2.u.paged.local_pages = (struct rdmax_pages){.indices = li + n, .count = n};
	expect_ok(reader, &job2, n * page);
	for (size_t i = 0; i < n; i++) {
		memcpy(expect + (uint64_t)li[n + i] * page, itest_bytes(src) + i * page, page);
	}
	itest_assert_mem_eq(itest_bytes(dst), expect, l_len, "paged reads");

	itest_pair_end(owner, reader, a, b);
	free(ri);
	free(li);
	free(expect);
}
END_TEST

/* One Submit of one PAGED_READ per K and V of every layer, with the same block ids. */
START_TEST(paged_read_layers_in_one_submit)
{
	enum { LAYERS = 4, REGIONS = 2 * LAYERS, BLOCKS = 64, PULL = 24 };
	const uint64_t block = 4096, len = BLOCKS * block;
	uint32_t remote_ids[PULL], local_ids[PULL], perm[BLOCKS];
	struct rdmax_region *src[REGIONS], *dst[REGIONS];
	struct rdmax_desc desc[REGIONS];
	struct rdmax_job jobs[REGIONS];
	struct rdmax_event ev[REGIONS];

	struct itest_daemon *a = itest_daemon_new("prefill", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("decode", itest_addr_b());
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *owner = itest_client(a, "prefill");
	struct rdmax_client *reader = itest_client(b, "decode");
	itest_permute(perm, BLOCKS, itest_seed() + 3);
	memcpy(remote_ids, perm, sizeof(remote_ids));
	itest_permute(perm, BLOCKS, itest_seed() + 4);
	memcpy(local_ids, perm, sizeof(local_ids));
	for (int r = 0; r < REGIONS; r++) {
		src[r] = itest_alloc(owner, len, RDMAX_ACCESS_REMOTE_READ);
		dst[r] = itest_alloc(reader, len, RDMAX_ACCESS_LOCAL);
		desc[r] = itest_desc(src[r]);
		itest_fill(itest_bytes(src[r]), len, itest_seed() + 10 + (uint64_t)r);
		jobs[r] = paged_read(100 + (uint64_t)r, dst[r], &desc[r], block);
		jobs[r].u.paged.remote_pages =
			(struct rdmax_pages){.indices = remote_ids, .count = PULL};
		jobs[r].u.paged.local_pages =
			(struct rdmax_pages){.indices = local_ids, .count = PULL};
	}
	ck_assert_int_eq(rdmax_submit(reader, jobs, REGIONS), 0);
	ck_assert_uint_eq(itest_collect(reader, ev, REGIONS, 60000, NULL), REGIONS);
	for (int i = 0; i < REGIONS; i++) {
		ck_assert_msg(ev[i].status == 0, "job %" PRIu64 ": %s ('%s')", ev[i].job_id,
			      rdmax_err_name(ev[i].status), ev[i].reason);
		ck_assert_uint_eq(ev[i].bytes, PULL * block);
	}
	uint8_t *zero = calloc(1, block);
	ck_assert(zero);
	for (int r = 0; r < REGIONS; r++) {
		uint8_t pulled[BLOCKS] = {0};
		for (int i = 0; i < PULL; i++) {
			itest_assert_mem_eq(itest_bytes(dst[r]) + local_ids[i] * block,
					    itest_bytes(src[r]) + remote_ids[i] * block, block,
					    "pulled block");
			pulled[local_ids[i]] = 1;
		}
		for (int p = 0; p < BLOCKS; p++) {
			if (!pulled[p]) {
				itest_assert_mem_eq(itest_bytes(dst[r]) + p * block, zero, block,
						    "block not pulled");
			}
		}
	}
	free(zero);
	itest_pair_end(owner, reader, a, b);
}
END_TEST

/*
 * With the daemons' default chunk sizes: a PAGED_WRITE of 512 scattered 16 KiB
 * pages and a PAGED_READ of them back into other scattered pages. Over TCP
 * that is two 4 MiB frames of 256 segments each way (transport.tcp_chunk_bytes),
 * sent in calls of up to 512 iovecs that the socket may cut anywhere and
 * received 256 segments per recvmsg(): every byte lands where its page says.
 */
START_TEST(paged_full_frames)
{
	enum { PAGES = 512, POOL = 2 * PAGES };
	const uint64_t page = 16 * KiB, len = POOL * page;
	uint32_t *src_ids = malloc(POOL * sizeof(uint32_t)),
		 *mid_ids = malloc(POOL * sizeof(uint32_t));
	uint32_t *back_ids = malloc(POOL * sizeof(uint32_t));
	ck_assert(src_ids && mid_ids && back_ids);
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;
	itest_pair_start(&a, &b, &ca, "prefill", &cb, "decode");
	struct rdmax_region *src = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *back = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *mid =
		itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_desc desc = itest_desc(mid);
	itest_fill(itest_bytes(src), len, itest_seed() + 20);
	itest_permute(src_ids, POOL, itest_seed() + 21);
	itest_permute(mid_ids, POOL, itest_seed() + 22);
	itest_permute(back_ids, POOL, itest_seed() + 23);

	struct rdmax_job w = itest_job(30, RDMAX_OP_PAGED_WRITE, src, 0, &desc, 0, 0);
	w.u.paged.page_len = page;
	w.u.paged.local_pages = (struct rdmax_pages){.indices = src_ids, .count = PAGES};
	w.u.paged.remote_pages = (struct rdmax_pages){.indices = mid_ids, .count = PAGES};
	expect_ok(ca, &w, PAGES * page);
	struct rdmax_job r = paged_read(31, back, &desc, page);
	r.u.paged.remote_pages = (struct rdmax_pages){.indices = mid_ids, .count = PAGES};
	r.u.paged.local_pages = (struct rdmax_pages){.indices = back_ids, .count = PAGES};
	expect_ok(ca, &r, PAGES * page);
	for (size_t i = 0; i < PAGES; i++) {
		itest_assert_mem_eq(itest_bytes(mid) + (uint64_t)mid_ids[i] * page,
				    itest_bytes(src) + (uint64_t)src_ids[i] * page, page,
				    "written page");
		itest_assert_mem_eq(itest_bytes(back) + (uint64_t)back_ids[i] * page,
				    itest_bytes(src) + (uint64_t)src_ids[i] * page, page,
				    "read page");
	}
	itest_pair_end(ca, cb, a, b);
	free(src_ids);
	free(mid_ids);
	free(back_ids);
}
END_TEST

START_TEST(paged_read_errors)
{
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;
	itest_pair_start(&a, &b, &ca, "owner", &cb, "reader");
	struct rdmax_region *src = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *wo = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *dst = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc desc = itest_desc(src), wo_desc = itest_desc(wo);
	const uint32_t ok[] = {0, 1, 2}, dup[] = {5, 9, 5}, far[] = {0, 1, 16}, same[] = {3, 3, 3};
	struct rdmax_event ev;

	/* Local pages are the destination: they must not repeat. */
	struct rdmax_job job = paged_read(10, dst, &desc, 4096);
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = ok, .count = 3};
	job.u.paged.local_pages = (struct rdmax_pages){.indices = dup, .count = 3};
	ck_assert_int_eq(rdmax_submit(cb, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(cb, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_msg(
		strstr(ev.reason, "destination page 5 is listed twice (list entries 0 and 2)"),
		"reason: '%s'", ev.reason);

	/* A remote page past the end of the remote region. */
	job.id = 11;
	job.u.paged.local_pages.indices = ok;
	job.u.paged.remote_pages.indices = far;
	ck_assert_int_eq(rdmax_submit(cb, &job, 1), 0);
	ck_assert_uint_eq(itest_collect(cb, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_OUT_OF_RANGE);
	ck_assert_msg(strstr(ev.reason, "source page 16 (list entry 2)") &&
			      strstr(ev.reason, "remote region"),
		      "reason: '%s'", ev.reason);

	/* Lists of different lengths, page_len 0. */
	job.id = 12;
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = ok, .count = 2};
	itest_expect_job_error(cb, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	job.id = 13;
	job.u.paged.remote_pages.count = 3;
	job.u.paged.page_len = 0;
	itest_expect_job_error(cb, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	/* PAGED_READ takes no imm: the library refuses it. */
	job.id = 14;
	job.u.paged.page_len = 4096;
	job.flags = RDMAX_JOB_IMM;
	itest_assert_err(rdmax_submit(cb, &job, 1), RDMAX_E_INVALID_ARGUMENT);
	job.flags = 0;

	/* The owner's region without REMOTE_READ: refused there, nothing lands. */
	job.id = 15;
	job.remote = &wo_desc;
	itest_fill(itest_bytes(wo), 64 * KiB, 5);
	itest_expect_job_error(cb, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	uint8_t *zero = calloc(1, 64 * KiB);
	ck_assert(zero);
	itest_assert_mem_eq(itest_bytes(dst), zero, 64 * KiB, "refused read");
	free(zero);

	/* A remote page read into several local pages is fine. */
	job.id = 16;
	job.remote = &desc;
	job.u.paged.remote_pages.indices = same;
	itest_fill(itest_bytes(src), 64 * KiB, 6);
	expect_ok(cb, &job, 3 * 4096);
	for (int i = 0; i < 3; i++) {
		itest_assert_mem_eq(itest_bytes(dst) + i * 4096, itest_bytes(src) + 3 * 4096, 4096,
				    "repeated remote page");
	}

	itest_pair_end(ca, cb, a, b);
}
END_TEST

TCase *itest_tcase_paged_read(void)
{
	TCase *tc = tcase_create("paged_read");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, paged_read_many_pages);
	tcase_add_test(tc, paged_read_layers_in_one_submit);
	tcase_add_test(tc, paged_full_frames);
	tcase_add_test(tc, paged_read_errors);
	return tc;
}
