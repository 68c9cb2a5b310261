/* SPDX-License-Identifier: MIT */
/*
 * The TCP handshake: HELLO exchange (wire version, node name, instance id,
 * nonces) and, when a key is configured, the channel-bound HMAC
 * challenge-response in which the client proves first. With
 * tcp_encryption = on the HELLOs travel inside TLS (tcp_tls.c), whose PSK
 * handshake already proved the key over this very channel, so no HMAC step
 * follows them. It decides whether a connection becomes ready; it never
 * lets a data frame through before that, never answers an invalid proof
 * (no MAC oracle), and never accepts a plain HELLO while tcp_encryption = on.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "counters.h"
#include "status.h"
#include "tcp_internal.h"

/* ---- handshake ---- */

/*
 * Both ends of the connection as this side sees them, for the channel-bound
 * proof: a relay's two connections have different ends, so a proof made on
 * one fails on the other.
 */
int tcp_bind_transcript(struct tcp_conn *conn)
{
	struct auth_transcript *tr = &conn->transcript;
	struct sockaddr_storage local, remote;
	socklen_t local_len = sizeof(local), remote_len = sizeof(remote);

	if (getsockname(conn->fd, (struct sockaddr *)&local, &local_len) < 0 ||
	    getpeername(conn->fd, (struct sockaddr *)&remote, &remote_len) < 0) {
		return -errno;
	}
	bool out = conn->outgoing;
	int err = auth_endpoint((struct sockaddr *)(out ? &local : &remote), tr->client_addr,
				&tr->client_port);
	if (err == 0) {
		err = auth_endpoint((struct sockaddr *)(out ? &remote : &local), tr->server_addr,
				    &tr->server_port);
	}
	tr->bound = err == 0;
	return err;
}

/* The HMAC step: a key, and no TLS, whose PSK handshake proved the key already. */
static bool auth_on(const struct tcp_conn *conn)
{
	return conn->tt->daemon->auth_key_len > 0 && !conn->tt->daemon->cfg.tcp_encryption;
}

bool tcp_queue_hello(struct tcp_conn *conn)
{
	struct rdmaxd *d = conn->tt->daemon;
	struct wire_hello hello = {
		.version = WIRE_VERSION,
		.flags = (conn->tls       ? WIRE_HELLO_F_TLS
			  : auth_on(conn) ? WIRE_HELLO_F_AUTH | WIRE_HELLO_F_BOUND
					  : 0) |
			 (conn->tt->no_segs ? 0 : WIRE_HELLO_F_SEGS) |
			 (conn->tt->no_read_segs ? 0 : WIRE_HELLO_F_READ_SEGS) |
			 (conn->outgoing && conn->urgent_lane ? WIRE_HELLO_F_LATENCY : 0),
		.instance_id = d->instance_id,
	};
	uint8_t body[WIRE_HELLO_BYTES];

	memcpy(hello.nonce,
	       conn->outgoing ? conn->transcript.client_nonce : conn->transcript.server_nonce,
	       WIRE_NONCE_BYTES);
	copy_string(hello.node_name, sizeof(hello.node_name), d->node_name);
	wire_hello_encode(&hello, body, sizeof(body));
	return tcp_queue_small(conn, WIRE_HELLO, 0, body, sizeof(body));
}

static bool queue_proof(struct tcp_conn *conn)
{
	struct rdmaxd *d = conn->tt->daemon;
	uint8_t mac[AUTH_MAC_BYTES];

	auth_compute(d->auth_key, d->auth_key_len,
		     conn->outgoing ? AUTH_ROLE_CLIENT : AUTH_ROLE_SERVER, &conn->transcript, mac);
	return tcp_queue_small(conn, WIRE_AUTH, 0, mac, sizeof(mac));
}

/*
 * Refuse the peer during the handshake: tell it why (best effort, the
 * socket is idle at this point), then fail the connection with err.
 */
