/* SPDX-License-Identifier: MIT */
/*
 * shm-pingpong: the floor of a process hop through shared memory, the
 * reference for rdmax-bench's ring hop (`rdmax-bench local --lat`). One
 * process forks a peer; they share one anonymous mapping with a cache line
 * each way. Per round trip the first writes a sequence number into its line
 * and spins until the peer, which spins on that line, has copied SIZE bytes
 * and echoed the number into the other line. Both ends spin with a pause
 * instruction, or with --yield a sched_yield() per poll (librdmax's default
 * wait, RDMAX_SPIN_YIELD). The clock is read before and after each round
 * trip, as rdmax-bench does.
 *
 *   shm-pingpong [-n ITERS] [-s SIZE] [--yield]
 *
 * Prints one line: iterations, p50 and p99 of the round trip in µs. It never
 * touches rdmaxd: no protocol, no allocation, no system call on the path
 * (without --yield), so no daemon design can make a hop cheaper than this.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hop.h"

#define LINE     64
#define MAX_SIZE 4096

struct shared {
	_Alignas(LINE) _Atomic uint64_t ping;
	_Alignas(LINE) _Atomic uint64_t pong;
	_Alignas(LINE) unsigned char src[MAX_SIZE];
	_Alignas(LINE) unsigned char dst[MAX_SIZE];
};

/* The peer: copy SIZE bytes and echo each sequence number until it sees 0. */
static void peer(struct shared *sh, size_t size)
{
	uint64_t seen = 0;

	for (;;) {
		uint64_t v = atomic_load_explicit(&sh->ping, memory_order_acquire);
		if (v == seen) {
			hop_relax();
			continue;
		}
		if (v == UINT64_MAX) {
			_exit(0);
		}
		memcpy(sh->dst, sh->src, size);
		seen = v;
		atomic_store_explicit(&sh->pong, v, memory_order_release);
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"yield", no_argument, NULL, 'y'}, {0}};
	size_t iters = 10000, size = 64;
	int c;

	while ((c = getopt_long(argc, argv, "n:s:y", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			iters = strtoul(optarg, NULL, 0);
			break;
		case 's':
			size = strtoul(optarg, NULL, 0);
			break;
		case 'y':
			hop_yield = 1;
			break;
		default:
			fprintf(stderr, "usage: shm-pingpong [-n ITERS] [-s SIZE] [--yield]\n");
			return 2;
		}
	}
	if (iters == 0 || size > MAX_SIZE) {
		fprintf(stderr, "shm-pingpong: ITERS must be > 0 and SIZE <= %d\n", MAX_SIZE);
		return 2;
	}
	struct shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t *lat = calloc(iters, sizeof(*lat));
	if (sh == MAP_FAILED || !lat) {
		perror("shm-pingpong");
		return 1;
	}
	memset(sh->src, 0xa5, size);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		peer(sh, size);
	}
	for (size_t i = 0; i < iters; i++) {
		uint64_t t0 = hop_now_ns();
		atomic_store_explicit(&sh->ping, i + 1, memory_order_release);
		while (atomic_load_explicit(&sh->pong, memory_order_acquire) != i + 1) {
			hop_relax();
		}
		lat[i] = hop_now_ns() - t0;
	}
	atomic_store_explicit(&sh->ping, UINT64_MAX, memory_order_release);
	int status;
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "shm-pingpong: the peer did not exit cleanly\n");
		return 1;
	}
	if (memcmp(sh->src, sh->dst, size) != 0) {
		fprintf(stderr, "shm-pingpong: the copied bytes differ\n");
		return 1;
	}
	qsort(lat, iters, sizeof(*lat), hop_cmp_u64);
	printf("shm-pingpong %s %zu B x %zu: p50 %.2f us p99 %.2f us\n",
	       hop_yield ? "yield" : "pause", size, iters, lat[iters / 2] / 1e3,
	       lat[iters * 99 / 100] / 1e3);
	return 0;
}
