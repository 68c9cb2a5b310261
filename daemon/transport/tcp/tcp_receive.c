/* SPDX-License-Identifier: MIT */
/*
 * Receiving on a TCP connection: the readiness callback, bounded recvmsg()
 * loops that read payloads straight into region memory and headers and
 * small frames many at a time through the receive-ahead buffer, the parser
 * that hands each finished part to the handshake or the request code, and
 * per-frame deadlines. A malformed frame fails its connection, never the
 * daemon; reading pauses while a responder's answers are backed up.
 */
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "region.h"
#include "tcp_internal.h"

/* ---- receiving ---- */

/*
 * Loop time by which a frame with `payload` bytes still to come must be in:
 * peer_timeout_ms plus its size at min_frame_rate_kib_s. A peer that
 * trickles a frame (and so keeps the no-progress clock from firing) is cut
 * off there, and with it any region reference the frame holds.
 */
uint64_t tcp_frame_deadline(const struct tcp_conn *conn, uint64_t payload)
{
	const struct config *c = tcp_cfg(conn);
	uint64_t per_s = (uint64_t)c->min_frame_rate_kib_s * 1024;
	uint64_t ms = payload / per_s * 1000 + payload % per_s * 1000 / per_s;
	uint64_t now = uv_now(conn->tt->daemon->loop);

	ms += c->peer_timeout_ms;
	return ms > UINT64_MAX - now ? UINT64_MAX : now + ms;
}

/*
 * Payload bytes of the current frame still to come: the current part's and,
 * for a WRITE_SEGS (or a READ_SEGS answer), every later segment's; 0
 * outside a payload.
 */
uint64_t tcp_rx_payload_rest(const struct tcp_conn *conn)
{
	if (conn->rx_state != RX_DATA && conn->rx_state != RX_SEGDATA &&
	    conn->rx_state != RX_DISCARD) {
		return 0;
	}
	uint64_t rest = conn->rx_len - conn->rx_got;
	return conn->rx_state == RX_SEGDATA ? rest + conn->rx_segs_after : rest;
}

/*
 * The region a WRITE lands in is being deregistered: the rest of the
 * payload is dropped and the WRITE refused, so a slow peer holds the
 * region (and a dead client's mapping) no longer than one receive.
 */
void tcp_check_rx_region(struct tcp_conn *conn)
{
	if ((conn->rx_state != RX_DATA && conn->rx_state != RX_SEGDATA) || !conn->rx_region ||
	    !conn->rx_region->deregistering) {
		return;
	}
	/* A thread may be receiving into the region: its bytes are in before it goes. */
	tcp_offload_reap(&conn->rx_op);
	uint64_t rest = tcp_rx_payload_rest(conn);
	if (rest == 0) {
		return; /* the thread brought the last byte: the parser finishes the write */
	}
	region_put(&conn->tt->daemon->regions, conn->rx_region);
	conn->rx_region = NULL;
	conn->rx_err = RDMAX_E_NOT_FOUND;
	snprintf(conn->rx_msg, sizeof(conn->rx_msg),
		 "region %llu was deregistered while the write was arriving",
		 (unsigned long long)conn->rx_h.region_id);
	tcp_rx_expect(conn, RX_DISCARD, NULL, rest);
}

