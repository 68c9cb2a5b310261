/* SPDX-License-Identifier: MIT */
/*
 * [transport] tcp_encryption = on: TLS 1.3 with the PSK of the shared key
 * on TCP peer connections. Transfers of every shape arrive byte for byte; a
 * sniffing relay between the daemons sees a payload pattern with
 * encryption off and never with it on; daemons with different settings or
 * keys fail the job with a named error instead of hanging; and a connection
 * to the daemon's own listener is still refused by the instance id that
 * travels inside TLS. RDMAX_TEST_TLS_PATH (ktls_tx, user, or ktls, which
 * also accepts ktls_tx) makes tls_transfers insist on that data path on both
 * daemons (tests/run-verbs-suite proves kernel TLS in the guest this way).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define ACCESS_RW (RDMAX_ACCESS_LOCAL | RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)
#define TLS_KEY   "tls-test-key-0123456789abcdef-0123\n"
#define OTHER_KEY "tls-test-key-0123456789abcdef-0124\n"
#define PATTERN   "RDMAX-SNIFF-ME-7f3a9c-PLAINTEXT!"

static struct itest_daemon *tls_daemon(const char *name, const char *addr, const char *key, bool on)
{
	struct itest_daemon *d = itest_daemon_new(name, addr);

	if (key) {
		itest_daemon_auth_key(d, key);
	}
	itest_daemon_set(d, "transport.tcp_encryption=%s", on ? "on" : "off");
	itest_daemon_set(d, "peers.connect_retries=0");
	return d;
}

/* Both clients closed, both daemons stopped (exit status 0) and freed. */
static void close_pair(struct rdmax_client *c1, struct rdmax_client *c2, struct itest_daemon *d1,
		       struct itest_daemon *d2)
{
	itest_pair_end(c1, c2, d1, d2);
}

static void run_ok(struct rdmax_client *c, const struct rdmax_job *job, uint64_t bytes,
		   const char *what)
{
	struct rdmax_event ev = itest_run_job(c, job, ITEST_WAIT_MS);

	ck_assert_msg(ev.status == 0, "%s failed with %s ('%s')", what, rdmax_err_name(ev.status),
		      ev.reason);
	ck_assert_uint_eq(ev.bytes, bytes);
}

/* The job fails with err, and its reason names why. */
static void run_refused(struct rdmax_client *c, const struct rdmax_job *job, int err,
			const char *needle)
{
	uint64_t t0 = itest_now_ms();
	struct rdmax_event ev = itest_run_job(c, job, ITEST_WAIT_MS);

	ck_assert_msg(ev.status == err, "job completed with %s ('%s'), expected %s",
		      rdmax_err_name(ev.status), ev.reason, rdmax_err_name(err));
	ck_assert_msg(strstr(ev.reason, needle), "reason '%s' does not name '%s'", ev.reason,
		      needle);
	fprintf(stderr, "itest tls: refused in %" PRIu64 " ms: %s\n", itest_now_ms() - t0,
		ev.reason);
}

static void fill_pattern(uint8_t *p, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++) {
		p[i] = (uint8_t)PATTERN[i % (sizeof(PATTERN) - 1)];
	}
}

