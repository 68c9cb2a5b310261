/* SPDX-License-Identifier: MIT */
/*
 * etcd v3 JSON gateway client on the libuv loop. libcurl's multi interface
 * tells which sockets to watch (CURLMOPT_SOCKETFUNCTION: one uv_poll_t per
 * socket) and when to time out (CURLMOPT_TIMERFUNCTION: one uv_timer_t); the
 * loop hands readiness back with curl_multi_socket_action(). Replies are
 * parsed with jansson; a watch's reply is a stream of JSON documents, each
 * parsed as soon as it is whole. Callbacks never run from inside libcurl:
 * bytes are only collected there, and documents are delivered after
 * curl_multi_socket_action() returned, so a callback may start or cancel
 * requests. Owns HTTP and JSON only; what the documents mean is members.c's.
 */
#include <curl/curl.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_affinity.h"
#include "etcd.h"
#include "log.h"
#include "rdmax.h"
#include "util.h"

#define ETCD_ENDPOINTS_MAX 8
#define ETCD_REPLY_MAX     (64u << 20) /* a list of 10 000 nodes is ~3 MiB */
#define ETCD_TOKEN_MAX     512

struct etcd_req {
	struct etcd *etcd;
	struct list_node link; /* in etcd->reqs */
	CURL *easy;
	struct curl_slist *headers;
	char *body;
	uint8_t *buf;
	size_t len;
	size_t cap;
	bool stream;
	bool done;      /* curl finished it; deliver the rest and the end */
	bool cancelled; /* etcd_cancel() while it was being delivered */
	CURLcode result;
	etcd_cb cb;
	void *arg;
	char errbuf[CURL_ERROR_SIZE];
};

struct sock {
	uv_poll_t poll;
	curl_socket_t fd;
	struct etcd *etcd;
};

struct etcd {
	uv_loop_t *loop;
	CURLM *multi;
	uv_timer_t timer;
	bool closed;
	bool delivering;
	bool close_pending; /* etcd_close() from a callback: done when delivery ends */
	bool lent;          /* the loop runs on the workers' CPUs until libcurl returns */
	struct list_node reqs;
	char *endpoints[ETCD_ENDPOINTS_MAX];
	uint32_t n_endpoints;
	uint32_t current;
	char ca_file[256];
	char cert_file[256];
	char key_file[256];
	char auth_header[ETCD_TOKEN_MAX + 32];
};

static void run_pending(struct etcd *etcd);

/*
 * libcurl resolves a name on a thread it starts from the thread that drives
 * it: the loop, which [engine] loop_cpus keeps on CPUs of its own, and a
 * thread inherits its creator's CPUs. For the call that starts a resolve the
 * loop runs on the workers' CPUs, so the resolver does too, and end_call()
 * takes the loop back once libcurl returned.
 */
static int on_resolver_start(void *resolver_state, void *reserved, void *userp)
{
	struct etcd *etcd = userp;

	if (!etcd->lent) {
		etcd->lent = true;
		int err = cpu_affinity_lend_loop();
		if (err < 0) {
			log_warn("discovery: cannot move the loop off its CPUs for a name "
				 "resolution: %s",
				 strerror(-err));
		}
	}
	return 0;
}

/* After every call into libcurl: the loop back on its own CPUs. */
static void end_call(struct etcd *etcd)
{
	if (etcd->lent) {
		etcd->lent = false;
		int err = cpu_affinity_pin_loop();
		if (err < 0) {
			log_warn("discovery: cannot move the loop back to [engine] loop_cpus: %s",
				 strerror(-err));
		}
	}
}

static void sock_closed(uv_handle_t *handle)
{
	free(handle->data);
}

static void on_poll(uv_poll_t *poll, int status, int events)
{
	struct sock *s = poll->data;
	struct etcd *etcd = s->etcd;
	int flags = 0, running;

	if (status < 0) {
		flags = CURL_CSELECT_ERR;
	} else {
		flags |= events & UV_READABLE ? CURL_CSELECT_IN : 0;
		flags |= events & UV_WRITABLE ? CURL_CSELECT_OUT : 0;
	}
	curl_multi_socket_action(etcd->multi, s->fd, flags, &running);
	end_call(etcd);
	run_pending(etcd);
}

