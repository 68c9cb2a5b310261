/* SPDX-License-Identifier: MIT */
/*
 * The admin socket: status and inventory queries, metrics, peer resets and
 * drains for rdmaxctl. Owns the admin listening socket (unless inherited
 * from the socket unit), admin connections and the drain timer. Reads the
 * other modules through their iterators only; never touches payload bytes,
 * never blocks the loop (replies that do not fit the socket wait for
 * POLLOUT), and never trusts a peer it has not checked with SO_PEERCRED.
 *
 * Protocol: a request is one datagram holding a command line ("jobs",
 * "stats prometheus", "peer-reset 10.0.0.2:7471", "drain 30000"); the reply
 * is one datagram holding one JSON object with "ok": true or "ok": false and
 * "error" naming what went wrong. Several requests may use one connection.
 */
#include "admin.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "discovery.h"
#include "engine.h"
#include "gpu.h"
#include "ipc.h"
#include "json.h"
#include "listen_backoff.h"
#include "log.h"
#include "metrics.h"
#include "names.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "region.h"
#include "transport.h"

#define ADMIN_DEFAULT_PATH "/run/rdmaxd-admin.sock"
/* Entries of one list reply at most; the rest is counted in "truncated". */
#define ADMIN_LIST_MAX   1000
#define ADMIN_SNDBUF     (4u << 20)
#define DRAIN_POLL_MS    50
#define DRAIN_DEFAULT_MS 30000
#define ADMIN_ARGS_MAX   8

struct admin_conn {
	struct admin *admin;
	struct list_node link;
	int fd;
	uv_poll_t poll;
	bool closing;
	int pid;
	uint32_t uid;
	char *pending; /* reply waiting for POLLOUT */
	size_t pending_len;
	bool draining;    /* waits for the drain to finish */
	uint64_t last_ms; /* connected, or the last request */
	uint64_t drain_start_ms;
	uint64_t drain_deadline_ms;
};

struct admin {
	struct rdmaxd *daemon;
	int listen_fd;
	uv_poll_t listen_poll;
	struct listen_backoff backoff; /* pauses accepting after EMFILE and the like */
	uv_timer_t drain_timer;
	uv_timer_t idle_timer; /* closes connections silent for admin_idle_timeout_ms */
	bool listening;
	bool inherited;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	bool have_group;
	gid_t group;
	struct list_node conns;
	uint32_t n_conns;
	size_t reply_max;
	struct log_ratelimit rl;
};

static void conn_close(struct admin_conn *c);
/* uv_poll_start() replaces the callback too: every restart must name it. */
static void conn_io(uv_poll_t *poll, int status, int events);

/* ------------------------------------------------------------------ replies */

static int send_reply(struct admin_conn *c, const char *text, size_t len)
{
	ssize_t n;

	if (c->closing) {
		return -EPIPE;
	}
	if (c->pending) {
		return -EBUSY; /* one request at a time; the client must read first */
	}
	n = send(c->fd, text, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n >= 0) {
		return 0;
	}
	if (errno != EAGAIN && errno != EWOULDBLOCK) {
		return -errno;
	}
	c->pending = malloc(len);
	if (!c->pending) {
		return -ENOMEM;
	}
	memcpy(c->pending, text, len);
	c->pending_len = len;
	uv_poll_start(&c->poll, UV_READABLE | UV_WRITABLE, conn_io);
	return 0;
}

