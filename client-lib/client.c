/* SPDX-License-Identifier: MIT */
/*
 * librdmax: one connection to the node's rdmaxd over an AF_UNIX
 * SOCK_SEQPACKET socket, one protobuf message per datagram. Owns the socket,
 * the request/reply matching by seq (region.c and submit.c send through
 * client_request()), the wait calls, and the payloads of mailbox messages
 * until the application is done with them. Events that
 * arrive while a call waits for something else are kept, in order, for
 * rdmax_poll_events().
 *
 * Never logs, never keeps global state, never lets SIGPIPE reach the
 * application (every send uses MSG_NOSIGNAL), and never sleeps in poll()
 * for a reply before a short busy-poll window: a sleeping wake-up costs far
 * more than the daemon's usual reply time.
 *
 * When the daemon offers it, jobs and completions use a shared-memory ring
 * (ring.c) instead of the socket: the library writes submission entries and
 * reads completion entries, spinning on the ring for a bounded window before
 * it asks the daemon for a RingNotify and sleeps in poll(). Datagrams are
 * counted both ways so that ring entries and socket messages are taken in
 * the order they were sent. Outside a call the library always asks for the
 * RingNotify, so rdmax_client_fd() becomes readable for event-loop users.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "gpu.h"
#include "rdmax_ring.h"

_Static_assert(sizeof(struct rdmax_event) >= RDMAX_EVENT_SIZE_MIN, "RDMAX_2.0 event layout");

/* Busy-poll window before blocking: a blocking wake-up costs ~20 µs per hop. */
#define SPIN_NS 1000000
/*
 * The start of a ring wait that pauses instead of yielding: a host's ring
 * hop takes under 1 µs, and a sched_yield() between two looks made it 1.4
 * (docs/benchmarks.md, "The client pauses before it yields"). The same
 * budget as the daemon's spin before it yields (SPIN_YIELD_IDLE_NS): a
 * client sharing its daemon's CPU holds it off at most this long per wait.
 */
#define SPIN_PAUSE_NS 4000
/* The Hello is the only request that can meet something that is not rdmaxd. */
#define HELLO_TIMEOUT_MS 10000
/* Receive buffer before the Welcome says better, and its floor afterwards. */
#define RX_MIN_BYTES (64u * 1024)
/* Never trust a Welcome into allocating more than this per connection. */
#define RX_MAX_BYTES (64u * 1024 * 1024)
/* fds a daemon datagram could carry by mistake; they are closed. */
#define RX_MAX_FDS 8
/* Datagrams handled per drain, so a flood cannot hold a call forever. */
#define DRAIN_MAX 1024
/* Ring sizes unless the environment says otherwise (docs/protocol.md). */
#define RING_SQ_ENTRIES 256u
#define RING_SQE_BYTES  1024u
#define RING_CQ_ENTRIES 1024u

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* -1: no deadline. */
static int64_t deadline_after(int timeout_ms)
{
	if (timeout_ms < 0) {
		return -1;
	}
	return now_ns() + (int64_t)timeout_ms * 1000000;
}

/* Receive-path failures leave the stream in an unknown state: they stick. */
static int fail(struct rdmax_client *c, int err)
{
	if (!c->err) {
		c->err = err;
	}
	return c->err;
}

size_t client_outstanding_jobs(const struct rdmax_client *client)
{
	return client->jobs.len;
}

static void pending_pop(struct rdmax_client *c)
{
	struct client_pending *p = c->pending;
	c->pending = p->next;
	if (!c->pending) {
		c->pending_tail = &c->pending;
	}
	free(p);
}

/* Submits up to and including \p seq were accepted. */
static void pending_accept_through(struct rdmax_client *c, uint64_t seq)
{
	while (c->pending && c->pending->seq <= seq) {
		pending_pop(c);
	}
}

/*
 * The daemon refused a whole Submit: its jobs never started, so give each
 * one the completion the application is promised, carrying the refusal.
 */
static int pending_refuse(struct rdmax_client *c, const Rdmax__V1__Error *error)
{
	struct client_pending *p = c->pending;
	int status = client_err_from_status(error->status);

	if (client_evq_reserve(&c->events, p->n_ids) < 0) {
		pending_pop(c);
		return fail(c, -ENOMEM);
	}
	for (size_t i = 0; i < p->n_ids; i++) {
		uint64_t seq;
		client_jobs_take(&c->jobs, p->ids[i], &seq);
		struct rdmax_event *e = client_evq_push(&c->events);
		e->type = RDMAX_EVENT_COMPLETION;
		e->job_id = p->ids[i];
		e->status = status;
		client_copy_text(e->reason, sizeof(e->reason),
				 error->message ? error->message : rdmax_strerror(e->status));
	}
	pending_pop(c);
	return 0;
}