static void on_header(struct tcp_conn *conn)
{
	struct wire_header *h = &conn->rx_h;

	if (wire_header_decode(conn->rx_hdr, WIRE_HEADER_BYTES, h) < 0) {
		/* A TLS ClientHello (record type 22, version 3.x) where a HELLO belongs. */
		if (conn->state == TCP_CONN_WAIT_HELLO && !conn->outgoing && !conn->tls &&
		    conn->rx_hdr[0] == 0x16 && conn->rx_hdr[1] == 0x03) {
			tcp_on_tls_hello(conn);
			return;
		}
		tcp_protocol_error(conn, "malformed frame header");
		return;
	}
	uint64_t payload = wire_payload_bytes(h);
	conn->rx_bulk = payload >= RX_DIRECT_MIN;
	conn->frame_deadline = payload ? tcp_frame_deadline(conn, payload) : 0;
	tcp_rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES); /* unless a body follows */
	bool request = h->type == WIRE_WRITE || h->type == WIRE_READ_REQ ||
		       h->type == WIRE_MESSAGE || h->type == WIRE_WRITE_SEGS ||
		       h->type == WIRE_READ_SEGS;
	bool answer = h->type == WIRE_ACK || h->type == WIRE_READ_RESP;
	/* Handshake frames only in their step; requests only to the acceptor, answers back. */
	bool ok = h->type == WIRE_ERROR ||
		  (h->type == WIRE_HELLO && conn->state == TCP_CONN_WAIT_HELLO) ||
		  (h->type == WIRE_AUTH && conn->state == TCP_CONN_WAIT_AUTH) ||
		  (conn->state == TCP_CONN_READY &&
		   ((request && !conn->outgoing) || (answer && conn->outgoing)));
	if (!ok) {
		tcp_protocol_error(conn, "unexpected %s frame", wire_type_name(h->type));
	} else if (request) {
		tcp_on_request(conn);
	} else if (answer) {
		tcp_on_answer_header(conn);
	} else {
		tcp_rx_expect(conn, RX_BODY, conn->rx_body, h->length);
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
		tcp_on_segtab(conn);
		return;
	}
	if (state == RX_SEGDATA && tcp_next_seg(conn)) {
		return;
	}
	tcp_rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES);
	conn->frame_deadline = 0;
	uint8_t type = conn->rx_h.type;
	if (type == WIRE_HELLO) {
		tcp_on_hello(conn);
	} else if (type == WIRE_AUTH) {
		tcp_on_proof(conn);
	} else if (type == WIRE_ERROR) {
		tcp_on_peer_error(conn);
	} else if (type == WIRE_WRITE || type == WIRE_WRITE_SEGS) {
		tcp_on_write_done(conn, state == RX_DATA || state == RX_SEGDATA);
	} else if (type == WIRE_MESSAGE) {
		tcp_on_message_done(conn, state == RX_DATA);
	} else {
		tcp_complete_request(conn); /* ACK or READ_RESP */
	}
}

bool tcp_reading_paused(const struct tcp_conn *conn)
{
	return !conn->outgoing && conn->n_out >= ANSWERS_MAX;
}

static void rx_progress(struct tcp_conn *conn, uint64_t n)
{
	conn->rx_got += n;
	if ((conn->rx_state == RX_DATA || conn->rx_state == RX_SEGDATA) && conn->rx_req) {
		conn->rx_req->xfer->bytes_done += n; /* a read's answer (or a part of one) */
	}
}

/*
 * Credit n payload bytes received straight into the current part and, for
 * a segment list (WRITE_SEGS, a READ_SEGS answer), the segments behind it
 * in order; a part left full is handled by the parser (on_part_done()).
 */
static void rx_credit(struct tcp_conn *conn, uint64_t n)
{
	for (;;) {
		uint64_t take = MIN(n, conn->rx_len - conn->rx_got);
		rx_progress(conn, take);
		n -= take;
		if (n == 0 || conn->rx_state != RX_SEGDATA || !tcp_next_seg(conn)) {
			return;
		}
	}
}

void tcp_rx_landed(struct tcp_conn *conn, uint64_t n)
{
	conn->bytes_received += n;
	rx_credit(conn, n);
}

void tcp_rx_staged(struct tcp_conn *conn, uint64_t n)
{
	conn->bytes_received += n;
	conn->rx_end += (uint32_t)n;
}

/*
 * The rest of a large payload (at most OFFLOAD_MAX, over at most
 * IOV_BATCH - 1 segments of a segment list) is read by an I/O thread
 * straight into its destination; where that is the payload's end, its last
 * call also takes what is there of the next frame's header into rx_stage,
 * so that under a stream of large frames the loop parses the next header
 * without a recvmsg() of its own on the bulk socket (each of which
 * processes the socket's backlog on the loop's CPU).
 * \return whether it was handed out.
 */
