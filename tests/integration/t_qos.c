/* SPDX-License-Identifier: MIT */
/*
 * Case "qos": traffic classes end to end between two daemons. One client
 * queues a large bulk backlog to a peer and then one latency write: with
 * [qos] enabled the latency write completes before most of the bulk jobs
 * that were queued ahead of it; with [qos] off the same submissions keep
 * their order and it completes last. Bytes are compared on both paths. With
 * [qos] on the latency write took a connection of its own (a latency lane,
 * of one queue pair on verbs), seen in the admin socket's conns; with it
 * off there is none. A
 * SIGHUP reload changes the weights (seen in the admin status) and a bad
 * [qos] value leaves them as they were; a bad class is refused by name.
 * [engine] loop_cpus and worker_cpus put the loop and the I/O threads on
 * their CPUs, at start-up and on reload, and decide whether the loop sleeps
 * while bulk copies run.
 */
#include <dirent.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define BULK_JOBS  32
#define BULK_BYTES (2 * MiB)
#define LAT_BYTES  (64 * KiB)

static void write_conf(const struct itest_daemon *d, const char *text)
{
	FILE *f = fopen(d->conf_path, "w");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_ge(fputs(text, f), 0);
	ck_assert_int_eq(fclose(f), 0);
}

/* Bounded wait until the daemon's log holds needle. */
static void wait_log(const struct itest_daemon *d, const char *needle)
{
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	char line[2048];

	for (;;) {
		FILE *f = fopen(d->log_path, "r");
		ck_assert_ptr_nonnull(f);
		bool found = false;
		while (!found && fgets(line, sizeof(line), f)) {
			found = strstr(line, needle) != NULL;
		}
		fclose(f);
		if (found) {
			return;
		}
		ck_assert_msg(itest_now_ms() < deadline, "daemon %s never logged '%s'", d->name,
			      needle);
		itest_sleep_ms(10);
	}
}

/*
 * The daemon's outgoing connections: how many are latency lanes, and the
 * queue pairs of the last one (0 when it names none, as TCP's do).
 */
static int latency_lanes(const struct itest_daemon *d, uint64_t *ret_qps)
{
	static char reply[65536];
	int n = 0;

	*ret_qps = 0;
	ck_assert_int_eq(itest_admin_reply(d, "conns", reply, sizeof(reply)), 0);
	for (char *obj = strchr(reply, '{'); obj; obj = strchr(obj + 1, '{')) {
		char *end = strchr(obj, '}');
		ck_assert_ptr_nonnull(end);
		*end = '\0';
		if (strstr(obj, "\"direction\":\"out\"") && strstr(obj, "\"lane\":\"latency\"")) {
			const char *qps = strstr(obj, "\"qps\":");
			*ret_qps = qps ? strtoull(qps + strlen("\"qps\":"), NULL, 10) : 0;
			n++;
		}
		*end = '}';
	}
	return n;
}

/*
 * BULK_JOBS bulk writes then one latency write, all from one client to
 * daemon b: returns how many bulk jobs completed after the latency one.
 */
