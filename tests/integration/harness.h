/* SPDX-License-Identifier: MIT */
/*
 * Integration-test harness: real rdmaxd processes with their own temporary
 * directories, real librdmax clients, and the helpers the cases share
 * (random data, completion bookkeeping, bounded waits).
 *
 * Every function that can fail asserts (check's ck_assert) instead of
 * returning an error, so a case reads as the scenario it tests. Child
 * processes forked by a case must not assert and must leave with _exit().
 */
#ifndef RDMAX_ITEST_HARNESS_H
#define RDMAX_ITEST_HARNESS_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "rdmax.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

/* Longest wait for anything that should happen "at once" (a reply, a local job). */
#define ITEST_WAIT_MS 10000
/* How long a case watches for an event that must not come. */
#define ITEST_QUIET_MS 300

/* ------------------------------------------------------------- environment */

/* RDMAX_TEST_ADDR_A / RDMAX_TEST_ADDR_B (default 127.0.0.1). */
const char *itest_addr_a(void);
const char *itest_addr_b(void);
/* RDMAX_TEST_TRANSPORT (default tcp), passed to every daemon as --transport. */
const char *itest_transport(void);
/*
 * Whether RDMAXD_TEST_VERBS_POST_THREAD is "1", the one value rdmaxd itself
 * reads it as: its verbs transport then hands every bulk post list to the
 * posting thread, where otherwise the loop posts them (the thread takes them
 * only on software devices while a latency lane is active). tests/run-verbs-suite
 * sets it for its second pass over the suite.
 */
bool itest_verbs_post_thread_forced(void);
/*
 * Whether the verbs devices are software ones (Soft-RoCE in the project's
 * guest: RDMAX_GUEST=1), where bulk post lists beside an active latency lane
 * go to the posting thread; on a hardware NIC they stay on the loop.
 */
bool itest_verbs_software(void);
/* RDMAX_TEST_SCALE (default 1). */
double itest_scale(void);
/* n scaled by RDMAX_TEST_SCALE, never below min. */
uint64_t itest_scaled(uint64_t n, uint64_t min);
/* Monotonic milliseconds. */
uint64_t itest_now_ms(void);
/* Sleep for ms milliseconds. */
void itest_sleep_ms(unsigned ms);

/* ----------------------------------------------------------------- daemons */

#define ITEST_MAX_SETS 16

struct itest_daemon {
	char name[32]; /* --node-name */
	char dir[128]; /* own temporary directory */
	char socket_path[160];
	char log_path[160];
	char conf_path[160];
	char key_path[160]; /* "" unless a key was set */
	char addr[64];      /* --listen */
	uint16_t port;      /* --port; 0 = ephemeral */
	char *sets[ITEST_MAX_SETS];
	size_t n_sets;
	pid_t pid;           /* 0 when not running */
	bool stopped;        /* SIGSTOPped (or its fabric stalled) by the case */
	bool fabric_stalled; /* stalled with RDMAX_TEST_FABRIC_STALL instead of SIGSTOP */
};

/*
 * A daemon (not started) with its own directory under the run directory.
 * \param name node name, also part of the directory name
 * \param addr listen address
 */
