/* SPDX-License-Identifier: MIT */
/*
 * The engine: client jobs in, transfers (xfers) out, one completion back.
 *
 * A job is validated against the client's own regions and the peer's
 * descriptor, split into chunks of at most cfg.chunk_bytes and issued to a
 * transport through a small window of xfers. The job holds its local region
 * until its last xfer returned, even when it completed early (error,
 * deadline, cancel), so memory never goes away under a transfer.
 *
 * Exactly one completion per job: every path goes through complete_job(),
 * which records the job as completed and ignores later attempts.
 * Never does socket I/O: completions leave through the complete callback.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "transport.h"

/* Chunks of one job in flight at once. */
#define JOB_WINDOW 8

struct engine {
	struct rdmaxd *daemon;
	engine_complete_cb complete;
	struct list_node jobs; /* every job not yet freed */
	uint64_t outstanding;  /* jobs without a completion */
};

struct job;

struct job_xfer {
	struct xfer xfer;
	struct job *job;
	bool busy;
};

struct job {
	struct engine *engine;
	struct job_owner *owner; /* NULL once the client left */
	uint64_t id;
	struct list_node link;
	enum xfer_op op;
	struct transport *transport;
	struct endpoint peer;
	struct remote_desc remote;
	struct region *local;
	uint64_t local_offset;
	uint64_t remote_offset;
	uint64_t length;
	bool has_imm;
	uint32_t imm;
	uint64_t next_offset;    /* next byte (relative) to issue */
	uint32_t chunks_left;    /* chunks not yet issued */
	uint32_t in_flight;      /* xfers issued and not returned */
	uint64_t bytes_done;     /* bytes of returned successful xfers */
	bool completed;          /* completion delivered (or dropped) */
	bool issuing;            /* inside issue(): do not free */
	uv_timer_t *deadline;    /* NULL when no deadline */
	struct job_xfer window[JOB_WINDOW];
};

static void deadline_closed(uv_handle_t *handle)
{
	free(handle);
}

static void job_free_if_done(struct job *job)
{
	if (!job->completed || job->in_flight > 0 || job->issuing) {
		return;
	}
	if (job->local) {
		region_put(&job->engine->daemon->regions, job->local);
	}
	list_del(&job->link);
	free(job);
}

static void complete_job(struct job *job, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void complete_job(struct job *job, int err, const char *fmt, ...)
{
	char message[RDMAX_MESSAGE_MAX] = "";
	struct engine *engine = job->engine;

	if (job->completed) {
		return;
	}
	job->completed = true;
	if (job->deadline) {
		uv_timer_stop(job->deadline);
		uv_close((uv_handle_t *)job->deadline, deadline_closed);
		job->deadline = NULL;
	}
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(message, sizeof(message), fmt, ap);
		va_end(ap);
	}
	engine->outstanding--;
	if (job->owner) {
		struct job_owner *owner = job->owner;
		hmap_del(&owner->jobs, job->id + 1);
		owner->outstanding--;
		job->owner = NULL;
		engine->complete(owner, job->id, err, err ? message : NULL,
				 err ? job->bytes_done : job->length);
	}
}

static int issue_chunk(struct job *job, struct job_xfer *slot);

static void xfer_done(struct xfer *xfer, int err, const char *message)
{
	struct job_xfer *slot = container_of(xfer, struct job_xfer, xfer);
	struct job *job = slot->job;

	slot->busy = false;
	job->in_flight--;
	if (err == 0) {
		job->bytes_done += xfer->length;
	} else {
		complete_job(job, err, "%s", message ? message : "transfer failed");
	}
	if (!job->completed && job->chunks_left > 0) {
		/* Held last chunk (unordered transport with imm) goes once the rest returned. */
		bool last_held = job->chunks_left == 1 && job->has_imm && !job->transport->ordered;
		if (!last_held || job->in_flight == 0) {
			int ret = issue_chunk(job, slot);
			if (ret < 0) {
				complete_job(job, ret, "cannot start transfer: %s", rdmax_strerror(ret));
			}
		}
	}
	if (!job->completed && job->chunks_left == 0 && job->in_flight == 0) {
		complete_job(job, 0, NULL);
	}
	job_free_if_done(job);
}

