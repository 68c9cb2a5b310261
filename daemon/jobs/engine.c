/* SPDX-License-Identifier: MIT */
/*
 * The engine: client jobs in, transfers (xfers) out, one completion back.
 *
 * A job is validated against the client's own regions and the peers'
 * descriptors and planned as runs (planner.c: page lists, scatter
 * destinations) towards one or more nodes (daemons); runs are cut into
 * chunks of at most cfg.chunk_bytes and issued to the transports through a
 * small window of xfers. A job's imm rides on the last xfer to each node
 * (held until the node's other xfers returned when the transport does not
 * keep order). Runs towards this daemon itself are copied (or, for SEND,
 * delivered) in place. The job holds its local region until its last xfer
 * returned, even when it completed early (error, deadline, cancel), so
 * memory never goes away under a transfer.
 *
 * Exactly one completion per job: every path goes through complete_job(),
 * which records the job as completed and ignores later attempts.
 * Never does socket I/O: completions leave through the complete callback.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "discovery.h"
#include "engine.h"
#include "log.h"
#include "mailbox.h"
#include "counters.h"
#include "peer_group.h"
#include "planner.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "transport.h"

/* Chunks of one job in flight at once; also its byte budget: JOB_WINDOW * chunk_bytes. */
#define JOB_WINDOW 8
/* Xfers in flight for jobs of many runs (pages, destinations) while they stay in that budget. */
#define JOB_WINDOW_RUNS 64
/*
 * Planned runs (32 bytes each) one client's jobs may hold at once: bounds the
 * memory a client can pin with paged writes and scatters.
 */
#define RUNS_PER_CLIENT_MAX (4u << 20)

_Static_assert(MAILBOX_NAME_MAX == TRANSPORT_MAILBOX_NAME_MAX, "mailbox name bounds differ");
_Static_assert(MAILBOX_PAYLOAD_MAX == TRANSPORT_MESSAGE_PAYLOAD_MAX, "message bounds differ");

static const char *const g_kind_names[JOB_KIND_MAX] = {
	[JOB_WRITE] = "write",
	[JOB_READ] = "read",
	[JOB_PAGED_WRITE] = "paged_write",
	[JOB_PAGED_READ] = "paged_read",
	[JOB_SCATTER] = "scatter",
	[JOB_BARRIER] = "barrier",
	[JOB_SEND] = "send",
};

const char *engine_job_kind_name(int kind)
{
	return kind >= 0 && kind < JOB_KIND_MAX ? g_kind_names[kind] : "unknown";
}

/* One daemon a job moves bytes to or from: imm counting and ordering are per node. */
struct job_node {
	struct transport *transport; /* NULL: this daemon (copies in place, no xfers) */
	struct endpoint peer;
	uint64_t instance;
	uint64_t xfers_left; /* xfers (or local copies) towards this node not yet issued */
	uint32_t in_flight;
	bool has_imm;        /* the node's last xfer carries the job's imm */
	void *landing_owner; /* this daemon: the client of the region last copied into */
	bool held;           /* that last xfer waits until in_flight is 0 (unordered transport) */
	/*
	 * Device pairs (rails) to stripe chunks over: bit i names rail_eps[i],
	 * the endpoints of the node's descriptor (job->remote, a peer group
	 * member's, or a copy the job owns when rail_eps_owned). Set only with
	 * two or more usable endpoints of the node's transport; 0 otherwise
	 * (every xfer goes to peer).
	 */
	uint8_t rails;
	uint8_t n_rails;
	bool rail_eps_owned;
	const struct endpoint *rail_eps;
	struct plan_run held_run;
};

/* One remote region a job addresses. */
struct job_dest {
	uint32_t node;
	uint64_t region_id;
	uint64_t region_key;
};

/*
 * Parse cache of remote descriptors, keyed by their exact bytes: clients send
 * the same few descriptors with every job, and decoding one costs more than
 * the rest of a small job's submission. A hit only skips the parse; the
 * owning daemon still checks instance, key, bounds and access on every access.
 * DESC_CACHE_WAYS entries per set, least recently used evicted.
 */
#define DESC_CACHE_SETS    64
#define DESC_CACHE_WAYS    4
#define DESC_CACHE_KEY_MAX 512 /* longer descriptors are decoded every time */

struct desc_cache_entry {
	uint64_t hash;
	uint64_t used; /* engine->desc_clock at the last use; 0: empty */
	uint32_t len;
	uint8_t bytes[DESC_CACHE_KEY_MAX];
	struct remote_desc desc;
};

/* A device pair that failed recently: chunks avoid it until `until_ms`. */
#define RAIL_FAILS_MAX 16
struct rail_fail {
	char addr[46];
	uint16_t port;
	uint64_t until_ms;
};

struct engine {
	struct rdmaxd *daemon;
	uint32_t rail_next; /* round-robin position over the rails of striped jobs */
	uint64_t reissued;  /* chunks re-issued on another rail */
	struct log_ratelimit rail_rl;
	struct rail_fail rail_fails[RAIL_FAILS_MAX];
	engine_complete_cb complete;
	struct list_node jobs; /* every job not yet freed */
	uint64_t outstanding;  /* jobs without a completion */
	uint64_t desc_clock;
	uint64_t desc_hits;
	uint64_t desc_misses;
	struct desc_cache_entry *desc_cache; /* DESC_CACHE_SETS * DESC_CACHE_WAYS */
};

struct job;

struct job_xfer {
	struct xfer xfer;
	struct job *job;
	uint32_t node; /* index in job->nodes */
	bool busy;
	uint8_t tries; /* rails this xfer was issued on before the current one */
};

struct job {
	struct engine *engine;
	struct job_owner *owner; /* NULL once the client left */
	uint64_t id;
	struct list_node link;
	enum xfer_op op;
	struct transport *transport;
	struct endpoint peer;
	struct region *local;
	uint64_t local_offset;
	uint64_t remote_offset;
	uint64_t length;
	bool has_imm;
	uint32_t imm;
	enum job_kind kind;
	struct job_node *nodes; /* &node1, or allocated */
	struct job_dest *dests; /* &dest1, or allocated */
	struct plan_run *runs;  /* &run1, or allocated */
	uint32_t n_nodes;
	uint32_t n_dests;
	size_t n_runs;
	size_t next_run;          /* next run to issue */
	uint64_t run_offset;      /* bytes of that run already issued */
	uint32_t nodes_held;      /* nodes whose last xfer is held back */
	uint64_t runs_counted;    /* charged to the owner's runs until the completion */
	struct peer_group *group; /* referenced for the job's life */
	uint8_t *payload;         /* SEND: the message, copied */
	char mailbox[MAILBOX_NAME_MAX + 1];
	struct job_node node1; /* storage of single-node, single-run jobs */
	struct job_dest dest1;
	struct plan_run run1;
	uint32_t in_flight;       /* xfers issued and not returned */
	uint64_t bytes_done;      /* bytes of returned successful xfers */
	bool completed;           /* completion delivered (or dropped) */
	bool issuing;             /* inside pump(): do not free */
	uv_timer_t *deadline;     /* NULL when no deadline */
	uint64_t started_ns;      /* submission, for metrics and the admin socket */
	uint64_t in_flight_bytes; /* bytes of the xfers in flight */
	struct job_xfer *slots;   /* window, or an allocation of JOB_WINDOW_RUNS */
	uint32_t n_slots;
	/*
	 * Not zeroed at submission (most of a job's bytes): remote is written by a
	 * successful decode before any read, and a window slot is read only while
	 * busy, its xfer set in full when issued.
	 */
	struct remote_desc remote;
	struct job_xfer window[JOB_WINDOW];
};

static void deadline_closed(uv_handle_t *handle)
{
	free(handle);
}