static int bulk_then_latency(bool qos)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	write_conf(a, qos ? "[qos]\nenabled = true\nmax_in_flight = 8\nlatency_reserve = 2\n"
			  : "[qos]\nenabled = false\n");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "mixed");
	struct rdmax_client *cb = itest_client(b, "sink");
	struct rdmax_region *src = itest_alloc(ca, BULK_BYTES, 0);
	struct rdmax_region *lsrc = itest_alloc(ca, LAT_BYTES, 0);
	struct rdmax_region *dst =
		itest_alloc(cb, (uint64_t)BULK_JOBS * BULK_BYTES, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *ldst = itest_alloc(cb, LAT_BYTES, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc ddesc = itest_desc(dst), ldesc = itest_desc(ldst);
	struct rdmax_job jobs[BULK_JOBS];
	struct rdmax_event ev[BULK_JOBS + 1];

	itest_fill(itest_bytes(src), BULK_BYTES, itest_seed());
	itest_fill(itest_bytes(lsrc), LAT_BYTES, itest_seed() + 1);
	for (int i = 0; i < BULK_JOBS; i++) {
		jobs[i] = itest_job((uint64_t)i + 1, RDMAX_OP_WRITE, src, 0, &ddesc,
				    (uint64_t)i * BULK_BYTES, BULK_BYTES);
		jobs[i].traffic_class = RDMAX_CLASS_BULK;
	}
	ck_assert_int_eq(rdmax_submit(ca, jobs, BULK_JOBS), 0);
	struct rdmax_job lat = itest_job(1000, RDMAX_OP_WRITE, lsrc, 0, &ldesc, 0, LAT_BYTES);
	lat.traffic_class = RDMAX_CLASS_LATENCY;
	ck_assert_int_eq(rdmax_submit(ca, &lat, 1), 0);

	ck_assert_uint_eq(itest_collect(ca, ev, BULK_JOBS + 1, 120000, NULL), BULK_JOBS + 1);
	int lat_at = -1;
	for (int i = 0; i <= BULK_JOBS; i++) {
		ck_assert_msg(ev[i].status == 0, "job %" PRIu64 " failed: %s ('%s')", ev[i].job_id,
			      rdmax_err_name(ev[i].status), ev[i].reason);
		if (ev[i].job_id == 1000) {
			lat_at = i;
			ck_assert_uint_eq(ev[i].bytes, LAT_BYTES);
		} else {
			ck_assert_uint_eq(ev[i].bytes, BULK_BYTES);
		}
	}
	ck_assert_int_ge(lat_at, 0);
	itest_assert_mem_eq(itest_bytes(ldst), itest_bytes(lsrc), LAT_BYTES, "latency write");
	uint64_t qps;
	ck_assert_int_eq(latency_lanes(a, &qps), qos ? 1 : 0);
	if (qos && strcmp(itest_transport(), "verbs") == 0) {
		ck_assert_uint_eq(qps, 1);
	}
	for (int i = 0; i < BULK_JOBS; i++) {
		itest_assert_mem_eq(itest_bytes(dst) + (uint64_t)i * BULK_BYTES, itest_bytes(src),
				    BULK_BYTES, "bulk write");
	}
	itest_pair_end(ca, cb, a, b);
	return BULK_JOBS - lat_at;
}

START_TEST(qos_latency_passes_bulk_backlog)
{
	/*
	 * The latency write goes on the credits kept for its class and ahead of
	 * every bulk frame not yet started: at most the few bulk jobs already on
	 * the wire finish before it.
	 */
	int after = bulk_then_latency(true);
	ck_assert_msg(after >= BULK_JOBS / 2,
		      "with [qos] on, only %d of %d bulk jobs completed after the latency write",
		      after, BULK_JOBS);
}
END_TEST

START_TEST(qos_off_keeps_submission_order)
{
	/* Today's behaviour: every bulk chunk was queued first on the one connection. */
	ck_assert_int_eq(bulk_then_latency(false), 0);
}
END_TEST

START_TEST(qos_reload_and_bad_class)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	write_conf(a, "[qos]\nenabled = true\nlatency_weight = 8\n");
	itest_daemon_start(a);
	itest_daemon_start(b);
	itest_wait_status(a, "qos_enabled", 1);
	itest_wait_status(a, "qos_latency_weight", 8);
	itest_wait_status(a, "qos_bulk_weight", 1);

	write_conf(a, "[qos]\nenabled = true\nlatency_weight = 3\nbulk_weight = 2\n");
	ck_assert_int_eq(kill(a->pid, SIGHUP), 0);
	itest_wait_status(a, "qos_latency_weight", 3);
	itest_wait_status(a, "qos_bulk_weight", 2);
	/* A bad value: the reload fails as a whole and the weights stay. */
	write_conf(a, "[qos]\nenabled = true\nlatency_weight = 5\ndefault_class = fast\n");
	ck_assert_int_eq(kill(a->pid, SIGHUP), 0);
	wait_log(a, "expected latency or bulk");
	itest_wait_status(a, "qos_latency_weight", 3);
	write_conf(a, "[qos]\nenabled = false\n");
	ck_assert_int_eq(kill(a->pid, SIGHUP), 0);
	itest_wait_status(a, "qos_enabled", 0);
	itest_wait_status(a, "qos_latency_weight", 8);

	/* A job naming an unknown class is refused by name; the session goes on. */
	struct rdmax_client *ca = itest_client(a, "classy");
	struct rdmax_client *cb = itest_client(b, "sink");
	struct rdmax_region *src = itest_alloc(ca, 4096, 0);
	struct rdmax_region *dst = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc ddesc = itest_desc(dst);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &ddesc, 0, 4096);
	job.traffic_class = 5;
	ck_assert(itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS));
	job.id = 2;
	job.traffic_class = RDMAX_CLASS_LATENCY;
	itest_fill(itest_bytes(src), 4096, 7);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_int_eq(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 4096, "latency write");

	/* A session class the library does not know: the client is not opened. */
	struct rdmax_client *bad = NULL;
	ck_assert_int_eq(setenv("RDMAX_TRAFFIC_CLASS", "fast", 1), 0);
	ck_assert_int_eq(rdmax_client_open(a->socket_path, "bad", &bad), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_null(bad);
	ck_assert_int_eq(setenv("RDMAX_TRAFFIC_CLASS", "latency", 1), 0);
	struct rdmax_client *cl = itest_client(a, "session-latency");
	ck_assert_int_eq(unsetenv("RDMAX_TRAFFIC_CLASS"), 0);
	rdmax_client_close(cl);

	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* Thread tid of pid's "Cpus_allowed_list" into buf; false when the thread is gone. */
static bool thread_cpus(pid_t pid, const char *tid, char *buf, size_t size)
{
	char path[300], line[256], cpus[256];
	bool found = false;

	snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, tid);
	FILE *f = fopen(path, "r");
	if (!f) {
		return false;
	}
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Cpus_allowed_list: %255s", cpus) == 1) {
			snprintf(buf, size, "%s", cpus);
			found = true;
			break;
		}
	}
	fclose(f);
	return found;
}

