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
#include "qos.h"

struct rdmaxd;
struct engine;
struct endpoint;
struct remote_desc;
struct transport;
struct Rdmax__V1__Job;

/* What the client asked for. Every kind but READ and PAGED_READ moves bytes as writes. */
enum job_kind {
	JOB_WRITE,       /* one local range to one remote region */
	JOB_READ,        /* one remote range into the local region */
	JOB_PAGED_WRITE, /* page lists on both sides, one remote region */
	JOB_SCATTER,     /* one local region to many destinations on many nodes */
	JOB_BARRIER,     /* a zero-byte write with imm to every node of a group */
	JOB_SEND,        /* a small message for a mailbox of one node */
	JOB_PAGED_READ,  /* page lists on both sides, read from one remote region */
	JOB_KIND_MAX,    /* terminator */
};

/* "write", "paged_write", ... for logs, metrics and rdmaxctl. */
const char *engine_job_kind_name(int kind);

typedef void (*engine_complete_cb)(void *owner, uint64_t job_id, int err, const char *message,
				   uint64_t bytes);

/* Per-client bookkeeping, embedded in the client's session. */
struct job_owner {
	struct hmap jobs;          /* job_id+1 -> struct job, in flight */
	uint32_t outstanding;      /* jobs without a completion yet */
	uint32_t *uid_outstanding; /* shared by the clients of one uid; NULL: none */
	bool has_uid;              /* uid: peer connections its jobs open count for it */
	uint32_t uid;
	bool gone;                      /* the client left; completions are dropped */
	struct peer_group_table groups; /* the client's peer groups (SCATTER, BARRIER) */
	uint64_t runs;                  /* planned runs held by its jobs without a completion */
	char pinned_devices[256];       /* local devices its traffic may use, "a,b"; "": any */
	uint32_t traffic_class;         /* its session's class (protocol value); 0: the daemon's */
	struct qos_flow flows[QOS_CLASS_MAX]; /* its jobs waiting for the scheduler, by class */
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
 * Start one job. Returns 0 and exactly one completion callback follows,
 * possibly before this returns (validation errors); the callback's owner is
 * `owner`. Returns RDMAX_E_INVALID_ARGUMENT without any completion when the
 * job id is already in flight for this owner: a completion carrying that id
 * would be a second one for the job in flight.
 */
int engine_submit(struct engine *engine, struct job_owner *owner, const struct Rdmax__V1__Job *job);

/* Whether the owner has a job with this id in flight (no completion yet). */
bool engine_job_in_flight(struct job_owner *owner, uint64_t job_id);

/* Complete the job with RDMAX_E_CANCELLED now. RDMAX_E_NOT_FOUND if not in flight. */
int engine_cancel(struct engine *engine, struct job_owner *owner, uint64_t job_id);

/* Progress of an in-flight job; RDMAX_E_NOT_FOUND when not in flight. */
int engine_job_progress(struct engine *engine, struct job_owner *owner, uint64_t job_id,
			uint64_t *ret_done, uint64_t *ret_total);

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

/*
 * Freed jobs kept for reuse: at most ENGINE_JOB_POOL_MAX, so a burst leaves
 * no more memory behind than that; a job beyond it is malloc'd and freed as
 * before. Idle jobs held now and jobs that were taken from the pool, ever
 * (for tests).
 */
#define ENGINE_JOB_POOL_MAX 64u
void engine_job_pool_stats(const struct engine *engine, uint32_t *ret_idle, uint64_t *ret_reused);

/* The traffic-class scheduler's state, for metrics, status and tests. */
struct engine_qos_stats {
	uint32_t in_flight[QOS_CLASS_MAX]; /* chunks to other daemons in flight */
	uint32_t waiting[QOS_CLASS_MAX];   /* jobs waiting for a credit */
	uint64_t grants[QOS_CLASS_MAX];    /* chunks the scheduler granted */
	uint64_t granted_bytes[QOS_CLASS_MAX];
	uint64_t waits[QOS_CLASS_MAX]; /* times a job had to wait for a credit */
};
void engine_qos_stats(const struct engine *engine, struct engine_qos_stats *ret_stats);
/*
 * [qos] changed (SIGHUP): weights and limits apply from the next pick; when
 * QoS was turned off or given more room, the jobs waiting go on now.
 */
void engine_qos_reconfigure(struct engine *engine);

struct endpoint;

/* One job the engine still holds, as the admin socket shows it. */
struct engine_job_info {
	uint64_t id;
	const void *owner;           /* the client's job_owner; NULL once the client left */
	int op;                      /* enum xfer_op (READ for read and paged_read, else WRITE) */
	const char *kind;            /* job kind: "write", "read", "paged_write", "scatter", ... */
	bool completed;              /* completion delivered; transfers still returning */
	const struct endpoint *peer; /* NULL for a job between two regions of this daemon */
	uint64_t length;
	uint64_t bytes_done; /* including progress of transfers in flight */
	uint32_t chunks_in_flight;
	uint64_t age_ms; /* since submission */
	bool has_imm;
	uint32_t imm;
	int traffic_class; /* enum qos_class */
};
typedef void (*engine_job_cb)(void *arg, const struct engine_job_info *info);

/* Report every job the engine holds to cb, oldest first, synchronously. */
void engine_for_each_job(const struct engine *engine, engine_job_cb cb, void *arg);

#endif
