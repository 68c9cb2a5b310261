/* SPDX-License-Identifier: MIT */
/*
 * Node membership through etcd (docs/discovery.md). This daemon keeps one
 * record, PREFIX/nodes/NAME, under one lease that it renews every ttl/3; it
 * lists PREFIX/nodes/ and watches it from the listed revision, so it knows
 * every node's instance and listeners. A record deleted (its lease expired,
 * or revoked by a clean stop) or replaced by another instance makes the node
 * lost: the daemon is told once (members_lost_cb) and refuses new work to
 * that instance. With the store unreachable the daemon keeps what it knows,
 * logs it once, and starts over with a doubling backoff: renew or re-grant
 * the lease, put the record, list, watch. A compacted watch re-lists.
 *
 * States, in order: AUTH (token, when a user is configured), LEASE (renew the
 * lease held, or grant one), PUT, LIST, WATCH (registered). Any failure goes
 * to BACKOFF, which restarts at AUTH.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "etcd.h"
#include "hmap.h"
#include "log.h"
#include "members.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"
#include "util.h"

#define MEMBERS_MAX         100000 /* nodes tracked, alive or lost */
#define MEMBERS_LOST_MAX    65536  /* lost instances remembered */
#define MEMBERS_RECORD_MAX  4096   /* bytes of one node record */
#define MEMBERS_BACKOFF_MIN 250
#define MEMBERS_BACKOFF_MAX 8000
#define MEMBERS_REQ_TIMEOUT 3000
#define MEMBERS_PROTO       1

/* Where the connection to the store stands. */
enum members_state {
	M_AUTH,    /* getting a token */
	M_LEASE,   /* renewing or granting the lease */
	M_PUT,     /* writing this node's record */
	M_LIST,    /* reading every record */
	M_WATCH,   /* registered: watching for changes */
	M_BACKOFF, /* the store failed; waiting before starting over */
	M_STOPPED, /* shut down */
	M_STATE_MAX,
};

static const char *const g_state_names[M_STATE_MAX] = {
	"connecting", "connecting",  "connecting", "connecting",
	"registered", "unreachable", "stopped",
};

struct member {
	char name[64];
	uint64_t instance;
	bool alive;
	bool seen; /* in the list being reconciled */
	uint64_t first_seen_ms;
	uint64_t missing_since_ms; /* absent from a list (the store lost it?); 0: not */
	uint32_t n_endpoints;
	struct endpoint endpoints[DESC_MAX_ENDPOINTS];
};

struct members {
	struct rdmaxd *daemon;
	struct etcd *etcd;
	enum members_state state;
	members_lost_cb lost_cb;
	char prefix[128]; /* PREFIX/nodes/ */
	char key[192];    /* this node's record */
	char password[256];
	uint64_t lease;
	int64_t revision; /* of the last list or event */
	uint32_t ttl_s;
	uint32_t backoff_ms;
	bool logged_down;
	bool revoking;
	uv_timer_t timer; /* keep-alive while registered, backoff otherwise */
	struct etcd_req *pending;
	struct etcd_req *watch;
	struct hmap by_name; /* hash of the name -> struct member (chained by probing name) */
	struct member **all;
	uint32_t n_all;
	struct hmap lost; /* instance -> (void *)1 */
	uint32_t n_lost_instances;
	/* counters */
	uint64_t renewals;
	uint64_t watch_events;
	uint64_t store_errors;
};

static void start_over(struct members *m);
static void step_lease(struct members *m);
static void step_put(struct members *m);
static void step_list(struct members *m);
static void step_watch(struct members *m);

/* ----------------------------------------------------------------- table */

static struct member *find(const struct members *m, const char *name)
{
	for (uint32_t i = 0; i < m->n_all; i++) {
		if (strcmp(m->all[i]->name, name) == 0) {
			return m->all[i];
		}
	}
	return NULL;
}

static struct member *find_fast(const struct members *m, const char *name)
{
	struct member *x = hmap_get(&m->by_name, hmap_hash_bytes(name, strlen(name)));
	if (x && strcmp(x->name, name) == 0) {
		return x;
	}
	return x ? find(m, name) : NULL; /* a hash collision: the slow way */
}