static int socket_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
	struct etcd *etcd = userp;
	struct sock *s = socketp;

	if (what == CURL_POLL_REMOVE) {
		if (s) {
			uv_poll_stop(&s->poll);
			uv_close((uv_handle_t *)&s->poll, sock_closed);
			curl_multi_assign(etcd->multi, fd, NULL);
		}
		return 0;
	}
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s || uv_poll_init_socket(etcd->loop, &s->poll, fd) < 0) {
			free(s);
			return -1;
		}
		s->fd = fd;
		s->etcd = etcd;
		s->poll.data = s;
		curl_multi_assign(etcd->multi, fd, s);
	}
	int events =
		(what & CURL_POLL_IN ? UV_READABLE : 0) | (what & CURL_POLL_OUT ? UV_WRITABLE : 0);
	uv_poll_start(&s->poll, events, on_poll);
	return 0;
}

static void on_timer(uv_timer_t *timer)
{
	struct etcd *etcd = timer->data;
	int running;

	curl_multi_socket_action(etcd->multi, CURL_SOCKET_TIMEOUT, 0, &running);
	end_call(etcd);
	run_pending(etcd);
}

static int timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
	struct etcd *etcd = userp;

	if (timeout_ms < 0) {
		uv_timer_stop(&etcd->timer);
	} else {
		/* 0 means "now": from the loop, never from inside libcurl. */
		uv_timer_start(&etcd->timer, on_timer, (uint64_t)timeout_ms, 0);
	}
	return 0;
}

static size_t on_write(char *data, size_t size, size_t n, void *userp)
{
	struct etcd_req *req = userp;
	size_t len = size * n;

	if (req->len + len > ETCD_REPLY_MAX) {
		return 0; /* curl fails the transfer: CURLE_WRITE_ERROR */
	}
	if (req->len + len + 1 > req->cap) {
		size_t cap = req->cap ? req->cap : 4096;
		while (cap < req->len + len + 1) {
			cap *= 2;
		}
		uint8_t *grown = realloc(req->buf, cap);
		if (!grown) {
			return 0;
		}
		req->buf = grown;
		req->cap = cap;
	}
	memcpy(req->buf + req->len, data, len);
	req->len += len;
	return len;
}

static void req_free(struct etcd_req *req)
{
	list_del(&req->link);
	if (req->easy) {
		curl_multi_remove_handle(req->etcd->multi, req->easy);
		curl_easy_cleanup(req->easy);
	}
	curl_slist_free_all(req->headers);
	free(req->body);
	free(req->buf);
	free(req);
}

/* The gateway's error document: {"error": ..., "code": N, "message": ...}. */
static void error_text(json_t *doc, long http, char *why, size_t size)
{
	json_t *msg = json_object_get(doc, "message");
	if (!json_is_string(msg)) {
		msg = json_object_get(doc, "error");
	}
	snprintf(why, size, "HTTP %ld: %s", http,
		 json_is_string(msg) ? json_string_value(msg) : "");
}

/* Deliver the stream's whole documents; false when the request went away meanwhile. */
static bool deliver_stream(struct etcd_req *req)
{
	size_t off = 0;

	while (off < req->len && !req->cancelled) {
		json_error_t jerr;
		json_t *doc = json_loadb((const char *)req->buf + off, req->len - off,
					 JSON_DISABLE_EOF_CHECK, &jerr);
		if (!doc) {
			if (json_error_code(&jerr) == json_error_premature_end_of_input) {
				break; /* the rest is on its way */
			}
			req->done = true;
			req->result = CURLE_WEIRD_SERVER_REPLY;
			snprintf(req->errbuf, sizeof(req->errbuf), "malformed watch message: %s",
				 jerr.text);
			off = req->len;
			break;
		}
		off += (size_t)jerr.position;
		req->cb(req->arg, 0, NULL, doc);
		json_decref(doc);
	}
	if (off > 0 && off < req->len) {
		memmove(req->buf, req->buf + off, req->len - off);
	}
	req->len = off <= req->len ? req->len - off : 0;
	return !req->cancelled;
}

