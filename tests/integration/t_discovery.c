/* SPDX-License-Identifier: MIT */
/*
 * Node membership through a real etcd (Debian's etcd-server) started on
 * loopback by the test: temporary data directory, free ports, stopped at the
 * end. Three daemons find each other and move data by node name with no
 * descriptor passed out of band; a daemon that stops renewing its lease is
 * lost within the TTL and its job in flight fails at once with UNREACHABLE,
 * exactly once; restarted, it comes back with a new instance and the old
 * descriptors stay refused; etcd stopped (and its data lost) and started
 * again: the daemons keep serving and register again, one record each.
 * Registered only when RDMAX_TEST_ETCD names the etcd binary (make check-discovery).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define TTL_S 2

struct etcd {
	pid_t pid;
	uint16_t client_port;
	uint16_t peer_port;
	char dir[128];
	char url[64];
};

static void etcd_start(struct etcd *e)
{
	char client[64], peer[64], data[160], cluster[96], log_path[160];
	pid_t parent = getpid();

	snprintf(client, sizeof(client), "http://127.0.0.1:%u", e->client_port);
	snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", e->peer_port);
	snprintf(data, sizeof(data), "%s/data", e->dir);
	snprintf(cluster, sizeof(cluster), "itest=%s", peer);
	snprintf(log_path, sizeof(log_path), "%s/etcd.log", e->dir);
	snprintf(e->url, sizeof(e->url), "%s", client);
	e->pid = fork();
	ck_assert_msg(e->pid >= 0, "fork() failed: %s", strerror(errno));
	if (e->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent) {
			_exit(127);
		}
		FILE *log = freopen(log_path, "a", stderr);
		(void)log;
		dup2(2, 1);
		execl(getenv("RDMAX_TEST_ETCD"), "etcd", "--name", "itest", "--data-dir", data,
		      "--listen-client-urls", client, "--advertise-client-urls", client,
		      "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		      "--initial-cluster", cluster, (char *)NULL);
		_exit(127);
	}
	/* Ready when the gateway answers a request (bounded). */
	char cmd[256];
	snprintf(cmd, sizeof(cmd),
		 "ETCDCTL_API=3 etcdctl --endpoints %s --dial-timeout 1s endpoint health "
		 ">/dev/null 2>&1",
		 client);
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	while (system(cmd) != 0) {
		ck_assert_msg(itest_now_ms() < deadline, "etcd did not answer on %s (see %s)",
			      client, log_path);
		itest_sleep_ms(50);
	}
}

static void etcd_stop(struct etcd *e)
{
	int status;

	if (e->pid > 0) {
		kill(e->pid, SIGTERM);
		waitpid(e->pid, &status, 0);
		e->pid = 0;
	}
}

static struct etcd *etcd_new(void)
{
	static struct etcd e;
	char cmd[192];

	memset(&e, 0, sizeof(e));
	snprintf(e.dir, sizeof(e.dir), "/tmp/rdmax-itest-etcd-XXXXXX");
	ck_assert_msg(mkdtemp(e.dir), "mkdtemp() failed: %s", strerror(errno));
	e.client_port = itest_free_port("127.0.0.1");
	do {
		e.peer_port = itest_free_port("127.0.0.1");
	} while (e.peer_port == e.client_port);
	etcd_start(&e);
	(void)cmd;
	return &e;
}

