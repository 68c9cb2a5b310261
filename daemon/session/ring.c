/* SPDX-License-Identifier: MIT */
/*
 * The daemon's side of a client's shared-memory ring: validating and mapping
 * the client's memfd, taking submission entries, posting completions, and
 * the sleep/wake flags. Owns only its view of the ring (its private indices
 * and the mapping); never touches sockets or the engine.
 *
 * The client can rewrite the shared memory at any time, so: every shared
 * index is loaded once and bounded against the private one, every entry is
 * copied out before anything looks at it, lengths come from the copy and are
 * checked against the slot, and the daemon's own indices are never read
 * back from shared memory. A lying client can only break its own session.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rdmax.h"
#include "ring.h"

int ring_map(int fd, uint32_t sq_entries, uint32_t sqe_bytes, uint32_t cq_entries,
	     struct ring *ret_ring)
{
	const int need_seals = F_SEAL_SHRINK | F_SEAL_GROW;
	struct stat st;
	void *base;

	if (!rdmax_ring_sizes_ok(sq_entries, sqe_bytes, cq_entries)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/* A file the client could shrink would fault the daemon's loads (SIGBUS). */
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & need_seals) != need_seals) {
		return RDMAX_E_PERMISSION_DENIED;
	}
	size_t len = rdmax_ring_bytes(sq_entries, sqe_bytes, cq_entries);
	if (st.st_size < 0 || (uint64_t)st.st_size < len) {
		return RDMAX_E_OUT_OF_RANGE;
	}
	base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		/* Read-only fd, or sealed against writes. */
		return RDMAX_E_PERMISSION_DENIED;
	}
	struct ring r = {.v = rdmax_ring_view_of(base, sq_entries, sqe_bytes, cq_entries)};
	atomic_store_explicit(&r.v.ctl->sq_head, 0, memory_order_relaxed);
	atomic_store_explicit(&r.v.ctl->cq_tail, 0, memory_order_relaxed);
	atomic_store_explicit(&r.v.ctl->daemon_flags, 0, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	*ret_ring = r;
	return 0;
}

void ring_unmap(struct ring *ring)
{
	if (!ring || !ring->v.base) {
		return;
	}
	munmap(ring->v.base, ring->v.map_len);
	memset(ring, 0, sizeof(*ring));
}

uint32_t ring_sq_pending(const struct ring *ring)
{
	uint32_t tail = atomic_load_explicit(&ring->v.ctl->sq_tail, memory_order_acquire);
	uint32_t n = tail - ring->sq_head;

	return n > ring->v.sq_entries ? 0 : n;
}

int ring_sq_peek(struct ring *ring, uint64_t msgs_received, uint8_t *buf, size_t buf_size)
{
	uint32_t tail = atomic_load_explicit(&ring->v.ctl->sq_tail, memory_order_acquire);
	uint32_t avail = tail - ring->sq_head;
	struct rdmax_ring_sqe hdr;

	if (avail == 0) {
		return -EAGAIN;
	}
	if (avail > ring->v.sq_entries) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	const uint8_t *slot =
		ring->v.sq + (size_t)(ring->sq_head & (ring->v.sq_entries - 1)) * ring->v.sqe_bytes;
	/* One copy of the header: later rewrites by the client cannot change what we use. */
	memcpy(&hdr, slot, sizeof(hdr));
	if (hdr.len > ring->v.sqe_bytes - RDMAX_RING_SQE_HDR || hdr.len > buf_size ||
	    hdr.len > INT32_MAX) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if (hdr.after > msgs_received) {
		return -EAGAIN; /* a request sent before this entry is still in the socket */
	}
	memcpy(buf, slot + RDMAX_RING_SQE_HDR, hdr.len);
	return (int)hdr.len;
}

void ring_sq_consume(struct ring *ring)
{
	ring->sq_head++;
	atomic_store_explicit(&ring->v.ctl->sq_head, ring->sq_head, memory_order_release);
}