/* Any reply proves every earlier Submit was accepted; an Error for one refuses it. */
static int settle_pending(struct rdmax_client *c, uint64_t seq, const Rdmax__V1__DaemonMsg *msg)
{
	pending_accept_through(c, seq - 1);
	if (!c->pending || c->pending->seq != seq) {
		return 0;
	}
	if (msg->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR &&
	    msg->error->status != RDMAX__V1__STATUS__OK) {
		return pending_refuse(c, msg->error);
	}
	pending_pop(c);
	return 0;
}

static int queue_completions(struct rdmax_client *c, const Rdmax__V1__Completions *cs)
{
	if (client_evq_reserve(&c->events, cs->n_completions) < 0) {
		return fail(c, -ENOMEM);
	}
	for (size_t i = 0; i < cs->n_completions; i++) {
		const Rdmax__V1__Completion *cp = cs->completions[i];
		uint64_t seq;
		if (client_jobs_take(&c->jobs, cp->job_id, &seq)) {
			pending_accept_through(c, seq);
		}
		struct rdmax_event *e = client_evq_push(&c->events);
		e->type = RDMAX_EVENT_COMPLETION;
		e->job_id = cp->job_id;
		e->status = client_err_from_status(cp->status);
		e->bytes = cp->has_bytes ? cp->bytes : 0;
		client_copy_text(e->reason, sizeof(e->reason), cp->message);
	}
	return 0;
}

static int queue_event(struct rdmax_client *c, const Rdmax__V1__DaemonMsg *msg)
{
	struct rdmax_event *e;

	if (client_evq_reserve(&c->events, 1) < 0) {
		return fail(c, -ENOMEM);
	}
	e = client_evq_push(&c->events);
	if (msg->body_case == RDMAX__V1__DAEMON_MSG__BODY_IMM_REACHED) {
		e->type = RDMAX_EVENT_IMM_REACHED;
		e->imm = msg->imm_reached->imm;
		e->count = msg->imm_reached->count;
	} else {
		const Rdmax__V1__MailboxMessage *mm = msg->mailbox_message;
		void *payload = malloc(mm->payload.len ? mm->payload.len : 1);
		if (!payload) {
			/* The event slot stays reserved but unused: take it back. */
			c->events.len--;
			return fail(c, -ENOMEM);
		}
		if (mm->payload.len) {
			memcpy(payload, mm->payload.data, mm->payload.len);
		}
		e->type = RDMAX_EVENT_MESSAGE;
		e->bytes = mm->payload.len;
		e->payload = payload;
		client_copy_text(e->mailbox, sizeof(e->mailbox), mm->mailbox);
		client_copy_text(e->from_node, sizeof(e->from_node), mm->from_node);
	}
	return 0;
}

static int queue_ring_completion(struct rdmax_client *c, const struct rdmax_ring_cqe *cqe)
{
	char text[RDMAX_RING_CQE_MESSAGE + 1];
	size_t len = cqe->msg_len < RDMAX_RING_CQE_MESSAGE ? cqe->msg_len : RDMAX_RING_CQE_MESSAGE;
	uint64_t seq;

	if (client_evq_reserve(&c->events, 1) < 0) {
		return fail(c, -ENOMEM);
	}
	if (client_jobs_take(&c->jobs, cqe->job_id, &seq)) {
		pending_accept_through(c, seq);
	}
	struct rdmax_event *e = client_evq_push(&c->events);
	e->type = RDMAX_EVENT_COMPLETION;
	e->job_id = cqe->job_id;
	e->status = client_err_from_status(cqe->status);
	e->bytes = cqe->bytes;
	memcpy(text, cqe->message, len);
	text[len] = '\0';
	client_copy_text(e->reason, sizeof(e->reason), text);
	return 0;
}

/*
 * Queue the ring's completions that are due: posted before the daemon sent
 * the datagrams not read yet (all of them once the daemon is gone).
 * \return how many were queued, or an error
 */
static int ring_drain(struct rdmax_client *c, bool all)
{
	const struct rdmax_ring_cqe *cqe;
	int n = 0, r = 0;

	if (!c->ring.v.base) {
		return 0;
	}
	while ((cqe = client_ring_cq_peek(&c->ring)) != NULL) {
		if (!all && cqe->after > c->msgs_received) {
			break;
		}
		r = queue_ring_completion(c, cqe);
		if (r < 0) {
			break;
		}
		client_ring_cq_advance(&c->ring);
		n++;
	}
	if (n) {
		client_ring_cq_release(&c->ring);
	}
	return r < 0 ? r : n;
}

/* The daemon is gone: what it posted to the ring is still ours to hand out. */
static int disconnected(struct rdmax_client *c)
{
	if (!c->err) {
		ring_drain(c, true);
	}
	return fail(c, RDMAX_E_DISCONNECTED);
}

