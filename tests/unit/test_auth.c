/* SPDX-License-Identifier: MIT */
/* Handshake proofs: only the key holder, for this exchange, in its own role. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "auth.h"
#include "rdmax.h"

static const uint8_t g_key[] = "correct horse battery staple, 32+";
static const uint8_t g_other_key[] = "correct horse battery staple, 32-";

static struct auth_transcript sample(void)
{
	struct auth_transcript t = {.client_instance = 0x1111, .server_instance = 0x2222};

	ck_assert_int_eq(auth_init(), 0);
	auth_nonce(t.client_nonce);
	auth_nonce(t.server_nonce);
	return t;
}

START_TEST(right_key_accepted)
{
	struct auth_transcript t = sample();
	uint8_t client_mac[AUTH_MAC_BYTES], server_mac[AUTH_MAC_BYTES];

	ck_assert_int_eq(auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, client_mac), 0);
	ck_assert_int_eq(auth_compute(g_key, sizeof(g_key), AUTH_ROLE_SERVER, &t, server_mac), 0);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, client_mac), 0);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_SERVER, &t, server_mac), 0);
	/* Deterministic for one transcript. */
	uint8_t again[AUTH_MAC_BYTES];
	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, again);
	ck_assert_mem_eq(again, client_mac, AUTH_MAC_BYTES);
}
END_TEST

START_TEST(wrong_key_rejected)
{
	struct auth_transcript t = sample();
	uint8_t mac[AUTH_MAC_BYTES];

	auth_compute(g_other_key, sizeof(g_other_key), AUTH_ROLE_CLIENT, &t, mac);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, mac),
			 RDMAX_E_PERMISSION_DENIED);
	/* A key that differs only by a trailing NUL is a different key. */
	auth_compute(g_key, sizeof(g_key) - 1, AUTH_ROLE_CLIENT, &t, mac);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, mac),
			 RDMAX_E_PERMISSION_DENIED);
	/* A flipped bit of a right proof is rejected. */
	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, mac);
	mac[AUTH_MAC_BYTES - 1] ^= 1;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, mac),
			 RDMAX_E_PERMISSION_DENIED);
}
END_TEST

START_TEST(tampered_nonce_rejected)
{
	struct auth_transcript t = sample();
	uint8_t mac[AUTH_MAC_BYTES];

	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, mac);
	struct auth_transcript bad = t;
	bad.client_nonce[5] ^= 0x40;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
	bad = t;
	bad.server_nonce[AUTH_NONCE_BYTES - 1] ^= 1;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
	/* Swapped nonces (the peer's answer to a mirrored exchange) do not verify either. */
	bad = t;
	memcpy(bad.client_nonce, t.server_nonce, AUTH_NONCE_BYTES);
	memcpy(bad.server_nonce, t.client_nonce, AUTH_NONCE_BYTES);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
}
END_TEST

START_TEST(tampered_instance_rejected)
{
	struct auth_transcript t = sample();
	uint8_t mac[AUTH_MAC_BYTES];

	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_SERVER, &t, mac);
	struct auth_transcript bad = t;
	bad.server_instance++;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_SERVER, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
	bad = t;
	bad.client_instance ^= 1ull << 63;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_SERVER, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
}
END_TEST

/* A server's proof sent back to it as a client's proof must fail, and vice versa. */
START_TEST(role_reflection_rejected)
{
	struct auth_transcript t = sample();
	uint8_t server_mac[AUTH_MAC_BYTES], client_mac[AUTH_MAC_BYTES];

	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_SERVER, &t, server_mac);
	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, client_mac);
	ck_assert_mem_ne(server_mac, client_mac, AUTH_MAC_BYTES);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, server_mac),
			 RDMAX_E_PERMISSION_DENIED);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_SERVER, &t, client_mac),
			 RDMAX_E_PERMISSION_DENIED);
}
END_TEST

/* A proof recorded from one exchange is useless in the next (fresh nonces). */
START_TEST(replay_rejected)
{
	struct auth_transcript first = sample();
	struct auth_transcript second = first;
	uint8_t recorded[AUTH_MAC_BYTES];

	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &first, recorded);
	auth_nonce(second.server_nonce);
	ck_assert_mem_ne(second.server_nonce, first.server_nonce, AUTH_NONCE_BYTES);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &second, recorded),
			 RDMAX_E_PERMISSION_DENIED);
}
END_TEST

