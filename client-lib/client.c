/* SPDX-License-Identifier: MIT */
/*
 * librdmax: one connection to the node's rdmaxd over an AF_UNIX
 * SOCK_SEQPACKET socket, one protobuf message per datagram. Owns the socket,
 * the request/reply matching by seq, the regions this client registered and
 * the local mappings of rdmax_alloc_host(), its peer groups, and the payloads
 * of mailbox messages until the application is done with them. Events that
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

#include "gpu.h"
#include "internal.h"
#include "rdmax.pb-c.h"
#include "rdmax_ring.h"

/* Busy-poll window before blocking: a blocking wake-up costs ~20 µs per hop. */
#define SPIN_NS 1000000
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

struct rdmax_region {
	struct rdmax_client *client;
	struct rdmax_region *prev;
	struct rdmax_region *next;
	uint64_t id;
	uint64_t length;
	void *addr;     /* caller's mapping, ours when map_len != 0 */
	size_t map_len; /* rdmax_alloc_host(): bytes to munmap */
	uint32_t desc_len;
	uint8_t desc[RDMAX_DESC_MAX];
};

struct rdmax_peer_group {
	struct rdmax_client *client;
	struct rdmax_peer_group *prev;
	struct rdmax_peer_group *next;
	uint64_t handle; /* the daemon's */
	size_t size;     /* members */
};

struct rdmax_client {
	int fd;
	int err;           /* sticky: DISCONNECTED, PROTOCOL_ERROR, lost event */
	int hangup_err;    /* why the daemon said it would hang up (Error with seq 0) */
	uint64_t next_seq; /* requests use 1, 2, ...; 0 marks events */
	struct rdmax_daemon_info info;

	uint8_t *rx;
	size_t rx_size;
	uint8_t *tx;
	size_t tx_size;
	size_t max_tx; /* largest request the daemon accepts */

	uint64_t want_seq;           /* reply a synchronous call waits for, 0: none */
	Rdmax__V1__DaemonMsg *reply; /* that reply, once it arrived */

	struct client_evq events;
	struct client_jobs jobs;
	struct client_pending *pending; /* oldest first */
	struct client_pending **pending_tail;

	struct rdmax_region *regions;
	struct rdmax_peer_group *groups;
	struct client_gpu *gpu; /* GPU registrations and pool mappings (gpu.c); NULL until used */

	/* Payloads of MESSAGE events returned by the last rdmax_poll_events(). */
	void **handed;
	size_t n_handed;
	size_t cap_handed;

	int64_t spin_ns; /* busy-poll window before sleeping in poll() */
	/* Datagrams both ways, for the ring's ordering (RingNotify not counted). */
	uint64_t msgs_sent;
	uint64_t msgs_received;
	struct client_ring ring; /* ring.base == NULL: the socket carries jobs */
	bool ring_wake;          /* a RingNotify is asked for */
	bool notify_pending;     /* the daemon took the request: a RingNotify may be queued */
	bool spin_yield;         /* spin with sched_yield() rather than a pause */
};

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
		client_copy_text(e->message, sizeof(e->message),
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
		client_copy_text(e->message, sizeof(e->message), cp->message);
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
		client_copy_text(e->message, sizeof(e->message), mm->mailbox);
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
	client_copy_text(e->message, sizeof(e->message), text);
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

	if (!c->ring.base) {
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
static int drain(struct rdmax_client *c)
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
	int n = ring_drain(c, false);
	if (n < 0) {
		return n;
	}
	return got || n > 0;
}

/* Block in poll() on the socket until readable or \p deadline (ns, -1: none), \p now being now. */
static int sleep_on_socket(struct rdmax_client *c, int64_t deadline, int64_t now)
{
	int timeout_ms = -1;

	if (deadline >= 0) {
		int64_t ms = (deadline - now + 999999) / 1000000;
		timeout_ms = ms > INT_MAX ? INT_MAX : (int)ms;
	}
	struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
	if (poll(&pfd, 1, timeout_ms) < 0 && errno != EINTR) {
		return fail(c, -errno);
	}
	return 0;
}

/* recv_one() with a ring: spin on the ring, then sleep on the socket for a RingNotify. */
static int ring_wait(struct rdmax_client *c, int64_t deadline)
{
	int64_t spin_end = now_ns() + c->spin_ns;

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
			 * Give the CPU to a runnable daemon: shared memory wakes no
			 * one, so on a busy machine a spinning client would hold off
			 * the very process it waits for.
			 */
			if (c->spin_yield) {
				sched_yield();
			} else {
				cpu_relax();
			}
			continue;
		}
		r = ring_rewake(c);
		if (r == 0) {
			/* Stale RingNotifies too: poll() must not return for them. */
			r = drain_all(c);
		}
		if (r != 0) {
			return r < 0 ? r : 1;
		}
		r = sleep_on_socket(c, deadline, t);
		if (r < 0) {
			return r;
		}
		ring_unwake(c);
	}
}

