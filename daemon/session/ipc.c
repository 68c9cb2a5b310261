/* SPDX-License-Identifier: MIT */
/*
 * The client socket: AF_UNIX SOCK_SEQPACKET, one protobuf message per
 * datagram, fds as SCM_RIGHTS. Owns client sessions, their limits, their
 * regions' lifetimes and the batching of completions (flushed once per loop
 * iteration from a uv_check handle). Never calls verbs and never touches
 * payload bytes.
 *
 * libuv cannot hand over fds received with SCM_RIGHTS on its stream types,
 * so sockets are raw fds watched with uv_poll_t and read with recvmsg().
 *
 * A client may also open a shared-memory ring (RingSetup, ring.c): its jobs
 * then arrive as ring entries, polled from the uv_check handle for a bounded
 * window after the last activity, and completions go to the ring while it
 * has room and nothing waits on the socket before them (otherwise to the
 * socket, in order). Datagrams are counted both ways so that ring entries and
 * socket messages are taken in the order they were sent.
 *
 * Hardening: a session is never closed from inside another operation (a
 * failed send dooms it; the loop's next turn closes it), a client with 4 MiB
 * of replies unread is not read from until it drains (back-pressure), and
 * what the clients of one uid hold together is bounded by [limits] per_uid_*
 * (docs/security.md). Connections without Hello are closed after
 * hello_timeout_ms.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "discovery.h"
#include "engine.h"
#include "gpu.h"
#include "ipc.h"
#include "listen_backoff.h"
#include "log.h"
#include "mailbox.h"
#include "counters.h"
#include "names.h"
#include "peer_group.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "ring.h"
#include "status.h"
#include "transport.h"

/* Bytes a client may leave unread before the daemon drops it. */
#define SESSION_MAX_QUEUED_BYTES (64u << 20)
/*
 * Back-pressure: while this much waits for a client to read, the daemon reads
 * no more of its requests (nor ring entries), so a client that never reads
 * can only have its outstanding jobs' completions queued, not more.
 */
#define SESSION_PAUSE_QUEUED_BYTES (4u << 20)
/* Completions per Completions message at most. */
#define COMPLETION_BATCH_MAX 1024u
#define MAX_FDS_HARD         253
/* Ring entries taken per client per loop turn, so other clients get theirs. */
#define RING_POLL_MAX 256u

struct out_msg {
	struct list_node link;
	size_t len;
	uint8_t data[];
};

struct pending_completion {
	uint64_t job_id;
	int status;
	uint64_t bytes;
	char *message; /* NULL when OK */
};

/* What the clients of one uid hold together ([limits] per_uid_*). */
struct uid_share {
	uid_t uid;
	uint32_t clients;
	uint32_t regions;
	uint64_t registered_bytes;
	uint32_t outstanding;  /* jobs without a completion (the engine counts them) */
	uint32_t imm_counters; /* in the namespaces of its clients (imm.c counts them) */
};

struct session {
	struct ipc *ipc;
	struct list_node link; /* in ipc->sessions */
	int fd;
	uv_poll_t poll;
	bool closing;
	/*
	 * Failed while the daemon was in the middle of something (sending from a
	 * completion callback, inside engine_submit): nothing more is sent or
	 * read, and the session is closed from the loop's next turn, never from
	 * inside the call that failed.
	 */
	bool doomed;
	const char *doom_why;       /* static text */
	struct list_node doom_link; /* in ipc->doomed */
	bool paused;                /* back-pressure: requests are not read */
	struct uid_share *share;
	bool hello_done;
	bool close_after_flush; /* a fatal protocol error was answered */
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[64];
	struct job_owner owner;
	struct list_node regions; /* struct region.owner_link */
	uint32_t region_count;
	uint64_t registered_bytes;
	struct list_node out_queue; /* struct out_msg waiting for POLLOUT */
	size_t queued_bytes;
	struct pending_completion *completions;
	size_t n_completions;
	size_t cap_completions;
	size_t completions_bytes; /* estimate of the encoded size */
	bool dirty;               /* completions waiting for the flush */
	struct list_node dirty_link;
	/* Datagrams both ways, for the ring's ordering (RingNotify not counted). */
	uint64_t msgs_sent;
	uint64_t msgs_received;
	/* Shared-memory ring (ring.v.base == NULL: none). */
	struct ring ring;
	struct list_node ring_link; /* in ipc->rings while the ring is mapped */
	uint64_t ring_active_ns;    /* last entry taken or datagram read */
	bool ring_posted;           /* completions posted since the last wake check */
	bool ring_bad;              /* the client broke the ring: closed at the next check */
	/* For the admin socket and metrics. */
	uint64_t jobs_ok;
	uint64_t jobs_failed;
	uint64_t bytes_moved;
	uint64_t connected_ms;
};

struct ipc {
	struct rdmaxd *daemon;
	int listen_fd;
	uv_poll_t listen_poll;
	struct listen_backoff backoff; /* pauses accepting after EMFILE and the like */
	uv_check_t flush_check;
	struct list_node sessions;
	struct list_node dirty;
	struct list_node rings; /* sessions with a mapped ring */
	uint8_t *ring_buf;      /* one submission entry, copied out of shared memory */
	uint32_t n_sessions;
	uint64_t next_session_id;
	struct list_node doomed; /* sessions to close at the next turn */
	uv_idle_t doom_idle;     /* runs that turn */
	uv_timer_t hello_timer;  /* closes connections that sent no Hello in time */
	struct hmap shares;      /* uid+1 -> struct uid_share */
	uint8_t *rx_buf;
	size_t rx_size;
	uint8_t *tx_buf;
	size_t tx_size;
	bool listening;
	bool inherited; /* listen_fd came from the service manager: never unlink it */
	struct mailbox_table mailboxes; /* the node's mailboxes (daemon->mailboxes) */
	struct name_table names;        /* the node's named regions (daemon->names) */
};

static struct session *session_of(void *owner)
{
	return container_of((struct job_owner *)owner, struct session, owner);
}

static void session_close(struct session *s, const char *why);
/* uv_poll_start() replaces the callback too: every restart must name it. */
static void session_io(uv_poll_t *poll, int status, int events);

