/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the job kinds beyond WRITE/READ (suite "planner_jobs"): the
 * page-list and scatter planner, mailboxes, peer groups, the MESSAGE frame
 * of the TCP wire format, and the engine's PAGED_WRITE, PAGED_READ, SCATTER, BARRIER and
 * SEND jobs driven through a fake transport that records xfers and completes
 * them when the test says so.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine.h"
#include "fake_transport.h"
#include "fixtures.h"
#include "mailbox.h"
#include "peer_group.h"
#include "planner.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "transport.h"
#include "wire.h"

Suite *planner_jobs_suite(void);

#define PAGE 4096u

static char g_why[RDMAX_MESSAGE_MAX];

#define assert_why_has(text)                                                                       \
	ck_assert_msg(strstr(g_why, (text)) != NULL, "reason '%s' lacks '%s'", g_why, (text))

/* ------------------------------------------------------------------ planner */

static int plan(uint64_t page_len, const uint32_t *si, const uint32_t *di, size_t n,
		uint64_t src_len, uint64_t dst_len, uint64_t max_run, struct plan_run **runs,
		size_t *n_runs)
{
	struct plan_pages src = {.indices = si, .count = n};
	struct plan_pages dst = {.indices = di, .count = n};
	g_why[0] = '\0';
	return planner_paged(page_len, &src, src_len, &dst, dst_len, max_run, runs, n_runs, g_why,
			     sizeof(g_why));
}

