/* SPDX-License-Identifier: MIT */
/*
 * Counters: recording is a few additions on the loop thread, so the data path pays nearly
 * nothing. Rendering is ops/metrics.c's. Never allocates, never does I/O.
 */
#include "counters.h"

#include <stdio.h>
#include <string.h>

#include "rdmax.pb-c.h"
#include "status.h"

const double counters_latency_bounds[] = {
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
	0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,
};
const size_t counters_latency_buckets =
	sizeof(counters_latency_bounds) / sizeof(counters_latency_bounds[0]);

const double counters_size_bounds[] = {
	4096, 65536, 1048576, 16777216, 268435456, 4294967296.0,
};
const size_t counters_size_buckets = sizeof(counters_size_bounds) / sizeof(counters_size_bounds[0]);

const double counters_stage_bounds[] = {
	0.000001, 0.000002, 0.000005, 0.00001, 0.00002, 0.00005, 0.0001, 0.0002,
	0.0005,   0.001,    0.002,    0.005,   0.01,    0.1,     1,
};
const size_t counters_stage_buckets =
	sizeof(counters_stage_bounds) / sizeof(counters_stage_bounds[0]);
const char *const counters_stage_names[COUNTERS_STAGE_MAX] = {"queue", "post", "complete"};
_Static_assert(sizeof(counters_stage_bounds) / sizeof(counters_stage_bounds[0]) <
		       sizeof(((struct histogram *)0)->buckets) / sizeof(uint64_t),
	       "a stage histogram needs a bucket per bound and one for +Inf");

const char *const counters_transport_names[COUNTERS_TRANSPORTS] = {"tcp", "verbs", "other"};

const char *const counters_conn_event_names[COUNTERS_CONN_EVENT_MAX] = {
	[COUNTERS_CONN_ESTABLISHED] = "established",
	[COUNTERS_CONN_FAILED] = "failed",
	[COUNTERS_CONN_CLOSED] = "closed",
};

const char *const counters_tls_mode_names[COUNTERS_TLS_MODE_MAX] = {
	[COUNTERS_TLS_KTLS] = "ktls",
	[COUNTERS_TLS_KTLS_TX] = "ktls_tx",
	[COUNTERS_TLS_USER] = "user",
};

_Static_assert(RDMAX__V1__STATUS__GPU_ADDRESS_REUSED < COUNTERS_STATUSES,
	       "COUNTERS_STATUSES too small");

void counters_init(struct counters *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->other.name, sizeof(c->other.name), "other");
}

static void histogram_add(struct histogram *h, const double *bounds, size_t n_bounds, double v)
{
	size_t i = 0;

	while (i < n_bounds && v > bounds[i]) {
		i++;
	}
	h->buckets[i]++;
	h->count++;
	h->sum += v;
}

static struct peer_stats *peer_slot(struct counters *c, const char *addr, uint16_t port)
{
	for (uint32_t i = 0; i < c->n_peers; i++) {
		struct peer_stats *p = &c->peers[i];

		if (p->port == port && strcmp(p->addr, addr) == 0) {
			return p;
		}
	}
	if (c->n_peers == COUNTERS_PEERS) {
		return &c->other;
	}
	struct peer_stats *p = &c->peers[c->n_peers++];
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	p->port = port;
	/* An address is at most 45 characters, so name is never cut short. */
	if (strchr(addr, ':')) {
		snprintf(p->name, sizeof(p->name), "[%s]:%u", addr, port);
	} else {
		snprintf(p->name, sizeof(p->name), "%s:%u", addr, port);
	}
	return p;
}

void counters_job_done(struct counters *c, int kind, int err, uint64_t bytes, uint64_t latency_ns,
		       const char *peer_addr, uint16_t peer_port, bool had_imm)
{
	int status = status_from_err(err);

	if (kind < 0 || kind >= COUNTERS_KINDS) {
		kind = 0;
	}
	if (status < 0 || status >= COUNTERS_STATUSES) {
		status = RDMAX__V1__STATUS__INTERNAL;
	}
	c->jobs[kind][status]++;
	c->bytes[kind][status] += bytes;
	c->total_jobs++;
	c->total_bytes += bytes;
	histogram_add(&c->latency[kind], counters_latency_bounds, counters_latency_buckets,
		      (double)latency_ns / 1e9);
	if (err == 0) {
		histogram_add(&c->size[kind], counters_size_bounds, counters_size_buckets,
			      (double)bytes);
		if (had_imm) {
			c->imm_writes++;
		}
	}
	if (!peer_addr) {
		c->local_jobs++;
		return;
	}
	struct peer_stats *p = peer_slot(c, peer_addr, peer_port);
	if (err == 0) {
		p->jobs_ok[kind]++;
	} else {
		p->jobs_failed[kind]++;
	}
	p->bytes[kind] += bytes;
}

void counters_conn_event(struct counters *c, const char *transport, enum counters_conn_event event)
{
	size_t t = COUNTERS_TRANSPORTS - 1;

	if ((unsigned)event >= COUNTERS_CONN_EVENT_MAX) {
		return;
	}
	for (size_t k = 0; k + 1 < COUNTERS_TRANSPORTS; k++) {
		if (transport && strcmp(transport, counters_transport_names[k]) == 0) {
			t = k;
		}
	}
	c->conn_events[t][event]++;
}

void counters_imm_fired(struct counters *c)
{
	c->imm_fired++;
}

void counters_class_done(struct counters *c, int cls, int err, uint64_t bytes, uint64_t latency_ns)
{
	if (cls < 0 || cls >= COUNTERS_CLASSES) {
		return;
	}
	if (err == 0) {
		c->class_ok[cls]++;
	} else {
		c->class_failed[cls]++;
	}
	c->class_bytes[cls] += bytes;
	histogram_add(&c->class_latency[cls], counters_latency_bounds, counters_latency_buckets,
		      (double)latency_ns / 1e9);
}

void counters_job_stages(struct counters *c, const uint64_t stage_ns[COUNTERS_STAGE_MAX])
{
	for (size_t i = 0; i < COUNTERS_STAGE_MAX; i++) {
		histogram_add(&c->job_stage[i], counters_stage_bounds, counters_stage_buckets,
			      (double)stage_ns[i] / 1e9);
	}
}

double counters_quantile_of(const struct histogram *h, const double *bounds, size_t n_bounds,
			    double q)
{
	uint64_t seen = 0;

	if (h->count == 0) {
		return 0;
	}
	uint64_t rank = (uint64_t)(q * (double)h->count + 0.999999);
	rank = rank == 0 ? 1 : rank;
	for (size_t i = 0; i < n_bounds; i++) {
		seen += h->buckets[i];
		if (seen >= rank) {
			return bounds[i];
		}
	}
	return bounds[n_bounds - 1];
}

double counters_quantile(const struct histogram *h, double q)
{
	return counters_quantile_of(h, counters_latency_bounds, counters_latency_buckets, q);
}
