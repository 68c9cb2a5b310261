/* SPDX-License-Identifier: MIT */
/*
 * Immediate counters: per-client namespaces of counts of landed jobs by imm
 * value, and the client's claims on them. Pure bookkeeping, driven by the
 * transports and the engine (a job landed in a region of some client) and
 * by client requests (expect, disconnect). Never trusts a landing to name
 * its namespace: the caller passes the owner of the region it validated.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "imm.h"
#include "log.h"
#include "rdmax.h"
#include "util.h"

struct imm_counter {
	uint64_t landed;   /* landings not yet consumed by a fired expectation */
	uint64_t expected; /* 0: nobody waits */
	uint64_t last_ms;  /* last landing or claim */
	bool standing;     /* the claim stays after it fires */
};

struct imm_space {
	void *owner;
	struct hmap counters; /* imm+1 -> struct imm_counter */
	uint32_t *uid_counters;
	uint32_t uid_max;
	uint64_t swept_ms; /* last eviction sweep */
};

static uint64_t imm_key(uint32_t imm)
{
	return (uint64_t)imm + 1; /* 0 is the map's empty key */
}

static uint64_t owner_key(const void *owner)
{
	return (uint64_t)(uintptr_t)owner;
}

int imm_table_init(struct imm_table *table, uint32_t max_counters, imm_fired_cb fired, void *arg)
{
	table->max_counters = max_counters;
	table->n_counters = 0;
	table->fired = fired;
	table->fired_arg = arg;
	table->dropped = 0;
	return hmap_init(&table->spaces, 16);
}

static void space_free(struct imm_table *table, struct imm_space *space)
{
	struct imm_counter *counter;
	size_t iter = 0;

	while (hmap_next(&space->counters, &iter, NULL, (void **)&counter)) {
		free(counter);
	}
	table->n_counters -= (uint32_t)space->counters.count;
	if (space->uid_counters) {
		*space->uid_counters -= (uint32_t)space->counters.count;
	}
	hmap_fini(&space->counters);
	free(space);
}

void imm_table_fini(struct imm_table *table)
{
	struct imm_space *space;
	size_t iter = 0;

	while (hmap_next(&table->spaces, &iter, NULL, (void **)&space)) {
		space_free(table, space);
	}
	hmap_fini(&table->spaces);
}

int imm_space_open(struct imm_table *table, void *owner, uint32_t *uid_counters, uint32_t uid_max)
{
	struct imm_space *space;

	if (!owner || hmap_get(&table->spaces, owner_key(owner))) {
		return -EEXIST;
	}
	space = calloc(1, sizeof(*space));
	if (!space) {
		return -ENOMEM;
	}
	space->owner = owner;
	space->uid_counters = uid_counters;
	space->uid_max = uid_max;
	if (hmap_init(&space->counters, 16) < 0) {
		free(space);
		return -ENOMEM;
	}
	if (hmap_put(&table->spaces, owner_key(owner), space) < 0) {
		hmap_fini(&space->counters);
		free(space);
		return -ENOMEM;
	}
	return 0;
}

static void counter_del(struct imm_table *table, struct imm_space *space, uint64_t key,
			struct imm_counter *counter)
{
	hmap_del(&space->counters, key);
	free(counter);
	table->n_counters--;
	if (space->uid_counters) {
		(*space->uid_counters)--;
	}
}

static bool room(const struct imm_table *table, const struct imm_space *space)
{
	return table->n_counters < table->max_counters &&
	       (!space->uid_counters || *space->uid_counters < space->uid_max);
}

/*
 * Make room in a full share by evicting unclaimed counters of this
 * namespace: those idle for IMM_IDLE_EVICT_MS (at most one sweep a second,
 * for landings), or any one of them (for a claim, which must not be locked
 * out by counts nobody asked for).
 */
static void evict(struct imm_table *table, struct imm_space *space, bool for_claim)
{
	uint64_t now = now_ms(), key;
	struct imm_counter *counter;
	size_t iter = 0;

	if (!for_claim && now - space->swept_ms < 1000) {
		return;
	}
	space->swept_ms = now;
	while (hmap_next(&space->counters, &iter, &key, (void **)&counter)) {
		if (counter->expected != 0) {
			continue;
		}
		if (for_claim || now - counter->last_ms >= IMM_IDLE_EVICT_MS) {
			counter_del(table, space, key,
				    counter); /* a tombstone: iteration goes on */
			if (for_claim) {
				return;
			}
		}
	}
}

