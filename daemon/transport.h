/* SPDX-License-Identifier: MIT */
/*
 * One interface, two fabrics. A transport moves bytes between a local region
 * and a region of a peer daemon with one-sided semantics: the peer names its
 * region by (instance, id, key) in a descriptor, and the side that owns the
 * memory validates every access before touching it (TCP in software, verbs
 * in the NIC).
 *
 * Contract of submit(): returns 0 and later calls xfer->done exactly once, or
 * returns a negative error and never calls done. done may run from inside
 * other transport calls but never from inside submit itself.
 */
#ifndef RDMAXD_TRANSPORT_H
#define RDMAXD_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "desc.h"
#include "util.h"

struct rdmaxd;
struct region;
struct transport;
struct xfer;

/* Direction of one transfer. */
enum xfer_op {
	XFER_WRITE,   /* local -> remote; length may be 0 for an imm-only write */
	XFER_READ,    /* remote -> local */
	XFER_OP_MAX,  /* terminator */
};

typedef void (*xfer_done_cb)(struct xfer *xfer, int err, const char *message);

struct xfer {
	enum xfer_op op;
	struct endpoint peer;      /* which daemon (and for verbs which device/rkey) */
	uint64_t remote_instance;
	uint64_t remote_region;
	uint64_t remote_key;
	uint64_t remote_offset;
	struct region *local;      /* referenced by the caller for the xfer's life */
	uint64_t local_offset;
	uint64_t length;
	bool has_imm;              /* count one landed job under `imm` at the peer */
	uint32_t imm;
	xfer_done_cb done;         /* err: 0 or RDMAX_E_*; message names the cause */
	void *ctx;                 /* caller's */
	uint64_t bytes_done;       /* progress, updated by the transport */
	/* transport-private */
	struct list_node link;
	uint64_t wire_id;
	uint64_t started_ms;
};

struct transport_ops {
	const char *name;
	int (*submit)(struct transport *transport, struct xfer *xfer);
	/* Endpoints for descriptors of this region (one per device for verbs). */
	int (*endpoints)(struct transport *transport, const struct region *region,
			 struct endpoint *ret_endpoints, uint32_t max);
	/* Fail every xfer with RDMAX_E_CANCELLED, close connections and listeners. */
	void (*shutdown)(struct transport *transport);
	/* Free; only after shutdown and once the loop has closed its handles. */
	void (*destroy)(struct transport *transport);
};

struct transport {
	const struct transport_ops *ops;
	enum endpoint_transport kind;
	struct rdmaxd *daemon;
	/*
	 * True when xfers to one peer land in submit order (one TCP stream): the
	 * engine may then put a job's imm on its last chunk. Otherwise the last
	 * chunk is held until every other chunk completed.
	 */
	bool ordered;
};

/* TCP transport: listens on cfg listen_addr:listen_port. */
int transport_tcp_create(struct rdmaxd *daemon, struct transport **ret_transport);

#endif
