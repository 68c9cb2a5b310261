/* SPDX-License-Identifier: MIT */
/*
 * Named-region lookups for this node's clients, and the front of node
 * membership (members.c, etcd.c). A lookup of this node's own name is answered
 * from the name table at once; any other goes to the owning daemon as a
 * message to its TRANSPORT_LOOKUP_MAILBOX over the first transport that has a
 * peer link to it (verbs preferred), with a deadline of its own. The answer
 * is decoded and checked before the client sees it: a peer is not trusted to
 * hand back a well-formed descriptor, nor one of the instance discovery
 * knows. Never touches regions or payload bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "discovery.h"
#include "log.h"
#include "members.h"
#include "names.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"
#include "util.h"

struct lookup {
	struct discovery *disc;
	struct list_node link; /* in disc->lookups while the xfer is out */
	void *owner;           /* NULL once answered (or the owner left) */
	uint64_t seq;
	uint64_t expect_instance; /* 0: whichever daemon answers there */
	struct xfer xfer;
	uv_timer_t timer;
	bool xfer_out;   /* the transport still holds xfer */
	bool timer_open; /* timer not closed yet */
	char node[64];   /* for messages */
	char name[NAMES_NAME_MAX + 1];
	uint8_t reply[TRANSPORT_REPLY_MAX];
};

struct discovery {
	struct rdmaxd *daemon;
	discovery_lookup_cb cb;
	struct list_node lookups;
	uint32_t n_lookups;
	uint64_t lookups_ok;
	uint64_t lookups_failed;
	struct members *members; /* NULL: backend = none */
	bool shut;
};

int discovery_create(struct rdmaxd *daemon, discovery_lookup_cb cb, struct discovery **ret)
{
	struct discovery *disc = calloc(1, sizeof(*disc));
	int ret_code;

	if (!disc) {
		return -ENOMEM;
	}
	disc->daemon = daemon;
	disc->cb = cb;
	list_init(&disc->lookups);
	ret_code = members_create(daemon, &disc->members);
	if (ret_code < 0) {
		free(disc);
		return ret_code;
	}
	*ret = disc;
	return 0;
}

static void answer(struct lookup *l, int err, const char *message, const uint8_t *desc, size_t len)
{
	struct discovery *disc = l->disc;
	void *owner = l->owner;

	if (!owner) {
		return;
	}
	l->owner = NULL;
	if (err < 0) {
		disc->lookups_failed++;
	} else {
		disc->lookups_ok++;
	}
	disc->cb(owner, l->seq, err, message, desc, len);
}

static void lookup_free(uv_handle_t *handle)
{
	free(handle->data);
}

/* Free once the transport gave the xfer back and the timer is closed. */
static void lookup_release(struct lookup *l)
{
	if (l->xfer_out) {
		return;
	}
	if (l->timer_open) {
		l->timer_open = false;
		uv_close((uv_handle_t *)&l->timer, lookup_free);
	}
}

static void lookup_timeout(uv_timer_t *timer)
{
	struct lookup *l = timer->data;
	char message[RDMAX_MESSAGE_MAX];

	snprintf(message, sizeof(message),
		 "node '%.40s' did not answer the lookup of '%.48s' in time", l->node, l->name);
	answer(l, RDMAX_E_TIMEOUT, message, NULL, 0);
}

static void lookup_done(struct xfer *xfer, int err, const char *message)
{
	struct lookup *l = xfer->ctx;
	struct discovery *disc = l->disc;
	char text[RDMAX_MESSAGE_MAX];
	struct remote_desc desc;

	l->xfer_out = false;
	list_del(&l->link);
	disc->n_lookups--;
	uv_timer_stop(&l->timer);
	if (err == 0 && desc_decode(l->reply, xfer->reply_len, &desc) < 0) {
		err = RDMAX_E_PROTOCOL_ERROR;
		snprintf(text, sizeof(text),
			 "node '%.40s' answered the lookup of '%.48s' with a malformed "
			 "descriptor",
			 l->node, l->name);
		message = text;
	} else if (err == 0 && l->expect_instance && desc.instance_id != l->expect_instance) {
		err = RDMAX_E_NOT_FOUND;
		snprintf(text, sizeof(text),
			 "node '%.40s' restarted: its daemon is instance %016" PRIx64
			 ", discovery knows %016" PRIx64,
			 l->node, desc.instance_id, l->expect_instance);
		message = text;
	}
	if (err < 0 && (!message || !message[0])) {
		snprintf(text, sizeof(text), "lookup of '%.48s' on node '%.40s' failed: %s",
			 l->name, l->node, rdmax_strerror(err));
		message = text;
	}
	if (err < 0) {
		log_debug("lookup of '%s' on '%s': %s", l->name, l->node, message);
	}
	answer(l, err, message, err ? NULL : l->reply, err ? 0 : xfer->reply_len);
	lookup_release(l);
}

