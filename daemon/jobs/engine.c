/* SPDX-License-Identifier: MIT */
/*
 * The engine: client jobs in, transfers (xfers) out, one completion back.
 *
 * A job is validated against the client's own regions and the peers'
 * descriptors and planned as runs (engine_prepare.c, engine_fanout.c,
 * planner.c) towards one or more nodes (daemons); runs are cut into chunks of
 * at most cfg.chunk_bytes and issued to the transports through a small window
 * of xfers (engine_pump.c), striped over device pairs where a node has
 * several (engine_rails.c), in the order the traffic-class scheduler grants
 * ([qos], engine_pump.c, qos.c). This file owns a job's life: submission and its
 * refusals, deadlines, cancel, progress, and the completion. The job holds
 * its local region until its last xfer returned, even when it completed
 * early (error, deadline, cancel), so memory never goes away under a
 * transfer.
 *
 * Exactly one completion per job: every path goes through job_complete(),
 * which records the job as completed and ignores later attempts.
 * Never does socket I/O: completions leave through the complete callback.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "counters.h"
#include "engine.h"
#include "engine_internal.h"
#include "mailbox.h"
#include "peer_group.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ENGINE_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(ENGINE_ASAN)
#include <sanitizer/asan_interface.h>
/* A pooled job is poisoned: a use after its completion still faults under ASan. */
#define POOL_POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POOL_POISON(p, n)   ((void)(p), (void)(n))
#define POOL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/*
 * Planned runs (32 bytes each) one client's jobs may hold at once: bounds the
 * memory a client can pin with paged writes and scatters.
 */
#define RUNS_PER_CLIENT_MAX (4u << 20)

_Static_assert(MAILBOX_ADDR_NAME_MAX == TRANSPORT_MAILBOX_NAME_MAX, "mailbox name bounds differ");
_Static_assert(MAILBOX_ADDR_NAME_MAX == DESC_MAILBOX_MAX, "mailbox address bounds differ");
_Static_assert(MAILBOX_PAYLOAD_MAX == TRANSPORT_MESSAGE_PAYLOAD_MAX, "message bounds differ");

static const char *const g_kind_names[JOB_KIND_MAX] = {
	[JOB_WRITE] = "write",
	[JOB_READ] = "read",
	[JOB_PAGED_WRITE] = "paged_write",
	[JOB_PAGED_READ] = "paged_read",
	[JOB_SCATTER] = "scatter",
	[JOB_BARRIER] = "barrier",
	[JOB_SEND] = "send",
};

const char *engine_job_kind_name(int kind)
{
	return kind >= 0 && kind < JOB_KIND_MAX ? g_kind_names[kind] : "unknown";
}

static void deadline_closed(uv_handle_t *handle)
{
	free(handle);
}

/* The job's own allocations and the job; references are the caller's to drop. */
static void job_free_memory(struct job *job)
{
	for (uint32_t i = 0; i < job->n_nodes; i++) {
		if (job->nodes[i].rail_eps_owned) {
			free((void *)job->nodes[i].rail_eps);
		}
	}
	if (job->nodes != &job->node1) {
		free(job->nodes);
	}
	if (job->dests != &job->dest1) {
		for (uint32_t i = 0; i < job->n_dests; i++) {
			free(job->dests[i].eps);
		}
		free(job->dests);
	}
	if (job->runs != &job->run1) {
		free(job->runs);
	}
	if (job->slots != job->window) {
		free(job->slots);
	}
	peer_group_put(job->group);
	free(job->final_message);
	free(job->payload);
	list_del(&job->link);
	struct engine *engine = job->engine;
	if (engine->n_job_pool < ENGINE_JOB_POOL_MAX) {
		POOL_POISON(job, sizeof(*job));
		engine->job_pool[engine->n_job_pool++] = job;
	} else {
		free(job);
	}
}

/* A job's memory, from the pool when it holds one; the caller initialises it. */
static struct job *job_alloc(struct engine *engine)
{
	if (engine->n_job_pool > 0) {
		struct job *job = engine->job_pool[--engine->n_job_pool];
		engine->job_pool_reused++;
		POOL_UNPOISON(job, sizeof(*job));
		return job;
	}
	return malloc(sizeof(struct job));
}

