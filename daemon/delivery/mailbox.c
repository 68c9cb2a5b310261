/* SPDX-License-Identifier: MIT */
/*
 * The node's mailboxes: names, their owners and per-client and per-node
 * limits. Owns the name table only; delivering a message to a client is the
 * deliver callback's job (ipc), so this file never does socket I/O, and it
 * never keeps a message: it is handed on or refused at once.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "mailbox.h"
#include "rdmax.h"

struct mailbox {
	struct mailbox *next; /* same hash */
	void *owner;
	uint64_t hash;
	char name[MAILBOX_NAME_MAX + 1];
};

static uint64_t name_hash(const char *name)
{
	return hmap_hash_bytes(name, strlen(name));
}

_Static_assert(offsetof(struct mailbox, next) == 0, "hmap_fini_chains() follows the first member");

static uint64_t owner_key(const void *owner)
{
	return (uint64_t)(uintptr_t)owner;
}

int mailbox_table_init(struct mailbox_table *table, mailbox_deliver_cb deliver)
{
	int ret;

	memset(table, 0, sizeof(*table));
	ret = hmap_init(&table->by_hash, 64);
	if (ret < 0) {
		return ret;
	}
	ret = hmap_init(&table->per_owner, 16);
	if (ret < 0) {
		hmap_fini(&table->by_hash);
		return ret;
	}
	table->deliver = deliver;
	return 0;
}

void mailbox_table_fini(struct mailbox_table *table)
{
	if (!table || !table->by_hash.slots) {
		return;
	}
	hmap_fini_chains(&table->by_hash);
	hmap_fini(&table->per_owner);
	table->count = 0;
}

int mailbox_name_check(const char *name, size_t len)
{
	if (!name || len == 0 || len > MAILBOX_NAME_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < len; i++) {
		if (name[i] <= 0x20 || name[i] >= 0x7f) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	return 0;
}

static struct mailbox *find(const struct mailbox_table *table, const char *name, uint64_t hash)
{
	for (struct mailbox *box = hmap_get(&table->by_hash, hash); box; box = box->next) {
		if (strcmp(box->name, name) == 0) {
			return box;
		}
	}
	return NULL;
}

static uint32_t owner_count(const struct mailbox_table *table, const void *owner)
{
	return hmap_count(&table->per_owner, owner_key(owner));
}

static int set_owner_count(struct mailbox_table *table, const void *owner, uint32_t n)
{
	return hmap_set_count(&table->per_owner, owner_key(owner), n);
}

int mailbox_open(struct mailbox_table *table, void *owner, const char *name)
{
	size_t len = name ? strnlen(name, MAILBOX_NAME_MAX + 1) : 0;
	struct mailbox *box;
	uint64_t hash;
	int ret;

	if (!owner || mailbox_name_check(name, len) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	hash = name_hash(name);
	if (find(table, name, hash)) {
		return RDMAX_E_ALREADY_EXISTS;
	}
	uint32_t mine = owner_count(table, owner);
	if (mine >= MAILBOX_MAX_PER_CLIENT || table->count >= MAILBOX_MAX_PER_NODE) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	box = calloc(1, sizeof(*box));
	if (!box) {
		return -ENOMEM;
	}
	box->owner = owner;
	box->hash = hash;
	memcpy(box->name, name, len);
	ret = set_owner_count(table, owner, mine + 1);
	if (ret < 0) {
		goto out_free;
	}
	box->next = hmap_get(&table->by_hash, hash);
	ret = hmap_put(&table->by_hash, hash, box);
	if (ret < 0) {
		set_owner_count(table, owner, mine);
		goto out_free;
	}
	table->count++;
	return 0;

out_free:
	free(box);
	return ret;
}

static void unlink_box(struct mailbox_table *table, struct mailbox *box)
{
	struct mailbox *head = hmap_get(&table->by_hash, box->hash);

	if (head == box) {
		if (box->next) {
			hmap_put(&table->by_hash, box->hash, box->next); /* replaces: cannot fail */
		} else {
			hmap_del(&table->by_hash, box->hash);
		}
	} else {
		struct mailbox *prev = head;
		while (prev->next != box) {
			prev = prev->next;
		}
		prev->next = box->next;
	}
	set_owner_count(table, box->owner, owner_count(table, box->owner) - 1);
	table->count--;
	free(box);
}

int mailbox_close(struct mailbox_table *table, void *owner, const char *name)
{
	struct mailbox *box;

	if (!name || strnlen(name, MAILBOX_NAME_MAX + 1) > MAILBOX_NAME_MAX) {
		return RDMAX_E_NOT_FOUND;
	}
	box = find(table, name, name_hash(name));
	if (!box || box->owner != owner) {
		return RDMAX_E_NOT_FOUND;
	}
	unlink_box(table, box);
	return 0;
}

void mailbox_release_owner(struct mailbox_table *table, void *owner)
{
	uint32_t n = table && table->by_hash.slots ? owner_count(table, owner) : 0;
	struct mailbox *box;
	size_t iter = 0;

	/* At most MAILBOX_MAX_PER_CLIENT: collect first, the map changes while unlinking. */
	struct mailbox *mine[MAILBOX_MAX_PER_CLIENT];
	uint32_t k = 0;
	while (k < n && k < MAILBOX_MAX_PER_CLIENT &&
	       hmap_next(&table->by_hash, &iter, NULL, (void **)&box)) {
		for (; box && k < MAILBOX_MAX_PER_CLIENT; box = box->next) {
			if (box->owner == owner) {
				mine[k++] = box;
			}
		}
	}
	for (uint32_t i = 0; i < k; i++) {
		unlink_box(table, mine[i]);
	}
}

int mailbox_deliver(struct mailbox_table *table, const char *name, const uint8_t *payload,
		    size_t len, const char *from_node)
{
	size_t name_len = name ? strnlen(name, MAILBOX_NAME_MAX + 1) : 0;
	struct mailbox *box;
	int ret;

	if (mailbox_name_check(name, name_len) < 0 || len > MAILBOX_PAYLOAD_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (!table || !table->by_hash.slots) {
		return RDMAX_E_NOT_FOUND;
	}
	box = find(table, name, name_hash(name));
	if (!box) {
		table->refused++;
		return RDMAX_E_NOT_FOUND;
	}
	ret = table->deliver ? table->deliver(box->owner, box->name, payload, len, from_node) : 0;
	if (ret < 0) {
		table->refused++;
		return ret;
	}
	table->delivered++;
	return 0;
}
