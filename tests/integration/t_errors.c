/* SPDX-License-Identifier: MIT */
/*
 * Case "errors": every job status the public API can provoke, each asserted
 * by its RDMAX_E_* code, and after each group a job that must still succeed.
 * Validation that only the daemon owning the memory can do (bounds, access,
 * key of a forged descriptor) is provoked with descriptors re-encoded by the
 * test, because a peer can send any bytes it likes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdmax.pb-c.h"

#define ACCESS_RW (RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)

static void dereg(struct rdmax_client *c, struct rdmax_region *r)
{
	int ret = rdmax_region_free(c, r);

	ck_assert_msg(ret == 0, "rdmax_region_free() failed: %s", rdmax_err_name(ret));
}

static void expect_ok(struct rdmax_client *c, const struct rdmax_job *job)
{
	struct rdmax_event ev = itest_run_job(c, job, ITEST_WAIT_MS);

	ck_assert_msg(ev.status == 0, "job %" PRIu64 " failed: %s ('%s')", job->id,
		      rdmax_err_name(ev.status), ev.reason);
	ck_assert_uint_eq(ev.bytes, job->length);
}

/*
 * Submit jobs that must all fail with err: either rdmax_submit() refuses the
 * whole call, or each job completes once with err.
 */
static void expect_submit_error(struct rdmax_client *c, const struct rdmax_job *jobs, size_t n,
				int err)
{
	int ret = rdmax_submit(c, jobs, n);

	if (ret < 0) {
		itest_assert_err(ret, err);
		itest_assert_quiet(c, 100);
		return;
	}
	struct rdmax_event *evs = calloc(n, sizeof(*evs));
	ck_assert_ptr_nonnull(evs);
	ck_assert_uint_eq(itest_collect(c, evs, n, ITEST_WAIT_MS, NULL), n);
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(evs[i].status == err,
			      "job %" PRIu64 " completed with %s, expected %s", evs[i].job_id,
			      rdmax_err_name(evs[i].status), rdmax_err_name(err));
		for (size_t j = 0; j < i; j++) {
			ck_assert_msg(evs[j].job_id != evs[i].job_id,
				      "job %" PRIu64 " completed twice", evs[i].job_id);
		}
	}
	free(evs);
	itest_assert_quiet(c, 100);
}

/* Refused by the library with lib_err, or completed once by the daemon with daemon_err. */
static void expect_refused(struct rdmax_client *c, const struct rdmax_job *job, int lib_err,
			   int daemon_err)
{
	int ret = rdmax_submit(c, job, 1);
	struct rdmax_event ev;

	if (ret < 0) {
		itest_assert_err(ret, lib_err);
	} else {
		ck_assert_uint_eq(itest_collect(c, &ev, 1, ITEST_WAIT_MS, NULL), 1);
		ck_assert_uint_eq(ev.job_id, job->id);
		itest_assert_err(ev.status, daemon_err);
	}
	itest_assert_quiet(c, 100);
}

/* Re-encode a descriptor with some fields changed, as a hostile peer could. */
enum forge {
	FORGE_LENGTH, /* claim a larger region */
	FORGE_ACCESS, /* claim remote read and write access */
	FORGE_KEY,    /* guess another region key */
	FORGE_MAX,    /* terminator */
};

static struct rdmax_desc forge_desc(const struct rdmax_desc *in, enum forge what)
{
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, in->len, in->bytes);
	struct rdmax_desc out;

	ck_assert_msg(m != NULL, "a descriptor from rdmax_region_desc() is not a RegionDesc");
	switch (what) {
	case FORGE_LENGTH:
		m->length *= 4;
		break;
	case FORGE_ACCESS:
		m->access = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
		break;
	case FORGE_KEY:
		m->region_key ^= 0x5555aaaa5555aaaaull;
		break;
	default:
		ck_abort();
	}
	uint8_t buf[RDMAX_DESC_MAX];
	size_t len = rdmax__v1__region_desc__get_packed_size(m);
	ck_assert_uint_le(len, sizeof(buf));
	rdmax__v1__region_desc__pack(m, buf);
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	/* Well-formed, so the library accepts it; only the owner can tell it is a lie. */
	int ret = rdmax_desc_import(buf, len, &out);
	ck_assert_msg(ret == 0, "rdmax_desc_import() of a re-encoded descriptor failed: %s",
		      rdmax_err_name(ret));
	return out;
}

