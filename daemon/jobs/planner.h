/* SPDX-License-Identifier: MIT */
/*
 * Job planning: pure functions that turn the page lists of a PAGED_WRITE or
 * PAGED_READ and
 * the destinations of a SCATTER into runs (contiguous byte ranges on both
 * sides), with every range, overlap and overflow check done once, before any
 * byte moves. The engine cuts runs into xfers of at most chunk_bytes.
 */
#ifndef RDMAXD_PLANNER_H
#define RDMAXD_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h" /* struct plan_run: xfers carry runs */

/* A page list of one side: page i starts at offset + indices[i] * stride. */
struct plan_pages {
	uint64_t offset;
	uint64_t stride; /* 0: page_len */
	const uint32_t *indices;
	size_t count;
};

/*
 * Plan a paged write of src's pages (in a local region of src_len bytes)
 * onto dst's pages (in a remote region of dst_len bytes), pairwise in list
 * order. Runs of pages contiguous on both sides are merged while the run
 * stays within max_run bytes (a single page longer than max_run stays one
 * run). Errors, with the reason in why:
 * RDMAX_E_INVALID_ARGUMENT: page_len 0, lists of different lengths, a stride
 * below page_len (pages would overlap), a destination page listed twice;
 * RDMAX_E_OUT_OF_RANGE: a page outside its region, or whose offset
 * overflows 64 bits (naming the side, the page index and the list entry);
 * -ENOMEM.
 * On success *ret_runs (malloc'd, NULL when there are no pages) holds
 * *ret_n runs.
 */
int planner_paged(uint64_t page_len, const struct plan_pages *src, uint64_t src_len,
		  const struct plan_pages *dst, uint64_t dst_len, uint64_t max_run,
		  struct plan_run **ret_runs, size_t *ret_n, char *why, size_t why_size);

/*
 * Plan a paged read: remote's pages (in a remote region of remote_len bytes)
 * into local's pages (in a local region of local_len bytes), pairwise in list
 * order; the same merging and errors as planner_paged(), with the local
 * pages as the destination (they must not repeat) and the remote pages as
 * the source.
 */
int planner_paged_read(uint64_t page_len, const struct plan_pages *local, uint64_t local_len,
		       const struct plan_pages *remote, uint64_t remote_len, uint64_t max_run,
		       struct plan_run **ret_runs, size_t *ret_n, char *why, size_t why_size);

/*
 * The bytes a plan reaches on each side: the largest offset + length of its
 * runs (0 and 0 for none). A paged job's further region pairs must be at
 * least this long on their side.
 */
void planner_extent(const struct plan_run *runs, size_t n, uint64_t *ret_local_end,
		    uint64_t *ret_remote_end);

/*
 * The plan of a paged job of n_pairs region pairs that share one pair of
 * page lists: the n runs repeated once per pair, pair-major (every run of
 * pair 0, then of pair 1, ...), each copy's dest the pair's index. Errors:
 * RDMAX_E_INVALID_ARGUMENT for n_pairs 0 or a plan whose size overflows,
 * -ENOMEM. On success *ret_runs (malloc'd, NULL when n is 0) holds *ret_n
 * runs.
 */
int planner_pairs(const struct plan_run *runs, size_t n, uint32_t n_pairs,
		  struct plan_run **ret_runs, size_t *ret_n);

/* One destination of a scatter, as the engine resolved it. */
struct plan_dest {
	uint64_t local_offset;
	uint64_t remote_offset;
	uint64_t length;
	uint64_t remote_len; /* length of the destination region */
	uint32_t dest;       /* the engine's index for it */
};

/*
 * Check every destination of a scatter against the local region (local_len
 * bytes) and its own region, and write one run per destination into runs
 * (room for n). Errors: RDMAX_E_OUT_OF_RANGE naming the destination entry
 * and side.
 */
int planner_scatter(const struct plan_dest *dests, size_t n, uint64_t local_len,
		    struct plan_run *runs, char *why, size_t why_size);

/* 0 when [offset, offset + length) lies inside len bytes (no overflow), else RDMAX_E_OUT_OF_RANGE.
 */
int planner_check_range(uint64_t offset, uint64_t length, uint64_t len);

/* Xfers a run of length bytes becomes with chunk bytes each: ceil(length / chunk), at least 1. */
uint64_t planner_run_xfers(uint64_t length, uint64_t chunk);

#endif