/* WRITE, READ, PAGED_WRITE and PAGED_READ over TLS, bytes compared each time. */
START_TEST(tls_transfers)
{
	const uint64_t len = 4 * MiB, page = 16 * KiB;
	const size_t n = 64;
	uint32_t li[64], ri[64];
	struct itest_daemon *a = tls_daemon("tls-a", itest_addr_a(), TLS_KEY, true);
	struct itest_daemon *b = tls_daemon("tls-b", itest_addr_b(), TLS_KEY, true);

	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "owner");
	struct rdmax_client *cb = itest_client(b, "mover");
	struct rdmax_region *remote = itest_alloc(ca, len, ACCESS_RW);
	struct rdmax_region *local = itest_alloc(cb, len, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(remote);

	/* WRITE: one large and one small frame. */
	itest_fill(itest_bytes(local), len, itest_seed());
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, local, 0, &desc, 0, len);
	run_ok(cb, &job, len, "WRITE of 4 MiB over TLS");
	itest_assert_mem_eq(itest_bytes(remote), itest_bytes(local), len, "WRITE over TLS");
	job = itest_job(2, RDMAX_OP_WRITE, local, 100, &desc, 7, 3000);
	itest_fill(itest_bytes(local), len, itest_seed() + 1);
	run_ok(cb, &job, 3000, "small WRITE over TLS");
	itest_assert_mem_eq(itest_bytes(remote) + 7, itest_bytes(local) + 100, 3000, "small WRITE");

	/* READ: the remote region back into a cleared local one. */
	itest_fill(itest_bytes(remote), len, itest_seed() + 2);
	memset(itest_bytes(local), 0, len);
	job = itest_job(3, RDMAX_OP_READ, local, 0, &desc, 0, len);
	run_ok(cb, &job, len, "READ of 4 MiB over TLS");
	itest_assert_mem_eq(itest_bytes(local), itest_bytes(remote), len, "READ over TLS");

	/* PAGED_WRITE and PAGED_READ: pages in a scrambled order both ways. */
	for (size_t i = 0; i < n; i++) {
		li[i] = (uint32_t)((i * 37) % n);
		ri[i] = (uint32_t)((i * 11 + 5) % (len / page));
	}
	itest_fill(itest_bytes(local), len, itest_seed() + 3);
	memset(itest_bytes(remote), 0, len);
	job = itest_job(4, RDMAX_OP_PAGED_WRITE, local, 0, &desc, 0, 0);
	job.u.paged.page_len = page;
	job.u.paged.local_pages = (struct rdmax_pages){.indices = li, .count = n};
	job.u.paged.remote_pages = (struct rdmax_pages){.indices = ri, .count = n};
	run_ok(cb, &job, n * page, "PAGED_WRITE over TLS");
	for (size_t i = 0; i < n; i++) {
		itest_assert_mem_eq(itest_bytes(remote) + ri[i] * page,
				    itest_bytes(local) + li[i] * page, page, "PAGED_WRITE page");
	}
	itest_fill(itest_bytes(remote), len, itest_seed() + 4);
	memset(itest_bytes(local), 0, len);
	job.id = 5;
	job.op = RDMAX_OP_PAGED_READ;
	run_ok(cb, &job, n * page, "PAGED_READ over TLS");
	for (size_t i = 0; i < n; i++) {
		itest_assert_mem_eq(itest_bytes(local) + li[i] * page,
				    itest_bytes(remote) + ri[i] * page, page, "PAGED_READ page");
	}

	/* Both ends logged the TLS data path once; the expected one where the run names it. */
	ck_assert_msg(itest_log_contains(b, "TLSv1.3 TLS_AES_128_GCM_SHA256, data path"),
		      "the dialer did not log its TLS data path");
	ck_assert_msg(itest_log_contains(a, "TLSv1.3 TLS_AES_128_GCM_SHA256, data path"),
		      "the acceptor did not log its TLS data path");
	/* One connection each way counted under the data path the log names. */
	static const char *const paths[] = {"ktls", "ktls_tx", "user"};
	const char *want = getenv("RDMAX_TEST_TLS_PATH");
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		char needle[64], field[64];
		snprintf(needle, sizeof(needle), "data path %s (", paths[i]);
		snprintf(field, sizeof(field), "tcp_tls_connections_%s", paths[i]);
		bool on_a = itest_log_contains(a, needle), on_b = itest_log_contains(b, needle);
		ck_assert_uint_eq(itest_stats_field(a, field), on_a ? 1 : 0);
		ck_assert_uint_eq(itest_stats_field(b, field), on_b ? 1 : 0);
		if (on_a || on_b) {
			fprintf(stderr, "itest tls: data path %s on %s\n", paths[i],
				on_a && on_b ? "both daemons"
				: on_a       ? "the acceptor"
					     : "the dialer");
		}
	}
	if (want && *want) {
		char needle[64];
		snprintf(needle, sizeof(needle), "data path %s", want);
		ck_assert_msg(itest_log_contains(b, needle) && itest_log_contains(a, needle),
			      "TLS data path is not '%s' on both daemons", want);
	}
	close_pair(ca, cb, a, b);
}
END_TEST

