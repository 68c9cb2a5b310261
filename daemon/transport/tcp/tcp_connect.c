/* SPDX-License-Identifier: MIT */
/*
 * Opening TCP connections: outgoing attempts (non-blocking connect() from
 * the listen address, with connect and handshake deadlines), the listener's
 * accept loop with its admission limits per daemon and per host, and the
 * periodic tick that cuts slow, stalled and idle connections. It never
 * admits an incoming connection beyond peers.max_* or into the slots kept
 * for outgoing ones.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "listen_backoff.h"
#include "tcp_internal.h"

/* ---- connecting and accepting ---- */

static void start_attempt(struct tcp_conn *conn)
{
	struct tcp_transport *tt = conn->tt;
	struct sockaddr_storage src;
	socklen_t src_len;
	char reason[MSG_BYTES];

	int fd = socket(conn->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(reason, sizeof(reason), "socket() failed: %s", strerror(errno));
		tcp_attempt_failed(conn, reason);
		return;
	}
	tcp_tune_socket(tt, fd);
	/* Several daemons may share a host: the peer must see our listen address as the source. */
	if (tcp_parse_addr(tt->daemon->cfg.listen_addr, 0, &src, &src_len) == 0 &&
	    src.ss_family == conn->addr.ss_family) {
		int one = 1;
		setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&src, src_len) < 0) {
			snprintf(reason, sizeof(reason), "bind() to '%s' failed: %s",
				 tt->daemon->cfg.listen_addr, strerror(errno));
			close(fd);
			tcp_attempt_failed(conn, reason);
			return;
		}
	}
	int err = tcp_conn_open_poll(conn, fd);
	if (err < 0) {
		close(fd);
		tcp_attempt_failed(conn, err == -ENOMEM ? strerror(ENOMEM) : uv_strerror(err));
		return;
	}
	if (connect(fd, (struct sockaddr *)&conn->addr, conn->addr_len) == 0) {
		tcp_on_connected(conn);
	} else if (errno == EINPROGRESS) {
		conn->state = TCP_CONN_CONNECTING;
		uv_timer_start(&conn->timer, tcp_on_conn_timer, tcp_cfg(conn)->connect_timeout_ms,
			       0);
	} else {
		tcp_attempt_failed(conn, strerror(errno));
		return;
	}
	tcp_update_poll(conn);
}

void tcp_on_conn_timer(uv_timer_t *timer)
{
	struct tcp_conn *conn = timer->data;

	switch (conn->state) {
	case TCP_CONN_BACKOFF:
		start_attempt(conn);
		break;
	case TCP_CONN_CONNECTING:
		tcp_attempt_failed(conn, "connection timed out");
		break;
	case TCP_CONN_TLS:
	case TCP_CONN_WAIT_HELLO:
	case TCP_CONN_WAIT_AUTH:
		tcp_conn_lost(conn, LOG_INFO, "handshake timed out");
		break;
	default:
		if (conn->withdrawn && conn->withdrawn_out) {
			struct frame *frame = conn->withdrawn;
			struct xfer *xfer = frame->xfer;
			conn->withdrawn = NULL;
			tcp_frame_orphan(frame); /* its answer is discarded */
			xfer->done(xfer, RDMAX_E_CANCELLED, "withdrawn after its job completed");
		} else if (conn->withdrawn) {
			/* The peer did not take the rest: nothing more of it may be sent. */
			struct linger lg = {.l_onoff = 1, .l_linger = 0};
			conn->withdrawn = NULL;
			if (conn->fd >= 0) {
				setsockopt(conn->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
			}
			tcp_conn_lost(conn, LOG_INFO,
				      "a job completed while its frame was half sent, and the peer "
				      "did not take the rest in time");
		}
		break;
	}
}

static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family) {
		return false;
	}
	if (a->ss_family == AF_INET) {
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	}
	return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