static void close_doomed(uv_idle_t *idle);

/* Whether the session still takes requests and events. */
static bool session_live(const struct session *s)
{
	return !s->closing && !s->doomed;
}

/*
 * The session must go, but the caller may be deep inside a completion
 * callback or a loop over the client's jobs: stop every further send and
 * read now, close from the loop's next turn (close_doomed). Never recurses.
 */
static void session_doom(struct session *s, const char *why)
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
static void session_poll_update(struct session *s)
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

/* ------------------------------------------------------------------ sending */

/* A datagram was sent or queued: ring completions posted later come after it. */
static void count_sent(struct session *s)
{
	s->msgs_sent++;
	if (s->ring.v.base) {
		ring_report_sent(&s->ring, s->msgs_sent);
	}
}

static void mark_dirty(struct session *s)
{
	if (!s->dirty) {
		s->dirty = true;
		list_add_tail(&s->ipc->dirty, &s->dirty_link);
	}
}

/*
 * Completions were posted and the client asked to be woken: one RingNotify.
 * Not counted and never queued: a socket that is full is readable already.
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
	(void)send(s->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static int send_or_queue(struct session *s, const uint8_t *data, size_t len)
{
	if (!session_live(s)) {
		return -EPIPE;
	}
	if (list_empty(&s->out_queue)) {
		ssize_t n = send(s->fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n >= 0) {
			count_sent(s);
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
	count_sent(s);
	session_poll_update(s);
	return 0;
}

static int send_daemon_msg(struct session *s, const Rdmax__V1__DaemonMsg *msg)
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

static void reply_status(struct session *s, uint64_t seq, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void reply_status(struct session *s, uint64_t seq, int err, const char *fmt, ...)
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
	send_daemon_msg(s, &msg);
}

static void flush_completions(struct session *s)
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
	send_daemon_msg(s, &msg);
	free(items);
	free(ptrs);
out_clear:
	for (size_t i = 0; i < s->n_completions; i++) {
		free(s->completions[i].message);
	}
	s->n_completions = 0;
	s->completions_bytes = 0;
}

static void poll_rings(struct ipc *ipc);

static void flush_dirty(uv_check_t *check)
{
	struct ipc *ipc = check->data;
	struct list_node *pos, *tmp;

	poll_rings(ipc);

	list_for_each_safe(pos, tmp, &ipc->dirty)
	{
		struct session *s = container_of(pos, struct session, dirty_link);
		list_del(&s->dirty_link);
		s->dirty = false;
		flush_completions(s);
		if (s->ring_posted && s->ring.v.base) {
			s->ring_posted = false;
			if (ring_take_wake_request(&s->ring)) {
				send_ring_notify(s);
			}
		}
	}
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
			s->ring_posted = true;
			/* A completion is what a waiting client answers with its next jobs. */
			s->ring_active_ns = now_ns();
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
		flush_completions(s);
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
	flush_completions(s);
	ev.imm = imm;
	ev.count = count;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_IMM_REACHED;
	msg.imm_reached = &ev;
	send_daemon_msg(s, &msg);
}

/* ----------------------------------------------------------------- requests */

static uint32_t collect_endpoints(struct rdmaxd *daemon, const struct region *region,
				  struct endpoint *eps, uint32_t max)
{
	uint32_t n = 0;

	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = daemon->transports[k];
		if (!t || n >= max) {
			continue;
		}
		int got = t->ops->endpoints(t, region, eps + n, max - n);
		if (got > 0) {
			n += (uint32_t)got;
		}
	}
	return n;
}

/* The region's descriptor as peers use it: every transport's endpoints. */
static int encode_desc(struct rdmaxd *daemon, const struct region *region, uint8_t *buf,
		       size_t size)
{
	struct endpoint eps[DESC_MAX_ENDPOINTS];
	uint32_t n = collect_endpoints(daemon, region, eps, DESC_MAX_ENDPOINTS);

	return region_desc_encode(&daemon->regions, region, daemon->node_name, eps, n, buf, size);
}

static void handle_hello(struct session *s, uint64_t seq, const Rdmax__V1__Hello *hello)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	const struct config *cfg = &daemon->cfg;
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Welcome welcome = RDMAX__V1__WELCOME__INIT;
	Rdmax__V1__Limits limits = RDMAX__V1__LIMITS__INIT;
	struct endpoint eps[DESC_MAX_ENDPOINTS];
	Rdmax__V1__Endpoint pep[DESC_MAX_ENDPOINTS];
	Rdmax__V1__Endpoint *pep_ptrs[DESC_MAX_ENDPOINTS];

	if (s->hello_done) {
		reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR, "Hello sent twice");
		return;
	}
	if (hello->protocol_version != RDMAX_PROTOCOL_VERSION) {
		reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR,
			     "protocol version %u is not supported (this daemon speaks %u)",
			     hello->protocol_version, RDMAX_PROTOCOL_VERSION);
		s->close_after_flush = true;
		return;
	}
	if (hello->client_name) {
		snprintf(s->name, sizeof(s->name), "%s", hello->client_name);
	}
	if (config_pin_devices(cfg->pin, s->name, s->owner.pinned_devices,
			       sizeof(s->owner.pinned_devices)) > 0) {
		log_info("client %" PRIu64 " '%s' is pinned to devices %s ([verbs] pin)", s->id,
			 s->name, s->owner.pinned_devices);
	}
	s->hello_done = true;
	log_info("client %" PRIu64 " '%s' connected (pid %d, uid %u)", s->id, s->name, (int)s->pid,
		 (unsigned)s->uid);

	uint32_t n = collect_endpoints(daemon, NULL, eps, DESC_MAX_ENDPOINTS);
	for (uint32_t i = 0; i < n; i++) {
		Rdmax__V1__Endpoint init = RDMAX__V1__ENDPOINT__INIT;
		pep[i] = init;
		pep[i].transport = (Rdmax__V1__Transport)eps[i].transport;
		pep[i].addr = eps[i].addr;
		pep[i].port = eps[i].port;
		if (eps[i].device[0]) {
			pep[i].device = eps[i].device;
		}
		pep_ptrs[i] = &pep[i];
	}
	limits.max_message_bytes = cfg->max_message_bytes;
	limits.max_fds_per_message = cfg->max_fds_per_message;
	limits.max_regions = cfg->max_regions;
	limits.max_registered_bytes = cfg->max_registered_bytes;
	limits.max_outstanding_jobs = cfg->max_outstanding_jobs;
	limits.max_jobs_per_submit = cfg->max_jobs_per_submit;
	welcome.protocol_version = RDMAX_PROTOCOL_VERSION;
	welcome.daemon_version = RDMAXD_VERSION;
	welcome.instance_id = daemon->instance_id;
	welcome.node_name = daemon->node_name;
	welcome.n_endpoints = n;
	welcome.endpoints = pep_ptrs;
	welcome.capabilities = (daemon->transports[ENDPOINT_TCP] ? RDMAX_CAP_TCP : 0) |
			       (daemon->transports[ENDPOINT_VERBS] ? RDMAX_CAP_VERBS : 0) |
			       (daemon->auth_key_len ? RDMAX_CAP_AUTH : 0) | RDMAX_CAP_RING |
			       gpu_capabilities(daemon->gpu);
	welcome.limits = &limits;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_WELCOME;
	msg.welcome = &welcome;
	send_daemon_msg(s, &msg);
}

