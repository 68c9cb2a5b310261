/* SPDX-License-Identifier: MIT */
/*
 * Private to the engine's files (engine.c, engine_prepare.c,
 * engine_fanout.c, engine_pump.c, engine_rails.c): the job, its nodes,
 * destinations and window, the engine itself, and the calls they make on
 * one another. Nothing outside daemon/jobs/engine*.c includes it; the
 * engine's interface is engine.h, which each of them includes first: this
 * header does not include it, since engine.c including a header that
 * includes engine.h would make the module depend on itself
 * (tests/check-layout).
 */
#ifndef RDMAXD_ENGINE_INTERNAL_H
#define RDMAXD_ENGINE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef RDMAXD_ENGINE_H
#error "include engine.h before engine_internal.h"
#endif

#include "log.h"
#include "mailbox.h"
#include "planner.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "transport.h"

/* Chunks of one job in flight at once; also its byte budget: JOB_WINDOW * chunk_bytes. */
#define JOB_WINDOW 8
/* Xfers in flight for jobs of many runs (pages, destinations) while they stay in that budget. */
#define JOB_WINDOW_RUNS 64

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
	/*
	 * The local region of this destination's runs, referenced for the job's
	 * life (the further pairs of a paged job); NULL: job->local.
	 */
	struct region *local;
	/*
	 * Verbs: the endpoints of this destination's own descriptor (an
	 * allocation of n_eps), whose iova and rkey replace those of the node's
	 * endpoint an xfer is sent through (a region pair other than pair 0 on
	 * the same node); NULL: the node's endpoints are this region's.
	 */
	struct endpoint *eps;
	uint32_t n_eps;
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
	struct desc_cache_entry *desc_last; /* the entry of the last hit or fill */
	uint64_t desc_hits;
	uint64_t desc_misses;
	struct desc_cache_entry *desc_cache; /* DESC_CACHE_SETS * DESC_CACHE_WAYS */
	/* Traffic classes ([qos]): credits are chunks in flight to other daemons. */
	struct qos_sched qos;
	uint32_t qos_in_flight[QOS_CLASS_MAX];
	uint64_t qos_waits[QOS_CLASS_MAX];
	bool qos_dispatching; /* inside engine_qos_dispatch(): no nested run */
	/* Freed jobs for the next submissions: no malloc/free per job (ENGINE_JOB_POOL_MAX). */
	struct job *job_pool[ENGINE_JOB_POOL_MAX];
	uint32_t n_job_pool;
	uint64_t job_pool_reused;
};

struct job;

struct job_xfer {
	struct xfer xfer;
	struct job *job;
	uint32_t node; /* index in job->nodes */
	uint32_t dest; /* index in job->dests */
	bool busy;
	bool finishing; /* withdrawn mid-wire: its done ends the job's deferred completion */
	uint8_t tries;  /* rails this xfer was issued on before the current one */
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
	char mailbox[MAILBOX_ADDR_NAME_MAX + 1]; /* SEND: the scoped name; key in dests */
	struct job_node node1;                   /* storage of single-node, single-run jobs */
	struct job_dest dest1;
	struct plan_run run1;
	uint32_t in_flight;  /* xfers issued and not returned */
	uint64_t bytes_done; /* bytes of returned successful xfers */
	bool completed;      /* completion decided (delivered, dropped or deferred) */
	/*
	 * Xfers a transport could not withdraw at once but finishes shortly (a
	 * frame half on the wire): the completion, decided with final_err and
	 * final_message, is delivered when the last of them returns.
	 */
	uint32_t finishing;
	bool delivered; /* the deferred completion went out (at the end, or at shutdown) */
	int final_err;
	char *final_message;
	bool issuing;         /* inside job_pump(): do not free */
	uv_timer_t *deadline; /* NULL when no deadline */
	uint64_t started_ns;  /* submission, for metrics and the admin socket */
	/* [metrics] job_stages: the earliest post of its xfers, its return, the latest return */
	uint64_t first_post_ns;
	uint64_t first_post_end_ns;
	uint64_t last_post_end_ns;
	uint64_t in_flight_bytes; /* bytes of the xfers in flight */
	struct job_xfer *slots;   /* window, or an allocation of JOB_WINDOW_RUNS */
	uint32_t n_slots;
	uint8_t cls; /* enum qos_class */
	/*
	 * Its xfers take the transports' latency lanes (xfer.urgent): the latency
	 * class with [qos] on, fixed at admission so that a reload never splits one
	 * job's chunks over two lanes (an ordered transport's imm must trail its data).
	 */
	bool urgent;
	bool qos_grant;            /* the scheduler granted it its next chunk */
	struct qos_waiter qos;     /* waiting for a credit (in its client's flow of cls) */
	struct qos_flow *qos_flow; /* that flow; NULL when the job never waits (no client) */
	/*
	 * Not zeroed at submission (most of a job's bytes): remote is written by a
	 * successful decode before any read, and a window slot is read only while
	 * busy, its xfer set in full when issued.
	 */
	struct remote_desc remote;
	struct job_xfer window[JOB_WINDOW];
};

