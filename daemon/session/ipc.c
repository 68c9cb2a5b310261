/* SPDX-License-Identifier: MIT */
/*
 * The client socket: AF_UNIX SOCK_SEQPACKET, one protobuf message per
 * datagram, fds as SCM_RIGHTS. This file owns the sessions' lifetime:
 * the listening socket, accepting (SO_PEERCRED, max_clients, the per-uid
 * shares), the Hello deadline, dooming and closing a session, and the
 * daemon's start and shutdown of all of it. Never calls verbs and never
 * touches payload bytes. The rest of a session's work lives next to it:
 * ipc_read.c (its socket), ipc_requests.c and ipc_names.c (what it asks),
 * ipc_send.c (replies and completion batches), ipc_ring.c (its
 * shared-memory ring); session_internal.h is what they share.
 *
 * libuv cannot hand over fds received with SCM_RIGHTS on its stream types,
 * so sockets are raw fds watched with uv_poll_t and read with recvmsg().
 *
 * Hardening: a session is never closed from inside another operation (a
 * failed send dooms it; the loop's next turn closes it), a client with 4 MiB
 * of replies unread is not read from until it drains (back-pressure), and
 * what the clients of one uid hold together is bounded by [limits] per_uid_*
 * (docs/security.md). Connections without Hello are closed after
 * hello_timeout_ms.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "discovery.h"
#include "ipc.h"
#include "log.h"
#include "rdmax.h"
#include "session_internal.h"
#include "status.h"

static void close_doomed(uv_idle_t *idle);

/*
 * The session must go, but the caller may be deep inside a completion
 * callback or a loop over the client's jobs: stop every further send and
 * read now, close from the loop's next turn (close_doomed). Never recurses.
 */
void session_doom(struct session *s, const char *why)
{
	if (s->closing || s->doomed) {
		return;
	}
	s->doomed = true;
	s->doom_why = why;
	uv_poll_stop(&s->poll);
	list_add_tail(&s->ipc->doomed, &s->doom_link);
	uv_idle_start(&s->ipc->doom_idle, close_doomed);
}

/* Which events to wait for: back-pressure stops reading while much is queued. */
void session_poll_update(struct session *s)
{
	int events = 0;

	if (!session_live(s)) {
		return;
	}
	s->paused = s->queued_bytes >= SESSION_PAUSE_QUEUED_BYTES;
	if (!s->paused) {
		events |= UV_READABLE;
	}
	if (!list_empty(&s->out_queue)) {
		events |= UV_WRITABLE;
	}
	uv_poll_start(&s->poll, events, session_io);
}

static void session_freed(uv_handle_t *handle)
{
	struct session *s = handle->data;

	free(s->completions);
	free(s);
}

static void trim_heap(uv_timer_t *timer)
{
	(void)timer;
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}

