/* SPDX-License-Identifier: MIT */
/* Open-addressing hash map (linear probing) from uint64 keys to pointers. */
#include <errno.h>
#include <stdlib.h>

#include "hmap.h"

#define HMAP_EMPTY   0
#define HMAP_DELETED UINT64_MAX

static uint64_t mix(uint64_t x)
{
	/* splitmix64 finaliser: ids are sequential, spread them. */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

int hmap_init(struct hmap *map, size_t initial_capacity)
{
	size_t cap = 16;

	while (cap < initial_capacity) {
		cap <<= 1;
	}
	map->slots = calloc(cap, sizeof(*map->slots));
	if (!map->slots) {
		return -ENOMEM;
	}
	map->capacity = cap;
	map->count = 0;
	map->tombstones = 0;
	return 0;
}

void hmap_fini(struct hmap *map)
{
	free(map->slots);
	map->slots = NULL;
	map->capacity = 0;
	map->count = 0;
	map->tombstones = 0;
}

static struct hmap_slot *find(const struct hmap *map, uint64_t key)
{
	size_t mask = map->capacity - 1;

	for (size_t i = mix(key) & mask, n = 0; n < map->capacity; i = (i + 1) & mask, n++) {
		struct hmap_slot *slot = &map->slots[i];
		if (slot->key == HMAP_EMPTY) {
			return NULL;
		}
		if (slot->key == key) {
			return slot;
		}
	}
	return NULL;
}

static int resize(struct hmap *map, size_t capacity)
{
	struct hmap_slot *old = map->slots;
	size_t old_cap = map->capacity;
	struct hmap_slot *slots = calloc(capacity, sizeof(*slots));

	if (!slots) {
		return -ENOMEM;
	}
	map->slots = slots;
	map->capacity = capacity;
	map->count = 0;
	map->tombstones = 0;
	for (size_t i = 0; i < old_cap; i++) {
		if (old[i].key != HMAP_EMPTY && old[i].key != HMAP_DELETED) {
			size_t mask = capacity - 1;
			size_t j = mix(old[i].key) & mask;
			while (slots[j].key != HMAP_EMPTY) {
				j = (j + 1) & mask;
			}
			slots[j] = old[i];
			map->count++;
		}
	}
	free(old);
	return 0;
}

int hmap_put(struct hmap *map, uint64_t key, void *value)
{
	struct hmap_slot *slot = find(map, key);

	if (key == HMAP_EMPTY || key == HMAP_DELETED) {
		return -EINVAL;
	}
	if (slot) {
		slot->value = value;
		return 0;
	}
	if ((map->count + map->tombstones + 1) * 4 > map->capacity * 3) {
		size_t cap = map->capacity;
		if ((map->count + 1) * 2 > cap) {
			cap *= 2;
		}
		int ret = resize(map, cap);
		if (ret < 0) {
			return ret;
		}
	}
	size_t mask = map->capacity - 1;
	size_t i = mix(key) & mask;
	while (map->slots[i].key != HMAP_EMPTY && map->slots[i].key != HMAP_DELETED) {
		i = (i + 1) & mask;
	}
	if (map->slots[i].key == HMAP_DELETED) {
		map->tombstones--;
	}
	map->slots[i].key = key;
	map->slots[i].value = value;
	map->count++;
	return 0;
}

void *hmap_get(const struct hmap *map, uint64_t key)
{
	if (key == HMAP_EMPTY || key == HMAP_DELETED) {
		return NULL;
	}
	struct hmap_slot *slot = find(map, key);
	return slot ? slot->value : NULL;
}

void *hmap_del(struct hmap *map, uint64_t key)
{
	if (key == HMAP_EMPTY || key == HMAP_DELETED) {
		return NULL;
	}
	struct hmap_slot *slot = find(map, key);
	if (!slot) {
		return NULL;
	}
	void *value = slot->value;
	size_t mask = map->capacity - 1;
	size_t i = (size_t)(slot - map->slots);

	slot->value = NULL;
	map->count--;
	if (map->slots[(i + 1) & mask].key != HMAP_EMPTY) {
		/* A probe for a later key may pass through this slot. */
		slot->key = HMAP_DELETED;
		map->tombstones++;
		return value;
	}
	/*
	 * No probe passes an empty slot, so this one and the tombstones just
	 * before it end every probe that reaches them: all become empty. Nothing
	 * moves, so an iteration in progress stays valid. Without this a map
	 * with a key added and removed per job fills with tombstones until a
	 * rehash, and every miss walks them.
	 */
	slot->key = HMAP_EMPTY;
	for (i = (i - 1) & mask; map->slots[i].key == HMAP_DELETED; i = (i - 1) & mask) {
		map->slots[i].key = HMAP_EMPTY;
		map->tombstones--;
	}
	return value;
}

int hmap_next(const struct hmap *map, size_t *iter, uint64_t *ret_key, void **ret_value)
{
	while (*iter < map->capacity) {
		struct hmap_slot *slot = &map->slots[(*iter)++];
		if (slot->key != HMAP_EMPTY && slot->key != HMAP_DELETED) {
			if (ret_key) {
				*ret_key = slot->key;
			}
			if (ret_value) {
				*ret_value = slot->value;
			}
			return 1;
		}
	}
	return 0;
}

uint64_t hmap_hash_bytes(const void *s, size_t len)
{
	const unsigned char *p = s;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h == 0 || h == UINT64_MAX ? 1 : h;
}

void hmap_fini_chains(struct hmap *map)
{
	void *value;
	size_t iter = 0;

	while (hmap_next(map, &iter, NULL, &value)) {
		while (value) {
			void *next = *(void **)value;
			free(value);
			value = next;
		}
	}
	hmap_fini(map);
}

uint32_t hmap_count(const struct hmap *map, uint64_t key)
{
	return (uint32_t)(uintptr_t)hmap_get(map, key);
}

int hmap_set_count(struct hmap *map, uint64_t key, uint32_t n)
{
	if (n == 0) {
		hmap_del(map, key);
		return 0;
	}
	return hmap_put(map, key, (void *)(uintptr_t)n);
}
