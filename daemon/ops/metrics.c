/* SPDX-License-Identifier: MIT */
/*
 * Metrics: counters and histograms of jobs (by op, status, peer), connection
 * events and imm counters, plus gauges read from the other modules when a
 * scrape renders them. Recording is a few additions on the loop thread, so
 * the data path pays nearly nothing; rendering allocates and may be slow.
 *
 * Owns the node_exporter textfile writer (temp file + rename). Never blocks
 * the loop on anything but a local file write, and never touches payload.
 */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "counters.h"
#include "discovery.h"
#include "engine.h"
#include "ipc.h"
#include "json.h"
#include "log.h"
#include "names.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "status.h"
#include "transport.h"

/* Room for every Status value; only the values the protocol defines are printed. */
#define STATUS_SLOTS COUNTERS_STATUSES
_Static_assert(JOB_KIND_MAX <= COUNTERS_KINDS, "COUNTERS_KINDS too small");
_Static_assert(ENDPOINT_TCP == 0 && ENDPOINT_VERBS == 1 && ENDPOINT_MAX + 1 == COUNTERS_TRANSPORTS,
	       "counters_transport_names follows enum endpoint_transport");

/* The i-th Status value the protocol defines (they need not be contiguous). */
static int status_value(unsigned i)
{
	return rdmax__v1__status__descriptor.values[i].value;
}

#define TEXTFILE_NAME "rdmaxd.prom"

/* The renderer: counters live in the daemon (daemon->counters), gauges in the modules. */
struct metrics {
	struct rdmaxd *daemon;
	/* metrics_rates() state */
	uint64_t rate_ms;
	uint64_t rate_jobs;
	uint64_t rate_bytes;
	/* textfile */
	uv_timer_t *timer; /* own allocation, freed in its close callback */
	char textfile_dir[256];
};

int metrics_create(struct rdmaxd *daemon, struct metrics **ret_metrics)
{
	struct metrics *m = calloc(1, sizeof(*m));

	if (!m) {
		return -ENOMEM;
	}
	m->daemon = daemon;
	m->rate_ms = now_ms();
	*ret_metrics = m;
	return 0;
}

static void timer_closed(uv_handle_t *handle)
{
	free(handle);
}

void metrics_shutdown(struct metrics *metrics)
{
	if (!metrics || !metrics->timer) {
		return;
	}
	uv_timer_stop(metrics->timer);
	uv_close((uv_handle_t *)metrics->timer, timer_closed);
	metrics->timer = NULL;
}

void metrics_destroy(struct metrics *metrics)
{
	if (!metrics) {
		return;
	}
	metrics_shutdown(metrics);
	free(metrics);
}

void metrics_rates(struct metrics *metrics, double *ret_jobs_per_s, double *ret_bytes_per_s)
{
	const struct counters *c = &metrics->daemon->counters;
	uint64_t now = now_ms();
	double secs = (double)(now - metrics->rate_ms) / 1000.0;

	if (secs <= 0) {
		secs = 1e-3;
	}
	*ret_jobs_per_s = (double)(c->total_jobs - metrics->rate_jobs) / secs;
	*ret_bytes_per_s = (double)(c->total_bytes - metrics->rate_bytes) / secs;
	metrics->rate_ms = now;
	metrics->rate_jobs = c->total_jobs;
	metrics->rate_bytes = c->total_bytes;
}

/* ------------------------------------------------------------ rendering */

struct text {
	char *buf;
	size_t len;
	size_t cap;
	bool failed;
};

static void text_printf(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void text_printf(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->failed) {
		return;
	}
	for (;;) {
		size_t room = t->cap - t->len;
		va_start(ap, fmt);
		n = vsnprintf(t->buf ? t->buf + t->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->failed = true;
			return;
		}
		if ((size_t)n < room) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = t->cap ? t->cap * 2 : 16384;
		while (cap < t->len + (size_t)n + 1) {
			cap *= 2;
		}
		char *buf = realloc(t->buf, cap);
		if (!buf) {
			t->failed = true;
			return;
		}
		t->buf = buf;
		t->cap = cap;
	}
}

/* A label value: '\\', '"' and newlines escaped, other control and non-ASCII bytes replaced. */
static const char *label_escape(const char *in, char *out, size_t size)
{
	size_t o = 0;

	for (const char *p = in; *p && o + 3 < size; p++) {
		if (*p == '\\' || *p == '"') {
			out[o++] = '\\';
			out[o++] = *p;
		} else if (*p == '\n') {
			out[o++] = '\\';
			out[o++] = 'n';
		} else if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) {
			out[o++] = '?'; /* client-chosen bytes: keep the text format valid UTF-8 */
		} else {
			out[o++] = *p;
		}
	}
	out[o] = '\0';
	return out;
}

