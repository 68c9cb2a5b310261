/* SPDX-License-Identifier: MIT */
/*
 * Private to daemon/session/ipc*.c: the session and ipc structures and the
 * calls the client-socket files make into each other. Nothing outside
 * daemon/session/ includes it; the rest of the daemon sees ipc.h only.
 */
#ifndef RDMAXD_SESSION_INTERNAL_H
#define RDMAXD_SESSION_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "arena.h"
#include "engine.h"
#include "listen_backoff.h"
#include "mailbox.h"
#include "names.h"
#include "rdmax.pb-c.h"
#include "rdmaxd.h"
#include "ring.h"

/* Bytes a client may leave unread before the daemon drops it. */
#define SESSION_MAX_QUEUED_BYTES (64u << 20)
/*
 * Back-pressure: while this much waits for a client to read, the daemon reads
 * no more of its requests (nor ring entries), so a client that never reads
 * can only have its outstanding jobs' completions queued, not more.
 */
#define SESSION_PAUSE_QUEUED_BYTES (4u << 20)
/*
 * After a client left, free heap pages go back to the system this much later
 * (one malloc_trim() for any number of departures meanwhile): the small
 * allocations of a client's backlog leave the heap fragmented, and glibc
 * only returns its top on its own (docs/reliability.md, "Soak").
 */
#define SESSION_TRIM_DELAY_MS 1000
/* Completions per Completions message at most. */
#define COMPLETION_BATCH_MAX 1024u
#define MAX_FDS_HARD         253
/* Ring entries taken per client per loop turn, so other clients get theirs. */
#define RING_POLL_MAX 256u
/*
 * The arena a ring entry is unpacked into: twice the largest entry, so any
 * job the library writes decodes without malloc (inputs that unpack larger,
 * such as many empty repeated messages, spill to malloc for that entry).
 */
#define IPC_RING_ARENA_BYTES (2u * RDMAX_RING_MAX_SQE_BYTES)

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
	uint32_t mailboxes;    /* open in its namespace (mailbox.c counts them) */
	uint64_t queued_bytes; /* replies and events its clients have not read yet */
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
	uint64_t notifies_sent; /* RingNotify datagrams, published in the ring (CAP_RING_COUNTS) */
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
	/*
	 * Active while dirty is not empty: completions delivered after this
	 * turn's flush_check (a transport's own check handle, a timer) keep the
	 * loop from sleeping in epoll before the next pass sends them.
	 */
	uv_idle_t flush_idle;
	struct list_node sessions;
	struct list_node dirty;
	struct list_node rings;  /* sessions with a mapped ring */
	uint8_t *ring_buf;       /* one submission entry, copied out of shared memory */
	struct arena ring_arena; /* that entry's Job, unpacked; reset per entry */
	uint32_t n_sessions;
	uint64_t next_session_id;
	struct list_node doomed; /* sessions to close at the next turn */
	uv_idle_t doom_idle;     /* runs that turn */
	uv_timer_t hello_timer;  /* closes connections that sent no Hello in time */
	uv_timer_t trim_timer;   /* gives free heap pages back after clients left */
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

/* A DeregisterRegion waiting for the region's last job (ipc_requests.c). */
struct dereg_wait {
	struct session *session; /* NULL once the session closed */
	uint64_t seq;
};

static inline struct session *session_of(void *owner)
{
	return container_of((struct job_owner *)owner, struct session, owner);
}

/* Whether the session still takes requests and events. */
static inline bool session_live(const struct session *s)
{
	return !s->closing && !s->doomed;
}

/* ipc.c: session lifetime. */
void session_close(struct session *s, const char *why);
void session_doom(struct session *s, const char *why);
void session_poll_update(struct session *s);

/* ipc_send.c: replies, events and completion batches. */
int ipc_send_msg(struct session *s, const Rdmax__V1__DaemonMsg *msg);
void ipc_reply_status(struct session *s, uint64_t seq, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void ipc_flush_completions(struct session *s);
void ipc_flush_dirty(uv_check_t *check);
void ipc_flush_dirty_idle(uv_idle_t *idle);

/* ipc_requests.c: one decoded ClientMsg; mailbox delivery. */
void ipc_dispatch(struct session *s, const Rdmax__V1__ClientMsg *m, const int *fds, size_t n_fds);
int ipc_encode_desc(struct rdmaxd *daemon, const struct region *region, uint8_t *buf, size_t size);
int ipc_deliver_message(void *owner, const char *name, const uint8_t *payload, size_t len,
			const char *from_node);

/* ipc_names.c: named regions, lookups, the node list. */
void ipc_handle_publish(struct session *s, uint64_t seq, const Rdmax__V1__RegionPublish *rp);
void ipc_handle_lookup(struct session *s, uint64_t seq, const Rdmax__V1__Lookup *lk);
void ipc_handle_nodes(struct session *s, uint64_t seq);

/* ipc_ring.c: the shared-memory ring. */
void ipc_handle_ring_setup(struct session *s, uint64_t seq, const Rdmax__V1__RingSetup *rs,
			   const int *fds, size_t n_fds);
void ipc_ring_active(struct session *s, uint64_t now);
uint32_t ipc_ring_take(struct session *s, uint32_t max, uint64_t now);
void ipc_ring_cancel_pending(struct session *s);
uint32_t ipc_poll_rings(struct ipc *ipc, uint64_t now);

/* ipc_read.c: the session's socket. */
/* uv_poll_start() replaces the callback too: every restart must name it. */
void session_io(uv_poll_t *poll, int status, int events);
void ipc_flush_out_queue(struct session *s);

#endif
