/* SPDX-License-Identifier: MIT */
/*
 * Mailboxes: endpoints on this node for SEND jobs. A client opens a mailbox
 * by name in its uid's namespace: the mailbox is known by its scoped name
 * "<uid>:<name>", so two uids never compete for a name, and gets a random
 * 64-bit key. A message names the scoped name and the key (both travel in
 * the mailbox's address); only a message with the right key is handed to
 * the owner, through the table's deliver callback.
 */
#ifndef RDMAXD_MAILBOX_H
#define RDMAXD_MAILBOX_H

#include <stddef.h>
#include <stdint.h>

#include "owned_names.h"

#define MAILBOX_NAME_MAX       64           /* bytes of a name (printable ASCII, no space) */
#define MAILBOX_PAYLOAD_MAX    (64u * 1024) /* bytes of one message */
#define MAILBOX_MAX_PER_CLIENT 64           /* mailboxes one client may hold open */
#define MAILBOX_MAX_PER_NODE   4096         /* mailboxes open on this node */
/* Bytes of a scoped name "<uid>:<name>": up to 10 digits, ':', the name. */
#define MAILBOX_ADDR_NAME_MAX (MAILBOX_NAME_MAX + 11)

/*
 * Hand a message to the owner of a mailbox. Returns 0, or an error the sender
 * sees (e.g. RDMAX_E_RESOURCE_EXHAUSTED when the owner does not keep up).
 */
typedef int (*mailbox_deliver_cb)(void *owner, const char *name, const uint8_t *payload, size_t len,
				  const char *from_node);

/* What one open mailbox gives its opener. */
struct mailbox_ref {
	char scoped[MAILBOX_ADDR_NAME_MAX + 1]; /* "<uid>:<name>" */
	uint64_t key;                           /* random, never 0 */
};

struct mailbox_table {
	struct owned_names owned; /* struct mailbox chains; owner -> number of its mailboxes */
	uint32_t count;
	mailbox_deliver_cb deliver;
	uint64_t delivered; /* messages handed to an owner */
	uint64_t refused;   /* messages for a missing mailbox, with a wrong key, or refused */
};

int mailbox_table_init(struct mailbox_table *table, mailbox_deliver_cb deliver);
/* Free every mailbox. Accepts a table that was never initialised (zeroed). */
void mailbox_table_fini(struct mailbox_table *table);

/* 0 for a usable name (or scoped name) of len bytes, else RDMAX_E_INVALID_ARGUMENT. */
int mailbox_name_check(const char *name, size_t len);
int mailbox_scoped_check(const char *scoped, size_t len);

/*
 * Write the scoped name of (uid, name) into buf (MAILBOX_ADDR_NAME_MAX + 1
 * bytes). 0, or RDMAX_E_INVALID_ARGUMENT for a bad name.
 */
int mailbox_scope(uint32_t uid, const char *name, char *buf, size_t size);

/*
 * Open mailbox `name` in uid's namespace for owner, counted in *uid_open
 * (the uid's open mailboxes, at most uid_limit; it must outlive the mailbox).
 * Errors: RDMAX_E_INVALID_ARGUMENT (bad name), RDMAX_E_ALREADY_EXISTS (open
 * in this uid's namespace), RDMAX_E_RESOURCE_EXHAUSTED (per-client, per-uid
 * or per-node limit), -ENOMEM. The scoped name and key go to *ret_ref.
 */
int mailbox_open(struct mailbox_table *table, void *owner, uint32_t uid, const char *name,
		 uint32_t *uid_open, uint32_t uid_limit, struct mailbox_ref *ret_ref);

/* Close owner's mailbox; RDMAX_E_NOT_FOUND when owner holds none by that name. */
int mailbox_close(struct mailbox_table *table, void *owner, uint32_t uid, const char *name);

/* Close every mailbox of owner (the client left). */
void mailbox_release_owner(struct mailbox_table *table, void *owner);

/*
 * Deliver a message to the mailbox of scoped name `scoped` whose key is
 * `key`. RDMAX_E_NOT_FOUND when no such mailbox is open, when the key does
 * not match (the same answer, so keys cannot be probed; compared in
 * constant time) or when the table is NULL; RDMAX_E_INVALID_ARGUMENT for a
 * bad name or oversized payload, otherwise what the deliver callback
 * returned.
 */
int mailbox_deliver(struct mailbox_table *table, const char *scoped, uint64_t key,
		    const uint8_t *payload, size_t len, const char *from_node);

#endif
