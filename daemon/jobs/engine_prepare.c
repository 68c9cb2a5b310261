/* SPDX-License-Identifier: MIT */
/*
 * Validating and planning a job of one node: WRITE, READ, PAGED_WRITE,
 * PAGED_READ and SEND, and the dispatch of every kind (SCATTER and BARRIER go
 * to engine_fanout.c). Checks the client's own region, decodes the remote
 * descriptor (through the parse cache kept here) and picks the transport.
 * Every refusal names its reason in `why`. Never issues or completes a job.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "discovery.h"
#include "engine.h"
#include "engine_internal.h"
#include "mailbox.h"
#include "planner.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"

/* Like transport_resolve_peer(), with the reason in why; SEND needs send_message. */
int job_resolve(struct job *job, const struct remote_desc *desc, struct transport **ret_transport,
		struct endpoint *ret_peer, char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	const char *lacking = NULL;
	struct endpoint peer;
	struct transport *transport;

	if (desc->instance_id == daemon->instance_id) {
		memset(ret_peer, 0, sizeof(*ret_peer));
		*ret_transport = NULL;
		return 0;
	}
	if (discovery_instance_lost(daemon->discovery, desc->instance_id)) {
		snprintf(why, why_size,
			 "node '%.63s' was lost (instance %016" PRIx64
			 "): refused until it returns",
			 desc->node_name, desc->instance_id);
		return RDMAX_E_UNREACHABLE;
	}
	transport = transport_pick(daemon, desc, job->kind == JOB_SEND, &peer, &lacking);
	if (!transport && lacking) {
		snprintf(
			why, why_size,
			"the '%s' transport cannot carry SEND messages yet, and the descriptor has "
			"no other endpoint this daemon can use",
			lacking);
		return RDMAX_E_UNIMPLEMENTED;
	}
	if (!transport) {
		snprintf(why, why_size,
			 "no endpoint of the descriptor uses a transport of this daemon");
		return RDMAX_E_UNREACHABLE;
	}
	*ret_transport = transport;
	*ret_peer = peer;
	return 0;
}

/* The client's own region, range checked and referenced for the job's life. */
int job_take_local(struct job *job, uint64_t id, uint64_t offset, uint64_t length, bool into,
		   char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	struct region *region = region_find_owned(&daemon->regions, job->owner, id);

	if (!region) {
		snprintf(why, why_size, "local region %" PRIu64 " is not registered by this client",
			 id);
		return RDMAX_E_NOT_FOUND;
	}
	if (region_check_range(region, offset, length) < 0) {
		snprintf(why, why_size,
			 "local range [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64
			 " of %" PRIu64 " bytes",
			 offset, length, id, region->length);
		return RDMAX_E_OUT_OF_RANGE;
	}
	if (into && !region->writable) {
		snprintf(why, why_size, "local region %" PRIu64 " is mapped read-only", id);
		return RDMAX_E_PERMISSION_DENIED;
	}
	region_get(region);
	job->local = region;
	return 0;
}

/* The only node of a job: one transport, xfers counted for the imm rule. */
static void single_node(struct job *job, struct transport *transport, const struct endpoint *peer,
			uint64_t instance, uint64_t region_id, uint64_t region_key)
{
	job->node1 = (struct job_node){.transport = transport,
				       .peer = *peer,
				       .instance = instance,
				       .has_imm = job->has_imm};
	job->dest1 = (struct job_dest){.node = 0, .region_id = region_id, .region_key = region_key};
	job->nodes = &job->node1;
	job->n_nodes = 1;
	job->dests = &job->dest1;
	job->n_dests = 1;
	job->transport = transport;
	job->peer = *peer;
	job->length = 0;
	for (size_t i = 0; i < job->n_runs; i++) {
		job->node1.xfers_left +=
			planner_run_xfers(job->runs[i].length, job_chunk_bytes(job, &job->node1));
		job->length += job->runs[i].length;
	}
}

