/* SPDX-License-Identifier: MIT */
/* Unit tests of imm: immediate counters: firing once at the count, landings before the claim, the
 * table's bound. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "imm.h"
#include "rdmax.h"

Suite *imm_suite(void);

struct fired {
	void *owner;
	uint32_t imm;
	uint64_t count;
	int calls;
};

static void on_fired(void *owner, uint32_t imm, uint64_t count, void *arg)
{
	struct fired *f = arg;
	f->owner = owner;
	f->imm = imm;
	f->count = count;
	f->calls++;
}

START_TEST(imm_fires_once_at_count)
{
	struct imm_table t;
	struct fired f = {0};
	int a, b;
	ck_assert_int_eq(imm_table_init(&t, 16, on_fired, &f), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 7, 3), 0);
	imm_landed(&t, 7);
	imm_landed(&t, 7);
	ck_assert_int_eq(f.calls, 0);
	imm_landed(&t, 7);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_ptr_eq(f.owner, &a);
	ck_assert_uint_eq(f.imm, 7);
	ck_assert_uint_eq(f.count, 3);
	/* More landings do not fire again until a new expect. */
	imm_landed(&t, 7);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_uint_eq(imm_count(&t, 7), 1);
	/* The claim stays with a: b is refused. */
	ck_assert_int_eq(imm_expect(&t, &b, 7, 1), RDMAX_E_ALREADY_EXISTS);
	ck_assert_int_eq(imm_expect(&t, &a, 7, 0), RDMAX_E_INVALID_ARGUMENT);
	imm_table_fini(&t);
}
END_TEST

START_TEST(imm_landings_before_expect_count)
{
	struct imm_table t;
	struct fired f = {0};
	int a, b;
	ck_assert_int_eq(imm_table_init(&t, 16, on_fired, &f), 0);
	for (int i = 0; i < 5; i++) {
		imm_landed(&t, 0xffffffffu);
	}
	ck_assert_int_eq(imm_expect(&t, &a, 0xffffffffu, 5), 0);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_uint_eq(f.imm, 0xffffffffu);
	ck_assert_uint_eq(imm_count(&t, 0xffffffffu), 0);
	/* Released claims can be taken by another owner. */
	imm_release_owner(&t, &a);
	ck_assert_int_eq(imm_expect(&t, &b, 0xffffffffu, 2), 0);
	imm_landed(&t, 0xffffffffu);
	imm_landed(&t, 0xffffffffu);
	ck_assert_int_eq(f.calls, 2);
	ck_assert_ptr_eq(f.owner, &b);
	imm_table_fini(&t);
}
END_TEST

START_TEST(imm_table_bounded)
{
	struct imm_table t;
	struct fired f = {0};
	int a;
	ck_assert_int_eq(imm_table_init(&t, 4, on_fired, &f), 0);
	for (uint32_t i = 0; i < 10; i++) {
		imm_landed(&t, i);
	}
	ck_assert_uint_eq(t.dropped, 6);
	ck_assert_uint_eq(imm_count(&t, 3), 1);
	ck_assert_uint_eq(imm_count(&t, 9), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 100, 1), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(imm_expect(&t, &a, 2, 1), 0);
	ck_assert_int_eq(f.calls, 1);
	imm_table_fini(&t);
}
END_TEST

Suite *imm_suite(void)
{
	Suite *s = suite_create("imm");
	TCase *tc = tcase_create("imm");
	tcase_set_timeout(tc, 5);
	tcase_add_test(tc, imm_fires_once_at_count);
	tcase_add_test(tc, imm_landings_before_expect_count);
	tcase_add_test(tc, imm_table_bounded);
	suite_add_tcase(s, tc);
	return s;
}
