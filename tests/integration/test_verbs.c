/* SPDX-License-Identifier: MIT */
/*
 * Case "verbs": what only the verbs transport does, on a real verbs device
 * (Soft-RoCE in the test guest, or real NICs). Registered only when
 * RDMAX_TEST_TRANSPORT=verbs: itest_tcase_verbs() returns NULL otherwise.
 *  - descriptors carry one verbs endpoint per device, with an rkey;
 *  - the NIC itself refuses a write into a region registered without remote
 *    write (and a read without remote read), reported as REMOTE_ACCESS, and
 *    the connection that the refusal broke is replaced for the next job;
 *  - a daemon with another key is refused at connection set-up, before the
 *    accepting side allocates a QP, and the refusal is not retried;
 *  - case "verbs_isolation": with [verbs] isolation = per-uid, two uids' jobs
 *    to their own regions work, and a descriptor of one uid's region forged
 *    with the other uid's protection domain is refused by the NIC (or, with
 *    a guessed domain token, at connection set-up), bytes unchanged;
 *  - a loop spinning through jobs back to back polls its CQ and leaves it
 *    unarmed (no completion event per job).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdmax.pb-c.h"

#define ACCESS_RW (RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)

START_TEST(verbs_descriptor_endpoints)
{
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_start(b);
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *r = itest_alloc(cb, 64 * KiB, ACCESS_RW);
	struct rdmax_desc d = itest_desc(r);
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, d.len, d.bytes);
	ck_assert_ptr_nonnull(m);
	size_t verbs = 0;
	for (size_t i = 0; i < m->n_endpoints; i++) {
		const Rdmax__V1__Endpoint *e = m->endpoints[i];
		if (e->transport != RDMAX__V1__TRANSPORT__TRANSPORT_VERBS) {
			continue;
		}
		verbs++;
		ck_assert_str_eq(e->addr, itest_addr_b());
		ck_assert_msg(e->device && e->device[0], "verbs endpoint without a device");
		ck_assert(e->has_rkey && e->has_iova);
		ck_assert_uint_ne(e->port, 0);
	}
	ck_assert_msg(verbs >= 1, "descriptor has no verbs endpoint");
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	ck_assert_msg(itest_log_contains(b, "transport: verbs"), "daemon did not choose verbs");
	rdmax_client_close(cb);
	itest_daemon_stop(b);
	itest_daemon_free(b);
}
END_TEST

START_TEST(verbs_nic_refuses_access)
{
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	itest_pair_start(&a, &b, &ca, "initiator", &cb, "target");
	struct rdmax_region *src = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *ro = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *wo = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *rw = itest_alloc(cb, 64 * KiB, ACCESS_RW);
	struct rdmax_desc dro = itest_desc(ro), dwo = itest_desc(wo), drw = itest_desc(rw);
	struct rdmax_job job;

	itest_fill(itest_bytes(src), 64 * KiB, 5);
	memset(itest_bytes(ro), 0x5a, 64 * KiB);

	/* Warm: the connection is up, so the refusals below come from the NIC. */
	job = itest_job(1, RDMAX_OP_WRITE, src, 0, &drw, 0, 64 * KiB);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "warm-up write failed: %s", ev.reason);

	/* The descriptor claims nothing it lacks: the library and the engine let it pass. */
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &dro, 0, 4096);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_REMOTE_ACCESS);
	ck_assert_msg(strstr(ev.reason, "RDMA WRITE"), "message: %s", ev.reason);
	for (size_t i = 0; i < 64 * KiB; i++) {
		ck_assert_msg(itest_bytes(ro)[i] == 0x5a, "refused write changed byte %zu", i);
	}
	/* The broken connection is replaced: the next job works. */
	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &drw, 0, 64 * KiB);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "write after a refusal failed: %s", ev.reason);
	itest_assert_mem_eq(itest_bytes(rw), itest_bytes(src), 64 * KiB, "write after refusal");

	job = itest_job(4, RDMAX_OP_READ, src, 0, &dwo, 0, 4096);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_REMOTE_ACCESS);
	ck_assert_msg(strstr(ev.reason, "RDMA READ"), "message: %s", ev.reason);
	job = itest_job(5, RDMAX_OP_READ, src, 0, &drw, 0, 64 * KiB);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "read after a refusal failed: %s", ev.reason);

	itest_assert_quiet(ca, 100);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