static void reply_error(struct admin_conn *c, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void reply_error(struct admin_conn *c, const char *code, const char *fmt, ...)
{
	struct json j;
	char text[512];
	const char *doc;
	size_t len;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	json_init(&j, 4096);
	json_obj_open(&j, NULL);
	json_bool(&j, "ok", false);
	json_str(&j, "code", code);
	json_str(&j, "error", text);
	json_obj_close(&j);
	if (json_finish(&j, &doc, &len) == 0 && send_reply(c, doc, len) < 0) {
		conn_close(c);
	}
	json_fini(&j);
}

static void send_json(struct admin_conn *c, struct json *j)
{
	const char *doc;
	size_t len;
	int ret = json_finish(j, &doc, &len);

	if (ret == -EMSGSIZE) {
		reply_error(c, "RESOURCE_EXHAUSTED",
			    "the reply is larger than %zu bytes; ask for less (rdmaxctl --json "
			    "COMMAND on a quieter moment)",
			    c->admin->reply_max);
		return;
	}
	if (ret < 0) {
		reply_error(c, "INTERNAL", "cannot build the reply: %s", strerror(-ret));
		return;
	}
	ret = send_reply(c, doc, len);
	if (ret < 0) {
		log_ratelimited(&c->admin->rl, LOG_WARNING, "admin reply to pid %d failed: %s",
				c->pid, strerror(-ret));
		conn_close(c);
	}
}

/* ----------------------------------------------------------------- helpers */

static const char *access_text(uint32_t access)
{
	switch (access & (RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)) {
	case RDMAX_ACCESS_REMOTE_READ:
		return "remote-read";
	case RDMAX_ACCESS_REMOTE_WRITE:
		return "remote-write";
	case RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE:
		return "remote-read,remote-write";
	default:
		return "local";
	}
}

static const char *region_kind_text(enum region_kind kind)
{
	switch (kind) {
	case REGION_HOST_FD:
		return "host";
	case REGION_GPU_DMABUF:
		return "gpu-dmabuf";
	case REGION_GPU_CUDA_IPC:
		return "gpu-cuda-ipc";
	case REGION_POOL_SLICE:
		return "pool";
	default:
		return "?";
	}
}

static void json_endpoint(struct json *j, const char *key, const struct endpoint *ep)
{
	if (strchr(ep->addr, ':')) {
		json_strf(j, key, "[%s]:%u", ep->addr, ep->port);
	} else {
		json_strf(j, key, "%s:%u", ep->addr, ep->port);
	}
}

/* Client lookup by job owner, for jobs and regions. */
struct owner_map {
	size_t n;
	size_t cap;
	struct {
		const void *owner;
		uint64_t id;
		char name[64];
	} * items;
};

static void add_owner(void *arg, const struct ipc_client_info *info)
{
	struct owner_map *m = arg;

	if (m->n == m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 16;
		void *items = realloc(m->items, cap * sizeof(*m->items));
		if (!items) {
			return;
		}
		m->items = items;
		m->cap = cap;
	}
	m->items[m->n].owner = info->owner;
	m->items[m->n].id = info->id;
	snprintf(m->items[m->n].name, sizeof(m->items[m->n].name), "%s", info->name);
	m->n++;
}

static void json_owner(struct json *j, const struct owner_map *m, const void *owner)
{
	for (size_t i = 0; owner && i < m->n; i++) {
		if (m->items[i].owner == owner) {
			json_u64(j, "client_id", m->items[i].id);
			json_str(j, "client", m->items[i].name);
			return;
		}
	}
	json_null(j, "client_id");
	json_null(j, "client");
}

/* ---------------------------------------------------------------- commands */

typedef int (*command_fn)(struct admin *a, struct json *j, int argc, char **argv, char *err,
			  size_t err_size);

/*
 * Open the next object of a list reply, counting it in *n; past ADMIN_LIST_MAX
 * count it in *truncated instead and return false (the caller leaves it out).
 */
static bool list_entry_open(struct json *j, uint32_t *n, uint32_t *truncated)
{
	if (*n >= ADMIN_LIST_MAX) {
		(*truncated)++;
		return false;
	}
	(*n)++;
	json_obj_open(j, NULL);
	return true;
}

struct conn_list_ctx {
	struct json *j;
	const char *transport;
	uint32_t n;
	uint32_t ready;
	uint32_t truncated;
};

static void count_conns(void *arg, const struct transport_conn_info *info)
{
	struct conn_list_ctx *ctx = arg;

	ctx->n++;
	ctx->ready += strcmp(info->state, "ready") == 0;
}

static int cmd_status(struct admin *a, struct json *j, int argc, char **argv, char *err,
		      size_t err_size)
{
	struct rdmaxd *d = a->daemon;
	struct conn_list_ctx conns = {0};

	json_str(j, "version", RDMAXD_VERSION);
	json_u64(j, "protocol", RDMAX_PROTOCOL_VERSION);
	json_str(j, "node", d->node_name);
	json_strf(j, "instance_id", "%016" PRIx64, d->instance_id);
	json_i64(j, "pid", (int64_t)getpid());
	json_u64(j, "uptime_s", (now_ms() - d->started_ms) / 1000);
	json_str(j, "state", d->stopping ? "stopping" : d->draining ? "draining" : "running");
	json_bool(j, "draining", d->draining);
	json_str(j, "socket", d->cfg.socket_path);
	json_str(j, "admin_socket", a->path);
	json_bool(j, "socket_activated", d->client_listen_fd > 0);
	json_str(j, "log_level", log_level_name(log_get_level()));
	json_bool(j, "authentication", d->auth_key_len > 0);
	json_bool(j, "tcp_encryption", d->cfg.tcp_encryption);
	json_str(j, "configured_transport", config_transport_name(d->cfg.transport));
	struct discovery_stats ds;
	discovery_get_stats(d->discovery, &ds);
	json_obj_open(j, "discovery");
	json_str(j, "backend", ds.backend);
	json_str(j, "state", ds.state);
	json_u64(j, "nodes_alive", ds.nodes_alive);
	json_u64(j, "nodes_lost", ds.nodes_lost);
	json_u64(j, "names", d->names ? d->names->count : 0);
	json_u64(j, "lookups_ok", ds.lookups_ok);
	json_u64(j, "lookups_failed", ds.lookups_failed);
	json_u64(j, "lookups_served", d->names ? d->names->served : 0);
	json_u64(j, "store_errors", ds.store_errors);
	json_obj_close(j);
	json_arr_open(j, "transports");
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = d->transports[k];
		struct endpoint eps[DESC_MAX_ENDPOINTS];
		if (!t) {
			continue;
		}
		int n = t->ops->endpoints(t, NULL, eps, DESC_MAX_ENDPOINTS);
		json_obj_open(j, NULL);
		json_str(j, "name", t->ops->name);
		json_arr_open(j, "endpoints");
		for (int i = 0; i < n; i++) {
			json_obj_open(j, NULL);
			json_str(j, "addr", eps[i].addr);
			json_u64(j, "port", eps[i].port);
			if (eps[i].device[0]) {
				json_str(j, "device", eps[i].device);
			}
			json_obj_close(j);
		}
		json_arr_close(j);
		json_obj_close(j);
		if (t->ops->list_conns) {
			t->ops->list_conns(t, count_conns, &conns);
		}
	}
	json_arr_close(j);
	json_u64(j, "clients", ipc_client_count(d->ipc));
	json_u64(j, "regions", d->regions.count);
	json_u64(j, "registered_bytes", d->regions.total_bytes);
	json_u64(j, "connections", conns.n);
	json_u64(j, "connections_ready", conns.ready);
	json_u64(j, "jobs_in_flight", d->engine ? engine_outstanding(d->engine) : 0);
	json_u64(j, "chunks_reissued", d->engine ? engine_reissued_chunks(d->engine) : 0);
	json_u64(j, "jobs_total", d->counters.total_jobs);
	json_u64(j, "bytes_total", d->counters.total_bytes);
	/* [qos] as applied now (a reload shows here), and the scheduler's queues. */
	struct engine_qos_stats qs = {0};
	if (d->engine) {
		engine_qos_stats(d->engine, &qs);
	}
	json_u64(j, "qos_enabled", d->cfg.qos_enabled);
	json_u64(j, "qos_latency_weight", d->cfg.qos_weight[QOS_LATENCY]);
	json_u64(j, "qos_bulk_weight", d->cfg.qos_weight[QOS_BULK]);
	json_u64(j, "qos_latency_waiting", qs.waiting[QOS_LATENCY]);
	json_u64(j, "qos_bulk_waiting", qs.waiting[QOS_BULK]);
	return 0;
}

