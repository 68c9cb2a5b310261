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
#include <uv.h>

#include "auth.h"
#include "imm.h"
#include "listen_backoff.h"
#include "log.h"
#include "mailbox.h"
#include "counters.h"
#include "names.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "region.h"
#include "status.h"
#include "transport.h"
#include "wire.h"

#define IOV_BATCH      64    /* iovecs per sendmsg() */
#define TX_BUDGET      16    /* sendmsg() calls per readiness callback */
#define RX_BUDGET      64    /* recvmsg() calls per readiness callback */
#define ACCEPT_BUDGET  32    /* accept() calls per readiness callback */
#define ANSWERS_MAX    256   /* queued answers before a responder stops reading */
#define SCRATCH_BYTES  65536 /* sink for the payload of a refused WRITE */
#define RX_STAGE_BYTES 65536 /* per connection: bytes received ahead of the current part */
#define RX_DIRECT_MIN  8192  /* payloads from this size on go straight into memory */
#define RX_TAIL_MAX    65536 /* payloads up to this size are read with the next header */
#define FRAME_CACHE    1024  /* freed frames kept for reuse, per transport */
#define MSG_BYTES      256
#define RX_SEG_IOV     64                  /* segments of a WRITE_SEGS read by one recvmsg() */
#define DISCARD_MAX    (UINT64_C(1) << 30) /* largest refused WRITE whose payload is skipped */

/* Life of a connection. */
enum tcp_conn_state {
	TCP_CONN_BACKOFF,    /* outgoing: no socket; the timer starts the next attempt */
	TCP_CONN_CONNECTING, /* outgoing: non-blocking connect() in flight */
	TCP_CONN_WAIT_HELLO, /* handshake: waiting for the peer's HELLO */
	TCP_CONN_WAIT_AUTH,  /* handshake: HELLOs exchanged, waiting for the peer's proof */
	TCP_CONN_READY,      /* data frames flow */
	TCP_CONN_CLOSED,     /* failed or shut down; freed once its handles closed */
	TCP_CONN_STATE_MAX,  /* terminator */
};

/* What the bytes being received are. */
enum rx_state {
	RX_HEADER,    /* a frame header into rx_hdr */
	RX_BODY,      /* a small body (HELLO, proof, message) into rx_body */
	RX_DATA,      /* payload straight into region memory */
	RX_DISCARD,   /* payload of a refused WRITE, dropped */
	RX_SEGTAB,    /* segment table of a WRITE_SEGS into rx_segtab */
	RX_SEGDATA,   /* one segment of a WRITE_SEGS straight into region memory */
	RX_STATE_MAX, /* terminator */
};

struct frame {
	struct list_node link;
	struct xfer *xfer;      /* requester: the xfer this frame carries (or &ghost) */
	bool orphan;            /* its job completed: the answer is discarded, done is a no-op */
	struct xfer ghost;      /* an orphan's stand-in: the job's xfer may be gone */
	struct region *region;  /* responder: READ_RESP source, referenced until sent */
	const uint8_t *payload; /* sent after head, never copied */
	uint8_t *owned;         /* responder: a payload of its own (lookup answer), freed with it */
	uint64_t payload_len;   /* with WRITE_SEGS: table_len + the runs' bytes */
	/* WRITE_SEGS: the segment table (own allocation), then the runs from base */
	uint8_t *table;
	uint32_t table_len;
	const struct plan_run *runs;
	uint32_t n_runs;
	const uint8_t *base;
	uint32_t head_len;
	uint8_t head[WIRE_HEADER_BYTES + WIRE_BODY_MAX];
};

struct tcp_transport;

struct tcp_conn {
	struct tcp_transport *tt;
	struct list_node link; /* in tt->conns until closed */
	enum tcp_conn_state state;
	bool outgoing;
	bool ever_ready;
	bool in_handshake; /* incoming, counted in tt->n_in_handshake */
	int fd;
	uv_poll_t *poll; /* own allocation: every connect attempt needs a fresh handle */
	int poll_events;
	uv_timer_t timer; /* connect, backoff and handshake deadlines */
	uint32_t handles; /* open libuv handles; the conn is freed when closed and 0 */
	struct sockaddr_storage addr;
	socklen_t addr_len;
	char name[64]; /* "addr:port" of the peer for messages */
	char node_name[WIRE_NODE_NAME_BYTES];
	uint32_t attempts;
	uint64_t last_io_ms;     /* last byte moved in either direction */
	uint64_t frame_deadline; /* loop time by which the frame being received must end; 0 */
	uint64_t tx_frame_start; /* bytes_sent when the frame at the head of outq started */
	uint64_t tx_deadline;    /* loop time by which that frame must be sent */
	uint64_t bytes_sent;     /* for the admin socket */
	uint64_t bytes_received; /* for the admin socket */
	struct auth_transcript transcript;
	bool aborting; /* a withdrawn frame was half sent: the connection fails at once */

	struct list_node outq;     /* frames to send, in order */
	struct list_node pendq;    /* requester: frames waiting for the handshake */
	struct list_node inflight; /* requester: frames sent, answer pending, in order */
	uint64_t out_sent;         /* bytes of the head of outq already sent */
	uint32_t n_out;

	enum rx_state rx_state;
	struct wire_header rx_h;
	uint8_t *rx_dst;
	uint64_t rx_len;
	uint64_t rx_got;
	uint8_t rx_hdr[WIRE_HEADER_BYTES];
	uint8_t rx_body[WIRE_LOOKUP_REPLY_MAX]; /* >= WIRE_BODY_MAX */
	struct region *rx_region;               /* responder: WRITE target, referenced */
	struct frame *rx_req;                   /* requester: the request being answered */
	int rx_err; /* responder: why the WRITE being discarded was refused */
	char rx_msg[WIRE_MESSAGE_MAX];
	uint8_t *rx_msgbuf; /* responder: body of the MESSAGE being received */
	/* responder: WRITE_SEGS table as received, decoded, and the current segment */
	uint8_t *rx_segtab;       /* WIRE_SEGS_MAX * WIRE_SEG_BYTES, on first use */
	struct wire_seg *rx_segs; /* WIRE_SEGS_MAX, on first use */
	uint32_t rx_seg;
	/*
	 * Receive-ahead: headers and small frames are read many at a time into
	 * rx_stage and parsed from there; a large payload is read straight into
	 * its destination, together with at most the next header.
	 */
	uint8_t *rx_stage; /* RX_STAGE_BYTES */
	uint32_t rx_start; /* first byte of rx_stage not yet consumed */
	uint32_t rx_end;   /* end of the bytes in rx_stage */
	bool rx_bulk;      /* the last frame's payload was large: expect another */
};

struct tcp_transport {
	struct transport base;
	struct rdmaxd *daemon;
	int listen_fd;
	uv_poll_t listen_poll;
	uv_timer_t timer;
	uint32_t handles; /* listener + timer + conns not yet freed */
	uint16_t port;
	bool shut;
	struct list_node conns;
	uint32_t n_conns;
	uint32_t n_in;                 /* incoming connections, any state */
	uint32_t n_in_handshake;       /* incoming connections before their handshake finished */
	struct listen_backoff backoff; /* pauses accepting after EMFILE and the like */
	struct list_node frame_cache;  /* freed frames: one per request and answer otherwise */
	uint32_t n_cached;
	uint64_t next_id;
	struct log_ratelimit rl;
	/* The last peer parsed: clients send to few peers, and parsing per xfer costs. */
	char last_peer_addr[sizeof(((struct endpoint *)0)->addr)];
	uint16_t last_peer_port;
	socklen_t last_peer_len; /* 0: nothing cached */
	struct sockaddr_storage last_peer_ss;
	uint8_t scratch[SCRATCH_BYTES];
};

static void conn_fail(struct tcp_conn *conn, int err, const char *message);
static void update_poll(struct tcp_conn *conn);
static void on_poll(uv_poll_t *handle, int status, int events);

static const struct config *cfg(const struct tcp_conn *conn)
{
	return &conn->tt->daemon->cfg;
}

static bool usable(const struct tcp_conn *conn)
{
	return conn->state == TCP_CONN_WAIT_HELLO || conn->state == TCP_CONN_WAIT_AUTH ||
	       conn->state == TCP_CONN_READY;
}