static void finish(struct etcd_req *req)
{
	struct etcd *etcd = req->etcd;
	char why[512];
	long http = 0;
	json_t *doc = NULL;
	int err = 0;

	curl_easy_getinfo(req->easy, CURLINFO_RESPONSE_CODE, &http);
	if (req->result != CURLE_OK) {
		err = RDMAX_E_UNREACHABLE;
		snprintf(why, sizeof(why), "%.200s: %.300s", etcd_endpoint(etcd),
			 req->errbuf[0] ? req->errbuf : curl_easy_strerror(req->result));
		/* The next request tries the next endpoint. */
		etcd->current = (etcd->current + 1) % etcd->n_endpoints;
	} else if (req->stream && http == 200) {
		err = RDMAX_E_TRANSPORT_ERROR;
		snprintf(why, sizeof(why), "%s closed the watch", etcd_endpoint(etcd));
	} else {
		json_error_t jerr;
		doc = json_loadb((const char *)req->buf, req->len, 0, &jerr);
		if (http != 200) {
			err = http == 401 || http == 403 ? RDMAX_E_PERMISSION_DENIED
							 : RDMAX_E_TRANSPORT_ERROR;
			error_text(doc, http, why, sizeof(why));
		} else if (!json_is_object(doc)) {
			err = RDMAX_E_PROTOCOL_ERROR;
			snprintf(why, sizeof(why), "%s sent a reply that is not JSON: %s",
				 etcd_endpoint(etcd), jerr.text);
		}
	}
	req->cb(req->arg, err, err ? why : NULL, err ? NULL : doc);
	json_decref(doc);
}

/* Completed transfers and stream documents, delivered outside libcurl. */
static void run_pending(struct etcd *etcd)
{
	CURLMsg *m;
	int left;

	if (etcd->delivering) {
		return;
	}
	etcd->delivering = true;
	while ((m = curl_multi_info_read(etcd->multi, &left))) {
		struct etcd_req *req;
		if (m->msg != CURLMSG_DONE) {
			continue;
		}
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&req);
		req->done = true;
		req->result = m->data.result;
	}
	bool again = true;
	while (again && !etcd->close_pending) {
		struct list_node *pos, *tmp;
		again = false;
		list_for_each_safe(pos, tmp, &etcd->reqs)
		{
			struct etcd_req *req = container_of(pos, struct etcd_req, link);
			if (req->cancelled) {
				req_free(req);
				continue;
			}
			if (req->stream && req->len > 0 && !deliver_stream(req)) {
				req_free(req);
				again = true; /* callbacks changed the list */
				break;
			}
			if (req->done) {
				finish(req);
				req_free(req);
				again = true;
				break;
			}
		}
	}
	etcd->delivering = false;
	if (etcd->close_pending) {
		etcd_close(etcd);
	}
}