/* The client's region limits; false when one would be broken (answered). */
static bool region_limits_ok(struct session *s, uint64_t seq, uint64_t length)
{
	const struct config *cfg = &s->ipc->daemon->cfg;

	if (s->region_count >= cfg->max_regions) {
		reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
			     "client already has %u regions (limit)", s->region_count);
		return false;
	}
	if (length > cfg->max_registered_bytes - s->registered_bytes) {
		reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
			     "registering %" PRIu64
			     " bytes would exceed the client's limit of %" PRIu64 " bytes (%" PRIu64
			     " registered)",
			     length, cfg->max_registered_bytes, s->registered_bytes);
		return false;
	}
	if (s->share->regions >= cfg->per_uid_regions) {
		reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
			     "the clients of uid %u already have %u regions ([limits] "
			     "per_uid_regions)",
			     (unsigned)s->uid, s->share->regions);
		return false;
	}
	if (cfg->per_uid_registered_bytes < s->share->registered_bytes ||
	    length > cfg->per_uid_registered_bytes - s->share->registered_bytes) {
		reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
			     "registering %" PRIu64
			     " bytes would exceed the share of uid %u: %" PRIu64
			     " bytes ([limits] per_uid_registered_bytes, %" PRIu64 " registered)",
			     length, (unsigned)s->uid, cfg->per_uid_registered_bytes,
			     s->share->registered_bytes);
		return false;
	}
	return true;
}

static void reply_region(struct session *s, uint64_t seq, struct region *region,
			 const struct gpu_lease *lease);

/* REGION_GPU_DMABUF and REGION_GPU_CUDA_IPC (docs/gpu.md). */
static void handle_register_gpu(struct session *s, uint64_t seq,
				const Rdmax__V1__RegisterRegion *rr, const int *fds, size_t n_fds)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct gpu_reg_req req = {
		.kind = (enum region_kind)rr->kind,
		.fd = -1,
		.offset = rr->offset,
		.length = rr->length,
		.access = rr->access,
		.bus_id = rr->gpu_bus_id,
		.buffer_id = rr->has_gpu_buffer_id ? rr->gpu_buffer_id : 0,
		.ipc_handle = rr->has_cuda_ipc_handle ? rr->cuda_ipc_handle.data : NULL,
		.ipc_handle_len = rr->has_cuda_ipc_handle ? rr->cuda_ipc_handle.len : 0,
	};
	struct region *region;
	char why[320];
	int ret;

	/* A dma-buf registration without an fd names one the client sent before (buffer id). */
	if (rr->kind == RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF &&
	    (rr->has_fd_index || n_fds > 0)) {
		uint32_t idx = rr->has_fd_index ? rr->fd_index : 0;
		if (idx >= n_fds) {
			reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
				     "RegisterRegion names fd %u but the message carried %zu fds",
				     idx, n_fds);
			return;
		}
		req.fd = fds[idx]; /* closed with the message's other fds once this returns */
	}
	if (!region_limits_ok(s, seq, rr->length)) {
		return;
	}
	ret = gpu_register(daemon->gpu, &daemon->regions, &s->owner, &req, why, sizeof(why),
			   &region);
	if (ret < 0) {
		log_debug("client %" PRIu64 ": GPU region refused: %s", s->id, why);
		reply_status(s, seq, ret, "cannot register GPU region: %s", why);
		return;
	}
	reply_region(s, seq, region, NULL);
}

static void handle_pool_alloc(struct session *s, uint64_t seq, const Rdmax__V1__PoolAlloc *pa)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct gpu_lease lease;
	struct region *region;
	char why[320];
	int ret;

	if (!region_limits_ok(s, seq, pa->length)) {
		return;
	}
	ret = gpu_pool_alloc(daemon->gpu, &daemon->regions, &s->owner, pa->pool_id, pa->gpu_bus_id,
			     pa->length, pa->access, &lease, why, sizeof(why), &region);
	if (ret < 0) {
		reply_status(s, seq, ret, "cannot lease from a GPU pool: %s", why);
		return;
	}
	reply_region(s, seq, region, &lease);
}

