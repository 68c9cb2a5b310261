// SPDX-License-Identifier: MIT
/*
 * A program built against rdmax.h alone, the way an application is: it pins
 * the RDMAX_2.0 layout of the public structs (the build fails when a field
 * moves) and, run against a daemon, proves that jobs and events cross the
 * library boundary by their size. tests/abi/run builds it against this
 * header and against a "next release" header with one field appended to each
 * struct, and runs each build against this library and against a library
 * built from the next header, so every pairing of old and new is exercised.
 *
 * Usage: abi_check SOCKET. Exit 0 when every check passed; prints the first
 * failure and exits 1 otherwise.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmax.h"

#define PIN(type, field, off)                                                                      \
	_Static_assert(offsetof(struct type, field) == (off), #type "." #field " moved")

/* The RDMAX_2.0 layout (x86-64 and aarch64 LP64): append only, never move. */
PIN(rdmax_desc, bytes, 4);
PIN(rdmax_pages, indices, 16);
PIN(rdmax_job, id, 0);
PIN(rdmax_job, op, 8);
PIN(rdmax_job, flags, 12);
PIN(rdmax_job, imm, 16);
PIN(rdmax_job, deadline_ms, 20);
PIN(rdmax_job, local, 24);
PIN(rdmax_job, local_offset, 32);
PIN(rdmax_job, length, 40);
PIN(rdmax_job, remote, 48);
PIN(rdmax_job, remote_offset, 56);
PIN(rdmax_job, u, 64);
PIN(rdmax_event, type, 0);
PIN(rdmax_event, job_id, 8);
PIN(rdmax_event, status, 16);
PIN(rdmax_event, bytes, 24);
PIN(rdmax_event, imm, 32);
PIN(rdmax_event, count, 40);
PIN(rdmax_event, reason, 48);
PIN(rdmax_event, mailbox, 208);
PIN(rdmax_event, payload, 280);
PIN(rdmax_event, from_node, 288);
PIN(rdmax_daemon_info, struct_size, 0);
PIN(rdmax_daemon_info, protocol_version, 4);
PIN(rdmax_daemon_info, max_jobs_per_submit, 140);
_Static_assert(sizeof(struct rdmax_job) >= RDMAX_JOB_SIZE_MIN, "job shrank");
_Static_assert(sizeof(struct rdmax_event) >= RDMAX_EVENT_SIZE_MIN, "event shrank");

static int g_failed;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "abi_check:%d: %s: ", __LINE__, #cond);                    \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			g_failed = 1;                                                              \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

static int check_names(void)
{
	CHECK(strcmp(rdmax_err_name(RDMAX_E_TIMEOUT), "RDMAX_E_TIMEOUT") == 0, "%s",
	      rdmax_err_name(RDMAX_E_TIMEOUT));
	CHECK(strcmp(rdmax_err_name(RDMAX_E_GPU_ADDRESS_REUSED), "RDMAX_E_GPU_ADDRESS_REUSED") == 0,
	      "%s", rdmax_err_name(RDMAX_E_GPU_ADDRESS_REUSED));
	CHECK(strcmp(rdmax_err_name(RDMAX_E_DISCONNECTED), "RDMAX_E_DISCONNECTED") == 0, "%s",
	      rdmax_err_name(RDMAX_E_DISCONNECTED));
	CHECK(strcmp(rdmax_err_name(-ENOENT), "ENOENT") == 0, "%s", rdmax_err_name(-ENOENT));
	CHECK(strcmp(rdmax_err_name(0), "RDMAX_OK") == 0, "%s", rdmax_err_name(0));
	CHECK(strcmp(rdmax_err_name(-1999), "RDMAX_E_UNKNOWN") == 0, "%s", rdmax_err_name(-1999));
	return 0;
}