int etcd_create(uv_loop_t *loop, const struct etcd_options *opt, struct etcd **ret)
{
	static bool g_curl_ready;
	struct etcd *etcd;
	char list[512];
	char *save = NULL;

	if (!g_curl_ready) {
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
			return -ENOMEM;
		}
		g_curl_ready = true;
	}
	etcd = calloc(1, sizeof(*etcd));
	if (!etcd) {
		return -ENOMEM;
	}
	etcd->loop = loop;
	list_init(&etcd->reqs);
	snprintf(list, sizeof(list), "%s", opt->endpoints ? opt->endpoints : "");
	for (char *url = strtok_r(list, ",", &save); url && etcd->n_endpoints < ETCD_ENDPOINTS_MAX;
	     url = strtok_r(NULL, ",", &save)) {
		size_t n = strlen(url);
		while (n > 0 && url[n - 1] == '/') {
			url[--n] = '\0';
		}
		if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
			log_err("[discovery] endpoint '%s' is not an http:// or https:// URL", url);
			etcd_close(etcd);
			etcd_destroy(etcd);
			return -EINVAL;
		}
		etcd->endpoints[etcd->n_endpoints++] = strdup(url);
	}
	if (etcd->n_endpoints == 0) {
		free(etcd);
		return -EINVAL;
	}
	snprintf(etcd->ca_file, sizeof(etcd->ca_file), "%s", opt->ca_file ? opt->ca_file : "");
	snprintf(etcd->cert_file, sizeof(etcd->cert_file), "%s",
		 opt->cert_file ? opt->cert_file : "");
	snprintf(etcd->key_file, sizeof(etcd->key_file), "%s", opt->key_file ? opt->key_file : "");
	etcd->multi = curl_multi_init();
	if (!etcd->multi) {
		etcd_destroy(etcd);
		return -ENOMEM;
	}
	curl_multi_setopt(etcd->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
	curl_multi_setopt(etcd->multi, CURLMOPT_SOCKETDATA, etcd);
	curl_multi_setopt(etcd->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
	curl_multi_setopt(etcd->multi, CURLMOPT_TIMERDATA, etcd);
	uv_timer_init(loop, &etcd->timer);
	etcd->timer.data = etcd;
	*ret = etcd;
	return 0;
}

const char *etcd_endpoint(const struct etcd *etcd)
{
	return etcd->endpoints[etcd->current];
}

int etcd_set_token(struct etcd *etcd, const char *token)
{
	if (token && strlen(token) > ETCD_TOKEN_MAX) {
		return -ENAMETOOLONG;
	}
	if (token && token[0]) {
		snprintf(etcd->auth_header, sizeof(etcd->auth_header), "Authorization: %s", token);
	} else {
		etcd->auth_header[0] = '\0';
	}
	return 0;
}

int etcd_post(struct etcd *etcd, const char *path, json_t *body, bool stream, uint32_t timeout_ms,
	      etcd_cb cb, void *arg, struct etcd_req **ret_req)
{
	struct etcd_req *req;
	char url[512];

	if (etcd->closed) {
		return RDMAX_E_CANCELLED;
	}
	req = calloc(1, sizeof(*req));
	if (!req) {
		return -ENOMEM;
	}
	req->etcd = etcd;
	req->stream = stream;
	req->cb = cb;
	req->arg = arg;
	list_init(&req->link);
	req->body = json_dumps(body, JSON_COMPACT);
	req->easy = curl_easy_init();
	req->headers = curl_slist_append(NULL, "Content-Type: application/json");
	if (req->headers && etcd->auth_header[0]) {
		struct curl_slist *h = curl_slist_append(req->headers, etcd->auth_header);
		req->headers = h ? h : req->headers;
	}
	if (!req->body || !req->easy || !req->headers) {
		req_free(req);
		return -ENOMEM;
	}
	snprintf(url, sizeof(url), "%s%s", etcd_endpoint(etcd), path);
	CURL *e = req->easy;
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, req->headers);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, req);
	curl_easy_setopt(e, CURLOPT_PRIVATE, req);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, req->errbuf);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_RESOLVER_START_FUNCTION, on_resolver_start);
	curl_easy_setopt(e, CURLOPT_RESOLVER_START_DATA, etcd);
	if (timeout_ms) {
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
	}
	if (etcd->ca_file[0]) {
		curl_easy_setopt(e, CURLOPT_CAINFO, etcd->ca_file);
	}
	if (etcd->cert_file[0]) {
		curl_easy_setopt(e, CURLOPT_SSLCERT, etcd->cert_file);
		curl_easy_setopt(e, CURLOPT_SSLKEY, etcd->key_file[0] ? etcd->key_file : NULL);
	}
	CURLMcode added = curl_multi_add_handle(etcd->multi, e);
	end_call(etcd);
	if (added != CURLM_OK) {
		curl_easy_cleanup(e);
		req->easy = NULL;
		req_free(req);
		return -ENOMEM;
	}
	list_add_tail(&etcd->reqs, &req->link);
	if (ret_req) {
		*ret_req = req;
	}
	return 0;
}

void etcd_cancel(struct etcd *etcd, struct etcd_req *req)
{
	if (!req) {
		return;
	}
	if (etcd->delivering) {
		req->cancelled = true; /* freed by run_pending(), which walks the list */
		return;
	}
	req_free(req);
}

static void timer_closed(uv_handle_t *handle)
{
}

void etcd_close(struct etcd *etcd)
{
	struct list_node *pos, *tmp;

	if (!etcd || etcd->closed) {
		return;
	}
	if (etcd->delivering) {
		etcd->close_pending = true; /* a callback's request is still in use */
		return;
	}
	etcd->closed = true;
	list_for_each_safe(pos, tmp, &etcd->reqs)
	{
		req_free(container_of(pos, struct etcd_req, link));
	}
	if (etcd->multi) {
		curl_multi_cleanup(etcd->multi); /* removes its sockets through socket_cb */
		etcd->multi = NULL;
		uv_timer_stop(&etcd->timer);
		uv_close((uv_handle_t *)&etcd->timer, timer_closed);
	}
}

void etcd_destroy(struct etcd *etcd)
{
	if (!etcd) {
		return;
	}
	for (uint32_t i = 0; i < etcd->n_endpoints; i++) {
		free(etcd->endpoints[i]);
	}
	free(etcd);
}

char *etcd_b64(const void *s, size_t len)
{
	size_t size = sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL);
	char *out = malloc(size);

	if (out) {
		sodium_bin2base64(out, size, s, len, sodium_base64_VARIANT_ORIGINAL);
	}
	return out;
}

int etcd_unb64(const char *s, uint8_t *buf, size_t size)
{
	size_t len;

	if (!s || sodium_base642bin(buf, size, s, strlen(s), NULL, &len, NULL,
				    sodium_base64_VARIANT_ORIGINAL) != 0) {
		return -1;
	}
	return (int)len;
}
