/* SPDX-License-Identifier: MIT */
/*
 * The job planner. Owns the arithmetic of page lists and scatter
 * destinations: every offset is computed with overflow checks, every range is
 * checked against its region, and a paged write or read whose destination
 * pages would overlap is refused, all before the engine issues a single xfer. Pure
 * functions: never touches daemon state, memory of regions or the network,
 * and never logs (the reason goes back to the client in `why`).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "planner.h"
#include "rdmax.h"

int planner_check_range(uint64_t offset, uint64_t length, uint64_t len)
{
	return offset <= len && length <= len - offset ? 0 : RDMAX_E_OUT_OF_RANGE;
}

uint64_t planner_run_xfers(uint64_t length, uint64_t chunk)
{
	if (length == 0 || chunk == 0) {
		return 1;
	}
	return length / chunk + (length % chunk != 0);
}

/* Byte offset of list entry i, checked against the region; reason in why. */
static int page_at(const struct plan_pages *list, size_t i, uint64_t page_len, uint64_t stride,
		   uint64_t region_len, const char *side, const char *region, uint64_t *ret_offset,
		   char *why, size_t why_size)
{
	uint32_t index = list->indices[i];
	uint64_t pos, end;

	if (__builtin_mul_overflow((uint64_t)index, stride, &pos) ||
	    __builtin_add_overflow(pos, list->offset, &pos) ||
	    __builtin_add_overflow(pos, page_len, &end)) {
		snprintf(why, why_size,
			 "%s page %" PRIu32 " (list entry %zu): offset %" PRIu64 " + %" PRIu32
			 " x stride %" PRIu64 " overflows 64 bits",
			 side, index, i, list->offset, index, stride);
		return RDMAX_E_OUT_OF_RANGE;
	}
	if (end > region_len) {
		snprintf(why, why_size,
			 "%s page %" PRIu32 " (list entry %zu) covers bytes [%" PRIu64 ", %" PRIu64
			 ") outside the %s region of %" PRIu64 " bytes",
			 side, index, i, pos, end, region, region_len);
		return RDMAX_E_OUT_OF_RANGE;
	}
	*ret_offset = pos;
	return 0;
}

struct entry {
	uint32_t index;
	uint32_t pad;
	size_t pos;
};

