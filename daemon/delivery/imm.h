/* SPDX-License-Identifier: MIT */
/*
 * Immediate counters. Every job that carried imm X and fully landed on this
 * node increments counter X. A client claims X with expect(X, n); the claim
 * fires once when the counter reaches n, and n is then taken off the counter.
 * Landings that arrive before the expect are kept, so there is no race
 * between a sender and a receiver that subscribes late.
 */
#ifndef RDMAXD_IMM_H
#define RDMAXD_IMM_H

#include <stdint.h>

#include "hmap.h"

typedef void (*imm_fired_cb)(void *owner, uint32_t imm, uint64_t count, void *arg);

struct imm_table {
	struct hmap counters; /* key imm+1 -> struct imm_counter */
	uint32_t max_counters;
	imm_fired_cb fired;
	void *fired_arg;
	uint64_t dropped; /* landings not counted because the table was full */
};

int imm_table_init(struct imm_table *table, uint32_t max_counters, imm_fired_cb fired, void *arg);
void imm_table_fini(struct imm_table *table);

/*
 * Claim imm for owner and wait for count landings. Errors:
 * RDMAX_E_ALREADY_EXISTS (claimed by another owner),
 * RDMAX_E_INVALID_ARGUMENT (count 0), RDMAX_E_RESOURCE_EXHAUSTED (table full).
 * May fire the callback before returning when enough have landed already.
 */
int imm_expect(struct imm_table *table, void *owner, uint32_t imm, uint64_t count);

/* One job carrying imm landed. */
void imm_landed(struct imm_table *table, uint32_t imm);

/* Drop every claim of owner (client disconnected). */
void imm_release_owner(struct imm_table *table, void *owner);

/* Landings so far not consumed by a fired expectation. */
uint64_t imm_count(const struct imm_table *table, uint32_t imm);

#endif