int ring_cq_post(struct ring *ring, uint64_t job_id, int status, uint64_t bytes,
		 const char *message, uint64_t after)
{
	/* Acquire: the client has finished reading the slots it gave back. */
	uint32_t head = atomic_load_explicit(&ring->v.ctl->cq_head, memory_order_acquire);
	uint32_t used = ring->cq_tail - head;

	if (used > ring->v.cq_entries) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if (used == ring->v.cq_entries) {
		return -ENOSPC;
	}
	struct rdmax_ring_cqe *e = &ring->v.cq[ring->cq_tail & (ring->v.cq_entries - 1)];
	size_t msg_len = message ? strnlen(message, RDMAX_RING_CQE_MESSAGE) : 0;
	e->job_id = job_id;
	e->bytes = bytes;
	e->after = after;
	e->status = status;
	e->msg_len = (uint16_t)msg_len;
	e->pad = 0;
	if (msg_len) {
		memcpy(e->message, message, msg_len);
	}
	ring->cq_tail++;
	atomic_store_explicit(&ring->v.ctl->cq_tail, ring->cq_tail, memory_order_release);
	return 0;
}

void ring_report_sent(struct ring *ring, uint64_t msgs_sent)
{
	atomic_store_explicit(&ring->v.ctl->msgs_sent, msgs_sent, memory_order_release);
}

void ring_report_notifies(struct ring *ring, uint64_t notifies_sent)
{
	atomic_store_explicit(&ring->v.ctl->notifies_sent, notifies_sent, memory_order_release);
}

bool ring_client_sent_all(const struct ring *ring, uint64_t received)
{
	return atomic_load_explicit(&ring->v.ctl->client_msgs_sent, memory_order_relaxed) ==
	       received;
}

/*
 * The wake-up handshake, and why sparing a RingNotify loses none.
 *
 * Client, before it sleeps: store WAKE in client_flags; seq_cst fence; load
 * cq_tail (acquire) and take what it finds; sleep on the socket only if
 * nothing was there. Daemon, after posting: store cq_tail (release, in
 * ring_cq_post); seq_cst fence (here); load client_flags. By the two fences
 * at least one side sees the other's store: either the client sees the new
 * completion before sleeping, or the daemon sees WAKE.
 *
 * Seeing WAKE, the daemon loads cq_head (acquire). The client stores cq_head
 * only after reading the entries before it, so cq_head equal to our own
 * cq_tail means every completion posted so far has been read: the client,
 * whether awake or about to sleep, waits for nothing we posted, and a
 * RingNotify would only cost both sides a system call. Then the request is
 * left set, so the next post (which runs this check again) wakes it. Any
 * other cq_head (older, or garbage from a hostile client) takes the request
 * and sends: a stale cq_head can only cost a RingNotify the client did not
 * need, never one it needs. The request is cleared only when a RingNotify
 * follows, which is what the library's ring_unwake() relies on to know
 * whether one is on its way.
 */
enum ring_wake_request ring_take_wake_request(struct ring *ring)
{
	/* Pairs with the client's fence between setting the flag and reading cq_tail. */
	atomic_thread_fence(memory_order_seq_cst);
	if (!(atomic_load_explicit(&ring->v.ctl->client_flags, memory_order_relaxed) &
	      RDMAX_RING_CLIENT_WAKE)) {
		return RING_WAKE_NONE;
	}
	if (atomic_load_explicit(&ring->v.ctl->cq_head, memory_order_acquire) == ring->cq_tail) {
		return RING_WAKE_SPARED;
	}
	atomic_fetch_and_explicit(&ring->v.ctl->client_flags, ~RDMAX_RING_CLIENT_WAKE,
				  memory_order_relaxed);
	return RING_WAKE_TAKEN;
}

bool ring_sleep(struct ring *ring)
{
	atomic_store_explicit(&ring->v.ctl->daemon_flags, RDMAX_RING_DAEMON_SLEEPING,
			      memory_order_relaxed);
	/* Pairs with the client's fence between publishing its tail and reading the flag. */
	atomic_thread_fence(memory_order_seq_cst);
	uint32_t tail = atomic_load_explicit(&ring->v.ctl->sq_tail, memory_order_acquire);
	if (tail != ring->sq_head) {
		atomic_store_explicit(&ring->v.ctl->daemon_flags, 0, memory_order_relaxed);
		return false;
	}
	ring->sleeping = true;
	return true;
}

void ring_wake(struct ring *ring)
{
	if (ring->sleeping) {
		ring->sleeping = false;
		atomic_store_explicit(&ring->v.ctl->daemon_flags, 0, memory_order_relaxed);
	}
}
