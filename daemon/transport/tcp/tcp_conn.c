/* SPDX-License-Identifier: MIT */
/*
 * Life of one TCP connection between daemons: creation, its socket and poll
 * handle, the single way it ends (tcp_conn_fail(), which completes every
 * xfer on it exactly once), retries with backoff for outgoing attempts, and
 * the sending side: frames queued in order and written with one
 * tcp_io_send() (sendmsg(), or OpenSSL where kernel TLS is missing) straight
 * from region memory. It never parses what the peer sends and never
 * frees a conn before its libuv handles are closed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "counters.h"
#include "region.h"
#include "status.h"
#include "tcp_internal.h"

/* Zeroes the whole storage first, so two results for one peer compare equal with memcmp(). */
int tcp_parse_addr(const char *addr, uint16_t port, struct sockaddr_storage *ret_ss,
		   socklen_t *ret_len)
{
	struct sockaddr_storage ss;

	memset(&ss, 0, sizeof(ss));
	if (uv_ip4_addr(addr, port, (struct sockaddr_in *)&ss) == 0) {
		*ret_len = sizeof(struct sockaddr_in);
	} else if (uv_ip6_addr(addr, port, (struct sockaddr_in6 *)&ss) == 0) {
		*ret_len = sizeof(struct sockaddr_in6);
	} else {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	*ret_ss = ss;
	return 0;
}

/* tcp_parse_addr() of a peer, remembering the last success; peer->addr must hold a NUL. */
int tcp_peer_addr(struct tcp_transport *tt, const struct endpoint *peer,
		  struct sockaddr_storage *ret_ss, socklen_t *ret_len)
{
	if (tt->last_peer_len == 0 || tt->last_peer_port != peer->port ||
	    strcmp(tt->last_peer_addr, peer->addr) != 0) {
		struct sockaddr_storage ss;
		socklen_t len;
		int err = tcp_parse_addr(peer->addr, peer->port, &ss, &len);

		if (err < 0) {
			return err;
		}
		memcpy(tt->last_peer_addr, peer->addr, sizeof(tt->last_peer_addr));
		tt->last_peer_port = peer->port;
		tt->last_peer_ss = ss;
		tt->last_peer_len = len;
	}
	*ret_ss = tt->last_peer_ss;
	*ret_len = tt->last_peer_len;
	return 0;
}

uint16_t tcp_addr_port(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
					       : ((const struct sockaddr_in *)ss)->sin_port);
}

void tcp_format_addr(const struct sockaddr_storage *ss, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN] = "?";

	uv_ip_name((const struct sockaddr *)ss, host, sizeof(host));
	snprintf(buf, size, ss->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host,
		 tcp_addr_port(ss));
}

/* Failures here only cost latency or liveness detection, so they are logged, not fatal. */
void tcp_tune_socket(struct tcp_transport *tt, int fd)
{
	uint32_t timeout_ms = tt->daemon->cfg.peer_timeout_ms;
	int one = 1;
	int keep_s = (int)MAX(1u, timeout_ms / 3000);
	int keep_cnt = 3;
	unsigned user_timeout = timeout_ms;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &keep_s, sizeof(keep_s)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &keep_s, sizeof(keep_s)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &keep_cnt, sizeof(keep_cnt)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout)) <
		    0) {
		log_ratelimited(&tt->rl, LOG_WARNING, "setsockopt() on a peer socket failed: %s",
				strerror(errno));
	}
}

/* ---- connection life ---- */

/* Poll handles are allocated per socket, the timer lives in the conn. */
static void on_conn_handle_closed(uv_handle_t *handle)
{
	struct tcp_conn *conn = handle->data;

	if (handle != (uv_handle_t *)&conn->timer) {
		free(handle);
	}
	if (--conn->handles == 0 && conn->state == TCP_CONN_CLOSED) {
		conn->tt->handles--;
		free(conn->rx_stage);
		free(conn->rx_segtab);
		free(conn->rx_segs);
		free(conn);
	}
}

struct tcp_conn *tcp_conn_new(struct tcp_transport *tt, bool outgoing)
{
	struct tcp_conn *conn = calloc(1, sizeof(*conn));

