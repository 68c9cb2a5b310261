/* SPDX-License-Identifier: MIT */
/*
 * Immediate counters: per-node counts of landed jobs by imm value, and the
 * clients' claims on them. Pure bookkeeping, driven by the transports (a job
 * landed) and by client requests (expect, disconnect).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "imm.h"
#include "log.h"
#include "rdmax.h"

struct imm_counter {
	uint64_t landed;   /* landings not yet consumed by a fired expectation */
	uint64_t expected; /* 0: nobody waits */
	void *owner;       /* claiming client, or NULL */
};

static uint64_t imm_key(uint32_t imm)
{
	return (uint64_t)imm + 1; /* 0 is the map's empty key */
}

int imm_table_init(struct imm_table *table, uint32_t max_counters, imm_fired_cb fired, void *arg)
{
	table->max_counters = max_counters;
	table->fired = fired;
	table->fired_arg = arg;
	table->dropped = 0;
	return hmap_init(&table->counters, 64);
}

void imm_table_fini(struct imm_table *table)
{
	struct imm_counter *counter;
	size_t iter = 0;

	while (hmap_next(&table->counters, &iter, NULL, (void **)&counter)) {
		free(counter);
	}
	hmap_fini(&table->counters);
}

static struct imm_counter *counter_get(struct imm_table *table, uint32_t imm, bool create)
{
	struct imm_counter *counter = hmap_get(&table->counters, imm_key(imm));

	if (counter || !create) {
		return counter;
	}
	if (table->counters.count >= table->max_counters) {
		return NULL;
	}
	counter = calloc(1, sizeof(*counter));
	if (!counter) {
		return NULL;
	}
	if (hmap_put(&table->counters, imm_key(imm), counter) < 0) {
		free(counter);
		return NULL;
	}
	return counter;
}

static void counter_maybe_free(struct imm_table *table, uint32_t imm, struct imm_counter *counter)
{
	if (counter->landed == 0 && counter->owner == NULL) {
		hmap_del(&table->counters, imm_key(imm));
		free(counter);
	}
}

/* Fire when enough landed; the claim stays with its owner for the next expect. */
static void check_fire(struct imm_table *table, uint32_t imm, struct imm_counter *counter)
{
	if (counter->expected == 0 || counter->landed < counter->expected) {
		return;
	}
	uint64_t count = counter->expected;
	counter->landed -= count;
	counter->expected = 0;
	table->fired(counter->owner, imm, count, table->fired_arg);
}

int imm_expect(struct imm_table *table, void *owner, uint32_t imm, uint64_t count)
{
	struct imm_counter *counter;

	if (count == 0 || owner == NULL) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	counter = counter_get(table, imm, true);
	if (!counter) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	if (counter->owner && counter->owner != owner) {
		return RDMAX_E_ALREADY_EXISTS;
	}
	counter->owner = owner;
	counter->expected = count;
	check_fire(table, imm, counter);
	return 0;
}

void imm_landed(struct imm_table *table, uint32_t imm)
{
	struct imm_counter *counter = counter_get(table, imm, true);

	if (!counter) {
		static struct log_ratelimit rl;
		table->dropped++;
		log_ratelimited(&rl, LOG_WARNING,
				"imm counter table full (%u values): landing of imm %u not counted",
				table->max_counters, imm);
		return;
	}
	counter->landed++;
	check_fire(table, imm, counter);
}

void imm_release_owner(struct imm_table *table, void *owner)
{
	struct imm_counter *counter;
	uint64_t key;
	size_t iter = 0;

	while (hmap_next(&table->counters, &iter, &key, (void **)&counter)) {
		if (counter->owner == owner) {
			counter->owner = NULL;
			counter->expected = 0;
			counter_maybe_free(table, (uint32_t)(key - 1), counter);
		}
	}
}

uint64_t imm_count(const struct imm_table *table, uint32_t imm)
{
	struct imm_counter *counter = hmap_get(&table->counters, imm_key(imm));

	return counter ? counter->landed : 0;
}
