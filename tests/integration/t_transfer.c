/* SPDX-License-Identifier: MIT */
/*
 * Data movement: WRITE and READ between two daemons at many sizes and
 * unaligned offsets (case "transfer"), between two clients of one daemon
 * (case "same_node"), and deregistration of a region that a job still uses
 * (case "dereg_wait"). Every transfer is checked byte for byte, including
 * the bytes around the target range that must stay untouched.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define ACCESS_RW (RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)

/* Copies of the bytes of a region outside [off, off+len), to prove they were not touched. */
struct guard {
	uint8_t *head;
	uint8_t *tail;
	uint64_t off;
	uint64_t len;
	uint64_t total;
};

static struct guard guard_take(const uint8_t *base, uint64_t total, uint64_t off, uint64_t len)
{
	struct guard g = {.off = off, .len = len, .total = total};

	g.head = malloc(off + 1);
	g.tail = malloc(total - off - len + 1);
	ck_assert(g.head && g.tail);
	memcpy(g.head, base, off);
	memcpy(g.tail, base + off + len, total - off - len);
	return g;
}

static void guard_check(struct guard *g, const uint8_t *base, const char *what)
{
	char msg[128];

	snprintf(msg, sizeof(msg), "%s: bytes before the target range", what);
	itest_assert_mem_eq(base, g->head, g->off, msg);
	snprintf(msg, sizeof(msg), "%s: bytes after the target range", what);
	itest_assert_mem_eq(base + g->off + g->len, g->tail, g->total - g->off - g->len, msg);
	free(g->head);
	free(g->tail);
}

static void dereg(struct rdmax_client *c, struct rdmax_region *r)
{
	int ret = rdmax_region_free(c, r);

	ck_assert_msg(ret == 0, "rdmax_region_free() failed: %s", rdmax_err_name(ret));
}

/* One WRITE a->b and one READ b->a of `len` bytes at odd offsets, checked byte for byte. */
static void write_then_read(struct rdmax_client *ca, struct rdmax_client *cb, uint64_t len,
			    unsigned k)
{
	const uint64_t loff = 13 + 4096 * (k % 3), roff = 4099 + 7 * k;
	char what[96];

	/* A write source needs no remote access at all (least privilege). */
	struct rdmax_region *src = itest_alloc(ca, loff + len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, roff + len + 11, ACCESS_RW);
	uint8_t *s = itest_bytes(src), *t = itest_bytes(dst);
	uint64_t dst_total = rdmax_region_length(dst);
	struct rdmax_desc desc = itest_desc(dst);

	itest_fill(s, rdmax_region_length(src), 1000 + k);
	itest_fill(t, dst_total, 2000 + k);
	struct guard g = guard_take(t, dst_total, roff, len);

	struct rdmax_job job = itest_job(100 + k, RDMAX_OP_WRITE, src, loff, &desc, roff, len);
	struct rdmax_event ev = itest_run_job(ca, &job, 60000);
	ck_assert_msg(ev.status == 0, "WRITE of %" PRIu64 " bytes failed: %s ('%s')", len,
		      rdmax_err_name(ev.status), ev.reason);
	ck_assert_msg(ev.bytes == len, "WRITE of %" PRIu64 " bytes reported %" PRIu64 " bytes", len,
		      ev.bytes);
	snprintf(what, sizeof(what), "WRITE of %" PRIu64 " bytes", len);
	itest_assert_mem_eq(t + roff, s + loff, len, what);
	guard_check(&g, t, what);

	/* READ back other bytes into a fresh region at another offset. */
	const uint64_t roff2 = roff + 1; /* the region has 11 spare bytes */
	const uint64_t loff2 = 4097;
	itest_fill(t, dst_total, 3000 + k);
	struct rdmax_region *sink = itest_alloc(ca, loff2 + len + 5, RDMAX_ACCESS_LOCAL);
	uint8_t *r = itest_bytes(sink);
	uint64_t sink_total = rdmax_region_length(sink);
	itest_fill(r, sink_total, 4000 + k);
	g = guard_take(r, sink_total, loff2, len);

	job = itest_job(200 + k, RDMAX_OP_READ, sink, loff2, &desc, roff2, len);
	ev = itest_run_job(ca, &job, 60000);
	ck_assert_msg(ev.status == 0, "READ of %" PRIu64 " bytes failed: %s ('%s')", len,
		      rdmax_err_name(ev.status), ev.reason);
	ck_assert_msg(ev.bytes == len, "READ of %" PRIu64 " bytes reported %" PRIu64 " bytes", len,
		      ev.bytes);
	snprintf(what, sizeof(what), "READ of %" PRIu64 " bytes", len);
	itest_assert_mem_eq(r + loff2, t + roff2, len, what);
	guard_check(&g, r, what);

	dereg(ca, src);
	dereg(ca, sink);
	dereg(cb, dst);
}

