/* SPDX-License-Identifier: MIT */
/*
 * HMAC-SHA256 proofs for the daemon-to-daemon handshake. This module owns
 * the exact bytes that are authenticated; it never logs keys or MACs and
 * never compares secrets with memcmp.
 *
 * Authenticated message: label || client_nonce || server_nonce ||
 * client_instance (u64 LE) || server_instance (u64 LE), with the label
 * "rdmaxd-tcp-auth-v1 client" or "rdmaxd-tcp-auth-v1 server". The HMAC key
 * is SHA-256 of the shared key, because HMAC pads short keys with zeros and
 * would otherwise treat "k" and "k\0" as the same key.
 */
#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "auth.h"
#include "util.h"
#include "rdmax.h"

_Static_assert(AUTH_MAC_BYTES == crypto_auth_hmacsha256_BYTES, "MAC size");

static const char *const g_labels[AUTH_ROLE_MAX] = {
	[AUTH_ROLE_CLIENT] = "rdmaxd-tcp-auth-v1 client",
	[AUTH_ROLE_SERVER] = "rdmaxd-tcp-auth-v1 server",
};

int auth_init(void)
{
	return sodium_init() < 0 ? -EIO : 0;
}

void auth_nonce(uint8_t *nonce)
{
	randombytes_buf(nonce, AUTH_NONCE_BYTES);
}

int auth_compute(const uint8_t *key, size_t key_len, enum auth_role role,
		 const struct auth_transcript *transcript, uint8_t *ret_mac)
{
	crypto_auth_hmacsha256_state state;
	uint8_t hashed_key[crypto_hash_sha256_BYTES];
	uint8_t ids[16];

	if (!key || key_len == 0 || (unsigned)role >= AUTH_ROLE_MAX) {
		return -EINVAL;
	}
	put_le64(ids, transcript->client_instance);
	put_le64(ids + 8, transcript->server_instance);
	/* The label is sent with its NUL so one label can never be a prefix of the other's input.
	 */
	crypto_hash_sha256(hashed_key, key, key_len);
	crypto_auth_hmacsha256_init(&state, hashed_key, sizeof(hashed_key));
	crypto_auth_hmacsha256_update(&state, (const uint8_t *)g_labels[role],
				      strlen(g_labels[role]) + 1);
	crypto_auth_hmacsha256_update(&state, transcript->client_nonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&state, transcript->server_nonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&state, ids, sizeof(ids));
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
