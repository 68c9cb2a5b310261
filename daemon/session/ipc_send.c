/* SPDX-License-Identifier: MIT */
/*
 * What the daemon sends to a client: replies and errors (always valid
 * UTF-8), events (ImmReached, RingNotify) and the per-client batches of
 * completions, flushed once per loop iteration from the uv_check handle
 * and from every pass of the daemon's spin (ipc_poll_pass).
 * Completions go to the client's shared-memory ring while it has room and
 * nothing waits on the socket before them (otherwise to the socket, in
 * order); datagrams are counted so that ring entries and socket messages
 * are read in the order they were sent. A reply that cannot be sent or
 * queued (over SESSION_MAX_QUEUED_BYTES) dooms the session; this file never
 * closes one, nor reads from the socket.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "counters.h"
#include "gpu.h"
#include "ipc.h"
#include "log.h"
#include "rdmax.h"
#include "session_internal.h"
#include "status.h"

/*
 * A datagram is about to be sent or queued (delta 1), or was not after all
 * (-1): ring completions posted later come after it. Counted before the
 * send: a client that the datagram wakes finds it counted, rather than
 * polling a readable socket until a daemon preempted between the two
 * calls catches up. Taking a count back is safe: no client can have read
 * a datagram that was never sent.
 */
static void count_sent(struct session *s, int delta)
{
	s->msgs_sent += (uint64_t)(int64_t)delta;
	if (s->ring.v.base) {
		ring_report_sent(&s->ring, s->msgs_sent);
	}
}

/*
 * Completions to flush at the next pass. The pass runs from the loop's
 * check phase and from the spin; a completion delivered after this turn's
 * pass (from a transport's check handle, which libuv runs after the
 * client socket's, or from a timer) must not wait for the loop's next
 * event: the idle handle keeps epoll from blocking until the pass ran.
 */
static void mark_dirty(struct session *s)
{
	if (!s->dirty) {
		s->dirty = true;
		list_add_tail(&s->ipc->dirty, &s->dirty_link);
		uv_idle_start(&s->ipc->flush_idle, ipc_flush_dirty_idle);
	}
}

/*
 * Completions were posted and the client asked to be woken: one RingNotify.
 * Not among the counted datagrams and never queued: a socket that is full
 * is readable already. Counted apart, so that a client reads as many as
 * there are and never calls once more to hear EAGAIN.
 */
static void send_ring_notify(struct session *s)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__RingNotify notify = RDMAX__V1__RING_NOTIFY__INIT;
	uint8_t buf[16];

	if (s->closing || !list_empty(&s->out_queue)) {
		return;
	}
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_RING_NOTIFY;
	msg.ring_notify = &notify;
	size_t len = rdmax__v1__daemon_msg__pack(&msg, buf);
	/* Counted before the send, as count_sent() does, and taken back if it failed. */
	ring_report_notifies(&s->ring, ++s->notifies_sent);
	if (send(s->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) {
		s->ipc->daemon->counters.ring_notifies++;
	} else {
		ring_report_notifies(&s->ring, --s->notifies_sent);
	}
}

/*
 * Completions were posted since the last pass: a RingNotify only when the
 * client asked for one and has not read them all (ring.c explains why that
 * loses no wake-up). A client that spun on the ring and took them already
 * pays no datagram; its request stays for the next completion.
 */
static void ring_wake_check(struct session *s)
{
	switch (ring_take_wake_request(&s->ring)) {
	case RING_WAKE_TAKEN:
		send_ring_notify(s);
		break;
	case RING_WAKE_SPARED:
		s->ipc->daemon->counters.ring_notifies_spared++;
		break;
	case RING_WAKE_NONE:
		break;
	}
}