static int issue_chunk(struct job *job, struct job_xfer *slot)
{
	uint64_t chunk = job->engine->daemon->cfg.chunk_bytes;
	struct xfer *xfer = &slot->xfer;
	uint64_t len = MIN(chunk, job->length - job->next_offset);
	int ret;

	memset(xfer, 0, sizeof(*xfer));
	xfer->op = job->op;
	xfer->peer = job->peer;
	xfer->remote_instance = job->remote.instance_id;
	xfer->remote_region = job->remote.region_id;
	xfer->remote_key = job->remote.region_key;
	xfer->remote_offset = job->remote_offset + job->next_offset;
	xfer->local = job->local;
	xfer->local_offset = job->local_offset + job->next_offset;
	xfer->length = len;
	xfer->has_imm = job->has_imm && job->chunks_left == 1;
	xfer->imm = job->imm;
	xfer->done = xfer_done;
	xfer->ctx = job;
	slot->job = job;
	slot->busy = true;
	ret = job->transport->ops->submit(job->transport, xfer);
	if (ret < 0) {
		slot->busy = false;
		return ret;
	}
	job->next_offset += len;
	job->chunks_left--;
	job->in_flight++;
	return 0;
}

/* Fill the window; stop before a held last chunk. */
static void issue(struct job *job)
{
	job->issuing = true;
	for (size_t i = 0; i < JOB_WINDOW && job->chunks_left > 0 && !job->completed; i++) {
		bool last_held = job->chunks_left == 1 && job->has_imm && !job->transport->ordered;
		if (job->window[i].busy || (last_held && job->in_flight > 0)) {
			continue;
		}
		int ret = issue_chunk(job, &job->window[i]);
		if (ret < 0) {
			complete_job(job, ret, "cannot start transfer: %s", rdmax_strerror(ret));
		}
	}
	job->issuing = false;
	if (!job->completed && job->chunks_left == 0 && job->in_flight == 0) {
		complete_job(job, 0, NULL);
	}
	job_free_if_done(job);
}

static void deadline_fired(uv_timer_t *timer)
{
	struct job *job = timer->data;

	complete_job(job, RDMAX_E_TIMEOUT, "deadline of job %" PRIu64 " passed after %" PRIu64
			   " of %" PRIu64 " bytes", job->id, job->bytes_done, job->length);
	job_free_if_done(job);
}

/* Same daemon: copy between two local regions, checked like a remote access. */
static void run_local(struct job *job)
{
	struct rdmaxd *daemon = job->engine->daemon;
	uint32_t need = job->op == XFER_WRITE ? RDMAX_ACCESS_REMOTE_WRITE : RDMAX_ACCESS_REMOTE_READ;
	struct region *target;
	int ret;

	ret = region_get_remote(&daemon->regions, job->remote.instance_id, job->remote.region_id,
				job->remote.region_key, job->remote_offset, job->length, need, &target);
	if (ret < 0) {
		complete_job(job, ret == RDMAX_E_PERMISSION_DENIED ? RDMAX_E_REMOTE_ACCESS : ret,
			     "local target region %" PRIu64 ": %s", job->remote.region_id,
			     ret == RDMAX_E_NOT_FOUND ? "stale or unknown descriptor"
						      : rdmax_strerror(ret));
		return;
	}
	if (job->op == XFER_WRITE) {
		memmove(target->addr + job->remote_offset, job->local->addr + job->local_offset,
			job->length);
	} else {
		memmove(job->local->addr + job->local_offset, target->addr + job->remote_offset,
			job->length);
	}
	region_put(&daemon->regions, target);
	job->bytes_done = job->length;
	if (job->has_imm) {
		imm_landed(&daemon->imm, job->imm);
	}
	complete_job(job, 0, NULL);
}

static struct transport *pick_transport(struct rdmaxd *daemon, const struct remote_desc *remote,
					struct endpoint *ret_peer)
{
	/* Prefer RDMA when both sides have it. */
	static const enum endpoint_transport order[] = {ENDPOINT_VERBS, ENDPOINT_TCP};

	for (size_t k = 0; k < ARRAY_SIZE(order); k++) {
		struct transport *transport = daemon->transports[order[k]];
		if (!transport) {
			continue;
		}
		for (uint32_t i = 0; i < remote->n_endpoints; i++) {
			if (remote->endpoints[i].transport == order[k]) {
				*ret_peer = remote->endpoints[i];
				return transport;
			}
		}
	}
	return NULL;
}