START_TEST(verbs_wrong_key_refused_at_connect)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_auth_key(a, "verbs-test-key-one-0123456789\n");
	itest_daemon_auth_key(b, "verbs-test-key-two-9876543210\n");
	itest_daemon_set(a, "peers.connect_retries=5");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, 4096, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);

	memset(itest_bytes(dst), 0, 4096);
	itest_fill(itest_bytes(src), 4096, 9);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	uint64_t t0 = itest_now_ms();
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	uint64_t took = itest_now_ms() - t0;
	itest_assert_err(ev.status, RDMAX_E_PERMISSION_DENIED);
	ck_assert_msg(strstr(ev.reason, "authentication"), "message: %s", ev.reason);
	/* Five retries with backoff would take seconds: an application reject is final. */
	ck_assert_msg(took < 3000, "refusal took %" PRIu64 " ms", took);
	for (int i = 0; i < 4096; i++) {
		ck_assert_msg(itest_bytes(dst)[i] == 0, "a refused peer changed byte %d", i);
	}
	/* The accepting side refused the request itself, before any QP existed. */
	ck_assert_msg(itest_log_contains(b, "refused connection from"), "no refusal in b's log");
	ck_assert_msg(!itest_log_contains(b, "accepting QP"),
		      "b allocated a QP for a refused peer");

	itest_pair_end(ca, cb, a, b);
}
END_TEST

/*
 * Deadline, cancel and progress over verbs. A stopped peer does not stall a
 * NIC, so the jobs are simply large: 64 MiB takes over 5 ms even at 100 Gb/s
 * and about half a second on Soft-RoCE, far beyond a 1 ms deadline.
 */
START_TEST(verbs_deadline_cancel_progress)
{
	const uint64_t big = 64 * MiB;
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	itest_pair_start(&a, &b, &ca, "initiator", &cb, "target");
	struct rdmax_region *src = itest_alloc(ca, big, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, big, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_event ev;

	itest_fill(itest_bytes(src), big, 11);
	/* Warm: the connection is up before the timed jobs. */
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "warm-up write failed: %s", ev.reason);

	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &desc, 0, big);
	job.deadline_ms = 1;
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_TIMEOUT);
	ck_assert_msg(strstr(ev.reason, "deadline"), "message: %s", ev.reason);

	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &desc, 0, big);
	ck_assert_int_eq(rdmax_submit(ca, &job, 1), 0);
	uint64_t done = UINT64_MAX, total = 0;
	ck_assert_int_eq(rdmax_job_status(ca, 3, &done, &total), 0);
	ck_assert_uint_eq(total, big);
	ck_assert_uint_lt(done, big);
	ck_assert_int_eq(rdmax_cancel(ca, 3), 0);
	ck_assert_int_eq(rdmax_wait_job(ca, 3, ITEST_WAIT_MS), RDMAX_E_CANCELLED);
	ck_assert_int_eq(rdmax_cancel(ca, 3), RDMAX_E_NOT_FOUND);

	/* Chunks already handed to the NIC finish quietly: no second completion. */
	itest_assert_quiet(ca, 1500);
	job = itest_job(4, RDMAX_OP_WRITE, src, 0, &desc, 0, 1 * MiB);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "write after deadline and cancel failed: %s", ev.reason);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 1 * MiB, "write after cancel");

	itest_pair_end(ca, cb, a, b);
}
END_TEST

/*
 * While the daemon's loop spins (jobs back to back), it polls its CQs and
 * leaves them unarmed: no completion event per job, which would cost the
 * loop a read and a re-arm per turn (and the NIC an interrupt). Armed
 * between two jobs, as before, about one job in four raised an event.
 */