void session_close(struct session *s, const char *why)
{
	struct ipc *ipc = s->ipc;
	struct rdmaxd *daemon = ipc->daemon;
	struct list_node *pos, *tmp;

	if (s->closing) {
		return;
	}
	/*
	 * Completions already decided still reach a client that is merely being
	 * closed; a failed send dooms the session instead of closing it again.
	 */
	if (!s->doomed) {
		ipc_flush_completions(s);
	}
	if (s->doomed) {
		list_del(&s->doom_link);
	}
	s->closing = true;
	log_info("client %" PRIu64 " '%s' (pid %d) closed: %s", s->id, s->name, (int)s->pid, why);
	if (s->dirty) {
		list_del(&s->dirty_link);
		s->dirty = false;
	}
	job_owner_leave(daemon->engine, &s->owner);
	imm_release_owner(&daemon->imm, &s->owner);
	mailbox_release_owner(&ipc->mailboxes, &s->owner);
	names_release_owner(&ipc->names, &s->owner);
	discovery_release_owner(daemon->discovery, &s->owner);
	if (s->ring.v.base) {
		/* Entries left in it die with the session, like unread datagrams. */
		list_del(&s->ring_link);
		ring_unmap(&s->ring);
	}
	list_for_each_safe(pos, tmp, &s->regions)
	{
		struct region *region = container_of(pos, struct region, owner_link);
		/* Jobs may hold the region past the session's life: unlink it from the session. */
		list_del(&region->owner_link);
		if (region->deregistering) {
			/* A pending DeregisterRegion must not reply to a freed session. */
			struct dereg_wait *wait = region->released_arg;
			if (wait) {
				wait->session = NULL;
			}
		} else {
			region_deregister(&daemon->regions, region, NULL, NULL);
		}
	}
	list_for_each_safe(pos, tmp, &s->out_queue)
	{
		struct out_msg *m = container_of(pos, struct out_msg, link);
		list_del(&m->link);
		free(m);
	}
	for (size_t i = 0; i < s->n_completions; i++) {
		free(s->completions[i].message);
	}
	s->n_completions = 0;
	s->share->queued_bytes -= s->queued_bytes;
	s->queued_bytes = 0;
	s->share->clients--;
	s->share->regions -= s->region_count;
	s->share->registered_bytes -= s->registered_bytes;
	if (s->share->clients == 0) {
		/* Its jobs were completed by job_owner_leave(): nothing refers to it any more. */
		hmap_del(&ipc->shares, (uint64_t)s->uid + 1);
		free(s->share);
	}
	s->share = NULL;
	list_del(&s->link);
	ipc->n_sessions--;
	uv_poll_stop(&s->poll);
	close(s->fd);
	s->fd = -1;
	uv_close((uv_handle_t *)&s->poll, session_freed);
	if (ipc->listening && !uv_is_active((uv_handle_t *)&ipc->trim_timer)) {
		uv_timer_start(&ipc->trim_timer, trim_heap, SESSION_TRIM_DELAY_MS, 0);
	}
}

static void reject_client(int fd, int err, const char *text)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Error error = RDMAX__V1__ERROR__INIT;
	uint8_t buf[512];

	error.status = (Rdmax__V1__Status)status_from_err(err);
	error.message = (char *)text;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_ERROR;
	msg.error = &error;
	size_t len = rdmax__v1__daemon_msg__get_packed_size(&msg);
	if (len <= sizeof(buf)) {
		rdmax__v1__daemon_msg__pack(&msg, buf);
		(void)send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	close(fd);
}

/* The share of uid, created on first use; NULL without memory. */
static struct uid_share *share_get(struct ipc *ipc, uid_t uid)
{
	struct uid_share *share = hmap_get(&ipc->shares, (uint64_t)uid + 1);

	if (share) {
		return share;
	}
	share = calloc(1, sizeof(*share));
	if (!share) {
		return NULL;
	}
	share->uid = uid;
	if (hmap_put(&ipc->shares, (uint64_t)uid + 1, share) < 0) {
		free(share);
		return NULL;
	}
	return share;
}

/* From the idle handle: close the sessions doomed during the last turn. */
static void close_doomed(uv_idle_t *idle)
{
	struct ipc *ipc = idle->data;

	while (!list_empty(&ipc->doomed)) {
		struct session *s = container_of(ipc->doomed.next, struct session, doom_link);
		session_close(s, s->doom_why); /* unlinks it from ipc->doomed */
	}
	uv_idle_stop(idle);
}

/* Every so often: connections that did not say Hello in time go. */
static void hello_deadline(uv_timer_t *timer)
{
	struct ipc *ipc = timer->data;
	const struct config *cfg = &ipc->daemon->cfg;
	uint64_t now = now_ms();
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &ipc->sessions)
	{
		struct session *s = container_of(pos, struct session, link);
		if (s->hello_done || !session_live(s) ||
		    now - s->connected_ms < cfg->hello_timeout_ms) {
			continue;
		}
		ipc_reply_status(s, 0, RDMAX_E_TIMEOUT,
				 "no Hello within %u ms ([limits] hello_timeout_ms); closing the "
				 "connection",
				 cfg->hello_timeout_ms);
		session_close(s, "no Hello in time");
	}
}

