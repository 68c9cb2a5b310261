/* SPDX-License-Identifier: MIT */
/*
 * Large payload copies of the TCP transport on I/O threads of their own
 * ([transport] tcp_io_threads), so the loop that serves clients, small
 * frames and latency-class connections is not the thread that spends
 * milliseconds in the kernel copying bulk bytes: with the copies elsewhere
 * the loop sleeps between events, and a frame or doorbell that arrives
 * wakes it ahead of the threads that have been running (docs/benchmarks.md,
 * "Traffic classes").
 *
 * What leaves the loop is one system-call loop at a time per connection
 * and direction: the iovecs of the frames at the head of the send queue
 * (from OFFLOAD_MIN payload bytes on), or the rest of a payload being
 * received straight into memory. The thread only moves bytes, with
 * non-blocking calls of at most OFFLOAD_CALL_MAX each: it stops where the
 * socket would block and the loop waits for readiness as before. Everything
 * else (parsing, queues, completions, failures) stays on the loop, which
 * applies each result when the thread hands it back. Before a connection
 * fails or a job's frame is withdrawn, the loop takes its operation back
 * (tcp_offload_reap), waiting at most for the call in progress, so no byte
 * of a completed job moves and no socket is closed under a thread.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "counters.h"
#include "cpu_affinity.h"
#include "tcp_internal.h"

#define OFFLOAD_POLL_MS 1 /* a reap waits at most this for a thread in poll() */
/*
 * An op ends this long after it started, with what it moved: the loop then
 * sees the connection again (its no-progress clock, a region being
 * deregistered under a payload, a peer that trickles) and hands the rest
 * out anew, so a slow peer holds nothing longer than this on the thread.
 */
#define OFFLOAD_OP_MS 50

enum op_state {
	OP_IDLE,    /* the loop's */
	OP_QUEUED,  /* waiting for a thread */
	OP_RUNNING, /* a thread moves its bytes */
	OP_DONE,    /* result ready, in pool->done until the loop takes it */
};

/*
 * The iovecs of `op` from byte `from` on, at most OFFLOAD_CALL_MAX bytes and
 * never past the end of a request frame: the call that sends a request's
 * last byte returns right after it, so the loop, reading the answer, waits
 * for no more than that (tcp_offload_answered).
 */
static size_t op_window(const struct tcp_offload_op *op, uint64_t from, struct iovec *iov)
{
	size_t n = 0;
	uint64_t budget = OFFLOAD_CALL_MAX;

	for (int i = 0; i < op->n_iov && budget > 0; i++) {
		uint64_t len = op->iov[i].iov_len;
		if (from >= len) {
			from -= len;
			continue;
		}
		uint64_t take = MIN(len - from, budget);
		iov[n].iov_base = (uint8_t *)op->iov[i].iov_base + from;
		iov[n].iov_len = take;
		n++;
		budget -= take;
		from = 0;
		if (op->frame_end[i]) {
			break;
		}
	}
	return n;
}

/*
 * On a thread: wait for the socket to take or give bytes, in slices of
 * OFFLOAD_POLL_MS so that a cancel is seen within one, until the op's
 * end; then the loop's readiness events and timers take over (a peer that
 * stopped reading or sending is the loop's to judge).
 */
static bool wait_ready(struct tcp_offload_op *op, uint64_t end_ns)
{
	struct pollfd pfd = {.fd = op->fd, .events = op->tx ? POLLOUT : POLLIN};

	while (now_ns() < end_ns) {
		if (atomic_load_explicit(&op->cancel, memory_order_relaxed)) {
			return false;
		}
		int n = poll(&pfd, 1, OFFLOAD_POLL_MS);
		if (n > 0) {
			return true; /* an error or hang-up shows in the next call */
		}
		if (n < 0 && errno != EINTR) {
			return false;
		}
	}
	return false;
}

/*
 * On a thread: move the op's bytes until done, cancelled, OFFLOAD_OP_MS
 * passed, or the socket stays blocked.
 */