/* The job's own allocations and the job; references are the caller's to drop. */
static void job_free_memory(struct job *job)
{
	for (uint32_t i = 0; i < job->n_nodes; i++) {
		if (job->nodes[i].rail_eps_owned) {
			free((void *)job->nodes[i].rail_eps);
		}
	}
	if (job->nodes != &job->node1) {
		free(job->nodes);
	}
	if (job->dests != &job->dest1) {
		free(job->dests);
	}
	if (job->runs != &job->run1) {
		free(job->runs);
	}
	if (job->slots != job->window) {
		free(job->slots);
	}
	peer_group_put(job->group);
	free(job->payload);
	list_del(&job->link);
	free(job);
}

static void job_free_if_done(struct job *job)
{
	if (!job->completed || job->in_flight > 0 || job->issuing) {
		return;
	}
	if (job->local) {
		region_put(&job->engine->daemon->regions, job->local);
	}
	job_free_memory(job);
}

/*
 * The job completed: none of its bytes may move any more. Xfers the
 * transport can still stop are detached (they count as returned); the
 * others return as usual and are ignored. Held and un-issued chunks are
 * never issued (pump stops at a completed job).
 */
static void withdraw_xfers(struct job *job)
{
	for (uint32_t i = 0; i < job->n_slots && job->in_flight > 0; i++) {
		struct job_xfer *slot = &job->slots[i];
		if (!slot->busy) {
			continue; /* a free slot's other fields are not set */
		}
		struct job_node *node = &job->nodes[slot->node];
		struct transport *t = node->transport;
		if (!t || !t->ops->withdraw || t->ops->withdraw(t, &slot->xfer) < 0) {
			continue;
		}
		slot->busy = false;
		job->in_flight--;
		job->in_flight_bytes -= slot->xfer.length;
		node->in_flight--;
	}
}

static void complete_job(struct job *job, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void complete_job(struct job *job, int err, const char *fmt, ...)
{
	char message[RDMAX_MESSAGE_MAX] = "";
	struct engine *engine = job->engine;

	if (job->completed) {
		return;
	}
	job->completed = true;
	if (job->deadline) {
		uv_timer_stop(job->deadline);
		uv_close((uv_handle_t *)job->deadline, deadline_closed);
		job->deadline = NULL;
	}
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(message, sizeof(message), fmt, ap);
		va_end(ap);
	}
	engine->outstanding--;
	withdraw_xfers(job);
	counters_job_done(&engine->daemon->counters, job->kind, err,
			  err ? job->bytes_done : job->length, now_ns() - job->started_ns,
			  job->transport ? job->peer.addr : NULL, job->peer.port, job->has_imm);
	if (job->owner) {
		struct job_owner *owner = job->owner;
		hmap_del(&owner->jobs, job->id + 1);
		owner->outstanding--;
		if (owner->uid_outstanding) {
			(*owner->uid_outstanding)--;
		}
		owner->runs -= job->runs_counted;
		job->owner = NULL;
		engine->complete(owner, job->id, err, err ? message : NULL,
				 err ? job->bytes_done : job->length);
	}
}

static void pump(struct job *job);

/* Local copies need no chunks, and a message is never cut. */
static uint64_t chunk_of(const struct job *job, const struct job_node *node)
{
	if (!node->transport || job->kind == JOB_SEND) {
		return UINT64_MAX;
	}
	return job->engine->daemon->cfg.chunk_bytes;
}

static struct job_node *node_of_run(struct job *job, const struct plan_run *run)
{
	return &job->nodes[job->dests[run->dest].node];
}

/* Take the next piece of the plan: at most one chunk of the current run. */
static void next_piece(struct job *job, struct plan_run *ret_piece)
{
	const struct plan_run *run = &job->runs[job->next_run];
	uint64_t len = MIN(chunk_of(job, node_of_run(job, run)), run->length - job->run_offset);

	*ret_piece = *run;
	ret_piece->local_offset += job->run_offset;
	ret_piece->remote_offset += job->run_offset;
	ret_piece->length = len;
	job->run_offset += len;
	if (job->run_offset >= run->length) {
		job->next_run++;
		job->run_offset = 0;
	}
}

static void xfer_done(struct xfer *xfer, int err, const char *message);

/* ---- striping over device pairs (rails) */

static bool rail_failed(const struct engine *engine, const struct endpoint *ep, uint64_t now)
{
	for (size_t i = 0; i < RAIL_FAILS_MAX; i++) {
		const struct rail_fail *f = &engine->rail_fails[i];
		if (f->until_ms > now && f->port == ep->port && strcmp(f->addr, ep->addr) == 0) {
			return true;
		}
	}
	return false;
}

static void rail_mark_failed(struct engine *engine, const struct endpoint *ep, uint64_t now)
{
	struct rail_fail *slot = &engine->rail_fails[0];

	for (size_t i = 0; i < RAIL_FAILS_MAX; i++) {
		struct rail_fail *f = &engine->rail_fails[i];
		if (f->port == ep->port && strcmp(f->addr, ep->addr) == 0) {
			slot = f;
			break;
		}
		if (f->until_ms < slot->until_ms) {
			slot = f;
		}
	}
	copy_string(slot->addr, sizeof(slot->addr), ep->addr);
	slot->port = ep->port;
	slot->until_ms = now + engine->daemon->cfg.rail_retry_ms;
}

/* A rail takes chunks while it has not failed recently and its local device is up. */
static bool rail_usable(const struct job *job, const struct job_node *node,
			const struct endpoint *ep, uint64_t now)
{
	char device[sizeof(ep->device)];

	return !rail_failed(job->engine, ep, now) &&
	       node->transport->ops->route(node->transport, ep, device, sizeof(device)) == 0;
}

/*
 * The endpoint of the next chunk to node: round robin over its usable rails
 * (engine-wide, so that single-chunk jobs spread too), never `avoid`. With
 * no usable rail: NULL when avoiding one (a re-issue), else the next rail
 * anyway, so that the transport names the failure.
 */
static const struct endpoint *pick_rail(struct job *job, const struct job_node *node,
					const struct endpoint *avoid)
{
	uint8_t idx[DESC_MAX_ENDPOINTS];
	uint32_t n = 0;

	if (node->n_rails < 2) {
		return avoid ? NULL : &node->peer;
	}
	for (uint32_t i = 0; i < DESC_MAX_ENDPOINTS; i++) {
		if (node->rails & (1u << i)) {
			idx[n++] = (uint8_t)i;
		}
	}
	uint32_t start = job->engine->rail_next++;
	uint64_t now = now_ms();
	for (uint32_t k = 0; k < n; k++) {
		const struct endpoint *ep = &node->rail_eps[idx[(start + k) % n]];
		if (avoid && endpoint_same_peer(ep, avoid)) {
			continue;
		}
		if (rail_usable(job, node, ep, now)) {
			return ep;
		}
	}
	return avoid ? NULL : &node->rail_eps[idx[start % n]];
}

/*
 * Errors of a device pair or of the path between them, not of the job:
 * INTERNAL is how a local device error reaches the engine (a work completion
 * such as a local QP operation error, which a port going down produces), and
 * another device is the right place to try again.
 */
static bool rail_error(int err)
{
	return err == RDMAX_E_TRANSPORT_ERROR || err == RDMAX_E_UNREACHABLE ||
	       err == RDMAX_E_TIMEOUT || err == RDMAX_E_INTERNAL;
}

/*
 * A chunk whose rail failed goes again over another rail: a write or read of
 * the same bytes to the same place, so landing twice changes nothing. Not the
 * chunk that carries an imm: whether it landed cannot be known, and a second
 * landing would count twice. True when re-issued (the slot stays in flight).
 */
