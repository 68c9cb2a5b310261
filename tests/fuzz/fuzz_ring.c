/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the daemon's side of the shared-memory ring
 * (daemon/session/ring.c). The client owns the shared memory and may write
 * anything into it at any moment, so the input is a ring geometry, the
 * memfd's size and seals, then a program of steps: the client rewriting
 * bytes of the mapping, and the daemon peeking, consuming, posting
 * completions, sleeping and waking. Every entry the daemon takes is decoded
 * as the ipc layer decodes it (the straight-line codec, or protobuf-c into
 * an arena), and where the codec takes it, both must agree. Nothing may touch memory outside the
 * mapping, and a lying client only ever earns PROTOCOL_ERROR.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arena.h"
#include "fuzz.h"
#include "job_codec.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum step {
	STEP_WRITE,   /* the client writes bytes into the mapping */
	STEP_TAIL,    /* the client publishes a tail */
	STEP_TAKE,    /* the daemon peeks, decodes and consumes */
	STEP_POST,    /* the daemon posts a completion */
	STEP_CQ_HEAD, /* the client gives completions back */
	STEP_WAKE_REQ,
	STEP_SLEEP,
	STEP_WAKE,
	STEP_MAX,
};

static void same_bytes(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b)
{
	if (a->len != b->len || (a->data == NULL) != (b->data == NULL) ||
	    (a->len && memcmp(a->data, b->data, a->len) != 0)) {
		abort();
	}
}

/*
 * An entry decoded as ipc_ring_take() decodes it: the straight-line codec
 * when it takes the bytes, protobuf-c (into an arena) otherwise. Whatever
 * the codec takes, protobuf-c must take with the same values.
 */
static void check_entry(const uint8_t *buf, size_t len)
{
	static struct arena arena;
	struct job_codec_msg m;

	if (!arena.buf && arena_init(&arena, 4096) < 0) {
		abort();
	}
	Rdmax__V1__Job *pc = rdmax__v1__job__unpack(arena_pb_allocator(&arena), len, buf);
	if (job_codec_unpack(buf, len, &m)) {
		const Rdmax__V1__Job *j = &m.job;
		if (!pc || pc->job_id != j->job_id || pc->has_deadline_ms != j->has_deadline_ms ||
		    pc->deadline_ms != j->deadline_ms ||
		    pc->has_traffic_class != j->has_traffic_class ||
		    pc->traffic_class != j->traffic_class || pc->kind_case != j->kind_case) {
			abort();
		}
		if (j->kind_case == RDMAX__V1__JOB__KIND_WRITE) {
			const Rdmax__V1__WriteJob *a = j->write, *b = pc->write;
			if (a->local_region != b->local_region ||
			    a->local_offset != b->local_offset || a->length != b->length ||
			    a->remote_offset != b->remote_offset || a->has_imm != b->has_imm ||
			    a->imm != b->imm) {
				abort();
			}
			same_bytes(&a->remote_desc, &b->remote_desc);
		} else {
			const Rdmax__V1__ReadJob *a = j->read, *b = pc->read;
			if (j->kind_case != RDMAX__V1__JOB__KIND_READ ||
			    a->remote_offset != b->remote_offset || a->length != b->length ||
			    a->local_region != b->local_region ||
			    a->local_offset != b->local_offset) {
				abort();
			}
			same_bytes(&a->remote_desc, &b->remote_desc);
		}
	}
	arena_reset(&arena);
}