static int send_now_or_queue(struct session *s, const uint8_t *data, size_t len)
{
	if (list_empty(&s->out_queue)) {
		ssize_t n = send(s->fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n >= 0) {
			return 0;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			return -errno;
		}
	}
	if (s->queued_bytes + len > SESSION_MAX_QUEUED_BYTES) {
		return -ENOBUFS;
	}
	struct out_msg *m = malloc(sizeof(*m) + len);
	if (!m) {
		return -ENOMEM;
	}
	m->len = len;
	memcpy(m->data, data, len);
	list_add_tail(&s->out_queue, &m->link);
	s->queued_bytes += len;
	s->share->queued_bytes += len;
	session_poll_update(s);
	return 0;
}

static int send_or_queue(struct session *s, const uint8_t *data, size_t len)
{
	if (!session_live(s)) {
		return -EPIPE;
	}
	count_sent(s, 1);
	int ret = send_now_or_queue(s, data, len);
	if (ret < 0) {
		count_sent(s, -1);
	}
	return ret;
}

int ipc_send_msg(struct session *s, const Rdmax__V1__DaemonMsg *msg)
{
	struct ipc *ipc = s->ipc;
	size_t len = rdmax__v1__daemon_msg__get_packed_size(msg);
	int ret;

	if (len > ipc->tx_size) {
		log_err("reply of %zu bytes to client %" PRIu64 " exceeds the message limit", len,
			s->id);
		return -EMSGSIZE;
	}
	rdmax__v1__daemon_msg__pack(msg, ipc->tx_buf);
	ret = send_or_queue(s, ipc->tx_buf, len);
	if (ret < 0 && ret != -EPIPE) {
		session_doom(s, ret == -ENOBUFS  ? "client does not read its events"
				: ret == -ENOMEM ? "out of memory while queueing a reply"
						 : "cannot send to the client");
	}
	return ret;
}

void ipc_reply_status(struct session *s, uint64_t seq, int err, const char *fmt, ...)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Error error = RDMAX__V1__ERROR__INIT;
	char text[256];

	msg.has_seq = seq != 0;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_ERROR;
	msg.error = &error;
	error.status = (Rdmax__V1__Status)status_from_err(err);
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(text, sizeof(text), fmt, ap);
		va_end(ap);
		/* Messages quote client bytes (names, ids): a string field must stay UTF-8. */
		utf8_sanitize(text);
		error.message = text;
	}
	ipc_send_msg(s, &msg);
}

void ipc_flush_completions(struct session *s)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Completions batch = RDMAX__V1__COMPLETIONS__INIT;
	size_t n = s->n_completions;

	if (n == 0 || !session_live(s)) {
		goto out_clear;
	}
	Rdmax__V1__Completion *items = calloc(n, sizeof(*items));
	Rdmax__V1__Completion **ptrs = calloc(n, sizeof(*ptrs));
	if (!items || !ptrs) {
		free(items);
		free(ptrs);
		session_doom(s, "out of memory while reporting completions");
		goto out_clear;
	}
	for (size_t i = 0; i < n; i++) {
		const struct pending_completion *pc = &s->completions[i];
		Rdmax__V1__Completion init = RDMAX__V1__COMPLETION__INIT;
		items[i] = init;
		items[i].job_id = pc->job_id;
		items[i].status = (Rdmax__V1__Status)pc->status;
		items[i].message = pc->message;
		items[i].has_bytes = 1;
		items[i].bytes = pc->bytes;
		ptrs[i] = &items[i];
	}
	batch.n_completions = n;
	batch.completions = ptrs;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_COMPLETIONS;
	msg.completions = &batch;
	ipc_send_msg(s, &msg);
	free(items);
	free(ptrs);
out_clear:
	for (size_t i = 0; i < s->n_completions; i++) {
		free(s->completions[i].message);
	}
	s->n_completions = 0;
	s->completions_bytes = 0;
}

/*
 * One pass over the clients: ring entries taken and started, then the
 * completions gathered since the last pass sent (socket batches, RingNotify).
 * From the uv_check handle once per loop iteration, and from the daemon's
 * spin between iterations (now: its recent clock reading, 0 to read the
 * clock). Returns how many entries and sessions it handled.
 */