static int dispatch(struct rdmax_client *c, const uint8_t *buf, size_t len)
{
	Rdmax__V1__DaemonMsg *msg = rdmax__v1__daemon_msg__unpack(NULL, len, buf);
	uint64_t seq;
	int r = 0;

	if (!msg) {
		return fail(c, RDMAX_E_PROTOCOL_ERROR);
	}
	if (msg->body_case == RDMAX__V1__DAEMON_MSG__BODY_RING_NOTIFY) {
		/* Only a wake-up: the completions are in the ring. */
		c->notifies_read++;
		rdmax__v1__daemon_msg__free_unpacked(msg, NULL);
		return 0;
	}
	/* Completions posted before the daemon sent this datagram come first. */
	r = ring_drain(c, false);
	if (r < 0) {
		rdmax__v1__daemon_msg__free_unpacked(msg, NULL);
		return r;
	}
	r = 0;
	c->msgs_received++;
	seq = msg->has_seq ? msg->seq : 0;
	if (seq != 0) {
		r = settle_pending(c, seq, msg);
		if (r == 0 && seq == c->want_seq) {
			c->reply = msg;
			c->want_seq = 0;
			return 0;
		}
		/* Otherwise a late reply to a call that gave up waiting. */
		goto out_free;
	}
	switch (msg->body_case) {
	case RDMAX__V1__DAEMON_MSG__BODY_ERROR:
		/* A notice about no request in particular, sent before the daemon hangs up. */
		if (!c->hangup_err) {
			c->hangup_err = client_err_from_status(msg->error->status);
		}
		break;
	case RDMAX__V1__DAEMON_MSG__BODY_COMPLETIONS:
		r = queue_completions(c, msg->completions);
		break;
	case RDMAX__V1__DAEMON_MSG__BODY_IMM_REACHED:
	case RDMAX__V1__DAEMON_MSG__BODY_MAILBOX_MESSAGE:
		r = queue_event(c, msg);
		break;
	default:
		/* Unknown to this version (newer daemon) or a stray reply: ignore. */
		break;
	}
out_free:
	rdmax__v1__daemon_msg__free_unpacked(msg, NULL);
	return r;
}

static void close_received_fds(struct msghdr *mh)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
			continue;
		}
		size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
			close(fd);
		}
	}
}

/* 1: a datagram was handled; 0: nothing to read; < 0: error (sticky). */
static int recv_nonblock(struct rdmax_client *c)
{
	union {
		char buf[CMSG_SPACE(RX_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = c->rx, .iov_len = c->rx_size};
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = ctl.buf,
		.msg_controllen = sizeof(ctl.buf),
	};
	bool reset_seen = false;
	ssize_t n;

	if (c->err) {
		return c->err;
	}
	for (;;) {
		mh.msg_controllen = sizeof(ctl.buf);
		n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n >= 0) {
			break;
		}
		if (errno == EINTR) {
			continue;
		}
		/*
		 * A daemon that hangs up before reading all we sent makes the
		 * kernel report ECONNRESET once, ahead of the datagrams it sent
		 * before hanging up: read those first.
		 */
		if (errno == ECONNRESET && !reset_seen) {
			reset_seen = true;
			continue;
		}
		break;
	}
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			return 0;
		}
		if (errno == ECONNRESET || errno == ENOTCONN || errno == EPIPE) {
			return disconnected(c);
		}
		return fail(c, -errno);
	}
	close_received_fds(&mh);
	if (n == 0) {
		return disconnected(c);
	}
	if (mh.msg_flags & MSG_TRUNC) {
		return fail(c, RDMAX_E_PROTOCOL_ERROR);
	}
	int r = dispatch(c, c->rx, (size_t)n);
	return r < 0 ? r : 1;
}

/* Handle what is readable now, within a bound. */
int client_drain(struct rdmax_client *c)
{
	for (int i = 0; i < DRAIN_MAX; i++) {
		int r = recv_nonblock(c);
		if (r <= 0) {
			return r;
		}
	}
	return 0;
}

/*
 * Handle one datagram, waiting until \p deadline (ns, -1: forever): spin for
 * SPIN_NS first, then block in poll().
 * \return 1 when one was handled, 0 when the deadline passed, or an error
 */
static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

/* Read every datagram there is now; 1 when one was, 0 when none, or an error. */
static int drain_all(struct rdmax_client *c)
{
	int got = 0;

	for (int i = 0; i < DRAIN_MAX; i++) {
		int r = recv_nonblock(c);
		if (r < 0) {
			return r;
		}
		if (r == 0) {
			break;
		}
		got = 1;
	}
	return got;
}

/*
 * Withdraw the request for a RingNotify: the caller polls the ring itself
 * now. When the daemon had taken the request, its RingNotify is to be read.
 */
static void ring_unwake(struct rdmax_client *c)
{
	if (c->ring_wake) {
		c->ring_wake = false;
		if (client_ring_set_wake(&c->ring, false)) {
			c->notify_pending = true;
		}
	}
}

/* Ask for a RingNotify, then take what was posted before the daemon could see the request. */
static int ring_rewake(struct rdmax_client *c)
{
	if (!c->ring_wake) {
		client_ring_set_wake(&c->ring, true);
		c->ring_wake = true;
	}
	return ring_drain(c, false);
}