START_TEST(job_errors)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *ca2 = itest_client(a, "neighbour");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *foreign = itest_alloc(ca2, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *rw = itest_alloc(cb, 64 * KiB, ACCESS_RW);
	struct rdmax_region *ro = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *wo = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_region *none = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_desc drw = itest_desc(rw), dro = itest_desc(ro), dwo = itest_desc(wo);
	struct rdmax_desc dnone = itest_desc(none);
	struct rdmax_job job;
	uint64_t id = 1;

	itest_fill(itest_bytes(src), 64 * KiB, 21);
	memset(itest_bytes(ro), 0x11, 64 * KiB);
	memset(itest_bytes(none), 0x22, 64 * KiB);

	/* Sanity: the set-up works, so the failures below are the daemon's verdicts. */
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &drw, 0, 64 * KiB);
	expect_ok(ca, &job);

	/*
	 * A region that belongs to another client of the same daemon: the library
	 * refuses the foreign handle (INVALID_ARGUMENT), or the daemon does not find
	 * the region among this client's (NOT_FOUND). An unknown region id reaching
	 * the daemon is asserted to be NOT_FOUND by case "raw".
	 */
	job = itest_job(id++, RDMAX_OP_WRITE, foreign, 0, &drw, 0, 16);
	expect_refused(ca, &job, RDMAX_E_INVALID_ARGUMENT, RDMAX_E_NOT_FOUND);
	job = itest_job(id++, RDMAX_OP_READ, foreign, 0, &drw, 0, 16);
	expect_refused(ca, &job, RDMAX_E_INVALID_ARGUMENT, RDMAX_E_NOT_FOUND);

	/* OUT_OF_RANGE on the local side: one byte past the end, offset past the end, overflow. */
	job = itest_job(id++, RDMAX_OP_WRITE, src, 1, &drw, 0, 64 * KiB);
	itest_expect_job_error(ca, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_READ, src, 64 * KiB + 1, &drw, 0, 1);
	itest_expect_job_error(ca, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_WRITE, src, 16, &drw, 0, UINT64_MAX - 8);
	itest_expect_job_error(ca, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);

	/* OUT_OF_RANGE on the remote side, as the descriptor says... */
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &drw, 64 * KiB - 10, 11);
	itest_expect_job_error(ca, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &drw, UINT64_MAX - 2, 16);
	itest_expect_job_error(ca, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);
	/* ...and when the descriptor lies about the length: the owner checks too. */
	struct rdmax_desc big = forge_desc(&drw, FORGE_LENGTH);
	uint8_t before[64];
	memcpy(before, itest_bytes(rw) + 64 * KiB - 32, 32);
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &big, 64 * KiB - 32, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);
	itest_assert_mem_eq(itest_bytes(rw) + 64 * KiB - 32, before, 32,
			    "region end after a refused out-of-range WRITE");
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &big, 64 * KiB, 16);
	itest_expect_job_error(ca, &job, RDMAX_E_OUT_OF_RANGE, ITEST_WAIT_MS);

	/* REMOTE_ACCESS: write without REMOTE_WRITE, read without REMOTE_READ. */
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &dro, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &dnone, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &dwo, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &dnone, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	/* A descriptor that claims access the region does not grant. */
	struct rdmax_desc claimed = forge_desc(&dnone, FORGE_ACCESS);
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &claimed, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &claimed, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	claimed = forge_desc(&dro, FORGE_ACCESS);
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &claimed, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_REMOTE_ACCESS, ITEST_WAIT_MS);
	for (size_t i = 0; i < 64 * KiB; i++) {
		ck_assert_msg(itest_bytes(ro)[i] == 0x11 && itest_bytes(none)[i] == 0x22,
			      "a refused WRITE changed byte %zu of its target", i);
	}

	/* NOT_FOUND: a guessed key, and a descriptor that outlived its region. */
	struct rdmax_desc guessed = forge_desc(&drw, FORGE_KEY);
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &guessed, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	dereg(cb, wo);
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &dwo, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &dwo, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);

	/* INVALID_ARGUMENT: garbage instead of a descriptor. */
	struct rdmax_desc garbage;
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x34, 0x56, 0x78};
	itest_assert_err(rdmax_desc_import(junk, sizeof(junk), &garbage), RDMAX_E_INVALID_ARGUMENT);
	itest_assert_err(rdmax_desc_import(junk, 0, &garbage), RDMAX_E_INVALID_ARGUMENT);
	uint8_t huge[RDMAX_DESC_MAX + 1];
	memset(huge, 0, sizeof(huge));
	memcpy(huge, drw.bytes, drw.len);
	itest_assert_err(rdmax_desc_import(huge, sizeof(huge), &garbage), RDMAX_E_INVALID_ARGUMENT);
	/* A well-formed message that is not a usable descriptor (no endpoint, wrong version). */
	Rdmax__V1__RegionDesc empty = RDMAX__V1__REGION_DESC__INIT;
	empty.version = 1;
	empty.length = 4096;
	size_t elen = rdmax__v1__region_desc__pack(&empty, huge);
	itest_assert_err(rdmax_desc_import(huge, elen, &garbage), RDMAX_E_INVALID_ARGUMENT);
	/* The daemon decodes what it is sent, whatever the library let through. */
	memset(&garbage, 0, sizeof(garbage));
	garbage.len = sizeof(junk);
	memcpy(garbage.bytes, junk, sizeof(junk));
	job = itest_job(id++, RDMAX_OP_WRITE, src, 0, &garbage, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	garbage.len = (uint32_t)elen;
	memcpy(garbage.bytes, huge, elen);
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &garbage, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);

	/*
	 * A barrier without peers, a SEND to a region descriptor (no mailbox
	 * address), one to a closed mailbox, and a kind that does not exist.
	 */
	job = itest_job(id++, RDMAX_OP_BARRIER, NULL, 0, &drw, 0, 0);
	job.flags = RDMAX_JOB_IMM;
	job.imm = 9;
	itest_assert_err(rdmax_submit(ca, &job, 1), RDMAX_E_INVALID_ARGUMENT);
	itest_assert_quiet(ca, 100);
	job = itest_job(id++, RDMAX_OP_SEND, NULL, 0, &drw, 0, 0);
	job.u.send.mailbox = "itest-nobody";
	itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);
	struct rdmax_desc closed;
	ck_assert_int_eq(rdmax_mailbox_open_addr(cb, "itest-closed", &closed), 0);
	ck_assert_int_eq(rdmax_mailbox_close(cb, "itest-closed"), 0);
	job = itest_job(id++, RDMAX_OP_SEND, NULL, 0, &closed, 0, 0);
	itest_expect_job_error(ca, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	job = itest_job(id++, (enum rdmax_op)42, src, 0, &drw, 0, 64);
	itest_expect_job_error(ca, &job, RDMAX_E_INVALID_ARGUMENT, ITEST_WAIT_MS);

	/* After all that, the same client, daemons and connection still work. */
	job = itest_job(id++, RDMAX_OP_READ, src, 0, &drw, 0, 64 * KiB);
	expect_ok(ca, &job);
	itest_assert_mem_eq(itest_bytes(src), itest_bytes(rw), 64 * KiB, "READ after errors");
	itest_assert_quiet(ca2, 50);
	itest_assert_quiet(cb, 50);

	rdmax_client_close(ca);
	itest_pair_end(ca2, cb, a, b);
}
END_TEST