static inline struct region *job_dest_local(const struct job *job, const struct job_dest *dest)
{
	return dest->local ? dest->local : job->local;
}

/*
 * The endpoint an xfer to dest goes through: `via` (a rail or the node's
 * peer) with dest's own iova and rkey on that device when dest has them.
 * False when dest's descriptor has no key for via's device.
 */
static inline bool job_dest_endpoint(const struct job_dest *dest, const struct endpoint *via,
				     struct endpoint *ret_ep)
{
	*ret_ep = *via;
	if (!dest->eps) {
		return true;
	}
	for (uint32_t i = 0; i < dest->n_eps; i++) {
		const struct endpoint *e = &dest->eps[i];
		if (endpoint_same_peer(e, via) && __builtin_strcmp(e->device, via->device) == 0) {
			ret_ep->iova = e->iova;
			ret_ep->rkey = e->rkey;
			return true;
		}
	}
	return false;
}

int job_dest_own_endpoints(const struct job_node *node, const struct endpoint *endpoints,
			   uint32_t n_endpoints, const char *which, struct endpoint **ret_eps,
			   uint32_t *ret_n, char *why, size_t why_size);

/*
 * Local copies need no chunks, and a message is never cut; a transport may cut
 * its own size (TCP: transport.tcp_chunk_bytes), the rest engine.chunk_bytes.
 */
static inline uint64_t job_chunk_bytes(const struct job *job, const struct job_node *node)
{
	if (!node->transport || job->kind == JOB_SEND) {
		return UINT64_MAX;
	}
	return node->transport->chunk_bytes ? node->transport->chunk_bytes
					    : job->engine->daemon->cfg.chunk_bytes;
}

static inline struct job_node *job_node_of_run(struct job *job, const struct plan_run *run)
{
	return &job->nodes[job->dests[run->dest].node];
}

/* ---- engine.c: life and completion */

/*
 * A slot that withdraw() left finishing (a frame half on the wire) returned:
 * when it was the job's last, the completion decided earlier is delivered.
 */
void job_finish_withdrawn(struct job_xfer *slot);
/*
 * The job's one completion (later calls do nothing): counts released, xfers
 * withdrawn, the client told. The job stays until job_free_if_done().
 */
void job_complete(struct job *job, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Frees a completed job once no xfer of it is in flight and it is not issuing. */
void job_free_if_done(struct job *job);
/* An xfer of the job came back with its post timed (xfer.post_ns, post_end_ns). */
void job_post_timed(struct job *job, uint64_t post_ns, uint64_t post_end_ns);

/* ---- engine_pump.c: issuing the plan, and the traffic-class scheduler */

/*
 * Whether the job may issue its next chunk now ([qos] off, a grant, or a
 * free credit no job of its class waits for); otherwise it waits for
 * engine_qos_dispatch(). *ret_granted says a grant was used.
 */
bool job_qos_admit(struct job *job, bool *ret_granted);
/* A chunk of the job to another daemon returned (or was withdrawn): its credit is free. */
void job_qos_release(struct job *job);
/*
 * Grant the free credits to waiting jobs, by class weight and round robin
 * over clients. Called at the end of every entry point that may have freed
 * credits (a returned chunk, a completion, a submission); never nested.
 */
void engine_qos_dispatch(struct engine *engine);

/* Issues as far as the window allows; may complete and free the job. */
void job_pump(struct job *job);

/* ---- engine_prepare.c, engine_fanout.c: validating and planning each kind of job */

/* Fill the job from its protobuf; returns 0 or an error with the reason in `why`. */
int job_prepare(struct job *job, const Rdmax__V1__Job *pj, char *why, size_t why_size);
/* Like transport_resolve_peer(), with the reason in why; SEND needs send_message. */
int job_resolve(struct job *job, const struct remote_desc *desc, struct transport **ret_transport,
		struct endpoint *ret_peer, char *why, size_t why_size);
/* The client's own region, range checked and referenced for the job's life. */
int job_take_local(struct job *job, uint64_t id, uint64_t offset, uint64_t length, bool into,
		   char *why, size_t why_size);
int job_prepare_scatter(struct job *job, const Rdmax__V1__ScatterJob *sj, char *why,
			size_t why_size);
/* One zero-byte write with the imm to each distinct node (first member or desc of it). */
int job_prepare_barrier(struct job *job, const Rdmax__V1__BarrierJob *bj, char *why,
			size_t why_size);

/* ---- engine_rails.c: striping over device pairs (rails) */

/* The node's rails from the endpoints of its descriptor (see the definition). */
int rail_set(struct job *job, struct job_node *node, const struct endpoint *eps, uint32_t n_eps,
	     bool copy, const char *node_name, char *why, size_t why_size);
/* The endpoint of the next chunk to node, never `avoid`; NULL when none is left to re-issue on. */
const struct endpoint *rail_pick(struct job *job, const struct job_node *node,
				 const struct endpoint *avoid);
/* A chunk whose rail failed goes again over another rail; true when re-issued. */
bool rail_reissue(struct job_xfer *slot, int err, const char *message);

#endif
