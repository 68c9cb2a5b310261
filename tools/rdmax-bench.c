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
 */
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

static volatile sig_atomic_t g_stop;

static void on_stop_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int fail(const char *what, int err)
{
	fprintf(stderr, "rdmax-bench: %s: %s\n", what, rdmax_strerror(err));
	return 1;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* A pattern that differs per seed, so a stale buffer never passes a check. */
static void fill_pattern(uint8_t *buf, uint64_t len, uint64_t seed)
{
	for (uint64_t i = 0; i < len; i += 8) {
		uint64_t v = mix(i / 8 + seed * 0x9e3779b97f4a7c15ull);
		memcpy(buf + i, &v, len - i < 8 ? len - i : 8);
	}
}

/* utime+stime of a process in seconds, or a negative value when unreadable. */
static double proc_cpu_s(int pid)
{
	char path[64], buf[1024];
	unsigned long long utime, stime;
	FILE *f;
	size_t n;

	if (pid <= 0) {
		return -1;
	}
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f) {
		return -1;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* comm may contain spaces and parentheses: fields restart after the last ')'. */
	char *p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
			 &stime) != 2) {
		return -1;
	}
	return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

static int daemon_pid_of(const struct rdmax_client *c)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(rdmax_client_fd(c), SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		return -errno;
	}
	return cred.pid;
}

static int parse_size(const char *s, uint64_t *ret_size)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	uint64_t mult = 1;

	if (errno || end == s) {
		return -EINVAL;
	}
	switch (*end) {
	case 'k':
	case 'K':
		mult = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mult = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mult = 1ull << 30;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' || *end == 'I') {
		end++;
	}
	if (*end == 'b' || *end == 'B') {
		end++;
	}
	if (*end != '\0' || v == 0 || v > UINT64_MAX / mult) {
		return -EINVAL;
	}
	*ret_size = v * mult;
	return 0;
}

static int parse_sizes(struct opts *o, const char *list)
{
	char *dup = strdup(list);
	char *save = NULL;
	int ret = 0;

	if (!dup) {
		return -ENOMEM;
	}
	o->n_sizes = 0;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->n_sizes == MAX_SIZES || parse_size(tok, &o->sizes[o->n_sizes]) < 0) {
			fprintf(stderr, "rdmax-bench: bad size '%s' (at most %d sizes)\n", tok,
				MAX_SIZES);
			ret = -EINVAL;
			break;
		}
		o->n_sizes++;
	}
	free(dup);
	return ret;
}

static int hex_digit(char ch)
{
	if (ch >= '0' && ch <= '9') {
		return ch - '0';
	}
	if (ch >= 'a' && ch <= 'f') {
		return ch - 'a' + 10;
	}
	if (ch >= 'A' && ch <= 'F') {
		return ch - 'A' + 10;
	}
	return -EINVAL;
}

static int import_hex(const char *hex, struct rdmax_desc *ret_desc)
{
	uint8_t buf[RDMAX_DESC_MAX];
	size_t len = strlen(hex), n = 0;

	while (len > 0 && (hex[len - 1] == '\n' || hex[len - 1] == ' ')) {
		len--;
	}
	if (len % 2 || len / 2 > sizeof(buf)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < len; i += 2) {
		int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
		if (hi < 0 || lo < 0) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		buf[n++] = (uint8_t)(hi << 4 | lo);
	}
	return rdmax_desc_import(buf, n, ret_desc);
}

/* Wait up to 30 s for the responder to publish its descriptor. */
static int read_desc_file(const char *path, struct rdmax_desc *ret_desc)
{
	uint8_t buf[RDMAX_DESC_MAX + 1];
	uint64_t deadline = now_ns() + 30000000000ull;
	FILE *f;

	while (!(f = fopen(path, "rb"))) {
		if (now_ns() > deadline) {
			fprintf(stderr, "rdmax-bench: no descriptor at '%s': %s\n", path,
				strerror(errno));
			return RDMAX_E_TIMEOUT;
		}
		usleep(10000);
	}
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	if (n > RDMAX_DESC_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	return rdmax_desc_import(buf, n, ret_desc);
}

static int write_desc_file(const char *path, const struct rdmax_desc *desc)
{
	char tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	f = fopen(tmp, "wb");
	if (!f) {
		return -errno;
	}
	if (fwrite(desc->bytes, 1, desc->len, f) != desc->len) {
		fclose(f);
		unlink(tmp);
		return -EIO;
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0) {
		int err = -errno;
		unlink(tmp);
		return err;
	}
	return 0;
}

static void caps_string(uint32_t caps, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s%s%s%s", caps & RDMAX_CAP_TCP ? "tcp " : "",
		 caps & RDMAX_CAP_VERBS ? "verbs " : "", caps & RDMAX_CAP_DMABUF ? "dmabuf " : "",
		 caps & RDMAX_CAP_PEERMEM ? "peermem " : "", caps & RDMAX_CAP_AUTH ? "auth " : "",
		 caps & RDMAX_CAP_RING ? "ring " : "");
	size_t n = strlen(buf);
	if (n > 0) {
		buf[n - 1] = '\0';
	}
}

/* ---- responder ---- */

/* \return the process exit status */
static int run_serve(struct opts *o)
{
	struct rdmax_client *c;
	struct rdmax_region *region;
	struct rdmax_desc desc;
	struct sigaction sa = {.sa_handler = on_stop_signal};
	int ret;

	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	ret = rdmax_client_open(o->socket_path, "bench-serve", &c);
	if (ret < 0) {
		return fail("connect", ret);
	}
	ret = rdmax_region_alloc_host(
		c, o->serve_bytes, RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE, &region);
	if (ret < 0) {
		rdmax_client_close(c);
		return fail("allocate region", ret);
	}
	fill_pattern(rdmax_region_addr(region), rdmax_region_length(region), 0);
	rdmax_region_desc(region, &desc);
	if (strcmp(o->desc_path, "-") == 0) {
		for (uint32_t i = 0; i < desc.len; i++) {
			printf("%02x", desc.bytes[i]);
		}
		printf("\n");
		fflush(stdout);
	} else {
		ret = write_desc_file(o->desc_path, &desc);
		if (ret < 0) {
			fprintf(stderr, "rdmax-bench: cannot write descriptor to '%s': %s\n",
				o->desc_path, strerror(-ret));
			rdmax_client_close(c);
			return 1;
		}
	}
	fprintf(stderr, "rdmax-bench: serving %" PRIu64 " bytes (read+write) on daemon pid %d\n",
		rdmax_region_length(region), daemon_pid_of(c));
	while (!g_stop) {
		struct rdmax_event ev[16];
		int n = rdmax_poll_events(c, ev, 16, 100);
		if (n < 0 && n != -EINTR) {
			rdmax_client_close(c);
			return fail("wait for events", n);
		}
		if (o->stop_file && access(o->stop_file, F_OK) == 0) {
			break;
		}
	}
	if (strcmp(o->desc_path, "-") != 0) {
		unlink(o->desc_path);
	}
	ret = rdmax_region_free(c, region);
	rdmax_client_close(c);
	return ret < 0 ? fail("deregister", ret) : 0;
}

/* ---- requester ---- */

static int ensure_t(struct bench *b, uint64_t need)
{
	if (need <= b->t_cap) {
		return 0;
	}
	uint64_t cap = b->t_cap ? b->t_cap : 1024;
	while (cap < need) {
		cap *= 2;
	}
	uint64_t *t = realloc(b->t, cap * sizeof(*t));
	if (!t) {
		return -ENOMEM;
	}
	b->t = t;
	b->t_cap = cap;
	return 0;
}

static void fill_job(struct bench *b, struct rdmax_job *j, enum rdmax_op op, uint64_t size)
{
	memset(j, 0, sizeof(*j));
	j->id = b->next_id++;
	j->op = op;
	j->local = op == RDMAX_OP_READ ? b->dst : b->src;
	switch (op) {
	case RDMAX_OP_PAGED_WRITE:
		j->remote = &b->peer;
		j->u.paged.page_len = b->page_len;
		j->u.paged.local_pages.indices = b->src_pages;
		j->u.paged.local_pages.count = b->n_pages;
		j->u.paged.remote_pages.indices = b->dst_pages;
		j->u.paged.remote_pages.count = b->n_pages;
		break;
	case RDMAX_OP_SCATTER:
		j->u.scatter.dests = b->dests;
		j->u.scatter.count = b->n_dests;
		break;
	default:
		j->length = size;
		j->remote = &b->peer;
		break;
	}
	if (b->o->has_imm && op != RDMAX_OP_READ) {
		j->flags = RDMAX_JOB_IMM;
		j->imm = b->o->imm;
	}
}

