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
#include "rdmax_ring.h"

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

/*
 * The library's side of the shared-memory ring (ring.c, proto/rdmax_ring.h).
 * sq_tail and cq_head are the library's own indices;
 * the shared copies are what the daemon reads.
 */
struct client_ring {
	struct rdmax_ring_view v; /* v.base == NULL: no ring */
	uint32_t sq_tail;
	uint32_t cq_head;
};

/*
 * Create the ring's memfd (sealed against shrinking and growing) and map it.
 * On success *ret_fd is the memfd for RingSetup; the caller closes it.
 */
int client_ring_create(uint32_t sq_entries, uint32_t sqe_bytes, uint32_t cq_entries,
		       struct client_ring *ret_ring, int *ret_fd);
/* Unmap; accepts a ring that was never created. */
void client_ring_destroy(struct client_ring *ring);
/* Submission slots free now. */
uint32_t client_ring_sq_space(const struct client_ring *ring);
/* Payload bytes one submission slot holds. */
uint32_t client_ring_sqe_max(const struct client_ring *ring);
/* Write the i-th unpublished entry's header; returns where its payload goes. */
uint8_t *client_ring_sqe_prepare(struct client_ring *ring, uint32_t i, uint32_t len,
				 uint64_t after);
/* Publish n prepared entries; true when the daemon sleeps and wants a RingDoorbell. */
bool client_ring_sq_publish(struct client_ring *ring, uint32_t n);
/* The oldest unconsumed completion entry, or NULL. */
const struct rdmax_ring_cqe *client_ring_cq_peek(const struct client_ring *ring);
/* Consume the entry peeked; client_ring_cq_release() gives the slots back. */
void client_ring_cq_advance(struct client_ring *ring);
void client_ring_cq_release(struct client_ring *ring);
/* Datagrams the daemon says it sent (RingNotify not counted). */
uint64_t client_ring_daemon_sent(const struct client_ring *ring);
/* RingNotify datagrams the daemon says it sent (RDMAX_CAP_RING_COUNTS). */
uint64_t client_ring_daemon_notifies(const struct client_ring *ring);
/* Tell the daemon how many datagrams we have sent, before each send. */
void client_ring_publish_sent(struct client_ring *ring, uint64_t msgs_sent);
/*
 * Ask for (true) or withdraw (false) a RingNotify on new completions. Asking
 * is followed by a full fence, so a completion posted before the daemon saw
 * the request is visible to the next client_ring_cq_peek(). Withdrawing
 * returns true when the daemon had taken the request (a RingNotify is on its
 * way or was dropped on a full socket).
 */
bool client_ring_set_wake(struct client_ring *ring, bool wake);

/* Copy text into a fixed buffer, cutting at a UTF-8 character boundary. */
void client_copy_text(char *dst, size_t dst_size, const char *src);
/* RDMAX_E_* (or 0) for a protocol Status value. */
int client_err_from_status(int status);
/* Jobs the daemon has accepted (or may still accept) and not completed. */
size_t client_outstanding_jobs(const struct rdmax_client *client);

#endif
