/* SPDX-License-Identifier: MIT */
/*
 * Discovery: named-region lookups across nodes and, with a store configured,
 * node membership (docs/discovery.md). A lookup asks the daemon of another
 * node for a name over the peer link of a transport (a message to its
 * TRANSPORT_LOOKUP_MAILBOX) and hands the descriptor back to the asking
 * client. Sits above the transports and below the engine and ipc.
 */
#ifndef RDMAXD_DISCOVERY_H
#define RDMAXD_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "desc.h"
#include "members.h"

struct rdmaxd;
struct discovery;

#define DISCOVERY_LOOKUP_TIMEOUT_MS  5000  /* when the client gives none */
#define DISCOVERY_LOOKUP_TIMEOUT_MAX 60000 /* longest a client may ask for */
#define DISCOVERY_LOOKUPS_MAX        4096  /* lookups in flight on this node */
#define DISCOVERY_LOOKUPS_PER_OWNER  64    /* lookups in flight for one client */

/*
 * A lookup's one outcome for owner's request seq: 0 and the descriptor's
 * desc_len bytes, or an error and a message naming the cause.
 */
typedef void (*discovery_lookup_cb)(void *owner, uint64_t seq, int err, const char *message,
				    const uint8_t *desc, size_t desc_len);

int discovery_create(struct rdmaxd *daemon, discovery_lookup_cb cb, struct discovery **ret);
/* Answer every pending lookup with RDMAX_E_CANCELLED; revoke the lease; stop the store. */
void discovery_shutdown(struct discovery *disc);
/* Free; after the transports finished every xfer and the loop closed the handles. */
void discovery_destroy(struct discovery *disc);

/*
 * Look name up on node: this node's own name, a node discovery knows, or
 * ADDR:PORT of a daemon's listener. Returns 0 and runs cb exactly once
 * (perhaps before returning, for this node's own names), unless
 * discovery_release_owner(owner) runs first; or returns an error
 * (RDMAX_E_INVALID_ARGUMENT for a bad name or node, RDMAX_E_UNREACHABLE for
 * a node nobody knows, RDMAX_E_RESOURCE_EXHAUSTED) and never runs cb.
 */
int discovery_lookup(struct discovery *disc, void *owner, uint64_t seq, const char *node,
		     const char *name, uint32_t timeout_ms, char *why, size_t why_size);

/* Who is told when membership loses a node (main: the engine and the transports). */
void discovery_set_lost_cb(struct discovery *disc, members_lost_cb cb);

/* Whether instance is a daemon start that membership knows to be gone (jobs to it are refused). */
bool discovery_instance_lost(const struct discovery *disc, uint64_t instance);

/* owner left: its pending lookups end without a callback. */
void discovery_release_owner(struct discovery *disc, void *owner);

/* Report every node discovery knows to cb, synchronously; returns false when discovery is off. */
bool discovery_for_each_node(const struct discovery *disc, discovery_node_cb cb, void *arg);

void discovery_get_stats(const struct discovery *disc, struct discovery_stats *ret_stats);

#endif
