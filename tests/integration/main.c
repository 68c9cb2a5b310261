/* SPDX-License-Identifier: MIT */
/*
 * The integration-test runner: one check suite, one TCase per scenario, each
 * test in its own forked process with its own daemons. CK_RUN_CASE=name runs
 * one scenario; CK_VERBOSITY=verbose prints each test as it ends.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

int main(void)
{
	TCase *(*const cases[])(void) = {
		itest_tcase_transfer,
		itest_tcase_concurrency,
		itest_tcase_imm,
		itest_tcase_errors,
		itest_tcase_raw,
		itest_tcase_client_kill,
		itest_tcase_peer_kill,
		itest_tcase_shutdown,
		itest_tcase_same_node,
		itest_tcase_dereg_wait,
		itest_tcase_jobs,
		itest_tcase_verbs,
		itest_tcase_verbs_isolation,
		itest_tcase_ring,
		itest_tcase_paged_read,
		itest_tcase_harden,
		itest_tcase_peer,
		itest_tcase_names,
		itest_tcase_discovery,
		itest_tcase_multipair,
		itest_tcase_tls,
		itest_tcase_qos,
		itest_tcase_mailbox,
	};
	char binary[512];

	snprintf(binary, sizeof(binary), "%s/rdmaxd",
		 getenv("RDMAX_BUILD") ? getenv("RDMAX_BUILD") : "build");
	if (access(binary, X_OK) != 0) {
		fprintf(stderr, "itest: no daemon at '%s' (set RDMAX_BUILD to the build folder)\n",
			binary);
		return EXIT_FAILURE;
	}
	fprintf(stderr, "itest: daemon %s, transport %s, addresses %s and %s, scale %g\n", binary,
		itest_transport(), itest_addr_a(), itest_addr_b(), itest_scale());
	itest_run_dir_init();

	Suite *suite = suite_create("integration");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = cases[i]();
		if (!tc) {
			continue; /* the case does not apply to this transport */
		}
		/* Runs in this process after the case's tests: reports what failures left. */
		tcase_add_unchecked_fixture(tc, NULL, itest_report_leftovers);
		suite_add_tcase(suite, tc);
	}
	SRunner *runner = srunner_create(suite);
	/* Each test must be its own process: daemons die with it (PR_SET_PDEATHSIG). */
	srunner_set_fork_status(runner, CK_FORK);
	srunner_run_all(runner, CK_ENV);
	int failed = srunner_ntests_failed(runner);
	srunner_free(runner);
	itest_run_dir_fini();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