/* How many of pid's threads other than the main one run on exactly `cpus`; *ret_main the main's. */
static int threads_on(pid_t pid, const char *cpus, char *ret_main, size_t main_size)
{
	char path[64], list[256];
	struct dirent *e;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.' || !thread_cpus(pid, e->d_name, list, sizeof(list))) {
			continue;
		}
		if (atoi(e->d_name) == (int)pid) {
			snprintf(ret_main, main_size, "%s", list);
		} else {
			n += strcmp(list, cpus) == 0;
		}
	}
	closedir(dir);
	return n;
}

/* The process's lowest and highest CPU: the loop's and the workers' lists. */
static void cpu_range(unsigned *ret_lo, unsigned *ret_hi)
{
	cpu_set_t mine;
	unsigned lo = CPU_SETSIZE, hi = 0;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(mine), &mine), 0);
	for (unsigned c = 0; c < CPU_SETSIZE; c++) {
		if (CPU_ISSET(c, &mine)) {
			lo = c < lo ? c : lo;
			hi = c;
		}
	}
	*ret_lo = lo;
	*ret_hi = hi;
}

static bool two_cpus(void)
{
	cpu_set_t mine;

	return sched_getaffinity(0, sizeof(mine), &mine) == 0 && CPU_COUNT(&mine) >= 2;
}

/* Until the main thread runs on `loop` and at least `workers` other threads on `worker`. */
static void wait_threads_on(pid_t pid, const char *loop, const char *worker, int workers)
{
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	char main_cpus[256] = "";
	int n;

	for (;;) {
		n = threads_on(pid, worker, main_cpus, sizeof(main_cpus));
		if ((strcmp(main_cpus, loop) == 0 && n >= workers) || itest_now_ms() > deadline) {
			break;
		}
		itest_sleep_ms(10);
	}
	ck_assert_str_eq(main_cpus, loop);
	ck_assert_msg(n >= workers, "%d of %d threads on CPUs %s", n, workers, worker);
}

