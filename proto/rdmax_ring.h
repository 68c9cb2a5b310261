/* SPDX-License-Identifier: MIT */
/*
 * Layout of the shared-memory submission/completion ring between librdmax
 * and rdmaxd (docs/protocol.md, "Shared-memory ring"). Both sides compile
 * against this header; the socket's RingSetup message carries the sizes, and
 * each side derives every offset from those sizes itself: nothing in the
 * shared memory describes the memory.
 *
 * The memory is the client's and the client can rewrite any byte at any
 * time. The daemon reads each index once per pass, bounds it, and copies an
 * entry out before it looks at it (daemon/ring.c).
 */
#ifndef RDMAX_RING_H
#define RDMAX_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Page 0: the control block. Two cache lines, one per writer. */
#define RDMAX_RING_CTL_BYTES 4096u

/* Sizes the daemon accepts (powers of two). */
#define RDMAX_RING_MIN_ENTRIES   2u
#define RDMAX_RING_MAX_ENTRIES   65536u
#define RDMAX_RING_MIN_SQE_BYTES 128u
#define RDMAX_RING_MAX_SQE_BYTES 65536u
/* Submission plus completion area, at most. */
#define RDMAX_RING_MAX_BYTES (32u << 20)

/*
 * client_flags: send a RingNotify datagram when completions are posted that
 * the client has not read (its cq_head behind the daemon's cq_tail); the
 * daemon clears the flag only when it sends one.
 */
#define RDMAX_RING_CLIENT_WAKE 0x1u
/* daemon_flags: the daemon does not poll the submission ring; send RingDoorbell. */
#define RDMAX_RING_DAEMON_SLEEPING 0x1u

/*
 * Indices are free-running 32-bit counters; slot = index & (entries - 1);
 * entries held = tail - head (mod 2^32), never more than the ring's size.
 * Accessed with C11 atomics: a producer writes the slot, then stores its
 * tail with release; a consumer loads the tail with acquire, reads the
 * slots, then stores its head with release.
 */
struct rdmax_ring_ctl {
	/* Written by the client only. */
	_Atomic uint32_t sq_tail;      /* submission entries published */
	_Atomic uint32_t cq_head;      /* completion entries consumed */
	_Atomic uint32_t client_flags; /* RDMAX_RING_CLIENT_* */
	uint32_t pad0;
	/*
	 * Datagrams the client has sent on the socket, stored before each send
	 * (so at most one ahead). The daemon only compares it with what it has
	 * read, to skip a read that would hear EAGAIN; any value is harmless.
	 */
	_Atomic uint64_t client_msgs_sent;
	uint8_t pad1[64 - 24];
	/* Written by the daemon only. */
	_Atomic uint32_t sq_head;      /* submission entries consumed */
	_Atomic uint32_t cq_tail;      /* completion entries published */
	_Atomic uint32_t daemon_flags; /* RDMAX_RING_DAEMON_* */
	uint32_t pad2;
	/*
	 * Datagrams sent or queued to the client, RingNotify not counted;
	 * RingNotify datagrams sent (kept with CAP_RING_COUNTS). Both stored
	 * before each send and taken back if it fails: a client woken by a
	 * datagram finds it counted.
	 */
	_Atomic uint64_t msgs_sent;
	_Atomic uint64_t notifies_sent;
	uint8_t pad3[64 - 32];
};

/*
 * A submission slot: this header, then `len` bytes of one encoded
 * rdmax.v1.Job. `after`: how many datagrams the client had sent on the
 * socket when it wrote the entry; the daemon takes the entry only once it
 * has read that many, so socket requests and ring jobs keep their order.
 */
struct rdmax_ring_sqe {
	uint32_t len;
	uint32_t flags; /* 0 */
	uint64_t after;
	/* uint8_t data[len] follows */
};
#define RDMAX_RING_SQE_HDR ((uint32_t)sizeof(struct rdmax_ring_sqe))

/*
 * A completion slot. `status` is the protocol's Status; `message` holds
 * msg_len bytes (no NUL). `after`: datagrams the daemon had sent on the
 * socket when it posted the entry; the client takes the entry only after it
 * has read that many, so completions and socket events keep their order.
 */
#define RDMAX_RING_CQE_MESSAGE 160u
struct rdmax_ring_cqe {
	uint64_t job_id;
	uint64_t bytes;
	uint64_t after;
	int32_t status;
	uint16_t msg_len;
	uint16_t pad;
	char message[RDMAX_RING_CQE_MESSAGE];
};

