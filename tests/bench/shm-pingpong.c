/* SPDX-License-Identifier: MIT */
/*
 * shm-pingpong: the floor under rdmax's ring hop on this machine. Two
 * processes (fork) share one anonymous mapping and bounce a 64-byte message
 * by spinning on memory, with no protocol and no library around it:
 *
 *   --lines 1: one cache line each way (the payload and its sequence number
 *     together), the least two processes can move per round trip;
 *   --ring (default): the cache lines the rdmax ring moves per job, in its
 *     order: the entry (header and 64 B payload), the submission tail, the
 *     completion entry, the completion tail, the consumed heads written back;
 *   --yield: sched_yield() between two polls on both sides, as librdmax
 *     does by default (RDMAX_SPIN_YIELD);
 *   --pipe: no shared memory; one byte each way over two pipes, each side
 *     sleeping in read(): what waking a process costs on this machine (with
 *     --cpus 0,0 two process switches and four system calls per round trip),
 *     which every request of the KV rows pays a few times (docs/benchmarks.md,
 *     Where the KV row's CPU goes).
 *
 * --cpus A,B pins the requester to CPU A and the responder to CPU B (as
 * RDMAX_ABLAT_PIN does). It prints p50 and p99 of the round trip in µs, or
 * with --json the shape of rdmax-bench's results ("lat_us": p50, p99), so
 * tests/bench/ab-lat.sh reads both. It never touches rdmaxd.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE 64

/* Each member on its own cache line, written by one side only (as in rdmax_ring.h). */
struct shared {
	_Alignas(LINE) _Atomic uint32_t sq_tail; /* requester */
	_Atomic uint32_t cq_head;
	_Alignas(LINE) _Atomic uint32_t sq_head; /* responder */
	_Atomic uint32_t cq_tail;
	_Alignas(LINE) uint8_t sqe[2 * LINE]; /* requester: 16 B header + 64 B payload */
	_Alignas(LINE) uint8_t cqe[LINE];     /* responder: the completion's first line */
	_Alignas(LINE) _Atomic uint64_t ping; /* --lines 1: seq + payload in one line each way */
	uint8_t ping_data[LINE - 8];
	_Alignas(LINE) _Atomic uint64_t pong;
	uint8_t pong_data[LINE - 8];
	_Alignas(LINE) _Atomic int stop;
};

static int g_yield;

static void relax(void)
{
	if (g_yield) {
		sched_yield();
	} else {
#if defined(__x86_64__) || defined(__i386__)
		__builtin_ia32_pause();
#endif
	}
}

static void pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0) {
		return;
	}
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0) {
		perror("shm-pingpong: sched_setaffinity");
		exit(2);
	}
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void respond_lines(struct shared *sh)
{
	uint64_t seq = 0;

	while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
		uint64_t v = atomic_load_explicit(&sh->ping, memory_order_acquire);
		if (v == seq) {
			relax();
			continue;
		}
		seq = v;
		memcpy(sh->pong_data, sh->ping_data, sizeof(sh->pong_data));
		atomic_store_explicit(&sh->pong, seq, memory_order_release);
	}
}

static void respond_ring(struct shared *sh)
{
	uint32_t head = 0;
	uint8_t copy[2 * LINE];

	while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
		uint32_t tail = atomic_load_explicit(&sh->sq_tail, memory_order_acquire);
		if (tail == head) {
			relax();
			continue;
		}
		memcpy(copy, sh->sqe, 16 + 64); /* the daemon copies the entry out */
		head++;
		atomic_store_explicit(&sh->sq_head, head, memory_order_release);
		(void)atomic_load_explicit(&sh->cq_head, memory_order_acquire);
		memcpy(sh->cqe, copy, 40); /* job id, bytes, after, status */
		atomic_store_explicit(&sh->cq_tail, head, memory_order_release);
	}
}