static bool reissue(struct job_xfer *slot, int err, const char *message)
{
	struct job *job = slot->job;
	struct job_node *node = &job->nodes[slot->node];
	struct xfer *xfer = &slot->xfer;
	struct engine *engine = job->engine;

	if (job->completed || node->n_rails < 2 || !rail_error(err) || xfer->has_imm ||
	    slot->tries + 1u >= node->n_rails) {
		return false;
	}
	struct endpoint failed = xfer->peer;
	rail_mark_failed(engine, &failed, now_ms());
	const struct endpoint *next = pick_rail(job, node, &failed);
	if (!next) {
		return false;
	}
	xfer->peer = *next;
	xfer->bytes_done = 0;
	if (node->transport->ops->submit(node->transport, xfer) < 0) {
		xfer->peer = failed;
		return false;
	}
	slot->tries++;
	engine->reissued++;
	log_ratelimited(&engine->rail_rl, LOG_NOTICE,
			"job %" PRIu64 ": %" PRIu64
			" bytes re-issued to %s port %u (peer device '%s') "
			"after the pair to %s port %u (peer device '%s') failed: %s",
			job->id, xfer->length, next->addr, next->port, next->device, failed.addr,
			failed.port, failed.device, message ? message : rdmax_strerror(err));
	return true;
}

uint64_t engine_reissued_chunks(const struct engine *engine)
{
	return engine->reissued;
}

/*
 * The rails of a node: the endpoints of its descriptor (eps, n_eps) that use
 * the node's transport and, for a pinned client, a device it may use. A node
 * with one rail keeps its peer and never stripes. With `copy`, eps is scratch
 * and the node keeps its own copy when it stripes.
 */
static int set_rails(struct job *job, struct job_node *node, const struct endpoint *eps,
		     uint32_t n_eps, bool copy, const char *node_name, char *why, size_t why_size)
{
	const char *pin = job->owner->pinned_devices;
	uint32_t mask = 0, n = 0, candidates = 0;

	node->rails = 0;
	node->n_rails = 0;
	node->rail_eps = NULL;
	node->rail_eps_owned = false;
	if (!node->transport || !node->transport->ops->route || job->kind == JOB_SEND) {
		return 0;
	}
	n_eps = MIN(n_eps, (uint32_t)DESC_MAX_ENDPOINTS);
	for (uint32_t i = 0; i < n_eps; i++) {
		candidates += eps[i].transport == node->transport->kind;
	}
	if (candidates < 2 && !pin[0]) {
		return 0; /* the common case costs nothing */
	}
	for (uint32_t i = 0; i < n_eps; i++) {
		const struct endpoint *ep = &eps[i];
		char device[sizeof(ep->device)] = "";
		if (ep->transport != node->transport->kind) {
			continue;
		}
		(void)node->transport->ops->route(node->transport, ep, device, sizeof(device));
		if (pin[0] && !name_in_list(pin, device)) {
			continue;
		}
		if (n == 0) {
			node->peer = *ep;
		}
		mask |= 1u << i;
		n++;
	}
	if (n == 0) {
		snprintf(
			why, why_size,
			"this client is pinned to device%s '%.40s' ([verbs] pin), and none of them "
			"reaches node '%.32s'",
			strchr(pin, ',') ? "s" : "", pin, node_name);
		return RDMAX_E_UNREACHABLE;
	}
	if (n > 1) {
		if (copy) {
			struct endpoint *own = malloc(n_eps * sizeof(*own));
			if (!own) {
				snprintf(why, why_size, "out of memory");
				return -ENOMEM;
			}
			memcpy(own, eps, n_eps * sizeof(*own));
			eps = own;
			node->rail_eps_owned = true;
		}
		node->rail_eps = eps;
		node->rails = (uint8_t)mask;
		node->n_rails = (uint8_t)n;
	}
	return 0;
}

/*
 * Issue piece; with n_group > 0 the piece stands for the n_group whole runs
 * at group, sent as one xfer (transport->max_runs).
 */
static int issue_piece(struct job *job, struct job_xfer *slot, const struct plan_run *piece,
		       const struct plan_run *group, uint32_t n_group)
{
	const struct job_dest *dest = &job->dests[piece->dest];
	struct job_node *node = &job->nodes[dest->node];
	struct xfer *xfer = &slot->xfer;
	int ret;

	memset(xfer, 0, sizeof(*xfer));
	xfer->op = job->op;
	xfer->peer = *pick_rail(job, node, NULL);
	xfer->remote_instance = node->instance;
	xfer->remote_region = dest->region_id;
	xfer->remote_key = dest->region_key;
	xfer->remote_offset = piece->remote_offset;
	xfer->local = job->local;
	xfer->local_offset = piece->local_offset;
	xfer->length = piece->length;
	xfer->runs = n_group ? group : NULL;
	xfer->n_runs = n_group;
	uint64_t xfers = n_group ? n_group : 1;
	xfer->has_imm = node->has_imm && node->xfers_left == xfers;
	xfer->imm = job->imm;
	xfer->done = xfer_done;
	xfer->ctx = job;
	slot->job = job;
	slot->node = dest->node;
	slot->busy = true;
	slot->tries = 0;
	if (job->kind == JOB_SEND) {
		xfer->mailbox = job->mailbox;
		xfer->payload = job->payload;
		ret = node->transport->ops->send_message(node->transport, xfer);
	} else {
		ret = node->transport->ops->submit(node->transport, xfer);
	}
	if (ret < 0) {
		slot->busy = false;
		return ret;
	}
	node->xfers_left -= xfers;
	node->in_flight++;
	job->in_flight++;
	job->in_flight_bytes += xfer->length;
	return 0;
}

static void xfer_done(struct xfer *xfer, int err, const char *message)
{
	struct job_xfer *slot = container_of(xfer, struct job_xfer, xfer);
	struct job *job = slot->job;
	struct job_node *node = &job->nodes[slot->node];

	if (err && reissue(slot, err, message)) {
		return;
	}
	slot->busy = false;
	job->in_flight--;
	job->in_flight_bytes -= xfer->length;
	node->in_flight--;
	if (err == 0) {
		job->bytes_done += xfer->length;
	} else {
		complete_job(job, err, "%s", message ? message : "transfer failed");
	}
	if (!job->completed && node->held && node->in_flight == 0) {
		/* Every other xfer to the node returned: the one with the imm may go. */
		struct plan_run piece = node->held_run;
		node->held = false;
		job->nodes_held--;
		int ret = issue_piece(job, slot, &piece, NULL, 0);
		if (ret < 0) {
			complete_job(job, ret, "cannot start transfer: %s", rdmax_strerror(ret));
		}
	}
	pump(job);
}

/* A piece towards this daemon: copied (or delivered) now, checked like a remote access. */
static int run_local_piece(struct job *job, const struct plan_run *piece)
{
	struct rdmaxd *daemon = job->engine->daemon;
	const struct job_dest *dest = &job->dests[piece->dest];
	struct region *target;
	int ret;

	if (job->kind == JOB_SEND) {
		ret = mailbox_deliver(daemon->mailboxes, job->mailbox, job->payload, piece->length,
				      daemon->node_name);
		if (ret == RDMAX_E_NOT_FOUND) {
			complete_job(job, ret, "no mailbox '%s' is open on node '%s'", job->mailbox,
				     daemon->node_name);
		} else if (ret < 0) {
			complete_job(job, ret, "mailbox '%s' refused the message: %s", job->mailbox,
				     rdmax_strerror(ret));
		} else {
			job->bytes_done += piece->length;
		}
		return ret;
	}
	uint32_t need =
		job->op == XFER_WRITE ? RDMAX_ACCESS_REMOTE_WRITE : RDMAX_ACCESS_REMOTE_READ;
	ret = region_get_remote(&daemon->regions, daemon->instance_id, dest->region_id,
				dest->region_key, piece->remote_offset, piece->length, need,
				&target);
	if (ret == 0 && job->op == XFER_WRITE && piece->length > 0 && !target->writable) {
		region_put(&daemon->regions, target);
		ret = RDMAX_E_PERMISSION_DENIED;
	}
	if (ret < 0) {
		complete_job(job, ret == RDMAX_E_PERMISSION_DENIED ? RDMAX_E_REMOTE_ACCESS : ret,
			     "local target region %" PRIu64 ": %s", dest->region_id,
			     ret == RDMAX_E_NOT_FOUND ? "stale or unknown descriptor"
						      : rdmax_strerror(ret));
		return ret;
	}
	if (piece->length > 0 && (!target->addr || !job->local->addr)) {
		/* GPU memory has no host mapping here: only a NIC moves it (docs/gpu.md). */
		region_put(&daemon->regions, target);
		complete_job(job, RDMAX_E_GPU_NEEDS_RDMA,
			     "a copy between two regions of node '%s' cannot involve GPU memory: "
			     "GPU regions move between nodes over RDMA only",
			     daemon->node_name);
		return RDMAX_E_GPU_NEEDS_RDMA;
	}
	if (piece->length > 0 && job->op == XFER_WRITE) {
		memmove(target->addr + piece->remote_offset, job->local->addr + piece->local_offset,
			piece->length);
	} else if (piece->length > 0) {
		memmove(job->local->addr + piece->local_offset, target->addr + piece->remote_offset,
			piece->length);
	}
	job->nodes[dest->node].landing_owner = region_imm_owner(target);
	region_put(&daemon->regions, target);
	job->bytes_done += piece->length;
	return 0;
}

