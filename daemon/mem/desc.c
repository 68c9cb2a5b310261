/* SPDX-License-Identifier: MIT */
/*
 * Region descriptors: encoding and strict decoding of rdmax.v1.RegionDesc.
 * Descriptors arrive from applications (and so from remote peers): decoding
 * checks every field before anything uses it.
 */
#include <arpa/inet.h>
#include <stdbool.h>
#include <string.h>

#include "desc.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "util.h"

int desc_encode(const struct remote_desc *desc, uint8_t *buf, size_t buf_size)
{
	Rdmax__V1__RegionDesc msg = RDMAX__V1__REGION_DESC__INIT;
	Rdmax__V1__Endpoint eps[DESC_MAX_ENDPOINTS];
	Rdmax__V1__Endpoint *ep_ptrs[DESC_MAX_ENDPOINTS];

	if (desc->n_endpoints == 0 || desc->n_endpoints > DESC_MAX_ENDPOINTS) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	msg.version = DESC_VERSION;
	msg.instance_id = desc->instance_id;
	msg.region_id = desc->region_id;
	msg.region_key = desc->region_key;
	msg.length = desc->length;
	msg.access = desc->access;
	if (desc->node_name[0]) {
		msg.node_name = (char *)desc->node_name;
	}
	if (desc->mailbox[0]) {
		msg.mailbox = (char *)desc->mailbox;
	}
	for (uint32_t i = 0; i < desc->n_endpoints; i++) {
		const struct endpoint *e = &desc->endpoints[i];
		Rdmax__V1__Endpoint init = RDMAX__V1__ENDPOINT__INIT;
		eps[i] = init;
		eps[i].transport = (Rdmax__V1__Transport)e->transport;
		eps[i].addr = (char *)e->addr;
		eps[i].port = e->port;
		if (e->transport == ENDPOINT_VERBS) {
			eps[i].device = (char *)e->device;
			eps[i].has_iova = 1;
			eps[i].iova = e->iova;
			eps[i].has_rkey = 1;
			eps[i].rkey = e->rkey;
			if (e->domain) {
				eps[i].has_domain = 1;
				eps[i].domain = e->domain;
				eps[i].has_domain_token = 1;
				eps[i].domain_token = e->domain_token;
			}
		}
		ep_ptrs[i] = &eps[i];
	}
	msg.n_endpoints = desc->n_endpoints;
	msg.endpoints = ep_ptrs;
	size_t len = rdmax__v1__region_desc__get_packed_size(&msg);
	if (len > buf_size) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	rdmax__v1__region_desc__pack(&msg, buf);
	return (int)len;
}

static int valid_addr(const char *addr)
{
	struct in6_addr a6;
	struct in_addr a4;

	return inet_pton(AF_INET, addr, &a4) == 1 || inet_pton(AF_INET6, addr, &a6) == 1;
}

/* A mailbox address's scoped name: 1..DESC_MAILBOX_MAX printable bytes, no space. */
static bool valid_mailbox(const char *name)
{
	size_t len = strnlen(name, DESC_MAILBOX_MAX + 1);

	if (len == 0 || len > DESC_MAILBOX_MAX) {
		return false;
	}
	for (size_t i = 0; i < len; i++) {
		if (name[i] <= 0x20 || name[i] >= 0x7f) {
			return false;
		}
	}
	return true;
}

int desc_decode(const uint8_t *buf, size_t len, struct remote_desc *ret_desc)
{
	struct remote_desc desc;
	int ret = RDMAX_E_INVALID_ARGUMENT;

	if (!buf || len == 0 || len > DESC_MAX_BYTES) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	Rdmax__V1__RegionDesc *msg = rdmax__v1__region_desc__unpack(NULL, len, buf);
	if (!msg) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	memset(&desc, 0, sizeof(desc));
	if (msg->version != DESC_VERSION || msg->n_endpoints == 0 ||
	    msg->n_endpoints > DESC_MAX_ENDPOINTS) {
		goto out_free;
	}
	if (msg->access & ~(uint32_t)(RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)) {
		goto out_free;
	}
	desc.instance_id = msg->instance_id;
	desc.region_id = msg->region_id;
	desc.region_key = msg->region_key;
	desc.length = msg->length;
	desc.access = msg->access;
	if (msg->node_name && copy_string(desc.node_name, sizeof(desc.node_name), msg->node_name)) {
		goto out_free;
	}
	if (msg->mailbox) {
		/* An address names a mailbox, never a region: its region fields stay 0. */
		if (!valid_mailbox(msg->mailbox) || msg->region_id || msg->length || msg->access) {
			goto out_free;
		}
		copy_string(desc.mailbox, sizeof(desc.mailbox), msg->mailbox);
	}
	for (size_t i = 0; i < msg->n_endpoints; i++) {
		const Rdmax__V1__Endpoint *m = msg->endpoints[i];
		struct endpoint *e = &desc.endpoints[i];
		if ((unsigned)m->transport >= ENDPOINT_MAX || m->port == 0 || m->port > 65535) {
			goto out_free;
		}
		e->transport = (enum endpoint_transport)m->transport;
		if (copy_string(e->addr, sizeof(e->addr), m->addr) || !valid_addr(e->addr)) {
			goto out_free;
		}
		e->port = (uint16_t)m->port;
		if (e->transport == ENDPOINT_VERBS) {
			if (!m->device || !m->has_rkey || !m->has_iova ||
			    copy_string(e->device, sizeof(e->device), m->device)) {
				goto out_free;
			}
			e->iova = m->iova;
			e->rkey = m->rkey;
			/* A domain comes with its token, and fits a connect request. */
			if (m->has_domain != m->has_domain_token ||
			    (m->has_domain && (m->domain == 0 || m->domain > DESC_DOMAIN_MAX))) {
				goto out_free;
			}
			e->domain = m->has_domain ? m->domain : 0;
			e->domain_token = m->has_domain ? m->domain_token : 0;
		} else if (m->has_domain || m->has_domain_token) {
			goto out_free;
		}
	}
	desc.n_endpoints = (uint32_t)msg->n_endpoints;
	*ret_desc = desc;
	ret = 0;
out_free:
	rdmax__v1__region_desc__free_unpacked(msg, NULL);
	return ret;
}

void desc_copy(struct remote_desc *dst, const struct remote_desc *src)
{
	memcpy(dst, src,
	       offsetof(struct remote_desc, endpoints) +
		       src->n_endpoints * sizeof(src->endpoints[0]));
}

int endpoint_same_peer(const struct endpoint *a, const struct endpoint *b)
{
	return a->transport == b->transport && a->port == b->port && strcmp(a->addr, b->addr) == 0;
}