static void handle_register(struct session *s, uint64_t seq, const Rdmax__V1__RegisterRegion *rr,
			    const int *fds, size_t n_fds)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct region *region;
	int ret;

	if (rr->kind == RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF ||
	    rr->kind == RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC) {
		handle_register_gpu(s, seq, rr, fds, n_fds);
		return;
	}
	if (rr->kind != RDMAX__V1__REGION_KIND__REGION_HOST_FD) {
		const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
			&rdmax__v1__region_kind__descriptor, rr->kind);
		if (v) {
			reply_status(
				s, seq, RDMAX_E_INVALID_ARGUMENT,
				"region kind %s cannot be registered (slices come from PoolAlloc)",
				v->name);
		} else {
			reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
				     "unknown region kind %d (this daemon knows REGION_HOST_FD, "
				     "REGION_GPU_DMABUF and REGION_GPU_CUDA_IPC)",
				     (int)rr->kind);
		}
		return;
	}
	uint32_t idx = rr->has_fd_index ? rr->fd_index : 0;
	if (idx >= n_fds) {
		reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
			     "RegisterRegion names fd %u but the message carried %zu fds", idx,
			     n_fds);
		return;
	}
	if (!region_limits_ok(s, seq, rr->length)) {
		return;
	}
	ret = region_register_host_fd(&daemon->regions, &s->owner, fds[idx], rr->offset, rr->length,
				      rr->access, &region);
	if (ret < 0) {
		const char *why = rdmax_strerror(ret);
		if (ret == RDMAX_E_PERMISSION_DENIED) {
			why = "the fd must be a memfd sealed with F_SEAL_SHRINK (and be writable "
			      "when "
			      "remote write access is asked)";
		} else if (ret == RDMAX_E_OUT_OF_RANGE) {
			why = "offset and length reach past the end of the file";
		} else if (ret == RDMAX_E_INVALID_ARGUMENT) {
			why = "zero length, unknown access bits, or not a regular file";
		}
		reply_status(s, seq, ret, "cannot register region: %s", why);
		return;
	}
	reply_region(s, seq, region, NULL);
}

/* A new region of this client: account for it and answer with its descriptor. */
static void reply_region(struct session *s, uint64_t seq, struct region *region,
			 const struct gpu_lease *lease)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	uint8_t desc[DESC_MAX_BYTES];

	list_add_tail(&s->regions, &region->owner_link);
	s->region_count++;
	s->registered_bytes += region->length;
	s->share->regions++;
	s->share->registered_bytes += region->length;

	int len = encode_desc(daemon, region, desc, sizeof(desc));
	if (len < 0) {
		reply_status(s, seq, len, "cannot encode the region's descriptor");
		s->region_count--;
		s->registered_bytes -= region->length;
		s->share->regions--;
		s->share->registered_bytes -= region->length;
		region_deregister(&daemon->regions, region, NULL, NULL);
		return;
	}
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__RegionReply reply = RDMAX__V1__REGION_REPLY__INIT;
	reply.region_id = region->id;
	reply.desc.data = desc;
	reply.desc.len = (size_t)len;
	reply.has_length = 1;
	reply.length = region->length;
	if (lease) {
		reply.has_cuda_ipc_handle = 1;
		reply.cuda_ipc_handle.data = (uint8_t *)lease->ipc_handle;
		reply.cuda_ipc_handle.len = sizeof(lease->ipc_handle);
		reply.has_pool_offset = 1;
		reply.pool_offset = lease->offset;
		reply.has_pool_id = 1;
		reply.pool_id = lease->pool_id;
		reply.gpu_bus_id = (char *)lease->bus_id;
	}
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_REGION;
	msg.region = &reply;
	log_debug("client %" PRIu64 " registered region %" PRIu64 " (%" PRIu64 " bytes, access %u)",
		  s->id, region->id, region->length, region->access);
	send_daemon_msg(s, &msg);
}

struct dereg_wait {
	struct session *session;
	uint64_t seq;
};

static void deregistered(struct region *region, void *arg)
{
	struct dereg_wait *wait = arg;

	if (wait->session) {
		reply_status(wait->session, wait->seq, 0, NULL);
	}
	free(wait);
}

static void handle_deregister(struct session *s, uint64_t seq, const Rdmax__V1__DeregisterRegion *d)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct region *region = region_find_owned(&daemon->regions, &s->owner, d->region_id);
	struct dereg_wait *wait;

	if (!region) {
		reply_status(s, seq, RDMAX_E_NOT_FOUND, "region %" PRIu64 " is not registered",
			     d->region_id);
		return;
	}
	wait = malloc(sizeof(*wait));
	if (!wait) {
		reply_status(s, seq, -ENOMEM, "out of memory");
		return;
	}
	wait->session = s;
	wait->seq = seq;
	names_unpublish_region(&s->ipc->names, &s->owner, region->id);
	s->region_count--;
	s->registered_bytes -= region->length;
	s->share->regions--;
	s->share->registered_bytes -= region->length;
	/* Replies now, or once the last job holding the region returned. */
	region_deregister(&daemon->regions, region, deregistered, wait);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * A job id already in flight, or twice in this Submit: the id that is in the
 * way (true), or false. Such a Submit is refused as a whole, so that no id
 * ever gets a second completion.
 */
static bool submit_has_duplicate(struct session *s, const Rdmax__V1__Submit *submit,
				 uint64_t *ret_id)
{
	uint64_t *ids;

	for (size_t i = 0; i < submit->n_jobs; i++) {
		if (engine_job_in_flight(&s->owner, submit->jobs[i]->job_id)) {
			*ret_id = submit->jobs[i]->job_id;
			return true;
		}
	}
	if (submit->n_jobs < 2) {
		return false;
	}
	ids = malloc(submit->n_jobs * sizeof(*ids));
	if (!ids) {
		return false; /* the engine still refuses an id in flight, without a completion */
	}
	for (size_t i = 0; i < submit->n_jobs; i++) {
		ids[i] = submit->jobs[i]->job_id;
	}
	qsort(ids, submit->n_jobs, sizeof(*ids), cmp_u64);
	for (size_t i = 1; i < submit->n_jobs; i++) {
		if (ids[i] == ids[i - 1]) {
			*ret_id = ids[i];
			free(ids);
			return true;
		}
	}
	free(ids);
	return false;
}