static void remember_lost(struct members *m, uint64_t instance)
{
	if (instance == 0 || instance == UINT64_MAX || m->n_lost_instances >= MEMBERS_LOST_MAX) {
		return;
	}
	if (!hmap_get(&m->lost, instance) && hmap_put(&m->lost, instance, (void *)1) == 0) {
		m->n_lost_instances++;
	}
}

static void lose(struct members *m, struct member *x, const char *why)
{
	if (!x->alive) {
		return;
	}
	x->alive = false;
	remember_lost(m, x->instance);
	log_notice("node '%s' (instance %016" PRIx64 ") lost: %s", x->name, x->instance, why);
	if (m->lost_cb) {
		m->lost_cb(m->daemon, x->name, x->instance);
	}
}

/* Parse a record written by put_record(); false for anything malformed. */
static bool parse_record(const char *name, const uint8_t *value, size_t len, struct member *out)
{
	json_error_t jerr;
	json_t *doc = json_loadb((const char *)value, len, 0, &jerr);
	const char *node = json_string_value(json_object_get(doc, "node"));
	const char *inst = json_string_value(json_object_get(doc, "instance"));
	json_t *eps = json_object_get(doc, "endpoints");
	bool ok = false;
	char *end;

	memset(out, 0, sizeof(*out));
	if (!node || !inst || strcmp(node, name) != 0 || strlen(inst) != 16 ||
	    !json_is_array(eps) || json_array_size(eps) > DESC_MAX_ENDPOINTS) {
		goto out;
	}
	snprintf(out->name, sizeof(out->name), "%s", name);
	errno = 0;
	out->instance = strtoull(inst, &end, 16);
	if (errno || *end || out->instance == 0) {
		goto out;
	}
	for (size_t i = 0; i < json_array_size(eps); i++) {
		json_t *e = json_array_get(eps, i);
		const char *tr = json_string_value(json_object_get(e, "transport"));
		const char *addr = json_string_value(json_object_get(e, "addr"));
		const char *dev = json_string_value(json_object_get(e, "device"));
		json_int_t port = json_integer_value(json_object_get(e, "port"));
		struct endpoint *ep = &out->endpoints[out->n_endpoints];
		uint8_t bin[16];
		if (!tr || !addr || port <= 0 || port > 65535 || strlen(addr) >= sizeof(ep->addr) ||
		    (inet_pton(AF_INET, addr, bin) != 1 && inet_pton(AF_INET6, addr, bin) != 1) ||
		    (dev && strlen(dev) >= sizeof(ep->device))) {
			goto out;
		}
		if (strcmp(tr, "tcp") == 0) {
			ep->transport = ENDPOINT_TCP;
		} else if (strcmp(tr, "verbs") == 0) {
			ep->transport = ENDPOINT_VERBS;
		} else {
			continue; /* a fabric of a later version */
		}
		snprintf(ep->addr, sizeof(ep->addr), "%s", addr);
		snprintf(ep->device, sizeof(ep->device), "%s", dev ? dev : "");
		ep->port = (uint16_t)port;
		out->n_endpoints++;
	}
	ok = true;
out:
	json_decref(doc);
	return ok;
}

/* A record put (listed or watched): add, update, or a new instance replacing a lost one. */
static void upsert(struct members *m, const char *name, const uint8_t *value, size_t len)
{
	struct member rec, *x = find_fast(m, name);

	if (!parse_record(name, value, len, &rec)) {
		log_warn("discovery: ignoring a malformed record for node '%.63s'", name);
		return;
	}
	if (x) {
		x->seen = true;
		x->missing_since_ms = 0;
		if (x->instance == rec.instance && !x->alive) {
			/* The same start again (it hung, or the store lost its record): alive. */
			if (hmap_del(&m->lost, rec.instance)) {
				m->n_lost_instances--;
			}
			x->alive = true;
			log_notice("node '%s' (instance %016" PRIx64 ") is back", name,
				   rec.instance);
		}
		if (x->instance == rec.instance) {
			x->n_endpoints = rec.n_endpoints;
			memcpy(x->endpoints, rec.endpoints, sizeof(rec.endpoints));
			return;
		}
		if (x->instance != rec.instance) {
			lose(m, x, "a new instance replaced it");
			log_notice("node '%s' is back as instance %016" PRIx64, name, rec.instance);
		}
		rec.first_seen_ms = x->instance == rec.instance ? x->first_seen_ms : now_ms();
		rec.seen = true;
		rec.alive = !hmap_get(&m->lost, rec.instance);
		*x = rec;
		return;
	}
	if (m->n_all >= MEMBERS_MAX) {
		log_warn("discovery: more than %u nodes; ignoring '%s'", MEMBERS_MAX, name);
		return;
	}
	x = malloc(sizeof(*x));
	struct member **grown = realloc(m->all, (m->n_all + 1) * sizeof(*grown));
	if (!x || !grown) {
		free(x);
		if (grown) {
			m->all = grown;
		}
		return;
	}
	m->all = grown;
	*x = rec;
	x->alive = true;
	x->seen = true;
	x->first_seen_ms = now_ms();
	m->all[m->n_all++] = x;
	hmap_put(&m->by_name, hmap_hash_bytes(name, strlen(name)), x);
	if (strcmp(name, m->daemon->node_name) != 0) {
		log_info("node '%s' (instance %016" PRIx64 ") found", name, rec.instance);
	}
}