static void accept_clients(uv_poll_t *poll, int status, int events)
{
	struct ipc *ipc = poll->data;
	struct rdmaxd *daemon = ipc->daemon;

	if (status < 0) {
		log_err("client socket poll failed: %s", uv_strerror(status));
		return;
	}
	for (int i = 0; i < 32; i++) {
		int fd = accept4(ipc->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			int err = errno;
			if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
				static struct log_ratelimit rl;
				bool paused = listen_backoff_failed(&ipc->backoff, err);
				log_ratelimited(&rl, LOG_ERR, "accept4() on '%s' failed: %s%s",
						daemon->cfg.socket_path, strerror(err),
						paused ? "; accepting paused" : "");
			}
			return;
		}
		listen_backoff_ok(&ipc->backoff);
		struct ucred cred = {.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
		socklen_t cred_len = sizeof(cred);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) < 0) {
			reject_client(fd, -EPERM, "cannot read the peer's credentials");
			continue;
		}
		if (ipc->n_sessions >= daemon->cfg.max_clients) {
			static struct log_ratelimit rl;
			log_ratelimited(&rl, LOG_WARNING,
					"refusing client of uid %u: %u clients connected (limit)",
					(unsigned)cred.uid, ipc->n_sessions);
			reject_client(fd, RDMAX_E_RESOURCE_EXHAUSTED, "too many clients");
			continue;
		}
		struct uid_share *share = share_get(ipc, cred.uid);
		if (share && share->clients >= daemon->cfg.per_uid_clients) {
			static struct log_ratelimit rl;
			log_ratelimited(&rl, LOG_WARNING,
					"refusing client of uid %u: it has %u clients connected "
					"([limits] per_uid_clients)",
					(unsigned)cred.uid, share->clients);
			reject_client(fd, RDMAX_E_RESOURCE_EXHAUSTED,
				      "too many clients of this uid ([limits] per_uid_clients)");
			continue;
		}
		struct session *s = share ? calloc(1, sizeof(*s)) : NULL;
		if (!s || job_owner_init(&s->owner) < 0) {
			free(s);
			if (share && share->clients == 0) {
				hmap_del(&ipc->shares, (uint64_t)cred.uid + 1);
				free(share);
			}
			reject_client(fd, -ENOMEM, "out of memory");
			continue;
		}
		s->pid = cred.pid;
		s->uid = cred.uid;
		s->gid = cred.gid;
		s->share = share;
		share->clients++;
		s->owner.uid_outstanding = &share->outstanding;
		s->owner.has_uid = true;
		s->owner.uid = (uint32_t)cred.uid;
		if (imm_space_open(&daemon->imm, &s->owner, &share->imm_counters,
				   daemon->cfg.per_uid_imm_counters) < 0) {
			share->clients--;
			if (share->clients == 0) {
				hmap_del(&ipc->shares, (uint64_t)cred.uid + 1);
				free(share);
			}
			job_owner_leave(daemon->engine, &s->owner);
			free(s);
			reject_client(fd, -ENOMEM, "out of memory");
			continue;
		}
		int sndbuf = (int)daemon->cfg.max_message_bytes * 4;
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		s->ipc = ipc;
		s->fd = fd;
		s->id = ++ipc->next_session_id;
		s->connected_ms = now_ms();
		snprintf(s->name, sizeof(s->name), "pid-%d", (int)s->pid);
		list_init(&s->regions);
		list_init(&s->out_queue);
		list_init(&s->dirty_link);
		list_init(&s->ring_link);
		list_init(&s->doom_link);
		uv_poll_init(daemon->loop, &s->poll, fd);
		s->poll.data = s;
		uv_poll_start(&s->poll, UV_READABLE, session_io);
		list_add_tail(&ipc->sessions, &s->link);
		ipc->n_sessions++;
	}
}

/* Refuse to steal the socket of a running daemon; remove a stale one. */
static int prepare_socket_path(const char *path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct stat st;

	if (lstat(path, &st) < 0) {
		return errno == ENOENT ? 0 : -errno;
	}
	if (!S_ISSOCK(st.st_mode)) {
		return -EEXIST;
	}
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		return -errno;
	}
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	int live = connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
	close(fd);
	if (live) {
		return -EADDRINUSE;
	}
	return unlink(path) < 0 ? -errno : 0;
}

/* region_table.owner_uid: every region's owner is a session's job_owner. */
static uint32_t owner_uid(void *owner)
{
	return (uint32_t)session_of(owner)->uid;
}

