/* SPDX-License-Identifier: MIT */
/*
 * Per-uid counts with a limit: how many of something each uid holds (peer
 * connections opened for its jobs). An entry exists while its count is above
 * zero, so the table holds at most one entry per uid that holds something.
 */
#ifndef RDMAXD_UID_COUNTS_H
#define RDMAXD_UID_COUNTS_H

#include <stdint.h>

#include "hmap.h"

struct uid_counts {
	struct hmap by_uid; /* uid+1 -> count (hmap_count) */
};

/* A zeroed table is ready too: it allocates on first use. */
int uid_counts_init(struct uid_counts *counts);
/* Accepts a table that was never initialised (zeroed). */
void uid_counts_fini(struct uid_counts *counts);

/* Count one more for uid: 0, RDMAX_E_RESOURCE_EXHAUSTED at limit, or -ENOMEM. */
int uid_counts_take(struct uid_counts *counts, uint32_t uid, uint32_t limit);

/* Give one back (a no-op when uid holds none). */
void uid_counts_put(struct uid_counts *counts, uint32_t uid);

/* How many uid holds. */
uint32_t uid_counts_get(const struct uid_counts *counts, uint32_t uid);

#endif