/* Fill the job from its protobuf; returns 0 or an error with the reason in `why`. */
static int prepare(struct job *job, const Rdmax__V1__Job *pj, char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	uint64_t local_region;
	ProtobufCBinaryData desc_bytes;
	int ret;

	switch (pj->kind_case) {
	case RDMAX__V1__JOB__KIND_WRITE:
		job->op = XFER_WRITE;
		local_region = pj->write->local_region;
		job->local_offset = pj->write->local_offset;
		job->length = pj->write->length;
		job->remote_offset = pj->write->remote_offset;
		desc_bytes = pj->write->remote_desc;
		job->has_imm = pj->write->has_imm;
		job->imm = pj->write->imm;
		break;
	case RDMAX__V1__JOB__KIND_READ:
		job->op = XFER_READ;
		local_region = pj->read->local_region;
		job->local_offset = pj->read->local_offset;
		job->length = pj->read->length;
		job->remote_offset = pj->read->remote_offset;
		desc_bytes = pj->read->remote_desc;
		break;
	case RDMAX__V1__JOB__KIND_PAGED_WRITE:
	case RDMAX__V1__JOB__KIND_SCATTER:
	case RDMAX__V1__JOB__KIND_BARRIER:
	case RDMAX__V1__JOB__KIND_SEND: {
		const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
			&rdmax__v1__job__descriptor, pj->kind_case);
		snprintf(why, why_size, "job kind '%s' is not implemented by this daemon",
			 f ? f->name : "?");
		return RDMAX_E_UNIMPLEMENTED;
	}
	default:
		snprintf(why, why_size, "job has no kind");
		return RDMAX_E_INVALID_ARGUMENT;
	}

	job->local = region_find_owned(&daemon->regions, job->owner, local_region);
	if (!job->local) {
		snprintf(why, why_size, "local region %" PRIu64 " is not registered by this client",
			 local_region);
		return RDMAX_E_NOT_FOUND;
	}
	if (region_check_range(job->local, job->local_offset, job->length) < 0) {
		snprintf(why, why_size,
			 "local range [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64
			 " of %" PRIu64 " bytes",
			 job->local_offset, job->length, local_region, job->local->length);
		job->local = NULL;
		return RDMAX_E_OUT_OF_RANGE;
	}
	if (job->op == XFER_READ && !job->local->writable) {
		snprintf(why, why_size, "local region %" PRIu64 " is mapped read-only", local_region);
		job->local = NULL;
		return RDMAX_E_PERMISSION_DENIED;
	}
	region_get(job->local);

	ret = desc_decode(desc_bytes.data, desc_bytes.len, &job->remote);
	if (ret < 0) {
		snprintf(why, why_size, "remote descriptor is malformed");
		return ret;
	}
	if (job->remote_offset > job->remote.length ||
	    job->length > job->remote.length - job->remote_offset) {
		snprintf(why, why_size,
			 "remote range [%" PRIu64 ", +%" PRIu64 ") outside region of %" PRIu64
			 " bytes",
			 job->remote_offset, job->length, job->remote.length);
		return RDMAX_E_OUT_OF_RANGE;
	}
	if (job->remote.instance_id == daemon->instance_id) {
		job->transport = NULL;
		return 0;
	}
	job->transport = pick_transport(daemon, &job->remote, &job->peer);
	if (!job->transport) {
		snprintf(why, why_size, "no endpoint of the descriptor uses a transport of this daemon");
		return RDMAX_E_UNREACHABLE;
	}
	return 0;
}

