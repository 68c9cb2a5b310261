/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench: transfer benchmarks over the public client library, in the
 * manner of perftest's ib_write_bw / ib_write_lat.
 *
 *   rdmax-bench serve --socket B.sock --desc FILE|-   register a region, publish
 *       its descriptor (file written atomically, or hex on stdout), wait for
 *       SIGTERM/SIGINT or the --stop-file
 *   rdmax-bench run --socket A.sock --desc FILE [-o write|read|paged|scatter]
 *       [-a | -s LIST] [-w WINDOW] [-b BATCH] [-n ITERS | -D SECS] [--lat]
 *       [--json[=FILE]]   jobs against the published region, one row per size
 *   rdmax-bench local --socket A.sock ...   two clients of one daemon (the
 *       daemon copies locally) against a plain memcpy of the same sizes
 *   rdmax-bench kv --socket A.sock --decode-socket B.sock ...   prefill
 *       clients push paged KV requests with per-request imm into one decode
 *       client that checks every byte (see "kv" below)
 *   rdmax-bench pairs --socket A.sock --peer-socket B.sock ...   one paged
 *       job of region pairs against per-layer and per-region jobs (pairs.c)
 *
 * Per size it reports bandwidth, job rate, per-job submit-to-completion
 * latency percentiles, and the CPU time the daemon(s) spent per GB moved
 * (utime+stime from /proc/PID/stat; the local daemon's pid comes from
 * SO_PEERCRED on the library's socket unless --daemon-pid says otherwise).
 * Every size ends with a read-back check of the bytes moved. Paged writes
 * use a reversed block table so no two pages merge into one transfer;
 * scatter splits each job into equal slices. When the library or the daemon
 * refuses an op kind, the tool says which of the two answered and exits 69.
 *
 * Uses only librdmax's public header: it measures what an application gets.
 *
 * bench.h: what the files of the tool share (options, the per-size row, the
 * requester state, the helpers each file calls). Private to tools/rdmax-bench/;
 * never includes anything from daemon/.
 */
#ifndef RDMAX_BENCH_H
#define RDMAX_BENCH_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdmax.h>

#define MAX_SIZES           32
#define SWEEP_MIN           2ull
#define SWEEP_MAX           (8ull << 20)
#define DEFAULT_SERVE_BYTES (8ull << 20)
#define DEFAULT_ITERS       1000u
#define DEFAULT_LAT_ITERS   1000u
#define ITER_BYTES_CAP      (1ull << 30) /* default -n never moves more than this per size */
#define MIN_DEFAULT_ITERS   10u
#define DEFAULT_WINDOW      16u
#define DEFAULT_WARMUP      16u
#define EVENTS_MAX          256
#define WAIT_MS             30000 /* no completion for this long: the run failed */
#define EXIT_UNAVAILABLE    69    /* sysexits' EX_UNAVAILABLE: op not implemented */

#define MIN_U64(a, b) ((uint64_t)(a) < (uint64_t)(b) ? (uint64_t)(a) : (uint64_t)(b))
#define MAX_U64(a, b) ((uint64_t)(a) > (uint64_t)(b) ? (uint64_t)(a) : (uint64_t)(b))

enum mode {
	MODE_SERVE, /* responder: region + descriptor, then wait */
	MODE_RUN,   /* requester against a peer's descriptor */
	MODE_LOCAL, /* requester and target on one daemon, plus memcpy */
	MODE_MAX,   /* terminator */
};

struct opts {
	enum mode mode;
	const char *socket_path;
	const char *desc_path;
	const char *desc_hex;
	const char *stop_file;
	const char *label;
	const char *json_path; /* "-" for stdout */
	bool json;
	enum rdmax_op op;
	const char *op_name;
	uint64_t sizes[MAX_SIZES];
	uint32_t n_sizes;
	uint64_t serve_bytes;
	uint32_t window;
	uint32_t batch;
	uint64_t iters; /* 0: default per size */
	double duration_s;
	uint32_t warmup;
	bool has_imm;
	uint32_t imm;
	bool lat;
	bool no_ring; /* RDMAX_RING=0 for this process: jobs and completions cross the socket */
	bool verify;
	uint64_t page_len; /* paged: bytes per page */
	uint32_t dests;    /* scatter: destinations per job */
	int daemon_pid;
	int peer_pid;
};

/* Results of one size. */
struct row {
	uint64_t size;
	uint64_t jobs;
	double seconds;
	double gbytes_s;
	double gbits_s;
	double jobs_s;
	double lat_us[5]; /* p50, p99, p99.9, max, mean */
	double daemon_cpu_s;
	double peer_cpu_s; /* < 0: unknown */
	double client_cpu_s;
	/*
	 * Scheduler time over the timed run (< 0: unknown): each daemon's threads
	 * on a CPU and waiting for one, and the share of the machine's CPUs idle.
	 */
	double daemon_run_s, daemon_wait_s;
	double peer_run_s, peer_wait_s;
	double host_idle;
	const char *verify; /* "ok", "FAILED", "skipped: ..." */
	char verify_msg[RDMAX_MESSAGE_MAX + 64];
	/* same-node mode: memcpy of the same size and count */
	double ref_gbytes_s;
};

struct bench {
	struct opts *o;
	struct rdmax_client *c;
	struct rdmax_region *src; /* write source, pattern holder */
	struct rdmax_region *dst; /* read destination, read-back target */
	struct rdmax_desc peer;
	uint64_t next_id;
	uint64_t *t; /* per job of the current run: submit time, then latency (ns) */
	uint64_t t_cap;
	struct rdmax_job *jobs;
	struct rdmax_event events[EVENTS_MAX];
	/* page lists (paged) and destinations (scatter) of the current size */
	uint64_t page_len;
	uint32_t *src_pages;
	uint32_t *dst_pages;
	size_t n_pages;
	struct rdmax_scatter_dest *dests;
	size_t n_dests;
};

/* util.c: clock, errors, patterns, CPU accounting, descriptor files */
extern volatile sig_atomic_t bench_stop;
void bench_on_stop_signal(int sig);
uint64_t bench_now_ns(void);
int bench_fail(const char *what, int err);
void bench_fill_pattern(uint8_t *buf, uint64_t len, uint64_t seed);
double bench_proc_cpu_s(int pid);
/* This process's CPU time (user + system) and context switches (slept or preempted). */
struct bench_usage {
	double cpu_s;
	double switches;
};
struct bench_usage bench_self_usage(void);
double bench_self_cpu_s(void);
/* Time a process's threads ran and waited to run, in seconds, and how often they were run. */
struct bench_sched {
	double run_s;
	double wait_s;
	double runs;   /* times a thread was put on a CPU: wake-ups and preemptions */
	double sleeps; /* times a thread went to sleep (voluntary context switches) */
};
bool bench_proc_sched(int pid, struct bench_sched *ret);
double bench_host_idle_s(void);
int bench_daemon_pid_of(const struct rdmax_client *c);
int bench_import_hex(const char *hex, struct rdmax_desc *ret_desc);
int bench_read_desc_file(const char *path, struct rdmax_desc *ret_desc);
int bench_write_desc_file(const char *path, const struct rdmax_desc *desc);
void bench_caps_string(uint32_t caps, char *buf, size_t len);

/* main.c: option parsing shared with kv */
int bench_parse_size(const char *s, uint64_t *ret_size);
int bench_parse_u64(const char *s, uint64_t *ret);

/* transfer.c: the responder and the job loop */
int bench_run_serve(struct opts *o);
int bench_shape_jobs(struct bench *b, uint64_t size);
uint64_t bench_job_bytes(const struct bench *b, uint64_t size);
/* PAGED_WRITE or PAGED_READ: jobs of page lists. */
static inline bool bench_op_paged(enum rdmax_op op)
{
	return op == RDMAX_OP_PAGED_WRITE || op == RDMAX_OP_PAGED_READ;
}
/* READ or PAGED_READ: jobs that bring the peer's bytes here. */
static inline bool bench_op_reads(enum rdmax_op op)
{
	return op == RDMAX_OP_READ || op == RDMAX_OP_PAGED_READ;
}
int bench_one_job(struct bench *b, enum rdmax_op op, uint64_t size, char *msg, size_t msg_len);
int bench_run_jobs(struct bench *b, enum rdmax_op op, uint64_t size, uint64_t count,
		   uint64_t until_ns, uint64_t *ret_jobs, uint64_t *ret_t1);

/* rows.c: per-size rows and the requester */
void bench_print_num(FILE *f, double v, int decimals);
void bench_json_string(FILE *f, const char *str);
int bench_run_requester(struct opts *o);

/* kv.c: the serving-pattern benchmark */
int bench_kv_main(int argc, char **argv);

/* pairs.c: one job of region pairs against per-layer and per-region jobs */
int bench_pairs_main(int argc, char **argv);

#endif /* RDMAX_BENCH_H */
