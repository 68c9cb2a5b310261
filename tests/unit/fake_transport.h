/* SPDX-License-Identifier: MIT */
/*
 * A fake transport for the engine suites (validate, planner_jobs): it records
 * every xfer the engine submits or sends (the pointer, and a copy as it was
 * submitted since window slots are reused) and completes one only when the
 * test calls fake_transport_finish(). Never moves a byte and never completes
 * anything on its own.
 */
#ifndef RDMAXD_TEST_FAKE_TRANSPORT_H
#define RDMAXD_TEST_FAKE_TRANSPORT_H

#include "transport.h"

#define FAKE_TRANSPORT_MAX_XFERS 1100

struct fake_transport {
	struct transport base;
	struct xfer *xfers[FAKE_TRANSPORT_MAX_XFERS];
	struct xfer snap[FAKE_TRANSPORT_MAX_XFERS]; /* as submitted: window slots are reused */
	int n;
	int fail_submit; /* submit returns this when non-zero */
};

/* submit: records an xfer without a mailbox (or returns fail_submit). */
int fake_transport_submit(struct transport *transport, struct xfer *xfer);
/* send_message: records an xfer with a mailbox. */
int fake_transport_send_message(struct transport *transport, struct xfer *xfer);
/* endpoints: none. */
int fake_transport_endpoints(struct transport *transport, const struct region *region,
			     struct endpoint *ret, uint32_t max);
/* shutdown and destroy: nothing to do. */
void fake_transport_noop(struct transport *transport);

/* The members every fake ops table shares; each table adds its name and its extras. */
#define FAKE_TRANSPORT_OPS                                                                         \
	.submit = fake_transport_submit, .endpoints = fake_transport_endpoints,                    \
	.shutdown = fake_transport_noop, .destroy = fake_transport_noop

/* Complete the i-th recorded xfer with err ("fake failure" as the message when non-zero). */
void fake_transport_finish(struct fake_transport *ft, int i, int err);
/* Complete every recorded xfer from the from-th on, successfully. */
void fake_transport_finish_all(struct fake_transport *ft, int from);

#endif