/* The record's key without the prefix: the node name, or NULL for keys that are not ours. */
static const char *name_of_key(const struct members *m, const uint8_t *key, size_t len, char *buf,
			       size_t size)
{
	size_t plen = strlen(m->prefix);

	if (len <= plen || len - plen >= size || memcmp(key, m->prefix, plen) != 0) {
		return NULL;
	}
	memcpy(buf, key + plen, len - plen);
	buf[len - plen] = '\0';
	for (char *p = buf; *p; p++) {
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_')) {
			return NULL;
		}
	}
	return buf;
}

/* A kv of a list or an event: {"key": b64, "value": b64}. */
static void apply_kv(struct members *m, json_t *kv, bool deleted)
{
	static uint8_t value[MEMBERS_RECORD_MAX];
	uint8_t key[256];
	char name[64];
	int klen = etcd_unb64(json_string_value(json_object_get(kv, "key")), key, sizeof(key));

	if (klen < 0 || !name_of_key(m, key, (size_t)klen, name, sizeof(name))) {
		return;
	}
	if (deleted) {
		struct member *x = find_fast(m, name);
		if (x && strcmp(name, m->daemon->node_name) != 0) {
			lose(m, x, "its record is gone (lease expired or revoked)");
		}
		return;
	}
	int vlen =
		etcd_unb64(json_string_value(json_object_get(kv, "value")), value, sizeof(value));
	if (vlen > 0) {
		upsert(m, name, value, (size_t)vlen);
	}
}

/* ---------------------------------------------------------------- the store */

static void count_error(struct members *m, const char *what, const char *why)
{
	m->store_errors++;
	if (!m->logged_down) {
		log_warn("discovery: etcd %s failed: %s; serving with the %u nodes known, retrying",
			 what, why ? why : "?", m->n_all);
		m->logged_down = true;
	} else {
		log_debug("discovery: etcd %s failed: %s", what, why ? why : "?");
	}
}

static void on_backoff(uv_timer_t *timer)
{
	struct members *m = timer->data;

	m->state = M_AUTH;
	start_over(m);
}

static void fail(struct members *m, const char *what, const char *why)
{
	count_error(m, what, why);
	if (m->pending) {
		etcd_cancel(m->etcd, m->pending); /* another request than the one that failed */
	}
	if (m->watch) {
		etcd_cancel(m->etcd, m->watch);
		m->watch = NULL;
	}
	m->pending = NULL;
	m->state = M_BACKOFF;
	uv_timer_start(&m->timer, on_backoff, m->backoff_ms, 0);
	m->backoff_ms = MIN(m->backoff_ms * 2, MEMBERS_BACKOFF_MAX);
}

static int64_t json_i64(json_t *v)
{
	if (json_is_string(v)) {
		return strtoll(json_string_value(v), NULL, 10);
	}
	return json_is_integer(v) ? json_integer_value(v) : 0;
}

static bool post(struct members *m, const char *path, json_t *body, etcd_cb cb)
{
	int ret = body ? etcd_post(m->etcd, path, body, false, MEMBERS_REQ_TIMEOUT, cb, m,
				   &m->pending)
		       : -ENOMEM;
	json_decref(body);
	if (ret < 0) {
		fail(m, path, rdmax_strerror(ret));
		return false;
	}
	return true;
}