/*
 * Whether one more incoming connection from `from` fits; NULL when it does,
 * else why not. Incoming connections never take the slots kept for outgoing
 * ones, connections in their handshake have their own (smaller) budget, and
 * one address gets a bounded share of both, so a host that connects without
 * end or stalls its handshakes neither locks out other peers nor stops this
 * daemon from connecting out.
 */
static const char *admission(struct tcp_transport *tt, const struct sockaddr_storage *from)
{
	const struct config *c = &tt->daemon->cfg;
	uint32_t reserve = MIN(c->reserved_outgoing, c->max_connections / 2);
	uint32_t host_all = 0, host_handshakes = 0;

	if (tt->n_conns >= c->max_connections || tt->n_in >= c->max_connections - reserve) {
		return "incoming connections at their limit (limits.max_connections less "
		       "peers.reserved_outgoing)";
	}
	if (tt->n_in_handshake >= c->max_handshakes) {
		return "peers.max_handshakes reached";
	}
	for (struct list_node *pos = tt->conns.next; pos != &tt->conns; pos = pos->next) {
		const struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		if (!conn->outgoing && same_host(&conn->addr, from)) {
			host_all++;
			host_handshakes += conn->in_handshake;
		}
	}
	if (host_handshakes >= c->max_handshakes_per_host) {
		return "peers.max_handshakes_per_host reached for its address";
	}
	if (host_all >= c->max_connections_per_host) {
		return "peers.max_connections_per_host reached for its address";
	}
	return NULL;
}

void tcp_on_listen(uv_poll_t *handle, int status, int events)
{
	struct tcp_transport *tt = handle->data;
	const struct config *c = &tt->daemon->cfg;

	for (int i = 0; i < ACCEPT_BUDGET && !tt->shut; i++) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		char name[64];
		int fd = accept4(tt->listen_fd, (struct sockaddr *)&ss, &len,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			int err = errno;
			if (err == EINTR || err == ECONNABORTED) {
				continue;
			}
			if (listen_backoff_failed(&tt->backoff, err)) {
				log_ratelimited(
					&tt->rl, LOG_WARNING,
					"accept() failed: %s; not accepting peers for %u ms",
					strerror(err), tt->backoff.delay_ms);
			} else if (err != EAGAIN && err != EWOULDBLOCK) {
				log_ratelimited(&tt->rl, LOG_WARNING, "accept() failed: %s",
						strerror(err));
			}
			return;
		}
		listen_backoff_ok(&tt->backoff);
		tcp_format_addr(&ss, name, sizeof(name));
		const char *full = admission(tt, &ss);
		if (full) {
			log_ratelimited(&tt->rl, LOG_WARNING, "refusing connection from %s: %s",
					name, full);
			close(fd);
			continue;
		}
		struct tcp_conn *conn = tcp_conn_new(tt, false);
		if (!conn) {
			close(fd);
			continue;
		}
		memcpy(&conn->addr, &ss, sizeof(ss));
		conn->addr_len = len;
		copy_string(conn->name, sizeof(conn->name), name);
		tcp_tune_socket(tt, fd);
		if (tcp_conn_open_poll(conn, fd) < 0) {
			close(fd);
			tcp_conn_fail(conn, 0, NULL);
			continue;
		}
		if (tcp_bind_transcript(conn) < 0) {
			tcp_conn_fail(conn, 0, NULL);
			continue;
		}
		conn->state = TCP_CONN_WAIT_HELLO;
		conn->in_handshake = true;
		tt->n_in_handshake++;
		conn->transcript.server_instance = tt->daemon->instance_id;
		auth_nonce(conn->transcript.server_nonce);
		tcp_rx_reset(conn);
		if (tt->tls_ctx && tcp_tls_start(conn) < 0) {
			tcp_conn_fail(conn, 0, NULL);
			continue;
		}
		uv_timer_start(&conn->timer, tcp_on_conn_timer, c->handshake_timeout_ms, 0);
		tcp_update_poll(conn);
	}
}

