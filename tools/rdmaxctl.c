/* SPDX-License-Identifier: MIT */
/*
 * rdmaxctl: ask a running rdmaxd what it is doing, and check a node for what
 * commonly breaks RDMA set-ups (rdmaxctl doctor).
 *
 * Talks to the daemon's admin socket: one command line per request datagram,
 * one JSON document per reply. The reply is parsed once and printed either
 * as it came (--json, for scripts) or as tables for people, so both outputs
 * come from the same data. `nodes` and `lookup` speak the client protocol
 * through librdmax on the client socket instead.
 *
 * Exit status: 0 success, 1 the daemon answered with an error (or doctor
 * found a problem), 2 usage or connection error.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "rdmax.h"

#define DEFAULT_ADMIN_SOCKET  "/run/rdmaxd-admin.sock"
#define DEFAULT_CLIENT_SOCKET "/run/rdmaxd.sock"
#define ADMIN_GROUP           "rdmaxd-admin"
#define REPLY_MAX             (8u << 20)
#define REQUEST_MAX           1024
#define TIMEOUT_MS            10000
#define VERSION               "0.1.0"

enum exit_code {
	EXIT_OK = 0,     /* success */
	EXIT_DAEMON = 1, /* the daemon reported an error, or the node is unhealthy */
	EXIT_USAGE = 2,  /* bad command line or cannot reach the daemon */
};

/* ------------------------------------------------------------------ JSON */

/* Readers over a parsed reply (libjansson); a missing or mistyped member reads as the default. */
static const json_t *jget(const json_t *obj, const char *key)
{
	return json_is_object(obj) ? json_object_get(obj, key) : NULL;
}

static const char *jstr(const json_t *obj, const char *key, const char *def)
{
	const json_t *v = jget(obj, key);
	return json_is_string(v) ? json_string_value(v) : def;
}

static uint64_t ju64(const json_t *obj, const char *key, uint64_t def)
{
	const json_t *v = jget(obj, key);
	return json_is_integer(v) ? (uint64_t)json_integer_value(v) : def;
}

static bool jbool(const json_t *obj, const char *key, bool def)
{
	const json_t *v = jget(obj, key);
	return json_is_boolean(v) ? json_is_true(v) : def;
}

/* Items of an array member: 0 for anything that is not an array. */
static size_t jlen(const json_t *v)
{
	return json_is_array(v) ? json_array_size(v) : 0;
}

static const json_t *jat(const json_t *v, size_t i)
{
	return json_array_get(v, i);
}

/* A value as text for a table cell. */
static void jtext(const json_t *v, char *buf, size_t size)
{
	switch (v ? json_typeof(v) : JSON_NULL) {
	case JSON_TRUE:
	case JSON_FALSE:
		snprintf(buf, size, "%s", json_is_true(v) ? "yes" : "no");
		break;
	case JSON_INTEGER:
		snprintf(buf, size, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		break;
	case JSON_REAL:
		snprintf(buf, size, "%g", json_real_value(v));
		break;
	case JSON_STRING:
		snprintf(buf, size, "%s", json_string_value(v));
		break;
	case JSON_ARRAY:
		snprintf(buf, size, "[%zu]", json_array_size(v));
		break;
	case JSON_OBJECT:
		snprintf(buf, size, "{...}");
		break;
	default:
		snprintf(buf, size, "-");
		break;
	}
}

/* --------------------------------------------------------------- transport */

struct ctl {
	const char *socket_path;
	const char *client_socket; /* --client-socket, for nodes and lookup */
	bool json;
	bool socket_given;
};

static int g_last_errno;

static int connect_admin(const char *path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd;

	if (strlen(path) >= sizeof(addr.sun_path)) {
		g_last_errno = ENAMETOOLONG;
		return -ENAMETOOLONG;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		g_last_errno = errno;
		return -errno;
	}
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		int err = errno;
		close(fd);
		g_last_errno = err;
		return -err;
	}
	return fd;
}

static void explain_connect_error(const char *path, int err)
{
	switch (err) {
	case ENOENT:
		fprintf(stderr,
			"rdmaxctl: admin socket '%s' does not exist: is rdmaxd running? "
			"(systemctl status rdmaxd; or pass --socket)\n",
			path);
		break;
	case EACCES:
	case EPERM:
		fprintf(stderr,
			"rdmaxctl: permission denied on '%s': run as root or as a member of group "
			"'%s'\n",
			path, ADMIN_GROUP);
		break;
	case ECONNREFUSED:
		fprintf(stderr, "rdmaxctl: nobody listens on '%s': rdmaxd is not running\n", path);
		break;
	default:
		fprintf(stderr, "rdmaxctl: cannot connect to '%s': %s\n", path, strerror(err));
		break;
	}
}

/*
 * One request, one reply. Returns the raw reply (malloc'd, NUL-terminated)
 * in *ret_text and its parse in *ret (json_decref it); 0, or -errno (message printed).
 */
static int request(const struct ctl *ctl, const char *line, int timeout_ms, char **ret_text,
		   json_t **ret)
{
	struct pollfd pfd;
	json_error_t perr;
	json_t *doc;
	char *buf;
	ssize_t n;
	int fd, ret_code;

	fd = connect_admin(ctl->socket_path);
	if (fd < 0) {
		explain_connect_error(ctl->socket_path, -fd);
		return fd;
	}
	buf = malloc(REPLY_MAX + 1);
	if (!buf) {
		close(fd);
		fprintf(stderr, "rdmaxctl: out of memory\n");
		return -ENOMEM;
	}
	/*
	 * A refused peer finds the socket closed at once; the refusal is already
	 * queued for it, so read it instead of reporting the broken pipe.
	 */
	if (send(fd, line, strlen(line), MSG_NOSIGNAL) < 0 && errno != EPIPE &&
	    errno != ECONNRESET) {
		ret_code = -errno;
		fprintf(stderr, "rdmaxctl: send() to '%s' failed: %s\n", ctl->socket_path,
			strerror(errno));
		goto out_free;
	}
	pfd.fd = fd;
	pfd.events = POLLIN;
	int pr;
	do {
		pr = poll(&pfd, 1, timeout_ms);
	} while (pr < 0 && errno == EINTR);
	if (pr == 0) {
		ret_code = -ETIMEDOUT;
		fprintf(stderr, "rdmaxctl: no reply from '%s' within %d ms\n", ctl->socket_path,
			timeout_ms);
		goto out_free;
	}
	n = recv(fd, buf, REPLY_MAX, MSG_TRUNC);
	if (n < 0 && errno == ECONNRESET) {
		/*
		 * The daemon closed with our request unread (it refused us): the
		 * error is reported once, then the queued refusal can be read.
		 */
		n = recv(fd, buf, REPLY_MAX, MSG_TRUNC | MSG_DONTWAIT);
		if (n < 0) {
			errno = ECONNRESET;
		}
	}
	if (n < 0) {
		ret_code = -errno;
		fprintf(stderr, "rdmaxctl: recv() from '%s' failed: %s\n", ctl->socket_path,
			strerror(errno));
		goto out_free;
	}
	if (n == 0) {
		ret_code = -ECONNRESET;
		fprintf(stderr, "rdmaxctl: the daemon closed the connection without a reply\n");
		goto out_free;
	}
	if ((size_t)n > REPLY_MAX) {
		ret_code = -EMSGSIZE;
		fprintf(stderr, "rdmaxctl: reply of %zd bytes is larger than %u\n", n, REPLY_MAX);
		goto out_free;
	}
	buf[n] = '\0';
	doc = json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, &perr);
	if (!doc) {
		ret_code = -EBADMSG;
		fprintf(stderr, "rdmaxctl: the daemon's reply is not valid JSON: %s\n", perr.text);
		goto out_free;
	}
	close(fd);
	*ret_text = buf;
	*ret = doc;
	return 0;