static void on_auth(void *arg, int err, const char *why, json_t *doc)
{
	struct members *m = arg;
	const char *token = json_string_value(json_object_get(doc, "token"));

	m->pending = NULL;
	if (err || !token || etcd_set_token(m->etcd, token) < 0) {
		fail(m, "authentication", err ? why : "no token in the reply");
		return;
	}
	step_lease(m);
}

static void start_over(struct members *m)
{
	if (m->daemon->cfg.discovery_user[0]) {
		m->state = M_AUTH;
		etcd_set_token(m->etcd, NULL);
		post(m, "/v3/auth/authenticate",
		     json_pack("{s:s, s:s}", "name", m->daemon->cfg.discovery_user, "password",
			       m->password),
		     on_auth);
		return;
	}
	step_lease(m);
}

static void on_keepalive_timer(uv_timer_t *timer);

static void on_lease(void *arg, int err, const char *why, json_t *doc)
{
	struct members *m = arg;
	json_t *res = json_object_get(doc, "result");
	int64_t ttl = json_i64(json_object_get(res ? res : doc, "TTL"));
	int64_t id = json_i64(json_object_get(res ? res : doc, "ID"));

	m->pending = NULL;
	if (err) {
		fail(m, "lease", why);
		return;
	}
	if (ttl <= 0 || id == 0) {
		/* The lease expired while the store was away: our record went with it. */
		log_info("discovery: lease %016" PRIx64 " expired; registering again", m->lease);
		m->lease = 0;
		step_lease(m);
		return;
	}
	if (m->state == M_WATCH) {
		m->renewals++;
		return; /* a keep-alive while registered */
	}
	if ((uint64_t)id != m->lease) {
		m->lease = (uint64_t)id;
	} else {
		m->renewals++;
	}
	step_put(m);
}

/* Renew the lease held, or grant a new one. */
static void step_lease(struct members *m)
{
	m->state = M_LEASE;
	if (m->lease) {
		char id[24];
		snprintf(id, sizeof(id), "%" PRId64, (int64_t)m->lease);
		post(m, "/v3/lease/keepalive", json_pack("{s:s}", "ID", id), on_lease);
	} else {
		post(m, "/v3/lease/grant", json_pack("{s:I}", "TTL", (json_int_t)m->ttl_s),
		     on_lease);
	}
}

static void on_put(void *arg, int err, const char *why, json_t *doc)
{
	struct members *m = arg;

	m->pending = NULL;
	if (err) {
		fail(m, "put", why);
		return;
	}
	step_list(m);
}

static json_t *record(struct members *m)
{
	struct rdmaxd *d = m->daemon;
	struct endpoint eps[DESC_MAX_ENDPOINTS];
	uint32_t n = 0;
	char inst[17];
	json_t *arr = json_array(), *caps = json_array();

	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = d->transports[k];
		if (!t || n >= DESC_MAX_ENDPOINTS) {
			continue;
		}
		int got = t->ops->endpoints(t, NULL, eps + n, DESC_MAX_ENDPOINTS - n);
		n += got > 0 ? (uint32_t)got : 0;
		json_array_append_new(caps, json_string(k == ENDPOINT_TCP ? "tcp" : "verbs"));
	}
	for (uint32_t i = 0; i < n; i++) {
		json_t *e = json_pack("{s:s, s:s, s:i}", "transport",
				      eps[i].transport == ENDPOINT_TCP ? "tcp" : "verbs", "addr",
				      eps[i].addr, "port", (int)eps[i].port);
		if (e && eps[i].device[0]) {
			json_object_set_new(e, "device", json_string(eps[i].device));
		}
		json_array_append_new(arr, e);
	}
	json_array_append_new(caps, json_string("lookup"));
	snprintf(inst, sizeof(inst), "%016" PRIx64, d->instance_id);
	return json_pack("{s:s, s:s, s:i, s:s, s:o, s:o}", "node", d->node_name, "instance", inst,
			 "proto", MEMBERS_PROTO, "version", RDMAXD_VERSION, "endpoints", arr,
			 "capabilities", caps);
}

