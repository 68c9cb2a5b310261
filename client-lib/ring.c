/* SPDX-License-Identifier: MIT */
/*
 * librdmax's side of the shared-memory submission/completion ring
 * (proto/rdmax_ring.h): the sealed memfd, the library's indices and the
 * wake flags. Plain memory work: this file never touches the socket, never
 * blocks and never allocates after creation.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "rdmax_ring.h"

int client_ring_create(uint32_t sq_entries, uint32_t sqe_bytes, uint32_t cq_entries,
		       struct client_ring *ret_ring, int *ret_fd)
{
	struct client_ring r;
	int fd, err;

	if (!rdmax_ring_sizes_ok(sq_entries, sqe_bytes, cq_entries)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	size_t len = rdmax_ring_bytes(sq_entries, sqe_bytes, cq_entries);
	fd = memfd_create("rdmax-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		return -errno;
	}
	if (ftruncate(fd, (off_t)len) < 0) {
		err = -errno;
		goto out_close;
	}
	/* The daemon maps it too: it must never shrink under that mapping. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		err = -errno;
		goto out_close;
	}
	void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		err = -errno;
		goto out_close;
	}
	memset(&r, 0, sizeof(r));
	r.v = rdmax_ring_view_of(base, sq_entries, sqe_bytes, cq_entries);
	/* Until a call spins on the ring, whoever waits sleeps on the socket. */
	atomic_store_explicit(&r.v.ctl->client_flags, RDMAX_RING_CLIENT_WAKE, memory_order_relaxed);
	*ret_ring = r;
	*ret_fd = fd;
	return 0;

out_close:
	close(fd);
	return err;
}

void client_ring_destroy(struct client_ring *ring)
{
	if (!ring || !ring->v.base) {
		return;
	}
	munmap(ring->v.base, ring->v.map_len);
	memset(ring, 0, sizeof(*ring));
}

uint32_t client_ring_sq_space(const struct client_ring *ring)
{
	uint32_t head = atomic_load_explicit(&ring->v.ctl->sq_head, memory_order_acquire);
	uint32_t used = ring->sq_tail - head;

	return used >= ring->v.sq_entries ? 0 : ring->v.sq_entries - used;
}

uint32_t client_ring_sqe_max(const struct client_ring *ring)
{
	return ring->v.sqe_bytes - RDMAX_RING_SQE_HDR;
}

uint8_t *client_ring_sqe_prepare(struct client_ring *ring, uint32_t i, uint32_t len, uint64_t after)
{
	uint8_t *slot = ring->v.sq + (size_t)((ring->sq_tail + i) & (ring->v.sq_entries - 1)) *
					     ring->v.sqe_bytes;
	struct rdmax_ring_sqe hdr = {.len = len, .flags = 0, .after = after};

	memcpy(slot, &hdr, sizeof(hdr));
	return slot + RDMAX_RING_SQE_HDR;
}

bool client_ring_sq_publish(struct client_ring *ring, uint32_t n)
{
	ring->sq_tail += n;
	atomic_store_explicit(&ring->v.ctl->sq_tail, ring->sq_tail, memory_order_release);
	/* Pairs with the daemon's fence between setting SLEEPING and reading the tail. */
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load_explicit(&ring->v.ctl->daemon_flags, memory_order_relaxed) &
	       RDMAX_RING_DAEMON_SLEEPING;
}

const struct rdmax_ring_cqe *client_ring_cq_peek(const struct client_ring *ring)
{
	uint32_t tail = atomic_load_explicit(&ring->v.ctl->cq_tail, memory_order_acquire);

	if (tail == ring->cq_head) {
		return NULL;
	}
	return &ring->v.cq[ring->cq_head & (ring->v.cq_entries - 1)];
}

void client_ring_cq_advance(struct client_ring *ring)
{
	ring->cq_head++;
}

void client_ring_cq_release(struct client_ring *ring)
{
	atomic_store_explicit(&ring->v.ctl->cq_head, ring->cq_head, memory_order_release);
}

uint64_t client_ring_daemon_sent(const struct client_ring *ring)
{
	return atomic_load_explicit(&ring->v.ctl->msgs_sent, memory_order_acquire);
}

uint64_t client_ring_daemon_notifies(const struct client_ring *ring)
{
	return atomic_load_explicit(&ring->v.ctl->notifies_sent, memory_order_acquire);
}

void client_ring_publish_sent(struct client_ring *ring, uint64_t msgs_sent)
{
	atomic_store_explicit(&ring->v.ctl->client_msgs_sent, msgs_sent, memory_order_relaxed);
}

bool client_ring_set_wake(struct client_ring *ring, bool wake)
{
	if (wake) {
		atomic_store_explicit(&ring->v.ctl->client_flags, RDMAX_RING_CLIENT_WAKE,
				      memory_order_relaxed);
		/* Pairs with the daemon's fence between publishing cq_tail and reading the flag. */
		atomic_thread_fence(memory_order_seq_cst);
		return false;
	}
	uint32_t old =
		atomic_exchange_explicit(&ring->v.ctl->client_flags, 0, memory_order_relaxed);
	return !(old & RDMAX_RING_CLIENT_WAKE);
}