START_TEST(planner_coalesces_runs_on_both_sides)
{
	/* Pages 0-2 -> 10-12 are contiguous on both sides; 5-6 -> 3-4 too; 9 -> 20 alone. */
	const uint32_t si[] = {0, 1, 2, 5, 6, 9};
	const uint32_t di[] = {10, 11, 12, 3, 4, 20};
	struct plan_run *runs;
	size_t n;

	ck_assert_int_eq(plan(PAGE, si, di, 6, 16 * PAGE, 32 * PAGE, 1 << 20, &runs, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(runs[0].local_offset, 0);
	ck_assert_uint_eq(runs[0].remote_offset, 10 * PAGE);
	ck_assert_uint_eq(runs[0].length, 3 * PAGE);
	ck_assert_uint_eq(runs[1].local_offset, 5 * PAGE);
	ck_assert_uint_eq(runs[1].remote_offset, 3 * PAGE);
	ck_assert_uint_eq(runs[1].length, 2 * PAGE);
	ck_assert_uint_eq(runs[2].local_offset, 9 * PAGE);
	ck_assert_uint_eq(runs[2].remote_offset, 20 * PAGE);
	ck_assert_uint_eq(runs[2].length, PAGE);
	free(runs);

	/* Contiguous on one side only: no merge. */
	const uint32_t s2[] = {0, 1, 2};
	const uint32_t d2[] = {0, 2, 4};
	ck_assert_int_eq(plan(PAGE, s2, d2, 3, 16 * PAGE, 16 * PAGE, 1 << 20, &runs, &n), 0);
	ck_assert_uint_eq(n, 3);
	free(runs);
}
END_TEST

START_TEST(planner_caps_runs_at_max_run)
{
	uint32_t idx[8];
	struct plan_run *runs;
	size_t n;

	for (uint32_t i = 0; i < 8; i++) {
		idx[i] = i;
	}
	/* Runs stop at 3 pages: 3 + 3 + 2. */
	ck_assert_int_eq(plan(PAGE, idx, idx, 8, 8 * PAGE, 8 * PAGE, 3 * PAGE, &runs, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(runs[0].length, 3 * PAGE);
	ck_assert_uint_eq(runs[1].local_offset, 3 * PAGE);
	ck_assert_uint_eq(runs[1].length, 3 * PAGE);
	ck_assert_uint_eq(runs[2].local_offset, 6 * PAGE);
	ck_assert_uint_eq(runs[2].length, 2 * PAGE);
	free(runs);
	/* A page longer than max_run stays one run (the engine chunks it) and merges with nothing.
	 */
	ck_assert_int_eq(plan(4 * PAGE, idx, idx, 2, 8 * PAGE, 8 * PAGE, PAGE, &runs, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(runs[1].local_offset, 4 * PAGE);
	ck_assert_uint_eq(runs[1].length, 4 * PAGE);
	free(runs);
}
END_TEST

START_TEST(planner_offsets_and_strides)
{
	/* Source pages 4 KiB apart in an interleaved layout (stride 3 pages), offset 100. */
	const uint32_t si[] = {0, 1, 2};
	const uint32_t di[] = {0, 1, 2};
	struct plan_pages src = {.offset = 100, .stride = 3 * PAGE, .indices = si, .count = 3};
	struct plan_pages dst = {.offset = 7, .indices = di, .count = 3};
	struct plan_run *runs;
	size_t n;

	ck_assert_int_eq(planner_paged(PAGE, &src, 100 + 6 * PAGE + PAGE, &dst, 7 + 3 * PAGE,
				       1 << 20, &runs, &n, g_why, sizeof(g_why)),
			 0);
	ck_assert_uint_eq(n, 3); /* contiguous on the destination only */
	ck_assert_uint_eq(runs[2].local_offset, 100 + 6 * PAGE);
	ck_assert_uint_eq(runs[2].remote_offset, 7 + 2 * PAGE);
	free(runs);
	/* Stride equal to page_len and stride 0 mean the same: contiguous pages. */
	src.offset = 0;
	src.stride = PAGE;
	ck_assert_int_eq(planner_paged(PAGE, &src, 3 * PAGE, &dst, 7 + 3 * PAGE, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(runs[0].length, 3 * PAGE);
	free(runs);
}
END_TEST

START_TEST(planner_boundary_pages)
{
	const uint32_t last[] = {15};
	struct plan_run *runs;
	size_t n;

	/* The last page of each region fits exactly. */
	ck_assert_int_eq(plan(PAGE, last, last, 1, 16 * PAGE, 16 * PAGE, 1 << 20, &runs, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(runs[0].local_offset, 15 * PAGE);
	free(runs);
	/* One byte short on the source side. */
	const uint32_t s2[] = {0, 15};
	const uint32_t d2[] = {0, 1};
	ck_assert_int_eq(plan(PAGE, s2, d2, 2, 16 * PAGE - 1, 16 * PAGE, 1 << 20, &runs, &n),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("source page 15 (list entry 1)");
	assert_why_has("local region");
	/* And on the destination side. */
	ck_assert_int_eq(plan(PAGE, d2, s2, 2, 16 * PAGE, 16 * PAGE - 1, 1 << 20, &runs, &n),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("destination page 15 (list entry 1)");
	assert_why_has("remote region");
}
END_TEST

START_TEST(planner_rejects_bad_lists)
{
	const uint32_t a[] = {0, 1, 2, 3};
	const uint32_t dup[] = {4, 7, 1, 7};
	struct plan_pages src = {.indices = a, .count = 4}, dst = {.indices = a, .count = 4};
	struct plan_run *runs = (struct plan_run *)1;
	size_t n = 99;

	ck_assert_int_eq(plan(0, a, a, 4, 1 << 20, 1 << 20, 1 << 20, &runs, &n),
			 RDMAX_E_INVALID_ARGUMENT);
	assert_why_has("page_len is 0");
	ck_assert_int_eq(plan(PAGE, a, a, 4, 1 << 20, 1 << 20, 1 << 20, &runs, &n), 0);
	free(runs);

	dst.count = 3;
	ck_assert_int_eq(planner_paged(PAGE, &src, 1 << 20, &dst, 1 << 20, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 RDMAX_E_INVALID_ARGUMENT);
	assert_why_has("4 pages but the destination list has 3");
	dst.count = 4;

	src.stride = PAGE - 1;
	ck_assert_int_eq(planner_paged(PAGE, &src, 1 << 20, &dst, 1 << 20, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 RDMAX_E_INVALID_ARGUMENT);
	assert_why_has("source stride 4095 is smaller than page_len 4096");
	src.stride = 0;
	dst.stride = 100;
	ck_assert_int_eq(planner_paged(PAGE, &src, 1 << 20, &dst, 1 << 20, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 RDMAX_E_INVALID_ARGUMENT);
	assert_why_has("destination stride 100");
	dst.stride = 0;

	/* Overlapping destination pages: the same page twice. */
	ck_assert_int_eq(plan(PAGE, a, dup, 4, 1 << 20, 1 << 20, 1 << 20, &runs, &n),
			 RDMAX_E_INVALID_ARGUMENT);
	assert_why_has("destination page 7 is listed twice (list entries 1 and 3)");
	/* The same source page twice is fine (read twice). */
	ck_assert_int_eq(plan(PAGE, dup, a, 4, 1 << 20, 1 << 20, 1 << 20, &runs, &n), 0);
	ck_assert_uint_eq(n, 4);
	free(runs);

	/* Indices missing behind a count. */
	src.indices = NULL;
	ck_assert_int_eq(planner_paged(PAGE, &src, 1 << 20, &dst, 1 << 20, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 RDMAX_E_INVALID_ARGUMENT);
	/* Out-params untouched on failure. */
	ck_assert_uint_eq(n, 4);
}
END_TEST

START_TEST(planner_paged_read_sides)
{
	/* Local (destination) 10-11 <- remote (source) 0-1 merge; remote 0 may repeat. */
	const uint32_t li[] = {10, 11, 3}, ri[] = {0, 1, 0};
	struct plan_pages local = {.indices = li, .count = 3}, remote = {.indices = ri, .count = 3};
	struct plan_run *runs;
	size_t n;

	ck_assert_int_eq(planner_paged_read(PAGE, &local, 16 * PAGE, &remote, 2 * PAGE, 1 << 20,
					    &runs, &n, g_why, sizeof(g_why)),
			 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(runs[0].local_offset, 10 * PAGE);
	ck_assert_uint_eq(runs[0].remote_offset, 0);
	ck_assert_uint_eq(runs[0].length, 2 * PAGE);
	ck_assert_uint_eq(runs[1].local_offset, 3 * PAGE);
	ck_assert_uint_eq(runs[1].remote_offset, 0);
	free(runs);

	/* A repeated local page is a repeated destination. */
	const uint32_t dup[] = {4, 4, 5};
	local.indices = dup;
	ck_assert_int_eq(planner_paged_read(PAGE, &local, 16 * PAGE, &remote, 2 * PAGE, 1 << 20,
					    &runs, &n, g_why, sizeof(g_why)),
			 RDMAX_E_INVALID_ARGUMENT);
	assert_why_has("destination page 4 is listed twice");

	/* Out of range on each side names the side and the region. */
	const uint32_t far[] = {0, 1, 2};
	local.indices = li;
	remote.indices = far;
	ck_assert_int_eq(planner_paged_read(PAGE, &local, 16 * PAGE, &remote, 2 * PAGE, 1 << 20,
					    &runs, &n, g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("source page 2 (list entry 2)");
	assert_why_has("remote region");
	remote.indices = ri;
	ck_assert_int_eq(planner_paged_read(PAGE, &local, 11 * PAGE, &remote, 2 * PAGE, 1 << 20,
					    &runs, &n, g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("destination page 11 (list entry 1)");
	assert_why_has("local region");
}
END_TEST

START_TEST(planner_rejects_overflow)
{
	const uint32_t big[] = {UINT32_MAX};
	const uint32_t zero[] = {0};
	struct plan_pages src = {.stride = UINT64_C(1) << 40, .indices = big, .count = 1};
	struct plan_pages dst = {.indices = zero, .count = 1};
	struct plan_run *runs;
	size_t n;

	ck_assert_int_eq(planner_paged(PAGE, &src, UINT64_MAX, &dst, UINT64_MAX, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("source page 4294967295 (list entry 0)");
	assert_why_has("overflows");
	/* offset + position, and position + page_len. */
	src.stride = 0;
	src.indices = zero;
	src.offset = UINT64_MAX - 10;
	ck_assert_int_eq(planner_paged(PAGE, &src, UINT64_MAX, &dst, UINT64_MAX, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("overflows");
	src.offset = 0;
	dst.offset = UINT64_MAX - PAGE;
	dst.indices = big;
	ck_assert_int_eq(planner_paged(PAGE, &src, UINT64_MAX, &dst, UINT64_MAX, 1 << 20, &runs, &n,
				       g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("destination page 4294967295");
	/* A huge page_len against a small region is a plain range error. */
	ck_assert_int_eq(plan(UINT64_MAX, zero, zero, 1, 1 << 20, 1 << 20, 1 << 20, &runs, &n),
			 RDMAX_E_OUT_OF_RANGE);
}
END_TEST

START_TEST(planner_many_pages)
{
	const size_t count = 10000;
	uint32_t *si = malloc(count * sizeof(*si)), *di = malloc(count * sizeof(*di));
	struct plan_run *runs;
	size_t n;

	ck_assert(si && di);
	/* Reversed destination: nothing merges, order is kept. */
	for (size_t i = 0; i < count; i++) {
		si[i] = (uint32_t)i;
		di[i] = (uint32_t)(count - 1 - i);
	}
	ck_assert_int_eq(plan(64, si, di, count, count * 64, count * 64, 1 << 20, &runs, &n), 0);
	ck_assert_uint_eq(n, count);
	ck_assert_uint_eq(runs[0].remote_offset, (count - 1) * 64);
	ck_assert_uint_eq(runs[count - 1].remote_offset, 0);
	ck_assert_uint_eq(runs[count - 1].local_offset, (count - 1) * 64);
	free(runs);
	/* Identity: one run per max_run. */
	for (size_t i = 0; i < count; i++) {
		di[i] = (uint32_t)i;
	}
	ck_assert_int_eq(plan(64, si, di, count, count * 64, count * 64, 64 * 1000, &runs, &n), 0);
	ck_assert_uint_eq(n, 10);
	free(runs);
	/* Empty lists plan nothing. */
	ck_assert_int_eq(plan(64, si, di, 0, 0, 0, 1 << 20, &runs, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(runs);
	free(si);
	free(di);
}
END_TEST

START_TEST(planner_scatter_and_helpers)
{
	struct plan_dest d[3] = {
		{.local_offset = 0,
		 .remote_offset = 10,
		 .length = 100,
		 .remote_len = 110,
		 .dest = 0},
		{.local_offset = 100, .remote_offset = 0, .length = 0, .remote_len = 0, .dest = 1},
		{.local_offset = 900,
		 .remote_offset = 0,
		 .length = 100,
		 .remote_len = 100,
		 .dest = 2},
	};
	struct plan_run runs[3];

	ck_assert_int_eq(planner_scatter(d, 3, 1000, runs, g_why, sizeof(g_why)), 0);
	ck_assert_uint_eq(runs[0].remote_offset, 10);
	ck_assert_uint_eq(runs[2].local_offset, 900);
	ck_assert_uint_eq(runs[1].dest, 1);
	d[2].local_offset = 901;
	ck_assert_int_eq(planner_scatter(d, 3, 1000, runs, g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("destination 2: local range");
	d[2].local_offset = 900;
	d[0].remote_offset = 11;
	ck_assert_int_eq(planner_scatter(d, 3, 1000, runs, g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);
	assert_why_has("destination 0: remote range");
	d[0].remote_offset = UINT64_MAX;
	d[0].length = 2;
	ck_assert_int_eq(planner_scatter(d, 3, 1000, runs, g_why, sizeof(g_why)),
			 RDMAX_E_OUT_OF_RANGE);

	ck_assert_uint_eq(planner_run_xfers(0, 4096), 1);
	ck_assert_uint_eq(planner_run_xfers(4096, 4096), 1);
	ck_assert_uint_eq(planner_run_xfers(4097, 4096), 2);
	ck_assert_uint_eq(planner_run_xfers(UINT64_MAX, UINT64_MAX), 1);
	ck_assert_int_eq(planner_check_range(UINT64_MAX, 1, UINT64_MAX), RDMAX_E_OUT_OF_RANGE);
	ck_assert_int_eq(planner_check_range(10, 0, 10), 0);
}
END_TEST

/* ---------------------------------------------------------------- mailbox */

static int g_delivered;
static char g_last_name[MAILBOX_NAME_MAX + 1];
static char g_last_payload[64];
static char g_last_from[64];
static void *g_last_owner;
static int g_deliver_err;

static int record_deliver(void *owner, const char *name, const uint8_t *payload, size_t len,
			  const char *from_node)
{
	if (g_deliver_err) {
		return g_deliver_err;
	}
	g_delivered++;
	g_last_owner = owner;
	snprintf(g_last_name, sizeof(g_last_name), "%s", name);
	snprintf(g_last_payload, sizeof(g_last_payload), "%.*s", (int)len, (const char *)payload);
	snprintf(g_last_from, sizeof(g_last_from), "%s", from_node);
	return 0;
}

START_TEST(planner_pairs_repeat_runs_per_pair)
{
	const uint32_t si[] = {0, 1, 5}, di[] = {3, 4, 9};
	struct plan_run *runs, *rep;
	uint64_t local_end, remote_end;
	size_t n, n_rep;

	ck_assert_int_eq(plan(PAGE, si, di, 3, 16 * PAGE, 16 * PAGE, 1 << 20, &runs, &n), 0);
	ck_assert_uint_eq(n, 2);
	planner_extent(runs, n, &local_end, &remote_end);
	ck_assert_uint_eq(local_end, 6 * PAGE);
	ck_assert_uint_eq(remote_end, 10 * PAGE);
	planner_extent(NULL, 0, &local_end, &remote_end);
	ck_assert_uint_eq(local_end, 0);
	ck_assert_uint_eq(remote_end, 0);

	/* Pair-major: every run of pair 0, then of pair 1, ...; dest is the pair. */
	ck_assert_int_eq(planner_pairs(runs, n, 3, &rep, &n_rep), 0);
	ck_assert_uint_eq(n_rep, 6);
	for (size_t k = 0; k < 3; k++) {
		for (size_t i = 0; i < n; i++) {
			ck_assert_uint_eq(rep[k * n + i].dest, k);
			ck_assert_uint_eq(rep[k * n + i].local_offset, runs[i].local_offset);
			ck_assert_uint_eq(rep[k * n + i].remote_offset, runs[i].remote_offset);
			ck_assert_uint_eq(rep[k * n + i].length, runs[i].length);
		}
	}
	free(rep);
	ck_assert_int_eq(planner_pairs(runs, n, 0, &rep, &n_rep), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(planner_pairs(runs, SIZE_MAX / 2, 3, &rep, &n_rep),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(planner_pairs(NULL, 0, 5, &rep, &n_rep), 0);
	ck_assert_ptr_null(rep);
	ck_assert_uint_eq(n_rep, 0);
	free(runs);
}
END_TEST

/* Shorthands: open for owner in uid's namespace, deliver a short text. */
static uint32_t g_uid_open[3];

static int open_box(struct mailbox_table *t, void *owner, uint32_t uid, const char *name,
		    struct mailbox_ref *ret_ref)
{
	struct mailbox_ref ref;

	return mailbox_open(t, owner, uid, name, &g_uid_open[uid % 3], 1000,
			    ret_ref ? ret_ref : &ref);
}

static int deliver_text(struct mailbox_table *t, const char *scoped, uint64_t key, const char *text)
{
	return mailbox_deliver(t, scoped, key, (const uint8_t *)text, strlen(text), "n");
}

START_TEST(mailbox_open_close_deliver)
{
	struct mailbox_table t;
	struct mailbox_ref ra, rb, rc;
	int a, b, c;
	char name[80];

	g_delivered = 0;
	g_deliver_err = 0;
	memset(g_uid_open, 0, sizeof(g_uid_open));
	ck_assert_int_eq(mailbox_table_init(&t, record_deliver), 0);
	ck_assert_int_eq(open_box(&t, &a, 1000, "kv.layer-0", &ra), 0);
	ck_assert_str_eq(ra.scoped, "1000:kv.layer-0");
	ck_assert_uint_ne(ra.key, 0);
	ck_assert_int_eq(open_box(&t, &a, 1000, "kv.layer-0", NULL), RDMAX_E_ALREADY_EXISTS);
	/* Same uid, other client: the same namespace. */
	ck_assert_int_eq(open_box(&t, &b, 1000, "kv.layer-0", NULL), RDMAX_E_ALREADY_EXISTS);
	/* Another uid has a namespace of its own: the same name coexists. */
	ck_assert_int_eq(open_box(&t, &c, 1001, "kv.layer-0", &rc), 0);
	ck_assert_str_eq(rc.scoped, "1001:kv.layer-0");
	ck_assert_uint_ne(rc.key, ra.key);
	ck_assert_int_eq(open_box(&t, &b, 1000, "", NULL), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(open_box(&t, &b, 1000, "has space", NULL), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(open_box(&t, &b, 1000, "bad\x01", NULL), RDMAX_E_INVALID_ARGUMENT);
	memset(name, 'x', 65);
	name[65] = '\0';
	ck_assert_int_eq(open_box(&t, &b, 1000, name, NULL), RDMAX_E_INVALID_ARGUMENT);
	name[64] = '\0';
	ck_assert_int_eq(open_box(&t, &b, UINT32_MAX, name, &rb), 0);
	ck_assert_uint_eq(strlen(rb.scoped), MAILBOX_ADDR_NAME_MAX);

	ck_assert_int_eq(mailbox_deliver(&t, "1000:kv.layer-0", ra.key, (const uint8_t *)"hello", 5,
					 "node-a"),
			 0);
	ck_assert_int_eq(g_delivered, 1);
	ck_assert_ptr_eq(g_last_owner, &a);
	ck_assert_str_eq(g_last_name, "kv.layer-0");
	ck_assert_str_eq(g_last_payload, "hello");
	ck_assert_str_eq(g_last_from, "node-a");
	/* The other uid's mailbox of the same name gets its own messages only. */
	ck_assert_int_eq(deliver_text(&t, "1001:kv.layer-0", rc.key, "y"), 0);
	ck_assert_ptr_eq(g_last_owner, &c);
	/* A wrong key, another mailbox's key, no key, a bare name: all as if not open. */
	ck_assert_int_eq(deliver_text(&t, "1000:kv.layer-0", ra.key ^ 1, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(deliver_text(&t, "1000:kv.layer-0", rc.key, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(deliver_text(&t, "1000:kv.layer-0", 0, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(deliver_text(&t, "kv.layer-0", ra.key, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(g_delivered, 2);
	ck_assert_int_eq(deliver_text(&t, "nobody", 1, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(
		mailbox_deliver(&t, "1000:kv.layer-0", ra.key, NULL, MAILBOX_PAYLOAD_MAX + 1, "n"),
		RDMAX_E_INVALID_ARGUMENT);
	g_deliver_err = RDMAX_E_RESOURCE_EXHAUSTED;
	ck_assert_int_eq(deliver_text(&t, "1000:kv.layer-0", ra.key, "x"),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	g_deliver_err = 0;
	ck_assert_uint_eq(t.delivered, 2);
	ck_assert_uint_eq(t.refused, 6);

	/* Only the owner closes it, in its own namespace. */
	ck_assert_int_eq(mailbox_close(&t, &b, 1000, "kv.layer-0"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(mailbox_close(&t, &a, 1001, "kv.layer-0"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(mailbox_close(&t, &a, 1000, "kv.layer-0"), 0);
	ck_assert_int_eq(mailbox_close(&t, &a, 1000, "kv.layer-0"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(deliver_text(&t, "1000:kv.layer-0", ra.key, "x"), RDMAX_E_NOT_FOUND);
	/* The name is free again, under a new key: the old address stays refused. */
	ck_assert_int_eq(open_box(&t, &b, 1000, "kv.layer-0", &rb), 0);
	ck_assert_uint_ne(rb.key, ra.key);
	ck_assert_int_eq(deliver_text(&t, "1000:kv.layer-0", ra.key, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_uint_eq(t.count, 3);
	mailbox_table_fini(&t);
	ck_assert_int_eq(mailbox_deliver(NULL, "x", 1, NULL, 0, "n"), RDMAX_E_NOT_FOUND);
}
END_TEST

START_TEST(mailbox_limits_and_release)
{
	struct mailbox_table t;
	struct mailbox_ref ref;
	uint32_t uid_open = 0, other_open = 0;
	int a, b, c;
	char name[32];

	ck_assert_int_eq(mailbox_table_init(&t, record_deliver), 0);
	for (int i = 0; i < MAILBOX_MAX_PER_CLIENT; i++) {
		snprintf(name, sizeof(name), "a-%d", i);
		ck_assert_int_eq(mailbox_open(&t, &a, 7, name, &uid_open, 1000, &ref), 0);
	}
	ck_assert_int_eq(mailbox_open(&t, &a, 7, "one-more", &uid_open, 1000, &ref),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(mailbox_open(&t, &b, 7, "b-0", &uid_open, 1000, &ref), 0);
	struct mailbox_ref b0 = ref;
	ck_assert_uint_eq(t.count, MAILBOX_MAX_PER_CLIENT + 1);
	ck_assert_uint_eq(uid_open, MAILBOX_MAX_PER_CLIENT + 1);
	/* The uid's share: b may not go past it, a client of another uid still may. */
	ck_assert_int_eq(
		mailbox_open(&t, &b, 7, "b-1", &uid_open, MAILBOX_MAX_PER_CLIENT + 1, &ref),
		RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(mailbox_open(&t, &c, 8, "b-1", &other_open, 1, &ref), 0);
	ck_assert_int_eq(mailbox_open(&t, &c, 8, "c-1", &other_open, 1, &ref),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	mailbox_release_owner(&t, &a);
	ck_assert_uint_eq(t.count, 2);
	ck_assert_uint_eq(uid_open, 1);
	ck_assert_int_eq(deliver_text(&t, "7:a-3", 1, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(deliver_text(&t, "7:b-0", b0.key, "x"), 0);
	/* a may open again after leaving. */
	ck_assert_int_eq(mailbox_open(&t, &a, 7, "a-0", &uid_open, 1000, &ref), 0);
	mailbox_release_owner(&t, &b);
	mailbox_release_owner(&t, &b);
	mailbox_release_owner(&t, &c);
	ck_assert_uint_eq(t.count, 1);
	ck_assert_uint_eq(uid_open, 1);
	ck_assert_uint_eq(other_open, 0);
	mailbox_table_fini(&t);
}
END_TEST

/* ----------------------------------------------------------- fake transport */

static const struct transport_ops fake_tcp_ops = {
	.name = "tcp",
	FAKE_TRANSPORT_OPS,
	.send_message = fake_transport_send_message,
};

/* Like the verbs transport today: no send_message. */
static const struct transport_ops fake_verbs_ops = {
	.name = "verbs",
	FAKE_TRANSPORT_OPS,
};

struct done_rec {
	uint64_t job_id;
	int err;
	char message[RDMAX_MESSAGE_MAX];
	uint64_t bytes;
};

static struct done_rec g_done[64];
static int g_n_done;

static void on_complete(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes)
{
	ck_assert_int_lt(g_n_done, 64);
	g_done[g_n_done].job_id = job_id;
	g_done[g_n_done].err = err;
	snprintf(g_done[g_n_done].message, sizeof(g_done[0].message), "%s", message ? message : "");
	g_done[g_n_done].bytes = bytes;
	g_n_done++;
}

#define REMOTE_LEN (1u << 20)

struct fixture {
	struct rdmaxd d;
	struct fake_transport tcp;
	struct fake_transport verbs;
	struct mailbox_table boxes;
	struct engine *engine;
	struct job_owner owner;
	struct region *local;
	struct region *target; /* on this daemon, another client's */
	int other_owner;
	uint8_t desc[4][DESC_MAX_BYTES]; /* 0, 1: node 2; 2: node 3; 3: this daemon */
	size_t desc_len[4];
};

static struct fixture F;

static size_t encode_remote(uint8_t *buf, uint64_t instance, uint64_t region, uint16_t port,
			    enum endpoint_transport kind)
{
	struct remote_desc rd;
	memset(&rd, 0, sizeof(rd));
	rd.instance_id = instance;
	rd.region_id = region;
	rd.region_key = region * 100;
	rd.length = REMOTE_LEN;
	rd.access = RDMAX_ACCESS_REMOTE_WRITE;
	snprintf(rd.node_name, sizeof(rd.node_name), "node-%llu", (unsigned long long)instance);
	rd.n_endpoints = 1;
	rd.endpoints[0].transport = kind;
	strcpy(rd.endpoints[0].addr, "127.0.0.1");
	rd.endpoints[0].port = port;
	int len = desc_encode(&rd, buf, DESC_MAX_BYTES);
	ck_assert_int_gt(len, 0);
	return (size_t)len;
}

static void fixture_setup(void)
{
	memset(&F, 0, sizeof(F));
	g_n_done = 0;
	g_delivered = 0;
	g_deliver_err = 0;
	config_defaults(&F.d.cfg);
	F.d.cfg.chunk_bytes = 4096;
	F.d.loop = uv_default_loop();
	F.d.instance_id = 1;
	snprintf(F.d.node_name, sizeof(F.d.node_name), "self");
	ck_assert_int_eq(region_table_init(&F.d.regions, 1), 0);
	ck_assert_int_eq(imm_table_init(&F.d.imm, 16, NULL, NULL), 0);
	/* Landings count in the namespace of the target region's client. */
	ck_assert_int_eq(imm_space_open(&F.d.imm, &F.owner, NULL, 0), 0);
	ck_assert_int_eq(imm_space_open(&F.d.imm, &F.other_owner, NULL, 0), 0);
	ck_assert_int_eq(mailbox_table_init(&F.boxes, record_deliver), 0);
	F.d.mailboxes = &F.boxes;
	F.tcp.base.ops = &fake_tcp_ops;
	F.tcp.base.kind = ENDPOINT_TCP;
	F.tcp.base.ordered = true;
	F.d.transports[ENDPOINT_TCP] = &F.tcp.base;
	F.verbs.base.ops = &fake_verbs_ops;
	F.verbs.base.kind = ENDPOINT_VERBS;
	F.verbs.base.ordered = false;
	F.d.transports[ENDPOINT_VERBS] = &F.verbs.base;
	ck_assert_int_eq(engine_create(&F.d, on_complete, &F.engine), 0);
	ck_assert_int_eq(job_owner_init(&F.owner), 0);
	int fd = unit_sealed_memfd(1 << 20, F_SEAL_SHRINK);
	ck_assert_int_eq(
		region_register_host_fd(&F.d.regions, &F.owner, fd, 0, 1 << 20, 0, &F.local), 0);
	close(fd);
	for (size_t i = 0; i < (1 << 20); i++) {
		F.local->addr[i] = (uint8_t)(i * 7 + 3);
	}
	fd = unit_sealed_memfd(1 << 20, F_SEAL_SHRINK);
	ck_assert_int_eq(region_register_host_fd(&F.d.regions, &F.other_owner, fd, 0, 1 << 20,
						 RDMAX_ACCESS_REMOTE_WRITE, &F.target),
			 0);
	close(fd);
	F.desc_len[0] = encode_remote(F.desc[0], 2, 5, 7001, ENDPOINT_TCP);
	F.desc_len[1] = encode_remote(F.desc[1], 2, 6, 7001, ENDPOINT_TCP);
	F.desc_len[2] = encode_remote(F.desc[2], 3, 5, 7002, ENDPOINT_TCP);
	struct endpoint ep = {.transport = ENDPOINT_TCP, .addr = "127.0.0.1", .port = 7000};
	int len = region_desc_encode(&F.d.regions, F.target, "self", &ep, 1, F.desc[3],
				     sizeof(F.desc[3]));
	ck_assert_int_gt(len, 0);
	F.desc_len[3] = (size_t)len;
}

static void fixture_teardown(void)
{
	if (!F.owner.gone) {
		job_owner_leave(F.engine, &F.owner);
	}
	engine_destroy(F.engine);
	mailbox_table_fini(&F.boxes);
	imm_table_fini(&F.d.imm);
	region_table_fini(&F.d.regions);
	uv_run(uv_default_loop(), UV_RUN_NOWAIT);
}

static ProtobufCBinaryData desc_of(int i)
{
	return (ProtobufCBinaryData){.len = F.desc_len[i], .data = F.desc[i]};
}

/*
 * A PAGED_WRITE of F.local's pages si onto descriptor desc's pages di, with
 * n_pairs more region pairs (local region ids, descriptor indices).
 */
static void submit_paged_pairs(uint64_t id, uint64_t page_len, const uint32_t *si,
			       const uint32_t *di, size_t n, int desc, int imm,
			       const uint64_t *locals, const int *descs, size_t n_pairs)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__PagedWriteJob pw = RDMAX__V1__PAGED_WRITE_JOB__INIT;
	Rdmax__V1__PageList src = RDMAX__V1__PAGE_LIST__INIT, dst = RDMAX__V1__PAGE_LIST__INIT;
	Rdmax__V1__PagedPair pairs[4], *ptrs[4];
	ck_assert_uint_le(n_pairs, 4);
	for (size_t k = 0; k < n_pairs; k++) {
		rdmax__v1__paged_pair__init(&pairs[k]);
		pairs[k].local_region = locals[k];
		pairs[k].remote_desc = desc_of(descs[k]);
		ptrs[k] = &pairs[k];
	}
	src.indices = (uint32_t *)si;
	src.n_indices = n;
	dst.indices = (uint32_t *)di;
	dst.n_indices = n;
	pw.local_region = F.local->id;
	pw.page_len = page_len;
	pw.src = &src;
	pw.dst = &dst;
	pw.remote_desc = desc_of(desc);
	pw.pairs = n_pairs ? ptrs : NULL;
	pw.n_pairs = n_pairs;
	if (imm >= 0) {
		pw.has_imm = 1;
		pw.imm = (uint32_t)imm;
	}
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_PAGED_WRITE;
	job.paged_write = &pw;
	engine_submit(F.engine, &F.owner, &job);
}

static void submit_paged(uint64_t id, uint64_t page_len, const uint32_t *si, const uint32_t *di,
			 size_t n, int desc, int imm)
{
	submit_paged_pairs(id, page_len, si, di, n, desc, imm, NULL, NULL, 0);
}

static void submit_paged_read(uint64_t id, uint64_t page_len, const uint32_t *li,
			      const uint32_t *ri, size_t n, int desc)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__PagedReadJob pr = RDMAX__V1__PAGED_READ_JOB__INIT;
	Rdmax__V1__PageList src = RDMAX__V1__PAGE_LIST__INIT, dst = RDMAX__V1__PAGE_LIST__INIT;
	dst.indices = (uint32_t *)li;
	dst.n_indices = n;
	src.indices = (uint32_t *)ri;
	src.n_indices = n;
	pr.local_region = F.local->id;
	pr.page_len = page_len;
	pr.dst = &dst;
	pr.src = &src;
	pr.remote_desc = desc_of(desc);
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_PAGED_READ;
	job.paged_read = &pr;
	engine_submit(F.engine, &F.owner, &job);
}

/* ----------------------------------------------------------- engine: paged */

START_TEST(paged_read_xfers_are_reads)
{
	/* Remote 4-5 -> local 0-1 merge; remote 4 again -> local 7 (a source may repeat). */
	const uint32_t li[] = {0, 1, 7}, ri[] = {4, 5, 4};
	F.d.cfg.chunk_bytes = 2 * PAGE;
	submit_paged_read(1, PAGE, li, ri, 3, 0);
	ck_assert_int_eq(F.tcp.n, 2);
	ck_assert_int_eq(F.tcp.xfers[0]->op, XFER_READ);
	ck_assert_uint_eq(F.tcp.xfers[0]->local_offset, 0);
	ck_assert_uint_eq(F.tcp.xfers[0]->remote_offset, 4 * PAGE);
	ck_assert_uint_eq(F.tcp.xfers[0]->length, 2 * PAGE);
	ck_assert_int_eq(F.tcp.xfers[1]->op, XFER_READ);
	ck_assert_uint_eq(F.tcp.xfers[1]->local_offset, 7 * PAGE);
	ck_assert_uint_eq(F.tcp.xfers[1]->remote_offset, 4 * PAGE);
	ck_assert_int_eq(F.tcp.xfers[1]->has_imm, 0);
	fake_transport_finish_all(&F.tcp, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, 3 * PAGE);
	ck_assert_uint_eq(F.owner.runs, 0);
	ck_assert_uint_eq(F.local->refs, 1);

	/* Local pages are the destination: a repeat is refused before any xfer. */
	const uint32_t dup[] = {3, 3};
	submit_paged_read(2, PAGE, dup, ri, 2, 0);
	ck_assert_int_eq(F.tcp.n, 2);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_INVALID_ARGUMENT);
}
END_TEST

START_TEST(paged_xfers_and_imm_on_last)
{
	/* 6 pages: 0-3 contiguous on both sides (2 runs of 2 pages at chunk 8 KiB), 9, 7. */
	const uint32_t si[] = {0, 1, 2, 3, 9, 7};
	const uint32_t di[] = {4, 5, 6, 7, 0, 1};
	F.d.cfg.chunk_bytes = 2 * PAGE;
	submit_paged(1, PAGE, si, di, 6, 0, 42);
	ck_assert_int_eq(F.tcp.n, 4);
	ck_assert_uint_eq(F.tcp.xfers[0]->local_offset, 0);
	ck_assert_uint_eq(F.tcp.xfers[0]->remote_offset, 4 * PAGE);
	ck_assert_uint_eq(F.tcp.xfers[0]->length, 2 * PAGE);
	ck_assert_uint_eq(F.tcp.xfers[1]->remote_offset, 6 * PAGE);
	ck_assert_uint_eq(F.tcp.xfers[2]->local_offset, 9 * PAGE);
	ck_assert_uint_eq(F.tcp.xfers[2]->remote_offset, 0);
	ck_assert_uint_eq(F.tcp.xfers[3]->local_offset, 7 * PAGE);
	ck_assert_uint_eq(F.tcp.xfers[3]->remote_offset, PAGE);
	for (int i = 0; i < 4; i++) {
		ck_assert_uint_eq(F.tcp.xfers[i]->remote_instance, 2);
		ck_assert_uint_eq(F.tcp.xfers[i]->remote_region, 5);
		ck_assert_int_eq(F.tcp.xfers[i]->has_imm, i == 3);
	}
	fake_transport_finish(&F.tcp, 3, 0);
	fake_transport_finish(&F.tcp, 0, 0);
	fake_transport_finish(&F.tcp, 1, 0);
	ck_assert_int_eq(g_n_done, 0);
	fake_transport_finish(&F.tcp, 2, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, 6 * PAGE);
	ck_assert_uint_eq(F.owner.runs, 0);
	ck_assert_uint_eq(F.local->refs, 1);
}
END_TEST

START_TEST(paged_window_and_many_pages)
{
	/*
	 * 1000 scattered small pages: 64 in flight at a time (small runs get a wider window
	 * within the same byte budget), all issued in list order.
	 */
	enum { N = 1000 };
	static uint32_t si[N], di[N];
	for (uint32_t i = 0; i < N; i++) {
		si[i] = (i * 37) % N;
		di[i] = N - 1 - i;
	}
	submit_paged(7, 64, si, di, N, 0, 5);
	ck_assert_uint_eq(F.owner.runs, N);
	ck_assert_int_eq(F.tcp.n, 64);
	int done_upto = 0;
	while (done_upto < F.tcp.n) {
		ck_assert_int_le(F.tcp.n - done_upto, 64);
		fake_transport_finish(&F.tcp, done_upto++, 0);
	}
	ck_assert_int_eq(F.tcp.n, N);
	for (int i = 0; i < N; i++) {
		ck_assert_uint_eq(F.tcp.snap[i].local_offset, si[i] * 64u);
		ck_assert_uint_eq(F.tcp.snap[i].remote_offset, di[i] * 64u);
		ck_assert_int_eq(F.tcp.snap[i].has_imm, i == N - 1);
	}
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, N * 64);
	ck_assert_uint_eq(F.owner.runs, 0);
}
END_TEST

START_TEST(paged_errors_name_the_page)
{
	const uint32_t si[] = {0, 1};
	const uint32_t di[] = {3, 3};
	const uint32_t far[] = {0, 256};
	submit_paged(1, PAGE, si, di, 2, 0, -1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[0].message, "destination page 3 is listed twice"));
	/* 1 MiB regions: page 256 is just past the end on either side. */
	submit_paged(2, PAGE, far, si, 2, 0, -1);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_OUT_OF_RANGE);
	ck_assert_ptr_nonnull(strstr(g_done[1].message, "source page 256 (list entry 1)"));
	submit_paged(3, PAGE, si, far, 2, 0, -1);
	ck_assert_int_eq(g_done[2].err, RDMAX_E_OUT_OF_RANGE);
	ck_assert_ptr_nonnull(strstr(g_done[2].message, "destination page 256"));
	submit_paged(4, 0, si, si, 2, 0, -1);
	ck_assert_int_eq(g_done[3].err, RDMAX_E_INVALID_ARGUMENT);
	submit_paged(5, PAGE, si, di, 1, 0, -1); /* one page each: fine */
	ck_assert_int_eq(g_n_done, 4);
	ck_assert_int_eq(F.tcp.n, 1);
	fake_transport_finish(&F.tcp, 0, 0);
	ck_assert_int_eq(g_done[4].err, 0);
	ck_assert_uint_eq(F.local->refs, 1);
	ck_assert_uint_eq(F.owner.outstanding, 0);
}
END_TEST

START_TEST(paged_zero_pages_and_unordered_hold)
{
	/* No pages, with imm: one zero-byte xfer carrying it. Without: done at once. */
	submit_paged(1, PAGE, NULL, NULL, 0, 0, 9);
	ck_assert_int_eq(F.tcp.n, 1);
	ck_assert_uint_eq(F.tcp.xfers[0]->length, 0);
	ck_assert(F.tcp.xfers[0]->has_imm);
	fake_transport_finish(&F.tcp, 0, 0);
	submit_paged(2, PAGE, NULL, NULL, 0, 0, -1);
	ck_assert_int_eq(F.tcp.n, 1);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, 0);

	/* Unordered transport: the last xfer (with the imm) waits for the others. */
	F.tcp.base.ordered = false;
	const uint32_t si[] = {0, 2, 4};
	submit_paged(3, PAGE, si, si, 3, 0, 11);
	ck_assert_int_eq(F.tcp.n, 3);
	ck_assert(!F.tcp.xfers[1]->has_imm && !F.tcp.xfers[2]->has_imm);
	fake_transport_finish(&F.tcp, 2, 0);
	ck_assert_int_eq(F.tcp.n, 3);
	fake_transport_finish(&F.tcp, 1, 0);
	ck_assert_int_eq(F.tcp.n, 4);
	ck_assert(F.tcp.xfers[3]->has_imm);
	ck_assert_uint_eq(F.tcp.xfers[3]->local_offset, 4 * PAGE);
	ck_assert_int_eq(g_n_done, 2);
	fake_transport_finish(&F.tcp, 3, 0);
	ck_assert_int_eq(g_n_done, 3);
	ck_assert_int_eq(g_done[2].err, 0);
}
END_TEST

START_TEST(paged_local_copy_counts_imm)
{
	const uint32_t si[] = {1, 0};
	const uint32_t di[] = {0, 2};
	submit_paged(1, PAGE, si, di, 2, 3, 77);
	ck_assert_int_eq(F.tcp.n, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_mem_eq(F.target->addr, F.local->addr + PAGE, PAGE);
	ck_assert_mem_eq(F.target->addr + 2 * PAGE, F.local->addr, PAGE);
	ck_assert_uint_eq(F.target->addr[PAGE], 0);
	ck_assert_uint_eq(imm_count(&F.d.imm, &F.other_owner, 77), 1);
}
END_TEST

/* --------------------------------------------------------- engine: scatter */

static void submit_scatter(uint64_t id, Rdmax__V1__ScatterDest **dests, size_t n, uint64_t group,
			   int imm)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__ScatterJob sj = RDMAX__V1__SCATTER_JOB__INIT;
	sj.local_region = F.local->id;
	sj.dests = dests;
	sj.n_dests = n;
	if (group) {
		sj.has_peer_group = 1;
		sj.peer_group = group;
	}
	if (imm >= 0) {
		sj.has_imm = 1;
		sj.imm = (uint32_t)imm;
	}
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_SCATTER;
	job.scatter = &sj;
	engine_submit(F.engine, &F.owner, &job);
}

static Rdmax__V1__ScatterDest dest_desc(int desc, uint64_t local_off, uint64_t remote_off,
					uint64_t len)
{
	Rdmax__V1__ScatterDest d = RDMAX__V1__SCATTER_DEST__INIT;
	d.has_remote_desc = 1;
	d.remote_desc = desc_of(desc);
	d.local_offset = local_off;
	d.remote_offset = remote_off;
	d.length = len;
	return d;
}

START_TEST(scatter_imm_once_per_node)
{
	/* Node 2 gets two destinations (two regions), node 3 one, this daemon one. */
	Rdmax__V1__ScatterDest d[4] = {
		dest_desc(0, 0, 0, 3 * PAGE),
		dest_desc(2, PAGE, 100, 10),
		dest_desc(1, 2 * PAGE, 0, PAGE),
		dest_desc(3, 5, 7, 1000),
	};
	Rdmax__V1__ScatterDest *ptrs[4] = {&d[0], &d[1], &d[2], &d[3]};
	submit_scatter(1, ptrs, 4, 0, 123);
	/* 3 chunks + 1 + 1 to remote nodes; the local one is copied at once. */
	ck_assert_int_eq(F.tcp.n, 5);
	ck_assert_mem_eq(F.target->addr + 7, F.local->addr + 5, 1000);
	ck_assert_uint_eq(imm_count(&F.d.imm, &F.other_owner, 123), 1);
	int imm_node2 = 0, imm_node3 = 0;
	for (int i = 0; i < 5; i++) {
		struct xfer *x = F.tcp.xfers[i];
		if (x->has_imm) {
			imm_node2 += x->remote_instance == 2;
			imm_node3 += x->remote_instance == 3;
		}
		ck_assert_uint_eq(x->peer.port, x->remote_instance == 2 ? 7001 : 7002);
	}
	ck_assert_int_eq(imm_node2, 1);
	ck_assert_int_eq(imm_node3, 1);
	/* Node 2's imm rides on its last xfer: destination 2, region 6. */
	ck_assert(F.tcp.xfers[4]->has_imm);
	ck_assert_uint_eq(F.tcp.xfers[4]->remote_region, 6);
	ck_assert(F.tcp.xfers[3]->has_imm && F.tcp.xfers[3]->remote_instance == 3);
	ck_assert_uint_eq(F.tcp.xfers[3]->remote_offset, 100);
	fake_transport_finish_all(&F.tcp, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, 3 * PAGE + 10 + PAGE + 1000);
}
END_TEST

START_TEST(scatter_errors)
{
	Rdmax__V1__ScatterDest d[2] = {dest_desc(0, 0, 0, 10), dest_desc(2, 0, REMOTE_LEN - 5, 10)};
	Rdmax__V1__ScatterDest *ptrs[2] = {&d[0], &d[1]};
	submit_scatter(1, ptrs, 2, 0, -1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_OUT_OF_RANGE);
	ck_assert_ptr_nonnull(strstr(g_done[0].message, "destination 1: remote range"));
	submit_scatter(2, ptrs, 0, 0, -1);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_INVALID_ARGUMENT);
	d[1] = dest_desc(2, 0, 0, 10);
	d[1].has_peer_index = 1;
	submit_scatter(3, ptrs, 2, 0, -1);
	ck_assert_int_eq(g_done[2].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[2].message, "either a remote_desc or a peer_index"));
	d[1].has_remote_desc = 0;
	submit_scatter(4, ptrs, 2, 0, -1);
	ck_assert_int_eq(g_done[3].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[3].message, "no peer_group"));
	submit_scatter(5, ptrs, 2, 99, -1);
	ck_assert_int_eq(g_done[4].err, RDMAX_E_NOT_FOUND);
	ck_assert_ptr_nonnull(strstr(g_done[4].message, "peer group 99 does not exist"));
	ck_assert_int_eq(F.tcp.n, 0);
	ck_assert_uint_eq(F.local->refs, 1);
	ck_assert_uint_eq(F.owner.runs, 0);
}
END_TEST

/* ------------------------------------------------------ peer groups, barrier */

static uint64_t make_group(const int *descs, size_t n)
{
	ProtobufCBinaryData bins[8];
	uint64_t handle;
	for (size_t i = 0; i < n; i++) {
		bins[i] = desc_of(descs[i]);
	}
	int ret = peer_group_create(&F.d, &F.owner.groups, bins, n, &handle, g_why, sizeof(g_why));
	ck_assert_msg(ret == 0, "peer_group_create: %d (%s)", ret, g_why);
	return handle;
}

START_TEST(peer_group_resolves_once)
{
	const int members[] = {0, 2, 1, 3};
	uint64_t h = make_group(members, 4);
	struct peer_group *g = peer_group_find(&F.owner.groups, h);
	ck_assert_ptr_nonnull(g);
	ck_assert_uint_eq(g->n_members, 4);
	ck_assert_uint_eq(g->n_nodes, 3);
	ck_assert_uint_eq(g->members[0].node, g->members[2].node);
	ck_assert_uint_ne(g->members[0].node, g->members[1].node);
	ck_assert_ptr_eq(g->members[0].transport, &F.tcp.base);
	ck_assert_ptr_null(g->members[3].transport); /* this daemon */
	ck_assert_uint_eq(g->members[1].peer.port, 7002);
	ck_assert_uint_eq(g->node_member[g->members[3].node], 3);

	/* Errors. */
	ProtobufCBinaryData bad = {.len = 3, .data = (uint8_t *)"xyz"};
	uint64_t h2 = 0;
	ck_assert_int_eq(
		peer_group_create(&F.d, &F.owner.groups, &bad, 1, &h2, g_why, sizeof(g_why)),
		RDMAX_E_INVALID_ARGUMENT);
	assert_why_has("descriptor 0 is malformed");
	ck_assert_int_eq(
		peer_group_create(&F.d, &F.owner.groups, &bad, 0, &h2, g_why, sizeof(g_why)),
		RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(peer_group_create(&F.d, &F.owner.groups, &bad, PEER_GROUP_MAX_MEMBERS + 1,
					   &h2, g_why, sizeof(g_why)),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	F.d.transports[ENDPOINT_TCP] = NULL;
	ProtobufCBinaryData tcp_only = desc_of(0);
	ck_assert_int_eq(
		peer_group_create(&F.d, &F.owner.groups, &tcp_only, 1, &h2, g_why, sizeof(g_why)),
		RDMAX_E_UNREACHABLE);
	F.d.transports[ENDPOINT_TCP] = &F.tcp.base;
	ck_assert_uint_eq(h2, 0);
	for (uint32_t i = 1; i < PEER_GROUP_MAX_PER_CLIENT; i++) {
		make_group(members, 1);
	}
	ck_assert_int_eq(
		peer_group_create(&F.d, &F.owner.groups, &tcp_only, 1, &h2, g_why, sizeof(g_why)),
		RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(peer_group_destroy(&F.owner.groups, h), 0);
	ck_assert_int_eq(peer_group_destroy(&F.owner.groups, h), RDMAX_E_NOT_FOUND);
	ck_assert_ptr_null(peer_group_find(&F.owner.groups, h));
}
END_TEST

START_TEST(scatter_by_peer_index_outlives_destroy)
{
	const int members[] = {2, 0};
	uint64_t h = make_group(members, 2);
	Rdmax__V1__ScatterDest d[2] = {RDMAX__V1__SCATTER_DEST__INIT,
				       RDMAX__V1__SCATTER_DEST__INIT};
	Rdmax__V1__ScatterDest *ptrs[2] = {&d[0], &d[1]};
	d[0].has_peer_index = 1;
	d[0].peer_index = 1;
	d[0].length = 64;
	d[1].has_peer_index = 1;
	d[1].peer_index = 0;
	d[1].local_offset = 64;
	d[1].remote_offset = 8;
	d[1].length = 64;
	submit_scatter(1, ptrs, 2, h, 4);
	ck_assert_int_eq(F.tcp.n, 2);
	ck_assert_uint_eq(F.tcp.xfers[0]->remote_instance, 2);
	ck_assert_uint_eq(F.tcp.xfers[1]->remote_instance, 3);
	ck_assert_uint_eq(F.tcp.xfers[1]->remote_offset, 8);
	ck_assert(F.tcp.xfers[0]->has_imm && F.tcp.xfers[1]->has_imm);
	/* The job holds the group: destroying the handle does not free it under the job. */
	ck_assert_int_eq(peer_group_destroy(&F.owner.groups, h), 0);
	fake_transport_finish_all(&F.tcp, 0);
	ck_assert_int_eq(g_done[0].err, 0);
	d[0].peer_index = 2;
	submit_scatter(2, ptrs, 2, make_group(members, 2), -1);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_OUT_OF_RANGE);
	ck_assert_ptr_nonnull(strstr(g_done[1].message, "peer_index 2 outside"));
}
END_TEST

static void submit_barrier(uint64_t id, uint64_t group, const int *descs, size_t n, uint32_t imm)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__BarrierJob bj = RDMAX__V1__BARRIER_JOB__INIT;
	ProtobufCBinaryData bins[8];
	for (size_t i = 0; i < n; i++) {
		bins[i] = desc_of(descs[i]);
	}
	if (group) {
		bj.has_peer_group = 1;
		bj.peer_group = group;
	}
	bj.remote_descs = bins;
	bj.n_remote_descs = n;
	bj.imm = imm;
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_BARRIER;
	job.barrier = &bj;
	engine_submit(F.engine, &F.owner, &job);
}

START_TEST(barrier_once_per_node)
{
	/* Four members on three nodes (2, 3, this daemon): two xfers, one local landing. */
	const int members[] = {0, 1, 2, 3};
	uint64_t h = make_group(members, 4);
	submit_barrier(1, h, NULL, 0, 0xBA);
	ck_assert_int_eq(F.tcp.n, 2);
	ck_assert_uint_eq(imm_count(&F.d.imm, &F.other_owner, 0xBA), 1);
	for (int i = 0; i < 2; i++) {
		ck_assert_uint_eq(F.tcp.xfers[i]->length, 0);
		ck_assert(F.tcp.xfers[i]->has_imm);
		ck_assert_uint_eq(F.tcp.xfers[i]->imm, 0xBA);
	}
	ck_assert_uint_ne(F.tcp.xfers[0]->remote_instance, F.tcp.xfers[1]->remote_instance);
	fake_transport_finish(&F.tcp, 0, 0);
	ck_assert_int_eq(g_n_done, 0);
	fake_transport_finish(&F.tcp, 1, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, 0);

	/* By descriptors; one node refuses: the barrier fails, once. */
	const int two[] = {2, 1};
	submit_barrier(2, 0, two, 2, 0xBB);
	ck_assert_int_eq(F.tcp.n, 4);
	fake_transport_finish(&F.tcp, 2, RDMAX_E_REMOTE_ACCESS);
	fake_transport_finish(&F.tcp, 3, 0);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_REMOTE_ACCESS);

	/* No peers; both kinds of peers. */
	submit_barrier(3, 0, NULL, 0, 1);
	ck_assert_int_eq(g_done[2].err, RDMAX_E_INVALID_ARGUMENT);
	submit_barrier(4, h, two, 2, 1);
	ck_assert_int_eq(g_done[3].err, RDMAX_E_INVALID_ARGUMENT);
}
END_TEST

/* ------------------------------------------------------------ engine: send */

/* The address of mailbox `scoped` (key `key`) on the node of descriptor desc. */
static ProtobufCBinaryData addr_of(int desc, const char *scoped, uint64_t key)
{
	static uint8_t buf[DESC_MAX_BYTES];
	struct remote_desc rd;

	ck_assert_int_eq(desc_decode(F.desc[desc], F.desc_len[desc], &rd), 0);
	rd.region_id = 0;
	rd.length = 0;
	rd.access = 0;
	rd.region_key = key;
	snprintf(rd.mailbox, sizeof(rd.mailbox), "%s", scoped);
	int len = desc_encode(&rd, buf, sizeof(buf));
	ck_assert_int_gt(len, 0);
	return (ProtobufCBinaryData){.len = (size_t)len, .data = buf};
}

/* A SEND to (scoped, key) on desc's node; `name` is the job's optional mailbox field. */
static void submit_send_to(uint64_t id, ProtobufCBinaryData remote, const char *name,
			   const char *payload)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__SendJob sj = RDMAX__V1__SEND_JOB__INIT;
	char copy[64];
	snprintf(copy, sizeof(copy), "%s", payload);
	sj.remote_desc = remote;
	sj.mailbox = (char *)name;
	sj.payload.data = (uint8_t *)copy;
	sj.payload.len = strlen(copy);
	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_SEND;
	job.send = &sj;
	engine_submit(F.engine, &F.owner, &job);
	memset(copy, 0, sizeof(copy)); /* the engine must have copied the payload */
}

static void submit_send(uint64_t id, int desc, const char *scoped, uint64_t key,
			const char *payload)
{
	submit_send_to(id, addr_of(desc, scoped, key), NULL, payload);
}

START_TEST(send_remote_local_and_unimplemented)
{
	submit_send(1, 2, "7:inbox", 0x1234, "hello node 3");
	ck_assert_int_eq(F.tcp.n, 1);
	struct xfer *x = F.tcp.xfers[0];
	ck_assert_str_eq(x->mailbox, "7:inbox");
	ck_assert_uint_eq(x->remote_key, 0x1234);
	ck_assert_uint_eq(x->length, 12);
	ck_assert_mem_eq(x->payload, "hello node 3", 12);
	ck_assert_uint_eq(x->remote_instance, 3);
	ck_assert(!x->has_imm);
	x->done(x, RDMAX_E_NOT_FOUND, "127.0.0.1:7002: no mailbox '7:inbox' is open on node 'n3'");
	ck_assert_int_eq(g_done[0].err, RDMAX_E_NOT_FOUND);
	ck_assert_ptr_nonnull(strstr(g_done[0].message, "no mailbox '7:inbox'"));

	/* Same node: delivered in place, with the right key only. */
	int owner2;
	uint32_t uid_open = 0;
	struct mailbox_ref ref;
	ck_assert_int_eq(mailbox_open(&F.boxes, &owner2, 7, "inbox", &uid_open, 8, &ref), 0);
	submit_send(2, 3, ref.scoped, ref.key, "local");
	ck_assert_int_eq(g_done[1].err, 0);
	ck_assert_uint_eq(g_done[1].bytes, 5);
	ck_assert_int_eq(g_delivered, 1);
	ck_assert_str_eq(g_last_payload, "local");
	ck_assert_str_eq(g_last_from, "self");
	submit_send(3, 3, "7:other", ref.key, "x");
	ck_assert_int_eq(g_done[2].err, RDMAX_E_NOT_FOUND);
	ck_assert_ptr_nonnull(strstr(g_done[2].message, "no mailbox '7:other' with this key"));
	submit_send(4, 3, ref.scoped, ref.key + 1, "x");
	ck_assert_int_eq(g_done[3].err, RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(g_delivered, 1);
	/* A region descriptor is no address; the job's name must match the address's. */
	submit_send_to(5, desc_of(3), "inbox", "x");
	ck_assert_int_eq(g_done[4].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[4].message, "needs the mailbox's address"));
	submit_send_to(6, addr_of(3, ref.scoped, ref.key), "other", "x");
	ck_assert_int_eq(g_done[5].err, RDMAX_E_INVALID_ARGUMENT);
	submit_send_to(7, addr_of(3, ref.scoped, ref.key), "inbox", "named");
	ck_assert_int_eq(g_done[6].err, 0);
	ck_assert_int_eq(g_delivered, 2);
	/* An address is no region descriptor either. */
	const uint32_t one[] = {0};
	Rdmax__V1__Job wj = RDMAX__V1__JOB__INIT;
	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;
	w.local_region = F.local->id;
	w.length = 1;
	w.remote_desc = addr_of(2, "7:inbox", 1);
	wj.job_id = 8;
	wj.kind_case = RDMAX__V1__JOB__KIND_WRITE;
	wj.write = &w;
	engine_submit(F.engine, &F.owner, &wj);
	ck_assert_int_eq(g_done[7].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[7].message, "not a region descriptor"));

	/* A node reachable only over a transport without send_message. */
	uint8_t vdesc[DESC_MAX_BYTES];
	F.desc_len[0] = encode_remote(vdesc, 4, 1, 7004, ENDPOINT_VERBS);
	memcpy(F.desc[0], vdesc, F.desc_len[0]);
	submit_send(9, 0, "7:inbox", 1, "x");
	ck_assert_int_eq(g_done[8].err, RDMAX_E_UNIMPLEMENTED);
	ck_assert_ptr_nonnull(strstr(g_done[8].message, "'verbs' transport cannot carry SEND"));
	/* Writes to it use verbs. */
	submit_paged(10, 64, one, one, 1, 0, -1);
	ck_assert_int_eq(F.verbs.n, 1);
	fake_transport_finish(&F.verbs, 0, 0);
	ck_assert_int_eq(g_done[9].err, 0);
	ck_assert_int_eq(F.tcp.n, 1);
}
END_TEST

START_TEST(send_is_never_chunked)
{
	/* A message larger than chunk_bytes (4 KiB here) leaves as one. */
	static uint8_t payload[MAILBOX_PAYLOAD_MAX];
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__SendJob sj = RDMAX__V1__SEND_JOB__INIT;
	memset(payload, 0x5a, sizeof(payload));
	sj.remote_desc = addr_of(0, "0:big", 1);
	sj.payload.data = payload;
	sj.payload.len = sizeof(payload);
	job.job_id = 1;
	job.kind_case = RDMAX__V1__JOB__KIND_SEND;
	job.send = &sj;
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(F.tcp.n, 1);
	ck_assert_uint_eq(F.tcp.snap[0].length, MAILBOX_PAYLOAD_MAX);
	fake_transport_finish(&F.tcp, 0, 0);
	ck_assert_int_eq(g_done[0].err, 0);
	ck_assert_uint_eq(g_done[0].bytes, MAILBOX_PAYLOAD_MAX);
	/* One byte more is refused. */
	sj.payload.len = MAILBOX_PAYLOAD_MAX + 1;
	job.job_id = 2;
	engine_submit(F.engine, &F.owner, &job);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(F.tcp.n, 1);
}
END_TEST

/* A PAGED_WRITE of PAGE pages to descriptor 0 whose pairs 1.. are (local id, descriptor). */
static void submit_paired(uint64_t id, const uint32_t *si, const uint32_t *di, size_t n,
			  const uint64_t *locals, const int *descs, size_t n_pairs, int imm)
{
	submit_paged_pairs(id, PAGE, si, di, n, 0, imm, locals, descs, n_pairs);
}

START_TEST(paged_pairs_one_job)
{
	/* Pages 0, 1 -> 2, 3 (one run) and 6 -> 0: two runs per pair, three pairs. */
	const uint32_t si[] = {0, 1, 6}, di[] = {2, 3, 0};
	struct region *second;
	int fd = unit_sealed_memfd(1 << 20, F_SEAL_SHRINK);
	ck_assert_int_eq(
		region_register_host_fd(&F.d.regions, &F.owner, fd, 0, 1 << 20, 0, &second), 0);
	close(fd);
	/* Pair 1: (second, node 2 region 6); pair 2: (F.local, node 2 region 5 again). */
	const uint64_t locals[] = {second->id, F.local->id};
	const int descs[] = {1, 1};

	/* Region 6 twice: the destination pages of the pairs would overlap. */
	submit_paired(1, si, di, 3, locals, descs, 2, 9);
	ck_assert_int_eq(F.tcp.n, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_uint_eq(second->refs, 1);

	/* A pair on node 3: one node per job, refused by pair before any xfer. */
	const int other_node[] = {1, 2};
	submit_paired(2, si, di, 3, locals, other_node, 2, 9);
	ck_assert_int_eq(F.tcp.n, 0);
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_uint_eq(second->refs, 1);

	/* 257 pairs in all: over the limit, refused before any lookup. */
	{
		static Rdmax__V1__PagedPair pair, *many[RDMAX_PAGED_PAIRS_MAX];
		Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
		Rdmax__V1__PagedWriteJob pw = RDMAX__V1__PAGED_WRITE_JOB__INIT;
		Rdmax__V1__PageList src = RDMAX__V1__PAGE_LIST__INIT,
				    dst = RDMAX__V1__PAGE_LIST__INIT;
		rdmax__v1__paged_pair__init(&pair);
		pair.local_region = second->id;
		pair.remote_desc = desc_of(1);
		for (size_t k = 0; k < RDMAX_PAGED_PAIRS_MAX; k++) {
			many[k] = &pair;
		}
		pw.local_region = F.local->id;
		pw.page_len = PAGE;
		pw.src = &src;
		pw.dst = &dst;
		pw.remote_desc = desc_of(0);
		pw.pairs = many;
		pw.n_pairs = RDMAX_PAGED_PAIRS_MAX;
		job.job_id = 9;
		job.kind_case = RDMAX__V1__JOB__KIND_PAGED_WRITE;
		job.paged_write = &pw;
		engine_submit(F.engine, &F.owner, &job);
		ck_assert_int_eq(g_n_done, 3);
		ck_assert_int_eq(g_done[2].err, RDMAX_E_RESOURCE_EXHAUSTED);
		ck_assert_ptr_nonnull(
			strstr(g_done[2].message, "257 region pairs exceed the limit of 256"));
	}

	/* An unknown local region in pair 1. */
	const uint64_t unknown[] = {second->id + 100};
	submit_paired(3, si, di, 3, unknown, descs, 1, -1);
	ck_assert_int_eq(g_n_done, 4);
	ck_assert_int_eq(g_done[3].err, RDMAX_E_NOT_FOUND);

	/* Two pairs: runs of pair 0 to region 5 from F.local, then pair 1's to 6 from second. */
	F.d.cfg.chunk_bytes = 1 << 20;
	submit_paired(4, si, di, 3, locals, descs, 1, 9);
	ck_assert_int_eq(F.tcp.n, 4);
	ck_assert_uint_eq(second->refs, 2);
	for (int i = 0; i < 4; i++) {
		bool pair1 = i >= 2;
		ck_assert_uint_eq(F.tcp.snap[i].remote_region, pair1 ? 6 : 5);
		ck_assert_ptr_eq(F.tcp.snap[i].local, pair1 ? second : F.local);
		ck_assert_uint_eq(F.tcp.snap[i].local_offset, i % 2 ? 6 * PAGE : 0);
		ck_assert_uint_eq(F.tcp.snap[i].remote_offset, i % 2 ? 0 : 2 * PAGE);
		ck_assert_int_eq(F.tcp.snap[i].has_imm, i == 3);
	}
	fake_transport_finish_all(&F.tcp, 0);
	ck_assert_int_eq(g_n_done, 5);
	ck_assert_int_eq(g_done[4].err, 0);
	ck_assert_uint_eq(g_done[4].bytes, 2 * 3 * PAGE);
	ck_assert_uint_eq(F.owner.runs, 0);
	ck_assert_uint_eq(second->refs, 1);
	ck_assert_uint_eq(F.local->refs, 1);
}
END_TEST

/* A verbs descriptor of region `region` of node 4 on `device`, with its iova and rkey. */
static size_t encode_verbs(uint8_t *buf, uint64_t region, const char *device, uint64_t iova,
			   uint32_t rkey)
{
	struct remote_desc rd;
	memset(&rd, 0, sizeof(rd));
	rd.instance_id = 4;
	rd.region_id = region;
	rd.region_key = region * 100;
	rd.length = REMOTE_LEN;
	rd.access = RDMAX_ACCESS_REMOTE_WRITE;
	snprintf(rd.node_name, sizeof(rd.node_name), "node-4");
	rd.n_endpoints = 1;
	rd.endpoints[0] = (struct endpoint){.transport = ENDPOINT_VERBS,
					    .addr = "10.0.0.4",
					    .port = 7004,
					    .iova = iova,
					    .rkey = rkey};
	snprintf(rd.endpoints[0].device, sizeof(rd.endpoints[0].device), "%s", device);
	int len = desc_encode(&rd, buf, DESC_MAX_BYTES);
	ck_assert_int_gt(len, 0);
	return (size_t)len;
}

START_TEST(paged_pairs_verbs_keys_per_pair)
{
	/* Over RDMA each pair's WRs carry its own region's iova and rkey. */
	const uint32_t si[] = {0, 2}, di[] = {1, 3};
	F.desc_len[0] = encode_verbs(F.desc[0], 10, "rxe0", 0x1000000, 111);
	F.desc_len[1] = encode_verbs(F.desc[1], 11, "rxe0", 0x2000000, 222);
	F.desc_len[2] = encode_verbs(F.desc[2], 12, "rxe9", 0x3000000, 333);
	const uint64_t locals[] = {F.local->id};

	/* Pair 1 registered on another device than pair 0's: no key for it there. */
	const int other_device[] = {2};
	submit_paired(1, si, di, 2, locals, other_device, 1, -1);
	ck_assert_int_eq(F.verbs.n, 0);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(g_done[0].message, "pair 1: its descriptor has no key for "
							"device 'rxe0'"));

	const int second[] = {1};
	submit_paired(2, si, di, 2, locals, second, 1, 5);
	/* Unordered: the imm's xfer waits for the other three (finished here, then it). */
	ck_assert_int_eq(F.verbs.n, 3);
	ck_assert_int_eq(g_n_done, 1);
	fake_transport_finish_all(&F.verbs, 0);
	ck_assert_int_eq(F.verbs.n, 4);
	ck_assert_int_eq(F.verbs.snap[3].has_imm, 1);
	for (int i = 0; i < 4; i++) {
		bool pair1 = i >= 2;
		ck_assert_uint_eq(F.verbs.snap[i].remote_region, pair1 ? 11 : 10);
		ck_assert_uint_eq(F.verbs.snap[i].peer.iova, pair1 ? 0x2000000 : 0x1000000);
		ck_assert_uint_eq(F.verbs.snap[i].peer.rkey, pair1 ? 222 : 111);
		ck_assert_str_eq(F.verbs.snap[i].peer.device, "rxe0");
	}
	ck_assert_int_eq(g_n_done, 2);
	ck_assert_int_eq(g_done[1].err, 0);
	ck_assert_uint_eq(g_done[1].bytes, 2 * 2 * PAGE);
}
END_TEST

START_TEST(cancel_paged_in_flight)
{
	enum { N = 64 };
	uint32_t idx[N];
	uint64_t done, total;
	for (uint32_t i = 0; i < N; i++) {
		idx[i] = 2 * i;
	}
	submit_paged(9, PAGE, idx, idx, N, 0, 1);
	ck_assert_int_eq(engine_job_progress(F.engine, &F.owner, 9, &done, &total), 0);
	ck_assert_uint_eq(total, N * PAGE);
	/* Pages of a whole chunk each: the byte budget (8 chunks) bounds the window. */
	ck_assert_int_eq(F.tcp.n, 8);
	fake_transport_finish(&F.tcp, 0, 0);
	ck_assert_int_eq(engine_job_progress(F.engine, &F.owner, 9, &done, &total), 0);
	ck_assert_uint_eq(done, PAGE);
	ck_assert_int_eq(engine_cancel(F.engine, &F.owner, 9), 0);
	ck_assert_int_eq(g_done[0].err, RDMAX_E_CANCELLED);
	ck_assert_uint_eq(F.owner.runs, 0);
	/* Returning xfers issue nothing more. */
	fake_transport_finish_all(&F.tcp, 1);
	ck_assert_int_eq(F.tcp.n, 9);
	ck_assert_int_eq(g_n_done, 1);
	ck_assert_uint_eq(F.local->refs, 1);
}
END_TEST

/* ------------------------------------------------------------------- wire */

START_TEST(wire_message_frame)
{
	struct wire_header h = {.type = WIRE_MESSAGE,
				.request_id = 5,
				.instance = 9,
				.offset = 5,
				.length = 5 + 100};
	struct wire_header got;
	uint8_t buf[WIRE_HEADER_BYTES];

	wire_header_encode(&h, buf);
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &got), 0);
	ck_assert_uint_eq(got.type, WIRE_MESSAGE);
	ck_assert_uint_eq(got.offset, 5);
	ck_assert_uint_eq(wire_payload_bytes(&got), 105);
	ck_assert_str_eq(wire_type_name(WIRE_MESSAGE), "MESSAGE");
	h.length = 5 + WIRE_MESSAGE_PAYLOAD_MAX;
	wire_header_encode(&h, buf);
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &got), 0);
	/* The mailbox's key rides in region_key; a scoped name may be 75 bytes. */
	h.region_key = UINT64_C(0xfedcba9876543210);
	h.offset = WIRE_MAILBOX_NAME_MAX;
	h.length = WIRE_MAILBOX_NAME_MAX + 1;
	wire_header_encode(&h, buf);
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &got), 0);
	ck_assert_uint_eq(got.region_key, h.region_key);

	const struct wire_header bad[] = {
		{.type = WIRE_MESSAGE, .offset = 0, .length = 10},  /* no name */
		{.type = WIRE_MESSAGE, .offset = 76, .length = 80}, /* name too long */
		{.type = WIRE_MESSAGE, .offset = 5, .length = 4},   /* body shorter than the name */
		{.type = WIRE_MESSAGE, .offset = 5, .length = 6 + WIRE_MESSAGE_PAYLOAD_MAX},
		{.type = WIRE_MESSAGE, .offset = 5, .length = 6, .region_id = 1},
		{.type = WIRE_MESSAGE, .offset = 5, .length = 6, .status = 2},
		{.type = WIRE_MESSAGE, .offset = 5, .length = 6, .flags = WIRE_F_HAS_IMM, .imm = 1},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		wire_header_encode(&bad[i], buf);
		ck_assert_msg(wire_header_decode(buf, sizeof(buf), &got) == RDMAX_E_PROTOCOL_ERROR,
			      "bad MESSAGE header %zu accepted", i);
	}
}
END_TEST

Suite *planner_jobs_suite(void)
{
	Suite *s = suite_create("planner_jobs");
	TCase *tc = tcase_create("planner");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, planner_coalesces_runs_on_both_sides);
	tcase_add_test(tc, planner_caps_runs_at_max_run);
	tcase_add_test(tc, planner_offsets_and_strides);
	tcase_add_test(tc, planner_boundary_pages);
	tcase_add_test(tc, planner_paged_read_sides);
	tcase_add_test(tc, planner_rejects_bad_lists);
	tcase_add_test(tc, planner_rejects_overflow);
	tcase_add_test(tc, planner_many_pages);
	tcase_add_test(tc, planner_scatter_and_helpers);
	tcase_add_test(tc, planner_pairs_repeat_runs_per_pair);
	suite_add_tcase(s, tc);

	tc = tcase_create("mailbox");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, mailbox_open_close_deliver);
	tcase_add_test(tc, mailbox_limits_and_release);
	tcase_add_test(tc, wire_message_frame);
	suite_add_tcase(s, tc);

	tc = tcase_create("jobs");
	tcase_set_timeout(tc, 10);
	tcase_add_checked_fixture(tc, fixture_setup, fixture_teardown);
	tcase_add_test(tc, paged_xfers_and_imm_on_last);
	tcase_add_test(tc, paged_read_xfers_are_reads);
	tcase_add_test(tc, paged_window_and_many_pages);
	tcase_add_test(tc, paged_errors_name_the_page);
	tcase_add_test(tc, paged_zero_pages_and_unordered_hold);
	tcase_add_test(tc, paged_local_copy_counts_imm);
	tcase_add_test(tc, scatter_imm_once_per_node);
	tcase_add_test(tc, scatter_errors);
	tcase_add_test(tc, peer_group_resolves_once);
	tcase_add_test(tc, scatter_by_peer_index_outlives_destroy);
	tcase_add_test(tc, barrier_once_per_node);
	tcase_add_test(tc, send_remote_local_and_unimplemented);
	tcase_add_test(tc, send_is_never_chunked);
	tcase_add_test(tc, cancel_paged_in_flight);
	tcase_add_test(tc, paged_pairs_one_job);
	tcase_add_test(tc, paged_pairs_verbs_keys_per_pair);
	suite_add_tcase(s, tc);
	return s;
}
