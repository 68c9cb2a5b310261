/* SPDX-License-Identifier: MIT */
/*
 * Private to daemon/transport/tcp/: the connection and transport objects
 * and the functions the TCP transport's files share. Nothing outside this
 * folder includes it; other modules reach the fabric through transport.h.
 */
#ifndef RDMAXD_TCP_INTERNAL_H
#define RDMAXD_TCP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <uv.h>

#include "auth.h"
#include "listen_backoff.h"
#include "log.h"
#include "loop_wake.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"
#include "util.h"
#include "wire.h"

#define IOV_BATCH      512   /* iovecs per sendmsg(): a chunk of pages and its headers */
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
#define RX_SEG_IOV     WIRE_SEGS_MAX       /* segments of a WRITE_SEGS read by one recvmsg(): all */
#define DISCARD_MAX    (UINT64_C(1) << 30) /* largest refused WRITE whose payload is skipped */
/*
 * Bytes one connection moves per readiness callback, each way, so that a
 * connection busy with bulk frames lets the loop serve the others (the
 * latency-class connection) every couple of chunks.
 */
#define IO_BYTES_BUDGET (2u << 20)
/*
 * After a send, a connection that received this many bytes since it last did
 * so leaves delayed-ACK "ping-pong" mode (TCP_QUICKACK): Linux enters it when
 * a socket sends data shortly after it received some, as a responder's ACK
 * frames or a reader's READ_REQs do, and then delays its TCP ACKs of a bulk
 * payload, which stalls the peer's sending (docs/benchmarks.md, "Delayed
 * ACKs behind answers"). Small requests and answers do not reach it, and
 * neither does a connection while latency-class traffic flows.
 */
#define QUICKACK_BYTES (64u << 10)
/*
 * Copies handed to the I/O threads (tcp_offload.c): from this many bytes
 * queued on a connection (or left of a payload being received), at most
 * OFFLOAD_MAX per operation and OFFLOAD_CALL_MAX per system call.
 */
#define OFFLOAD_MIN      (256u << 10)
#define OFFLOAD_MAX      (8u << 20)
#define OFFLOAD_CALL_MAX (1u << 20)
/*
 * The receive low-water mark (SO_RCVLOWAT) while a payload arrives: the
 * socket reports readable (and wakes its reader) once RX_LOWAT_MAX bytes
 * are queued while twice that or more of the frame is still to come,
 * RX_LOWAT_MIN while twice that is, and at every segment the sender's
 * softirq delivers otherwise. Never more than half the frame's rest, so the
 * reader copies while the rest arrives and the last byte always wakes it
 * (docs/benchmarks.md, "Woken per segment").
 */
#define RX_LOWAT_MIN (128u << 10)
#define RX_LOWAT_MAX (256u << 10)

/* Life of a connection. */
enum tcp_conn_state {
	TCP_CONN_BACKOFF,    /* outgoing: no socket; the timer starts the next attempt */
	TCP_CONN_CONNECTING, /* outgoing: non-blocking connect() in flight */
	TCP_CONN_TLS,        /* tcp_encryption = on: TLS 1.3 handshake before the HELLOs */
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
	RX_SEGTAB,    /* segment table of a WRITE_SEGS or READ_SEGS into rx_segtab */
	RX_SEGDATA,   /* one segment of a WRITE_SEGS (or READ_SEGS answer) straight into memory */
	RX_STATE_MAX, /* terminator */
};

struct frame {
	struct list_node link;
	struct xfer *xfer; /* requester: the xfer this frame carries (or &ghost) */
	bool orphan;       /* its job completed: the answer is discarded, done is a no-op */
	struct xfer ghost; /* an orphan's stand-in: the job's xfer may be gone */
	bool urgent;       /* requester: a latency-class xfer, queued ahead (tcp_queue_urgent) */
	struct region *region; /* responder: READ_RESP source, referenced until sent */
	/*
	 * Requester: a READ_REQ cut from a READ_SEGS for a peer that does not
	 * take them; its answer lands at read_offset of the xfer's local region.
	 */
	bool read_part;
	uint64_t read_offset;
	uint64_t read_len;
	const uint8_t *payload; /* sent after head, never copied */
	uint8_t *owned;         /* responder: a payload of its own (lookup answer), freed with it */
	uint64_t payload_len;   /* with WRITE_SEGS: table_len + the runs' bytes */
	/*
	 * WRITE_SEGS: the segment table (own allocation), then the runs from
	 * base; READ_SEGS: the table alone (n_runs 0); READ_RESP to a
	 * READ_SEGS: the runs from the region (in `owned`)
	 */
	uint8_t *table;
	uint32_t table_len;
	const struct plan_run *runs;
	uint32_t n_runs;
	const uint8_t *base;
	/*
	 * A WRITE (READ_REQ) cut from a WRITE_SEGS (READ_SEGS) for a peer that
	 * does not take them: not the last frame of its xfer, whose answer
	 * alone completes the xfer.
	 */
	bool more;
	uint32_t head_len;
	uint8_t head[WIRE_HEADER_BYTES + WIRE_BODY_MAX];
};