static void respond_pipe(int from, int to)
{
	char c;

	while (read(from, &c, 1) == 1 && write(to, &c, 1) == 1) {
	}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"lines", required_argument, NULL, 'l'}, {"ring", no_argument, NULL, 'r'},
		{"yield", no_argument, NULL, 'y'},       {"pipe", no_argument, NULL, 'p'},
		{"iters", required_argument, NULL, 'n'}, {"cpus", required_argument, NULL, 'c'},
		{"json", no_argument, NULL, 'j'},        {NULL, 0, NULL, 0},
	};
	int lines = 0, json = 0, cpu_a = -1, cpu_b = -1, use_pipe = 0, c;
	long iters = 100000;

	while ((c = getopt_long(argc, argv, "l:rypn:c:j", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			lines = atoi(optarg);
			if (lines != 1) {
				fprintf(stderr, "shm-pingpong: --lines takes 1\n");
				return 2;
			}
			break;
		case 'r':
			lines = 0;
			break;
		case 'y':
			g_yield = 1;
			break;
		case 'p':
			use_pipe = 1;
			break;
		case 'n':
			iters = atol(optarg);
			break;
		case 'c':
			if (sscanf(optarg, "%d,%d", &cpu_a, &cpu_b) != 2) {
				fprintf(stderr, "shm-pingpong: --cpus A,B\n");
				return 2;
			}
			break;
		case 'j':
			json = 1;
			break;
		default:
			fprintf(stderr,
				"Usage: shm-pingpong [--lines 1 | --ring | --pipe] [--yield] "
				"[--iters N] [--cpus A,B] [--json]\n");
			return 2;
		}
	}
	if (iters < 100) {
		iters = 100;
	}
	struct shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t *rtt = calloc((size_t)iters, sizeof(*rtt));
	if (sh == MAP_FAILED || !rtt) {
		perror("shm-pingpong: memory");
		return 1;
	}
	memset(sh, 0, sizeof(*sh));
	int ping[2], pong[2];
	if (use_pipe && (pipe(ping) < 0 || pipe(pong) < 0)) {
		perror("shm-pingpong: pipe");
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		perror("shm-pingpong: fork");
		return 1;
	}
	if (pid == 0) {
		pin(cpu_b);
		if (use_pipe) {
			close(ping[1]);
			close(pong[0]);
			respond_pipe(ping[0], pong[1]);
		} else if (lines) {
			respond_lines(sh);
		} else {
			respond_ring(sh);
		}
		_exit(0);
	}
	pin(cpu_a);
	if (use_pipe) {
		close(ping[0]);
		close(pong[1]);
	}
	long warm = iters / 10;
	uint32_t cq_head = 0;
	for (long i = -warm; i < iters; i++) {
		uint64_t t0 = now_ns();
		if (use_pipe) {
			char b = (char)i;
			if (write(ping[1], &b, 1) != 1 || read(pong[0], &b, 1) != 1) {
				perror("shm-pingpong: pipe");
				return 1;
			}
		} else if (lines) {
			uint64_t seq = (uint64_t)(i + warm + 1);
			memset(sh->ping_data, (int)seq, sizeof(sh->ping_data));
			atomic_store_explicit(&sh->ping, seq, memory_order_release);
			while (atomic_load_explicit(&sh->pong, memory_order_acquire) != seq) {
				relax();
			}
		} else {
			memset(sh->sqe, (int)i, 16 + 64);
			uint32_t tail =
				atomic_load_explicit(&sh->sq_tail, memory_order_relaxed) + 1;
			atomic_store_explicit(&sh->sq_tail, tail, memory_order_release);
			while (atomic_load_explicit(&sh->cq_tail, memory_order_acquire) ==
			       cq_head) {
				relax();
			}
			uint8_t cqe[40];
			memcpy(cqe, sh->cqe, sizeof(cqe));
			cq_head++;
			atomic_store_explicit(&sh->cq_head, cq_head, memory_order_release);
		}
		if (i >= 0) {
			rtt[i] = now_ns() - t0;
		}
	}
	atomic_store(&sh->stop, 1);
	if (use_pipe) {
		close(ping[1]); /* the responder reads end-of-file */
	}
	waitpid(pid, NULL, 0);
	qsort(rtt, (size_t)iters, sizeof(*rtt), cmp_u64);
	double p50 = (double)rtt[iters / 2] / 1000.0, p99 = (double)rtt[iters * 99 / 100] / 1000.0;
	const char *mode = use_pipe ? "pipe" : lines ? "lines1" : "ring";
	if (json) {
		printf("{\"results\": [{\"mode\": \"%s\", \"yield\": %d, \"iters\": %ld, "
		       "\"lat_us\": {\"p50\": %.3f, \"p99\": %.3f}}]}\n",
		       mode, g_yield, iters, p50, p99);
	} else {
		printf("shm-pingpong %s%s: round trip p50 %.3f us, p99 %.3f us (%ld iterations)\n",
		       mode, g_yield ? " yield" : "", p50, p99, iters);
	}
	free(rtt);
	return 0;
}