static void family(struct text *t, const char *name, const char *type, const char *help)
{
	text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void status_label(int status, char *buf, size_t size)
{
	const char *name = status_name(status);
	size_t i = 0;

	for (; name[i] && i + 1 < size; i++) {
		buf[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] - 'A' + 'a' : name[i]);
	}
	buf[i] = '\0';
}

/* label is the histogram's one label ("op", "class"), value its value. */
static void render_histogram(struct text *t, const char *name, const struct histogram *h,
			     const double *bounds, size_t n_bounds, const char *label,
			     const char *value)
{
	uint64_t cum = 0;

	for (size_t i = 0; i < n_bounds; i++) {
		cum += h->buckets[i];
		text_printf(t, "%s_bucket{%s=\"%s\",le=\"%g\"} %" PRIu64 "\n", name, label, value,
			    bounds[i], cum);
	}
	cum += h->buckets[n_bounds];
	text_printf(t, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name, label, value, cum);
	text_printf(t, "%s_sum{%s=\"%s\"} %.9g\n", name, label, value, h->sum);
	text_printf(t, "%s_count{%s=\"%s\"} %" PRIu64 "\n", name, label, value, h->count);
}

/* Per traffic class ([qos]): jobs, bytes, latency, and the scheduler's state. */
static void render_classes(struct text *t, struct rdmaxd *daemon)
{
	const struct counters *m = &daemon->counters;
	struct engine_qos_stats st = {0};

	if (daemon->engine) {
		engine_qos_stats(daemon->engine, &st);
	}
	family(t, "rdmaxd_qos_enabled", "gauge", "1 while chunks are scheduled by traffic class.");
	text_printf(t, "rdmaxd_qos_enabled %d\n", daemon->cfg.qos_enabled ? 1 : 0);
	family(t, "rdmaxd_qos_weight", "gauge", "Weight of each traffic class ([qos]).");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		text_printf(t, "rdmaxd_qos_weight{class=\"%s\"} %u\n", qos_class_name(c),
			    daemon->cfg.qos_weight[c]);
	}
	family(t, "rdmaxd_class_jobs_total", "counter",
	       "Completed jobs by traffic class and result.");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		text_printf(t, "rdmaxd_class_jobs_total{class=\"%s\",result=\"ok\"} %" PRIu64 "\n",
			    qos_class_name(c), m->class_ok[c]);
		text_printf(t,
			    "rdmaxd_class_jobs_total{class=\"%s\",result=\"failed\"} %" PRIu64 "\n",
			    qos_class_name(c), m->class_failed[c]);
	}
	family(t, "rdmaxd_class_bytes_total", "counter",
	       "Bytes moved by completed jobs, by class.");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		text_printf(t, "rdmaxd_class_bytes_total{class=\"%s\"} %" PRIu64 "\n",
			    qos_class_name(c), m->class_bytes[c]);
	}
	family(t, "rdmaxd_class_job_duration_seconds", "histogram",
	       "Time from submission to completion of a job, by traffic class.");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		render_histogram(t, "rdmaxd_class_job_duration_seconds", &m->class_latency[c],
				 counters_latency_bounds, counters_latency_buckets, "class",
				 qos_class_name(c));
	}
	family(t, "rdmaxd_class_chunks_in_flight", "gauge",
	       "Chunks to other daemons in flight, by class.");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		text_printf(t, "rdmaxd_class_chunks_in_flight{class=\"%s\"} %u\n",
			    qos_class_name(c), st.in_flight[c]);
	}
	family(t, "rdmaxd_class_jobs_waiting", "gauge",
	       "Jobs waiting for the scheduler to grant their next chunk, by class.");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		text_printf(t, "rdmaxd_class_jobs_waiting{class=\"%s\"} %u\n", qos_class_name(c),
			    st.waiting[c]);
	}
	family(t, "rdmaxd_class_grants_total", "counter",
	       "Chunks the scheduler granted to waiting jobs, by class.");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		text_printf(t, "rdmaxd_class_grants_total{class=\"%s\"} %" PRIu64 "\n",
			    qos_class_name(c), st.grants[c]);
	}
}

struct conn_count {
	uint64_t total;
	uint64_t ready;
	uint64_t in_flight;
};

static void count_conn(void *arg, const struct transport_conn_info *info)
{
	struct conn_count *c = arg;

	c->total++;
	if (strcmp(info->state, "ready") == 0) {
		c->ready++;
	}
	c->in_flight += info->in_flight;
}

/* The labels that name one client session: client="...",pid="...",session="...". */
static void client_labels(const struct ipc_client_info *info, char *buf, size_t size)
{
	char name[160];

	label_escape(info->name, name, sizeof(name));
	snprintf(buf, size, "client=\"%s\",pid=\"%d\",session=\"%" PRIu64 "\"", name, info->pid,
		 info->id);
}