static void op_run(struct tcp_offload_op *op)
{
	struct iovec iov[IOV_BATCH];
	uint64_t done = 0;
	uint64_t end_ns = now_ns() + (uint64_t)OFFLOAD_OP_MS * 1000000;

	while (done < op->want && !atomic_load_explicit(&op->cancel, memory_order_relaxed) &&
	       now_ns() < end_ns) {
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = op_window(op, done, iov)};
		ssize_t n = op->tx ? sendmsg(op->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT)
				   : recvmsg(op->fd, &msg, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				op->err = errno;
				return;
			}
			if (!op->tx) {
				/* Woken for the payload's next RX_LOWAT_MAX, not each segment. */
				tcp_rx_lowat_set(op->fd, &op->lowat, op->want - done);
			}
			if (!wait_ready(op, end_ns)) {
				op->again = true;
				return;
			}
			continue;
		}
		if (n == 0 && !op->tx) {
			op->eof = true;
			return;
		}
		done += (uint64_t)n;
		atomic_store_explicit(&op->done, done, memory_order_release);
	}
}

static void *io_thread(void *arg)
{
	struct tcp_offload *pool = arg;
	int err = cpu_affinity_pin_worker();

	if (err < 0) {
		log_warn("TCP I/O thread: cannot pin to engine.worker_cpus: %s", strerror(-err));
	}
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		while (!pool->stop && list_empty(&pool->queue)) {
			pthread_cond_wait(&pool->work, &pool->lock);
		}
		if (pool->stop) {
			break;
		}
		struct tcp_offload_op *op =
			container_of(pool->queue.next, struct tcp_offload_op, link);
		list_del(&op->link);
		op->state = OP_RUNNING;
		atomic_store_explicit(&op->running, 1, memory_order_relaxed);
		pthread_mutex_unlock(&pool->lock);
		op_run(op);
		pthread_mutex_lock(&pool->lock);
		op->state = OP_DONE;
		atomic_store_explicit(&op->running, 0, memory_order_release);
		list_add_tail(&pool->done, &op->link);
		pthread_cond_broadcast(&pool->finished);
		/* Not under the lock: the loop this wakes takes it first thing. */
		pthread_mutex_unlock(&pool->lock);
		loop_wake_send(&pool->wake);
		pthread_mutex_lock(&pool->lock);
	}
	pthread_mutex_unlock(&pool->lock);
	cpu_affinity_worker_exit();
	return NULL;
}

/* On the loop: credit the bytes the thread published since the last call (no callbacks). */
static void op_progress(struct tcp_offload_op *op)
{
	struct tcp_conn *conn = op->conn;
	uint64_t done = atomic_load_explicit(&op->done, memory_order_acquire);

	if (done <= op->applied) {
		return;
	}
	uint64_t n = done - op->applied;
	conn->last_io_ms = now_ms();
	if (op->tx) {
		op->applied = done;
		conn->tt->daemon->counters.tcp_io_thread_sent += n;
		tcp_advance_out(conn, n);
	} else {
		/* Up to want the payload; beyond it what the last call read ahead. */
		uint64_t payload = MIN(done, op->want) - MIN(op->applied, op->want);
		op->applied = done;
		conn->tt->daemon->counters.tcp_io_thread_received += n;
		if (payload > 0) {
			tcp_rx_landed(conn, payload);
		}
		if (n > payload) {
			tcp_rx_staged(conn, n - payload);
		}
	}
}

/* On the loop: an op is back; the rest of its bytes credited, its connection kicked. */
static void op_apply(struct tcp_offload_op *op)
{
	struct tcp_conn *conn = op->conn;

	op_progress(op);
	op->busy = false;
	conn->tt->daemon->io_offloaded--;
	conn->tt->daemon->io_offload_ns = now_ns();
	conn->offload_kick = true;
}

/*
 * On the loop, after results were applied: what each connection does next.
 * A failure or end of stream fails the connection; otherwise it reads and
 * sends on (or hands the next copy out) and waits for readiness again.
 */
