/* SPDX-License-Identifier: MIT */
/*
 * verbs-hop: the raw verbs reference for a completed small write posted by a
 * daemon on a client's behalf. A server (-l) registers a buffer and hands its
 * address and rkey over in the connection's private data; the client side
 * connects (librdmacm, RC, one QP) and times SIZE-byte RDMA writes with one
 * in flight, each waited for on the CQ, like `ib_write_bw -t 1`:
 *
 *   direct: one process posts and polls (perftest's layout);
 *   --hop: a forked "client" process asks for each write through shared
 *     memory (a sequence number in one cache line) and spins until the
 *     poster has seen the completion and echoed the number into another:
 *     rdmaxd's process layout with nothing of its code, so the floor of any
 *     daemon design on this NIC. --yield: the asking process spins with a
 *     sched_yield() per poll; --pause-ns N: with --yield, it pauses for the
 *     first N ns of each wait, as librdmax does (RDMAX_SPIN_PAUSE_NS, 4000);
 *     the poster never yields.
 *   --code N: before each post the poster calls N of 512 small functions
 *     spread over 32 KiB of text (16 instructions each, in a scattered
 *     order), standing for the code a daemon runs per job. --code-span F
 *     (512 to 4096, a multiple of 512): the same calls go to every
 *     (F / 512)-th of F functions (about 70 bytes of text apiece): the
 *     same instructions over F / 512 times as much text. --asker-code N
 *     (with --hop): the asking process makes N such calls before each
 *     request, inside the time it measures, as a client library's code.
 *     Under an emulator (QEMU TCG) that code does not only cost its own
 *     time: it displaces the emulator's per-CPU translation caches, and the
 *     emulated NIC's work in the next post call slows with it.
 *
 *   verbs-hop -l ADDR [-p PORT]
 *   verbs-hop -b SRC_ADDR ADDR [-p PORT] [-n ITERS] [-s SIZE] [--hop] [--yield]
 *             [--pause-ns N] [--code N] [--code-span F] [--asker-code N]
 *
 * Prints one line: mode, iterations, p50, p99, p99.9, max and mean of a write in µs, as seen by
 * the process that asked for it, then the poster's post call (mean, p50, p90) and
 * its wait from the post's return to the completion. The server prints "listening" once it
 * listens and exits when the client has gone.
 */
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

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define LINE    64
#define BUF_LEN 4096

/* Set by the program's --yield and --pause-ns options. */
static int hop_yield;
static uint64_t hop_pause_ns;