/* The per-client families, each rendered in one pass over the sessions. */
enum client_family {
	CLIENT_JOBS,        /* rdmaxd_client_jobs_total, by result */
	CLIENT_BYTES,       /* rdmaxd_client_bytes_total */
	CLIENT_REGISTERED,  /* rdmaxd_client_registered_bytes */
	CLIENT_OUTSTANDING, /* rdmaxd_client_jobs_outstanding */
	CLIENT_FAMILY_MAX,  /* terminator */
};

static const struct {
	const char *name, *type, *help;
} g_client_families[CLIENT_FAMILY_MAX] = {
	[CLIENT_JOBS] = {"rdmaxd_client_jobs_total", "counter",
			 "Completed jobs by client session."},
	[CLIENT_BYTES] = {"rdmaxd_client_bytes_total", "counter", "Bytes moved by client session."},
	[CLIENT_REGISTERED] = {"rdmaxd_client_registered_bytes", "gauge",
			       "Bytes registered by client session."},
	[CLIENT_OUTSTANDING] = {"rdmaxd_client_jobs_outstanding", "gauge",
				"Jobs in flight by client session."},
};

struct client_render {
	struct text *t;
	enum client_family family;
};

static void render_client(void *arg, const struct ipc_client_info *info)
{
	const struct client_render *r = arg;
	const char *name = g_client_families[r->family].name;
	char labels[224];

	client_labels(info, labels, sizeof(labels));
	switch (r->family) {
	case CLIENT_JOBS:
		text_printf(r->t, "%s{%s,result=\"ok\"} %" PRIu64 "\n", name, labels,
			    info->jobs_ok);
		text_printf(r->t, "%s{%s,result=\"error\"} %" PRIu64 "\n", name, labels,
			    info->jobs_failed);
		break;
	case CLIENT_BYTES:
		text_printf(r->t, "%s{%s} %" PRIu64 "\n", name, labels, info->bytes);
		break;
	case CLIENT_REGISTERED:
		text_printf(r->t, "%s{%s} %" PRIu64 "\n", name, labels, info->registered_bytes);
		break;
	case CLIENT_OUTSTANDING:
	case CLIENT_FAMILY_MAX:
		text_printf(r->t, "%s{%s} %u\n", name, labels, info->outstanding);
		break;
	}
}

static void render_peer(struct text *t, const char *metric, const struct peer_stats *p, int what)
{
	char name[COUNTERS_PEER_NAME * 2];

	label_escape(p->name, name, sizeof(name));
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		if (what == 0) {
			text_printf(t, "%s{peer=\"%s\",op=\"%s\",result=\"ok\"} %" PRIu64 "\n",
				    metric, name, engine_job_kind_name((int)op), p->jobs_ok[op]);
			text_printf(t, "%s{peer=\"%s\",op=\"%s\",result=\"error\"} %" PRIu64 "\n",
				    metric, name, engine_job_kind_name((int)op),
				    p->jobs_failed[op]);
		} else {
			text_printf(t, "%s{peer=\"%s\",op=\"%s\"} %" PRIu64 "\n", metric, name,
				    engine_job_kind_name((int)op), p->bytes[op]);
		}
	}
}

static bool peer_used(const struct peer_stats *p)
{
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		if (p->jobs_ok[op] || p->jobs_failed[op]) {
			return true;
		}
	}
	return false;
}

