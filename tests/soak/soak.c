/* SPDX-License-Identifier: MIT */
/*
 * Soak: three daemons (on loopback over TCP, or over verbs between the
 * Soft-RoCE devices of the test guest), many clients over the public
 * librdmax API for a given time, and at the end the accounts.
 *
 * Nodes a and b stay up all along; node c is restarted (SIGTERM, then
 * SIGKILL, alternately) every restart period. Worker processes come and go,
 * each homed on a or b with a second client on the other node and a third
 * on c. Kinds of worker:
 *  - normal: rounds of mixed WRITE, READ, PAGED_WRITE, SCATTER (to the other
 *    node and c), BARRIER, SEND, plus cancelled and deadline-bound jobs; it
 *    counts every completion per job id (exactly one, never an unknown id),
 *    compares every byte an OK job moved through its own mappings of the
 *    destination regions, and requires OK for every job between a and b;
 *    jobs that involve c may fail while c restarts, but only with a named
 *    error;
 *  - killed: like normal, SIGKILLed by the driver at a random moment;
 *  - silent: submits a batch and never reads its socket, then leaves.
 * The driver fails when any worker fails or exits unexpectedly, when a or b
 * died, or when their open fds are not back to the baseline (measured after
 * a warm-up, with no client and no peer connection) or their RSS grew by
 * more than the allowed slack over it.
 *
 * Usage: soak RDMAXD_PATH WORK_DIR SECONDS
 * Environment: SOAK_CLIENTS (concurrent workers, 8), SOAK_RESTART_S (period
 * of c's restarts, 10), SOAK_RSS_SLACK_KB (8192), SOAK_SEED, SOAK_TRANSPORT
 * (the daemons' --transport, tcp), SOAK_ADDRS (listen addresses of a, b, c,
 * comma-separated, the last one repeated: 127.0.0.1), SOAK_SILENT_JOBS (4096),
 * SOAK_MALLOC_STATS=1 (glibc's heap account of a and b at the baseline and
 * the end, through gdb).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rdmax.h"

#define REGION_BYTES (1u << 20)
#define SLICE_BYTES  (16u << 10)
#define SLICES       (REGION_BYTES / SLICE_BYTES)
#define BATCH        8
/* Slices the verified jobs rotate over; the last BATCH slices are scratch. */
#define ROTATION    (SLICES - BATCH)
#define WAIT_MS     30000
#define MAX_WORKERS 64

/* ------------------------------------------------------------------ util */

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t g_rng;

static uint64_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng;
}

static uint32_t env_u32(const char *name, uint32_t dflt)
{
	const char *v = getenv(name);
	return v && *v ? (uint32_t)strtoul(v, NULL, 0) : dflt;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

/* ----------------------------------------------------------------- nodes */

struct node {
	char name[8];
	char addr[64]; /* listen address */
	char sock[160];
	char log[160];
	pid_t pid;
	unsigned starts;
};

static const char *g_rdmaxd, *g_dir, *g_transport;
static struct node g_nodes[3];

static bool socket_up(const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path) >= (int)sizeof(sun.sun_path)) {
		fprintf(stderr, "soak: socket path too long: %s\n", path);
		exit(1);
	}
	bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0;
	if (fd >= 0) {
		close(fd);
	}
	return ok;
}

static void node_start(struct node *n)
{
	char conf[200];
	if (snprintf(conf, sizeof(conf), "%s/empty.conf", g_dir) >= (int)sizeof(conf)) {
		exit(1);
	}
	int cfd = open(conf, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (cfd >= 0) {
		close(cfd);
	}
	unlink(n->sock);
	n->pid = fork();
	if (n->pid == 0) {
		int fd = open(n->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			dup2(fd, 1);
		}
		execl(g_rdmaxd, g_rdmaxd, "--config", conf, "--socket", n->sock, "--listen",
		      n->addr, "--port", "0", "--transport", g_transport, "--node-name", n->name,
		      "--log-level", "notice", "--set", "peers.idle_timeout_s=2", "--set",
		      "peers.connect_timeout_ms=1000", "--set", "peers.connect_retries=2", "--set",
		      "peers.peer_timeout_ms=3000", "--set", "limits.max_clients=256",
		      (char *)NULL);
		_exit(127);
	}
	uint64_t deadline = now_ms() + 10000;
	while (!socket_up(n->sock)) {
		if (now_ms() > deadline || waitpid(n->pid, NULL, WNOHANG) == n->pid) {
			fprintf(stderr, "soak: node %s did not start (see %s)\n", n->name, n->log);
			exit(1);
		}
		usleep(10000);
	}
	n->starts++;
}

static void node_stop(struct node *n, int sig)
{
	kill(n->pid, sig);
	waitpid(n->pid, NULL, 0);
	n->pid = 0;
}

static long proc_rss_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) {
			break;
		}
	}
	if (f) {
		fclose(f);
	}
	return kb;
}

