/* SPDX-License-Identifier: MIT */
/*
 * Internals of librdmax shared by its files and by the unit tests; never
 * installed. Names carry a client_ prefix so they cannot collide with daemon
 * modules when both are linked into the unit-test binary.
 */
#ifndef RDMAX_CLIENT_INTERNAL_H
#define RDMAX_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdmax.h"

/* Marks the functions of rdmax.h; everything else stays hidden. */
#define RDMAX_EXPORT __attribute__((visibility("default")))

/* Growable ring of events, oldest first. */
struct client_evq {
	struct rdmax_event *ev; /* cap slots */
	size_t cap;             /* 0 or a power of two */
	size_t head;            /* index of the oldest event */
	size_t len;             /* events held */
};

void client_evq_free(struct client_evq *q);
/* Make room for \p extra more events; then client_evq_push() cannot fail. */
int client_evq_reserve(struct client_evq *q, size_t extra);
/* Append a zeroed event (room must have been reserved) and return it. */
struct rdmax_event *client_evq_push(struct client_evq *q);
/* The i-th oldest event, i < len. */
struct rdmax_event *client_evq_at(const struct client_evq *q, size_t i);
/* Take out the i-th oldest event, keeping the order of the others. */
void client_evq_remove(struct client_evq *q, size_t i, struct rdmax_event *ret_event);
/* Move up to \p max oldest events to \p out; returns how many. */
size_t client_evq_pop(struct client_evq *q, struct rdmax_event *out, size_t max);

/*
 * Multiset of outstanding job ids, each with the seq of the Submit that
 * carried it (open addressing, linear probing, backward-shift deletion).
 */
struct client_job_slot {
	uint64_t job_id;
	uint64_t seq; /* 0: free slot (requests never use seq 0) */
};

struct client_jobs {
	struct client_job_slot *slots; /* cap slots */
	size_t cap;                    /* 0 or a power of two */
	size_t len;                    /* ids held */
};

void client_jobs_free(struct client_jobs *s);
/* Make room for \p extra more ids; then client_jobs_add() cannot fail. */
int client_jobs_reserve(struct client_jobs *s, size_t extra);
void client_jobs_add(struct client_jobs *s, uint64_t job_id, uint64_t seq);
bool client_jobs_has(const struct client_jobs *s, uint64_t job_id);
/* Remove one instance of \p job_id; false when none is held. */
bool client_jobs_take(struct client_jobs *s, uint64_t job_id, uint64_t *ret_seq);

/*
 * A Submit not yet known to be accepted. The daemon handles a client's
 * datagrams in order and replies to a refused Submit at once, so a later
 * reply or a completion of this or a later Submit proves it was accepted.
 */
struct client_pending {
	struct client_pending *next;
	uint64_t seq;
	size_t n_ids;
	uint64_t ids[]; /* job ids, for the completions of a refusal */
};

/* Copy text into a fixed buffer, cutting at a UTF-8 character boundary. */
void client_copy_text(char *dst, size_t dst_size, const char *src);
/* RDMAX_E_* (or 0) for a protocol Status value. */
int client_err_from_status(int status);
/* Jobs the daemon has accepted (or may still accept) and not completed. */
size_t client_outstanding_jobs(const struct rdmax_client *client);

#endif