START_TEST(verbs_spin_leaves_cq_unarmed)
{
	enum { JOBS = 400, LEN = 64 };
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	/*
	 * A window far above one write's time under emulation: a job slower than
	 * busy_poll_us may arm the CQ by design, and on a loaded host a 1 ms window
	 * let a few dozen do so. What is tested is the spin, not the window.
	 */
	a = itest_daemon_new("a", itest_addr_a());
	b = itest_daemon_new("b", itest_addr_b());
	itest_daemon_set(a, "engine.busy_poll_us=50000");
	itest_daemon_start(a);
	itest_daemon_start(b);
	ca = itest_client(a, "initiator");
	cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, (size_t)JOBS * LEN, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);

	itest_fill(itest_bytes(src), 4096, 5);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, LEN);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "warm-up write failed: %s", ev.reason);

	uint64_t events = itest_stats_field(a, "verbs_cq_events_total");
	for (uint64_t i = 0; i < JOBS; i++) {
		job = itest_job(2 + i, RDMAX_OP_WRITE, src, i % 64, &desc, i * LEN, LEN);
		ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
		ck_assert_msg(ev.status == 0, "write %" PRIu64 " failed: %s", i, ev.reason);
	}
	events = itest_stats_field(a, "verbs_cq_events_total") - events;
	for (uint64_t i = 0; i < JOBS; i++) {
		itest_assert_mem_eq(itest_bytes(dst) + i * LEN, itest_bytes(src) + i % 64, LEN,
				    "write back to back");
	}
	/* A job slower than the spin's window (50 ms here) may still raise one. */
	ck_assert_msg(events < JOBS / 20,
		      "%" PRIu64 " completion events for %d writes back to back: the spinning "
		      "loop armed its CQ",
		      events, JOBS);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* ------------------------------------------------------------------ rails */

/*
 * Two devices per node (RDMAX_TEST_RAIL_* from tests/run-verbs-suite under
 * `run-in-guest --two-rails`): daemons listen on every address of their two
 * devices, descriptors carry both, and the engine stripes chunks over the
 * two device pairs, keeps pinned clients on their devices, and re-issues
 * the chunks of a device that goes down on the other one.
 */
static const char *rail_env(const char *name)
{
	const char *v = getenv(name);

	return v && v[0] ? v : NULL;
}

static bool rails_available(void)
{
	return rail_env("RDMAX_TEST_RAIL_DEVS_A") && rail_env("RDMAX_TEST_RAIL_DEVS_B") &&
	       rail_env("RDMAX_TEST_RAIL_NETDEV0") && rail_env("RDMAX_TEST_RAIL_NETDEV1") &&
	       rail_env("RDMAX_TEST_RAIL_DEV1") && rail_env("RDMAX_TEST_RAIL_LINK");
}

/* Bytes the interface sent so far (both daemons share one network namespace). */
static uint64_t tx_bytes(const char *netdev)
{
	char path[128], buf[32] = "";
	snprintf(path, sizeof(path), "/sys/class/net/%s/statistics/tx_bytes", netdev);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_msg(fd >= 0, "cannot open %s", path);
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	ck_assert_msg(n > 0, "cannot read %s", path);
	return strtoull(buf, NULL, 10);
}

/*
 * Take the second device pair down or up with RDMAX_TEST_RAIL_LINK ("down" or
 * "up" appended): under the guest, tests/vm/rail-link, which also restores
 * the routes the kernel drops with the link.
 */
static void set_link(const char *state)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "%s %s", rail_env("RDMAX_TEST_RAIL_LINK"), state);
	ck_assert_msg(system(cmd) == 0, "'%s' failed", cmd);
}

/* Wait until the device's port 1 is ACTIVE again (after its link came back). */
static void wait_port_active(const char *dev)
{
	char path[128], buf[64];
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/state", dev);
	for (int i = 0; i < 100; i++) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
		if (fd >= 0) {
			close(fd);
		}
		if (n > 0) {
			buf[n] = '\0';
			if (strstr(buf, "ACTIVE")) {
				return;
			}
		}
		itest_sleep_ms(100);
	}
	ck_abort_msg("port 1 of '%s' did not come back ACTIVE", dev);
}

static struct itest_daemon *rail_daemon(const char *name, const char *devices,
					const char *advertise, const char *pin)
{
	struct itest_daemon *d = itest_daemon_new(name, "0.0.0.0");
	itest_daemon_set(d, "verbs.devices=%s", devices);
	itest_daemon_set(d, "transport.advertise=%s", advertise);
	if (pin) {
		itest_daemon_set(d, "verbs.pin=%s", pin);
	}
	itest_daemon_start(d);
	return d;
}

/*
 * Submit `count` writes of `size` bytes at distinct offsets; all complete OK,
 * once each. With take_down, the second pair goes down after the first
 * completion. \return how long after it the link was down, in ms (0 without)
 */
