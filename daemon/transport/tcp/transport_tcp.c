/* SPDX-License-Identifier: MIT */
/*
 * TCP transport between daemons. Owns the listener, the cache of connections
 * to peer daemons (lazy connect, retries with backoff, idle close), the
 * handshake (HELLO exchange and optional HMAC challenge-response) and the
 * movement of bytes between sockets and registered regions.
 *
 * One direction per connection: the daemon that connected sends requests
 * (WRITE, READ_REQ) and the daemon that accepted answers them (ACK,
 * READ_RESP) strictly in order, so answers match the oldest request in
 * flight. Payload bytes go straight between the socket and region memory
 * (sendmsg from the mapping, recvmsg into it); only headers, answers and
 * payloads below RX_DIRECT_MIN pass through the per-connection receive-ahead
 * buffer, many frames per system call. The responder validates every
 * access with region_get_remote() before touching memory and never writes
 * outside the validated range. Every xfer completes exactly once; a peer's
 * malformed frame closes that connection, never the daemon.
 *
 * This file holds the transport_ops (submit, send, endpoints, withdraw,
 * shutdown, destroy), the admin socket's view of the connections and the
 * listener's creation; the connection, handshake, request, receive and
 * connect code lives in the tcp_*.c files next to it (tcp_internal.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "listen_backoff.h"
#include "log.h"
#include "region.h"
#include "tcp_internal.h"

/* ---- transport ops ---- */

/* The outgoing connection to addr of that lane (latency-class requests, or the others). */
static struct tcp_conn *find_conn(struct tcp_transport *tt, const struct sockaddr_storage *addr,
				  bool urgent_lane)
{
	struct list_node *pos;

	for (pos = tt->conns.next; pos != &tt->conns; pos = pos->next) {
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		if (conn->outgoing && conn->urgent_lane == urgent_lane &&
		    memcmp(&conn->addr, addr, sizeof(*addr)) == 0) {
			return conn;
		}
	}
	return NULL;
}

