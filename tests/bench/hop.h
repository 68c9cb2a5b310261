/* SPDX-License-Identifier: MIT */
/*
 * hop.h: what the two process-hop references (shm-pingpong, verbs-hop)
 * share: the spin of a waiting process (a pause instruction, or a
 * sched_yield() per poll as librdmax does by default), the clock, and the
 * order of latencies for percentiles. Header-only: each is one program.
 */
#ifndef RDMAX_BENCH_HOP_H
#define RDMAX_BENCH_HOP_H

#include <sched.h>
#include <stdint.h>
#include <time.h>

/* Set by the program's --yield option. */
static int hop_yield;

static inline void hop_relax(void)
{
	if (hop_yield) {
		sched_yield();
		return;
	}
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

static inline uint64_t hop_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* qsort() order of uint64_t latencies. */
static inline int hop_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

#endif
