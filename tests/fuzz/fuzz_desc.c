/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: region descriptors (daemon/mem/desc.c). Applications hand the
 * daemon descriptors that came from anywhere; desc_decode() must refuse
 * every malformed one with INVALID_ARGUMENT and never read outside the
 * buffer. What it accepts must encode again and decode to the same fields.
 */
#include <stdlib.h>
#include <string.h>

#include "desc.h"
#include "rdmax.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct remote_desc a, b;
	uint8_t buf[DESC_MAX_BYTES * 2];

	int ret = desc_decode(data, size, &a);
	if (ret != 0) {
		if (ret != RDMAX_E_INVALID_ARGUMENT) {
			abort();
		}
		return 0;
	}
	/* Accepted: printable C strings within their fields, a round trip that keeps them. */
	if (a.n_endpoints == 0 || a.n_endpoints > DESC_MAX_ENDPOINTS ||
	    strnlen(a.node_name, sizeof(a.node_name)) == sizeof(a.node_name)) {
		abort();
	}
	int len = desc_encode(&a, buf, sizeof(buf));
	if (len <= 0 || desc_decode(buf, (size_t)len, &b) != 0) {
		abort();
	}
	if (a.instance_id != b.instance_id || a.region_id != b.region_id ||
	    a.region_key != b.region_key || a.length != b.length || a.access != b.access ||
	    strcmp(a.node_name, b.node_name) != 0 || a.n_endpoints != b.n_endpoints) {
		abort();
	}
	for (uint32_t i = 0; i < a.n_endpoints; i++) {
		const struct endpoint *x = &a.endpoints[i], *y = &b.endpoints[i];
		if (!endpoint_same_peer(x, y) || strcmp(x->device, y->device) != 0 ||
		    x->iova != y->iova || x->rkey != y->rkey) {
			abort();
		}
	}
	return 0;
}
