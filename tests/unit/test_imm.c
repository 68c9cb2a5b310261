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
	ck_assert_int_eq(imm_space_open(&t, &a, NULL, 0), 0);
	ck_assert_int_eq(imm_space_open(&t, &b, NULL, 0), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 7, 3, 0), 0);
	imm_landed(&t, &a, 7);
	imm_landed(&t, &a, 7);
	ck_assert_int_eq(f.calls, 0);
	imm_landed(&t, &a, 7);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_ptr_eq(f.owner, &a);
	ck_assert_uint_eq(f.imm, 7);
	ck_assert_uint_eq(f.count, 3);
	/* More landings do not fire again until a new expect. */
	imm_landed(&t, &a, 7);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_uint_eq(imm_count(&t, &a, 7), 1);
	/* b's namespace is its own: the value is free there, a's landings are not b's. */
	ck_assert_int_eq(imm_expect(&t, &b, 7, 1, 0), 0);
	ck_assert_int_eq(f.calls, 1);
	imm_landed(&t, &a, 7);
	ck_assert_int_eq(f.calls, 1);
	imm_landed(&t, &b, 7);
	ck_assert_int_eq(f.calls, 2);
	ck_assert_ptr_eq(f.owner, &b);
	ck_assert_int_eq(imm_expect(&t, &a, 7, 0, 0), RDMAX_E_INVALID_ARGUMENT);
	/* Reset drops what was counted. */
	ck_assert_uint_eq(imm_count(&t, &a, 7), 2);
	ck_assert_int_eq(imm_expect(&t, &a, 7, 1, IMM_RESET), 0);
	ck_assert_int_eq(f.calls, 2);
	ck_assert_uint_eq(imm_count(&t, &a, 7), 0);
	imm_table_fini(&t);
}
END_TEST

START_TEST(imm_landings_before_expect_count)
{
	struct imm_table t;
	struct fired f = {0};
	int a, gone;
	ck_assert_int_eq(imm_table_init(&t, 16, on_fired, &f), 0);
	ck_assert_int_eq(imm_space_open(&t, &a, NULL, 0), 0);
	for (int i = 0; i < 5; i++) {
		imm_landed(&t, &a, 0xffffffffu);
	}
	ck_assert_int_eq(imm_expect(&t, &a, 0xffffffffu, 5, 0), 0);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_uint_eq(f.imm, 0xffffffffu);
	ck_assert_uint_eq(imm_count(&t, &a, 0xffffffffu), 0);
	/* A namespace ends with its client: nothing of it stays counted. */
	imm_landed(&t, &a, 3);
	ck_assert_uint_eq(t.n_counters, 1);
	imm_release_owner(&t, &a);
	ck_assert_uint_eq(t.n_counters, 0);
	ck_assert_uint_eq(imm_count(&t, &a, 3), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 3, 1, 0), RDMAX_E_NOT_FOUND);
	/* A landing in a region of nobody known is dropped. */
	imm_landed(&t, &gone, 3);
	imm_landed(&t, NULL, 3);
	ck_assert_uint_eq(t.dropped, 2);
	ck_assert_int_eq(f.calls, 1);
	imm_table_fini(&t);
}
END_TEST