START_TEST(peer_unreachable)
{
	/* One retry of at most 500 ms each: the verdict must come well within 5 s. */
	const uint64_t bound_ms = 5000;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());

	itest_daemon_set(a, "peers.connect_retries=1");
	itest_daemon_set(a, "peers.connect_timeout_ms=500");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, 4096, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);
	rdmax_client_close(cb);
	itest_daemon_stop(b);

	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	uint64_t t0 = itest_now_ms();
	itest_expect_job_error(ca, &job, RDMAX_E_UNREACHABLE, (int)bound_ms);
	ck_assert_uint_lt(itest_now_ms() - t0, bound_ms);
	job = itest_job(2, RDMAX_OP_READ, src, 0, &desc, 0, 4096);
	t0 = itest_now_ms();
	itest_expect_job_error(ca, &job, RDMAX_E_UNREACHABLE, (int)bound_ms);
	ck_assert_uint_lt(itest_now_ms() - t0, bound_ms);

	rdmax_client_close(ca);
	itest_daemon_stop(a);
	itest_daemon_free(a);
	itest_daemon_free(b);
}
END_TEST

START_TEST(job_limits)
{
	const int max_outstanding = 16, max_per_submit = 8;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	struct rdmax_job jobs[32];
	struct rdmax_event evs[32];

	itest_daemon_set(a, "limits.max_outstanding_jobs=%d", max_outstanding);
	itest_daemon_set(a, "limits.max_jobs_per_submit=%d", max_per_submit);
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *cb = itest_client(b, "target");
	const struct rdmax_daemon_info *info = rdmax_client_info(ca);
	ck_assert_uint_eq(info->max_outstanding_jobs, (unsigned)max_outstanding);
	ck_assert_uint_eq(info->max_jobs_per_submit, (unsigned)max_per_submit);
	struct rdmax_region *src = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, 64 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	itest_fill(itest_bytes(src), 64 * KiB, 31);
	for (int i = 0; i < 32; i++) {
		jobs[i] = itest_job(100 + i, RDMAX_OP_WRITE, src, i * 1024, &desc, i * 1024, 1024);
	}
	expect_ok(ca, &jobs[0]);

	/* One job too many in one submit: all refused, nothing done. */
	expect_submit_error(ca, jobs, max_per_submit + 1, RDMAX_E_RESOURCE_EXHAUSTED);

	/* Fill the outstanding window against a stopped peer, then one more. */
	itest_daemon_pause(b);
	ck_assert_int_eq(rdmax_submit(ca, jobs, max_per_submit), 0);
	ck_assert_int_eq(rdmax_submit(ca, jobs + max_per_submit, max_per_submit), 0);
	struct rdmax_job extra = itest_job(999, RDMAX_OP_WRITE, src, 0, &desc, 0, 1024);
	itest_expect_job_error(ca, &extra, RDMAX_E_RESOURCE_EXHAUSTED, ITEST_WAIT_MS);
	itest_daemon_resume(b);
	ck_assert_uint_eq(itest_collect(ca, evs, max_outstanding, 30000, NULL),
			  (size_t)max_outstanding);
	for (int i = 0; i < max_outstanding; i++) {
		ck_assert_msg(evs[i].status == 0, "job %" PRIu64 " failed: %s ('%s')",
			      evs[i].job_id, rdmax_err_name(evs[i].status), evs[i].reason);
		ck_assert_msg(evs[i].job_id >= 100 &&
				      evs[i].job_id < 100 + (unsigned)max_outstanding,
			      "completion for job %" PRIu64, evs[i].job_id);
		for (int j = 0; j < i; j++) {
			ck_assert_msg(evs[i].job_id != evs[j].job_id,
				      "job %" PRIu64 " completed twice", evs[i].job_id);
		}
	}
	itest_assert_quiet(ca, ITEST_QUIET_MS);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), max_outstanding * 1024,
			    "jobs that waited for the stopped peer");
	/* The window is free again. */
	ck_assert_int_eq(rdmax_submit(ca, jobs, max_per_submit), 0);
	ck_assert_uint_eq(itest_collect(ca, evs, max_per_submit, ITEST_WAIT_MS, NULL),
			  (size_t)max_per_submit);
	for (int i = 0; i < max_per_submit; i++) {
		ck_assert_int_eq(evs[i].status, 0);
	}

	itest_pair_end(ca, cb, a, b);
}
END_TEST