/* A 1 MiB write from a client of a to one of b, byte-checked; then both daemons stop. */
static void write_and_end(struct itest_daemon *a, struct itest_daemon *b, uint8_t seed,
			  const char *what)
{
	struct rdmax_client *ca = itest_client(a, "pinned");
	struct rdmax_client *cb = itest_client(b, "sink");
	struct rdmax_region *src = itest_alloc(ca, 1 << 20, 0);
	struct rdmax_region *dst = itest_alloc(cb, 1 << 20, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc ddesc = itest_desc(dst);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &ddesc, 0, 1 << 20);
	itest_fill(itest_bytes(src), 1 << 20, seed);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_int_eq(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 1 << 20, what);
	itest_pair_end(ca, cb, a, b);
}

START_TEST(qos_loop_and_workers_on_their_cpus)
{
	/*
	 * [engine] loop_cpus and worker_cpus: the loop thread and the TCP I/O
	 * threads each end up on their list; a job still completes. With one CPU
	 * the two lists are the same CPU, and the case checks the wiring only.
	 */
	unsigned lo, hi;
	char loop_list[16], worker_list[16];

	cpu_range(&lo, &hi);
	snprintf(loop_list, sizeof(loop_list), "%u", lo);
	snprintf(worker_list, sizeof(worker_list), "%u", hi);
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	itest_daemon_set(a, "engine.loop_cpus=%s", loop_list);
	itest_daemon_set(a, "engine.worker_cpus=%s", worker_list);
	itest_daemon_set(a, "transport.tcp_io_threads=2");
	itest_daemon_start(a);
	itest_daemon_start(b);
	wait_log(a, "loop on CPUs");
	/* Workers pin themselves as they start. */
	wait_threads_on(a->pid, loop_list, worker_list,
			strcmp(itest_transport(), "tcp") == 0 ? 2 : 0);
	write_and_end(a, b, 11, "pinned write");
}
END_TEST

START_TEST(qos_reload_moves_loop_and_workers)
{
	/*
	 * A reload with the two lists swapped moves the running loop and I/O
	 * threads; a list with a CPU the daemon may not use changes nothing.
	 * With one CPU the lists are the same CPU, and the case checks the wiring.
	 */
	unsigned lo, hi;
	char conf[128], lo_list[16], hi_list[16];
	int io = strcmp(itest_transport(), "tcp") == 0 ? 2 : 0;

	cpu_range(&lo, &hi);
	snprintf(lo_list, sizeof(lo_list), "%u", lo);
	snprintf(hi_list, sizeof(hi_list), "%u", hi);
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	itest_daemon_set(a, "transport.tcp_io_threads=2");
	snprintf(conf, sizeof(conf), "[engine]\nloop_cpus = %u\nworker_cpus = %u\n", lo, hi);
	write_conf(a, conf);
	itest_daemon_start(a);
	itest_daemon_start(b);
	wait_log(a, "loop on CPUs");
	wait_threads_on(a->pid, lo_list, hi_list, io);

	snprintf(conf, sizeof(conf), "[engine]\nloop_cpus = %u\nworker_cpus = %u\n", hi, lo);
	write_conf(a, conf);
	ck_assert_int_eq(kill(a->pid, SIGHUP), 0);
	wait_log(a, "reload: loop on CPUs");
	wait_threads_on(a->pid, hi_list, lo_list, io);

	write_conf(a, "[engine]\nloop_cpus = 1023\nworker_cpus = 0\n");
	ck_assert_int_eq(kill(a->pid, SIGHUP), 0);
	wait_log(a, "the loop and workers keep their CPUs");
	wait_threads_on(a->pid, hi_list, lo_list, io);

	write_and_end(a, b, 13, "write after the moves");
}
END_TEST

#define COPY_BYTES (16 * MiB)

/*
 * Daemon a's loop turns that slept for copies, over 16 MiB bulk writes a -> b
 * whose copies ran on a's I/O threads (a latency lane open, as in
 * production): four writes, or with `until_one` as many as it takes for one
 * such turn. With `apart`, a's loop is on the lowest CPU and its workers on
 * the highest.
 */
