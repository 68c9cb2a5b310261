/* SPDX-License-Identifier: MIT */
/*
 * A test xfer for the verbs suites (conn, sq_plan): an xfer whose done
 * callback counts its calls, keeps its error and message, and records its
 * order among all done calls. Never submits anything itself.
 */
#ifndef RDMAXD_TEST_TXFER_H
#define RDMAXD_TEST_TXFER_H

#include <stdint.h>

#include "conn.h"
#include "rdmax.h"

struct txfer {
	struct xfer x;
	int calls;
	int err;
	int order; /* position among all done calls */
	char msg[RDMAX_MESSAGE_MAX];
};

/* Zero t and make it an xfer of op and length to 192.0.2.2:7471 (verbs) of that instance. */
void unit_txfer_init(struct txfer *t, enum xfer_op op, uint64_t length, uint64_t instance);

#endif
