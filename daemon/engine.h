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

struct rdmaxd;
struct engine;
struct Rdmax__V1__Job;

typedef void (*engine_complete_cb)(void *owner, uint64_t job_id, int err, const char *message,
				   uint64_t bytes);

/* Per-client bookkeeping, embedded in the client's session. */
struct job_owner {
	struct hmap jobs;      /* job_id+1 -> struct job, in flight */
	uint32_t outstanding;  /* jobs without a completion yet */
	bool gone;             /* the client left; completions are dropped */
};

int engine_create(struct rdmaxd *daemon, engine_complete_cb complete, struct engine **ret_engine);
void engine_destroy(struct engine *engine);

int job_owner_init(struct job_owner *owner);
/* The client left: drop its future completions; returns once bookkeeping is detached. */
void job_owner_leave(struct engine *engine, struct job_owner *owner);

/*
 * Start one job. Exactly one completion callback follows, possibly before
 * this returns (validation errors). The callback's owner is `owner`.
 */
void engine_submit(struct engine *engine, struct job_owner *owner, const struct Rdmax__V1__Job *job);

/* Complete the job with RDMAX_E_CANCELLED now. RDMAX_E_NOT_FOUND if not in flight. */
int engine_cancel(struct engine *engine, struct job_owner *owner, uint64_t job_id);

/* Progress of an in-flight job; RDMAX_E_NOT_FOUND when not in flight. */
int engine_job_progress(struct engine *engine, struct job_owner *owner, uint64_t job_id,
			uint64_t *ret_done, uint64_t *ret_total);

/* Daemon shutdown: complete every job with RDMAX_E_CANCELLED. */
void engine_cancel_all(struct engine *engine);

/* Jobs without a completion, over all clients. */
uint64_t engine_outstanding(const struct engine *engine);

#endif