void engine_job_pool_stats(const struct engine *engine, uint32_t *ret_idle, uint64_t *ret_reused)
{
	*ret_idle = engine->n_job_pool;
	*ret_reused = engine->job_pool_reused;
}

void job_free_if_done(struct job *job)
{
	if (!job->completed || job->in_flight > 0 || job->issuing) {
		return;
	}
	if (job->local) {
		region_put(&job->engine->daemon->regions, job->local);
	}
	for (uint32_t i = 0; job->dests && i < job->n_dests; i++) {
		if (job->dests[i].local) {
			region_put(&job->engine->daemon->regions, job->dests[i].local);
		}
	}
	job_free_memory(job);
}

/*
 * The job completed: none of its bytes may move any more. Xfers the
 * transport can still stop are detached (they count as returned); the
 * others return as usual and are ignored. Held and un-issued chunks are
 * never issued (job_pump stops at a completed job).
 */
static void withdraw_xfers(struct job *job)
{
	for (uint32_t i = 0; i < job->n_slots && job->in_flight > 0; i++) {
		struct job_xfer *slot = &job->slots[i];
		if (!slot->busy) {
			continue; /* a free slot's other fields are not set */
		}
		struct job_node *node = &job->nodes[slot->node];
		struct transport *t = node->transport;
		int ret = t && t->ops->withdraw ? t->ops->withdraw(t, &slot->xfer) : -EBUSY;
		if (ret == -EINPROGRESS) {
			slot->finishing = true;
			job->finishing++;
			continue;
		}
		if (ret < 0) {
			continue;
		}
		slot->busy = false;
		job_qos_release(job);
		job->in_flight--;
		job->in_flight_bytes -= slot->xfer.length;
		node->in_flight--;
	}
}

/* What a job in the client's table counts against the client and its uid, released. */
static void owner_uncount(struct job_owner *owner, const struct job *job)
{
	owner->outstanding--;
	if (owner->uid_outstanding) {
		(*owner->uid_outstanding)--;
	}
	owner->runs -= job->runs_counted;
}

/*
 * Refuses a job that is not in its client's table (job_complete() must not
 * look for it there): its one completion goes out directly, with no bytes.
 * With `counted`, what was counted for it (engine, client, uid) is undone.
 */
static void refuse_unlisted(struct job *job, struct job_owner *owner, bool counted, int err,
			    const char *message)
{
	if (counted) {
		job->owner = NULL;
		job->engine->outstanding--;
		owner_uncount(owner, job);
	}
	job->completed = true;
	job->engine->complete(owner, job->id, err, message, 0);
	job_free_if_done(job);
}

void job_post_timed(struct job *job, uint64_t post_ns, uint64_t post_end_ns)
{
	if (!job->first_post_ns || post_ns < job->first_post_ns) {
		job->first_post_ns = post_ns;
		job->first_post_end_ns = post_end_ns;
	}
	job->last_post_end_ns = MAX(job->last_post_end_ns, post_end_ns);
}

/* A job whose posts were timed, by stage ([metrics] job_stages); now: its completion. */
static void record_stages(struct job *job, uint64_t now)
{
	uint64_t stage_ns[COUNTERS_STAGE_MAX] = {
		[COUNTERS_STAGE_QUEUE] = job->first_post_ns > job->started_ns
						 ? job->first_post_ns - job->started_ns
						 : 0,
		[COUNTERS_STAGE_POST] = job->first_post_end_ns - job->first_post_ns,
		[COUNTERS_STAGE_COMPLETE] =
			now > job->last_post_end_ns ? now - job->last_post_end_ns : 0,
	};

	counters_job_stages(&job->engine->daemon->counters, stage_ns);
}

/*
 * The job's one completion, to its client if it is still there, and then
 * its counters: the client does not wait for the daemon's bookkeeping (the
 * counters are read on a later pass of the loop, after this one).
 */
