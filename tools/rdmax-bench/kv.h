/* SPDX-License-Identifier: MIT */
/*
 * kv.h: what rdmax-bench kv (kv.c) and its raw reference, the same clients
 * over two relay processes instead of two rdmaxd (kv_relay.c), share.
 * Private to tools/rdmax-bench/.
 */
#ifndef RDMAX_BENCH_KV_H
#define RDMAX_BENCH_KV_H

#include "bench.h"

#define KV_CLIENTS_MAX 64
#define KV_WINDOW_MAX  64

struct kv_opts {
	const char *socket_path;
	const char *decode_socket;
	const char *label;
	const char *json_path;
	uint32_t clients;
	uint32_t layers;
	uint32_t blocks;
	uint32_t window;
	uint64_t block_len;
	double duration_s;
	int daemon_pid;
	int peer_pid;
	bool verify;            /* the decode client checks every byte of every block */
	bool one_job;           /* one PAGED_WRITE per request instead of one per layer */
	bool decode_sleep;      /* the decode client sleeps between imms instead of spinning */
	bool claim_each;        /* the decode client claims each request's imm anew */
	bool relay;             /* --relay: raw relay processes stand where the daemons do */
	uint32_t relay_spin_us; /* --relay-spin: the relays poll this long before they sleep */
};

/*
 * --relay: the row's process layout without rdmaxd. A sending relay takes
 * each request's block lists from its prefill client over a socket pair,
 * sends a header, the destination list and the blocks (gathered by one
 * sendmsg() from the client's memory) over one TCP connection; the receiving
 * relay lands the blocks in the decode client's pool (scattered by one
 * recvmsg()), acknowledges the request over TCP and tells the decode client
 * its imm; the sending relay passes the acknowledgement back to the prefill
 * client as its completion. Both relays sleep in the kernel between
 * messages, or with --relay-spin US poll without sleeping for up to US
 * after the last one, yielding the CPU every few microseconds, as rdmaxd's
 * loop does for [engine] busy_poll_us. The memory is shared memfds, as
 * rdmaxd's host regions are.
 */
struct kv_relay {
	int src_fd[KV_CLIENTS_MAX];          /* each prefill client's source memfd */
	int pool_fd;                         /* the decode client's pool memfd */
	int prefill_sock[KV_CLIENTS_MAX][2]; /* [0]: the client's end, [1]: the sender's */
	int decode_sock[2];                  /* [0]: the decode client's end, [1]: the receiver's */
	pid_t sender, receiver;
};

/* A request as a prefill client hands it to the sending relay (SOCK_SEQPACKET). */
struct kv_relay_req {
	uint32_t slot;
	uint32_t imm;
	uint32_t count; /* blocks */
	uint32_t idx[]; /* count source block indices, then count destination ones */
};

#define KV_RELAY_BLOCKS_MAX 1023 /* a request's blocks plus its header in one iovec */

uint64_t kv_slot_bytes(const struct kv_opts *k);
uint64_t kv_pool_blocks(const struct kv_opts *k);
/* A prefill client's sources: both variants of every slot's request. */
uint64_t kv_src_bytes(const struct kv_opts *k);
/* Sets up the memory and sockets and starts both relays. \return 0 or a negative errno */
int kv_relay_start(const struct kv_opts *k, struct kv_relay *r);
/* Stops both relays (after their CPU time was read). \return 0 when both ran to the end */
int kv_relay_stop(struct kv_relay *r);
/* Maps a relay memfd of len bytes, or NULL. */
uint8_t *kv_relay_map(int fd, uint64_t len);
/* A prefill client hands one request to the sending relay. \return 0 or a negative errno */
int kv_relay_submit(int sock, uint32_t slot, uint32_t imm, uint32_t count, const uint32_t *src,
		    const uint32_t *dst);
/*
 * Up to max values (completed slots for a prefill client, imms for the decode
 * client), waiting up to timeout_ms for the first. \return their count or a
 * negative errno
 */
int kv_relay_poll(int sock, uint32_t *vals, int max, int timeout_ms);

#endif