static void handle_submit(struct session *s, uint64_t seq, const Rdmax__V1__Submit *submit)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	uint64_t dup;

	if (submit->n_jobs > daemon->cfg.max_jobs_per_submit) {
		reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
			     "Submit carries %zu jobs; the limit is %u per message", submit->n_jobs,
			     daemon->cfg.max_jobs_per_submit);
		return;
	}
	if (submit_has_duplicate(s, submit, &dup)) {
		reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
			     "job id %" PRIu64 " is already in flight or appears twice in this "
			     "Submit; no job of it was started",
			     dup);
		return;
	}
	for (size_t i = 0; i < submit->n_jobs && session_live(s); i++) {
		if (engine_submit(daemon->engine, &s->owner, submit->jobs[i]) < 0) {
			/* Only without memory for the check above; the id keeps its one completion.
			 */
			log_warn("client %" PRIu64 ": job id %" PRIu64
				 " already in flight; dropped",
				 s->id, submit->jobs[i]->job_id);
		}
	}
}

static void handle_peer_group_create(struct session *s, uint64_t seq,
				     const Rdmax__V1__PeerGroupCreate *req)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__PeerGroupReply reply = RDMAX__V1__PEER_GROUP_REPLY__INIT;
	char why[RDMAX_MESSAGE_MAX];
	uint64_t handle;

	int ret = peer_group_create(s->ipc->daemon, &s->owner.groups, req->remote_descs,
				    req->n_remote_descs, &handle, why, sizeof(why));
	if (ret < 0) {
		reply_status(s, seq, ret, "cannot create the peer group: %s", why);
		return;
	}
	log_debug("client %" PRIu64 " created peer group %" PRIu64 " of %zu members", s->id, handle,
		  req->n_remote_descs);
	reply.peer_group = handle;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_PEER_GROUP;
	msg.peer_group = &reply;
	send_daemon_msg(s, &msg);
}

static void handle_mailbox_open(struct session *s, uint64_t seq, const char *name)
{
	int ret = mailbox_open(&s->ipc->mailboxes, &s->owner, name);

	switch (ret) {
	case 0:
		log_debug("client %" PRIu64 " opened mailbox '%s'", s->id, name);
		reply_status(s, seq, 0, NULL);
		break;
	case RDMAX_E_INVALID_ARGUMENT:
		reply_status(s, seq, ret,
			     "mailbox name '%.64s' is not valid: 1 to %u printable characters "
			     "without spaces",
			     name ? name : "", MAILBOX_NAME_MAX);
		break;
	case RDMAX_E_ALREADY_EXISTS:
		reply_status(s, seq, ret, "mailbox '%s' is already open on this node", name);
		break;
	case RDMAX_E_RESOURCE_EXHAUSTED:
		reply_status(s, seq, ret,
			     "too many mailboxes open (limits: %u per client, %u per node)",
			     MAILBOX_MAX_PER_CLIENT, MAILBOX_MAX_PER_NODE);
		break;
	default:
		reply_status(s, seq, ret, "cannot open mailbox: %s", rdmax_strerror(ret));
		break;
	}
}

/*
 * Mailbox delivery (mailbox_deliver_cb): one MailboxMessage event to the
 * owner. Refused, so the sender hears of it, rather than risk the owner's
 * session: when it does not read its events or the event would not fit its
 * message limit.
 */
static int deliver_message(void *owner, const char *name, const uint8_t *payload, size_t len,
			   const char *from_node)
{
	struct session *s = session_of(owner);
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__MailboxMessage ev = RDMAX__V1__MAILBOX_MESSAGE__INIT;

	if (!session_live(s)) {
		return RDMAX_E_NOT_FOUND;
	}
	if (s->queued_bytes + len > SESSION_MAX_QUEUED_BYTES / 2) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	ev.mailbox = (char *)name;
	ev.payload.data = (uint8_t *)payload;
	ev.payload.len = len;
	ev.from_node = (char *)(from_node ? from_node : "");
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_MAILBOX_MESSAGE;
	msg.mailbox_message = &ev;
	if (rdmax__v1__daemon_msg__get_packed_size(&msg) > s->ipc->tx_size) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	int ret = send_daemon_msg(s, &msg);
	return ret < 0 ? RDMAX_E_RESOURCE_EXHAUSTED : 0;
}

static void handle_publish(struct session *s, uint64_t seq, const Rdmax__V1__RegionPublish *rp)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct region *region = region_find_owned(&daemon->regions, &s->owner, rp->region_id);
	uint8_t desc[DESC_MAX_BYTES];

	if (!region || region->deregistering) {
		reply_status(s, seq, RDMAX_E_NOT_FOUND, "region %" PRIu64 " is not registered",
			     rp->region_id);
		return;
	}
	int len = encode_desc(daemon, region, desc, sizeof(desc));
	int ret = len < 0 ? len
			  : names_publish(&s->ipc->names, &s->owner, rp->name, region->id, desc,
					  (size_t)len);
	switch (ret) {
	case 0:
		log_debug("client %" PRIu64 " published region %" PRIu64 " as '%s'", s->id,
			  region->id, rp->name);
		reply_status(s, seq, 0, NULL);
		break;
	case RDMAX_E_INVALID_ARGUMENT:
		reply_status(s, seq, ret,
			     "region name '%.64s' is not valid: 1 to %u characters of A-Z a-z 0-9 "
			     ". _ : @ + / -",
			     rp->name ? rp->name : "", NAMES_NAME_MAX);
		break;
	case RDMAX_E_ALREADY_EXISTS:
		reply_status(s, seq, ret, "a region is already published as '%s' on this node",
			     rp->name);
		break;
	case RDMAX_E_RESOURCE_EXHAUSTED:
		reply_status(s, seq, ret,
			     "too many published names (limits: %u per client, %u per node)",
			     NAMES_MAX_PER_CLIENT, NAMES_MAX_PER_NODE);
		break;
	default:
		reply_status(s, seq, ret, "cannot publish region: %s", rdmax_strerror(ret));
		break;
	}
}

static void handle_lookup(struct session *s, uint64_t seq, const Rdmax__V1__Lookup *lk)
{
	char why[RDMAX_MESSAGE_MAX];
	int ret = discovery_lookup(s->ipc->daemon->discovery, &s->owner, seq, lk->node, lk->name,
				   lk->has_timeout_ms ? lk->timeout_ms : 0, why, sizeof(why));

	if (ret < 0) {
		reply_status(s, seq, ret, "%s", why);
	}
}