static int cmp_entry(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;

	if (x->index != y->index) {
		return x->index < y->index ? -1 : 1;
	}
	return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/*
 * With stride >= page_len two destination pages overlap exactly when they
 * have the same index, so sorting finds every overlap.
 */
static int check_distinct(const struct plan_pages *dst, char *why, size_t why_size)
{
	struct entry *e;
	int ret = 0;

	if (dst->count < 2) {
		return 0;
	}
	e = calloc(dst->count, sizeof(*e));
	if (!e) {
		snprintf(why, why_size, "out of memory while checking %zu pages", dst->count);
		return -ENOMEM;
	}
	for (size_t i = 0; i < dst->count; i++) {
		e[i].index = dst->indices[i];
		e[i].pos = i;
	}
	qsort(e, dst->count, sizeof(*e), cmp_entry);
	for (size_t i = 1; i < dst->count; i++) {
		if (e[i].index == e[i - 1].index) {
			snprintf(why, why_size,
				 "destination page %" PRIu32
				 " is listed twice (list entries %zu and "
				 "%zu): the destination pages of one job must not overlap",
				 e[i].index, e[i - 1].pos, e[i].pos);
			ret = RDMAX_E_INVALID_ARGUMENT;
			break;
		}
	}
	free(e);
	return ret;
}

static int check_stride(uint64_t page_len, uint64_t stride, const char *side, char *why,
			size_t why_size)
{
	if (stride >= page_len) {
		return 0;
	}
	snprintf(why, why_size,
		 "%s stride %" PRIu64 " is smaller than page_len %" PRIu64 ": pages would overlap",
		 side, stride, page_len);
	return RDMAX_E_INVALID_ARGUMENT;
}

/*
 * Both paged kinds: local pages in a region of local_len bytes, remote pages
 * in one of remote_len, paired in list order. `read`: the remote pages are
 * the source and the local ones the destination (PAGED_READ), else the
 * reverse (PAGED_WRITE). Runs carry local and remote offsets either way.
 */
static int plan_paged(uint64_t page_len, const struct plan_pages *local, uint64_t local_len,
		      const struct plan_pages *remote, uint64_t remote_len, bool read,
		      uint64_t max_run, struct plan_run **ret_runs, size_t *ret_n, char *why,
		      size_t why_size)
{
	const struct plan_pages *src = read ? remote : local, *dst = read ? local : remote;
	uint64_t src_stride, dst_stride;
	struct plan_run *runs = NULL;
	size_t n = 0;
	int ret;

	if (page_len == 0) {
		snprintf(why, why_size, "page_len is 0");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (src->count != dst->count) {
		snprintf(why, why_size,
			 "the source list has %zu pages but the destination list has %zu",
			 src->count, dst->count);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if ((src->count && !src->indices) || (dst->count && !dst->indices)) {
		snprintf(why, why_size, "a page list has a count but no indices");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	src_stride = src->stride ? src->stride : page_len;
	dst_stride = dst->stride ? dst->stride : page_len;
	ret = check_stride(page_len, src_stride, "source", why, why_size);
	if (ret == 0) {
		ret = check_stride(page_len, dst_stride, "destination", why, why_size);
	}
	if (ret < 0) {
		return ret;
	}
	if (src->count > SIZE_MAX / sizeof(*runs)) {
		snprintf(why, why_size, "%zu pages are too many", src->count);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/* Ranges first: an out-of-range page is the more useful message. */
	if (src->count > 0) {
		runs = malloc(src->count * sizeof(*runs));
		if (!runs) {
			snprintf(why, why_size, "out of memory while planning %zu pages",
				 src->count);
			return -ENOMEM;
		}
	}
	uint64_t local_stride = read ? dst_stride : src_stride;
	uint64_t remote_stride = read ? src_stride : dst_stride;
	const char *local_side = read ? "destination" : "source";
	const char *remote_side = read ? "source" : "destination";
	for (size_t i = 0; i < src->count; i++) {
		uint64_t l, r;
		ret = page_at(local, i, page_len, local_stride, local_len, local_side, "local", &l,
			      why, why_size);
		if (ret == 0) {
			ret = page_at(remote, i, page_len, remote_stride, remote_len, remote_side,
				      "remote", &r, why, why_size);
		}
		if (ret < 0) {
			goto out_free;
		}
		struct plan_run *last = n ? &runs[n - 1] : NULL;
		/* Both sides continue the previous run and the run stays within max_run. */
		if (last && last->local_offset + last->length == l &&
		    last->remote_offset + last->length == r && last->length <= max_run &&
		    page_len <= max_run - last->length) {
			last->length += page_len;
			continue;
		}
		runs[n++] = (struct plan_run){
			.local_offset = l, .remote_offset = r, .length = page_len, .dest = 0};
	}
	ret = check_distinct(dst, why, why_size);
	if (ret < 0) {
		goto out_free;
	}
	if (n > 0 && n < src->count) {
		struct plan_run *shrunk = realloc(runs, n * sizeof(*runs));
		if (shrunk) {
			runs = shrunk;
		}
	}
	*ret_runs = runs;
	*ret_n = n;
	return 0;

out_free:
	free(runs);
	return ret;
}

int planner_paged(uint64_t page_len, const struct plan_pages *src, uint64_t src_len,
		  const struct plan_pages *dst, uint64_t dst_len, uint64_t max_run,
		  struct plan_run **ret_runs, size_t *ret_n, char *why, size_t why_size)
{
	return plan_paged(page_len, src, src_len, dst, dst_len, false, max_run, ret_runs, ret_n,
			  why, why_size);
}

int planner_paged_read(uint64_t page_len, const struct plan_pages *local, uint64_t local_len,
		       const struct plan_pages *remote, uint64_t remote_len, uint64_t max_run,
		       struct plan_run **ret_runs, size_t *ret_n, char *why, size_t why_size)
{
	return plan_paged(page_len, local, local_len, remote, remote_len, true, max_run, ret_runs,
			  ret_n, why, why_size);
}

void planner_extent(const struct plan_run *runs, size_t n, uint64_t *ret_local_end,
		    uint64_t *ret_remote_end)
{
	uint64_t local_end = 0, remote_end = 0;

	/* Planned runs lie inside their regions, so the sums cannot wrap. */
	for (size_t i = 0; i < n; i++) {
		local_end = MAX(local_end, runs[i].local_offset + runs[i].length);
		remote_end = MAX(remote_end, runs[i].remote_offset + runs[i].length);
	}
	*ret_local_end = local_end;
	*ret_remote_end = remote_end;
}

int planner_pairs(const struct plan_run *runs, size_t n, uint32_t n_pairs,
		  struct plan_run **ret_runs, size_t *ret_n)
{
	struct plan_run *out = NULL;
	size_t total, bytes;

	if (n_pairs == 0 || __builtin_mul_overflow(n, (size_t)n_pairs, &total) ||
	    __builtin_mul_overflow(total, sizeof(*out), &bytes)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (total > 0) {
		out = malloc(bytes);
		if (!out) {
			return -ENOMEM;
		}
	}
	for (uint32_t k = 0; k < n_pairs; k++) {
		for (size_t i = 0; i < n; i++) {
			out[k * n + i] = runs[i];
			out[k * n + i].dest = k;
		}
	}
	*ret_runs = out;
	*ret_n = total;
	return 0;
}

int planner_scatter(const struct plan_dest *dests, size_t n, uint64_t local_len,
		    struct plan_run *runs, char *why, size_t why_size)
{
	for (size_t i = 0; i < n; i++) {
		const struct plan_dest *d = &dests[i];
		if (planner_check_range(d->local_offset, d->length, local_len) < 0) {
			snprintf(why, why_size,
				 "destination %zu: local range [%" PRIu64 ", +%" PRIu64
				 ") outside the local region of %" PRIu64 " bytes",
				 i, d->local_offset, d->length, local_len);
			return RDMAX_E_OUT_OF_RANGE;
		}
		if (planner_check_range(d->remote_offset, d->length, d->remote_len) < 0) {
			snprintf(why, why_size,
				 "destination %zu: remote range [%" PRIu64 ", +%" PRIu64
				 ") outside its region of %" PRIu64 " bytes",
				 i, d->remote_offset, d->length, d->remote_len);
			return RDMAX_E_OUT_OF_RANGE;
		}
		runs[i] = (struct plan_run){.local_offset = d->local_offset,
					    .remote_offset = d->remote_offset,
					    .length = d->length,
					    .dest = d->dest};
	}
	return 0;
}