static void kick_conns(struct tcp_transport *tt)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &tt->conns)
	{
		struct tcp_conn *conn = container_of(pos, struct tcp_conn, link);
		if (!conn->offload_kick) {
			continue;
		}
		conn->offload_kick = false;
		struct tcp_offload_op *ops[2] = {&conn->tx_op, &conn->rx_op};
		bool failed = false;
		for (int i = 0; i < 2 && !failed; i++) {
			struct tcp_offload_op *op = ops[i];
			if (op->busy) {
				continue;
			}
			if (op->eof) {
				tcp_conn_lost(conn, LOG_INFO, "peer closed the connection");
				failed = true;
			} else if (op->err) {
				tcp_conn_lost(conn, LOG_INFO, strerror(op->err));
				failed = true;
			}
			op->eof = false;
			op->err = 0;
		}
		if (failed || !tcp_usable(conn)) {
			continue;
		}
		/* Where the socket would block, readiness brings the connection back. */
		int events = conn->rx_op.again ? 0 : UV_READABLE;
		events |= conn->tx_op.again || list_empty(&conn->outq) ? 0 : UV_WRITABLE;
		conn->rx_op.again = false;
		conn->tx_op.again = false;
		tcp_serve_conn(conn, events);
	}
}

static void on_wake(struct loop_wake *wake)
{
	struct tcp_transport *tt = wake->poll.data;
	struct tcp_offload *pool = &tt->offload;
	struct list_node done;

	list_init(&done);
	pthread_mutex_lock(&pool->lock);
	list_move_all(&done, &pool->done);
	pthread_mutex_unlock(&pool->lock);
	while (!list_empty(&done)) {
		struct tcp_offload_op *op = container_of(done.next, struct tcp_offload_op, link);
		list_del(&op->link);
		op->state = OP_IDLE;
		op_apply(op);
	}
	kick_conns(tt);
}

int tcp_offload_start(struct tcp_transport *tt, uint32_t n_threads)
{
	struct tcp_offload *pool = &tt->offload;

	list_init(&pool->queue);
	list_init(&pool->done);
	if (n_threads == 0) {
		return 0;
	}
	pool->threads = calloc(n_threads, sizeof(*pool->threads));
	if (!pool->threads) {
		return -ENOMEM;
	}
	pthread_mutex_init(&pool->lock, NULL);
	pthread_cond_init(&pool->work, NULL);
	pthread_cond_init(&pool->finished, NULL);
	int err = loop_wake_init(tt->daemon->loop, &pool->wake, on_wake);
	if (err < 0) {
		goto out_free;
	}
	pool->wake.poll.data = tt;
	pool->wake_open = true;
	for (; pool->n_threads < n_threads; pool->n_threads++) {
		err = -pthread_create(&pool->threads[pool->n_threads], NULL, io_thread, pool);
		if (err < 0) {
			log_err("cannot start a TCP I/O thread: %s", strerror(-err));
			return err; /* tcp_offload_stop() joins the ones that started */
		}
	}
	return 0;

out_free:
	pthread_cond_destroy(&pool->finished);
	pthread_cond_destroy(&pool->work);
	pthread_mutex_destroy(&pool->lock);
	free(pool->threads);
	pool->threads = NULL;
	return err;
}

/* Connections are gone (their ops reaped): join the threads; the wake-up handle closes with cb. */
void tcp_offload_stop(struct tcp_transport *tt, uv_close_cb cb)
{
	struct tcp_offload *pool = &tt->offload;

	if (!pool->threads) {
		return;
	}
	pthread_mutex_lock(&pool->lock);
	pool->stop = true;
	pthread_cond_broadcast(&pool->work);
	pthread_mutex_unlock(&pool->lock);
	for (uint32_t i = 0; i < pool->n_threads; i++) {
		pthread_join(pool->threads[i], NULL);
	}
	if (pool->wake_open) {
		loop_wake_close(&pool->wake, cb);
		pool->wake_open = false;
	}
	pthread_cond_destroy(&pool->finished);
	pthread_cond_destroy(&pool->work);
	pthread_mutex_destroy(&pool->lock);
	free(pool->threads);
	pool->threads = NULL;
	pool->n_threads = 0;
}

/*
 * Whether latency-class traffic is there to serve: a latency-class
 * connection is open and, with [qos] lane_linger_ms, moved a byte (or
 * became ready) that recently. A lane that stays open in the connection cache
 * after its traffic ended leaves bulk copies to the loop again.
 */