/*
 * A bound proof covers both ends of the connection: the same exchange seen
 * through a relay (other address or port at either end) does not verify,
 * and neither does the unbound (v1) proof of the same exchange.
 */
START_TEST(bound_ends_rejected)
{
	struct auth_transcript t = sample();
	uint8_t mac[AUTH_MAC_BYTES], unbound[AUTH_MAC_BYTES];
	struct sockaddr_in client = {.sin_family = AF_INET, .sin_port = htons(40000)};
	struct sockaddr_in6 server = {.sin6_family = AF_INET6, .sin6_port = htons(7471)};

	client.sin_addr.s_addr = htonl(0x0a000001);
	server.sin6_addr.s6_addr[15] = 1;
	ck_assert_int_eq(auth_endpoint((struct sockaddr *)&client, t.client_addr, &t.client_port),
			 0);
	ck_assert_int_eq(auth_endpoint((struct sockaddr *)&server, t.server_addr, &t.server_port),
			 0);
	ck_assert_uint_eq(t.client_port, 40000);
	ck_assert_uint_eq(t.client_addr[10], 0xff); /* IPv4 as ::ffff:10.0.0.1 */
	ck_assert_uint_eq(t.client_addr[15], 1);
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	uint8_t addr[16];
	uint16_t port;
	ck_assert_int_eq(auth_endpoint((struct sockaddr *)&un, addr, &port), -EAFNOSUPPORT);

	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, unbound);
	t.bound = true;
	auth_compute(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, mac);
	ck_assert_mem_ne(mac, unbound, AUTH_MAC_BYTES);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, mac), 0);
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &t, unbound),
			 RDMAX_E_PERMISSION_DENIED);
	struct auth_transcript bad = t;
	bad.client_port++;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
	bad = t;
	bad.server_port++;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
	bad = t;
	bad.client_addr[15] ^= 2;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
	bad = t;
	bad.server_addr[0] ^= 0x80;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
	/* The two ends swapped (a reflected connection) differ too. */
	bad = t;
	memcpy(bad.client_addr, t.server_addr, 16);
	memcpy(bad.server_addr, t.client_addr, 16);
	bad.client_port = t.server_port;
	bad.server_port = t.client_port;
	ck_assert_int_eq(auth_verify(g_key, sizeof(g_key), AUTH_ROLE_CLIENT, &bad, mac),
			 RDMAX_E_PERMISSION_DENIED);
}
END_TEST

START_TEST(bad_arguments)
{
	struct auth_transcript t = sample();
	uint8_t mac[AUTH_MAC_BYTES] = {0};

	ck_assert_int_eq(auth_compute(g_key, 0, AUTH_ROLE_CLIENT, &t, mac), -EINVAL);
	ck_assert_int_eq(auth_compute(NULL, 8, AUTH_ROLE_CLIENT, &t, mac), -EINVAL);
	ck_assert_int_eq(auth_compute(g_key, sizeof(g_key), AUTH_ROLE_MAX, &t, mac), -EINVAL);
	ck_assert_int_eq(auth_verify(g_key, 0, AUTH_ROLE_CLIENT, &t, mac), -EINVAL);

	/* Keys longer than the hash block are hashed first; still only the right one works. */
	uint8_t long_key[200];
	memset(long_key, 0xab, sizeof(long_key));
	ck_assert_int_eq(auth_compute(long_key, sizeof(long_key), AUTH_ROLE_CLIENT, &t, mac), 0);
	ck_assert_int_eq(auth_verify(long_key, sizeof(long_key), AUTH_ROLE_CLIENT, &t, mac), 0);
	long_key[199] ^= 1;
	ck_assert_int_eq(auth_verify(long_key, sizeof(long_key), AUTH_ROLE_CLIENT, &t, mac),
			 RDMAX_E_PERMISSION_DENIED);
}
END_TEST

