/* SPDX-License-Identifier: MIT */
/*
 * The daemon's counters (base/counters.h) and the modules' gauges, rendered as Prometheus text
 * (exposition format 0.0.4) or JSON for rdmaxctl, and optionally written to a
 * node_exporter textfile directory on a timer. The data path records into
 * daemon->counters and never calls this module.
 */
#ifndef RDMAXD_METRICS_H
#define RDMAXD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rdmaxd;
struct metrics;
struct json;

int metrics_create(struct rdmaxd *daemon, struct metrics **ret_metrics);
/* Stops the textfile timer; call metrics_destroy once the loop closed it. */
void metrics_shutdown(struct metrics *metrics);
void metrics_destroy(struct metrics *metrics);

/* Rates since the previous call (for the service manager's STATUS line). */
void metrics_rates(struct metrics *metrics, double *ret_jobs_per_s, double *ret_bytes_per_s);

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