static void json_port(void *arg, const struct transport_port_info *p)
{
	struct json *j = arg;

	json_obj_open(j, NULL);
	json_str(j, "device", p->device);
	json_u64(j, "port", p->port);
	json_str(j, "state", p->state);
	json_str(j, "link_layer", p->link_layer);
	json_u64(j, "active_mtu", p->active_mtu);
	json_u64(j, "max_mtu", p->max_mtu);
	json_str(j, "netdev", p->netdev ? p->netdev : "");
	json_bool(j, "dmabuf", p->dmabuf);
	json_bool(j, "peermem", p->peermem);
	json_arr_open(j, "gids");
	for (uint32_t i = 0; i < p->n_gids && i < TRANSPORT_PORT_GIDS_MAX; i++) {
		json_obj_open(j, NULL);
		json_u64(j, "index", p->gids[i].index);
		json_str(j, "gid", p->gids[i].gid);
		json_str(j, "type", p->gids[i].type);
		json_obj_close(j);
	}
	json_arr_close(j);
	json_obj_close(j);
}

static void json_pool(void *arg, const struct gpu_pool_info *info)
{
	struct json *j = arg;

	json_obj_open(j, NULL);
	json_u64(j, "id", info->pool_id);
	json_str(j, "gpu", info->bus_id);
	json_str(j, "path", info->path);
	json_u64(j, "bytes", info->bytes);
	json_u64(j, "leased", info->leased);
	json_u64(j, "slices", info->slices);
	json_obj_close(j);
}

static int cmd_devices(struct admin *a, struct json *j, int argc, char **argv, char *err,
		       size_t err_size)
{
	struct rdmaxd *d = a->daemon;
	/* The topology gpu.c scanned at start-up, the same the transport prefers NICs by. */
	const struct gpu_topology *topo = gpu_topology(d->gpu);
	struct gpu_topology *scanned = NULL;
	bool any_ports = false;
	uint32_t caps = gpu_capabilities(d->gpu);

	if (!topo) {
		scanned = malloc(sizeof(*scanned));
		if (!scanned || gpu_topology_scan(NULL, scanned) < 0) {
			free(scanned);
			snprintf(err, err_size, "out of memory");
			return -ENOMEM;
		}
		topo = scanned;
	}
	json_arr_open(j, "transports");
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		if (d->transports[k]) {
			json_str(j, NULL, d->transports[k]->ops->name);
		}
	}
	json_arr_close(j);
	json_arr_open(j, "ports");
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = d->transports[k];
		if (t && t->ops->list_ports) {
			t->ops->list_ports(t, json_port, j);
			any_ports = true;
		}
	}
	json_arr_close(j);
	if (!any_ports) {
		json_str(j, "note",
			 "no RDMA transport is running (TCP transport): the daemon uses no RDMA "
			 "device; run 'rdmaxctl doctor' to inspect the node's devices");
	}
	json_bool(j, "peermem", gpu_peermem_loaded(NULL));
	json_str(j, "gpu_registration", config_gpu_registration_name(d->cfg.gpu_registration));
	json_arr_open(j, "gpu_paths"); /* what clients are offered for GPU memory */
	if (caps & RDMAX_CAP_DMABUF) {
		json_str(j, NULL, "dmabuf");
	}
	if (caps & RDMAX_CAP_PEERMEM) {
		json_str(j, NULL, "peermem");
	}
	json_arr_close(j);
	json_arr_open(j, "rdma_devices_present");
	for (uint32_t i = 0; i < topo->n_nics; i++) {
		json_obj_open(j, NULL);
		json_str(j, "name", topo->nics[i].name);
		json_str(j, "pci_path", topo->nics[i].pci_path);
		json_obj_close(j);
	}
	json_arr_close(j);
	json_arr_open(j, "gpus");
	for (uint32_t g = 0; g < topo->n_gpus; g++) {
		const struct gpu_dev *gd = &topo->gpus[g];
		bool near = gd->n_nics > 0 && gd->closeness[0] >= 0;
		json_obj_open(j, NULL);
		json_str(j, "pci", gd->bus_id);
		json_i64(j, "numa_node", gd->numa_node);
		json_u64(j, "bar1_bytes", gd->bar1_bytes);
		if (near) {
			json_str(j, "nearest_nic", topo->nics[gd->nics[0]].name);
			json_str(j, "relation", gpu_closeness_text(gd->closeness[0]));
		} else {
			json_null(j, "nearest_nic");
			json_null(j, "relation");
		}
		/* Every NIC, nearest first: the order GPU regions prefer them in. */
		json_arr_open(j, "nics");
		for (uint32_t i = 0; i < gd->n_nics; i++) {
			json_obj_open(j, NULL);
			json_str(j, "name", topo->nics[gd->nics[i]].name);
			json_str(j, "relation", gpu_closeness_text(gd->closeness[i]));
			json_obj_close(j);
		}
		json_arr_close(j);
		json_obj_close(j);
	}
	json_arr_close(j);
	json_arr_open(j, "gpu_pools");
	gpu_for_each_pool(d->gpu, json_pool, j);
	json_arr_close(j);
	free(scanned);
	return 0;
}

struct list_ctx {
	struct json *j;
	struct owner_map *owners;
	uint32_t n;
	uint32_t truncated;
};