/*
 * Eight bytes per step (a byte loop was a fifth of a ring job's engine work),
 * then a final mix so that every byte reaches the low bits that pick the set.
 * Only a cache key: a hit still compares the bytes.
 */
static uint64_t desc_hash(const uint8_t *buf, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull ^ len, w;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		memcpy(&w, buf + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	for (; i < len; i++) {
		h = (h ^ buf[i]) * 0x100000001b3ull;
	}
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

int engine_desc_decode(struct engine *engine, const uint8_t *buf, size_t len,
		       struct remote_desc *ret_desc)
{
	if (!buf || len == 0 || len > DESC_CACHE_KEY_MAX) {
		return desc_decode(buf, len, ret_desc);
	}
	struct desc_cache_entry *last = engine->desc_last;

	/* A client sends the same descriptor job after job: no hash for a repeat. */
	engine->desc_clock++;
	if (last && last->used && last->len == len && memcmp(last->bytes, buf, len) == 0) {
		last->used = engine->desc_clock;
		engine->desc_hits++;
		desc_copy(ret_desc, &last->desc);
		return 0;
	}
	uint64_t hash = desc_hash(buf, len);
	struct desc_cache_entry *set =
		&engine->desc_cache[(hash % DESC_CACHE_SETS) * DESC_CACHE_WAYS];
	struct desc_cache_entry *victim = &set[0];

	for (size_t i = 0; i < DESC_CACHE_WAYS; i++) {
		struct desc_cache_entry *e = &set[i];

		if (e->used && e->hash == hash && e->len == len &&
		    memcmp(e->bytes, buf, len) == 0) {
			e->used = engine->desc_clock;
			engine->desc_hits++;
			engine->desc_last = e;
			desc_copy(ret_desc, &e->desc);
			return 0;
		}
		if (e->used < victim->used) {
			victim = e;
		}
	}
	engine->desc_misses++;
	struct remote_desc desc;
	int ret = desc_decode(buf, len, &desc);
	if (ret < 0) {
		return ret; /* malformed bytes are not kept */
	}
	desc_copy(&victim->desc, &desc);
	victim->hash = hash;
	victim->used = engine->desc_clock;
	victim->len = (uint32_t)len;
	memcpy(victim->bytes, buf, len);
	engine->desc_last = victim;
	desc_copy(ret_desc, &desc);
	return 0;
}

void engine_desc_cache_stats(const struct engine *engine, uint64_t *ret_hits, uint64_t *ret_misses,
			     uint32_t *ret_entries)
{
	uint32_t n = 0;

	for (size_t i = 0; i < DESC_CACHE_SETS * DESC_CACHE_WAYS; i++) {
		n += engine->desc_cache[i].used != 0;
	}
	*ret_hits = engine->desc_hits;
	*ret_misses = engine->desc_misses;
	*ret_entries = n;
}

/* The job's remote descriptor (job->remote), decoded through the parse cache. */
static int decode_remote(struct job *job, ProtobufCBinaryData bytes, char *why, size_t why_size)
{
	int ret = engine_desc_decode(job->engine, bytes.data, bytes.len, &job->remote);

	if (ret < 0) {
		snprintf(why, why_size, "remote descriptor is malformed");
	} else if (job->remote.mailbox[0] && job->kind != JOB_SEND) {
		snprintf(why, why_size, "a mailbox address is not a region descriptor");
		ret = RDMAX_E_INVALID_ARGUMENT;
	}
	return ret;
}

/* The only node of a WRITE, READ or PAGED job, at job->remote, with its rails. */
static int remote_node(struct job *job, struct transport *transport, const struct endpoint *peer,
		       char *why, size_t why_size)
{
	int ret;

	single_node(job, transport, peer, job->remote.instance_id, job->remote.region_id,
		    job->remote.region_key);
	ret = rail_set(job, &job->node1, job->remote.endpoints, job->remote.n_endpoints, false,
		       job->remote.node_name, why, why_size);
	job->peer = job->node1.peer;
	return ret;
}

/* WRITE and READ: one range on each side. */
static int prepare_single(struct job *job, uint64_t local_region, ProtobufCBinaryData desc_bytes,
			  char *why, size_t why_size)
{
	struct transport *transport;
	struct endpoint peer;
	int ret;

	ret = job_take_local(job, local_region, job->local_offset, job->length,
			     job->op == XFER_READ, why, why_size);
	if (ret < 0) {
		return ret;
	}
	ret = decode_remote(job, desc_bytes, why, why_size);
	if (ret < 0) {
		return ret;
	}
	if (planner_check_range(job->remote_offset, job->length, job->remote.length) < 0) {
		snprintf(why, why_size,
			 "remote range [%" PRIu64 ", +%" PRIu64 ") outside region of %" PRIu64
			 " bytes",
			 job->remote_offset, job->length, job->remote.length);
		return RDMAX_E_OUT_OF_RANGE;
	}
	ret = job_resolve(job, &job->remote, &transport, &peer, why, why_size);
	if (ret < 0) {
		return ret;
	}
	job->run1 = (struct plan_run){.local_offset = job->local_offset,
				      .remote_offset = job->remote_offset,
				      .length = job->length};
	job->runs = &job->run1;
	job->n_runs = 1;
	return remote_node(job, transport, &peer, why, why_size);
}

static struct plan_pages page_list(const Rdmax__V1__PageList *list)
{
	return (struct plan_pages){.offset = list->offset,
				   .stride = list->stride,
				   .indices = list->indices,
				   .count = list->n_indices};
}

/* The page lists and descriptor of a PAGED_WRITE or PAGED_READ, side by side. */
struct paged_req {
	uint64_t local_region;
	uint64_t page_len;
	const Rdmax__V1__PageList *local_pages;
	const Rdmax__V1__PageList *remote_pages;
	ProtobufCBinaryData remote_desc;
	Rdmax__V1__PagedPair **pairs; /* pairs 1..n_pairs */
	size_t n_pairs;
};

/*
 * A destination region on a node whose endpoints are another region's (a
 * further pair of a paged job, a second region of one node in a SCATTER):
 * over verbs each region has its own iova and rkey on every device, so the
 * destination keeps a copy of its descriptor's endpoints, which must cover
 * the node's peer device and every rail. Other transports address regions
 * by id: *ret_eps stays NULL.
 */
int job_dest_own_endpoints(const struct job_node *node, const struct endpoint *endpoints,
			   uint32_t n_endpoints, const char *which, struct endpoint **ret_eps,
			   uint32_t *ret_n, char *why, size_t why_size)
{
	*ret_eps = NULL;
	*ret_n = 0;
	if (!node->transport || node->transport->kind != ENDPOINT_VERBS) {
		return 0;
	}
	struct job_dest probe = {.eps = (struct endpoint *)endpoints, .n_eps = n_endpoints};
	struct endpoint ep;
	for (int32_t i = -1; i < DESC_MAX_ENDPOINTS; i++) {
		const struct endpoint *via = i < 0 ? &node->peer : &node->rail_eps[i];
		if (i >= 0 && (node->n_rails < 2 || !(node->rails & (1u << i)))) {
			continue;
		}
		if (!job_dest_endpoint(&probe, via, &ep)) {
			snprintf(why, why_size,
				 "%s: its descriptor has no key for device '%s' at %s port %u, "
				 "which the node's first region uses",
				 which, via->device, via->addr, via->port);
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	*ret_eps = malloc((n_endpoints ? n_endpoints : 1) * sizeof(**ret_eps));
	if (!*ret_eps) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	memcpy(*ret_eps, endpoints, n_endpoints * sizeof(**ret_eps));
	*ret_n = n_endpoints;
	return 0;
}

/*
 * Pair k (1-based into pr->pairs) of a paged job: its local region taken,
 * its descriptor decoded, both checked to hold the plan's extent, its
 * descriptor naming pair 0's node.
 */
static int take_pair(struct job *job, const struct paged_req *pr, size_t k, uint64_t local_end,
		     uint64_t remote_end, struct job_dest *ret_dest, char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	const Rdmax__V1__PagedPair *pp = pr->pairs[k - 1];
	bool read = job->op == XFER_READ;
	struct remote_desc desc;
	struct region *region;

	region = region_find_owned(&daemon->regions, job->owner, pp->local_region);
	if (!region) {
		snprintf(why, why_size,
			 "pair %zu: local region %" PRIu64 " is not registered by this client", k,
			 pp->local_region);
		return RDMAX_E_NOT_FOUND;
	}
	if (read && !region->writable) {
		snprintf(why, why_size, "pair %zu: local region %" PRIu64 " is mapped read-only", k,
			 pp->local_region);
		return RDMAX_E_PERMISSION_DENIED;
	}
	if (region->length < local_end) {
		snprintf(why, why_size,
			 "pair %zu: the pages reach byte %" PRIu64 " but local region %" PRIu64
			 " has %" PRIu64 " bytes",
			 k, local_end, pp->local_region, region->length);
		return RDMAX_E_OUT_OF_RANGE;
	}
	if (engine_desc_decode(job->engine, pp->remote_desc.data, pp->remote_desc.len, &desc) < 0) {
		snprintf(why, why_size, "pair %zu: remote descriptor is malformed", k);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (desc.instance_id != job->remote.instance_id) {
		snprintf(why, why_size,
			 "pair %zu: its region is on node '%.63s' but pair 0's on '%.63s': every "
			 "pair of a paged job goes to one node",
			 k, desc.node_name, job->remote.node_name);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (desc.length < remote_end) {
		snprintf(why, why_size,
			 "pair %zu: the pages reach byte %" PRIu64 " but remote region %" PRIu64
			 " has %" PRIu64 " bytes",
			 k, remote_end, desc.region_id, desc.length);
		return RDMAX_E_OUT_OF_RANGE;
	}
	struct endpoint *eps = NULL;
	uint32_t n_eps = 0;
	char which[40];
	snprintf(which, sizeof(which), "pair %zu", k);
	int ret = job_dest_own_endpoints(&job->node1, desc.endpoints, desc.n_endpoints, which, &eps,
					 &n_eps, why, why_size);
	if (ret < 0) {
		return ret;
	}
	region_get(region);
	*ret_dest = (struct job_dest){.node = 0,
				      .region_id = desc.region_id,
				      .region_key = desc.region_key,
				      .local = region,
				      .eps = eps,
				      .n_eps = n_eps};
	return 0;
}

/* Pairs 1.. of a paged job whose plan (for pair 0) is in job->runs: dests and repeated runs. */
static int prepare_pairs(struct job *job, const struct paged_req *pr, char *why, size_t why_size)
{
	uint32_t n_pairs = (uint32_t)pr->n_pairs + 1;
	uint64_t local_end, remote_end;
	struct plan_run *runs;
	size_t n;
	int ret;

	planner_extent(job->runs, job->n_runs, &local_end, &remote_end);
	job->dests = calloc(n_pairs, sizeof(*job->dests));
	if (!job->dests) {
		job->dests = &job->dest1;
		snprintf(why, why_size, "out of memory for %u region pairs", n_pairs);
		return -ENOMEM;
	}
	job->dests[0] = job->dest1;
	job->n_dests = 1;
	for (size_t k = 1; k < n_pairs; k++) {
		ret = take_pair(job, pr, k, local_end, remote_end, &job->dests[k], why, why_size);
		if (ret < 0) {
			return ret;
		}
		job->n_dests++;
		/* The rule of one list (destination pages must not overlap) across pairs. */
		for (size_t j = 0; j < k; j++) {
			const struct job_dest *a = &job->dests[j], *b = &job->dests[k];
			bool same = job->op == XFER_READ
					    ? job_dest_local(job, a) == job_dest_local(job, b)
					    : a->region_id == b->region_id;
			if (same && job->n_runs > 0 && job->runs[0].length > 0) {
				snprintf(why, why_size,
					 "pair %zu: its destination region is pair %zu's: the "
					 "destination pages of one job must not overlap",
					 k, j);
				return RDMAX_E_INVALID_ARGUMENT;
			}
		}
	}
	if (job->n_runs == 0 || job->runs[0].length == 0) {
		return 0; /* no pages: nothing to repeat (an imm alone still goes once) */
	}
	ret = planner_pairs(job->runs, job->n_runs, n_pairs, &runs, &n);
	if (ret < 0) {
		snprintf(why, why_size, "%s while planning %u region pairs",
			 ret == -ENOMEM ? "out of memory" : "too many runs", n_pairs);
		return ret;
	}
	if (job->runs != &job->run1) {
		free(job->runs);
	}
	job->runs = runs;
	job->n_runs = n;
	/* The node's xfers and the job's length count every pair. */
	job->node1.xfers_left *= n_pairs;
	job->length *= n_pairs;
	return 0;
}

static int prepare_paged(struct job *job, const struct paged_req *pr, char *why, size_t why_size)
{
	struct rdmaxd *daemon = job->engine->daemon;
	bool read = job->op == XFER_READ;
	struct transport *transport;
	struct endpoint peer;
	struct plan_run *runs;
	size_t n;
	int ret;

	if (!pr->local_pages || !pr->remote_pages) {
		snprintf(why, why_size, "%s needs a src and a dst page list",
			 engine_job_kind_name(job->kind));
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (pr->n_pairs >= RDMAX_PAGED_PAIRS_MAX) {
		snprintf(why, why_size, "%zu region pairs exceed the limit of %u per paged job",
			 pr->n_pairs + 1, RDMAX_PAGED_PAIRS_MAX);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	ret = job_take_local(job, pr->local_region, 0, 0, read, why, why_size);
	if (ret < 0) {
		return ret;
	}
	ret = decode_remote(job, pr->remote_desc, why, why_size);
	if (ret < 0) {
		return ret;
	}
	struct plan_pages local = page_list(pr->local_pages), remote = page_list(pr->remote_pages);
	if (read) {
		ret = planner_paged_read(pr->page_len, &local, job->local->length, &remote,
					 job->remote.length, daemon->cfg.chunk_bytes, &runs, &n,
					 why, why_size);
	} else {
		ret = planner_paged(pr->page_len, &local, job->local->length, &remote,
				    job->remote.length, daemon->cfg.chunk_bytes, &runs, &n, why,
				    why_size);
	}
	if (ret < 0) {
		return ret;
	}
	if (n > 0) {
		job->runs = runs;
		job->n_runs = n;
	} else if (job->has_imm) {
		/* No pages: the imm alone still lands, as a zero-byte write. */
		job->run1 = (struct plan_run){0};
		job->runs = &job->run1;
		job->n_runs = 1;
	} else {
		job->runs = &job->run1;
		job->n_runs = 0;
	}
	ret = job_resolve(job, &job->remote, &transport, &peer, why, why_size);
	if (ret < 0) {
		return ret;
	}
	ret = remote_node(job, transport, &peer, why, why_size);
	if (ret < 0 || pr->n_pairs == 0) {
		return ret;
	}
	return prepare_pairs(job, pr, why, why_size);
}

static int prepare_send(struct job *job, const Rdmax__V1__SendJob *sj, char *why, size_t why_size)
{
	struct transport *transport;
	struct endpoint peer;
	int ret;

	if (sj->payload.len > MAILBOX_PAYLOAD_MAX) {
		snprintf(why, why_size, "payload of %zu bytes exceeds the limit of %u per message",
			 sj->payload.len, MAILBOX_PAYLOAD_MAX);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	ret = decode_remote(job, sj->remote_desc, why, why_size);
	if (ret < 0) {
		return ret;
	}
	/* Names alone reach nothing: the address carries the scoped name and the key. */
	const char *scoped = job->remote.mailbox;
	const char *colon = strchr(scoped, ':');
	if (!scoped[0] || !colon) {
		snprintf(why, why_size,
			 "a SEND needs the mailbox's address (rdmax_mailbox_open_addr()), not a "
			 "region descriptor");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (sj->mailbox && strcmp(sj->mailbox, colon + 1) != 0) {
		snprintf(why, why_size, "mailbox name '%.64s' is not the address's ('%s')",
			 sj->mailbox, colon + 1);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	ret = job_resolve(job, &job->remote, &transport, &peer, why, why_size);
	if (ret < 0) {
		return ret;
	}
	job->payload = malloc(sj->payload.len ? sj->payload.len : 1);
	if (!job->payload) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	if (sj->payload.len) {
		memcpy(job->payload, sj->payload.data, sj->payload.len);
	}
	copy_string(job->mailbox, sizeof(job->mailbox), scoped);
	job->run1 = (struct plan_run){.length = sj->payload.len};
	job->runs = &job->run1;
	job->n_runs = 1;
	single_node(job, transport, &peer, job->remote.instance_id, job->remote.region_id,
		    job->remote.region_key);
	/* One message, whatever its size. */
	job->node1.xfers_left = 1;
	return 0;
}

/* Fill the job from its protobuf; returns 0 or an error with the reason in `why`. */
int job_prepare(struct job *job, const Rdmax__V1__Job *pj, char *why, size_t why_size)
{
	job->op = XFER_WRITE;
	switch (pj->kind_case) {
	case RDMAX__V1__JOB__KIND_WRITE:
		job->kind = JOB_WRITE;
		job->local_offset = pj->write->local_offset;
		job->length = pj->write->length;
		job->remote_offset = pj->write->remote_offset;
		job->has_imm = pj->write->has_imm;
		job->imm = pj->write->imm;
		return prepare_single(job, pj->write->local_region, pj->write->remote_desc, why,
				      why_size);
	case RDMAX__V1__JOB__KIND_READ:
		job->kind = JOB_READ;
		job->op = XFER_READ;
		job->local_offset = pj->read->local_offset;
		job->length = pj->read->length;
		job->remote_offset = pj->read->remote_offset;
		return prepare_single(job, pj->read->local_region, pj->read->remote_desc, why,
				      why_size);
	case RDMAX__V1__JOB__KIND_PAGED_WRITE: {
		const Rdmax__V1__PagedWriteJob *pw = pj->paged_write;
		job->kind = JOB_PAGED_WRITE;
		job->has_imm = pw->has_imm;
		job->imm = pw->imm;
		struct paged_req pr = {.local_region = pw->local_region,
				       .page_len = pw->page_len,
				       .local_pages = pw->src,
				       .remote_pages = pw->dst,
				       .remote_desc = pw->remote_desc,
				       .pairs = pw->pairs,
				       .n_pairs = pw->n_pairs};
		return prepare_paged(job, &pr, why, why_size);
	}
	case RDMAX__V1__JOB__KIND_PAGED_READ: {
		const Rdmax__V1__PagedReadJob *prj = pj->paged_read;
		job->kind = JOB_PAGED_READ;
		job->op = XFER_READ;
		struct paged_req pr = {.local_region = prj->local_region,
				       .page_len = prj->page_len,
				       .local_pages = prj->dst,
				       .remote_pages = prj->src,
				       .remote_desc = prj->remote_desc,
				       .pairs = prj->pairs,
				       .n_pairs = prj->n_pairs};
		return prepare_paged(job, &pr, why, why_size);
	}
	case RDMAX__V1__JOB__KIND_SCATTER:
		job->kind = JOB_SCATTER;
		return job_prepare_scatter(job, pj->scatter, why, why_size);
	case RDMAX__V1__JOB__KIND_BARRIER:
		job->kind = JOB_BARRIER;
		return job_prepare_barrier(job, pj->barrier, why, why_size);
	case RDMAX__V1__JOB__KIND_SEND:
		job->kind = JOB_SEND;
		return prepare_send(job, pj->send, why, why_size);
	default:
		snprintf(why, why_size, "job has no kind");
		return RDMAX_E_INVALID_ARGUMENT;
	}
}