	if (!conn) {
		return NULL;
	}
	conn->rx_stage = malloc(RX_STAGE_BYTES);
	if (!conn->rx_stage) {
		free(conn);
		return NULL;
	}
	conn->tt = tt;
	conn->outgoing = outgoing;
	conn->fd = -1;
	list_init(&conn->outq);
	list_init(&conn->pendq);
	list_init(&conn->inflight);
	conn->tx_op.conn = conn;
	conn->tx_op.tx = true;
	conn->rx_op.conn = conn;
	uv_timer_init(tt->daemon->loop, &conn->timer);
	conn->timer.data = conn;
	conn->handles = 1;
	conn->last_io_ms = now_ms();
	list_add_tail(&tt->conns, &conn->link);
	tt->n_conns++;
	tt->n_in += outgoing ? 0 : 1;
	tt->handles++;
	return conn;
}

int tcp_conn_open_poll(struct tcp_conn *conn, int fd)
{
	uv_poll_t *poll = malloc(sizeof(*poll));

	if (!poll) {
		return -ENOMEM;
	}
	int err = uv_poll_init(conn->tt->daemon->loop, poll, fd);
	if (err < 0) {
		free(poll);
		return err;
	}
	poll->data = conn;
	conn->poll = poll;
	conn->poll_events = 0;
	conn->fd = fd;
	conn->handles++;
	return 0;
}

/* The poll handle goes before the fd: libuv must not watch a closed (or reused) fd. */
static void close_socket(struct tcp_conn *conn)
{
	tcp_tls_free(conn);
	if (conn->poll) {
		uv_close((uv_handle_t *)conn->poll, on_conn_handle_closed);
		conn->poll = NULL;
		conn->poll_events = 0;
	}
	if (conn->fd >= 0) {
		close(conn->fd);
		conn->fd = -1;
	}
}

/* Only the memory: the frame holds no region reference any more. */
void tcp_frame_release(struct tcp_transport *tt, struct frame *frame)
{
	free(frame->table);
	frame->table = NULL;
	free(frame->owned);
	frame->owned = NULL;
	if (tt->n_cached >= FRAME_CACHE) {
		free(frame);
		return;
	}
	list_add_tail(&tt->frame_cache, &frame->link);
	tt->n_cached++;
}

static void frame_free(struct tcp_conn *conn, struct frame *frame)
{
	if (frame->region) {
		region_put(&conn->tt->daemon->regions, frame->region);
	}
	tcp_frame_release(conn->tt, frame);
}

/* Empty a queue: xfer frames move to `dead` (NULL: there are none), the others are freed. */
static void drain_queue(struct tcp_conn *conn, struct list_node *queue, struct list_node *dead)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, queue)
	{
		struct frame *frame = container_of(pos, struct frame, link);
		list_del(pos);
		if (frame->xfer && dead) {
			list_add_tail(dead, pos);
		} else {
			frame_free(conn, frame);
		}
	}
}

void tcp_rx_reset(struct tcp_conn *conn)
{
	if (conn->rx_region) {
		region_put(&conn->tt->daemon->regions, conn->rx_region);
		conn->rx_region = NULL;
	}
	free(conn->rx_msgbuf);
	conn->rx_msgbuf = NULL;
	conn->rx_req = NULL;
	conn->rx_start = 0;
	conn->rx_end = 0;
	conn->rx_bulk = false;
	tcp_rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES);
}

/*
 * The one way a connection ends: it leaves the cache first (so a done
 * callback that submits again gets a fresh connection), then every xfer on
 * it completes once with err/message, oldest first.
 */
