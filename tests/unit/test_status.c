/* SPDX-License-Identifier: MIT */
/* Unit tests of status: the one mapping between error codes and the protocol's Status. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "status.h"

Suite *status_suite(void);

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
