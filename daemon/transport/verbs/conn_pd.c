/* SPDX-License-Identifier: MIT */
/*
 * The private data of the verbs transport's connection set-up: connect
 * requests, accepts, rejects, queries and verdicts, their HMAC proofs and the
 * replay memory of the passive side. Encoding and strict checking only; the
 * state machine that acts on them is conn.c's.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "conn.h"
#include "log.h"
#include "util.h"

#define REPLAY_MAX 8192 /* remembered connect requests (per CONN_AUTH_WINDOW_MS) */

/*
 * Connect request (CONN_PD_REQ_LEN bytes, little-endian):
 *   0 magic u32 | 4 version u8 | 5 type u8 | 6 flags u8 (bit 0: proof, bit 1: domain)
 *   7 n_links u8 | 8 link_index u8 | 9 domain u24 (zero without bit 1) | 12 group u32
 *  16 instance u64 | 24 time_ms u64 | 32 nonce[8] | 40 proof[16]
 * Accept: 0 magic | 4 version | 5 type | 6 flags | 7 zero | 8 instance u64 | 16 proof[32]
 * Reject: 0 magic | 4 version | 5 type | 6 reason u8 | 7 zero | 8 text (NUL-padded);
 *         for CONN_REJ_DOMAIN(_GONE), 48 the refusing daemon's instance u64 (stale
 *         descriptors)
 *
 * The proofs are auth_compute() over a transcript made of the request and
 * the address and port the requester connects to, so a request cannot be
 * replayed to another daemon; the accept's proof also covers the accepting
 * daemon's instance, which the requester then trusts for stale checks.
 *
 * A request for a protection domain (per-uid isolation at the accepting
 * daemon) names the domain and proves the domain's token, which only
 * descriptors of that domain's regions carry: its nonce is then not random
 * but conn_pd_domain_proof() of the token over bytes 0..31, so the token
 * never crosses the wire and the request stays unique (the attempt id, link
 * index and time are in those bytes). The shared key's proof covers it too.
 */
#define FLAG_PROOF  0x1u
#define FLAG_DOMAIN 0x2u

void conn_pd_domain_proof(const uint8_t *req, uint64_t domain_token, uint8_t ret_proof[8])
{
	struct auth_transcript tr;
	uint8_t key[8];
	uint8_t mac[AUTH_MAC_BYTES];

	memset(&tr, 0, sizeof(tr));
	memcpy(tr.client_nonce, req, 32);
	memcpy(tr.server_nonce, "VRD1", 4);
	put_le64(key, domain_token);
	if (auth_compute(key, sizeof(key), AUTH_ROLE_CLIENT, &tr, mac) < 0) {
		/* Cannot happen with a non-empty key; an all-zero proof matches nothing useful. */
		memset(mac, 0, sizeof(mac));
	}
	memcpy(ret_proof, mac, 8);
}

bool conn_pd_domain_ok(const uint8_t *pd, size_t len, uint64_t domain_token)
{
	uint8_t proof[8];

	if (!pd || len < CONN_PD_REQ_LEN || !(pd[6] & FLAG_DOMAIN)) {
		return false;
	}
	conn_pd_domain_proof(pd, domain_token, proof);
	return auth_equal(proof, pd + 32, sizeof(proof));
}
void conn_pd_transcript(struct auth_transcript *tr, const uint8_t *req,
			const uint8_t server_addr[16], uint16_t server_port,
			uint64_t server_instance)
{
	uint8_t *s = tr->server_nonce;

	memset(tr, 0, sizeof(*tr));
	memcpy(tr->client_nonce, req, 32);
	memcpy(s, "VRB1", 4);
	s[4] = (uint8_t)server_port;
	s[5] = (uint8_t)(server_port >> 8);
	memcpy(s + 8, req + 32, 8);
	memcpy(s + 16, server_addr, 16);
	tr->client_instance = get_le64(req + 16);
	tr->server_instance = server_instance;
}

int conn_addr_bytes(const struct sockaddr *sa, uint8_t ret_addr[16], uint16_t *ret_port)
{
	return auth_endpoint(sa, ret_addr, ret_port);
}

int conn_addr_parse(const char *addr, uint8_t ret_addr[16])
{
	struct in_addr a4;
	struct in6_addr a6;

	if (inet_pton(AF_INET, addr, &a4) == 1) {
		memset(ret_addr, 0, 10);
		ret_addr[10] = ret_addr[11] = 0xff;
		memcpy(ret_addr + 12, &a4, 4);
		return 0;
	}
	if (inet_pton(AF_INET6, addr, &a6) == 1) {
		memcpy(ret_addr, &a6, 16);
		return 0;
	}
	return -EINVAL;
}

