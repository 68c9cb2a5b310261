/* SPDX-License-Identifier: MIT */
/*
 * The sessions' side of the shared-memory rings (RingSetup; ring.c maps
 * and reads them): jobs arrive as ring entries, taken from the uv_check
 * handle and from the daemon's spin (ipc_poll_pass) for a bounded window
 * after the last activity (then the ring sleeps until a doorbell), at most
 * RING_POLL_MAX per client per pass. A ring that
 * holds an impossible index or entry closes its session; nothing read from
 * the shared memory is trusted, and entries left at shutdown are cancelled.
 */
#include <inttypes.h>

#include "ipc.h"
#include "job_codec.h"
#include "log.h"
#include "rdmax.h"
#include "session_internal.h"

void ipc_handle_ring_setup(struct session *s, uint64_t seq, const Rdmax__V1__RingSetup *rs,
			   const int *fds, size_t n_fds)
{
	struct ipc *ipc = s->ipc;
	uint32_t idx = rs->has_fd_index ? rs->fd_index : 0;
	const char *why;
	int ret;

	if (s->ring.v.base) {
		ipc_reply_status(s, seq, RDMAX_E_ALREADY_EXISTS, "this client has a ring already");
		return;
	}
	if (idx >= n_fds) {
		ipc_reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
				 "RingSetup names fd %u but the message carried %zu fds", idx,
				 n_fds);
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
		ipc_reply_status(s, seq, ret,
				 "cannot set up the ring (%u x %u B, %u completions): %s",
				 rs->sq_entries, rs->sq_entry_bytes, rs->cq_entries, why);
		return;
	}
	list_add_tail(&ipc->rings, &s->ring_link);
	s->ring_active_ns = now_ns();
	log_debug("client %" PRIu64 " opened a ring: %u x %u B submissions, %u completions", s->id,
		  rs->sq_entries, rs->sq_entry_bytes, rs->cq_entries);
	ipc_reply_status(s, seq, 0, NULL);
}

/*
 * The entry in ipc->ring_buf as a Job: a plain write or read straight from
 * the bytes (into `fast`, pointing into ring_buf), anything else through
 * protobuf-c into the arena. No malloc or free per entry either way; the
 * caller resets the arena once done with the Job.
 */
static Rdmax__V1__Job *unpack_entry(struct ipc *ipc, size_t len, struct job_codec_msg *fast)
{
	if (job_codec_unpack(ipc->ring_buf, len, fast)) {
		return &fast->job;
	}
	return rdmax__v1__job__unpack(arena_pb_allocator(&ipc->ring_arena), len, ipc->ring_buf);
}

/* The ring moved at about \p now (a recent now_ns() reading, 0: read it). */
void ipc_ring_active(struct session *s, uint64_t now)
{
	now = now ? now : now_ns();
	if (now > s->ring_active_ns) {
		s->ring_active_ns = now;
	}
}

/*
 * Start the client's ring entries that are due (their `after` reached), at
 * most max. Returns how many were taken; a broken ring is marked for closing.
 * now: as for ipc_ring_active().
 */
uint32_t ipc_ring_take(struct session *s, uint32_t max, uint64_t now)
{
	struct ipc *ipc = s->ipc;
	struct job_codec_msg fast;
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
		Rdmax__V1__Job *job = unpack_entry(ipc, (size_t)len, &fast);
		if (!job) {
			arena_reset(&ipc->ring_arena);
			/* No job id to answer: the library never writes this. */
			s->ring_bad = true;
			break;
		}
		ret = engine_submit(ipc->daemon->engine, &s->owner, job);
		arena_reset(&ipc->ring_arena);
		if (ret < 0) {
			/* The library never reuses an id in flight; there is no seq to answer. */
			s->ring_bad = true;
			break;
		}
	}
	if (n) {
		ipc_ring_active(s, now);
	}
	return n;
}

/*
 * Daemon shutdown: entries still in a ring were submitted as far as the
 * client knows; each gets its CANCELLED completion instead of a start.
 */
void ipc_ring_cancel_pending(struct session *s)
{
	struct ipc *ipc = s->ipc;

	for (uint32_t i = 0; s->ring.v.base && !s->closing && i < s->ring.v.sq_entries; i++) {
		int len =
			ring_sq_peek(&s->ring, UINT64_MAX, ipc->ring_buf, RDMAX_RING_MAX_SQE_BYTES);
		if (len < 0) {
			break;
		}
		ring_sq_consume(&s->ring);
		struct job_codec_msg fast;
		Rdmax__V1__Job *job = unpack_entry(ipc, (size_t)len, &fast);
		if (job) {
			ipc_job_completed(&s->owner, job->job_id, RDMAX_E_CANCELLED,
					  "daemon shutting down", 0);
		}
		arena_reset(&ipc->ring_arena);
	}
}

/*
 * From ipc_poll_pass: take what the clients' rings hold; a ring with
 * no entry taken and no completion posted for busy_poll_us goes to sleep and
 * waits for a doorbell. now: the caller's recent clock reading, or 0 to read
 * it here when needed (a clock read costs more than a pass over the rings).
 */
uint32_t ipc_poll_rings(struct ipc *ipc, uint64_t now)
{
	uint64_t window = (uint64_t)ipc->daemon->cfg.busy_poll_us * 1000;
	struct list_node *pos, *tmp;
	uint32_t taken = 0;

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
			uint32_t n = ipc_ring_take(s, RING_POLL_MAX, now);
			taken += n;
			/* Completions posted since the last pass count when it ends. */
			if (n == 0 && !s->ring_bad && !s->ring_posted) {
				now = now ? now : now_ns();
				/* A caller's reading may predate this ring's last activity. */
				if (now >= s->ring_active_ns && now - s->ring_active_ns >= window &&
				    !ring_sleep(&s->ring)) {
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
			ipc_reply_status(
				s, 0, RDMAX_E_PROTOCOL_ERROR,
				"the shared-memory ring holds an impossible index or entry "
				"(or a job id already in flight); closing the connection");
			ipc_flush_completions(s);
			session_close(s, "ring protocol violation");
		}
	}
	return taken;
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

/*
 * The loop is about to sleep through copies on I/O threads: every ring
 * asks its client for a doorbell instead of being polled. Returns false
 * when a ring stays awake because entries arrived meanwhile (take them
 * first).
 */
bool ipc_rings_sleep(struct ipc *ipc)
{
	struct list_node *pos;
	bool asleep = true;

	if (!ipc) {
		return true;
	}
	for (pos = ipc->rings.next; pos != &ipc->rings; pos = pos->next) {
		struct session *s = container_of(pos, struct session, ring_link);
		if (!s->ring.sleeping && !s->ring_bad && !ring_sleep(&s->ring)) {
			asleep = false;
		}
	}
	return asleep;
}