int ipc_create(struct rdmaxd *daemon, struct ipc **ret_ipc)
{
	const struct config *cfg = &daemon->cfg;
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct ipc *ipc;
	int ret;

	ipc = calloc(1, sizeof(*ipc));
	if (!ipc) {
		return -ENOMEM;
	}
	ipc->daemon = daemon;
	ipc->listen_fd = -1;
	daemon->regions.owner_uid = owner_uid;
	list_init(&ipc->sessions);
	list_init(&ipc->dirty);
	list_init(&ipc->rings);
	list_init(&ipc->doomed);
	if (hmap_init(&ipc->shares, 16) < 0) {
		free(ipc);
		return -ENOMEM;
	}
	/* One byte more than the limit so that an oversized datagram shows MSG_TRUNC. */
	ipc->rx_size = cfg->max_message_bytes + 1;
	ipc->tx_size = cfg->max_message_bytes;
	ipc->rx_buf = malloc(ipc->rx_size);
	ipc->tx_buf = malloc(ipc->tx_size);
	ipc->ring_buf = malloc(RDMAX_RING_MAX_SQE_BYTES);
	if (!ipc->rx_buf || !ipc->tx_buf || !ipc->ring_buf ||
	    arena_init(&ipc->ring_arena, IPC_RING_ARENA_BYTES) < 0) {
		ret = -ENOMEM;
		goto out_free;
	}
	ret = mailbox_table_init(&ipc->mailboxes, ipc_deliver_message);
	if (ret == 0) {
		ret = names_init(&ipc->names);
	}
	if (ret < 0) {
		goto out_free;
	}
	if (daemon->client_listen_fd > 0) {
		/* Socket activation: already bound and listening; the socket unit owns it. */
		ipc->listen_fd = daemon->client_listen_fd;
		ipc->inherited = true;
		goto out_listening;
	}
	ret = prepare_socket_path(cfg->socket_path);
	if (ret < 0) {
		log_err("cannot use socket path '%s': %s", cfg->socket_path,
			ret == -EADDRINUSE ? "another daemon is listening on it"
			: ret == -EEXIST   ? "a file that is not a socket is in the way"
					   : strerror(-ret));
		goto out_free;
	}
	ipc->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ipc->listen_fd < 0) {
		ret = -errno;
		log_err("socket(AF_UNIX, SOCK_SEQPACKET) failed: %s", strerror(errno));
		goto out_free;
	}
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", cfg->socket_path);
	if (bind(ipc->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		ret = -errno;
		log_err("bind() to '%s' failed: %s", cfg->socket_path, strerror(errno));
		goto out_close;
	}
	if (chmod(cfg->socket_path, cfg->socket_mode) < 0) {
		log_warn("chmod() of '%s' failed: %s", cfg->socket_path, strerror(errno));
	}
	if (listen(ipc->listen_fd, 128) < 0) {
		ret = -errno;
		log_err("listen() on '%s' failed: %s", cfg->socket_path, strerror(errno));
		goto out_unlink;
	}
out_listening:
	uv_poll_init(daemon->loop, &ipc->listen_poll, ipc->listen_fd);
	ipc->listen_poll.data = ipc;
	uv_poll_start(&ipc->listen_poll, UV_READABLE, accept_clients);
	listen_backoff_init(&ipc->backoff, daemon->loop, &ipc->listen_poll, accept_clients);
	uv_check_init(daemon->loop, &ipc->flush_check);
	ipc->flush_check.data = ipc;
	uv_check_start(&ipc->flush_check, ipc_flush_dirty);
	uv_idle_init(daemon->loop, &ipc->flush_idle);
	ipc->flush_idle.data = ipc;
	uv_idle_init(daemon->loop, &ipc->doom_idle);
	ipc->doom_idle.data = ipc;
	uv_timer_init(daemon->loop, &ipc->hello_timer);
	ipc->hello_timer.data = ipc;
	/* A sweep over at most max_clients sessions; a quarter of the timeout late at most. */
	uint64_t sweep = MAX(cfg->hello_timeout_ms / 4, 25);
	uv_timer_start(&ipc->hello_timer, hello_deadline, sweep, sweep);
	uv_unref((uv_handle_t *)&ipc->hello_timer);
	uv_timer_init(daemon->loop, &ipc->trim_timer);
	ipc->trim_timer.data = ipc;
	uv_unref((uv_handle_t *)&ipc->trim_timer);
	ipc->listening = true;
	daemon->mailboxes = &ipc->mailboxes;
	daemon->names = &ipc->names;
	*ret_ipc = ipc;
	return 0;

out_unlink:
	unlink(cfg->socket_path);
out_close:
	close(ipc->listen_fd);
out_free:
	mailbox_table_fini(&ipc->mailboxes);
	hmap_fini(&ipc->shares);
	names_fini(&ipc->names);
	free(ipc->rx_buf);
	free(ipc->tx_buf);
	free(ipc->ring_buf);
	arena_fini(&ipc->ring_arena);
	free(ipc);
	return ret;
}