static uint64_t rail_writes(struct rdmax_client *c, struct rdmax_region *src,
			    const struct rdmax_desc *desc, uint64_t first_id, size_t count,
			    uint64_t size, bool take_down)
{
	struct rdmax_event *ev = calloc(count, sizeof(*ev));
	bool *seen = calloc(count, sizeof(*seen));
	ck_assert(ev && seen);
	for (size_t i = 0; i < count; i++) {
		struct rdmax_job job = itest_job(first_id + i, RDMAX_OP_WRITE, src, i * size, desc,
						 i * size, size);
		ck_assert_int_eq(rdmax_submit(c, &job, 1), 0);
	}
	size_t got = 0;
	uint64_t down_ms = 0;
	if (take_down) {
		/* A device goes down while most of the writes are still in flight. */
		got = itest_collect(c, ev, 1, ITEST_WAIT_MS, NULL);
		uint64_t first = itest_now_ms();
		set_link("down");
		down_ms = itest_now_ms() - first;
	}
	got += itest_collect(c, ev + got, count - got, 60000, NULL);
	ck_assert_msg(got == count,
		      "%zu of %zu writes completed (the link went down %" PRIu64
		      " ms after the first completion)",
		      got, count, down_ms);
	for (size_t i = 0; i < count; i++) {
		ck_assert_msg(ev[i].status == 0, "job %" PRIu64 " failed: %s (%s)", ev[i].job_id,
			      rdmax_err_name(ev[i].status), ev[i].reason);
		ck_assert(ev[i].job_id >= first_id && ev[i].job_id < first_id + count);
		ck_assert_msg(!seen[ev[i].job_id - first_id], "job %" PRIu64 " completed twice",
			      ev[i].job_id);
		seen[ev[i].job_id - first_id] = true;
	}
	itest_assert_quiet(c, 300);
	free(ev);
	free(seen);
	return down_ms;
}

