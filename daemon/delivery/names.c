/* SPDX-License-Identifier: MIT */
/*
 * The node's named regions: names, their owners, the descriptor each one
 * stands for, and the per-client and per-node limits. Owns the table only;
 * ipc publishes and withdraws (it makes the descriptors), the transports and
 * ipc answer lookups from it. Never does I/O and never touches a region.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"
#include "rdmax.h"

struct name_entry {
	struct name_entry *next; /* same hash */
	const void *owner;
	uint64_t hash;
	uint64_t region_id;
	uint16_t desc_len;
	char name[NAMES_NAME_MAX + 1];
	uint8_t desc[];
};

_Static_assert(offsetof(struct name_entry, next) == 0,
	       "hmap_fini_chains() follows the first member");

static uint64_t owner_key(const void *owner)
{
	return (uint64_t)(uintptr_t)owner;
}

int names_init(struct name_table *table)
{
	int ret;

	memset(table, 0, sizeof(*table));
	ret = hmap_init(&table->by_hash, 64);
	if (ret < 0) {
		return ret;
	}
	ret = hmap_init(&table->per_owner, 16);
	if (ret < 0) {
		hmap_fini(&table->by_hash);
		return ret;
	}
	return 0;
}

void names_fini(struct name_table *table)
{
	if (!table || !table->by_hash.slots) {
		return;
	}
	hmap_fini_chains(&table->by_hash);
	hmap_fini(&table->per_owner);
	table->count = 0;
}

int names_check(const char *name, size_t len)
{
	if (!name || len == 0 || len > NAMES_NAME_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < len; i++) {
		char c = name[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || strchr("._:@+/-", c) != NULL;
		if (!ok || c == '\0') {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	return 0;
}

static struct name_entry *find(const struct name_table *table, const char *name, size_t len,
			       uint64_t hash)
{
	for (struct name_entry *e = hmap_get(&table->by_hash, hash); e; e = e->next) {
		if (strlen(e->name) == len && memcmp(e->name, name, len) == 0) {
			return e;
		}
	}
	return NULL;
}

static uint32_t owner_count(const struct name_table *table, const void *owner)
{
	return hmap_count(&table->per_owner, owner_key(owner));
}

static int set_owner_count(struct name_table *table, const void *owner, uint32_t n)
{
	return hmap_set_count(&table->per_owner, owner_key(owner), n);
}

int names_publish(struct name_table *table, const void *owner, const char *name, uint64_t region_id,
		  const uint8_t *desc, size_t desc_len)
{
	size_t len = name ? strnlen(name, NAMES_NAME_MAX + 1) : 0;
	struct name_entry *e;
	uint64_t hash;
	int ret;

	if (names_check(name, len) < 0 || !desc || desc_len == 0 || desc_len > DESC_MAX_BYTES) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	hash = hmap_hash_bytes(name, len);
	if (find(table, name, len, hash)) {
		return RDMAX_E_ALREADY_EXISTS;
	}
	uint32_t mine = owner_count(table, owner);
	if (mine >= NAMES_MAX_PER_CLIENT || table->count >= NAMES_MAX_PER_NODE) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	e = calloc(1, sizeof(*e) + desc_len);
	if (!e) {
		return -ENOMEM;
	}
	e->owner = owner;
	e->hash = hash;
	e->region_id = region_id;
	e->desc_len = (uint16_t)desc_len;
	memcpy(e->name, name, len);
	memcpy(e->desc, desc, desc_len);
	ret = set_owner_count(table, owner, mine + 1);
	if (ret < 0) {
		free(e);
		return ret;
	}
	e->next = hmap_get(&table->by_hash, hash);
	ret = hmap_put(&table->by_hash, hash, e);
	if (ret < 0) {
		set_owner_count(table, owner, mine);
		free(e);
		return ret;
	}
	table->count++;
	return 0;
}

/* Unlink e from its chain and free it. */
static void drop(struct name_table *table, struct name_entry *e)
{
	struct name_entry *head = hmap_get(&table->by_hash, e->hash);

	if (head == e) {
		if (e->next) {
			hmap_put(&table->by_hash, e->hash, e->next); /* replaces: cannot fail */
		} else {
			hmap_del(&table->by_hash, e->hash);
		}
	} else {
		struct name_entry *prev = head;
		while (prev->next != e) {
			prev = prev->next;
		}
		prev->next = e->next;
	}
	set_owner_count(table, e->owner, owner_count(table, e->owner) - 1);
	table->count--;
	free(e);
}

int names_unpublish(struct name_table *table, const void *owner, const char *name)
{
	size_t len = name ? strnlen(name, NAMES_NAME_MAX + 1) : 0;
	struct name_entry *e;

	if (names_check(name, len) < 0) {
		return RDMAX_E_NOT_FOUND;
	}
	e = find(table, name, len, hmap_hash_bytes(name, len));
	if (!e || e->owner != owner) {
		return RDMAX_E_NOT_FOUND;
	}
	drop(table, e);
	return 0;
}

/* Drop the entries of owner (and of region_id unless any_region); returns how many. */
static uint32_t drop_matching(struct name_table *table, const void *owner, bool any_region,
			      uint64_t region_id)
{
	uint32_t n = 0;
	bool again = true;

	if (!table || !table->by_hash.slots || owner_count(table, owner) == 0) {
		return 0;
	}
	/* Dropping changes the map under the iterator: start over after each pass that dropped. */
	while (again) {
		struct name_entry *chain;
		size_t iter = 0;
		again = false;
		while (!again && hmap_next(&table->by_hash, &iter, NULL, (void **)&chain)) {
			for (struct name_entry *e = chain; e; e = e->next) {
				if (e->owner == owner &&
				    (any_region || e->region_id == region_id)) {
					drop(table, e);
					n++;
					again = true;
					break;
				}
			}
		}
	}
	return n;
}

uint32_t names_unpublish_region(struct name_table *table, const void *owner, uint64_t region_id)
{
	return drop_matching(table, owner, false, region_id);
}

uint32_t names_release_owner(struct name_table *table, const void *owner)
{
	return drop_matching(table, owner, true, 0);
}

int names_lookup(struct name_table *table, const char *name, size_t len, uint8_t *buf, size_t size)
{
	struct name_entry *e;

	if (names_check(name, len) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (!table || !table->by_hash.slots) {
		return RDMAX_E_NOT_FOUND;
	}
	e = find(table, name, len, hmap_hash_bytes(name, len));
	if (!e) {
		table->missing++;
		return RDMAX_E_NOT_FOUND;
	}
	if (e->desc_len > size) {
		return -ENOSPC;
	}
	memcpy(buf, e->desc, e->desc_len);
	table->served++;
	return e->desc_len;
}

int names_serve(struct name_table *table, const char *node_name, const uint8_t *name, size_t len,
		uint8_t *buf, size_t size, char *text, size_t text_size)
{
	int ret = names_lookup(table, (const char *)name, len, buf, size);

	if (ret == RDMAX_E_INVALID_ARGUMENT) {
		snprintf(text, text_size,
			 "region name is not valid (1 to %u characters of A-Z a-z 0-9 . _ : @ + / "
			 "-)",
			 NAMES_NAME_MAX);
	} else if (ret == RDMAX_E_NOT_FOUND) {
		snprintf(text, text_size, "no region is published as '%.*s' on node '%s'",
			 (int)(len > 64 ? 64 : len), (const char *)name, node_name);
	} else if (ret < 0) {
		snprintf(text, text_size, "lookup on node '%s' failed: %s", node_name,
			 rdmax_strerror(ret));
	}
	return ret;
}
