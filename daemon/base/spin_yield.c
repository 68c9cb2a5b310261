/* SPDX-License-Identifier: MIT */
#include "spin_yield.h"

#include "util.h"

void spin_yield_init(struct spin_yield *y)
{
	y->every = SPIN_YIELD_MAX;
	y->backoff = 1;
	y->idle_passes = 0;
	y->yield_min_ns = 0;
	y->yielded_ns = 0;
}

void spin_yield_learn(struct spin_yield *y, uint64_t elapsed_ns, uint32_t passes)
{
	elapsed_ns -= MIN(y->yielded_ns, elapsed_ns); /* a pass's cost, not the yields' */
	y->yielded_ns = 0;
	uint64_t per_pass = passes ? elapsed_ns / passes : 0;
	uint64_t every = per_pass ? SPIN_YIELD_IDLE_NS / per_pass : SPIN_YIELD_MAX;

	y->every = (uint32_t)MAX(1, MIN(every, (uint64_t)SPIN_YIELD_MAX));
}

void spin_yield_done(struct spin_yield *y, uint64_t took_ns)
{
	y->yielded_ns += took_ns;
	if (y->yield_min_ns == 0 || took_ns < y->yield_min_ns) {
		y->yield_min_ns = MAX(took_ns, 1);
	}
	if (took_ns > 2 * y->yield_min_ns + SPIN_YIELD_RAN_NS) {
		y->backoff = 1; /* another task ran: it wants this CPU, keep giving way */
	} else if (y->backoff < SPIN_YIELD_BACKOFF_MAX) {
		y->backoff *= 2; /* no one ran: the yield only cost its system call */
	}
}