static uint64_t sleeps_beside_copies(bool apart, bool until_one)
{
	unsigned lo, hi;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	cpu_range(&lo, &hi);
	itest_daemon_set(a, "transport.tcp_io_threads=2");
	itest_daemon_set(a, "qos.enabled=true");
	itest_daemon_set(b, "qos.enabled=true");
	itest_daemon_set(a, "qos.lane_linger_ms=0"); /* however long the writes take */
	if (apart) {
		itest_daemon_set(a, "engine.loop_cpus=%u", lo);
		itest_daemon_set(a, "engine.worker_cpus=%u", hi);
	}
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "copies");
	struct rdmax_client *cb = itest_client(b, "sink");

	itest_open_latency_lane(ca, cb);
	struct rdmax_region *src = itest_alloc(ca, COPY_BYTES, 0);
	struct rdmax_region *dst = itest_alloc(cb, COPY_BYTES, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc ddesc = itest_desc(dst);
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS, sleeps = 0;
	itest_fill(itest_bytes(src), COPY_BYTES, 23);
	for (uint64_t id = 2;; id++) {
		struct rdmax_job job = itest_job(id, RDMAX_OP_WRITE, src, 0, &ddesc, 0, COPY_BYTES);
		job.traffic_class = RDMAX_CLASS_BULK;
		struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
		ck_assert_msg(ev.status == 0, "bulk write: %s", rdmax_err_name(ev.status));
		sleeps = itest_stats_field(a, "loop_sleeps_for_copies_total");
		ck_assert_uint_ne(sleeps, UINT64_MAX);
		if (id >= 5 && (!until_one || sleeps > 0)) {
			break;
		}
		ck_assert_msg(itest_now_ms() < deadline,
			      "%" PRIu64 " bulk writes, and the loop never slept for their copies",
			      id - 1);
	}
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), COPY_BYTES, "bulk write");
	uint64_t on_threads = itest_stats_field(a, "tcp_io_thread_bytes_sent");
	ck_assert_msg(on_threads >= COPY_BYTES && on_threads != UINT64_MAX,
		      "the copies did not run on the I/O threads (%" PRIu64 " bytes)", on_threads);

	itest_pair_end(ca, cb, a, b);
	return sleeps;
}

START_TEST(qos_loop_apart_spins_beside_copies)
{
	/*
	 * While bulk copies run on I/O threads the loop sleeps in epoll rather
	 * than spin, so that it takes no CPU from them; where engine.loop_cpus
	 * is apart from engine.worker_cpus its spin takes nothing from them, and
	 * a sleep would cost every hop a wake-up: there it never sleeps for them.
	 */
	ck_assert_uint_gt(sleeps_beside_copies(false, true), 0);
	uint64_t apart = sleeps_beside_copies(true, false);
	ck_assert_msg(apart == 0, "the loop on CPUs of its own slept %" PRIu64 " times for copies",
		      apart);
}
END_TEST

#define LINGER_MS    300
#define LINGER_BYTES (4 * MiB)

/* Daemon a's bulk work that went off its loop: TCP payload bytes, or verbs post lists. */
static uint64_t off_loop(const struct itest_daemon *a)
{
	uint64_t n = itest_stats_field(a, strcmp(itest_transport(), "tcp") == 0
						  ? "tcp_io_thread_bytes_sent"
						  : "verbs_post_thread_wrs");
	ck_assert_uint_ne(n, UINT64_MAX);
	return n;
}

/* One bulk write a -> b, checked byte for byte: how much of it went off a's loop. */
static uint64_t bulk_write_off_loop(struct rdmax_client *ca, struct rdmax_region *src,
				    struct rdmax_region *dst, const struct itest_daemon *a,
				    uint64_t id)
{
	struct rdmax_desc desc = itest_desc(dst);
	uint64_t before = off_loop(a);

	itest_fill(itest_bytes(src), LINGER_BYTES, (uint32_t)id);
	struct rdmax_job job = itest_job(id, RDMAX_OP_WRITE, src, 0, &desc, 0, LINGER_BYTES);
	job.traffic_class = RDMAX_CLASS_BULK;
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "bulk write %" PRIu64 ": %s ('%s')", id,
		      rdmax_err_name(ev.status), ev.reason);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), LINGER_BYTES, "bulk write");
	return off_loop(a) - before;
}