static bool busy(const struct tcp_conn *conn)
{
	return !list_empty(&conn->outq) || !list_empty(&conn->pendq) ||
	       !list_empty(&conn->inflight) || conn->rx_state != RX_HEADER || conn->rx_got != 0 ||
	       conn->rx_end != conn->rx_start;
}

/* Zeroes the whole storage first, so two results for one peer compare equal with memcmp(). */
static int parse_addr(const char *addr, uint16_t port, struct sockaddr_storage *ret_ss,
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

/* parse_addr() of a peer, remembering the last success; peer->addr must hold a NUL. */
static int peer_addr(struct tcp_transport *tt, const struct endpoint *peer,
		     struct sockaddr_storage *ret_ss, socklen_t *ret_len)
{
	if (tt->last_peer_len == 0 || tt->last_peer_port != peer->port ||
	    strcmp(tt->last_peer_addr, peer->addr) != 0) {
		struct sockaddr_storage ss;
		socklen_t len;
		int err = parse_addr(peer->addr, peer->port, &ss, &len);

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

static uint16_t addr_port(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
					       : ((const struct sockaddr_in *)ss)->sin_port);
}

static void format_addr(const struct sockaddr_storage *ss, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN] = "?";

	uv_ip_name((const struct sockaddr *)ss, host, sizeof(host));
	snprintf(buf, size, ss->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, addr_port(ss));
}

/* Failures here only cost latency or liveness detection, so they are logged, not fatal. */
static void tune_socket(struct tcp_transport *tt, int fd)
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

static void on_conn_timer(uv_timer_t *timer);

static struct tcp_conn *conn_new(struct tcp_transport *tt, bool outgoing)
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

static int conn_open_poll(struct tcp_conn *conn, int fd)
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
static void frame_release(struct tcp_transport *tt, struct frame *frame)
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
	frame_release(conn->tt, frame);
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

static void rx_expect(struct tcp_conn *conn, enum rx_state state, uint8_t *dst, uint64_t len)
{
	conn->rx_state = state;
	conn->rx_dst = dst;
	conn->rx_len = len;
	conn->rx_got = 0;
}

static void rx_reset(struct tcp_conn *conn)
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
	rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES);
}

/*
 * The one way a connection ends: it leaves the cache first (so a done
 * callback that submits again gets a fresh connection), then every xfer on
 * it completes once with err/message, oldest first.
 */
static void conn_fail(struct tcp_conn *conn, int err, const char *message)
{
	struct tcp_transport *tt = conn->tt;
	struct list_node dead;
	struct list_node *pos, *tmp;

	if (conn->state == TCP_CONN_CLOSED) {
		return;
	}
	if (conn->ever_ready) {
		counters_conn_event(&tt->daemon->counters, "tcp", COUNTERS_CONN_CLOSED);
	}
	list_init(&dead);
	rx_reset(conn);
	drain_queue(conn, &conn->inflight, &dead);
	drain_queue(conn, &conn->outq, &dead);
	drain_queue(conn, &conn->pendq, &dead);
	conn->n_out = 0;
	conn->state = TCP_CONN_CLOSED;
	list_del(&conn->link);
	tt->n_conns--;
	tt->n_in -= conn->outgoing ? 0 : 1;
	if (conn->in_handshake) {
		conn->in_handshake = false;
		tt->n_in_handshake--;
	}
	close_socket(conn);
	uv_timer_stop(&conn->timer);
	uv_close((uv_handle_t *)&conn->timer, on_conn_handle_closed);

	list_for_each_safe(pos, tmp, &dead)
	{
		struct frame *frame = container_of(pos, struct frame, link);
		struct xfer *xfer = frame->xfer;
		list_del(pos);
		frame_release(tt, frame);
		xfer->done(xfer, err, message);
	}
}

static void attempt_failed(struct tcp_conn *conn, const char *reason)
{
	const struct config *c = cfg(conn);
	char message[MSG_BYTES];

	counters_conn_event(&conn->tt->daemon->counters, "tcp", COUNTERS_CONN_FAILED);
	close_socket(conn);
	drain_queue(conn, &conn->outq, NULL); /* handshake frames only: data waits in pendq */
	conn->n_out = 0;
	conn->out_sent = 0;
	rx_reset(conn);
	conn->attempts++;
	if (conn->attempts > c->connect_retries || conn->tt->shut) {
		snprintf(message, sizeof(message), "connect to %s failed after %u attempt%s: %s",
			 conn->name, conn->attempts, conn->attempts == 1 ? "" : "s", reason);
		log_ratelimited(&conn->tt->rl, LOG_WARNING, "%s", message);
		conn_fail(conn, RDMAX_E_UNREACHABLE, message);
		return;
	}
	uint32_t shift = MIN(conn->attempts - 1, 16u);
	uint64_t delay = (uint64_t)c->retry_backoff_ms << shift;
	log_debug("connect to %s: %s; attempt %u in %llu ms", conn->name, reason,
		  conn->attempts + 1, (unsigned long long)delay);
	conn->state = TCP_CONN_BACKOFF;
	uv_timer_start(&conn->timer, on_conn_timer, delay, 0);
}

/*
 * The connection broke: log it once and fail what was on it. Before its
 * handshake finished an outgoing connection counts this as a failed attempt
 * instead (the peer may be restarting).
 */
static void conn_lost(struct tcp_conn *conn, int prio, const char *reason)
{
	char message[MSG_BYTES];

	if (conn->outgoing && !conn->ever_ready && usable(conn)) {
		attempt_failed(conn, reason);
		return;
	}
	if (conn->state == TCP_CONN_CLOSED) {
		return;
	}
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
	conn_fail(conn, conn->ever_ready ? RDMAX_E_TRANSPORT_ERROR : RDMAX_E_UNREACHABLE, message);
}

static void protocol_error(struct tcp_conn *conn, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void protocol_error(struct tcp_conn *conn, const char *fmt, ...)
{
	char reason[MSG_BYTES];
	va_list ap;

	va_start(ap, fmt);
	int n = snprintf(reason, sizeof(reason), "protocol error: ");
	vsnprintf(reason + n, sizeof(reason) - (size_t)n, fmt, ap);
	va_end(ap);
	conn_lost(conn, LOG_WARNING, reason);
}

/* ---- sending ---- */

/* head[] past head_len is never read, so it is not cleared. */
static struct frame *frame_new(struct tcp_transport *tt, const struct wire_header *header,
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
	wire_header_encode(header, frame->head);
	if (body_len > 0) {
		memcpy(frame->head + WIRE_HEADER_BYTES, body, body_len);
	}
	frame->head_len = (uint32_t)(WIRE_HEADER_BYTES + body_len);
	return frame;
}

static void queue_frame(struct tcp_conn *conn, struct frame *frame)
{
	list_add_tail(&conn->outq, &frame->link);
	conn->n_out++;
}

/* Queue a frame with a small body (status from err); false when out of memory (conn failed). */
static bool queue_small(struct tcp_conn *conn, uint8_t type, int err, const void *body,
			size_t body_len)
{
	struct wire_header h = {.type = type,
				.status = (uint32_t)status_from_err(err),
				.request_id = type == WIRE_ACK || type == WIRE_READ_RESP
						      ? conn->rx_h.request_id
						      : 0,
				.length = body_len};
	struct frame *frame = frame_new(conn->tt, &h, body, body_len);

	if (!frame) {
		conn_lost(conn, LOG_ERR, "out of memory");
		return false;
	}
	queue_frame(conn, frame);
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
	if (frame->n_runs == 0) {
		add_iov(iov, n, frame->payload, frame->payload_len, skip);
		return true;
	}
	add_iov(iov, n, frame->table, frame->table_len, skip);
	for (uint32_t i = 0; i < frame->n_runs; i++) {
		if (*n == max) {
			return false;
		}
		const struct plan_run *run = &frame->runs[i];
		add_iov(iov, n, frame->base + run->local_offset, run->length, skip);
	}
	return true;
}

static void advance_out(struct tcp_conn *conn, uint64_t n)
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
		if (frame->xfer) { /* a request: now it waits for its answer */
			frame->xfer->bytes_done = frame->payload_len - frame->table_len;
			list_add_tail(&conn->inflight, &frame->link);
		} else {
			frame_free(conn, frame);
		}
	}
}

