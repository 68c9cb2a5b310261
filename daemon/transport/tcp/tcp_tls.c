/* SPDX-License-Identifier: MIT */
/*
 * TLS 1.3 on TCP peer connections ([transport] tcp_encryption = on): an
 * external PSK derived from the shared key (auth_tls_psk()), no
 * certificates, no session tickets, AES-128-GCM, and (EC)DHE with the PSK so
 * every connection has keys of its own. The handshake runs non-blocking on
 * the connection's poll handle within its handshake deadline; after it the
 * HELLO exchange runs inside the channel. This module also owns the one I/O
 * seam of the transport: tcp_io_send()/tcp_io_recv() are sendmsg()/recvmsg()
 * on the socket for the plain wire and wherever kernel TLS carries a
 * direction, and SSL_write_ex()/SSL_read_ex() elsewhere, so the rest of the
 * transport never asks which. It never logs key material and never lets a
 * connection on which no PSK was agreed carry a frame.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "counters.h"
#include "tcp_internal.h"

#define TLS_CIPHER "TLS_AES_128_GCM_SHA256"
#define TLS_CIPHER_ID                                                                              \
	{                                                                                          \
		0x13, 0x01                                                                         \
	}
#define TLS_IDENTITY_PREFIX  "rdmaxd-psk-v1:"
#define TLS_IDENTITY_BYTES   (sizeof(TLS_IDENTITY_PREFIX) - 1 + 2 * AUTH_TLS_ID_BYTES)
#define TLS_RECORD_HANDSHAKE 0x16
#define TLS_RECORD_ALERT     0x15
#define TLS_WRITE_MAX        (1u << 20)   /* plaintext bytes per SSL_write_ex() */
#define TLS_READ_MAX         (256u << 10) /* plaintext bytes per tcp_io_recv() */

static int g_conn_index = -1; /* SSL ex_data slot holding the tcp_conn */

static struct tcp_conn *conn_of(SSL *ssl)
{
	return SSL_get_ex_data(ssl, g_conn_index);
}

/* The PSK session and identity of the daemon's current key (it may change on SIGHUP). */
static SSL_SESSION *psk_session(SSL *ssl, char ret_identity[TLS_IDENTITY_BYTES + 1])
{
	const struct rdmaxd *d = conn_of(ssl)->tt->daemon;
	static const unsigned char cipher_id[] = TLS_CIPHER_ID;
	uint8_t psk[AUTH_TLS_PSK_BYTES], id[AUTH_TLS_ID_BYTES];
	const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, cipher_id);
	SSL_SESSION *sess = NULL;

	if (!cipher || auth_tls_psk(d->auth_key, d->auth_key_len, psk, id) < 0) {
		return NULL;
	}
	int n = snprintf(ret_identity, TLS_IDENTITY_BYTES + 1, "%s", TLS_IDENTITY_PREFIX);
	for (size_t i = 0; i < sizeof(id); i++) {
		n += snprintf(ret_identity + n, TLS_IDENTITY_BYTES + 1 - (size_t)n, "%02x", id[i]);
	}
	sess = SSL_SESSION_new();
	if (!sess || !SSL_SESSION_set1_master_key(sess, psk, sizeof(psk)) ||
	    !SSL_SESSION_set_cipher(sess, cipher) ||
	    !SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION)) {
		SSL_SESSION_free(sess);
		sess = NULL;
	}
	OPENSSL_cleanse(psk, sizeof(psk));
	return sess;
}

static int on_psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **ret_id, size_t *ret_idlen,
		      SSL_SESSION **ret_sess)
{
	static char identity[TLS_IDENTITY_BYTES + 1]; /* read by OpenSSL before the next call */
	SSL_SESSION *sess = psk_session(ssl, identity);

	(void)md;
	if (!sess) {
		return 0;
	}
	*ret_id = (const unsigned char *)identity;
	*ret_idlen = TLS_IDENTITY_BYTES;
	*ret_sess = sess;
	return 1;
}

/*
 * An identity of another key is answered with no session, so the handshake
 * fails (there is no certificate to fall back on); the reason is logged here,
 * where it is known, and the peer sees a handshake_failure alert.
 */