/* discovery_lookup_cb: the descriptor, or why there is none. */
void ipc_lookup_done(void *owner, uint64_t seq, int err, const char *message, const uint8_t *desc,
		     size_t desc_len)
{
	struct session *s = session_of(owner);
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__LookupReply reply = RDMAX__V1__LOOKUP_REPLY__INIT;

	if (s->closing) {
		return;
	}
	if (err < 0) {
		reply_status(s, seq, err, "%s", message ? message : rdmax_strerror(err));
		return;
	}
	reply.desc.data = (uint8_t *)desc;
	reply.desc.len = desc_len;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_LOOKUP;
	msg.lookup = &reply;
	send_daemon_msg(s, &msg);
}

static void add_node(void *arg, const struct discovery_node *node)
{
	Rdmax__V1__NodesReply *reply = arg;
	Rdmax__V1__NodeInfo *info = calloc(1, sizeof(*info));
	Rdmax__V1__Endpoint **eps = calloc(node->n_endpoints + 1, sizeof(*eps));
	Rdmax__V1__Endpoint *ep = calloc(node->n_endpoints + 1, sizeof(*ep));

	if (!info || !eps || !ep) {
		free(info);
		free(eps);
		free(ep);
		return;
	}
	rdmax__v1__node_info__init(info);
	info->name = (char *)node->name;
	info->instance_id = node->instance_id;
	info->alive = node->alive;
	info->has_age_ms = 1;
	info->age_ms = node->age_ms;
	for (uint32_t i = 0; i < node->n_endpoints; i++) {
		rdmax__v1__endpoint__init(&ep[i]);
		ep[i].transport = (Rdmax__V1__Transport)node->endpoints[i].transport;
		ep[i].addr = (char *)node->endpoints[i].addr;
		ep[i].port = node->endpoints[i].port;
		if (node->endpoints[i].device[0]) {
			ep[i].device = (char *)node->endpoints[i].device;
		}
		eps[i] = &ep[i];
	}
	info->n_endpoints = node->n_endpoints;
	info->endpoints = eps;
	reply->nodes[reply->n_nodes++] = info;
}

static void count_node(void *arg, const struct discovery_node *node)
{
	(*(size_t *)arg)++;
}

static void handle_nodes(struct session *s, uint64_t seq)
{
	const struct discovery *disc = s->ipc->daemon->discovery;
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__NodesReply reply = RDMAX__V1__NODES_REPLY__INIT;
	size_t n = 0;

	reply.discovery = discovery_for_each_node(disc, count_node, &n);
	reply.nodes = calloc(n + 1, sizeof(*reply.nodes));
	if (!reply.nodes) {
		reply_status(s, seq, -ENOMEM, "out of memory");
		return;
	}
	if (n) {
		discovery_for_each_node(disc, add_node, &reply);
	}
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_NODES;
	msg.nodes = &reply;
	if (rdmax__v1__daemon_msg__get_packed_size(&msg) > s->ipc->tx_size) {
		reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
			     "the list of %zu nodes does not fit one message", reply.n_nodes);
	} else {
		send_daemon_msg(s, &msg);
	}
	for (size_t i = 0; i < reply.n_nodes; i++) {
		if (reply.nodes[i]->n_endpoints) {
			free(reply.nodes[i]->endpoints[0]);
		}
		free(reply.nodes[i]->endpoints);
		free(reply.nodes[i]);
	}
	free(reply.nodes);
}

static void handle_job_status(struct session *s, uint64_t seq, const Rdmax__V1__JobStatusQuery *q)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__JobStatusReply reply = RDMAX__V1__JOB_STATUS_REPLY__INIT;
	uint64_t done = 0, total = 0;

	reply.job_id = q->job_id;
	reply.in_flight = engine_job_progress(s->ipc->daemon->engine, &s->owner, q->job_id, &done,
					      &total) == 0;
	if (reply.in_flight) {
		reply.has_bytes_done = 1;
		reply.bytes_done = done;
		reply.has_bytes_total = 1;
		reply.bytes_total = total;
	}
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_JOB_STATUS;
	msg.job_status = &reply;
	send_daemon_msg(s, &msg);
}

/* ------------------------------------------------------------------ ring */

static void handle_ring_setup(struct session *s, uint64_t seq, const Rdmax__V1__RingSetup *rs,
			      const int *fds, size_t n_fds)
{
	struct ipc *ipc = s->ipc;
	uint32_t idx = rs->has_fd_index ? rs->fd_index : 0;
	const char *why;
	int ret;

	if (s->ring.v.base) {
		reply_status(s, seq, RDMAX_E_ALREADY_EXISTS, "this client has a ring already");
		return;
	}
	if (idx >= n_fds) {
		reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
			     "RingSetup names fd %u but the message carried %zu fds", idx, n_fds);
		return;
	}
	ret = ring_map(fds[idx], rs->sq_entries, rs->sq_entry_bytes, rs->cq_entries, &s->ring);
	if (ret < 0) {
		switch (ret) {
		case RDMAX_E_INVALID_ARGUMENT:
			why = "sizes must be powers of two within the limits, the fd a regular "
			      "file";
			break;
		case RDMAX_E_PERMISSION_DENIED:
			why = "the fd must be a writable memfd sealed with F_SEAL_SHRINK and "
			      "F_SEAL_GROW";
			break;
		case RDMAX_E_OUT_OF_RANGE:
			why = "the file is smaller than the ring's sizes need";
			break;
		default:
			why = rdmax_strerror(ret);
			break;
		}
		reply_status(s, seq, ret, "cannot set up the ring (%u x %u B, %u completions): %s",
			     rs->sq_entries, rs->sq_entry_bytes, rs->cq_entries, why);
		return;
	}
	list_add_tail(&ipc->rings, &s->ring_link);
	s->ring_active_ns = now_ns();
	log_debug("client %" PRIu64 " opened a ring: %u x %u B submissions, %u completions", s->id,
		  rs->sq_entries, rs->sq_entry_bytes, rs->cq_entries);
	reply_status(s, seq, 0, NULL);
}

