/* SPDX-License-Identifier: MIT */
/* Unit tests of the daemon's small core modules: hash map, status mapping, descriptors, imm
 * counters. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "desc.h"
#include "hmap.h"
#include "imm.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "status.h"

Suite *hmap_suite(void);
Suite *status_suite(void);
Suite *desc_suite(void);
Suite *imm_suite(void);

/* ------------------------------------------------------------------ hmap */

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

Suite *hmap_suite(void)
{
	Suite *s = suite_create("hmap");
	TCase *tc = tcase_create("hmap");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, hmap_put_get_del_grow);
	tcase_add_test(tc, hmap_reserved_keys_refused);
	suite_add_tcase(s, tc);
	return s;
}

/* ---------------------------------------------------------------- status */

START_TEST(status_round_trip)
{
	for (int st = 0; st <= RDMAX__V1__STATUS__INTERNAL; st++) {
		int err = err_from_status(st);
		ck_assert_int_eq(status_from_err(err), st);
		ck_assert_str_ne(status_name(st), "UNKNOWN");
	}
	ck_assert_int_eq(err_from_status(RDMAX__V1__STATUS__REMOTE_ACCESS), RDMAX_E_REMOTE_ACCESS);
	ck_assert_int_eq(err_from_status(999), RDMAX_E_INTERNAL);
	ck_assert_str_eq(status_name(RDMAX__V1__STATUS__REMOTE_ACCESS), "REMOTE_ACCESS");
}
END_TEST

START_TEST(status_from_errno)
{
	ck_assert_int_eq(status_from_err(-ENOMEM), RDMAX__V1__STATUS__RESOURCE_EXHAUSTED);
	ck_assert_int_eq(status_from_err(-ECONNREFUSED), RDMAX__V1__STATUS__UNREACHABLE);
	ck_assert_int_eq(status_from_err(-ECONNRESET), RDMAX__V1__STATUS__TRANSPORT_ERROR);
	ck_assert_int_eq(status_from_err(-ETIMEDOUT), RDMAX__V1__STATUS__TIMEOUT);
	ck_assert_int_eq(status_from_err(-EINVAL), RDMAX__V1__STATUS__INVALID_ARGUMENT);
	ck_assert_int_eq(status_from_err(-EACCES), RDMAX__V1__STATUS__PERMISSION_DENIED);
	ck_assert_int_eq(status_from_err(-EXDEV), RDMAX__V1__STATUS__INTERNAL);
	/* Codes past the protocol's range are not mistaken for statuses. */
	ck_assert_int_eq(status_from_err(RDMAX_E_DISCONNECTED), RDMAX__V1__STATUS__INTERNAL);
}
END_TEST

Suite *status_suite(void)
{
	Suite *s = suite_create("status");
	TCase *tc = tcase_create("status");
	tcase_set_timeout(tc, 5);
	tcase_add_test(tc, status_round_trip);
	tcase_add_test(tc, status_from_errno);
	suite_add_tcase(s, tc);
	return s;
}

/* ------------------------------------------------------------------ desc */

static struct remote_desc sample_desc(void)
{
	struct remote_desc d;
	memset(&d, 0, sizeof(d));
	d.instance_id = 0x1122334455667788ull;
	d.region_id = 42;
	d.region_key = 0xdeadbeefcafef00dull;
	d.length = 1 << 20;
	d.access = RDMAX_ACCESS_REMOTE_WRITE;
	strcpy(d.node_name, "node-a");
	d.n_endpoints = 2;
	d.endpoints[0].transport = ENDPOINT_TCP;
	strcpy(d.endpoints[0].addr, "127.0.0.1");
	d.endpoints[0].port = 7471;
	d.endpoints[1].transport = ENDPOINT_VERBS;
	strcpy(d.endpoints[1].addr, "fe80::1");
	d.endpoints[1].port = 7472;
	strcpy(d.endpoints[1].device, "mlx5_0");
	d.endpoints[1].iova = 0x7f0000001000ull;
	d.endpoints[1].rkey = 0x1234;
	return d;
}