int conn_pd_connect(uint8_t *buf, uint8_t link_index, uint8_t n_links, uint32_t group,
		    uint64_t instance, uint64_t time_ms, const uint8_t *key, size_t key_len,
		    const uint8_t server_addr[16], uint16_t server_port, uint32_t domain,
		    uint64_t domain_token)
{
	struct auth_transcript tr;
	uint8_t mac[AUTH_MAC_BYTES];
	uint8_t nonce[8];

	memset(buf, 0, CONN_PD_REQ_LEN);
	put_le32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_CONNECT;
	buf[6] = key && key_len ? FLAG_PROOF : 0;
	buf[7] = n_links;
	buf[8] = link_index;
	if (domain) {
		buf[6] |= FLAG_DOMAIN;
		buf[9] = (uint8_t)domain;
		buf[10] = (uint8_t)(domain >> 8);
		buf[11] = (uint8_t)(domain >> 16);
	}
	put_le32(buf + 12, group);
	put_le64(buf + 16, instance);
	put_le64(buf + 24, time_ms);
	if (domain) {
		conn_pd_domain_proof(buf, domain_token, nonce);
	} else {
		/* The nonce makes every request distinct, which the replay check relies on. */
		random_bytes(nonce, sizeof(nonce));
	}
	memcpy(buf + 32, nonce, sizeof(nonce));
	if (key && key_len) {
		conn_pd_transcript(&tr, buf, server_addr, server_port, 0);
		if (auth_compute(key, key_len, AUTH_ROLE_CLIENT, &tr, mac) == 0) {
			memcpy(buf + 40, mac, CONN_PD_MAC_LEN);
		}
	}
	return CONN_PD_REQ_LEN;
}

static void replay_sweep(struct conn_table *t, uint64_t now)
{
	uint64_t key;
	void *value;
	size_t iter = 0;
	uint64_t dead[64];
	size_t n = 0;

	while (n < ARRAY_SIZE(dead) && hmap_next(&t->replay, &iter, &key, &value)) {
		if ((uint64_t)(uintptr_t)value <= now) {
			dead[n++] = key;
		}
	}
	for (size_t i = 0; i < n; i++) {
		hmap_del(&t->replay, dead[i]);
	}
}

enum conn_reject_reason conn_pd_check(struct conn_table *t, const uint8_t *pd, size_t len,
				      const uint8_t server_addr[16], uint16_t server_port,
				      uint64_t now_real_ms, struct conn_request *ret_req)
{
	struct conn_request req;

	if (!pd || len < CONN_PD_REQ_LEN || get_le32(pd) != CONN_PD_MAGIC ||
	    pd[4] != CONN_PD_VERSION || pd[5] != CONN_PD_CONNECT) {
		return CONN_REJ_VERSION;
	}
	memset(&req, 0, sizeof(req));
	req.has_mac = pd[6] & FLAG_PROOF;
	req.n_links = pd[7];
	req.link_index = pd[8];
	req.domain = (uint32_t)pd[9] | (uint32_t)pd[10] << 8 | (uint32_t)pd[11] << 16;
	if ((pd[6] & ~(FLAG_PROOF | FLAG_DOMAIN)) || !(pd[6] & FLAG_DOMAIN) != (req.domain == 0)) {
		return CONN_REJ_VERSION;
	}
	req.group = get_le32(pd + 12);
	req.instance = get_le64(pd + 16);
	req.time_ms = get_le64(pd + 24);
	if (req.n_links == 0 || req.link_index >= req.n_links) {
		return CONN_REJ_VERSION;
	}
	if (!t->key) {
		if (req.has_mac) {
			return CONN_REJ_AUTH_UNUSED;
		}
		*ret_req = req;
		return CONN_REJ_NONE;
	}
	if (!req.has_mac) {
		return CONN_REJ_AUTH_REQUIRED;
	}
	struct auth_transcript tr;
	uint8_t mac[AUTH_MAC_BYTES];
	conn_pd_transcript(&tr, pd, server_addr, server_port, 0);
	if (auth_compute(t->key, t->key_len, AUTH_ROLE_CLIENT, &tr, mac) < 0 ||
	    !auth_equal(mac, pd + 40, CONN_PD_MAC_LEN)) {
		return CONN_REJ_AUTH_FAILED;
	}
	/* Only a request with a valid proof reaches the clock and replay checks. */
	uint64_t skew =
		req.time_ms > now_real_ms ? req.time_ms - now_real_ms : now_real_ms - req.time_ms;
	if (skew > CONN_AUTH_WINDOW_MS) {
		return CONN_REJ_CLOCK;
	}
	uint64_t key = get_le64(pd + 40);
	if (key == 0 || key == UINT64_MAX) {
		key = 1;
	}
	if (hmap_get(&t->replay, key)) {
		return CONN_REJ_REPLAY;
	}
	if (t->replay.count >= REPLAY_MAX) {
		replay_sweep(t, now_real_ms);
		if (t->replay.count >= REPLAY_MAX) {
			return CONN_REJ_RESOURCES;
		}
	}
	/* Remembered until a replay would fail the clock check anyway. */
	uint64_t expiry = req.time_ms + CONN_AUTH_WINDOW_MS + 1;
	if (hmap_put(&t->replay, key, (void *)(uintptr_t)expiry) < 0) {
		return CONN_REJ_RESOURCES;
	}
	*ret_req = req;
	return CONN_REJ_NONE;
}