/* Send what the socket takes; false when the connection failed. */
static bool flush(struct tcp_conn *conn)
{
	for (int round = 0; round < TX_BUDGET && !list_empty(&conn->outq); round++) {
		struct iovec iov[IOV_BATCH];
		uint64_t skip = conn->out_sent;
		int n = 0;
		for (struct list_node *pos = conn->outq.next; pos != &conn->outq; pos = pos->next) {
			if (!frame_iov(container_of(pos, struct frame, link), iov, &n, IOV_BATCH,
				       &skip)) {
				break;
			}
		}
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
		ssize_t sent = sendmsg(conn->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (sent < 0) {
			if (errno == EINTR) {
				continue;
			}
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				break;
			}
			conn_lost(conn, LOG_INFO, strerror(errno));
			return false;
		}
		conn->last_io_ms = now_ms();
		advance_out(conn, (uint64_t)sent);
	}
	return true;
}

/* ---- handshake ---- */

/*
 * Both ends of the connection as this side sees them, for the channel-bound
 * proof: a relay's two connections have different ends, so a proof made on
 * one fails on the other.
 */
static int bind_transcript(struct tcp_conn *conn)
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

static bool auth_on(const struct tcp_conn *conn)
{
	return conn->tt->daemon->auth_key_len > 0;
}

static bool queue_hello(struct tcp_conn *conn)
{
	struct rdmaxd *d = conn->tt->daemon;
	struct wire_hello hello = {
		.version = WIRE_VERSION,
		.flags = auth_on(conn) ? WIRE_HELLO_F_AUTH | WIRE_HELLO_F_BOUND : 0,
		.instance_id = d->instance_id,
	};
	uint8_t body[WIRE_HELLO_BYTES];

	memcpy(hello.nonce,
	       conn->outgoing ? conn->transcript.client_nonce : conn->transcript.server_nonce,
	       WIRE_NONCE_BYTES);
	copy_string(hello.node_name, sizeof(hello.node_name), d->node_name);
	wire_hello_encode(&hello, body, sizeof(body));
	return queue_small(conn, WIRE_HELLO, 0, body, sizeof(body));
}