static int check_xfer(const struct xfer *xfer)
{
	if ((unsigned)xfer->op >= XFER_OP_MAX || xfer->peer.transport != ENDPOINT_TCP ||
	    !xfer->done || (xfer->op == XFER_READ && xfer->has_imm) ||
	    !memchr(xfer->peer.addr, '\0', sizeof(xfer->peer.addr))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (xfer->length == 0) {
		return 0;
	}
	if (!xfer->local) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (!xfer->local->addr) {
		return RDMAX_E_GPU_NEEDS_RDMA; /* GPU memory without a host mapping */
	}
	if (xfer->op == XFER_READ && !xfer->local->writable) {
		return RDMAX_E_PERMISSION_DENIED;
	}
	if (xfer->n_runs == 0) {
		return region_check_range(xfer->local, xfer->local_offset, xfer->length);
	}
	uint64_t total = 0;
	if (!xfer->runs || xfer->n_runs > WIRE_SEGS_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (uint32_t i = 0; i < xfer->n_runs; i++) {
		const struct plan_run *run = &xfer->runs[i];
		int err = region_check_range(xfer->local, run->local_offset, run->length);
		if (err < 0) {
			return err;
		}
		if (run->length == 0 || run->remote_offset > UINT64_MAX - run->length) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		total += run->length; /* each below the region's length: no wrap */
	}
	return total == xfer->length ? 0 : RDMAX_E_INVALID_ARGUMENT;
}

/*
 * A WRITE_SEGS (READ_SEGS) frame for an xfer of several runs (checked by
 * check_xfer()): the table of remote ranges, then for a write the runs'
 * bytes; a read's answer lands in the xfer's runs (tcp_on_answer_header()).
 */
static struct frame *segs_frame(struct tcp_transport *tt, struct xfer *xfer, struct wire_header *h)
{
	struct wire_seg segs[WIRE_SEGS_MAX];
	bool write = xfer->op == XFER_WRITE;

	h->type = write ? WIRE_WRITE_SEGS : WIRE_READ_SEGS;
	h->offset = xfer->n_runs;
	for (uint32_t i = 0; i < xfer->n_runs; i++) {
		segs[i] = (struct wire_seg){.offset = xfer->runs[i].remote_offset,
					    .length = xfer->runs[i].length};
	}
	struct frame *frame = tcp_frame_new(tt, h, NULL, 0);
	if (!frame) {
		return NULL;
	}
	frame->table_len = xfer->n_runs * WIRE_SEG_BYTES;
	frame->table = malloc(frame->table_len);
	if (!frame->table) {
		tcp_frame_release(tt, frame);
		return NULL;
	}
	wire_segs_encode(segs, xfer->n_runs, frame->table);
	frame->payload_len = frame->table_len;
	if (write) {
		frame->runs = xfer->runs;
		frame->n_runs = xfer->n_runs;
		frame->base = xfer->local->addr;
		frame->payload_len += xfer->length;
	}
	return frame;
}

static int start_request(struct tcp_transport *tt, struct xfer *xfer, struct frame *frame,
			 const struct sockaddr_storage *addr, socklen_t addr_len);

static int tcp_submit(struct transport *transport, struct xfer *xfer)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	struct sockaddr_storage addr;
	socklen_t addr_len;

	if (tt->shut) {
		return RDMAX_E_CANCELLED;
	}
	int err = check_xfer(xfer);
	if (err < 0) {
		return err;
	}
	err = tcp_peer_addr(tt, &xfer->peer, &addr, &addr_len);
	if (err < 0) {
		return err;
	}
	struct wire_header h = {
		.type = xfer->op == XFER_WRITE ? WIRE_WRITE : WIRE_READ_REQ,
		.flags = xfer->has_imm ? WIRE_F_HAS_IMM : 0,
		.imm = xfer->has_imm ? xfer->imm : 0,
		.request_id = tt->next_id + 1,
		.instance = xfer->remote_instance,
		.region_id = xfer->remote_region,
		.region_key = xfer->remote_key,
		.offset = xfer->remote_offset,
		.length = xfer->length,
	};
	struct frame *frame =
		xfer->n_runs ? segs_frame(tt, xfer, &h) : tcp_frame_new(tt, &h, NULL, 0);
	if (!frame) {
		return -ENOMEM;
	}
	if (xfer->op == XFER_WRITE && xfer->length > 0 && !xfer->n_runs) {
		frame->payload = xfer->local->addr + xfer->local_offset;
		frame->payload_len = xfer->length;
	}
	return start_request(tt, xfer, frame, &addr, addr_len);
}

/* Queue a request frame on the peer's connection (opened on first use); frees it on error. */
static int start_request(struct tcp_transport *tt, struct xfer *xfer, struct frame *frame,
			 const struct sockaddr_storage *addr, socklen_t addr_len)
{
	struct tcp_conn *conn = find_conn(tt, addr, xfer->urgent);
	if (!conn) {
		if (tt->n_conns >= tt->daemon->cfg.max_connections) {
			tcp_frame_release(tt, frame);
			return RDMAX_E_RESOURCE_EXHAUSTED;
		}
		/* A connection opened for a client's job counts in its uid's share. */
		int err = xfer->has_uid ? uid_counts_take(&tt->daemon->peer_conns, xfer->uid,
							  tt->daemon->cfg.per_uid_peer_connections)
					: 0;
		if (err < 0) {
			char name[64];
			tcp_format_addr(addr, name, sizeof(name));
			log_ratelimited(&tt->rl, LOG_INFO,
					"refused a connection to %s for uid %u: %u open for it "
					"([limits] per_uid_peer_connections)",
					name, xfer->uid,
					uid_counts_get(&tt->daemon->peer_conns, xfer->uid));
			tcp_frame_release(tt, frame);
			return err;
		}
		conn = tcp_conn_new(tt, true);
		if (!conn) {
			if (xfer->has_uid) {
				uid_counts_put(&tt->daemon->peer_conns, xfer->uid);
			}
			tcp_frame_release(tt, frame);
			return -ENOMEM;
		}
		conn->has_uid = xfer->has_uid;
		conn->uid = xfer->uid;
		conn->addr = *addr;
		conn->addr_len = addr_len;
		conn->urgent_lane = xfer->urgent;
		tcp_format_addr(addr, conn->name, sizeof(conn->name));
		conn->state = TCP_CONN_BACKOFF;
		uv_timer_start(&conn->timer, tcp_on_conn_timer, 0, 0);
	}
	tt->next_id++;
	frame->xfer = xfer;
	xfer->wire_id = tt->next_id;
	xfer->bytes_done = 0;
	xfer->started_ms = now_ms();
	if (!tcp_busy(conn)) {
		conn->last_io_ms = xfer->started_ms; /* the no-progress clock starts now */
	}
	if (conn->state == TCP_CONN_READY) {
		if (tcp_queue_request(conn, frame) < 0) {
			tcp_frame_release(tt, frame);
			return -ENOMEM;
		}
		tcp_update_poll(conn); /* sent from the loop: done must never run inside submit */
	} else {
		list_add_tail(&conn->pendq, &frame->link);
	}
	return 0;
}

/*
 * SEND: MESSAGE frame with the mailbox's scoped name in the head, its key in
 * region_key, and the payload sent from the job.
 */
static int tcp_send_message(struct transport *transport, struct xfer *xfer)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	struct sockaddr_storage addr;
	socklen_t addr_len;
	size_t name_len = xfer->mailbox ? strnlen(xfer->mailbox, WIRE_MAILBOX_NAME_MAX + 1) : 0;

	if (tt->shut) {
		return RDMAX_E_CANCELLED;
	}
	if (xfer->op != XFER_WRITE || xfer->peer.transport != ENDPOINT_TCP || !xfer->done ||
	    name_len == 0 || name_len > WIRE_MAILBOX_NAME_MAX ||
	    xfer->length > WIRE_MESSAGE_PAYLOAD_MAX || (xfer->length > 0 && !xfer->payload) ||
	    !memchr(xfer->peer.addr, '\0', sizeof(xfer->peer.addr))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	int err = tcp_peer_addr(tt, &xfer->peer, &addr, &addr_len);
	if (err < 0) {
		return err;
	}
	struct wire_header h = {
		.type = WIRE_MESSAGE,
		.request_id = tt->next_id + 1,
		.instance = xfer->remote_instance,
		.region_key = xfer->remote_key,
		.offset = name_len,
		.length = name_len + xfer->length,
	};
	struct frame *frame = tcp_frame_new(tt, &h, xfer->mailbox, name_len);
	if (!frame) {
		return -ENOMEM;
	}
	frame->payload = xfer->length ? xfer->payload : NULL;
	frame->payload_len = xfer->length;
	return start_request(tt, xfer, frame, &addr, addr_len);
}

static int tcp_endpoints(struct transport *transport, const struct region *region,
			 struct endpoint *ret_endpoints, uint32_t max)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	const struct config *c = &tt->daemon->cfg;
	struct endpoint ep = {.transport = ENDPOINT_TCP, .port = tt->port};

	if (max < 1) {
		return -ENOSPC;
	}
	int err = copy_string(ep.addr, sizeof(ep.addr),
			      c->advertise_addr[0] ? c->advertise_addr : c->listen_addr);
	if (err < 0) {
		return err;
	}
	ret_endpoints[0] = ep;
	return 1;
}

