/* SPDX-License-Identifier: MIT */
/*
 * A small client of etcd's v3 JSON gateway (POST /v3/...), driven by the
 * daemon's libuv loop through libcurl's multi interface: nothing here blocks.
 * Requests carry a jansson body and come back as parsed jansson documents;
 * a watch is a request whose reply is a stream of documents.
 */
#ifndef RDMAXD_ETCD_H
#define RDMAXD_ETCD_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

struct etcd;
struct etcd_req;

struct etcd_options {
	const char *endpoints; /* comma-separated base URLs */
	const char *ca_file;   /* "" or NULL: the system's */
	const char *cert_file;
	const char *key_file;
	const char *user; /* "" or NULL: no token authentication */
	const char *password;
};

/*
 * One reply (a unary request's only one, or one message of a watch): err 0 and
 * the document (borrowed for the call), or an error with why. A unary request
 * calls it once; a watch once per message and a last time with an error when
 * the stream ends. Never called after etcd_cancel().
 */
typedef void (*etcd_cb)(void *arg, int err, const char *why, json_t *doc);

int etcd_create(uv_loop_t *loop, const struct etcd_options *opt, struct etcd **ret_etcd);
/* Cancel every request without callbacks, close the loop handles. */
void etcd_close(struct etcd *etcd);
/* Free; after etcd_close() and once the loop ran the close callbacks. */
void etcd_destroy(struct etcd *etcd);

/*
 * POST body (not stolen) to path ("/v3/kv/put"); timeout_ms 0 for none (a
 * watch). Returns 0 and the request (for etcd_cancel) in *ret_req when not
 * NULL, or a negative error without calling cb.
 */
int etcd_post(struct etcd *etcd, const char *path, json_t *body, bool stream, uint32_t timeout_ms,
	      etcd_cb cb, void *arg, struct etcd_req **ret_req);
void etcd_cancel(struct etcd *etcd, struct etcd_req *req);

/* The endpoint in use ("http://127.0.0.1:2379"); the next is used after a failure. */
const char *etcd_endpoint(const struct etcd *etcd);

/* Token authentication: the token from /v3/auth/authenticate, sent with every request. */
int etcd_set_token(struct etcd *etcd, const char *token);

/* Base64 of len bytes of s (malloc'd; NULL when out of memory), as the gateway wants bytes. */
char *etcd_b64(const void *s, size_t len);
/* Decode base64 text into buf (size bytes); its length, or -1 when invalid or too long. */
int etcd_unb64(const char *s, uint8_t *buf, size_t size);

#endif
