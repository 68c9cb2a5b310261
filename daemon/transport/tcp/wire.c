/* SPDX-License-Identifier: MIT */
/*
 * Encoding and checking of daemon-to-daemon frames. This module owns the
 * byte layout and the rules a header must satisfy before the transport acts
 * on it; it never does I/O and never trusts a length it has not bounded.
 * Layout of the 64-byte header (all little-endian):
 *
 *   0 magic u32 | 4 type u8 | 5 flags u8 | 6 reserved u16 | 8 status u32
 *   12 imm u32 | 16 request_id | 24 instance | 32 region_id | 40 region_key
 *   48 offset | 56 length (u64 each)
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "rdmax.h"
#include "util.h"
#include "wire.h"

void wire_header_encode(const struct wire_header *header, uint8_t *out)
{
	put_le32(out + 0, WIRE_MAGIC);
	out[4] = header->type;
	out[5] = header->flags;
	put_le16(out + 6, 0);
	put_le32(out + 8, header->status);
	put_le32(out + 12, header->imm);
	put_le64(out + 16, header->request_id);
	put_le64(out + 24, header->instance);
	put_le64(out + 32, header->region_id);
	put_le64(out + 40, header->region_key);
	put_le64(out + 48, header->offset);
	put_le64(out + 56, header->length);
}

/* Body bounds per type; data lengths (WRITE, READ_REQ, successful READ_RESP) are the caller's. */
static int check_header(const struct wire_header *h)
{
	bool request = h->type == WIRE_HELLO || h->type == WIRE_AUTH || h->type == WIRE_WRITE ||
		       h->type == WIRE_READ_REQ || h->type == WIRE_MESSAGE ||
		       h->type == WIRE_WRITE_SEGS || h->type == WIRE_READ_SEGS;

	if (h->flags & ~WIRE_F_HAS_IMM) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if ((h->flags & WIRE_F_HAS_IMM) && h->type != WIRE_WRITE && h->type != WIRE_WRITE_SEGS) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if (!(h->flags & WIRE_F_HAS_IMM) && h->imm != 0) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if (request && h->status != 0) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	switch (h->type) {
	case WIRE_HELLO:
		return h->length >= WIRE_HELLO_BYTES && h->length <= WIRE_BODY_MAX
			       ? 0
			       : RDMAX_E_PROTOCOL_ERROR;
	case WIRE_AUTH:
		return h->length == WIRE_MAC_BYTES ? 0 : RDMAX_E_PROTOCOL_ERROR;
	case WIRE_WRITE:
	case WIRE_READ_REQ:
		return 0;
	case WIRE_WRITE_SEGS:
	case WIRE_READ_SEGS:
		/* `offset` counts the table's entries; every segment holds at least a byte. */
		if (h->offset == 0 || h->offset > WIRE_SEGS_MAX || h->length < h->offset ||
		    h->length > WIRE_SEGS_DATA_MAX) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		return 0;
	case WIRE_MESSAGE:
		/* The name is 1..WIRE_MAILBOX_NAME_MAX bytes and leads the body; the key may be
		 * any. */
		if (h->region_id != 0 || h->offset == 0 || h->offset > WIRE_MAILBOX_NAME_MAX ||
		    h->length < h->offset || h->length - h->offset > WIRE_MESSAGE_PAYLOAD_MAX) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		return 0;
	case WIRE_READ_RESP:
		return h->status == 0 || h->length <= WIRE_MESSAGE_MAX ? 0 : RDMAX_E_PROTOCOL_ERROR;
	case WIRE_ACK:
		return h->length <= (h->status == 0 ? WIRE_LOOKUP_REPLY_MAX : WIRE_MESSAGE_MAX)
			       ? 0
			       : RDMAX_E_PROTOCOL_ERROR;
	case WIRE_ERROR:
		return h->status != 0 && h->length <= WIRE_MESSAGE_MAX ? 0 : RDMAX_E_PROTOCOL_ERROR;
	default:
		return RDMAX_E_PROTOCOL_ERROR;
	}
}

int wire_header_decode(const uint8_t *buf, size_t len, struct wire_header *ret_header)
{
	struct wire_header h;

	if (!buf || len < WIRE_HEADER_BYTES) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if (get_le32(buf) != WIRE_MAGIC || get_le16(buf + 6) != 0) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	h.type = buf[4];
	h.flags = buf[5];
	h.status = get_le32(buf + 8);
	h.imm = get_le32(buf + 12);
	h.request_id = get_le64(buf + 16);
	h.instance = get_le64(buf + 24);
	h.region_id = get_le64(buf + 32);
	h.region_key = get_le64(buf + 40);
	h.offset = get_le64(buf + 48);
	h.length = get_le64(buf + 56);
	int err = check_header(&h);
	if (err < 0) {
		return err;
	}
	*ret_header = h;
	return 0;
}