void tcp_conn_fail(struct tcp_conn *conn, int err, const char *message)
{
	struct tcp_transport *tt = conn->tt;
	struct list_node dead;
	struct list_node *pos, *tmp;

	if (conn->state == TCP_CONN_CLOSED) {
		return;
	}
	/* No thread may touch the socket, the frames or the memory from here on. */
	tcp_offload_reap(&conn->tx_op);
	tcp_offload_reap(&conn->rx_op);
	if (conn->ever_ready) {
		counters_conn_event(&tt->daemon->counters, "tcp", COUNTERS_CONN_CLOSED);
	}
	list_init(&dead);
	tcp_rx_reset(conn);
	drain_queue(conn, &conn->inflight, &dead);
	drain_queue(conn, &conn->outq, &dead);
	drain_queue(conn, &conn->pendq, &dead);
	conn->n_out = 0;
	conn->state = TCP_CONN_CLOSED;
	tcp_flush_unlist(conn);
	list_del(&conn->link);
	tt->n_conns--;
	tt->n_in -= conn->outgoing ? 0 : 1;
	if (conn->has_uid) {
		conn->has_uid = false;
		uid_counts_put(&tt->daemon->peer_conns, conn->uid);
	}
	if (conn->in_handshake) {
		conn->in_handshake = false;
		tt->n_in_handshake--;
	}
	if (conn->lane_counted) {
		conn->lane_counted = false;
		tt->n_latency_lanes--;
	}
	close_socket(conn);
	uv_timer_stop(&conn->timer);
	uv_close((uv_handle_t *)&conn->timer, on_conn_handle_closed);

	list_for_each_safe(pos, tmp, &dead)
	{
		struct frame *frame = container_of(pos, struct frame, link);
		struct xfer *xfer = frame->xfer;
		bool orphan = frame->orphan; /* its ghost xfer goes with the frame */
		list_del(pos);
		bool more = frame->more;
		tcp_frame_release(tt, frame);
		/* a cut xfer completes once, with its last frame; an orphan's never */
		if (!more && !orphan) {
			xfer->done(xfer, err, message);
		}
	}
}

void tcp_attempt_failed(struct tcp_conn *conn, const char *reason)
{
	const struct config *c = tcp_cfg(conn);
	char message[MSG_BYTES];

	counters_conn_event(&conn->tt->daemon->counters, "tcp", COUNTERS_CONN_FAILED);
	tcp_offload_reap(&conn->tx_op);
	tcp_offload_reap(&conn->rx_op);
	close_socket(conn);
	drain_queue(conn, &conn->outq, NULL); /* handshake frames only: data waits in pendq */
	conn->n_out = 0;
	conn->out_sent = 0;
	tcp_rx_reset(conn);
	conn->attempts++;
	if (conn->attempts > c->connect_retries || conn->tt->shut) {
		snprintf(message, sizeof(message), "connect to %s failed after %u attempt%s: %s",
			 conn->name, conn->attempts, conn->attempts == 1 ? "" : "s", reason);
		log_ratelimited(&conn->tt->rl, LOG_WARNING, "%s", message);
		tcp_conn_fail(conn, RDMAX_E_UNREACHABLE, message);
		return;
	}
	uint32_t shift = MIN(conn->attempts - 1, 16u);
	uint64_t delay = (uint64_t)c->retry_backoff_ms << shift;
	log_debug("connect to %s: %s; attempt %u in %llu ms", conn->name, reason,
		  conn->attempts + 1, (unsigned long long)delay);
	conn->state = TCP_CONN_BACKOFF;
	uv_timer_start(&conn->timer, tcp_on_conn_timer, delay, 0);
}

/*
 * The connection broke: log it once and fail what was on it. Before its
 * handshake finished an outgoing connection counts this as a failed attempt
 * instead (the peer may be restarting).
 */
void tcp_conn_lost(struct tcp_conn *conn, int prio, const char *reason)
{
	char message[MSG_BYTES];

	if (conn->outgoing && !conn->ever_ready && tcp_usable(conn)) {
		tcp_attempt_failed(conn, reason);
		return;
	}
	if (conn->state == TCP_CONN_CLOSED) {
		return;
	}
	conn->withdrawn = NULL; /* failed below with every other frame */
	/* Warnings are what a hostile peer can provoke at will, so they are rate-limited. */
	if (conn->ever_ready && prio > LOG_WARNING) {
		log_msg(prio, "connection %s %s (node '%s') down: %s",
			conn->outgoing ? "to" : "from", conn->name, conn->node_name, reason);
	} else {
		log_ratelimited(&conn->tt->rl, prio, "connection %s %s (node '%s') %s: %s",
				conn->outgoing ? "to" : "from", conn->name, conn->node_name,
				conn->ever_ready ? "down" : "failed during handshake", reason);
	}
	snprintf(message, sizeof(message), "connection to %s lost: %s", conn->name, reason);
	tcp_conn_fail(conn, conn->ever_ready ? RDMAX_E_TRANSPORT_ERROR : RDMAX_E_UNREACHABLE,
		      message);
}

