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
 *
 * With [transport] tcp_encryption = on the key also yields, by HKDF-SHA256
 * with the labels "rdmaxd-tcp-tls-psk-v1" and "rdmaxd-tcp-tls-id-v1", the
 * TLS 1.3 external PSK and the key fingerprint sent as its identity.
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

int auth_hkdf_sha256(const uint8_t *salt, size_t salt_len, const uint8_t *ikm, size_t ikm_len,
		     const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len)
{
	static const uint8_t zero_salt[crypto_auth_hmacsha256_BYTES];
	crypto_auth_hmacsha256_state state;
	uint8_t prk[crypto_auth_hmacsha256_BYTES];
	uint8_t t[crypto_auth_hmacsha256_BYTES];
	size_t done = 0;

	if (out_len > 255 * sizeof(t)) {
		return -EINVAL;
	}
	if (!salt || salt_len == 0) {
		salt = zero_salt;
		salt_len = sizeof(zero_salt);
	}
	crypto_auth_hmacsha256_init(&state, salt, salt_len);
	crypto_auth_hmacsha256_update(&state, ikm, ikm_len);
	crypto_auth_hmacsha256_final(&state, prk);
	for (uint8_t i = 1; done < out_len; i++) {
		crypto_auth_hmacsha256_init(&state, prk, sizeof(prk));
		if (i > 1) {
			crypto_auth_hmacsha256_update(&state, t, sizeof(t));
		}
		crypto_auth_hmacsha256_update(&state, info, info_len);
		crypto_auth_hmacsha256_update(&state, &i, 1);
		crypto_auth_hmacsha256_final(&state, t);
		size_t n = MIN(sizeof(t), out_len - done);
		memcpy(out + done, t, n);
		done += n;
	}
	sodium_memzero(&state, sizeof(state));
	sodium_memzero(prk, sizeof(prk));
	sodium_memzero(t, sizeof(t));
	return 0;
}

int auth_tls_psk(const uint8_t *key, size_t key_len, uint8_t *ret_psk, uint8_t *ret_id)
{
	static const char psk_label[] = "rdmaxd-tcp-tls-psk-v1";
	static const char id_label[] = "rdmaxd-tcp-tls-id-v1";

	if (!key || key_len == 0) {
		return -EINVAL;
	}
	auth_hkdf_sha256(NULL, 0, key, key_len, (const uint8_t *)psk_label, strlen(psk_label),
			 ret_psk, AUTH_TLS_PSK_BYTES);
	auth_hkdf_sha256(NULL, 0, key, key_len, (const uint8_t *)id_label, strlen(id_label), ret_id,
			 AUTH_TLS_ID_BYTES);
	return 0;
}

bool auth_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
	return sodium_memcmp(a, b, n) == 0;
}