static void deliver(struct job *job, int err, const char *message)
{
	struct engine *engine = job->engine;
	uint64_t now = now_ns();
	uint64_t latency_ns = now - job->started_ns;
	uint64_t bytes = err ? job->bytes_done : job->length;

	if (job->owner) {
		struct job_owner *owner = job->owner;
		hmap_del(&owner->jobs, job->id + 1);
		owner_uncount(owner, job);
		job->owner = NULL;
		engine->complete(owner, job->id, err, err ? message : NULL, bytes);
	}
	counters_job_done(&engine->daemon->counters, job->kind, err, bytes, latency_ns,
			  job->transport ? job->peer.addr : NULL, job->peer.port, job->has_imm);
	counters_class_done(&engine->daemon->counters, job->cls, err, bytes, latency_ns);
	if (err == 0 && job->first_post_ns && engine->daemon->cfg.metrics_job_stages) {
		record_stages(job, now);
	}
}

/* The completion job_complete() decided and held for frames on the wire; once. */
static void deliver_deferred(struct job *job)
{
	if (job->delivered) {
		return;
	}
	job->delivered = true;
	deliver(job, job->final_err, job->final_message ? job->final_message : "");
	free(job->final_message);
	job->final_message = NULL;
}

void job_finish_withdrawn(struct job_xfer *slot)
{
	struct job *job = slot->job;
	struct job_node *node = &job->nodes[slot->node];

	slot->finishing = false;
	slot->busy = false;
	job_qos_release(job);
	job->in_flight--;
	job->in_flight_bytes -= slot->xfer.length;
	node->in_flight--;
	if (--job->finishing == 0) {
		deliver_deferred(job);
	}
	job_free_if_done(job);
}

void job_complete(struct job *job, int err, const char *fmt, ...)
{
	char message[RDMAX_MESSAGE_MAX] = "";
	struct engine *engine = job->engine;

	if (job->completed) {
		return;
	}
	job->completed = true;
	qos_unwait(&engine->qos, &job->qos);
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
	withdraw_xfers(job);
	if (job->finishing > 0) {
		/* Delivered by job_finish_withdrawn() once the frames on the wire are out. */
		job->final_err = err;
		job->final_message = strdup(message);
		return;
	}
	deliver(job, err, message);
}

static void deadline_fired(uv_timer_t *timer)
{
	struct job *job = timer->data;

	struct engine *engine = job->engine;

	job_complete(job, RDMAX_E_TIMEOUT,
		     "deadline of job %" PRIu64 " passed after %" PRIu64 " of %" PRIu64 " bytes",
		     job->id, job->bytes_done, job->length);
	job_free_if_done(job);
	engine_qos_dispatch(engine);
}

/*
 * A job in its client's table: within the limits, accepted while the daemon
 * is not draining, prepared, and its plan charged to the client. 0, or the
 * refusal with its reason in `why`.
 */
