/* SPDX-License-Identifier: MIT */
/*
 * Framing of mailbox messages over the verbs transport: a message is cut into
 * checked frames, reassembled on the receiving side, and answered once.
 * Encoding and checking only; the connections that carry frames are conn.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_msg.h"
#include "util.h"

#define FRAME_VERSION 2 /* 2: message frames carry the mailbox key */
/* Statuses an answer may carry: 0 and the RDMAX_E_* range. */
#define STATUS_LOWEST  (-1199)
#define STATUS_HIGHEST (-1001)

uint32_t conn_msg_frames(uint64_t body_len)
{
	if (body_len == 0) {
		return 1;
	}
	return (uint32_t)((body_len + CONN_FRAME_DATA - 1) / CONN_FRAME_DATA);
}

uint32_t conn_msg_frame_len(uint64_t body_len, uint32_t index)
{
	uint64_t off = (uint64_t)index * CONN_FRAME_DATA;

	if (off >= body_len) {
		return CONN_FRAME_HDR;
	}
	return CONN_FRAME_HDR + (uint32_t)MIN((uint64_t)CONN_FRAME_DATA, body_len - off);
}

static void frame_header(uint8_t *p, enum conn_frame_type type, uint8_t name_len, uint8_t from_len,
			 uint64_t id, uint32_t a, uint32_t b, uint64_t key)
{
	memset(p, 0, CONN_FRAME_HDR);
	put_le32(p, CONN_FRAME_MAGIC);
	p[4] = FRAME_VERSION;
	p[5] = (uint8_t)type;
	p[6] = name_len;
	p[7] = from_len;
	put_le64(p + 8, id);
	put_le32(p + 16, a);
	put_le32(p + 20, b);
	put_le64(p + 24, key);
}