/*
 * Verbs on Soft-RoCE (the guest), or every bulk post list sent to the
 * posting thread: bulk posts beside a latency lane go through the thread.
 */
static bool verbs_posts_on_thread(void)
{
	return itest_verbs_software() ||
	       (strcmp(itest_transport(), "verbs") == 0 && itest_verbs_post_thread_forced());
}

/*
 * Writes and reads of every size class, checked byte for byte, beside an
 * open latency-class connection: with io_threads > 0 (the default, 2) the
 * bulk payloads from 256 KiB on are copied by the TCP transport's I/O
 * threads, with 0 all on the loop; the daemons' counters show which did.
 * Over verbs on a software device the bulk connection's post lists go
 * through the posting thread meanwhile (its counter shows it), and the
 * same bytes must arrive.
 */
static void write_read_sizes_with(unsigned io_threads)
{
	const uint64_t sizes[] = {
		1, 7, 4 * KiB, 64 * KiB + 3, MiB, 8 * MiB + 5, itest_scaled(64 * MiB, 16 * MiB),
	};
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	bool tcp = strcmp(itest_transport(), "tcp") == 0;

	itest_daemon_set(a, "transport.tcp_io_threads=%u", io_threads);
	itest_daemon_set(a, "qos.enabled=true");
	/* The lane keeps bulk off the loops while open, however long the sizes take. */
	itest_daemon_set(a, "qos.lane_linger_ms=0");
	itest_daemon_set(b, "qos.lane_linger_ms=0");
	itest_daemon_set(b, "transport.tcp_io_threads=%u", io_threads);
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "writer");
	struct rdmax_client *cb = itest_client(b, "target");

	itest_open_latency_lane(ca, cb);

	for (unsigned k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		write_then_read(ca, cb, sizes[k], k);
	}
	if (tcp) {
		/* WRITE payloads a -> b, READ payloads b -> a: each side, each direction. */
		const char *fields[] = {"tcp_io_thread_bytes_sent", "tcp_io_thread_bytes_received"};
		struct itest_daemon *ds[] = {a, b};
		for (int i = 0; i < 2; i++) {
			for (int f = 0; f < 2; f++) {
				uint64_t n = itest_stats_field(ds[i], fields[f]);
				ck_assert_msg(io_threads ? n >= 8 * MiB : n == 0,
					      "daemon %s, tcp_io_threads = %u: %s = %" PRIu64,
					      i ? "b" : "a", io_threads, fields[f], n);
			}
		}
	} else {
		/* Every size was written and read back by a: all of it on the thread, or none. */
		uint64_t n = itest_stats_field(a, "verbs_post_thread_wrs");
		ck_assert_msg(verbs_posts_on_thread() ? n >= 2 * sizeof(sizes) / sizeof(sizes[0])
						      : n == 0,
			      "daemon a: verbs_post_thread_wrs = %" PRIu64, n);
	}
	itest_assert_quiet(ca, 50);
	itest_assert_quiet(cb, 50);
	itest_pair_end(ca, cb, a, b);
}

START_TEST(write_read_sizes)
{
	write_read_sizes_with(2);
}
END_TEST

START_TEST(write_read_sizes_on_loop)
{
	write_read_sizes_with(0);
}
END_TEST