int conn_pd_accept(uint8_t *buf, size_t size, const struct conn_table *t, const uint8_t *request,
		   const uint8_t server_addr[16], uint16_t server_port)
{
	size_t len = 16 + (t->key ? AUTH_MAC_BYTES : 0);

	if (size < len) {
		return -ENOSPC;
	}
	memset(buf, 0, len);
	put_le32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_ACCEPT;
	put_le64(buf + 8, t->instance);
	if (t->key) {
		struct auth_transcript tr;
		conn_pd_transcript(&tr, request, server_addr, server_port, t->instance);
		if (auth_compute(t->key, t->key_len, AUTH_ROLE_SERVER, &tr, buf + 16) < 0) {
			return -EINVAL;
		}
		buf[6] = 1;
	}
	return (int)len;
}

const char *conn_reject_reason_str(enum conn_reject_reason reason)
{
	static const char *const names[CONN_REJ_MAX] = {
		[CONN_REJ_NONE] = "accepted",
		[CONN_REJ_AUTH_REQUIRED] = "authentication required (it has a shared key)",
		[CONN_REJ_AUTH_FAILED] = "authentication failed (different shared key)",
		[CONN_REJ_AUTH_UNUSED] = "it has no shared key but the request carried a proof",
		[CONN_REJ_CLOCK] = "request time outside the allowed clock skew",
		[CONN_REJ_REPLAY] = "replayed connect request",
		[CONN_REJ_VERSION] = "unsupported protocol version or malformed request",
		[CONN_REJ_LIMIT] = "connection limit reached",
		[CONN_REJ_RESOURCES] = "no resources for another queue pair",
		[CONN_REJ_SHUTDOWN] = "shutting down",
		[CONN_REJ_DOMAIN] = "protection domain not proven",
		[CONN_REJ_DOMAIN_GONE] = "protection domain gone (deregistered)",
	};
	return (unsigned)reason < CONN_REJ_MAX ? names[reason] : "unknown reason";
}

int conn_pd_reject(uint8_t *buf, size_t size, enum conn_reject_reason reason)
{
	const char *text = conn_reject_reason_str(reason);
	size_t len = 56;

	if (size < len) {
		return -ENOSPC;
	}
	memset(buf, 0, len);
	put_le32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_REJECT;
	buf[6] = (uint8_t)reason;
	memcpy(buf + 8, text, MIN(strlen(text), len - 9));
	return (int)len;
}

int conn_pd_reject_domain(uint8_t *buf, size_t size, enum conn_reject_reason reason,
			  uint64_t instance)
{
	int len = conn_pd_reject(buf, size, reason);

	/* The reason's text ends before byte 48 (conn_reject_reason_str() is short). */
	if (len >= 56) {
		put_le64(buf + 48, instance);
	}
	return len;
}

uint64_t conn_pd_reject_instance(const uint8_t *pd, size_t len)
{
	if (!pd || len < 56 || get_le32(pd) != CONN_PD_MAGIC || pd[5] != CONN_PD_REJECT ||
	    (pd[6] != CONN_REJ_DOMAIN && pd[6] != CONN_REJ_DOMAIN_GONE) || pd[47] != 0) {
		return 0;
	}
	return get_le64(pd + 48);
}