static bool offload_rx(struct tcp_conn *conn)
{
	struct tcp_offload_op *op = &conn->rx_op;
	uint64_t rest = tcp_rx_payload_rest(conn);

	if ((conn->rx_state != RX_DATA && conn->rx_state != RX_SEGDATA) || rest < OFFLOAD_MIN ||
	    !tcp_offload_usable(conn)) {
		return false;
	}
	uint64_t want = MIN(conn->rx_len - conn->rx_got, (uint64_t)OFFLOAD_MAX);
	op->iov[0].iov_base = conn->rx_dst + conn->rx_got;
	op->iov[0].iov_len = want;
	op->n_iov = 1;
	if (conn->rx_state == RX_SEGDATA) {
		for (uint32_t k = conn->rx_seg + 1;
		     k < conn->rx_n_segs && op->n_iov < IOV_BATCH - 1 && want < OFFLOAD_MAX; k++) {
			const struct wire_seg *seg = &conn->rx_segs[k];
			uint64_t take = MIN(seg->length, OFFLOAD_MAX - want);
			op->iov[op->n_iov].iov_base = conn->rx_seg_base + seg->offset;
			op->iov[op->n_iov].iov_len = take;
			op->n_iov++;
			want += take;
		}
	}
	if (want == rest && conn->rx_start == conn->rx_end) {
		conn->rx_start = conn->rx_end = 0;
		op->iov[op->n_iov].iov_base = conn->rx_stage;
		op->iov[op->n_iov].iov_len = WIRE_HEADER_BYTES;
		op->n_iov++;
	}
	op->want = want;
	tcp_offload_submit(op);
	return true;
}

/*
 * Bytes received ahead and not parsed yet, a finished part not handled yet,
 * or bytes OpenSSL decrypted that no readiness event will announce.
 */
static bool rx_pending(const struct tcp_conn *conn)
{
	return conn->rx_end != conn->rx_start || conn->rx_got == conn->rx_len ||
	       tcp_io_pending(conn) > 0;
}

/*
 * Hand the staged bytes to the parts they belong to, handling each part as
 * it completes (parts of length 0 complete without any byte). Returns with
 * rx_stage empty and the current part waiting for more, or when the
 * connection failed or stopped reading.
 */