START_TEST(verbs_rails_stripe_pin_failover)
{
	const uint64_t size = 1 * MiB; /* one chunk per job: jobs spread over the rails */
	const size_t count = 64;
	const char *net0 = rail_env("RDMAX_TEST_RAIL_NETDEV0"); /* a's device on rail 0 */
	const char *net1 = rail_env("RDMAX_TEST_RAIL_NETDEV1"); /* a's device on rail 1 */
	const char *dev1 = rail_env("RDMAX_TEST_RAIL_DEV1");
	char pin[128];

	/* A failed run may have left the second pair down or slowed: undo that first. */
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "tc qdisc del dev %s root 2>/dev/null", net1);
	(void)!system(cmd);
	set_link("up");
	wait_port_active(dev1);
	snprintf(pin, sizeof(pin), "pinned=%s nowhere=no_such_device", dev1);
	struct itest_daemon *a =
		rail_daemon("a", rail_env("RDMAX_TEST_RAIL_DEVS_A"), itest_addr_a(), pin);
	struct itest_daemon *b =
		rail_daemon("b", rail_env("RDMAX_TEST_RAIL_DEVS_B"), itest_addr_b(), NULL);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, count * size, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, count * size, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);

	/* The descriptor names both of b's devices. */
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, desc.len, desc.bytes);
	ck_assert_ptr_nonnull(m);
	size_t verbs = 0;
	for (size_t i = 0; i < m->n_endpoints; i++) {
		verbs += m->endpoints[i]->transport == RDMAX__V1__TRANSPORT__TRANSPORT_VERBS;
	}
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	ck_assert_uint_eq(verbs, 2);

	/* 1. Striped: both device pairs carry a real share of the bytes. */
	itest_fill(itest_bytes(src), count * size, itest_seed() + 41);
	uint64_t tx0 = tx_bytes(net0), tx1 = tx_bytes(net1);
	rail_writes(ca, src, &desc, 1, count, size, false);
	uint64_t d0 = tx_bytes(net0) - tx0, d1 = tx_bytes(net1) - tx1;
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), count * size, "striped writes");
	ck_assert_msg(d0 >= count * size / 4 && d1 >= count * size / 4,
		      "not striped: %s sent %" PRIu64 " bytes, %s %" PRIu64 " of %" PRIu64, net0,
		      d0, net1, d1, (uint64_t)(count * size));

	/* A scatter's destinations on that node stripe too. */
	struct rdmax_scatter_dest sd[8];
	for (size_t i = 0; i < 8; i++) {
		sd[i] = (struct rdmax_scatter_dest){.remote = &desc,
						    .local_offset = i * size,
						    .remote_offset = (63 - i) * size,
						    .length = size};
	}
	itest_fill(itest_bytes(src), 8 * size, itest_seed() + 44);
	struct rdmax_job sj = itest_job(900, RDMAX_OP_SCATTER, src, 0, NULL, 0, 0);
	sj.u.scatter.dests = sd;
	sj.u.scatter.count = 8;
	tx0 = tx_bytes(net0);
	tx1 = tx_bytes(net1);
	struct rdmax_event sev = itest_run_job(ca, &sj, ITEST_WAIT_MS);
	ck_assert_msg(sev.status == 0, "scatter failed: %s", sev.reason);
	d0 = tx_bytes(net0) - tx0;
	d1 = tx_bytes(net1) - tx1;
	for (size_t i = 0; i < 8; i++) {
		itest_assert_mem_eq(itest_bytes(dst) + (63 - i) * size, itest_bytes(src) + i * size,
				    size, "scatter destination");
	}
	ck_assert_msg(d0 >= 2 * size && d1 >= 2 * size,
		      "scatter not striped: %s sent %" PRIu64 ", %s %" PRIu64, net0, d0, net1, d1);

	/* 2. Pinned: a client named 'pinned' uses only its device. */
	struct rdmax_client *cp = itest_client(a, "pinned");
	struct rdmax_region *psrc = itest_alloc(cp, 16 * size, RDMAX_ACCESS_LOCAL);
	itest_fill(itest_bytes(psrc), 16 * size, itest_seed() + 42);
	tx0 = tx_bytes(net0);
	tx1 = tx_bytes(net1);
	rail_writes(cp, psrc, &desc, 1, 16, size, false);
	d0 = tx_bytes(net0) - tx0;
	d1 = tx_bytes(net1) - tx1;
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(psrc), 16 * size, "pinned writes");
	ck_assert_msg(d1 >= 16 * size && d0 < size / 4,
		      "pinned client not kept on %s: %s sent %" PRIu64 ", %s %" PRIu64, dev1, net0,
		      d0, net1, d1);
	rdmax_client_close(cp);
	/* A client pinned to devices that do not reach the peer is told so. */
	struct rdmax_client *cn = itest_client(a, "nowhere");
	struct rdmax_region *nsrc = itest_alloc(cn, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, nsrc, 0, &desc, 0, 4096);
	struct rdmax_event ev = itest_run_job(cn, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_UNREACHABLE);
	ck_assert_msg(strstr(ev.reason, "pinned"), "message: %s", ev.reason);
	rdmax_client_close(cn);

	/*
	 * 3. Rail 1 goes down mid-transfer: every job completes once, bytes
	 * intact. Its link is slowed first, so that chunks are surely in flight
	 * on it: at 50 Mbit/s its half of the bytes takes over 5 s. At 200
	 * Mbit/s (1.3 s) it once had landed before the link went down, taking
	 * the link down being a fork and exec in a guest busy with the
	 * transfer. A QP holds at most 64 packets in the queue this builds:
	 * under 0.1 s, far from the ack timeout.
	 */
	snprintf(cmd, sizeof(cmd), "tc qdisc add dev %s root netem rate 50mbit", net1);
	ck_assert_msg(system(cmd) == 0, "'%s' failed", cmd);
	itest_fill(itest_bytes(src), count * size, itest_seed() + 43);
	uint64_t down_ms = rail_writes(ca, src, &desc, 1000, count, size, true);
	snprintf(cmd, sizeof(cmd), "tc qdisc del dev %s root", net1);
	ck_assert_msg(system(cmd) == 0, "'%s' failed", cmd);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), count * size,
			    "writes across a failed device");
	ck_assert_msg(itest_log_contains(a, "re-issued"),
		      "a did not log a re-issued chunk (the link went down %" PRIu64
		      " ms after the first completion: after the pair's share had landed?)",
		      down_ms);
	/* Still working on the remaining pair. */
	job = itest_job(5000, RDMAX_OP_READ, src, 0, &desc, 0, 4 * size);
	memset(itest_bytes(src), 0, 4 * size);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "read after the failure: %s", ev.reason);
	itest_assert_mem_eq(itest_bytes(src), itest_bytes(dst), 4 * size, "read after failure");

	set_link("up");
	wait_port_active(dev1);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* ------------------------------------------------------- per-uid isolation */