/* Two WRITE jobs between regions of this node, submitted in one array, both verified. */
static int check_jobs(struct rdmax_client *c, struct rdmax_region *src, struct rdmax_region *dst)
{
	struct rdmax_job jobs[2];
	struct rdmax_desc desc;
	uint8_t *s = rdmax_region_addr(src), *d = rdmax_region_addr(dst);

	CHECK(rdmax_region_desc(dst, &desc) == 0, "rdmax_region_desc");
	for (int i = 0; i < 4096; i++) {
		s[i] = (uint8_t)(i * 7 + 3);
	}
	memset(jobs, 0, sizeof(jobs));
	for (int i = 0; i < 2; i++) {
		jobs[i].id = 100 + (uint64_t)i;
		jobs[i].op = RDMAX_OP_WRITE;
		jobs[i].local = src;
		jobs[i].local_offset = (uint64_t)i * 2048;
		jobs[i].length = 2048;
		jobs[i].remote = &desc;
		jobs[i].remote_offset = (uint64_t)i * 2048;
	}
#ifdef ABI_NEXT
	/* A field this program knows and an older library does not. */
	jobs[1].abi_next_field = 1;
	int r = rdmax_submit(c, jobs, 2);
	const char *lib_next = getenv("ABI_CHECK_LIB_NEXT");
	if (lib_next && *lib_next) {
		CHECK(r != RDMAX_E_INVALID_ARGUMENT, "a library that knows the field refused it");
		/* The next library ignores what it does not act on; collect both. */
		CHECK(r == 0, "%s", rdmax_err_name(r));
		CHECK(rdmax_wait_job(c, 100, 10000) == 0, "job 100");
		CHECK(rdmax_wait_job(c, 101, 10000) == 0, "job 101");
		jobs[0].id = 102;
		jobs[1].id = 103;
	} else {
		CHECK(r == RDMAX_E_INVALID_ARGUMENT, "unknown non-zero field accepted: %s",
		      rdmax_err_name(r));
	}
	jobs[1].abi_next_field = 0;
#endif
	memset(d, 0, 4096);
	int ret = rdmax_submit(c, jobs, 2);
	CHECK(ret == 0, "rdmax_submit: %s", rdmax_err_name(ret));

	struct rdmax_event ev[4];
	int got = 0;
	memset(ev, 0xa5, sizeof(ev));
	while (got < 2) {
		int n = rdmax_poll_events(c, ev + got, 4 - (size_t)got, 10000);
		CHECK(n > 0, "rdmax_poll_events: %s", rdmax_err_name(n));
		got += n;
	}
	for (int i = 0; i < 2; i++) {
		CHECK(ev[i].type == RDMAX_EVENT_COMPLETION, "type %d", (int)ev[i].type);
		CHECK(ev[i].status == 0, "job %llu: %s (%s)", (unsigned long long)ev[i].job_id,
		      rdmax_err_name(ev[i].status), ev[i].reason);
		CHECK(ev[i].bytes == 2048, "bytes %llu", (unsigned long long)ev[i].bytes);
		CHECK(ev[i].reason[0] == '\0' && ev[i].mailbox[0] == '\0',
		      "fields of other events");
#ifdef ABI_NEXT
		/* An older library does not know the field: it must come back zeroed. */
		CHECK(ev[i].abi_next_field == 0, "unknown event tail not zeroed");
#endif
	}
	CHECK(memcmp(s, d, 4096) == 0, "bytes differ after the two writes");
	/* Stride: the third slot was not written. */
	CHECK(((const uint8_t *)&ev[2])[0] == 0xa5, "wrote past the events returned");
	return 0;
}

static int check_sizes(struct rdmax_client *c)
{
	struct rdmax_job job;
	struct rdmax_event ev;

	memset(&job, 0, sizeof(job));
	CHECK(rdmax_submit_sized(c, &job, 1, RDMAX_JOB_SIZE_MIN - 8) == RDMAX_E_INVALID_ARGUMENT,
	      "a job below the minimum size accepted");
	CHECK(rdmax_poll_events_sized(c, &ev, 1, RDMAX_EVENT_SIZE_MIN - 8, 0) == -EINVAL,
	      "an event below the minimum size accepted");
	const struct rdmax_daemon_info *info = rdmax_client_info(c);
	CHECK(info && info->struct_size >= offsetof(struct rdmax_daemon_info, max_jobs_per_submit) +
						   sizeof(uint32_t),
	      "struct_size %u", info ? info->struct_size : 0);
	CHECK(RDMAX_INFO_HAS(info, max_jobs_per_submit) && info->protocol_version == 1,
	      "info fields");
	return 0;
}

static int check_lifetimes(struct rdmax_client *c, struct rdmax_region *r)
{
	CHECK(rdmax_region_deregister(c, r) == -EINVAL, "deregister of an allocation");
	CHECK(rdmax_region_length(r) >= 4096, "region freed by the refused call");
	CHECK(rdmax_region_free(c, NULL) == 0, "free(NULL)");
	int ret = rdmax_region_free(c, r);
	CHECK(ret == 0, "rdmax_region_free: %s", rdmax_err_name(ret));
	return 0;
}

int main(int argc, char **argv)
{
	struct rdmax_client *c;
	struct rdmax_region *src, *dst;
	int ret;

	if (argc != 2) {
		fprintf(stderr, "usage: abi_check SOCKET\n");
		return 2;
	}
	if (check_names()) {
		return 1;
	}
	ret = rdmax_client_open(argv[1], "abi_check", &c);
	if (ret < 0) {
		fprintf(stderr, "abi_check: rdmax_client_open: %s\n", rdmax_err_name(ret));
		return 1;
	}
	ret = rdmax_region_alloc_host(c, 4096, RDMAX_ACCESS_LOCAL, &src);
	if (ret == 0) {
		ret = rdmax_region_alloc_host(c, 4096, RDMAX_ACCESS_REMOTE_WRITE, &dst);
	}
	if (ret < 0) {
		fprintf(stderr, "abi_check: rdmax_region_alloc_host: %s\n", rdmax_err_name(ret));
		return 1;
	}
	if (!check_sizes(c) && !check_jobs(c, src, dst)) {
		check_lifetimes(c, src);
	}
	rdmax_client_close(c);
	if (!g_failed) {
		printf("abi_check: ok (job %zu bytes, event %zu bytes)\n", sizeof(struct rdmax_job),
		       sizeof(struct rdmax_event));
	}
	return g_failed;
}