static bool queue_proof(struct tcp_conn *conn)
{
	struct rdmaxd *d = conn->tt->daemon;
	uint8_t mac[AUTH_MAC_BYTES];

	auth_compute(d->auth_key, d->auth_key_len,
		     conn->outgoing ? AUTH_ROLE_CLIENT : AUTH_ROLE_SERVER, &conn->transcript, mac);
	return queue_small(conn, WIRE_AUTH, 0, mac, sizeof(mac));
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
	if (conn->out_sent == 0 &&
	    send(conn->fd, buf, WIRE_HEADER_BYTES + h.length, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		log_debug("send() of a refusal to %s failed: %s", conn->name, strerror(errno));
	}
	log_ratelimited(&conn->tt->rl, LOG_WARNING, "%s %s (node '%s'): %s",
			conn->outgoing ? "refusing peer" : "refused connection from", conn->name,
			conn->node_name, reason);
	conn_fail(conn, err, message);
}

static void conn_ready(struct tcp_conn *conn)
{
	struct list_node *pos, *tmp;

	conn->state = TCP_CONN_READY;
	conn->ever_ready = true;
	if (conn->in_handshake) {
		conn->in_handshake = false;
		conn->tt->n_in_handshake--;
	}
	counters_conn_event(&conn->tt->daemon->counters, "tcp", COUNTERS_CONN_ESTABLISHED);
	conn->attempts = 0;
	uv_timer_stop(&conn->timer);
	list_for_each_safe(pos, tmp, &conn->pendq)
	{
		list_del(pos);
		queue_frame(conn, container_of(pos, struct frame, link));
	}
	log_info("connection %s %s (node '%s') up%s", conn->outgoing ? "to" : "from", conn->name,
		 conn->node_name, auth_on(conn) ? ", authenticated" : "");
}

static void on_hello(struct tcp_conn *conn)
{
	const struct rdmaxd *d = conn->tt->daemon;
	char version[64], message[MSG_BYTES];
	struct wire_hello hello;
	const char *why = NULL;
	int err = RDMAX_E_PERMISSION_DENIED;

	if (wire_hello_decode(conn->rx_body, conn->rx_h.length, &hello) < 0) {
		protocol_error(conn, "malformed HELLO");
		return;
	}
	copy_string(conn->node_name, sizeof(conn->node_name), hello.node_name);
	bool mine = auth_on(conn), theirs = hello.flags & WIRE_HELLO_F_AUTH;
	if (hello.version != WIRE_VERSION) {
		snprintf(version, sizeof(version), "unsupported wire version %u (expected %u)",
			 hello.version, WIRE_VERSION);
		why = version;
		err = conn->outgoing ? RDMAX_E_UNREACHABLE : RDMAX_E_PROTOCOL_ERROR;
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
		queued = queue_hello(conn);
	}
	if (queued && mine) {
		conn->state = TCP_CONN_WAIT_AUTH;
	} else if (queued) {
		conn_ready(conn);
	}
}

/* The client proves first; a server answers only a valid proof, so it is no MAC oracle. */
static void on_proof(struct tcp_conn *conn)
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
static void on_peer_error(struct tcp_conn *conn)
{
	char text[WIRE_MESSAGE_MAX + 1];
	char message[MSG_BYTES];
	int err = err_from_status((int)conn->rx_h.status);

	wire_text_copy(text, sizeof(text), conn->rx_body, conn->rx_h.length);
	if (conn->ever_ready || !conn->outgoing) {
		snprintf(message, sizeof(message), "peer reported: %s", text);
		conn_lost(conn, LOG_WARNING, message);
		return;
	}
	bool auth = err == RDMAX_E_PERMISSION_DENIED;
	snprintf(message, sizeof(message), "peer %s refused %s: %s", conn->name,
		 auth ? "authentication" : "the connection", text);
	err = auth ? err : RDMAX_E_UNREACHABLE;
	log_ratelimited(&conn->tt->rl, LOG_WARNING, "%s", message);
	conn_fail(conn, err, message);
}

/* ---- requester: answers ---- */

static int map_remote(uint32_t status)
{
	int err = err_from_status((int)status);

	/* The peer refusing an access is the remote side's decision, not ours. */
	if (err >= 0 || err == RDMAX_E_PERMISSION_DENIED) {
		return RDMAX_E_REMOTE_ACCESS;
	}
	return err;
}

static void complete_request(struct tcp_conn *conn)
{
	struct frame *frame = conn->rx_req;
	struct xfer *xfer = frame->xfer;
	char text[WIRE_MESSAGE_MAX + 1];
	char message[MSG_BYTES];
	int err = 0;

	message[0] = '\0'; /* not "= {0}": clearing all of it costs more than the rest */
	if (conn->rx_h.status != 0) {
		err = map_remote(conn->rx_h.status);
		wire_text_copy(text, sizeof(text), conn->rx_body, conn->rx_h.length);
		snprintf(message, sizeof(message), "%s: %s", conn->name,
			 text[0] ? text : status_name((int)conn->rx_h.status));
	} else if (xfer->op == XFER_READ) {
		xfer->bytes_done = xfer->length;
	} else if (xfer->reply) {
		/* A lookup's answer: the descriptor, checked by the asker before use. */
		if (conn->rx_h.length == 0 || conn->rx_h.length > xfer->reply_size) {
			err = RDMAX_E_PROTOCOL_ERROR;
			snprintf(message, sizeof(message), "%s answered a lookup with %llu bytes",
				 conn->name, (unsigned long long)conn->rx_h.length);
		} else {
			memcpy(xfer->reply, conn->rx_body, conn->rx_h.length);
			xfer->reply_len = (uint32_t)conn->rx_h.length;
		}
	}
	list_del(&frame->link);
	frame_release(conn->tt, frame);
	conn->rx_req = NULL;
	xfer->done(xfer, err, message);
}

static void on_answer_header(struct tcp_conn *conn)
{
	const struct wire_header *h = &conn->rx_h;
	struct frame *frame = NULL;

	if (!list_empty(&conn->inflight)) {
		frame = container_of(conn->inflight.next, struct frame, link);
	}
	if (!frame || frame->xfer->wire_id != h->request_id ||
	    (h->type == WIRE_ACK) != (frame->xfer->op == XFER_WRITE)) {
		protocol_error(conn, "%s for request %llu, which is not the oldest in flight",
			       wire_type_name(h->type), (unsigned long long)h->request_id);
		return;
	}
	struct xfer *xfer = frame->xfer;
	conn->rx_req = frame;
	if (h->type == WIRE_ACK || h->status != 0) {
		rx_expect(conn, RX_BODY, conn->rx_body, h->length);
	} else if (frame->orphan && h->length == xfer->length) {
		/* Its job completed: the memory is no longer the job's to write. */
		rx_expect(conn, RX_DISCARD, NULL, h->length);
	} else if (h->length != xfer->length) {
		protocol_error(conn, "READ_RESP of %llu bytes for a read of %llu",
			       (unsigned long long)h->length, (unsigned long long)xfer->length);
	} else {
		rx_expect(conn, RX_DATA, h->length ? xfer->local->addr + xfer->local_offset : NULL,
			  h->length);
	}
}

/* ---- responder: requests ---- */

static void describe_refusal(char *buf, size_t size, int err, const struct wire_header *h)
{
	unsigned long long id = (unsigned long long)h->region_id;
	const char *what = h->type == WIRE_READ_REQ ? "read" : "write";

	switch (err) {
	case RDMAX_E_NOT_FOUND:
		snprintf(buf, size, "region %llu not found (stale descriptor or deregistered)", id);
		break;
	case RDMAX_E_OUT_OF_RANGE:
		snprintf(buf, size, "range %llu+%llu is outside region %llu",
			 (unsigned long long)h->offset, (unsigned long long)h->length, id);
		break;
	case RDMAX_E_PERMISSION_DENIED:
		snprintf(buf, size, "region %llu is not registered for remote %s", id, what);
		break;
	default:
		snprintf(buf, size, "remote %s of region %llu failed: %s", what, id,
			 status_name(status_from_err(err)));
		break;
	}
}

/* region_get_remote() decides; the range is checked again here as belt and braces. */
static int get_target(struct tcp_conn *conn, uint32_t access, struct region **ret_region)
{
	struct region_table *regions = &conn->tt->daemon->regions;
	const struct wire_header *h = &conn->rx_h;
	struct region *region;

	int err = region_get_remote(regions, h->instance, h->region_id, h->region_key, h->offset,
				    h->length, access, &region);
	if (err < 0) {
		return err;
	}
	if (h->offset > region->length || h->length > region->length - h->offset) {
		err = RDMAX_E_OUT_OF_RANGE;
	} else if (!region->addr && h->length > 0) {
		err = RDMAX_E_GPU_NEEDS_RDMA; /* no host mapping (GPU memory) */
	} else if (access == RDMAX_ACCESS_REMOTE_WRITE && !region->writable) {
		err = RDMAX_E_PERMISSION_DENIED;
	}
	if (err < 0) {
		region_put(regions, region);
		return err;
	}
	*ret_region = region;
	return 0;
}

/*
 * MESSAGE for a mailbox of this daemon: the body (name, then payload) is
 * bounded by wire_header_decode(), so it is received whole, then delivered.
 */
static void on_message_request(struct tcp_conn *conn)
{
	const struct wire_header *h = &conn->rx_h;
	struct rdmaxd *d = conn->tt->daemon;

	conn->rx_err = 0;
	if (h->instance != d->instance_id &&
	    h->instance != 0) { /* 0: a lookup, checked at the end */
		conn->rx_err = RDMAX_E_NOT_FOUND;
		snprintf(conn->rx_msg, sizeof(conn->rx_msg),
			 "node '%s' restarted since the descriptor was made (stale descriptor)",
			 d->node_name);
	} else if (!(conn->rx_msgbuf = malloc(h->length))) {
		conn->rx_err = RDMAX_E_RESOURCE_EXHAUSTED;
		snprintf(conn->rx_msg, sizeof(conn->rx_msg), "node '%s' is out of memory",
			 d->node_name);
	}
	if (conn->rx_err) {
		rx_expect(conn, RX_DISCARD, NULL, h->length);
		return;
	}
	rx_expect(conn, RX_DATA, conn->rx_msgbuf, h->length);
}

/* A lookup of a named region: answered with the descriptor, or refused with a reason. */
static void serve_lookup(struct tcp_conn *conn, const uint8_t *name, size_t len)
{
	struct rdmaxd *d = conn->tt->daemon;
	uint8_t *desc = malloc(WIRE_LOOKUP_REPLY_MAX);
	int n = desc ? names_serve(d->names, d->node_name, name, len, desc, WIRE_LOOKUP_REPLY_MAX,
				   conn->rx_msg, sizeof(conn->rx_msg))
		     : -ENOMEM;

	if (n < 0) {
		free(desc);
		if (n == -ENOMEM) {
			snprintf(conn->rx_msg, sizeof(conn->rx_msg), "node '%s' is out of memory",
				 d->node_name);
		}
		log_ratelimited(&conn->tt->rl, LOG_DEBUG, "refused lookup from %s: %s", conn->name,
				conn->rx_msg);
		queue_small(conn, WIRE_ACK, n, conn->rx_msg, strlen(conn->rx_msg));
		return;
	}
	struct wire_header h = {
		.type = WIRE_ACK, .request_id = conn->rx_h.request_id, .length = (uint64_t)n};
	struct frame *frame = frame_new(conn->tt, &h, NULL, 0);
	if (!frame) {
		free(desc);
		conn_lost(conn, LOG_ERR, "out of memory");
		return;
	}
	frame->owned = desc;
	frame->payload = desc;
	frame->payload_len = (uint64_t)n;
	queue_frame(conn, frame);
}

static void on_message_done(struct tcp_conn *conn, bool received)
{
	struct rdmaxd *d = conn->tt->daemon;
	char name[WIRE_MAILBOX_NAME_MAX + 1];
	size_t name_len = conn->rx_h.offset;
	int err = conn->rx_err;

	if (received) {
		uint8_t *body = conn->rx_msgbuf;
		conn->rx_msgbuf = NULL;
		wire_text_copy(name, sizeof(name), body, name_len);
		if (strcmp(name, TRANSPORT_LOOKUP_MAILBOX) == 0 && !memchr(body, '\0', name_len)) {
			serve_lookup(conn, body + name_len, conn->rx_h.length - name_len);
			free(body);
			return;
		}
		if (conn->rx_h.instance == 0) {
			err = RDMAX_E_NOT_FOUND;
			snprintf(conn->rx_msg, sizeof(conn->rx_msg),
				 "a message must name the instance of node '%s'", d->node_name);
		} else if (memchr(body, '\0', name_len) || mailbox_name_check(name, name_len) < 0) {
			err = RDMAX_E_INVALID_ARGUMENT;
			snprintf(conn->rx_msg, sizeof(conn->rx_msg),
				 "mailbox name '%s' is not valid", name);
		} else {
			err = mailbox_deliver(d->mailboxes, name, body + name_len,
					      conn->rx_h.length - name_len, conn->node_name);
			if (err == RDMAX_E_NOT_FOUND) {
				snprintf(conn->rx_msg, sizeof(conn->rx_msg),
					 "no mailbox '%s' is open on node '%s'", name,
					 d->node_name);
			} else if (err < 0) {
				snprintf(conn->rx_msg, sizeof(conn->rx_msg),
					 "mailbox '%s' refused the message: %s", name,
					 rdmax_strerror(err));
			}
		}
		free(body);
	}
	if (err < 0) {
		log_ratelimited(&conn->tt->rl, LOG_INFO, "refused MESSAGE from %s: %s", conn->name,
				conn->rx_msg);
		queue_small(conn, WIRE_ACK, err, conn->rx_msg, strlen(conn->rx_msg));
		return;
	}
	queue_small(conn, WIRE_ACK, 0, NULL, 0);
}

/* WRITE_SEGS: the table comes first, bounded by wire_header_decode() (4 KiB at most). */
static void on_segs_request(struct tcp_conn *conn)
{
	if (!conn->rx_segtab) {
		conn->rx_segtab = malloc((size_t)WIRE_SEGS_MAX * WIRE_SEG_BYTES);
		conn->rx_segs = malloc(WIRE_SEGS_MAX * sizeof(*conn->rx_segs));
		if (!conn->rx_segtab || !conn->rx_segs) {
			conn_lost(conn, LOG_ERR, "out of memory");
			return;
		}
	}
	rx_expect(conn, RX_SEGTAB, conn->rx_segtab, conn->rx_h.offset * WIRE_SEG_BYTES);
}

/*
 * The table of a WRITE_SEGS is in: every segment is checked against the
 * region (instance, key, bounds, remote write) before any byte lands; a
 * refusal names the first bad segment, drops the data and answers one ACK.
 */
static void on_segtab(struct tcp_conn *conn)
{
	struct region_table *regions = &conn->tt->daemon->regions;
	const struct wire_header *h = &conn->rx_h;
	struct wire_seg *segs = conn->rx_segs;
	struct region *region = NULL;
	uint32_t n = (uint32_t)h->offset, i = 0;

	if (wire_segs_decode(h, conn->rx_segtab, conn->rx_len, segs) < 0) {
		protocol_error(conn, "malformed WRITE_SEGS segment table");
		return;
	}
	int err =
		region_get_remote(regions, h->instance, h->region_id, h->region_key, segs[0].offset,
				  segs[0].length, RDMAX_ACCESS_REMOTE_WRITE, &region);
	if (err == 0 && !region->writable) {
		err = RDMAX_E_PERMISSION_DENIED;
	} else if (err == 0 && !region->addr) {
		err = RDMAX_E_GPU_NEEDS_RDMA;
	}
	for (; err == 0 && i < n; i++) {
		if (segs[i].offset > region->length ||
		    segs[i].length > region->length - segs[i].offset) {
			err = RDMAX_E_OUT_OF_RANGE;
			break;
		}
	}
	if (err < 0) {
		if (region) {
			region_put(regions, region);
		}
		if (err == RDMAX_E_OUT_OF_RANGE) {
			snprintf(conn->rx_msg, sizeof(conn->rx_msg),
				 "segment %u: range %llu+%llu is outside region %llu", i,
				 (unsigned long long)segs[i].offset,
				 (unsigned long long)segs[i].length,
				 (unsigned long long)h->region_id);
		} else {
			describe_refusal(conn->rx_msg, sizeof(conn->rx_msg), err, h);
		}
		log_ratelimited(&conn->tt->rl, LOG_INFO, "refused WRITE_SEGS from %s: %s",
				conn->name, conn->rx_msg);
		if (h->length > DISCARD_MAX) {
			/* Skipping it would take the peer's time, not ours: no frame is that big.
			 */
			protocol_error(conn,
				       "refused WRITE_SEGS of %llu bytes is too large to skip",
				       (unsigned long long)h->length);
			return;
		}
		conn->rx_err = err;
		rx_expect(conn, RX_DISCARD, NULL, h->length);
		return;
	}
	conn->rx_region = region;
	conn->rx_seg = 0;
	rx_expect(conn, RX_SEGDATA, region->addr + segs[0].offset, segs[0].length);
}

/* The current segment is full: on to the next one. \return false after the last. */
static bool next_seg(struct tcp_conn *conn)
{
	if (conn->rx_seg + 1 >= conn->rx_h.offset) {
		return false;
	}
	const struct wire_seg *seg = &conn->rx_segs[++conn->rx_seg];
	rx_expect(conn, RX_SEGDATA, conn->rx_region->addr + seg->offset, seg->length);
	return true;
}

/* WRITE or READ_REQ: validated before any byte of the region is touched. */
static void on_request(struct tcp_conn *conn)
{
	const struct wire_header *h = &conn->rx_h;
	bool write = h->type == WIRE_WRITE;
	struct region *region;

	if (h->type == WIRE_MESSAGE) {
		on_message_request(conn);
		return;
	}
	if (h->type == WIRE_WRITE_SEGS) {
		on_segs_request(conn);
		return;
	}

	int err = get_target(conn, write ? RDMAX_ACCESS_REMOTE_WRITE : RDMAX_ACCESS_REMOTE_READ,
			     &region);
	if (err < 0) {
		describe_refusal(conn->rx_msg, sizeof(conn->rx_msg), err, h);
		log_ratelimited(&conn->tt->rl, LOG_INFO, "refused %s from %s: %s",
				wire_type_name(h->type), conn->name, conn->rx_msg);
		if (write && h->length > DISCARD_MAX) {
			/* Skipping it would take the peer's time, not ours: no frame is that big.
			 */
			protocol_error(conn, "refused WRITE of %llu bytes is too large to skip",
				       (unsigned long long)h->length);
		} else if (write) { /* the payload is on its way: drop it, then answer */
			conn->rx_err = err;
			rx_expect(conn, RX_DISCARD, NULL, h->length);
		} else {
			queue_small(conn, WIRE_READ_RESP, err, conn->rx_msg, strlen(conn->rx_msg));
		}
		return;
	}
	if (write) {
		conn->rx_region = region;
		rx_expect(conn, RX_DATA, h->length ? region->addr + h->offset : NULL, h->length);
		return;
	}
	struct wire_header resp = {
		.type = WIRE_READ_RESP, .request_id = h->request_id, .length = h->length};
	struct frame *frame = frame_new(conn->tt, &resp, NULL, 0);
	if (!frame) {
		region_put(&conn->tt->daemon->regions, region);
		conn_lost(conn, LOG_ERR, "out of memory");
		return;
	}
	frame->region = region; /* held until the last byte left */
	frame->payload = h->length ? region->addr + h->offset : NULL;
	frame->payload_len = h->length;
	queue_frame(conn, frame);
}

/* The imm counts only once every byte of the WRITE is in the region. */
static void on_write_done(struct tcp_conn *conn, bool landed)
{
	struct rdmaxd *d = conn->tt->daemon;

	if (!landed) {
		queue_small(conn, WIRE_ACK, conn->rx_err, conn->rx_msg, strlen(conn->rx_msg));
		return;
	}
	/* The imm counts in the namespace of the region's client (imm.h). */
	void *owner = region_imm_owner(conn->rx_region);
	if (conn->rx_h.flags & WIRE_F_HAS_IMM) {
		imm_landed(&d->imm, owner, conn->rx_h.imm);
	}
	region_put(&d->regions, conn->rx_region);
	conn->rx_region = NULL;
	queue_small(conn, WIRE_ACK, 0, NULL, 0);
}

/* ---- receiving ---- */

/*
 * Loop time by which a frame with `payload` bytes still to come must be in:
 * peer_timeout_ms plus its size at min_frame_rate_kib_s. A peer that
 * trickles a frame (and so keeps the no-progress clock from firing) is cut
 * off there, and with it any region reference the frame holds.
 */
static uint64_t frame_deadline(const struct tcp_conn *conn, uint64_t payload)
{
	const struct config *c = cfg(conn);
	uint64_t per_s = (uint64_t)c->min_frame_rate_kib_s * 1024;
	uint64_t ms = payload / per_s * 1000 + payload % per_s * 1000 / per_s;
	uint64_t now = uv_now(conn->tt->daemon->loop);

	ms += c->peer_timeout_ms;
	return ms > UINT64_MAX - now ? UINT64_MAX : now + ms;
}

/*
 * The region a WRITE lands in is being deregistered: the rest of the
 * payload is dropped and the WRITE refused, so a slow peer holds the
 * region (and a dead client's mapping) no longer than one receive.
 */
static void check_rx_region(struct tcp_conn *conn)
{
	if ((conn->rx_state != RX_DATA && conn->rx_state != RX_SEGDATA) || !conn->rx_region ||
	    !conn->rx_region->deregistering) {
		return;
	}
	/* The rest of the frame: this segment's and every later segment's bytes. */
	uint64_t rest = conn->rx_len - conn->rx_got;
	if (conn->rx_state == RX_SEGDATA) {
		for (uint32_t k = conn->rx_seg + 1; k < conn->rx_h.offset; k++) {
			rest += conn->rx_segs[k].length;
		}
	}
	region_put(&conn->tt->daemon->regions, conn->rx_region);
	conn->rx_region = NULL;
	conn->rx_err = RDMAX_E_NOT_FOUND;
	snprintf(conn->rx_msg, sizeof(conn->rx_msg),
		 "region %llu was deregistered while the write was arriving",
		 (unsigned long long)conn->rx_h.region_id);
	rx_expect(conn, RX_DISCARD, NULL, rest);
}

static void on_header(struct tcp_conn *conn)
{
	struct wire_header *h = &conn->rx_h;

	if (wire_header_decode(conn->rx_hdr, WIRE_HEADER_BYTES, h) < 0) {
		protocol_error(conn, "malformed frame header");
		return;
	}
	uint64_t payload = wire_payload_bytes(h);
	conn->rx_bulk = payload >= RX_DIRECT_MIN;
	conn->frame_deadline = payload ? frame_deadline(conn, payload) : 0;
	rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES); /* unless a body follows */
	bool request = h->type == WIRE_WRITE || h->type == WIRE_READ_REQ ||
		       h->type == WIRE_MESSAGE || h->type == WIRE_WRITE_SEGS;
	bool answer = h->type == WIRE_ACK || h->type == WIRE_READ_RESP;
	/* Handshake frames only in their step; requests only to the acceptor, answers back. */
	bool ok = h->type == WIRE_ERROR ||
		  (h->type == WIRE_HELLO && conn->state == TCP_CONN_WAIT_HELLO) ||
		  (h->type == WIRE_AUTH && conn->state == TCP_CONN_WAIT_AUTH) ||
		  (conn->state == TCP_CONN_READY &&
		   ((request && !conn->outgoing) || (answer && conn->outgoing)));
	if (!ok) {
		protocol_error(conn, "unexpected %s frame", wire_type_name(h->type));
	} else if (request) {
		on_request(conn);
	} else if (answer) {
		on_answer_header(conn);
	} else {
		rx_expect(conn, RX_BODY, conn->rx_body, h->length);
	}
}