static void json_client(void *arg, const struct ipc_client_info *info)
{
	struct list_ctx *ctx = arg;
	struct json *j = ctx->j;

	if (!list_entry_open(j, &ctx->n, &ctx->truncated)) {
		return;
	}
	json_u64(j, "id", info->id);
	json_str(j, "name", info->name);
	json_i64(j, "pid", info->pid);
	json_u64(j, "uid", info->uid);
	json_u64(j, "gid", info->gid);
	json_u64(j, "regions", info->regions);
	json_u64(j, "registered_bytes", info->registered_bytes);
	json_u64(j, "jobs_outstanding", info->outstanding);
	json_u64(j, "jobs_ok", info->jobs_ok);
	json_u64(j, "jobs_failed", info->jobs_failed);
	json_u64(j, "bytes", info->bytes);
	json_u64(j, "queued_bytes", info->queued_bytes);
	json_u64(j, "connected_s", info->connected_ms / 1000);
	json_obj_close(j);
}

static int cmd_clients(struct admin *a, struct json *j, int argc, char **argv, char *err,
		       size_t err_size)
{
	struct list_ctx ctx = {.j = j};

	json_arr_open(j, "clients");
	ipc_for_each_client(a->daemon->ipc, json_client, &ctx);
	json_arr_close(j);
	json_u64(j, "truncated", ctx.truncated);
	return 0;
}

static int cmd_regions(struct admin *a, struct json *j, int argc, char **argv, char *err,
		       size_t err_size)
{
	struct rdmaxd *d = a->daemon;
	struct owner_map owners = {0};
	struct region *r;
	uint32_t n = 0, truncated = 0;

	ipc_for_each_client(d->ipc, add_owner, &owners);
	json_arr_open(j, "regions");
	for (size_t it = 0; hmap_next(&d->regions.by_id, &it, NULL, (void **)&r);) {
		if (!list_entry_open(j, &n, &truncated)) {
			continue;
		}
		json_u64(j, "id", r->id);
		json_owner(j, &owners, r->owner);
		json_str(j, "kind", region_kind_text(r->kind));
		json_u64(j, "length", r->length);
		json_str(j, "access", access_text(r->access));
		json_bool(j, "writable", r->writable);
		/* One reference is the registration; the others are jobs using it. */
		json_u64(j, "jobs_using", r->refs > 0 ? r->refs - (r->deregistering ? 0 : 1) : 0);
		json_bool(j, "deregistering", r->deregistering);
		json_obj_close(j);
	}
	json_arr_close(j);
	json_u64(j, "truncated", truncated);
	free(owners.items);
	return 0;
}

static void json_conn(void *arg, const struct transport_conn_info *info)
{
	struct conn_list_ctx *ctx = arg;
	struct json *j = ctx->j;

	if (!list_entry_open(j, &ctx->n, &ctx->truncated)) {
		return;
	}
	json_str(j, "transport", ctx->transport);
	json_str(j, "peer", info->peer);
	json_str(j, "node", info->node_name ? info->node_name : "");
	json_str(j, "state", info->state);
	json_str(j, "direction", info->outgoing ? "out" : "in");
	json_u64(j, "in_flight", info->in_flight);
	json_u64(j, "queued", info->queued);
	json_u64(j, "bytes_sent", info->bytes_sent);
	json_u64(j, "bytes_received", info->bytes_received);
	json_u64(j, "idle_ms", info->idle_ms);
	/* Protection domains (per-uid isolation): "local>remote", "" for shared ones. */
	char pd[32] = "";
	if (info->local_domain || info->remote_domain) {
		snprintf(pd, sizeof(pd), "%u>%u", info->local_domain, info->remote_domain);
	}
	json_str(j, "domains", pd);
	json_str(j, "lane", info->latency_lane ? "latency" : "");
	if (info->qps) {
		json_u64(j, "qps", info->qps);
	}
	json_obj_close(j);
}

static int cmd_conns(struct admin *a, struct json *j, int argc, char **argv, char *err,
		     size_t err_size)
{
	struct rdmaxd *d = a->daemon;
	struct conn_list_ctx ctx = {.j = j};
	bool any = false;

	json_arr_open(j, "conns");
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = d->transports[k];
		if (t && t->ops->list_conns) {
			ctx.transport = t->ops->name;
			t->ops->list_conns(t, json_conn, &ctx);
			any = true;
		}
	}
	json_arr_close(j);
	json_u64(j, "truncated", ctx.truncated);
	if (!any) {
		json_str(j, "note", "the running transports do not report their connections");
	}
	return 0;
}

static void json_job(void *arg, const struct engine_job_info *info)
{
	struct list_ctx *ctx = arg;
	struct json *j = ctx->j;

	if (!list_entry_open(j, &ctx->n, &ctx->truncated)) {
		return;
	}
	json_u64(j, "id", info->id);
	json_owner(j, ctx->owners, info->owner);
	json_str(j, "op", info->op == XFER_READ ? "read" : "write");
	json_str(j, "kind", info->kind ? info->kind : info->op == XFER_READ ? "read" : "write");
	json_str(j, "class", qos_class_name(info->traffic_class));
	json_str(j, "state", info->completed ? "completing" : "in-flight");
	if (info->peer) {
		json_endpoint(j, "peer", info->peer);
	} else {
		json_str(j, "peer", "local");
	}
	json_u64(j, "length", info->length);
	json_u64(j, "bytes_done", info->bytes_done);
	json_u64(j, "chunks_in_flight", info->chunks_in_flight);
	json_u64(j, "age_ms", info->age_ms);
	if (info->has_imm) {
		json_u64(j, "imm", info->imm);
	}
	json_obj_close(j);
}