static int proc_fds(pid_t pid)
{
	char path[64];
	int n = 0;
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		n += e->d_name[0] != '.';
	}
	if (d) {
		closedir(d);
	}
	return d ? n : -1;
}

/*
 * SOAK_MALLOC_STATS=1: glibc's own account of node n's heap, through gdb
 * (malloc_stats() prints to the daemon's stderr, its log): the "Total (incl.
 * mmap)" system and in-use bytes, in kB. With `trim`, malloc_trim(0) first.
 * False when gdb or the lines are missing.
 */
static bool malloc_totals(const struct node *n, bool trim, long *system_kb, long *in_use_kb)
{
	char cmd[512], line[256];
	FILE *f = fopen(n->log, "r");
	long start = -1;
	if (f && fseek(f, 0, SEEK_END) == 0) {
		start = ftell(f);
	}
	snprintf(cmd, sizeof(cmd),
		 "gdb -p %d -batch -nx %s -ex 'call (void)malloc_stats()' >/dev/null 2>&1",
		 (int)n->pid, trim ? "-ex 'call (int)malloc_trim(0)'" : "");
	bool ok = f && start >= 0 && system(cmd) == 0 && fseek(f, start, SEEK_SET) == 0;
	bool total = false;
	*system_kb = *in_use_kb = -1;
	while (ok && fgets(line, sizeof(line), f)) {
		long v;
		total = total || strstr(line, "Total (incl. mmap)");
		if (total && sscanf(line, "system bytes = %ld", &v) == 1) {
			*system_kb = v / 1024;
		} else if (total && sscanf(line, "in use bytes = %ld", &v) == 1) {
			*in_use_kb = v / 1024;
		}
	}
	if (f) {
		fclose(f);
	}
	return ok && *system_kb >= 0 && *in_use_kb >= 0;
}

static void malloc_report(const struct node *n, const char *when, bool trim)
{
	long sys_kb, use_kb;
	if (!getenv("SOAK_MALLOC_STATS") || strcmp(getenv("SOAK_MALLOC_STATS"), "1") != 0) {
		return;
	}
	if (!malloc_totals(n, trim, &sys_kb, &use_kb)) {
		printf("soak: node %s %s: no malloc_stats() (is gdb installed?)\n", n->name, when);
		return;
	}
	printf("soak: node %s %s: %ld kB RSS; heap %ld kB from the system, %ld kB in use, "
	       "%ld kB free in the arenas\n",
	       n->name, when, proc_rss_kb(n->pid), sys_kb, use_kb, sys_kb - use_kb);
}

/* --------------------------------------------------------------- workers */

enum kind { KIND_NORMAL, KIND_KILLED, KIND_SILENT };

struct tally {
	uint64_t jobs;       /* submitted */
	uint64_t ok;         /* completed OK */
	uint64_t failed;     /* completed with a named error (all involve c, or were cancelled) */
	uint64_t cancelled;  /* of which RDMAX_E_CANCELLED */
	uint64_t timed_out;  /* of which RDMAX_E_TIMEOUT */
	uint64_t verified;   /* bytes compared after OK completions */
	uint64_t messages;   /* SEND payloads received and compared */
	uint64_t barriers;   /* imm counts that fired */
	uint64_t reconnects; /* clients reopened after c restarted */
};