START_TEST(qos_idle_lane_leaves_bulk_to_the_loop)
{
	/*
	 * Bulk copies (TCP) and bulk posts on a software device (verbs) leave
	 * the loop only while latency-class traffic is there to serve: right
	 * after a latency write they go to the I/O threads or the posting
	 * thread; once the lane, still open, has carried nothing for
	 * lane_linger_ms they are the loop's again, which moves bulk alone
	 * faster; the next latency write takes them off the loop once more.
	 */
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	uint64_t id = 1, lane_ms;

	itest_daemon_set(a, "qos.enabled=true");
	itest_daemon_set(a, "qos.lane_linger_ms=%u", LINGER_MS);
	itest_daemon_set(b, "qos.enabled=true");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "bulk");
	struct rdmax_client *cb = itest_client(b, "sink");
	struct rdmax_region *src = itest_alloc(ca, LINGER_BYTES, 0);
	struct rdmax_region *dst = itest_alloc(cb, LINGER_BYTES, RDMAX_ACCESS_REMOTE_WRITE);
	uint64_t lanes_qps;

	/* No lane yet: the loop's. */
	ck_assert_uint_eq(bulk_write_off_loop(ca, src, dst, a, id++), 0);
	for (int round = 0; round < 2; round++) {
		lane_ms = itest_now_ms(); /* before the daemon's last lane byte */
		itest_open_latency_lane(ca, cb);
		ck_assert_int_eq(latency_lanes(a, &lanes_qps), 1);
		ck_assert_uint_gt(bulk_write_off_loop(ca, src, dst, a, id++), 0);
		/* The lane stays open; bulk goes back to the loop once it has idled. */
		uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
		while (bulk_write_off_loop(ca, src, dst, a, id++) > 0) {
			ck_assert_msg(itest_now_ms() < deadline,
				      "bulk still off the loop %" PRIu64 " ms after the last "
				      "latency write",
				      itest_now_ms() - lane_ms);
		}
		ck_assert_msg(itest_now_ms() - lane_ms >= LINGER_MS,
			      "bulk back on the loop %" PRIu64 " ms after the last latency write",
			      itest_now_ms() - lane_ms);
		ck_assert_int_eq(latency_lanes(a, &lanes_qps), 1);
	}
	itest_assert_quiet(ca, 50);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* Where bulk leaves the loop beside a lane: TCP I/O threads, or a software verbs device. */
static bool bulk_leaves_loop(void)
{
	if (strcmp(itest_transport(), "tcp") == 0) {
		return !getenv("RDMAXD_TEST_TCP_OFFLOAD");
	}
	return itest_verbs_software() && !itest_verbs_post_thread_forced();
}

TCase *itest_tcase_qos(void)
{
	TCase *tc = tcase_create("qos");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, qos_latency_passes_bulk_backlog);
	ITEST_ADD_TEST_IF(tc, qos_off_keeps_submission_order, strcmp(itest_transport(), "tcp") == 0,
			  "only one TCP connection keeps every chunk in submission order; verbs "
			  "spreads them over several queue pairs");
	tcase_add_test(tc, qos_reload_and_bad_class);
	tcase_add_test(tc, qos_loop_and_workers_on_their_cpus);
	tcase_add_test(tc, qos_reload_moves_loop_and_workers);
	ITEST_ADD_TEST_IF(tc, qos_loop_apart_spins_beside_copies,
			  strcmp(itest_transport(), "tcp") == 0 && two_cpus(),
			  "it needs bulk copies on TCP I/O threads and two CPUs to keep apart");
	ITEST_ADD_TEST_IF(tc, qos_idle_lane_leaves_bulk_to_the_loop, bulk_leaves_loop(),
			  "bulk leaves the loop beside a lane only over TCP or on a software verbs "
			  "device, and not when a test variable sends it off the loop always");
	return tc;
}