/* Room in the window: a slot, and bytes in flight under JOB_WINDOW chunks. */
static struct job_xfer *free_slot(struct job *job)
{
	uint64_t budget = (uint64_t)JOB_WINDOW * job->engine->daemon->cfg.chunk_bytes;

	if (job->in_flight >= job->n_slots || job->in_flight_bytes >= budget) {
		return NULL;
	}
	for (size_t i = 0; i < job->n_slots; i++) {
		if (!job->slots[i].busy) {
			return &job->slots[i];
		}
	}
	return NULL;
}

/*
 * Whole runs from the next one on that can travel as one xfer: the node's
 * transport takes several (max_runs), they go to the same destination, each
 * fits one chunk, and together they stay within a chunk. 0 when fewer than
 * two qualify (the next piece goes alone). An unordered transport holds the
 * imm's xfer back alone, so the node's last run is never grouped there.
 */
static uint32_t group_runs(const struct job *job, const struct job_node *node, uint64_t *ret_len)
{
	uint64_t chunk = chunk_of(job, node), len = 0;
	uint32_t max = node->transport->max_runs, n = 0;
	size_t end = job->n_runs;

	if (max < 2 || job->run_offset != 0 || job->op != XFER_WRITE || job->kind == JOB_SEND) {
		return 0;
	}
	if (node->has_imm && !node->transport->ordered) {
		end--;
	}
	for (size_t i = job->next_run; i < end && n < max; i++) {
		const struct plan_run *run = &job->runs[i];
		if (run->dest != job->runs[job->next_run].dest || run->length == 0 ||
		    run->length > chunk - len) {
			break;
		}
		len += run->length;
		n++;
	}
	*ret_len = len;
	return n >= 2 ? n : 0;
}

/*
 * Issue the plan in order as far as the window allows; a node's last xfer
 * is held back (node->held) while others to it are in flight on a transport
 * that does not keep order. Completes the job once everything returned and
 * frees it when done: callers must not touch the job afterwards.
 */
static void pump(struct job *job)
{
	struct rdmaxd *daemon = job->engine->daemon;

	job->issuing = true;
	while (!job->completed && job->next_run < job->n_runs) {
		struct job_node *node = node_of_run(job, &job->runs[job->next_run]);
		struct job_xfer *slot = NULL;
		struct plan_run piece;

		if (node->transport) {
			slot = free_slot(job);
			if (!slot) {
				break;
			}
		}
		uint64_t group_len = 0;
		uint32_t n_group = node->transport ? group_runs(job, node, &group_len) : 0;
		if (n_group > 0) {
			const struct plan_run *group = &job->runs[job->next_run];
			piece = *group;
			piece.length = group_len;
			job->next_run += n_group;
			int ret = issue_piece(job, slot, &piece, group, n_group);
			if (ret < 0) {
				complete_job(job, ret, "cannot start transfer: %s",
					     rdmax_strerror(ret));
			}
			continue;
		}
		next_piece(job, &piece);
		if (!node->transport) {
			if (run_local_piece(job, &piece) < 0) {
				break;
			}
			if (--node->xfers_left == 0 && node->has_imm) {
				imm_landed(&daemon->imm, node->landing_owner, job->imm);
			}
			continue;
		}
		if (node->has_imm && node->xfers_left == 1 && !node->transport->ordered &&
		    node->in_flight > 0) {
			node->held = true;
			node->held_run = piece;
			job->nodes_held++;
			continue;
		}
		int ret = issue_piece(job, slot, &piece, NULL, 0);
		if (ret < 0) {
			complete_job(job, ret, "cannot start transfer: %s", rdmax_strerror(ret));
		}
	}
	job->issuing = false;
	if (!job->completed && job->next_run >= job->n_runs && job->nodes_held == 0 &&
	    job->in_flight == 0) {
		complete_job(job, 0, NULL);
	}
	job_free_if_done(job);
}

static void deadline_fired(uv_timer_t *timer)
{
	struct job *job = timer->data;

	complete_job(job, RDMAX_E_TIMEOUT,
		     "deadline of job %" PRIu64 " passed after %" PRIu64 " of %" PRIu64 " bytes",
		     job->id, job->bytes_done, job->length);
	job_free_if_done(job);
}

/* Like transport_resolve_peer(), with the reason in why; SEND needs send_message. */
static int resolve(struct job *job, const struct remote_desc *desc,
		   struct transport **ret_transport, struct endpoint *ret_peer, char *why,
		   size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	const char *lacking = NULL;
	struct endpoint peer;
	struct transport *transport;

	if (desc->instance_id == daemon->instance_id) {
		memset(ret_peer, 0, sizeof(*ret_peer));
		*ret_transport = NULL;
		return 0;
	}
	if (discovery_instance_lost(daemon->discovery, desc->instance_id)) {
		snprintf(why, why_size,
			 "node '%.63s' was lost (instance %016" PRIx64
			 "): refused until it returns",
			 desc->node_name, desc->instance_id);
		return RDMAX_E_UNREACHABLE;
	}
	transport = transport_pick(daemon, desc, job->kind == JOB_SEND, &peer, &lacking);
	if (!transport && lacking) {
		snprintf(
			why, why_size,
			"the '%s' transport cannot carry SEND messages yet, and the descriptor has "
			"no other endpoint this daemon can use",
			lacking);
		return RDMAX_E_UNIMPLEMENTED;
	}
	if (!transport) {
		snprintf(why, why_size,
			 "no endpoint of the descriptor uses a transport of this daemon");
		return RDMAX_E_UNREACHABLE;
	}
	*ret_transport = transport;
	*ret_peer = peer;
	return 0;
}

/* The client's own region, range checked and referenced for the job's life. */
static int take_local(struct job *job, uint64_t id, uint64_t offset, uint64_t length, bool into,
		      char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	struct region *region = region_find_owned(&daemon->regions, job->owner, id);

	if (!region) {
		snprintf(why, why_size, "local region %" PRIu64 " is not registered by this client",
			 id);
		return RDMAX_E_NOT_FOUND;
	}
	if (region_check_range(region, offset, length) < 0) {
		snprintf(why, why_size,
			 "local range [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64
			 " of %" PRIu64 " bytes",
			 offset, length, id, region->length);
		return RDMAX_E_OUT_OF_RANGE;
	}
	if (into && !region->writable) {
		snprintf(why, why_size, "local region %" PRIu64 " is mapped read-only", id);
		return RDMAX_E_PERMISSION_DENIED;
	}
	region_get(region);
	job->local = region;
	return 0;
}

