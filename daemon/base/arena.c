/* SPDX-License-Identifier: MIT */
/*
 * Bump allocation over one fixed buffer, with a malloc'd overflow chain, for
 * messages decoded and dropped one at a time (ring entries). Owns only its
 * memory; never hands out a pointer that survives arena_reset().
 */
#include <errno.h>
#include <stdlib.h>

#include "arena.h"

#define ARENA_ALIGN 16u

struct arena_chunk {
	struct arena_chunk *next;
	uint64_t pad; /* keeps the payload 16-byte aligned */
};

static void *pb_alloc(void *data, size_t size)
{
	return arena_alloc(data, size);
}

static void pb_free(void *data, void *ptr)
{
	/* Everything goes at arena_reset(); protobuf-c may free a string it replaces. */
	(void)data;
	(void)ptr;
}

int arena_init(struct arena *a, size_t cap)
{
	cap = (cap + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
	a->buf = aligned_alloc(ARENA_ALIGN, cap ? cap : ARENA_ALIGN);
	if (!a->buf) {
		return -ENOMEM;
	}
	a->cap = cap;
	a->used = 0;
	a->spill = NULL;
	a->spills = 0;
	a->pb.alloc = pb_alloc;
	a->pb.free = pb_free;
	a->pb.allocator_data = a;
	return 0;
}

void arena_fini(struct arena *a)
{
	if (!a) {
		return;
	}
	arena_reset(a);
	free(a->buf);
	a->buf = NULL;
	a->cap = 0;
}

void *arena_alloc(struct arena *a, size_t size)
{
	size_t need = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);

	if (need >= size && need <= a->cap - a->used) {
		void *p = a->buf + a->used;
		a->used += need;
		return p;
	}
	if (size > SIZE_MAX - sizeof(struct arena_chunk)) {
		return NULL;
	}
	struct arena_chunk *c = malloc(sizeof(*c) + size);
	if (!c) {
		return NULL;
	}
	c->next = a->spill;
	a->spill = c;
	a->spills++;
	return c + 1;
}

void arena_reset(struct arena *a)
{
	while (a->spill) {
		struct arena_chunk *c = a->spill;
		a->spill = c->next;
		free(c);
	}
	a->used = 0;
}

ProtobufCAllocator *arena_pb_allocator(struct arena *a)
{
	return &a->pb;
}