out_free:
	free(buf);
	close(fd);
	return ret_code;
}

/* ------------------------------------------------------------------ tables */

/* How a column's value is shown. */
enum col_fmt {
	F_TEXT,  /* as it is */
	F_BYTES, /* 1.5 MiB */
	F_MS,    /* 1.2 s */
	F_FMT_MAX,
};

struct column {
	const char *key;
	const char *header;
	enum col_fmt fmt;
};

static void human_bytes(uint64_t v, char *buf, size_t size)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double d = (double)v;
	size_t u = 0;

	while (d >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		d /= 1024;
		u++;
	}
	if (u == 0) {
		snprintf(buf, size, "%" PRIu64 " B", v);
	} else {
		snprintf(buf, size, "%.1f %s", d, units[u]);
	}
}

static void cell(const json_t *row, const struct column *col, char *buf, size_t size)
{
	const json_t *v = jget(row, col->key);

	if (json_is_number(v) && col->fmt == F_BYTES) {
		human_bytes((uint64_t)json_number_value(v), buf, size);
	} else if (json_is_number(v) && col->fmt == F_MS) {
		double ms = json_number_value(v);
		if (ms < 1000) {
			snprintf(buf, size, "%.0f ms", ms);
		} else {
			snprintf(buf, size, "%.1f s", ms / 1000);
		}
	} else {
		jtext(v, buf, size);
	}
}

#define CELL_MAX 96
#define COLS_MAX 16

static void print_table(const json_t *rows, const struct column *cols, size_t n_cols,
			const char *empty)
{
	size_t width[COLS_MAX];
	char buf[CELL_MAX];

	if (jlen(rows) == 0) {
		printf("%s\n", empty);
		return;
	}
	for (size_t c = 0; c < n_cols; c++) {
		width[c] = strlen(cols[c].header);
		for (size_t r = 0; r < jlen(rows); r++) {
			cell(jat(rows, r), &cols[c], buf, sizeof(buf));
			width[c] = strlen(buf) > width[c] ? strlen(buf) : width[c];
		}
	}
	for (size_t c = 0; c < n_cols; c++) {
		printf("%-*s%s", (int)width[c], cols[c].header, c + 1 < n_cols ? "  " : "\n");
	}
	for (size_t r = 0; r < jlen(rows); r++) {
		for (size_t c = 0; c < n_cols; c++) {
			cell(jat(rows, r), &cols[c], buf, sizeof(buf));
			printf("%-*s%s", (int)width[c], buf, c + 1 < n_cols ? "  " : "\n");
		}
	}
}

static void print_truncated(const json_t *reply)
{
	uint64_t t = ju64(reply, "truncated", 0);

	if (t) {
		printf("(%" PRIu64 " more not shown)\n", t);
	}
}

