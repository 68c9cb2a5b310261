/* SPDX-License-Identifier: MIT */
#include "spin_yield.h"

#include "util.h"

void spin_yield_init(struct spin_yield *y)
{
	y->every = SPIN_YIELD_MAX;
	y->idle_passes = 0;
}

void spin_yield_learn(struct spin_yield *y, uint64_t elapsed_ns, uint32_t passes)
{
	uint64_t per_pass = passes ? elapsed_ns / passes : 0;
	uint64_t every = per_pass ? SPIN_YIELD_IDLE_NS / per_pass : SPIN_YIELD_MAX;

	y->every = (uint32_t)MAX(1, MIN(every, (uint64_t)SPIN_YIELD_MAX));
}