static void on_transport_handle_closed(uv_handle_t *handle)
{
	struct tcp_transport *tt = handle->data;

	tt->handles--;
}

static void tcp_shutdown(struct transport *transport)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);

	if (tt->shut) {
		return;
	}
	tt->shut = true;
	uv_close((uv_handle_t *)&tt->listen_poll, on_transport_handle_closed);
	close(tt->listen_fd);
	tt->listen_fd = -1;
	uv_close((uv_handle_t *)&tt->timer, on_transport_handle_closed);
	uv_close((uv_handle_t *)&tt->flush_idle, on_transport_handle_closed);
	tt->backoff.timer.data = tt; /* for on_transport_handle_closed() */
	listen_backoff_close(&tt->backoff, on_transport_handle_closed);
	while (!list_empty(&tt->conns)) {
		struct tcp_conn *conn = container_of(tt->conns.next, struct tcp_conn, link);
		tcp_conn_fail(conn, RDMAX_E_CANCELLED, "daemon shutting down");
	}
	tcp_offload_stop(tt, on_transport_handle_closed);
}

static void tcp_destroy(struct transport *transport)
{
	if (!transport) {
		return;
	}
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	if (!tt->shut || tt->handles > 0) {
		/* Freeing now would leave libuv pointing into freed memory: leak instead. */
		log_err("transport_tcp: destroy() before shutdown completed (%u handles open)",
			tt->handles);
		return;
	}
	tcp_tls_destroy(tt);
	while (!list_empty(&tt->frame_cache)) {
		struct list_node *pos = tt->frame_cache.next;
		list_del(pos);
		free(container_of(pos, struct frame, link));
	}
	free(tt);
}