/* Whether the file holds needle; *ret_size receives its size. */
static bool file_holds(const char *path, const char *needle, uint64_t *ret_size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(read(fd, buf, (size_t)st.st_size), st.st_size);
	close(fd);
	bool found = memmem(buf, (size_t)st.st_size, needle, strlen(needle)) != NULL;
	free(buf);
	*ret_size = (uint64_t)st.st_size;
	return found;
}

/*
 * A WRITE and a READ of a recognisable pattern through a relay that keeps a
 * copy of every byte. With encryption off (and no key, since a keyed plain
 * connection refuses a relay) the pattern is in the copy; with it on the
 * transfers still succeed through the relay, byte for byte, and the copy,
 * larger than both payloads, never holds the pattern.
 */
static void sniff(bool on)
{
	const uint64_t len = 256 * KiB;
	struct itest_daemon *v = tls_daemon("sniff-v", itest_addr_a(), on ? TLS_KEY : NULL, on);
	struct itest_daemon *d = tls_daemon("sniff-d", itest_addr_b(), on ? TLS_KEY : NULL, on);
	char capture_path[256];
	uint16_t rport;

	itest_daemon_start(v);
	itest_daemon_start(d);
	struct rdmax_client *cv = itest_client(v, "victim-app");
	struct rdmax_client *cd = itest_client(d, "dialer-app");
	struct rdmax_region *dst = itest_alloc(cv, len, ACCESS_RW);
	struct rdmax_region *src = itest_alloc(cd, len, ACCESS_RW);
	struct rdmax_desc real = itest_desc(dst);
	struct itest_target t = itest_target_of(&real);

	snprintf(capture_path, sizeof(capture_path), "%s/sniffed.bin", d->dir);
	int capture = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(capture, 0);
	int lfd = itest_listen_any(itest_addr_b(), &rport);
	pid_t parent = getpid(), child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		itest_child_setup(parent);
		itest_relay(lfd, t.addr, t.port, capture);
	}
	close(lfd);
	close(capture);
	struct rdmax_desc relayed = itest_via(&real, itest_addr_b(), rport);

	fill_pattern(itest_bytes(src), len);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &relayed, 0, len);
	run_ok(cd, &job, len, "WRITE through the sniffing relay");
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), len, "WRITE through the relay");
	memset(itest_bytes(src), 0, len);
	job = itest_job(2, RDMAX_OP_READ, src, 0, &relayed, 0, len);
	run_ok(cd, &job, len, "READ through the sniffing relay");
	itest_assert_mem_eq(itest_bytes(src), itest_bytes(dst), len, "READ through the relay");
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);

	uint64_t size;
	bool seen = file_holds(capture_path, PATTERN, &size);
	fprintf(stderr, "itest tls: encryption %s: the relay saw %" PRIu64 " bytes, pattern %s\n",
		on ? "on" : "off", size, seen ? "seen" : "not seen");
	ck_assert_msg(size >= 2 * len, "the relay carried %" PRIu64 " bytes, expected >= %" PRIu64,
		      size, 2 * len);
	ck_assert_msg(seen == !on, "the pattern was %s in the relayed bytes with encryption %s",
		      seen ? "seen" : "not seen", on ? "on" : "off");
	close_pair(cv, cd, v, d);
}

START_TEST(tls_sniff_off)
{
	sniff(false);
}
END_TEST

START_TEST(tls_sniff_on)
{
	sniff(true);
}
END_TEST

/*
 * One daemon dials another with other settings: the WRITE fails with
 * RDMAX_E_PERMISSION_DENIED and a reason naming the difference, and no byte
 * lands. _i selects which side has encryption on, or different keys.
 */