/* The only node of a job: one transport, xfers counted for the imm rule. */
static void single_node(struct job *job, struct transport *transport, const struct endpoint *peer,
			uint64_t instance, uint64_t region_id, uint64_t region_key)
{
	job->node1 = (struct job_node){.transport = transport,
				       .peer = *peer,
				       .instance = instance,
				       .has_imm = job->has_imm};
	job->dest1 = (struct job_dest){.node = 0, .region_id = region_id, .region_key = region_key};
	job->nodes = &job->node1;
	job->n_nodes = 1;
	job->dests = &job->dest1;
	job->n_dests = 1;
	job->transport = transport;
	job->peer = *peer;
	job->length = 0;
	for (size_t i = 0; i < job->n_runs; i++) {
		job->node1.xfers_left +=
			planner_run_xfers(job->runs[i].length, chunk_of(job, &job->node1));
		job->length += job->runs[i].length;
	}
}

static uint64_t desc_hash(const uint8_t *buf, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (size_t i = 0; i < len; i++) {
		h = (h ^ buf[i]) * 0x100000001b3ull;
	}
	return h;
}

int engine_desc_decode(struct engine *engine, const uint8_t *buf, size_t len,
		       struct remote_desc *ret_desc)
{
	if (!buf || len == 0 || len > DESC_CACHE_KEY_MAX) {
		return desc_decode(buf, len, ret_desc);
	}
	uint64_t hash = desc_hash(buf, len);
	struct desc_cache_entry *set =
		&engine->desc_cache[(hash % DESC_CACHE_SETS) * DESC_CACHE_WAYS];
	struct desc_cache_entry *victim = &set[0];

	engine->desc_clock++;
	for (size_t i = 0; i < DESC_CACHE_WAYS; i++) {
		struct desc_cache_entry *e = &set[i];

		if (e->used && e->hash == hash && e->len == len &&
		    memcmp(e->bytes, buf, len) == 0) {
			e->used = engine->desc_clock;
			engine->desc_hits++;
			*ret_desc = e->desc;
			return 0;
		}
		if (e->used < victim->used) {
			victim = e;
		}
	}
	engine->desc_misses++;
	struct remote_desc desc;
	int ret = desc_decode(buf, len, &desc);
	if (ret < 0) {
		return ret; /* malformed bytes are not kept */
	}
	victim->desc = desc;
	victim->hash = hash;
	victim->used = engine->desc_clock;
	victim->len = (uint32_t)len;
	memcpy(victim->bytes, buf, len);
	*ret_desc = victim->desc;
	return 0;
}

void engine_desc_cache_stats(const struct engine *engine, uint64_t *ret_hits, uint64_t *ret_misses,
			     uint32_t *ret_entries)
{
	uint32_t n = 0;

	for (size_t i = 0; i < DESC_CACHE_SETS * DESC_CACHE_WAYS; i++) {
		n += engine->desc_cache[i].used != 0;
	}
	*ret_hits = engine->desc_hits;
	*ret_misses = engine->desc_misses;
	*ret_entries = n;
}

/* WRITE and READ: one range on each side. */
static int prepare_single(struct job *job, uint64_t local_region, ProtobufCBinaryData desc_bytes,
			  char *why, size_t why_size)
{
	struct transport *transport;
	struct endpoint peer;
	int ret;

	ret = take_local(job, local_region, job->local_offset, job->length, job->op == XFER_READ,
			 why, why_size);
	if (ret < 0) {
		return ret;
	}
	ret = engine_desc_decode(job->engine, desc_bytes.data, desc_bytes.len, &job->remote);
	if (ret < 0) {
		snprintf(why, why_size, "remote descriptor is malformed");
		return ret;
	}
	if (planner_check_range(job->remote_offset, job->length, job->remote.length) < 0) {
		snprintf(why, why_size,
			 "remote range [%" PRIu64 ", +%" PRIu64 ") outside region of %" PRIu64
			 " bytes",
			 job->remote_offset, job->length, job->remote.length);
		return RDMAX_E_OUT_OF_RANGE;
	}
	ret = resolve(job, &job->remote, &transport, &peer, why, why_size);
	if (ret < 0) {
		return ret;
	}
	job->run1 = (struct plan_run){.local_offset = job->local_offset,
				      .remote_offset = job->remote_offset,
				      .length = job->length};
	job->runs = &job->run1;
	job->n_runs = 1;
	single_node(job, transport, &peer, job->remote.instance_id, job->remote.region_id,
		    job->remote.region_key);
	ret = set_rails(job, &job->node1, job->remote.endpoints, job->remote.n_endpoints, false,
			job->remote.node_name, why, why_size);
	job->peer = job->node1.peer;
	return ret;
}

static struct plan_pages page_list(const Rdmax__V1__PageList *list)
{
	return (struct plan_pages){.offset = list->offset,
				   .stride = list->stride,
				   .indices = list->indices,
				   .count = list->n_indices};
}

/* The page lists and descriptor of a PAGED_WRITE or PAGED_READ, side by side. */
struct paged_req {
	uint64_t local_region;
	uint64_t page_len;
	const Rdmax__V1__PageList *local_pages;
	const Rdmax__V1__PageList *remote_pages;
	ProtobufCBinaryData remote_desc;
};

static int prepare_paged(struct job *job, const struct paged_req *pr, char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	bool read = job->op == XFER_READ;
	struct transport *transport;
	struct endpoint peer;
	struct plan_run *runs;
	size_t n;
	int ret;

	if (!pr->local_pages || !pr->remote_pages) {
		snprintf(why, why_size, "%s needs a src and a dst page list",
			 engine_job_kind_name(job->kind));
		return RDMAX_E_INVALID_ARGUMENT;
	}
	ret = take_local(job, pr->local_region, 0, 0, read, why, why_size);
	if (ret < 0) {
		return ret;
	}
	ret = engine_desc_decode(job->engine, pr->remote_desc.data, pr->remote_desc.len,
				 &job->remote);
	if (ret < 0) {
		snprintf(why, why_size, "remote descriptor is malformed");
		return ret;
	}
	struct plan_pages local = page_list(pr->local_pages), remote = page_list(pr->remote_pages);
	if (read) {
		ret = planner_paged_read(pr->page_len, &local, job->local->length, &remote,
					 job->remote.length, daemon->cfg.chunk_bytes, &runs, &n,
					 why, why_size);
	} else {
		ret = planner_paged(pr->page_len, &local, job->local->length, &remote,
				    job->remote.length, daemon->cfg.chunk_bytes, &runs, &n, why,
				    why_size);
	}
	if (ret < 0) {
		return ret;
	}
	if (n > 0) {
		job->runs = runs;
		job->n_runs = n;
	} else if (job->has_imm) {
		/* No pages: the imm alone still lands, as a zero-byte write. */
		job->run1 = (struct plan_run){0};
		job->runs = &job->run1;
		job->n_runs = 1;
	} else {
		job->runs = &job->run1;
		job->n_runs = 0;
	}
	ret = resolve(job, &job->remote, &transport, &peer, why, why_size);
	if (ret < 0) {
		return ret;
	}
	single_node(job, transport, &peer, job->remote.instance_id, job->remote.region_id,
		    job->remote.region_key);
	ret = set_rails(job, &job->node1, job->remote.endpoints, job->remote.n_endpoints, false,
			job->remote.node_name, why, why_size);
	job->peer = job->node1.peer;
	return ret;
}

/*
 * Daemon instance -> node index while a job is prepared. hmap reserves the
 * keys 0 and UINT64_MAX, so those two instances get a slot of their own.
 */
struct node_map {
	struct hmap map;
	uint32_t special[2]; /* node + 1 of instance 0 and UINT64_MAX; 0: none yet */
};

/* A peer or a group member, as a job sees it. */
struct target {
	uint64_t instance;
	uint64_t region_id;
	uint64_t region_key;
	uint64_t length;
	struct transport *transport;
	struct endpoint peer;
	const struct endpoint *endpoints; /* of its descriptor, for the rails */
	uint32_t n_endpoints;
	bool endpoints_scratch; /* endpoints do not outlive the job's preparation */
	const char *node_name;
};