int metrics_prometheus(struct metrics *metrics, char **ret_text, size_t *ret_len)
{
	const struct counters *m = &metrics->daemon->counters;
	struct rdmaxd *daemon = metrics->daemon;
	struct text t = {0};
	char status[32];
	char node[160];

	family(&t, "rdmaxd_build_info", "gauge", "Version and node of this daemon (always 1).");
	text_printf(&t,
		    "rdmaxd_build_info{version=\"%s\",node=\"%s\",instance_id=\"%016" PRIx64
		    "\"} 1\n",
		    RDMAXD_VERSION, label_escape(daemon->node_name, node, sizeof(node)),
		    daemon->instance_id);
	family(&t, "rdmaxd_start_time_seconds", "gauge", "When this daemon started (Unix time).");
	text_printf(&t, "rdmaxd_start_time_seconds %" PRIu64 "\n",
		    (uint64_t)time(NULL) - (now_ms() - daemon->started_ms) / 1000);
	family(&t, "rdmaxd_draining", "gauge", "1 while new jobs are refused (rdmaxctl drain).");
	text_printf(&t, "rdmaxd_draining %d\n", daemon->draining ? 1 : 0);
	family(&t, "rdmaxd_transport_up", "gauge", "1 for each transport this daemon runs.");
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		text_printf(&t, "rdmaxd_transport_up{transport=\"%s\"} %d\n",
			    counters_transport_names[k], daemon->transports[k] ? 1 : 0);
	}

	struct discovery_stats ds;
	discovery_get_stats(daemon->discovery, &ds);
	family(&t, "rdmaxd_discovery_state", "gauge",
	       "1 for the state of node membership (backend none: off).");
	static const char *const states[] = {"off", "connecting", "registered", "unreachable",
					     "stopped"};
	for (size_t i = 0; i < ARRAY_SIZE(states); i++) {
		text_printf(&t, "rdmaxd_discovery_state{backend=\"%s\",state=\"%s\"} %d\n",
			    ds.backend, states[i], strcmp(ds.state, states[i]) == 0);
	}
	family(&t, "rdmaxd_discovery_nodes", "gauge", "Nodes membership knows, alive or lost.");
	text_printf(&t, "rdmaxd_discovery_nodes{alive=\"true\"} %u\n", ds.nodes_alive);
	text_printf(&t, "rdmaxd_discovery_nodes{alive=\"false\"} %u\n", ds.nodes_lost);
	family(&t, "rdmaxd_discovery_lease_renewals_total", "counter",
	       "Keep-alives of this node's lease that the store answered.");
	text_printf(&t, "rdmaxd_discovery_lease_renewals_total %" PRIu64 "\n", ds.lease_renewals);
	family(&t, "rdmaxd_discovery_watch_events_total", "counter",
	       "Node records put or deleted, as the watch reported them.");
	text_printf(&t, "rdmaxd_discovery_watch_events_total %" PRIu64 "\n", ds.watch_events);
	family(&t, "rdmaxd_discovery_store_errors_total", "counter",
	       "Requests to the membership store that failed.");
	text_printf(&t, "rdmaxd_discovery_store_errors_total %" PRIu64 "\n", ds.store_errors);
	family(&t, "rdmaxd_lookups_total", "counter",
	       "Named-region lookups by this node's clients, by result.");
	text_printf(&t, "rdmaxd_lookups_total{result=\"ok\"} %" PRIu64 "\n", ds.lookups_ok);
	text_printf(&t, "rdmaxd_lookups_total{result=\"failed\"} %" PRIu64 "\n", ds.lookups_failed);
	family(&t, "rdmaxd_lookups_served_total", "counter",
	       "Lookups of this node's names, from peers and local clients, by result.");
	text_printf(&t, "rdmaxd_lookups_served_total{result=\"ok\"} %" PRIu64 "\n",
		    daemon->names ? daemon->names->served : 0);
	text_printf(&t, "rdmaxd_lookups_served_total{result=\"not_found\"} %" PRIu64 "\n",
		    daemon->names ? daemon->names->missing : 0);
	family(&t, "rdmaxd_published_names", "gauge", "Names published on this node.");
	text_printf(&t, "rdmaxd_published_names %u\n", daemon->names ? daemon->names->count : 0);

	family(&t, "rdmaxd_jobs_total", "counter", "Completed jobs by operation and status.");
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		for (unsigned i = 0; i < rdmax__v1__status__descriptor.n_values; i++) {
			int s = status_value(i);
			status_label(s, status, sizeof(status));
			text_printf(&t, "rdmaxd_jobs_total{op=\"%s\",status=\"%s\"} %" PRIu64 "\n",
				    engine_job_kind_name((int)op), status, m->jobs[op][s]);
		}
	}
	family(&t, "rdmaxd_job_bytes_total", "counter",
	       "Bytes moved by completed jobs, by operation and status.");
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		for (unsigned i = 0; i < rdmax__v1__status__descriptor.n_values; i++) {
			int s = status_value(i);
			status_label(s, status, sizeof(status));
			text_printf(&t,
				    "rdmaxd_job_bytes_total{op=\"%s\",status=\"%s\"} %" PRIu64 "\n",
				    engine_job_kind_name((int)op), status, m->bytes[op][s]);
		}
	}
	family(&t, "rdmaxd_local_jobs_total", "counter",
	       "Jobs between two regions of this daemon (no transport).");
	text_printf(&t, "rdmaxd_local_jobs_total %" PRIu64 "\n", m->local_jobs);
	family(&t, "rdmaxd_jobs_in_flight", "gauge", "Jobs without a completion yet.");
	text_printf(&t, "rdmaxd_jobs_in_flight %" PRIu64 "\n",
		    daemon->engine ? engine_outstanding(daemon->engine) : 0);
	family(&t, "rdmaxd_chunks_reissued_total", "counter",
	       "Chunks re-issued over another device pair after theirs failed.");
	text_printf(&t, "rdmaxd_chunks_reissued_total %" PRIu64 "\n",
		    daemon->engine ? engine_reissued_chunks(daemon->engine) : 0);
	family(&t, "rdmaxd_job_duration_seconds", "histogram",
	       "Time from submission to completion of a job.");
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		render_histogram(&t, "rdmaxd_job_duration_seconds", &m->latency[op],
				 counters_latency_bounds, counters_latency_buckets, "op",
				 engine_job_kind_name((int)op));
	}
	family(&t, "rdmaxd_job_size_bytes", "histogram", "Length of jobs that completed OK.");
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		render_histogram(&t, "rdmaxd_job_size_bytes", &m->size[op], counters_size_bounds,
				 counters_size_buckets, "op", engine_job_kind_name((int)op));
	}
	render_classes(&t, daemon);

	family(&t, "rdmaxd_peer_jobs_total", "counter", "Completed jobs by peer daemon.");
	for (uint32_t i = 0; i < m->n_peers; i++) {
		render_peer(&t, "rdmaxd_peer_jobs_total", &m->peers[i], 0);
	}
	if (peer_used(&m->other)) {
		render_peer(&t, "rdmaxd_peer_jobs_total", &m->other, 0);
	}
	family(&t, "rdmaxd_peer_bytes_total", "counter", "Bytes moved by completed jobs by peer.");
	for (uint32_t i = 0; i < m->n_peers; i++) {
		render_peer(&t, "rdmaxd_peer_bytes_total", &m->peers[i], 1);
	}
	if (peer_used(&m->other)) {
		render_peer(&t, "rdmaxd_peer_bytes_total", &m->other, 1);
	}

	family(&t, "rdmaxd_connection_events_total", "counter",
	       "Connections to peer daemons established, failed and closed.");
	for (size_t k = 0; k <= ENDPOINT_MAX; k++) {
		for (size_t e = 0; e < COUNTERS_CONN_EVENT_MAX; e++) {
			if (k == ENDPOINT_MAX && m->conn_events[k][e] == 0) {
				continue;
			}
			text_printf(&t,
				    "rdmaxd_connection_events_total{transport=\"%s\",event=\"%s\"} "
				    "%" PRIu64 "\n",
				    counters_transport_names[k], counters_conn_event_names[e],
				    m->conn_events[k][e]);
		}
	}
	if (daemon->cfg.tcp_encryption) {
		family(&t, "rdmaxd_tcp_tls_connections_total", "counter",
		       "TCP connections to peer daemons whose TLS handshake completed, by data "
		       "path: ktls (kernel TLS both ways), ktls_tx (kernel sends, OpenSSL "
		       "receives), user (OpenSSL both ways).");
		for (size_t i = 0; i < COUNTERS_TLS_MODE_MAX; i++) {
			text_printf(&t,
				    "rdmaxd_tcp_tls_connections_total{mode=\"%s\"} %" PRIu64 "\n",
				    counters_tls_mode_names[i], m->tcp_tls[i]);
		}
	}
	family(&t, "rdmaxd_tcp_io_thread_bytes_total", "counter",
	       "TCP payload bytes copied by the transport's I/O threads instead of the loop "
	       "([transport] tcp_io_threads), by direction.");
	text_printf(&t, "rdmaxd_tcp_io_thread_bytes_total{direction=\"sent\"} %" PRIu64 "\n",
		    m->tcp_io_thread_sent);
	text_printf(&t, "rdmaxd_tcp_io_thread_bytes_total{direction=\"received\"} %" PRIu64 "\n",
		    m->tcp_io_thread_received);
	family(&t, "rdmaxd_verbs_post_thread_wrs_total", "counter",
	       "Verbs work requests of bulk connections handed to the posting thread instead of "
	       "posted by the loop (software devices while a latency lane is open).");
	text_printf(&t, "rdmaxd_verbs_post_thread_wrs_total %" PRIu64 "\n",
		    m->verbs_post_thread_wrs);
	family(&t, "rdmaxd_verbs_cq_events_total", "counter",
	       "Completion events the loop woke for from the verbs completion queues; none "
	       "while the loop spins, which polls them instead.");
	text_printf(&t, "rdmaxd_verbs_cq_events_total %" PRIu64 "\n", m->verbs_cq_events);
	family(&t, "rdmaxd_job_stage_seconds", "histogram",
	       "Stages of jobs to other daemons that completed OK, while [metrics] job_stages "
	       "is on: queue (accepted to the call that hands their first bytes to the NIC or "
	       "the socket: ibv_post_send(), sendmsg()), post (that call), complete (its return "
	       "to the completion handed to the client).");
	for (int s = 0; s < COUNTERS_STAGE_MAX; s++) {
		render_histogram(&t, "rdmaxd_job_stage_seconds", &m->job_stage[s],
				 counters_stage_bounds, counters_stage_buckets, "stage",
				 counters_stage_names[s]);
	}
	struct conn_count counts[ENDPOINT_MAX] = {0};
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *tr = daemon->transports[k];
		if (tr && tr->ops->list_conns) {
			tr->ops->list_conns(tr, count_conn, &counts[k]);
		}
	}
	family(&t, "rdmaxd_connections", "gauge", "Connections to peer daemons now, by state.");
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		if (!daemon->transports[k]) {
			continue;
		}
		text_printf(&t,
			    "rdmaxd_connections{transport=\"%s\",state=\"ready\"} %" PRIu64 "\n",
			    counters_transport_names[k], counts[k].ready);
		text_printf(&t,
			    "rdmaxd_connections{transport=\"%s\",state=\"other\"} %" PRIu64 "\n",
			    counters_transport_names[k], counts[k].total - counts[k].ready);
	}
	family(&t, "rdmaxd_connection_requests_in_flight", "gauge",
	       "Requests sent to peers whose answer is pending.");
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		if (daemon->transports[k]) {
			text_printf(
				&t,
				"rdmaxd_connection_requests_in_flight{transport=\"%s\"} %" PRIu64
				"\n",
				counters_transport_names[k], counts[k].in_flight);
		}
	}

	family(&t, "rdmaxd_clients", "gauge", "Clients connected to the client socket.");
	text_printf(&t, "rdmaxd_clients %u\n", ipc_client_count(daemon->ipc));
	for (int k = 0; k < CLIENT_FAMILY_MAX; k++) {
		struct client_render r = {.t = &t, .family = (enum client_family)k};

		family(&t, g_client_families[k].name, g_client_families[k].type,
		       g_client_families[k].help);
		ipc_for_each_client(daemon->ipc, render_client, &r);
	}

	family(&t, "rdmaxd_regions", "gauge", "Registered regions.");
	text_printf(&t, "rdmaxd_regions %u\n", daemon->regions.count);
	family(&t, "rdmaxd_registered_bytes", "gauge", "Bytes of all registered regions.");
	text_printf(&t, "rdmaxd_registered_bytes %" PRIu64 "\n", daemon->regions.total_bytes);
	family(&t, "rdmaxd_registrations_total", "counter", "Regions registered since start.");
	text_printf(&t, "rdmaxd_registrations_total %" PRIu64 "\n",
		    daemon->regions.next_id ? daemon->regions.next_id - 1 : 0);

	family(&t, "rdmaxd_imm_writes_total", "counter",
	       "Jobs carrying an immediate value that completed OK on this node.");
	text_printf(&t, "rdmaxd_imm_writes_total %" PRIu64 "\n", m->imm_writes);
	family(&t, "rdmaxd_imm_fired_total", "counter",
	       "ExpectImm claims that reached their count.");
	text_printf(&t, "rdmaxd_imm_fired_total %" PRIu64 "\n", m->imm_fired);
	family(&t, "rdmaxd_ring_notifies_total", "counter",
	       "RingNotify datagrams sent to clients waiting on unread ring completions.");
	text_printf(&t, "rdmaxd_ring_notifies_total %" PRIu64 "\n", m->ring_notifies);
	family(&t, "rdmaxd_ring_notifies_spared_total", "counter",
	       "Wake requests left standing because the client had read every completion.");
	text_printf(&t, "rdmaxd_ring_notifies_spared_total %" PRIu64 "\n", m->ring_notifies_spared);
	family(&t, "rdmaxd_loop_sleeps_for_copies_total", "counter",
	       "Turns of the event loop that slept in epoll rather than spin while bulk copies "
	       "ran on I/O threads.");
	text_printf(&t, "rdmaxd_loop_sleeps_for_copies_total %" PRIu64 "\n",
		    m->loop_sleeps_for_copies);
	family(&t, "rdmaxd_imm_dropped_total", "counter",
	       "Landings not counted because the imm counter table was full.");
	text_printf(&t, "rdmaxd_imm_dropped_total %" PRIu64 "\n", daemon->imm.dropped);
	family(&t, "rdmaxd_imm_counters", "gauge", "Immediate counters tracked now.");
	text_printf(&t, "rdmaxd_imm_counters %u\n", daemon->imm.n_counters);

	if (t.failed) {
		free(t.buf);
		return -ENOMEM;
	}
	*ret_text = t.buf;
	*ret_len = t.len;
	return 0;
}

