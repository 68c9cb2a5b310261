/* SPDX-License-Identifier: MIT */
/*
 * A bump allocator for decoding one message at a time: protobuf-c unpacks
 * into it (arena_pb_allocator()), nothing is freed one by one, and
 * arena_reset() gives everything back at once. Allocations beyond the fixed
 * buffer fall back to malloc and are freed by arena_reset(), so any input
 * decodes whatever its size; the buffer only decides which inputs need no
 * malloc at all.
 */
#ifndef RDMAXD_ARENA_H
#define RDMAXD_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

struct arena_chunk;

struct arena {
	uint8_t *buf; /* cap bytes, 16-byte aligned */
	size_t cap;
	size_t used;
	struct arena_chunk *spill; /* malloc'd beyond buf, freed by arena_reset() */
	size_t spills;             /* allocations that took the fallback, ever (for tests) */
	ProtobufCAllocator pb;
};

/* A buffer of cap bytes (rounded up to 16). 0 or -ENOMEM. */
int arena_init(struct arena *a, size_t cap);
/* Frees the buffer and what spilled; accepts a zeroed arena. */
void arena_fini(struct arena *a);
/* size bytes, 16-byte aligned; NULL only when the fallback malloc fails. */
void *arena_alloc(struct arena *a, size_t size);
/* Everything allocated since the last reset is gone. */
void arena_reset(struct arena *a);
/*
 * The allocator to hand protobuf-c's unpack: its free is a no-op, so never
 * call *_free_unpacked() with it; arena_reset() releases the message.
 */
ProtobufCAllocator *arena_pb_allocator(struct arena *a);

#endif
