/* SPDX-License-Identifier: MIT */
/*
 * A session's socket: reading datagrams with recvmsg() (SCM_RIGHTS fds,
 * the message and fd limits, decoding, taking the ring's earlier entries
 * first) and writing out what waits in its queue. Reads are bounded per
 * turn so other clients get theirs, and stop under back-pressure. The
 * daemon keeps no fd a client sent: each is closed once its message is
 * handled.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdmax.h"
#include "session_internal.h"

static void close_fds(const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		close(fds[i]);
	}
}

/* Close every fd a received message's control data passed in. */
static void close_cmsg_fds(struct msghdr *mh)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				close(fd);
			}
		}
	}
}

/*
 * Whether a datagram wakes its sender's sleeping ring: a doorbell or jobs,
 * from a client that submits now. Other requests (an imm expected, a region
 * registered) only take the entries published before them: a client that
 * sleeps between events and claims each one must not keep the daemon
 * spinning on its ring.
 */
static bool ring_wakes_for(const Rdmax__V1__ClientMsg *m)
{
	return m->body_case == RDMAX__V1__CLIENT_MSG__BODY_RING_DOORBELL ||
	       m->body_case == RDMAX__V1__CLIENT_MSG__BODY_SUBMIT;
}

/* Read one datagram; returns 1 when one was handled, 0 on EAGAIN, <0 to close. */
static int read_one(struct session *s)
{
	struct ipc *ipc = s->ipc;
	const struct config *cfg = &ipc->daemon->cfg;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * MAX_FDS_HARD)];
	} control;
	struct iovec iov = {.iov_base = ipc->rx_buf, .iov_len = ipc->rx_size};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	int fds[MAX_FDS_HARD];
	size_t n_fds = 0;

	/* Room for one fd more than allowed, so that "too many" is seen, not truncated. */
	mh.msg_control = control.buf;
	mh.msg_controllen = CMSG_SPACE(sizeof(int) * (cfg->max_fds_per_message + 1));
	ssize_t n = recvmsg(s->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0) {
		return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
	}
	if (n == 0) {
		/* An empty datagram may still carry fds: they are ours now, so close them. */
		close_cmsg_fds(&mh);
		/*
		 * recvmsg() says 0 both for the end of the stream and for an empty
		 * datagram: only a hang-up tells them apart.
		 */
		struct pollfd pfd = {.fd = s->fd, .events = POLLRDHUP};
		if (poll(&pfd, 1, 0) != 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR))) {
			return -ECONNRESET;
		}
		s->msgs_received++;
		ipc_reply_status(
			s, 0, RDMAX_E_PROTOCOL_ERROR,
			"empty datagram: every message must carry a ClientMsg with a body%s",
			s->hello_done ? "" : "; closing the connection");
		s->close_after_flush = !s->hello_done;
		return 1;
	}
	if (s->ring.v.base) {
		/* Entries written before this datagram was sent go first. */
		ipc_ring_take(s, UINT32_MAX, 0);
	}
	s->msgs_received++;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k && n_fds < MAX_FDS_HARD; i++) {
				memcpy(&fds[n_fds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			}
		}
	}
	if ((mh.msg_flags & MSG_TRUNC) || (size_t)n > cfg->max_message_bytes) {
		close_fds(fds, n_fds);
		ipc_reply_status(
			s, 0, RDMAX_E_RESOURCE_EXHAUSTED,
			"message larger than the limit of %u bytes; closing the connection",
			cfg->max_message_bytes);
		s->close_after_flush = true;
		return 1;
	}
	if ((mh.msg_flags & MSG_CTRUNC) || n_fds > cfg->max_fds_per_message) {
		close_fds(fds, n_fds);
		ipc_reply_status(s, 0, RDMAX_E_RESOURCE_EXHAUSTED,
				 "message carried more than %u fds; closing the connection",
				 cfg->max_fds_per_message);
		s->close_after_flush = true;
		return 1;
	}
	Rdmax__V1__ClientMsg *m = rdmax__v1__client_msg__unpack(NULL, (size_t)n, ipc->rx_buf);
	if (!m) {
		close_fds(fds, n_fds);
		/* Before Hello nothing shows the peer speaks this protocol at all. */
		ipc_reply_status(s, 0, RDMAX_E_PROTOCOL_ERROR,
				 "cannot decode a %zd-byte message as rdmax.v1.ClientMsg%s", n,
				 s->hello_done ? "" : " (before Hello); closing the connection");
		s->close_after_flush = !s->hello_done;
		return 1;
	}
	if (s->ring.v.base && ring_wakes_for(m)) {
		ring_wake(&s->ring);
		ipc_ring_active(s, 0);
	}
	ipc_dispatch(s, m, fds, n_fds);
	/* The daemon keeps no client fd: regions hold their own mapping. */
	close_fds(fds, n_fds);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	return 1;
}

void ipc_flush_out_queue(struct session *s)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &s->out_queue)
	{
		struct out_msg *m = container_of(pos, struct out_msg, link);
		ssize_t n = send(s->fd, m->data, m->len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				return;
			}
			session_doom(s, "cannot send to the client");
			return;
		}
		s->queued_bytes -= m->len;
		s->share->queued_bytes -= m->len;
		list_del(&m->link);
		free(m);
		if (s->paused && s->queued_bytes < SESSION_PAUSE_QUEUED_BYTES / 2) {
			break; /* read requests again while the rest drains */
		}
	}
	session_poll_update(s);
}

void session_io(uv_poll_t *poll, int status, int events)
{
	struct session *s = poll->data;

	if (status < 0) {
		session_close(s, uv_strerror(status));
		return;
	}
	if (events & UV_WRITABLE) {
		ipc_flush_out_queue(s);
	}
	/* Bounded: other clients get their turn. */
	for (int i = 0; i < 64 && session_live(s) && !s->paused && (events & UV_READABLE); i++) {
		int ret = read_one(s);
		if (ret == 0) {
			break;
		}
		if (ret < 0) {
			session_close(s, ret == -ECONNRESET ? "disconnected" : strerror(-ret));
			return;
		}
		if (s->close_after_flush) {
			ipc_flush_completions(s);
			session_close(s, "protocol violation");
			return;
		}
		/*
		 * The client says it sent no more: the next call would most likely
		 * only hear EAGAIN, one more system call per doorbell. Epoll's
		 * readiness is level-triggered, so a datagram that came meanwhile
		 * (or one a wrong count hides) brings the session back.
		 */
		if (s->ring.v.base && ring_client_sent_all(&s->ring, s->msgs_received)) {
			break;
		}
	}
	if (s->doomed) {
		session_close(s, s->doom_why); /* at the top of a callback: safe now */
	}
}