static int on_psk_find(SSL *ssl, const unsigned char *identity, size_t identity_len,
		       SSL_SESSION **ret_sess)
{
	struct tcp_conn *conn = conn_of(ssl);
	char mine[TLS_IDENTITY_BYTES + 1];
	SSL_SESSION *sess = psk_session(ssl, mine);

	*ret_sess = NULL;
	if (!sess) {
		return 0;
	}
	if (identity_len != TLS_IDENTITY_BYTES || memcmp(identity, mine, identity_len) != 0) {
		bool ours =
			identity_len >= sizeof(TLS_IDENTITY_PREFIX) - 1 &&
			memcmp(identity, TLS_IDENTITY_PREFIX, sizeof(TLS_IDENTITY_PREFIX) - 1) == 0;
		snprintf(conn->tt->tls_reason, sizeof(conn->tt->tls_reason),
			 ours ? "its TLS key was derived from another [auth] key_file"
			      : "it offered an unknown TLS PSK identity");
		SSL_SESSION_free(sess);
		return 1;
	}
	*ret_sess = sess;
	return 1;
}

int tcp_tls_create(struct tcp_transport *tt)
{
	if (!tt->daemon->cfg.tcp_encryption) {
		return 0;
	}
	if (tt->daemon->auth_key_len == 0) {
		log_err("[transport] tcp_encryption = on needs a key: [auth] key_file is empty or "
			"unreadable");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (g_conn_index < 0) {
		g_conn_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
	}
	SSL_CTX *ctx = SSL_CTX_new(TLS_method());
	if (!ctx || g_conn_index < 0 || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(ctx, TLS_CIPHER) || !SSL_CTX_set_num_tickets(ctx, 0)) {
		log_err("setting up the TLS context failed: %s",
			ERR_reason_error_string(ERR_get_error()));
		SSL_CTX_free(ctx);
		return -EIO;
	}
	/* No tickets and no key updates: kernel TLS receives nothing but application data. */
	SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS | SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_clear_mode(ctx, SSL_MODE_AUTO_RETRY);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	SSL_CTX_set_psk_use_session_callback(ctx, on_psk_use);
	SSL_CTX_set_psk_find_session_callback(ctx, on_psk_find);
	tt->tls_ctx = ctx;
	return 0;
}

void tcp_tls_destroy(struct tcp_transport *tt)
{
	SSL_CTX_free(tt->tls_ctx);
	tt->tls_ctx = NULL;
}

void tcp_tls_free(struct tcp_conn *conn)
{
	SSL_free(conn->tls); /* no close_notify: the socket closes right after */
	conn->tls = NULL;
	free(conn->tls_stage);
	conn->tls_stage = NULL;
	conn->tls_peeked = conn->tls_ktx = conn->tls_krx = false;
}

/*
 * The connection now waits for the TLS handshake instead of the plain HELLO.
 * OpenSSL writes to the socket from the start but reads from an empty memory
 * BIO until the peer's first byte is known to be TLS (tcp_tls_drive()): a
 * peer with tcp_encryption = off answers in plain frames, which must reach
 * the frame parser, not the record layer.
 */
int tcp_tls_start(struct tcp_conn *conn)
{
	SSL *ssl = SSL_new(conn->tt->tls_ctx);
	BIO *wbio = BIO_new_socket(conn->fd, BIO_NOCLOSE);
	BIO *hold = BIO_new(BIO_s_mem());

	if (!ssl || !wbio || !hold || !SSL_set_ex_data(ssl, g_conn_index, conn)) {
		BIO_free(wbio);
		BIO_free(hold);
		SSL_free(ssl);
		return -ENOMEM;
	}
	BIO_set_mem_eof_return(hold, -1); /* empty: "try again", not end of stream */
	SSL_set_bio(ssl, hold, wbio);
	if (conn->outgoing) {
		SSL_set_connect_state(ssl);
	} else {
		SSL_set_accept_state(ssl);
	}
	conn->tls = ssl;
	conn->state = TCP_CONN_TLS;
	conn->tls_want = UV_READABLE;
	return 0;
}

/* The last OpenSSL error as text, for tt->tls_reason. */
static void note_ssl_error(struct tcp_conn *conn, const char *call)
{
	char text[160];
	unsigned long e = ERR_peek_last_error();

	if (e) {
		ERR_error_string_n(e, text, sizeof(text));
	} else {
		snprintf(text, sizeof(text), "%s", strerror(errno ? errno : EIO));
	}
	ERR_clear_error();
	snprintf(conn->tt->tls_reason, sizeof(conn->tt->tls_reason), "%s failed: %s", call, text);
}

/* The handshake failed for a reason TLS states: no retry, the jobs learn why. */
static void tls_refused(struct tcp_conn *conn, unsigned long e)
{
	char message[MSG_BYTES];
	char text[160];
	const char *why = conn->tt->tls_reason;

	ERR_error_string_n(e, text, sizeof(text));
	ERR_clear_error();
	if (conn->outgoing && ERR_GET_REASON(e) == SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE) {
		why = "the peer does not accept our TLS key: both daemons need the same "
		      "[auth] key_file";
	} else if (conn->outgoing || why[0] == '\0') {
		why = text;
	}
	snprintf(message, sizeof(message), "peer %s failed authentication: TLS handshake: %.120s",
		 conn->name, why);
	log_ratelimited(&conn->tt->rl, LOG_WARNING, "%s %s: TLS handshake failed: %s",
			conn->outgoing ? "refusing peer" : "refused connection from", conn->name,
			why);
	tcp_conn_fail(conn, RDMAX_E_PERMISSION_DENIED, message);
}

static void tls_established(struct tcp_conn *conn)
{
	struct tcp_transport *tt = conn->tt;
	SSL *ssl = conn->tls;

	if (!SSL_session_reused(ssl)) {
		/* Cannot happen without a certificate; never let such a channel carry a frame. */
		tcp_conn_fail(conn, RDMAX_E_PERMISSION_DENIED, "TLS handshake without the PSK");
		return;
	}
	conn->tls_ktx = BIO_get_ktls_send(SSL_get_wbio(ssl)) > 0;
	conn->tls_krx = BIO_get_ktls_recv(SSL_get_rbio(ssl)) > 0;
	if (!conn->tls_ktx && !(conn->tls_stage = malloc(TCP_TLS_STAGE_BYTES))) {
		tcp_conn_lost(conn, LOG_ERR, "out of memory");
		return;
	}
	enum counters_tls_mode mode = conn->tls_krx   ? COUNTERS_TLS_KTLS
				      : conn->tls_ktx ? COUNTERS_TLS_KTLS_TX
						      : COUNTERS_TLS_USER;
	tt->daemon->counters.tcp_tls[mode]++;
	log_info("connection %s %s: %s %s, data path %s (%s)", conn->outgoing ? "to" : "from",
		 conn->name, SSL_get_version(ssl), SSL_CIPHER_get_name(SSL_get_current_cipher(ssl)),
		 counters_tls_mode_names[mode],
		 mode == COUNTERS_TLS_KTLS      ? "kernel TLS both ways"
		 : mode == COUNTERS_TLS_KTLS_TX ? "kernel TLS sends, OpenSSL receives"
						: "OpenSSL both ways");
	tcp_hello_after_tls(conn);
}

/*
 * A peer with tcp_encryption = off speaks the plain wire: its HELLO (to an
 * acceptor) or its refusal (to a dialer) starts with the frame magic, not a
 * TLS record. The connection drops TLS to read that one frame; the HELLO
 * check refuses every plain HELLO while tcp_encryption = on, so such a
 * connection can only end.
 */
static void plain_peer(struct tcp_conn *conn)
{
	tcp_tls_free(conn);
	conn->state = TCP_CONN_WAIT_HELLO;
	tcp_receive(conn);
}

/* One step of the handshake, on readiness of the socket. */
void tcp_tls_drive(struct tcp_conn *conn)
{
	char reason[MSG_BYTES];

	if (!conn->tls_peeked) {
		uint8_t first;
		ssize_t n = recv(conn->fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n == 1 && first != TLS_RECORD_HANDSHAKE && first != TLS_RECORD_ALERT) {
			plain_peer(conn);
			return;
		}
		if (n >= 0) {
			/* TLS, or the end of the stream, which OpenSSL is to see too. */
			BIO *rbio = BIO_new_socket(conn->fd, BIO_NOCLOSE);
			if (!rbio) {
				tcp_conn_lost(conn, LOG_ERR, "out of memory");
				return;
			}
			SSL_set0_rbio(conn->tls, rbio);
			conn->tls_peeked = true;
		}
	}
	conn->tt->tls_reason[0] = '\0';
	ERR_clear_error();
	errno = 0;
	int r = SSL_do_handshake(conn->tls);
	if (r == 1) {
		tls_established(conn);
		return;
	}
	int e = SSL_get_error(conn->tls, r);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
		conn->tls_want = e == SSL_ERROR_WANT_READ ? UV_READABLE : UV_WRITABLE;
		tcp_update_poll(conn);
		return;
	}
	unsigned long err = ERR_peek_last_error();
	if (e == SSL_ERROR_SSL && err &&
	    ERR_GET_REASON(err) != SSL_R_UNEXPECTED_EOF_WHILE_READING) {
		tls_refused(conn, err);
		return;
	}
	/* The socket failed or the peer closed: for a dialer, one more failed attempt. */
	int sys = errno;
	ERR_clear_error();
	snprintf(reason, sizeof(reason), "%s during the TLS handshake",
		 sys ? strerror(sys) : "peer closed the connection");
	tcp_conn_lost(conn, LOG_INFO, reason);
}