void metrics_json(struct metrics *metrics, struct json *j, const char *key)
{
	const struct counters *m = &metrics->daemon->counters;
	char status[32];

	json_obj_open(j, key);
	json_u64(j, "jobs_total", m->total_jobs);
	json_u64(j, "bytes_total", m->total_bytes);
	json_u64(j, "local_jobs_total", m->local_jobs);
	json_arr_open(j, "jobs");
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		for (int s = 0; s < (int)STATUS_SLOTS; s++) {
			if (m->jobs[op][s] == 0) {
				continue;
			}
			status_label(s, status, sizeof(status));
			json_obj_open(j, NULL);
			json_str(j, "op", engine_job_kind_name((int)op));
			json_str(j, "status", status);
			json_u64(j, "jobs", m->jobs[op][s]);
			json_u64(j, "bytes", m->bytes[op][s]);
			json_obj_close(j);
		}
	}
	json_arr_close(j);
	json_arr_open(j, "latency");
	for (size_t op = 0; op < JOB_KIND_MAX; op++) {
		const struct histogram *h = &m->latency[op];
		json_obj_open(j, NULL);
		json_str(j, "op", engine_job_kind_name((int)op));
		json_u64(j, "count", h->count);
		json_double(j, "mean_s", h->count ? h->sum / (double)h->count : 0);
		json_arr_open(j, "buckets");
		uint64_t cum = 0;
		for (size_t i = 0; i <= counters_latency_buckets; i++) {
			cum += h->buckets[i];
			json_obj_open(j, NULL);
			if (i < counters_latency_buckets) {
				json_double(j, "le", counters_latency_bounds[i]);
			} else {
				json_str(j, "le", "+Inf");
			}
			json_u64(j, "count", cum);
			json_obj_close(j);
		}
		json_arr_close(j);
		json_obj_close(j);
	}
	json_arr_close(j);
	struct engine_qos_stats st = {0};
	if (metrics->daemon->engine) {
		engine_qos_stats(metrics->daemon->engine, &st);
	}
	const struct config *cfg = &metrics->daemon->cfg;
	json_obj_open(j, "qos");
	json_bool(j, "enabled", cfg->qos_enabled);
	json_str(j, "default_class", qos_class_name((int)cfg->qos_default_class));
	json_u64(j, "max_in_flight", cfg->qos_max_in_flight);
	json_u64(j, "latency_reserve", cfg->qos_latency_reserve);
	json_arr_open(j, "classes");
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		const struct histogram *h = &m->class_latency[c];
		json_obj_open(j, NULL);
		json_str(j, "class", qos_class_name(c));
		json_u64(j, "weight", cfg->qos_weight[c]);
		json_u64(j, "jobs_ok", m->class_ok[c]);
		json_u64(j, "jobs_failed", m->class_failed[c]);
		json_u64(j, "bytes", m->class_bytes[c]);
		json_double(j, "mean_s", h->count ? h->sum / (double)h->count : 0);
		json_double(j, "p50_le_s", counters_quantile(h, 0.5));
		json_double(j, "p99_le_s", counters_quantile(h, 0.99));
		json_u64(j, "chunks_in_flight", st.in_flight[c]);
		json_u64(j, "jobs_waiting", st.waiting[c]);
		json_u64(j, "waits", st.waits[c]);
		json_u64(j, "grants", st.grants[c]);
		json_u64(j, "granted_bytes", st.granted_bytes[c]);
		json_obj_close(j);
	}
	json_arr_close(j);
	json_obj_close(j);
	json_arr_open(j, "peers");
	for (uint32_t i = 0; i <= m->n_peers; i++) {
		const struct peer_stats *p = i < m->n_peers ? &m->peers[i] : &m->other;
		if (i == m->n_peers && !peer_used(p)) {
			break;
		}
		json_obj_open(j, NULL);
		json_str(j, "peer", p->name);
		for (size_t op = 0; op < JOB_KIND_MAX; op++) {
			char k[32];
			snprintf(k, sizeof(k), "%s_ok", engine_job_kind_name((int)op));
			json_u64(j, k, p->jobs_ok[op]);
			snprintf(k, sizeof(k), "%s_failed", engine_job_kind_name((int)op));
			json_u64(j, k, p->jobs_failed[op]);
			snprintf(k, sizeof(k), "%s_bytes", engine_job_kind_name((int)op));
			json_u64(j, k, p->bytes[op]);
		}
		json_obj_close(j);
	}
	json_arr_close(j);
	json_arr_open(j, "connection_events");
	for (size_t k = 0; k <= ENDPOINT_MAX; k++) {
		for (size_t e = 0; e < COUNTERS_CONN_EVENT_MAX; e++) {
			if (m->conn_events[k][e] == 0) {
				continue;
			}
			json_obj_open(j, NULL);
			json_str(j, "transport", counters_transport_names[k]);
			json_str(j, "event", counters_conn_event_names[e]);
			json_u64(j, "count", m->conn_events[k][e]);
			json_obj_close(j);
		}
	}
	json_arr_close(j);
	for (size_t i = 0; i < COUNTERS_TLS_MODE_MAX; i++) {
		char name[48];
		snprintf(name, sizeof(name), "tcp_tls_connections_%s", counters_tls_mode_names[i]);
		json_u64(j, name, m->tcp_tls[i]);
	}
	json_u64(j, "tcp_io_thread_bytes_sent", m->tcp_io_thread_sent);
	json_u64(j, "tcp_io_thread_bytes_received", m->tcp_io_thread_received);
	json_u64(j, "verbs_post_thread_wrs", m->verbs_post_thread_wrs);
	json_u64(j, "verbs_cq_events_total", m->verbs_cq_events);
	json_arr_open(j, "job_stages");
	for (int s = 0; s < COUNTERS_STAGE_MAX; s++) {
		const struct histogram *h = &m->job_stage[s];
		json_obj_open(j, NULL);
		json_str(j, "stage", counters_stage_names[s]);
		json_u64(j, "count", h->count);
		json_double(j, "mean_s", h->count ? h->sum / (double)h->count : 0);
		json_double(j, "p50_le_s",
			    counters_quantile_of(h, counters_stage_bounds, counters_stage_buckets,
						 0.5));
		json_double(j, "p99_le_s",
			    counters_quantile_of(h, counters_stage_bounds, counters_stage_buckets,
						 0.99));
		json_obj_close(j);
	}
	json_arr_close(j);
	json_u64(j, "regions", metrics->daemon->regions.count);
	json_u64(j, "registered_bytes", metrics->daemon->regions.total_bytes);
	json_u64(j, "registrations_total",
		 metrics->daemon->regions.next_id ? metrics->daemon->regions.next_id - 1 : 0);
	json_u64(j, "imm_writes_total", m->imm_writes);
	json_u64(j, "imm_fired_total", m->imm_fired);
	json_u64(j, "imm_dropped_total", metrics->daemon->imm.dropped);
	json_u64(j, "ring_notifies_total", m->ring_notifies);
	json_u64(j, "ring_notifies_spared_total", m->ring_notifies_spared);
	json_u64(j, "loop_sleeps_for_copies_total", m->loop_sleeps_for_copies);
	json_u64(j, "imm_counters", metrics->daemon->imm.n_counters);
	json_obj_close(j);
}

