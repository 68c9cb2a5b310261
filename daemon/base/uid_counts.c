/* SPDX-License-Identifier: MIT */
/*
 * Per-uid counts with a limit (see uid_counts.h). Only counting: what is
 * counted, and when it is given back, is the caller's; never logs.
 */
#include <errno.h>
#include <string.h>

#include "rdmax.h"
#include "uid_counts.h"

int uid_counts_init(struct uid_counts *counts)
{
	memset(counts, 0, sizeof(*counts));
	return hmap_init(&counts->by_uid, 16);
}

void uid_counts_fini(struct uid_counts *counts)
{
	if (counts && counts->by_uid.slots) {
		hmap_fini(&counts->by_uid);
	}
}

int uid_counts_take(struct uid_counts *counts, uint32_t uid, uint32_t limit)
{
	if (!counts->by_uid.slots && hmap_init(&counts->by_uid, 16) < 0) {
		return -ENOMEM;
	}
	uint32_t n = hmap_count(&counts->by_uid, (uint64_t)uid + 1);

	if (n >= limit) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	return hmap_set_count(&counts->by_uid, (uint64_t)uid + 1, n + 1);
}

void uid_counts_put(struct uid_counts *counts, uint32_t uid)
{
	uint32_t n = uid_counts_get(counts, uid);

	if (n > 0) {
		/* Lowering a count never allocates. */
		(void)hmap_set_count(&counts->by_uid, (uint64_t)uid + 1, n - 1);
	}
}

uint32_t uid_counts_get(const struct uid_counts *counts, uint32_t uid)
{
	return counts->by_uid.slots ? hmap_count(&counts->by_uid, (uint64_t)uid + 1) : 0;
}
