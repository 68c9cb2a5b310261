/* SPDX-License-Identifier: MIT */
/*
 * The one unit-test runner. Each module's suite is a weak symbol so a suite
 * file can be added without touching this list's users; the list below is
 * the whole set and a missing suite is reported, not silently skipped.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#define SUITES(X)                                                                                  \
	X(hmap)                                                                                    \
	X(status)                                                                                  \
	X(config)                                                                                  \
	X(log)                                                                                     \
	X(desc)                                                                                    \
	X(imm)                                                                                     \
	X(region)                                                                                  \
	X(framing)                                                                                 \
	X(validate)                                                                                \
	X(wire)                                                                                    \
	X(auth)                                                                                    \
	X(client)                                                                                  \
	X(conn)                                                                                    \
	X(sq_plan)                                                                                 \
	X(post_thread)                                                                             \
	X(verbs_msg)                                                                               \
	X(planner_jobs)                                                                            \
	X(ops)                                                                                     \
	X(gpu)                                                                                     \
	X(ring)                                                                                    \
	X(names)                                                                                   \
	X(ipc)                                                                                     \
	X(qos)                                                                                     \
	X(spin_yield)                                                                              \
	X(loop_wake)                                                                               \
	X(cpu_affinity)

#define DECLARE(name) extern Suite *name##_suite(void) __attribute__((weak));
SUITES(DECLARE)

int main(void)
{
	SRunner *runner = srunner_create(NULL);
	int missing = 0;

#define ADD(name)                                                                                  \
	if (name##_suite) {                                                                        \
		srunner_add_suite(runner, name##_suite());                                         \
	} else {                                                                                   \
		fprintf(stderr, "unit-tests: suite '%s' is not built\n", #name);                   \
		missing++;                                                                         \
	}
	SUITES(ADD)

	srunner_run_all(runner, CK_NORMAL);
	int failed = srunner_ntests_failed(runner);
	srunner_free(runner);
	return failed == 0 && missing == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