static int cmd_jobs(struct admin *a, struct json *j, int argc, char **argv, char *err,
		    size_t err_size)
{
	struct rdmaxd *d = a->daemon;
	struct owner_map owners = {0};
	struct list_ctx ctx = {.j = j, .owners = &owners};

	ipc_for_each_client(d->ipc, add_owner, &owners);
	json_arr_open(j, "jobs");
	if (d->engine) {
		engine_for_each_job(d->engine, json_job, &ctx);
	}
	json_arr_close(j);
	json_u64(j, "truncated", ctx.truncated);
	json_u64(j, "jobs_in_flight", d->engine ? engine_outstanding(d->engine) : 0);
	free(owners.items);
	return 0;
}

static int cmd_stats(struct admin *a, struct json *j, int argc, char **argv, char *err,
		     size_t err_size)
{
	struct rdmaxd *d = a->daemon;

	if (argc > 1 && strcmp(argv[1], "prometheus") == 0) {
		char *text;
		size_t len;
		int ret = metrics_prometheus(d->metrics, &text, &len);
		if (ret < 0) {
			snprintf(err, err_size, "cannot render the metrics: %s", strerror(-ret));
			return ret;
		}
		json_str(j, "prometheus", text);
		free(text);
		return 0;
	}
	if (argc > 1) {
		snprintf(err, err_size, "unknown stats format '%s' (expected 'prometheus')",
			 argv[1]);
		return -EINVAL;
	}
	json_u64(j, "clients", ipc_client_count(d->ipc));
	json_u64(j, "jobs_in_flight", d->engine ? engine_outstanding(d->engine) : 0);
	metrics_json(d->metrics, j, "counters");
	return 0;
}

static int cmd_config(struct admin *a, struct json *j, int argc, char **argv, char *err,
		      size_t err_size)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f) {
		snprintf(err, err_size, "open_memstream() failed: %s", strerror(errno));
		return -errno;
	}
	config_print(&a->daemon->cfg, f);
	fclose(f);
	json_str(j, "config", text ? text : "");
	free(text);
	return 0;
}

static int cmd_peer_reset(struct admin *a, struct json *j, int argc, char **argv, char *err,
			  size_t err_size)
{
	struct rdmaxd *d = a->daemon;
	bool supported = false;
	int closed = 0;

	if (argc != 2) {
		snprintf(err, err_size, "usage: peer-reset ADDR:PORT|NODE");
		return -EINVAL;
	}
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = d->transports[k];
		if (t && t->ops->reset_peer) {
			supported = true;
			int n = t->ops->reset_peer(t, argv[1]);
			closed += n > 0 ? n : 0;
		}
	}
	if (!supported) {
		snprintf(err, err_size, "the running transports cannot reset connections");
		return -EOPNOTSUPP;
	}
	if (closed == 0) {
		snprintf(err, err_size, "no connection to '%s'", argv[1]);
		return -ENOENT;
	}
	log_notice("admin: closed %d connection%s to '%s'", closed, closed == 1 ? "" : "s",
		   argv[1]);
	json_str(j, "peer", argv[1]);
	json_u64(j, "closed", (uint64_t)closed);
	return 0;
}

static int cmd_resume(struct admin *a, struct json *j, int argc, char **argv, char *err,
		      size_t err_size)
{
	if (a->daemon->draining) {
		log_notice("admin: drain ended; accepting new jobs again");
	}
	a->daemon->draining = false;
	json_bool(j, "draining", false);
	return 0;
}

static int cmd_help(struct admin *a, struct json *j, int argc, char **argv, char *err,
		    size_t err_size);

static const struct command {
	const char *name;
	command_fn fn;
	const char *help;
} g_commands[] = {
	{"status", cmd_status, "daemon summary"},
	{"devices", cmd_devices, "RDMA ports in use, GPUs and their nearest NIC"},
	{"clients", cmd_clients, "connected clients"},
	{"regions", cmd_regions, "registered memory regions"},
	{"conns", cmd_conns, "connections to peer daemons"},
	{"jobs", cmd_jobs, "jobs in flight"},
	{"stats", cmd_stats, "counters; 'stats prometheus' for Prometheus text"},
	{"config", cmd_config, "the effective configuration"},
	{"peer-reset", cmd_peer_reset, "close the connections to a peer (ADDR:PORT or node name)"},
	{"drain", NULL, "refuse new jobs and wait for the outstanding ones [TIMEOUT_MS]"},
	{"resume", cmd_resume, "accept new jobs again after a drain"},
	{"help", cmd_help, "this list"},
};

static int cmd_help(struct admin *a, struct json *j, int argc, char **argv, char *err,
		    size_t err_size)
{
	json_arr_open(j, "commands");
	for (size_t i = 0; i < ARRAY_SIZE(g_commands); i++) {
		json_obj_open(j, NULL);
		json_str(j, "name", g_commands[i].name);
		json_str(j, "help", g_commands[i].help);
		json_obj_close(j);
	}
	json_arr_close(j);
	return 0;
}

/* ------------------------------------------------------------------ drain */

static void drain_reply(struct admin_conn *c, bool done)
{
	struct rdmaxd *d = c->admin->daemon;
	struct json j;

	c->draining = false;
	json_init(&j, c->admin->reply_max);
	json_obj_open(&j, NULL);
	json_bool(&j, "ok", true);
	json_str(&j, "command", "drain");
	json_bool(&j, "drained", done);
	json_bool(&j, "draining", d->draining);
	json_u64(&j, "jobs_in_flight", d->engine ? engine_outstanding(d->engine) : 0);
	json_u64(&j, "waited_ms", now_ms() - c->drain_start_ms);
	json_obj_close(&j);
	send_json(c, &j);
	json_fini(&j);
}

