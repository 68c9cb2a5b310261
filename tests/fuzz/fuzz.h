/* SPDX-License-Identifier: MIT */
/*
 * Shared pieces of the libFuzzer targets (tests/fuzz/README.md): a reader
 * over the fuzzer's bytes and an in-process daemon (real region table, imm
 * table, engine, TCP transport on loopback and, optionally, the client
 * socket) that a target drives one loop turn at a time.
 */
#ifndef RDMAXD_FUZZ_H
#define RDMAXD_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rdmaxd.h"

/* The fuzzer's input, consumed from the front. */
struct fuzz_in {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
	if (!in->n) {
		return 0;
	}
	in->n--;
	return *in->p++;
}

static inline uint16_t fuzz_u16(struct fuzz_in *in)
{
	uint16_t lo = fuzz_u8(in);
	return (uint16_t)(lo | (uint16_t)fuzz_u8(in) << 8);
}

static inline uint32_t fuzz_u32(struct fuzz_in *in)
{
	uint32_t lo = fuzz_u16(in);
	return lo | (uint32_t)fuzz_u16(in) << 16;
}

/* Up to want bytes (fewer at the end of the input); returns how many. */
static inline size_t fuzz_bytes(struct fuzz_in *in, size_t want, const uint8_t **ret)
{
	size_t n = want < in->n ? want : in->n;
	*ret = in->p;
	in->p += n;
	in->n -= n;
	return n;
}

/* Instance ids of the fuzzing daemons, and the shared key of the keyed one. */
#define FUZZ_INSTANCE       0x0123456789abcdefull
#define FUZZ_KEYED_INSTANCE 0x0123456789abcdeeull
#define FUZZ_AUTH_KEY       "fuzzing-key-0123456789abcdef"

/*
 * Start (once) a daemon in this process: TCP transport on 127.0.0.1 (port
 * chosen by the kernel), short peer timeouts, the client socket in a
 * temporary folder; with keyed, a second daemon on the same loop that
 * requires peers to prove FUZZ_AUTH_KEY. Aborts on failure (a harness bug,
 * not a finding).
 */
struct rdmaxd *fuzz_daemon_start(bool keyed);
/* Run the loop turns times without blocking. */
void fuzz_daemon_turns(struct rdmaxd *daemon, int turns);
/* The TCP port the daemon listens on. */
uint16_t fuzz_daemon_tcp_port(struct rdmaxd *daemon);
/*
 * Run the loop until no client is connected and no job is outstanding.
 * Returns false when that did not happen within timeout_ms.
 */
bool fuzz_daemon_settle(struct rdmaxd *daemon, int timeout_ms);
/* Milliseconds on the monotonic clock. */
uint64_t fuzz_now_ms(void);

#endif