/* With RDMAX_CAP_RING_COUNTS: whether the daemon says it sent datagrams not read yet. */
static bool counted_unread(const struct rdmax_client *c)
{
	return client_ring_daemon_notifies(&c->ring) > c->notifies_read ||
	       client_ring_daemon_sent(&c->ring) > c->msgs_received;
}

/*
 * Read as many datagrams as the daemon's counts say wait (RingNotifies
 * included), not one call more: the call that would only hear EAGAIN is
 * the one a sleeping client pays per wake-up otherwise. A daemon whose
 * counts run ahead costs that call back, never a datagram.
 * \return 1 when one was read, 0 when none, or an error
 */
static int read_counted(struct rdmax_client *c)
{
	int got = 0;

	while (counted_unread(c)) {
		int r = recv_nonblock(c);
		if (r <= 0) {
			return r < 0 ? r : got;
		}
		got = 1;
	}
	return got;
}

/*
 * Without a system call unless the daemon sent something: the datagrams it
 * says it sent (and a RingNotify it may have), then the ring.
 * \return 1 when something was handled, 0 when nothing, or an error
 */
static int ring_progress(struct rdmax_client *c)
{
	int got = 0;

	if (c->err) {
		return c->err;
	}
	if (c->ring_counts) {
		/* The counts also say whether the RingNotify the daemon took the request for came.
		 */
		got = read_counted(c);
		if (got < 0) {
			return got;
		}
	} else {
		while (c->notify_pending || client_ring_daemon_sent(&c->ring) > c->msgs_received) {
			int r = recv_nonblock(c);
			if (r < 0) {
				return r;
			}
			if (r == 0) {
				c->notify_pending = false;
				break;
			}
			got = 1;
		}
	}
	int n = ring_drain(c, false);
	if (n < 0) {
		return n;
	}
	return got || n > 0;
}

/*
 * Block in poll() on the socket until readable or \p deadline (ns, -1: none),
 * \p now being now.
 * \return 1 when the socket woke it, 0 otherwise, or an error
 */
static int sleep_on_socket(struct rdmax_client *c, int64_t deadline, int64_t now)
{
	int timeout_ms = -1;

	if (deadline >= 0) {
		int64_t ms = (deadline - now + 999999) / 1000000;
		timeout_ms = ms > INT_MAX ? INT_MAX : (int)ms;
	}
	struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
	int n = poll(&pfd, 1, timeout_ms);
	if (n < 0 && errno != EINTR) {
		return fail(c, -errno);
	}
	return n > 0;
}

/* recv_one() with a ring: spin on the ring, then sleep on the socket for a RingNotify. */
static int ring_wait(struct rdmax_client *c, int64_t deadline)
{
	int64_t start = now_ns();
	int64_t spin_end = start + c->spin_ns;
	int64_t pause_end = start + c->spin_pause_ns;
	bool woken = false; /* poll() returned for a datagram */

	ring_unwake(c);
	for (;;) {
		int r = ring_progress(c);
		if (r != 0) {
			return r;
		}
		int64_t t = now_ns();
		if (deadline >= 0 && t >= deadline) {
			return 0;
		}
		if (t < spin_end) {
			/*
			 * After the first few microseconds, give the CPU to a runnable
			 * daemon: shared memory wakes no one, so on a busy machine a
			 * spinning client would hold off the very process it waits for.
			 */
			if (c->spin_yield && t >= pause_end) {
				sched_yield();
			} else {
				cpu_relax();
			}
			continue;
		}
		r = ring_rewake(c);
		if (r == 0) {
			/*
			 * Stale RingNotifies too: poll() must not return for them.
			 * The counts name them without a call that hears EAGAIN;
			 * a wake-up they did not explain (a daemon that counts
			 * late or not at all) drains the socket, so poll() never
			 * spins on a datagram left unread.
			 */
			r = c->ring_counts && !woken ? read_counted(c) : drain_all(c);
		}
		if (r != 0) {
			return r < 0 ? r : 1;
		}
		r = sleep_on_socket(c, deadline, t);
		if (r < 0) {
			return r;
		}
		woken = r > 0;
		ring_unwake(c);
	}
}

static int recv_one(struct rdmax_client *c, int64_t deadline)
{
	int64_t spin_end = now_ns() + c->spin_ns;

	if (c->ring.v.base) {
		int r = ring_wait(c, deadline);
		/* Leave every call asking for a RingNotify, for rdmax_client_fd() users. */
		int n = ring_rewake(c);
		return r == 0 && n > 0 ? 1 : r;
	}
	for (;;) {
		int r = recv_nonblock(c);
		if (r != 0) {
			return r;
		}
		int64_t t = now_ns();
		if (deadline >= 0 && t >= deadline) {
			return 0;
		}
		if (t < spin_end) {
			continue;
		}
		r = sleep_on_socket(c, deadline, t);
		if (r < 0) {
			return r;
		}
	}
}

