/* SPDX-License-Identifier: MIT */
/*
 * Counters and histograms of the daemon, rendered as Prometheus text
 * (exposition format 0.0.4) or JSON for rdmaxctl, and optionally written to a
 * node_exporter textfile directory on a timer. Every recording function
 * accepts a NULL metrics (unit tests build daemons without one).
 */
#ifndef RDMAXD_METRICS_H
#define RDMAXD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rdmaxd;
struct metrics;
struct endpoint;
struct json;

/* Connection events a transport reports. */
enum metrics_conn_event {
	METRICS_CONN_ESTABLISHED, /* handshake done, data may flow */
	METRICS_CONN_FAILED,      /* a connection attempt failed */
	METRICS_CONN_CLOSED,      /* an established connection went away */
	METRICS_CONN_EVENT_MAX,   /* terminator */
};

int metrics_create(struct rdmaxd *daemon, struct metrics **ret_metrics);
/* Stops the textfile timer; call metrics_destroy once the loop closed it. */
void metrics_shutdown(struct metrics *metrics);
void metrics_destroy(struct metrics *metrics);

/*
 * A job completed (exactly once per job). kind is an enum job_kind, err 0 or a
 * negative error, bytes what moved, latency from submission to completion;
 * peer is NULL for a job between two regions of this daemon.
 */
void metrics_job_done(struct metrics *metrics, int kind, int err, uint64_t bytes,
		      uint64_t latency_ns, const struct endpoint *peer, bool had_imm);
/* transport is the transport's name ("tcp", "verbs"). */
void metrics_conn_event(struct metrics *metrics, const char *transport,
			enum metrics_conn_event event);
/* An ExpectImm of a client reached its count. */
void metrics_imm_fired(struct metrics *metrics);

/* Rates since the previous call (for the service manager's STATUS line). */
void metrics_rates(struct metrics *metrics, double *ret_jobs_per_s, double *ret_bytes_per_s);

/* Jobs completed and bytes moved since start. */
void metrics_totals(const struct metrics *metrics, uint64_t *ret_jobs, uint64_t *ret_bytes);

/*
 * Prometheus text of every metric into a malloc'd, NUL-terminated buffer.
 * \return 0, or -ENOMEM
 */
int metrics_prometheus(struct metrics *metrics, char **ret_text, size_t *ret_len);

/* The same counters as a JSON object under key (admin 'stats'). */
void metrics_json(struct metrics *metrics, struct json *j, const char *key);

/*
 * Write <dir>/rdmaxd.prom every interval_s seconds (temp file + rename, so
 * node_exporter never reads half a file). dir "" turns it off.
 */
int metrics_textfile_start(struct metrics *metrics, const char *dir, uint32_t interval_s);
/* Write the textfile now (also done by the timer). */
int metrics_textfile_write(struct metrics *metrics);

#endif
