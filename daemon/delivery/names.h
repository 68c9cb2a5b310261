/* SPDX-License-Identifier: MIT */
/*
 * Named regions: the names this node's clients published for their regions,
 * answered to lookups from peer daemons (over either transport) and from
 * local clients. A name is unique per node; each entry keeps the region's
 * encoded descriptor as it was made at publication, so serving a lookup is a
 * copy.
 */
#ifndef RDMAXD_NAMES_H
#define RDMAXD_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "desc.h"
#include "owned_names.h"

#define NAMES_NAME_MAX       128  /* bytes of a name: [A-Za-z0-9._:@+/-] */
#define NAMES_MAX_PER_CLIENT 256  /* names one client may hold */
#define NAMES_MAX_PER_NODE   4096 /* names published on this node */

struct name_table {
	struct owned_names owned; /* struct name_entry chains; owner -> number of its names */
	uint32_t count;
	uint64_t served;  /* lookups answered with a descriptor */
	uint64_t missing; /* lookups of a name nobody published here */
};

int names_init(struct name_table *table);
/* Free every entry. Accepts a zeroed table that was never initialised. */
void names_fini(struct name_table *table);

/* 0 for a usable name of len bytes, else RDMAX_E_INVALID_ARGUMENT. */
int names_check(const char *name, size_t len);

/*
 * Publish desc (desc_len bytes, an encoded RegionDesc) of owner's region
 * region_id under name. Errors: RDMAX_E_INVALID_ARGUMENT (bad name or
 * descriptor size), RDMAX_E_ALREADY_EXISTS (published on this node, by
 * anyone), RDMAX_E_RESOURCE_EXHAUSTED (per-client or per-node limit), -ENOMEM.
 */
int names_publish(struct name_table *table, const void *owner, const char *name, uint64_t region_id,
		  const uint8_t *desc, size_t desc_len);

/* Withdraw owner's name; RDMAX_E_NOT_FOUND when owner holds none by that name. */
int names_unpublish(struct name_table *table, const void *owner, const char *name);

/* Withdraw every name of owner's region (deregistration); returns how many. */
uint32_t names_unpublish_region(struct name_table *table, const void *owner, uint64_t region_id);

/* Withdraw every name of owner (the client left); returns how many. */
uint32_t names_release_owner(struct name_table *table, const void *owner);

/*
 * The descriptor published under name (len bytes, not NUL-terminated) into
 * buf. \return its length, RDMAX_E_INVALID_ARGUMENT (bad name),
 * RDMAX_E_NOT_FOUND (nobody published it; also for a NULL table) or -ENOSPC.
 */
int names_lookup(struct name_table *table, const char *name, size_t len, uint8_t *buf, size_t size);

/*
 * A lookup from a peer daemon: like names_lookup(), and on failure a reason
 * for the peer in text (names node_name).
 */
int names_serve(struct name_table *table, const char *node_name, const uint8_t *name, size_t len,
		uint8_t *buf, size_t size, char *text, size_t text_size);

#endif