static void consume_staged(struct tcp_conn *conn)
{
	while (tcp_usable(conn) && !tcp_reading_paused(conn)) {
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

void tcp_rx_lowat_set(int fd, int *lowat, uint64_t rest)
{
	int want = rest >= 2 * RX_LOWAT_MAX   ? (int)RX_LOWAT_MAX
		   : rest >= 2 * RX_LOWAT_MIN ? (int)RX_LOWAT_MIN
					      : 1;

	if (want == MAX(*lowat, 1)) {
		return;
	}
	/* Where it fails, *lowat keeps the value the socket still has. */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) {
		*lowat = want;
	}
}

/*
 * The low-water mark for what the socket is read for next (the loop's
 * reads; a thread sets its own while it holds the payload). Not under TLS:
 * OpenSSL and kernel TLS read records, not the payload's bytes.
 */
static void rx_lowat_follow(struct tcp_conn *conn)
{
	if (conn->tls || conn->rx_op.busy || !tcp_usable(conn)) {
		return;
	}
	tcp_rx_lowat_set(conn->fd, &conn->rx_op.lowat, tcp_rx_payload_rest(conn));
}

bool tcp_rx_lowat_release(struct tcp_conn *conn)
{
	int queued = 0;

	tcp_offload_reap(&conn->rx_op); /* a thread waiting below the mark gives it back */
	if (conn->rx_op.lowat <= 1 || !tcp_usable(conn)) {
		return false;
	}
	tcp_rx_lowat_set(conn->fd, &conn->rx_op.lowat, 0);
	/* Queued bytes nobody may read (answers backed up) are no progress. */
	if (ioctl(conn->fd, FIONREAD, &queued) < 0 || queued <= 0 || tcp_reading_paused(conn)) {
		return false;
	}
	tcp_receive(conn); /* reads them, or hands them to a thread that does */
	return true;
}

static void receive_some(struct tcp_conn *conn);

/* Read what is there (receive_some), then set the low-water mark for what comes next. */
void tcp_receive(struct tcp_conn *conn)
{
	receive_some(conn);
	rx_lowat_follow(conn);
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
static void receive_some(struct tcp_conn *conn)
{
	uint64_t start = conn->bytes_received;
	bool drained = false;

	if (conn->rx_op.busy || tcp_reads_wait_for_tx(conn)) {
		return; /* the thread's result brings the connection back */
	}
	for (int calls = 0;; calls++) {
		consume_staged(conn);
		/*
		 * A responder's last call took less than asked and left no frame
		 * begun: the socket is most likely empty, and the next call would
		 * only hear EAGAIN, one more system call between a request and its
		 * answer. Epoll's readiness is level-triggered, so bytes that came
		 * meanwhile still bring the connection back. OpenSSL may hold bytes
		 * no event announces: userspace TLS reads on. A requester reads on
		 * too: its spin reads the socket again on every pass while answers
		 * are due, and stopping there measured slower (docs/benchmarks.md,
		 * "The completed 64 B write over TCP, by stage").
		 */
		if (drained && !conn->outgoing && conn->rx_state == RX_HEADER &&
		    conn->rx_got == 0 && !conn->tls) {
			return;
		}
		/* Past the budget only what OpenSSL holds: no event would bring it back. */
		if (!tcp_usable(conn) || tcp_reading_paused(conn) ||
		    ((calls >= RX_BUDGET || conn->bytes_received - start >= IO_BYTES_BUDGET) &&
		     !tcp_io_pending(conn))) {
			return;
		}
		tcp_check_rx_region(conn);
		if (calls < RX_BUDGET && offload_rx(conn)) {
			return;
		}
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
				for (; k < conn->rx_n_segs && n_iov <= RX_SEG_IOV; k++) {
					const struct wire_seg *seg = &conn->rx_segs[k];
					iov[n_iov].iov_base = conn->rx_seg_base + seg->offset;
					iov[n_iov].iov_len = seg->length;
					n_iov++;
					direct += seg->length;
				}
				ahead = k == conn->rx_n_segs && conn->rx_h.length <= RX_TAIL_MAX
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
		size_t n_direct = n_iov;
		if (ahead > 0) {
			iov[n_iov].iov_base = conn->rx_stage;
			iov[n_iov].iov_len = ahead;
			n_iov++;
		}
		if (calls >= RX_BUDGET) {
			/* Past the budget only what OpenSSL holds, so the socket is not read. */
			uint64_t left = tcp_io_pending(conn);
			direct = 0;
			for (size_t i = 0; i < n_iov; i++) {
				iov[i].iov_len = MIN((uint64_t)iov[i].iov_len, left);
				left -= iov[i].iov_len;
				direct += i < n_direct ? iov[i].iov_len : 0;
			}
		}
		size_t asked = 0;
		for (size_t i = 0; i < n_iov; i++) {
			asked += iov[i].iov_len;
		}
		ssize_t n = tcp_io_recv(conn, iov, n_iov);
		if (n == 0) {
			tcp_conn_lost(conn, LOG_INFO, "peer closed the connection");
			return;
		}
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				tcp_conn_lost(conn, LOG_INFO, tcp_io_strerror(conn, errno));
			}
			return;
		}
		uint64_t got = (uint64_t)n;
		drained = got < asked;
		conn->bytes_received += got;
		conn->last_io_ms = now_ms();
		if (conn->urgent_lane) {
			conn->tt->lane_io_ms = conn->last_io_ms;
		}
		if (direct > 0) {
			uint64_t part = MIN(got, direct);
			got -= part;
			rx_credit(conn, part); /* a segment list's read runs into the next ones */
		}
		conn->rx_start = 0;
		conn->rx_end = (uint32_t)got;
	}
}

