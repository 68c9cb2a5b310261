/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the base containers: hmap, the hash map (put, get, delete,
 * growth, reserved keys), and the intrusive list's move of a whole list.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hmap.h"
#include "util.h"

Suite *hmap_suite(void);

START_TEST(hmap_put_get_del_grow)
{
	struct hmap map;
	ck_assert_int_eq(hmap_init(&map, 4), 0);
	for (uintptr_t k = 1; k <= 10000; k++) {
		ck_assert_int_eq(hmap_put(&map, k, (void *)(k * 3)), 0);
	}
	ck_assert_uint_eq(map.count, 10000);
	for (uintptr_t k = 1; k <= 10000; k++) {
		ck_assert_ptr_eq(hmap_get(&map, k), (void *)(k * 3));
	}
	for (uintptr_t k = 1; k <= 10000; k += 2) {
		ck_assert_ptr_eq(hmap_del(&map, k), (void *)(k * 3));
	}
	ck_assert_uint_eq(map.count, 5000);
	ck_assert_ptr_null(hmap_get(&map, 1));
	ck_assert_ptr_eq(hmap_get(&map, 2), (void *)6);
	/* Tombstones are reused and lookups still find keys past them. */
	for (uintptr_t k = 1; k <= 10000; k += 2) {
		ck_assert_int_eq(hmap_put(&map, k, (void *)k), 0);
	}
	ck_assert_uint_eq(map.count, 10000);
	ck_assert_ptr_eq(hmap_get(&map, 9999), (void *)9999);
	size_t iter = 0, seen = 0;
	uint64_t key;
	void *value;
	while (hmap_next(&map, &iter, &key, &value)) {
		seen++;
	}
	ck_assert_uint_eq(seen, 10000);
	hmap_fini(&map);
}
END_TEST

START_TEST(hmap_reserved_keys_refused)
{
	struct hmap map;
	ck_assert_int_eq(hmap_init(&map, 0), 0);
	ck_assert_int_eq(hmap_put(&map, 0, &map), -EINVAL);
	ck_assert_int_eq(hmap_put(&map, UINT64_MAX, &map), -EINVAL);
	ck_assert_ptr_null(hmap_get(&map, 0));
	ck_assert_ptr_null(hmap_del(&map, UINT64_MAX));
	ck_assert_int_eq(hmap_put(&map, 5, &map), 0);
	ck_assert_int_eq(hmap_put(&map, 5, NULL), 0);
	ck_assert_uint_eq(map.count, 1);
	hmap_fini(&map);
}
END_TEST

START_TEST(hmap_churn_leaves_no_tombstones)
{
	/*
	 * A key added and removed per job: tombstones used to pile up until a
	 * rehash, and every miss walked them. A slot followed by an empty one
	 * empties, with the tombstones before it, so one job at a time leaves
	 * none, a map whose keys are all gone has none, and lookups past the
	 * tombstones left still work.
	 */
	struct hmap map;
	ck_assert_int_eq(hmap_init(&map, 64), 0);
	for (uintptr_t k = 1; k <= 1000; k++) {
		ck_assert_int_eq(hmap_put(&map, k, (void *)k), 0);
		ck_assert_ptr_eq(hmap_del(&map, k), (void *)k);
		ck_assert_uint_eq(map.tombstones, 0);
	}
	for (uintptr_t k = 1; k <= 100000; k++) {
		ck_assert_int_eq(hmap_put(&map, k, (void *)k), 0);
		if (k > 24) {
			ck_assert_ptr_eq(hmap_del(&map, k - 24), (void *)(k - 24));
		}
		for (uintptr_t live = k > 24 ? k - 23 : 1; live <= k; live += 7) {
			ck_assert_ptr_eq(hmap_get(&map, live), (void *)live);
		}
	}
	ck_assert_uint_eq(map.count, 24);
	ck_assert_uint_eq(map.capacity, 64);
	for (uintptr_t k = 100000 - 23; k <= 100000; k++) {
		ck_assert_ptr_eq(hmap_del(&map, k), (void *)k);
	}
	ck_assert_uint_eq(map.count, 0);
	ck_assert_uint_eq(map.tombstones, 0);
	for (size_t i = 0; i < map.capacity; i++) {
		ck_assert_uint_eq(map.slots[i].key, 0);
	}
	hmap_fini(&map);
}
END_TEST

/* list_move_all(): every node once, in order, after dst's own; src left empty. */
START_TEST(list_move_all_keeps_order)
{
	struct list_node dst, src, nodes[6];

	list_init(&dst);
	list_init(&src);
	list_move_all(&dst, &src); /* both empty */
	ck_assert(list_empty(&dst) && list_empty(&src));
	for (int i = 0; i < 6; i++) {
		list_add_tail(i < 2 ? &dst : &src, &nodes[i]);
	}
	list_move_all(&dst, &src);
	ck_assert(list_empty(&src));
	struct list_node *pos = dst.next;
	for (int i = 0; i < 6; i++, pos = pos->next) {
		ck_assert_ptr_eq(pos, &nodes[i]);
		ck_assert_ptr_eq(pos->next->prev, pos);
	}
	ck_assert_ptr_eq(pos, &dst);
	ck_assert_ptr_eq(dst.prev, &nodes[5]);
	list_move_all(&dst, &src); /* an empty src changes nothing */
	ck_assert_ptr_eq(dst.prev, &nodes[5]);
}
END_TEST

Suite *hmap_suite(void)
{
	Suite *s = suite_create("hmap");
	TCase *tc = tcase_create("hmap");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, hmap_put_get_del_grow);
	tcase_add_test(tc, hmap_reserved_keys_refused);
	tcase_add_test(tc, hmap_churn_leaves_no_tombstones);
	tcase_add_test(tc, list_move_all_keeps_order);
	suite_add_tcase(s, tc);
	return s;
}
