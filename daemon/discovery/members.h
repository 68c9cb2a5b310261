/* SPDX-License-Identifier: MIT */
/*
 * Node membership: the nodes of the cluster as a store (etcd) lists them,
 * each with its daemon's instance and listeners, alive or lost. With
 * `[discovery] backend = none` there is no membership: members_create()
 * returns NULL and every call accepts NULL.
 */
#ifndef RDMAXD_MEMBERS_H
#define RDMAXD_MEMBERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "desc.h"

struct rdmaxd;
struct members;

/*
 * One node discovery knows of, as rdmax_nodes() and the admin socket show
 * it. Endpoints name the daemon's listeners (no region fields).
 */
struct discovery_node {
	const char *name;
	uint64_t instance_id;
	bool alive;      /* false: lost (lease expired, or a new instance replaced it) */
	uint64_t age_ms; /* since this instance was first seen */
	uint32_t n_endpoints;
	const struct endpoint *endpoints;
};
typedef void (*discovery_node_cb)(void *arg, const struct discovery_node *node);

/* Counters for metrics and the admin socket. */
struct discovery_stats {
	uint64_t lookups_ok;       /* answered with a descriptor */
	uint64_t lookups_failed;   /* answered with an error */
	uint32_t lookups_inflight; /* waiting for a peer */
	const char *backend;       /* "none" or "etcd" */
	const char *state;         /* "off", "connecting", "registered", "unreachable" */
	uint64_t lease_renewals;   /* keep-alives the store answered */
	uint64_t watch_events;     /* node records put or deleted, as the watch saw them */
	uint64_t store_errors;     /* requests to the store that failed */
	uint32_t nodes_alive;
	uint32_t nodes_lost;
};

/*
 * A known node was lost (lease expired, record deleted, or a new instance
 * replaced old_instance): the daemon fails what is in flight to it.
 */
typedef void (*members_lost_cb)(struct rdmaxd *daemon, const char *node, uint64_t old_instance);

int members_create(struct rdmaxd *daemon, struct members **ret_members);
void members_set_lost_cb(struct members *members, members_lost_cb cb);
/* Revoke this node's lease (a clean stop), stop watching, close the store's connections. */
void members_shutdown(struct members *members);
void members_destroy(struct members *members);

/*
 * Endpoints and instance of node. RDMAX_E_NOT_FOUND when membership does not
 * know it (or is off), RDMAX_E_UNREACHABLE (why says so) while it is lost.
 */
int members_resolve(const struct members *members, const char *node, struct endpoint *eps,
		    uint32_t max, uint32_t *ret_n, uint64_t *ret_instance, char *why,
		    size_t why_size);

/* Whether instance is a daemon start membership knows to be gone. */
bool members_instance_lost(const struct members *members, uint64_t instance);

void members_for_each(const struct members *members, discovery_node_cb cb, void *arg);
void members_get_stats(const struct members *members, struct discovery_stats *stats);

#endif