struct itest_daemon *itest_daemon_new(const char *name, const char *addr);
/* Add a "--set section.key=value" option (printf format). */
void itest_daemon_set(struct itest_daemon *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Use this shared key for daemon-to-daemon authentication (file mode 0600). */
void itest_daemon_auth_key(struct itest_daemon *d, const char *key);
/* Listen on a fixed port (for restarts at the same address); 0 = ephemeral. */
void itest_daemon_port(struct itest_daemon *d, uint16_t port);
/* Start and wait until the socket accepts a client. */
void itest_daemon_start(struct itest_daemon *d);
/* SIGTERM; asserts exit status 0 and that the socket file is gone. */
void itest_daemon_stop(struct itest_daemon *d);
/* SIGKILL and reap. */
void itest_daemon_kill(struct itest_daemon *d);
/*
 * SIGSTOP / SIGCONT. Over a transport whose peer NIC answers without the
 * process (verbs), with RDMAX_TEST_FABRIC_STALL set: that command's "on" /
 * "off" silences the link between the test's daemons instead.
 */
void itest_daemon_pause(struct itest_daemon *d);
void itest_daemon_resume(struct itest_daemon *d);
/* itest_daemon_resume() without asserting, for a forked helper: 0 or -errno. */
int itest_daemon_resume_quiet(struct itest_daemon *d);
/* Kill when still running, remove its directory, free it. Accepts NULL. */
void itest_daemon_free(struct itest_daemon *d);
/* "; daemon 'a' died from signal 11 (...)" for each daemon of this test that died, or "". */
const char *itest_daemon_deaths(void);
/* Print the last lines of the daemon's log to stderr. */
void itest_daemon_print_log(const struct itest_daemon *d, int lines);
/* Open file descriptors of the running daemon (from /proc). */
int itest_daemon_fd_count(const struct itest_daemon *d);
/* Whether the daemon's address space maps a file whose name contains needle. */
bool itest_daemon_maps(const struct itest_daemon *d, const char *needle);
/*
 * Wait (up to ITEST_WAIT_MS, failing the case after) until the daemon's admin
 * "status" reports `field` (e.g. "jobs_in_flight", "clients") equal to want.
 */
void itest_wait_status(const struct itest_daemon *d, const char *field, uint64_t want);
/* The daemon's admin reply to cmd ("conns", ...) as text in reply; 0 or -1. */
int itest_admin_reply(const struct itest_daemon *d, const char *cmd, char *reply, size_t size);
/* A numeric field of the daemon's admin "stats" reply; UINT64_MAX when it cannot be read. */
uint64_t itest_stats_field(const struct itest_daemon *d, const char *field);
/* Wait (up to ITEST_WAIT_MS) until itest_daemon_maps(d, needle) is want. */
void itest_wait_maps(const struct itest_daemon *d, const char *needle, bool want);
/* A TCP port on addr that nobody listens on right now. */
uint16_t itest_free_port(const char *addr);

/*
 * Whether itest_daemon_pause() stalls transfers to the peer. True for TCP,
 * where the peer's process moves every byte; for verbs, where the peer's NIC
 * completes one-sided WRITE and READ without its process, only when
 * RDMAX_TEST_FABRIC_STALL names a command that stalls the link.
 */
bool itest_stopped_peer_stalls(void);
/*
 * Register a test only where it can mean something; otherwise print why it
 * does not run. A test left out this way is neither run nor counted as passed.
 */
#define ITEST_ADD_TEST_IF(tc, test, cond, why)                                                     \
	do {                                                                                       \
		if (cond) {                                                                        \
			tcase_add_test(tc, test);                                                  \
		} else {                                                                           \
			fprintf(stderr,                                                            \
				"itest: SKIP %s over transport '%s': %s (not run, not "            \
				"counted)\n",                                                      \
				#test, itest_transport(), why);                                    \
		}                                                                                  \
	} while (0)
#define ITEST_ADD_STALLING_TEST(tc, test)                                                          \
	ITEST_ADD_TEST_IF(tc, test, itest_stopped_peer_stalls(),                                   \
			  "it needs a stopped peer to stall transfers, which the NIC does not "    \
			  "(set RDMAX_TEST_FABRIC_STALL)")

/* ----------------------------------------------------------------- clients */

/* Connect to the daemon, retrying until ITEST_WAIT_MS passed. */
struct rdmax_client *itest_client(const struct itest_daemon *d, const char *name);
/* rdmax_region_alloc_host() that must succeed. */
struct rdmax_region *itest_alloc(struct rdmax_client *c, uint64_t length, uint32_t access);
/* rdmax_region_desc() that must succeed. */
struct rdmax_desc itest_desc(const struct rdmax_region *region);
/* The region's mapping as bytes (asserts it is mapped). */
uint8_t *itest_bytes(const struct rdmax_region *region);

/* A WRITE or READ job. */
struct rdmax_job itest_job(uint64_t id, enum rdmax_op op, struct rdmax_region *local,
			   uint64_t local_offset, const struct rdmax_desc *remote,
			   uint64_t remote_offset, uint64_t length);

/*
 * Submit one job and wait for its completion; the completion event is
 * returned. Any other event that arrives meanwhile fails the test.
 */
struct rdmax_event itest_run_job(struct rdmax_client *c, const struct rdmax_job *job,
				 int timeout_ms);

/*
 * A latency-class 4 KiB write from ca into a region of cb, which must
 * succeed: it opens the latency connection between their daemons, and only
 * while one is open do bulk copies (TCP) and bulk posts (verbs on a software
 * device) leave the loops. Both regions are freed again.
 */
void itest_open_latency_lane(struct rdmax_client *ca, struct rdmax_client *cb);

/*
 * The start of a two-node test: daemon "a" on itest_addr_a() and "b" on
 * itest_addr_b(), created without options and started in that order, then a
 * client named name_a of a and one named name_b of b. itest_pair_end() ends it.
 */
void itest_pair_start(struct itest_daemon **a, struct itest_daemon **b, struct rdmax_client **ca,
		      const char *name_a, struct rdmax_client **cb, const char *name_b);

/*
 * The end of a two-node test: both clients closed, then both daemons
 * stopped (itest_daemon_stop's checks) and freed, a before b.
 */
void itest_pair_end(struct rdmax_client *ca, struct rdmax_client *cb, struct itest_daemon *a,
		    struct itest_daemon *b);

/*
 * Submit one job that must fail with `err`, either refused by rdmax_submit()
 * itself or with exactly one completion carrying `err` and a message.
 * \return true when the daemon completed it, false when the library refused it
 */
#define itest_expect_job_error(c, job, err, timeout_ms)                                            \
	itest_expect_job_error_at(__FILE__, __LINE__, c, job, err, timeout_ms)
bool itest_expect_job_error_at(const char *file, int line, struct rdmax_client *c,
			       const struct rdmax_job *job, int err, int timeout_ms);

/*
 * Collect `count` completion events into out (any order) within timeout_ms;
 * IMM_REACHED events are counted into *imm_events when it is not NULL, other
 * events fail the test. Returns how many completions were collected.
 */
size_t itest_collect(struct rdmax_client *c, struct rdmax_event *out, size_t count, int timeout_ms,
		     size_t *imm_events);

/* Assert that no event arrives within ms. */
void itest_assert_quiet(struct rdmax_client *c, int ms);

/* ------------------------------------------------------------------- data */

/* Deterministic pseudo-random bytes from a seed (xorshift64*). */
void itest_fill(void *buf, size_t len, uint64_t seed);
/* A random permutation of 0..n-1 from a seed (Fisher-Yates over xorshift): block tables. */
void itest_permute(uint32_t *out, size_t n, uint64_t seed);
/* Seed for this test run (RDMAX_TEST_SEED or the clock); printed once. */
uint64_t itest_seed(void);
/*
 * Compare two buffers; on a mismatch, fail naming the first differing offset.
 */
#define itest_assert_mem_eq(a, b, len, what)                                                       \
	itest_mem_eq_at(__FILE__, __LINE__, (const uint8_t *)(a), (const uint8_t *)(b), (len),     \
			(what))
void itest_mem_eq_at(const char *file, int line, const uint8_t *a, const uint8_t *b, size_t len,
		     const char *what);

/* Fails naming both codes (rdmax_err_name()) when got != want. */
/* Evaluates got once: it is often a call whose second answer could differ. */
#define itest_assert_err(got, want)                                                                \
	do {                                                                                       \
		int itest_got_ = (int)(got), itest_want_ = (int)(want);                            \
		ck_assert_msg(itest_got_ == itest_want_, "%s: got %d (%s), expected %d (%s)",      \
			      #got, itest_got_, rdmax_err_name(itest_got_), itest_want_,           \
			      rdmax_err_name(itest_want_));                                        \
	} while (0)

/* ------------------------------------------------------------------ runner */

/* Run directory (created by the runner) under which every daemon gets its own. */
void itest_run_dir_init(void);
void itest_run_dir_fini(void);
/* Unchecked teardown: report and remove what failed tests left behind. */
void itest_report_leftovers(void);

/* Give every other uid a way to the daemon's socket (the test directories are 0700). */
void itest_open_socket_dirs(const struct itest_daemon *d);

/* First call in a forked child: die with the parent (whose pid the caller took before fork). */
void itest_child_setup(pid_t parent);

/* Test cases, one TCase each (see README.md). */
/* t_peer.c, shared with t_tls.c: what an attacker learns from a descriptor. */
struct itest_target {
	uint64_t instance;
	uint64_t region_id;
	uint64_t region_key;
	char addr[64];
	uint16_t port;
};
struct rdmax_desc;
struct itest_target itest_target_of(const struct rdmax_desc *desc);
/* The descriptor with its one endpoint replaced by addr:port; the instance id is kept. */
struct rdmax_desc itest_via(const struct rdmax_desc *real, const char *addr, uint16_t port);
/* A listening socket on addr, any port. */
int itest_listen_any(const char *addr, uint16_t *ret_port);
/* Child process body: a byte relay to addr:port, copying what it relays to capture (or -1). */
void itest_relay(int lfd, const char *addr, uint16_t port, int capture) __attribute__((noreturn));
/* Whether the daemon's log holds needle. */
bool itest_log_contains(const struct itest_daemon *d, const char *needle);

TCase *itest_tcase_transfer(void);
TCase *itest_tcase_concurrency(void);
TCase *itest_tcase_imm(void);
TCase *itest_tcase_errors(void);
TCase *itest_tcase_raw(void);
TCase *itest_tcase_client_kill(void);
TCase *itest_tcase_peer_kill(void);
TCase *itest_tcase_shutdown(void);
TCase *itest_tcase_same_node(void);
TCase *itest_tcase_dereg_wait(void);
TCase *itest_tcase_jobs(void);
TCase *itest_tcase_ring(void);
TCase *itest_tcase_paged_read(void);
TCase *itest_tcase_multipair(void);
TCase *itest_tcase_harden(void);
TCase *itest_tcase_peer(void);
TCase *itest_tcase_names(void);
TCase *itest_tcase_discovery(void);
TCase *itest_tcase_tls(void);
TCase *itest_tcase_qos(void);
TCase *itest_tcase_mailbox(void);
/* Verbs-only cases; NULL (not registered) on other transports. */
TCase *itest_tcase_verbs(void);
TCase *itest_tcase_verbs_isolation(void);

#endif
