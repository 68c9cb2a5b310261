/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the TCP wire format (daemon/transport/tcp/wire.c) on its own.
 * The bytes are a frame header, then a HELLO body. A header is accepted or
 * refused with PROTOCOL_ERROR; an accepted one encodes back to the same 64
 * bytes and never announces a body beyond its type's bound. An accepted
 * HELLO has a printable, NUL-terminated node name.
 */
#include <stdlib.h>
#include <string.h>

#include "rdmax.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wire_header h;
	struct wire_hello hello;
	uint8_t out[WIRE_HEADER_BYTES];

	int ret = wire_header_decode(data, size, &h);
	if (ret == 0) {
		wire_header_encode(&h, out);
		if (memcmp(out, data, WIRE_HEADER_BYTES) != 0) {
			abort();
		}
		/* Only data frames may announce more than a small body; a lookup's ACK a
		 * descriptor. */
		uint64_t small_max =
			h.type == WIRE_ACK && h.status == 0 ? WIRE_LOOKUP_REPLY_MAX : WIRE_BODY_MAX;
		if (h.type != WIRE_WRITE && h.type != WIRE_WRITE_SEGS && h.type != WIRE_READ_REQ &&
		    h.type != WIRE_READ_SEGS && h.type != WIRE_MESSAGE &&
		    !(h.type == WIRE_READ_RESP && h.status == 0) &&
		    wire_payload_bytes(&h) > small_max) {
			abort();
		}
		/* A READ_SEGS carries its table and nothing else. */
		if (h.type == WIRE_READ_SEGS &&
		    wire_payload_bytes(&h) > (uint64_t)WIRE_SEGS_MAX * WIRE_SEG_BYTES) {
			abort();
		}
		if (h.type == WIRE_MESSAGE &&
		    wire_payload_bytes(&h) > WIRE_MAILBOX_NAME_MAX + WIRE_MESSAGE_PAYLOAD_MAX) {
			abort();
		}
		if (wire_type_name(h.type)[0] == 'u') {
			abort(); /* accepted a type without a name */
		}
	} else if (ret != RDMAX_E_PROTOCOL_ERROR) {
		abort();
	}
	if (size <= WIRE_HEADER_BYTES) {
		return 0;
	}
	const uint8_t *body = data + WIRE_HEADER_BYTES;
	size_t len = size - WIRE_HEADER_BYTES;
	ret = wire_hello_decode(body, len, &hello);
	if (ret == 0) {
		size_t n = strnlen(hello.node_name, sizeof(hello.node_name));
		if (n == sizeof(hello.node_name)) {
			abort();
		}
		for (size_t i = 0; i < n; i++) {
			if (hello.node_name[i] < 0x20 || hello.node_name[i] > 0x7e) {
				abort();
			}
		}
		uint8_t again[WIRE_HELLO_BYTES];
		struct wire_hello back;
		if (wire_hello_encode(&hello, again, sizeof(again)) != WIRE_HELLO_BYTES ||
		    wire_hello_decode(again, sizeof(again), &back) != 0 ||
		    back.instance_id != hello.instance_id || back.version != hello.version ||
		    back.flags != hello.flags || strcmp(back.node_name, hello.node_name) != 0) {
			abort();
		}
	} else if (ret != RDMAX_E_PROTOCOL_ERROR) {
		abort();
	}
	char text[WIRE_MESSAGE_MAX + 1];
	wire_text_copy(text, sizeof(text), body, len);
	if (strlen(text) > WIRE_MESSAGE_MAX) {
		abort();
	}
	return 0;
}