/* ---------------------------------------------------- admin socket (rdmaxctl) */

static const char *tcp_conn_state_name(enum tcp_conn_state state)
{
	static const char *const names[TCP_CONN_STATE_MAX] = {
		[TCP_CONN_BACKOFF] = "backoff",
		[TCP_CONN_CONNECTING] = "connecting",
		[TCP_CONN_TLS] = "tls",
		[TCP_CONN_WAIT_HELLO] = "handshake",
		[TCP_CONN_WAIT_AUTH] = "authenticating",
		[TCP_CONN_READY] = "ready",
		[TCP_CONN_CLOSED] = "closed",
	};
	return (unsigned)state < TCP_CONN_STATE_MAX && names[state] ? names[state] : "?";
}

static uint32_t list_count(const struct list_node *head)
{
	uint32_t n = 0;

	for (const struct list_node *p = head->next; p != head; p = p->next) {
		n++;
	}
	return n;
}

static void tcp_list_conns(struct transport *transport, transport_conn_cb cb, void *arg)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	struct list_node *pos, *tmp;
	uint64_t now = now_ms();

	list_for_each_safe(pos, tmp, &tt->conns)
	{
		const struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		struct transport_conn_info info = {
			.peer = conn->name,
			.node_name = conn->node_name,
			.state = tcp_conn_state_name(conn->state),
			.outgoing = conn->outgoing,
			.in_flight = list_count(&conn->inflight),
			.queued = conn->n_out + list_count(&conn->pendq),
			.bytes_sent = conn->bytes_sent,
			.bytes_received = conn->bytes_received,
			.idle_ms = now - conn->last_io_ms,
			.latency_lane = conn->urgent_lane,
		};
		cb(arg, &info);
	}
}

static int tcp_reset_peer(struct transport *transport, const char *peer)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	struct list_node *pos, *tmp;
	struct list_node *last = tt->conns.prev;
	int closed = 0;

	if (list_empty(&tt->conns)) {
		return 0;
	}
	/* Failing xfers may open new connections at the tail: stop at the old tail. */
	list_for_each_safe(pos, tmp, &tt->conns)
	{
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		bool at_last = pos == last;
		if (strcmp(conn->name, peer) == 0 ||
		    (conn->node_name[0] && strcmp(conn->node_name, peer) == 0)) {
			log_notice("connection %s %s (node '%s') reset by the administrator",
				   conn->outgoing ? "to" : "from", conn->name, conn->node_name);
			tcp_conn_fail(
				conn, RDMAX_E_TRANSPORT_ERROR,
				"connection reset by the administrator (rdmaxctl peer reset)");
			closed++;
		}
		if (at_last) {
			break;
		}
	}
	return closed;
}

static void ghost_done(struct xfer *xfer, int err, const char *message)
{
	(void)xfer;
	(void)err;
	(void)message;
}

void tcp_frame_orphan(struct frame *frame)
{
	frame->ghost = *frame->xfer;
	frame->ghost.done = ghost_done;
	frame->ghost.local = NULL;
	frame->ghost.payload = NULL;
	frame->ghost.mailbox = NULL;
	frame->xfer = &frame->ghost;
	frame->orphan = true;
}

static struct frame *find_frame(struct list_node *queue, const struct xfer *xfer)
{
	for (struct list_node *pos = queue->next; pos != queue; pos = pos->next) {
		struct frame *frame = container_of(pos, struct frame, link);
		if (frame->xfer == xfer) {
			return frame;
		}
	}
	return NULL;
}

