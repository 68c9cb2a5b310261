/* SPDX-License-Identifier: MIT */
/*
 * Region descriptors: the opaque bytes an application ships to its peers so
 * they can address one of its regions. Encoding is the RegionDesc protobuf
 * message of proto/rdmax.proto.
 */
#ifndef RDMAXD_DESC_H
#define RDMAXD_DESC_H

#include <stddef.h>
#include <stdint.h>

#define DESC_VERSION       1
#define DESC_MAX_ENDPOINTS 8
#define DESC_MAX_BYTES     1024
/* Bytes of a mailbox address's scoped name "<uid>:<name>" (10 digits, ':', 64). */
#define DESC_MAILBOX_MAX 75

/* Fabric of an endpoint; values equal rdmax.v1.Transport. */
enum endpoint_transport {
	ENDPOINT_TCP = 0,   /* TCP transport: addr:port of the peer daemon */
	ENDPOINT_VERBS = 1, /* verbs: rdma_cm addr:port, device, iova, rkey */
	ENDPOINT_MAX,       /* terminator */
};

struct endpoint {
	enum endpoint_transport transport;
	char addr[46]; /* numeric IPv4 or IPv6 */
	uint16_t port;
	char device[32]; /* verbs device name, "" for TCP */
	uint64_t iova;   /* verbs only */
	uint32_t rkey;   /* verbs only */
	/*
	 * verbs only: the owner's protection domain of the region (per-uid
	 * isolation), 0 for its shared one, and the domain's secret, which the
	 * connecting daemon proves it holds (conn_pd.c).
	 */
	uint32_t domain;
	uint64_t domain_token;
};

/* Domain numbers fit the 24 bits a connect request has for them. */
#define DESC_DOMAIN_MAX 0xffffffu

struct remote_desc {
	uint64_t instance_id; /* daemon start the region belongs to */
	uint64_t region_id;
	uint64_t region_key;
	uint64_t length;
	uint32_t access; /* RDMAX_ACCESS_* */
	char node_name[64];
	/* A mailbox address: its scoped name ("" for a region; region_key is its key). */
	char mailbox[DESC_MAILBOX_MAX + 1];
	uint32_t n_endpoints;
	struct endpoint endpoints[DESC_MAX_ENDPOINTS];
};

/* Encode into buf (at most buf_size bytes); returns the length or a negative error. */
int desc_encode(const struct remote_desc *desc, uint8_t *buf, size_t buf_size);

/*
 * Decode and check a descriptor received from a client. Returns 0 or
 * RDMAX_E_INVALID_ARGUMENT for bytes that are not a well-formed version-1
 * descriptor (unknown transport, empty address, too many endpoints, a
 * mailbox address with a bad name or with region fields set...).
 */
int desc_decode(const uint8_t *buf, size_t len, struct remote_desc *ret_desc);

/*
 * Copy a decoded descriptor up to its last endpoint: dst's endpoints past
 * src->n_endpoints are left as they were (a whole copy is about four times
 * the bytes, per job).
 */
void desc_copy(struct remote_desc *dst, const struct remote_desc *src);

/* True when two endpoints name the same peer daemon (transport, addr, port). */
int endpoint_same_peer(const struct endpoint *a, const struct endpoint *b);

#endif
