/* SPDX-License-Identifier: MIT */
/*
 * Mutual challenge-response between two daemons that share a key. Each side
 * sends a fresh random nonce in its HELLO; each then proves knowledge of the
 * key with HMAC-SHA256 over a role label, both nonces and both instance ids.
 * The label differs per role, so a server's answer reflected back as a
 * client's proof fails; fresh nonces make a recorded answer useless later.
 * A channel-bound transcript (the TCP handshake) also covers both ends of
 * the connection as each side sees them (the address and port dialled and
 * accepted), so a proof relayed through a third host fails.
 */
#ifndef RDMAXD_AUTH_H
#define RDMAXD_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_NONCE_BYTES   32
#define AUTH_MAC_BYTES     32
#define AUTH_TLS_PSK_BYTES 32 /* TLS 1.3 external PSK derived from the shared key */
#define AUTH_TLS_ID_BYTES  8  /* key fingerprint in the PSK identity */

/* Which side of a connection computes the proof. */
enum auth_role {
	AUTH_ROLE_CLIENT, /* the daemon that connected */
	AUTH_ROLE_SERVER, /* the daemon that accepted */
	AUTH_ROLE_MAX,    /* terminator */
};

/* What both sides saw in the HELLO exchange. */
struct auth_transcript {
	uint8_t client_nonce[AUTH_NONCE_BYTES];
	uint8_t server_nonce[AUTH_NONCE_BYTES];
	uint64_t client_instance;
	uint64_t server_instance;
	/* Channel binding; ignored unless `bound` (IPv4 as ::ffff:a.b.c.d). */
	bool bound;
	uint8_t client_addr[16];
	uint16_t client_port;
	uint8_t server_addr[16];
	uint16_t server_port;
};

/*
 * Initialise libsodium (idempotent).
 * \return 0 or -EIO when libsodium cannot start
 */
int auth_init(void);

/* Fill nonce with AUTH_NONCE_BYTES random bytes (auth_init() first). */
void auth_nonce(uint8_t *nonce);

/*
 * The 16 address bytes and the port of a socket address, as the bound
 * transcript holds them (IPv4 as ::ffff:a.b.c.d, so a dual-stack socket and
 * an IPv4 one see the same bytes for one peer).
 * \return 0, or -EAFNOSUPPORT for a family other than AF_INET / AF_INET6
 */
struct sockaddr;
int auth_endpoint(const struct sockaddr *sa, uint8_t ret_addr[16], uint16_t *ret_port);

/*
 * Proof of `role` for this transcript.
 * \param key shared key, key_len > 0 bytes
 * \param ret_mac receives AUTH_MAC_BYTES
 * \return 0, or -EINVAL for an empty key or unknown role
 */
int auth_compute(const uint8_t *key, size_t key_len, enum auth_role role,
		 const struct auth_transcript *transcript, uint8_t *ret_mac);

/*
 * Check a peer's proof in constant time.
 * \return 0 when mac is the proof of `role`, RDMAX_E_PERMISSION_DENIED otherwise
 *         (-EINVAL for an empty key or unknown role)
 */
int auth_verify(const uint8_t *key, size_t key_len, enum auth_role role,
		const struct auth_transcript *transcript, const uint8_t *mac);

/*
 * HKDF-SHA256 (RFC 5869): extract with salt (NULL or empty: 32 zero bytes),
 * expand with info into out_len bytes.
 * \return 0, or -EINVAL when out_len exceeds 255 * 32 bytes
 */
int auth_hkdf_sha256(const uint8_t *salt, size_t salt_len, const uint8_t *ikm, size_t ikm_len,
		     const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len);

/*
 * The TLS external PSK of the shared key and a fingerprint of it that may
 * travel in the clear (the PSK identity), each HKDF-SHA256 of the key with
 * its own label, so neither reveals the key, the HMAC proofs or the other.
 * \param ret_psk receives AUTH_TLS_PSK_BYTES
 * \param ret_id receives AUTH_TLS_ID_BYTES
 * \return 0, or -EINVAL for an empty key
 */
int auth_tls_psk(const uint8_t *key, size_t key_len, uint8_t *ret_psk, uint8_t *ret_id);

/* Whether n bytes of a and b are equal, in constant time (proofs must not leak a prefix). */
bool auth_equal(const uint8_t *a, const uint8_t *b, size_t n);

#endif
