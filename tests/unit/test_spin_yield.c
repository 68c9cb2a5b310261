/* SPDX-License-Identifier: MIT */
/*
 * The daemon spin's yield rule (spin_yield.h): how many empty passes in a
 * row it waits before sched_yield(), learnt from what its passes cost and
 * from whether its yields ran anyone.
 */
#include <check.h>

#include "spin_yield.h"

Suite *spin_yield_suite(void);

/* Empty passes until spin_yield_due() says yield, at most limit. */
static uint32_t empty_passes_to_yield(struct spin_yield *y, uint32_t limit)
{
	for (uint32_t n = 1; n <= limit; n++) {
		if (spin_yield_due(y, false)) {
			return n;
		}
	}
	return 0;
}

START_TEST(spin_yield_host_waits_the_most_passes)
{
	struct spin_yield y;

	spin_yield_init(&y);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), SPIN_YIELD_MAX); /* nothing learnt yet */
	spin_yield_learn(&y, 16 * 50, 16); /* 50 ns a pass: 80 would fit 4 us, capped */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), SPIN_YIELD_MAX);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), SPIN_YIELD_MAX); /* and again */
}
END_TEST

START_TEST(spin_yield_follows_the_cost_of_a_pass)
{
	struct spin_yield y;

	spin_yield_init(&y);
	spin_yield_learn(&y, 16 * 200, 16); /* 200 ns a pass: 20 passes make 4 us */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), 20);
	spin_yield_learn(&y, 16 * 3000, 16); /* an emulator: 3 us a pass */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), 1);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), 1);
	spin_yield_learn(&y, 16 * 9000, 16); /* slower still: never less than one pass */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), 1);
	spin_yield_learn(&y, 0, 16); /* a clock too coarse to tell: the host's rule */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), SPIN_YIELD_MAX);
	spin_yield_learn(&y, 10, 16); /* under a nanosecond a pass: the same */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), SPIN_YIELD_MAX);
	spin_yield_learn(&y, 5000, 0); /* no passes counted */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), SPIN_YIELD_MAX);
}
END_TEST

START_TEST(spin_yield_counts_empty_passes_in_a_row)
{
	struct spin_yield y;

	spin_yield_init(&y);
	spin_yield_learn(&y, 16 * 400, 16); /* 10 passes */
	for (int i = 0; i < 9; i++) {
		ck_assert(!spin_yield_due(&y, false));
	}
	ck_assert(!spin_yield_due(&y, true)); /* a pass that moved starts the count again */
	ck_assert(!spin_yield_due(&y, true));
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), 10);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 1000), 10); /* a yield starts it again too */
}
END_TEST

START_TEST(spin_yield_backs_off_while_no_one_runs)
{
	struct spin_yield y;

	spin_yield_init(&y);
	spin_yield_learn(&y, 16 * 400, 16); /* 10 passes */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 10);
	spin_yield_done(&y, 300); /* the system call alone: no one ran */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 20);
	spin_yield_done(&y, 400); /* as cheap, give or take: no one ran again */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 40);
	for (int i = 0; i < 10; i++) {
		spin_yield_done(&y, 300);
	}
	ck_assert_uint_eq(empty_passes_to_yield(&y, 100000), 10 * SPIN_YIELD_BACKOFF_MAX);
	/* Longer than twice the cheapest and SPIN_YIELD_RAN_NS: another task ran. */
	spin_yield_done(&y, 2 * 300 + SPIN_YIELD_RAN_NS + 1);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 10);
	spin_yield_done(&y, 2 * 300 + SPIN_YIELD_RAN_NS); /* not longer: no one */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 20);
}
END_TEST

START_TEST(spin_yield_learns_without_the_yields)
{
	struct spin_yield y;

	spin_yield_init(&y);
	spin_yield_done(&y, 3000);
	spin_yield_done(&y, 3000);
	/* 16 passes in 16 * 250 + 6000 ns, 6000 of them in two yields: 250 ns a pass. */
	spin_yield_learn(&y, 16 * 250 + 6000, 16);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 16 * 4); /* back-off 4 after two */
	/* The yields were counted once: the next window is the passes' own. */
	spin_yield_learn(&y, 16 * 1000, 16);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 4 * 4);
	spin_yield_done(&y, 50000); /* longer than the window it falls in: no pass cost left */
	spin_yield_learn(&y, 20000, 16);
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), SPIN_YIELD_MAX);
}
END_TEST

START_TEST(spin_yield_cheapest_yield_is_the_measure)
{
	struct spin_yield y;

	spin_yield_init(&y);
	spin_yield_learn(&y, 16 * 2000, 16); /* an emulator: 2 passes make 4 us */
	spin_yield_done(&y, 50000);          /* the first yield has only itself to go by: no one */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 4);
	spin_yield_done(&y, 3000); /* a cheaper one: the system call under the emulator */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 8);
	spin_yield_done(&y, 2 * 3000 + SPIN_YIELD_RAN_NS + 1); /* measured by the cheaper */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 2);
	spin_yield_done(&y, 0); /* a clock too coarse to tell: no one ran */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 4);
	spin_yield_done(&y, SPIN_YIELD_RAN_NS + 3); /* beyond twice the new cheapest (1 ns) */
	ck_assert_uint_eq(empty_passes_to_yield(&y, 10000), 2);
}
END_TEST

Suite *spin_yield_suite(void)
{
	Suite *s = suite_create("spin_yield");
	TCase *tc = tcase_create("spin_yield");

	tcase_add_test(tc, spin_yield_host_waits_the_most_passes);
	tcase_add_test(tc, spin_yield_follows_the_cost_of_a_pass);
	tcase_add_test(tc, spin_yield_counts_empty_passes_in_a_row);
	tcase_add_test(tc, spin_yield_backs_off_while_no_one_runs);
	tcase_add_test(tc, spin_yield_cheapest_yield_is_the_measure);
	tcase_add_test(tc, spin_yield_learns_without_the_yields);
	suite_add_tcase(s, tc);
	return s;
}
