/* SPDX-License-Identifier: MIT */
/*
 * Striping over device pairs (rails): which endpoints of a node's descriptor
 * a job's chunks may use, the round robin over them, the engine-wide memory
 * of pairs that failed recently, and the re-issue of a chunk whose pair
 * failed on another one. Never re-issues the chunk that carries an imm, and
 * never completes or frees a job: that is engine.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_internal.h"
#include "log.h"
#include "rdmax.h"
#include "transport.h"

/* ---- striping over device pairs (rails) */

static bool rail_failed(const struct engine *engine, const struct endpoint *ep, uint64_t now)
{
	for (size_t i = 0; i < RAIL_FAILS_MAX; i++) {
		const struct rail_fail *f = &engine->rail_fails[i];
		if (f->until_ms > now && f->port == ep->port && strcmp(f->addr, ep->addr) == 0) {
			return true;
		}
	}
	return false;
}

static void rail_mark_failed(struct engine *engine, const struct endpoint *ep, uint64_t now)
{
	struct rail_fail *slot = &engine->rail_fails[0];

	for (size_t i = 0; i < RAIL_FAILS_MAX; i++) {
		struct rail_fail *f = &engine->rail_fails[i];
		if (f->port == ep->port && strcmp(f->addr, ep->addr) == 0) {
			slot = f;
			break;
		}
		if (f->until_ms < slot->until_ms) {
			slot = f;
		}
	}
	copy_string(slot->addr, sizeof(slot->addr), ep->addr);
	slot->port = ep->port;
	slot->until_ms = now + engine->daemon->cfg.rail_retry_ms;
}

/* A rail takes chunks while it has not failed recently and its local device is up. */
static bool rail_usable(const struct job *job, const struct job_node *node,
			const struct endpoint *ep, uint64_t now)
{
	char device[sizeof(ep->device)];

	return !rail_failed(job->engine, ep, now) &&
	       node->transport->ops->route(node->transport, ep, device, sizeof(device)) == 0;
}

/*
 * The endpoint of the next chunk to node: round robin over its usable rails
 * (engine-wide, so that single-chunk jobs spread too), never `avoid`. With
 * no usable rail: NULL when avoiding one (a re-issue), else the next rail
 * anyway, so that the transport names the failure.
 */
const struct endpoint *rail_pick(struct job *job, const struct job_node *node,
				 const struct endpoint *avoid)
{
	uint8_t idx[DESC_MAX_ENDPOINTS];
	uint32_t n = 0;

	if (node->n_rails < 2) {
		return avoid ? NULL : &node->peer;
	}
	for (uint32_t i = 0; i < DESC_MAX_ENDPOINTS; i++) {
		if (node->rails & (1u << i)) {
			idx[n++] = (uint8_t)i;
		}
	}
	uint32_t start = job->engine->rail_next++;
	uint64_t now = now_ms();
	for (uint32_t k = 0; k < n; k++) {
		const struct endpoint *ep = &node->rail_eps[idx[(start + k) % n]];
		if (avoid && endpoint_same_peer(ep, avoid)) {
			continue;
		}
		if (rail_usable(job, node, ep, now)) {
			return ep;
		}
	}
	return avoid ? NULL : &node->rail_eps[idx[start % n]];
}

/*
 * Errors of a device pair or of the path between them, not of the job:
 * INTERNAL is how a local device error reaches the engine (a work completion
 * such as a local QP operation error, which a port going down produces), and
 * another device is the right place to try again.
 */
static bool rail_error(int err)
{
	return err == RDMAX_E_TRANSPORT_ERROR || err == RDMAX_E_UNREACHABLE ||
	       err == RDMAX_E_TIMEOUT || err == RDMAX_E_INTERNAL;
}

/*
 * A chunk whose rail failed goes again over another rail: a write or read of
 * the same bytes to the same place, so landing twice changes nothing. Not the
 * chunk that carries an imm: whether it landed cannot be known, and a second
 * landing would count twice. True when re-issued (the slot stays in flight).
 */