static void etcd_free(struct etcd *e)
{
	char cmd[192];

	etcd_stop(e);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* Records under the test's prefix, as etcd itself counts them. */
static int etcd_records(const struct etcd *e, const char *prefix)
{
	char cmd[320], line[256];
	int n = 0;

	snprintf(cmd, sizeof(cmd),
		 "ETCDCTL_API=3 etcdctl --endpoints %s get --prefix --keys-only '%s' 2>/dev/null",
		 e->url, prefix);
	FILE *p = popen(cmd, "r");
	ck_assert_msg(p, "popen(etcdctl) failed");
	while (fgets(line, sizeof(line), p)) {
		n += strncmp(line, prefix, strlen(prefix)) == 0;
	}
	pclose(p);
	return n;
}

static struct itest_daemon *node(const char *name, const struct etcd *e, const char *prefix)
{
	struct itest_daemon *d = itest_daemon_new(name, "127.0.0.1");
	itest_daemon_port(d, itest_free_port("127.0.0.1"));
	itest_daemon_set(d, "discovery.backend=etcd");
	itest_daemon_set(d, "discovery.endpoints=%s", e->url);
	itest_daemon_set(d, "discovery.prefix=%s", prefix);
	itest_daemon_set(d, "discovery.ttl_s=%d", TTL_S);
	/* Transport timeouts far beyond the lease: a lost node is noticed through discovery. */
	itest_daemon_set(d, "peers.peer_timeout_ms=120000");
	itest_daemon_start(d);
	return d;
}

/* The node as c's daemon knows it: 1 alive, 0 lost, -1 unknown. */
static int node_state(struct rdmax_client *c, const char *name, uint64_t *ret_instance)
{
	static struct rdmax_node nodes[16];
	int n = rdmax_nodes(c, nodes, 16);

	ck_assert_msg(n >= 0, "rdmax_nodes: %s", rdmax_err_name(n));
	for (int i = 0; i < n && i < 16; i++) {
		if (strcmp(nodes[i].name, name) == 0) {
			if (ret_instance) {
				*ret_instance = nodes[i].instance_id;
			}
			return nodes[i].alive ? 1 : 0;
		}
	}
	return -1;
}

/* Wait (bounded) until c sees name in state want, with an instance other than not_instance. */
static uint64_t await_node(struct rdmax_client *c, const char *name, int want,
			   uint64_t not_instance, int timeout_ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms, inst = 0;

	for (;;) {
		int s = node_state(c, name, &inst);
		if (s == want && (want != 1 || inst != not_instance)) {
			return inst;
		}
		ck_assert_msg(itest_now_ms() < deadline, "node '%s' not %s within %d ms (state %d)",
			      name, want == 1 ? "alive" : "lost", timeout_ms, s);
		itest_sleep_ms(20);
	}
}

/* Run build/rdmaxctl against d's client socket; its exit status, stdout in out. */
static int rdmaxctl(const struct itest_daemon *d, const char *args, char *out, size_t size)
{
	char cmd[512];
	const char *build = getenv("RDMAX_BUILD") ? getenv("RDMAX_BUILD") : "build";

	snprintf(cmd, sizeof(cmd), "%s/rdmaxctl --client-socket '%s' %s 2>&1", build,
		 d->socket_path, args);
	FILE *p = popen(cmd, "r");
	ck_assert_msg(p, "popen(rdmaxctl) failed");
	size_t n = fread(out, 1, size - 1, p);
	out[n] = '\0';
	int status = pclose(p);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(discovery_three_nodes_lost_and_back)
{
	const uint64_t len = 4 * MiB;
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "/itest-%d/", (int)getpid());
	struct etcd *e = etcd_new();
	struct itest_daemon *a = node("alpha", e, prefix);
	struct itest_daemon *b = node("beta", e, prefix);
	struct itest_daemon *c = node("gamma", e, prefix);
	struct rdmax_client *ca = itest_client(a, "reader");
	struct rdmax_client *cb = itest_client(b, "owner.b");
	struct rdmax_client *cc = itest_client(c, "owner.c");
	struct rdmax_desc found, old_c;

	await_node(ca, "alpha", 1, 0, ITEST_WAIT_MS);
	await_node(ca, "beta", 1, 0, ITEST_WAIT_MS);
	uint64_t gamma1 = await_node(ca, "gamma", 1, 0, ITEST_WAIT_MS);
	ck_assert_int_eq(etcd_records(e, prefix), 3);

	/* By node name only: publish on b, look up from a, read, compare. */
	struct rdmax_region *rb = itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *la = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	itest_fill(itest_bytes(rb), len, itest_seed());
	ck_assert_int_eq(rdmax_region_publish(cb, rb, "weights/shard-0"), 0);
	ck_assert_int_eq(rdmax_lookup(ca, "beta", "weights/shard-0", 0, &found), 0);
	struct rdmax_job job = itest_job(1, RDMAX_OP_READ, la, 0, &found, 0, len);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(la), itest_bytes(rb), len, "read by node name");
	itest_assert_err(rdmax_lookup(ca, "beta", "weights/shard-1", 0, &found), RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_lookup(ca, "delta", "x", 0, &found), RDMAX_E_UNREACHABLE);
	itest_assert_err(rdmax_lookup(ca, "beta", "bad name", 0, &found), RDMAX_E_INVALID_ARGUMENT);

	/* gamma hangs (stops renewing), with a write to it in flight. */
	struct rdmax_region *rc = itest_alloc(cc, 64 * MiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *big = itest_alloc(ca, 64 * MiB, RDMAX_ACCESS_LOCAL);
	ck_assert_int_eq(rdmax_region_publish(cc, rc, "kv"), 0);
	ck_assert_int_eq(rdmax_lookup(ca, "gamma", "kv", 0, &old_c), 0);
	itest_daemon_pause(c);
	uint64_t t0 = itest_now_ms();
	job = itest_job(2, RDMAX_OP_WRITE, big, 0, &old_c, 0, 64 * MiB);
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	ck_assert_int_eq(rdmax_poll_events(ca, &ev, 1, (TTL_S + 5) * 1000), 1);
	uint64_t took = itest_now_ms() - t0;
	ck_assert_int_eq(ev.type, RDMAX_EVENT_COMPLETION);
	ck_assert_uint_eq(ev.job_id, 2);
	itest_assert_err(ev.status, RDMAX_E_UNREACHABLE);
	ck_assert_msg(strstr(ev.reason, "node 'gamma' was lost"), "message: '%s'", ev.reason);
	ck_assert_msg(took <= (TTL_S + 3) * 1000, "lost after %llu ms", (unsigned long long)took);
	itest_assert_quiet(ca, ITEST_QUIET_MS); /* exactly one completion */
	ck_assert_int_eq(node_state(ca, "gamma", NULL), 0);
	/* New work to the lost instance is refused at once. */
	job = itest_job(3, RDMAX_OP_WRITE, big, 0, &old_c, 0, 4096);
	itest_expect_job_error(ca, &job, RDMAX_E_UNREACHABLE, ITEST_WAIT_MS);
	itest_assert_err(rdmax_lookup(ca, "gamma", "kv", 0, &found), RDMAX_E_UNREACHABLE);

	/* gamma dies and comes back: a new instance, found again; the old desc stays refused. */
	itest_daemon_kill(c);
	rdmax_client_close(cc);
	itest_daemon_start(c);
	uint64_t gamma2 = await_node(ca, "gamma", 1, gamma1, ITEST_WAIT_MS);
	ck_assert_uint_ne(gamma2, gamma1);
	cc = itest_client(c, "owner.c2");
	itest_assert_err(rdmax_lookup(ca, "gamma", "kv", 0, &found), RDMAX_E_NOT_FOUND);
	rc = itest_alloc(cc, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	ck_assert_int_eq(rdmax_region_publish(cc, rc, "kv"), 0);
	ck_assert_int_eq(rdmax_lookup(ca, "gamma", "kv", 0, &found), 0);
	memset(itest_bytes(big), 0x7c, 4096);
	job = itest_job(4, RDMAX_OP_WRITE, big, 0, &found, 0, 4096);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(rc), itest_bytes(big), 4096, "write to the new gamma");
	job = itest_job(5, RDMAX_OP_WRITE, big, 0, &old_c, 0, 4096);
	itest_expect_job_error(ca, &job, RDMAX_E_UNREACHABLE, ITEST_WAIT_MS);
	ck_assert_int_eq(etcd_records(e, prefix), 3);

	/* A clean stop revokes the lease: the record goes at once. */
	rdmax_client_close(cb);
	itest_daemon_stop(b);
	await_node(ca, "beta", 0, 0, 1000);

	rdmax_client_close(ca);
	rdmax_client_close(cc);
	itest_daemon_stop(a);
	itest_daemon_stop(c);
	itest_daemon_free(a);
	itest_daemon_free(b);
	itest_daemon_free(c);
	etcd_free(e);
}
END_TEST

START_TEST(discovery_etcd_restart)
{
	char prefix[64], cmd[192];
	snprintf(prefix, sizeof(prefix), "/itest-%d/", (int)getpid());
	struct etcd *e = etcd_new();
	struct itest_daemon *a = node("alpha", e, prefix);
	struct itest_daemon *b = node("beta", e, prefix);
	struct rdmax_client *ca = itest_client(a, "reader");
	struct rdmax_client *cb = itest_client(b, "owner");
	struct rdmax_region *rb = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *la = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc found;

	await_node(ca, "beta", 1, 0, ITEST_WAIT_MS);
	ck_assert_int_eq(rdmax_region_publish(cb, rb, "x"), 0);

	/* rdmaxctl nodes and lookup, as an operator would use them. */
	char out[4096];
	ck_assert_int_eq(rdmaxctl(a, "--json nodes", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "\"node\":\"beta\"") && strstr(out, "\"alive\":true"),
		      "rdmaxctl nodes: %s", out);
	ck_assert_int_eq(rdmaxctl(a, "nodes", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "NODE") && strstr(out, "alpha") && strstr(out, "beta"),
		      "rdmaxctl nodes: %s", out);
	ck_assert_int_eq(rdmaxctl(a, "--json lookup beta x", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "\"ok\":true") && strstr(out, "\"desc_hex\":\""),
		      "rdmaxctl lookup: %s", out);
	ck_assert_int_eq(rdmaxctl(a, "lookup beta missing", out, sizeof(out)), 1);

	/* etcd goes away, with its data: the daemons keep serving with what they know. */
	etcd_stop(e);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s/data'", e->dir);
	ck_assert_int_eq(system(cmd), 0);
	itest_sleep_ms((TTL_S + 1) * 1000); /* past the lease: it must not matter */
	ck_assert_int_eq(node_state(ca, "beta", NULL), 1);
	itest_fill(itest_bytes(rb), 64 * KiB, itest_seed());
	ck_assert_int_eq(rdmax_lookup(ca, "beta", "x", 0, &found), 0);
	struct rdmax_job job = itest_job(1, RDMAX_OP_READ, la, 0, &found, 0, 64 * KiB);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(la), itest_bytes(rb), 64 * KiB, "read with etcd down");

	/* Back, empty: both register again, one record each. */
	etcd_start(e);
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	while (etcd_records(e, prefix) != 2) {
		ck_assert_msg(itest_now_ms() < deadline, "daemons did not register again");
		itest_sleep_ms(100);
	}
	itest_sleep_ms(TTL_S * 1000); /* renewals go on; no duplicate appears */
	ck_assert_int_eq(etcd_records(e, prefix), 2);
	ck_assert_int_eq(node_state(ca, "beta", NULL), 1);

	itest_pair_end(ca, cb, a, b);
	etcd_free(e);
}
END_TEST

TCase *itest_tcase_discovery(void)
{
	const char *etcd = getenv("RDMAX_TEST_ETCD");

	if (!etcd || !etcd[0] || access(etcd, X_OK) != 0) {
		fprintf(stderr, "itest: SKIP discovery: set RDMAX_TEST_ETCD to an etcd binary "
				"(make check-discovery; not run, not counted)\n");
		return NULL;
	}
	TCase *tc = tcase_create("discovery");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, discovery_three_nodes_lost_and_back);
	tcase_add_test(tc, discovery_etcd_restart);
	return tc;
}
