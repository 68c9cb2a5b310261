/* SPDX-License-Identifier: MIT */
/*
 * The node's mailboxes: scoped names ("<uid>:<name>"), their keys, owners
 * and per-client, per-uid and per-node limits. Owns the name table only;
 * delivering a message to a client is the deliver callback's job (ipc), so
 * this file never does socket I/O, and it never keeps a message: it is
 * handed on or refused at once. A message without the mailbox's key is
 * answered exactly like one for a mailbox that does not exist.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mailbox.h"
#include "rdmax.h"
#include "util.h"

struct mailbox {
	struct owned_name link; /* owner: the client, as mailbox_open() was handed it */
	char scoped[MAILBOX_ADDR_NAME_MAX + 1];
	const char *name;   /* the part after "<uid>:", inside scoped */
	uint64_t key;       /* random, never 0 */
	uint32_t *uid_open; /* the uid's count of open mailboxes */
};

static uint64_t name_hash(const char *name)
{
	return hmap_hash_bytes(name, strlen(name));
}

_Static_assert(offsetof(struct mailbox, link) == 0, "an owned_name chain links the whole entry");

int mailbox_table_init(struct mailbox_table *table, mailbox_deliver_cb deliver)
{
	int ret;

	memset(table, 0, sizeof(*table));
	ret = owned_names_init(&table->owned);
	if (ret < 0) {
		return ret;
	}
	table->deliver = deliver;
	return 0;
}

void mailbox_table_fini(struct mailbox_table *table)
{
	if (!table || !table->owned.by_hash.slots) {
		return;
	}
	owned_names_fini(&table->owned);
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

int mailbox_scoped_check(const char *scoped, size_t len)
{
	return len <= MAILBOX_ADDR_NAME_MAX ? mailbox_name_check(scoped, len)
					    : RDMAX_E_INVALID_ARGUMENT;
}

int mailbox_scope(uint32_t uid, const char *name, char *buf, size_t size)
{
	size_t len = name ? strnlen(name, MAILBOX_NAME_MAX + 1) : 0;

	if (mailbox_name_check(name, len) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	int n = snprintf(buf, size, "%u:%s", (unsigned)uid, name);
	return n > 0 && (size_t)n < size ? 0 : RDMAX_E_INVALID_ARGUMENT;
}

/* Equal keys, in time that does not depend on where they differ. */
static bool key_equal(uint64_t a, uint64_t b)
{
	volatile uint64_t diff = a ^ b;
	uint64_t d = diff;

	d |= d >> 32;
	d |= d >> 16;
	d |= d >> 8;
	return (d & 0xff) == 0;
}

static struct mailbox *find(const struct mailbox_table *table, const char *name, uint64_t hash)
{
	for (struct owned_name *l = owned_names_chain(&table->owned, hash); l; l = l->next) {
		struct mailbox *box = (struct mailbox *)l;
		if (strcmp(box->scoped, name) == 0) {
			return box;
		}
	}
	return NULL;
}

int mailbox_open(struct mailbox_table *table, void *owner, uint32_t uid, const char *name,
		 uint32_t *uid_open, uint32_t uid_limit, struct mailbox_ref *ret_ref)
{
	char scoped[MAILBOX_ADDR_NAME_MAX + 1];
	struct mailbox *box;
	uint64_t hash;
	int ret;

	if (!owner || !uid_open || mailbox_scope(uid, name, scoped, sizeof(scoped)) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	hash = name_hash(scoped);
	if (find(table, scoped, hash)) {
		return RDMAX_E_ALREADY_EXISTS;
	}
	uint32_t mine = owned_names_owner_count(&table->owned, owner);
	if (mine >= MAILBOX_MAX_PER_CLIENT || *uid_open >= uid_limit ||
	    table->count >= MAILBOX_MAX_PER_NODE) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	box = calloc(1, sizeof(*box));
	if (!box) {
		return -ENOMEM;
	}
	box->link.owner = owner;
	box->link.hash = hash;
	memcpy(box->scoped, scoped, sizeof(scoped));
	box->name = strchr(box->scoped, ':') + 1;
	do {
		box->key = random_u64();
	} while (box->key == 0);
	box->uid_open = uid_open;
	ret = owned_names_link(&table->owned, &box->link);
	if (ret < 0) {
		free(box);
		return ret;
	}
	table->count++;
	(*uid_open)++;
	memcpy(ret_ref->scoped, box->scoped, sizeof(ret_ref->scoped));
	ret_ref->key = box->key;
	return 0;
}

static void unlink_box(struct mailbox_table *table, struct mailbox *box)
{
	owned_names_unlink(&table->owned, &box->link);
	table->count--;
	(*box->uid_open)--;
	free(box);
}

int mailbox_close(struct mailbox_table *table, void *owner, uint32_t uid, const char *name)
{
	char scoped[MAILBOX_ADDR_NAME_MAX + 1];
	struct mailbox *box;

	if (mailbox_scope(uid, name, scoped, sizeof(scoped)) < 0) {
		return RDMAX_E_NOT_FOUND;
	}
	box = find(table, scoped, name_hash(scoped));
	if (!box || box->link.owner != owner) {
		return RDMAX_E_NOT_FOUND;
	}
	unlink_box(table, box);
	return 0;
}

void mailbox_release_owner(struct mailbox_table *table, void *owner)
{
	uint32_t n = table && table->owned.by_hash.slots
			     ? owned_names_owner_count(&table->owned, owner)
			     : 0;
	struct owned_name *l;
	size_t iter = 0;

	/* At most MAILBOX_MAX_PER_CLIENT: collect first, the map changes while unlinking. */
	struct mailbox *mine[MAILBOX_MAX_PER_CLIENT];
	uint32_t k = 0;
	while (k < n && k < MAILBOX_MAX_PER_CLIENT &&
	       hmap_next(&table->owned.by_hash, &iter, NULL, (void **)&l)) {
		for (; l && k < MAILBOX_MAX_PER_CLIENT; l = l->next) {
			if (l->owner == owner) {
				mine[k++] = (struct mailbox *)l;
			}
		}
	}
	for (uint32_t i = 0; i < k; i++) {
		unlink_box(table, mine[i]);
	}
}

int mailbox_deliver(struct mailbox_table *table, const char *scoped, uint64_t key,
		    const uint8_t *payload, size_t len, const char *from_node)
{
	size_t name_len = scoped ? strnlen(scoped, MAILBOX_ADDR_NAME_MAX + 1) : 0;
	struct mailbox *box;
	int ret;

	if (mailbox_scoped_check(scoped, name_len) < 0 || len > MAILBOX_PAYLOAD_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (!table || !table->owned.by_hash.slots) {
		return RDMAX_E_NOT_FOUND;
	}
	box = find(table, scoped, name_hash(scoped));
	/* A wrong key reads like no mailbox: keys cannot be told apart from names by probing. */
	if (!box || !key_equal(box->key, key)) {
		table->refused++;
		return RDMAX_E_NOT_FOUND;
	}
	ret = table->deliver
		      ? table->deliver((void *)box->link.owner, box->name, payload, len, from_node)
		      : 0;
	if (ret < 0) {
		table->refused++;
		return ret;
	}
	table->delivered++;
	return 0;
}