#define TENANT_UID 65534
#define ISO_BYTES  (64 * KiB)

/* What the tenant child reports to the test. */
struct tenant_report {
	int step;      /* 0: every step ran; else the step that could not */
	int own_write; /* status of its write to its own region on b */
	int own_read;  /* status of its read back */
	bool own_bytes_ok;
	uint32_t own_domain; /* the domain its descriptor names */
	int forged_write;    /* the victim's region, the tenant's domain and token */
	char forged_reason[RDMAX_MESSAGE_MAX];
	int guessed_write; /* the victim's domain number, the tenant's token */
	char guessed_reason[RDMAX_MESSAGE_MAX];
};

/* One job, waited for without the harness's asserts (they cannot fail a child). */
static int tenant_job(struct rdmax_client *c, const struct rdmax_job *job, char *reason)
{
	struct rdmax_event ev;
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	int ret = rdmax_submit(c, job, 1);

	if (ret < 0) {
		return ret;
	}
	while (itest_now_ms() < deadline) {
		ret = rdmax_poll_events(c, &ev, 1, (int)(deadline - itest_now_ms()));
		if (ret < 0) {
			return ret;
		}
		if (ret == 1 && ev.type == RDMAX_EVENT_COMPLETION && ev.job_id == job->id) {
			if (reason) {
				snprintf(reason, RDMAX_MESSAGE_MAX, "%s", ev.reason);
			}
			return ev.status;
		}
	}
	return RDMAX_E_TIMEOUT;
}

/*
 * The victim's descriptor with every verbs endpoint's domain and token (or
 * only the token, keep_number) taken from the tenant's own descriptor.
 */
static int forge_domain(const struct rdmax_desc *victim, const struct rdmax_desc *own,
			bool keep_number, struct rdmax_desc *ret_desc, uint32_t *ret_own_domain)
{
	Rdmax__V1__RegionDesc *v = rdmax__v1__region_desc__unpack(NULL, victim->len, victim->bytes);
	Rdmax__V1__RegionDesc *o = rdmax__v1__region_desc__unpack(NULL, own->len, own->bytes);
	uint8_t buf[RDMAX_DESC_MAX];
	int ret = -1;

	if (!v || !o) {
		goto out;
	}
	for (size_t i = 0; i < v->n_endpoints && i < o->n_endpoints; i++) {
		Rdmax__V1__Endpoint *e = v->endpoints[i];
		const Rdmax__V1__Endpoint *mine = o->endpoints[i];
		if (e->transport != RDMAX__V1__TRANSPORT__TRANSPORT_VERBS || !mine->has_domain) {
			continue;
		}
		*ret_own_domain = mine->domain;
		if (!keep_number) {
			e->has_domain = 1;
			e->domain = mine->domain;
		}
		e->has_domain_token = 1;
		e->domain_token = mine->domain_token;
	}
	size_t len = rdmax__v1__region_desc__get_packed_size(v);
	if (len <= sizeof(buf)) {
		rdmax__v1__region_desc__pack(v, buf);
		ret = rdmax_desc_import(buf, len, ret_desc);
	}
out:
	rdmax__v1__region_desc__free_unpacked(v, NULL);
	rdmax__v1__region_desc__free_unpacked(o, NULL);
	return ret;
}

/*
 * The tenant, a child of another uid with a client on each daemon: a write
 * and a read between its own regions, then the two forgeries against the
 * victim's descriptor (read from `in`). The report goes to `out`.
 */