bool rail_reissue(struct job_xfer *slot, int err, const char *message)
{
	struct job *job = slot->job;
	struct job_node *node = &job->nodes[slot->node];
	struct xfer *xfer = &slot->xfer;
	struct engine *engine = job->engine;

	if (job->completed || node->n_rails < 2 || !rail_error(err) || xfer->has_imm ||
	    slot->tries + 1u >= node->n_rails) {
		return false;
	}
	struct endpoint failed = xfer->peer;
	rail_mark_failed(engine, &failed, now_ms());
	const struct endpoint *next = rail_pick(job, node, &failed);
	if (!next) {
		return false;
	}
	job_dest_endpoint(&job->dests[slot->dest], next, &xfer->peer);
	xfer->bytes_done = 0;
	if (node->transport->ops->submit(node->transport, xfer) < 0) {
		xfer->peer = failed;
		return false;
	}
	slot->tries++;
	engine->reissued++;
	log_ratelimited(&engine->rail_rl, LOG_NOTICE,
			"job %" PRIu64 ": %" PRIu64
			" bytes re-issued to %s port %u (peer device '%s') "
			"after the pair to %s port %u (peer device '%s') failed: %s",
			job->id, xfer->length, next->addr, next->port, next->device, failed.addr,
			failed.port, failed.device, message ? message : rdmax_strerror(err));
	return true;
}

uint64_t engine_reissued_chunks(const struct engine *engine)
{
	return engine->reissued;
}

/*
 * The rails of a node: the endpoints of its descriptor (eps, n_eps) that use
 * the node's transport and, for a pinned client, a device it may use. A node
 * with one rail keeps its peer and never stripes. With `copy`, eps is scratch
 * and the node keeps its own copy when it stripes.
 */
int rail_set(struct job *job, struct job_node *node, const struct endpoint *eps, uint32_t n_eps,
	     bool copy, const char *node_name, char *why, size_t why_size)
{
	const char *pin = job->owner->pinned_devices;
	uint32_t mask = 0, n = 0, candidates = 0;

	node->rails = 0;
	node->n_rails = 0;
	node->rail_eps = NULL;
	node->rail_eps_owned = false;
	if (!node->transport || !node->transport->ops->route || job->kind == JOB_SEND) {
		return 0;
	}
	n_eps = MIN(n_eps, (uint32_t)DESC_MAX_ENDPOINTS);
	for (uint32_t i = 0; i < n_eps; i++) {
		candidates += eps[i].transport == node->transport->kind;
	}
	if (candidates < 2 && !pin[0]) {
		return 0; /* the common case costs nothing */
	}
	for (uint32_t i = 0; i < n_eps; i++) {
		const struct endpoint *ep = &eps[i];
		char device[sizeof(ep->device)] = "";
		if (ep->transport != node->transport->kind) {
			continue;
		}
		(void)node->transport->ops->route(node->transport, ep, device, sizeof(device));
		if (pin[0] && !name_in_list(pin, device)) {
			continue;
		}
		if (n == 0) {
			node->peer = *ep;
		}
		mask |= 1u << i;
		n++;
	}
	if (n == 0) {
		snprintf(
			why, why_size,
			"this client is pinned to device%s '%.40s' ([verbs] pin), and none of them "
			"reaches node '%.32s'",
			strchr(pin, ',') ? "s" : "", pin, node_name);
		return RDMAX_E_UNREACHABLE;
	}
	if (n > 1) {
		if (copy) {
			struct endpoint *own = malloc(n_eps * sizeof(*own));
			if (!own) {
				snprintf(why, why_size, "out of memory");
				return -ENOMEM;
			}
			memcpy(own, eps, n_eps * sizeof(*own));
			eps = own;
			node->rail_eps_owned = true;
		}
		node->rail_eps = eps;
		node->rails = (uint8_t)mask;
		node->n_rails = (uint8_t)n;
	}
	return 0;
}
