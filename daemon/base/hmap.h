/* SPDX-License-Identifier: MIT */
/* Open-addressing hash map from non-zero uint64 keys to pointers. */
#ifndef RDMAXD_HMAP_H
#define RDMAXD_HMAP_H

#include <stddef.h>
#include <stdint.h>

struct hmap_slot {
	uint64_t key; /* 0 = empty, UINT64_MAX = deleted */
	void *value;
};

struct hmap {
	struct hmap_slot *slots;
	size_t capacity; /* power of two */
	size_t count;
	size_t tombstones;
};

int hmap_init(struct hmap *map, size_t initial_capacity);
void hmap_fini(struct hmap *map);
/* Insert or replace; key must not be 0 or UINT64_MAX. Returns 0 or -ENOMEM. */
int hmap_put(struct hmap *map, uint64_t key, void *value);
void *hmap_get(const struct hmap *map, uint64_t key);
/* Remove and return the value, or NULL. */
void *hmap_del(struct hmap *map, uint64_t key);

/* FNV-1a of len bytes of s, never 0 or UINT64_MAX: a key for names. */
uint64_t hmap_hash_bytes(const void *s, size_t len);

/*
 * Free every value and the chain it heads, for maps whose values are lists
 * chained by their first member (a name table's same-hash entries), then the map.
 */
void hmap_fini_chains(struct hmap *map);

/* Maps of per-key counts (an owner's names): the count, 0 when absent. */
uint32_t hmap_count(const struct hmap *map, uint64_t key);
/* Set the count; 0 removes the key. 0 or -ENOMEM. */
int hmap_set_count(struct hmap *map, uint64_t key, uint32_t n);

/* Iterate: for (size_t i = 0; hmap_next(map, &i, &key, &value);) */
int hmap_next(const struct hmap *map, size_t *iter, uint64_t *ret_key, void **ret_value);

#endif
