/* SPDX-License-Identifier: MIT */
/*
 * The send-queue planner of a verbs link: which posted work requests are
 * signaled, how many slots the unsignaled ones hold, and which xfers a
 * completion (or a flush) retires. Pure bookkeeping over sequence numbers;
 * it never posts, so unit tests drive it directly.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sq_plan.h"

int sq_plan_init(struct sq_plan *plan, uint32_t depth, uint32_t signal_interval,
		 uint32_t max_inline, uint64_t max_wr_bytes)
{
	if (depth < 2 || max_wr_bytes == 0) {
		return -EINVAL;
	}
	memset(plan, 0, sizeof(*plan));
	plan->ring = calloc(depth, sizeof(*plan->ring));
	if (!plan->ring) {
		return -ENOMEM;
	}
	plan->depth = depth;
	plan->signal_interval = MAX(signal_interval, 1u);
	plan->max_inline = max_inline;
	plan->max_wr_bytes = max_wr_bytes;
	plan->cause_seq = UINT64_MAX;
	return 0;
}

void sq_plan_fini(struct sq_plan *plan)
{
	free(plan->ring);
	plan->ring = NULL;
}

uint32_t sq_plan_outstanding(const struct sq_plan *plan)
{
	return (uint32_t)(plan->next_seq - plan->done_seq);
}

uint32_t sq_plan_credits(const struct sq_plan *plan)
{
	uint32_t used = sq_plan_outstanding(plan);

	if (!plan->ring || plan->failed || plan->marker_posted || used + 1 >= plan->depth) {
		return 0;
	}
	return plan->depth - 1 - used;
}

uint64_t sq_plan_wrs_for(const struct sq_plan *plan, const struct xfer *xfer)
{
	if (xfer->wire_id) {
		return conn_msg_frames(xfer->length);
	}
	if (xfer->length == 0) {
		return 1;
	}
	return (xfer->length + plan->max_wr_bytes - 1) / plan->max_wr_bytes;
}

static void plan_wr(struct sq_plan *plan, struct wr_desc *wr, struct xfer *xfer, enum wr_kind kind,
		    uint64_t offset, uint64_t length, bool last)
{
	struct sq_slot *slot = &plan->ring[plan->next_seq % plan->depth];

	wr->xfer = xfer;
	wr->kind = kind;
	wr->seq = plan->next_seq++;
	wr->offset = offset;
	wr->length = length;
	wr->inline_data =
		kind != WR_READ && kind != WR_MARKER && length > 0 && length <= plan->max_inline;
	plan->since_signal++;
	wr->signaled = plan->since_signal >= plan->signal_interval;
	if (wr->signaled) {
		plan->since_signal = 0;
	}
	slot->xfer = xfer;
	slot->last = last;
	slot->signaled = wr->signaled;
}

size_t sq_plan_build(struct sq_plan *plan, struct list_node *queue, uint32_t *queued, size_t max,
		     struct wr_desc *out)
{
	size_t n = 0;

	while (!list_empty(queue)) {
		struct xfer *xfer = container_of(queue->next, struct xfer, link);
		uint64_t wrs = sq_plan_wrs_for(plan, xfer);
		if (wrs > sq_plan_credits(plan) || wrs > max - n) {
			break;
		}
		list_del(&xfer->link);
		(*queued)--;
		for (uint64_t i = 0; i < wrs; i++) {
			if (xfer->wire_id) {
				/* Frame i of a message, from its staging. */
				plan_wr(plan, &out[n++], xfer, WR_SEND, i * CONN_FRAME_MAX,
					conn_msg_frame_len(xfer->length, (uint32_t)i),
					i + 1 == wrs);
				continue;
			}
			uint64_t off = i * plan->max_wr_bytes;
			uint64_t len = MIN(plan->max_wr_bytes, xfer->length - off);
			bool last = i + 1 == wrs;
			enum wr_kind kind = xfer->op == XFER_READ ? WR_READ : WR_WRITE;
			if (last && xfer->op == XFER_WRITE && xfer->has_imm) {
				kind = WR_WRITE_IMM;
			}
			plan_wr(plan, &out[n++], xfer, kind, xfer->length ? off : 0,
				xfer->length ? len : 0, last);
		}
	}
	if (n > 0 && !out[n - 1].signaled) {
		/* Nothing may follow soon: an unsignaled tail would hold its xfers forever. */
		out[n - 1].signaled = true;
		plan->ring[out[n - 1].seq % plan->depth].signaled = true;
		plan->since_signal = 0;
	}
	return n;
}

void sq_plan_begin_drain(struct sq_plan *plan)
{
	if (!plan->failed) {
		plan->failed = true;
		plan->fail_seq = plan->done_seq;
	}
}

void sq_plan_marker(struct sq_plan *plan, struct wr_desc *out)
{
	struct sq_slot *slot = &plan->ring[plan->next_seq % plan->depth];

	memset(out, 0, sizeof(*out));
	out->kind = WR_MARKER;
	out->signaled = true;
	out->seq = plan->next_seq++;
	slot->xfer = NULL;
	slot->last = false;
	slot->signaled = true;
	plan->marker_posted = true;
	plan->marker_seq = out->seq;
	plan->since_signal = 0;
}

static uint32_t retire(struct sq_plan *plan, uint64_t upto, bool ok, sq_retire_cb cb, void *arg)
{
	uint32_t n = 0;

	while (plan->done_seq <= upto && plan->done_seq < plan->next_seq) {
		uint64_t s = plan->done_seq;
		struct sq_slot slot = plan->ring[s % plan->depth];
		plan->done_seq++;
		n++;
		if (s == plan->cause_seq) {
			plan->cause_xfer = slot.xfer;
		}
		if (!slot.xfer || !slot.last) {
			continue;
		}
		enum sq_outcome outcome = SQ_OK;
		if (!ok && plan->failed && s >= plan->fail_seq) {
			outcome = slot.xfer == plan->cause_xfer ? SQ_FAILED_CAUSE : SQ_FAILED_FLUSH;
		}
		cb(arg, slot.xfer, outcome);
	}
	return n;
}

uint32_t sq_plan_complete(struct sq_plan *plan, uint64_t seq, bool ok, bool flush, sq_retire_cb cb,
			  void *arg)
{
	if (seq < plan->done_seq || seq >= plan->next_seq) {
		return 0;
	}
	if (!ok && !plan->failed) {
		plan->failed = true;
		plan->fail_seq = seq;
		if (!flush) {
			plan->cause_seq = seq;
		}
	}
	/* A success confirms every WR before it (RC completes in order). */
	return retire(plan, seq, ok, cb, arg);
}

uint32_t sq_plan_fail_all(struct sq_plan *plan, sq_retire_cb cb, void *arg)
{
	sq_plan_begin_drain(plan);
	if (plan->next_seq == plan->done_seq) {
		return 0;
	}
	return retire(plan, plan->next_seq - 1, false, cb, arg);
}