static void kv(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void kv(const char *key, const char *fmt, ...)
{
	va_list ap;

	printf("%-20s ", key);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

static void show_status(const json_t *r)
{
	char b1[32], b2[32];
	const json_t *tr = jget(r, "transports");

	kv("node", "%s (rdmaxd %s, pid %" PRIu64 ", up %" PRIu64 " s)", jstr(r, "node", "?"),
	   jstr(r, "version", "?"), ju64(r, "pid", 0), ju64(r, "uptime_s", 0));
	kv("state", "%s", jstr(r, "state", "?"));
	for (size_t i = 0; i < jlen(tr); i++) {
		const json_t *eps = jget(jat(tr, i), "endpoints");
		char text[256] = "";
		size_t used = 0;
		for (size_t e = 0; e < jlen(eps); e++) {
			int w = snprintf(text + used, sizeof(text) - used, "%s%s:%" PRIu64 "%s%s",
					 e ? ", " : "", jstr(jat(eps, e), "addr", "?"),
					 ju64(jat(eps, e), "port", 0),
					 jget(jat(eps, e), "device") ? " on " : "",
					 jstr(jat(eps, e), "device", ""));
			used += w > 0 && (size_t)w < sizeof(text) - used ? (size_t)w : 0;
		}
		kv("transport", "%s %s", jstr(jat(tr, i), "name", "?"), text);
	}
	const json_t *disc = jget(r, "discovery");
	kv("discovery",
	   "%s, %s: %" PRIu64 " nodes alive, %" PRIu64 " lost; %" PRIu64
	   " names published, lookups %" PRIu64 " ok / %" PRIu64 " failed",
	   jstr(disc, "backend", "none"), jstr(disc, "state", "off"), ju64(disc, "nodes_alive", 0),
	   ju64(disc, "nodes_lost", 0), ju64(disc, "names", 0), ju64(disc, "lookups_ok", 0),
	   ju64(disc, "lookups_failed", 0));
	kv("client socket", "%s%s", jstr(r, "socket", "?"),
	   jbool(r, "socket_activated", false) ? " (socket-activated)" : "");
	kv("admin socket", "%s", jstr(r, "admin_socket", "?"));
	kv("authentication", "%s", jbool(r, "authentication", false) ? "on" : "off");
	kv("tcp encryption", "%s", jbool(r, "tcp_encryption", false) ? "on (TLS 1.3)" : "off");
	kv("log level", "%s", jstr(r, "log_level", "?"));
	kv("clients", "%" PRIu64, ju64(r, "clients", 0));
	human_bytes(ju64(r, "registered_bytes", 0), b1, sizeof(b1));
	kv("regions", "%" PRIu64 " (%s)", ju64(r, "regions", 0), b1);
	kv("connections", "%" PRIu64 " (%" PRIu64 " ready)", ju64(r, "connections", 0),
	   ju64(r, "connections_ready", 0));
	kv("jobs in flight", "%" PRIu64, ju64(r, "jobs_in_flight", 0));
	human_bytes(ju64(r, "bytes_total", 0), b2, sizeof(b2));
	kv("jobs completed", "%" PRIu64 " (%s)", ju64(r, "jobs_total", 0), b2);
}

static void show_devices(const json_t *r)
{
	static const struct column port_cols[] = {
		{"device", "DEVICE", F_TEXT},  {"port", "PORT", F_TEXT},
		{"state", "STATE", F_TEXT},    {"link_layer", "LINK", F_TEXT},
		{"active_mtu", "MTU", F_TEXT}, {"netdev", "NETDEV", F_TEXT},
		{"dmabuf", "DMA-BUF", F_TEXT}, {"peermem", "PEERMEM", F_TEXT},
	};
	static const struct column gpu_cols[] = {
		{"pci", "GPU", F_TEXT},
		{"nearest_nic", "NEAREST NIC", F_TEXT},
		{"relation", "PATH", F_TEXT},
	};
	const json_t *ports = jget(r, "ports");
	const json_t *present = jget(r, "rdma_devices_present");

	if (jstr(r, "note", NULL)) {
		printf("%s\n", jstr(r, "note", ""));
	}
	print_table(ports, port_cols, sizeof(port_cols) / sizeof(port_cols[0]),
		    "no RDMA ports in use");
	for (size_t i = 0; i < jlen(ports); i++) {
		const json_t *gids = jget(jat(ports, i), "gids");
		for (size_t g = 0; g < jlen(gids); g++) {
			printf("  %s/%" PRIu64 " gid[%" PRIu64 "] %s (%s)\n",
			       jstr(jat(ports, i), "device", "?"), ju64(jat(ports, i), "port", 0),
			       ju64(jat(gids, g), "index", 0), jstr(jat(gids, g), "gid", "?"),
			       jstr(jat(gids, g), "type", "?"));
		}
	}
	printf("\nRDMA devices on this node:");
	for (size_t i = 0; i < jlen(present); i++) {
		printf(" %s", jstr(jat(present, i), "name", "?"));
	}
	printf("%s\n", jlen(present) ? "" : " none");
	printf("nvidia_peermem loaded: %s\n\n", jbool(r, "peermem", false) ? "yes" : "no");
	print_table(jget(r, "gpus"), gpu_cols, sizeof(gpu_cols) / sizeof(gpu_cols[0]),
		    "no NVIDIA GPUs found");
}

static void show_clients(const json_t *r)
{
	static const struct column cols[] = {
		{"id", "ID", F_TEXT},
		{"name", "NAME", F_TEXT},
		{"pid", "PID", F_TEXT},
		{"uid", "UID", F_TEXT},
		{"regions", "REGIONS", F_TEXT},
		{"registered_bytes", "REGISTERED", F_BYTES},
		{"jobs_outstanding", "OUTSTANDING", F_TEXT},
		{"jobs_ok", "OK", F_TEXT},
		{"jobs_failed", "FAILED", F_TEXT},
		{"bytes", "MOVED", F_BYTES},
	};
	print_table(jget(r, "clients"), cols, sizeof(cols) / sizeof(cols[0]), "no clients");
	print_truncated(r);
}

static void show_regions(const json_t *r)
{
	static const struct column cols[] = {
		{"id", "ID", F_TEXT},           {"client", "CLIENT", F_TEXT},
		{"client_id", "CID", F_TEXT},   {"kind", "KIND", F_TEXT},
		{"length", "LENGTH", F_BYTES},  {"access", "ACCESS", F_TEXT},
		{"jobs_using", "JOBS", F_TEXT}, {"deregistering", "DEREG", F_TEXT},
	};
	print_table(jget(r, "regions"), cols, sizeof(cols) / sizeof(cols[0]), "no regions");
	print_truncated(r);
}

static void show_conns(const json_t *r)
{
	static const struct column cols[] = {
		{"transport", "TRANSPORT", F_TEXT},
		{"peer", "PEER", F_TEXT},
		{"node", "NODE", F_TEXT},
		{"direction", "DIR", F_TEXT},
		{"state", "STATE", F_TEXT},
		{"in_flight", "IN FLIGHT", F_TEXT},
		{"queued", "QUEUED", F_TEXT},
		{"bytes_sent", "SENT", F_BYTES},
		{"bytes_received", "RECEIVED", F_BYTES},
		{"idle_ms", "IDLE", F_MS},
		{"domains", "PD", F_TEXT},
		{"lane", "LANE", F_TEXT},
	};
	if (jstr(r, "note", NULL)) {
		printf("%s\n", jstr(r, "note", ""));
	}
	print_table(jget(r, "conns"), cols, sizeof(cols) / sizeof(cols[0]), "no connections");
	print_truncated(r);
}

static void show_jobs(const json_t *r)
{
	static const struct column cols[] = {
		{"id", "JOB", F_TEXT},           {"client", "CLIENT", F_TEXT},
		{"client_id", "CID", F_TEXT},    {"op", "OP", F_TEXT},
		{"class", "CLASS", F_TEXT},      {"state", "STATE", F_TEXT},
		{"peer", "PEER", F_TEXT},        {"length", "LENGTH", F_BYTES},
		{"bytes_done", "DONE", F_BYTES}, {"age_ms", "AGE", F_MS},
	};
	print_table(jget(r, "jobs"), cols, sizeof(cols) / sizeof(cols[0]), "no jobs in flight");
	print_truncated(r);
}

static void show_stats(const json_t *r)
{
	static const struct column job_cols[] = {
		{"op", "OP", F_TEXT},
		{"status", "STATUS", F_TEXT},
		{"jobs", "JOBS", F_TEXT},
		{"bytes", "BYTES", F_BYTES},
	};
	static const struct column peer_cols[] = {
		{"peer", "PEER", F_TEXT},
		{"write_ok", "WRITE OK", F_TEXT},
		{"write_failed", "WRITE ERR", F_TEXT},
		{"write_bytes", "WRITTEN", F_BYTES},
		{"read_ok", "READ OK", F_TEXT},
		{"read_failed", "READ ERR", F_TEXT},
		{"read_bytes", "READ", F_BYTES},
	};
	const json_t *c = jget(r, "counters");
	const json_t *lat = jget(c, "latency");
	const json_t *ev = jget(c, "connection_events");
	char b[32];

	human_bytes(ju64(c, "bytes_total", 0), b, sizeof(b));
	kv("jobs completed", "%" PRIu64 " (%s)", ju64(c, "jobs_total", 0), b);
	kv("local jobs", "%" PRIu64, ju64(c, "local_jobs_total", 0));
	kv("jobs in flight", "%" PRIu64, ju64(r, "jobs_in_flight", 0));
	kv("clients", "%" PRIu64, ju64(r, "clients", 0));
	human_bytes(ju64(c, "registered_bytes", 0), b, sizeof(b));
	kv("regions", "%" PRIu64 " (%s; %" PRIu64 " registered since start)", ju64(c, "regions", 0),
	   b, ju64(c, "registrations_total", 0));
	kv("imm", "%" PRIu64 " writes, %" PRIu64 " expectations fired, %" PRIu64 " dropped",
	   ju64(c, "imm_writes_total", 0), ju64(c, "imm_fired_total", 0),
	   ju64(c, "imm_dropped_total", 0));
	kv("ring notifies", "%" PRIu64 " sent, %" PRIu64 " spared (completions already read)",
	   ju64(c, "ring_notifies_total", 0), ju64(c, "ring_notifies_spared_total", 0));
	for (size_t i = 0; i < jlen(lat); i++) {
		const json_t *mean = jget(jat(lat, i), "mean_s");
		char key[32];
		snprintf(key, sizeof(key), "%s latency", jstr(jat(lat, i), "op", "?"));
		kv(key, "%" PRIu64 " jobs, mean %.3f ms", ju64(jat(lat, i), "count", 0),
		   json_is_number(mean) ? json_number_value(mean) * 1000 : 0.0);
	}
	const json_t *qos = jget(c, "qos");
	const json_t *classes = jget(qos, "classes");
	if (qos) {
		kv("qos",
		   "%s (default class %s, %" PRIu64 " chunks in flight at most, %" PRIu64
		   " kept for latency)",
		   jbool(qos, "enabled", false) ? "on" : "off", jstr(qos, "default_class", "?"),
		   ju64(qos, "max_in_flight", 0), ju64(qos, "latency_reserve", 0));
	}
	for (size_t i = 0; i < jlen(classes); i++) {
		const json_t *cl = jat(classes, i);
		const json_t *p50 = jget(cl, "p50_le_s"), *p99 = jget(cl, "p99_le_s");
		char key[32];
		human_bytes(ju64(cl, "bytes", 0), b, sizeof(b));
		snprintf(key, sizeof(key), "class %s", jstr(cl, "class", "?"));
		kv(key,
		   "weight %" PRIu64 ", %" PRIu64 " ok, %" PRIu64 " failed (%s), p50 <= %.3f ms, "
		   "p99 <= %.3f ms, %" PRIu64 " chunks in flight, %" PRIu64 " jobs waiting",
		   ju64(cl, "weight", 0), ju64(cl, "jobs_ok", 0), ju64(cl, "jobs_failed", 0), b,
		   json_is_number(p50) ? json_number_value(p50) * 1000 : 0.0,
		   json_is_number(p99) ? json_number_value(p99) * 1000 : 0.0,
		   ju64(cl, "chunks_in_flight", 0), ju64(cl, "jobs_waiting", 0));
	}
	for (size_t i = 0; i < jlen(ev); i++) {
		char key[48];
		snprintf(key, sizeof(key), "%s connections %s", jstr(jat(ev, i), "transport", "?"),
			 jstr(jat(ev, i), "event", "?"));
		kv(key, "%" PRIu64, ju64(jat(ev, i), "count", 0));
	}
	printf("\n");
	print_table(jget(c, "jobs"), job_cols, sizeof(job_cols) / sizeof(job_cols[0]),
		    "no jobs completed");
	printf("\n");
	print_table(jget(c, "peers"), peer_cols, sizeof(peer_cols) / sizeof(peer_cols[0]),
		    "no peers");
}

static void show_help_reply(const json_t *r)
{
	const json_t *cmds = jget(r, "commands");
	for (size_t i = 0; i < jlen(cmds); i++) {
		printf("  %-12s %s\n", jstr(jat(cmds, i), "name", "?"),
		       jstr(jat(cmds, i), "help", ""));
	}
}

static void show_generic(const json_t *r)
{
	const char *cmd = jstr(r, "command", "");

	if (strcmp(cmd, "config") == 0) {
		fputs(jstr(r, "config", ""), stdout);
	} else if (strcmp(cmd, "peer-reset") == 0) {
		printf("closed %" PRIu64 " connection(s) to %s\n", ju64(r, "closed", 0),
		       jstr(r, "peer", "?"));
	} else if (strcmp(cmd, "drain") == 0) {
		if (jbool(r, "drained", false)) {
			printf("drained: no jobs in flight (waited %" PRIu64
			       " ms); new jobs are refused until 'rdmaxctl resume'\n",
			       ju64(r, "waited_ms", 0));
		} else {
			printf("not drained: %" PRIu64 " jobs still in flight after %" PRIu64
			       " ms; new jobs are refused until 'rdmaxctl resume'\n",
			       ju64(r, "jobs_in_flight", 0), ju64(r, "waited_ms", 0));
		}
	} else if (strcmp(cmd, "resume") == 0) {
		printf("accepting new jobs\n");
	}
}

/* ------------------------------------------------------------------ doctor */

/* Outcome of one doctor check. */
enum verdict {
	V_OK,   /* fine */
	V_INFO, /* worth knowing, not a problem */
	V_WARN, /* likely to hurt performance or some uses */
	V_FAIL, /* breaks RDMA transfers */
	V_MAX,
};

struct doctor {
	json_t *checks; /* --json: the checks as they are made, printed at the end */
	int fails;
	int warns;
	const char *sysfs; /* "/sys", or a test tree */
};

static void report(struct doctor *d, enum verdict v, const char *check, const char *fix,
		   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void report(struct doctor *d, enum verdict v, const char *check, const char *fix,
		   const char *fmt, ...)
{
	static const char *const tags[V_MAX] = {"ok", "info", "warn", "fail"};
	static const char *const labels[V_MAX] = {"[ OK ]", "[INFO]", "[WARN]", "[FAIL]"};
	char detail[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	d->fails += v == V_FAIL;
	d->warns += v == V_WARN;
	if (d->checks) {
		json_t *c = json_pack("{s:s, s:s, s:s}", "check", check, "result", tags[v],
				      "detail", detail);
		if (c && fix) {
			json_object_set_new(c, "fix", json_string(fix));
		}
		json_array_append_new(d->checks, c);
		return;
	}
	printf("%s %s: %s\n", labels[v], check, detail);
	if (fix && v >= V_WARN) {
		printf("       fix: %s\n", fix);
	}
}

/* snprintf for paths: a truncated path is an empty one, so it names nothing. */
static void pathf(char *buf, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void pathf(char *buf, size_t size, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, size, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= size) {
		buf[0] = '\0';
	}
}

static bool read_file_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "re");
	bool ok;

	if (!f) {
		return false;
	}
	ok = fgets(buf, (int)size, f) != NULL;
	fclose(f);
	if (ok) {
		buf[strcspn(buf, "\n")] = '\0';
	}
	return ok;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted entry names of a directory (no dot files); returns the count, names malloc'd. */
static size_t list_dir(const char *path, char ***ret_names)
{
	DIR *dir = opendir(path);
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;

	*ret_names = NULL;
	if (!dir) {
		return 0;
	}
	while ((de = readdir(dir))) {
		if (de->d_name[0] == '.') {
			continue;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			char **grown = realloc(names, cap * sizeof(*names));
			if (!grown) {
				break;
			}
			names = grown;
		}
		names[n] = strdup(de->d_name);
		if (names[n]) {
			n++;
		}
	}
	closedir(dir);
	if (n) {
		qsort(names, n, sizeof(*names), cmp_str);
	}
	*ret_names = names;
	return n;
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(names[i]);
	}
	free(names);
}

struct port_seen {
	char name[96];
	bool ethernet;
	long mtu; /* netdev MTU, -1 when unknown */
	char netdev[64];
};

#define DOCTOR_PORTS_MAX 64

/* The first netdev of a RoCE port, from its GID table. */
static bool port_netdev(const char *port_dir, char *buf, size_t size)
{
	char path[PATH_MAX];
	char **names;
	size_t n;
	bool found = false;

	pathf(path, sizeof(path), "%s/gid_attrs/ndevs", port_dir);
	n = list_dir(path, &names);
	for (size_t i = 0; i < n && !found; i++) {
		char p[PATH_MAX];
		pathf(p, sizeof(p), "%s/gid_attrs/ndevs/%s", port_dir, names[i]);
		found = read_file_line(p, buf, size) && buf[0];
	}
	free_names(names, n);
	return found;
}

static bool gid_is_zero(const char *gid)
{
	for (const char *p = gid; *p; p++) {
		if (*p != '0' && *p != ':') {
			return false;
		}
	}
	return true;
}

static void check_ports(struct doctor *d, struct port_seen *seen, size_t *n_seen)
{
	char base[PATH_MAX];
	char **devs;
	size_t n_devs;

	pathf(base, sizeof(base), "%s/class/infiniband", d->sysfs);
	n_devs = list_dir(base, &devs);
	if (n_devs == 0) {
		report(d, V_INFO, "rdma devices",
		       "load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re...) or create a "
		       "Soft-RoCE device (rdma link add rxe0 type rxe netdev IFACE)",
		       "no RDMA device found under %s: rdmaxd can only use its TCP transport",
		       base);
	}
	for (size_t i = 0; i < n_devs; i++) {
		char ports_dir[PATH_MAX];
		char **ports;
		pathf(ports_dir, sizeof(ports_dir), "%s/%s/ports", base, devs[i]);
		size_t n_ports = list_dir(ports_dir, &ports);
		for (size_t p = 0; p < n_ports; p++) {
			char dir[PATH_MAX], path[PATH_MAX + 64], state[64] = "?", link[64] = "?";
			char name[96];
			pathf(dir, sizeof(dir), "%s/%s", ports_dir, ports[p]);
			snprintf(name, sizeof(name), "%s/%s", devs[i], ports[p]);
			pathf(path, sizeof(path), "%s/state", dir);
			read_file_line(path, state, sizeof(state));
			pathf(path, sizeof(path), "%s/link_layer", dir);
			read_file_line(path, link, sizeof(link));
			bool active = strstr(state, "ACTIVE") != NULL;
			bool eth = strcmp(link, "Ethernet") == 0;
			if (active) {
				report(d, V_OK, "port state", NULL, "%s is %s (%s)", name, state,
				       link);
			} else {
				report(d, V_FAIL, "port state",
				       eth ? "bring the network interface up (ip link set IFACE "
					     "up) "
					     "and check the cable and the switch port"
					   : "check the cable, the switch port and that a subnet "
					     "manager (opensm) runs on the fabric",
				       "%s is %s (%s): transfers over it fail", name, state, link);
			}
			struct port_seen *s =
				*n_seen < DOCTOR_PORTS_MAX ? &seen[(*n_seen)++] : NULL;
			if (s) {
				snprintf(s->name, sizeof(s->name), "%s", name);
				s->ethernet = eth;
				s->mtu = -1;
				s->netdev[0] = '\0';
			}
			if (!eth) {
				continue;
			}
			/* RoCE: rdma_cm needs a RoCE v2 GID, which exists only with an IP address.
			 */
			char types_dir[PATH_MAX];
			char **gids;
			bool v2 = false;
			pathf(types_dir, sizeof(types_dir), "%s/gid_attrs/types", dir);
			size_t n_gids = list_dir(types_dir, &gids);
			for (size_t g = 0; g < n_gids && !v2; g++) {
				char type[64] = "", gid[128] = "";
				pathf(path, sizeof(path), "%s/gid_attrs/types/%s", dir, gids[g]);
				if (!read_file_line(path, type, sizeof(type))) {
					continue;
				}
				pathf(path, sizeof(path), "%s/gids/%s", dir, gids[g]);
				read_file_line(path, gid, sizeof(gid));
				v2 = strcasecmp(type, "RoCE v2") == 0 && gid[0] &&
				     !gid_is_zero(gid);
			}
			free_names(gids, n_gids);
			char netdev[64] = "";
			bool has_netdev = port_netdev(dir, netdev, sizeof(netdev));
			if (v2) {
				report(d, V_OK, "RoCE v2 GID", NULL, "%s has a RoCE v2 GID", name);
			} else {
				char fix[256];
				snprintf(
					fix, sizeof(fix),
					"assign an IP address to %s (ip addr add ADDR/LEN dev %s); "
					"RoCE v2 GIDs follow the interface's addresses",
					has_netdev ? netdev : "the port's network interface",
					has_netdev ? netdev : "IFACE");
				report(d, V_FAIL, "RoCE v2 GID", fix,
				       "%s has no RoCE v2 GID: rdma_cm cannot route over it", name);
			}
			if (s && has_netdev) {
				char mtu[32];
				snprintf(s->netdev, sizeof(s->netdev), "%s", netdev);
				pathf(path, sizeof(path), "%s/class/net/%s/mtu", d->sysfs, netdev);
				if (read_file_line(path, mtu, sizeof(mtu))) {
					s->mtu = strtol(mtu, NULL, 10);
				}
			}
		}
		free_names(ports, n_ports);
	}
	free_names(devs, n_devs);
}

static void check_mtu(struct doctor *d, const struct port_seen *seen, size_t n)
{
	long first = -1;
	const char *first_name = NULL;
	bool mismatch = false;

	for (size_t i = 0; i < n; i++) {
		if (seen[i].mtu < 0) {
			continue;
		}
		if (first < 0) {
			first = seen[i].mtu;
			first_name = seen[i].name;
		} else if (seen[i].mtu != first) {
			mismatch = true;
			report(d, V_WARN, "MTU",
			       "give every RDMA interface the same MTU (ip link set IFACE mtu N) "
			       "and match it on the switches",
			       "%s (%s) has MTU %ld but %s has %ld: the path MTU drops to the "
			       "smaller one",
			       seen[i].name, seen[i].netdev, seen[i].mtu, first_name, first);
		}
	}
	if (first >= 0 && !mismatch) {
		report(d, first < 4096 ? V_INFO : V_OK, "MTU", NULL,
		       "every RoCE interface has MTU %ld%s", first,
		       first < 4096 ? " (RoCE uses at most 4096 when the interface allows 4200+)"
				    : "");
	}
}

static void check_memlock(struct doctor *d, long pid, bool rdma)
{
	char path[64], line[256];
	FILE *f;
	bool found = false;

	if (pid <= 0) {
		struct rlimit rl;
		if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
			report(d, rdma ? V_WARN : V_INFO, "memlock",
			       "start rdmaxd with LimitMEMLOCK=infinity (the shipped unit does)",
			       "daemon not reachable; this shell's locked-memory limit is %llu KiB",
			       (unsigned long long)rl.rlim_cur / 1024);
		}
		return;
	}
	pathf(path, sizeof(path), "/proc/%ld/limits", pid);
	f = fopen(path, "re");
	if (!f) {
		report(d, V_WARN, "memlock", "run rdmaxctl doctor as root", "cannot read %s: %s",
		       path, strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char soft[64];
		if (strncmp(line, "Max locked memory", 17) != 0) {
			continue;
		}
		found = true;
		if (sscanf(line + 17, " %63s", soft) != 1) {
			break;
		}
		if (strcmp(soft, "unlimited") == 0) {
			report(d, V_OK, "memlock", NULL,
			       "daemon (pid %ld) may lock unlimited memory", pid);
		} else {
			unsigned long long bytes = strtoull(soft, NULL, 10);
			report(d, rdma ? V_FAIL : V_INFO, "memlock",
			       "set LimitMEMLOCK=infinity in the service (systemctl edit rdmaxd) "
			       "and "
			       "restart it",
			       "daemon (pid %ld) may lock only %llu KiB%s", pid, bytes / 1024,
			       rdma ? ": registering RDMA memory beyond that fails"
				    : " (fine for the TCP transport)");
		}
		break;
	}
	fclose(f);
	if (!found) {
		report(d, V_WARN, "memlock", NULL, "no 'Max locked memory' line in %s", path);
	}
}

static bool nvidia_gpu_present(const char *sysfs)
{
	char base[PATH_MAX];
	char **devs;
	size_t n;
	bool found = false;

	pathf(base, sizeof(base), "%s/bus/pci/devices", sysfs);
	n = list_dir(base, &devs);
	for (size_t i = 0; i < n && !found; i++) {
		char path[PATH_MAX + 300], vendor[16] = "", klass[16] = "";
		pathf(path, sizeof(path), "%s/%s/vendor", base, devs[i]);
		read_file_line(path, vendor, sizeof(vendor));
		pathf(path, sizeof(path), "%s/%s/class", base, devs[i]);
		read_file_line(path, klass, sizeof(klass));
		found = strcmp(vendor, "0x10de") == 0 && strncmp(klass, "0x03", 4) == 0;
	}
	free_names(devs, n);
	return found;
}

static void check_gpu(struct doctor *d, bool rdma)
{
	char path[PATH_MAX], line[256] = "";
	bool gpu = nvidia_gpu_present(d->sysfs);
	bool peermem, open_module;

	if (!gpu) {
		report(d, V_INFO, "GPU memory", NULL,
		       "no NVIDIA GPU found: GPU regions (dma-buf, peermem) are not available");
		return;
	}
	pathf(path, sizeof(path), "%s/module/nvidia_peermem", d->sysfs);
	peermem = access(path, F_OK) == 0;
	pathf(path, sizeof(path), "%s/kernel/mm/memory_peers/nv_mem/version", d->sysfs);
	peermem = peermem || access(path, F_OK) == 0;
	/* dma-buf export needs NVIDIA's open kernel module (CUDA 11.7+). */
	open_module = read_file_line("/proc/driver/nvidia/version", line, sizeof(line)) &&
		      strstr(line, "Open Kernel Module") != NULL;
	if (open_module) {
		report(d, V_OK, "GPU memory", NULL,
		       "NVIDIA open kernel module: GPU memory can be registered as dma-buf%s",
		       peermem ? " (nvidia_peermem is loaded too)" : "");
	} else if (peermem) {
		report(d, V_OK, "GPU memory", NULL,
		       "nvidia_peermem is loaded: GPU memory can be registered via CUDA IPC");
	} else {
		report(d, rdma ? V_WARN : V_INFO, "GPU memory",
		       "install the NVIDIA open kernel module (dma-buf, preferred) or load "
		       "nvidia_peermem (modprobe nvidia_peermem)",
		       "NVIDIA GPU present but neither dma-buf export (open kernel module) nor "
		       "nvidia_peermem is available: GPU regions cannot be registered");
	}
}

static void check_dev_nodes(struct doctor *d, bool rdma)
{
	if (!rdma) {
		return;
	}
	if (access("/dev/infiniband/rdma_cm", R_OK | W_OK) == 0) {
		report(d, V_OK, "device nodes", NULL, "/dev/infiniband/rdma_cm is usable");
	} else {
		report(d, V_FAIL, "device nodes",
		       "load rdma_ucm (modprobe rdma_ucm) and check the permissions of "
		       "/dev/infiniband/*",
		       "/dev/infiniband/rdma_cm: %s", strerror(errno));
	}
}

static int run_doctor(const struct ctl *ctl)
{
	struct doctor d = {.checks = ctl->json ? json_array() : NULL, .sysfs = "/sys"};
	struct port_seen seen[DOCTOR_PORTS_MAX];
	size_t n_seen = 0;
	const char *env = getenv("RDMAXCTL_SYSFS");
	json_t *status = NULL;
	char *raw = NULL;
	long pid = -1;
	bool rdma;
	char **devs;

	if (env && env[0]) {
		d.sysfs = env; /* tests point this at a prepared tree */
	}
	/* Reachability first: its answer says which limits to read. */
	int fd = connect_admin(ctl->socket_path);
	if (fd < 0) {
		int err = g_last_errno;
		report(&d, V_FAIL, "daemon",
		       err == EACCES ? "run as root or as a member of group " ADMIN_GROUP
				     : "start it: systemctl start rdmaxd (journalctl -u rdmaxd "
				       "says why it stopped)",
		       "cannot connect to '%s': %s", ctl->socket_path, strerror(err));
	} else {
		close(fd);
		if (request(ctl, "status", TIMEOUT_MS, &raw, &status) == 0 &&
		    jbool(status, "ok", false)) {
			const json_t *tr = jget(status, "transports");
			char names[64] = "";
			for (size_t i = 0; i < jlen(tr); i++) {
				size_t used = strlen(names);
				snprintf(names + used, sizeof(names) - used, "%s%s", i ? "+" : "",
					 jstr(jat(tr, i), "name", "?"));
			}
			pid = (long)ju64(status, "pid", 0);
			report(&d, V_OK, "daemon", NULL,
			       "rdmaxd %s (pid %ld) answers on '%s'; transport %s",
			       jstr(status, "version", "?"), pid, ctl->socket_path,
			       names[0] ? names : "none");
			if (jbool(status, "draining", false)) {
				report(&d, V_WARN, "daemon", "rdmaxctl resume",
				       "the daemon is draining: new jobs are refused");
			}
		} else {
			report(&d, V_FAIL, "daemon", NULL,
			       "'%s' accepts connections but 'status' failed: %s", ctl->socket_path,
			       jstr(status, "error", "no valid reply"));
		}
	}
	char base[PATH_MAX];
	pathf(base, sizeof(base), "%s/class/infiniband", d.sysfs);
	size_t n_devs = list_dir(base, &devs);
	free_names(devs, n_devs);
	rdma = n_devs > 0;
	check_ports(&d, seen, &n_seen);
	check_mtu(&d, seen, n_seen);
	check_memlock(&d, pid, rdma);
	check_gpu(&d, rdma);
	check_dev_nodes(&d, rdma && !env);
	if (d.checks) {
		json_t *doc = json_pack("{s:o, s:b, s:i, s:i}", "checks", d.checks, "ok", !d.fails,
					"failures", d.fails, "warnings", d.warns);
		json_dumpf(doc, stdout, JSON_COMPACT);
		printf("\n");
		json_decref(doc);
	} else {
		printf("\n%s: %d problem%s, %d warning%s\n", d.fails ? "UNHEALTHY" : "healthy",
		       d.fails, d.fails == 1 ? "" : "s", d.warns, d.warns == 1 ? "" : "s");
	}
	json_decref(status);
	free(raw);
	return d.fails ? EXIT_DAEMON : EXIT_OK;
}

/* ------------------------------------------------------------ discovery */

/* nodes and lookup speak the client protocol (librdmax), on the client socket. */
static struct rdmax_client *open_client(const struct ctl *ctl)
{
	const char *env = getenv("RDMAXCTL_CLIENT_SOCKET");
	const char *path = ctl->client_socket ? ctl->client_socket
			   : env && env[0]    ? env
					      : DEFAULT_CLIENT_SOCKET;
	struct rdmax_client *c;
	int r = rdmax_client_open(path, "rdmaxctl", &c);

	if (r < 0) {
		fprintf(stderr, "rdmaxctl: cannot connect to the client socket '%s': %s\n", path,
			rdmax_strerror(r));
		return NULL;
	}
	return c;
}

static int run_nodes(const struct ctl *ctl)
{
	struct rdmax_client *c = open_client(ctl);
	static struct rdmax_node nodes[4096];

	if (!c) {
		return EXIT_USAGE;
	}
	int n = rdmax_nodes(c, nodes, sizeof(nodes) / sizeof(nodes[0]));
	rdmax_client_close(c);
	if (n < 0) {
		fprintf(stderr, "rdmaxctl: nodes: %s%s\n", rdmax_strerror(n),
			n == RDMAX_E_UNIMPLEMENTED ? " (no [discovery] backend is configured)"
						   : "");
		return EXIT_DAEMON;
	}
	size_t shown = (size_t)n < sizeof(nodes) / sizeof(nodes[0])
			       ? (size_t)n
			       : sizeof(nodes) / sizeof(nodes[0]);
	json_t *arr = json_array();
	for (size_t i = 0; i < shown; i++) {
		char inst[17];
		snprintf(inst, sizeof(inst), "%016" PRIx64, nodes[i].instance_id);
		json_array_append_new(arr, json_pack("{s:s, s:s, s:b, s:s, s:i, s:I}", "node",
						     nodes[i].name, "instance_id", inst, "alive",
						     nodes[i].alive, "addr", nodes[i].addr, "port",
						     (int)nodes[i].port, "age_ms",
						     (json_int_t)nodes[i].age_ms));
	}
	if (ctl->json) {
		json_t *doc = json_pack("{s:b, s:o, s:i}", "ok", 1, "nodes", arr, "count", n);
		json_dumpf(doc, stdout, JSON_COMPACT);
		printf("\n");
		json_decref(doc);
		return EXIT_OK;
	}
	static const struct column cols[] = {
		{"node", "NODE", F_TEXT},   {"instance_id", "INSTANCE", F_TEXT},
		{"alive", "ALIVE", F_TEXT}, {"addr", "ADDR", F_TEXT},
		{"port", "PORT", F_TEXT},   {"age_ms", "SEEN FOR", F_MS},
	};
	print_table(arr, cols, sizeof(cols) / sizeof(cols[0]), "no nodes known");
	json_decref(arr);
	return EXIT_OK;
}

static int run_lookup(const struct ctl *ctl, const char *node, const char *name)
{
	struct rdmax_client *c = open_client(ctl);
	struct rdmax_desc desc;

	if (!c) {
		return EXIT_USAGE;
	}
	int r = rdmax_lookup(c, node, name, 0, &desc);
	rdmax_client_close(c);
	if (r < 0) {
		if (ctl->json) {
			json_t *doc = json_pack("{s:b, s:s, s:s}", "ok", 0, "code",
						rdmax_strerror(r), "error", "lookup failed");
			json_dumpf(doc, stdout, JSON_COMPACT);
			printf("\n");
			json_decref(doc);
		} else {
			fprintf(stderr, "rdmaxctl: lookup of '%s' on '%s': %s\n", name, node,
				rdmax_strerror(r));
		}
		return EXIT_DAEMON;
	}
	char hex[2 * RDMAX_DESC_MAX + 1];
	for (uint32_t i = 0; i < desc.len; i++) {
		snprintf(hex + 2 * i, 3, "%02x", desc.bytes[i]);
	}
	if (ctl->json) {
		json_t *doc = json_pack("{s:b, s:s, s:s, s:i, s:s}", "ok", 1, "node", node, "name",
					name, "length", (int)desc.len, "desc_hex", hex);
		json_dumpf(doc, stdout, JSON_COMPACT);
		printf("\n");
		json_decref(doc);
	} else {
		printf("%s on %s: descriptor of %u bytes\n%s\n", name, node, desc.len, hex);
	}
	return EXIT_OK;
}

/* -------------------------------------------------------------------- main */

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: rdmaxctl [--socket PATH] [--json] COMMAND [ARGS]\n"
		"Query and control a running rdmaxd through its admin socket.\n\n"
		"Commands:\n"
		"  status                 daemon summary\n"
		"  devices                RDMA ports in use, GPUs and their nearest NIC\n"
		"  clients                connected applications\n"
		"  regions                registered memory regions\n"
		"  conns                  connections to peer daemons\n"
		"  jobs                   jobs in flight\n"
		"  stats [--prometheus]   counters (Prometheus text with --prometheus)\n"
		"  config                 the daemon's effective configuration\n"
		"  peer reset PEER        close the connections to PEER (ADDR:PORT or node name)\n"
		"  drain [--timeout SEC]  refuse new jobs, wait for the outstanding ones\n"
		"  resume                 accept new jobs again\n"
		"  doctor                 check this node for common RDMA set-up problems\n"
		"  nodes                  the nodes discovery knows (client socket)\n"
		"  lookup NODE NAME       the descriptor published as NAME on NODE (client "
		"socket)\n\n"
		"Options:\n"
		"  -s, --socket PATH      admin socket (default $RDMAXCTL_SOCKET or %s)\n"
		"  -c, --client-socket P  client socket for nodes and lookup\n"
		"                         (default $RDMAXCTL_CLIENT_SOCKET or /run/rdmaxd.sock)\n"
		"  -j, --json             print the daemon's JSON reply instead of tables\n"
		"  -h, --help             this text\n"
		"  -V, --version          print the version\n\n"
		"Exit status: 0 success, 1 the daemon reported an error or the node is "
		"unhealthy,\n2 usage or connection error.\n",
		DEFAULT_ADMIN_SOCKET);
}