static uint64_t hop_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One poll's wait in a wait that began at start_ns (0: unknown, yield at once). */
static void hop_relax(uint64_t start_ns)
{
	if (hop_yield &&
	    (hop_pause_ns == 0 || start_ns == 0 || hop_now_ns() - start_ns >= hop_pause_ns)) {
		sched_yield();
		return;
	}
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

/*
 * --code: HOP_CODE_FNS functions that differ in their constants only, so
 * the compiler keeps each (about 60 bytes of text apiece), named hop_fn_0000
 * to hop_fn_7777 (the name's digits are also the function's constant).
 */
#define HOP_CODE_FNS 4096
#define HOP_FN(i)                                                                                  \
	__attribute__((noinline)) static uint64_t hop_fn_##i(uint64_t x)                           \
	{                                                                                          \
		x = x * (2u * i + 3u) + i;                                                         \
		x ^= x >> (i % 13u + 1u);                                                          \
		x += (x << (i % 7u + 1u)) ^ (i * 2654435761u);                                     \
		x = (x & (1u << (i % 20u))) ? x + i * 7u : x - i * 11u;                            \
		return x;                                                                          \
	}
#define HOP_REF(i)   hop_fn_##i,
#define HOP_D8(m, p) m(p##0) m(p##1) m(p##2) m(p##3) m(p##4) m(p##5) m(p##6) m(p##7)
#define HOP_D64(m, p)                                                                              \
	HOP_D8(m, p##0)                                                                            \
	HOP_D8(m, p##1)                                                                            \
	HOP_D8(m, p##2)                                                                            \
	HOP_D8(m, p##3)                                                                            \
	HOP_D8(m, p##4) HOP_D8(m, p##5) HOP_D8(m, p##6) HOP_D8(m, p##7)
#define HOP_D512(m, p)                                                                             \
	HOP_D64(m, p##0)                                                                           \
	HOP_D64(m, p##1)                                                                           \
	HOP_D64(m, p##2)                                                                           \
	HOP_D64(m, p##3) HOP_D64(m, p##4) HOP_D64(m, p##5) HOP_D64(m, p##6) HOP_D64(m, p##7)
#define HOP_D4096(m)                                                                               \
	HOP_D512(m, 0)                                                                             \
	HOP_D512(m, 1)                                                                             \
	HOP_D512(m, 2)                                                                             \
	HOP_D512(m, 3) HOP_D512(m, 4) HOP_D512(m, 5) HOP_D512(m, 6) HOP_D512(m, 7)
HOP_D4096(HOP_FN)
static uint64_t (*const hop_fns[HOP_CODE_FNS])(uint64_t) = {HOP_D4096(HOP_REF)};
static volatile uint64_t hop_sink;
static unsigned hop_span = 512; /* --code-span */

/*
 * Calls n of the functions, the k-th call to number k * 167 mod 512, times
 * span / 512: scattered over 512 of them, every (span / 512)-th function,
 * so a larger span spreads the same calls over more text.
 */
static void hop_run_code(unsigned n)
{
	uint64_t x = hop_sink;

	for (unsigned k = 0; k < n; k++) {
		x = hop_fns[((k * 167u) % 512u) * (hop_span / 512u)](x);
	}
	hop_sink = x;
}

/* qsort() order of uint64_t latencies. */
static int hop_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct remote {
	uint64_t addr;
	uint32_t rkey;
};

struct shared {
	_Alignas(LINE) _Atomic uint64_t ping;
	_Alignas(LINE) _Atomic uint64_t pong;
};

static int die(const char *what)
{
	fprintf(stderr, "verbs-hop: %s: %s\n", what, strerror(errno));
	return 1;
}

static struct rdma_addrinfo *resolve(const char *src, const char *dst, const char *port,
				     int passive)
{
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *res = NULL, *srcres = NULL;

	if (passive) {
		hints.ai_flags = RAI_PASSIVE;
	} else if (src) {
		struct rdma_addrinfo sh = {.ai_port_space = RDMA_PS_TCP, .ai_flags = RAI_PASSIVE};
		if (rdma_getaddrinfo(src, NULL, &sh, &srcres)) {
			return NULL;
		}
		hints.ai_src_addr = srcres->ai_src_addr;
		hints.ai_src_len = srcres->ai_src_len;
	}
	int r = rdma_getaddrinfo(dst, port, &hints, &res);
	if (srcres) {
		rdma_freeaddrinfo(srcres);
	}
	return r ? NULL : res;
}

static int serve(const char *addr, const char *port)
{
	struct ibv_qp_init_attr attr = {
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1};
	struct rdma_cm_id *listen_id, *id;
	struct rdma_addrinfo *res = resolve(NULL, addr, port, 1);
	static char buf[BUF_LEN];

	if (!res) {
		return die("rdma_getaddrinfo");
	}
	if (rdma_create_ep(&listen_id, res, NULL, &attr) || rdma_listen(listen_id, 1)) {
		return die("listen");
	}
	printf("listening\n"); /* what a caller waits for before it starts the client */
	fflush(stdout);
	if (rdma_get_request(listen_id, &id)) {
		return die("rdma_get_request");
	}
	struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, sizeof(buf),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr) {
		return die("ibv_reg_mr");
	}
	struct remote rem = {.addr = (uintptr_t)buf, .rkey = mr->rkey};
	struct rdma_conn_param cp = {.private_data = &rem,
				     .private_data_len = sizeof(rem),
				     .responder_resources = 1,
				     .initiator_depth = 1};
	if (rdma_accept(id, &cp)) {
		return die("rdma_accept");
	}
	/* Until the client disconnects. */
	struct rdma_cm_event *ev;
	while (rdma_get_cm_event(id->channel, &ev) == 0) {
		enum rdma_cm_event_type t = ev->event;
		rdma_ack_cm_event(ev);
		if (t == RDMA_CM_EVENT_DISCONNECTED) {
			break;
		}
	}
	rdma_disconnect(id);
	ibv_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	return 0;
}

/*
 * Where the posting process's time goes: inside the post call (rxe does the
 * round trip's work there when it can) and from its return to the
 * completion. Summed over the timed writes.
 */
static struct {
	uint64_t post_ns, wait_ns, writes;
	uint64_t *posts; /* each timed write's post call, ns */
	size_t capacity; /* entries of posts */
	unsigned code;   /* --code */
} g_split;

/* One write, waited for on the CQ. */
static int write_one(struct rdma_cm_id *id, char *buf, size_t size, struct ibv_mr *mr,
		     const struct remote *rem)
{
	struct ibv_wc wc;
	int n;

	hop_run_code(g_split.code);
	uint64_t t0 = hop_now_ns();

	if (rdma_post_write(id, NULL, buf, size, mr,
			    IBV_SEND_SIGNALED | (size <= 64 ? IBV_SEND_INLINE : 0), rem->addr,
			    rem->rkey)) {
		return -1;
	}
	uint64_t t1 = hop_now_ns();
	while ((n = ibv_poll_cq(id->send_cq, 1, &wc)) == 0) {
	}
	g_split.post_ns += t1 - t0;
	g_split.wait_ns += hop_now_ns() - t1;
	if (g_split.posts && g_split.writes < g_split.capacity) {
		g_split.posts[g_split.writes] = t1 - t0;
	}
	g_split.writes++;
	return n < 0 || wc.status != IBV_WC_SUCCESS ? -1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"hop", no_argument, NULL, 'H'},
					     {"yield", no_argument, NULL, 'y'},
					     {"pause-ns", required_argument, NULL, 'P'},
					     {"code", required_argument, NULL, 'C'},
					     {"code-span", required_argument, NULL, 'S'},
					     {"asker-code", required_argument, NULL, 'A'},
					     {0}};
	const char *listen_addr = NULL, *src = NULL, *port = "18690";
	size_t iters = 2000, size = 64;
	int hop = 0, asker_yields = 0, c;
	unsigned code = 0, asker_code = 0;

	while ((c = getopt_long(argc, argv, "l:b:p:n:s:Hy", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			listen_addr = optarg;
			break;
		case 'b':
			src = optarg;
			break;
		case 'p':
			port = optarg;
			break;
		case 'n':
			iters = strtoul(optarg, NULL, 0);
			break;
		case 's':
			size = strtoul(optarg, NULL, 0);
			break;
		case 'H':
			hop = 1;
			break;
		case 'y':
			hop_yield = 1;
			break;
		case 'P':
			hop_pause_ns = strtoull(optarg, NULL, 0);
			break;
		case 'C':
			code = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case 'A':
			asker_code = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case 'S':
			hop_span = (unsigned)strtoul(optarg, NULL, 0);
			if (hop_span < 512 || hop_span > HOP_CODE_FNS || hop_span % 512) {
				fprintf(stderr, "verbs-hop: --code-span is 512, 1024, ... %d\n",
					HOP_CODE_FNS);
				return 2;
			}
			break;
		default:
			fprintf(stderr,
				"usage: verbs-hop -l ADDR | -b SRC ADDR [-p PORT] [-n ITERS] "
				"[-s SIZE] [--hop] [--yield] [--pause-ns N] [--code N] "
				"[--code-span F] [--asker-code N]\n");
			return 2;
		}
	}
	if (listen_addr) {
		return serve(listen_addr, port);
	}
	if (optind >= argc || iters == 0 || size == 0 || size > BUF_LEN) {
		fprintf(stderr, "verbs-hop: give the server's address; 0 < SIZE <= %d\n", BUF_LEN);
		return 2;
	}
	/* The asking process is forked before any verbs resource exists. */
	struct shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t *lat = mmap(NULL, iters * sizeof(*lat), PROT_READ | PROT_WRITE,
			     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED || lat == MAP_FAILED) {
		return die("mmap");
	}
	/* The poster reads requests from 1 on: nothing before the asker's first. */
	atomic_store_explicit(&sh->ping, 1, memory_order_relaxed);
	pid_t asker = -1;
	if (hop) {
		asker = fork();
		if (asker < 0) {
			return die("fork");
		}
		if (asker == 0) {
			/* Wait until the poster is connected (pong = 1), then ask. */
			while (atomic_load_explicit(&sh->pong, memory_order_acquire) != 1) {
				hop_relax(0);
			}
			for (uint64_t i = 0; i < iters; i++) {
				uint64_t t0 = hop_now_ns();
				hop_run_code(asker_code);
				atomic_store_explicit(&sh->ping, i + 2, memory_order_release);
				while (atomic_load_explicit(&sh->pong, memory_order_acquire) !=
				       i + 2) {
					hop_relax(t0);
				}
				lat[i] = hop_now_ns() - t0;
			}
			_exit(0);
		}
		asker_yields = hop_yield;
		hop_yield = 0; /* the poster spins without yielding, as rdmaxd does */
	}
	struct ibv_qp_init_attr attr = {.cap = {.max_send_wr = 4,
						.max_recv_wr = 4,
						.max_send_sge = 1,
						.max_recv_sge = 1,
						.max_inline_data = 64},
					.qp_type = IBV_QPT_RC};
	struct rdma_addrinfo *res = resolve(src, argv[optind], port, 0);
	struct rdma_cm_id *id;
	static char buf[BUF_LEN];
	if (!res) {
		return die("rdma_getaddrinfo");
	}
	if (rdma_create_ep(&id, res, NULL, &attr)) {
		return die("rdma_create_ep");
	}
	struct rdma_conn_param cp = {
		.responder_resources = 1, .initiator_depth = 1, .retry_count = 7};
	if (rdma_connect(id, &cp)) {
		return die("rdma_connect");
	}
	struct remote rem;
	if (!id->event || id->event->param.conn.private_data_len < sizeof(rem)) {
		fprintf(stderr, "verbs-hop: the server sent no address and rkey\n");
		return 1;
	}
	memcpy(&rem, id->event->param.conn.private_data, sizeof(rem));
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof(buf));
	if (!mr) {
		return die("rdma_reg_msgs");
	}
	memset(buf, 0x5a, size);
	for (int w = 0; w < 16; w++) { /* warm-up, untimed */
		if (write_one(id, buf, size, mr, &rem)) {
			return die("warm-up write");
		}
	}
	memset(&g_split, 0, sizeof(g_split));
	g_split.code = code;
	g_split.posts = calloc(iters, sizeof(*g_split.posts));
	g_split.capacity = iters;
	if (!g_split.posts) {
		return die("calloc");
	}
	if (hop) {
		uint64_t seen = 1;
		atomic_store_explicit(&sh->pong, 1, memory_order_release);
		while (seen < iters + 1) {
			uint64_t v = atomic_load_explicit(&sh->ping, memory_order_acquire);
			if (v == seen) {
				hop_relax(0);
				continue;
			}
			if (write_one(id, buf, size, mr, &rem)) {
				kill(asker, SIGKILL);
				return die("write");
			}
			seen = v;
			atomic_store_explicit(&sh->pong, v, memory_order_release);
		}
		int status;
		if (waitpid(asker, &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0) {
			fprintf(stderr, "verbs-hop: the asking process failed\n");
			return 1;
		}
	} else {
		for (size_t i = 0; i < iters; i++) {
			uint64_t t0 = hop_now_ns();
			if (write_one(id, buf, size, mr, &rem)) {
				return die("write");
			}
			lat[i] = hop_now_ns() - t0;
		}
	}
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
	char code_note[112] = "";
	if (code) {
		snprintf(code_note, sizeof(code_note),
			 "; %u calls of code (%u functions apart) before each post", code,
			 hop_span / 512);
	}
	if (asker_code) {
		size_t len = strlen(code_note);
		snprintf(code_note + len, sizeof(code_note) - len, "; %u in the asker", asker_code);
	}
	uint64_t sum = 0;
	for (size_t i = 0; i < iters; i++) {
		sum += lat[i];
	}
	qsort(lat, iters, sizeof(*lat), hop_cmp_u64);
	size_t posts = g_split.writes < g_split.capacity ? g_split.writes : g_split.capacity;
	qsort(g_split.posts, posts, sizeof(*g_split.posts), hop_cmp_u64);
	printf("verbs-hop %s%s %zu B x %zu: p50 %.1f us p99 %.1f us p999 %.1f us max %.1f us "
	       "mean %.1f us (poster: post call mean %.1f us, p50 %.1f us, p90 %.1f us, then the "
	       "completion %.1f us%s)\n",
	       hop ? "hop" : "direct",
	       hop ? (asker_yields ? (hop_pause_ns ? " pause-yield" : " yield") : " pause") : "",
	       size, iters, lat[iters / 2] / 1e3, lat[iters * 99 / 100] / 1e3,
	       lat[iters * 999 / 1000] / 1e3, lat[iters - 1] / 1e3,
	       (double)sum / (double)iters / 1e3,
	       g_split.writes ? (double)g_split.post_ns / (double)g_split.writes / 1e3 : 0.0,
	       posts ? g_split.posts[posts / 2] / 1e3 : 0.0,
	       posts ? g_split.posts[posts * 9 / 10] / 1e3 : 0.0,
	       g_split.writes ? (double)g_split.wait_ns / (double)g_split.writes / 1e3 : 0.0,
	       code_note);
	return 0;
}