static int admit(struct job *job, const Rdmax__V1__Job *pj, char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	struct job_owner *owner = job->owner;
	int ret;

	if (owner->outstanding > daemon->cfg.max_outstanding_jobs) {
		snprintf(why, why_size, "more than %u jobs outstanding",
			 daemon->cfg.max_outstanding_jobs);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	if (owner->uid_outstanding &&
	    *owner->uid_outstanding > daemon->cfg.per_uid_outstanding_jobs) {
		snprintf(why, why_size,
			 "the clients of this uid have more than %u jobs outstanding "
			 "([limits] per_uid_outstanding_jobs)",
			 daemon->cfg.per_uid_outstanding_jobs);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	if (daemon->draining) {
		snprintf(why, why_size,
			 "the daemon is draining (rdmaxctl drain) and accepts no new jobs");
		return RDMAX_E_CANCELLED;
	}
	enum qos_class dflt = (enum qos_class)daemon->cfg.qos_default_class, cls;
	if (qos_class_from_wire(owner->traffic_class, dflt, &dflt) < 0 ||
	    qos_class_from_wire(pj->has_traffic_class ? pj->traffic_class : 0, dflt, &cls) < 0) {
		snprintf(why, why_size, "unknown traffic class %u (1: latency, 2: bulk)",
			 pj->traffic_class);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	job->cls = (uint8_t)cls;
	job->urgent = cls == QOS_LATENCY && daemon->cfg.qos_enabled;
	job->qos_flow = &owner->flows[cls];
	ret = job_prepare(job, pj, why, why_size);
	if (ret < 0) {
		return ret;
	}
	if (job->runs != &job->run1) {
		/* Plans of paged writes and scatters cost memory: bounded per client. */
		if (owner->runs + job->n_runs > RUNS_PER_CLIENT_MAX) {
			snprintf(why, why_size,
				 "the client's jobs would hold more than %u planned runs",
				 RUNS_PER_CLIENT_MAX);
			return RDMAX_E_RESOURCE_EXHAUSTED;
		}
		owner->runs += job->n_runs;
		job->runs_counted = job->n_runs;
	}
	return 0;
}

int engine_submit(struct engine *engine, struct job_owner *owner, const Rdmax__V1__Job *pj)
{
	struct rdmaxd *daemon = engine->daemon;
	char why[RDMAX_MESSAGE_MAX];
	struct job *job;
	int ret;

	if (pj->job_id < UINT64_MAX - 1 && hmap_get(&owner->jobs, pj->job_id + 1)) {
		/* Refused without a completion: the id's one completion is the running job's. */
		return RDMAX_E_INVALID_ARGUMENT;
	}
	job = job_alloc(engine);
	if (!job) {
		engine->complete(owner, pj->job_id, -ENOMEM, "out of memory", 0);
		return 0;
	}
	memset(job, 0, offsetof(struct job, remote));
	for (size_t i = 0; i < JOB_WINDOW; i++) {
		job->window[i].busy = false;
	}
	job->engine = engine;
	job->id = pj->job_id;
	job->started_ns = now_ns();
	job->cls = (uint8_t)daemon->cfg.qos_default_class; /* until admit() knows better */
	list_add_tail(&engine->jobs, &job->link);

	if (pj->job_id >= UINT64_MAX - 1) {
		/* Such an id cannot key the in-flight table; refuse without registering it. */
		refuse_unlisted(job, owner, false, RDMAX_E_INVALID_ARGUMENT,
				"job id must be below 2^64-2");
		return 0;
	}
	engine->outstanding++;
	owner->outstanding++;
	if (owner->uid_outstanding) {
		(*owner->uid_outstanding)++;
	}
	job->owner = owner;
	if (hmap_put(&owner->jobs, pj->job_id + 1, job) < 0) {
		refuse_unlisted(job, owner, true, -ENOMEM, "out of memory");
		return 0;
	}
	ret = admit(job, pj, why, sizeof(why));
	if (ret < 0) {
		job_complete(job, ret, "%s", why);
		job_free_if_done(job);
		return 0;
	}
	job->slots = job->window;
	job->n_slots = JOB_WINDOW;
	if (job->n_runs > JOB_WINDOW && job->transport) {
		/* Many small runs: more of them in flight, the byte budget unchanged. */
		struct job_xfer *slots = calloc(JOB_WINDOW_RUNS, sizeof(*slots));
		if (slots) {
			job->slots = slots;
			job->n_slots = JOB_WINDOW_RUNS;
		}
	}
	/* Jobs that stay on this daemon are done before job_pump() returns: no deadline. */
	if (job->transport && pj->has_deadline_ms && pj->deadline_ms > 0) {
		job->deadline = malloc(sizeof(*job->deadline));
		if (job->deadline) {
			uv_timer_init(daemon->loop, job->deadline);
			job->deadline->data = job;
			uv_timer_start(job->deadline, deadline_fired, pj->deadline_ms, 0);
		}
	}
	job_pump(job);
	engine_qos_dispatch(engine);
	return 0;
}

bool engine_job_in_flight(struct job_owner *owner, uint64_t job_id)
{
	return job_id < UINT64_MAX - 1 && hmap_get(&owner->jobs, job_id + 1) != NULL;
}

int engine_create(struct rdmaxd *daemon, engine_complete_cb complete, struct engine **ret_engine)
{
	struct engine *engine = calloc(1, sizeof(*engine));

	if (!engine) {
		return -ENOMEM;
	}
	engine->desc_cache = calloc(DESC_CACHE_SETS * DESC_CACHE_WAYS, sizeof(*engine->desc_cache));
	if (!engine->desc_cache) {
		goto out_free_engine;
	}
	engine->daemon = daemon;
	engine->complete = complete;
	list_init(&engine->jobs);
	qos_sched_init(&engine->qos);
	*ret_engine = engine;
	return 0;
out_free_engine:
	free(engine);
	return -ENOMEM;
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
		job_free_memory(container_of(pos, struct job, link));
	}
	while (engine->n_job_pool > 0) {
		struct job *job = engine->job_pool[--engine->n_job_pool];
		POOL_UNPOISON(job, sizeof(*job));
		free(job);
	}
	free(engine->desc_cache);
	free(engine);
}

int job_owner_init(struct job_owner *owner)
{
	int ret;

	owner->outstanding = 0;
	owner->uid_outstanding = NULL;
	owner->gone = false;
	owner->runs = 0;
	owner->pinned_devices[0] = '\0';
	owner->traffic_class = 0;
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		qos_flow_init(&owner->flows[c], (enum qos_class)c);
	}
	ret = peer_group_table_init(&owner->groups);
	if (ret < 0) {
		return ret;
	}
	ret = hmap_init(&owner->jobs, 64);
	if (ret < 0) {
		peer_group_table_fini(&owner->groups);
	}
	return ret;
}

void job_owner_leave(struct engine *engine, struct job_owner *owner)
{
	struct job *job;
	size_t iter = 0;

	while (hmap_next(&owner->jobs, &iter, NULL, (void **)&job)) {
		/*
		 * The job runs on (its xfers hold the memory) but reports to nobody; what it
		 * counted against the client and its uid is released now, not at a delivery
		 * that will skip the client.
		 */
		owner_uncount(owner, job);
		job->owner = NULL;
		if (!job->completed) {
			job_complete(job, RDMAX_E_CANCELLED, "client left");
		}
		job_free_if_done(job);
	}
	owner->gone = true;
	owner->outstanding = 0;
	hmap_fini(&owner->jobs);
	/* Jobs still running keep their groups through their own references. */
	peer_group_table_fini(&owner->groups);
	engine_qos_dispatch(engine);
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
	job_complete(job, RDMAX_E_CANCELLED, "cancelled by the client after %" PRIu64 " bytes",
		     job->bytes_done);
	job_free_if_done(job);
	engine_qos_dispatch(engine);
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
	for (size_t i = 0; i < job->n_slots; i++) {
		if (job->slots[i].busy) {
			done += job->slots[i].xfer.bytes_done;
		}
	}
	*ret_done = done;
	*ret_total = job->length;
	return 0;
}

uint32_t engine_fail_instance(struct engine *engine, uint64_t instance, int err,
			      const char *message)
{
	struct list_node *pos, *tmp;
	uint32_t n = 0;

	list_for_each_safe(pos, tmp, &engine->jobs)
	{
		struct job *job = container_of(pos, struct job, link);
		for (uint32_t i = 0; i < job->n_nodes && !job->completed; i++) {
			if (job->nodes[i].transport && job->nodes[i].instance == instance) {
				job_complete(job, err, "%s", message);
				n++;
			}
		}
		job_free_if_done(job);
	}
	engine_qos_dispatch(engine);
	return n;
}

void engine_cancel_all(struct engine *engine)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &engine->jobs)
	{
		struct job *job = container_of(pos, struct job, link);
		job_complete(job, RDMAX_E_CANCELLED, "daemon is shutting down");
		if (job->finishing > 0) {
			/* Sessions close next: a completion held for a frame goes out now. */
			deliver_deferred(job);
		}
		job_free_if_done(job);
	}
}

uint64_t engine_outstanding(const struct engine *engine)
{
	return engine->outstanding;
}

void engine_for_each_job(const struct engine *engine, engine_job_cb cb, void *arg)
{
	struct list_node *pos, *tmp;
	uint64_t now = now_ns();

	list_for_each_safe(pos, tmp, (struct list_node *)&engine->jobs)
	{
		const struct job *job = container_of(pos, struct job, link);
		struct engine_job_info info = {
			.id = job->id,
			.owner = job->owner,
			.op = job->op,
			.kind = g_kind_names[job->kind],
			.completed = job->completed,
			.peer = job->transport ? &job->peer : NULL,
			.length = job->length,
			.bytes_done = job->bytes_done,
			.chunks_in_flight = job->in_flight,
			.age_ms = (now - job->started_ns) / 1000000u,
			.has_imm = job->has_imm,
			.imm = job->imm,
			.traffic_class = job->cls,
		};
		for (size_t i = 0; i < job->n_slots; i++) {
			if (job->slots[i].busy) {
				info.bytes_done += job->slots[i].xfer.bytes_done;
			}
		}
		cb(arg, &info);
	}
}