/* All sizes in one batch in both directions at once: jobs of one client overlap. */
START_TEST(write_read_batched)
{
	const uint64_t len = itest_scaled(4 * MiB, MiB), n = 6;
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;
	struct rdmax_job jobs[12];
	struct rdmax_event evs[12];

	itest_pair_start(&a, &b, &ca, "writer", &cb, "target");
	struct rdmax_region *src = itest_alloc(ca, n * len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *sink = itest_alloc(ca, n * len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, n * len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *origin = itest_alloc(cb, n * len, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_desc ddst = itest_desc(dst), dorigin = itest_desc(origin);
	itest_fill(itest_bytes(src), n * len, 77);
	itest_fill(itest_bytes(origin), n * len, 78);

	for (uint64_t i = 0; i < n; i++) {
		/* Lengths len, len-1, ... so that chunk boundaries differ between jobs. */
		uint64_t l = len - i;
		jobs[2 * i] = itest_job(10 + i, RDMAX_OP_WRITE, src, i * len, &ddst, i * len, l);
		jobs[2 * i + 1] =
			itest_job(20 + i, RDMAX_OP_READ, sink, i * len, &dorigin, i * len, l);
	}
	ck_assert_int_eq(rdmax_submit(ca, jobs, 2 * n), 0);
	size_t got = itest_collect(ca, evs, 2 * n, 60000, NULL);
	ck_assert_uint_eq(got, 2 * n);
	bool seen[12] = {false};
	for (size_t i = 0; i < got; i++) {
		uint64_t id = evs[i].job_id;
		ck_assert_msg((id >= 10 && id < 10 + n) || (id >= 20 && id < 20 + n),
			      "completion for unknown job %" PRIu64, id);
		size_t slot = id >= 20 ? 2 * (id - 20) + 1 : 2 * (id - 10);
		ck_assert_msg(!seen[slot], "job %" PRIu64 " completed twice", id);
		seen[slot] = true;
		ck_assert_msg(evs[i].status == 0, "job %" PRIu64 " failed: %s ('%s')", id,
			      rdmax_err_name(evs[i].status), evs[i].reason);
		ck_assert_uint_eq(evs[i].bytes, jobs[slot].length);
	}
	itest_assert_quiet(ca, ITEST_QUIET_MS);
	for (uint64_t i = 0; i < n; i++) {
		itest_assert_mem_eq(itest_bytes(dst) + i * len, itest_bytes(src) + i * len, len - i,
				    "batched WRITE");
		itest_assert_mem_eq(itest_bytes(sink) + i * len, itest_bytes(origin) + i * len,
				    len - i, "batched READ");
	}
	/* No latency-class connection was open: every copy and post stayed on the loops. */
	if (strcmp(itest_transport(), "tcp") == 0 && !getenv("RDMAXD_TEST_TCP_OFFLOAD")) {
		ck_assert_uint_eq(itest_stats_field(a, "tcp_io_thread_bytes_sent"), 0);
		ck_assert_uint_eq(itest_stats_field(b, "tcp_io_thread_bytes_received"), 0);
	}
	if (strcmp(itest_transport(), "verbs") == 0 && !itest_verbs_post_thread_forced()) {
		ck_assert_uint_eq(itest_stats_field(a, "verbs_post_thread_wrs"), 0);
	}
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* The number after `key` in the first object of `reply` that begins with `object`. */
static double reply_number(const char *reply, const char *object, const char *key)
{
	const char *o = strstr(reply, object);
	ck_assert_msg(o != NULL, "no %s in the stats reply", object);
	const char *k = strstr(o, key);
	const char *end = strchr(o, '}');
	ck_assert_msg(k != NULL && end != NULL && k < end, "no %s in %s", key, object);
	return strtod(k + strlen(key), NULL);
}

/*
 * [metrics] job_stages: every write and SEND to the other daemon is timed in
 * its three stages (queue, the call that sends its first bytes, complete),
 * each no longer than the jobs themselves on average. Over verbs, post lists
 * handed to the posting thread are not timed: with
 * RDMAXD_TEST_VERBS_POST_THREAD=1 every post list is, and no job is.
 * Over TCP every frame here is below the I/O threads' minimum, so the loop
 * sends them all in both passes.
 */
START_TEST(job_stages_timed)
{
	enum { JOBS = 64, LEN = 64, SENDS = 8 };
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	char reply[65536];

	itest_daemon_set(a, "metrics.job_stages=true");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "timed");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, 64 * KiB, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);

	itest_fill(itest_bytes(src), 64 * KiB, 11);
	for (uint64_t i = 0; i < JOBS; i++) {
		struct rdmax_job job =
			itest_job(1 + i, RDMAX_OP_WRITE, src, i * LEN, &desc, i * LEN, LEN);
		struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
		ck_assert_msg(ev.status == 0, "write %" PRIu64 " failed: %s", i, ev.reason);
	}
	/* One job of several chunks (and work requests, over verbs). */
	struct rdmax_job job = itest_job(JOBS + 1, RDMAX_OP_WRITE, src, 0, &desc, 0, 64 * KiB);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "64 KiB write failed: %s", ev.reason);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 64 * KiB, "timed writes");
	/* Messages to a mailbox of the other daemon (the transports that carry them). */
	bool sends =
		strcmp(itest_transport(), "tcp") == 0 || strcmp(itest_transport(), "verbs") == 0;
	if (sends) {
		struct rdmax_desc box;
		ck_assert_int_eq(rdmax_mailbox_open_addr(cb, "stages.in", &box), 0);
		for (uint64_t i = 0; i < SENDS; i++) {
			job = itest_job(JOBS + 2 + i, RDMAX_OP_SEND, NULL, 0, &box, 0, 0);
			job.u.send.payload = itest_bytes(src) + i * LEN;
			job.u.send.length = LEN;
			ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
			ck_assert_msg(ev.status == 0, "SEND %" PRIu64 " failed: %s", i, ev.reason);
		}
	}

	ck_assert_int_ge(itest_admin_reply(a, "stats", reply, sizeof(reply)), 0);
	bool thread = strcmp(itest_transport(), "verbs") == 0 && itest_verbs_post_thread_forced();
	uint64_t want = thread ? 0 : JOBS + 1 + (sends ? SENDS : 0);
	const char *latency = strstr(reply, "\"latency\":[");
	ck_assert_ptr_nonnull(latency);
	/* The mean over the jobs timed, writes and SENDs. */
	double write_n = reply_number(latency, "{\"op\":\"write\"", "\"count\":");
	double send_n = reply_number(latency, "{\"op\":\"send\"", "\"count\":");
	ck_assert_msg(send_n == (sends ? SENDS : 0), "%g SENDs counted", send_n);
	double job_mean = (write_n * reply_number(latency, "{\"op\":\"write\"", "\"mean_s\":") +
			   send_n * reply_number(latency, "{\"op\":\"send\"", "\"mean_s\":")) /
			  (write_n + send_n);
	double stages = 0;
	for (int s = 0; s < 3; s++) {
		static const char *const names[] = {"{\"stage\":\"queue\"", "{\"stage\":\"post\"",
						    "{\"stage\":\"complete\""};
		uint64_t count = (uint64_t)reply_number(reply, names[s], "\"count\":");
		ck_assert_msg(count == want, "%s: %" PRIu64 " jobs timed, %" PRIu64 " expected",
			      names[s], count, want);
		double mean = reply_number(reply, names[s], "\"mean_s\":");
		ck_assert_msg(mean >= 0 && mean <= job_mean, "%s: mean %g s, the job's %g s",
			      names[s], mean, job_mean);
		stages += mean;
	}
	if (want) {
		/* A system call (rxe: the whole round trip inside it): never 0. */
		ck_assert(reply_number(reply, "{\"stage\":\"post\"", "\"mean_s\":") > 0);
		ck_assert_msg(stages <= job_mean * 1.001, "stages %g s against the job's %g s",
			      stages, job_mean);
	}
	itest_pair_end(ca, cb, a, b);
}
END_TEST