/* The daemon hung up: keep what it sent before (the kernel still holds it), then stick. */
static int hung_up(struct rdmax_client *c)
{
	while (recv_nonblock(c) > 0) {
	}
	return disconnected(c);
}

/*
 * Send one datagram. While the socket is full, keep reading: the daemon may
 * be waiting for room to send us completions before it reads again.
 */
static int send_datagram(struct rdmax_client *c, const void *buf, size_t len, int fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (fd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	for (;;) {
		if (c->err) {
			return c->err;
		}
		if (c->ring.v.base) {
			/* Before the send: the daemon may stop reading at this count. */
			client_ring_publish_sent(&c->ring, c->msgs_sent + 1);
		}
		ssize_t n = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n >= 0) {
			c->msgs_sent++;
			return 0; /* SOCK_SEQPACKET sends all or nothing */
		}
		switch (errno) {
		case EINTR:
			continue;
		case EAGAIN:
#if EWOULDBLOCK != EAGAIN
		case EWOULDBLOCK:
#endif
			break;
		case EPIPE:
		case ECONNRESET:
		case ENOTCONN:
			return hung_up(c);
		case EMSGSIZE:
		case ENOBUFS:
			return RDMAX_E_RESOURCE_EXHAUSTED;
		default:
			return -errno;
		}
		struct pollfd pfd = {.fd = c->fd, .events = POLLIN | POLLOUT};
		if (poll(&pfd, 1, -1) < 0) {
			if (errno == EINTR) {
				continue;
			}
			return -errno;
		}
		if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
			int r = client_drain(c);
			if (r < 0) {
				return r;
			}
		}
	}
}

static int tx_reserve(struct rdmax_client *c, size_t len)
{
	if (len <= c->tx_size) {
		return 0;
	}
	uint8_t *tx = realloc(c->tx, len);
	if (!tx) {
		return -ENOMEM;
	}
	c->tx = tx;
	c->tx_size = len;
	return 0;
}

int client_send_msg(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd)
{
	size_t len = rdmax__v1__client_msg__get_packed_size(msg);
	int r;

	if (len > c->max_tx) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	r = tx_reserve(c, len ? len : 1);
	if (r < 0) {
		return r;
	}
	rdmax__v1__client_msg__pack(msg, c->tx);
	return send_datagram(c, c->tx, len, fd);
}

/*
 * Send a request and wait for the reply carrying its seq; events that
 * arrive meanwhile are queued. The caller frees the reply.
 */
int client_request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd, int timeout_ms,
		   Rdmax__V1__DaemonMsg **ret_reply)
{
	int64_t deadline;
	int r;

	if (c->err) {
		return c->err;
	}
	msg->has_seq = 1;
	msg->seq = c->next_seq++;
	r = client_send_msg(c, msg, fd);
	if (r < 0) {
		return r;
	}
	deadline = deadline_after(timeout_ms);
	c->want_seq = msg->seq;
	while (!c->reply) {
		r = recv_one(c, deadline);
		if (r < 0) {
			break;
		}
		if (r == 0) {
			r = RDMAX_E_TIMEOUT;
			break;
		}
	}
	c->want_seq = 0;
	if (!c->reply) {
		return r;
	}
	*ret_reply = c->reply;
	c->reply = NULL;
	return 0;
}