/*
 * Page lists for a paged write of `size` bytes: source pages in order,
 * destination pages reversed (a block table), so no two neighbours merge
 * into one transfer. Scatter: `dests` equal slices to the same region.
 */
static int shape_jobs(struct bench *b, uint64_t size)
{
	struct opts *o = b->o;

	if (o->op == RDMAX_OP_PAGED_WRITE) {
		b->page_len = MIN_U64(o->page_len, size);
		b->n_pages = (size_t)(size / b->page_len);
		uint32_t *s = realloc(b->src_pages, b->n_pages * sizeof(*s));
		if (!s) {
			return -ENOMEM;
		}
		b->src_pages = s;
		uint32_t *d = realloc(b->dst_pages, b->n_pages * sizeof(*d));
		if (!d) {
			return -ENOMEM;
		}
		b->dst_pages = d;
		for (size_t i = 0; i < b->n_pages; i++) {
			b->src_pages[i] = (uint32_t)i;
			b->dst_pages[i] = (uint32_t)(b->n_pages - 1 - i);
		}
	} else if (o->op == RDMAX_OP_SCATTER) {
		b->n_dests = (size_t)MIN_U64(o->dests, size);
		struct rdmax_scatter_dest *d = realloc(b->dests, b->n_dests * sizeof(*d));
		if (!d) {
			return -ENOMEM;
		}
		b->dests = d;
		uint64_t slice = size / b->n_dests;
		for (size_t i = 0; i < b->n_dests; i++) {
			memset(&d[i], 0, sizeof(d[i]));
			d[i].remote = &b->peer;
			d[i].local_offset = d[i].remote_offset = i * slice;
			d[i].length = i + 1 == b->n_dests ? size - i * slice : slice;
		}
	}
	return 0;
}

/* Bytes one job of this size moves (a paged write drops a partial last page). */
static uint64_t job_bytes(const struct bench *b, uint64_t size)
{
	return b->o->op == RDMAX_OP_PAGED_WRITE ? b->n_pages * b->page_len : size;
}

/* One job, waited for; its failure message goes to `msg`. */
static int one_job(struct bench *b, enum rdmax_op op, uint64_t size, char *msg, size_t msg_len)
{
	struct rdmax_job j;
	int ret;

	fill_job(b, &j, op, size);
	j.flags = 0;
	j.imm = 0;
	ret = rdmax_submit(b->c, &j, 1);
	if (ret < 0) {
		snprintf(msg, msg_len, "the client library refused it (rdmax_submit: %s)",
			 rdmax_strerror(ret));
		return ret;
	}
	for (;;) {
		int n = rdmax_poll_events(b->c, b->events, EVENTS_MAX, WAIT_MS);
		if (n <= 0) {
			snprintf(msg, msg_len, "no completion: %s",
				 rdmax_strerror(n == 0 ? RDMAX_E_TIMEOUT : n));
			return n == 0 ? RDMAX_E_TIMEOUT : n;
		}
		for (int k = 0; k < n; k++) {
			struct rdmax_event *e = &b->events[k];
			if (e->type == RDMAX_EVENT_COMPLETION && e->job_id == j.id) {
				if (e->status != 0) {
					snprintf(msg, msg_len, "the daemon answered %s: %s",
						 rdmax_strerror(e->status), e->reason);
				}
				return e->status;
			}
		}
	}
}

/*
 * `count` jobs (or until `until_ns` when count is 0) with at most `window`
 * outstanding and up to `batch` per submit. Latencies land in b->t[0..jobs).
 */
