/* SPDX-License-Identifier: MIT */
/*
 * HMAC-SHA256 proofs for the daemon-to-daemon handshake. This module owns
 * the exact bytes that are authenticated; it never logs keys or MACs and
 * never compares secrets with memcmp.
 *
 * Authenticated message: label || client_nonce || server_nonce ||
 * client_instance (u64 LE) || server_instance (u64 LE), with the label
 * "rdmaxd-tcp-auth-v1 client" or "rdmaxd-tcp-auth-v1 server". A bound
 * transcript uses the labels "rdmaxd-tcp-auth-v2 ..." and appends
 * client_addr[16] || client_port (u16 LE) || server_addr[16] || server_port
 * (u16 LE), the two ends of the TCP connection. The HMAC key
 * is SHA-256 of the shared key, because HMAC pads short keys with zeros and
 * would otherwise treat "k" and "k\0" as the same key.
 */
#include <errno.h>
#include <netinet/in.h>
#include <sodium.h>
#include <string.h>

#include "auth.h"
#include "util.h"
#include "rdmax.h"

_Static_assert(AUTH_MAC_BYTES == crypto_auth_hmacsha256_BYTES, "MAC size");

static const char *const g_labels[2][AUTH_ROLE_MAX] = {
	{
		[AUTH_ROLE_CLIENT] = "rdmaxd-tcp-auth-v1 client",
		[AUTH_ROLE_SERVER] = "rdmaxd-tcp-auth-v1 server",
	},
	{
		[AUTH_ROLE_CLIENT] = "rdmaxd-tcp-auth-v2 client",
		[AUTH_ROLE_SERVER] = "rdmaxd-tcp-auth-v2 server",
	},
};

int auth_init(void)
{
	return sodium_init() < 0 ? -EIO : 0;
}

void auth_nonce(uint8_t *nonce)
{
	randombytes_buf(nonce, AUTH_NONCE_BYTES);
}

int auth_endpoint(const struct sockaddr *sa, uint8_t ret_addr[16], uint16_t *ret_port)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
		memset(ret_addr, 0, 10);
		ret_addr[10] = ret_addr[11] = 0xff;
		memcpy(ret_addr + 12, &sin->sin_addr, 4);
		*ret_port = ntohs(sin->sin_port);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)sa;
		memcpy(ret_addr, &sin6->sin6_addr, 16);
		*ret_port = ntohs(sin6->sin6_port);
		return 0;
	}
	return -EAFNOSUPPORT;
}

int auth_compute(const uint8_t *key, size_t key_len, enum auth_role role,
		 const struct auth_transcript *transcript, uint8_t *ret_mac)
{
	crypto_auth_hmacsha256_state state;
	uint8_t hashed_key[crypto_hash_sha256_BYTES];
	uint8_t ids[16];
	uint8_t ends[36];

	if (!key || key_len == 0 || (unsigned)role >= AUTH_ROLE_MAX) {
		return -EINVAL;
	}
	put_le64(ids, transcript->client_instance);
	put_le64(ids + 8, transcript->server_instance);
	/* The label is sent with its NUL so one label can never be a prefix of the other's input.
	 */
	crypto_hash_sha256(hashed_key, key, key_len);
	crypto_auth_hmacsha256_init(&state, hashed_key, sizeof(hashed_key));
	const char *label = g_labels[transcript->bound][role];
	crypto_auth_hmacsha256_update(&state, (const uint8_t *)label, strlen(label) + 1);
	crypto_auth_hmacsha256_update(&state, transcript->client_nonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&state, transcript->server_nonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&state, ids, sizeof(ids));
	if (transcript->bound) {
		memcpy(ends, transcript->client_addr, 16);
		ends[16] = (uint8_t)transcript->client_port;
		ends[17] = (uint8_t)(transcript->client_port >> 8);
		memcpy(ends + 18, transcript->server_addr, 16);
		ends[34] = (uint8_t)transcript->server_port;
		ends[35] = (uint8_t)(transcript->server_port >> 8);
		crypto_auth_hmacsha256_update(&state, ends, sizeof(ends));
	}
	crypto_auth_hmacsha256_final(&state, ret_mac);
	sodium_memzero(&state, sizeof(state));
	sodium_memzero(hashed_key, sizeof(hashed_key));
	return 0;
}

int auth_verify(const uint8_t *key, size_t key_len, enum auth_role role,
		const struct auth_transcript *transcript, const uint8_t *mac)
{
	uint8_t expected[AUTH_MAC_BYTES];

	int err = auth_compute(key, key_len, role, transcript, expected);
	if (err < 0) {
		return err;
	}
	err = sodium_memcmp(expected, mac, AUTH_MAC_BYTES) == 0 ? 0 : RDMAX_E_PERMISSION_DENIED;
	sodium_memzero(expected, sizeof(expected));
	return err;
}

bool auth_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
	return sodium_memcmp(a, b, n) == 0;
}