/* For requests whose answer is a plain Error (status OK or not). */
int client_request_status(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd)
{
	Rdmax__V1__DaemonMsg *reply;
	int r = client_request(c, msg, fd, -1, &reply);

	if (r < 0) {
		return r;
	}
	if (reply->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR) {
		r = client_err_from_status(reply->error->status);
	} else {
		r = fail(c, RDMAX_E_PROTOCOL_ERROR);
	}
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

/* The error a reply that is not the expected kind stands for. */
int client_unexpected_reply(struct rdmax_client *c, const Rdmax__V1__DaemonMsg *reply)
{
	if (reply->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR &&
	    reply->error->status != RDMAX__V1__STATUS__OK) {
		return client_err_from_status(reply->error->status);
	}
	return fail(c, RDMAX_E_PROTOCOL_ERROR);
}

static void info_from_welcome(struct rdmax_daemon_info *info, const Rdmax__V1__Welcome *w)
{
	const Rdmax__V1__Limits *l = w->limits;

	memset(info, 0, sizeof(*info));
	info->struct_size = sizeof(*info);
	info->protocol_version = w->protocol_version;
	client_copy_text(info->daemon_version, sizeof(info->daemon_version), w->daemon_version);
	client_copy_text(info->node_name, sizeof(info->node_name), w->node_name);
	info->instance_id = w->instance_id;
	info->capabilities = w->capabilities;
	info->max_message_bytes = l->max_message_bytes;
	info->max_fds_per_message = l->max_fds_per_message;
	info->max_regions = l->max_regions;
	info->max_registered_bytes = l->max_registered_bytes;
	info->max_outstanding_jobs = l->max_outstanding_jobs;
	info->max_jobs_per_submit = l->max_jobs_per_submit;
	info->max_paged_pairs =
		l->has_max_paged_pairs && l->max_paged_pairs ? l->max_paged_pairs : 1;
}

static int hello(struct rdmax_client *c, const char *client_name)
{
	Rdmax__V1__Hello h = RDMAX__V1__HELLO__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;
	int r;

	h.protocol_version = RDMAX_PROTOCOL_VERSION;
	h.client_name = (char *)(client_name ? client_name : program_invocation_short_name);
	const char *cls = secure_getenv("RDMAX_TRAFFIC_CLASS");
	if (cls && cls[0]) {
		h.has_traffic_class = 1;
		if (strcmp(cls, "latency") == 0) {
			h.traffic_class = RDMAX_CLASS_LATENCY;
		} else if (strcmp(cls, "bulk") == 0) {
			h.traffic_class = RDMAX_CLASS_BULK;
		} else {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_HELLO;
	msg.hello = &h;
	r = client_request(c, &msg, -1, HELLO_TIMEOUT_MS, &reply);
	if (r == RDMAX_E_DISCONNECTED) {
		/*
		 * A daemon that refuses a client (too many clients) says why,
		 * then hangs up, maybe before our Hello was even sent: read
		 * what it left before giving the reason.
		 */
		c->err = 0;
		client_drain(c);
		c->err = RDMAX_E_DISCONNECTED;
		return c->hangup_err ? c->hangup_err : r;
	}
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_WELCOME) {
		r = client_unexpected_reply(c, reply);
		goto out_free;
	}
	if (reply->welcome->protocol_version != RDMAX_PROTOCOL_VERSION) {
		r = RDMAX_E_PROTOCOL_ERROR;
		goto out_free;
	}
	info_from_welcome(&c->info, reply->welcome);
	if (c->info.max_message_bytes) {
		c->max_tx = c->info.max_message_bytes;
		/*
		 * A datagram larger than the send buffer fails with EMSGSIZE (about 212 KB
		 * by default); the kernel caps this at net.core.wmem_max.
		 */
		int sndbuf = c->max_tx > INT_MAX / 4 ? INT_MAX : (int)c->max_tx * 4;
		(void)setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	}
	size_t rx_size = c->info.max_message_bytes;
	rx_size = rx_size < RX_MIN_BYTES ? RX_MIN_BYTES : rx_size;
	rx_size = rx_size > RX_MAX_BYTES ? RX_MAX_BYTES : rx_size;
	if (rx_size != c->rx_size) {
		uint8_t *rx = realloc(c->rx, rx_size);
		if (!rx) {
			r = -ENOMEM;
			goto out_free;
		}
		c->rx = rx;
		c->rx_size = rx_size;
	}
out_free:
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

/* A size from the environment (a power of two the daemon accepts is the caller's business). */
static uint32_t env_u32(const char *name, uint32_t def)
{
	const char *v = secure_getenv(name);
	char *end;

	if (!v || !v[0]) {
		return def;
	}
	errno = 0;
	unsigned long x = strtoul(v, &end, 0);
	if (errno || *end || x > UINT32_MAX) {
		return def;
	}
	return (uint32_t)x;
}

/*
 * Open the shared-memory ring. A daemon that refuses it leaves the
 * connection on the socket, as before; only a broken connection is an error.
 */
static int ring_open(struct rdmax_client *c)
{
	Rdmax__V1__RingSetup rs = RDMAX__V1__RING_SETUP__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	struct client_ring ring;
	int fd = -1, r;

	rs.sq_entries = env_u32("RDMAX_RING_SQ_ENTRIES", RING_SQ_ENTRIES);
	rs.sq_entry_bytes = env_u32("RDMAX_RING_SQE_BYTES", RING_SQE_BYTES);
	rs.cq_entries = env_u32("RDMAX_RING_CQ_ENTRIES", RING_CQ_ENTRIES);
	if (client_ring_create(rs.sq_entries, rs.sq_entry_bytes, rs.cq_entries, &ring, &fd) < 0) {
		return 0;
	}
	rs.has_fd_index = 1;
	rs.fd_index = 0;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP;
	msg.ring_setup = &rs;
	r = client_request_status(c, &msg, fd);
	close(fd);
	if (r < 0) {
		client_ring_destroy(&ring);
		return c->err ? c->err : 0;
	}
	c->ring = ring;
	c->ring_counts = (c->info.capabilities & RDMAX_CAP_RING_COUNTS) != 0;
	client_ring_publish_sent(&c->ring, c->msgs_sent);
	/* client_ring_create() left the request for a RingNotify set. */
	c->ring_wake = true;
	return 0;
}

RDMAX_EXPORT int rdmax_client_open(const char *socket_path, const char *client_name,
				   struct rdmax_client **ret_client)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct rdmax_client *c;
	int r;

	if (!ret_client) {
		return -EINVAL;
	}
	if (!socket_path) {
		socket_path = secure_getenv("RDMAX_SOCKET");
		if (!socket_path || !socket_path[0]) {
			socket_path = RDMAX_DEFAULT_SOCKET;
		}
	}
	if (!socket_path[0]) {
		return -EINVAL;
	}
	if (strlen(socket_path) >= sizeof(sa.sun_path)) {
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, socket_path);

	c = calloc(1, sizeof(*c));
	if (!c) {
		return -ENOMEM;
	}
	c->next_seq = 1;
	c->max_tx = RX_MIN_BYTES;
	c->pending_tail = &c->pending;
	c->rx_size = RX_MIN_BYTES;
	c->rx = malloc(c->rx_size);
	if (!c->rx) {
		r = -ENOMEM;
		goto out_free;
	}
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		r = -errno;
		goto out_free;
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		goto out_close;
	}
	c->spin_ns = (int64_t)env_u32("RDMAX_SPIN_US", SPIN_NS / 1000) * 1000;
	c->spin_yield = env_u32("RDMAX_SPIN_YIELD", 1) != 0;
	c->spin_pause_ns = env_u32("RDMAX_SPIN_PAUSE_NS", SPIN_PAUSE_NS);
	r = hello(c, client_name);
	if (r < 0) {
		goto out_close;
	}
	const char *want_ring = secure_getenv("RDMAX_RING");
	if ((c->info.capabilities & RDMAX_CAP_RING) &&
	    !(want_ring && strcmp(want_ring, "0") == 0)) {
		r = ring_open(c);
		if (r < 0) {
			goto out_close;
		}
	}
	*ret_client = c;
	return 0;

out_close:
	close(c->fd);
out_free:
	client_evq_free(&c->events);
	free(c->rx);
	free(c->tx);
	free(c);
	return r;
}

static void free_handed(struct rdmax_client *c)
{
	for (size_t i = 0; i < c->n_handed; i++) {
		free(c->handed[i]);
	}
	c->n_handed = 0;
}
RDMAX_EXPORT void rdmax_client_close(struct rdmax_client *client)
{
	if (!client) {
		return;
	}
	/* Closing the socket is the whole goodbye: the daemon releases everything. */
	close(client->fd);
	while (client->regions) {
		client_region_free(client->regions);
	}
	while (client->groups) {
		client_group_free(client->groups);
	}
	client_gpu_free(client);
	free_handed(client);
	free(client->handed);
	while (client->pending) {
		pending_pop(client);
	}
	if (client->reply) {
		rdmax__v1__daemon_msg__free_unpacked(client->reply, NULL);
	}
	client_evq_free(&client->events);
	client_jobs_free(&client->jobs);
	client_ring_destroy(&client->ring);
	free(client->rx);
	free(client->tx);
	free(client);
}

RDMAX_EXPORT const struct rdmax_daemon_info *rdmax_client_info(const struct rdmax_client *client)
{
	return client ? &client->info : NULL;
}

RDMAX_EXPORT int rdmax_client_fd(const struct rdmax_client *client)
{
	return client ? client->fd : -EINVAL;
}

RDMAX_EXPORT int rdmax_client_uses_ring(const struct rdmax_client *client)
{
	return client ? client->ring.v.base != NULL : -EINVAL;
}

/* Copy n events into the caller's array of event_size strides. */
static void hand_out(struct rdmax_event *events, size_t event_size, const struct rdmax_event *ev,
		     size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint8_t *dst = (uint8_t *)events + i * event_size;
		if (event_size <= sizeof(ev[i])) {
			memcpy(dst, &ev[i], event_size);
		} else {
			memcpy(dst, &ev[i], sizeof(ev[i]));
			memset(dst + sizeof(ev[i]), 0, event_size - sizeof(ev[i]));
		}
	}
}