int conn_pd_type(const uint8_t *pd, size_t len)
{
	if (!pd || len < 8 || get_le32(pd) != CONN_PD_MAGIC || pd[4] != CONN_PD_VERSION ||
	    pd[5] == 0 || pd[5] >= CONN_PD_TYPE_MAX) {
		return 0;
	}
	return pd[5];
}

/*
 * Probe query (CONN_PD_REQ_LEN bytes):
 *   0 magic | 4 version | 5 type | 6 flags (bit 0: proof) | 7 access u8
 *   8 region_id u64 | 16 region_key u64 | 24 offset u64 | 32 length u64 | 40 proof[16]
 * Verdict (in the reject): 0 magic | 4 version | 5 type | 6..7 zero | 8 verdict i32
 * The query's proof has no nonce: a replayed query only repeats an answer to
 * whoever sent the original, and allocates nothing.
 */
static void query_transcript(struct auth_transcript *tr, const uint8_t *req,
			     const uint8_t server_addr[16], uint16_t server_port)
{
	uint8_t *s = tr->server_nonce;

	memset(tr, 0, sizeof(*tr));
	memcpy(tr->client_nonce, req, 32);
	memcpy(s, "VRQ1", 4);
	s[4] = (uint8_t)server_port;
	s[5] = (uint8_t)(server_port >> 8);
	memcpy(s + 8, req + 32, 8);
	memcpy(s + 16, server_addr, 16);
}

int conn_pd_query(uint8_t *buf, const struct conn_query *q, const uint8_t *key, size_t key_len,
		  const uint8_t server_addr[16], uint16_t server_port)
{
	struct auth_transcript tr;
	uint8_t mac[AUTH_MAC_BYTES];

	memset(buf, 0, CONN_PD_REQ_LEN);
	put_le32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_QUERY;
	buf[6] = key && key_len ? 1 : 0;
	buf[7] = (uint8_t)q->access;
	put_le64(buf + 8, q->region_id);
	put_le64(buf + 16, q->region_key);
	put_le64(buf + 24, q->offset);
	put_le64(buf + 32, q->length);
	if (key && key_len) {
		query_transcript(&tr, buf, server_addr, server_port);
		if (auth_compute(key, key_len, AUTH_ROLE_CLIENT, &tr, mac) == 0) {
			memcpy(buf + 40, mac, CONN_PD_MAC_LEN);
		}
	}
	return CONN_PD_REQ_LEN;
}

enum conn_reject_reason conn_pd_check_query(const struct conn_table *t, const uint8_t *pd,
					    size_t len, const uint8_t server_addr[16],
					    uint16_t server_port, struct conn_query *ret_query)
{
	struct conn_query q;

	if (len < CONN_PD_REQ_LEN || conn_pd_type(pd, len) != CONN_PD_QUERY) {
		return CONN_REJ_VERSION;
	}
	bool has_mac = pd[6] & 1;
	if (!t->key && has_mac) {
		return CONN_REJ_AUTH_UNUSED;
	}
	if (t->key) {
		struct auth_transcript tr;
		uint8_t mac[AUTH_MAC_BYTES];
		if (!has_mac) {
			return CONN_REJ_AUTH_REQUIRED;
		}
		query_transcript(&tr, pd, server_addr, server_port);
		if (auth_compute(t->key, t->key_len, AUTH_ROLE_CLIENT, &tr, mac) < 0 ||
		    !auth_equal(mac, pd + 40, CONN_PD_MAC_LEN)) {
			return CONN_REJ_AUTH_FAILED;
		}
	}
	q.access = pd[7];
	if (q.access != RDMAX_ACCESS_REMOTE_READ && q.access != RDMAX_ACCESS_REMOTE_WRITE) {
		return CONN_REJ_VERSION;
	}
	q.region_id = get_le64(pd + 8);
	q.region_key = get_le64(pd + 16);
	q.offset = get_le64(pd + 24);
	q.length = get_le64(pd + 32);
	*ret_query = q;
	return CONN_REJ_NONE;
}

int conn_pd_verdict(uint8_t *buf, size_t size, int verdict)
{
	if (size < 12) {
		return -ENOSPC;
	}
	memset(buf, 0, 12);
	put_le32(buf, CONN_PD_MAGIC);
	buf[4] = CONN_PD_VERSION;
	buf[5] = CONN_PD_VERDICT;
	put_le32(buf + 8, (uint32_t)verdict);
	return 12;
}
