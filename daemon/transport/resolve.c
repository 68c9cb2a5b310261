/* SPDX-License-Identifier: MIT */
/*
 * Which transport of this daemon reaches the daemon a descriptor names, and through which of
 * its endpoints (verbs preferred). Used by the engine for each job and by peer groups once per
 * member; owns no state.
 */
#include <string.h>

#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"
#include "util.h"

struct transport *transport_pick(struct rdmaxd *daemon, const struct remote_desc *remote,
				 bool need_message, struct endpoint *ret_peer,
				 const char **ret_lacking)
{
	/* Prefer RDMA when both sides have it. */
	static const enum endpoint_transport order[] = {ENDPOINT_VERBS, ENDPOINT_TCP};

	for (size_t k = 0; k < ARRAY_SIZE(order); k++) {
		struct transport *transport = daemon->transports[order[k]];
		if (!transport) {
			continue;
		}
		for (uint32_t i = 0; i < remote->n_endpoints; i++) {
			if (remote->endpoints[i].transport != order[k]) {
				continue;
			}
			if (need_message && !transport->ops->send_message) {
				if (ret_lacking && !*ret_lacking) {
					*ret_lacking = transport->ops->name;
				}
				break;
			}
			*ret_peer = remote->endpoints[i];
			return transport;
		}
	}
	return NULL;
}

int transport_resolve_peer(struct rdmaxd *daemon, const struct remote_desc *desc,
			   struct transport **ret_transport, struct endpoint *ret_peer)
{
	struct endpoint peer;
	struct transport *transport = NULL;

	memset(&peer, 0, sizeof(peer));
	if (desc->instance_id != daemon->instance_id) {
		transport = transport_pick(daemon, desc, false, &peer, NULL);
		if (!transport) {
			return RDMAX_E_UNREACHABLE;
		}
	}
	*ret_transport = transport;
	*ret_peer = peer;
	return 0;
}