/* A header starts a frame; any other part ends one, and a header comes next. */
static void on_part_done(struct tcp_conn *conn)
{
	enum rx_state state = conn->rx_state;

	if (state == RX_HEADER) {
		on_header(conn);
		return;
	}
	if (state == RX_SEGTAB) {
		on_segtab(conn);
		return;
	}
	if (state == RX_SEGDATA && next_seg(conn)) {
		return;
	}
	rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES);
	conn->frame_deadline = 0;
	uint8_t type = conn->rx_h.type;
	if (type == WIRE_HELLO) {
		on_hello(conn);
	} else if (type == WIRE_AUTH) {
		on_proof(conn);
	} else if (type == WIRE_ERROR) {
		on_peer_error(conn);
	} else if (type == WIRE_WRITE || type == WIRE_WRITE_SEGS) {
		on_write_done(conn, state == RX_DATA || state == RX_SEGDATA);
	} else if (type == WIRE_MESSAGE) {
		on_message_done(conn, state == RX_DATA);
	} else {
		complete_request(conn); /* ACK or READ_RESP */
	}
}

static bool reading_paused(const struct tcp_conn *conn)
{
	return !conn->outgoing && conn->n_out >= ANSWERS_MAX;
}

static void rx_progress(struct tcp_conn *conn, uint64_t n)
{
	conn->rx_got += n;
	if (conn->rx_state == RX_DATA && conn->rx_req) {
		conn->rx_req->xfer->bytes_done = conn->rx_got;
	}
}