/* errno for an SSL_*_ex() failure; tt->tls_reason says more for EPROTO. */
static ssize_t io_failed(struct tcp_conn *conn, int r, const char *call)
{
	int e = SSL_get_error(conn->tls, r);

	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
		ERR_clear_error();
		errno = EAGAIN;
		return -1;
	}
	if (e == SSL_ERROR_ZERO_RETURN) {
		ERR_clear_error();
		return 0; /* close_notify: the end of the stream */
	}
	unsigned long err = ERR_peek_last_error();
	if ((e == SSL_ERROR_SYSCALL && errno == 0) ||
	    (e == SSL_ERROR_SSL && ERR_GET_REASON(err) == SSL_R_UNEXPECTED_EOF_WHILE_READING)) {
		ERR_clear_error();
		return 0; /* the peer closed without close_notify: the daemons never send one */
	}
	if (e == SSL_ERROR_SYSCALL) {
		int sys = errno;
		ERR_clear_error();
		errno = sys;
		return -1;
	}
	note_ssl_error(conn, call);
	errno = EPROTO;
	return -1;
}

ssize_t tcp_io_send(struct tcp_conn *conn, const struct iovec *iov, size_t n_iov)
{
	if (!conn->tls || conn->tls_ktx) {
		struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = n_iov};
		return sendmsg(conn->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	/*
	 * A large first piece is written as it lies; small ones are gathered
	 * into one record. A retry after WANT_WRITE starts at the same byte of
	 * the same queue, so OpenSSL gets the same bytes again, never fewer.
	 */
	const void *buf = iov[0].iov_base;
	size_t len = MIN(iov[0].iov_len, (size_t)TLS_WRITE_MAX);
	if (len < TCP_TLS_STAGE_BYTES) {
		len = 0;
		for (size_t i = 0; i < n_iov && len < TCP_TLS_STAGE_BYTES; i++) {
			size_t take = MIN(iov[i].iov_len, TCP_TLS_STAGE_BYTES - len);
			memcpy(conn->tls_stage + len, iov[i].iov_base, take);
			len += take;
		}
		buf = conn->tls_stage;
	}
	if (len == 0) {
		return 0;
	}
	size_t written = 0;
	ERR_clear_error();
	errno = 0;
	int r = SSL_write_ex(conn->tls, buf, len, &written);
	if (r == 1) {
		return (ssize_t)written;
	}
	ssize_t ret = io_failed(conn, r, "SSL_write_ex()");
	if (ret == 0) {
		errno = EPIPE;
		ret = -1;
	}
	return ret;
}

ssize_t tcp_io_recv(struct tcp_conn *conn, struct iovec *iov, size_t n_iov)
{
	if (!conn->tls || conn->tls_krx) {
		/*
		 * Kernel TLS hands anything but application data to recvmsg()
		 * with a control message, and fails a call without room for one
		 * with EIO; no ticket or key update is ever sent here, so that
		 * is a misbehaving peer, and its connection ends.
		 */
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n_iov};
		return recvmsg(conn->fd, &msg, MSG_DONTWAIT);
	}
	size_t total = 0;
	for (size_t i = 0; i < n_iov && total < TLS_READ_MAX; i++) {
		size_t done = 0;
		while (done < iov[i].iov_len && total < TLS_READ_MAX) {
			size_t got = 0;
			ERR_clear_error();
			errno = 0;
			int r = SSL_read_ex(
				conn->tls, (uint8_t *)iov[i].iov_base + done,
				MIN(iov[i].iov_len - done, (size_t)TLS_READ_MAX - total), &got);
			if (r != 1) {
				if (total > 0) {
					ERR_clear_error();
					return (ssize_t)
						total; /* the rest, or the error, next call */
				}
				return io_failed(conn, r, "SSL_read_ex()");
			}
			done += got;
			total += got;
		}
	}
	return (ssize_t)total;
}

size_t tcp_io_pending(const struct tcp_conn *conn)
{
	if (!conn->tls || conn->tls_krx || conn->state == TCP_CONN_TLS) {
		return 0;
	}
	int n = SSL_pending(conn->tls);
	return n > 0 ? (size_t)n : 0;
}

const char *tcp_io_strerror(const struct tcp_conn *conn, int err)
{
	if (conn->tls && err == EPROTO) {
		return conn->tt->tls_reason;
	}
	if (conn->tls_krx && err == EIO) {
		return "a TLS record other than application data arrived (kernel TLS)";
	}
	if (conn->tls_krx && err == EBADMSG) {
		return "a TLS record failed to decrypt (kernel TLS)";
	}
	return strerror(err);
}
