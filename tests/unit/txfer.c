/* SPDX-License-Identifier: MIT */
/*
 * The verbs suites' test xfer (txfer.h): its done callback and its set-up.
 * Owns the one counter that orders done calls across every txfer.
 */
#include <stdio.h>
#include <string.h>

#include "txfer.h"

static int g_done_seq;

static void tdone(struct xfer *x, int err, const char *msg)
{
	struct txfer *t = container_of(x, struct txfer, x);

	t->calls++;
	t->order = ++g_done_seq;
	t->err = err;
	snprintf(t->msg, sizeof(t->msg), "%s", msg ? msg : "");
}

void unit_txfer_init(struct txfer *t, enum xfer_op op, uint64_t length, uint64_t instance)
{
	memset(t, 0, sizeof(*t));
	t->x.op = op;
	t->x.peer.transport = ENDPOINT_VERBS;
	snprintf(t->x.peer.addr, sizeof(t->x.peer.addr), "192.0.2.2");
	t->x.peer.port = 7471;
	t->x.remote_instance = instance;
	t->x.length = length;
	t->x.done = tdone;
	t->err = 12345;
}