int main(int argc, char **argv)
{
	struct ctl ctl = {.socket_path = DEFAULT_ADMIN_SOCKET};
	const char *words[8];
	size_t n_words = 0;
	bool prometheus = false;
	double drain_timeout_s = 30;
	char line[REQUEST_MAX];
	int timeout_ms = TIMEOUT_MS;
	const char *env = getenv("RDMAXCTL_SOCKET");

	if (env && env[0]) {
		ctl.socket_path = env;
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-s") == 0 || strcmp(a, "--socket") == 0) {
			if (++i >= argc) {
				fprintf(stderr, "rdmaxctl: %s needs a path\n", a);
				return EXIT_USAGE;
			}
			ctl.socket_path = argv[i];
		} else if (strncmp(a, "--socket=", 9) == 0) {
			ctl.socket_path = a + 9;
		} else if (strcmp(a, "-c") == 0 || strcmp(a, "--client-socket") == 0) {
			if (++i >= argc) {
				fprintf(stderr, "rdmaxctl: %s needs a path\n", a);
				return EXIT_USAGE;
			}
			ctl.client_socket = argv[i];
		} else if (strcmp(a, "-j") == 0 || strcmp(a, "--json") == 0) {
			ctl.json = true;
		} else if (strcmp(a, "--prometheus") == 0) {
			prometheus = true;
		} else if (strcmp(a, "--timeout") == 0 || strncmp(a, "--timeout=", 10) == 0) {
			const char *v = a[9] == '=' ? a + 10 : (++i < argc ? argv[i] : NULL);
			char *end;
			if (!v) {
				fprintf(stderr, "rdmaxctl: --timeout needs a number of seconds\n");
				return EXIT_USAGE;
			}
			drain_timeout_s = strtod(v, &end);
			if (*end || end == v || drain_timeout_s < 0 || drain_timeout_s > 86400) {
				fprintf(stderr,
					"rdmaxctl: --timeout '%s' is not 0..86400 seconds\n", v);
				return EXIT_USAGE;
			}
		} else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return EXIT_OK;
		} else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
			printf("rdmaxctl %s\n", VERSION);
			return EXIT_OK;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "rdmaxctl: unknown option '%s'\n", a);
			usage(stderr);
			return EXIT_USAGE;
		} else if (n_words < sizeof(words) / sizeof(words[0])) {
			words[n_words++] = a;
		} else {
			fprintf(stderr, "rdmaxctl: too many arguments\n");
			return EXIT_USAGE;
		}
	}
	if (n_words == 0) {
		usage(stderr);
		return EXIT_USAGE;
	}
	const char *cmd = words[0];
	if (strcmp(cmd, "doctor") == 0 && n_words == 1) {
		return run_doctor(&ctl);
	}
	if (strcmp(cmd, "help") == 0) {
		usage(stdout);
		return EXIT_OK;
	}
	if (strcmp(cmd, "nodes") == 0 && n_words == 1) {
		return run_nodes(&ctl);
	}
	if (strcmp(cmd, "lookup") == 0 && n_words == 3) {
		return run_lookup(&ctl, words[1], words[2]);
	}
	static const char *const simple[] = {"status", "devices", "clients", "regions",
					     "conns",  "jobs",    "config",  "resume"};
	bool known = false;
	for (size_t i = 0; i < sizeof(simple) / sizeof(simple[0]); i++) {
		if (strcmp(cmd, simple[i]) == 0 && n_words == 1) {
			snprintf(line, sizeof(line), "%s", cmd);
			known = true;
		}
	}
	if (strcmp(cmd, "stats") == 0 && n_words == 1) {
		snprintf(line, sizeof(line), "%s", prometheus ? "stats prometheus" : "stats");
		known = true;
	} else if (strcmp(cmd, "peer") == 0 && n_words == 3 && strcmp(words[1], "reset") == 0) {
		if (strlen(words[2]) > 200 || strpbrk(words[2], " \t\r\n")) {
			fprintf(stderr, "rdmaxctl: '%s' is not a peer name\n", words[2]);
			return EXIT_USAGE;
		}
		snprintf(line, sizeof(line), "peer-reset %s", words[2]);
		known = true;
	} else if (strcmp(cmd, "drain") == 0 && n_words == 1) {
		uint64_t ms = (uint64_t)llround(drain_timeout_s * 1000);
		snprintf(line, sizeof(line), "drain %" PRIu64, ms);
		timeout_ms = (int)(ms + TIMEOUT_MS);
		known = true;
	}
	if (!known) {
		fprintf(stderr, "rdmaxctl: unknown command or wrong arguments: '%s'\n", cmd);
		usage(stderr);
		return EXIT_USAGE;
	}

	json_t *reply = NULL;
	char *raw = NULL;
	if (request(&ctl, line, timeout_ms, &raw, &reply) < 0) {
		return EXIT_USAGE;
	}
	int code = EXIT_OK;
	if (!json_is_object(reply)) {
		fprintf(stderr, "rdmaxctl: the daemon's reply is not a JSON object\n");
		code = EXIT_DAEMON;
	} else if (ctl.json) {
		printf("%s\n", raw);
		code = jbool(reply, "ok", false) ? EXIT_OK : EXIT_DAEMON;
	} else if (!jbool(reply, "ok", false)) {
		fprintf(stderr, "rdmaxctl: %s: %s\n", jstr(reply, "code", "ERROR"),
			jstr(reply, "error", "the daemon reported an error"));
		code = EXIT_DAEMON;
	} else if (prometheus) {
		fputs(jstr(reply, "prometheus", ""), stdout);
	} else if (strcmp(cmd, "status") == 0) {
		show_status(reply);
	} else if (strcmp(cmd, "devices") == 0) {
		show_devices(reply);
	} else if (strcmp(cmd, "clients") == 0) {
		show_clients(reply);
	} else if (strcmp(cmd, "regions") == 0) {
		show_regions(reply);
	} else if (strcmp(cmd, "conns") == 0) {
		show_conns(reply);
	} else if (strcmp(cmd, "jobs") == 0) {
		show_jobs(reply);
	} else if (strcmp(cmd, "stats") == 0) {
		show_stats(reply);
	} else if (strcmp(cmd, "help") == 0) {
		show_help_reply(reply);
	} else {
		show_generic(reply);
	}
	/* A drain that timed out is not an error of the request, but not done either. */
	if (code == EXIT_OK && strcmp(cmd, "drain") == 0 && !jbool(reply, "drained", false)) {
		code = EXIT_DAEMON;
	}
	json_decref(reply);
	free(raw);
	return code;
}