/* The node of a target's daemon, added (with its rails) on first sight; its index or an error. */
static int64_t node_for(struct job *job, struct node_map *m, const struct target *t, char *why,
			size_t why_size)
{
	uint64_t instance = t->instance;
	struct transport *transport = t->transport;
	const struct endpoint *peer = &t->peer;
	uint32_t *special = instance == 0            ? &m->special[0]
			    : instance == UINT64_MAX ? &m->special[1]
						     : NULL;
	uintptr_t v = special ? *special : (uintptr_t)hmap_get(&m->map, instance);

	if (v) {
		return (int64_t)v - 1;
	}
	uint32_t n = job->n_nodes;
	job->nodes[n] = (struct job_node){.transport = transport,
					  .peer = *peer,
					  .instance = instance,
					  .has_imm = job->has_imm};
	if (special) {
		*special = n + 1;
	} else if (hmap_put(&m->map, instance, (void *)(uintptr_t)(n + 1)) < 0) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	job->n_nodes++;
	int ret = set_rails(job, &job->nodes[n], t->endpoints, t->n_endpoints, t->endpoints_scratch,
			    t->node_name, why, why_size);
	if (ret < 0) {
		return ret;
	}
	if (transport && !job->transport) {
		/* Metrics and the admin socket show one peer per job: the first remote one. */
		job->transport = transport;
		job->peer = job->nodes[n].peer;
	}
	return n;
}

/* Room for n nodes, dests and runs. */
static int alloc_plan(struct job *job, size_t n, char *why, size_t why_size)
{
	job->nodes = calloc(n, sizeof(*job->nodes));
	job->dests = calloc(n, sizeof(*job->dests));
	job->runs = calloc(n, sizeof(*job->runs));
	if (!job->nodes || !job->dests || !job->runs) {
		snprintf(why, why_size, "out of memory for %zu destinations", n);
		return -ENOMEM;
	}
	return 0;
}

/* Descriptor bytes of entry i, resolved; the reason names the entry. */
static int target_from_desc(struct job *job, ProtobufCBinaryData bytes, size_t i,
			    struct target *ret_target, char *why, size_t why_size)
{
	struct remote_desc *desc = &job->remote; /* scratch: only WRITE/READ keep it */
	char reason[RDMAX_MESSAGE_MAX - 32];
	int ret;

	ret = engine_desc_decode(job->engine, bytes.data, bytes.len, desc);
	if (ret < 0) {
		snprintf(why, why_size, "destination %zu: descriptor is malformed", i);
		return ret;
	}
	ret = resolve(job, desc, &ret_target->transport, &ret_target->peer, reason, sizeof(reason));
	if (ret < 0) {
		snprintf(why, why_size, "destination %zu: %s", i, reason);
		return ret;
	}
	ret_target->instance = desc->instance_id;
	ret_target->region_id = desc->region_id;
	ret_target->region_key = desc->region_key;
	ret_target->length = desc->length;
	ret_target->endpoints = desc->endpoints;
	ret_target->n_endpoints = desc->n_endpoints;
	ret_target->endpoints_scratch = true;
	ret_target->node_name = desc->node_name;
	return 0;
}

static void target_from_member(const struct peer_member *m, struct target *ret_target)
{
	*ret_target = (struct target){.instance = m->instance_id,
				      .region_id = m->region_id,
				      .region_key = m->region_key,
				      .length = m->length,
				      .transport = m->transport,
				      .peer = m->peer,
				      .endpoints = m->endpoints,
				      .n_endpoints = m->n_endpoints,
				      .node_name = ""};
}

/* The group a job names, referenced by the job. */
static int take_group(struct job *job, uint64_t handle, char *why, size_t why_size)
{
	struct peer_group *group = peer_group_find(&job->owner->groups, handle);

	if (!group) {
		snprintf(why, why_size, "peer group %" PRIu64 " does not exist", handle);
		return RDMAX_E_NOT_FOUND;
	}
	peer_group_get(group);
	job->group = group;
	return 0;
}

static void count_node_xfers(struct job *job)
{
	job->length = 0;
	for (size_t i = 0; i < job->n_runs; i++) {
		struct job_node *node = node_of_run(job, &job->runs[i]);
		node->xfers_left += planner_run_xfers(job->runs[i].length, chunk_of(job, node));
		job->length += job->runs[i].length;
	}
}

