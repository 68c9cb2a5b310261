/* SPDX-License-Identifier: MIT */
/*
 * The daemon's side of one client's shared-memory submission/completion
 * ring (proto/rdmax_ring.h, docs/protocol.md). Pure memory work: no sockets,
 * no engine. The client may rewrite the shared memory at any time; every
 * function here stays within the mapping whatever it finds there.
 */
#ifndef RDMAXD_RING_H
#define RDMAXD_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdmax_ring.h"

struct ring {
	struct rdmax_ring_view v; /* v.base == NULL: not set up */
	/* The daemon's own indices: the shared copies are only reports to the client. */
	uint32_t sq_head;
	uint32_t cq_tail;
	bool sleeping; /* RDMAX_RING_DAEMON_SLEEPING is set */
};

/*
 * Check the client's fd and map it: a regular file sealed with F_SEAL_SHRINK
 * and F_SEAL_GROW, at least as large as the sizes need, mappable read-write.
 * Returns 0, RDMAX_E_INVALID_ARGUMENT (sizes, not a regular file),
 * RDMAX_E_PERMISSION_DENIED (seals, not writable) or RDMAX_E_OUT_OF_RANGE
 * (file too small). The fd stays the caller's.
 */
int ring_map(int fd, uint32_t sq_entries, uint32_t sqe_bytes, uint32_t cq_entries,
	     struct ring *ret_ring);
/* Unmap; accepts a ring that was never mapped. */
void ring_unmap(struct ring *ring);

/*
 * Copy the next submission entry into buf (buf_size >= sqe_bytes) when it is
 * there and its `after` is at most msgs_received. Does not consume it.
 * Returns the payload length (>= 0) with the entry copied, -EAGAIN when there
 * is none (or it waits for a datagram), or RDMAX_E_PROTOCOL_ERROR when the
 * client's tail or the entry's length cannot be true.
 */
int ring_sq_peek(struct ring *ring, uint64_t msgs_received, uint8_t *buf, size_t buf_size);
/* Consume the entry ring_sq_peek() returned and report the head to the client. */
void ring_sq_consume(struct ring *ring);
/* Entries the client published that are not consumed yet (0 when its tail is garbage). */
uint32_t ring_sq_pending(const struct ring *ring);

/*
 * Post one completion (status: protocol Status) and publish it; `after` is
 * the count of datagrams sent to the client so far. Returns 0, -ENOSPC when
 * the ring is full, or RDMAX_E_PROTOCOL_ERROR when the client's head cannot
 * be true. The message is cut to RDMAX_RING_CQE_MESSAGE bytes.
 */
int ring_cq_post(struct ring *ring, uint64_t job_id, int status, uint64_t bytes,
		 const char *message, uint64_t after);

/* Report the count of datagrams sent to the client (RingNotify excluded). */
void ring_report_sent(struct ring *ring, uint64_t msgs_sent);
/* Publish how many RingNotify datagrams were sent (CAP_RING_COUNTS). */
void ring_report_notifies(struct ring *ring, uint64_t notifies_sent);
/*
 * Whether the client says it has sent no more datagrams than `received`
 * (its client_msgs_sent equal to it): the socket is most likely empty. Only
 * a hint from client memory: level-triggered readiness brings back anything
 * a wrong value leaves unread.
 */
bool ring_client_sent_all(const struct ring *ring, uint64_t received);

/* What ring_take_wake_request() found. */
enum ring_wake_request {
	RING_WAKE_NONE,   /* the client did not ask to be woken */
	RING_WAKE_SPARED, /* it asked, but has read every completion: its request stays */
	RING_WAKE_TAKEN,  /* it asked and completions wait unread: request cleared */
};

/*
 * After completions were posted: RING_WAKE_TAKEN when the client asked to be
 * woken and has not read them all (its request is cleared; the caller sends
 * one RingNotify). A client that has already read everything needs no
 * datagram: its request is left standing for the next completion.
 */
enum ring_wake_request ring_take_wake_request(struct ring *ring);

/*
 * Stop polling: tell the client to ring the doorbell. Returns false (and
 * stays awake) when entries arrived meanwhile, so none can be missed.
 */
bool ring_sleep(struct ring *ring);
/* Polling again: the client needs no doorbell. */
void ring_wake(struct ring *ring);

#endif