struct side {
	struct node *node;
	struct rdmax_client *client;
	struct rdmax_region *region;
	struct rdmax_desc desc;
	struct rdmax_desc mailbox; /* the address of its mailbox, when it opened one */
	uint8_t *mem;
};

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "soak[%d]: ", (int)getpid());
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	_exit(1);
}

static int side_open(struct side *s, struct node *node, const char *name)
{
	memset(s, 0, sizeof(*s));
	s->node = node;
	int ret = rdmax_client_open(node->sock, name, &s->client);
	if (ret == 0) {
		ret = rdmax_region_alloc_host(s->client, REGION_BYTES,
					      RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE,
					      &s->region);
	}
	if (ret == 0) {
		ret = rdmax_region_desc(s->region, &s->desc);
	}
	if (ret < 0) {
		rdmax_client_close(s->client);
		s->client = NULL;
		return ret;
	}
	s->mem = rdmax_region_addr(s->region);
	return 0;
}

static void side_close(struct side *s)
{
	rdmax_client_close(s->client);
	s->client = NULL;
}

/* What a job must leave behind, checked after its OK completion. */
struct expect {
	uint64_t id;
	int completions;
	int status;
	bool involves_c; /* may fail while c restarts */
	bool may_fail;   /* cancelled or deadline-bound */
	uint8_t *dst[2]; /* bytes that must equal src */
	uint8_t *src;
	size_t len;
	int n_dst;
	/* PAGED_WRITE: pages of src to compare with pages of dst[0] */
	const uint32_t *src_pages, *dst_pages;
	size_t pages, page_len;
	/* BARRIER */
	uint32_t imm;
	/* SEND */
	char mailbox[RDMAX_MAILBOX_NAME_MAX + 1];
	uint8_t *payload;
	size_t payload_len;
};

static const uint32_t g_src_pages[4] = {3, 1, 2, 0};
static const uint32_t g_dst_pages[4] = {0, 1, 2, 3};

static void check_known(int status, const char *message, uint64_t id)
{
	const char *name = rdmax_strerror(status);
	if (!message[0] || !name || strstr(name, "nknown")) {
		die("job %" PRIu64 " failed without a named error: %d '%s'", id, status, message);
	}
}