static int recv_one(struct rdmax_client *c, int64_t deadline)
{
	int64_t spin_end = now_ns() + c->spin_ns;

	if (c->ring.base) {
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
			int r = drain(c);
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

static int send_msg(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd)
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
static int request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd, int timeout_ms,
		   Rdmax__V1__DaemonMsg **ret_reply)
{
	int64_t deadline;
	int r;

	if (c->err) {
		return c->err;
	}
	msg->has_seq = 1;
	msg->seq = c->next_seq++;
	r = send_msg(c, msg, fd);
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
static int request_status(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd)
{
	Rdmax__V1__DaemonMsg *reply;
	int r = request(c, msg, fd, -1, &reply);

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
static int unexpected_reply(struct rdmax_client *c, const Rdmax__V1__DaemonMsg *reply)
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
}

static int hello(struct rdmax_client *c, const char *client_name)
{
	Rdmax__V1__Hello h = RDMAX__V1__HELLO__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;
	int r;

	h.protocol_version = RDMAX_PROTOCOL_VERSION;
	h.client_name = (char *)(client_name ? client_name : program_invocation_short_name);
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_HELLO;
	msg.hello = &h;
	r = request(c, &msg, -1, HELLO_TIMEOUT_MS, &reply);
	if (r == RDMAX_E_DISCONNECTED) {
		/*
		 * A daemon that refuses a client (too many clients) says why,
		 * then hangs up, maybe before our Hello was even sent: read
		 * what it left before giving the reason.
		 */
		c->err = 0;
		drain(c);
		c->err = RDMAX_E_DISCONNECTED;
		return c->hangup_err ? c->hangup_err : r;
	}
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_WELCOME) {
		r = unexpected_reply(c, reply);
		goto out_free;
	}
	if (reply->welcome->protocol_version != RDMAX_PROTOCOL_VERSION) {
		r = RDMAX_E_PROTOCOL_ERROR;
		goto out_free;
	}
	info_from_welcome(&c->info, reply->welcome);
	if (c->info.max_message_bytes) {
		c->max_tx = c->info.max_message_bytes;
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
	int fd, r;

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
	r = request_status(c, &msg, fd);
	close(fd);
	if (r < 0) {
		client_ring_destroy(&ring);
		return c->err ? c->err : 0;
	}
	c->ring = ring;
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

static void group_free(struct rdmax_peer_group *group)
{
	struct rdmax_client *c = group->client;

	if (group->prev) {
		group->prev->next = group->next;
	} else {
		c->groups = group->next;
	}
	if (group->next) {
		group->next->prev = group->prev;
	}
	free(group);
}

static void region_free(struct rdmax_region *region)
{
	struct rdmax_client *c = region->client;

	if (region->prev) {
		region->prev->next = region->next;
	} else {
		c->regions = region->next;
	}
	if (region->next) {
		region->next->prev = region->prev;
	}
	client_gpu_region_freed(c, region);
	if (region->map_len) {
		munmap(region->addr, region->map_len);
	}
	free(region);
}

RDMAX_EXPORT void rdmax_client_close(struct rdmax_client *client)
{
	if (!client) {
		return;
	}
	/* Closing the socket is the whole goodbye: the daemon releases everything. */
	close(client->fd);
	while (client->regions) {
		region_free(client->regions);
	}
	while (client->groups) {
		group_free(client->groups);
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
	return client ? client->ring.base != NULL : -EINVAL;
}

/*
 * A peer's descriptor must name at least one endpoint to be usable; our own
 * daemon may hand out one without (no transport configured yet).
 */
static int desc_check(const void *bytes, size_t len, size_t min_endpoints)
{
	Rdmax__V1__RegionDesc *d;
	int r = 0;

	if (!bytes || len == 0 || len > RDMAX_DESC_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	d = rdmax__v1__region_desc__unpack(NULL, len, bytes);
	if (!d) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (d->version != 1 || d->n_endpoints < min_endpoints) {
		r = RDMAX_E_INVALID_ARGUMENT;
	}
	rdmax__v1__region_desc__free_unpacked(d, NULL);
	return r;
}

static int deregister_id(struct rdmax_client *c, uint64_t region_id)
{
	Rdmax__V1__DeregisterRegion d = RDMAX__V1__DEREGISTER_REGION__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	d.region_id = region_id;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION;
	msg.deregister_region = &d;
	/* No timeout: the daemon answers once the jobs holding the region are done. */
	return request_status(c, &msg, -1);
}

struct client_gpu **client_gpu_slot(struct rdmax_client *c)
{
	return &c->gpu;
}

void client_region_set_addr(struct rdmax_region *region, void *addr)
{
	region->addr = addr;
}

/* A RegisterRegion or PoolAlloc request; map_len != 0: addr is ours to munmap. */
static int region_request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd,
			  uint64_t length, void *addr, size_t map_len,
			  struct rdmax_region **ret_region, Rdmax__V1__DaemonMsg **ret_reply)
{
	Rdmax__V1__DaemonMsg *reply;
	struct rdmax_region *region;
	int r;

	r = request(c, msg, fd, -1, &reply);
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_REGION) {
		r = unexpected_reply(c, reply);
		goto out_free_reply;
	}
	const Rdmax__V1__RegionReply *rep = reply->region;
	if (desc_check(rep->desc.data, rep->desc.len, 0) < 0 ||
	    (rep->has_length && rep->length < length)) {
		/* Registered but unusable: give it back rather than leak it in the daemon. */
		deregister_id(c, rep->region_id);
		r = RDMAX_E_PROTOCOL_ERROR;
		goto out_free_reply;
	}
	region = calloc(1, sizeof(*region));
	if (!region) {
		deregister_id(c, rep->region_id);
		r = -ENOMEM;
		goto out_free_reply;
	}
	region->client = c;
	region->id = rep->region_id;
	region->length = length;
	region->addr = addr;
	region->map_len = map_len;
	region->desc_len = (uint32_t)rep->desc.len;
	memcpy(region->desc, rep->desc.data, rep->desc.len);
	region->next = c->regions;
	if (c->regions) {
		c->regions->prev = region;
	}
	c->regions = region;
	*ret_region = region;
	if (ret_reply) {
		*ret_reply = reply;
		return 0;
	}
out_free_reply:
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

int client_region_request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd,
			  uint64_t length, void *addr, struct rdmax_region **ret_region,
			  Rdmax__V1__DaemonMsg **ret_reply)
{
	return region_request(c, msg, fd, length, addr, 0, ret_region, ret_reply);
}

static int register_region(struct rdmax_client *c, int fd, uint64_t offset, uint64_t length,
			   void *addr, size_t map_len, uint32_t access,
			   struct rdmax_region **ret_region)
{
	Rdmax__V1__RegisterRegion rr = RDMAX__V1__REGISTER_REGION__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	rr.kind = RDMAX__V1__REGION_KIND__REGION_HOST_FD;
	rr.access = access;
	rr.offset = offset;
	rr.length = length;
	rr.has_fd_index = 1;
	rr.fd_index = 0;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION;
	msg.register_region = &rr;
	return region_request(c, &msg, fd, length, addr, map_len, ret_region, NULL);
}

static int check_access(uint32_t access)
{
	const uint32_t known = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	return (access & ~known) ? RDMAX_E_INVALID_ARGUMENT : 0;
}

RDMAX_EXPORT int rdmax_alloc_host(struct rdmax_client *client, uint64_t length, uint32_t access,
				  struct rdmax_region **ret_region)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct rdmax_region *region;
	uint64_t size;
	void *addr;
	int fd, r;

	if (!client || !ret_region) {
		return -EINVAL;
	}
	if (length == 0 || length > UINT64_MAX - page || check_access(access) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (client->err) {
		return client->err;
	}
	size = (length + page - 1) & ~(page - 1);
	if (size > SIZE_MAX || size > (uint64_t)INT64_MAX) {
		return -ENOMEM;
	}
	fd = memfd_create("rdmax", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		return -errno;
	}
	if (ftruncate(fd, (off_t)size) < 0) {
		r = -errno;
		goto out_close;
	}
	/* The daemon maps this file: it must never shrink under that mapping. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		goto out_close;
	}
	addr = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED) {
		r = -errno;
		goto out_close;
	}
	r = register_region(client, fd, 0, size, addr, (size_t)size, access, &region);
	if (r < 0) {
		goto out_unmap;
	}
	close(fd);
	*ret_region = region;
	return 0;

out_unmap:
	munmap(addr, (size_t)size);
out_close:
	close(fd);
	return r;
}

RDMAX_EXPORT int rdmax_region_register_fd(struct rdmax_client *client, int fd, uint64_t offset,
					  uint64_t length, void *addr, uint32_t access,
					  struct rdmax_region **ret_region)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	if (!client || !ret_region) {
		return -EINVAL;
	}
	if (fd < 0) {
		return -EBADF;
	}
	if (length == 0 || offset % page != 0 || offset > UINT64_MAX - length ||
	    check_access(access) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	return register_region(client, fd, offset, length, addr, 0, access, ret_region);
}

RDMAX_EXPORT int rdmax_region_deregister(struct rdmax_client *client, struct rdmax_region *region)
{
	int r;

	if (!client || !region || region->client != client) {
		return -EINVAL;
	}
	r = deregister_id(client, region->id);
	region_free(region);
	return r;
}

RDMAX_EXPORT void *rdmax_region_addr(const struct rdmax_region *region)
{
	return region ? region->addr : NULL;
}

RDMAX_EXPORT uint64_t rdmax_region_length(const struct rdmax_region *region)
{
	return region ? region->length : 0;
}

RDMAX_EXPORT uint64_t rdmax_region_id(const struct rdmax_region *region)
{
	return region ? region->id : 0;
}

RDMAX_EXPORT int rdmax_region_desc(const struct rdmax_region *region, struct rdmax_desc *ret_desc)
{
	if (!region || !ret_desc) {
		return -EINVAL;
	}
	ret_desc->len = region->desc_len;
	memcpy(ret_desc->bytes, region->desc, region->desc_len);
	memset(ret_desc->bytes + region->desc_len, 0, RDMAX_DESC_MAX - region->desc_len);
	return 0;
}

RDMAX_EXPORT int rdmax_desc_import(const void *bytes, size_t len, struct rdmax_desc *ret_desc)
{
	int r;

	if (!ret_desc) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	r = desc_check(bytes, len, 1);
	if (r < 0) {
		return r;
	}
	ret_desc->len = (uint32_t)len;
	memcpy(ret_desc->bytes, bytes, len);
	memset(ret_desc->bytes + len, 0, RDMAX_DESC_MAX - len);
	return 0;
}

static bool desc_usable(const struct rdmax_desc *d)
{
	return d && d->len > 0 && d->len <= RDMAX_DESC_MAX;
}

static bool owned_region(const struct rdmax_client *c, const struct rdmax_region *r)
{
	return r && r->client == c;
}

static bool owned_group(const struct rdmax_client *c, const struct rdmax_peer_group *g)
{
	return g && g->client == c;
}

static int check_scatter(const struct rdmax_client *c, const struct rdmax_job *j)
{
	if (!owned_region(c, j->local) || (j->u.scatter.count && !j->u.scatter.dests) ||
	    (j->u.scatter.group && !owned_group(c, j->u.scatter.group))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < j->u.scatter.count; i++) {
		const struct rdmax_scatter_dest *d = &j->u.scatter.dests[i];
		if (d->remote ? !desc_usable(d->remote) : !j->u.scatter.group) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	return 0;
}

static int check_barrier(const struct rdmax_client *c, const struct rdmax_job *j)
{
	if (j->u.barrier.group) {
		return owned_group(c, j->u.barrier.group) && j->u.barrier.count == 0
			       ? 0
			       : RDMAX_E_INVALID_ARGUMENT;
	}
	if (j->u.barrier.count == 0 || !j->u.barrier.remotes) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < j->u.barrier.count; i++) {
		if (!desc_usable(&j->u.barrier.remotes[i])) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	return 0;
}

/*
 * What can be refused without asking the daemon: what cannot be encoded.
 * Ranges, page lists and names are the daemon's to judge: it says why.
 */
static int check_job(const struct rdmax_client *c, const struct rdmax_job *j)
{
	bool imm_ok = j->op == RDMAX_OP_WRITE || j->op == RDMAX_OP_PAGED_WRITE ||
		      j->op == RDMAX_OP_SCATTER || j->op == RDMAX_OP_BARRIER;

	if (j->flags & ~RDMAX_JOB_IMM) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if ((j->flags & RDMAX_JOB_IMM) && !imm_ok) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	switch (j->op) {
	case RDMAX_OP_WRITE:
	case RDMAX_OP_READ:
		if (!owned_region(c, j->local) || !desc_usable(j->remote)) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		if (j->local_offset > j->local->length ||
		    j->length > j->local->length - j->local_offset) {
			return RDMAX_E_OUT_OF_RANGE;
		}
		return 0;
	case RDMAX_OP_PAGED_WRITE:
		if (!owned_region(c, j->local) || !desc_usable(j->remote) ||
		    (j->u.paged.src.count && !j->u.paged.src.indices) ||
		    (j->u.paged.dst.count && !j->u.paged.dst.indices)) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		return 0;
	case RDMAX_OP_SCATTER:
		return check_scatter(c, j);
	case RDMAX_OP_BARRIER:
		return check_barrier(c, j);
	case RDMAX_OP_SEND:
		if (!desc_usable(j->remote) || !j->u.send.mailbox ||
		    (j->u.send.length && !j->u.send.payload)) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		return j->u.send.length > RDMAX_MESSAGE_PAYLOAD_MAX ? RDMAX_E_RESOURCE_EXHAUSTED
								    : 0;
	default:
		return RDMAX_E_INVALID_ARGUMENT;
	}
}

/* Room for \p count more jobs under the daemon's limit, after reading what has arrived. */
static int check_outstanding(struct rdmax_client *c, size_t count)
{
	uint32_t max = c->info.max_outstanding_jobs;

	if (max == 0 || (count <= max && c->jobs.len <= max - count)) {
		return 0;
	}
	/* Completions may be waiting in the socket: our count only falls when we read them. */
	int r = drain(c);
	if (r < 0) {
		return r;
	}
	if (count <= max && c->jobs.len <= max - count) {
		return 0;
	}
	return RDMAX_E_RESOURCE_EXHAUSTED;
}

/* One job's protobuf structures. */
struct pb_job {
	Rdmax__V1__Job job;
	union {
		Rdmax__V1__WriteJob write;
		Rdmax__V1__ReadJob read;
		Rdmax__V1__PagedWriteJob paged;
		Rdmax__V1__ScatterJob scatter;
		Rdmax__V1__BarrierJob barrier;
		Rdmax__V1__SendJob send;
	} k;
	Rdmax__V1__PageList src;
	Rdmax__V1__PageList dst;
};

/* Everything a Submit needs, in one allocation (every member is 8-byte aligned). */
struct submit_buf {
	Rdmax__V1__Job **ptrs;
	struct pb_job *pbs;
	Rdmax__V1__ScatterDest *dests;
	Rdmax__V1__ScatterDest **dest_ptrs;
	ProtobufCBinaryData *descs; /* barrier descriptors */
	size_t next_dest;
	size_t next_desc;
};

static bool add_size(size_t *total, size_t count, size_t each)
{
	size_t bytes;
	return !__builtin_mul_overflow(count, each, &bytes) &&
	       !__builtin_add_overflow(*total, bytes, total);
}

static void *submit_alloc(const struct rdmax_job *jobs, size_t count, struct submit_buf *ret)
{
	size_t n_dests = 0, n_descs = 0, total = 0;
	char *mem;

	for (size_t i = 0; i < count; i++) {
		if (jobs[i].op == RDMAX_OP_SCATTER &&
		    __builtin_add_overflow(n_dests, jobs[i].u.scatter.count, &n_dests)) {
			return NULL;
		}
		if (jobs[i].op == RDMAX_OP_BARRIER && !jobs[i].u.barrier.group &&
		    __builtin_add_overflow(n_descs, jobs[i].u.barrier.count, &n_descs)) {
			return NULL;
		}
	}
	if (!add_size(&total, count, sizeof(struct pb_job)) ||
	    !add_size(&total, count, sizeof(Rdmax__V1__Job *)) ||
	    !add_size(&total, n_dests, sizeof(Rdmax__V1__ScatterDest)) ||
	    !add_size(&total, n_dests, sizeof(Rdmax__V1__ScatterDest *)) ||
	    !add_size(&total, n_descs, sizeof(ProtobufCBinaryData))) {
		return NULL;
	}
	mem = malloc(total ? total : 1);
	if (!mem) {
		return NULL;
	}
	/* Largest alignment first so each array stays aligned. */
	ret->pbs = (struct pb_job *)mem;
	ret->dests = (Rdmax__V1__ScatterDest *)(ret->pbs + count);
	ret->descs = (ProtobufCBinaryData *)(ret->dests + n_dests);
	ret->ptrs = (Rdmax__V1__Job **)(ret->descs + n_descs);
	ret->dest_ptrs = (Rdmax__V1__ScatterDest **)(ret->ptrs + count);
	ret->next_dest = 0;
	ret->next_desc = 0;
	return mem;
}

static ProtobufCBinaryData desc_bytes(const struct rdmax_desc *d)
{
	return (ProtobufCBinaryData){.len = d->len, .data = (uint8_t *)d->bytes};
}

static void encode_pages(Rdmax__V1__PageList *pl, const struct rdmax_pages *pages)
{
	rdmax__v1__page_list__init(pl);
	pl->has_offset = pages->offset != 0;
	pl->offset = pages->offset;
	pl->has_stride = pages->stride != 0;
	pl->stride = pages->stride;
	pl->n_indices = pages->count;
	pl->indices = (uint32_t *)pages->indices;
}

static void encode_paged(const struct rdmax_job *j, struct pb_job *pb)
{
	Rdmax__V1__PagedWriteJob *pw = &pb->k.paged;

	rdmax__v1__paged_write_job__init(pw);
	pw->local_region = j->local->id;
	pw->page_len = j->u.paged.page_len;
	encode_pages(&pb->src, &j->u.paged.src);
	encode_pages(&pb->dst, &j->u.paged.dst);
	pw->src = &pb->src;
	pw->dst = &pb->dst;
	pw->remote_desc = desc_bytes(j->remote);
	if (j->flags & RDMAX_JOB_IMM) {
		pw->has_imm = 1;
		pw->imm = j->imm;
	}
	pb->job.kind_case = RDMAX__V1__JOB__KIND_PAGED_WRITE;
	pb->job.paged_write = pw;
}

static void encode_scatter(const struct rdmax_job *j, struct pb_job *pb, struct submit_buf *b)
{
	Rdmax__V1__ScatterJob *sj = &pb->k.scatter;

	rdmax__v1__scatter_job__init(sj);
	sj->local_region = j->local->id;
	sj->n_dests = j->u.scatter.count;
	sj->dests = &b->dest_ptrs[b->next_dest];
	for (size_t i = 0; i < j->u.scatter.count; i++) {
		const struct rdmax_scatter_dest *d = &j->u.scatter.dests[i];
		Rdmax__V1__ScatterDest *x = &b->dests[b->next_dest];
		rdmax__v1__scatter_dest__init(x);
		if (d->remote) {
			x->has_remote_desc = 1;
			x->remote_desc = desc_bytes(d->remote);
		} else {
			x->has_peer_index = 1;
			x->peer_index = d->peer_index;
		}
		x->remote_offset = d->remote_offset;
		x->local_offset = d->local_offset;
		x->length = d->length;
		b->dest_ptrs[b->next_dest++] = x;
	}
	if (j->u.scatter.group) {
		sj->has_peer_group = 1;
		sj->peer_group = j->u.scatter.group->handle;
	}
	if (j->flags & RDMAX_JOB_IMM) {
		sj->has_imm = 1;
		sj->imm = j->imm;
	}
	pb->job.kind_case = RDMAX__V1__JOB__KIND_SCATTER;
	pb->job.scatter = sj;
}

static void encode_barrier(const struct rdmax_job *j, struct pb_job *pb, struct submit_buf *b)
{
	Rdmax__V1__BarrierJob *bj = &pb->k.barrier;

	rdmax__v1__barrier_job__init(bj);
	bj->imm = j->imm;
	if (j->u.barrier.group) {
		bj->has_peer_group = 1;
		bj->peer_group = j->u.barrier.group->handle;
	} else {
		bj->n_remote_descs = j->u.barrier.count;
		bj->remote_descs = &b->descs[b->next_desc];
		for (size_t i = 0; i < j->u.barrier.count; i++) {
			b->descs[b->next_desc++] = desc_bytes(&j->u.barrier.remotes[i]);
		}
	}
	pb->job.kind_case = RDMAX__V1__JOB__KIND_BARRIER;
	pb->job.barrier = bj;
}

static void encode_send(const struct rdmax_job *j, struct pb_job *pb)
{
	Rdmax__V1__SendJob *sj = &pb->k.send;

	rdmax__v1__send_job__init(sj);
	sj->remote_desc = desc_bytes(j->remote);
	sj->mailbox = (char *)j->u.send.mailbox;
	sj->payload.len = j->u.send.length;
	sj->payload.data = (uint8_t *)j->u.send.payload;
	pb->job.kind_case = RDMAX__V1__JOB__KIND_SEND;
	pb->job.send = sj;
}

static void encode_job(const struct rdmax_job *j, struct submit_buf *b, size_t i)
{
	struct pb_job *pb = &b->pbs[i];
	Rdmax__V1__Job *pj = &pb->job;

	rdmax__v1__job__init(pj);
	pj->job_id = j->id;
	if (j->deadline_ms) {
		pj->has_deadline_ms = 1;
		pj->deadline_ms = j->deadline_ms;
	}
	switch (j->op) {
	case RDMAX_OP_WRITE: {
		Rdmax__V1__WriteJob *w = &pb->k.write;
		rdmax__v1__write_job__init(w);
		w->local_region = j->local->id;
		w->local_offset = j->local_offset;
		w->length = j->length;
		w->remote_desc = desc_bytes(j->remote);
		w->remote_offset = j->remote_offset;
		if (j->flags & RDMAX_JOB_IMM) {
			w->has_imm = 1;
			w->imm = j->imm;
		}
		pj->kind_case = RDMAX__V1__JOB__KIND_WRITE;
		pj->write = w;
		break;
	}
	case RDMAX_OP_READ: {
		Rdmax__V1__ReadJob *rd = &pb->k.read;
		rdmax__v1__read_job__init(rd);
		rd->remote_desc = desc_bytes(j->remote);
		rd->remote_offset = j->remote_offset;
		rd->length = j->length;
		rd->local_region = j->local->id;
		rd->local_offset = j->local_offset;
		pj->kind_case = RDMAX__V1__JOB__KIND_READ;
		pj->read = rd;
		break;
	}
	case RDMAX_OP_PAGED_WRITE:
		encode_paged(j, pb);
		break;
	case RDMAX_OP_SCATTER:
		encode_scatter(j, pb, b);
		break;
	case RDMAX_OP_BARRIER:
		encode_barrier(j, pb, b);
		break;
	case RDMAX_OP_SEND:
		encode_send(j, pb);
		break;
	}
	b->ptrs[i] = pj;
}

/*
 * The batch as ring entries, all or none: -ENOSPC when the ring lacks room
 * or a job does not fit a slot (the caller then uses the socket, which keeps
 * the order through the entries' `after`).
 */
static size_t varint_size(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static int ring_submit(struct rdmax_client *c, const struct rdmax_job *jobs, size_t count,
		       struct submit_buf *b)
{
	uint32_t max = client_ring_sqe_max(&c->ring);
	size_t submit_len = 0;

	if (count > client_ring_sq_space(&c->ring)) {
		return -ENOSPC;
	}
	for (size_t i = 0; i < count; i++) {
		encode_job(&jobs[i], b, i);
		size_t len = rdmax__v1__job__get_packed_size(b->ptrs[i]);
		submit_len += 1 + varint_size(len) + len;
		if (len > max) {
			/* The socket path encodes again from the start. */
			b->next_dest = 0;
			b->next_desc = 0;
			return -ENOSPC;
		}
	}
	/* The same limit as the Submit it replaces: the call behaves alike on both paths. */
	size_t msg_len = 1 + varint_size(c->next_seq) + 1 + varint_size(submit_len) + submit_len;
	if (msg_len > c->max_tx) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < count; i++) {
		size_t len = rdmax__v1__job__get_packed_size(b->ptrs[i]);
		uint8_t *data =
			client_ring_sqe_prepare(&c->ring, (uint32_t)i, (uint32_t)len, c->msgs_sent);
		rdmax__v1__job__pack(b->ptrs[i], data);
	}
	bool doorbell = client_ring_sq_publish(&c->ring, (uint32_t)count);
	/*
	 * A ring job's completion also proves the Submits sent before it were
	 * accepted: the daemon took it only after reading them.
	 */
	for (size_t i = 0; i < count; i++) {
		client_jobs_add(&c->jobs, jobs[i].id, c->next_seq - 1);
	}
	if (doorbell) {
		Rdmax__V1__RingDoorbell db = RDMAX__V1__RING_DOORBELL__INIT;
		Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
		msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_DOORBELL;
		msg.ring_doorbell = &db;
		/* The jobs are the daemon's now; a failure here sticks for the next call. */
		(void)send_msg(c, &msg, -1);
	}
	return 0;
}

RDMAX_EXPORT int rdmax_submit(struct rdmax_client *client, const struct rdmax_job *jobs,
			      size_t count)
{
	Rdmax__V1__Submit submit = RDMAX__V1__SUBMIT__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	struct client_pending *p;
	struct submit_buf b;
	void *mem;
	int r;

	if (!client || (!jobs && count)) {
		return -EINVAL;
	}
	if (client->err) {
		return client->err;
	}
	if (count == 0) {
		return 0;
	}
	for (size_t i = 0; i < count; i++) {
		r = check_job(client, &jobs[i]);
		if (r < 0) {
			return r;
		}
	}
	if (client->info.max_jobs_per_submit && count > client->info.max_jobs_per_submit) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	r = check_outstanding(client, count);
	if (r < 0) {
		return r;
	}
	mem = submit_alloc(jobs, count, &b);
	if (!mem) {
		return -ENOMEM;
	}
	p = malloc(sizeof(*p) + count * sizeof(p->ids[0]));
	if (!p) {
		r = -ENOMEM;
		goto out_free_mem;
	}
	/* Reserve before sending so nothing can fail once the daemon has the jobs. */
	r = client_jobs_reserve(&client->jobs, count);
	if (r < 0) {
		goto out_free_pending;
	}
	if (client->ring.base) {
		r = ring_submit(client, jobs, count, &b);
		if (r != -ENOSPC) {
			free(p);
			free(mem);
			return r;
		}
	}
	for (size_t i = 0; i < count; i++) {
		encode_job(&jobs[i], &b, i);
		p->ids[i] = jobs[i].id;
	}
	submit.n_jobs = count;
	submit.jobs = b.ptrs;
	msg.has_seq = 1;
	msg.seq = client->next_seq++;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_SUBMIT;
	msg.submit = &submit;
	r = send_msg(client, &msg, -1);
	if (r < 0) {
		goto out_free_pending;
	}
	p->next = NULL;
	p->seq = msg.seq;
	p->n_ids = count;
	*client->pending_tail = p;
	client->pending_tail = &p->next;
	for (size_t i = 0; i < count; i++) {
		client_jobs_add(&client->jobs, jobs[i].id, msg.seq);
	}
	free(mem);
	return 0;

out_free_pending:
	free(p);
out_free_mem:
	free(mem);
	return r;
}

RDMAX_EXPORT int rdmax_expect_imm(struct rdmax_client *client, uint32_t imm, uint64_t count)
{
	Rdmax__V1__ExpectImm e = RDMAX__V1__EXPECT_IMM__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client) {
		return -EINVAL;
	}
	e.imm = imm;
	e.count = count;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM;
	msg.expect_imm = &e;
	return request_status(client, &msg, -1);
}

RDMAX_EXPORT int rdmax_poll_events(struct rdmax_client *client, struct rdmax_event *events,
				   size_t max, int timeout_ms)
{
	if (!client || (!events && max)) {
		return -EINVAL;
	}
	if (max > INT_MAX) {
		max = INT_MAX;
	}
	/* The payloads handed out last time are the application's no more. */
	free_handed(client);
	/* Errors stick in client->err; events read before one are still handed out. */
	if (client->ring.base) {
		ring_unwake(client);
		ring_progress(client);
	} else {
		drain(client);
	}
	if (client->events.len == 0 && max && timeout_ms != 0) {
		int64_t deadline = deadline_after(timeout_ms);
		while (client->events.len == 0 && recv_one(client, deadline) > 0) {
		}
	}
	if (client->ring.base) {
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
	size_t n = client_evq_pop(&client->events, events, max);
	for (size_t i = 0; i < n; i++) {
		if (events[i].payload) {
			client->handed[client->n_handed++] = (void *)events[i].payload;
		}
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

RDMAX_EXPORT int rdmax_cancel(struct rdmax_client *client, uint64_t job_id)
{
	Rdmax__V1__Cancel cancel = RDMAX__V1__CANCEL__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client) {
		return -EINVAL;
	}
	cancel.job_id = job_id;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_CANCEL;
	msg.cancel = &cancel;
	return request_status(client, &msg, -1);
}

RDMAX_EXPORT int rdmax_job_status(struct rdmax_client *client, uint64_t job_id, uint64_t *ret_done,
				  uint64_t *ret_total)
{
	Rdmax__V1__JobStatusQuery q = RDMAX__V1__JOB_STATUS_QUERY__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;
	int r;

	if (!client) {
		return -EINVAL;
	}
	q.job_id = job_id;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS;
	msg.job_status = &q;
	r = request(client, &msg, -1, -1, &reply);
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_JOB_STATUS ||
	    reply->job_status->job_id != job_id) {
		r = unexpected_reply(client, reply);
	} else if (!reply->job_status->in_flight) {
		r = RDMAX_E_NOT_FOUND;
	} else {
		if (ret_done) {
			*ret_done = reply->job_status->bytes_done;
		}
		if (ret_total) {
			*ret_total = reply->job_status->bytes_total;
		}
	}
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

RDMAX_EXPORT int rdmax_peer_group_create(struct rdmax_client *client,
					 const struct rdmax_desc *descs, size_t count,
					 struct rdmax_peer_group **ret_group)
{
	Rdmax__V1__PeerGroupCreate pg = RDMAX__V1__PEER_GROUP_CREATE__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;
	struct rdmax_peer_group *group;
	ProtobufCBinaryData *bins;
	int r;

	if (!client || !ret_group || (count && !descs)) {
		return -EINVAL;
	}
	if (count == 0 || count > SIZE_MAX / sizeof(*bins)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < count; i++) {
		if (!desc_usable(&descs[i])) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	group = calloc(1, sizeof(*group));
	bins = malloc(count * sizeof(*bins));
	if (!group || !bins) {
		r = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < count; i++) {
		bins[i] = desc_bytes(&descs[i]);
	}
	pg.n_remote_descs = count;
	pg.remote_descs = bins;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE;
	msg.peer_group_create = &pg;
	r = request(client, &msg, -1, -1, &reply);
	if (r < 0) {
		goto out_free;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_PEER_GROUP) {
		r = unexpected_reply(client, reply);
		rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
		goto out_free;
	}
	group->client = client;
	group->handle = reply->peer_group->peer_group;
	group->size = count;
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	group->next = client->groups;
	if (client->groups) {
		client->groups->prev = group;
	}
	client->groups = group;
	free(bins);
	*ret_group = group;
	return 0;

out_free:
	free(bins);
	free(group);
	return r;
}

RDMAX_EXPORT int rdmax_peer_group_destroy(struct rdmax_client *client,
					  struct rdmax_peer_group *group)
{
	Rdmax__V1__PeerGroupDestroy d = RDMAX__V1__PEER_GROUP_DESTROY__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	int r;

	if (!group) {
		return 0;
	}
	if (!client || group->client != client) {
		return -EINVAL;
	}
	d.peer_group = group->handle;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_DESTROY;
	msg.peer_group_destroy = &d;
	r = request_status(client, &msg, -1);
	group_free(group);
	return r;
}

RDMAX_EXPORT size_t rdmax_peer_group_size(const struct rdmax_peer_group *group)
{
	return group ? group->size : 0;
}

static int mailbox_request(struct rdmax_client *client, const char *name, bool open)
{
	Rdmax__V1__MailboxOpen mo = RDMAX__V1__MAILBOX_OPEN__INIT;
	Rdmax__V1__MailboxClose mc = RDMAX__V1__MAILBOX_CLOSE__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client) {
		return -EINVAL;
	}
	if (!name || strnlen(name, RDMAX_MAILBOX_NAME_MAX + 1) > RDMAX_MAILBOX_NAME_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (open) {
		mo.name = (char *)name;
		msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN;
		msg.mailbox_open = &mo;
	} else {
		mc.name = (char *)name;
		msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_CLOSE;
		msg.mailbox_close = &mc;
	}
	return request_status(client, &msg, -1);
}

RDMAX_EXPORT int rdmax_mailbox_open(struct rdmax_client *client, const char *name)
{
	return mailbox_request(client, name, true);
}

RDMAX_EXPORT int rdmax_mailbox_close(struct rdmax_client *client, const char *name)
{
	return mailbox_request(client, name, false);
}

/* key: the mailbox name as a pointer, 0 for any. */
static bool match_message(const struct rdmax_event *e, uint64_t key)
{
	const char *name = (const char *)(uintptr_t)key;
	return e->type == RDMAX_EVENT_MESSAGE && (!name || strcmp(e->message, name) == 0);
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

int client_request(struct rdmax_client *client, Rdmax__V1__ClientMsg *msg, int timeout_ms,
		   Rdmax__V1__DaemonMsg **ret_reply)
{
	return request(client, msg, -1, timeout_ms, ret_reply);
}

int client_unexpected_reply(struct rdmax_client *client, const Rdmax__V1__DaemonMsg *reply)
{
	return unexpected_reply(client, reply);
}
