/* SPDX-License-Identifier: MIT */
/*
 * Mailboxes: named endpoints on this node for SEND jobs. A client opens a
 * mailbox by name (unique per node); messages sent to (node, name) by any
 * peer, or by a client of this node, are handed to the owner through the
 * table's deliver callback.
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

/*
 * Hand a message to the owner of a mailbox. Returns 0, or an error the sender
 * sees (e.g. RDMAX_E_RESOURCE_EXHAUSTED when the owner does not keep up).
 */
typedef int (*mailbox_deliver_cb)(void *owner, const char *name, const uint8_t *payload, size_t len,
				  const char *from_node);

struct mailbox_table {
	struct owned_names owned; /* struct mailbox chains; owner -> number of its mailboxes */
	uint32_t count;
	mailbox_deliver_cb deliver;
	uint64_t delivered; /* messages handed to an owner */
	uint64_t refused;   /* messages for a missing mailbox or refused by the owner */
};

int mailbox_table_init(struct mailbox_table *table, mailbox_deliver_cb deliver);
/* Free every mailbox. Accepts a table that was never initialised (zeroed). */
void mailbox_table_fini(struct mailbox_table *table);

/* 0 for a usable name of len bytes, else RDMAX_E_INVALID_ARGUMENT. */
int mailbox_name_check(const char *name, size_t len);

/*
 * Open a mailbox for owner. Errors: RDMAX_E_INVALID_ARGUMENT (bad name),
 * RDMAX_E_ALREADY_EXISTS (open on this node, by anyone),
 * RDMAX_E_RESOURCE_EXHAUSTED (per-client or per-node limit), -ENOMEM.
 */
int mailbox_open(struct mailbox_table *table, void *owner, const char *name);

/* Close owner's mailbox; RDMAX_E_NOT_FOUND when owner holds none by that name. */
int mailbox_close(struct mailbox_table *table, void *owner, const char *name);

/* Close every mailbox of owner (the client left). */
void mailbox_release_owner(struct mailbox_table *table, void *owner);

/*
 * Deliver a message. RDMAX_E_NOT_FOUND when no such mailbox is open (or the
 * table is NULL), RDMAX_E_INVALID_ARGUMENT for a bad name or oversized
 * payload, otherwise what the deliver callback returned.
 */
int mailbox_deliver(struct mailbox_table *table, const char *name, const uint8_t *payload,
		    size_t len, const char *from_node);

#endif
