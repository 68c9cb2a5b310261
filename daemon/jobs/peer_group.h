/* SPDX-License-Identifier: MIT */
/*
 * Peer groups: a client's named list of remote region descriptors, decoded
 * and resolved to transports once, so that repeated SCATTER and BARRIER jobs
 * over the same peers do no per-job parsing. Members on one daemon share a
 * node index: imm counting and barriers are per node.
 */
#ifndef RDMAXD_PEER_GROUP_H
#define RDMAXD_PEER_GROUP_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "desc.h"
#include "hmap.h"

#define PEER_GROUP_MAX_PER_CLIENT 64   /* groups one client may hold */
#define PEER_GROUP_MAX_MEMBERS    1024 /* descriptors in one group */

struct rdmaxd;
struct transport;

struct peer_member {
	uint64_t instance_id; /* the member's daemon start */
	uint64_t region_id;
	uint64_t region_key;
	uint64_t length;             /* of the member's region */
	uint32_t node;               /* index of the member's daemon within the group */
	struct transport *transport; /* NULL: this daemon */
	struct endpoint peer;        /* where the transport reaches it */
	/* Every endpoint of its descriptor: the device pairs jobs stripe over. */
	uint32_t n_endpoints;
	struct endpoint endpoints[DESC_MAX_ENDPOINTS];
};

struct peer_group {
	uint64_t handle;
	uint32_t refs; /* the owner's table + one per job that uses it */
	uint32_t n_members;
	uint32_t n_nodes;      /* distinct daemons among the members */
	uint32_t *node_member; /* per node: its first member (a barrier's target) */
	struct peer_member members[];
};

struct peer_group_table {
	struct hmap by_handle; /* handle -> struct peer_group */
	uint64_t next_handle;
	uint32_t count;
};

int peer_group_table_init(struct peer_group_table *table);
/* Drop the table's references; groups still used by jobs live until those end. */
void peer_group_table_fini(struct peer_group_table *table);

/*
 * Decode n descriptors, resolve each to a transport of this daemon (or this
 * daemon itself) and store the group under a new handle. Errors, with the
 * reason in why: RDMAX_E_INVALID_ARGUMENT (no descriptor, a malformed one),
 * RDMAX_E_RESOURCE_EXHAUSTED (too many members or groups),
 * RDMAX_E_UNREACHABLE (no endpoint usable by this daemon), -ENOMEM.
 */
int peer_group_create(struct rdmaxd *daemon, struct peer_group_table *table,
		      const ProtobufCBinaryData *descs, size_t n, uint64_t *ret_handle, char *why,
		      size_t why_size);

/* Forget the handle; RDMAX_E_NOT_FOUND when unknown. Jobs using it keep it alive. */
int peer_group_destroy(struct peer_group_table *table, uint64_t handle);

/* The group with this handle, or NULL. */
struct peer_group *peer_group_find(const struct peer_group_table *table, uint64_t handle);

void peer_group_get(struct peer_group *group);
/* Accepts NULL. */
void peer_group_put(struct peer_group *group);

#endif