static void step_put(struct members *m)
{
	json_t *rec = record(m);
	char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
	char *key = etcd_b64(m->key, strlen(m->key));
	char *value = text ? etcd_b64(text, strlen(text)) : NULL;
	char lease[24];

	m->state = M_PUT;
	snprintf(lease, sizeof(lease), "%" PRId64, (int64_t)m->lease);
	post(m, "/v3/kv/put",
	     key && value ? json_pack("{s:s, s:s, s:s}", "key", key, "value", value, "lease", lease)
			  : NULL,
	     on_put);
	json_decref(rec);
	free(text);
	free(key);
	free(value);
}

/* [prefix, prefix + 1): every key under the prefix. */
static void range_of_prefix(const struct members *m, char **ret_key, char **ret_end)
{
	char end[sizeof(m->prefix)];
	size_t n = strlen(m->prefix);

	memcpy(end, m->prefix, n + 1);
	end[n - 1]++; /* the prefix ends in '/': the next byte up */
	*ret_key = etcd_b64(m->prefix, n);
	*ret_end = etcd_b64(end, n);
}

static void on_list(void *arg, int err, const char *why, json_t *doc)
{
	struct members *m = arg;
	json_t *kvs = json_object_get(doc, "kvs");

	m->pending = NULL;
	if (err) {
		fail(m, "list", why);
		return;
	}
	for (uint32_t i = 0; i < m->n_all; i++) {
		m->all[i]->seen = false;
	}
	for (size_t i = 0; i < json_array_size(kvs); i++) {
		apply_kv(m, json_array_get(kvs, i), false);
	}
	/*
	 * Records that went while nobody watched: expired leases, or a store that
	 * lost its data. A live daemon puts its record again within its backoff,
	 * so the node is lost only if it is still missing a lease later
	 * (members_check_missing()).
	 */
	for (uint32_t i = 0; i < m->n_all; i++) {
		struct member *x = m->all[i];
		if (!x->seen && x->alive && !x->missing_since_ms &&
		    strcmp(x->name, m->daemon->node_name) != 0) {
			x->missing_since_ms = now_ms();
		}
	}
	m->revision = json_i64(json_object_get(json_object_get(doc, "header"), "revision"));
	step_watch(m);
}

static void step_list(struct members *m)
{
	char *key, *end;

	m->state = M_LIST;
	range_of_prefix(m, &key, &end);
	post(m, "/v3/kv/range",
	     key && end ? json_pack("{s:s, s:s}", "key", key, "range_end", end) : NULL, on_list);
	free(key);
	free(end);
}

static void on_watch(void *arg, int err, const char *why, json_t *doc)
{
	struct members *m = arg;
	json_t *res = json_object_get(doc, "result");
	json_t *events = json_object_get(res, "events");

	if (err) {
		m->watch = NULL;
		fail(m, "watch", why);
		return;
	}
	if (json_i64(json_object_get(res, "compact_revision")) > 0 ||
	    json_is_true(json_object_get(res, "canceled"))) {
		/* Compacted past our revision: what changed meanwhile is only in a new list. */
		log_info("discovery: watch compacted at revision %" PRId64 "; listing again",
			 json_i64(json_object_get(res, "compact_revision")));
		etcd_cancel(m->etcd, m->watch);
		m->watch = NULL;
		step_list(m);
		return;
	}
	if (json_is_true(json_object_get(res, "created"))) {
		if (m->logged_down) {
			log_notice("discovery: etcd at %s reachable again; registered",
				   etcd_endpoint(m->etcd));
		}
		m->logged_down = false;
		m->backoff_ms = MEMBERS_BACKOFF_MIN;
	}
	for (size_t i = 0; i < json_array_size(events); i++) {
		json_t *ev = json_array_get(events, i);
		const char *type = json_string_value(json_object_get(ev, "type"));
		json_t *kv = json_object_get(ev, "kv");
		m->watch_events++;
		apply_kv(m, kv, type && strcmp(type, "DELETE") == 0);
		int64_t rev = json_i64(json_object_get(kv, "mod_revision"));
		m->revision = rev > m->revision ? rev : m->revision;
	}
}

