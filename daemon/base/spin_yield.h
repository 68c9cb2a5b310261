/* SPDX-License-Identifier: MIT */
/*
 * When the daemon's spin gives its CPU away: after as many empty passes in
 * a row as take about SPIN_YIELD_IDLE_NS, a number learnt from the spin's
 * own clock reads. On a host a pass costs tens of nanoseconds and the
 * yield comes every few dozen passes (at most SPIN_YIELD_MAX), so a ring
 * entry seldom arrives during the system call; under an emulator a pass
 * costs microseconds and the yield comes on nearly every one, so the spin
 * does not keep a vCPU from the emulated NIC's work (docs/benchmarks.md,
 * "KV over TCP").
 */
#ifndef RDMAXD_SPIN_YIELD_H
#define RDMAXD_SPIN_YIELD_H

#include <stdbool.h>
#include <stdint.h>

#define SPIN_YIELD_IDLE_NS 4000
#define SPIN_YIELD_MAX     64

struct spin_yield {
	uint32_t every;       /* empty passes in a row before a yield */
	uint32_t idle_passes; /* empty passes since the last move or yield */
};

void spin_yield_init(struct spin_yield *y);
/* The last `passes` passes took elapsed_ns, yields included. */
void spin_yield_learn(struct spin_yield *y, uint64_t elapsed_ns, uint32_t passes);
/* After a pass that moved something or not: whether to yield now (inline: every pass). */
static inline bool spin_yield_due(struct spin_yield *y, bool moved)
{
	if (moved) {
		y->idle_passes = 0;
		return false;
	}
	if (++y->idle_passes < y->every) {
		return false;
	}
	y->idle_passes = 0;
	return true;
}

#endif