void tcp_protocol_error(struct tcp_conn *conn, const char *fmt, ...)
{
	char reason[MSG_BYTES];
	va_list ap;

	va_start(ap, fmt);
	int n = snprintf(reason, sizeof(reason), "protocol error: ");
	vsnprintf(reason + n, sizeof(reason) - (size_t)n, fmt, ap);
	va_end(ap);
	tcp_conn_lost(conn, LOG_WARNING, reason);
}

/* ---- sending ---- */

/* head[] past head_len is never read, so it is not cleared. */
struct frame *tcp_frame_new(struct tcp_transport *tt, const struct wire_header *header,
			    const void *body, size_t body_len)
{
	struct frame *frame;

	if (!list_empty(&tt->frame_cache)) {
		frame = container_of(tt->frame_cache.prev, struct frame, link);
		list_del(&frame->link);
		tt->n_cached--;
	} else if (!(frame = malloc(sizeof(*frame)))) {
		return NULL;
	}
	frame->xfer = NULL;
	frame->orphan = false;
	frame->region = NULL;
	frame->payload = NULL;
	frame->owned = NULL;
	frame->payload_len = 0;
	frame->table = NULL;
	frame->table_len = 0;
	frame->runs = NULL;
	frame->n_runs = 0;
	frame->more = false;
	frame->read_part = false;
	wire_header_encode(header, frame->head);
	if (body_len > 0) {
		memcpy(frame->head + WIRE_HEADER_BYTES, body, body_len);
	}
	frame->head_len = (uint32_t)(WIRE_HEADER_BYTES + body_len);
	return frame;
}

/*
 * A WRITE_SEGS (READ_SEGS) as one WRITE (READ_REQ) per segment, for a peer
 * that predates them (it would close the connection on one): the same
 * request id on each (the answers come back in order), the imm on the last,
 * whose answer alone completes the xfer.
 */
static int queue_cut(struct tcp_conn *conn, struct frame *segs)
{
	const struct xfer *xfer = segs->xfer;
	bool write = xfer->op == XFER_WRITE;
	struct list_node parts;
	struct list_node *pos, *tmp;

	list_init(&parts);
	for (uint32_t i = 0; i < xfer->n_runs; i++) {
		const struct plan_run *run = &xfer->runs[i];
		bool last = i + 1 == xfer->n_runs;
		struct wire_header h = {
			.type = write ? WIRE_WRITE : WIRE_READ_REQ,
			.flags = last && xfer->has_imm ? WIRE_F_HAS_IMM : 0,
			.imm = last && xfer->has_imm ? xfer->imm : 0,
			.request_id = xfer->wire_id,
			.instance = xfer->remote_instance,
			.region_id = xfer->remote_region,
			.region_key = xfer->remote_key,
			.offset = run->remote_offset,
			.length = run->length,
		};
		struct frame *part = tcp_frame_new(conn->tt, &h, NULL, 0);
		if (!part) {
			list_for_each_safe(pos, tmp, &parts)
			{
				list_del(pos);
				tcp_frame_release(conn->tt, container_of(pos, struct frame, link));
			}
			return -ENOMEM;
		}
		part->xfer = segs->xfer;
		if (write) {
			part->payload = xfer->local->addr + run->local_offset;
			part->payload_len = run->length;
		} else {
			part->read_part = true;
			part->read_offset = run->local_offset;
			part->read_len = run->length;
		}
		part->more = !last;
		list_add_tail(&parts, &part->link);
	}
	list_for_each_safe(pos, tmp, &parts)
	{
		list_del(pos);
		tcp_queue_frame(conn, container_of(pos, struct frame, link));
	}
	tcp_frame_release(conn->tt, segs);
	return 0;
}

int tcp_queue_request(struct tcp_conn *conn, struct frame *frame)
{
	const struct xfer *xfer = frame->xfer;

	if (xfer->n_runs > 0 && xfer->op == XFER_WRITE && (!conn->peer_segs || conn->tt->no_segs)) {
		return queue_cut(conn, frame);
	}
	if (xfer->n_runs > 0 && xfer->op == XFER_READ &&
	    (!conn->peer_read_segs || conn->tt->no_read_segs)) {
		return queue_cut(conn, frame);
	}
	tcp_queue_frame(conn, frame);
	return 0;
}

