/* SPDX-License-Identifier: MIT */
/*
 * The engine turns client jobs into transfers (xfers) on a transport, holds
 * the regions they use, enforces deadlines and cancellation, counts imm
 * landings, and guarantees exactly one completion per job. It knows nothing
 * about sockets: completions leave through the callback given at creation.
 */
#ifndef RDMAXD_ENGINE_H
#define RDMAXD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "hmap.h"
#include "peer_group.h"

struct rdmaxd;
struct engine;
struct endpoint;
struct remote_desc;
struct transport;
struct Rdmax__V1__Job;

/* What the client asked for. Every kind but READ moves bytes as writes. */
enum job_kind {
	JOB_WRITE,       /* one local range to one remote region */
	JOB_READ,        /* one remote range into the local region */
	JOB_PAGED_WRITE, /* page lists on both sides, one remote region */
	JOB_SCATTER,     /* one local region to many destinations on many nodes */
	JOB_BARRIER,     /* a zero-byte write with imm to every node of a group */
	JOB_SEND,        /* a small message for a mailbox of one node */
	JOB_KIND_MAX,    /* terminator */
};

/* "write", "paged_write", ... for logs, metrics and rdmaxctl. */
const char *engine_job_kind_name(int kind);

typedef void (*engine_complete_cb)(void *owner, uint64_t job_id, int err, const char *message,
				   uint64_t bytes);

/* Per-client bookkeeping, embedded in the client's session. */
struct job_owner {
	struct hmap jobs;               /* job_id+1 -> struct job, in flight */
	uint32_t outstanding;           /* jobs without a completion yet */
	bool gone;                      /* the client left; completions are dropped */
	struct peer_group_table groups; /* the client's peer groups (SCATTER, BARRIER) */
	uint64_t runs;                  /* planned runs held by its jobs without a completion */
	char pinned_devices[256];       /* local devices its traffic may use, "a,b"; "": any */
};

int engine_create(struct rdmaxd *daemon, engine_complete_cb complete, struct engine **ret_engine);
void engine_destroy(struct engine *engine);

/*
 * desc_decode() through the engine's parse cache of descriptor bytes: the same
 * result, without the parse when these exact bytes were decoded before. Only
 * a parse cache: every access is still checked by the region's daemon.
 */
int engine_desc_decode(struct engine *engine, const uint8_t *buf, size_t len,
		       struct remote_desc *ret_desc);
/* Lookups answered from the cache, lookups that decoded, and entries held (for tests). */
void engine_desc_cache_stats(const struct engine *engine, uint64_t *ret_hits, uint64_t *ret_misses,
			     uint32_t *ret_entries);

int job_owner_init(struct job_owner *owner);
/* The client left: drop its future completions; returns once bookkeeping is detached. */
void job_owner_leave(struct engine *engine, struct job_owner *owner);

/*
 * Start one job. Exactly one completion callback follows, possibly before
 * this returns (validation errors). The callback's owner is `owner`.
 */
void engine_submit(struct engine *engine, struct job_owner *owner,
		   const struct Rdmax__V1__Job *job);

/* Complete the job with RDMAX_E_CANCELLED now. RDMAX_E_NOT_FOUND if not in flight. */
int engine_cancel(struct engine *engine, struct job_owner *owner, uint64_t job_id);

/* Progress of an in-flight job; RDMAX_E_NOT_FOUND when not in flight. */
int engine_job_progress(struct engine *engine, struct job_owner *owner, uint64_t job_id,
			uint64_t *ret_done, uint64_t *ret_total);

/*
 * Which transport reaches the daemon of a descriptor (verbs preferred), and
 * through which endpoint. *ret_transport is NULL for this daemon itself.
 * RDMAX_E_UNREACHABLE when no endpoint uses a transport of this daemon.
 */
int engine_resolve_peer(struct rdmaxd *daemon, const struct remote_desc *desc,
			struct transport **ret_transport, struct endpoint *ret_peer);

/* Chunks re-issued on another device pair after theirs failed (for metrics and tests). */
uint64_t engine_reissued_chunks(const struct engine *engine);

/* Daemon shutdown: complete every job with RDMAX_E_CANCELLED. */
void engine_cancel_all(struct engine *engine);

/*
 * Complete every job that moves bytes to or from daemon instance (a node
 * discovery lost) with err and message, at once; the transports' later
 * results for those jobs are ignored. Returns how many jobs it completed.
 */
uint32_t engine_fail_instance(struct engine *engine, uint64_t instance, int err,
			      const char *message);

/* Jobs without a completion, over all clients. */
uint64_t engine_outstanding(const struct engine *engine);

struct endpoint;

/* One job the engine still holds, as the admin socket shows it. */
struct engine_job_info {
	uint64_t id;
	const void *owner;           /* the client's job_owner; NULL once the client left */
	int op;                      /* enum xfer_op (WRITE for paged, scatter, barrier, send) */
	const char *kind;            /* job kind: "write", "read", "paged_write", "scatter", ... */
	bool completed;              /* completion delivered; transfers still returning */
	const struct endpoint *peer; /* NULL for a job between two regions of this daemon */
	uint64_t length;
	uint64_t bytes_done; /* including progress of transfers in flight */
	uint32_t chunks_in_flight;
	uint64_t age_ms; /* since submission */
	bool has_imm;
	uint32_t imm;
};
typedef void (*engine_job_cb)(void *arg, const struct engine_job_info *info);

/* Report every job the engine holds to cb, oldest first, synchronously. */
void engine_for_each_job(const struct engine *engine, engine_job_cb cb, void *arg);

#endif