static void step_watch(struct members *m)
{
	char *key, *end;
	char start[24];

	m->state = M_WATCH;
	if (m->watch) {
		etcd_cancel(m->etcd, m->watch);
		m->watch = NULL;
	}
	range_of_prefix(m, &key, &end);
	snprintf(start, sizeof(start), "%" PRId64, m->revision + 1);
	json_t *body = key && end ? json_pack("{s:{s:s, s:s, s:s}}", "create_request", "key", key,
					      "range_end", end, "start_revision", start)
				  : NULL;
	int ret = body ? etcd_post(m->etcd, "/v3/watch", body, true, 0, on_watch, m, &m->watch)
		       : -ENOMEM;
	json_decref(body);
	free(key);
	free(end);
	if (ret < 0) {
		fail(m, "watch", rdmax_strerror(ret));
		return;
	}
	/* Renew at a third of the lease, so two renewals may fail before it expires. */
	uint64_t every = (uint64_t)m->ttl_s * 1000 / 3;
	uv_timer_start(&m->timer, on_keepalive_timer, every, every);
}

/* Nodes absent from a list for a whole lease are lost. */
static void check_missing(struct members *m)
{
	uint64_t now = now_ms();

	for (uint32_t i = 0; i < m->n_all; i++) {
		struct member *x = m->all[i];
		if (x->missing_since_ms && now - x->missing_since_ms >= (uint64_t)m->ttl_s * 1000) {
			x->missing_since_ms = 0;
			lose(m, x, "its record is gone (missing from the list for a lease)");
		}
	}
}

static void on_keepalive_timer(uv_timer_t *timer)
{
	struct members *m = timer->data;
	char id[24];

	check_missing(m);
	if (m->state != M_WATCH || m->pending) {
		return;
	}
	snprintf(id, sizeof(id), "%" PRId64, (int64_t)m->lease);
	json_t *body = json_pack("{s:s}", "ID", id);
	int ret = body ? etcd_post(m->etcd, "/v3/lease/keepalive", body, false, MEMBERS_REQ_TIMEOUT,
				   on_lease, m, &m->pending)
		       : -ENOMEM;
	json_decref(body);
	if (ret < 0) {
		uv_timer_stop(&m->timer);
		fail(m, "keep-alive", rdmax_strerror(ret));
	}
}

/* ------------------------------------------------------------------ the API */

static int read_password(const char *path, char *buf, size_t size)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0) {
		return -errno;
	}
	if (fstat(fd, &st) < 0 || (st.st_mode & 077)) {
		close(fd);
		return -EPERM;
	}
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0) {
		return -errno;
	}
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n")] = '\0';
	return 0;
}

int members_create(struct rdmaxd *daemon, struct members **ret_members)
{
	const struct config *cfg = &daemon->cfg;
	struct members *m;
	int ret;

	*ret_members = NULL;
	if (strcmp(cfg->discovery_backend, "etcd") != 0) {
		return 0;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		return -ENOMEM;
	}
	m->daemon = daemon;
	m->ttl_s = cfg->discovery_ttl_s;
	m->backoff_ms = MEMBERS_BACKOFF_MIN;
	snprintf(m->prefix, sizeof(m->prefix), "%s%snodes/", cfg->discovery_prefix,
		 cfg->discovery_prefix[strlen(cfg->discovery_prefix) - 1] == '/' ? "" : "/");
	snprintf(m->key, sizeof(m->key), "%s%s", m->prefix, daemon->node_name);
	if (cfg->discovery_user[0]) {
		ret = cfg->discovery_password_file[0]
			      ? read_password(cfg->discovery_password_file, m->password,
					      sizeof(m->password))
			      : -ENOENT;
		if (ret < 0) {
			log_err("[discovery] password_file '%s' cannot be used: %s%s",
				cfg->discovery_password_file, strerror(-ret),
				ret == -EPERM ? " (group or others may read it)" : "");
			free(m);
			return ret;
		}
	}
	struct etcd_options opt = {
		.endpoints = cfg->discovery_endpoints,
		.ca_file = cfg->discovery_ca_file,
		.cert_file = cfg->discovery_cert_file,
		.key_file = cfg->discovery_key_file,
	};
	ret = hmap_init(&m->by_name, 64);
	if (ret == 0) {
		ret = hmap_init(&m->lost, 64);
	}
	if (ret == 0) {
		ret = etcd_create(daemon->loop, &opt, &m->etcd);
	}
	if (ret < 0) {
		hmap_fini(&m->by_name);
		hmap_fini(&m->lost);
		free(m);
		return ret;
	}
	uv_timer_init(daemon->loop, &m->timer);
	m->timer.data = m;
	log_info("discovery: etcd at %s, prefix '%s', lease %u s", cfg->discovery_endpoints,
		 m->prefix, m->ttl_s);
	start_over(m);
	*ret_members = m;
	return 0;
}