int ipc_poll_pass(struct ipc *ipc, uint64_t now)
{
	struct list_node *pos, *tmp;
	int moved;

	if (!ipc) {
		return 0;
	}
	moved = (int)ipc_poll_rings(ipc, now);
	list_for_each_safe(pos, tmp, &ipc->dirty)
	{
		moved++;
		struct session *s = container_of(pos, struct session, dirty_link);
		list_del(&s->dirty_link);
		s->dirty = false;
		ipc_flush_completions(s);
		if (s->ring_posted && s->ring.v.base) {
			s->ring_posted = false;
			now = now ? now : now_ns();
			ipc_ring_active(s, now);
			ring_wake_check(s);
		}
	}
	if (list_empty(&ipc->dirty)) {
		uv_idle_stop(&ipc->flush_idle);
	}
	return moved;
}

void ipc_flush_dirty(uv_check_t *check)
{
	ipc_poll_pass(check->data, 0);
}

void ipc_flush_dirty_idle(uv_idle_t *idle)
{
	ipc_poll_pass(idle->data, 0);
}

void ipc_job_completed(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes)
{
	struct session *s = session_of(owner);
	struct ipc *ipc = s->ipc;

	if (!session_live(s)) {
		return;
	}
	if (err) {
		s->jobs_failed++;
	} else {
		s->jobs_ok++;
	}
	s->bytes_moved += bytes;
	/*
	 * The ring, unless completions already wait for the socket: those were
	 * decided first and must be read first.
	 */
	if (s->ring.v.base && s->n_completions == 0 && !s->ring_bad) {
		int ret = ring_cq_post(&s->ring, job_id, status_from_err(err), bytes,
				       err ? message : NULL, s->msgs_sent);
		if (ret == 0) {
			/*
			 * A completion is what a waiting client answers with its next
			 * jobs: the ring stays awake (ipc_poll_pass dates it).
			 */
			s->ring_posted = true;
			mark_dirty(s);
			return;
		}
		if (ret != -ENOSPC) {
			s->ring_bad =
				true; /* its head is garbage; this completion takes the socket */
		}
	}
	if (s->n_completions == s->cap_completions) {
		size_t cap = s->cap_completions ? s->cap_completions * 2 : 64;
		struct pending_completion *p = realloc(s->completions, cap * sizeof(*p));
		if (!p) {
			session_doom(s, "out of memory while queueing completions");
			return;
		}
		s->completions = p;
		s->cap_completions = cap;
	}
	struct pending_completion *pc = &s->completions[s->n_completions++];
	pc->job_id = job_id;
	pc->status = status_from_err(err);
	pc->bytes = bytes;
	pc->message = err && message ? strdup(message) : NULL;
	if (pc->message) {
		utf8_sanitize(pc->message);
	}
	/* 24 bytes of framing per completion is generous for varints. */
	s->completions_bytes += 24 + (pc->message ? strlen(pc->message) + 2 : 0);
	if (s->n_completions >= COMPLETION_BATCH_MAX ||
	    s->completions_bytes + RDMAX_MESSAGE_MAX + 32 > ipc->tx_size / 2) {
		ipc_flush_completions(s);
		return;
	}
	mark_dirty(s);
}

void ipc_imm_fired(void *owner, uint32_t imm, uint64_t count, void *arg)
{
	struct session *s = session_of(owner);
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__ImmReached ev = RDMAX__V1__IMM_REACHED__INIT;

	if (!session_live(s)) {
		return;
	}
	counters_imm_fired(&s->ipc->daemon->counters);
	/* GPU kernels must see the writes that led here before the client hears of them. */
	gpu_flush_writes(s->ipc->daemon->gpu);
	/* Completions of the writes that led here go first. */
	ipc_flush_completions(s);
	ev.imm = imm;
	ev.count = count;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_IMM_REACHED;
	msg.imm_reached = &ev;
	ipc_send_msg(s, &msg);
}