/* One batch of mixed jobs from home to far (and c), every one accounted for. */
static void run_batch(struct side *home, struct side *far, struct side *c, uint64_t *next_id,
		      uint32_t round, struct tally *t, bool forever)
{
	struct rdmax_job jobs[BATCH];
	struct expect ex[BATCH];
	struct rdmax_scatter_dest dests[BATCH][2];
	const size_t payload_max = 4096;
	struct rdmax_desc barrier_descs[1];
	bool c_up = c->client != NULL;

	memset(jobs, 0, sizeof(jobs));
	memset(ex, 0, sizeof(ex));
	for (int j = 0; j < BATCH; j++) {
		struct rdmax_job *job = &jobs[j];
		struct expect *e = &ex[j];
		uint32_t slice = (round * BATCH + (uint32_t)j) % ROTATION;
		size_t off = (size_t)slice * SLICE_BYTES;
		/*
		 * Cancelled and deadline-bound jobs write into scratch slices that are
		 * never compared: how much of such a job landed before its completion
		 * is not known (after it, only bytes the kernel or NIC already took:
		 * docs/protocol.md).
		 */
		size_t scratch = (size_t)(ROTATION + (uint32_t)j) * SLICE_BYTES;
		size_t len = 1 + rnd() % SLICE_BYTES;
		job->id = e->id = (*next_id)++;
		e->src = home->mem + off;
		fill(e->src, SLICE_BYTES, job->id);
		switch (rnd() % 8) {
		case 0: /* WRITE */
			job->op = RDMAX_OP_WRITE;
			job->local = home->region;
			job->local_offset = job->remote_offset = off;
			job->length = e->len = len;
			job->remote = &far->desc;
			e->dst[e->n_dst++] = far->mem + off;
			break;
		case 1: /* READ: the far side's bytes come home */
			job->op = RDMAX_OP_READ;
			fill(far->mem + off, len, job->id ^ 0xfeed);
			job->local = home->region;
			job->local_offset = job->remote_offset = off;
			job->length = e->len = len;
			job->remote = &far->desc;
			e->src = far->mem + off;
			e->dst[e->n_dst++] = home->mem + off;
			break;
		case 2: /* PAGED_WRITE, 4 pages of 4 KiB out of order */
			job->op = RDMAX_OP_PAGED_WRITE;
			job->local = home->region;
			job->remote = &far->desc;
			job->u.paged.page_len = e->page_len = 4096;
			job->u.paged.local_pages = (struct rdmax_pages){off, 0, g_src_pages, 4};
			job->u.paged.remote_pages = (struct rdmax_pages){off, 0, g_dst_pages, 4};
			e->src_pages = g_src_pages;
			e->dst_pages = g_dst_pages;
			e->pages = 4;
			e->dst[e->n_dst++] = far->mem + off;
			break;
		case 3: /* SCATTER to far and c */
			job->op = RDMAX_OP_SCATTER;
			job->local = home->region;
			dests[j][0] = (struct rdmax_scatter_dest){&far->desc, 0, off, off, len};
			e->dst[e->n_dst++] = far->mem + off;
			job->u.scatter.count = 1;
			if (c_up) {
				dests[j][1] =
					(struct rdmax_scatter_dest){&c->desc, 0, off, off, len};
				e->dst[e->n_dst++] = c->mem + off;
				job->u.scatter.count = 2;
				e->involves_c = true;
			}
			job->u.scatter.dests = dests[j];
			e->len = len;
			break;
		case 4: /* BARRIER: one imm landing at far */
			job->op = RDMAX_OP_BARRIER;
			/* Unique per job: a value is never expected twice. */
			e->imm = job->imm =
				((uint32_t)getpid() % 16384u) << 16 | (uint32_t)(job->id & 0xffff);
			if (rdmax_expect_imm(far->client, e->imm, 1) < 0) {
				die("ExpectImm %u refused", e->imm);
			}
			barrier_descs[0] = far->desc;
			job->u.barrier.remotes = barrier_descs;
			job->u.barrier.count = 1;
			break;
		case 5: /* SEND to the far client's mailbox */
			job->op = RDMAX_OP_SEND;
			job->remote = &far->mailbox;
			snprintf(e->mailbox, sizeof(e->mailbox), "soak-%d", (int)getpid());
			job->u.send.mailbox = e->mailbox;
			e->payload_len = 1 + rnd() % payload_max;
			e->payload = malloc(e->payload_len);
			fill(e->payload, e->payload_len, job->id);
			job->u.send.payload = e->payload;
			job->u.send.length = e->payload_len;
			break;
		case 6: /* WRITE to c, or a deadline-bound one when c is away */
			job->op = RDMAX_OP_WRITE;
			job->local = home->region;
			job->local_offset = job->remote_offset = off;
			job->length = e->len = len;
			if (c_up) {
				job->remote = &c->desc;
				e->dst[e->n_dst++] = c->mem + off;
				e->involves_c = true;
			} else {
				job->remote = &far->desc;
				job->deadline_ms = 1 + rnd() % 20;
				job->local_offset = job->remote_offset = scratch;
				e->may_fail = true;
			}
			break;
		default: /* a WRITE cancelled right after submission */
			job->op = RDMAX_OP_WRITE;
			job->local = home->region;
			job->local_offset = job->remote_offset = scratch;
			job->length = e->len = len;
			job->remote = &far->desc;
			e->may_fail = true;
			break;
		}
	}
	int ret = rdmax_submit(home->client, jobs, BATCH);
	if (ret < 0) {
		die("submit refused: %s", rdmax_strerror(ret));
	}
	t->jobs += BATCH;
	for (int j = 0; j < BATCH; j++) {
		if (ex[j].may_fail && !jobs[j].deadline_ms) {
			rdmax_cancel(home->client, jobs[j].id); /* NOT_FOUND when it finished */
		}
	}
	while (forever) {
		pause(); /* KIND_KILLED: the driver ends it with jobs in flight */
	}
	/* Every job completes exactly once. */
	int done = 0;
	uint64_t deadline = now_ms() + WAIT_MS;
	while (done < BATCH) {
		struct rdmax_event ev[16];
		int n = rdmax_poll_events(home->client, ev, 16, 1000);
		if (n < 0) {
			die("poll: %s", rdmax_strerror(n));
		}
		for (int i = 0; i < n; i++) {
			if (ev[i].type != RDMAX_EVENT_COMPLETION) {
				die("unexpected event %d on the home client", ev[i].type);
			}
			struct expect *e = NULL;
			for (int j = 0; j < BATCH; j++) {
				if (ex[j].id == ev[i].job_id) {
					e = &ex[j];
				}
			}
			if (!e) {
				die("completion for unknown job %" PRIu64, ev[i].job_id);
			}
			if (++e->completions > 1) {
				die("job %" PRIu64 " completed twice", e->id);
			}
			e->status = ev[i].status;
			if (ev[i].status != 0) {
				check_known(ev[i].status, ev[i].reason, e->id);
				if (!e->involves_c && !e->may_fail) {
					die("job %" PRIu64 " (op %d) between a and b failed: %s",
					    e->id, (int)jobs[e - ex].op, ev[i].reason);
				}
			}
			done++;
		}
		if (now_ms() > deadline) {
			die("%d of %d jobs without a completion after %d ms", BATCH - done, BATCH,
			    WAIT_MS);
		}
	}
	/* Every byte of every OK job. */
	for (int j = 0; j < BATCH; j++) {
		struct expect *e = &ex[j];
		if (e->status != 0) {
			t->failed++;
			t->cancelled += e->status == RDMAX_E_CANCELLED;
			t->timed_out += e->status == RDMAX_E_TIMEOUT;
			free(e->payload);
			continue;
		}
		t->ok++;
		if (jobs[j].op == RDMAX_OP_PAGED_WRITE) {
			for (size_t p = 0; p < e->pages; p++) {
				if (memcmp(e->dst[0] + e->dst_pages[p] * e->page_len,
					   e->src + e->src_pages[p] * e->page_len, e->page_len)) {
					die("PAGED_WRITE %" PRIu64 ": page %zu differs", e->id, p);
				}
				t->verified += e->page_len;
			}
		}
		for (int d = 0; d < e->n_dst && e->len; d++) {
			if (memcmp(e->dst[d], e->src, e->len) != 0) {
				die("job %" PRIu64 " (op %d): destination %d differs", e->id,
				    jobs[j].op, d);
			}
			t->verified += e->len;
		}
		if (jobs[j].op == RDMAX_OP_BARRIER) {
			ret = rdmax_wait_imm(far->client, e->imm, WAIT_MS);
			if (ret < 0) {
				die("imm %u did not fire: %s", e->imm, rdmax_strerror(ret));
			}
			t->barriers++;
		}
		if (jobs[j].op == RDMAX_OP_SEND) {
			static uint8_t got[RDMAX_MESSAGE_PAYLOAD_MAX];
			char from[RDMAX_NODE_NAME_MAX];
			ret = rdmax_mailbox_recv(far->client, e->mailbox, got, sizeof(got), from,
						 WAIT_MS);
			if (ret != (int)e->payload_len || memcmp(got, e->payload, e->payload_len)) {
				die("SEND %" PRIu64 ": %d bytes received, %zu sent, or they differ",
				    e->id, ret, e->payload_len);
			}
			t->messages++;
			t->verified += e->payload_len;
		}
		free(e->payload);
	}
}