TCase *itest_tcase_transfer(void)
{
	TCase *tc = tcase_create("transfer");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, write_read_sizes);
	tcase_add_test(tc, write_read_sizes_on_loop);
	tcase_add_test(tc, write_read_batched);
	tcase_add_test(tc, job_stages_timed);
	return tc;
}

/* ---------------------------------------------------------------- same node */

START_TEST(same_node_copy)
{
	const uint64_t len = MiB + 333;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());

	itest_daemon_start(a);
	struct rdmax_client *c1 = itest_client(a, "one");
	struct rdmax_client *c2 = itest_client(a, "two");
	struct rdmax_region *src = itest_alloc(c1, len + 100, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(c2, len + 2 * 4096, ACCESS_RW);
	uint8_t *s = itest_bytes(src), *t = itest_bytes(dst);
	uint64_t total = rdmax_region_length(dst);
	struct rdmax_desc desc = itest_desc(dst);

	itest_fill(s, rdmax_region_length(src), 5);
	itest_fill(t, total, 6);
	struct guard g = guard_take(t, total, 777, len);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 100, &desc, 777, len);
	struct rdmax_event ev = itest_run_job(c1, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "same-node WRITE failed: %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
	ck_assert_uint_eq(ev.bytes, len);
	itest_assert_mem_eq(t + 777, s + 100, len, "same-node WRITE");
	guard_check(&g, t, "same-node WRITE");

	/* And back: READ from the other client's region into a third one. */
	struct rdmax_region *sink = itest_alloc(c1, len + 3, RDMAX_ACCESS_LOCAL);
	uint8_t *r = itest_bytes(sink);
	itest_fill(t, total, 7);
	itest_fill(r, rdmax_region_length(sink), 8);
	g = guard_take(r, rdmax_region_length(sink), 3, len);
	job = itest_job(2, RDMAX_OP_READ, sink, 3, &desc, 4096, len);
	ev = itest_run_job(c1, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "same-node READ failed: %s ('%s')", rdmax_err_name(ev.status),
		      ev.reason);
	ck_assert_uint_eq(ev.bytes, len);
	itest_assert_mem_eq(r + 3, t + 4096, len, "same-node READ");
	guard_check(&g, r, "same-node READ");

	/* The local copy path checks access like the remote one. */
	struct rdmax_region *closed = itest_alloc(c2, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *ro = itest_alloc(c2, 4096, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *wo = itest_alloc(c2, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc dclosed = itest_desc(closed), dro = itest_desc(ro), dwo = itest_desc(wo);
	itest_fill(itest_bytes(ro), 4096, 9);
	memset(itest_bytes(closed), 0x5a, 4096);
	memcpy(itest_bytes(wo), itest_bytes(ro), 4096);

	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &dclosed, 0, 64);
	itest_expect_job_error(c1, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	job = itest_job(4, RDMAX_OP_WRITE, src, 0, &dro, 0, 64);
	itest_expect_job_error(c1, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	job = itest_job(5, RDMAX_OP_READ, sink, 0, &dwo, 0, 64);
	itest_expect_job_error(c1, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	job = itest_job(6, RDMAX_OP_READ, sink, 0, &dclosed, 0, 64);
	itest_expect_job_error(c1, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	for (int i = 0; i < 4096; i++) {
		ck_assert_msg(itest_bytes(closed)[i] == 0x5a, "refused WRITE changed byte %d", i);
	}
	itest_assert_mem_eq(itest_bytes(ro), itest_bytes(wo), 4096, "refused WRITE");

	/* A stale descriptor of the same node: deregistered by its owner. */
	dereg(c2, dst);
	job = itest_job(7, RDMAX_OP_WRITE, src, 0, &desc, 0, 64);
	itest_expect_job_error(c1, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);

	itest_assert_quiet(c2, 50);
	rdmax_client_close(c1);
	rdmax_client_close(c2);
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

TCase *itest_tcase_same_node(void)
{
	TCase *tc = tcase_create("same_node");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, same_node_copy);
	return tc;
}

/* --------------------------------------------------------------- dereg wait */

/*
 * The peer is stopped while a large write is in flight, and resumed by a
 * helper process after RESUME_MS; a deregistration of the write's source
 * must not return before the write completed.
 */
#define RESUME_MS 700

START_TEST(dereg_waits_for_job)
{
	const uint64_t len = itest_scaled(64 * MiB, 8 * MiB);
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	itest_pair_start(&a, &b, &ca, "writer", &cb, "target");
	struct rdmax_region *dst = itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *src = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc desc = itest_desc(dst);
	uint8_t *expect = malloc(len);
	ck_assert_ptr_nonnull(expect);
	itest_fill(expect, len, 42);
	memcpy(itest_bytes(src), expect, len);

	/* Connect first, so that the write below is queued on a live connection. */
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "warm-up WRITE failed: %s ('%s')", rdmax_err_name(ev.status),
		      ev.reason);

	itest_daemon_pause(b);
	pid_t parent = getpid(), helper = fork();
	ck_assert_int_ge(helper, 0);
	if (helper == 0) {
		itest_child_setup(parent);
		itest_sleep_ms(RESUME_MS);
		itest_daemon_resume_quiet(b);
		_exit(0);
	}
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &desc, 0, len);
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	uint64_t t0 = itest_now_ms();
	int ret = rdmax_region_free(ca, src);
	uint64_t took = itest_now_ms() - t0;
	ck_assert_msg(ret == 0, "rdmax_region_free() failed: %s", rdmax_err_name(ret));
	ck_assert_msg(took >= RESUME_MS - 200,
		      "deregistration returned after %" PRIu64 " ms while the job using the "
		      "region was stuck on a stopped peer for %d ms",
		      took, RESUME_MS);
	/* What the daemon wrote must be complete now: it held the source until then. */
	itest_assert_mem_eq(itest_bytes(dst), expect, len,
			    "destination when the source's deregistration returned");

	struct rdmax_event done;
	ck_assert_uint_eq(itest_collect(ca, &done, 1, 30000, NULL), 1);
	ck_assert_uint_eq(done.job_id, 2);
	ck_assert_msg(done.status == 0, "the write whose source was deregistered failed: %s ('%s')",
		      rdmax_err_name(done.status), done.reason);
	ck_assert_uint_eq(done.bytes, len);
	itest_assert_quiet(ca, ITEST_QUIET_MS);

	int status;
	ck_assert_int_eq(waitpid(helper, &status, 0), helper);
	b->stopped = false;
	b->fabric_stalled = false; /* the helper let the fabric go */
	free(expect);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/*
 * The target of a large write is deregistered by its owner while the write
 * streams into it: the owner's daemon must not write into memory it has
 * unmapped, the deregistration must return, and the write gets one
 * completion: OK if it landed first, NOT_FOUND if the rest was refused.
 */
START_TEST(dereg_target_during_write)
{
	const uint64_t len = itest_scaled(64 * MiB, 8 * MiB);
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	itest_pair_start(&a, &b, &ca, "writer", &cb, "target");
	struct rdmax_region *src = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	itest_fill(itest_bytes(src), len, 43);

	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_int_eq(ev.status, 0);
	memset(itest_bytes(dst), 0, 4096);

	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &desc, 0, len);
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	/* Wait until the first bytes landed, so the write is surely under way. */
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	while (memcmp(itest_bytes(dst), itest_bytes(src), 4096) != 0 && itest_now_ms() < deadline) {
	}
	ck_assert_msg(itest_now_ms() < deadline, "the write did not start");
	dereg(cb, dst);

	ck_assert_uint_eq(itest_collect(ca, &ev, 1, 30000, NULL), 1);
	ck_assert_uint_eq(ev.job_id, 2);
	ck_assert_msg(ev.status == 0 || ev.status == RDMAX_E_NOT_FOUND,
		      "write into a region deregistered meanwhile completed with %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
	ck_assert_uint_eq(ev.bytes, ev.status == 0 ? len : ev.bytes);
	ck_assert_uint_le(ev.bytes, len);
	itest_assert_quiet(ca, ITEST_QUIET_MS);

	/* Both daemons are fine: a new target takes a write. */
	struct rdmax_region *dst2 = itest_alloc(cb, MiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc2 = itest_desc(dst2);
	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &desc2, 0, MiB);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "WRITE after the deregistration failed: %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
	itest_assert_mem_eq(itest_bytes(dst2), itest_bytes(src), MiB, "WRITE to a new target");
	/* And the old descriptor is stale now. */
	job = itest_job(4, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	itest_expect_job_error(ca, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);

	itest_pair_end(ca, cb, a, b);
}
END_TEST

TCase *itest_tcase_dereg_wait(void)
{
	TCase *tc = tcase_create("dereg_wait");

	tcase_set_timeout(tc, 60);
	ITEST_ADD_STALLING_TEST(tc, dereg_waits_for_job);
	tcase_add_test(tc, dereg_target_during_write);
	return tc;
}