START_TEST(region_limits)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct rdmax_region *r[4], *extra = NULL;

	itest_daemon_set(a, "limits.max_regions=4");
	itest_daemon_set(a, "limits.max_registered_bytes=1M");
	itest_daemon_start(a);

	/* Region count: four, then a refusal, and room again after a deregistration. */
	struct rdmax_client *c = itest_client(a, "counter");
	ck_assert_uint_eq(rdmax_client_info(c)->max_regions, 4);
	ck_assert_uint_eq(rdmax_client_info(c)->max_registered_bytes, MiB);
	for (int i = 0; i < 4; i++) {
		r[i] = itest_alloc(c, 64 * KiB, RDMAX_ACCESS_LOCAL);
	}
	itest_assert_err(rdmax_region_alloc_host(c, 64 * KiB, RDMAX_ACCESS_LOCAL, &extra),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_ptr_null(extra);
	dereg(c, r[0]);
	r[0] = itest_alloc(c, 64 * KiB, RDMAX_ACCESS_LOCAL);
	itest_assert_err(rdmax_region_alloc_host(c, 4 * KiB, RDMAX_ACCESS_LOCAL, &extra),
			 RDMAX_E_RESOURCE_EXHAUSTED);

	/* Registered bytes, counted per client: 1 MiB in all, exactly reachable. */
	struct rdmax_client *c2 = itest_client(a, "bytes");
	struct rdmax_region *half = itest_alloc(c2, 512 * KiB, RDMAX_ACCESS_LOCAL);
	itest_assert_err(rdmax_region_alloc_host(c2, 768 * KiB, RDMAX_ACCESS_LOCAL, &extra),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	struct rdmax_region *rest = itest_alloc(c2, 512 * KiB, RDMAX_ACCESS_LOCAL);
	itest_assert_err(rdmax_region_alloc_host(c2, 4 * KiB, RDMAX_ACCESS_LOCAL, &extra),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	dereg(c2, rest);
	rest = itest_alloc(c2, 256 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *quarter = itest_alloc(c2, 256 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	itest_assert_err(rdmax_region_alloc_host(c2, 4 * KiB, RDMAX_ACCESS_LOCAL, &extra),
			 RDMAX_E_RESOURCE_EXHAUSTED);

	/* The regions that were accepted work. */
	struct rdmax_desc desc = itest_desc(quarter);
	itest_fill(itest_bytes(half), 4096, 61);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, half, 0, &desc, 0, 4096);
	expect_ok(c2, &job);
	itest_assert_mem_eq(itest_bytes(quarter), itest_bytes(half), 4096, "WRITE at the limit");
	rdmax_client_close(c);
	rdmax_client_close(c2);
	itest_daemon_stop(a);
	itest_daemon_free(a);
}
END_TEST

START_TEST(deadline)
{
	struct itest_daemon *a, *b;
	struct rdmax_client *ca, *cb;

	itest_pair_start(&a, &b, &ca, "initiator", &cb, "target");
	struct rdmax_region *src = itest_alloc(ca, MiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, MiB, ACCESS_RW);
	struct rdmax_desc desc = itest_desc(dst);
	itest_fill(itest_bytes(src), MiB, 41);

	/* A deadline that is met changes nothing. */
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, MiB);
	job.deadline_ms = 5000;
	expect_ok(ca, &job);

	itest_daemon_pause(b);
	job = itest_job(2, RDMAX_OP_WRITE, src, 0, &desc, 0, MiB);
	job.deadline_ms = 300;
	uint64_t t0 = itest_now_ms();
	itest_expect_job_error(ca, &job, RDMAX_E_TIMEOUT, ITEST_WAIT_MS);
	uint64_t took = itest_now_ms() - t0;
	ck_assert_msg(took >= 250 && took < 3000, "deadline of 300 ms fired after %" PRIu64 " ms",
		      took);
	job = itest_job(3, RDMAX_OP_READ, src, 0, &desc, 0, 4096);
	job.deadline_ms = 300;
	itest_expect_job_error(ca, &job, RDMAX_E_TIMEOUT, ITEST_WAIT_MS);
	itest_daemon_resume(b);
	/* The transfers still under way finish quietly: no second completion. */
	itest_assert_quiet(ca, 500);
	job = itest_job(4, RDMAX_OP_WRITE, src, 0, &desc, 0, MiB);
	expect_ok(ca, &job);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), MiB, "WRITE after a deadline");

	itest_pair_end(ca, cb, a, b);
}
END_TEST

