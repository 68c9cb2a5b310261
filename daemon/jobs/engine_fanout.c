/* SPDX-License-Identifier: MIT */
/*
 * Validating and planning the jobs of many nodes: SCATTER (one run per
 * destination, named by descriptor or peer group member) and BARRIER (one
 * zero-byte write with the imm to each distinct node). Maps each target to
 * its node, with its rails, once. Every refusal names its reason in `why`.
 * Never issues or completes a job.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_internal.h"
#include "hmap.h"
#include "peer_group.h"
#include "planner.h"
#include "rdmax.h"
#include "transport.h"

/*
 * Daemon instance -> node index while a job is prepared. hmap reserves the
 * keys 0 and UINT64_MAX, so those two instances get a slot of their own.
 */
struct node_map {
	struct hmap map;
	uint32_t special[2]; /* node + 1 of instance 0 and UINT64_MAX; 0: none yet */
};

/* A peer or a group member, as a job sees it. */
struct target {
	uint64_t instance;
	uint64_t region_id;
	uint64_t region_key;
	uint64_t length;
	struct transport *transport;
	struct endpoint peer;
	const struct endpoint *endpoints; /* of its descriptor, for the rails */
	uint32_t n_endpoints;
	bool endpoints_scratch; /* endpoints do not outlive the job's preparation */
	const char *node_name;
};

/* The node of a target's daemon, added (with its rails) on first sight; its index or an error. */
static int64_t node_for(struct job *job, struct node_map *m, const struct target *t, char *why,
			size_t why_size)
{
	uint64_t instance = t->instance;
	struct transport *transport = t->transport;
	const struct endpoint *peer = &t->peer;
	uint32_t *special = instance == 0            ? &m->special[0]
			    : instance == UINT64_MAX ? &m->special[1]
						     : NULL;
	uintptr_t v = special ? *special : (uintptr_t)hmap_get(&m->map, instance);

	if (v) {
		return (int64_t)v - 1;
	}
	uint32_t n = job->n_nodes;
	job->nodes[n] = (struct job_node){.transport = transport,
					  .peer = *peer,
					  .instance = instance,
					  .has_imm = job->has_imm};
	if (special) {
		*special = n + 1;
	} else if (hmap_put(&m->map, instance, (void *)(uintptr_t)(n + 1)) < 0) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	job->n_nodes++;
	int ret = rail_set(job, &job->nodes[n], t->endpoints, t->n_endpoints, t->endpoints_scratch,
			   t->node_name, why, why_size);
	if (ret < 0) {
		return ret;
	}
	if (transport && !job->transport) {
		/* Metrics and the admin socket show one peer per job: the first remote one. */
		job->transport = transport;
		job->peer = job->nodes[n].peer;
	}
	return n;
}

/* Room for n nodes, dests and runs. */
static int alloc_plan(struct job *job, size_t n, char *why, size_t why_size)
{
	job->nodes = calloc(n, sizeof(*job->nodes));
	job->dests = calloc(n, sizeof(*job->dests));
	job->runs = calloc(n, sizeof(*job->runs));
	if (!job->nodes || !job->dests || !job->runs) {
		snprintf(why, why_size, "out of memory for %zu destinations", n);
		return -ENOMEM;
	}
	return 0;
}

/* Descriptor bytes of entry i, resolved; the reason names the entry. */
static int target_from_desc(struct job *job, ProtobufCBinaryData bytes, size_t i,
			    struct target *ret_target, char *why, size_t why_size)
{
	struct remote_desc *desc = &job->remote; /* scratch: only WRITE/READ keep it */
	char reason[RDMAX_MESSAGE_MAX - 32];
	int ret;

	ret = engine_desc_decode(job->engine, bytes.data, bytes.len, desc);
	if (ret < 0) {
		snprintf(why, why_size, "destination %zu: descriptor is malformed", i);
		return ret;
	}
	ret = job_resolve(job, desc, &ret_target->transport, &ret_target->peer, reason,
			  sizeof(reason));
	if (ret < 0) {
		snprintf(why, why_size, "destination %zu: %s", i, reason);
		return ret;
	}
	ret_target->instance = desc->instance_id;
	ret_target->region_id = desc->region_id;
	ret_target->region_key = desc->region_key;
	ret_target->length = desc->length;
	ret_target->endpoints = desc->endpoints;
	ret_target->n_endpoints = desc->n_endpoints;
	ret_target->endpoints_scratch = true;
	ret_target->node_name = desc->node_name;
	return 0;
}

static void target_from_member(const struct peer_member *m, struct target *ret_target)
{
	*ret_target = (struct target){.instance = m->instance_id,
				      .region_id = m->region_id,
				      .region_key = m->region_key,
				      .length = m->length,
				      .transport = m->transport,
				      .peer = m->peer,
				      .endpoints = m->endpoints,
				      .n_endpoints = m->n_endpoints,
				      .node_name = ""};
}

/* The group a job names, referenced by the job. */
static int take_group(struct job *job, uint64_t handle, char *why, size_t why_size)
{
	struct peer_group *group = peer_group_find(&job->owner->groups, handle);

	if (!group) {
		snprintf(why, why_size, "peer group %" PRIu64 " does not exist", handle);
		return RDMAX_E_NOT_FOUND;
	}
	peer_group_get(group);
	job->group = group;
	return 0;
}

static void count_node_xfers(struct job *job)
{
	job->length = 0;
	for (size_t i = 0; i < job->n_runs; i++) {
		struct job_node *node = job_node_of_run(job, &job->runs[i]);
		node->xfers_left +=
			planner_run_xfers(job->runs[i].length, job_chunk_bytes(job, node));
		job->length += job->runs[i].length;
	}
}