static int worker(int index, enum kind kind, uint32_t rounds, int result_fd)
{
	struct side home, far, c = {0};
	struct tally t = {0};
	char name[32];
	uint64_t next_id = 1;
	int ret;

	g_rng = env_u32("SOAK_SEED", 1) * 7919u + (uint64_t)getpid() * 104729u + 1;
	snprintf(name, sizeof(name), "soak-%d", index);
	struct node *h = &g_nodes[index % 2], *f = &g_nodes[1 - index % 2];
	if ((ret = side_open(&home, h, name)) < 0 || (ret = side_open(&far, f, name)) < 0) {
		die("cannot open clients on %s/%s: %s", h->name, f->name, rdmax_strerror(ret));
	}
	if (kind == KIND_SILENT) {
		/*
		 * Submit and never read: 4096 jobs by default, whose completions the
		 * daemon holds until the client leaves (the heap they fragment goes
		 * back to the system after the departure: docs/reliability.md).
		 */
		uint32_t n = env_u32("SOAK_SILENT_JOBS", 4096);
		for (uint32_t i = 0; i < n; i++) {
			struct rdmax_job job = {
				.id = i + 1,
				.op = RDMAX_OP_WRITE,
				.local = home.region,
				.local_offset = (i % SLICES) * SLICE_BYTES,
				.remote_offset = (i % SLICES) * SLICE_BYTES,
				.length = SLICE_BYTES,
				.remote = &far.desc,
			};
			if (rdmax_submit(home.client, &job, 1) < 0) {
				die("silent client: submit refused");
			}
		}
		usleep((useconds_t)(200000 + rnd() % 800000));
		_exit(0);
	}
	snprintf(name, sizeof(name), "soak-%d", (int)getpid());
	if ((ret = rdmax_mailbox_open_addr(far.client, name, &far.mailbox)) < 0) {
		die("mailbox %s: %s", name, rdmax_strerror(ret));
	}
	for (uint32_t r = 0; r < rounds; r++) {
		if (!c.client && side_open(&c, &g_nodes[2], name) == 0 && r > 0) {
			t.reconnects++;
		}
		run_batch(&home, &far, &c, &next_id, r, &t, kind == KIND_KILLED && r == rounds / 2);
		/* c restarted: its client is gone; open a new one next round. */
		if (c.client) {
			struct rdmax_event ev;
			if (rdmax_poll_events(c.client, &ev, 1, 0) == RDMAX_E_DISCONNECTED) {
				side_close(&c);
			}
		}
	}
	side_close(&c);
	side_close(&far);
	side_close(&home);
	if (write(result_fd, &t, sizeof(t)) != sizeof(t)) {
		_exit(1);
	}
	return 0;
}