/* "ADDR:PORT" or "[V6ADDR]:PORT", numeric; 0 or RDMAX_E_INVALID_ARGUMENT. */
static int parse_addr_port(const char *node, char *addr, size_t addr_size, uint16_t *ret_port)
{
	const char *colon = strrchr(node, ':');
	const char *start = node;
	size_t len;
	char *end;
	uint8_t bin[16];

	if (!colon || colon == node) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	len = (size_t)(colon - node);
	if (node[0] == '[') {
		if (colon[-1] != ']') {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		start = node + 1;
		len -= 2;
	}
	if (len == 0 || len >= addr_size) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	memcpy(addr, start, len);
	addr[len] = '\0';
	if (inet_pton(AF_INET, addr, bin) != 1 && inet_pton(AF_INET6, addr, bin) != 1) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	errno = 0;
	unsigned long port = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || port == 0 || port > 65535) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	*ret_port = (uint16_t)port;
	return 0;
}

/* The first transport (verbs preferred) that can carry a message to one of eps. */
static struct transport *pick(struct rdmaxd *daemon, const struct endpoint *eps, uint32_t n,
			      struct endpoint *ret_peer)
{
	static const enum endpoint_transport order[] = {ENDPOINT_VERBS, ENDPOINT_TCP};

	for (size_t k = 0; k < ARRAY_SIZE(order); k++) {
		struct transport *t = daemon->transports[order[k]];
		if (!t || !t->ops->send_message) {
			continue;
		}
		for (uint32_t i = 0; i < n; i++) {
			if (eps[i].transport == order[k]) {
				*ret_peer = eps[i];
				ret_peer->iova = 0;
				ret_peer->rkey = 0;
				return t;
			}
		}
	}
	return NULL;
}

/* This node's own names: answered at once, from the table. */
static int lookup_local(struct discovery *disc, void *owner, uint64_t seq, const char *name,
			size_t len)
{
	struct rdmaxd *daemon = disc->daemon;
	uint8_t desc[TRANSPORT_REPLY_MAX];
	char text[RDMAX_MESSAGE_MAX];
	int n = names_serve(daemon->names, daemon->node_name, (const uint8_t *)name, len, desc,
			    sizeof(desc), text, sizeof(text));

	if (n < 0) {
		disc->lookups_failed++;
		disc->cb(owner, seq, n, text, NULL, 0);
	} else {
		disc->lookups_ok++;
		disc->cb(owner, seq, 0, NULL, desc, (size_t)n);
	}
	return 0;
}

static uint32_t owner_lookups(const struct discovery *disc, const void *owner)
{
	uint32_t n = 0;
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &disc->lookups)
	{
		n += container_of(pos, struct lookup, link)->owner == owner;
	}
	return n;
}

