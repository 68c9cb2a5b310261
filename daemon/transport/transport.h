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

/* One contiguous transfer of a job, before chunking (jobs/planner.c plans them). */
struct plan_run {
	uint64_t local_offset;
	uint64_t remote_offset;
	uint64_t length;
	uint32_t dest; /* index of the job's destination (0 for a paged write) */
};
struct rdmaxd;
struct region;
struct transport;
struct xfer;

/* Direction of one transfer. */
enum xfer_op {
	XFER_WRITE,  /* local -> remote; length may be 0 for an imm-only write */
	XFER_READ,   /* remote -> local */
	XFER_OP_MAX, /* terminator */
};

typedef void (*xfer_done_cb)(struct xfer *xfer, int err, const char *message);

struct xfer {
	enum xfer_op op;
	struct endpoint peer; /* which daemon (and for verbs which device/rkey) */
	uint64_t remote_instance;
	uint64_t remote_region;
	uint64_t remote_key;
	uint64_t remote_offset;
	struct region *local; /* referenced by the caller for the xfer's life */
	uint64_t local_offset;
	uint64_t length;
	bool has_imm; /* count one landed job under `imm` at the peer */
	uint32_t imm;
	/*
	 * The uid whose job this is: a connection a transport opens for the
	 * xfer counts in that uid's share (daemon->peer_conns) until it closes.
	 */
	bool has_uid;
	uint32_t uid;
	xfer_done_cb done;   /* err: 0 or RDMAX_E_*; message names the cause */
	void *ctx;           /* caller's */
	uint64_t bytes_done; /* progress, updated by the transport */
	/*
	 * send_message() only (SEND jobs): `length` bytes at `payload` for the
	 * mailbox of scoped name `mailbox` ("<uid>:<name>",
	 * 1..TRANSPORT_MAILBOX_NAME_MAX printable bytes, NUL-terminated) and key
	 * `remote_key` of the daemon `remote_instance`; both stay valid until
	 * done. Region, offsets, local and imm are unused.
	 */
	const char *mailbox;
	const uint8_t *payload;
	/*
	 * Several ranges as one transfer (transports with max_runs > 1, WRITE
	 * or READ): n_runs > 0 runs (local_offset, remote_offset, length each,
	 * every length > 0; dest is unused) of the one remote region, valid
	 * until done; `length` is their sum and local_offset / remote_offset
	 * are unused. The imm, when set, counts once after all of them landed.
	 */
	const struct plan_run *runs;
	uint32_t n_runs;
	/*
	 * A lookup (mailbox TRANSPORT_LOOKUP_MAILBOX, payload = the region name):
	 * the peer's answer of status 0 carries the published descriptor, copied
	 * to reply (reply_size bytes) with its length in reply_len before done.
	 */
	uint8_t *reply;
	uint32_t reply_size;
	uint32_t reply_len;
	/*
	 * A latency-class chunk ([qos] enabled): TCP sends it over a second
	 * connection to the peer that carries only such chunks, so it never
	 * queues behind bulk frames or their bytes in the socket buffers.
	 */
	bool urgent;
	/*
	 * Set by a transport that times its sends ([metrics] job_stages): when
	 * the call handing the xfer's first bytes to the NIC or the socket
	 * (ibv_post_send(), sendmsg()) began and returned (now_ns()); 0 when
	 * not timed.
	 */
	uint64_t post_ns;
	uint64_t post_end_ns;
	/* transport-private */
	struct list_node link;
	uint64_t wire_id;
	uint64_t started_ms;
	bool withdrawn;   /* its job completed while the transport still held it */
	uint8_t requeues; /* times sent again after another xfer's fault broke its connection */
};

/*
 * The reserved mailbox that carries named-region lookups: its space keeps it
 * out of the names clients may open. A lookup may name remote_instance 0,
 * "whichever daemon listens there", since the asker may not know it yet.
 */
#define TRANSPORT_LOOKUP_MAILBOX " lookup"
#define TRANSPORT_REPLY_MAX      DESC_MAX_BYTES

static inline bool transport_is_lookup(const struct xfer *xfer)
{
	return xfer->mailbox && __builtin_strcmp(xfer->mailbox, TRANSPORT_LOOKUP_MAILBOX) == 0;
}

/* Bounds of a SEND message (equal to mailbox.h's; the wire format depends on them). */
#define TRANSPORT_MAILBOX_NAME_MAX    75 /* a scoped name "<uid>:<name>" */
#define TRANSPORT_MESSAGE_PAYLOAD_MAX (64u * 1024)

/* One connection to a peer daemon, as the admin socket shows it. */
struct transport_conn_info {
	const char *peer;      /* "addr:port" */
	const char *node_name; /* the peer's node name, "" before the handshake */
	const char *state;     /* "connecting", "handshake", "ready", "backoff", ... */
	bool outgoing;         /* this daemon connected (requester side) */
	uint32_t in_flight;    /* requests sent whose answer is pending */
	uint32_t queued;       /* requests waiting to be sent */
	uint64_t bytes_sent;   /* payload and framing */
	uint64_t bytes_received;
	uint64_t idle_ms; /* since the last byte moved */
	/* verbs, per-uid isolation: protection domains here and at the peer; 0: shared */
	uint32_t local_domain;
	uint32_t remote_domain;
	/* Carries only latency-class requests ([qos] on): a latency lane. */
	bool latency_lane;
	uint32_t qps; /* verbs: queue pairs of an outgoing connection; 0 otherwise */
};
typedef void (*transport_conn_cb)(void *arg, const struct transport_conn_info *info);