static void drain_tick(uv_timer_t *timer)
{
	struct admin *a = timer->data;
	struct rdmaxd *d = a->daemon;
	struct list_node *pos, *tmp;
	bool waiting = false;
	uint64_t now = now_ms();
	bool done = !d->engine || engine_outstanding(d->engine) == 0;

	list_for_each_safe(pos, tmp, &a->conns)
	{
		struct admin_conn *c = container_of(pos, struct admin_conn, link);
		if (!c->draining) {
			continue;
		}
		if (done || now >= c->drain_deadline_ms || !d->draining) {
			drain_reply(c, done);
		} else {
			waiting = true;
		}
	}
	if (!waiting) {
		uv_timer_stop(timer);
	}
}

static void cmd_drain(struct admin_conn *c, int argc, char **argv)
{
	struct admin *a = c->admin;
	struct rdmaxd *d = a->daemon;
	uint64_t timeout = DRAIN_DEFAULT_MS;

	if (argc > 2) {
		reply_error(c, "INVALID_ARGUMENT", "usage: drain [TIMEOUT_MS]");
		return;
	}
	if (argc == 2) {
		char *end;
		errno = 0;
		timeout = strtoull(argv[1], &end, 10);
		if (errno || *end || end == argv[1] || timeout > 24ull * 3600 * 1000) {
			reply_error(
				c, "INVALID_ARGUMENT",
				"drain timeout '%s' is not a number of milliseconds up to a day",
				argv[1]);
			return;
		}
	}
	if (!d->draining) {
		log_notice("admin: draining: new jobs are refused, %" PRIu64 " in flight",
			   d->engine ? engine_outstanding(d->engine) : 0);
	}
	d->draining = true;
	c->draining = true;
	c->drain_start_ms = now_ms();
	c->drain_deadline_ms = c->drain_start_ms + timeout;
	if (!d->engine || engine_outstanding(d->engine) == 0 || timeout == 0) {
		drain_reply(c, !d->engine || engine_outstanding(d->engine) == 0);
		return;
	}
	if (!uv_is_active((uv_handle_t *)&a->drain_timer)) {
		uv_timer_start(&a->drain_timer, drain_tick, DRAIN_POLL_MS, DRAIN_POLL_MS);
	}
}

/* --------------------------------------------------------------- requests */

static void handle_request(struct admin_conn *c, char *line)
{
	struct admin *a = c->admin;
	char *argv[ADMIN_ARGS_MAX];
	char err[256] = "";
	int argc = 0;
	char *save = NULL;
	struct json j;

	for (char *tok = strtok_r(line, " \t\r\n", &save); tok;
	     tok = strtok_r(NULL, " \t\r\n", &save)) {
		if (argc == ADMIN_ARGS_MAX) {
			reply_error(c, "INVALID_ARGUMENT", "too many words in the request");
			return;
		}
		argv[argc++] = tok;
	}
	if (argc == 0) {
		reply_error(c, "INVALID_ARGUMENT", "empty request; try 'help'");
		return;
	}
	if (c->draining) {
		reply_error(c, "INVALID_ARGUMENT", "a drain is in progress on this connection");
		return;
	}
	if (strcmp(argv[0], "drain") == 0) {
		cmd_drain(c, argc, argv);
		return;
	}
	for (size_t i = 0; i < ARRAY_SIZE(g_commands); i++) {
		if (!g_commands[i].fn || strcmp(argv[0], g_commands[i].name) != 0) {
			continue;
		}
		json_init(&j, a->reply_max);
		json_obj_open(&j, NULL);
		json_bool(&j, "ok", true);
		json_str(&j, "command", argv[0]);
		int ret = g_commands[i].fn(a, &j, argc, argv, err, sizeof(err));
		json_obj_close(&j);
		if (ret < 0) {
			json_fini(&j);
			reply_error(c,
				    ret == -ENOENT       ? "NOT_FOUND"
				    : ret == -EOPNOTSUPP ? "UNIMPLEMENTED"
				    : ret == -EINVAL     ? "INVALID_ARGUMENT"
							 : "INTERNAL",
				    "%s", err[0] ? err : strerror(-ret));
			return;
		}
		send_json(c, &j);
		json_fini(&j);
		return;
	}
	reply_error(c, "INVALID_ARGUMENT", "unknown command '%.64s'; try 'help'", argv[0]);
}

static void conn_freed(uv_handle_t *handle)
{
	struct admin_conn *c = handle->data;

	free(c->pending);
	free(c);
}

static void conn_close(struct admin_conn *c)
{
	if (c->closing) {
		return;
	}
	c->closing = true;
	list_del(&c->link);
	c->admin->n_conns--;
	uv_poll_stop(&c->poll);
	close(c->fd);
	c->fd = -1;
	uv_close((uv_handle_t *)&c->poll, conn_freed);
}

static void conn_io(uv_poll_t *poll, int status, int events)
{
	struct admin_conn *c = poll->data;
	char buf[ADMIN_REQUEST_MAX + 1];

	if (status < 0) {
		conn_close(c);
		return;
	}
	if ((events & UV_WRITABLE) && c->pending) {
		ssize_t n = send(c->fd, c->pending, c->pending_len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			conn_close(c);
			return;
		}
		if (n >= 0) {
			free(c->pending);
			c->pending = NULL;
			uv_poll_start(&c->poll, UV_READABLE, conn_io);
		}
	}
	/* Bounded; a request waits while the previous reply is still queued. */
	for (int i = 0; i < 8 && !c->closing && !c->pending && (events & UV_READABLE); i++) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				conn_close(c);
			}
			return;
		}
		if (n == 0) {
			conn_close(c);
			return;
		}
		c->last_ms = now_ms();
		if ((size_t)n > ADMIN_REQUEST_MAX) {
			reply_error(c, "INVALID_ARGUMENT", "request longer than %d bytes",
				    ADMIN_REQUEST_MAX);
			continue;
		}
		buf[n] = '\0';
		if (memchr(buf, '\0', (size_t)n)) {
			reply_error(c, "INVALID_ARGUMENT", "request contains a NUL byte");
			continue;
		}
		handle_request(c, buf);
	}
}