RDMAX_EXPORT int rdmax_poll_events_sized(struct rdmax_client *client, struct rdmax_event *events,
					 size_t max, size_t event_size, int timeout_ms)
{
	struct rdmax_event local[64];

	if (!client || (!events && max) || event_size < RDMAX_EVENT_SIZE_MIN) {
		return -EINVAL;
	}
	if (event_size != sizeof(struct rdmax_event) && max > sizeof(local) / sizeof(local[0])) {
		/* Another release's layout goes through a bounded buffer of ours. */
		max = sizeof(local) / sizeof(local[0]);
	}
	if (max > INT_MAX) {
		max = INT_MAX;
	}
	/* The payloads handed out last time are the application's no more. */
	free_handed(client);
	/* Errors stick in client->err; events read before one are still handed out. */
	if (client->ring.v.base) {
		ring_unwake(client);
		ring_progress(client);
	} else {
		client_drain(client);
	}
	if (client->events.len == 0 && max && timeout_ms != 0) {
		int64_t deadline = deadline_after(timeout_ms);
		while (client->events.len == 0 && recv_one(client, deadline) > 0) {
		}
	}
	if (client->ring.v.base) {
		/* Asked for a RingNotify again before the last look, so none can slip by. */
		ring_rewake(client);
	}
	/* Room to remember every payload handed out, before any event leaves the queue. */
	size_t take = client->events.len < max ? client->events.len : max, msgs = 0;
	for (size_t i = 0; i < take; i++) {
		msgs += client_evq_at(&client->events, i)->payload != NULL;
	}
	if (msgs > client->cap_handed) {
		void **handed = realloc(client->handed, msgs * sizeof(*handed));
		if (!handed) {
			return -ENOMEM;
		}
		client->handed = handed;
		client->cap_handed = msgs;
	}
	bool direct = event_size == sizeof(struct rdmax_event);
	struct rdmax_event *out = direct ? events : local;
	size_t n = client_evq_pop(&client->events, out, max);
	for (size_t i = 0; i < n; i++) {
		if (out[i].payload) {
			client->handed[client->n_handed++] = (void *)out[i].payload;
		}
	}
	if (!direct) {
		hand_out(events, event_size, out, n);
	}
	if (n == 0 && client->err) {
		return client->err;
	}
	return (int)n;
}

