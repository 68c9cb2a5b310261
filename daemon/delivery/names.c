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
	struct owned_name link;
	uint64_t region_id;
	uint16_t desc_len;
	char name[NAMES_NAME_MAX + 1];
	uint8_t desc[];
};

_Static_assert(offsetof(struct name_entry, link) == 0, "an owned_name chain links the whole entry");

int names_init(struct name_table *table)
{
	memset(table, 0, sizeof(*table));
	return owned_names_init(&table->owned);
}

void names_fini(struct name_table *table)
{
	if (!table || !table->owned.by_hash.slots) {
		return;
	}
	owned_names_fini(&table->owned);
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
	for (struct owned_name *l = owned_names_chain(&table->owned, hash); l; l = l->next) {
		struct name_entry *e = (struct name_entry *)l;
		if (strlen(e->name) == len && memcmp(e->name, name, len) == 0) {
			return e;
		}
	}
	return NULL;
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
	uint32_t mine = owned_names_owner_count(&table->owned, owner);
	if (mine >= NAMES_MAX_PER_CLIENT || table->count >= NAMES_MAX_PER_NODE) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	e = calloc(1, sizeof(*e) + desc_len);
	if (!e) {
		return -ENOMEM;
	}
	e->link.owner = owner;
	e->link.hash = hash;
	e->region_id = region_id;
	e->desc_len = (uint16_t)desc_len;
	memcpy(e->name, name, len);
	memcpy(e->desc, desc, desc_len);
	ret = owned_names_link(&table->owned, &e->link);
	if (ret < 0) {
		free(e);
		return ret;
	}
	table->count++;
	return 0;
}

/* Unlink e from its chain and free it. */
static void drop(struct name_table *table, struct name_entry *e)
{
	owned_names_unlink(&table->owned, &e->link);
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
	if (!e || e->link.owner != owner) {
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

	if (!table || !table->owned.by_hash.slots ||
	    owned_names_owner_count(&table->owned, owner) == 0) {
		return 0;
	}
	/* Dropping changes the map under the iterator: start over after each pass that dropped. */
	while (again) {
		struct owned_name *chain;
		size_t iter = 0;
		again = false;
		while (!again && hmap_next(&table->owned.by_hash, &iter, NULL, (void **)&chain)) {
			for (struct owned_name *l = chain; l; l = l->next) {
				struct name_entry *e = (struct name_entry *)l;
				if (l->owner == owner &&
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
	if (!table || !table->owned.by_hash.slots) {
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