START_TEST(tls_refusals)
{
	static const struct {
		bool dialer_on, acceptor_on;
		const char *dialer_key, *acceptor_key;
		const char *needle;
	} cases[] = {
		{true, false, TLS_KEY, TLS_KEY,
		 "tcp_encryption differs: the connecting daemon has it on"},
		{false, true, NULL, TLS_KEY,
		 "tcp_encryption differs: the connecting daemon has it off"},
		{false, true, TLS_KEY, TLS_KEY,
		 "tcp_encryption differs: the connecting daemon has it off"},
		{true, true, TLS_KEY, OTHER_KEY, "same [auth] key_file"},
	};
	const uint64_t len = 64 * KiB;
	struct itest_daemon *v = tls_daemon("acceptor", itest_addr_a(), cases[_i].acceptor_key,
					    cases[_i].acceptor_on);
	struct itest_daemon *d =
		tls_daemon("dialer", itest_addr_b(), cases[_i].dialer_key, cases[_i].dialer_on);

	itest_daemon_start(v);
	itest_daemon_start(d);
	struct rdmax_client *cv = itest_client(v, "acceptor-app");
	struct rdmax_client *cd = itest_client(d, "dialer-app");
	struct rdmax_region *dst = itest_alloc(cv, len, ACCESS_RW);
	struct rdmax_region *src = itest_alloc(cd, len, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);
	fill_pattern(itest_bytes(src), len);

	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, len);
	run_refused(cd, &job, RDMAX_E_PERMISSION_DENIED, cases[_i].needle);
	for (uint64_t i = 0; i < len; i++) {
		ck_assert_msg(itest_bytes(dst)[i] == 0, "a refused WRITE changed byte %" PRIu64, i);
	}
	job = itest_job(2, RDMAX_OP_READ, src, 0, &desc, 0, 4096);
	run_refused(cd, &job, RDMAX_E_PERMISSION_DENIED, cases[_i].needle);
	if (cases[_i].acceptor_key && cases[_i].dialer_key &&
	    strcmp(cases[_i].acceptor_key, cases[_i].dialer_key) != 0) {
		ck_assert_msg(itest_log_contains(v, "another [auth] key_file"),
			      "the acceptor did not log that the key differs");
	}
	close_pair(cv, cd, v, d);
}
END_TEST

/*
 * A descriptor of the peer's region pointing at the dialer's own listener:
 * TLS comes up (same key at both ends), and the HELLO inside it carries the
 * daemon's own instance id, so it refuses itself, as a relay back to the
 * dialer would be refused.
 */
START_TEST(tls_own_instance_refused)
{
	struct itest_daemon *v = tls_daemon("victim", itest_addr_a(), TLS_KEY, true);
	struct itest_daemon *d = tls_daemon("dialer", itest_addr_b(), TLS_KEY, true);

	itest_daemon_start(v);
	itest_daemon_start(d);
	struct rdmax_client *cv = itest_client(v, "victim-app");
	struct rdmax_client *cd = itest_client(d, "dialer-app");
	struct rdmax_region *dst = itest_alloc(cv, 4096, ACCESS_RW);
	struct rdmax_region *src = itest_alloc(cd, 4096, ACCESS_RW);
	struct rdmax_desc real = itest_desc(dst);
	struct rdmax_desc mine = itest_desc(src);
	struct itest_target own = itest_target_of(&mine);
	struct rdmax_desc looped = itest_via(&real, own.addr, own.port);

	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &looped, 0, 4096);
	run_refused(cd, &job, RDMAX_E_PERMISSION_DENIED, "own instance id");
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &real, 0, 4096);
	run_ok(cd, &job, 4096, "direct WRITE after the refusal");
	close_pair(cv, cd, v, d);
}
END_TEST

TCase *itest_tcase_tls(void)
{
	TCase *tc = tcase_create("tls");
	bool tcp = strcmp(itest_transport(), "tcp") == 0;
	bool loopback = strcmp(itest_addr_a(), "127.0.0.1") == 0 &&
			strcmp(itest_addr_b(), "127.0.0.1") == 0;
	const char *why = "tcp_encryption is a setting of the TCP transport";

	tcase_set_timeout(tc, 60);
	ITEST_ADD_TEST_IF(tc, tls_transfers, tcp, why);
	ITEST_ADD_TEST_IF(tc, tls_sniff_off, tcp && loopback, "the relay listens on loopback");
	ITEST_ADD_TEST_IF(tc, tls_sniff_on, tcp && loopback, "the relay listens on loopback");
	if (tcp) {
		tcase_add_loop_test(tc, tls_refusals, 0, 4);
	}
	ITEST_ADD_TEST_IF(tc, tls_own_instance_refused, tcp, why);
	return tc;
}