/* Queue a frame with a small body (status from err); false when out of memory (conn failed). */
bool tcp_queue_small(struct tcp_conn *conn, uint8_t type, int err, const void *body,
		     size_t body_len)
{
	struct wire_header h = {.type = type,
				.status = (uint32_t)status_from_err(err),
				.request_id = type == WIRE_ACK || type == WIRE_READ_RESP
						      ? conn->rx_h.request_id
						      : 0,
				.length = body_len};
	struct frame *frame = tcp_frame_new(conn->tt, &h, body, body_len);

	if (!frame) {
		tcp_conn_lost(conn, LOG_ERR, "out of memory");
		return false;
	}
	tcp_queue_frame(conn, frame);
	return true;
}

static void add_iov(struct iovec *iov, int *n, const uint8_t *base, uint64_t len, uint64_t *skip)
{
	if (*skip >= len) {
		*skip -= len;
		return;
	}
	iov[*n].iov_base = (void *)(base + *skip);
	iov[*n].iov_len = len - *skip;
	*skip = 0;
	(*n)++;
}

/*
 * The iovecs of a frame from *skip bytes on, appended at iov[*n] while
 * fewer than max are used. \return false when the frame did not fit whole.
 */
static bool frame_iov(const struct frame *frame, struct iovec *iov, int *n, int max, uint64_t *skip)
{
	if (*n + 2 > max) {
		return false;
	}
	add_iov(iov, n, frame->head, frame->head_len, skip);
	add_iov(iov, n, frame->table, frame->table_len, skip); /* none: a no-op */
	if (frame->n_runs == 0) {
		add_iov(iov, n, frame->payload, frame->payload_len - frame->table_len, skip);
		return true;
	}
	for (uint32_t i = 0; i < frame->n_runs; i++) {
		if (*n == max) {
			return false;
		}
		const struct plan_run *run = &frame->runs[i];
		add_iov(iov, n, frame->base + run->local_offset, run->length, skip);
	}
	return true;
}

void tcp_advance_out(struct tcp_conn *conn, uint64_t n)
{
	conn->bytes_sent += n;
	while (!list_empty(&conn->outq)) {
		struct frame *frame = container_of(conn->outq.next, struct frame, link);
		uint64_t left = frame->head_len + frame->payload_len - conn->out_sent;
		if (n < left) {
			conn->out_sent += n;
			uint64_t data_from = frame->head_len + frame->table_len;
			if (frame->xfer && conn->out_sent > data_from) {
				frame->xfer->bytes_done = conn->out_sent - data_from;
			}
			return;
		}
		n -= left;
		conn->out_sent = 0;
		list_del(&frame->link);
		conn->n_out--;
		if (frame == conn->withdrawn) {
			/* Out whole: its job's memory is not read again; release it from the loop.
			 */
			conn->withdrawn_out = true;
			uv_timer_start(&conn->timer, tcp_on_conn_timer, 0, 0);
		}
		if (frame->xfer) { /* a request: now it waits for its answer */
			if (frame->xfer->op == XFER_WRITE) { /* a read's progress is its answer's */
				frame->xfer->bytes_done = frame->payload_len - frame->table_len;
			}
			list_add_tail(&conn->inflight, &frame->link);
		} else {
			frame_free(conn, frame);
		}
	}
}

/*
 * From OFFLOAD_MIN bytes queued on a bulk connection: the iovecs of the
 * head of the queue (at most OFFLOAD_MAX bytes) go to an I/O thread.
 * \return whether they did.
 */