void ipc_shutdown(struct ipc *ipc)
{
	struct list_node *pos, *tmp;

	if (!ipc || !ipc->listening) {
		return;
	}
	ipc->listening = false;
	uv_poll_stop(&ipc->listen_poll);
	uv_close((uv_handle_t *)&ipc->listen_poll, NULL);
	listen_backoff_close(&ipc->backoff, NULL);
	uv_check_stop(&ipc->flush_check);
	uv_close((uv_handle_t *)&ipc->flush_check, NULL);
	uv_timer_stop(&ipc->hello_timer);
	uv_close((uv_handle_t *)&ipc->hello_timer, NULL);
	uv_timer_stop(&ipc->trim_timer);
	uv_close((uv_handle_t *)&ipc->trim_timer, NULL);
	close(ipc->listen_fd);
	if (!ipc->inherited) {
		unlink(ipc->daemon->cfg.socket_path);
	}
	list_for_each_safe(pos, tmp, &ipc->sessions)
	{
		struct session *s = container_of(pos, struct session, link);
		ipc_ring_cancel_pending(s);
		/* Best effort: the CANCELLED completions are already batched. */
		ipc_flush_completions(s);
		ipc_flush_out_queue(s);
		session_close(s, s->doomed ? s->doom_why : "daemon shutting down");
	}
	uv_idle_stop(&ipc->doom_idle);
	uv_close((uv_handle_t *)&ipc->doom_idle, NULL);
	uv_idle_stop(&ipc->flush_idle);
	uv_close((uv_handle_t *)&ipc->flush_idle, NULL);
}

void ipc_destroy(struct ipc *ipc)
{
	if (!ipc) {
		return;
	}
	if (ipc->daemon->mailboxes == &ipc->mailboxes) {
		ipc->daemon->mailboxes = NULL;
	}
	mailbox_table_fini(&ipc->mailboxes);
	if (ipc->daemon->names == &ipc->names) {
		ipc->daemon->names = NULL;
	}
	names_fini(&ipc->names);
	struct uid_share *share;
	size_t iter = 0;
	while (hmap_next(&ipc->shares, &iter, NULL, (void **)&share)) {
		free(share);
	}
	hmap_fini(&ipc->shares);
	free(ipc->rx_buf);
	free(ipc->tx_buf);
	free(ipc->ring_buf);
	arena_fini(&ipc->ring_arena);
	free(ipc);
}

uint32_t ipc_client_count(const struct ipc *ipc)
{
	return ipc ? ipc->n_sessions : 0;
}

void ipc_for_each_client(const struct ipc *ipc, ipc_client_cb cb, void *arg)
{
	struct list_node *pos, *tmp;
	uint64_t now = now_ms();

	if (!ipc) {
		return;
	}
	list_for_each_safe(pos, tmp, (struct list_node *)&ipc->sessions)
	{
		const struct session *s = container_of(pos, struct session, link);
		struct ipc_client_info info = {
			.id = s->id,
			.pid = (int)s->pid,
			.uid = (uint32_t)s->uid,
			.gid = (uint32_t)s->gid,
			.name = s->name,
			.owner = &s->owner,
			.regions = s->region_count,
			.registered_bytes = s->registered_bytes,
			.outstanding = s->owner.outstanding,
			.jobs_ok = s->jobs_ok,
			.jobs_failed = s->jobs_failed,
			.bytes = s->bytes_moved,
			.queued_bytes = s->queued_bytes,
			.connected_ms = now - s->connected_ms,
		};
		cb(arg, &info);
	}
}