struct tcp_transport;
struct tcp_conn;

/* One copy on an I/O thread: a connection has one per direction, idle or busy. */
struct tcp_offload_op {
	struct tcp_conn *conn;
	struct list_node link; /* pool queue or done list, under the pool's lock */
	int state;             /* tcp_offload.c's enum op_state, under the pool's lock */
	bool tx;
	bool busy; /* the loop's view: handed out, result not applied yet */
	atomic_bool cancel;
	int fd;
	struct iovec iov[IOV_BATCH];
	bool frame_end[IOV_BATCH]; /* sending: iov[i] ends a request frame; a call stops there */
	int n_iov;
	/*
	 * Bytes to move. Receiving, iov[] may hold room in rx_stage behind the
	 * payload for the next frame's header: the thread stops once want bytes
	 * came and keeps what its last call brought beyond them (never waits
	 * for those).
	 */
	uint64_t want;
	uint64_t applied;      /* the loop: bytes credited to the connection so far */
	_Atomic uint64_t done; /* the thread: bytes moved, published after every call */
	_Atomic int running;   /* the thread holds it (OP_RUNNING), for the loop's waits */
	/* written by the thread, read by the loop once the op is back */
	int err;    /* errno of the call that failed; 0 */
	bool eof;   /* receiving: the peer closed */
	bool again; /* the socket would block: the loop waits for readiness */
	/*
	 * rx_op only: the socket's SO_RCVLOWAT as last set (0: the kernel's 1),
	 * by the loop, or by the thread while the op is handed out.
	 */
	int lowat;
};

/* The I/O threads of one transport and the ops between them and the loop. */
struct tcp_offload {
	pthread_t *threads;
	uint32_t n_threads; /* 0: every copy on the loop */
	pthread_mutex_t lock;
	pthread_cond_t work;     /* an op was queued, or stop */
	pthread_cond_t finished; /* an op is done */
	struct list_node queue;  /* ops waiting for a thread */
	struct list_node done;   /* ops done, for the loop's wake-up callback */
	bool stop;
	struct loop_wake wake; /* the threads' results are in done */
	bool wake_open;
};

struct tcp_conn {
	struct tcp_transport *tt;
	struct list_node link; /* in tt->conns until closed */
	enum tcp_conn_state state;
	bool outgoing;
	/*
	 * Outgoing: carries only latency-class requests (xfer.urgent), so they
	 * never wait behind bulk bytes in either end's socket buffers.
	 */
	bool urgent_lane;
	bool has_uid; /* opened for a job of uid: counted in daemon->peer_conns until closed */
	uint32_t uid;
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
	uint64_t quickack_rx;    /* bytes_received when TCP_QUICKACK was last set */
	struct auth_transcript transcript;
	/* tcp_encryption = on (tcp_tls.c); tls is NULL on the plain wire */
	struct ssl_st *tls;
	int tls_want;       /* TLS handshake: the UV_READABLE / UV_WRITABLE it waits for */
	bool tls_peeked;    /* the peer's first byte was a TLS record, not a plain frame */
	bool tls_ktx;       /* kernel TLS encrypts what sendmsg() writes */
	bool tls_krx;       /* kernel TLS decrypts what recvmsg() reads */
	uint8_t *tls_stage; /* userspace sends: small frames gathered into one record */
	/*
	 * A frame whose job completed while it was half sent (transport_ops.withdraw
	 * answered -EINPROGRESS): once its last byte is out (withdrawn_out), its xfer
	 * is released from the timer; if it is not out within TCP_WITHDRAW_GRACE_MS,
	 * the connection fails with an abortive close instead.
	 */
	struct frame *withdrawn;
	bool withdrawn_out;
	/* requester: the peer's HELLO announced WRITE_SEGS (WIRE_HELLO_F_SEGS) */
	bool peer_segs;
	/* requester: the peer's HELLO announced READ_SEGS (WIRE_HELLO_F_READ_SEGS) */
	bool peer_read_segs;
	/* requester: the first refusal among the WRITEs of a cut xfer (wire id part_id) */
	int part_err;
	uint64_t part_id;
	char part_msg[MSG_BYTES];