static void run_steps(struct ring *ring, struct fuzz_in *in)
{
	uint8_t *buf = malloc(ring->v.sqe_bytes);
	uint64_t received = 0, sent = 0;
	uint32_t taken = 0;

	if (!buf) {
		abort();
	}
	for (int steps = 0; in->n && steps < 256; steps++) {
		switch (fuzz_u8(in) % STEP_MAX) {
		case STEP_WRITE: {
			uint32_t off = fuzz_u32(in) % ring->v.map_len;
			const uint8_t *bytes;
			size_t n = fuzz_bytes(in, fuzz_u8(in), &bytes);
			if (n > ring->v.map_len - off) {
				n = ring->v.map_len - off;
			}
			memcpy(ring->v.base + off, bytes, n);
			break;
		}
		case STEP_TAIL:
			atomic_store(&ring->v.ctl->sq_tail, ring->sq_head + fuzz_u8(in) % 4);
			break;
		case STEP_TAKE: {
			received += fuzz_u8(in) % 4;
			int len = ring_sq_peek(ring, received, buf, ring->v.sqe_bytes);
			if (len == -EAGAIN) {
				break;
			}
			if (len < 0) {
				if (len != RDMAX_E_PROTOCOL_ERROR) {
					abort();
				}
				break;
			}
			if ((uint32_t)len > ring->v.sqe_bytes - RDMAX_RING_SQE_HDR) {
				abort();
			}
			check_entry(buf, (size_t)len);
			ring_sq_consume(ring);
			taken++;
			if (ring->sq_head != taken) {
				abort(); /* the daemon's index moved by other means */
			}
			break;
		}
		case STEP_POST: {
			char msg[RDMAX_RING_CQE_MESSAGE + 40];
			const uint8_t *bytes;
			size_t n = fuzz_bytes(in, fuzz_u8(in) % sizeof(msg), &bytes);
			memcpy(msg, bytes, n);
			msg[n < sizeof(msg) ? n : sizeof(msg) - 1] = '\0';
			int ret = ring_cq_post(ring, fuzz_u32(in), (int)(fuzz_u8(in) % 20),
					       fuzz_u32(in), msg, sent++);
			if (ret != 0 && ret != -ENOSPC && ret != RDMAX_E_PROTOCOL_ERROR) {
				abort();
			}
			ring_report_sent(ring, sent);
			break;
		}
		case STEP_CQ_HEAD:
			atomic_store(&ring->v.ctl->cq_head, ring->cq_tail - fuzz_u8(in) % 4);
			break;
		case STEP_WAKE_REQ:
			ring_take_wake_request(ring);
			break;
		case STEP_SLEEP:
			ring_sleep(ring);
			break;
		case STEP_WAKE:
			ring_wake(ring);
			break;
		}
		if (ring_sq_pending(ring) > ring->v.sq_entries) {
			abort();
		}
	}
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = {data, size};
	struct ring ring = {0};
	uint32_t sq_entries, sqe_bytes, cq_entries;

	uint8_t shape = fuzz_u8(&in);
	if (shape & 1) {
		/* Any numbers the client may send in RingSetup. */
		sq_entries = fuzz_u32(&in);
		sqe_bytes = fuzz_u32(&in);
		cq_entries = fuzz_u32(&in);
	} else {
		/* Small valid geometries, so the steps run on most inputs. */
		sq_entries = 1u << (1 + fuzz_u8(&in) % 6);
		sqe_bytes = 1u << (7 + fuzz_u8(&in) % 4);
		cq_entries = 1u << (1 + fuzz_u8(&in) % 6);
	}
	size_t need = rdmax_ring_sizes_ok(sq_entries, sqe_bytes, cq_entries)
			      ? rdmax_ring_bytes(sq_entries, sqe_bytes, cq_entries)
			      : 8192;
	/* The file: a little shorter or longer than needed, some seals missing. */
	long delta = (long)(int8_t)fuzz_u8(&in) * 64;
	size_t file = delta < 0 && (size_t)-delta > need ? 0 : (size_t)((long)need + delta);
	int fd = memfd_create("fuzz-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)file) < 0) {
		abort();
	}
	unsigned seals = (shape & 2) ? F_SEAL_SHRINK : F_SEAL_SHRINK | F_SEAL_GROW;
	if (shape & 4) {
		seals |= F_SEAL_FUTURE_WRITE;
	}
	if (fcntl(fd, F_ADD_SEALS, seals) < 0) {
		abort();
	}
	int ret = ring_map(fd, sq_entries, sqe_bytes, cq_entries, &ring);
	close(fd);
	if (ret < 0) {
		if (ret != RDMAX_E_INVALID_ARGUMENT && ret != RDMAX_E_PERMISSION_DENIED &&
		    ret != RDMAX_E_OUT_OF_RANGE) {
			abort();
		}
		return 0;
	}
	if ((shape & 6) || file < need) {
		abort(); /* mapped a file the client could resize or that is too small */
	}
	run_steps(&ring, &in);
	ring_unmap(&ring);
	return 0;
}