_Static_assert(sizeof(struct rdmax_ring_ctl) == 128, "control block layout");
/* The control block's offsets, as docs/protocol.md gives them to clients in other languages. */
_Static_assert(offsetof(struct rdmax_ring_ctl, client_flags) == 8, "control block layout");
_Static_assert(offsetof(struct rdmax_ring_ctl, client_msgs_sent) == 16, "control block layout");
_Static_assert(offsetof(struct rdmax_ring_ctl, sq_head) == 64, "control block layout");
_Static_assert(offsetof(struct rdmax_ring_ctl, daemon_flags) == 72, "control block layout");
_Static_assert(offsetof(struct rdmax_ring_ctl, msgs_sent) == 80, "control block layout");
_Static_assert(offsetof(struct rdmax_ring_ctl, notifies_sent) == 88, "control block layout");
_Static_assert(sizeof(struct rdmax_ring_sqe) == 16, "submission header layout");
_Static_assert(sizeof(struct rdmax_ring_cqe) == 192, "completion slot layout");

/* Offsets and total size for the given sizes (already validated). */
static inline size_t rdmax_ring_sq_offset(void)
{
	return RDMAX_RING_CTL_BYTES;
}

static inline size_t rdmax_ring_cq_offset(uint32_t sq_entries, uint32_t sqe_bytes)
{
	return RDMAX_RING_CTL_BYTES + (size_t)sq_entries * sqe_bytes;
}

static inline size_t rdmax_ring_bytes(uint32_t sq_entries, uint32_t sqe_bytes, uint32_t cq_entries)
{
	return rdmax_ring_cq_offset(sq_entries, sqe_bytes) +
	       (size_t)cq_entries * sizeof(struct rdmax_ring_cqe);
}

static inline int rdmax_ring_pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

/*
 * Whether the daemon accepts these sizes: powers of two within the bounds,
 * areas within RDMAX_RING_MAX_BYTES.
 */
static inline int rdmax_ring_sizes_ok(uint32_t sq_entries, uint32_t sqe_bytes, uint32_t cq_entries)
{
	if (!rdmax_ring_pow2(sq_entries) || !rdmax_ring_pow2(sqe_bytes) ||
	    !rdmax_ring_pow2(cq_entries)) {
		return 0;
	}
	if (sq_entries < RDMAX_RING_MIN_ENTRIES || sq_entries > RDMAX_RING_MAX_ENTRIES ||
	    cq_entries < RDMAX_RING_MIN_ENTRIES || cq_entries > RDMAX_RING_MAX_ENTRIES ||
	    sqe_bytes < RDMAX_RING_MIN_SQE_BYTES || sqe_bytes > RDMAX_RING_MAX_SQE_BYTES) {
		return 0;
	}
	uint64_t areas = (uint64_t)sq_entries * sqe_bytes +
			 (uint64_t)cq_entries * sizeof(struct rdmax_ring_cqe);
	return areas <= RDMAX_RING_MAX_BYTES;
}

/*
 * Where the parts of one mapped ring lie: the same view on both sides (the
 * library that made the memfd and the daemon that maps it). Each side keeps
 * its own private indices next to it.
 */
struct rdmax_ring_view {
	uint8_t *base; /* the mapping, map_len bytes; NULL when there is no ring */
	size_t map_len;
	struct rdmax_ring_ctl *ctl;
	uint8_t *sq;               /* sq_entries slots of sqe_bytes */
	struct rdmax_ring_cqe *cq; /* cq_entries slots */
	uint32_t sq_entries;
	uint32_t sqe_bytes;
	uint32_t cq_entries;
};

/* The view of a mapping of rdmax_ring_bytes() for these (validated) sizes. */
static inline struct rdmax_ring_view rdmax_ring_view_of(void *base, uint32_t sq_entries,
							uint32_t sqe_bytes, uint32_t cq_entries)
{
	return (struct rdmax_ring_view){
		.base = (uint8_t *)base,
		.map_len = rdmax_ring_bytes(sq_entries, sqe_bytes, cq_entries),
		.ctl = (struct rdmax_ring_ctl *)base,
		.sq = (uint8_t *)base + rdmax_ring_sq_offset(),
		.cq = (struct rdmax_ring_cqe *)((uint8_t *)base +
						rdmax_ring_cq_offset(sq_entries, sqe_bytes)),
		.sq_entries = sq_entries,
		.sqe_bytes = sqe_bytes,
		.cq_entries = cq_entries,
	};
}

#endif