START_TEST(desc_round_trip)
{
	struct remote_desc in = sample_desc(), out;
	uint8_t buf[DESC_MAX_BYTES];
	int len = desc_encode(&in, buf, sizeof(buf));
	ck_assert_int_gt(len, 0);
	ck_assert_int_eq(desc_decode(buf, (size_t)len, &out), 0);
	ck_assert_uint_eq(out.instance_id, in.instance_id);
	ck_assert_uint_eq(out.region_id, 42);
	ck_assert_uint_eq(out.region_key, in.region_key);
	ck_assert_uint_eq(out.length, in.length);
	ck_assert_uint_eq(out.access, in.access);
	ck_assert_str_eq(out.node_name, "node-a");
	ck_assert_uint_eq(out.n_endpoints, 2);
	ck_assert_str_eq(out.endpoints[1].device, "mlx5_0");
	ck_assert_uint_eq(out.endpoints[1].rkey, 0x1234);
	ck_assert_uint_eq(out.endpoints[1].iova, in.endpoints[1].iova);
	ck_assert(endpoint_same_peer(&out.endpoints[0], &in.endpoints[0]));
	ck_assert(!endpoint_same_peer(&out.endpoints[0], &out.endpoints[1]));
}
END_TEST

START_TEST(desc_truncated_and_garbage_refused)
{
	struct remote_desc in = sample_desc(), out;
	uint8_t buf[DESC_MAX_BYTES];
	int len = desc_encode(&in, buf, sizeof(buf));
	for (int cut = 0; cut < len; cut++) {
		/*
		 * A strict prefix is undecodable, lacks a required field, or (cut at a
		 * field boundary after the required ones) visibly lacks what followed.
		 */
		int ret = desc_decode(buf, (size_t)cut, &out);
		if (ret == 0) {
			ck_assert(out.n_endpoints < 2 || out.node_name[0] == '\0');
		} else {
			ck_assert_int_eq(ret, RDMAX_E_INVALID_ARGUMENT);
		}
	}
	uint8_t garbage[64];
	for (size_t i = 0; i < sizeof(garbage); i++) {
		garbage[i] = (uint8_t)(i * 37 + 11);
	}
	ck_assert_int_eq(desc_decode(garbage, sizeof(garbage), &out), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(desc_decode(buf, DESC_MAX_BYTES + 1, &out), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(desc_encode(&in, buf, 8), RDMAX_E_RESOURCE_EXHAUSTED);
}
END_TEST

static int encode_with(void (*mutate)(struct remote_desc *), uint8_t *buf, size_t size)
{
	struct remote_desc d = sample_desc();
	mutate(&d);
	return desc_encode(&d, buf, size);
}

static void bad_addr(struct remote_desc *d)
{
	strcpy(d->endpoints[0].addr, "not-an-ip");
}
static void bad_port(struct remote_desc *d)
{
	d->endpoints[0].port = 0;
}
static void bad_access(struct remote_desc *d)
{
	d->access = 0x80;
}

START_TEST(desc_invalid_fields_refused)
{
	void (*mutations[])(struct remote_desc *) = {bad_addr, bad_port, bad_access};
	uint8_t buf[DESC_MAX_BYTES];
	struct remote_desc out;
	for (size_t i = 0; i < sizeof(mutations) / sizeof(mutations[0]); i++) {
		int len = encode_with(mutations[i], buf, sizeof(buf));
		ck_assert_int_gt(len, 0);
		ck_assert_int_eq(desc_decode(buf, (size_t)len, &out), RDMAX_E_INVALID_ARGUMENT);
	}
	/* Wrong version. */
	Rdmax__V1__RegionDesc msg = RDMAX__V1__REGION_DESC__INIT;
	Rdmax__V1__Endpoint ep = RDMAX__V1__ENDPOINT__INIT;
	Rdmax__V1__Endpoint *eps[1] = {&ep};
	ep.addr = "127.0.0.1";
	ep.port = 1;
	msg.version = 2;
	msg.n_endpoints = 1;
	msg.endpoints = eps;
	size_t len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), RDMAX_E_INVALID_ARGUMENT);
	/* No endpoint. */
	msg.version = 1;
	msg.n_endpoints = 0;
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), RDMAX_E_INVALID_ARGUMENT);
	/* Verbs endpoint without rkey. */
	msg.n_endpoints = 1;
	ep.transport = RDMAX__V1__TRANSPORT__TRANSPORT_VERBS;
	ep.device = "rxe0";
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), RDMAX_E_INVALID_ARGUMENT);
	ep.has_rkey = 1;
	ep.has_iova = 1;
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), 0);
}
END_TEST

