/* SPDX-License-Identifier: MIT */
/*
 * Node membership (placeholder for backend = none): no store, no nodes.
 */
#include <stdlib.h>

#include "members.h"
#include "rdmax.h"

int members_create(struct rdmaxd *daemon, struct members **ret_members)
{
	*ret_members = NULL;
	return 0;
}

void members_set_lost_cb(struct members *members, members_lost_cb cb)
{
}

void members_shutdown(struct members *members)
{
}

void members_destroy(struct members *members)
{
}

int members_resolve(const struct members *members, const char *node, struct endpoint *eps,
		    uint32_t max, uint32_t *ret_n, uint64_t *ret_instance, char *why,
		    size_t why_size)
{
	return RDMAX_E_NOT_FOUND;
}

bool members_instance_lost(const struct members *members, uint64_t instance)
{
	return false;
}

void members_for_each(const struct members *members, discovery_node_cb cb, void *arg)
{
}

void members_get_stats(const struct members *members, struct discovery_stats *stats)
{
}