int conn_msg_encode(uint8_t *staging, size_t size, uint64_t id, const char *name, uint64_t key,
		    const char *from, const uint8_t *payload, uint32_t payload_len)
{
	size_t name_len = name ? strnlen(name, TRANSPORT_MAILBOX_NAME_MAX + 1) : 0;
	size_t from_len = from ? strnlen(from, CONN_FROM_MAX + 1) : 0;

	if (id == 0 || id == UINT64_MAX || name_len == 0 || name_len > TRANSPORT_MAILBOX_NAME_MAX ||
	    from_len > CONN_FROM_MAX || payload_len > TRANSPORT_MESSAGE_PAYLOAD_MAX ||
	    (payload_len > 0 && !payload)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	const uint8_t *src[3] = {(const uint8_t *)name, (const uint8_t *)from, payload};
	const uint32_t len[3] = {(uint32_t)name_len, (uint32_t)from_len, payload_len};
	uint32_t body_len = len[0] + len[1] + len[2];
	uint32_t frames = conn_msg_frames(body_len);
	if (size <
	    (size_t)(frames - 1) * CONN_FRAME_MAX + conn_msg_frame_len(body_len, frames - 1)) {
		return -ENOSPC;
	}
	for (uint32_t i = 0; i < frames; i++) {
		uint8_t *f = staging + (size_t)i * CONN_FRAME_MAX;
		uint32_t off = i * CONN_FRAME_DATA;
		uint32_t end = off + conn_msg_frame_len(body_len, i) - CONN_FRAME_HDR;
		uint32_t base = 0;

		frame_header(f, CONN_FRAME_MESSAGE, (uint8_t)name_len, (uint8_t)from_len, id,
			     payload_len, off, key);
		/* The body is name | from | payload: copy the part of each piece in [off, end). */
		for (int k = 0; k < 3; k++) {
			uint32_t s = MAX(off, base), e = MIN(end, base + len[k]);
			if (s < e) {
				memcpy(f + CONN_FRAME_HDR + (s - off), src[k] + (s - base), e - s);
			}
			base += len[k];
		}
	}
	return (int)body_len;
}

int conn_answer_encode(uint8_t *buf, size_t size, uint64_t id, int status, const char *text)
{
	size_t n = text ? strnlen(text, CONN_ANSWER_TEXT_MAX) : 0;

	if (size < CONN_FRAME_HDR + n) {
		return -ENOSPC;
	}
	frame_header(buf, CONN_FRAME_ANSWER, 0, 0, id, (uint32_t)status, (uint32_t)n, 0);
	memcpy(buf + CONN_FRAME_HDR, text, n);
	return (int)(CONN_FRAME_HDR + n);
}

int conn_answer_encode_data(uint8_t *buf, size_t size, uint64_t id, const uint8_t *data, size_t len)
{
	if (len > CONN_ANSWER_DATA_MAX || size < CONN_FRAME_HDR + len) {
		return -ENOSPC;
	}
	frame_header(buf, CONN_FRAME_ANSWER, 0, 0, id, 0, (uint32_t)len, 0);
	memcpy(buf + CONN_FRAME_HDR, data, len);
	return (int)(CONN_FRAME_HDR + len);
}

int conn_frame_decode(const uint8_t *buf, size_t len, struct conn_frame *ret_frame)
{
	struct conn_frame f;

	if (!buf || len < CONN_FRAME_HDR || len > CONN_FRAME_MAX ||
	    get_le32(buf) != CONN_FRAME_MAGIC || buf[4] != FRAME_VERSION) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	memset(&f, 0, sizeof(f));
	f.id = get_le64(buf + 8);
	f.data = buf + CONN_FRAME_HDR;
	f.data_len = (uint32_t)(len - CONN_FRAME_HDR);
	if (f.id == 0 || f.id == UINT64_MAX) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	switch (buf[5]) {
	case CONN_FRAME_MESSAGE: {
		f.type = CONN_FRAME_MESSAGE;
		f.name_len = buf[6];
		f.from_len = buf[7];
		f.payload_len = get_le32(buf + 16);
		f.offset = get_le32(buf + 20);
		f.key = get_le64(buf + 24);
		if (f.name_len == 0 || f.name_len > TRANSPORT_MAILBOX_NAME_MAX ||
		    f.from_len > CONN_FROM_MAX || f.payload_len > TRANSPORT_MESSAGE_PAYLOAD_MAX) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		/* Each term is bounded above, so the sum cannot wrap. */
		uint32_t body_len = (uint32_t)f.name_len + f.from_len + f.payload_len;
		if (f.offset >= body_len || f.offset % CONN_FRAME_DATA != 0 ||
		    f.data_len != MIN((uint32_t)CONN_FRAME_DATA, body_len - f.offset)) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		break;
	}
	case CONN_FRAME_ANSWER:
		f.type = CONN_FRAME_ANSWER;
		f.status = (int)(int32_t)get_le32(buf + 16);
		if (buf[6] || buf[7] || get_le64(buf + 24) != 0 ||
		    get_le32(buf + 20) != f.data_len ||
		    f.data_len > (f.status == 0 ? CONN_ANSWER_DATA_MAX : CONN_ANSWER_TEXT_MAX) ||
		    (f.status != 0 && (f.status < STATUS_LOWEST || f.status > STATUS_HIGHEST))) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		break;
	default:
		return RDMAX_E_PROTOCOL_ERROR;
	}
	*ret_frame = f;
	return 0;
}

void conn_msg_rx_reset(struct conn_msg_rx *rx)
{
	free(rx->owned);
	memset(rx, 0, sizeof(*rx));
}

int conn_msg_rx_feed(struct conn_msg_rx *rx, const struct conn_frame *f)
{
	uint32_t body_len = (uint32_t)f->name_len + f->from_len + f->payload_len;

	/* Checked again: a frame here need not come from conn_frame_decode(). */
	if (f->type != CONN_FRAME_MESSAGE || f->data_len == 0 || f->offset > body_len ||
	    f->data_len > body_len - f->offset || f->payload_len > TRANSPORT_MESSAGE_PAYLOAD_MAX ||
	    rx->body) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	if (!rx->owned) {
		if (f->offset != 0) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
		rx->id = f->id;
		rx->key = f->key;
		rx->name_len = f->name_len;
		rx->from_len = f->from_len;
		rx->payload_len = f->payload_len;
		if (f->data_len == body_len) {
			/* One frame: used where it landed. */
			rx->got = body_len;
			rx->body = f->data;
			goto complete;
		}
		rx->owned = malloc(body_len);
		if (!rx->owned) {
			return -ENOMEM;
		}
	} else if (f->id != rx->id || f->key != rx->key || f->name_len != rx->name_len ||
		   f->from_len != rx->from_len || f->payload_len != rx->payload_len ||
		   f->offset != rx->got) {
		return RDMAX_E_PROTOCOL_ERROR;
	}
	memcpy(rx->owned + rx->got, f->data, f->data_len);
	rx->got += f->data_len;
	if (rx->got < body_len) {
		return 0;
	}
	rx->body = rx->owned;
complete:
	for (uint32_t i = 0; i < rx->from_len; i++) {
		uint8_t c = rx->body[rx->name_len + i];
		if (c < 0x20 || c > 0x7e) {
			return RDMAX_E_PROTOCOL_ERROR;
		}
	}
	return 1;
}
