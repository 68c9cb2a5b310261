/* SPDX-License-Identifier: MIT */
/*
 * The table under the node's mailboxes and named regions: entries chained by
 * the hash of their name, each with an owner, and how many entries each owner
 * holds. The name itself, its alphabet, the limits and what an entry carries
 * belong to the module that embeds this (mailbox.c, names.c).
 */
#ifndef RDMAXD_OWNED_NAMES_H
#define RDMAXD_OWNED_NAMES_H

#include <stdint.h>

#include "hmap.h"

/* The first member of every entry: hmap_fini_chains() follows next. */
struct owned_name {
	struct owned_name *next; /* same hash */
	const void *owner;
	uint64_t hash; /* of the name: the key of its chain */
};

struct owned_names {
	struct hmap by_hash;   /* hash of the name -> struct owned_name chain */
	struct hmap per_owner; /* owner -> number of its entries */
};

int owned_names_init(struct owned_names *set);
/* Free every entry (each a single allocation starting with its struct owned_name) and the maps. */
void owned_names_fini(struct owned_names *set);

/* The chain of entries whose names hash to hash, or NULL. */
struct owned_name *owned_names_chain(const struct owned_names *set, uint64_t hash);

/* How many entries owner holds. */
uint32_t owned_names_owner_count(const struct owned_names *set, const void *owner);

/*
 * Add e (owner and hash set, not in the table) and count it for its owner.
 * 0, or -ENOMEM with the table as it was (e is then still the caller's).
 */
int owned_names_link(struct owned_names *set, struct owned_name *e);

/* Take e out of its chain and out of its owner's count; freeing it is the caller's. */
void owned_names_unlink(struct owned_names *set, struct owned_name *e);

#endif