void tcp_on_connected(struct tcp_conn *conn)
{
	int err = tcp_bind_transcript(conn);
	if (err < 0) {
		tcp_attempt_failed(conn, strerror(-err));
		return;
	}
	conn->state = TCP_CONN_WAIT_HELLO;
	conn->transcript.client_instance = conn->tt->daemon->instance_id;
	auth_nonce(conn->transcript.client_nonce);
	/* An attempt, handshake included, also stays within connect_timeout_ms. */
	uv_timer_start(&conn->timer, tcp_on_conn_timer,
		       MIN(tcp_cfg(conn)->connect_timeout_ms, tcp_cfg(conn)->handshake_timeout_ms),
		       0);
	tcp_rx_reset(conn);
	if (!conn->tt->tls_ctx) {
		tcp_queue_hello(conn);
		return;
	}
	err = tcp_tls_start(conn);
	if (err < 0) {
		tcp_attempt_failed(conn, strerror(-err));
		return;
	}
	tcp_tls_drive(conn); /* the ClientHello */
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

static void serve_tail(struct tcp_conn *conn);

/*
 * A responder that paused at ANSWERS_MAX with requests staged, whose answers
 * a flush outside serve_tail() (the loop's flush list, the spin) made room
 * for: no readiness event announces bytes already read, so the caller reads
 * them now, or the requester waits for answers that never come.
 */
static bool staged_to_resume(const struct tcp_conn *conn)
{
	return !conn->outgoing && rx_pending(conn) && !tcp_reading_paused(conn) &&
	       conn->state == TCP_CONN_READY;
}

void tcp_on_poll(uv_poll_t *handle, int status, int events)
{
	struct tcp_conn *conn = handle->data;

	if (conn->poll != handle) {
		return;
	}
	if (conn->state == TCP_CONN_CONNECTING) {
		int err = socket_error(conn->fd);
		if (status < 0 || err != 0) {
			tcp_attempt_failed(conn, err ? strerror(err) : uv_strerror(status));
			return;
		}
		tcp_on_connected(conn);
	} else if (conn->state == TCP_CONN_TLS) {
		/* OpenSSL reads the socket's error itself; once up, the HELLOs go as below. */
		tcp_tls_drive(conn);
		if (tcp_usable(conn) && conn->state != TCP_CONN_TLS) {
			tcp_receive(conn);
		}
	} else if (status < 0) {
		/* libuv reports EPOLLERR as EBADF: read what arrived, then the real error. */
		conn->poll_events = 0;
		tcp_offload_reap(&conn->tx_op); /* reads wait for a sending thread */
		tcp_receive(conn);
		if (tcp_usable(conn)) {
			int err = socket_error(conn->fd);
			tcp_conn_lost(conn, LOG_INFO, err ? strerror(err) : uv_strerror(status));
		}
		return;
	} else {
		tcp_serve_conn(conn, events);
		return;
	}
	serve_tail(conn);
}

void tcp_serve_conn(struct tcp_conn *conn, int events)
{
	/*
	 * Read before sending: a flush may hand the send queue to a thread
	 * again, and the answers behind it would wait for that op too.
	 */
	if ((events & UV_READABLE) || rx_pending(conn)) {
		tcp_receive(conn);
		if (!tcp_usable(conn)) {
			return;
		}
	}
	if (events & UV_WRITABLE) {
		conn->tx_full = false;
		if (!tcp_flush(conn)) {
			return;
		}
	}
	serve_tail(conn);
}

static void serve_tail(struct tcp_conn *conn)
{
	/*
	 * Answers just queued go out now. Frames already staged raise no
	 * readiness event, so a responder that paused at ANSWERS_MAX parses
	 * them here once the flush made room; bounded, the rest waits for the
	 * next (writable) event.
	 */
	for (int round = 0; round < 4; round++) {
		if (tcp_usable(conn) && !list_empty(&conn->outq) && !tcp_flush(conn)) {
			return;
		}
		if (!tcp_usable(conn) || !rx_pending(conn) || tcp_reading_paused(conn)) {
			break;
		}
		tcp_receive(conn);
	}
	tcp_update_poll(conn);
}

/*
 * transport_ops.poll, from the daemon's spin between loop iterations: frames
 * queued since the last pass go out, and connections that wait for answers
 * are read, without waiting for epoll to report them. A connection with
 * nothing queued or in flight is left to its readiness events.
 */
int tcp_poll(struct transport *transport)
{
	struct tcp_transport *tt = container_of(transport, struct tcp_transport, base);
	struct list_node *pos, *tmp;
	int moved = 0;

	if (tt->shut) {
		return 0;
	}
	list_for_each_safe(pos, tmp, &tt->conns)
	{
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		if (conn->state != TCP_CONN_READY || !conn->poll ||
		    (list_empty(&conn->outq) && list_empty(&conn->inflight))) {
			continue;
		}
		uint64_t before = conn->bytes_sent + conn->bytes_received;
		if (!list_empty(&conn->outq) && !conn->tx_full && !tcp_flush(conn)) {
			moved++;
			continue;
		}
		if (tcp_usable(conn) && (!list_empty(&conn->inflight) || staged_to_resume(conn))) {
			tcp_receive(conn);
		}
		if (tcp_usable(conn)) {
			tcp_update_poll(conn);
		}
		moved += conn->bytes_sent + conn->bytes_received != before;
	}
	return moved;
}

/*
 * The connections with frames queued and room in the socket, from the loop's
 * idle phase: tcp_flush() sends them (where the socket fills, tx_full leaves
 * the rest to the writable event), then the connection's interest is set
 * anew. The idle handle stops when no connection is left listed.
 */
static void on_flush_idle(uv_idle_t *idle)
{
	struct tcp_transport *tt = idle->data;
	struct list_node todo;

	list_init(&todo);
	list_move_all(&todo, &tt->flush_list);
	while (!list_empty(&todo)) {
		struct tcp_conn *conn = container_of(todo.next, struct tcp_conn, flush_link);
		list_del(&conn->flush_link);
		conn->flush_listed = false;
		if (tcp_usable(conn) && !list_empty(&conn->outq) && !conn->tx_full &&
		    !tcp_flush(conn)) {
			continue; /* failed: its xfers completed */
		}
		if (tcp_usable(conn) && staged_to_resume(conn)) {
			tcp_receive(conn);
		}
		if (tcp_usable(conn)) {
			tcp_update_poll(conn);
		}
	}
	if (list_empty(&tt->flush_list)) {
		uv_idle_stop(&tt->flush_idle);
	}
}

void tcp_flush_unlist(struct tcp_conn *conn)
{
	if (conn->flush_listed) {
		list_del(&conn->flush_link);
		conn->flush_listed = false;
	}
}

void tcp_flush_init(struct tcp_transport *tt)
{
	list_init(&tt->flush_list);
	uv_idle_init(tt->daemon->loop, &tt->flush_idle);
	tt->flush_idle.data = tt;
}

void tcp_update_poll(struct tcp_conn *conn)
{
	int events = 0;

	if (!conn->poll) {
		return;
	}
	if (conn->state == TCP_CONN_CONNECTING) {
		events = UV_WRITABLE;
	} else if (conn->state == TCP_CONN_TLS) {
		events = conn->tls_want;
	} else if (tcp_usable(conn)) {
		/* A direction whose copy is on an I/O thread waits for its result instead. */
		events = tcp_reading_paused(conn) || conn->rx_op.busy || tcp_reads_wait_for_tx(conn)
				 ? 0
				 : UV_READABLE;
		/*
		 * Frames to send wait for the writable event only where the socket
		 * was full; otherwise the next iteration sends them, and a request
		 * costs no epoll_ctl() to watch for room and none to stop.
		 */
		if (!list_empty(&conn->outq) && !conn->tx_op.busy) {
			if (conn->tx_full) {
				events |= UV_WRITABLE;
			} else if (!conn->flush_listed && !conn->tt->shut) {
				struct tcp_transport *tt = conn->tt;
				if (list_empty(&tt->flush_list)) {
					uv_idle_start(&tt->flush_idle, on_flush_idle);
				}
				list_add_tail(&tt->flush_list, &conn->flush_link);
				conn->flush_listed = true;
			}
		}
	}
	if (events == conn->poll_events) {
		return;
	}
	int err =
		events ? uv_poll_start(conn->poll, events, tcp_on_poll) : uv_poll_stop(conn->poll);
	if (err < 0) {
		tcp_conn_lost(conn, LOG_ERR, uv_strerror(err));
		return;
	}
	conn->poll_events = events;
}