/* ------------------------------------------------------------- textfile */

int metrics_textfile_write(struct metrics *metrics)
{
	char path[512], tmp[512];
	char *text;
	size_t len;
	int fd, ret;

	if (!metrics || !metrics->textfile_dir[0]) {
		return 0;
	}
	ret = metrics_prometheus(metrics, &text, &len);
	if (ret < 0) {
		return ret;
	}
	snprintf(path, sizeof(path), "%s/%s", metrics->textfile_dir, TEXTFILE_NAME);
	/* node_exporter reads only *.prom, so the temp name must not end in .prom. */
	snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", metrics->textfile_dir, TEXTFILE_NAME,
		 (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		ret = -errno;
		goto out_free;
	}
	for (size_t off = 0; off < len;) {
		ssize_t n = write(fd, text + off, len - off);
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			ret = -errno;
			close(fd);
			goto out_unlink;
		}
		off += (size_t)n;
	}
	if (close(fd) < 0) {
		ret = -errno;
		goto out_unlink;
	}
	if (rename(tmp, path) < 0) {
		ret = -errno;
		goto out_unlink;
	}
	free(text);
	return 0;

out_unlink:
	unlink(tmp);
out_free:
	free(text);
	return ret;
}

static void textfile_tick(uv_timer_t *timer)
{
	struct metrics *m = timer->data;
	static struct log_ratelimit rl;
	int ret = metrics_textfile_write(m);

	if (ret < 0) {
		log_ratelimited(&rl, LOG_WARNING, "writing metrics to '%s/%s' failed: %s",
				m->textfile_dir, TEXTFILE_NAME, strerror(-ret));
	}
}

int metrics_textfile_start(struct metrics *metrics, const char *dir, uint32_t interval_s)
{
	struct stat st;

	if (!metrics) {
		return -EINVAL;
	}
	metrics_shutdown(metrics);
	metrics->textfile_dir[0] = '\0';
	if (!dir || !dir[0]) {
		return 0;
	}
	if (strlen(dir) >= sizeof(metrics->textfile_dir) - sizeof(TEXTFILE_NAME) - 16) {
		return -ENAMETOOLONG;
	}
	if (stat(dir, &st) < 0) {
		return -errno;
	}
	if (!S_ISDIR(st.st_mode)) {
		return -ENOTDIR;
	}
	snprintf(metrics->textfile_dir, sizeof(metrics->textfile_dir), "%s", dir);
	metrics->timer = malloc(sizeof(*metrics->timer));
	if (!metrics->timer) {
		metrics->textfile_dir[0] = '\0';
		return -ENOMEM;
	}
	uv_timer_init(metrics->daemon->loop, metrics->timer);
	metrics->timer->data = metrics;
	uint64_t ms = (uint64_t)(interval_s ? interval_s : 15) * 1000;
	uv_timer_start(metrics->timer, textfile_tick, 0, ms);
	return 0;
}