static int prepare_scatter(struct job *job, const Rdmax__V1__ScatterJob *sj, char *why,
			   size_t why_size)
{
	size_t n = sj->n_dests;
	struct plan_dest *plan = NULL;
	struct node_map map = {0};
	int ret;

	job->has_imm = sj->has_imm;
	job->imm = sj->imm;
	ret = take_local(job, sj->local_region, 0, 0, false, why, why_size);
	if (ret < 0) {
		return ret;
	}
	if (n == 0) {
		snprintf(why, why_size, "scatter job has no destinations");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (sj->has_peer_group) {
		ret = take_group(job, sj->peer_group, why, why_size);
		if (ret < 0) {
			return ret;
		}
	}
	ret = alloc_plan(job, n, why, why_size);
	if (ret < 0) {
		return ret;
	}
	plan = calloc(n, sizeof(*plan));
	ret = hmap_init(&map.map, 16);
	if (!plan || ret < 0) {
		snprintf(why, why_size, "out of memory for %zu destinations", n);
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		const Rdmax__V1__ScatterDest *d = sj->dests[i];
		bool by_desc = d->has_remote_desc && d->remote_desc.len > 0;
		struct target t;
		if (by_desc == d->has_peer_index) {
			snprintf(why, why_size,
				 "destination %zu must name either a remote_desc or a peer_index",
				 i);
			ret = RDMAX_E_INVALID_ARGUMENT;
			goto out;
		}
		if (by_desc) {
			ret = target_from_desc(job, d->remote_desc, i, &t, why, why_size);
			if (ret < 0) {
				goto out;
			}
		} else if (!job->group) {
			snprintf(why, why_size,
				 "destination %zu names peer_index %" PRIu32
				 " but the job names no peer_group",
				 i, d->peer_index);
			ret = RDMAX_E_INVALID_ARGUMENT;
			goto out;
		} else if (d->peer_index >= job->group->n_members) {
			snprintf(why, why_size,
				 "destination %zu: peer_index %" PRIu32
				 " outside peer group %" PRIu64 " of %" PRIu32 " members",
				 i, d->peer_index, job->group->handle, job->group->n_members);
			ret = RDMAX_E_OUT_OF_RANGE;
			goto out;
		} else {
			target_from_member(&job->group->members[d->peer_index], &t);
		}
		int64_t node = node_for(job, &map, &t, why, why_size);
		if (node < 0) {
			ret = (int)node;
			goto out;
		}
		job->dests[i] = (struct job_dest){.node = (uint32_t)node,
						  .region_id = t.region_id,
						  .region_key = t.region_key};
		plan[i] = (struct plan_dest){.local_offset = d->local_offset,
					     .remote_offset = d->remote_offset,
					     .length = d->length,
					     .remote_len = t.length,
					     .dest = (uint32_t)i};
	}
	job->n_dests = (uint32_t)n;
	ret = planner_scatter(plan, n, job->local->length, job->runs, why, why_size);
	if (ret < 0) {
		goto out;
	}
	job->n_runs = n;
	count_node_xfers(job);
out:
	hmap_fini(&map.map);
	free(plan);
	return ret;
}

/* One zero-byte write with the imm to each distinct node (first member or desc of it). */
static int prepare_barrier(struct job *job, const Rdmax__V1__BarrierJob *bj, char *why,
			   size_t why_size)
{
	struct node_map map = {0};
	size_t n;
	int ret;

	job->has_imm = true;
	job->imm = bj->imm;
	if (bj->has_peer_group && bj->n_remote_descs > 0) {
		snprintf(why, why_size, "barrier names both a peer_group and remote_descs");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (bj->has_peer_group) {
		ret = take_group(job, bj->peer_group, why, why_size);
		if (ret < 0) {
			return ret;
		}
	}
	n = job->group ? job->group->n_members : bj->n_remote_descs;
	if (n == 0) {
		snprintf(why, why_size, "barrier names no peers (no peer_group, no remote_descs)");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	ret = alloc_plan(job, n, why, why_size);
	if (ret == 0) {
		ret = hmap_init(&map.map, 16);
		if (ret < 0) {
			snprintf(why, why_size, "out of memory");
		}
	}
	for (size_t i = 0; i < n && ret == 0; i++) {
		struct target t;
		if (job->group) {
			target_from_member(&job->group->members[i], &t);
		} else {
			ret = target_from_desc(job, bj->remote_descs[i], i, &t, why, why_size);
			if (ret < 0) {
				break;
			}
		}
		uint32_t before = job->n_nodes;
		int64_t node = node_for(job, &map, &t, why, why_size);
		if (node < 0) {
			ret = (int)node;
		} else if (job->n_nodes > before) {
			uint32_t k = job->n_dests++;
			job->dests[k] = (struct job_dest){.node = (uint32_t)node,
							  .region_id = t.region_id,
							  .region_key = t.region_key};
			job->runs[k] = (struct plan_run){.dest = k};
		}
	}
	hmap_fini(&map.map);
	if (ret < 0) {
		return ret;
	}
	job->n_runs = job->n_dests;
	count_node_xfers(job);
	return 0;
}

static int prepare_send(struct job *job, const Rdmax__V1__SendJob *sj, char *why, size_t why_size)
{
	size_t name_len = sj->mailbox ? strnlen(sj->mailbox, MAILBOX_NAME_MAX + 1) : 0;
	struct transport *transport;
	struct endpoint peer;
	int ret;

	if (mailbox_name_check(sj->mailbox, name_len) < 0) {
		snprintf(why, why_size,
			 "mailbox name must be 1 to %u printable characters without spaces",
			 MAILBOX_NAME_MAX);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (sj->payload.len > MAILBOX_PAYLOAD_MAX) {
		snprintf(why, why_size, "payload of %zu bytes exceeds the limit of %u per message",
			 sj->payload.len, MAILBOX_PAYLOAD_MAX);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	ret = engine_desc_decode(job->engine, sj->remote_desc.data, sj->remote_desc.len,
				 &job->remote);
	if (ret < 0) {
		snprintf(why, why_size, "remote descriptor is malformed");
		return ret;
	}
	ret = resolve(job, &job->remote, &transport, &peer, why, why_size);
	if (ret < 0) {
		return ret;
	}
	job->payload = malloc(sj->payload.len ? sj->payload.len : 1);
	if (!job->payload) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	if (sj->payload.len) {
		memcpy(job->payload, sj->payload.data, sj->payload.len);
	}
	memcpy(job->mailbox, sj->mailbox, name_len);
	job->mailbox[name_len] = '\0';
	job->run1 = (struct plan_run){.length = sj->payload.len};
	job->runs = &job->run1;
	job->n_runs = 1;
	single_node(job, transport, &peer, job->remote.instance_id, job->remote.region_id,
		    job->remote.region_key);
	/* One message, whatever its size. */
	job->node1.xfers_left = 1;
	return 0;
}

/* Fill the job from its protobuf; returns 0 or an error with the reason in `why`. */
static int prepare(struct job *job, const Rdmax__V1__Job *pj, char *why, size_t why_size)
{
	job->op = XFER_WRITE;
	switch (pj->kind_case) {
	case RDMAX__V1__JOB__KIND_WRITE:
		job->kind = JOB_WRITE;
		job->local_offset = pj->write->local_offset;
		job->length = pj->write->length;
		job->remote_offset = pj->write->remote_offset;
		job->has_imm = pj->write->has_imm;
		job->imm = pj->write->imm;
		return prepare_single(job, pj->write->local_region, pj->write->remote_desc, why,
				      why_size);
	case RDMAX__V1__JOB__KIND_READ:
		job->kind = JOB_READ;
		job->op = XFER_READ;
		job->local_offset = pj->read->local_offset;
		job->length = pj->read->length;
		job->remote_offset = pj->read->remote_offset;
		return prepare_single(job, pj->read->local_region, pj->read->remote_desc, why,
				      why_size);
	case RDMAX__V1__JOB__KIND_PAGED_WRITE: {
		const Rdmax__V1__PagedWriteJob *pw = pj->paged_write;
		job->kind = JOB_PAGED_WRITE;
		job->has_imm = pw->has_imm;
		job->imm = pw->imm;
		struct paged_req pr = {.local_region = pw->local_region,
				       .page_len = pw->page_len,
				       .local_pages = pw->src,
				       .remote_pages = pw->dst,
				       .remote_desc = pw->remote_desc};
		return prepare_paged(job, &pr, why, why_size);
	}
	case RDMAX__V1__JOB__KIND_PAGED_READ: {
		const Rdmax__V1__PagedReadJob *prj = pj->paged_read;
		job->kind = JOB_PAGED_READ;
		job->op = XFER_READ;
		struct paged_req pr = {.local_region = prj->local_region,
				       .page_len = prj->page_len,
				       .local_pages = prj->dst,
				       .remote_pages = prj->src,
				       .remote_desc = prj->remote_desc};
		return prepare_paged(job, &pr, why, why_size);
	}
	case RDMAX__V1__JOB__KIND_SCATTER:
		job->kind = JOB_SCATTER;
		return prepare_scatter(job, pj->scatter, why, why_size);
	case RDMAX__V1__JOB__KIND_BARRIER:
		job->kind = JOB_BARRIER;
		return prepare_barrier(job, pj->barrier, why, why_size);
	case RDMAX__V1__JOB__KIND_SEND:
		job->kind = JOB_SEND;
		return prepare_send(job, pj->send, why, why_size);
	default:
		snprintf(why, why_size, "job has no kind");
		return RDMAX_E_INVALID_ARGUMENT;
	}
}

int engine_submit(struct engine *engine, struct job_owner *owner, const Rdmax__V1__Job *pj)
{
	struct rdmaxd *daemon = engine->daemon;
	char why[RDMAX_MESSAGE_MAX];
	struct job *job;
	int ret;

	if (pj->job_id < UINT64_MAX - 1 && hmap_get(&owner->jobs, pj->job_id + 1)) {
		/* Refused without a completion: the id's one completion is the running job's. */
		return RDMAX_E_INVALID_ARGUMENT;
	}
	job = malloc(sizeof(*job));
	if (!job) {
		engine->complete(owner, pj->job_id, -ENOMEM, "out of memory", 0);
		return 0;
	}
	memset(job, 0, offsetof(struct job, remote));
	for (size_t i = 0; i < JOB_WINDOW; i++) {
		job->window[i].busy = false;
	}
	job->engine = engine;
	job->id = pj->job_id;
	job->started_ns = now_ns();
	list_add_tail(&engine->jobs, &job->link);

	if (pj->job_id >= UINT64_MAX - 1) {
		/* Such an id cannot key the in-flight table; refuse without registering it. */
		job->completed = true;
		engine->complete(owner, pj->job_id, RDMAX_E_INVALID_ARGUMENT,
				 "job id must be below 2^64-2", 0);
		job_free_if_done(job);
		return 0;
	}
	engine->outstanding++;
	owner->outstanding++;
	if (owner->uid_outstanding) {
		(*owner->uid_outstanding)++;
	}
	job->owner = owner;
	if (hmap_put(&owner->jobs, pj->job_id + 1, job) < 0) {
		/* Not in the table: complete_job() must not find it there. */
		job->owner = NULL;
		owner->outstanding--;
		if (owner->uid_outstanding) {
			(*owner->uid_outstanding)--;
		}
		engine->outstanding--;
		job->completed = true;
		engine->complete(owner, pj->job_id, -ENOMEM, "out of memory", 0);
		job_free_if_done(job);
		return 0;
	}
	if (owner->outstanding > daemon->cfg.max_outstanding_jobs) {
		complete_job(job, RDMAX_E_RESOURCE_EXHAUSTED, "more than %u jobs outstanding",
			     daemon->cfg.max_outstanding_jobs);
		job_free_if_done(job);
		return 0;
	}
	if (owner->uid_outstanding &&
	    *owner->uid_outstanding > daemon->cfg.per_uid_outstanding_jobs) {
		complete_job(job, RDMAX_E_RESOURCE_EXHAUSTED,
			     "the clients of this uid have more than %u jobs outstanding "
			     "([limits] per_uid_outstanding_jobs)",
			     daemon->cfg.per_uid_outstanding_jobs);
		job_free_if_done(job);
		return 0;
	}
	if (daemon->draining) {
		complete_job(job, RDMAX_E_CANCELLED,
			     "the daemon is draining (rdmaxctl drain) and accepts no new jobs");
		job_free_if_done(job);
		return 0;
	}
	ret = prepare(job, pj, why, sizeof(why));
	if (ret < 0) {
		complete_job(job, ret, "%s", why);
		job_free_if_done(job);
		return 0;
	}
	if (job->runs != &job->run1) {
		/* Plans of paged writes and scatters cost memory: bounded per client. */
		if (owner->runs + job->n_runs > RUNS_PER_CLIENT_MAX) {
			complete_job(job, RDMAX_E_RESOURCE_EXHAUSTED,
				     "the client's jobs would hold more than %u planned runs",
				     RUNS_PER_CLIENT_MAX);
			job_free_if_done(job);
			return 0;
		}
		owner->runs += job->n_runs;
		job->runs_counted = job->n_runs;
	}
	job->slots = job->window;
	job->n_slots = JOB_WINDOW;
	if (job->n_runs > JOB_WINDOW && job->transport) {
		/* Many small runs: more of them in flight, the byte budget unchanged. */
		struct job_xfer *slots = calloc(JOB_WINDOW_RUNS, sizeof(*slots));
		if (slots) {
			job->slots = slots;
			job->n_slots = JOB_WINDOW_RUNS;
		}
	}
	/* Jobs that stay on this daemon are done before pump() returns: no deadline. */
	if (job->transport && pj->has_deadline_ms && pj->deadline_ms > 0) {
		job->deadline = malloc(sizeof(*job->deadline));
		if (job->deadline) {
			uv_timer_init(daemon->loop, job->deadline);
			job->deadline->data = job;
			uv_timer_start(job->deadline, deadline_fired, pj->deadline_ms, 0);
		}
	}
	pump(job);
	return 0;
}

bool engine_job_in_flight(struct job_owner *owner, uint64_t job_id)
{
	return job_id < UINT64_MAX - 1 && hmap_get(&owner->jobs, job_id + 1) != NULL;
}

int engine_create(struct rdmaxd *daemon, engine_complete_cb complete, struct engine **ret_engine)
{
	struct engine *engine = calloc(1, sizeof(*engine));

	if (!engine) {
		return -ENOMEM;
	}
	engine->desc_cache = calloc(DESC_CACHE_SETS * DESC_CACHE_WAYS, sizeof(*engine->desc_cache));
	if (!engine->desc_cache) {
		goto out_free_engine;
	}
	engine->daemon = daemon;
	engine->complete = complete;
	list_init(&engine->jobs);
	*ret_engine = engine;
	return 0;
out_free_engine:
	free(engine);
	return -ENOMEM;
}

void engine_destroy(struct engine *engine)
{
	struct list_node *pos, *tmp;

	if (!engine) {
		return;
	}
	/* Jobs whose xfers never returned (transport destroyed first): drop them. */
	list_for_each_safe(pos, tmp, &engine->jobs)
	{
		job_free_memory(container_of(pos, struct job, link));
	}
	free(engine->desc_cache);
	free(engine);
}

int job_owner_init(struct job_owner *owner)
{
	int ret;

	owner->outstanding = 0;
	owner->uid_outstanding = NULL;
	owner->gone = false;
	owner->runs = 0;
	owner->pinned_devices[0] = '\0';
	ret = peer_group_table_init(&owner->groups);
	if (ret < 0) {
		return ret;
	}
	ret = hmap_init(&owner->jobs, 64);
	if (ret < 0) {
		peer_group_table_fini(&owner->groups);
	}
	return ret;
}

void job_owner_leave(struct engine *engine, struct job_owner *owner)
{
	struct job *job;
	size_t iter = 0;

	while (hmap_next(&owner->jobs, &iter, NULL, (void **)&job)) {
		/* The job runs on (its xfers hold the memory) but reports to nobody. */
		job->owner = NULL;
		if (!job->completed) {
			complete_job(job, RDMAX_E_CANCELLED, "client left");
		}
		job_free_if_done(job);
	}
	owner->gone = true;
	owner->outstanding = 0;
	hmap_fini(&owner->jobs);
	/* Jobs still running keep their groups through their own references. */
	peer_group_table_fini(&owner->groups);
}

static struct job *find_job(struct job_owner *owner, uint64_t job_id)
{
	if (job_id >= UINT64_MAX - 1) {
		return NULL;
	}
	return hmap_get(&owner->jobs, job_id + 1);
}

int engine_cancel(struct engine *engine, struct job_owner *owner, uint64_t job_id)
{
	struct job *job = find_job(owner, job_id);

	if (!job) {
		return RDMAX_E_NOT_FOUND;
	}
	complete_job(job, RDMAX_E_CANCELLED, "cancelled by the client after %" PRIu64 " bytes",
		     job->bytes_done);
	job_free_if_done(job);
	return 0;
}

int engine_job_progress(struct engine *engine, struct job_owner *owner, uint64_t job_id,
			uint64_t *ret_done, uint64_t *ret_total)
{
	struct job *job = find_job(owner, job_id);
	uint64_t done;

	if (!job) {
		return RDMAX_E_NOT_FOUND;
	}
	done = job->bytes_done;
	for (size_t i = 0; i < job->n_slots; i++) {
		if (job->slots[i].busy) {
			done += job->slots[i].xfer.bytes_done;
		}
	}
	*ret_done = done;
	*ret_total = job->length;
	return 0;
}

uint32_t engine_fail_instance(struct engine *engine, uint64_t instance, int err,
			      const char *message)
{
	struct list_node *pos, *tmp;
	uint32_t n = 0;

	list_for_each_safe(pos, tmp, &engine->jobs)
	{
		struct job *job = container_of(pos, struct job, link);
		for (uint32_t i = 0; i < job->n_nodes && !job->completed; i++) {
			if (job->nodes[i].transport && job->nodes[i].instance == instance) {
				complete_job(job, err, "%s", message);
				n++;
			}
		}
		job_free_if_done(job);
	}
	return n;
}

void engine_cancel_all(struct engine *engine)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &engine->jobs)
	{
		struct job *job = container_of(pos, struct job, link);
		complete_job(job, RDMAX_E_CANCELLED, "daemon is shutting down");
		job_free_if_done(job);
	}
}

uint64_t engine_outstanding(const struct engine *engine)
{
	return engine->outstanding;
}

void engine_for_each_job(const struct engine *engine, engine_job_cb cb, void *arg)
{
	struct list_node *pos, *tmp;
	uint64_t now = now_ns();

	list_for_each_safe(pos, tmp, (struct list_node *)&engine->jobs)
	{
		const struct job *job = container_of(pos, struct job, link);
		struct engine_job_info info = {
			.id = job->id,
			.owner = job->owner,
			.op = job->op,
			.kind = g_kind_names[job->kind],
			.completed = job->completed,
			.peer = job->transport ? &job->peer : NULL,
			.length = job->length,
			.bytes_done = job->bytes_done,
			.chunks_in_flight = job->in_flight,
			.age_ms = (now - job->started_ns) / 1000000u,
			.has_imm = job->has_imm,
			.imm = job->imm,
		};
		for (size_t i = 0; i < job->n_slots; i++) {
			if (job->slots[i].busy) {
				info.bytes_done += job->slots[i].xfer.bytes_done;
			}
		}
		cb(arg, &info);
	}
}