/* One write from `from` into a fresh region of `to`; returns its status. */
static int write_between(struct itest_daemon *from, struct itest_daemon *to)
{
	struct rdmax_client *cf = itest_client(from, "auth-from");
	struct rdmax_client *ct = itest_client(to, "auth-to");
	struct rdmax_region *src = itest_alloc(cf, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(ct, 4096, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);

	itest_fill(itest_bytes(src), 4096, 51);
	memset(itest_bytes(dst), 0, 4096);
	struct rdmax_job job = itest_job(7, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	struct rdmax_event ev = itest_run_job(cf, &job, 20000);
	if (ev.status == 0) {
		itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 4096,
				    "authenticated WRITE");
	} else {
		ck_assert_msg(ev.reason[0], "failed job without a message");
		for (int i = 0; i < 4096; i++) {
			ck_assert_msg(itest_bytes(dst)[i] == 0,
				      "an unauthenticated WRITE changed byte %d", i);
		}
	}
	itest_assert_quiet(cf, 100);
	rdmax_client_close(cf);
	rdmax_client_close(ct);
	return ev.status;
}

START_TEST(auth_keys)
{
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *same = itest_daemon_new("same", itest_addr_b());
	struct itest_daemon *other = itest_daemon_new("other", itest_addr_b());
	struct itest_daemon *open = itest_daemon_new("open", itest_addr_b());

	itest_daemon_auth_key(a, "integration-test-key-one-0123456789\n");
	itest_daemon_auth_key(same, "integration-test-key-one-0123456789\n");
	itest_daemon_auth_key(other, "integration-test-key-two-9876543210\n");
	itest_daemon_start(a);
	itest_daemon_start(same);
	itest_daemon_start(other);
	itest_daemon_start(open);
	ck_assert_int_eq(write_between(a, same), 0);
	ck_assert_int_eq(write_between(same, a), 0);
	itest_assert_err(write_between(a, other), RDMAX_E_PERMISSION_DENIED);
	itest_assert_err(write_between(other, a), RDMAX_E_PERMISSION_DENIED);
	/* A daemon with a key does not talk to one without, in either direction. */
	itest_assert_err(write_between(a, open), RDMAX_E_PERMISSION_DENIED);
	itest_assert_err(write_between(open, a), RDMAX_E_PERMISSION_DENIED);
	/* The refusals did not poison the good pair. */
	ck_assert_int_eq(write_between(a, same), 0);
	itest_daemon_stop(a);
	itest_daemon_stop(same);
	itest_daemon_stop(other);
	itest_daemon_stop(open);
	itest_daemon_free(a);
	itest_daemon_free(same);
	itest_daemon_free(other);
	itest_daemon_free(open);
}
END_TEST

/* A descriptor of `real`'s region that points at addr:port instead of its daemon. */
static struct rdmax_desc redirect_desc(const struct rdmax_desc *real, const char *addr,
				       uint16_t port)
{
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, real->len, real->bytes);
	uint8_t buf[RDMAX_DESC_MAX];
	struct rdmax_desc out;

	ck_assert_ptr_nonnull(m);
	ck_assert_uint_ge(m->n_endpoints, 1);
	char *saved = m->endpoints[0]->addr;
	m->endpoints[0]->addr = (char *)addr;
	m->endpoints[0]->port = port;
	m->n_endpoints = 1;
	m->instance_id ^= 1; /* not the daemon that made it */
	size_t len = rdmax__v1__region_desc__get_packed_size(m);
	ck_assert_uint_le(len, sizeof(buf));
	rdmax__v1__region_desc__pack(m, buf);
	m->endpoints[0]->addr = saved;
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	ck_assert_int_eq(rdmax_desc_import(buf, len, &out), 0);
	return out;
}