static int run_jobs(struct bench *b, enum rdmax_op op, uint64_t size, uint64_t count,
		    uint64_t until_ns, uint64_t *ret_jobs, uint64_t *ret_t1)
{
	struct opts *o = b->o;
	uint64_t issued = 0, done = 0, inflight = 0, t_last = now_ns();
	uint64_t base = b->next_id;
	bool stop_issuing = false;
	int ret;

	if (count) {
		ret = ensure_t(b, count);
		if (ret < 0) {
			return ret;
		}
	}
	for (;;) {
		while (!stop_issuing) {
			uint64_t k = o->batch;
			if (count) {
				k = MIN_U64(k, count - issued);
			} else if (now_ns() >= until_ns) {
				k = 0;
			}
			if (k == 0) {
				stop_issuing = true;
				break;
			}
			if (inflight + k > o->window) {
				break;
			}
			ret = ensure_t(b, issued + k);
			if (ret < 0) {
				return ret;
			}
			for (uint64_t i = 0; i < k; i++) {
				fill_job(b, &b->jobs[i], op, size);
			}
			uint64_t t = now_ns();
			ret = rdmax_submit(b->c, b->jobs, k);
			if (ret < 0) {
				b->next_id -= k;
				fprintf(stderr,
					"rdmax-bench: rdmax_submit() of %" PRIu64 " %s jobs: %s\n",
					k, o->op_name, rdmax_strerror(ret));
				return ret;
			}
			for (uint64_t i = 0; i < k; i++) {
				b->t[issued + i] = t;
			}
			issued += k;
			inflight += k;
		}
		if (stop_issuing && inflight == 0) {
			break;
		}
		int n = rdmax_poll_events(b->c, b->events, EVENTS_MAX, WAIT_MS);
		uint64_t t = now_ns();
		if (n <= 0) {
			fprintf(stderr,
				"rdmax-bench: waiting for completions (%" PRIu64
				" in flight): %s\n",
				inflight, rdmax_strerror(n == 0 ? RDMAX_E_TIMEOUT : n));
			return n == 0 ? RDMAX_E_TIMEOUT : n;
		}
		for (int i = 0; i < n; i++) {
			struct rdmax_event *e = &b->events[i];
			if (e->type != RDMAX_EVENT_COMPLETION) {
				continue;
			}
			if (e->job_id < base || e->job_id - base >= issued) {
				continue; /* not ours: left over from an earlier phase */
			}
			if (e->status != 0) {
				fprintf(stderr,
					"rdmax-bench: %s job of %" PRIu64 " bytes failed: %s: %s\n",
					o->op_name, size, rdmax_strerror(e->status), e->reason);
				return e->status;
			}
			uint64_t seq = e->job_id - base;
			b->t[seq] = t - b->t[seq];
			inflight--;
			done++;
		}
		t_last = t;
	}
	*ret_jobs = done;
	*ret_t1 = t_last;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double percentile_us(const uint64_t *sorted, uint64_t n, double p)
{
	if (n == 0) {
		return 0;
	}
	uint64_t idx = (uint64_t)ceil(p * (double)n);
	idx = idx == 0 ? 0 : idx - 1;
	return (double)sorted[MIN_U64(idx, n - 1)] / 1e3;
}

static void latency_stats(uint64_t *lat, uint64_t n, double out[5])
{
	double sum = 0;

	qsort(lat, n, sizeof(*lat), cmp_u64);
	for (uint64_t i = 0; i < n; i++) {
		sum += (double)lat[i];
	}
	out[0] = percentile_us(lat, n, 0.50);
	out[1] = percentile_us(lat, n, 0.99);
	out[2] = percentile_us(lat, n, 0.999);
	out[3] = n ? (double)lat[n - 1] / 1e3 : 0;
	out[4] = n ? sum / (double)n / 1e3 : 0;
}

static uint64_t iters_for(const struct opts *o, uint64_t size)
{
	if (o->iters) {
		return o->iters;
	}
	uint64_t n = o->lat ? DEFAULT_LAT_ITERS : DEFAULT_ITERS;
	return MAX_U64(MIN_DEFAULT_ITERS, MIN_U64(n, ITER_BYTES_CAP / size));
}

/* Check that the bytes of the last job are where they should be. */
static void verify_size(struct bench *b, uint64_t size, struct row *r)
{
	uint8_t *src = rdmax_region_addr(b->src), *dst = rdmax_region_addr(b->dst);
	int ret;

	if (b->o->op != RDMAX_OP_READ) {
		/* Read the destination back: it must hold this size's pattern. */
		memset(dst, 0, size);
		ret = one_job(b, RDMAX_OP_READ, size, r->verify_msg, sizeof(r->verify_msg));
		if (ret < 0) {
			r->verify = "skipped";
			return;
		}
	}
	bool same = true;
	if (b->o->op == RDMAX_OP_PAGED_WRITE) {
		for (size_t i = 0; i < b->n_pages && same; i++) {
			same = memcmp(src + b->src_pages[i] * b->page_len,
				      dst + b->dst_pages[i] * b->page_len, b->page_len) == 0;
		}
	} else {
		same = memcmp(src, dst, size) == 0;
	}
	if (!same) {
		r->verify = "FAILED";
		snprintf(r->verify_msg, sizeof(r->verify_msg),
			 "the bytes at the destination differ from the source");
		return;
	}
	r->verify = "ok";
}

static double memcpy_gbytes_s(void *to, const void *from, uint64_t size, uint64_t count)
{
	uint64_t t0 = now_ns();

	for (uint64_t i = 0; i < count; i++) {
		memcpy(to, from, size);
		/* Keep the compiler from eliding or merging the copies. */
		__asm__ __volatile__("" : : "r"(to) : "memory");
	}
	double secs = (double)(now_ns() - t0) / 1e9;
	return secs > 0 ? (double)(size * count) / secs / 1e9 : 0;
}

static int bench_size(struct bench *b, uint64_t size, struct row *ret_row)
{
	struct opts *o = b->o;
	struct row row, *r = &row;
	uint64_t seed = size * 7919 + (uint64_t)o->op;
	uint64_t count = o->duration_s > 0 ? 0 : iters_for(o, size);
	uint64_t jobs = 0, t1 = 0, warm = 0;
	char msg[RDMAX_MESSAGE_MAX + 64] = "";
	int ret;

	memset(r, 0, sizeof(*r));
	ret = shape_jobs(b, size);
	if (ret < 0) {
		return ret;
	}
	r->size = job_bytes(b, size);
	r->peer_cpu_s = -1;
	r->verify = "off";
	fill_pattern(rdmax_region_addr(b->src), size, seed);
	if (o->op == RDMAX_OP_READ) {
		/* The remote region must hold the pattern the reads will bring back. */
		ret = one_job(b, RDMAX_OP_WRITE, size, msg, sizeof(msg));
		if (ret < 0) {
			fprintf(stderr,
				"rdmax-bench: cannot seed the remote region for reads: %s\n", msg);
			return ret;
		}
		memset(rdmax_region_addr(b->dst), 0, size);
	}
	if (o->warmup) {
		ret = run_jobs(b, o->op, size, o->warmup, 0, &warm, &t1);
		if (ret < 0) {
			return ret;
		}
	}
	double d0 = proc_cpu_s(o->daemon_pid), p0 = proc_cpu_s(o->peer_pid);
	double c0 = self_cpu_s();
	uint64_t t0 = now_ns();
	uint64_t until = t0 + (uint64_t)(o->duration_s * 1e9);
	ret = run_jobs(b, o->op, size, count, until, &jobs, &t1);
	if (ret < 0) {
		return ret;
	}
	double d1 = proc_cpu_s(o->daemon_pid), p1 = proc_cpu_s(o->peer_pid);
	r->client_cpu_s = self_cpu_s() - c0;
	r->jobs = jobs;
	r->seconds = (double)(t1 - t0) / 1e9;
	if (r->seconds > 0) {
		r->gbytes_s = (double)(r->size * jobs) / r->seconds / 1e9;
		r->gbits_s = r->gbytes_s * 8;
		r->jobs_s = (double)jobs / r->seconds;
	}
	r->daemon_cpu_s = d0 >= 0 && d1 >= 0 ? d1 - d0 : -1;
	r->peer_cpu_s = p0 >= 0 && p1 >= 0 ? p1 - p0 : -1;
	latency_stats(b->t, jobs, r->lat_us);
	if (o->verify) {
		verify_size(b, size, r);
	}
	if (o->mode == MODE_LOCAL) {
		/* Reference: the same copies by the CPU in this process, between two mappings. */
		uint8_t *from = rdmax_region_addr(b->src);
		uint8_t *to = rdmax_region_addr(b->dst);
		memcpy_gbytes_s(to, from, size, MIN_U64(o->warmup, jobs));
		r->ref_gbytes_s = memcpy_gbytes_s(to, from, size, MAX_U64(jobs, 1));
	}
	*ret_row = row;
	return 0;
}

static double per_gb(double cpu_s, const struct row *r)
{
	double gb = (double)(r->size * r->jobs) / 1e9;
	return cpu_s >= 0 && gb > 0 ? cpu_s / gb : -1;
}

static void print_num(FILE *f, double v, int decimals)
{
	if (v < 0 || isnan(v) || isinf(v)) {
		fprintf(f, "null");
	} else {
		fprintf(f, "%.*f", decimals, v);
	}
}

/* A JSON string: quotes and backslashes escaped, control characters dropped. */
static void json_string(FILE *f, const char *str)
{
	fputc('"', f);
	for (const char *p = str ? str : ""; *p; p++) {
		if (*p == '"' || *p == '\\') {
			fputc('\\', f);
		}
		if ((unsigned char)*p >= 0x20) {
			fputc(*p, f);
		}
	}
	fputc('"', f);
}

static void print_json(FILE *f, const struct opts *o, const struct rdmax_daemon_info *info,
		       const struct row *rows, uint32_t n_rows, const char *status,
		       const char *status_msg)
{
	char caps[64];

	caps_string(info ? info->capabilities : 0, caps, sizeof(caps));
	fprintf(f, "{\"tool\": \"rdmax-bench\", \"mode\": \"%s\", \"label\": ",
		o->mode == MODE_LOCAL ? "local" : "run");
	json_string(f, o->label);
	fprintf(f, ", \"op\": \"%s\", \"status\": \"%s\", \"message\": ", o->op_name, status);
	json_string(f, status_msg);
	fprintf(f, ", \"daemon\": {\"node\": ");
	json_string(f, info ? info->node_name : NULL);
	fprintf(f, ", \"version\": ");
	json_string(f, info ? info->daemon_version : NULL);
	fprintf(f, ", \"capabilities\": \"%s\", \"pid\": %d, \"peer_pid\": %d}, ", caps,
		o->daemon_pid, o->peer_pid);
	fprintf(f, "\"ring\": %s, ", o->no_ring ? "false" : "true");
	fprintf(f,
		"\"params\": {\"window\": %u, \"batch\": %u, \"iters\": %" PRIu64
		", \"duration_s\": %g, \"warmup\": %u, \"imm\": %s, \"lat\": %s, \"page_len\": "
		"%" PRIu64 ", \"dests\": %u}, \"results\": [",
		o->window, o->batch, o->iters, o->duration_s, o->warmup,
		o->has_imm ? "true" : "false", o->lat ? "true" : "false",
		o->op == RDMAX_OP_PAGED_WRITE ? o->page_len : 0,
		o->op == RDMAX_OP_SCATTER ? o->dests : 0);
	for (uint32_t i = 0; i < n_rows; i++) {
		const struct row *r = &rows[i];
		fprintf(f,
			"%s\n  {\"bytes\": %" PRIu64 ", \"jobs\": %" PRIu64
			", \"seconds\": %.6f, \"GBps\": %.6f, \"Gbps\": %.6f, \"jobs_per_s\": "
			"%.1f, ",
			i ? "," : "", r->size, r->jobs, r->seconds, r->gbytes_s, r->gbits_s,
			r->jobs_s);
		fprintf(f,
			"\"lat_us\": {\"p50\": %.3f, \"p99\": %.3f, \"p999\": %.3f, \"max\": %.3f, "
			"\"mean\": %.3f}, ",
			r->lat_us[0], r->lat_us[1], r->lat_us[2], r->lat_us[3], r->lat_us[4]);
		fprintf(f, "\"daemon_cpu_s\": ");
		print_num(f, r->daemon_cpu_s, 3);
		fprintf(f, ", \"daemon_cpu_s_per_GB\": ");
		print_num(f, per_gb(r->daemon_cpu_s, r), 4);
		fprintf(f, ", \"peer_cpu_s\": ");
		print_num(f, r->peer_cpu_s, 3);
		fprintf(f, ", \"peer_cpu_s_per_GB\": ");
		print_num(f, per_gb(r->peer_cpu_s, r), 4);
		fprintf(f, ", \"client_cpu_s_per_GB\": ");
		print_num(f, per_gb(r->client_cpu_s, r), 4);
		if (o->mode == MODE_LOCAL) {
			fprintf(f, ", \"memcpy_GBps\": %.6f", r->ref_gbytes_s);
		}
		fprintf(f, ", \"verify\": \"%s\"}", r->verify);
	}
	fprintf(f, "\n]}\n");
}

static void print_header(FILE *f, const struct opts *o, const struct rdmax_daemon_info *info)
{
	char caps[64];

	caps_string(info->capabilities, caps, sizeof(caps));
	fprintf(f, "rdmax-bench %s%s%s: window %u, batch %u%s%s, daemon '%s' %s (pid %d, %s)",
		o->op_name, o->lat ? " --lat" : "", o->mode == MODE_LOCAL ? " same-node" : "",
		o->window, o->batch, o->has_imm ? ", imm" : "", o->no_ring ? ", no ring" : "",
		info->node_name, info->daemon_version, o->daemon_pid, caps);
	if (o->op == RDMAX_OP_PAGED_WRITE) {
		fprintf(f, ", pages of %" PRIu64 " bytes", o->page_len);
	} else if (o->op == RDMAX_OP_SCATTER) {
		fprintf(f, ", %u destinations per job", o->dests);
	}
	if (o->peer_pid > 0) {
		fprintf(f, ", peer pid %d", o->peer_pid);
	}
	fprintf(f, "\n%9s %8s %8s %8s %8s %10s %9s %9s %9s %9s %9s%s %s\n", "bytes", "jobs",
		"seconds", "GB/s", "Gb/s", "jobs/s", "p50_us", "p99_us", "p99.9_us", "max_us",
		"dCPU_s/GB", o->mode == MODE_LOCAL ? "  memcpy_GB/s" : "", "verify");
	fflush(f);
}

static void print_row(FILE *f, const struct opts *o, const struct row *r)
{
	double cpu = per_gb(r->daemon_cpu_s, r);

	fprintf(f, "%9" PRIu64 " %8" PRIu64 " %8.3f %8.3f %8.3f %10.0f %9.1f %9.1f %9.1f %9.1f ",
		r->size, r->jobs, r->seconds, r->gbytes_s, r->gbits_s, r->jobs_s, r->lat_us[0],
		r->lat_us[1], r->lat_us[2], r->lat_us[3]);
	if (cpu >= 0) {
		fprintf(f, "%9.3f", cpu);
	} else {
		fprintf(f, "%9s", "-");
	}
	if (o->mode == MODE_LOCAL) {
		fprintf(f, " %13.3f", r->ref_gbytes_s);
	}
	fprintf(f, " %s%s%s\n", r->verify, r->verify_msg[0] ? ": " : "", r->verify_msg);
	fflush(f);
}

/*
 * Paged and scatter jobs are newer than write and read: try one first and,
 * when the library or the daemon refuses the kind, say clearly which of the
 * two answered and what, instead of failing inside a timed loop.
 * \return 0 when the op works, else the refusal (RDMAX_E_UNIMPLEMENTED when
 *         the kind is not implemented)
 */
static int probe_op(struct bench *b, const struct rdmax_daemon_info *info)
{
	struct opts *o = b->o;
	char msg[RDMAX_MESSAGE_MAX + 64] = "";
	int ret = shape_jobs(b, o->sizes[0]);

	if (ret == 0) {
		ret = one_job(b, o->op, o->sizes[0], msg, sizeof(msg));
	}
	if (ret == 0) {
		return 0;
	}
	fprintf(stderr, "rdmax-bench: op '%s' is not available: %s\n", o->op_name, msg);
	if (o->json) {
		FILE *f = stdout;
		if (o->json_path && strcmp(o->json_path, "-") != 0) {
			f = fopen(o->json_path, "w");
		}
		if (f) {
			print_json(f, o, info, NULL, 0,
				   ret == RDMAX_E_UNIMPLEMENTED ? "unimplemented" : "failed", msg);
			if (f != stdout) {
				fclose(f);
			}
		}
	}
	return ret;
}

/* \return the process exit status: 0, 1, or EXIT_UNAVAILABLE */
static int run_requester(struct opts *o)
{
	struct bench b = {.o = o, .next_id = 1};
	struct rdmax_client *target_client = NULL;
	struct rdmax_region *target = NULL;
	struct row rows[MAX_SIZES];
	uint32_t n_rows = 0;
	uint64_t max_size = 0;
	int ret, status = 1;

	for (uint32_t i = 0; i < o->n_sizes; i++) {
		max_size = MAX_U64(max_size, o->sizes[i]);
	}
	if (o->mode == MODE_RUN) {
		ret = o->desc_hex ? import_hex(o->desc_hex, &b.peer)
				  : read_desc_file(o->desc_path, &b.peer);
		if (ret < 0) {
			return fail("import descriptor", ret);
		}
	}
	ret = rdmax_client_open(o->socket_path, "bench", &b.c);
	if (ret < 0) {
		return fail("connect", ret);
	}
	/* What the connection does, not what was asked: an older daemon offers no ring. */
	o->no_ring = rdmax_client_uses_ring(b.c) != 1;
	const struct rdmax_daemon_info *info = rdmax_client_info(b.c);
	if (o->daemon_pid == 0) {
		int pid = daemon_pid_of(b.c);
		o->daemon_pid = pid > 0 ? pid : -1;
	}
	if (o->batch > info->max_jobs_per_submit) {
		o->batch = info->max_jobs_per_submit;
	}
	if (o->window > info->max_outstanding_jobs) {
		o->window = info->max_outstanding_jobs;
	}
	if (o->mode == MODE_LOCAL) {
		/* The target belongs to a second client of the same daemon: a same-node copy. */
		ret = rdmax_client_open(o->socket_path, "bench-target", &target_client);
		if (ret < 0) {
			fail("connect the target client", ret);
			goto out_close;
		}
		ret = rdmax_region_alloc_host(target_client, max_size,
					      RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE,
					      &target);
		if (ret < 0) {
			fail("allocate the target region", ret);
			goto out_close;
		}
		rdmax_region_desc(target, &b.peer);
	}
	ret = rdmax_region_alloc_host(b.c, max_size, RDMAX_ACCESS_LOCAL, &b.src);
	if (ret < 0) {
		fail("allocate the source region", ret);
		goto out_close;
	}
	ret = rdmax_region_alloc_host(b.c, max_size, RDMAX_ACCESS_LOCAL, &b.dst);
	if (ret < 0) {
		fail("allocate the destination region", ret);
		goto out_close;
	}
	/* Fault the pages in now, not inside the first timed job. */
	memset(rdmax_region_addr(b.src), 0, max_size);
	memset(rdmax_region_addr(b.dst), 0, max_size);
	b.jobs = calloc(o->batch, sizeof(*b.jobs));
	if (!b.jobs) {
		fail("allocate", -ENOMEM);
		goto out_close;
	}
	if (o->op == RDMAX_OP_PAGED_WRITE || o->op == RDMAX_OP_SCATTER) {
		ret = probe_op(&b, info);
		if (ret < 0) {
			status = ret == RDMAX_E_UNIMPLEMENTED ? EXIT_UNAVAILABLE : 1;
			goto out_close;
		}
	}
	bool table = !o->json || (o->json_path && strcmp(o->json_path, "-") != 0);
	if (table) {
		print_header(stdout, o, info);
	}
	for (uint32_t i = 0; i < o->n_sizes; i++) {
		ret = bench_size(&b, o->sizes[i], &rows[n_rows]);
		if (ret < 0) {
			goto out_report;
		}
		/* Row by row, so a long sweep shows progress. */
		if (table) {
			print_row(stdout, o, &rows[n_rows]);
		}
		n_rows++;
	}
	status = 0;
out_report:
	for (uint32_t i = 0; i < n_rows; i++) {
		if (strcmp(rows[i].verify, "FAILED") == 0) {
			status = 1;
		}
	}
	if (o->json) {
		FILE *f = stdout;
		if (o->json_path && strcmp(o->json_path, "-") != 0) {
			f = fopen(o->json_path, "w");
			if (!f) {
				fprintf(stderr, "rdmax-bench: cannot write '%s': %s\n",
					o->json_path, strerror(errno));
				status = 1;
			}
		}
		if (f) {
			print_json(f, o, info, rows, n_rows, status == 0 ? "ok" : "failed",
				   status == 0 ? "" : "see stderr");
			if (f != stdout) {
				fclose(f);
			}
		}
	}
out_close:
	free(b.jobs);
	free(b.t);
	free(b.src_pages);
	free(b.dst_pages);
	free(b.dests);
	rdmax_client_close(b.c);
	rdmax_client_close(target_client);
	return status;
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: rdmax-bench serve --socket PATH --desc FILE|- [--size BYTES] [--stop-file "
		"FILE]\n"
		"       rdmax-bench run   --socket PATH (--desc FILE | --desc-hex HEX) [OPTIONS]\n"
		"       rdmax-bench local --socket PATH [OPTIONS]\n"
		"\n"
		"serve: register a region (remote read+write), publish its descriptor to FILE\n"
		"       (atomically) or as hex on stdout (-), wait for SIGTERM/SIGINT or FILE.\n"
		"run:   jobs against a published region. local: two clients of one daemon (the\n"
		"       daemon copies locally) against memcpy of the same sizes.\n"
		"\n"
		"  -o, --op OP          write | read | paged | scatter (default write)\n"
		"  -a, --all            sizes 2 B .. 8 MiB, powers of two\n"
		"  -s, --sizes LIST     comma-separated sizes, K/M/G suffixes (default 64K)\n"
		"  -w, --window N       outstanding jobs (default %u)\n"
		"  -b, --batch N        jobs per rdmax_submit() (default 1)\n"
		"  -n, --iters N        jobs per size (default %u, at most 1 GiB per size)\n"
		"  -D, --duration SECS  run each size this long instead of -n\n"
		"      --warmup N       untimed jobs before each size (default %u)\n"
		"      --page-len BYTES paged: bytes per page (default 16K); destination pages\n"
		"                       are the source pages in reverse order (a block table)\n"
		"      --dests N        scatter: destinations per job, equal slices (default 4)\n"
		"      --imm VALUE      writes carry this immediate value\n"
		"      --lat            latency mode: window 1, batch 1\n"
		"      --no-ring        jobs and completions over the socket, not the "
		"shared-memory\n"
		"                       ring (sets RDMAX_RING=0 for this process)\n"
		"      --no-verify      skip the read-back check after each size\n"
		"      --daemon-pid PID the local daemon (default: SO_PEERCRED of the socket)\n"
		"      --peer-daemon-pid PID  also report the peer daemon's CPU time\n"
		"      --label TEXT     copied into the JSON\n"
		"      --json[=FILE]    JSON to stdout (table suppressed) or to FILE\n",
		DEFAULT_WINDOW, DEFAULT_ITERS, DEFAULT_WARMUP);
}

static int parse_u64(const char *s, uint64_t *ret)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s || *end) {
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	enum {
		OPT_WARMUP = 256,
		OPT_IMM,
		OPT_LAT,
		OPT_NO_RING,
		OPT_NO_VERIFY,
		OPT_DAEMON_PID,
		OPT_PEER_PID,
		OPT_LABEL,
		OPT_JSON,
		OPT_DESC_HEX,
		OPT_STOP_FILE,
		OPT_SIZE,
		OPT_PAGE_LEN,
		OPT_DESTS,
	};
	static const struct option options[] = {
		{"socket", required_argument, NULL, 'S'},
		{"desc", required_argument, NULL, 'd'},
		{"desc-hex", required_argument, NULL, OPT_DESC_HEX},
		{"stop-file", required_argument, NULL, OPT_STOP_FILE},
		{"size", required_argument, NULL, OPT_SIZE},
		{"op", required_argument, NULL, 'o'},
		{"all", no_argument, NULL, 'a'},
		{"sizes", required_argument, NULL, 's'},
		{"window", required_argument, NULL, 'w'},
		{"batch", required_argument, NULL, 'b'},
		{"iters", required_argument, NULL, 'n'},
		{"duration", required_argument, NULL, 'D'},
		{"warmup", required_argument, NULL, OPT_WARMUP},
		{"imm", required_argument, NULL, OPT_IMM},
		{"lat", no_argument, NULL, OPT_LAT},
		{"no-ring", no_argument, NULL, OPT_NO_RING},
		{"no-verify", no_argument, NULL, OPT_NO_VERIFY},
		{"daemon-pid", required_argument, NULL, OPT_DAEMON_PID},
		{"peer-daemon-pid", required_argument, NULL, OPT_PEER_PID},
		{"label", required_argument, NULL, OPT_LABEL},
		{"page-len", required_argument, NULL, OPT_PAGE_LEN},
		{"dests", required_argument, NULL, OPT_DESTS},
		{"json", optional_argument, NULL, OPT_JSON},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool window_set = false, batch_set = false;
	uint64_t v;
	int opt;

	if (argc < 2) {
		usage(stderr);
		return -EINVAL;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(stdout);
		exit(0);
	}
	if (strcmp(argv[1], "serve") == 0) {
		o->mode = MODE_SERVE;
	} else if (strcmp(argv[1], "run") == 0) {
		o->mode = MODE_RUN;
	} else if (strcmp(argv[1], "local") == 0) {
		o->mode = MODE_LOCAL;
	} else {
		fprintf(stderr, "rdmax-bench: unknown mode '%s' (serve, run or local)\n", argv[1]);
		return -EINVAL;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "S:d:o:as:w:b:n:D:h", options, NULL)) != -1) {
		switch (opt) {
		case 'S':
			o->socket_path = optarg;
			break;
		case 'd':
			o->desc_path = optarg;
			break;
		case OPT_DESC_HEX:
			o->desc_hex = optarg;
			break;
		case OPT_STOP_FILE:
			o->stop_file = optarg;
			break;
		case OPT_SIZE:
			if (parse_size(optarg, &o->serve_bytes) < 0) {
				fprintf(stderr, "rdmax-bench: bad --size '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case 'o':
			o->op_name = optarg;
			if (strcmp(optarg, "write") == 0) {
				o->op = RDMAX_OP_WRITE;
			} else if (strcmp(optarg, "read") == 0) {
				o->op = RDMAX_OP_READ;
			} else if (strcmp(optarg, "paged") == 0 ||
				   strcmp(optarg, "paged_write") == 0) {
				o->op = RDMAX_OP_PAGED_WRITE;
			} else if (strcmp(optarg, "scatter") == 0) {
				o->op = RDMAX_OP_SCATTER;
			} else {
				fprintf(stderr,
					"rdmax-bench: unknown op '%s' (write, read, paged, "
					"scatter)\n",
					optarg);
				return -EINVAL;
			}
			break;
		case 'a':
			o->n_sizes = 0;
			for (uint64_t s = SWEEP_MIN; s <= SWEEP_MAX; s *= 2) {
				o->sizes[o->n_sizes++] = s;
			}
			break;
		case 's':
			if (parse_sizes(o, optarg) < 0) {
				return -EINVAL;
			}
			break;
		case 'w':
			if (parse_u64(optarg, &v) < 0 || v == 0 || v > 1048576) {
				fprintf(stderr, "rdmax-bench: bad window '%s'\n", optarg);
				return -EINVAL;
			}
			o->window = (uint32_t)v;
			window_set = true;
			break;
		case 'b':
			if (parse_u64(optarg, &v) < 0 || v == 0 || v > 65536) {
				fprintf(stderr, "rdmax-bench: bad batch '%s'\n", optarg);
				return -EINVAL;
			}
			o->batch = (uint32_t)v;
			batch_set = true;
			break;
		case 'n':
			if (parse_u64(optarg, &o->iters) < 0 || o->iters == 0) {
				fprintf(stderr, "rdmax-bench: bad iteration count '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case 'D': {
			char *end;
			o->duration_s = strtod(optarg, &end);
			if (*end || !(o->duration_s > 0 && o->duration_s < 3600)) {
				fprintf(stderr, "rdmax-bench: bad duration '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		}
		case OPT_WARMUP:
			if (parse_u64(optarg, &v) < 0 || v > 1000000) {
				fprintf(stderr, "rdmax-bench: bad warm-up count '%s'\n", optarg);
				return -EINVAL;
			}
			o->warmup = (uint32_t)v;
			break;
		case OPT_IMM:
			if (parse_u64(optarg, &v) < 0 || v > UINT32_MAX) {
				fprintf(stderr, "rdmax-bench: bad imm '%s'\n", optarg);
				return -EINVAL;
			}
			o->has_imm = true;
			o->imm = (uint32_t)v;
			break;
		case OPT_LAT:
			o->lat = true;
			break;
		case OPT_NO_RING:
			o->no_ring = true;
			setenv("RDMAX_RING", "0", 1);
			break;
		case OPT_NO_VERIFY:
			o->verify = false;
			break;
		case OPT_DAEMON_PID:
		case OPT_PEER_PID:
			if (parse_u64(optarg, &v) < 0 || v == 0 || v > INT32_MAX) {
				fprintf(stderr, "rdmax-bench: bad pid '%s'\n", optarg);
				return -EINVAL;
			}
			*(opt == OPT_DAEMON_PID ? &o->daemon_pid : &o->peer_pid) = (int)v;
			break;
		case OPT_LABEL:
			o->label = optarg;
			break;
		case OPT_PAGE_LEN:
			if (parse_size(optarg, &o->page_len) < 0) {
				fprintf(stderr, "rdmax-bench: bad --page-len '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case OPT_DESTS:
			if (parse_u64(optarg, &v) < 0 || v == 0 || v > 4096) {
				fprintf(stderr, "rdmax-bench: bad --dests '%s'\n", optarg);
				return -EINVAL;
			}
			o->dests = (uint32_t)v;
			break;
		case OPT_JSON:
			o->json = true;
			o->json_path = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "rdmax-bench: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (o->mode == MODE_SERVE && !o->desc_path) {
		fprintf(stderr, "rdmax-bench: serve needs --desc FILE or --desc -\n");
		return -EINVAL;
	}
	if (o->mode == MODE_RUN && !o->desc_path == !o->desc_hex) {
		fprintf(stderr, "rdmax-bench: run needs one of --desc FILE and --desc-hex HEX\n");
		return -EINVAL;
	}
	if (o->lat) {
		if ((window_set && o->window != 1) || (batch_set && o->batch != 1)) {
			fprintf(stderr, "rdmax-bench: --lat runs with window 1 and batch 1\n");
			return -EINVAL;
		}
		o->window = 1;
		o->batch = 1;
	}
	if (o->batch > o->window) {
		if (batch_set && window_set) {
			fprintf(stderr, "rdmax-bench: batch %u exceeds window %u\n", o->batch,
				o->window);
			return -EINVAL;
		}
		o->window = o->batch;
	}
	if (o->iters && o->duration_s > 0) {
		fprintf(stderr, "rdmax-bench: -n and -D exclude each other\n");
		return -EINVAL;
	}
	return 0;
}

/*
 * ---- kv: the serving pattern ----
 *
 * Several prefill clients (processes, on the --socket daemon) push requests
 * into one decode client (on the --decode-socket daemon). A request is
 * `layers` PAGED_WRITE jobs of `blocks` blocks of block_len bytes, every
 * job carrying the request's imm; the decode client claims each imm for
 * `layers` landings, then checks every byte of the request's blocks (the
 * block's pattern and the request's sequence number at both ends), clears
 * them and hands the slot back to its prefill client over a pipe. The
 * decode side's block table is a permutation into a pool of twice as many
 * blocks, so no two blocks of a job are contiguous there. Each prefill
 * client keeps `window` requests in flight.
 */
#define KV_IMM(client, slot) (0x4b560000u | (uint32_t)(client) << 8 | (uint32_t)(slot))
#define KV_CLIENTS_MAX       64
#define KV_WINDOW_MAX        64

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
	bool verify; /* the decode client checks and clears every block */
};

/* What a prefill client tells the parent at the end. */
struct kv_result {
	uint64_t requests;
	uint64_t seconds_ns;
	uint64_t lat_ns_p50;
	uint64_t lat_ns_p99;
	int status;
};

static uint64_t kv_request_bytes(const struct kv_opts *k)
{
	return (uint64_t)k->layers * k->blocks * k->block_len;
}

static uint32_t kv_gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* Pool block of the decode side for block i of (client, slot, layer): a permutation. */
static uint32_t kv_dst_block(const struct kv_opts *k, uint32_t client, uint32_t slot,
			     uint32_t layer, uint32_t i)
{
	uint32_t pool = 2 * k->blocks; /* blocks of one (client, slot, layer) */
	uint32_t step = k->blocks + 1;

	while (kv_gcd(step, pool) != 1) {
		step++; /* coprime with the pool: i -> i * step % pool never repeats */
	}
	uint64_t area = (((uint64_t)client * k->window + slot) * k->layers + layer) * pool;
	return (uint32_t)(area + (uint64_t)i * step % pool);
}

/* Block content: the pattern of (client, layer, block), the sequence number at both ends. */
static void kv_fill_block(uint8_t *p, const struct kv_opts *k, uint32_t client, uint32_t layer,
			  uint32_t i, uint64_t seq)
{
	fill_pattern(p, k->block_len, ((uint64_t)client << 40) ^ ((uint64_t)layer << 20) ^ i);
	memcpy(p, &seq, sizeof(seq));
	memcpy(p + k->block_len - sizeof(seq), &seq, sizeof(seq));
}

static int kv_decode(const struct kv_opts *k, int desc_fd, int *token_fds, int result_fd)
{
	uint64_t pool_blocks = (uint64_t)k->clients * k->window * k->layers * 2 * k->blocks;
	uint64_t verified = 0;
	uint64_t next_seq[KV_CLIENTS_MAX][KV_WINDOW_MAX];
	struct rdmax_event ev[EVENTS_MAX];
	struct rdmax_client *c;
	struct rdmax_region *pool;
	struct rdmax_desc desc;
	/* Every block's pattern, computed once: checking must not cost more than moving. */
	uint64_t n_patterns = (uint64_t)k->clients * k->layers * k->blocks;
	uint8_t *expect = malloc(n_patterns * k->block_len);
	int ret;

	if (!expect) {
		return fail("kv decode: malloc", -ENOMEM);
	}
	for (uint32_t cl = 0; cl < k->clients; cl++) {
		for (uint32_t l = 0; l < k->layers; l++) {
			for (uint32_t i = 0; i < k->blocks; i++) {
				uint64_t at = ((uint64_t)cl * k->layers + l) * k->blocks + i;
				kv_fill_block(expect + at * k->block_len, k, cl, l, i, 0);
			}
		}
	}
	ret = rdmax_client_open(k->decode_socket, "rdmax-bench-kv-decode", &c);
	if (ret < 0) {
		return fail("kv decode: rdmax_client_open", ret);
	}
	ret = rdmax_region_alloc_host(c, pool_blocks * k->block_len, RDMAX_ACCESS_REMOTE_WRITE,
				      &pool);
	if (ret < 0) {
		return fail("kv decode: rdmax_region_alloc_host", ret);
	}
	for (uint32_t cl = 0; cl < k->clients; cl++) {
		for (uint32_t w = 0; w < k->window; w++) {
			next_seq[cl][w] = w;
			ret = rdmax_expect_imm(c, KV_IMM(cl, w), k->layers);
			if (ret < 0) {
				return fail("kv decode: rdmax_expect_imm", ret);
			}
		}
	}
	rdmax_region_desc(pool, &desc);
	if (write(desc_fd, &desc, sizeof(desc)) != (ssize_t)sizeof(desc)) {
		return fail("kv decode: handing over the descriptor", -errno);
	}
	close(desc_fd);
	uint8_t *base = rdmax_region_addr(pool);
	while (!g_stop) {
		int n = rdmax_poll_events(c, ev, EVENTS_MAX, 100);
		if (n == -EINTR) {
			continue;
		}
		if (n < 0) {
			return fail("kv decode: rdmax_poll_events", n);
		}
		for (int e = 0; e < n; e++) {
			if (ev[e].type != RDMAX_EVENT_IMM_REACHED) {
				continue;
			}
			uint32_t cl = (ev[e].imm >> 8) & 0xff, w = ev[e].imm & 0xff;
			uint64_t seq = next_seq[cl][w];
			/* Every layer landed: every byte of every block must be this request's. */
			for (uint32_t l = 0; k->verify && l < k->layers; l++) {
				for (uint32_t i = 0; i < k->blocks; i++) {
					uint8_t *got =
						base + (uint64_t)kv_dst_block(k, cl, w, l, i) *
							       k->block_len;
					const uint8_t *want =
						expect +
						((((uint64_t)cl * k->layers + l) * k->blocks) + i) *
							k->block_len;
					uint64_t head, tail;
					memcpy(&head, got, sizeof(head));
					memcpy(&tail, got + k->block_len - sizeof(tail),
					       sizeof(tail));
					if (head != seq || tail != seq ||
					    memcmp(got + sizeof(head), want + sizeof(head),
						   k->block_len - 2 * sizeof(head)) != 0) {
						fprintf(stderr,
							"rdmax-bench kv: client %u request %" PRIu64
							" layer %u block %u: bytes differ\n",
							cl, seq, l, i);
						return 1;
					}
					/* Cleared, so a block that did not land again never passes.
					 */
					memset(got, 0, k->block_len);
				}
			}
			verified++;
			next_seq[cl][w] = seq + k->window;
			ret = rdmax_expect_imm(c, ev[e].imm, k->layers);
			if (ret < 0) {
				return fail("kv decode: rdmax_expect_imm", ret);
			}
			if (write(token_fds[cl], &w, sizeof(w)) != (ssize_t)sizeof(w)) {
				return fail("kv decode: handing back a slot", -errno);
			}
		}
	}
	if (write(result_fd, &verified, sizeof(verified)) != (ssize_t)sizeof(verified)) {
		return 1;
	}
	free(expect);
	rdmax_client_close(c);
	return 0;
}

static int kv_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int kv_prefill(const struct kv_opts *k, uint32_t client, const struct rdmax_desc *peer,
		      int token_fd, int result_fd)
{
	uint64_t slot_bytes = (uint64_t)k->layers * k->blocks * k->block_len;
	struct kv_result res = {0};
	struct rdmax_event ev[EVENTS_MAX];
	struct rdmax_job *jobs = calloc(k->layers, sizeof(*jobs));
	uint32_t *src_idx = calloc((size_t)k->window * k->layers * k->blocks, sizeof(uint32_t));
	uint32_t *dst_idx = calloc((size_t)k->window * k->layers * k->blocks, sizeof(uint32_t));
	uint64_t *t_sent = calloc(k->window, sizeof(uint64_t));
	uint64_t lat_cap = 1 << 16, n_lat = 0;
	uint64_t *lat = malloc(lat_cap * sizeof(*lat));
	uint32_t free_slots[KV_WINDOW_MAX], n_free = k->window, outstanding = 0;
	struct rdmax_client *c;
	struct rdmax_region *src;
	uint64_t seq_of[KV_WINDOW_MAX], job_id = 1, last_token;
	int ret;

	if (!jobs || !src_idx || !dst_idx || !t_sent || !lat) {
		return fail("kv prefill: calloc", -ENOMEM);
	}
	ret = rdmax_client_open(k->socket_path, "rdmax-bench-kv-prefill", &c);
	if (ret < 0) {
		return fail("kv prefill: rdmax_client_open", ret);
	}
	ret = rdmax_region_alloc_host(c, k->window * slot_bytes, RDMAX_ACCESS_LOCAL, &src);
	if (ret < 0) {
		return fail("kv prefill: rdmax_region_alloc_host", ret);
	}
	uint8_t *base = rdmax_region_addr(src);
	for (uint32_t w = 0; w < k->window; w++) {
		free_slots[w] = k->window - 1 - w;
		seq_of[w] = w;
		for (uint32_t l = 0; l < k->layers; l++) {
			for (uint32_t i = 0; i < k->blocks; i++) {
				size_t at = ((size_t)w * k->layers + l) * k->blocks + i;
				src_idx[at] = (uint32_t)at;
				dst_idx[at] = kv_dst_block(k, client, w, l, i);
				kv_fill_block(base + at * k->block_len, k, client, l, i, 0);
			}
		}
	}
	uint64_t t0 = now_ns(), until = t0 + (uint64_t)(k->duration_s * 1e9);
	last_token = t0;
	while (!g_stop && (outstanding > 0 || now_ns() < until)) {
		while (n_free > 0 && now_ns() < until) {
			uint32_t w = free_slots[--n_free];
			/* Slot w carries requests w, w + window, ...: the decode side expects that.
			 */
			uint64_t seq = seq_of[w];
			seq_of[w] += k->window;
			for (uint32_t l = 0; l < k->layers; l++) {
				for (uint32_t i = 0; i < k->blocks; i++) {
					uint8_t *p =
						base + (((uint64_t)w * k->layers + l) * k->blocks +
							i) * k->block_len;
					memcpy(p, &seq, sizeof(seq));
					memcpy(p + k->block_len - sizeof(seq), &seq, sizeof(seq));
				}
				size_t at = ((size_t)w * k->layers + l) * k->blocks;
				jobs[l] = (struct rdmax_job){
					.id = job_id++,
					.op = RDMAX_OP_PAGED_WRITE,
					.flags = RDMAX_JOB_IMM,
					.imm = KV_IMM(client, w),
					.local = src,
					.remote = peer,
					.u.paged = {.page_len = k->block_len,
						    .local_pages = {.indices = src_idx + at,
								    .count = k->blocks},
						    .remote_pages = {.indices = dst_idx + at,
								     .count = k->blocks}},
				};
			}
			t_sent[w] = now_ns();
			ret = rdmax_submit(c, jobs, k->layers);
			if (ret < 0) {
				return fail("kv prefill: rdmax_submit", ret);
			}
			outstanding++;
		}
		int n = rdmax_poll_events(c, ev, EVENTS_MAX, 0);
		if (n < 0) {
			return fail("kv prefill: rdmax_poll_events", n);
		}
		for (int e = 0; e < n; e++) {
			if (ev[e].type == RDMAX_EVENT_COMPLETION && ev[e].status != 0) {
				fprintf(stderr, "rdmax-bench kv: paged write failed: %s: %s\n",
					rdmax_strerror(ev[e].status), ev[e].reason);
				return 1;
			}
		}
		uint32_t w;
		int tokens = 0;
		if (outstanding > 0 && now_ns() - last_token > (uint64_t)WAIT_MS * 1000000) {
			return fail("kv prefill: no request verified for 30 s", RDMAX_E_TIMEOUT);
		}
		while (read(token_fd, &w, sizeof(w)) == (ssize_t)sizeof(w)) {
			last_token = now_ns();
			if (w >= k->window || outstanding == 0) {
				return fail("kv prefill: slot token", -EPROTO);
			}
			if (n_lat == lat_cap) {
				lat_cap *= 2;
				uint64_t *nl = realloc(lat, lat_cap * sizeof(*lat));
				if (!nl) {
					return fail("kv prefill: realloc", -ENOMEM);
				}
				lat = nl;
			}
			lat[n_lat++] = now_ns() - t_sent[w];
			free_slots[n_free++] = w;
			outstanding--;
			res.requests++;
			tokens++;
		}
		if (n == 0 && tokens == 0 && outstanding > 0) {
			/* Nothing to do: sleep until a completion or a slot comes back. */
			struct pollfd pfd[2] = {{.fd = token_fd, .events = POLLIN},
						{.fd = rdmax_client_fd(c), .events = POLLIN}};
			poll(pfd, 2, 100);
		}
	}
	res.seconds_ns = now_ns() - t0;
	if (n_lat > 0) {
		qsort(lat, n_lat, sizeof(*lat), kv_cmp_u64);
		res.lat_ns_p50 = lat[(n_lat - 1) / 2];
		res.lat_ns_p99 = lat[(uint64_t)((double)(n_lat - 1) * 0.99)];
	}
	if (write(result_fd, &res, sizeof(res)) != (ssize_t)sizeof(res)) {
		return 1;
	}
	rdmax_client_close(c);
	return 0;
}

static int kv_usage(FILE *out, int ret)
{
	fprintf(out,
		"Usage: rdmax-bench kv --socket PREFILL.sock --decode-socket DECODE.sock\n"
		"                      [--clients N] [--layers N] [--blocks N] [--block-len "
		"BYTES]\n"
		"                      [--window N] [-D SECS] [--label TEXT] [--json=FILE]\n"
		"                      [--daemon-pid PID] [--peer-daemon-pid PID] [--no-verify]\n"
		"N prefill clients (processes) on the first daemon push requests of LAYERS\n"
		"paged writes of BLOCKS blocks each, with one imm per request, into one decode\n"
		"client on the second daemon, which checks every byte. Defaults: 2 clients, 8\n"
		"layers, 16 blocks of 16 KiB, 4 requests in flight per client, 2 s.\n"
		"--no-verify: the decode client hands slots back without checking (transport\n"
		"only; the checks cost the decode client two passes over every byte).\n");
	return ret;
}

static int kv_main(int argc, char **argv)
{
	static const struct option options[] = {
		{"socket", required_argument, NULL, 'S'},
		{"decode-socket", required_argument, NULL, 'T'},
		{"clients", required_argument, NULL, 'c'},
		{"layers", required_argument, NULL, 'L'},
		{"blocks", required_argument, NULL, 'B'},
		{"block-len", required_argument, NULL, 'l'},
		{"window", required_argument, NULL, 'w'},
		{"duration", required_argument, NULL, 'D'},
		{"label", required_argument, NULL, 'a'},
		{"json", optional_argument, NULL, 'j'},
		{"daemon-pid", required_argument, NULL, 'p'},
		{"peer-daemon-pid", required_argument, NULL, 'P'},
		{"no-verify", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct kv_opts k = {.clients = 2,
			    .layers = 8,
			    .blocks = 16,
			    .window = 4,
			    .block_len = 16 << 10,
			    .duration_s = 2,
			    .verify = true};
	uint64_t v;
	int opt;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "D:h", options, NULL)) != -1) {
		switch (opt) {
		case 'S':
			k.socket_path = optarg;
			break;
		case 'T':
			k.decode_socket = optarg;
			break;
		case 'c':
		case 'L':
		case 'B':
		case 'w':
			if (parse_u64(optarg, &v) < 0 || v == 0 || v > 1u << 20 ||
			    ((opt == 'c') && v > KV_CLIENTS_MAX) ||
			    ((opt == 'w') && v > KV_WINDOW_MAX)) {
				fprintf(stderr, "rdmax-bench kv: bad value '%s'\n", optarg);
				return 2;
			}
			*(opt == 'c'   ? &k.clients
			  : opt == 'L' ? &k.layers
			  : opt == 'B' ? &k.blocks
				       : &k.window) = (uint32_t)v;
			break;
		case 'l':
			if (parse_size(optarg, &k.block_len) < 0 || k.block_len < 16) {
				fprintf(stderr, "rdmax-bench kv: bad --block-len '%s'\n", optarg);
				return 2;
			}
			break;
		case 'D':
			k.duration_s = strtod(optarg, NULL);
			break;
		case 'a':
			k.label = optarg;
			break;
		case 'j':
			k.json_path = optarg ? optarg : "-";
			break;
		case 'p':
			k.daemon_pid = atoi(optarg);
			break;
		case 'P':
			k.peer_pid = atoi(optarg);
			break;
		case 'V':
			k.verify = false;
			break;
		case 'h':
			return kv_usage(stdout, 0);
		default:
			return kv_usage(stderr, 2);
		}
	}
	if (!k.socket_path || !k.decode_socket || k.duration_s <= 0) {
		return kv_usage(stderr, 2);
	}

	int desc_pipe[2], result_pipe[2], tokens[KV_CLIENTS_MAX][2];
	if (pipe(desc_pipe) < 0 || pipe(result_pipe) < 0) {
		return fail("kv: pipe", -errno);
	}
	for (uint32_t i = 0; i < k.clients; i++) {
		if (pipe2(tokens[i], O_NONBLOCK) < 0) {
			return fail("kv: pipe", -errno);
		}
	}
	double cpu0 = proc_cpu_s(k.daemon_pid), peer0 = proc_cpu_s(k.peer_pid);
	pid_t decode = fork();
	if (decode < 0) {
		return fail("kv: fork", -errno);
	}
	if (decode == 0) {
		int w[KV_CLIENTS_MAX];
		close(desc_pipe[0]);
		for (uint32_t i = 0; i < k.clients; i++) {
			w[i] = tokens[i][1];
			close(tokens[i][0]);
		}
		_exit(kv_decode(&k, desc_pipe[1], w, result_pipe[1]));
	}
	close(desc_pipe[1]);
	struct rdmax_desc peer;
	if (read(desc_pipe[0], &peer, sizeof(peer)) != (ssize_t)sizeof(peer)) {
		kill(decode, SIGKILL);
		waitpid(decode, NULL, 0);
		fprintf(stderr, "rdmax-bench kv: the decode client did not start\n");
		return 1;
	}
	pid_t prefill[KV_CLIENTS_MAX];
	for (uint32_t i = 0; i < k.clients; i++) {
		prefill[i] = fork();
		if (prefill[i] < 0) {
			return fail("kv: fork", -errno);
		}
		if (prefill[i] == 0) {
			_exit(kv_prefill(&k, i, &peer, tokens[i][0], result_pipe[1]));
		}
	}
	int failed = 0, status;
	struct kv_result sum = {0};
	uint64_t p50 = 0, p99 = 0;
	for (uint32_t i = 0; i < k.clients; i++) {
		if (waitpid(prefill[i], &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0) {
			failed = 1;
			continue;
		}
		struct kv_result r;
		if (read(result_pipe[0], &r, sizeof(r)) != (ssize_t)sizeof(r)) {
			failed = 1;
			continue;
		}
		sum.requests += r.requests;
		sum.seconds_ns = MAX_U64(sum.seconds_ns, r.seconds_ns);
		p50 = MAX_U64(p50, r.lat_ns_p50);
		p99 = MAX_U64(p99, r.lat_ns_p99);
	}
	double cpu = proc_cpu_s(k.daemon_pid) - cpu0, peer_cpu = proc_cpu_s(k.peer_pid) - peer0;
	kill(decode, SIGTERM);
	uint64_t verified = 0;
	if (waitpid(decode, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
	    read(result_pipe[0], &verified, sizeof(verified)) != (ssize_t)sizeof(verified)) {
		failed = 1;
	}
	if (!failed && verified != sum.requests) {
		fprintf(stderr,
			"rdmax-bench kv: %" PRIu64 " requests completed but %" PRIu64
			" were verified\n",
			sum.requests, verified);
		failed = 1;
	}
	uint64_t req = kv_request_bytes(&k);
	double secs = (double)sum.seconds_ns / 1e9;
	double gb = (double)(req * sum.requests) / 1e9;
	double gbps = secs > 0 ? gb * 8 / secs : 0;
	FILE *f = stdout;
	if (k.json_path && strcmp(k.json_path, "-") != 0 && !(f = fopen(k.json_path, "w"))) {
		return fail("kv: --json file", -errno);
	}
	if (k.json_path) {
		fprintf(f, "{\"tool\": \"rdmax-bench\", \"mode\": \"kv\", \"label\": ");
		json_string(f, k.label);
		fprintf(f,
			", \"op\": \"paged\", \"status\": \"%s\", \"params\": {\"clients\": %u, "
			"\"layers\": %u, \"blocks\": %u, \"block_len\": %" PRIu64
			", \"window\": %u, \"duration_s\": %g}, \"results\": [\n",
			failed ? "failed" : "ok", k.clients, k.layers, k.blocks, k.block_len,
			k.window, k.duration_s);
		fprintf(f,
			"  {\"bytes\": %" PRIu64 ", \"jobs\": %" PRIu64
			", \"seconds\": %.6f, \"GBps\": %.6f, \"Gbps\": %.6f, \"jobs_per_s\": "
			"%.1f, "
			"\"lat_us\": {\"p50\": %.3f, \"p99\": %.3f, \"p999\": 0, \"max\": 0, "
			"\"mean\": 0}, \"daemon_cpu_s_per_GB\": ",
			req, sum.requests, secs, gbps / 8, gbps, secs > 0 ? sum.requests / secs : 0,
			(double)p50 / 1e3, (double)p99 / 1e3);
		print_num(f, cpu >= 0 && gb > 0 ? cpu / gb : -1, 4);
		fprintf(f, ", \"peer_cpu_s_per_GB\": ");
		print_num(f, k.peer_pid > 0 && peer_cpu >= 0 && gb > 0 ? peer_cpu / gb : -1, 4);
		fprintf(f, ", \"verify\": \"%s\"}\n]}\n",
			failed     ? "FAILED"
			: k.verify ? "ok"
				   : "skipped");
	} else {
		printf("kv: %u prefill clients -> 1 decode client, requests of %u layers x %u "
		       "blocks x %" PRIu64 " B (%" PRIu64 " B)\n"
		       "%9s %8s %8s %9s %11s %11s %9s\n%9" PRIu64 " %8.3f %8.2f %9.1f %11.1f "
		       "%11.1f %9s\n",
		       k.clients, k.layers, k.blocks, k.block_len, req, "requests", "seconds",
		       "Gb/s", "req/s", "p50_us", "p99_us", "verify", sum.requests, secs, gbps,
		       secs > 0 ? sum.requests / secs : 0, (double)p50 / 1e3, (double)p99 / 1e3,
		       failed     ? "FAILED"
		       : k.verify ? "ok"
				  : "skipped");
	}
	if (f != stdout) {
		fclose(f);
	}
	return failed;
}

int main(int argc, char **argv)
{
	struct opts o = {
		.op = RDMAX_OP_WRITE,
		.op_name = "write",
		.serve_bytes = DEFAULT_SERVE_BYTES,
		.window = DEFAULT_WINDOW,
		.batch = 1,
		.warmup = DEFAULT_WARMUP,
		.verify = true,
		.page_len = 16 << 10,
		.dests = 4,
		.n_sizes = 1,
		.sizes = {64 << 10},
	};

	if (argc > 1 && strcmp(argv[1], "kv") == 0) {
		signal(SIGPIPE, SIG_IGN);
		signal(SIGTERM, on_stop_signal);
		return kv_main(argc - 1, argv + 1);
	}
	if (parse_args(argc, argv, &o) < 0) {
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (o.mode == MODE_SERVE) {
		return run_serve(&o);
	}
	return run_requester(&o);
}