START_TEST(imm_table_bounded)
{
	struct imm_table t;
	struct fired f = {0};
	uint32_t uid_a = 0, uid_b = 0;
	int a, a2, b;
	ck_assert_int_eq(imm_table_init(&t, 100, on_fired, &f), 0);
	/* a and a2 share one uid's 4 counters; b has its own. */
	ck_assert_int_eq(imm_space_open(&t, &a, &uid_a, 4), 0);
	ck_assert_int_eq(imm_space_open(&t, &a2, &uid_a, 4), 0);
	ck_assert_int_eq(imm_space_open(&t, &b, &uid_b, 4), 0);
	for (uint32_t i = 0; i < 10; i++) {
		imm_landed(&t, &a, i);
	}
	ck_assert_uint_eq(t.dropped, 6);
	ck_assert_uint_eq(uid_a, 4);
	ck_assert_uint_eq(imm_count(&t, &a, 3), 1);
	ck_assert_uint_eq(imm_count(&t, &a, 9), 0);
	/* The flood stays in its uid's share: b still claims and counts. */
	ck_assert_int_eq(imm_expect(&t, &b, 100, 1, 0), 0);
	imm_landed(&t, &b, 100);
	ck_assert_int_eq(f.calls, 1);
	/* A claim in the full share evicts an unclaimed count instead of failing. */
	ck_assert_int_eq(imm_expect(&t, &a, 100, 1, 0), 0);
	ck_assert_uint_eq(uid_a, 4);
	ck_assert_int_eq(imm_expect(&t, &a, 50, 1, 0), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 51, 1, 0), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 52, 1, 0), 0);
	/* Only claims left in the uid's share: the next one is refused, in a2 too. */
	ck_assert_int_eq(imm_expect(&t, &a, 53, 1, 0), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(imm_expect(&t, &a2, 53, 1, 0), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_uint_eq(uid_a, 4);
	imm_release_owner(&t, &a2);
	ck_assert_uint_eq(uid_a, 4);
	imm_release_owner(&t, &a);
	imm_release_owner(&t, &b);
	ck_assert_uint_eq(uid_a, 0);
	ck_assert_uint_eq(uid_b, 0);
	ck_assert_uint_eq(t.n_counters, 0);
	imm_table_fini(&t);
}
END_TEST

START_TEST(imm_standing_claim)
{
	struct imm_table t;
	struct fired f = {0};
	uint32_t uid = 0;
	int a;
	ck_assert_int_eq(imm_table_init(&t, 16, on_fired, &f), 0);
	ck_assert_int_eq(imm_space_open(&t, &a, &uid, 4), 0);
	/* Five landings before the claim: two whole counts fire as one, one stays. */
	for (int i = 0; i < 5; i++) {
		imm_landed(&t, &a, 9);
	}
	ck_assert_int_eq(imm_expect(&t, &a, 9, 2, IMM_STANDING), 0);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_uint_eq(f.count, 4);
	ck_assert_uint_eq(imm_count(&t, &a, 9), 1);
	/* It stays claimed: each further count fires once, with the claim's count. */
	for (int round = 0; round < 3; round++) {
		imm_landed(&t, &a, 9);
		ck_assert_int_eq(f.calls, 2 + round);
		ck_assert_uint_eq(f.count, 2);
		ck_assert_uint_eq(imm_count(&t, &a, 9), 0);
		imm_landed(&t, &a, 9);
		ck_assert_int_eq(f.calls, 2 + round);
	}
	/* Consumed to zero, the claimed counter stays in the share. */
	imm_landed(&t, &a, 9);
	ck_assert_int_eq(f.calls, 5);
	ck_assert_uint_eq(uid, 1);
	/* Released: landings count again without firing, and can be evicted. */
	ck_assert_int_eq(imm_release(&t, &a, 9), 0);
	ck_assert_uint_eq(uid, 0);
	ck_assert_int_eq(imm_release(&t, &a, 9), RDMAX_E_NOT_FOUND);
	imm_landed(&t, &a, 9);
	imm_landed(&t, &a, 9);
	ck_assert_int_eq(f.calls, 5);
	ck_assert_uint_eq(imm_count(&t, &a, 9), 2);
	/* Release of a value counted but unclaimed is refused and keeps the count. */
	ck_assert_int_eq(imm_release(&t, &a, 9), RDMAX_E_NOT_FOUND);
	ck_assert_uint_eq(imm_count(&t, &a, 9), 2);
	/* A one-shot claim replaces a standing one: it fires once and ends. */
	ck_assert_int_eq(imm_expect(&t, &a, 9, 3, IMM_STANDING), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 9, 3, 0), 0);
	imm_landed(&t, &a, 9);
	ck_assert_int_eq(f.calls, 6);
	ck_assert_uint_eq(f.count, 3);
	for (int i = 0; i < 3; i++) {
		imm_landed(&t, &a, 9);
	}
	ck_assert_int_eq(f.calls, 6);
	ck_assert_uint_eq(imm_count(&t, &a, 9), 3);
	/* A one-shot claim is released like a standing one. */
	ck_assert_int_eq(imm_expect(&t, &a, 9, 5, IMM_RESET), 0);
	ck_assert_uint_eq(imm_count(&t, &a, 9), 0);
	ck_assert_int_eq(imm_release(&t, &a, 9), 0);
	ck_assert_uint_eq(uid, 0);
	/* Another client cannot release a's claim: the value is a's alone. */
	int b;
	ck_assert_int_eq(imm_space_open(&t, &b, NULL, 0), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 10, 1, IMM_STANDING), 0);
	ck_assert_int_eq(imm_release(&t, &b, 10), RDMAX_E_NOT_FOUND);
	imm_landed(&t, &a, 10);
	ck_assert_int_eq(f.calls, 7);
	ck_assert_ptr_eq(f.owner, &a);
	ck_assert_int_eq(imm_release(&t, &b, 0xdead), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(imm_release(&t, NULL, 10), RDMAX_E_NOT_FOUND);
	imm_release_owner(&t, &a);
	imm_release_owner(&t, &b);
	ck_assert_uint_eq(t.n_counters, 0);
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
	tcase_add_test(tc, imm_standing_claim);
	suite_add_tcase(s, tc);
	return s;
}
