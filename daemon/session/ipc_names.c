/* SPDX-License-Identifier: MIT */
/*
 * A client's requests about names and nodes: publishing a region under a
 * name on this node (names.c holds the table), looking a name up on another
 * node (discovery.c asks it; ipc_lookup_done answers), and the list of
 * nodes discovery knows. Every refusal is answered with a named error;
 * never answers a session that is closing, never touches region memory.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "discovery.h"
#include "ipc.h"
#include "log.h"
#include "rdmax.h"
#include "session_internal.h"
void ipc_handle_publish(struct session *s, uint64_t seq, const Rdmax__V1__RegionPublish *rp)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct region *region = region_find_owned(&daemon->regions, &s->owner, rp->region_id);
	uint8_t desc[DESC_MAX_BYTES];

	if (!region || region->deregistering) {
		ipc_reply_status(s, seq, RDMAX_E_NOT_FOUND, "region %" PRIu64 " is not registered",
				 rp->region_id);
		return;
	}
	int len = ipc_encode_desc(daemon, region, desc, sizeof(desc));
	int ret = len < 0 ? len
			  : names_publish(&s->ipc->names, &s->owner, rp->name, region->id, desc,
					  (size_t)len);
	switch (ret) {
	case 0:
		log_debug("client %" PRIu64 " published region %" PRIu64 " as '%s'", s->id,
			  region->id, rp->name);
		ipc_reply_status(s, seq, 0, NULL);
		break;
	case RDMAX_E_INVALID_ARGUMENT:
		ipc_reply_status(
			s, seq, ret,
			"region name '%.64s' is not valid: 1 to %u characters of A-Z a-z 0-9 "
			". _ : @ + / -",
			rp->name ? rp->name : "", NAMES_NAME_MAX);
		break;
	case RDMAX_E_ALREADY_EXISTS:
		ipc_reply_status(s, seq, ret, "a region is already published as '%s' on this node",
				 rp->name);
		break;
	case RDMAX_E_RESOURCE_EXHAUSTED:
		ipc_reply_status(s, seq, ret,
				 "too many published names (limits: %u per client, %u per node)",
				 NAMES_MAX_PER_CLIENT, NAMES_MAX_PER_NODE);
		break;
	default:
		ipc_reply_status(s, seq, ret, "cannot publish region: %s", rdmax_strerror(ret));
		break;
	}
}

void ipc_handle_lookup(struct session *s, uint64_t seq, const Rdmax__V1__Lookup *lk)
{
	char why[RDMAX_MESSAGE_MAX];
	int ret = discovery_lookup(s->ipc->daemon->discovery, &s->owner, seq, lk->node, lk->name,
				   lk->has_timeout_ms ? lk->timeout_ms : 0, why, sizeof(why));

	if (ret < 0) {
		ipc_reply_status(s, seq, ret, "%s", why);
	}
}

/* discovery_lookup_cb: the descriptor, or why there is none. */
void ipc_lookup_done(void *owner, uint64_t seq, int err, const char *message, const uint8_t *desc,
		     size_t desc_len)
{
	struct session *s = session_of(owner);
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__LookupReply reply = RDMAX__V1__LOOKUP_REPLY__INIT;

	if (s->closing) {
		return;
	}
	if (err < 0) {
		ipc_reply_status(s, seq, err, "%s", message ? message : rdmax_strerror(err));
		return;
	}
	reply.desc.data = (uint8_t *)desc;
	reply.desc.len = desc_len;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_LOOKUP;
	msg.lookup = &reply;
	ipc_send_msg(s, &msg);
}

static void add_node(void *arg, const struct discovery_node *node)
{
	Rdmax__V1__NodesReply *reply = arg;
	Rdmax__V1__NodeInfo *info = calloc(1, sizeof(*info));
	Rdmax__V1__Endpoint **eps = calloc(node->n_endpoints + 1, sizeof(*eps));
	Rdmax__V1__Endpoint *ep = calloc(node->n_endpoints + 1, sizeof(*ep));

	if (!info || !eps || !ep) {
		free(info);
		free(eps);
		free(ep);
		return;
	}
	rdmax__v1__node_info__init(info);
	info->name = (char *)node->name;
	info->instance_id = node->instance_id;
	info->alive = node->alive;
	info->has_age_ms = 1;
	info->age_ms = node->age_ms;
	for (uint32_t i = 0; i < node->n_endpoints; i++) {
		rdmax__v1__endpoint__init(&ep[i]);
		ep[i].transport = (Rdmax__V1__Transport)node->endpoints[i].transport;
		ep[i].addr = (char *)node->endpoints[i].addr;
		ep[i].port = node->endpoints[i].port;
		if (node->endpoints[i].device[0]) {
			ep[i].device = (char *)node->endpoints[i].device;
		}
		eps[i] = &ep[i];
	}
	info->n_endpoints = node->n_endpoints;
	info->endpoints = eps;
	reply->nodes[reply->n_nodes++] = info;
}

static void count_node(void *arg, const struct discovery_node *node)
{
	(*(size_t *)arg)++;
}

void ipc_handle_nodes(struct session *s, uint64_t seq)
{
	const struct discovery *disc = s->ipc->daemon->discovery;
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__NodesReply reply = RDMAX__V1__NODES_REPLY__INIT;
	size_t n = 0;

	reply.discovery = discovery_for_each_node(disc, count_node, &n);
	reply.nodes = calloc(n + 1, sizeof(*reply.nodes));
	if (!reply.nodes) {
		ipc_reply_status(s, seq, -ENOMEM, "out of memory");
		return;
	}
	if (n) {
		discovery_for_each_node(disc, add_node, &reply);
	}
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_NODES;
	msg.nodes = &reply;
	if (rdmax__v1__daemon_msg__get_packed_size(&msg) > s->ipc->tx_size) {
		ipc_reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
				 "the list of %zu nodes does not fit one message", reply.n_nodes);
	} else {
		ipc_send_msg(s, &msg);
	}
	for (size_t i = 0; i < reply.n_nodes; i++) {
		if (reply.nodes[i]->n_endpoints) {
			free(reply.nodes[i]->endpoints[0]);
		}
		free(reply.nodes[i]->endpoints);
		free(reply.nodes[i]);
	}
	free(reply.nodes);
}