int job_prepare_scatter(struct job *job, const Rdmax__V1__ScatterJob *sj, char *why,
			size_t why_size)
{
	size_t n = sj->n_dests;
	struct plan_dest *plan = NULL;
	struct node_map map = {0};
	int ret;

	job->has_imm = sj->has_imm;
	job->imm = sj->imm;
	ret = job_take_local(job, sj->local_region, 0, 0, false, why, why_size);
	if (ret < 0) {
		return ret;
	}
	if (n == 0) {
		snprintf(why, why_size, "scatter job has no destinations");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (sj->has_peer_group) {
		ret = take_group(job, sj->peer_group, why, why_size);
		if (ret < 0) {
			return ret;
		}
	}
	ret = alloc_plan(job, n, why, why_size);
	if (ret < 0) {
		return ret;
	}
	plan = calloc(n, sizeof(*plan));
	ret = hmap_init(&map.map, 16);
	if (!plan || ret < 0) {
		snprintf(why, why_size, "out of memory for %zu destinations", n);
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		const Rdmax__V1__ScatterDest *d = sj->dests[i];
		bool by_desc = d->has_remote_desc && d->remote_desc.len > 0;
		struct target t;
		if (by_desc == d->has_peer_index) {
			snprintf(why, why_size,
				 "destination %zu must name either a remote_desc or a peer_index",
				 i);
			ret = RDMAX_E_INVALID_ARGUMENT;
			goto out;
		}
		if (by_desc) {
			ret = target_from_desc(job, d->remote_desc, i, &t, why, why_size);
			if (ret < 0) {
				goto out;
			}
		} else if (!job->group) {
			snprintf(why, why_size,
				 "destination %zu names peer_index %" PRIu32
				 " but the job names no peer_group",
				 i, d->peer_index);
			ret = RDMAX_E_INVALID_ARGUMENT;
			goto out;
		} else if (d->peer_index >= job->group->n_members) {
			snprintf(why, why_size,
				 "destination %zu: peer_index %" PRIu32
				 " outside peer group %" PRIu64 " of %" PRIu32 " members",
				 i, d->peer_index, job->group->handle, job->group->n_members);
			ret = RDMAX_E_OUT_OF_RANGE;
			goto out;
		} else {
			target_from_member(&job->group->members[d->peer_index], &t);
		}
		uint32_t before = job->n_nodes;
		int64_t node = node_for(job, &map, &t, why, why_size);
		if (node < 0) {
			ret = (int)node;
			goto out;
		}
		job->dests[i] = (struct job_dest){.node = (uint32_t)node,
						  .region_id = t.region_id,
						  .region_key = t.region_key};
		job->n_dests = (uint32_t)(i + 1); /* so a refusal below frees what dests hold */
		if (job->n_nodes == before) {
			/* A node seen before: its endpoints carry another region's keys. */
			char which[40];
			snprintf(which, sizeof(which), "destination %zu", i);
			ret = job_dest_own_endpoints(&job->nodes[node], t.endpoints, t.n_endpoints,
						     which, &job->dests[i].eps,
						     &job->dests[i].n_eps, why, why_size);
			if (ret < 0) {
				goto out;
			}
		}
		plan[i] = (struct plan_dest){.local_offset = d->local_offset,
					     .remote_offset = d->remote_offset,
					     .length = d->length,
					     .remote_len = t.length,
					     .dest = (uint32_t)i};
	}
	job->n_dests = (uint32_t)n;
	ret = planner_scatter(plan, n, job->local->length, job->runs, why, why_size);
	if (ret < 0) {
		goto out;
	}
	job->n_runs = n;
	count_node_xfers(job);
out:
	hmap_fini(&map.map);
	free(plan);
	return ret;
}

/* One zero-byte write with the imm to each distinct node (first member or desc of it). */
int job_prepare_barrier(struct job *job, const Rdmax__V1__BarrierJob *bj, char *why,
			size_t why_size)
{
	struct node_map map = {0};
	size_t n;
	int ret;

	job->has_imm = true;
	job->imm = bj->imm;
	if (bj->has_peer_group && bj->n_remote_descs > 0) {
		snprintf(why, why_size, "barrier names both a peer_group and remote_descs");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (bj->has_peer_group) {
		ret = take_group(job, bj->peer_group, why, why_size);
		if (ret < 0) {
			return ret;
		}
	}
	n = job->group ? job->group->n_members : bj->n_remote_descs;
	if (n == 0) {
		snprintf(why, why_size, "barrier names no peers (no peer_group, no remote_descs)");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	ret = alloc_plan(job, n, why, why_size);
	if (ret == 0) {
		ret = hmap_init(&map.map, 16);
		if (ret < 0) {
			snprintf(why, why_size, "out of memory");
		}
	}
	for (size_t i = 0; i < n && ret == 0; i++) {
		struct target t;
		if (job->group) {
			target_from_member(&job->group->members[i], &t);
		} else {
			ret = target_from_desc(job, bj->remote_descs[i], i, &t, why, why_size);
			if (ret < 0) {
				break;
			}
		}
		uint32_t before = job->n_nodes;
		int64_t node = node_for(job, &map, &t, why, why_size);
		if (node < 0) {
			ret = (int)node;
		} else if (job->n_nodes > before) {
			uint32_t k = job->n_dests++;
			job->dests[k] = (struct job_dest){.node = (uint32_t)node,
							  .region_id = t.region_id,
							  .region_key = t.region_key};
			job->runs[k] = (struct plan_run){.dest = k};
		}
	}
	hmap_fini(&map.map);
	if (ret < 0) {
		return ret;
	}
	job->n_runs = job->n_dests;
	count_node_xfers(job);
	return 0;
}