	struct list_node outq;     /* frames to send, in order */
	struct list_node pendq;    /* requester: frames waiting for the handshake */
	struct list_node inflight; /* requester: frames sent, answer pending, in order */
	uint64_t out_sent;         /* bytes of the head of outq already sent */
	uint32_t n_out;
	/*
	 * The last send found the socket full: the spin (tcp_poll) leaves outq
	 * to the writable event instead of retrying sendmsg() on every pass.
	 * Only then does the connection wait for that event: frames queued on a
	 * socket with room go out from tt->flush_idle (or the spin) instead, with
	 * no epoll_ctl() per frame.
	 */
	bool tx_full;
	bool flush_listed;           /* in tt->flush_list */
	struct list_node flush_link; /* in tt->flush_list while flush_listed */

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
	/*
	 * Responder: a WRITE_SEGS or READ_SEGS table as received and decoded.
	 * Both ends: the segments a payload lands in (a WRITE_SEGS's in
	 * rx_region, a READ_SEGS answer's in the xfer's local region), from
	 * rx_seg_base, and the current one.
	 */
	uint8_t *rx_segtab;       /* WIRE_SEGS_MAX * WIRE_SEG_BYTES, on first use */
	struct wire_seg *rx_segs; /* WIRE_SEGS_MAX, on first use */
	uint8_t *rx_seg_base;
	uint32_t rx_n_segs;
	uint32_t rx_seg;
	uint64_t rx_segs_after; /* payload bytes of the segments after rx_seg */
	/*
	 * Receive-ahead: headers and small frames are read many at a time into
	 * rx_stage and parsed from there; a large payload is read straight into
	 * its destination, together with at most the next header.
	 */
	uint8_t *rx_stage; /* RX_STAGE_BYTES */
	uint32_t rx_start; /* first byte of rx_stage not yet consumed */
	uint32_t rx_end;   /* end of the bytes in rx_stage */
	bool rx_bulk;      /* the last frame's payload was large: expect another */
	/* copies on the I/O threads (tcp_offload.c), one per direction */
	struct tcp_offload_op tx_op;
	struct tcp_offload_op rx_op;
	bool offload_kick; /* an op came back: serve the connection from the wake-up callback */
	bool lane_counted; /* a ready latency-class connection, counted in tt->n_latency_lanes */
};

struct tcp_transport {
	struct transport base;
	struct rdmaxd *daemon;
	int listen_fd;
	uv_poll_t listen_poll;
	uv_timer_t timer;
	/*
	 * Connections with frames queued and room in the socket, sent from the
	 * next loop iteration (an idle handle: the loop does not block before).
	 */
	uv_idle_t flush_idle;
	struct list_node flush_list;
	uint32_t handles; /* listener + timer + flush_idle + conns not yet freed */
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
	/*
	 * RDMAXD_TEST_NO_WRITE_SEGS=1: behave like a release without WRITE_SEGS
	 * (not announced, refused as an unknown type, never sent), for tests.
	 */
	bool no_segs;
	/*
	 * RDMAXD_TEST_NO_READ_SEGS=1 (or no_segs): behave like a release
	 * without READ_SEGS, for tests.
	 */
	bool no_read_segs;
	struct log_ratelimit rl;
	struct ssl_ctx_st *tls_ctx; /* tcp_encryption = on; else NULL */
	char tls_reason[MSG_BYTES]; /* why the last TLS call failed, for the message */
	/* The last peer parsed: clients send to few peers, and parsing per xfer costs. */
	char last_peer_addr[sizeof(((struct endpoint *)0)->addr)];
	uint16_t last_peer_port;
	socklen_t last_peer_len; /* 0: nothing cached */
	struct sockaddr_storage last_peer_ss;
	struct tcp_offload offload;
	uint32_t n_latency_lanes; /* ready latency-class connections, either direction */
	uint64_t lane_io_ms;      /* when one of them last became ready or moved a byte */
	/*
	 * RDMAXD_TEST_TCP_OFFLOAD=1: bulk copies go to the I/O threads even
	 * without a latency-class connection, so the test suites run every
	 * path through them; never set in production.
	 */
	bool offload_always;
	uint8_t scratch[SCRATCH_BYTES];
};

static inline const struct config *tcp_cfg(const struct tcp_conn *conn)
{
	return &conn->tt->daemon->cfg;
}

static inline bool tcp_usable(const struct tcp_conn *conn)
{
	return conn->state == TCP_CONN_TLS || conn->state == TCP_CONN_WAIT_HELLO ||
	       conn->state == TCP_CONN_WAIT_AUTH || conn->state == TCP_CONN_READY;
}

