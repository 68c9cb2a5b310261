/* SPDX-License-Identifier: MIT */
/* Unit tests of region: mapping, seals, remote access checks, references and hooks. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fixtures.h"
#include "rdmax.h"
#include "region.h"

Suite *region_suite(void);

static int hook_added, hook_removed;

static int count_added(void *ctx, struct region *region)
{
	hook_added++;
	return 0;
}

static void count_removed(void *ctx, struct region *region)
{
	hook_removed++;
}

static int released_calls;
static void on_released(struct region *region, void *arg)
{
	released_calls++;
}

START_TEST(region_register_checks_fd)
{
	struct region_table t;
	struct region *r;
	int owner;
	ck_assert_int_eq(region_table_init(&t, 99), 0);

	int unsealed = unit_sealed_memfd(8192, 0);
	ck_assert_int_eq(region_register_host_fd(&t, &owner, unsealed, 0, 4096, 0, &r),
			 RDMAX_E_PERMISSION_DENIED);
	int fd = unit_sealed_memfd(8192, F_SEAL_SHRINK);
	ck_assert_int_eq(region_register_host_fd(&t, &owner, fd, 4096, 8192, 0, &r),
			 RDMAX_E_OUT_OF_RANGE);
	ck_assert_int_eq(region_register_host_fd(&t, &owner, fd, 0, 0, 0, &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(region_register_host_fd(&t, &owner, fd, 0, 10, 0x100, &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(region_register_host_fd(&t, &owner, fd, UINT64_MAX - 2, 10, 0, &r),
			 RDMAX_E_OUT_OF_RANGE);
	int pipefd[2];
	ck_assert_int_eq(pipe(pipefd), 0);
	ck_assert_int_eq(region_register_host_fd(&t, &owner, pipefd[0], 0, 10, 0, &r),
			 RDMAX_E_INVALID_ARGUMENT);
	close(pipefd[0]);
	close(pipefd[1]);
	ck_assert_uint_eq(t.count, 0);

	/* Interior, unaligned offset: the daemon's view starts exactly there. */
	uint8_t *mine = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(mine, MAP_FAILED);
	mine[4096 + 100] = 0x5a;
	ck_assert_int_eq(region_register_host_fd(&t, &owner, fd, 4096 + 100, 50,
						 RDMAX_ACCESS_REMOTE_READ, &r),
			 0);
	ck_assert_uint_eq(r->addr[0], 0x5a);
	r->addr[1] = 0xa5;
	ck_assert_uint_eq(mine[4096 + 101], 0xa5);
	ck_assert_uint_eq(t.count, 1);
	ck_assert_uint_eq(t.total_bytes, 50);
	munmap(mine, 8192);
	close(unsealed);
	close(fd);
	region_table_fini(&t);
}
END_TEST

START_TEST(region_remote_access_and_refs)
{
	struct region_table t;
	struct region *r, *got;
	int owner, other;
	struct region_hooks hooks = {.added = count_added, .removed = count_removed};
	hook_added = hook_removed = released_calls = 0;
	ck_assert_int_eq(region_table_init(&t, 7), 0);
	ck_assert_int_eq(region_table_add_hooks(&t, &hooks), 0);
	int fd = unit_sealed_memfd(4096, F_SEAL_SHRINK);
	ck_assert_int_eq(
		region_register_host_fd(&t, &owner, fd, 0, 4096, RDMAX_ACCESS_REMOTE_WRITE, &r), 0);
	close(fd); /* the mapping keeps the memory */
	ck_assert_int_eq(hook_added, 1);
	ck_assert_ptr_eq(region_find_owned(&t, &owner, r->id), r);
	ck_assert_ptr_null(region_find_owned(&t, &other, r->id));

	ck_assert_int_eq(
		region_get_remote(&t, 8, r->id, r->key, 0, 1, RDMAX_ACCESS_REMOTE_WRITE, &got),
		RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(
		region_get_remote(&t, 7, r->id, r->key + 1, 0, 1, RDMAX_ACCESS_REMOTE_WRITE, &got),
		RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(
		region_get_remote(&t, 7, r->id, r->key, 0, 1, RDMAX_ACCESS_REMOTE_READ, &got),
		RDMAX_E_PERMISSION_DENIED);
	ck_assert_int_eq(
		region_get_remote(&t, 7, r->id, r->key, 4000, 97, RDMAX_ACCESS_REMOTE_WRITE, &got),
		RDMAX_E_OUT_OF_RANGE);
	ck_assert_int_eq(
		region_get_remote(&t, 7, r->id, r->key, 4000, 96, RDMAX_ACCESS_REMOTE_WRITE, &got),
		0);
	ck_assert_uint_eq(r->refs, 2);
	got->addr[4095] = 1; /* mapped */

	/* Deregistration waits for the holder. */
	region_deregister(&t, r, on_released, NULL);
	ck_assert_int_eq(released_calls, 0);
	ck_assert_ptr_null(region_find_owned(&t, &owner, r->id));
	ck_assert_int_eq(
		region_get_remote(&t, 7, got->id, got->key, 0, 1, RDMAX_ACCESS_REMOTE_WRITE, &r),
		RDMAX_E_NOT_FOUND);
	region_put(&t, got);
	ck_assert_int_eq(released_calls, 1);
	ck_assert_int_eq(hook_removed, 1);
	ck_assert_uint_eq(t.count, 0);
	ck_assert_uint_eq(t.total_bytes, 0);
	region_table_fini(&t);
}
END_TEST

Suite *region_suite(void)
{
	Suite *s = suite_create("region");
	TCase *tc = tcase_create("region");
	tcase_set_timeout(tc, 5);
	tcase_add_test(tc, region_register_checks_fd);
	tcase_add_test(tc, region_remote_access_and_refs);
	suite_add_tcase(s, tc);
	return s;
}