static bool match_job(const struct rdmax_event *e, uint64_t job_id)
{
	return e->type == RDMAX_EVENT_COMPLETION && e->job_id == job_id;
}

static bool match_imm(const struct rdmax_event *e, uint64_t imm)
{
	return e->type == RDMAX_EVENT_IMM_REACHED && e->imm == imm;
}

typedef bool (*event_match_fn)(const struct rdmax_event *e, uint64_t key);

/* Take the first matching event at index >= *scanned; advances *scanned past the others. */
static bool take_event(struct rdmax_client *c, event_match_fn match, uint64_t key, size_t *scanned,
		       struct rdmax_event *ret_event)
{
	for (size_t i = *scanned; i < c->events.len; i++) {
		if (match(client_evq_at(&c->events, i), key)) {
			client_evq_remove(&c->events, i, ret_event);
			return true;
		}
	}
	*scanned = c->events.len;
	return false;
}

/*
 * Wait for the first event \p match accepts and take it out of the queue,
 * leaving the others in order. \p known: the event can still come.
 * \return 0 (*ret_event set), RDMAX_E_TIMEOUT or an error
 */
static int wait_event(struct rdmax_client *c, event_match_fn match, uint64_t key, bool known,
		      int timeout_ms, struct rdmax_event *ret_event)
{
	int64_t deadline = deadline_after(timeout_ms);
	size_t scanned = 0;

	if (take_event(c, match, key, &scanned, ret_event)) {
		return 0;
	}
	if (c->err) {
		return c->err;
	}
	if (!known) {
		return RDMAX_E_NOT_FOUND;
	}
	for (;;) {
		int r = recv_one(c, deadline);
		/* Even after a failure, what arrived before it may hold the event. */
		if (take_event(c, match, key, &scanned, ret_event)) {
			return 0;
		}
		if (r < 0) {
			return r;
		}
		if (r == 0) {
			return RDMAX_E_TIMEOUT;
		}
	}
}

RDMAX_EXPORT int rdmax_wait_job(struct rdmax_client *client, uint64_t job_id, int timeout_ms)
{
	struct rdmax_event e;
	int r;

	if (!client) {
		return -EINVAL;
	}
	r = wait_event(client, match_job, job_id, client_jobs_has(&client->jobs, job_id),
		       timeout_ms, &e);
	return r < 0 ? r : e.status;
}

RDMAX_EXPORT int rdmax_wait_imm(struct rdmax_client *client, uint32_t imm, int timeout_ms)
{
	struct rdmax_event e;

	if (!client) {
		return -EINVAL;
	}
	/* ExpectImm claims are not tracked here: an unknown imm simply times out. */
	return wait_event(client, match_imm, imm, true, timeout_ms, &e);
}

/* key: the mailbox name as a pointer, 0 for any. */
static bool match_message(const struct rdmax_event *e, uint64_t key)
{
	const char *name = (const char *)(uintptr_t)key;
	return e->type == RDMAX_EVENT_MESSAGE && (!name || strcmp(e->mailbox, name) == 0);
}

RDMAX_EXPORT int rdmax_mailbox_recv(struct rdmax_client *client, const char *name, void *buf,
				    size_t size, char *ret_from, int timeout_ms)
{
	struct rdmax_event e;
	int r;

	if (!client || (size && !buf)) {
		return -EINVAL;
	}
	r = wait_event(client, match_message, (uint64_t)(uintptr_t)name, true, timeout_ms, &e);
	if (r < 0) {
		return r;
	}
	/* The event left the queue: its payload is ours to free. */
	if (e.payload && size) {
		memcpy(buf, e.payload, e.bytes < size ? e.bytes : size);
	}
	free((void *)e.payload);
	if (ret_from) {
		memcpy(ret_from, e.from_node, RDMAX_NODE_NAME_MAX);
	}
	return e.bytes > INT_MAX ? INT_MAX : (int)e.bytes;
}
