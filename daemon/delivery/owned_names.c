/* SPDX-License-Identifier: MIT */
/*
 * Hash chains of owned entries and per-owner counts, shared by the mailbox
 * and named-region tables. Owns the chaining and the counting only: it never
 * looks at a name, never applies a limit and never allocates an entry (it
 * frees them only in owned_names_fini()).
 */
#include <stddef.h>

#include "owned_names.h"

_Static_assert(offsetof(struct owned_name, next) == 0,
	       "hmap_fini_chains() follows the first member");

static uint64_t owner_key(const void *owner)
{
	return (uint64_t)(uintptr_t)owner;
}

static int set_owner_count(struct owned_names *set, const void *owner, uint32_t n)
{
	return hmap_set_count(&set->per_owner, owner_key(owner), n);
}

int owned_names_init(struct owned_names *set)
{
	int ret = hmap_init(&set->by_hash, 64);

	if (ret < 0) {
		return ret;
	}
	ret = hmap_init(&set->per_owner, 16);
	if (ret < 0) {
		hmap_fini(&set->by_hash);
		return ret;
	}
	return 0;
}

void owned_names_fini(struct owned_names *set)
{
	hmap_fini_chains(&set->by_hash);
	hmap_fini(&set->per_owner);
}

struct owned_name *owned_names_chain(const struct owned_names *set, uint64_t hash)
{
	return hmap_get(&set->by_hash, hash);
}

uint32_t owned_names_owner_count(const struct owned_names *set, const void *owner)
{
	return hmap_count(&set->per_owner, owner_key(owner));
}

int owned_names_link(struct owned_names *set, struct owned_name *e)
{
	uint32_t mine = owned_names_owner_count(set, e->owner);
	int ret = set_owner_count(set, e->owner, mine + 1);

	if (ret < 0) {
		return ret;
	}
	e->next = hmap_get(&set->by_hash, e->hash);
	ret = hmap_put(&set->by_hash, e->hash, e);
	if (ret < 0) {
		set_owner_count(set, e->owner, mine);
		return ret;
	}
	return 0;
}

void owned_names_unlink(struct owned_names *set, struct owned_name *e)
{
	struct owned_name *head = hmap_get(&set->by_hash, e->hash);

	if (head == e) {
		if (e->next) {
			hmap_put(&set->by_hash, e->hash, e->next); /* replaces: cannot fail */
		} else {
			hmap_del(&set->by_hash, e->hash);
		}
	} else {
		struct owned_name *prev = head;
		while (prev->next != e) {
			prev = prev->next;
		}
		prev->next = e->next;
	}
	set_owner_count(set, e->owner, owned_names_owner_count(set, e->owner) - 1);
}