void engine_submit(struct engine *engine, struct job_owner *owner, const Rdmax__V1__Job *pj)
{
	struct rdmaxd *daemon = engine->daemon;
	char why[RDMAX_MESSAGE_MAX];
	struct job *job;
	int ret;

	job = calloc(1, sizeof(*job));
	if (!job) {
		engine->complete(owner, pj->job_id, -ENOMEM, "out of memory", 0);
		return;
	}
	job->engine = engine;
	job->id = pj->job_id;
	list_add_tail(&engine->jobs, &job->link);
	engine->outstanding++;
	owner->outstanding++;
	job->owner = owner;

	if (pj->job_id >= UINT64_MAX - 1) {
		/* Such an id cannot key the in-flight table; refuse without registering it. */
		job->owner = NULL;
		owner->outstanding--;
		engine->outstanding--;
		job->completed = true;
		engine->complete(owner, pj->job_id, RDMAX_E_INVALID_ARGUMENT,
				 "job id must be below 2^64-2", 0);
		job_free_if_done(job);
		return;
	}
	if (hmap_get(&owner->jobs, pj->job_id + 1)) {
		job->owner = NULL;
		owner->outstanding--;
		engine->outstanding--;
		job->completed = true;
		engine->complete(owner, pj->job_id, RDMAX_E_INVALID_ARGUMENT,
				 "job id is already in flight", 0);
		job_free_if_done(job);
		return;
	}
	if (hmap_put(&owner->jobs, pj->job_id + 1, job) < 0) {
		complete_job(job, -ENOMEM, "out of memory");
		job_free_if_done(job);
		return;
	}
	if (owner->outstanding > daemon->cfg.max_outstanding_jobs) {
		complete_job(job, RDMAX_E_RESOURCE_EXHAUSTED, "more than %u jobs outstanding",
			     daemon->cfg.max_outstanding_jobs);
		job_free_if_done(job);
		return;
	}
	ret = prepare(job, pj, why, sizeof(why));
	if (ret < 0) {
		complete_job(job, ret, "%s", why);
		job_free_if_done(job);
		return;
	}
	if (!job->transport) {
		run_local(job);
		job_free_if_done(job);
		return;
	}
	if (pj->has_deadline_ms && pj->deadline_ms > 0) {
		job->deadline = malloc(sizeof(*job->deadline));
		if (job->deadline) {
			uv_timer_init(daemon->loop, job->deadline);
			job->deadline->data = job;
			uv_timer_start(job->deadline, deadline_fired, pj->deadline_ms, 0);
		}
	}
	uint64_t chunk = daemon->cfg.chunk_bytes;
	job->chunks_left = job->length == 0 ? 1 : (uint32_t)((job->length + chunk - 1) / chunk);
	issue(job);
}

int engine_create(struct rdmaxd *daemon, engine_complete_cb complete, struct engine **ret_engine)
{
	struct engine *engine = calloc(1, sizeof(*engine));

	if (!engine) {
		return -ENOMEM;
	}
	engine->daemon = daemon;
	engine->complete = complete;
	list_init(&engine->jobs);
	*ret_engine = engine;
	return 0;
}

void engine_destroy(struct engine *engine)
{
	struct list_node *pos, *tmp;

	if (!engine) {
		return;
	}
	/* Jobs whose xfers never returned (transport destroyed first): drop them. */
	list_for_each_safe(pos, tmp, &engine->jobs)
	{
		struct job *job = container_of(pos, struct job, link);
		list_del(&job->link);
		free(job);
	}
	free(engine);
}

int job_owner_init(struct job_owner *owner)
{
	owner->outstanding = 0;
	owner->gone = false;
	return hmap_init(&owner->jobs, 64);
}

void job_owner_leave(struct engine *engine, struct job_owner *owner)
{
	struct job *job;
	size_t iter = 0;

	while (hmap_next(&owner->jobs, &iter, NULL, (void **)&job)) {
		/* The job runs on (its xfers hold the memory) but reports to nobody. */
		job->owner = NULL;
		if (!job->completed) {
			complete_job(job, RDMAX_E_CANCELLED, "client left");
		}
		job_free_if_done(job);
	}
	owner->gone = true;
	owner->outstanding = 0;
	hmap_fini(&owner->jobs);
}

static struct job *find_job(struct job_owner *owner, uint64_t job_id)
{
	if (job_id >= UINT64_MAX - 1) {
		return NULL;
	}
	return hmap_get(&owner->jobs, job_id + 1);
}

int engine_cancel(struct engine *engine, struct job_owner *owner, uint64_t job_id)
{
	struct job *job = find_job(owner, job_id);

	if (!job) {
		return RDMAX_E_NOT_FOUND;
	}
	complete_job(job, RDMAX_E_CANCELLED, "cancelled by the client after %" PRIu64 " bytes",
		     job->bytes_done);
	job_free_if_done(job);
	return 0;
}

int engine_job_progress(struct engine *engine, struct job_owner *owner, uint64_t job_id,
			uint64_t *ret_done, uint64_t *ret_total)
{
	struct job *job = find_job(owner, job_id);
	uint64_t done;

	if (!job) {
		return RDMAX_E_NOT_FOUND;
	}
	done = job->bytes_done;
	for (size_t i = 0; i < JOB_WINDOW; i++) {
		if (job->window[i].busy) {
			done += job->window[i].xfer.bytes_done;
		}
	}
	*ret_done = done;
	*ret_total = job->length;
	return 0;
}

void engine_cancel_all(struct engine *engine)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &engine->jobs)
	{
		struct job *job = container_of(pos, struct job, link);
		complete_job(job, RDMAX_E_CANCELLED, "daemon is shutting down");
		job_free_if_done(job);
	}
}

uint64_t engine_outstanding(const struct engine *engine)
{
	return engine->outstanding;
}
