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
 *    accepting side allocates a QP, and the refusal is not retried.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "rdmax.pb-c.h"

#define ACCESS_RW (RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)

static bool log_contains(const struct itest_daemon *d, const char *needle)
{
	char buf[65536];
	int fd = open(d->log_path, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	bool found = false;

	if (fd < 0) {
		return false;
	}
	/* Logs of these cases are small; a needle split across reads is not expected. */
	while ((n = read(fd, buf, sizeof(buf) - 1)) > 0) {
		buf[n] = '\0';
		if (strstr(buf, needle)) {
			found = true;
			break;
		}
	}
	close(fd);
	return found;
}

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
	ck_assert_msg(log_contains(b, "transport: verbs"), "daemon did not choose verbs");
	rdmax_client_close(cb);
	itest_daemon_stop(b);
	itest_daemon_free(b);
}
END_TEST

START_TEST(verbs_nic_refuses_access)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *cb = itest_client(b, "target");
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
	ck_assert_msg(ev.status == 0, "warm-up write failed: %s", ev.message);

	/* The descriptor claims nothing it lacks: the library and the engine let it pass. */
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &dro, 0, 4096);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_REMOTE_ACCESS);
	ck_assert_msg(strstr(ev.message, "RDMA WRITE"), "message: %s", ev.message);
	for (size_t i = 0; i < 64 * KiB; i++) {
		ck_assert_msg(itest_bytes(ro)[i] == 0x5a, "refused write changed byte %zu", i);
	}
	/* The broken connection is replaced: the next job works. */
	job = itest_job(3, RDMAX_OP_WRITE, src, 0, &drw, 0, 64 * KiB);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "write after a refusal failed: %s", ev.message);
	itest_assert_mem_eq(itest_bytes(rw), itest_bytes(src), 64 * KiB, "write after refusal");

	job = itest_job(4, RDMAX_OP_READ, src, 0, &dwo, 0, 4096);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_REMOTE_ACCESS);
	ck_assert_msg(strstr(ev.message, "RDMA READ"), "message: %s", ev.message);
	job = itest_job(5, RDMAX_OP_READ, src, 0, &drw, 0, 64 * KiB);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "read after a refusal failed: %s", ev.message);

	itest_assert_quiet(ca, 100);
	rdmax_client_close(ca);
	rdmax_client_close(cb);
	itest_daemon_stop(a);
	itest_daemon_stop(b);
	itest_daemon_free(a);
	itest_daemon_free(b);
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
	ck_assert_msg(strstr(ev.message, "authentication"), "message: %s", ev.message);
	/* Five retries with backoff would take seconds: an application reject is final. */
	ck_assert_msg(took < 3000, "refusal took %" PRIu64 " ms", took);
	for (int i = 0; i < 4096; i++) {
		ck_assert_msg(itest_bytes(dst)[i] == 0, "a refused peer changed byte %d", i);
	}
	/* The accepting side refused the request itself, before any QP existed. */
	ck_assert_msg(log_contains(b, "refused connection from"), "no refusal in b's log");
	ck_assert_msg(!log_contains(b, "accepting QP"), "b allocated a QP for a refused peer");

	rdmax_client_close(ca);
	rdmax_client_close(cb);
	itest_daemon_stop(a);
	itest_daemon_stop(b);
	itest_daemon_free(a);
	itest_daemon_free(b);
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
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, big, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, big, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);
	struct rdmax_event ev;

	itest_fill(itest_bytes(src), big, 11);
	/* Warm: the connection is up before the timed jobs. */
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "warm-up write failed: %s", ev.message);

	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &desc, 0, big);
	job.deadline_ms = 1;
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, RDMAX_E_TIMEOUT);
	ck_assert_msg(strstr(ev.message, "deadline"), "message: %s", ev.message);

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
	ck_assert_msg(ev.status == 0, "write after deadline and cancel failed: %s", ev.message);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 1 * MiB, "write after cancel");

	rdmax_client_close(ca);
	rdmax_client_close(cb);
	itest_daemon_stop(a);
	itest_daemon_stop(b);
	itest_daemon_free(a);
	itest_daemon_free(b);
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
	return tc;
}
