/* SPDX-License-Identifier: MIT */
/*
 * Immediate counters, one namespace per client. A job carrying imm X that
 * fully landed in a region counts under X in the namespace of the client
 * that registered that region: the counter is bound to the memory it was
 * written through, so one client can neither claim, fire nor fill another's
 * counters. A client claims X in its own namespace with expect(X, n); the
 * claim fires once when the counter reaches n, and n is then taken off the
 * counter. A standing claim stays and fires again each time n more have
 * landed. Landings that arrive before the expect are kept, so there is no
 * race between a sender and a receiver that subscribes late; reset drops
 * them, and a namespace ends with its client.
 */
#ifndef RDMAXD_IMM_H
#define RDMAXD_IMM_H

#include <stdbool.h>
#include <stdint.h>

#include "hmap.h"

typedef void (*imm_fired_cb)(void *owner, uint32_t imm, uint64_t count, void *arg);

/* Unclaimed counters idle this long may be evicted when a namespace is full. */
#define IMM_IDLE_EVICT_MS 10000

struct imm_table {
	struct hmap spaces;    /* owner -> struct imm_space */
	uint32_t max_counters; /* over all namespaces */
	uint32_t n_counters;
	imm_fired_cb fired;
	void *fired_arg;
	uint64_t dropped; /* landings not counted: no namespace, or its share was full */
};

int imm_table_init(struct imm_table *table, uint32_t max_counters, imm_fired_cb fired, void *arg);
void imm_table_fini(struct imm_table *table);

/*
 * Open the namespace of owner (a client session). Its counters are also
 * counted in *uid_counters (shared by the clients of one uid; NULL: none),
 * which may not pass uid_max.
 */
int imm_space_open(struct imm_table *table, void *owner, uint32_t *uid_counters, uint32_t uid_max);

/* imm_expect() flags. */
#define IMM_RESET    0x1u /* drop the landings counted so far first */
#define IMM_STANDING 0x2u /* fire every count landings until released or claimed anew */

/*
 * Claim imm in owner's namespace and wait for count landings; a claim
 * replaces the value's earlier one. Errors: RDMAX_E_INVALID_ARGUMENT
 * (count 0), RDMAX_E_NOT_FOUND (no namespace), RDMAX_E_RESOURCE_EXHAUSTED
 * (every counter the share allows is claimed). May fire the callback before
 * returning when enough have landed already.
 */
int imm_expect(struct imm_table *table, void *owner, uint32_t imm, uint64_t count,
	       unsigned int flags);

/*
 * End owner's claim of imm, one-shot or standing; landings counted and not
 * consumed stay. RDMAX_E_NOT_FOUND when the value is not claimed.
 */
int imm_release(struct imm_table *table, void *owner, uint32_t imm);

/*
 * One job carrying imm landed in a region of owner (region->owner). Not
 * counted when owner has no namespace (gone) or its share is full.
 */
void imm_landed(struct imm_table *table, void *owner, uint32_t imm);

/* Close owner's namespace (client disconnected): its claims and counts end. */
void imm_release_owner(struct imm_table *table, void *owner);

/* Landings in owner's namespace so far not consumed by a fired expectation. */
uint64_t imm_count(const struct imm_table *table, void *owner, uint32_t imm);

#endif