void members_set_lost_cb(struct members *m, members_lost_cb cb)
{
	if (m) {
		m->lost_cb = cb;
	}
}

static void timer_closed(uv_handle_t *handle)
{
}

static void on_revoked(void *arg, int err, const char *why, json_t *doc)
{
	struct members *m = arg;

	m->pending = NULL;
	if (err) {
		log_info("discovery: revoking the lease failed (%s); the record expires with it",
			 why);
	}
	etcd_close(m->etcd);
}

void members_shutdown(struct members *m)
{
	if (!m || m->state == M_STOPPED) {
		return;
	}
	m->state = M_STOPPED;
	uv_timer_stop(&m->timer);
	uv_close((uv_handle_t *)&m->timer, timer_closed);
	if (m->watch) {
		etcd_cancel(m->etcd, m->watch);
		m->watch = NULL;
	}
	if (m->pending) {
		etcd_cancel(m->etcd, m->pending);
		m->pending = NULL;
	}
	/* A clean stop: the record goes now rather than after the lease. */
	if (m->lease) {
		char id[24];
		snprintf(id, sizeof(id), "%" PRId64, (int64_t)m->lease);
		json_t *body = json_pack("{s:s}", "ID", id);
		if (body && etcd_post(m->etcd, "/v3/lease/revoke", body, false, 1000, on_revoked, m,
				      &m->pending) == 0) {
			json_decref(body);
			return;
		}
		json_decref(body);
	}
	etcd_close(m->etcd);
}

void members_destroy(struct members *m)
{
	if (!m) {
		return;
	}
	etcd_close(m->etcd);
	etcd_destroy(m->etcd);
	for (uint32_t i = 0; i < m->n_all; i++) {
		free(m->all[i]);
	}
	free(m->all);
	hmap_fini(&m->by_name);
	hmap_fini(&m->lost);
	free(m);
}

int members_resolve(const struct members *m, const char *node, struct endpoint *eps, uint32_t max,
		    uint32_t *ret_n, uint64_t *ret_instance, char *why, size_t why_size)
{
	const struct member *x = m ? find_fast(m, node) : NULL;

	if (!x) {
		return RDMAX_E_NOT_FOUND;
	}
	if (!x->alive) {
		snprintf(why, why_size,
			 "node '%.63s' is lost (instance %016" PRIx64 "); refused until it returns",
			 node, x->instance);
		return RDMAX_E_UNREACHABLE;
	}
	uint32_t n = MIN(max, x->n_endpoints);
	memcpy(eps, x->endpoints, n * sizeof(*eps));
	*ret_n = n;
	*ret_instance = x->instance;
	return 0;
}

bool members_instance_lost(const struct members *m, uint64_t instance)
{
	return m && hmap_get(&m->lost, instance) != NULL;
}

void members_for_each(const struct members *m, discovery_node_cb cb, void *arg)
{
	uint64_t now = now_ms();

	for (uint32_t i = 0; m && i < m->n_all; i++) {
		const struct member *x = m->all[i];
		struct discovery_node n = {
			.name = x->name,
			.instance_id = x->instance,
			.alive = x->alive,
			.age_ms = now - x->first_seen_ms,
			.n_endpoints = x->n_endpoints,
			.endpoints = x->endpoints,
		};
		cb(arg, &n);
	}
}

void members_get_stats(const struct members *m, struct discovery_stats *st)
{
	if (!m) {
		return;
	}
	st->backend = "etcd";
	st->state = g_state_names[m->state];
	st->lease_renewals = m->renewals;
	st->watch_events = m->watch_events;
	st->store_errors = m->store_errors;
	for (uint32_t i = 0; i < m->n_all; i++) {
		if (m->all[i]->alive) {
			st->nodes_alive++;
		} else {
			st->nodes_lost++;
		}
	}
}
