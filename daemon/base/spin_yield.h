/* SPDX-License-Identifier: MIT */
/*
 * When the daemon's spin gives its CPU away: after as many empty passes in
 * a row as take about SPIN_YIELD_IDLE_NS, a number learnt from the spin's
 * own clock reads (yields left out). On a host a pass costs tens of
 * nanoseconds and the yield comes every few dozen passes (at most
 * SPIN_YIELD_MAX); under an emulator a pass costs microseconds and the
 * yield would come on nearly every one.
 *
 * A yield helps only where another task wants the CPU (a client or a peer
 * daemon on the same CPU, the kernel's socket work): one that returns as
 * fast as the cheapest seen ran no one, so the next waits twice as many
 * passes (up to SPIN_YIELD_BACKOFF_MAX times); one that took longer gave
 * the CPU away, and the next comes after the learnt count again. Under an
 * emulator a yield is a system call of microseconds, and yielding on every
 * pass to no one delayed the ring entries that arrived meanwhile
 * (docs/benchmarks.md, "The daemon's yield under the emulator").
 */
#ifndef RDMAXD_SPIN_YIELD_H
#define RDMAXD_SPIN_YIELD_H

#include <stdbool.h>
#include <stdint.h>

#define SPIN_YIELD_IDLE_NS     4000
#define SPIN_YIELD_MAX         64
#define SPIN_YIELD_BACKOFF_MAX 8
/* A yield this much longer than twice the cheapest one seen ran another task. */
#define SPIN_YIELD_RAN_NS 1000

struct spin_yield {
	uint32_t every;        /* empty passes in a row that take SPIN_YIELD_IDLE_NS */
	uint32_t backoff;      /* times every before a yield: 1 .. SPIN_YIELD_BACKOFF_MAX */
	uint32_t idle_passes;  /* empty passes since the last move or yield */
	uint64_t yield_min_ns; /* the cheapest yield seen: the system call, no one run */
	uint64_t yielded_ns;   /* time in yields since the last spin_yield_learn() */
};

void spin_yield_init(struct spin_yield *y);
/* The last `passes` passes took elapsed_ns, the yields among them included (left out here). */
void spin_yield_learn(struct spin_yield *y, uint64_t elapsed_ns, uint32_t passes);
/* A yield took took_ns: whether it ran another task decides when the next one comes. */
void spin_yield_done(struct spin_yield *y, uint64_t took_ns);
/* After a pass that moved something or not: whether to yield now (inline: every pass). */
static inline bool spin_yield_due(struct spin_yield *y, bool moved)
{
	if (moved) {
		y->idle_passes = 0;
		return false;
	}
	if (++y->idle_passes < y->every * y->backoff) {
		return false;
	}
	y->idle_passes = 0;
	return true;
}

#endif