/*
 * transport_ops.withdraw: a frame not sent yet is dropped; one sent whole
 * (the kernel has its bytes) is orphaned, its answer discarded; one half
 * sent is finished (-EINPROGRESS): its xfer is released, and the job's
 * completion delivered, once its last byte is out, so the connection and
 * every other client's transfers on it live on. A peer that does not take
 * the rest within TCP_WITHDRAW_GRACE_MS loses the connection (abortive close).
 */
static int tcp_withdraw(struct transport *transport, struct xfer *xfer)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	struct list_node *pos;

	/* One frame per xfer, except a *_SEGS cut into WRITEs or READ_REQs: all on one connection.
	 */
	for (pos = tt->conns.next; pos != &tt->conns; pos = pos->next) {
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		struct frame *frame;
		bool found = false;
		int ret = 0;

		/* A copy on an I/O thread may be sending or filling this xfer's memory. */
		if (find_frame(&conn->outq, xfer)) {
			tcp_offload_reap(&conn->tx_op);
		}
		if (conn->rx_req && conn->rx_req->xfer == xfer) {
			tcp_offload_reap(&conn->rx_op);
		}

		while ((frame = find_frame(&conn->pendq, xfer))) {
			list_del(&frame->link);
			tcp_frame_release(tt, frame);
			found = true;
		}
		while ((frame = find_frame(&conn->inflight, xfer))) {
			tcp_frame_orphan(frame);
			if (conn->rx_req == frame &&
			    (conn->rx_state == RX_DATA || conn->rx_state == RX_SEGDATA)) {
				/* The rest of the answer, every segment of it, is dropped. */
				tcp_rx_expect(conn, RX_DISCARD, NULL, tcp_rx_payload_rest(conn));
				conn->rx_segs_after = 0;
			}
			found = true;
		}
		for (struct list_node *q = conn->outq.next, *next; q != &conn->outq; q = next) {
			next = q->next;
			frame = container_of(q, struct frame, link);
			if (frame->xfer != xfer) {
				continue;
			}
			found = true;
			if (q != conn->outq.next || conn->out_sent == 0) {
				list_del(&frame->link);
				conn->n_out--;
				tcp_frame_release(tt, frame);
				continue;
			}
			/*
			 * Only the head can be half sent, so a connection has one at a time;
			 * it becomes the xfer's last frame (the later ones are dropped).
			 */
			frame->more = false;
			conn->withdrawn = frame;
			conn->withdrawn_out = false;
			uv_timer_start(&conn->timer, tcp_on_conn_timer, TCP_WITHDRAW_GRACE_MS, 0);
			ret = -EINPROGRESS;
		}
		if (found) {
			tcp_update_poll(conn);
			return ret;
		}
	}
	return -EBUSY;
}

static const struct transport_ops g_tcp_ops = {
	.name = "tcp",
	.submit = tcp_submit,
	.endpoints = tcp_endpoints,
	.shutdown = tcp_shutdown,
	.destroy = tcp_destroy,
	.list_conns = tcp_list_conns,
	.reset_peer = tcp_reset_peer,
	.send_message = tcp_send_message,
	.withdraw = tcp_withdraw,
	.poll = tcp_poll,
};

static int listen_open(struct tcp_transport *tt, int *ret_fd)
{
	const struct config *c = &tt->daemon->cfg;
	struct sockaddr_storage ss;
	socklen_t len;
	int one = 1;

	if (tcp_parse_addr(c->listen_addr, c->listen_port, &ss, &len) < 0) {
		log_err("listen address '%s' is not a numeric IPv4 or IPv6 address",
			c->listen_addr);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	int err;
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		err = -errno;
		log_err("socket() for the TCP listener failed: %s", strerror(-err));
		return err;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	const char *call = "bind";
	if (bind(fd, (struct sockaddr *)&ss, len) < 0) {
		goto out_close;
	}
	call = "listen";
	if (listen(fd, SOMAXCONN) < 0) {
		goto out_close;
	}
	call = "getsockname";
	len = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
		goto out_close;
	}
	tt->port = tcp_addr_port(&ss);
	*ret_fd = fd;
	return 0;

out_close:
	err = -errno;
	log_err("%s() of the TCP listener on '%s' port %u failed: %s", call, c->listen_addr,
		c->listen_port, strerror(-err));
	close(fd);
	return err;
}