static int tenant(const char *sock_a, const char *sock_b, int in, int out)
{
	struct tenant_report rep = {.step = 1};
	struct rdmax_client *ca, *cb;
	struct rdmax_region *src, *back, *own;
	struct rdmax_desc d_own, d_victim, forged;
	struct rdmax_job job;

	if (setgid(TENANT_UID) < 0 || setuid(TENANT_UID) < 0) {
		goto out;
	}
	rep.step = 2;
	if (rdmax_client_open(sock_a, "tenant-a", &ca) < 0 ||
	    rdmax_client_open(sock_b, "tenant-b", &cb) < 0) {
		goto out;
	}
	rep.step = 3;
	if (rdmax_region_alloc_host(ca, ISO_BYTES, RDMAX_ACCESS_LOCAL, &src) < 0 ||
	    rdmax_region_alloc_host(ca, ISO_BYTES, RDMAX_ACCESS_LOCAL, &back) < 0 ||
	    rdmax_region_alloc_host(cb, ISO_BYTES, ACCESS_RW, &own) < 0 ||
	    rdmax_region_desc(own, &d_own) < 0) {
		goto out;
	}
	itest_fill(rdmax_region_addr(src), ISO_BYTES, 21);
	job = itest_job(1, RDMAX_OP_WRITE, src, 0, &d_own, 0, ISO_BYTES);
	rep.own_write = tenant_job(ca, &job, NULL);
	job = itest_job(2, RDMAX_OP_READ, back, 0, &d_own, 0, ISO_BYTES);
	rep.own_read = tenant_job(ca, &job, NULL);
	rep.own_bytes_ok = memcmp(rdmax_region_addr(own), rdmax_region_addr(src), ISO_BYTES) == 0 &&
			   memcmp(rdmax_region_addr(back), rdmax_region_addr(src), ISO_BYTES) == 0;
	rep.step = 4;
	if (read(in, &d_victim, sizeof(d_victim)) != (ssize_t)sizeof(d_victim)) {
		goto out;
	}
	rep.step = 5;
	if (forge_domain(&d_victim, &d_own, false, &forged, &rep.own_domain) < 0) {
		goto out;
	}
	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &forged, 0, 4096);
	rep.forged_write = tenant_job(ca, &job, rep.forged_reason);
	rep.step = 6;
	if (forge_domain(&d_victim, &d_own, true, &forged, &rep.own_domain) < 0) {
		goto out;
	}
	job = itest_job(4, RDMAX_OP_WRITE, src, 0, &forged, 0, 4096);
	rep.guessed_write = tenant_job(ca, &job, rep.guessed_reason);
	rep.step = 0;
out:
	return write(out, &rep, sizeof(rep)) == (ssize_t)sizeof(rep) ? 0 : 1;
}

/* The protection domain the first verbs endpoint of a descriptor names. */
static uint32_t desc_domain(const struct rdmax_desc *d)
{
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, d->len, d->bytes);
	uint32_t domain = 0;

	ck_assert_ptr_nonnull(m);
	for (size_t i = 0; i < m->n_endpoints && !domain; i++) {
		if (m->endpoints[i]->transport == RDMAX__V1__TRANSPORT__TRANSPORT_VERBS) {
			ck_assert_msg(m->endpoints[i]->has_domain_token ||
					      !m->endpoints[i]->has_domain,
				      "a domain without its token");
			domain = m->endpoints[i]->has_domain ? m->endpoints[i]->domain : 0;
		}
	}
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	return domain;
}