/* ---------------------------------------------------------------- driver */

struct running {
	pid_t pid;
	enum kind kind;
	int fd;           /* read end of its result pipe */
	uint64_t kill_at; /* KIND_KILLED */
};

static struct tally g_total;
static unsigned g_by_kind[3], g_failures;

static void spawn(struct running *w, int index)
{
	int p[2];
	uint32_t pick = (uint32_t)(rnd() % 100);
	enum kind kind = pick < 70 ? KIND_NORMAL : pick < 85 ? KIND_KILLED : KIND_SILENT;
	uint32_t rounds = 4 + (uint32_t)(rnd() % 24);

	if (pipe2(p, O_CLOEXEC) < 0) {
		exit(1);
	}
	w->pid = fork();
	if (w->pid == 0) {
		close(p[0]);
		_exit(worker(index, kind, rounds, p[1]));
	}
	close(p[1]);
	w->fd = p[0];
	w->kind = kind;
	w->kill_at = kind == KIND_KILLED ? now_ms() + 50 + rnd() % 1500 : 0;
	g_by_kind[kind]++;
}

static void reap(struct running *w, int status)
{
	struct tally t;
	bool ok;

	if (w->kind == KIND_KILLED) {
		ok = (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
		     (WIFEXITED(status) && WEXITSTATUS(status) == 0);
	} else {
		ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	}
	if (!ok) {
		fprintf(stderr, "soak: worker %d (kind %d) ended with status 0x%x\n", (int)w->pid,
			w->kind, status);
		g_failures++;
	}
	if (read(w->fd, &t, sizeof(t)) == sizeof(t)) {
		g_total.jobs += t.jobs;
		g_total.ok += t.ok;
		g_total.failed += t.failed;
		g_total.cancelled += t.cancelled;
		g_total.timed_out += t.timed_out;
		g_total.verified += t.verified;
		g_total.messages += t.messages;
		g_total.barriers += t.barriers;
		g_total.reconnects += t.reconnects;
	} else if (w->kind == KIND_NORMAL && ok) {
		fprintf(stderr, "soak: worker %d left no tally\n", (int)w->pid);
		g_failures++;
	}
	close(w->fd);
	w->pid = 0;
}

/* Wait until a and b have exactly their baseline fds (no client, no peer connection). */
static bool settle(const int *fds, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		bool ok = true;
		for (int i = 0; i < 2; i++) {
			ok = ok && proc_fds(g_nodes[i].pid) == fds[i];
		}
		if (ok) {
			return true;
		}
		if (now_ms() > deadline) {
			return false;
		}
		usleep(50000);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: soak RDMAXD WORK_DIR SECONDS\n");
		return 2;
	}
	g_rdmaxd = argv[1];
	g_dir = argv[2];
	uint64_t seconds = strtoull(argv[3], NULL, 10);
	uint32_t clients = env_u32("SOAK_CLIENTS", 8);
	uint64_t restart_ms = env_u32("SOAK_RESTART_S", 10) * 1000ull;
	long slack_kb = (long)env_u32("SOAK_RSS_SLACK_KB", 8192);
	int base_fds[2];
	long base_rss[2];
	struct running w[MAX_WORKERS] = {0};
	int index = 0;

	if (clients > MAX_WORKERS) {
		clients = MAX_WORKERS;
	}
	g_rng = env_u32("SOAK_SEED", 1) * 2654435761u + 1;
	signal(SIGPIPE, SIG_IGN);
	g_transport = getenv("SOAK_TRANSPORT") && *getenv("SOAK_TRANSPORT")
			      ? getenv("SOAK_TRANSPORT")
			      : "tcp";
	const char *addrs =
		getenv("SOAK_ADDRS") && *getenv("SOAK_ADDRS") ? getenv("SOAK_ADDRS") : "127.0.0.1";
	for (int i = 0; i < 3; i++) {
		struct node *n = &g_nodes[i];
		snprintf(n->name, sizeof(n->name), "%c", 'a' + i);
		/* The i-th address of SOAK_ADDRS, or its last one. */
		size_t len = strcspn(addrs, ",");
		if (len == 0 || len >= sizeof(n->addr)) {
			fprintf(stderr, "soak: bad SOAK_ADDRS '%s'\n", getenv("SOAK_ADDRS"));
			return 2;
		}
		memcpy(n->addr, addrs, len);
		n->addr[len] = '\0';
		if (addrs[len] == ',') {
			addrs += len + 1;
		}
		if (snprintf(n->sock, sizeof(n->sock), "%s/%s.sock", g_dir, n->name) >=
			    (int)sizeof(n->sock) ||
		    snprintf(n->log, sizeof(n->log), "%s/%s.log", g_dir, n->name) >=
			    (int)sizeof(n->log)) {
			fprintf(stderr, "soak: work folder path too long\n");
			return 2;
		}
		node_start(n);
	}
	/* Baseline: after one normal worker per home node, with everything idle again. */
	for (int i = 0; i < 2; i++) {
		int p[2];
		if (pipe2(p, O_CLOEXEC) < 0) {
			return 1;
		}
		w[i].pid = fork();
		if (w[i].pid == 0) {
			close(p[0]);
			_exit(worker(i, KIND_NORMAL, 4, p[1]));
		}
		close(p[1]);
		w[i].fd = p[0];
		w[i].kind = KIND_NORMAL;
	}
	for (int i = 0; i < 2; i++) {
		int status;
		waitpid(w[i].pid, &status, 0);
		reap(&w[i], status);
	}
	if (g_failures) {
		fprintf(stderr, "soak: the warm-up failed\n");
		return 1;
	}
	/* Idle peer connections close after peers.idle_timeout_s = 2. */
	uint64_t idle_until = now_ms() + 4000;
	while (now_ms() < idle_until) {
		usleep(100000);
	}
	for (int i = 0; i < 2; i++) {
		base_fds[i] = proc_fds(g_nodes[i].pid);
		base_rss[i] = proc_rss_kb(g_nodes[i].pid);
	}
	for (int i = 0; i < 2; i++) {
		malloc_report(&g_nodes[i], "at the baseline", false);
	}
	printf("soak: transport %s, a on %s, b on %s, c on %s\n", g_transport, g_nodes[0].addr,
	       g_nodes[1].addr, g_nodes[2].addr);
	printf("soak: baseline a: %d fds, %ld kB RSS; b: %d fds, %ld kB RSS\n", base_fds[0],
	       base_rss[0], base_fds[1], base_rss[1]);
	fflush(stdout);

	uint64_t start = now_ms(), end = start + seconds * 1000, next_restart = start + restart_ms;
	unsigned restarts = 0;
	while (now_ms() < end) {
		for (uint32_t i = 0; i < clients; i++) {
			if (!w[i].pid) {
				spawn(&w[i], index++);
			}
			if (w[i].kill_at && now_ms() >= w[i].kill_at) {
				kill(w[i].pid, SIGKILL);
				w[i].kill_at = 0;
			}
		}
		int status;
		pid_t pid;
		while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
			for (uint32_t i = 0; i < clients; i++) {
				if (w[i].pid == pid) {
					reap(&w[i], status);
				}
			}
			for (int i = 0; i < 3; i++) {
				if (g_nodes[i].pid == pid) {
					fprintf(stderr,
						"soak: node %s died (status 0x%x), see %s\n",
						g_nodes[i].name, status, g_nodes[i].log);
					return 1;
				}
			}
		}
		if (now_ms() >= next_restart) {
			node_stop(&g_nodes[2], restarts % 2 ? SIGKILL : SIGTERM);
			node_start(&g_nodes[2]);
			restarts++;
			next_restart = now_ms() + restart_ms;
		}
		usleep(5000);
	}
	/* Let the last workers finish (killed ones are killed now). */
	for (uint32_t i = 0; i < clients; i++) {
		if (!w[i].pid) {
			continue;
		}
		if (w[i].kind == KIND_KILLED) {
			kill(w[i].pid, SIGKILL);
		}
		int status;
		waitpid(w[i].pid, &status, 0);
		reap(&w[i], status);
	}
	uint64_t elapsed = now_ms() - start;
	bool settled = settle(base_fds, 20000);
	bool ok = g_failures == 0 && settled;
	printf("soak: %" PRIu64 " s, workers %u normal / %u killed / %u silent, node c restarted "
	       "%u times\n",
	       elapsed / 1000, g_by_kind[KIND_NORMAL], g_by_kind[KIND_KILLED],
	       g_by_kind[KIND_SILENT], restarts);
	printf("soak: jobs accounted by finished workers: %" PRIu64 " submitted, each completed "
	       "once: %" PRIu64 " OK, %" PRIu64 " failed with a named error (%" PRIu64
	       " CANCELLED, %" PRIu64 " TIMEOUT, %" PRIu64 " others, all to node c)\n",
	       g_total.jobs, g_total.ok, g_total.failed, g_total.cancelled, g_total.timed_out,
	       g_total.failed - g_total.cancelled - g_total.timed_out);
	printf("soak: %" PRIu64 " bytes compared, %" PRIu64 " messages, %" PRIu64
	       " barriers fired, %" PRIu64 " reconnects to c\n",
	       g_total.verified, g_total.messages, g_total.barriers, g_total.reconnects);
	for (int i = 0; i < 2; i++) {
		int fds = proc_fds(g_nodes[i].pid);
		long rss = proc_rss_kb(g_nodes[i].pid);
		bool rss_ok = rss <= base_rss[i] + slack_kb;
		printf("soak: node %s: %d fds (baseline %d), %ld kB RSS (baseline %ld, slack "
		       "%ld)%s\n",
		       g_nodes[i].name, fds, base_fds[i], rss, base_rss[i], slack_kb,
		       fds == base_fds[i] && rss_ok ? "" : "  <-- not back to baseline");
		ok = ok && rss_ok;
	}
	if (g_total.jobs == 0 || g_total.ok + g_total.failed != g_total.jobs) {
		ok = false;
	}
	for (int i = 0; i < 2; i++) {
		malloc_report(&g_nodes[i], "at the end", false);
		malloc_report(&g_nodes[i], "after malloc_trim(0)", true);
	}
	for (int i = 0; i < 3; i++) {
		node_stop(&g_nodes[i], SIGTERM);
	}
	printf("soak: %s\n", ok ? "PASS" : "FAIL");
	return ok ? 0 : 1;
}
