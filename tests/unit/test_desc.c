/* SPDX-License-Identifier: MIT */
/* Unit tests of desc: region descriptors: round trip, truncation, garbage and invalid fields
 * refused. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "desc.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"

Suite *desc_suite(void);

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
	d.endpoints[1].domain = 5;
	d.endpoints[1].domain_token = 0xfeedfacefeedfaceull;
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
	ck_assert_uint_eq(out.endpoints[1].domain, 5);
	ck_assert_uint_eq(out.endpoints[1].domain_token, in.endpoints[1].domain_token);
	ck_assert_uint_eq(out.endpoints[0].domain, 0);
	/* A shared domain leaves the fields out. */
	in.endpoints[1].domain = 0;
	len = desc_encode(&in, buf, sizeof(buf));
	ck_assert_int_gt(len, 0);
	ck_assert_int_eq(desc_decode(buf, (size_t)len, &out), 0);
	ck_assert_uint_eq(out.endpoints[1].domain, 0);
	ck_assert_uint_eq(out.endpoints[1].domain_token, 0);
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
	/* A protection domain needs its token, a number in 1..2^24-1, and a verbs endpoint. */
	ep.has_domain = 1;
	ep.domain = 3;
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), RDMAX_E_INVALID_ARGUMENT);
	ep.has_domain_token = 1;
	ep.domain_token = 99;
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), 0);
	ck_assert_uint_eq(out.endpoints[0].domain, 3);
	ep.domain = 0;
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), RDMAX_E_INVALID_ARGUMENT);
	ep.domain = DESC_DOMAIN_MAX + 1;
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), RDMAX_E_INVALID_ARGUMENT);
	ep.domain = 3;
	ep.transport = RDMAX__V1__TRANSPORT__TRANSPORT_TCP;
	len = rdmax__v1__region_desc__pack(&msg, buf);
	ck_assert_int_eq(desc_decode(buf, len, &out), RDMAX_E_INVALID_ARGUMENT);
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