START_TEST(verbs_per_uid_isolation)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_set(a, "verbs.isolation=per-uid");
	itest_daemon_set(b, "verbs.isolation=per-uid");
	itest_daemon_set(a, "peers.connect_retries=5");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "victim-a");
	struct rdmax_client *cb = itest_client(b, "victim-b");
	struct rdmax_region *src = itest_alloc(ca, ISO_BYTES, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *back = itest_alloc(ca, ISO_BYTES, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *victim = itest_alloc(cb, ISO_BYTES, ACCESS_RW);
	struct rdmax_desc dv = itest_desc(victim);
	struct rdmax_event ev;

	/* The victim's uid: its own jobs over its domain's QPs, bytes compared. */
	uint32_t victim_domain = desc_domain(&dv);
	ck_assert_msg(victim_domain != 0, "per-uid: the descriptor names no protection domain");
	itest_fill(itest_bytes(src), ISO_BYTES, 20);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &dv, 0, ISO_BYTES);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "the victim's own write failed: %s", ev.reason);
	itest_assert_mem_eq(itest_bytes(victim), itest_bytes(src), ISO_BYTES, "victim's write");
	job = itest_job(2, RDMAX_OP_READ, back, 0, &dv, 0, ISO_BYTES);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "the victim's own read failed: %s", ev.reason);
	itest_assert_mem_eq(itest_bytes(back), itest_bytes(src), ISO_BYTES, "victim's read");

	if (geteuid() != 0) {
		fprintf(stderr, "itest verbs: not root, so no second uid: the tenant part of "
				"verbs_per_uid_isolation did not run\n");
		goto out;
	}
	int to_child[2], from_child[2];
	itest_open_socket_dirs(a);
	itest_open_socket_dirs(b);
	ck_assert_int_eq(pipe2(to_child, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(from_child, O_CLOEXEC), 0);
	pid_t parent = getpid(), child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		itest_child_setup(parent);
		_exit(tenant(a->socket_path, b->socket_path, to_child[0], from_child[1]));
	}
	ck_assert_int_eq(write(to_child[1], &dv, sizeof(dv)), (ssize_t)sizeof(dv));
	struct tenant_report rep;
	struct pollfd pfd = {.fd = from_child[0], .events = POLLIN};
	ck_assert_msg(poll(&pfd, 1, 4 * ITEST_WAIT_MS) == 1, "the tenant did not report");
	ck_assert_int_eq(read(from_child[0], &rep, sizeof(rep)), (ssize_t)sizeof(rep));
	int wstatus;
	ck_assert_int_eq(waitpid(child, &wstatus, 0), child);
	close(to_child[0]);
	close(to_child[1]);
	close(from_child[0]);
	close(from_child[1]);
	ck_assert_msg(rep.step == 0, "the tenant stopped at step %d", rep.step);

	/* The tenant's own jobs work, in a domain of its own. */
	itest_assert_err(rep.own_write, 0);
	itest_assert_err(rep.own_read, 0);
	ck_assert_msg(rep.own_bytes_ok, "the tenant's own bytes differ");
	ck_assert_msg(rep.own_domain != 0 && rep.own_domain != victim_domain,
		      "tenant domain %u, victim domain %u", rep.own_domain, victim_domain);
	/* The victim's rkey and address over the tenant's domain: the NIC refuses. */
	itest_assert_err(rep.forged_write, RDMAX_E_REMOTE_ACCESS);
	ck_assert_msg(strstr(rep.forged_reason, "protection domain"), "message: %s",
		      rep.forged_reason);
	fprintf(stderr, "itest verbs: forged domain: %s\n", rep.forged_reason);
	/* The victim's domain with a token the tenant does not have: refused at connect. */
	itest_assert_err(rep.guessed_write, RDMAX_E_PERMISSION_DENIED);
	ck_assert_msg(strstr(rep.guessed_reason, "protection domain"), "message: %s",
		      rep.guessed_reason);
	fprintf(stderr, "itest verbs: guessed token: %s\n", rep.guessed_reason);
	ck_assert_msg(itest_log_contains(b, "protection domain not proven"),
		      "no refusal of the guessed token in b's log");
	/* Neither forgery changed a byte of the victim's region. */
	itest_assert_mem_eq(itest_bytes(victim), itest_bytes(src), ISO_BYTES,
			    "victim's region after the forgeries");
	/* And the victim's jobs still work. */
	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &dv, 0, ISO_BYTES);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "the victim's write after the forgeries failed: %s",
		      ev.reason);
out:
	itest_assert_quiet(ca, 100);
	itest_pair_end(ca, cb, a, b);
}
END_TEST

TCase *itest_tcase_verbs(void)
{
	if (strcmp(itest_transport(), "verbs") != 0) {
		return NULL;
	}
	TCase *tc = tcase_create("verbs");

	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, verbs_descriptor_endpoints);
	tcase_add_test(tc, verbs_nic_refuses_access);
	tcase_add_test(tc, verbs_wrong_key_refused_at_connect);
	tcase_add_test(tc, verbs_deadline_cancel_progress);
	ITEST_ADD_TEST_IF(tc, verbs_spin_leaves_cq_unarmed, !itest_verbs_post_thread_forced(),
			  "it counts the loop's own posts; with RDMAXD_TEST_VERBS_POST_THREAD=1 "
			  "every post list takes the posting thread's hand-off");
	ITEST_ADD_TEST_IF(tc, verbs_rails_stripe_pin_failover, rails_available(),
			  "it needs two devices per node (RDMAX_TEST_RAIL_*, set by "
			  "tests/run-verbs-suite under run-in-guest --two-rails)");
	return tc;
}

TCase *itest_tcase_verbs_isolation(void)
{
	if (strcmp(itest_transport(), "verbs") != 0) {
		return NULL;
	}
	TCase *tc = tcase_create("verbs_isolation");

	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, verbs_per_uid_isolation);
	return tc;
}
