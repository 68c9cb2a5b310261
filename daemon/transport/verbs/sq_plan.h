/* SPDX-License-Identifier: MIT */
/*
 * The send-queue planner of one verbs link: credits, selective signaling,
 * inline, post lists, and retirement of xfers by completed sequence numbers.
 * Pure logic, no rdma-core.
 */
#ifndef RDMAXD_SQ_PLAN_H
#define RDMAXD_SQ_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn_msg.h"
#include "transport.h"
#include "util.h"

/* What one send work request does. */
enum wr_kind {
	WR_WRITE,     /* RDMA WRITE of part of an xfer */
	WR_WRITE_IMM, /* RDMA WRITE with immediate: the last WR of an xfer that carries imm */
	WR_READ,      /* RDMA READ of part of an xfer */
	WR_SEND,      /* two-sided SEND of one frame of a message (from its staging) */
	WR_MARKER,   /* signaled empty WRITE after the QP went to error: its flush ends the drain */
	WR_KIND_MAX, /* terminator */
};

/* One WR as planned; the transport turns it into an ibv_send_wr. */
struct wr_desc {
	struct xfer *xfer; /* NULL for the marker */
	enum wr_kind kind;
	uint64_t seq;    /* wr_id: position in the send queue's history */
	uint64_t offset; /* bytes into the xfer (local and remote); WR_SEND: into the staging */
	uint64_t length;
	bool signaled;
	bool inline_data;
};

struct sq_slot {
	struct xfer *xfer; /* NULL for the marker */
	bool last;         /* the xfer's last WR: retiring it completes the xfer */
	bool signaled;
};

/* How a retired xfer ended. */
enum sq_outcome {
	SQ_OK,           /* every WR of the xfer completed */
	SQ_FAILED_CAUSE, /* a WR of this xfer completed with the error status */
	SQ_FAILED_FLUSH, /* flushed (or unknown) because the queue pair failed */
	SQ_OUTCOME_MAX,  /* terminator */
};

typedef void (*sq_retire_cb)(void *arg, struct xfer *xfer, enum sq_outcome outcome);

/*
 * Send-queue accounting of one QP. A slot is held from posting until a
 * signaled WR at or after it completes (an unsignaled WR gives no completion
 * of its own), so credits come back only with signaled completions. One slot
 * is always kept for the drain marker.
 */
struct sq_plan {
	uint32_t depth;           /* WRs the send queue holds (max_send_wr) */
	uint32_t signal_interval; /* at most this many WRs per signaled one */
	uint32_t max_inline;      /* writes of 1..max_inline bytes go inline */
	uint64_t max_wr_bytes;    /* largest message of one WR */
	uint64_t next_seq;        /* seq of the next WR */
	uint64_t done_seq;        /* every WR below it is retired */
	uint32_t since_signal;    /* WRs posted since the last signaled one */
	bool failed;              /* a WR failed or the QP is draining */
	uint64_t fail_seq;        /* WRs from here on fail unless a success confirms them */
	uint64_t cause_seq;       /* the WR whose error started it, UINT64_MAX when a flush */
	struct xfer *cause_xfer;  /* its xfer, once retired */
	bool marker_posted;
	uint64_t marker_seq;
	struct sq_slot *ring; /* depth slots, indexed by seq % depth */
};

/*
 * \param depth send queue size (>= 2: one slot is the marker's)
 * \param max_wr_bytes largest WR message (> 0)
 */
int sq_plan_init(struct sq_plan *plan, uint32_t depth, uint32_t signal_interval,
		 uint32_t max_inline, uint64_t max_wr_bytes);
void sq_plan_fini(struct sq_plan *plan);
/* WRs that may still be posted (the marker's slot excluded). */
uint32_t sq_plan_credits(const struct sq_plan *plan);
/* WRs posted and not yet retired. */
uint32_t sq_plan_outstanding(const struct sq_plan *plan);
/* WRs an xfer needs (a message: one per frame). */
uint64_t sq_plan_wrs_for(const struct sq_plan *plan, const struct xfer *xfer);

/*
 * Plan whole xfers from the head of queue (linked by xfer->link) into at most
 * max WRs; planned xfers leave the queue and *queued drops by their number.
 * Every signal_interval-th WR is signaled, and so is the last one returned,
 * so that every planned WR is eventually retired.
 * \return the number of WRs written to out
 */
size_t sq_plan_build(struct sq_plan *plan, struct list_node *queue, uint32_t *queued, size_t max,
		     struct wr_desc *out);

/*
 * The QP is being drained: whatever is outstanding fails unless a successful
 * completion still confirms it (an unsignaled WR may have been flushed
 * without a completion of its own).
 */
void sq_plan_begin_drain(struct sq_plan *plan);

/* Plan the drain marker into *out (uses the reserved slot). */
void sq_plan_marker(struct sq_plan *plan, struct wr_desc *out);

/*
 * A completion for WR seq arrived with status ok / failed: every WR before it
 * completed successfully (RC completes in order) unless the queue already
 * failed. Each xfer whose last slot is retired is reported once to cb.
 * Completions for retired or unknown seqs are ignored.
 * \return the number of WRs retired
 */
uint32_t sq_plan_complete(struct sq_plan *plan, uint64_t seq, bool ok, bool flush, sq_retire_cb cb,
			  void *arg);

/* Retire everything still outstanding as failed (drain finished or given up). */
uint32_t sq_plan_fail_all(struct sq_plan *plan, sq_retire_cb cb, void *arg);

#endif