static void hex_eq(const uint8_t *got, const char *hex, size_t n)
{
	char text[2 * 64 + 1];

	ck_assert_uint_le(n, 64);
	for (size_t i = 0; i < n; i++) {
		snprintf(text + 2 * i, 3, "%02x", got[i]);
	}
	ck_assert_str_eq(text, hex);
}

/* RFC 5869 test cases 1 and 3 (SHA-256): the derivation is HKDF, not something like it. */
START_TEST(hkdf_rfc5869)
{
	uint8_t ikm[22], salt[13], info[10], okm[42];

	memset(ikm, 0x0b, sizeof(ikm));
	for (size_t i = 0; i < sizeof(salt); i++) {
		salt[i] = (uint8_t)i;
	}
	for (size_t i = 0; i < sizeof(info); i++) {
		info[i] = (uint8_t)(0xf0 + i);
	}
	ck_assert_int_eq(auth_init(), 0);
	ck_assert_int_eq(auth_hkdf_sha256(salt, sizeof(salt), ikm, sizeof(ikm), info, sizeof(info),
					  okm, sizeof(okm)),
			 0);
	hex_eq(okm,
	       "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185"
	       "865",
	       sizeof(okm));
	ck_assert_int_eq(auth_hkdf_sha256(NULL, 0, ikm, sizeof(ikm), NULL, 0, okm, sizeof(okm)), 0);
	hex_eq(okm,
	       "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96"
	       "c8",
	       sizeof(okm));
	ck_assert_int_eq(auth_hkdf_sha256(NULL, 0, ikm, sizeof(ikm), NULL, 0, okm, 255 * 32 + 1),
			 -EINVAL);
}
END_TEST

/* The TLS PSK and its identity: pinned values (both daemons must agree), one per key. */
START_TEST(tls_psk_derivation)
{
	static const uint8_t key[] = "peer-test-key-0123456789abcdef\n";
	uint8_t psk[AUTH_TLS_PSK_BYTES], id[AUTH_TLS_ID_BYTES];
	uint8_t psk2[AUTH_TLS_PSK_BYTES], id2[AUTH_TLS_ID_BYTES];

	ck_assert_int_eq(auth_init(), 0);
	ck_assert_int_eq(auth_tls_psk(key, sizeof(key) - 1, psk, id), 0);
	hex_eq(psk, "f10012aa686ee0d43270bc0b85e04523f2476b5f4b51903bb561fc56afbe93c1",
	       sizeof(psk));
	hex_eq(id, "fc8a05cf23f88923", sizeof(id));
	/* One more byte (even a NUL) is another key, with another PSK and identity. */
	uint8_t longer[sizeof(key)];
	memcpy(longer, key, sizeof(key));
	ck_assert_int_eq(auth_tls_psk(longer, sizeof(longer), psk2, id2), 0);
	ck_assert(memcmp(psk, psk2, sizeof(psk)) != 0);
	ck_assert(memcmp(id, id2, sizeof(id)) != 0);
	/* The PSK is not the HMAC key of the proofs, nor does the identity give away its start. */
	ck_assert(memcmp(psk, id, sizeof(id)) != 0);
	ck_assert_int_eq(auth_tls_psk(key, 0, psk2, id2), -EINVAL);
	ck_assert_int_eq(auth_tls_psk(NULL, 8, psk2, id2), -EINVAL);
}
END_TEST

Suite *auth_suite(void);

Suite *auth_suite(void)
{
	Suite *s = suite_create("auth");
	TCase *tc = tcase_create("hmac");

	tcase_set_timeout(tc, 5);
	tcase_add_test(tc, right_key_accepted);
	tcase_add_test(tc, wrong_key_rejected);
	tcase_add_test(tc, tampered_nonce_rejected);
	tcase_add_test(tc, tampered_instance_rejected);
	tcase_add_test(tc, role_reflection_rejected);
	tcase_add_test(tc, replay_rejected);
	tcase_add_test(tc, bound_ends_rejected);
	tcase_add_test(tc, bad_arguments);
	tcase_add_test(tc, hkdf_rfc5869);
	tcase_add_test(tc, tls_psk_derivation);
	suite_add_tcase(s, tc);
	return s;
}