#define TRANSPORT_PORT_GIDS_MAX 8

/* One port of an RDMA device in use, as the admin socket shows it. */
struct transport_port_info {
	const char *device;     /* "mlx5_0" */
	uint32_t port;          /* 1-based */
	const char *state;      /* "ACTIVE", "DOWN", ... */
	const char *link_layer; /* "InfiniBand" or "Ethernet" */
	uint32_t active_mtu;    /* bytes */
	uint32_t max_mtu;       /* bytes */
	const char *netdev;     /* "" when none */
	bool dmabuf;            /* ibv_reg_dmabuf_mr works on this device */
	bool peermem;           /* nvidia_peermem is loaded */
	uint32_t n_gids;
	struct {
		uint32_t index;
		char gid[46];     /* as text */
		const char *type; /* "IB", "RoCE v1", "RoCE v2" */
	} gids[TRANSPORT_PORT_GIDS_MAX];
};
typedef void (*transport_port_cb)(void *arg, const struct transport_port_info *info);

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

	/* Optional, for the admin socket (NULL when a transport has none). */
	/* Report every connection to cb, synchronously. */
	void (*list_conns)(struct transport *transport, transport_conn_cb cb, void *arg);
	/*
	 * Close every connection to peer ("addr:port" or the peer's node name); their
	 * xfers fail with RDMAX_E_TRANSPORT_ERROR. Returns how many were closed.
	 */
	int (*reset_peer)(struct transport *transport, const char *peer);
	/* Report every port of every device in use to cb, synchronously. */
	void (*list_ports)(struct transport *transport, transport_port_cb cb, void *arg);

	/*
	 * Optional: carry a small message (xfer->mailbox, payload, length) to a
	 * mailbox of the peer daemon and bring back its status (0, or e.g.
	 * RDMAX_E_NOT_FOUND for a mailbox that is not open there). Same contract as
	 * submit(). NULL: the engine completes SEND jobs over this transport with
	 * RDMAX_E_UNIMPLEMENTED.
	 */
	int (*send_message)(struct transport *transport, struct xfer *xfer);

	/*
	 * Optional, for transports with several devices: the name of the local
	 * device that carries xfers to `peer` into ret_device ("" when routing
	 * decides). 0, or RDMAX_E_UNREACHABLE while that device has no active
	 * port (the engine then stripes over the other devices).
	 */
	int (*route)(struct transport *transport, const struct endpoint *peer, char *ret_device,
		     size_t device_size);

	/*
	 * Optional: the xfer's job has completed (deadline, cancel, another chunk
	 * failed, the client left), so no byte of it may move any more. Returns 0
	 * when the xfer is detached: it is never started, its source is never read
	 * again, a READ's answer is discarded instead of written, and done is
	 * never called. Returns -EINPROGRESS for an xfer half on the wire (a TCP
	 * frame, or verbs work requests a NIC holds): the transport calls done
	 * once nothing of it can move any more (the frame is out, the WRs
	 * completed or flushed), within a bound (it fails the connection
	 * otherwise), and the engine delivers the job's completion only then.
	 * Returns -EBUSY when the transport cannot stop it; done then follows as
	 * usual. Never calls done itself.
	 */
	int (*withdraw)(struct transport *transport, struct xfer *xfer);

	/*
	 * Optional: one pass of the daemon's busy spin (main.c), between two loop
	 * iterations: reap completions (CQs, sockets with answers due) and post
	 * or send what submit() queued, without waiting for the loop's readiness
	 * events. Returns how many things moved (0: nothing). Never blocks, and
	 * is never called from inside submit(), so done may run from here.
	 */
	int (*poll)(struct transport *transport);
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
	/* Runs one WRITE or READ xfer may carry (xfer->runs); 0 or 1: one range per xfer. */
	uint32_t max_runs;
	/* Largest xfer the engine cuts a job into for this transport; 0: engine.chunk_bytes. */
	uint64_t chunk_bytes;
};

/*
 * Which transport reaches the daemon of a descriptor (verbs preferred), and
 * through which endpoint. *ret_transport is NULL for this daemon itself.
 * RDMAX_E_UNREACHABLE when no endpoint uses a transport of this daemon.
 */
int transport_resolve_peer(struct rdmaxd *daemon, const struct remote_desc *desc,
			   struct transport **ret_transport, struct endpoint *ret_peer);
/*
 * The first transport of this daemon (verbs, then TCP) that reaches an endpoint of remote, or
 * NULL; with need_message only one that carries SEND messages, and *ret_lacking (when not NULL
 * and not yet set) names a transport that was passed over for lacking them.
 */
struct transport *transport_pick(struct rdmaxd *daemon, const struct remote_desc *remote,
				 bool need_message, struct endpoint *ret_peer,
				 const char **ret_lacking);

/* TCP transport: listens on cfg listen_addr:listen_port. */
int transport_tcp_create(struct rdmaxd *daemon, struct transport **ret_transport);

/*
 * Verbs transport: rdma_cm listeners on the RDMA devices that carry the listen
 * address (every device with an IP for the wildcard address). -ENODEV when no
 * usable device has it (logged at error level under transport = verbs).
 */
int transport_verbs_create(struct rdmaxd *daemon, struct transport **ret_transport);

#endif