int transport_tcp_create(struct rdmaxd *daemon, struct transport **ret_transport)
{
	int fd = -1;

	int err = auth_init();
	if (err < 0) {
		log_err("sodium_init() failed");
		return err;
	}
	struct tcp_transport *tt = calloc(1, sizeof(*tt));
	if (!tt) {
		return -ENOMEM;
	}
	tt->base.ops = &g_tcp_ops;
	tt->base.kind = ENDPOINT_TCP;
	tt->base.daemon = daemon;
	tt->base.ordered = true;           /* one stream per peer, answered in order */
	tt->base.max_runs = WIRE_SEGS_MAX; /* paged jobs: one *_SEGS frame per chunk */
	/* One stream, nothing to spread over: a chunk is a frame and its answer. */
	tt->base.chunk_bytes = daemon->cfg.tcp_chunk_bytes;
	tt->daemon = daemon;
	const char *no_segs = getenv("RDMAXD_TEST_NO_WRITE_SEGS");
	const char *no_read_segs = getenv("RDMAXD_TEST_NO_READ_SEGS");
	tt->no_segs = no_segs && strcmp(no_segs, "1") == 0;
	tt->no_read_segs = tt->no_segs || (no_read_segs && strcmp(no_read_segs, "1") == 0);
	if (tt->no_segs) {
		log_warn("RDMAXD_TEST_NO_WRITE_SEGS=1: the TCP transport behaves like a release "
			 "without WRITE_SEGS or READ_SEGS; never set this in production");
	} else if (tt->no_read_segs) {
		log_warn("RDMAXD_TEST_NO_READ_SEGS=1: the TCP transport behaves like a release "
			 "without READ_SEGS; never set this in production");
	}
	const char *offload = getenv("RDMAXD_TEST_TCP_OFFLOAD");
	tt->offload_always = offload && strcmp(offload, "1") == 0;
	if (tt->offload_always) {
		log_warn("RDMAXD_TEST_TCP_OFFLOAD=1: every TCP bulk copy goes to the I/O threads; "
			 "never set this in production");
	}
	list_init(&tt->conns);
	list_init(&tt->frame_cache);
	err = tcp_tls_create(tt);
	if (err < 0) {
		goto out_free;
	}
	err = listen_open(tt, &fd);
	if (err < 0) {
		goto out_tls;
	}
	err = uv_poll_init(daemon->loop, &tt->listen_poll, fd);
	if (err < 0) {
		log_err("uv_poll_init() on the TCP listener failed: %s", uv_strerror(err));
		goto out_close;
	}
	tt->listen_fd = fd;
	tt->listen_poll.data = tt;
	uv_poll_start(&tt->listen_poll, UV_READABLE, tcp_on_listen);
	uv_timer_init(daemon->loop, &tt->timer);
	tt->timer.data = tt;
	listen_backoff_init(&tt->backoff, daemon->loop, &tt->listen_poll, tcp_on_listen);
	tcp_flush_init(tt);
	tt->handles = 4;
	err = tcp_offload_start(tt, daemon->cfg.tcp_io_threads);
	tt->handles += tt->offload.wake_open;
	if (err < 0) {
		/* Start-up fails; the handles close with the loop, the transport is not freed. */
		log_err("cannot start the TCP I/O threads: %s", strerror(-err));
		tcp_shutdown(&tt->base);
		return err;
	}
	uint64_t tick = MIN(MAX(daemon->cfg.peer_timeout_ms / 4, 10u), 1000u);
	uv_timer_start(&tt->timer, tcp_on_tick, tick, tick);
	log_info("TCP transport listening on %s port %u%s", daemon->cfg.listen_addr, tt->port,
		 tt->tls_ctx            ? " (TLS 1.3 with the shared key)"
		 : daemon->auth_key_len ? " (authentication on)"
					: "");
	*ret_transport = &tt->base;
	return 0;

out_close:
	close(fd);
out_tls:
	tcp_tls_destroy(tt);
out_free:
	free(tt);
	return err;
}