/* Bytes received ahead and not parsed yet, or a finished part not handled yet. */
static bool rx_pending(const struct tcp_conn *conn)
{
	return conn->rx_end != conn->rx_start || conn->rx_got == conn->rx_len;
}

/*
 * Hand the staged bytes to the parts they belong to, handling each part as
 * it completes (parts of length 0 complete without any byte). Returns with
 * rx_stage empty and the current part waiting for more, or when the
 * connection failed or stopped reading.
 */
static void consume_staged(struct tcp_conn *conn)
{
	while (usable(conn) && !reading_paused(conn)) {
		if (conn->rx_got == conn->rx_len) {
			on_part_done(conn);
			continue;
		}
		uint64_t take =
			MIN((uint64_t)(conn->rx_end - conn->rx_start), conn->rx_len - conn->rx_got);
		if (take == 0) {
			return;
		}
		if (conn->rx_state != RX_DISCARD) {
			memcpy(conn->rx_dst + conn->rx_got, conn->rx_stage + conn->rx_start, take);
		}
		conn->rx_start += (uint32_t)take;
		rx_progress(conn, take);
	}
}

/*
 * Drain the socket in a bounded number of recvmsg() calls. Each call reads
 * the rest of the current part straight into its destination (region
 * memory, body buffer, or the discard sink) and, behind it, bytes of the
 * following frames into rx_stage: a whole stage of them after small
 * frames, so one call brings in many ACKs, READ_REQs or small WRITEs; only
 * the next header after a payload of RX_DIRECT_MIN..RX_TAIL_MAX bytes (one
 * call per 16 KiB page), so the next payload is not copied twice; nothing
 * after a larger one. rx_stage is only refilled once empty.
 */
static void receive(struct tcp_conn *conn)
{
	for (int calls = 0;; calls++) {
		consume_staged(conn);
		if (!usable(conn) || reading_paused(conn) || calls == RX_BUDGET) {
			return;
		}
		check_rx_region(conn);
		struct iovec iov[2 + RX_SEG_IOV];
		size_t n_iov = 0;
		uint64_t direct = 0;
		uint64_t ahead = conn->rx_bulk ? WIRE_HEADER_BYTES : RX_STAGE_BYTES;
		if (conn->rx_state != RX_HEADER) {
			uint64_t want = conn->rx_len - conn->rx_got;
			if (conn->rx_state == RX_DISCARD) {
				direct = MIN(want, (uint64_t)SCRATCH_BYTES);
				iov[0].iov_base = conn->tt->scratch;
			} else {
				direct = MIN(want, (uint64_t)1 << 30);
				iov[0].iov_base = conn->rx_dst + conn->rx_got;
			}
			iov[0].iov_len = direct;
			n_iov = 1;
			if (conn->rx_state == RX_SEGDATA && direct == want) {
				/* The segments behind this one, in the same call. */
				uint32_t k = conn->rx_seg + 1;
				for (; k < conn->rx_h.offset && n_iov <= RX_SEG_IOV; k++) {
					const struct wire_seg *seg = &conn->rx_segs[k];
					iov[n_iov].iov_base = conn->rx_region->addr + seg->offset;
					iov[n_iov].iov_len = seg->length;
					n_iov++;
					direct += seg->length;
				}
				ahead = k == conn->rx_h.offset && conn->rx_h.length <= RX_TAIL_MAX
						? WIRE_HEADER_BYTES
						: 0;
			} else if (direct < want || conn->rx_len > RX_TAIL_MAX) {
				/*
				 * Cannot reach the end of the part; or a large payload,
				 * where the saved call is noise and 1 MiB writes measured
				 * slower with it (median 19 against 23 Gb/s).
				 */
				ahead = 0;
			} else if (conn->rx_len >= RX_DIRECT_MIN) {
				ahead = WIRE_HEADER_BYTES;
			}
		}
		if (ahead > 0) {
			iov[n_iov].iov_base = conn->rx_stage;
			iov[n_iov].iov_len = ahead;
			n_iov++;
		}
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n_iov};
		ssize_t n = recvmsg(conn->fd, &msg, MSG_DONTWAIT);
		if (n == 0) {
			conn_lost(conn, LOG_INFO, "peer closed the connection");
			return;
		}
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				conn_lost(conn, LOG_INFO, strerror(errno));
			}
			return;
		}
		uint64_t got = (uint64_t)n;
		conn->bytes_received += got;
		conn->last_io_ms = now_ms();
		if (direct > 0) {
			uint64_t part = MIN(got, direct);
			got -= part;
			/* Only a WRITE_SEGS read runs past its part, into the next segments. */
			for (;;) {
				uint64_t take = MIN(part, conn->rx_len - conn->rx_got);
				rx_progress(conn, take);
				part -= take;
				if (part == 0 || !next_seg(conn)) {
					break;
				}
			}
		}
		conn->rx_start = 0;
		conn->rx_end = (uint32_t)got;
	}
}

