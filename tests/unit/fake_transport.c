/* SPDX-License-Identifier: MIT */
/*
 * The engine suites' fake transport (fake_transport.h): records submitted and
 * sent xfers, completes them when a test says so. Holds no state of its own
 * beyond the struct fake_transport each test owns.
 */
#include <check.h>

#include "fake_transport.h"

static int fake_transport_record(struct fake_transport *ft, struct xfer *xfer)
{
	ck_assert_int_lt(ft->n, FAKE_TRANSPORT_MAX_XFERS);
	ft->snap[ft->n] = *xfer;
	ft->xfers[ft->n++] = xfer;
	return 0;
}

int fake_transport_submit(struct transport *transport, struct xfer *xfer)
{
	struct fake_transport *ft = (struct fake_transport *)transport;
	if (ft->fail_submit) {
		return ft->fail_submit;
	}
	ck_assert_ptr_null(xfer->mailbox);
	return fake_transport_record(ft, xfer);
}

int fake_transport_send_message(struct transport *transport, struct xfer *xfer)
{
	struct fake_transport *ft = (struct fake_transport *)transport;
	ck_assert_ptr_nonnull(xfer->mailbox);
	return fake_transport_record(ft, xfer);
}

int fake_transport_endpoints(struct transport *transport, const struct region *region,
			     struct endpoint *ret, uint32_t max)
{
	return 0;
}

void fake_transport_noop(struct transport *transport)
{
}

void fake_transport_finish(struct fake_transport *ft, int i, int err)
{
	struct xfer *x = ft->xfers[i];
	x->done(x, err, err ? "fake failure" : NULL);
}

void fake_transport_finish_all(struct fake_transport *ft, int from)
{
	for (int i = from; i < ft->n; i++) {
		fake_transport_finish(ft, i, 0);
	}
}
