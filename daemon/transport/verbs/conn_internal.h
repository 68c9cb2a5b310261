/* SPDX-License-Identifier: MIT */
/*
 * Private to conn.c and conn_events.c: the steps of the connection state
 * machine that both the table's logic and the rdma_cm event handling take.
 * Nothing outside daemon/transport/verbs/ includes it; it names conn.h's
 * types without including it (conn.h is the module's own header).
 */
#ifndef RDMAXD_CONN_INTERNAL_H
#define RDMAXD_CONN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "sq_plan.h"

struct conn;
struct xfer;

void conn_on_retire(void *arg, struct xfer *xfer, enum sq_outcome outcome);
void conn_retired(struct conn *conn, uint32_t n);
/* Fail whatever the link still has out, its completions not awaited (settled first). */
void conn_link_fail_all(struct conn *conn, struct conn_link *link);
void conn_check_drained(struct conn *conn);
void conn_down(struct conn *conn, int err, const char *message);
/* A link of a draining connection that has nothing out any more starts its own drain. */
void conn_link_quiet(struct conn_link *link);
void conn_attempt_failed(struct conn *conn, int err, bool retryable, const char *reason);
void conn_established(struct conn *conn, uint64_t now);

/* "WRITE", "READ", ...: an xfer operation as work completion messages name it. */
const char *conn_op_name(enum xfer_op op);

/* conn_wc_error() with the operation named by the caller (e.g. "SEND to"). */
int conn_wc_error_named(int wc_status, uint32_t vendor_err, const char *op, const char *peer,
			char *message, size_t message_size);

#endif /* RDMAXD_CONN_INTERNAL_H */