static void on_connected(struct tcp_conn *conn)
{
	int err = bind_transcript(conn);
	if (err < 0) {
		attempt_failed(conn, strerror(-err));
		return;
	}
	conn->state = TCP_CONN_WAIT_HELLO;
	conn->transcript.client_instance = conn->tt->daemon->instance_id;
	auth_nonce(conn->transcript.client_nonce);
	/* An attempt, handshake included, also stays within connect_timeout_ms. */
	uv_timer_start(&conn->timer, on_conn_timer,
		       MIN(cfg(conn)->connect_timeout_ms, cfg(conn)->handshake_timeout_ms), 0);
	rx_reset(conn);
	queue_hello(conn);
}

static int socket_error(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) {
		return errno;
	}
	return err;
}

static void on_poll(uv_poll_t *handle, int status, int events)
{
	struct tcp_conn *conn = handle->data;

	if (conn->poll != handle) {
		return;
	}
	if (conn->state == TCP_CONN_CONNECTING) {
		int err = socket_error(conn->fd);
		if (status < 0 || err != 0) {
			attempt_failed(conn, err ? strerror(err) : uv_strerror(status));
			return;
		}
		on_connected(conn);
	} else if (status < 0) {
		/* libuv reports EPOLLERR as EBADF: read what arrived, then the real error. */
		conn->poll_events = 0;
		receive(conn);
		if (usable(conn)) {
			int err = socket_error(conn->fd);
			conn_lost(conn, LOG_INFO, err ? strerror(err) : uv_strerror(status));
		}
		return;
	} else {
		if ((events & UV_WRITABLE) && !flush(conn)) {
			return;
		}
		if ((events & UV_READABLE) || rx_pending(conn)) {
			receive(conn);
		}
	}
	/*
	 * Answers just queued go out now. Frames already staged raise no
	 * readiness event, so a responder that paused at ANSWERS_MAX parses
	 * them here once the flush made room; bounded, the rest waits for the
	 * next (writable) event.
	 */
	for (int round = 0; round < 4; round++) {
		if (usable(conn) && !list_empty(&conn->outq) && !flush(conn)) {
			return;
		}
		if (!usable(conn) || !rx_pending(conn) || reading_paused(conn)) {
			break;
		}
		receive(conn);
	}
	update_poll(conn);
}

static void update_poll(struct tcp_conn *conn)
{
	int events = 0;

	if (!conn->poll) {
		return;
	}
	if (conn->state == TCP_CONN_CONNECTING) {
		events = UV_WRITABLE;
	} else if (usable(conn)) {
		events = reading_paused(conn) ? 0 : UV_READABLE;
		events |= list_empty(&conn->outq) ? 0 : UV_WRITABLE;
	}
	if (events == conn->poll_events) {
		return;
	}
	int err = events ? uv_poll_start(conn->poll, events, on_poll) : uv_poll_stop(conn->poll);
	if (err < 0) {
		conn_lost(conn, LOG_ERR, uv_strerror(err));
		return;
	}
	conn->poll_events = events;
}

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
		attempt_failed(conn, reason);
		return;
	}
	tune_socket(tt, fd);
	/* Several daemons may share a host: the peer must see our listen address as the source. */
	if (parse_addr(tt->daemon->cfg.listen_addr, 0, &src, &src_len) == 0 &&
	    src.ss_family == conn->addr.ss_family) {
		int one = 1;
		setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&src, src_len) < 0) {
			snprintf(reason, sizeof(reason), "bind() to '%s' failed: %s",
				 tt->daemon->cfg.listen_addr, strerror(errno));
			close(fd);
			attempt_failed(conn, reason);
			return;
		}
	}
	int err = conn_open_poll(conn, fd);
	if (err < 0) {
		close(fd);
		attempt_failed(conn, err == -ENOMEM ? strerror(ENOMEM) : uv_strerror(err));
		return;
	}
	if (connect(fd, (struct sockaddr *)&conn->addr, conn->addr_len) == 0) {
		on_connected(conn);
	} else if (errno == EINPROGRESS) {
		conn->state = TCP_CONN_CONNECTING;
		uv_timer_start(&conn->timer, on_conn_timer, cfg(conn)->connect_timeout_ms, 0);
	} else {
		attempt_failed(conn, strerror(errno));
		return;
	}
	update_poll(conn);
}

static void on_conn_timer(uv_timer_t *timer)
{
	struct tcp_conn *conn = timer->data;

	switch (conn->state) {
	case TCP_CONN_BACKOFF:
		start_attempt(conn);
		break;
	case TCP_CONN_CONNECTING:
		attempt_failed(conn, "connection timed out");
		break;
	case TCP_CONN_WAIT_HELLO:
	case TCP_CONN_WAIT_AUTH:
		conn_lost(conn, LOG_INFO, "handshake timed out");
		break;
	default:
		if (conn->aborting) {
			conn_lost(conn, LOG_INFO,
				  "a job completed while its frame was half sent; the rest "
				  "must not be read from its memory");
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

static void on_listen(uv_poll_t *handle, int status, int events)
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
		format_addr(&ss, name, sizeof(name));
		const char *full = admission(tt, &ss);
		if (full) {
			log_ratelimited(&tt->rl, LOG_WARNING, "refusing connection from %s: %s",
					name, full);
			close(fd);
			continue;
		}
		struct tcp_conn *conn = conn_new(tt, false);
		if (!conn) {
			close(fd);
			continue;
		}
		memcpy(&conn->addr, &ss, sizeof(ss));
		conn->addr_len = len;
		copy_string(conn->name, sizeof(conn->name), name);
		tune_socket(tt, fd);
		if (conn_open_poll(conn, fd) < 0) {
			close(fd);
			conn_fail(conn, 0, NULL);
			continue;
		}
		if (bind_transcript(conn) < 0) {
			conn_fail(conn, 0, NULL);
			continue;
		}
		conn->state = TCP_CONN_WAIT_HELLO;
		conn->in_handshake = true;
		tt->n_in_handshake++;
		conn->transcript.server_instance = tt->daemon->instance_id;
		auth_nonce(conn->transcript.server_nonce);
		rx_reset(conn);
		uv_timer_start(&conn->timer, on_conn_timer, c->handshake_timeout_ms, 0);
		update_poll(conn);
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
	} else if (conn->frame_deadline == 0 || reading_paused(conn)) {
		/* A header begun, or reading paused: the rest has its budget from here. */
		conn->frame_deadline = frame_deadline(
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
		conn->tx_deadline = frame_deadline(conn, head->head_len + head->payload_len);
	} else if (now >= conn->tx_deadline) {
		return "reads";
	}
	return NULL;
}

/* Progress and idle checks for every connection. */
static void on_tick(uv_timer_t *timer)
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
		check_rx_region(conn);
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
			conn_fail(conn, RDMAX_E_TIMEOUT, message);
			continue;
		}
		uint64_t quiet = now - conn->last_io_ms;
		if (busy(conn) && quiet >= c->peer_timeout_ms) {
			snprintf(message, sizeof(message), "peer %s stopped answering", conn->name);
			log_warn("connection %s %s (node '%s') down: no progress for %llu ms",
				 conn->outgoing ? "to" : "from", conn->name, conn->node_name,
				 (unsigned long long)quiet);
			conn_fail(conn, RDMAX_E_TIMEOUT, message);
		} else if (!busy(conn) && c->idle_timeout_s > 0 &&
			   quiet >= (uint64_t)c->idle_timeout_s * 1000 * (conn->outgoing ? 1 : 2)) {
			/* The accepting side waits twice as long: the requester closes first. */
			log_info("connection %s %s (node '%s') down: idle",
				 conn->outgoing ? "to" : "from", conn->name, conn->node_name);
			conn_fail(conn, 0, NULL);
		}
	}
}

/* ---- transport ops ---- */

static struct tcp_conn *find_conn(struct tcp_transport *tt, const struct sockaddr_storage *addr)
{
	struct list_node *pos;