static bool lanes_active(const struct tcp_transport *tt)
{
	uint32_t linger = tt->daemon->cfg.qos_lane_linger_ms;

	return tt->n_latency_lanes > 0 && (linger == 0 || now_ms() - tt->lane_io_ms < linger);
}

bool tcp_offload_usable(const struct tcp_conn *conn)
{
	/*
	 * Without latency-class traffic to serve the loop copies and spins: a
	 * hand-over per payload and a wake-up per answer cost about a fifth
	 * more CPU per byte, and bulk alone moved 30-60 % less through the
	 * threads (docs/benchmarks.md, "Traffic classes"). OpenSSL's state is
	 * the loop's; kernel TLS records need their control messages.
	 */
	return conn->tt->offload.n_threads > 0 && !conn->urgent_lane && !conn->tls &&
	       conn->fd >= 0 && (conn->tt->offload_always || lanes_active(conn->tt));
}

void tcp_offload_submit(struct tcp_offload_op *op)
{
	struct tcp_conn *conn = op->conn;
	struct tcp_offload *pool = &conn->tt->offload;

	op->fd = conn->fd;
	op->applied = 0;
	atomic_store_explicit(&op->done, 0, memory_order_relaxed);
	op->err = 0;
	op->eof = false;
	op->again = false;
	atomic_store_explicit(&op->cancel, false, memory_order_relaxed);
	op->busy = true;
	conn->tt->daemon->io_offloaded++;
	conn->tt->daemon->io_offload_ns = now_ns();
	pthread_mutex_lock(&pool->lock);
	op->state = OP_QUEUED;
	list_add_tail(&pool->queue, &op->link);
	pthread_cond_signal(&pool->work);
	pthread_mutex_unlock(&pool->lock);
}

/*
 * Take an op back on the loop now: a queued one is unqueued, a running one
 * is asked to stop and waited for (one system call at most). Its bytes are
 * credited, its connection kicked from the next wake-up callback.
 */
void tcp_offload_reap(struct tcp_offload_op *op)
{
	struct tcp_offload *pool;

	if (!op->busy) {
		return;
	}
	pool = &op->conn->tt->offload;
	atomic_store_explicit(&op->cancel, true, memory_order_relaxed);
	pthread_mutex_lock(&pool->lock);
	while (op->state == OP_RUNNING) {
		pthread_cond_wait(&pool->finished, &pool->lock);
	}
	list_del(&op->link); /* from the queue or the done list */
	op->state = OP_IDLE;
	pthread_mutex_unlock(&pool->lock);
	op_apply(op);
	loop_wake_send(&pool->wake);
}

/* Whether the request frame at the head of the send queue is request_id's. */
static bool head_is(struct tcp_conn *conn, uint64_t request_id)
{
	if (list_empty(&conn->outq)) {
		return false;
	}
	const struct frame *frame = container_of(conn->outq.next, struct frame, link);
	return frame->xfer && frame->xfer->wire_id == request_id;
}

void tcp_offload_answered(struct tcp_conn *conn, uint64_t request_id)
{
	struct tcp_offload_op *op = &conn->tx_op;

	if (!op->busy || !list_empty(&conn->inflight)) {
		return; /* the oldest in flight is the one answered, or the peer is wrong */
	}
	op_progress(op);
	if (!list_empty(&conn->inflight) || !head_is(conn, request_id)) {
		return;
	}
	/*
	 * The peer has the request's last byte only once it was sent; the call
	 * that sent it ends there (op_window) and publishes. The op stops after
	 * the call in progress (the rest is handed out again), so a peer that
	 * answers what was not sent costs one call, or one poll slice, and
	 * finds the request still queued: the caller's protocol error.
	 */
	atomic_store_explicit(&op->cancel, true, memory_order_relaxed);
	while (list_empty(&conn->inflight) && head_is(conn, request_id) &&
	       (atomic_load_explicit(&op->running, memory_order_acquire) ||
		op->applied < atomic_load_explicit(&op->done, memory_order_acquire))) {
		sched_yield();
		op_progress(op);
	}
}