static struct imm_counter *counter_get(struct imm_table *table, struct imm_space *space,
				       uint32_t imm, bool for_claim)
{
	struct imm_counter *counter = hmap_get(&space->counters, imm_key(imm));

	if (counter) {
		return counter;
	}
	if (!room(table, space)) {
		evict(table, space, for_claim);
		if (!room(table, space)) {
			return NULL;
		}
	}
	counter = calloc(1, sizeof(*counter));
	if (!counter) {
		return NULL;
	}
	if (hmap_put(&space->counters, imm_key(imm), counter) < 0) {
		free(counter);
		return NULL;
	}
	table->n_counters++;
	if (space->uid_counters) {
		(*space->uid_counters)++;
	}
	return counter;
}

/*
 * Fire when enough landed. A one-shot claim ends; a standing one consumes
 * every whole multiple of its count in one firing (more than one only when
 * the claim found landings already counted) and stays. The counter goes when
 * nothing is left in it; the callback comes last, with the table consistent.
 */
static void check_fire(struct imm_table *table, struct imm_space *space, uint32_t imm,
		       struct imm_counter *counter)
{
	if (counter->expected == 0 || counter->landed < counter->expected) {
		return;
	}
	uint64_t count = counter->expected;
	if (counter->standing) {
		count *= counter->landed / counter->expected;
	} else {
		counter->expected = 0;
	}
	counter->landed -= count;
	if (counter->landed == 0 && counter->expected == 0) {
		counter_del(table, space, imm_key(imm), counter);
	}
	table->fired(space->owner, imm, count, table->fired_arg);
}

int imm_expect(struct imm_table *table, void *owner, uint32_t imm, uint64_t count,
	       unsigned int flags)
{
	struct imm_space *space = owner ? hmap_get(&table->spaces, owner_key(owner)) : NULL;
	struct imm_counter *counter;

	if (count == 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (!space) {
		return RDMAX_E_NOT_FOUND;
	}
	counter = counter_get(table, space, imm, true);
	if (!counter) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	if (flags & IMM_RESET) {
		counter->landed = 0;
	}
	counter->expected = count;
	counter->standing = flags & IMM_STANDING;
	counter->last_ms = now_ms();
	check_fire(table, space, imm, counter);
	return 0;
}

int imm_release(struct imm_table *table, void *owner, uint32_t imm)
{
	struct imm_space *space = owner ? hmap_get(&table->spaces, owner_key(owner)) : NULL;
	struct imm_counter *counter = space ? hmap_get(&space->counters, imm_key(imm)) : NULL;

	if (!counter || counter->expected == 0) {
		return RDMAX_E_NOT_FOUND;
	}
	counter->expected = 0;
	counter->standing = false;
	counter->last_ms = now_ms();
	if (counter->landed == 0) {
		counter_del(table, space, imm_key(imm), counter);
	}
	return 0;
}

void imm_landed(struct imm_table *table, void *owner, uint32_t imm)
{
	struct imm_space *space = owner ? hmap_get(&table->spaces, owner_key(owner)) : NULL;
	struct imm_counter *counter = space ? counter_get(table, space, imm, false) : NULL;

	if (!counter) {
		static struct log_ratelimit rl;
		table->dropped++;
		log_ratelimited(&rl, LOG_WARNING, "landing of imm %u not counted: %s", imm,
				space ? "the client's share of imm counters is full ([limits] "
					"per_uid_imm_counters, max_imm_counters)"
				      : "the region's client is gone");
		return;
	}
	counter->landed++;
	counter->last_ms = now_ms();
	check_fire(table, space, imm, counter);
}

void imm_release_owner(struct imm_table *table, void *owner)
{
	struct imm_space *space = owner ? hmap_del(&table->spaces, owner_key(owner)) : NULL;

	if (space) {
		space_free(table, space);
	}
}

uint64_t imm_count(const struct imm_table *table, void *owner, uint32_t imm)
{
	struct imm_space *space = owner ? hmap_get(&table->spaces, owner_key(owner)) : NULL;
	struct imm_counter *counter = space ? hmap_get(&space->counters, imm_key(imm)) : NULL;

	return counter ? counter->landed : 0;
}