Suite *desc_suite(void)
{
	Suite *s = suite_create("desc");
	TCase *tc = tcase_create("desc");
	tcase_set_timeout(tc, 5);
	tcase_add_test(tc, desc_round_trip);
	tcase_add_test(tc, desc_truncated_and_garbage_refused);
	tcase_add_test(tc, desc_invalid_fields_refused);
	suite_add_tcase(s, tc);
	return s;
}

/* ------------------------------------------------------------------- imm */

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
	ck_assert_int_eq(imm_expect(&t, &a, 7, 3, false), 0);
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
	ck_assert_int_eq(imm_expect(&t, &b, 7, 1, false), 0);
	ck_assert_int_eq(f.calls, 1);
	imm_landed(&t, &a, 7);
	ck_assert_int_eq(f.calls, 1);
	imm_landed(&t, &b, 7);
	ck_assert_int_eq(f.calls, 2);
	ck_assert_ptr_eq(f.owner, &b);
	ck_assert_int_eq(imm_expect(&t, &a, 7, 0, false), RDMAX_E_INVALID_ARGUMENT);
	/* Reset drops what was counted. */
	ck_assert_uint_eq(imm_count(&t, &a, 7), 2);
	ck_assert_int_eq(imm_expect(&t, &a, 7, 1, true), 0);
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
	ck_assert_int_eq(imm_expect(&t, &a, 0xffffffffu, 5, false), 0);
	ck_assert_int_eq(f.calls, 1);
	ck_assert_uint_eq(f.imm, 0xffffffffu);
	ck_assert_uint_eq(imm_count(&t, &a, 0xffffffffu), 0);
	/* A namespace ends with its client: nothing of it stays counted. */
	imm_landed(&t, &a, 3);
	ck_assert_uint_eq(t.n_counters, 1);
	imm_release_owner(&t, &a);
	ck_assert_uint_eq(t.n_counters, 0);
	ck_assert_uint_eq(imm_count(&t, &a, 3), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 3, 1, false), RDMAX_E_NOT_FOUND);
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
	ck_assert_int_eq(imm_expect(&t, &b, 100, 1, false), 0);
	imm_landed(&t, &b, 100);
	ck_assert_int_eq(f.calls, 1);
	/* A claim in the full share evicts an unclaimed count instead of failing. */
	ck_assert_int_eq(imm_expect(&t, &a, 100, 1, false), 0);
	ck_assert_uint_eq(uid_a, 4);
	ck_assert_int_eq(imm_expect(&t, &a, 50, 1, false), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 51, 1, false), 0);
	ck_assert_int_eq(imm_expect(&t, &a, 52, 1, false), 0);
	/* Only claims left in the uid's share: the next one is refused, in a2 too. */
	ck_assert_int_eq(imm_expect(&t, &a, 53, 1, false), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(imm_expect(&t, &a2, 53, 1, false), RDMAX_E_RESOURCE_EXHAUSTED);
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