int discovery_lookup(struct discovery *disc, void *owner, uint64_t seq, const char *node,
		     const char *name, uint32_t timeout_ms, char *why, size_t why_size)
{
	struct rdmaxd *daemon = disc->daemon;
	size_t name_len = name ? strnlen(name, NAMES_NAME_MAX + 1) : 0;
	struct endpoint eps[DESC_MAX_ENDPOINTS];
	uint32_t n_eps = 0;
	uint64_t instance = 0;
	struct endpoint peer;
	struct transport *t;
	int ret;

	if (disc->shut) {
		snprintf(why, why_size, "the daemon is shutting down");
		return RDMAX_E_CANCELLED;
	}
	if (names_check(name, name_len) < 0) {
		snprintf(
			why, why_size,
			"region name is not valid: 1 to %u characters of A-Z a-z 0-9 . _ : @ + / -",
			NAMES_NAME_MAX);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (!node || !node[0] || strnlen(node, 256) >= 256) {
		snprintf(why, why_size, "the node must be a node name or ADDR:PORT");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (strcmp(node, daemon->node_name) == 0) {
		return lookup_local(disc, owner, seq, name, name_len);
	}
	ret = members_resolve(disc->members, node, eps, DESC_MAX_ENDPOINTS, &n_eps, &instance, why,
			      why_size);
	if (ret == RDMAX_E_UNREACHABLE) {
		return ret; /* known, and lost: refused until it returns */
	}
	if (ret < 0) {
		struct endpoint ep = {0};
		if (parse_addr_port(node, ep.addr, sizeof(ep.addr), &ep.port) < 0) {
			snprintf(why, why_size,
				 "node '%.64s' is unknown%s; name a daemon by ADDR:PORT of its "
				 "listener",
				 node, disc->members ? " to discovery" : " (no discovery backend)");
			return RDMAX_E_UNREACHABLE;
		}
		for (size_t k = 0; k < ENDPOINT_MAX; k++) {
			eps[n_eps] = ep;
			eps[n_eps++].transport = (enum endpoint_transport)k;
		}
	}
	t = pick(daemon, eps, n_eps, &peer);
	if (!t) {
		snprintf(why, why_size, "no transport of this daemon reaches node '%.64s'", node);
		return RDMAX_E_UNREACHABLE;
	}
	if (disc->n_lookups >= DISCOVERY_LOOKUPS_MAX ||
	    owner_lookups(disc, owner) >= DISCOVERY_LOOKUPS_PER_OWNER) {
		snprintf(why, why_size,
			 "too many lookups in flight (limits: %u per client, %u per node)",
			 DISCOVERY_LOOKUPS_PER_OWNER, DISCOVERY_LOOKUPS_MAX);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	struct lookup *l = calloc(1, sizeof(*l));
	if (!l) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	l->disc = disc;
	l->owner = owner;
	l->seq = seq;
	l->expect_instance = instance;
	snprintf(l->node, sizeof(l->node), "%.63s", node);
	memcpy(l->name, name, name_len);
	l->xfer.op = XFER_WRITE;
	l->xfer.peer = peer;
	l->xfer.remote_instance = instance;
	l->xfer.mailbox = TRANSPORT_LOOKUP_MAILBOX;
	l->xfer.payload = (const uint8_t *)l->name;
	l->xfer.length = name_len;
	l->xfer.reply = l->reply;
	l->xfer.reply_size = sizeof(l->reply);
	l->xfer.done = lookup_done;
	l->xfer.ctx = l;
	ret = t->ops->send_message(t, &l->xfer);
	if (ret < 0) {
		snprintf(why, why_size, "cannot send the lookup to node '%.64s': %s", node,
			 rdmax_strerror(ret));
		free(l);
		return ret;
	}
	l->xfer_out = true;
	list_add_tail(&disc->lookups, &l->link);
	disc->n_lookups++;
	uv_timer_init(daemon->loop, &l->timer);
	l->timer.data = l;
	l->timer_open = true;
	if (timeout_ms == 0) {
		timeout_ms = DISCOVERY_LOOKUP_TIMEOUT_MS;
	}
	uv_timer_start(&l->timer, lookup_timeout, MIN(timeout_ms, DISCOVERY_LOOKUP_TIMEOUT_MAX), 0);
	return 0;
}

void discovery_set_lost_cb(struct discovery *disc, members_lost_cb cb)
{
	if (disc) {
		members_set_lost_cb(disc->members, cb);
	}
}

bool discovery_instance_lost(const struct discovery *disc, uint64_t instance)
{
	return disc && members_instance_lost(disc->members, instance);
}

void discovery_release_owner(struct discovery *disc, void *owner)
{
	struct list_node *pos, *tmp;

	if (!disc) {
		return;
	}
	list_for_each_safe(pos, tmp, &disc->lookups)
	{
		struct lookup *l = container_of(pos, struct lookup, link);
		if (l->owner == owner) {
			l->owner = NULL;
		}
	}
}

void discovery_shutdown(struct discovery *disc)
{
	struct list_node *pos, *tmp;

	if (!disc || disc->shut) {
		return;
	}
	disc->shut = true;
	list_for_each_safe(pos, tmp, &disc->lookups)
	{
		answer(container_of(pos, struct lookup, link), RDMAX_E_CANCELLED,
		       "the daemon is shutting down", NULL, 0);
	}
	members_shutdown(disc->members);
}

void discovery_destroy(struct discovery *disc)
{
	if (!disc) {
		return;
	}
	if (disc->n_lookups) {
		log_warn("%u lookups still held by a transport at exit", disc->n_lookups);
	}
	members_destroy(disc->members);
	free(disc);
}

bool discovery_for_each_node(const struct discovery *disc, discovery_node_cb cb, void *arg)
{
	if (!disc || !disc->members) {
		return false;
	}
	members_for_each(disc->members, cb, arg);
	return true;
}

void discovery_get_stats(const struct discovery *disc, struct discovery_stats *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->backend = "none";
	ret->state = "off";
	if (!disc) {
		return;
	}
	ret->lookups_ok = disc->lookups_ok;
	ret->lookups_failed = disc->lookups_failed;
	ret->lookups_inflight = disc->n_lookups;
	members_get_stats(disc->members, ret);
}