/*
 * Start the client's ring entries that are due (their `after` reached), at
 * most max. Returns how many were taken; a broken ring is marked for closing.
 */
static uint32_t ring_take(struct session *s, uint32_t max)
{
	struct ipc *ipc = s->ipc;
	uint32_t n = 0;
	int ret;

	while (n < max && s->ring.v.base && session_live(s) && !s->ring_bad && !s->paused) {
		int len = ring_sq_peek(&s->ring, s->msgs_received, ipc->ring_buf,
				       RDMAX_RING_MAX_SQE_BYTES);
		if (len == -EAGAIN) {
			break;
		}
		if (len < 0) {
			s->ring_bad = true;
			break;
		}
		ring_sq_consume(&s->ring);
		n++;
		Rdmax__V1__Job *job = rdmax__v1__job__unpack(NULL, (size_t)len, ipc->ring_buf);
		if (!job) {
			/* No job id to answer: the library never writes this. */
			s->ring_bad = true;
			break;
		}
		ret = engine_submit(ipc->daemon->engine, &s->owner, job);
		rdmax__v1__job__free_unpacked(job, NULL);
		if (ret < 0) {
			/* The library never reuses an id in flight; there is no seq to answer. */
			s->ring_bad = true;
			break;
		}
	}
	if (n) {
		s->ring_active_ns = now_ns();
	}
	return n;
}

/*
 * Daemon shutdown: entries still in a ring were submitted as far as the
 * client knows; each gets its CANCELLED completion instead of a start.
 */
static void ring_cancel_pending(struct session *s)
{
	struct ipc *ipc = s->ipc;

	for (uint32_t i = 0; s->ring.v.base && !s->closing && i < s->ring.v.sq_entries; i++) {
		int len =
			ring_sq_peek(&s->ring, UINT64_MAX, ipc->ring_buf, RDMAX_RING_MAX_SQE_BYTES);
		if (len < 0) {
			break;
		}
		ring_sq_consume(&s->ring);
		Rdmax__V1__Job *job = rdmax__v1__job__unpack(NULL, (size_t)len, ipc->ring_buf);
		if (job) {
			ipc_job_completed(&s->owner, job->job_id, RDMAX_E_CANCELLED,
					  "daemon shutting down", 0);
			rdmax__v1__job__free_unpacked(job, NULL);
		}
	}
}

/*
 * From the uv_check handle: take what the clients' rings hold; a ring with
 * no entry taken and no completion posted for busy_poll_us goes to sleep and
 * waits for a doorbell.
 */
static void poll_rings(struct ipc *ipc)
{
	uint64_t window = (uint64_t)ipc->daemon->cfg.busy_poll_us * 1000;
	struct list_node *pos, *tmp;
	uint64_t now = 0;

	list_for_each_safe(pos, tmp, &ipc->rings)
	{
		struct session *s = container_of(pos, struct session, ring_link);
		if (!s->ring.sleeping) {
			/*
			 * Not kept awake by jobs in flight: a large job completes
			 * milliseconds apart, and spinning through that costs a core
			 * (main.c's window follows the same rule). A completion posted
			 * to the ring restarts the window.
			 */
			if (ring_take(s, RING_POLL_MAX) == 0 && !s->ring_bad) {
				now = now ? now : now_ns();
				if (now - s->ring_active_ns >= window && !ring_sleep(&s->ring)) {
					s->ring_active_ns = now;
				}
			}
		}
		if (s->ring_bad && session_live(s)) {
			static struct log_ratelimit rl;
			log_ratelimited(&rl, LOG_WARNING,
					"client %" PRIu64 " '%s' (pid %d) broke its shared-memory "
					"ring (index or entry out of range); closing it",
					s->id, s->name, (int)s->pid);
			reply_status(s, 0, RDMAX_E_PROTOCOL_ERROR,
				     "the shared-memory ring holds an impossible index or entry "
				     "(or a job id already in flight); closing the connection");
			flush_completions(s);
			session_close(s, "ring protocol violation");
		}
	}
}

bool ipc_rings_awake(const struct ipc *ipc)
{
	const struct list_node *pos;

	if (!ipc) {
		return false;
	}
	for (pos = ipc->rings.next; pos != &ipc->rings; pos = pos->next) {
		const struct session *s = container_of(pos, struct session, ring_link);
		if (!s->ring.sleeping) {
			return true;
		}
	}
	return false;
}

static void dispatch(struct session *s, const Rdmax__V1__ClientMsg *m, const int *fds, size_t n_fds)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	uint64_t seq = m->has_seq ? m->seq : 0;
	int ret;

	if (!s->hello_done && m->body_case != RDMAX__V1__CLIENT_MSG__BODY_HELLO) {
		reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR, "the first message must be Hello");
		s->close_after_flush = true;
		return;
	}
	switch (m->body_case) {
	case RDMAX__V1__CLIENT_MSG__BODY_HELLO:
		handle_hello(s, seq, m->hello);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION:
		handle_register(s, seq, m->register_region, fds, n_fds);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION:
		handle_deregister(s, seq, m->deregister_region);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_SUBMIT:
		handle_submit(s, seq, m->submit);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM:
		ret = imm_expect(&daemon->imm, &s->owner, m->expect_imm->imm, m->expect_imm->count,
				 m->expect_imm->has_reset && m->expect_imm->reset);
		if (ret == RDMAX_E_RESOURCE_EXHAUSTED) {
			reply_status(s, seq, ret,
				     "every imm counter this uid may hold is claimed ([limits] "
				     "per_uid_imm_counters, max_imm_counters)");
		} else if (ret < 0) {
			reply_status(s, seq, ret, "ExpectImm refused: %s", rdmax_strerror(ret));
		} else {
			reply_status(s, seq, 0, NULL);
		}
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_CANCEL:
		ret = engine_cancel(daemon->engine, &s->owner, m->cancel->job_id);
		reply_status(s, seq, ret, ret ? "job %" PRIu64 " is not in flight" : NULL,
			     m->cancel->job_id);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS:
		handle_job_status(s, seq, m->job_status);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE:
		handle_peer_group_create(s, seq, m->peer_group_create);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_DESTROY:
		ret = peer_group_destroy(&s->owner.groups, m->peer_group_destroy->peer_group);
		reply_status(s, seq, ret, ret ? "peer group %" PRIu64 " does not exist" : NULL,
			     m->peer_group_destroy->peer_group);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN:
		handle_mailbox_open(s, seq, m->mailbox_open->name);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_CLOSE:
		ret = mailbox_close(&s->ipc->mailboxes, &s->owner, m->mailbox_close->name);
		reply_status(s, seq, ret, ret ? "this client has no mailbox '%.64s' open" : NULL,
			     m->mailbox_close->name);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_POOL_ALLOC:
		handle_pool_alloc(s, seq, m->pool_alloc);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP:
		handle_ring_setup(s, seq, m->ring_setup, fds, n_fds);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_REGION_PUBLISH:
		handle_publish(s, seq, m->region_publish);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_REGION_UNPUBLISH:
		ret = names_unpublish(&s->ipc->names, &s->owner, m->region_unpublish->name);
		reply_status(s, seq, ret, ret ? "this client published no region as '%.64s'" : NULL,
			     m->region_unpublish->name);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_LOOKUP:
		handle_lookup(s, seq, m->lookup);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_NODES:
		handle_nodes(s, seq);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_RING_DOORBELL:
		/* Reading the datagram already woke the ring and took its entries. */
		break;
	default:
		reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR, "message has no body");
		break;
	}
}