static bool in_group(struct admin *a, int fd, const struct ucred *cred)
{
	gid_t stack_groups[128];
	gid_t *groups = stack_groups;
	socklen_t len = sizeof(stack_groups);
	bool found = false;

	if (!a->have_group) {
		return false;
	}
	if (cred->gid == a->group) {
		return true;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) {
		if (errno != ERANGE) {
			return false;
		}
		groups = malloc(len);
		if (!groups || getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) {
			free(groups);
			return false;
		}
	}
	for (size_t i = 0; i < len / sizeof(gid_t); i++) {
		found = found || groups[i] == a->group;
	}
	if (groups != stack_groups) {
		free(groups);
	}
	return found;
}

static void deny(int fd, const char *code, const char *text)
{
	char buf[ADMIN_REQUEST_MAX];
	struct json j;
	const char *doc;
	size_t len;

	json_init(&j, 4096);
	json_obj_open(&j, NULL);
	json_bool(&j, "ok", false);
	json_str(&j, "code", code);
	json_str(&j, "error", text);
	json_obj_close(&j);
	if (json_finish(&j, &doc, &len) == 0) {
		(void)send(fd, doc, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	json_fini(&j);
	/* Closing with a request unread resets the peer before it reads the refusal. */
	for (int i = 0; i < 4 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++) {
	}
	close(fd);
}

static void on_accept(uv_poll_t *poll, int status, int events)
{
	struct admin *a = poll->data;

	if (status < 0) {
		log_ratelimited(&a->rl, LOG_ERR, "admin socket poll failed: %s",
				uv_strerror(status));
		return;
	}
	for (int i = 0; i < 16; i++) {
		struct ucred cred;
		socklen_t cred_len = sizeof(cred);
		char text[256];
		int fd = accept4(a->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			int err = errno;
			if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
				bool paused = listen_backoff_failed(&a->backoff, err);
				log_ratelimited(&a->rl, LOG_ERR, "accept4() on '%s' failed: %s%s",
						a->path, strerror(err),
						paused ? "; accepting paused" : "");
			}
			return;
		}
		listen_backoff_ok(&a->backoff);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) < 0) {
			deny(fd, "INTERNAL", "cannot read the peer's credentials");
			continue;
		}
		if (cred.uid != 0 && cred.uid != geteuid() && !in_group(a, fd, &cred)) {
			snprintf(text, sizeof(text),
				 "permission denied: uid %u is not root, not the daemon's user and "
				 "not in group '%s'",
				 (unsigned)cred.uid, a->daemon->cfg.admin_group);
			log_ratelimited(
				&a->rl, LOG_NOTICE,
				"admin: refused pid %d uid %u (not root, not in group '%s')",
				(int)cred.pid, (unsigned)cred.uid, a->daemon->cfg.admin_group);
			deny(fd, "PERMISSION_DENIED", text);
			continue;
		}
		if (a->n_conns >= a->daemon->cfg.admin_max_connections || !a->listening) {
			log_ratelimited(&a->rl, LOG_WARNING,
					"admin: refused pid %d uid %u: %u connections open "
					"([limits] admin_max_connections)",
					(int)cred.pid, (unsigned)cred.uid, a->n_conns);
			deny(fd, "RESOURCE_EXHAUSTED", "too many admin connections; try again");
			continue;
		}
		struct admin_conn *c = calloc(1, sizeof(*c));
		if (!c) {
			deny(fd, "RESOURCE_EXHAUSTED", "out of memory");
			continue;
		}
		int sndbuf = ADMIN_SNDBUF;
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		c->admin = a;
		c->fd = fd;
		c->pid = (int)cred.pid;
		c->uid = (uint32_t)cred.uid;
		c->last_ms = now_ms();
		uv_poll_init(a->daemon->loop, &c->poll, fd);
		c->poll.data = c;
		uv_poll_start(&c->poll, UV_READABLE, conn_io);
		list_add_tail(&a->conns, &c->link);
		a->n_conns++;
	}
}

/* Connections that said nothing for admin_idle_timeout_ms go (a drain waiting is not idle). */
static void close_idle(uv_timer_t *timer)
{
	struct admin *a = timer->data;
	uint64_t now = now_ms(), limit = a->daemon->cfg.admin_idle_timeout_ms;
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &a->conns)
	{
		struct admin_conn *c = container_of(pos, struct admin_conn, link);
		if (!c->draining && now - c->last_ms >= limit) {
			log_debug("admin: closing the connection of pid %d: idle for %" PRIu64
				  " ms",
				  c->pid, now - c->last_ms);
			conn_close(c);
		}
	}
}

/* ------------------------------------------------------------- life cycle */

/* Refuse to steal the socket of a running daemon; remove a stale one. */
static int prepare_path(const char *path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, live;

	if (lstat(path, &st) < 0) {
		return errno == ENOENT ? 0 : -errno;
	}
	if (!S_ISSOCK(st.st_mode)) {
		return -EEXIST;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		return -errno;
	}
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	live = connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
	close(fd);
	if (live) {
		return -EADDRINUSE;
	}
	return unlink(path) < 0 ? -errno : 0;
}

int admin_path_for(const struct config *cfg, char *buf, size_t size)
{
	const char *client = cfg->socket_path;
	size_t len = strlen(client);

	if (strcmp(cfg->admin_socket_path, ADMIN_DEFAULT_PATH) != 0 ||
	    strcmp(client, RDMAX_DEFAULT_SOCKET) == 0) {
		return copy_string(buf, size, cfg->admin_socket_path);
	}
	if (len > 5 && strcmp(client + len - 5, ".sock") == 0) {
		len -= 5;
	}
	if ((size_t)snprintf(buf, size, "%.*s-admin.sock", (int)len, client) >= size) {
		return -ENAMETOOLONG;
	}
	return 0;
}