/*
 * Per-frame deadlines, both ways: "sends" when the frame being received is
 * overdue, "reads" when the frame being sent is, NULL otherwise. While this
 * side pauses reading (answers backed up) the receive budget starts again,
 * since the delay is not the sender's.
 */
static const char *frame_too_slow(struct tcp_conn *conn)
{
	uint64_t now = uv_now(conn->tt->daemon->loop);
	bool in_frame =
		conn->rx_state != RX_HEADER || conn->rx_got != 0 || conn->rx_end != conn->rx_start;

	if (!in_frame) {
		conn->frame_deadline = 0;
	} else if (conn->frame_deadline == 0 || tcp_reading_paused(conn)) {
		/* A header begun, or reading paused: the rest has its budget from here. */
		conn->frame_deadline = tcp_frame_deadline(
			conn, conn->rx_state == RX_HEADER ? 0 : conn->rx_len - conn->rx_got);
	} else if (now >= conn->frame_deadline) {
		return "sends";
	}
	if (list_empty(&conn->outq)) {
		return NULL;
	}
	const struct frame *head = container_of(conn->outq.next, struct frame, link);
	uint64_t start = conn->bytes_sent - conn->out_sent; /* differs for every frame */
	if (start != conn->tx_frame_start || conn->tx_deadline == 0) {
		conn->tx_frame_start = start;
		conn->tx_deadline = tcp_frame_deadline(conn, head->head_len + head->payload_len);
	} else if (now >= conn->tx_deadline) {
		return "reads";
	}
	return NULL;
}

/* Progress and idle checks for every connection. */
void tcp_on_tick(uv_timer_t *timer)
{
	struct tcp_transport *tt = timer->data;
	const struct config *c = &tt->daemon->cfg;
	uint64_t now = now_ms();
	struct list_node *pos, *tmp;
	char message[MSG_BYTES];

	list_for_each_safe(pos, tmp, &tt->conns)
	{
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		if (tt->shut) {
			return;
		}
		if (conn->state != TCP_CONN_READY) {
			continue;
		}
		tcp_check_rx_region(conn);
		const char *slow = frame_too_slow(conn);
		if (slow) {
			snprintf(message, sizeof(message),
				 "peer %s %s too slowly (a frame took longer than "
				 "peers.peer_timeout_ms plus its size at "
				 "peers.min_frame_rate_kib_s)",
				 conn->name, slow);
			log_ratelimited(&tt->rl, LOG_WARNING,
					"connection %s %s (node '%s') down: it %s too slowly",
					conn->outgoing ? "to" : "from", conn->name, conn->node_name,
					slow);
			tcp_conn_fail(conn, RDMAX_E_TIMEOUT, message);
			continue;
		}
		uint64_t quiet = now - conn->last_io_ms;
		if (tcp_busy(conn) && quiet >= c->peer_timeout_ms) {
			if (tcp_rx_lowat_release(conn)) {
				continue; /* bytes waited below the low-water mark: progress */
			}
			snprintf(message, sizeof(message), "peer %s stopped answering", conn->name);
			log_warn("connection %s %s (node '%s') down: no progress for %llu ms",
				 conn->outgoing ? "to" : "from", conn->name, conn->node_name,
				 (unsigned long long)quiet);
			tcp_conn_fail(conn, RDMAX_E_TIMEOUT, message);
		} else if (!tcp_busy(conn) && c->idle_timeout_s > 0 &&
			   quiet >= (uint64_t)c->idle_timeout_s * 1000 * (conn->outgoing ? 1 : 2)) {
			/* The accepting side waits twice as long: the requester closes first. */
			log_info("connection %s %s (node '%s') down: idle",
				 conn->outgoing ? "to" : "from", conn->name, conn->node_name);
			tcp_conn_fail(conn, 0, NULL);
		}
	}
}