/* A TCP listener on addr; returns the fd and its port. */
static int listen_on(const char *addr, uint16_t *ret_port)
{
	struct sockaddr_storage ss;
	socklen_t len;

	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, addr, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		ss.ss_family = AF_INET;
		len = sizeof(struct sockaddr_in);
	} else {
		ck_assert_int_eq(
			inet_pton(AF_INET6, addr, &((struct sockaddr_in6 *)&ss)->sin6_addr), 1);
		ss.ss_family = AF_INET6;
		len = sizeof(struct sockaddr_in6);
	}
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_msg(bind(fd, (struct sockaddr *)&ss, len) == 0, "bind() failed: %s",
		      strerror(errno));
	ck_assert_int_eq(listen(fd, 8), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	*ret_port = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
					    : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return fd;
}

/* Child: answer every connection with garbage, then drain it until the peer closes. */
static void garbage_peer(int lfd)
{
	uint8_t junk[4096], sink[4096];

	for (uint64_t seed = 1;; seed++) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0) {
			_exit(1);
		}
		itest_fill(junk, sizeof(junk), seed);
		(void)send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
		while (recv(fd, sink, sizeof(sink), 0) > 0) {
		}
		close(fd);
	}
}

static bool in_set(int status, const int *set, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (status == set[i]) {
			return true;
		}
	}
	return false;
}