uint64_t wire_payload_bytes(const struct wire_header *header)
{
	if (header->type == WIRE_WRITE_SEGS) {
		return header->offset * WIRE_SEG_BYTES +
		       header->length; /* both bounded by decode */
	}
	if (header->type == WIRE_READ_SEGS) {
		return header->offset * WIRE_SEG_BYTES; /* the table; the data comes back */
	}
	return header->type == WIRE_READ_REQ ? 0 : header->length;
}

/* Table entry: 0 offset u64 | 8 length u64 */
void wire_segs_encode(const struct wire_seg *segs, uint32_t n, uint8_t *out)
{
	for (uint32_t i = 0; i < n; i++) {
		put_le64(out + (size_t)i * WIRE_SEG_BYTES, segs[i].offset);
		put_le64(out + (size_t)i * WIRE_SEG_BYTES + 8, segs[i].length);
	}
}

int wire_segs_decode(const struct wire_header *h, const uint8_t *buf, size_t len,
		     struct wire_seg *ret_segs)
{
	uint64_t total = 0;

	if (!h || !buf || (h->type != WIRE_WRITE_SEGS && h->type != WIRE_READ_SEGS) ||
	    h->offset == 0 || h->offset > WIRE_SEGS_MAX || len != h->offset * WIRE_SEG_BYTES) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	for (uint64_t i = 0; i < h->offset; i++) {
		uint64_t offset = get_le64(buf + i * WIRE_SEG_BYTES);
		uint64_t length = get_le64(buf + i * WIRE_SEG_BYTES + 8);
		/* Each term is checked before the sum, so the sum cannot wrap. */
		if (length == 0 || offset > UINT64_MAX - length || length > h->length - total) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		total += length;
		ret_segs[i] = (struct wire_seg){.offset = offset, .length = length};
	}
	return total == h->length ? 0 : RDMAX_E_PROTOCOL_ERROR;
}

/* Hello body: 0 version u16 | 2 flags u16 | 4 reserved u32 | 8 instance u64 | 16 nonce[32] | 48
 * name[64] */
int wire_hello_encode(const struct wire_hello *hello, uint8_t *out, size_t size)
{
	if (size < WIRE_HELLO_BYTES) {
		return -ENOSPC;
	}
	memset(out, 0, WIRE_HELLO_BYTES);
	put_le16(out + 0, hello->version);
	put_le16(out + 2, hello->flags);
	put_le64(out + 8, hello->instance_id);
	memcpy(out + 16, hello->nonce, WIRE_NONCE_BYTES);
	size_t name_len = strnlen(hello->node_name, WIRE_NODE_NAME_BYTES - 1);
	memcpy(out + 48, hello->node_name, name_len);
	return WIRE_HELLO_BYTES;
}

int wire_hello_decode(const uint8_t *buf, size_t len, struct wire_hello *ret_hello)
{
	struct wire_hello hello;

	if (!buf || len < WIRE_HELLO_BYTES || len > WIRE_BODY_MAX) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	hello.version = get_le16(buf + 0);
	hello.flags = get_le16(buf + 2);
	hello.instance_id = get_le64(buf + 8);
	memcpy(hello.nonce, buf + 16, WIRE_NONCE_BYTES);
	const uint8_t *name = buf + 48;
	/* The name must be NUL-terminated inside its field; anything else is garbage. */
	size_t name_len = strnlen((const char *)name, WIRE_NODE_NAME_BYTES);
	if (name_len == WIRE_NODE_NAME_BYTES) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	wire_text_copy(hello.node_name, sizeof(hello.node_name), name, name_len);
	*ret_hello = hello;
	return 0;
}

void wire_text_copy(char *dst, size_t dst_size, const uint8_t *src, size_t len)
{
	size_t n = 0;

	if (dst_size == 0) {
		return;
	}
	for (; n < len && n + 1 < dst_size; n++) {
		dst[n] = src[n] >= 0x20 && src[n] < 0x7f ? (char)src[n] : '?';
	}
	dst[n] = '\0';
}

const char *wire_type_name(unsigned type)
{
	static const char *const names[WIRE_TYPE_MAX] = {
		[WIRE_HELLO] = "HELLO",           [WIRE_AUTH] = "AUTH",
		[WIRE_WRITE] = "WRITE",           [WIRE_READ_REQ] = "READ_REQ",
		[WIRE_READ_RESP] = "READ_RESP",   [WIRE_ACK] = "ACK",
		[WIRE_ERROR] = "ERROR",           [WIRE_MESSAGE] = "MESSAGE",
		[WIRE_WRITE_SEGS] = "WRITE_SEGS", [WIRE_READ_SEGS] = "READ_SEGS",
	};

	return type < WIRE_TYPE_MAX && names[type] ? names[type] : "unknown";
}
