/* SPDX-License-Identifier: MIT */
/*
 * Named regions and the node list (docs/discovery.md): publish, unpublish,
 * lookup and nodes, each one request to the daemon and its reply. The
 * library only checks arguments and copies the reply; names are validated
 * again, and lookups made, by the daemon.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "internal.h"
#include "rdmax.pb-c.h"

/* A request answered by a plain Error: its status; any other reply breaks the protocol. */
static int request_status(struct rdmax_client *client, Rdmax__V1__ClientMsg *msg)
{
	Rdmax__V1__DaemonMsg *reply;
	int r = client_request(client, msg, -1, -1, &reply);

	if (r < 0) {
		return r;
	}
	r = reply->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR
		    ? client_err_from_status(reply->error->status)
		    : client_unexpected_reply(client, reply);
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

RDMAX_EXPORT int rdmax_region_publish(struct rdmax_client *client,
				      const struct rdmax_region *region, const char *name)
{
	Rdmax__V1__RegionPublish rp = RDMAX__V1__REGION_PUBLISH__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client || !region || !name) {
		return -EINVAL;
	}
	rp.region_id = rdmax_region_id(region);
	rp.name = (char *)name;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGION_PUBLISH;
	msg.region_publish = &rp;
	return request_status(client, &msg);
}

RDMAX_EXPORT int rdmax_region_unpublish(struct rdmax_client *client, const char *name)
{
	Rdmax__V1__RegionUnpublish ru = RDMAX__V1__REGION_UNPUBLISH__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client || !name) {
		return -EINVAL;
	}
	ru.name = (char *)name;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGION_UNPUBLISH;
	msg.region_unpublish = &ru;
	return request_status(client, &msg);
}

RDMAX_EXPORT int rdmax_lookup(struct rdmax_client *client, const char *node, const char *name,
			      int timeout_ms, struct rdmax_desc *ret_desc)
{
	Rdmax__V1__Lookup lk = RDMAX__V1__LOOKUP__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;

	if (!client || !node || !name || !ret_desc || timeout_ms < 0) {
		return -EINVAL;
	}
	lk.node = (char *)node;
	lk.name = (char *)name;
	lk.has_timeout_ms = timeout_ms > 0;
	lk.timeout_ms = (uint32_t)timeout_ms;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_LOOKUP;
	msg.lookup = &lk;
	/* The daemon answers within its deadline (at most 60 s); it is not awaited forever. */
	int r = client_request(client, &msg, -1, -1, &reply);
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_LOOKUP) {
		r = client_unexpected_reply(client, reply);
	} else if (reply->lookup->desc.len == 0 || reply->lookup->desc.len > RDMAX_DESC_MAX) {
		r = RDMAX_E_PROTOCOL_ERROR;
	} else {
		ret_desc->len = (uint32_t)reply->lookup->desc.len;
		memcpy(ret_desc->bytes, reply->lookup->desc.data, reply->lookup->desc.len);
	}
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

RDMAX_EXPORT int rdmax_nodes_sized(struct rdmax_client *client, struct rdmax_node *nodes,
				   size_t max, size_t node_size)
{
	Rdmax__V1__NodesQuery q = RDMAX__V1__NODES_QUERY__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;

	if (!client || (max && !nodes)) {
		return -EINVAL;
	}
	if (node_size < RDMAX_NODE_SIZE_MIN) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_NODES;
	msg.nodes = &q;
	int r = client_request(client, &msg, -1, -1, &reply);
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_NODES) {
		r = client_unexpected_reply(client, reply);
	} else if (!reply->nodes->discovery) {
		r = RDMAX_E_UNIMPLEMENTED;
	} else {
		const Rdmax__V1__NodesReply *nr = reply->nodes;
		for (size_t i = 0; i < nr->n_nodes && i < max; i++) {
			const Rdmax__V1__NodeInfo *ni = nr->nodes[i];
			struct rdmax_node node;
			memset(&node, 0, sizeof(node));
			client_copy_text(node.name, sizeof(node.name), ni->name);
			node.instance_id = ni->instance_id;
			node.alive = ni->alive;
			node.age_ms = ni->age_ms;
			if (ni->n_endpoints) {
				client_copy_text(node.addr, sizeof(node.addr),
						 ni->endpoints[0]->addr);
				node.port = ni->endpoints[0]->port;
			}
			/* Up to the caller's size: fields it does not know are left out, more
			 * zeroed. */
			uint8_t *dst = (uint8_t *)nodes + i * node_size;
			memcpy(dst, &node, node_size < sizeof(node) ? node_size : sizeof(node));
			if (node_size > sizeof(node)) {
				memset(dst + sizeof(node), 0, node_size - sizeof(node));
			}
		}
		r = nr->n_nodes > INT32_MAX ? INT32_MAX : (int)nr->n_nodes;
	}
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

_Static_assert(sizeof(struct rdmax_node) == RDMAX_NODE_SIZE_MIN, "RDMAX_2.0 node layout");