/* ------------------------------------------------------------------ reading */

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
		reply_status(s, 0, RDMAX_E_PROTOCOL_ERROR,
			     "empty datagram: every message must carry a ClientMsg with a body%s",
			     s->hello_done ? "" : "; closing the connection");
		s->close_after_flush = !s->hello_done;
		return 1;
	}
	if (s->ring.v.base) {
		/* Entries written before this datagram was sent go first. */
		ring_wake(&s->ring);
		ring_take(s, UINT32_MAX);
		s->ring_active_ns = now_ns();
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
		reply_status(s, 0, RDMAX_E_RESOURCE_EXHAUSTED,
			     "message larger than the limit of %u bytes; closing the connection",
			     cfg->max_message_bytes);
		s->close_after_flush = true;
		return 1;
	}
	if ((mh.msg_flags & MSG_CTRUNC) || n_fds > cfg->max_fds_per_message) {
		close_fds(fds, n_fds);
		reply_status(s, 0, RDMAX_E_RESOURCE_EXHAUSTED,
			     "message carried more than %u fds; closing the connection",
			     cfg->max_fds_per_message);
		s->close_after_flush = true;
		return 1;
	}
	Rdmax__V1__ClientMsg *m = rdmax__v1__client_msg__unpack(NULL, (size_t)n, ipc->rx_buf);
	if (!m) {
		close_fds(fds, n_fds);
		/* Before Hello nothing shows the peer speaks this protocol at all. */
		reply_status(s, 0, RDMAX_E_PROTOCOL_ERROR,
			     "cannot decode a %zd-byte message as rdmax.v1.ClientMsg%s", n,
			     s->hello_done ? "" : " (before Hello); closing the connection");
		s->close_after_flush = !s->hello_done;
		return 1;
	}
	dispatch(s, m, fds, n_fds);
	/* The daemon keeps no client fd: regions hold their own mapping. */
	close_fds(fds, n_fds);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	return 1;
}

static void flush_out_queue(struct session *s)
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
		list_del(&m->link);
		free(m);
		if (s->paused && s->queued_bytes < SESSION_PAUSE_QUEUED_BYTES / 2) {
			break; /* read requests again while the rest drains */
		}
	}
	session_poll_update(s);
}

static void session_io(uv_poll_t *poll, int status, int events);

static void session_io(uv_poll_t *poll, int status, int events)
{
	struct session *s = poll->data;

	if (status < 0) {
		session_close(s, uv_strerror(status));
		return;
	}
	if (events & UV_WRITABLE) {
		flush_out_queue(s);
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
			flush_completions(s);
			session_close(s, "protocol violation");
			return;
		}
	}
	if (s->doomed) {
		session_close(s, s->doom_why); /* at the top of a callback: safe now */
	}
}

/* ---------------------------------------------------------------- sessions */

static void session_freed(uv_handle_t *handle)
{
	struct session *s = handle->data;

	free(s->completions);
	free(s);
}

static void session_close(struct session *s, const char *why)
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
		flush_completions(s);
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
		reply_status(s, 0, RDMAX_E_TIMEOUT,
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
	if (!ipc->rx_buf || !ipc->tx_buf || !ipc->ring_buf) {
		ret = -ENOMEM;
		goto out_free;
	}
	ret = mailbox_table_init(&ipc->mailboxes, deliver_message);
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
	uv_check_start(&ipc->flush_check, flush_dirty);
	uv_idle_init(daemon->loop, &ipc->doom_idle);
	ipc->doom_idle.data = ipc;
	uv_timer_init(daemon->loop, &ipc->hello_timer);
	ipc->hello_timer.data = ipc;
	/* A sweep over at most max_clients sessions; a quarter of the timeout late at most. */
	uint64_t sweep = MAX(cfg->hello_timeout_ms / 4, 25);
	uv_timer_start(&ipc->hello_timer, hello_deadline, sweep, sweep);
	uv_unref((uv_handle_t *)&ipc->hello_timer);
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
	close(ipc->listen_fd);
	if (!ipc->inherited) {
		unlink(ipc->daemon->cfg.socket_path);
	}
	list_for_each_safe(pos, tmp, &ipc->sessions)
	{
		struct session *s = container_of(pos, struct session, link);
		ring_cancel_pending(s);
		/* Best effort: the CANCELLED completions are already batched. */
		flush_completions(s);
		flush_out_queue(s);
		session_close(s, s->doomed ? s->doom_why : "daemon shutting down");
	}
	uv_idle_stop(&ipc->doom_idle);
	uv_close((uv_handle_t *)&ipc->doom_idle, NULL);
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
