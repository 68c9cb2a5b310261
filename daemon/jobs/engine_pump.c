/* SPDX-License-Identifier: MIT */
/*
 * Issuing a job's plan: runs cut into chunks (or small runs grouped into one
 * xfer), handed to the transports through the job's window (and, with [qos]
 * enabled, a credit of the daemon-wide budget that the traffic-class
 * scheduler grants by class weight and client), a node's imm on
 * its last xfer (held back until the others returned when the transport does
 * not keep order), returned xfers accounted, and runs towards this daemon
 * copied (or, for SEND, delivered) in place. Never validates a job (that is
 * done before it gets here) and never completes one except through
 * job_complete().
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_internal.h"
#include "mailbox.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"

static void xfer_done(struct xfer *xfer, int err, const char *message);

/* Take the next piece of the plan: at most one chunk of the current run. */
static void next_piece(struct job *job, struct plan_run *ret_piece)
{
	const struct plan_run *run = &job->runs[job->next_run];
	uint64_t len =
		MIN(job_chunk_bytes(job, job_node_of_run(job, run)), run->length - job->run_offset);

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

/* Why a transport refused to start an xfer; its limits are the usual reason. */
static const char *start_error(int ret)
{
	return ret == RDMAX_E_RESOURCE_EXHAUSTED
		       ? "no connection to the peer may be opened now ([limits] max_connections, "
			 "per_uid_peer_connections)"
		       : rdmax_strerror(ret);
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
	job_dest_endpoint(dest, rail_pick(job, node, NULL), &xfer->peer); /* checked at prepare */
	xfer->remote_instance = node->instance;
	xfer->remote_region = dest->region_id;
	xfer->remote_key = dest->region_key;
	xfer->remote_offset = piece->remote_offset;
	xfer->local = job_dest_local(job, dest);
	xfer->local_offset = piece->local_offset;
	xfer->length = piece->length;
	xfer->runs = n_group ? group : NULL;
	xfer->n_runs = n_group;
	uint64_t xfers = n_group ? n_group : 1;
	xfer->has_imm = node->has_imm && node->xfers_left == xfers;
	xfer->imm = job->imm;
	xfer->has_uid = job->owner && job->owner->has_uid;
	xfer->uid = job->owner ? job->owner->uid : 0;
	xfer->done = xfer_done;
	xfer->ctx = job;
	xfer->urgent = job->urgent;
	slot->job = job;
	slot->node = dest->node;
	slot->dest = piece->dest;
	slot->busy = true;
	slot->finishing = false;
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
	job->engine->qos_in_flight[job->cls]++;
	job->in_flight_bytes += xfer->length;
	return 0;
}

static void xfer_done(struct xfer *xfer, int err, const char *message)
{
	struct job_xfer *slot = container_of(xfer, struct job_xfer, xfer);
	struct job *job = slot->job;
	struct job_node *node = &job->nodes[slot->node];
	struct engine *engine = job->engine;

	if (slot->finishing) {
		job_finish_withdrawn(slot); /* the job's status was decided already */
		engine_qos_dispatch(engine);
		return;
	}
	if (err && rail_reissue(slot, err, message)) {
		return;
	}
	slot->busy = false;
	job_qos_release(job);
	job->in_flight--;
	job->in_flight_bytes -= xfer->length;
	node->in_flight--;
	if (xfer->post_ns) {
		job_post_timed(job, xfer->post_ns, xfer->post_end_ns);
	}
	if (err == 0) {
		job->bytes_done += xfer->length;
	} else {
		job_complete(job, err, "%s", message ? message : "transfer failed");
	}
	if (!job->completed && node->held && node->in_flight == 0) {
		/* Every other xfer to the node returned: the one with the imm may go. */
		struct plan_run piece = node->held_run;
		node->held = false;
		job->nodes_held--;
		int ret = issue_piece(job, slot, &piece, NULL, 0);
		if (ret < 0) {
			job_complete(job, ret, "cannot start transfer: %s", start_error(ret));
		}
	}
	job_pump(job);
	engine_qos_dispatch(engine);
}

/* A piece towards this daemon: copied (or delivered) now, checked like a remote access. */
static int run_local_piece(struct job *job, const struct plan_run *piece)
{
	struct rdmaxd *daemon = job->engine->daemon;
	const struct job_dest *dest = &job->dests[piece->dest];
	struct region *target;
	int ret;

	if (job->kind == JOB_SEND) {
		/* An address from an earlier start of this daemon holds a key nobody has now. */
		uint64_t key = job->nodes[dest->node].instance == daemon->instance_id
				       ? dest->region_key
				       : 0;
		ret = mailbox_deliver(daemon->mailboxes, job->mailbox, key, job->payload,
				      piece->length, daemon->node_name);
		if (ret == RDMAX_E_NOT_FOUND) {
			job_complete(job, ret,
				     "no mailbox '%s' with this key is open on node '%.32s'",
				     job->mailbox, daemon->node_name);
		} else if (ret < 0) {
			job_complete(job, ret, "mailbox '%s' refused the message: %s", job->mailbox,
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
		job_complete(job, ret == RDMAX_E_PERMISSION_DENIED ? RDMAX_E_REMOTE_ACCESS : ret,
			     "local target region %" PRIu64 ": %s", dest->region_id,
			     ret == RDMAX_E_NOT_FOUND ? "stale or unknown descriptor"
						      : rdmax_strerror(ret));
		return ret;
	}
	struct region *local = job_dest_local(job, dest);
	if (piece->length > 0 && (!target->addr || !local->addr)) {
		/* GPU memory has no host mapping here: only a NIC moves it (docs/gpu.md). */
		region_put(&daemon->regions, target);
		job_complete(job, RDMAX_E_GPU_NEEDS_RDMA,
			     "a copy between two regions of node '%s' cannot involve GPU memory: "
			     "GPU regions move between nodes over RDMA only",
			     daemon->node_name);
		return RDMAX_E_GPU_NEEDS_RDMA;
	}
	if (piece->length > 0 && job->op == XFER_WRITE) {
		memmove(target->addr + piece->remote_offset, local->addr + piece->local_offset,
			piece->length);
	} else if (piece->length > 0) {
		memmove(local->addr + piece->local_offset, target->addr + piece->remote_offset,
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
	uint64_t chunk = job_chunk_bytes(job, node), len = 0;
	uint32_t max = node->transport->max_runs, n = 0;
	size_t end = job->n_runs;

	if (max < 2 || job->run_offset != 0 || job->kind == JOB_SEND) {
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
void job_pump(struct job *job)
{
	struct rdmaxd *daemon = job->engine->daemon;

	job->issuing = true;
	while (!job->completed && job->next_run < job->n_runs) {
		struct job_node *node = job_node_of_run(job, &job->runs[job->next_run]);
		struct job_xfer *slot = NULL;
		struct plan_run piece;

		bool granted = false;
		if (node->transport) {
			slot = free_slot(job);
			if (!slot || !job_qos_admit(job, &granted)) {
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
				job_complete(job, ret, "cannot start transfer: %s",
					     start_error(ret));
			} else if (granted) {
				qos_charge(&job->engine->qos, job->cls, piece.length);
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
			if (granted) {
				job->qos_grant = true; /* unused: the next chunk has it */
			}
			continue;
		}
		int ret = issue_piece(job, slot, &piece, NULL, 0);
		if (ret < 0) {
			job_complete(job, ret, "cannot start transfer: %s", start_error(ret));
		} else if (granted) {
			qos_charge(&job->engine->qos, job->cls, piece.length);
		}
	}
	job->qos_grant = false;
	job->issuing = false;
	if (!job->completed && job->next_run >= job->n_runs && job->nodes_held == 0 &&
	    job->in_flight == 0) {
		job_complete(job, 0, NULL);
	}
	job_free_if_done(job);
}

/* ---- the traffic-class scheduler ([qos]) */

/* Whether a chunk of class cls may take a credit now. */
static bool credit_free(const struct engine *engine, enum qos_class cls)
{
	const struct config *cfg = &engine->daemon->cfg;
	uint32_t used = engine->qos_in_flight[QOS_LATENCY] + engine->qos_in_flight[QOS_BULK];
	uint32_t limit = cfg->qos_max_in_flight;

	if (cls == QOS_BULK) {
		limit = limit > cfg->qos_latency_reserve ? limit - cfg->qos_latency_reserve : 1;
	}
	return used < limit;
}

bool job_qos_admit(struct job *job, bool *ret_granted)
{
	struct engine *engine = job->engine;

	*ret_granted = false;
	if (!engine->daemon->cfg.qos_enabled || !job->qos_flow) {
		return true;
	}
	if (job->qos_grant) {
		job->qos_grant = false;
		*ret_granted = true;
		return true;
	}
	/* Jobs of its class already waiting go first: they are served by the scheduler. */
	if (!qos_waiting(&job->qos) && engine->qos.n_waiting[job->cls] == 0 &&
	    credit_free(engine, job->cls)) {
		return true;
	}
	if (!qos_waiting(&job->qos)) {
		engine->qos_waits[job->cls]++;
		qos_wait(&engine->qos, job->qos_flow, &job->qos);
	}
	return false;
}

void job_qos_release(struct job *job)
{
	if (job->engine->qos_in_flight[job->cls] > 0) {
		job->engine->qos_in_flight[job->cls]--;
	}
}

/*
 * The scheduler's quantum: the largest chunk any transport cuts, so that one
 * quantum always covers one charge (qos.c).
 */
static uint64_t qos_quantum(const struct rdmaxd *daemon)
{
	uint64_t q = daemon->cfg.chunk_bytes;

	for (int k = 0; k < ENDPOINT_MAX; k++) {
		const struct transport *t = daemon->transports[k];
		q = t && t->chunk_bytes > q ? t->chunk_bytes : q;
	}
	return q;
}

void engine_qos_dispatch(struct engine *engine)
{
	const struct config *cfg = &engine->daemon->cfg;

	if (engine->qos_dispatching) {
		return;
	}
	engine->qos_dispatching = true;
	/* Each turn unwaits a job or issues a chunk: bounded by the waiters and credits. */
	for (;;) {
		unsigned eligible = 0;
		for (int c = 0; c < QOS_CLASS_MAX; c++) {
			if (!cfg->qos_enabled || credit_free(engine, (enum qos_class)c)) {
				eligible |= 1u << c;
			}
		}
		struct qos_waiter *w = qos_pick(&engine->qos, cfg->qos_weight,
						qos_quantum(engine->daemon), eligible);
		if (!w) {
			break;
		}
		struct job *job = container_of(w, struct job, qos);
		qos_unwait(&engine->qos, w);
		job->qos_grant = cfg->qos_enabled;
		job_pump(job); /* may free the job */
	}
	engine->qos_dispatching = false;
}

void engine_qos_stats(const struct engine *engine, struct engine_qos_stats *ret_stats)
{
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		ret_stats->in_flight[c] = engine->qos_in_flight[c];
		ret_stats->waiting[c] = engine->qos.n_waiting[c];
		ret_stats->grants[c] = engine->qos.picks[c];
		ret_stats->granted_bytes[c] = engine->qos.charged[c];
		ret_stats->waits[c] = engine->qos_waits[c];
	}
}

void engine_qos_reconfigure(struct engine *engine)
{
	engine_qos_dispatch(engine);
}
