/* SPDX-License-Identifier: MIT */
/*
 * The name table of named regions (daemon/delivery/names.c): the alphabet and
 * length of names, uniqueness per node, the per-client and per-node bounds,
 * withdrawal by name, by region and by owner, and what a lookup copies.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "names.h"
#include "rdmax.h"

static const uint8_t g_desc[] = {1, 2, 3, 4, 5};

START_TEST(names_check_alphabet)
{
	char longest[NAMES_NAME_MAX + 2];
	memset(longest, 'a', sizeof(longest));

	ck_assert_int_eq(names_check("kv/layer-0.cache@node:1+x_y", 27), 0);
	ck_assert_int_eq(names_check(longest, NAMES_NAME_MAX), 0);
	ck_assert_int_eq(names_check(longest, NAMES_NAME_MAX + 1), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(names_check("", 0), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(names_check(NULL, 3), RDMAX_E_INVALID_ARGUMENT);
	const char *const bad[] = {"a b", "a\tb", "a'b", "a;b", "a\"b", "\xc3\xa9", "a*b", "a\\b"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(names_check(bad[i], strlen(bad[i])) == RDMAX_E_INVALID_ARGUMENT,
			      "accepted '%s'", bad[i]);
	}
	/* An embedded NUL is not part of any name. */
	ck_assert_int_eq(names_check("ab\0c", 4), RDMAX_E_INVALID_ARGUMENT);
}
END_TEST

START_TEST(names_publish_lookup_withdraw)
{
	struct name_table t;
	int owner_a, owner_b;
	uint8_t buf[16];

	ck_assert_int_eq(names_init(&t), 0);
	ck_assert_int_eq(names_publish(&t, &owner_a, "x", 7, g_desc, sizeof(g_desc)), 0);
	ck_assert_int_eq(names_publish(&t, &owner_b, "x", 8, g_desc, sizeof(g_desc)),
			 RDMAX_E_ALREADY_EXISTS);
	ck_assert_int_eq(names_publish(&t, &owner_a, "bad name", 7, g_desc, 5),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(names_publish(&t, &owner_a, "y", 7, g_desc, 0), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(names_publish(&t, &owner_a, "y", 7, g_desc, DESC_MAX_BYTES + 1),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(names_lookup(&t, "x", 1, buf, sizeof(buf)), (int)sizeof(g_desc));
	ck_assert_mem_eq(buf, g_desc, sizeof(g_desc));
	ck_assert_int_eq(names_lookup(&t, "x", 1, buf, 4), -ENOSPC);
	ck_assert_int_eq(names_lookup(&t, "z", 1, buf, sizeof(buf)), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(names_lookup(NULL, "z", 1, buf, sizeof(buf)), RDMAX_E_NOT_FOUND);
	ck_assert_uint_eq(t.served, 1);
	ck_assert_uint_eq(t.missing, 1);

	/* Only the owner withdraws; by region; by owner. */
	ck_assert_int_eq(names_unpublish(&t, &owner_b, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(names_unpublish(&t, &owner_a, "x"), 0);
	ck_assert_int_eq(names_unpublish(&t, &owner_a, "x"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(names_publish(&t, &owner_a, "r1.a", 1, g_desc, 5), 0);
	ck_assert_int_eq(names_publish(&t, &owner_a, "r1.b", 1, g_desc, 5), 0);
	ck_assert_int_eq(names_publish(&t, &owner_a, "r2", 2, g_desc, 5), 0);
	ck_assert_int_eq(names_publish(&t, &owner_b, "b1", 1, g_desc, 5), 0);
	ck_assert_uint_eq(names_unpublish_region(&t, &owner_a, 1), 2);
	ck_assert_int_eq(names_lookup(&t, "r1.a", 4, buf, sizeof(buf)), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(names_lookup(&t, "b1", 2, buf, sizeof(buf)),
			 5); /* other owner's region 1 */
	ck_assert_uint_eq(names_release_owner(&t, &owner_a), 1);
	ck_assert_uint_eq(names_release_owner(&t, &owner_a), 0);
	ck_assert_uint_eq(t.count, 1);
	names_fini(&t);
}
END_TEST

START_TEST(names_bounds)
{
	struct name_table t;
	int owners[NAMES_MAX_PER_NODE / NAMES_MAX_PER_CLIENT + 1];
	char name[32];

	ck_assert_int_eq(names_init(&t), 0);
	/* Every client fills its share; the node is full after the last one. */
	for (size_t o = 0; o < NAMES_MAX_PER_NODE / NAMES_MAX_PER_CLIENT; o++) {
		for (int i = 0; i < NAMES_MAX_PER_CLIENT; i++) {
			snprintf(name, sizeof(name), "o%zu.n%d", o, i);
			ck_assert_int_eq(names_publish(&t, &owners[o], name, 1, g_desc, 5), 0);
		}
		ck_assert_int_eq(names_publish(&t, &owners[o], "one.more", 1, g_desc, 5),
				 RDMAX_E_RESOURCE_EXHAUSTED);
	}
	ck_assert_uint_eq(t.count, NAMES_MAX_PER_NODE);
	size_t last = NAMES_MAX_PER_NODE / NAMES_MAX_PER_CLIENT;
	ck_assert_int_eq(names_publish(&t, &owners[last], "new.owner", 1, g_desc, 5),
			 RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_uint_eq(names_release_owner(&t, &owners[0]), NAMES_MAX_PER_CLIENT);
	ck_assert_int_eq(names_publish(&t, &owners[last], "new.owner", 1, g_desc, 5), 0);
	names_fini(&t);
}
END_TEST

Suite *names_suite(void);

Suite *names_suite(void)
{
	Suite *s = suite_create("names");
	TCase *tc = tcase_create("table");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, names_check_alphabet);
	tcase_add_test(tc, names_publish_lookup_withdraw);
	tcase_add_test(tc, names_bounds);
	suite_add_tcase(s, tc);
	return s;
}