static inline bool tcp_busy(const struct tcp_conn *conn)
{
	return !list_empty(&conn->outq) || !list_empty(&conn->pendq) ||
	       !list_empty(&conn->inflight) || conn->rx_state != RX_HEADER || conn->rx_got != 0 ||
	       conn->rx_end != conn->rx_start;
}

/* The next part to receive, from its first byte; called once or more per frame. */
static inline void tcp_rx_expect(struct tcp_conn *conn, enum rx_state state, uint8_t *dst,
				 uint64_t len)
{
	conn->rx_state = state;
	conn->rx_dst = dst;
	conn->rx_len = len;
	conn->rx_got = 0;
}

/* Append to the send queue; called for every frame. */
static inline void tcp_queue_frame(struct tcp_conn *conn, struct frame *frame)
{
	list_add_tail(&conn->outq, &frame->link);
	conn->n_out++;
}

/* tcp_conn.c: addresses, connection life, sending */
int tcp_parse_addr(const char *addr, uint16_t port, struct sockaddr_storage *ret_ss,
		   socklen_t *ret_len);
int tcp_peer_addr(struct tcp_transport *tt, const struct endpoint *peer,
		  struct sockaddr_storage *ret_ss, socklen_t *ret_len);
uint16_t tcp_addr_port(const struct sockaddr_storage *ss);
void tcp_format_addr(const struct sockaddr_storage *ss, char *buf, size_t size);
void tcp_tune_socket(struct tcp_transport *tt, int fd);
struct tcp_conn *tcp_conn_new(struct tcp_transport *tt, bool outgoing);
int tcp_conn_open_poll(struct tcp_conn *conn, int fd);
void tcp_frame_release(struct tcp_transport *tt, struct frame *frame);
void tcp_rx_reset(struct tcp_conn *conn);
void tcp_conn_fail(struct tcp_conn *conn, int err, const char *message);
void tcp_attempt_failed(struct tcp_conn *conn, const char *reason);
void tcp_conn_lost(struct tcp_conn *conn, int prio, const char *reason);
void tcp_protocol_error(struct tcp_conn *conn, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
struct frame *tcp_frame_new(struct tcp_transport *tt, const struct wire_header *header,
			    const void *body, size_t body_len);
bool tcp_queue_small(struct tcp_conn *conn, uint8_t type, int err, const void *body,
		     size_t body_len);
bool tcp_flush(struct tcp_conn *conn);
/* Credit n bytes sent to the frames at the head of the send queue. */
void tcp_advance_out(struct tcp_conn *conn, uint64_t n);

/*
 * Queue a request frame on a ready connection; a WRITE_SEGS (READ_SEGS) for
 * a peer that did not announce them goes as one WRITE (READ_REQ) per
 * segment. 0, or -ENOMEM with nothing queued (the frame stays the caller's).
 */
int tcp_queue_request(struct tcp_conn *conn, struct frame *frame);

/* tcp_handshake.c */
int tcp_bind_transcript(struct tcp_conn *conn);
bool tcp_queue_hello(struct tcp_conn *conn);
void tcp_on_hello(struct tcp_conn *conn);
void tcp_on_proof(struct tcp_conn *conn);
void tcp_on_peer_error(struct tcp_conn *conn);

void tcp_on_tls_hello(struct tcp_conn *conn);
void tcp_hello_after_tls(struct tcp_conn *conn);

/* tcp_tls.c: TLS 1.3 with the PSK of the shared key, and the one I/O seam */
#define TCP_TLS_STAGE_BYTES 16384 /* one TLS record of plaintext */
int tcp_tls_create(struct tcp_transport *tt);
void tcp_tls_destroy(struct tcp_transport *tt);
int tcp_tls_start(struct tcp_conn *conn);
void tcp_tls_drive(struct tcp_conn *conn);
void tcp_tls_free(struct tcp_conn *conn);
/* sendmsg()/recvmsg() of the connection, whatever carries its bytes; -1 and errno on failure */
ssize_t tcp_io_send(struct tcp_conn *conn, const struct iovec *iov, size_t n_iov);
ssize_t tcp_io_recv(struct tcp_conn *conn, struct iovec *iov, size_t n_iov);
/* Decrypted bytes held by OpenSSL, which no readiness event will announce. */
size_t tcp_io_pending(const struct tcp_conn *conn);
/* Text for an errno from tcp_io_send() / tcp_io_recv(). */
const char *tcp_io_strerror(const struct tcp_conn *conn, int err);

/* tcp_requests.c: requester answers, responder requests */
void tcp_complete_request(struct tcp_conn *conn);
void tcp_on_answer_header(struct tcp_conn *conn);
void tcp_on_message_done(struct tcp_conn *conn, bool received);
void tcp_on_segtab(struct tcp_conn *conn);
/* Receive a payload into the first of n segments (rx_segs) from base on. */
void tcp_rx_segs_start(struct tcp_conn *conn, uint8_t *base, uint32_t n);
bool tcp_next_seg(struct tcp_conn *conn);
void tcp_on_request(struct tcp_conn *conn);
void tcp_on_write_done(struct tcp_conn *conn, bool landed);

/* tcp_receive.c */
uint64_t tcp_frame_deadline(const struct tcp_conn *conn, uint64_t payload);
/* Payload bytes of the frame being received still to come (all of its segments'). */
uint64_t tcp_rx_payload_rest(const struct tcp_conn *conn);
void tcp_check_rx_region(struct tcp_conn *conn);
/* Set fd's SO_RCVLOWAT for a payload with `rest` bytes to come; *lowat: its value now. */
void tcp_rx_lowat_set(int fd, int *lowat, uint64_t rest);
/*
 * The no-progress clock is about to fire: bytes queued below the low-water
 * mark are read now. \return whether there were any to read (the peer is
 * making progress).
 */
bool tcp_rx_lowat_release(struct tcp_conn *conn);
bool tcp_reading_paused(const struct tcp_conn *conn);
void tcp_receive(struct tcp_conn *conn);
void tcp_on_connected(struct tcp_conn *conn);
void tcp_on_poll(uv_poll_t *handle, int status, int events);
void tcp_update_poll(struct tcp_conn *conn);
/* The flush list and its idle handle (tcp_update_poll); a conn leaves it before it closes. */
void tcp_flush_init(struct tcp_transport *tt);
void tcp_flush_unlist(struct tcp_conn *conn);
int tcp_poll(struct transport *transport);
/* Credit n bytes received straight into the current part. */
void tcp_rx_landed(struct tcp_conn *conn, uint64_t n);
/* Credit n bytes an I/O thread read ahead into rx_stage behind a payload. */
void tcp_rx_staged(struct tcp_conn *conn, uint64_t n);
/* Send and receive what `events` (UV_READABLE, UV_WRITABLE) allow, then watch for more. */
void tcp_serve_conn(struct tcp_conn *conn, int events);

/* tcp_offload.c: large copies on I/O threads */
int tcp_offload_start(struct tcp_transport *tt, uint32_t n_threads);
void tcp_offload_stop(struct tcp_transport *tt, uv_close_cb cb);
/*
 * Whether this connection's copies may leave the loop: threads exist, a
 * latency-class connection is open (only then is a sleeping loop worth the
 * hand-overs), and this is a plain bulk connection.
 */
bool tcp_offload_usable(const struct tcp_conn *conn);
/*
 * Whether the loop leaves the socket unread while a thread sends on it:
 * each of the thread's calls holds the socket's lock for up to
 * OFFLOAD_CALL_MAX bytes, and a recvmsg() for a 64-byte answer waited that
 * long, milliseconds in which the loop served nobody (docs/benchmarks.md,
 * "The loop waited on the socket lock"). Answers wait for the op's result
 * instead (at most OFFLOAD_MAX bytes or OFFLOAD_OP_MS). A connection whose
 * last frame in carried a large payload keeps reading: that is bulk too.
 */
static inline bool tcp_reads_wait_for_tx(const struct tcp_conn *conn)
{
	return conn->tx_op.busy && !conn->rx_bulk;
}
/* Hand op (conn, tx, iov, n_iov, want set) to a thread. */
void tcp_offload_submit(struct tcp_offload_op *op);
/* Take a busy op back now, its bytes credited; a no-op on an idle one. */
void tcp_offload_reap(struct tcp_offload_op *op);
/*
 * An answer for request_id arrived while the send queue's head may still
 * be on a thread: credit what the thread sent, waiting for the call that
 * carries the request's last bytes. The caller then finds it in flight, or
 * the peer answered what was never sent.
 */
void tcp_offload_answered(struct tcp_conn *conn, uint64_t request_id);

/* tcp_connect.c: connecting and accepting */
void tcp_on_conn_timer(uv_timer_t *timer);
/* The frame stays on the wire's books (ids, order), without the job's xfer. */
void tcp_frame_orphan(struct frame *frame);
#define TCP_WITHDRAW_GRACE_MS 1000 /* for the rest of a half-sent frame of a completed job */
void tcp_on_listen(uv_poll_t *handle, int status, int events);
void tcp_on_tick(uv_timer_t *timer);

#endif