/*
 * Peers are untrusted: one that accepts the connection but never answers,
 * and one that answers with garbage, must fail the job within a bound and
 * leave the daemon healthy.
 */
START_TEST(hostile_peers)
{
	static const int silent_ok[] = {RDMAX_E_UNREACHABLE, RDMAX_E_TIMEOUT};
	static const int garbage_ok[] = {RDMAX_E_UNREACHABLE, RDMAX_E_TRANSPORT_ERROR};
	const uint64_t bound_ms = 6000;
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	uint16_t port;

	itest_daemon_set(a, "peers.connect_retries=1");
	itest_daemon_set(a, "peers.connect_timeout_ms=500");
	itest_daemon_set(a, "peers.peer_timeout_ms=1000");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *ca = itest_client(a, "initiator");
	struct rdmax_client *cb = itest_client(b, "target");
	struct rdmax_region *src = itest_alloc(ca, 64 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, 64 * KiB, ACCESS_RW);
	struct rdmax_desc real = itest_desc(dst);
	itest_fill(itest_bytes(src), 64 * KiB, 131);

	/* Silent: the kernel completes the TCP handshake, nobody ever answers. */
	int silent = listen_on(itest_addr_b(), &port);
	struct rdmax_desc desc = redirect_desc(&real, itest_addr_b(), port);
	struct rdmax_job job = itest_job(1, RDMAX_OP_WRITE, src, 0, &desc, 0, 4096);
	uint64_t t0 = itest_now_ms();
	struct rdmax_event ev = itest_run_job(ca, &job, (int)bound_ms + 5000);
	ck_assert_msg(in_set(ev.status, silent_ok, 2),
		      "job to a silent peer completed with %s ('%s')", rdmax_err_name(ev.status),
		      ev.reason);
	ck_assert_msg(itest_now_ms() - t0 < bound_ms,
		      "job to a silent peer took %" PRIu64 " ms to fail", itest_now_ms() - t0);
	job = itest_job(2, RDMAX_OP_READ, src, 0, &desc, 0, 4096);
	ev = itest_run_job(ca, &job, (int)bound_ms + 5000);
	ck_assert_msg(in_set(ev.status, silent_ok, 2),
		      "READ from a silent peer completed with %s ('%s')", rdmax_err_name(ev.status),
		      ev.reason);
	close(silent);

	/* Garbage: every connection gets 4 KiB of random bytes. */
	int lfd = listen_on(itest_addr_b(), &port);
	pid_t parent = getpid(), child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		itest_child_setup(parent);
		garbage_peer(lfd);
	}
	close(lfd);
	desc = redirect_desc(&real, itest_addr_b(), port);
	for (uint64_t i = 0; i < 3; i++) {
		job = itest_job(10 + i, i % 2 ? RDMAX_OP_READ : RDMAX_OP_WRITE, src, 0, &desc, 0,
				4096);
		t0 = itest_now_ms();
		ev = itest_run_job(ca, &job, (int)bound_ms + 5000);
		ck_assert_msg(in_set(ev.status, garbage_ok, 2),
			      "job to a peer speaking garbage completed with %s ('%s')",
			      rdmax_err_name(ev.status), ev.reason);
		ck_assert_uint_lt(itest_now_ms() - t0, bound_ms);
	}
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	itest_assert_quiet(ca, 100);

	/* The real peer is still served. */
	job = itest_job(20, RDMAX_OP_WRITE, src, 0, &real, 0, 64 * KiB);
	expect_ok(ca, &job);
	itest_assert_mem_eq(itest_bytes(dst), itest_bytes(src), 64 * KiB,
			    "WRITE after hostile peers");
	itest_pair_end(ca, cb, a, b);
}
END_TEST

TCase *itest_tcase_errors(void)
{
	TCase *tc = tcase_create("errors");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, job_errors);
	tcase_add_test(tc, peer_unreachable);
	ITEST_ADD_STALLING_TEST(tc, job_limits);
	tcase_add_test(tc, region_limits);
	ITEST_ADD_STALLING_TEST(tc, deadline);
	tcase_add_test(tc, auth_keys);
	ITEST_ADD_TEST_IF(tc, hostile_peers, strcmp(itest_transport(), "tcp") == 0,
			  "the fake peers speak the TCP wire format only");
	return tc;
}
