/* SPDX-License-Identifier: MIT */
/*
 * Peer groups of one client: decoding and resolving descriptors once, the
 * node index of each member, handles and references. Never does network
 * I/O and never touches region memory; the engine uses the resolved members
 * and the remote daemon still validates every access.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer_group.h"
#include "discovery.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"

int peer_group_table_init(struct peer_group_table *table)
{
	memset(table, 0, sizeof(*table));
	table->next_handle = 1;
	return hmap_init(&table->by_handle, 8);
}

void peer_group_table_fini(struct peer_group_table *table)
{
	struct peer_group *group;
	size_t iter = 0;

	if (!table || !table->by_handle.slots) {
		return;
	}
	while (hmap_next(&table->by_handle, &iter, NULL, (void **)&group)) {
		peer_group_put(group);
	}
	hmap_fini(&table->by_handle);
	table->count = 0;
}

void peer_group_get(struct peer_group *group)
{
	group->refs++;
}

void peer_group_put(struct peer_group *group)
{
	if (!group || --group->refs > 0) {
		return;
	}
	free(group->node_member);
	free(group);
}

/* Members of one daemon start share a node; groups are small, a linear scan will do. */
static uint32_t node_of(struct peer_group *group, uint32_t upto, uint64_t instance)
{
	for (uint32_t i = 0; i < upto; i++) {
		if (group->members[i].instance_id == instance) {
			return group->members[i].node;
		}
	}
	group->node_member[group->n_nodes] = upto;
	return group->n_nodes++;
}

int peer_group_create(struct rdmaxd *daemon, struct peer_group_table *table,
		      const ProtobufCBinaryData *descs, size_t n, uint64_t *ret_handle, char *why,
		      size_t why_size)
{
	struct peer_group *group;
	struct remote_desc desc;
	int ret;

	if (n == 0) {
		snprintf(why, why_size, "a peer group needs at least one descriptor");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (n > PEER_GROUP_MAX_MEMBERS) {
		snprintf(why, why_size, "%zu descriptors in one peer group; the limit is %u", n,
			 PEER_GROUP_MAX_MEMBERS);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	if (table->count >= PEER_GROUP_MAX_PER_CLIENT) {
		snprintf(why, why_size, "the client already has %u peer groups (limit)",
			 table->count);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	group = calloc(1, sizeof(*group) + n * sizeof(group->members[0]));
	if (!group) {
		goto out_nomem;
	}
	group->node_member = calloc(n, sizeof(*group->node_member));
	if (!group->node_member) {
		goto out_nomem;
	}
	group->refs = 1;
	group->n_members = (uint32_t)n;
	for (size_t i = 0; i < n; i++) {
		struct peer_member *m = &group->members[i];
		ret = desc_decode(descs[i].data, descs[i].len, &desc);
		if (ret < 0) {
			snprintf(why, why_size, "descriptor %zu is malformed", i);
			goto out_free;
		}
		if (discovery_instance_lost(daemon->discovery, desc.instance_id)) {
			/* A node membership lost: refused until it returns, like single jobs. */
			snprintf(why, why_size, "descriptor %zu (node '%s'): the node was lost", i,
				 desc.node_name);
			ret = RDMAX_E_UNREACHABLE;
			goto out_free;
		}
		ret = transport_resolve_peer(daemon, &desc, &m->transport, &m->peer);
		if (ret < 0) {
			snprintf(why, why_size,
				 "descriptor %zu (node '%s'): no endpoint uses a transport of this "
				 "daemon",
				 i, desc.node_name);
			goto out_free;
		}
		m->instance_id = desc.instance_id;
		m->region_id = desc.region_id;
		m->region_key = desc.region_key;
		m->length = desc.length;
		m->n_endpoints = desc.n_endpoints;
		memcpy(m->endpoints, desc.endpoints, desc.n_endpoints * sizeof(desc.endpoints[0]));
		m->node = node_of(group, (uint32_t)i, desc.instance_id);
	}
	group->handle = table->next_handle;
	ret = hmap_put(&table->by_handle, group->handle, group);
	if (ret < 0) {
		goto out_nomem;
	}
	table->next_handle++;
	table->count++;
	*ret_handle = group->handle;
	return 0;

out_nomem:
	snprintf(why, why_size, "out of memory");
	ret = -ENOMEM;
out_free:
	if (group) {
		free(group->node_member);
		free(group);
	}
	return ret;
}

int peer_group_destroy(struct peer_group_table *table, uint64_t handle)
{
	struct peer_group *group;

	if (handle == 0 || handle == UINT64_MAX) {
		return RDMAX_E_NOT_FOUND;
	}
	group = hmap_del(&table->by_handle, handle);
	if (!group) {
		return RDMAX_E_NOT_FOUND;
	}
	table->count--;
	peer_group_put(group);
	return 0;
}

struct peer_group *peer_group_find(const struct peer_group_table *table, uint64_t handle)
{
	if (handle == 0 || handle == UINT64_MAX || !table->by_handle.slots) {
		return NULL;
	}
	return hmap_get(&table->by_handle, handle);
}