	for (pos = tt->conns.next; pos != &tt->conns; pos = pos->next) {
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		if (conn->outgoing && memcmp(&conn->addr, addr, sizeof(*addr)) == 0) {
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
	if (xfer->op != XFER_WRITE || !xfer->runs || xfer->n_runs > WIRE_SEGS_MAX) {
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

/* A WRITE_SEGS frame for an xfer of several runs (checked by check_xfer()). */
static struct frame *segs_frame(struct tcp_transport *tt, struct xfer *xfer, struct wire_header *h)
{
	struct wire_seg segs[WIRE_SEGS_MAX];

	h->type = WIRE_WRITE_SEGS;
	h->offset = xfer->n_runs;
	for (uint32_t i = 0; i < xfer->n_runs; i++) {
		segs[i] = (struct wire_seg){.offset = xfer->runs[i].remote_offset,
					    .length = xfer->runs[i].length};
	}
	struct frame *frame = frame_new(tt, h, NULL, 0);
	if (!frame) {
		return NULL;
	}
	frame->table_len = xfer->n_runs * WIRE_SEG_BYTES;
	frame->table = malloc(frame->table_len);
	if (!frame->table) {
		frame_release(tt, frame);
		return NULL;
	}
	wire_segs_encode(segs, xfer->n_runs, frame->table);
	frame->runs = xfer->runs;
	frame->n_runs = xfer->n_runs;
	frame->base = xfer->local->addr;
	frame->payload_len = frame->table_len + xfer->length;
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
	err = peer_addr(tt, &xfer->peer, &addr, &addr_len);
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
	struct frame *frame = xfer->n_runs ? segs_frame(tt, xfer, &h) : frame_new(tt, &h, NULL, 0);
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
	struct tcp_conn *conn = find_conn(tt, addr);
	if (!conn) {
		if (tt->n_conns >= tt->daemon->cfg.max_connections) {
			frame_release(tt, frame);
			return RDMAX_E_RESOURCE_EXHAUSTED;
		}
		conn = conn_new(tt, true);
		if (!conn) {
			frame_release(tt, frame);
			return -ENOMEM;
		}
		conn->addr = *addr;
		conn->addr_len = addr_len;
		format_addr(addr, conn->name, sizeof(conn->name));
		conn->state = TCP_CONN_BACKOFF;
		uv_timer_start(&conn->timer, on_conn_timer, 0, 0);
	}
	tt->next_id++;
	frame->xfer = xfer;
	xfer->wire_id = tt->next_id;
	xfer->bytes_done = 0;
	xfer->started_ms = now_ms();
	if (!busy(conn)) {
		conn->last_io_ms = xfer->started_ms; /* the no-progress clock starts now */
	}
	if (conn->state == TCP_CONN_READY) {
		queue_frame(conn, frame);
		update_poll(conn); /* sent from the loop: done must never run inside submit */
	} else {
		list_add_tail(&conn->pendq, &frame->link);
	}
	return 0;
}

/* SEND: MESSAGE frame with the mailbox name in the head and the payload sent from the job. */
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
	int err = peer_addr(tt, &xfer->peer, &addr, &addr_len);
	if (err < 0) {
		return err;
	}
	struct wire_header h = {
		.type = WIRE_MESSAGE,
		.request_id = tt->next_id + 1,
		.instance = xfer->remote_instance,
		.offset = name_len,
		.length = name_len + xfer->length,
	};
	struct frame *frame = frame_new(tt, &h, xfer->mailbox, name_len);
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
	tt->backoff.timer.data = tt; /* for on_transport_handle_closed() */
	listen_backoff_close(&tt->backoff, on_transport_handle_closed);
	while (!list_empty(&tt->conns)) {
		struct tcp_conn *conn = container_of(tt->conns.next, struct tcp_conn, link);
		conn_fail(conn, RDMAX_E_CANCELLED, "daemon shutting down");
	}
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
	while (!list_empty(&tt->frame_cache)) {
		struct list_node *pos = tt->frame_cache.next;
		list_del(pos);
		free(container_of(pos, struct frame, link));
	}
	free(tt);
}

/* ---------------------------------------------------- admin socket (rdmaxctl) */

static const char *conn_state_name(enum tcp_conn_state state)
{
	static const char *const names[TCP_CONN_STATE_MAX] = {
		[TCP_CONN_BACKOFF] = "backoff",      [TCP_CONN_CONNECTING] = "connecting",
		[TCP_CONN_WAIT_HELLO] = "handshake", [TCP_CONN_WAIT_AUTH] = "authenticating",
		[TCP_CONN_READY] = "ready",          [TCP_CONN_CLOSED] = "closed",
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
			.state = conn_state_name(conn->state),
			.outgoing = conn->outgoing,
			.in_flight = list_count(&conn->inflight),
			.queued = conn->n_out + list_count(&conn->pendq),
			.bytes_sent = conn->bytes_sent,
			.bytes_received = conn->bytes_received,
			.idle_ms = now - conn->last_io_ms,
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
			conn_fail(conn, RDMAX_E_TRANSPORT_ERROR,
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

/* The frame stays on the wire's books (ids, order), without the job's xfer. */
static void frame_orphan(struct frame *frame)
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
 * sent would have the rest read from the job's memory later, so its
 * connection fails from the loop's next turn, with an abortive close (RST)
 * that discards what the kernel still holds.
 */
static int tcp_withdraw(struct transport *transport, struct xfer *xfer)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	struct list_node *pos;

	for (pos = tt->conns.next; pos != &tt->conns; pos = pos->next) {
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		struct frame *frame = find_frame(&conn->pendq, xfer);
		if (frame) {
			list_del(&frame->link);
			frame_release(tt, frame);
			return 0;
		}
		frame = find_frame(&conn->outq, xfer);
		if (frame) {
			bool head = conn->outq.next == &frame->link;
			if (!head || conn->out_sent == 0) {
				list_del(&frame->link);
				conn->n_out--;
				frame_release(tt, frame);
				update_poll(conn);
				return 0;
			}
			frame_orphan(frame);
			if (!conn->aborting && conn->fd >= 0) {
				struct linger lg = {.l_onoff = 1, .l_linger = 0};
				setsockopt(conn->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
				conn->aborting = true;
				uv_timer_start(&conn->timer, on_conn_timer, 0, 0);
			}
			return 0;
		}
		frame = find_frame(&conn->inflight, xfer);
		if (frame) {
			frame_orphan(frame);
			if (conn->rx_req == frame && conn->rx_state == RX_DATA) {
				conn->rx_state = RX_DISCARD;
			}
			return 0;
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
};

static int listen_open(struct tcp_transport *tt, int *ret_fd)
{
	const struct config *c = &tt->daemon->cfg;
	struct sockaddr_storage ss;
	socklen_t len;
	int one = 1;

	if (parse_addr(c->listen_addr, c->listen_port, &ss, &len) < 0) {
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
	tt->port = addr_port(&ss);
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
	tt->base.max_runs = WIRE_SEGS_MAX; /* paged jobs: one WRITE_SEGS frame per chunk */
	tt->daemon = daemon;
	list_init(&tt->conns);
	list_init(&tt->frame_cache);
	err = listen_open(tt, &fd);
	if (err < 0) {
		goto out_free;
	}
	err = uv_poll_init(daemon->loop, &tt->listen_poll, fd);
	if (err < 0) {
		log_err("uv_poll_init() on the TCP listener failed: %s", uv_strerror(err));
		goto out_close;
	}
	tt->listen_fd = fd;
	tt->listen_poll.data = tt;
	uv_poll_start(&tt->listen_poll, UV_READABLE, on_listen);
	uv_timer_init(daemon->loop, &tt->timer);
	tt->timer.data = tt;
	listen_backoff_init(&tt->backoff, daemon->loop, &tt->listen_poll, on_listen);
	tt->handles = 3;
	uint64_t tick = MIN(MAX(daemon->cfg.peer_timeout_ms / 4, 10u), 1000u);
	uv_timer_start(&tt->timer, on_tick, tick, tick);
	log_info("TCP transport listening on %s port %u%s", daemon->cfg.listen_addr, tt->port,
		 daemon->auth_key_len ? " (authentication on)" : "");
	*ret_transport = &tt->base;
	return 0;

out_close:
	close(fd);
out_free:
	free(tt);
	return err;
}