static int bind_socket(struct admin *a)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int ret;

	ret = prepare_path(a->path);
	if (ret < 0) {
		log_err("cannot use admin socket path '%s': %s", a->path,
			ret == -EADDRINUSE ? "another daemon is listening on it"
			: ret == -EEXIST   ? "a file that is not a socket is in the way"
					   : strerror(-ret));
		return ret;
	}
	a->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (a->listen_fd < 0) {
		ret = -errno;
		log_err("socket(AF_UNIX, SOCK_SEQPACKET) failed: %s", strerror(errno));
		return ret;
	}
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", a->path);
	if (bind(a->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		ret = -errno;
		log_err("bind() to '%s' failed: %s", a->path, strerror(errno));
		goto out_close;
	}
	/* Owner and group only; the daemon checks every peer again anyway. */
	if (a->have_group && chown(a->path, (uid_t)-1, a->group) < 0) {
		log_warn("chown() of '%s' to group '%s' failed: %s", a->path,
			 a->daemon->cfg.admin_group, strerror(errno));
	}
	if (chmod(a->path, 0660) < 0) {
		log_warn("chmod() of '%s' failed: %s", a->path, strerror(errno));
	}
	if (listen(a->listen_fd, 16) < 0) {
		ret = -errno;
		log_err("listen() on '%s' failed: %s", a->path, strerror(errno));
		goto out_unlink;
	}
	return 0;

out_unlink:
	unlink(a->path);
out_close:
	close(a->listen_fd);
	a->listen_fd = -1;
	return ret;
}

int admin_create(struct rdmaxd *daemon, struct admin **ret_admin)
{
	struct admin *a;
	struct group grp, *found = NULL;
	char grbuf[4096];
	int sndbuf = ADMIN_SNDBUF;
	socklen_t optlen = sizeof(sndbuf);
	int probe, ret;

	a = calloc(1, sizeof(*a));
	if (!a) {
		return -ENOMEM;
	}
	a->daemon = daemon;
	a->listen_fd = -1;
	list_init(&a->conns);
	if (getgrnam_r(a->daemon->cfg.admin_group, &grp, grbuf, sizeof(grbuf), &found) == 0 &&
	    found) {
		a->have_group = true;
		a->group = grp.gr_gid;
	}
	/* The largest datagram a reply can be: what the kernel grants for SO_SNDBUF. */
	probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (probe >= 0) {
		setsockopt(probe, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		if (getsockopt(probe, SOL_SOCKET, SO_SNDBUF, &sndbuf, &optlen) < 0) {
			sndbuf = 212992;
		}
		close(probe);
	}
	a->reply_max = sndbuf > 4096 ? (size_t)sndbuf - 1024 : 4096;

	if (daemon->admin_listen_fd > 0) {
		a->listen_fd = daemon->admin_listen_fd;
		a->inherited = true;
		ret = copy_string(a->path, sizeof(a->path), daemon->cfg.admin_socket_path);
	} else {
		ret = admin_path_for(&daemon->cfg, a->path, sizeof(a->path));
		if (ret < 0) {
			log_err("admin socket path derived from '%s' is too long",
				daemon->cfg.socket_path);
			goto out_free;
		}
		ret = bind_socket(a);
	}
	if (ret < 0) {
		goto out_free;
	}
	uv_poll_init(daemon->loop, &a->listen_poll, a->listen_fd);
	a->listen_poll.data = a;
	uv_poll_start(&a->listen_poll, UV_READABLE, on_accept);
	listen_backoff_init(&a->backoff, daemon->loop, &a->listen_poll, on_accept);
	uv_timer_init(daemon->loop, &a->drain_timer);
	a->drain_timer.data = a;
	uv_timer_init(daemon->loop, &a->idle_timer);
	a->idle_timer.data = a;
	uint64_t sweep = MAX(daemon->cfg.admin_idle_timeout_ms / 4, 25);
	uv_timer_start(&a->idle_timer, close_idle, sweep, sweep);
	uv_unref((uv_handle_t *)&a->idle_timer);
	a->listening = true;
	log_info("admin socket '%s'%s; admin group '%s'%s", a->path,
		 a->inherited ? " (from the service manager)" : "", a->daemon->cfg.admin_group,
		 a->have_group ? "" : " does not exist (root and the daemon's user only)");
	*ret_admin = a;
	return 0;

out_free:
	free(a);
	return ret;
}

void admin_shutdown(struct admin *admin)
{
	struct list_node *pos, *tmp;

	if (!admin || !admin->listening) {
		return;
	}
	admin->listening = false;
	uv_poll_stop(&admin->listen_poll);
	uv_close((uv_handle_t *)&admin->listen_poll, NULL);
	listen_backoff_close(&admin->backoff, NULL);
	uv_timer_stop(&admin->drain_timer);
	uv_close((uv_handle_t *)&admin->drain_timer, NULL);
	uv_timer_stop(&admin->idle_timer);
	uv_close((uv_handle_t *)&admin->idle_timer, NULL);
	close(admin->listen_fd);
	if (!admin->inherited) {
		unlink(admin->path);
	}
	list_for_each_safe(pos, tmp, &admin->conns)
	{
		struct admin_conn *c = container_of(pos, struct admin_conn, link);
		if (c->draining) {
			drain_reply(c, admin->daemon->engine &&
					       engine_outstanding(admin->daemon->engine) == 0);
		}
		conn_close(c);
	}
}

void admin_destroy(struct admin *admin)
{
	free(admin);
}

const char *admin_socket_path(const struct admin *admin)
{
	return admin ? admin->path : "";
}