static void refuse(struct tcp_conn *conn, int err, const char *reason, const char *message)
{
	struct wire_header h = {.type = WIRE_ERROR,
				.status = (uint32_t)status_from_err(err),
				.length = strlen(reason)};
	uint8_t buf[WIRE_HEADER_BYTES + WIRE_MESSAGE_MAX];

	h.length = MIN(h.length, WIRE_MESSAGE_MAX);
	wire_header_encode(&h, buf);
	memcpy(buf + WIRE_HEADER_BYTES, reason, h.length);
	/* Never in the middle of another frame; a refusal that does not fit is just a close. */
	struct iovec iov = {.iov_base = buf, .iov_len = WIRE_HEADER_BYTES + h.length};
	if (conn->out_sent == 0 && tcp_io_send(conn, &iov, 1) < 0) {
		log_debug("sending a refusal to %s failed: %s", conn->name,
			  tcp_io_strerror(conn, errno));
	}
	log_ratelimited(&conn->tt->rl, LOG_WARNING, "%s %s (node '%s'): %s",
			conn->outgoing ? "refusing peer" : "refused connection from", conn->name,
			conn->node_name, reason);
	tcp_conn_fail(conn, err, message);
}

static void conn_ready(struct tcp_conn *conn)
{
	struct list_node *pos, *tmp;

	conn->state = TCP_CONN_READY;
	conn->ever_ready = true;
	if (conn->urgent_lane) {
		conn->lane_counted = true;
		conn->tt->n_latency_lanes++;
		conn->tt->lane_io_ms = now_ms();
	}
	if (conn->in_handshake) {
		conn->in_handshake = false;
		conn->tt->n_in_handshake--;
	}
	counters_conn_event(&conn->tt->daemon->counters, "tcp", COUNTERS_CONN_ESTABLISHED);
	conn->attempts = 0;
	uv_timer_stop(&conn->timer);
	list_for_each_safe(pos, tmp, &conn->pendq)
	{
		struct frame *frame = container_of(pos, struct frame, link);
		list_del(pos);
		if (tcp_queue_request(conn, frame) < 0) {
			struct xfer *xfer = frame->xfer;
			tcp_frame_release(conn->tt, frame);
			xfer->done(xfer, -ENOMEM, "out of memory while queueing a request");
		}
	}
	log_info("connection %s %s (node '%s') up%s", conn->outgoing ? "to" : "from", conn->name,
		 conn->node_name,
		 conn->tls       ? ", TLS"
		 : auth_on(conn) ? ", authenticated"
				 : "");
}

/* Sent to the peer and logged here, so they name the two sides by role. */
static const char g_dialer_tls[] =
	"tcp_encryption differs: the connecting daemon has it on, the accepting one off";
static const char g_acceptor_tls[] =
	"tcp_encryption differs: the connecting daemon has it off, the accepting one on";

/* TLS is up: the HELLOs follow inside it, the dialer's first. */
void tcp_hello_after_tls(struct tcp_conn *conn)
{
	conn->state = TCP_CONN_WAIT_HELLO;
	if (conn->outgoing) {
		tcp_queue_hello(conn);
	}
}

/*
 * A TLS record where a plain HELLO belongs: the dialer has
 * tcp_encryption = on and this daemon off. It is told so in a plain ERROR,
 * which it reads before its TLS layer would (tcp_tls.c). The rest of its
 * ClientHello is read first, so that the close is a FIN that lets the ERROR
 * arrive, not a reset.
 */
void tcp_on_tls_hello(struct tcp_conn *conn)
{
	char message[MSG_BYTES];

	for (int i = 0; i < 4; i++) {
		if (recv(conn->fd, conn->tt->scratch, sizeof(conn->tt->scratch), MSG_DONTWAIT) <=
		    0) {
			break;
		}
	}
	snprintf(message, sizeof(message), "peer %s refused: %s", conn->name, g_dialer_tls);
	refuse(conn, RDMAX_E_PERMISSION_DENIED, g_dialer_tls, message);
}