static bool offload_tx(struct tcp_conn *conn)
{
	struct tcp_offload_op *op = &conn->tx_op;
	uint64_t skip = conn->out_sent;
	uint64_t want = 0;
	int n = 0;

	if (!tcp_offload_usable(conn)) {
		return false;
	}
	for (struct list_node *pos = conn->outq.next; pos != &conn->outq && want < OFFLOAD_MAX;
	     pos = pos->next) {
		const struct frame *frame = container_of(pos, struct frame, link);
		int from = n;
		bool whole = frame_iov(frame, op->iov, &n, IOV_BATCH, &skip);
		for (int i = from; i < n; i++) {
			want += op->iov[i].iov_len;
			op->frame_end[i] = whole && frame->xfer && i == n - 1;
		}
		if (!whole) {
			break;
		}
	}
	if (want < OFFLOAD_MIN) {
		return false;
	}
	/* Cut the last iovecs to OFFLOAD_MAX: the rest goes with the next op. */
	uint64_t over = want > OFFLOAD_MAX ? want - OFFLOAD_MAX : 0;
	while (over > 0) {
		struct iovec *last = &op->iov[n - 1];
		uint64_t cut = MIN(over, (uint64_t)last->iov_len);
		last->iov_len -= cut;
		over -= cut;
		want -= cut;
		n -= last->iov_len == 0;
	}
	op->n_iov = n;
	op->want = want;
	tcp_offload_submit(op);
	return true;
}

/*
 * [metrics] job_stages: the sendmsg() that handed the first bytes of each
 * request frame among its `sent` bytes to the kernel (the engine times the
 * stages of its job from it).
 */
static void stamp_sent(struct tcp_conn *conn, uint64_t sent, uint64_t post_ns, uint64_t post_end_ns)
{
	uint64_t offset = conn->out_sent;

	for (struct list_node *pos = conn->outq.next; pos != &conn->outq && sent > 0;
	     pos = pos->next) {
		struct frame *frame = container_of(pos, struct frame, link);
		uint64_t left = frame->head_len + frame->payload_len - offset;
		if (offset == 0 && frame->xfer && !frame->xfer->post_ns) {
			frame->xfer->post_ns = post_ns;
			frame->xfer->post_end_ns = post_end_ns;
		}
		sent -= MIN(sent, left);
		offset = 0;
	}
}

/*
 * Bulk arriving since the last time: ACK it at once, not behind our next
 * answer. Not while latency-class traffic flows (the latency lane itself, or
 * bulk payloads on the I/O threads because a lane is active): the call takes
 * the socket's lock, which a thread receiving a payload holds for its copy,
 * and the loop that serves the lane waited behind it (QUICKACK_BYTES).
 */
static void quickack_after_send(struct tcp_conn *conn)
{
	int one = 1;

	if (conn->bytes_received - conn->quickack_rx < QUICKACK_BYTES) {
		return; /* most sends: no clock read, no system call */
	}
	conn->quickack_rx = conn->bytes_received;
	if (!conn->urgent_lane && !tcp_offload_usable(conn)) {
		(void)setsockopt(conn->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
	}
}

/* Send what the socket takes; false when the connection failed. */
bool tcp_flush(struct tcp_conn *conn)
{
	bool timed = conn->tt->daemon->cfg.metrics_job_stages;
	uint64_t start = conn->bytes_sent;

	if (conn->tx_op.busy || (!list_empty(&conn->outq) && offload_tx(conn))) {
		return true; /* the thread's result brings the connection back */
	}

	for (int round = 0; round < TX_BUDGET && !list_empty(&conn->outq) &&
			    conn->bytes_sent - start < IO_BYTES_BUDGET;
	     round++) {
		struct iovec iov[IOV_BATCH];
		uint64_t skip = conn->out_sent;
		int n = 0;
		for (struct list_node *pos = conn->outq.next; pos != &conn->outq; pos = pos->next) {
			if (!frame_iov(container_of(pos, struct frame, link), iov, &n, IOV_BATCH,
				       &skip)) {
				break;
			}
		}
		uint64_t post_ns = timed ? now_ns() : 0;
		ssize_t sent = tcp_io_send(conn, iov, (size_t)n);
		if (sent < 0) {
			if (errno == EINTR) {
				continue;
			}
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				conn->tx_full = true;
				break;
			}
			tcp_conn_lost(conn, LOG_INFO, tcp_io_strerror(conn, errno));
			return false;
		}
		conn->tx_full = false;
		conn->last_io_ms = now_ms();
		if (conn->urgent_lane) {
			conn->tt->lane_io_ms = conn->last_io_ms;
		}
		if (timed) {
			stamp_sent(conn, (uint64_t)sent, post_ns, now_ns());
		}
		tcp_advance_out(conn, (uint64_t)sent);
	}
	if (conn->bytes_sent != start) {
		quickack_after_send(conn);
	}
	return true;
}