void tcp_on_hello(struct tcp_conn *conn)
{
	const struct rdmaxd *d = conn->tt->daemon;
	char version[64], message[MSG_BYTES];
	struct wire_hello hello;
	const char *why = NULL;
	int err = RDMAX_E_PERMISSION_DENIED;

	if (wire_hello_decode(conn->rx_body, conn->rx_h.length, &hello) < 0) {
		tcp_protocol_error(conn, "malformed HELLO");
		return;
	}
	copy_string(conn->node_name, sizeof(conn->node_name), hello.node_name);
	conn->peer_segs = hello.flags & WIRE_HELLO_F_SEGS;
	conn->peer_read_segs = hello.flags & WIRE_HELLO_F_READ_SEGS;
	if (!conn->outgoing) {
		conn->urgent_lane = hello.flags & WIRE_HELLO_F_LATENCY;
	}
	bool mine = auth_on(conn), theirs = hello.flags & WIRE_HELLO_F_AUTH;
	bool tls_on = d->cfg.tcp_encryption;
	if (hello.version != WIRE_VERSION) {
		snprintf(version, sizeof(version), "unsupported wire version %u (expected %u)",
			 hello.version, WIRE_VERSION);
		why = version;
		err = conn->outgoing ? RDMAX_E_UNREACHABLE : RDMAX_E_PROTOCOL_ERROR;
	} else if (tls_on != ((hello.flags & WIRE_HELLO_F_TLS) != 0) || tls_on != !!conn->tls) {
		/* A plain HELLO while on (tcp_tls.c, plain_peer()), or a HELLO that lies. */
		why = tls_on == conn->outgoing ? g_dialer_tls : g_acceptor_tls;
	} else if (mine != theirs && conn->outgoing) {
		why = mine ? "it does not authenticate" : "it requires authentication";
	} else if (mine != theirs) {
		why = mine ? "authentication required"
			   : "authentication is not configured on this peer";
	} else if (mine && !(hello.flags & WIRE_HELLO_F_BOUND)) {
		/* The v1 proof does not cover the connection: it can be relayed. */
		why = "its proof does not bind the connection (wire v1 authentication)";
	} else if (hello.instance_id == d->instance_id) {
		/* Only a reflection or a relay of our own HELLO carries our instance id. */
		why = "it claims this daemon's own instance id";
	}
	if (why) {
		snprintf(message, sizeof(message), "peer %s %s: %s", conn->name,
			 err == RDMAX_E_PERMISSION_DENIED ? "failed authentication" : "refused",
			 why);
		refuse(conn, err, why, message);
		return;
	}
	bool queued;
	if (conn->outgoing) {
		conn->transcript.server_instance = hello.instance_id;
		memcpy(conn->transcript.server_nonce, hello.nonce, WIRE_NONCE_BYTES);
		queued = !mine || queue_proof(conn);
	} else {
		conn->transcript.client_instance = hello.instance_id;
		memcpy(conn->transcript.client_nonce, hello.nonce, WIRE_NONCE_BYTES);
		queued = tcp_queue_hello(conn);
	}
	if (queued && mine) {
		conn->state = TCP_CONN_WAIT_AUTH;
	} else if (queued) {
		conn_ready(conn);
	}
}

/* The client proves first; a server answers only a valid proof, so it is no MAC oracle. */
void tcp_on_proof(struct tcp_conn *conn)
{
	struct rdmaxd *d = conn->tt->daemon;
	char message[MSG_BYTES];
	enum auth_role peer_role = conn->outgoing ? AUTH_ROLE_SERVER : AUTH_ROLE_CLIENT;

	if (auth_verify(d->auth_key, d->auth_key_len, peer_role, &conn->transcript, conn->rx_body) <
	    0) {
		snprintf(message, sizeof(message),
			 "peer %s failed authentication: its proof does not match our key",
			 conn->name);
		refuse(conn, RDMAX_E_PERMISSION_DENIED, "authentication failed", message);
		return;
	}
	if (conn->outgoing || queue_proof(conn)) {
		conn_ready(conn);
	}
}

/* ERROR from the peer: it closes after this, so the connection ends here. */
void tcp_on_peer_error(struct tcp_conn *conn)
{
	char text[WIRE_MESSAGE_MAX + 1];
	char message[MSG_BYTES];
	int err = err_from_status((int)conn->rx_h.status);

	wire_text_copy(text, sizeof(text), conn->rx_body, conn->rx_h.length);
	if (conn->ever_ready || !conn->outgoing) {
		snprintf(message, sizeof(message), "peer reported: %s", text);
		tcp_conn_lost(conn, LOG_WARNING, message);
		return;
	}
	bool auth = err == RDMAX_E_PERMISSION_DENIED;
	snprintf(message, sizeof(message), "peer %s refused %s: %s", conn->name,
		 auth ? "authentication" : "the connection", text);
	err = auth ? err : RDMAX_E_UNREACHABLE;
	log_ratelimited(&conn->tt->rl, LOG_WARNING, "%s", message);
	tcp_conn_fail(conn, err, message);
}
