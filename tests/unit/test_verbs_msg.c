/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the verbs transport's message frames (suite "verbs_msg"):
 * the layout of a message's frames in its staging, the decoder that checks
 * every received frame before anything is copied, and the reassembly of a
 * QP's frames into one message. Hostile inputs (lying sizes, offsets, ids,
 * statuses, truncated and padded frames, random corruption) must be refused
 * without reading or writing outside the frame or the reassembly buffer;
 * under the sanitizer build an overrun fails the test.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "rdmax.h"

Suite *verbs_msg_suite(void);

static uint8_t g_staging[CONN_MSG_STAGING];
static uint8_t g_payload[TRANSPORT_MESSAGE_PAYLOAD_MAX];

static void fill_payload(uint32_t seed)
{
	for (size_t i = 0; i < sizeof(g_payload); i++) {
		g_payload[i] = (uint8_t)((i * 131 + seed) >> 3);
	}
}

/* Decode and feed every frame of the staged message; returns the last feed result. */
static int feed_all(struct conn_msg_rx *rx, int body_len, uint32_t frames)
{
	int ret = 0;

	for (uint32_t i = 0; i < frames; i++) {
		struct conn_frame f;
		uint32_t len = conn_msg_frame_len((uint64_t)body_len, i);
		ck_assert_int_eq(conn_frame_decode(g_staging + (size_t)i * CONN_FRAME_MAX, len, &f),
				 0);
		ck_assert_int_eq(f.type, CONN_FRAME_MESSAGE);
		ret = conn_msg_rx_feed(rx, &f);
		ck_assert_int_eq(ret, i + 1 == frames ? 1 : 0);
	}
	return ret;
}

START_TEST(msg_round_trip)
{
	const uint32_t sizes[] = {0,
				  1,
				  CONN_FRAME_DATA - 10 - 1,
				  CONN_FRAME_DATA - 10,
				  CONN_FRAME_DATA - 10 + 1,
				  1000,
				  3 * CONN_FRAME_DATA,
				  TRANSPORT_MESSAGE_PAYLOAD_MAX};

	fill_payload(5);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		struct conn_msg_rx rx;
		memset(&rx, 0, sizeof(rx));
		memset(g_staging, 0xee, sizeof(g_staging));
		int body = conn_msg_encode(g_staging, sizeof(g_staging), 42 + k, "decode.ctl", 0,
					   "alpha", g_payload, sizes[k]);
		ck_assert_int_eq(body, 10 + 5 + (int)sizes[k]);
		uint32_t frames = conn_msg_frames((uint64_t)body);
		ck_assert_uint_le(frames, CONN_MSG_FRAMES_MAX);
		ck_assert_uint_eq(frames, ((uint32_t)body + CONN_FRAME_DATA - 1) / CONN_FRAME_DATA);
		ck_assert_int_eq(feed_all(&rx, body, frames), 1);
		ck_assert_uint_eq(rx.id, 42 + k);
		ck_assert_uint_eq(rx.name_len, 10);
		ck_assert_uint_eq(rx.from_len, 5);
		ck_assert_uint_eq(rx.payload_len, sizes[k]);
		ck_assert_mem_eq(rx.body, "decode.ctlalpha", 15);
		if (sizes[k]) {
			ck_assert_mem_eq(rx.body + 15, g_payload, sizes[k]);
		}
		/* One frame is used in place; more are reassembled. */
		ck_assert(frames == 1 ? rx.owned == NULL : rx.owned != NULL);
		conn_msg_rx_reset(&rx);
		ck_assert_ptr_null(rx.owned);
	}
	/* The largest message fills every frame of its staging. */
	int body = conn_msg_encode(g_staging, sizeof(g_staging), 1, "n", 0, "", g_payload,
				   TRANSPORT_MESSAGE_PAYLOAD_MAX);
	ck_assert_int_eq(body, 1 + TRANSPORT_MESSAGE_PAYLOAD_MAX);
	ck_assert_uint_eq(conn_msg_frame_len((uint64_t)body, 0), CONN_FRAME_MAX);
	ck_assert_uint_eq(conn_msg_frame_len((uint64_t)body, conn_msg_frames((uint64_t)body)),
			  CONN_FRAME_HDR);
}
END_TEST

START_TEST(msg_encode_refuses)
{
	char name[TRANSPORT_MAILBOX_NAME_MAX + 2];
	char from[CONN_FROM_MAX + 2];

	memset(name, 'n', sizeof(name));
	name[sizeof(name) - 1] = '\0';
	memset(from, 'f', sizeof(from));
	from[sizeof(from) - 1] = '\0';
	ck_assert_int_eq(
		conn_msg_encode(g_staging, sizeof(g_staging), 0, "a", 0, "b", g_payload, 1),
		RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(conn_msg_encode(g_staging, sizeof(g_staging), 1, "", 0, "b", g_payload, 1),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(
		conn_msg_encode(g_staging, sizeof(g_staging), 1, name, 0, "b", g_payload, 1),
		RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(
		conn_msg_encode(g_staging, sizeof(g_staging), 1, "a", 0, from, g_payload, 1),
		RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(conn_msg_encode(g_staging, sizeof(g_staging), 1, "a", 0, "b", g_payload,
					 TRANSPORT_MESSAGE_PAYLOAD_MAX + 1),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(conn_msg_encode(g_staging, sizeof(g_staging), 1, "a", 0, "b", NULL, 1),
			 RDMAX_E_INVALID_ARGUMENT);
	/* Staging too small for the frames: nothing written past it. */
	ck_assert_int_eq(conn_msg_encode(g_staging, CONN_FRAME_MAX, 1, "a", 0, "b", g_payload,
					 CONN_FRAME_DATA),
			 -ENOSPC);
	ck_assert_int_eq(conn_msg_encode(g_staging, CONN_FRAME_HDR + 2, 1, "a", 0, "b", NULL, 0),
			 2);
}
END_TEST

/* A valid one-frame message in buf; returns its length. */
static size_t one_frame(uint8_t *buf, uint64_t id, uint32_t payload_len)
{
	int body =
		conn_msg_encode(buf, CONN_FRAME_MAX, id, "box", 0, "node", g_payload, payload_len);

	ck_assert_int_gt(body, 0);
	return conn_msg_frame_len((uint64_t)body, 0);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

START_TEST(msg_decode_hostile)
{
	uint8_t buf[CONN_FRAME_MAX + 64];
	struct conn_frame f;
	size_t len;

	memset(&f, 0x5a, sizeof(f));
	struct conn_frame untouched = f;
	ck_assert_int_eq(conn_frame_decode(NULL, 100, &f), RDMAX_E_PROTOCOL_ERROR);
	len = one_frame(buf, 9, 100);
	ck_assert_int_eq(conn_frame_decode(buf, len, &f), 0);
	f = untouched;

	/* Truncated, padded, shorter than a header, longer than a receive buffer. */
	ck_assert_int_eq(conn_frame_decode(buf, len - 1, &f), RDMAX_E_PROTOCOL_ERROR);
	ck_assert_int_eq(conn_frame_decode(buf, len + 1, &f), RDMAX_E_PROTOCOL_ERROR);
	ck_assert_int_eq(conn_frame_decode(buf, CONN_FRAME_HDR - 1, &f), RDMAX_E_PROTOCOL_ERROR);
	ck_assert_int_eq(conn_frame_decode(buf, CONN_FRAME_MAX + 1, &f), RDMAX_E_PROTOCOL_ERROR);
	/* ret_frame is written only on success. */
	ck_assert_mem_eq(&f, &untouched, sizeof(f));

	struct {
		size_t at;
		uint8_t value;
		const char *what;
	} bytes[] = {
		{0, 'X', "magic"},
		{4, 1, "version 1 (frames without a key)"},
		{4, 3, "version"},
		{5, 0, "type 0"},
		{5, 9, "unknown type"},
		{6, 0, "empty mailbox name"},
		{6, TRANSPORT_MAILBOX_NAME_MAX + 1, "name longer than the limit"},
		{7, CONN_FROM_MAX + 1, "sender name longer than the limit"},
	};
	for (size_t i = 0; i < sizeof(bytes) / sizeof(bytes[0]); i++) {
		len = one_frame(buf, 9, 100);
		buf[bytes[i].at] = bytes[i].value;
		ck_assert_msg(conn_frame_decode(buf, len, &f) == RDMAX_E_PROTOCOL_ERROR,
			      "accepted a frame with a bad %s", bytes[i].what);
	}
	/* The key travels in every frame of a message; an answer carries none. */
	ck_assert_int_gt(conn_msg_encode(buf, CONN_FRAME_MAX, 9, "box",
					 UINT64_C(0x8877665544332211), "node", g_payload, 100),
			 0);
	ck_assert_int_eq(conn_frame_decode(buf, len, &f), 0);
	ck_assert_uint_eq(f.key, UINT64_C(0x8877665544332211));
	f = untouched;
	len = (size_t)conn_answer_encode(buf, sizeof(buf), 9, RDMAX_E_NOT_FOUND, "no");
	ck_assert_int_eq(conn_frame_decode(buf, len, &f), 0);
	buf[31] = 0x80;
	ck_assert_int_eq(conn_frame_decode(buf, len, &f), RDMAX_E_PROTOCOL_ERROR);
	f = untouched;
	/* Sizes that lie about the data that follows. */
	const uint32_t payloads[] = {99, 101, TRANSPORT_MESSAGE_PAYLOAD_MAX + 1, UINT32_MAX};
	for (size_t i = 0; i < sizeof(payloads) / sizeof(payloads[0]); i++) {
		len = one_frame(buf, 9, 100);
		put32(buf + 16, payloads[i]);
		ck_assert_msg(conn_frame_decode(buf, len, &f) == RDMAX_E_PROTOCOL_ERROR,
			      "accepted payload_len %u for 100 bytes", payloads[i]);
	}
	const uint32_t offsets[] = {1, CONN_FRAME_DATA, 107, UINT32_MAX - 5};
	for (size_t i = 0; i < sizeof(offsets) / sizeof(offsets[0]); i++) {
		len = one_frame(buf, 9, 100);
		put32(buf + 20, offsets[i]);
		ck_assert_msg(conn_frame_decode(buf, len, &f) == RDMAX_E_PROTOCOL_ERROR,
			      "accepted offset %u", offsets[i]);
	}
	/* Ids 0 and all ones are never used. */
	len = one_frame(buf, 9, 100);
	memset(buf + 8, 0, 8);
	ck_assert_int_eq(conn_frame_decode(buf, len, &f), RDMAX_E_PROTOCOL_ERROR);
	memset(buf + 8, 0xff, 8);
	ck_assert_int_eq(conn_frame_decode(buf, len, &f), RDMAX_E_PROTOCOL_ERROR);

	/* A later frame must be full unless it is the last one. */
	int body = conn_msg_encode(g_staging, sizeof(g_staging), 3, "box", 0, "node", g_payload,
				   3 * CONN_FRAME_DATA);
	uint8_t *second = g_staging + CONN_FRAME_MAX;
	ck_assert_int_eq(conn_frame_decode(second, conn_msg_frame_len((uint64_t)body, 1), &f), 0);
	ck_assert_uint_eq(f.offset, CONN_FRAME_DATA);
	ck_assert_int_eq(conn_frame_decode(second, conn_msg_frame_len((uint64_t)body, 1) - 1, &f),
			 RDMAX_E_PROTOCOL_ERROR);
}
END_TEST

START_TEST(msg_answers)
{
	uint8_t buf[CONN_ANSWER_MAX + 64];
	char long_text[400];
	struct conn_frame f;

	int len = conn_answer_encode(buf, sizeof(buf), 77, RDMAX_E_NOT_FOUND,
				     "no mailbox 'x' is open on node 'b'");
	ck_assert_int_eq(len, CONN_FRAME_HDR + 34);
	ck_assert_int_eq(conn_frame_decode(buf, (size_t)len, &f), 0);
	ck_assert_int_eq(f.type, CONN_FRAME_ANSWER);
	ck_assert_uint_eq(f.id, 77);
	ck_assert_int_eq(f.status, RDMAX_E_NOT_FOUND);
	ck_assert_uint_eq(f.data_len, 34);
	ck_assert_mem_eq(f.data, "no mailbox 'x' is open on node 'b'", 34);
	/* Long texts are cut to what a job's message holds. */
	memset(long_text, 'y', sizeof(long_text) - 1);
	long_text[sizeof(long_text) - 1] = '\0';
	len = conn_answer_encode(buf, sizeof(buf), 78, 0, long_text);
	ck_assert_int_eq(len, CONN_ANSWER_MAX);
	ck_assert_int_eq(conn_frame_decode(buf, (size_t)len, &f), 0);
	ck_assert_uint_eq(f.data_len, CONN_ANSWER_TEXT_MAX);
	ck_assert_int_eq(conn_answer_encode(buf, CONN_FRAME_HDR + 3, 1, 0, "four"), -ENOSPC);

	/* Statuses that do not exist, text lengths that lie, texts past the limit. */
	const int statuses[] = {1, -1, -ENOMEM, -1000, -1200, 0x7fffffff, (int)0x80000000};
	for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++) {
		len = conn_answer_encode(buf, sizeof(buf), 79, 0, "t");
		put32(buf + 16, (uint32_t)statuses[i]);
		ck_assert_msg(conn_frame_decode(buf, (size_t)len, &f) == RDMAX_E_PROTOCOL_ERROR,
			      "accepted status %d", statuses[i]);
	}
	len = conn_answer_encode(buf, sizeof(buf), 79, 0, "text");
	put32(buf + 20, 5);
	ck_assert_int_eq(conn_frame_decode(buf, (size_t)len, &f), RDMAX_E_PROTOCOL_ERROR);

	/* A lookup's answer: status 0 with binary data up to CONN_ANSWER_DATA_MAX; errors keep the
	 * text limit. */
	static uint8_t big[CONN_ANSWER_DATA_FRAME_MAX + 8], data[CONN_ANSWER_DATA_MAX + 1];
	for (size_t i = 0; i < sizeof(data); i++) {
		data[i] = (uint8_t)(i * 7);
	}
	len = conn_answer_encode_data(big, sizeof(big), 80, data, CONN_ANSWER_DATA_MAX);
	ck_assert_int_eq(len, CONN_ANSWER_DATA_FRAME_MAX);
	ck_assert_int_eq(conn_frame_decode(big, (size_t)len, &f), 0);
	ck_assert_int_eq(f.status, 0);
	ck_assert_uint_eq(f.data_len, CONN_ANSWER_DATA_MAX);
	ck_assert_mem_eq(f.data, data, CONN_ANSWER_DATA_MAX);
	ck_assert_int_eq(
		conn_answer_encode_data(big, sizeof(big), 81, data, CONN_ANSWER_DATA_MAX + 1),
		-ENOSPC);
	put32(big + 16, (uint32_t)RDMAX_E_NOT_FOUND); /* an error may not carry that much */
	ck_assert_int_eq(conn_frame_decode(big, (size_t)len, &f), RDMAX_E_PROTOCOL_ERROR);
	/* Texts past the limit: an error's text, and a status-0 answer past the data limit. */
	len = conn_answer_encode(buf, sizeof(buf), 79, RDMAX_E_NOT_FOUND, long_text);
	put32(buf + 20, CONN_ANSWER_TEXT_MAX + 1);
	ck_assert_int_eq(conn_frame_decode(buf, (size_t)len + 1, &f), RDMAX_E_PROTOCOL_ERROR);
	len = conn_answer_encode_data(big, sizeof(big), 82, data, CONN_ANSWER_DATA_MAX);
	put32(big + 20, CONN_ANSWER_DATA_MAX + 1);
	ck_assert_int_eq(conn_frame_decode(big, (size_t)len + 1, &f), RDMAX_E_PROTOCOL_ERROR);
	len = conn_answer_encode(buf, sizeof(buf), 79, 0, "text");
	buf[6] = 1;
	ck_assert_int_eq(conn_frame_decode(buf, (size_t)len, &f), RDMAX_E_PROTOCOL_ERROR);
	/* An answer is not a message frame. */
	struct conn_msg_rx rx;
	memset(&rx, 0, sizeof(rx));
	len = conn_answer_encode(buf, sizeof(buf), 80, 0, "");
	ck_assert_int_eq(conn_frame_decode(buf, (size_t)len, &f), 0);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), RDMAX_E_PROTOCOL_ERROR);
	conn_msg_rx_reset(&rx);
}
END_TEST

/* Decoded frame i of the message staged in g_staging. */
static struct conn_frame frame_of(int body, uint32_t i)
{
	struct conn_frame f;

	ck_assert_int_eq(conn_frame_decode(g_staging + (size_t)i * CONN_FRAME_MAX,
					   conn_msg_frame_len((uint64_t)body, i), &f),
			 0);
	return f;
}

START_TEST(msg_reassembly_hostile)
{
	struct conn_msg_rx rx;
	struct conn_frame f, g;
	static uint8_t other[CONN_MSG_STAGING];

	fill_payload(9);
	memset(&rx, 0, sizeof(rx));
	int body = conn_msg_encode(g_staging, sizeof(g_staging), 5, "box", 0, "node", g_payload,
				   4 * CONN_FRAME_DATA);
	ck_assert_uint_eq(conn_msg_frames((uint64_t)body), 5);

	/* A message cannot start in its middle. */
	f = frame_of(body, 1);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), RDMAX_E_PROTOCOL_ERROR);
	conn_msg_rx_reset(&rx);
	/* Out of order, repeated, skipped. */
	f = frame_of(body, 0);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), 0);
	f = frame_of(body, 0);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), RDMAX_E_PROTOCOL_ERROR);
	f = frame_of(body, 2);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), RDMAX_E_PROTOCOL_ERROR);
	conn_msg_rx_reset(&rx);
	/* Another message's frame in the middle, or the same id with other sizes. */
	int body2 = conn_msg_encode(other, sizeof(other), 6, "box", 0, "node", g_payload,
				    4 * CONN_FRAME_DATA);
	f = frame_of(body, 0);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), 0);
	ck_assert_int_eq(conn_frame_decode(other + CONN_FRAME_MAX,
					   conn_msg_frame_len((uint64_t)body2, 1), &g),
			 0);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &g), RDMAX_E_PROTOCOL_ERROR);
	g = frame_of(body, 1);
	g.key ^= 1; /* a key that changes mid-message */
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &g), RDMAX_E_PROTOCOL_ERROR);
	g = frame_of(body, 1);
	g.payload_len -= 1;
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &g), RDMAX_E_PROTOCOL_ERROR);
	g = frame_of(body, 1);
	g.from_len += 1;
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &g), RDMAX_E_PROTOCOL_ERROR);
	/* Frames that did not come through the decoder are checked again. */
	g = frame_of(body, 1);
	g.data_len = (uint32_t)body;
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &g), RDMAX_E_PROTOCOL_ERROR);
	g.data_len = 0;
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &g), RDMAX_E_PROTOCOL_ERROR);
	g = frame_of(body, 1);
	g.payload_len = TRANSPORT_MESSAGE_PAYLOAD_MAX + 1;
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &g), RDMAX_E_PROTOCOL_ERROR);
	conn_msg_rx_reset(&rx);

	/* Complete, then another frame without a reset. */
	ck_assert_int_eq(feed_all(&rx, body, 5), 1);
	f = frame_of(body, 0);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), RDMAX_E_PROTOCOL_ERROR);
	conn_msg_rx_reset(&rx);

	/* A sender name that is not printable. */
	body = conn_msg_encode(g_staging, sizeof(g_staging), 7, "box", 0, "no\tde", g_payload, 10);
	f = frame_of(body, 0);
	ck_assert_int_eq(conn_msg_rx_feed(&rx, &f), RDMAX_E_PROTOCOL_ERROR);
	conn_msg_rx_reset(&rx);
}
END_TEST

/* Random corruption of valid frames: whatever decodes is fed; nothing may overrun. */
START_TEST(msg_fuzz)
{
	static uint8_t buf[CONN_FRAME_MAX];
	struct conn_msg_rx rx;
	uint32_t seed = 12345;
	unsigned accepted = 0;

	fill_payload(3);
	memset(&rx, 0, sizeof(rx));
	int body = conn_msg_encode(g_staging, sizeof(g_staging), 11, "box", 0, "node", g_payload,
				   2 * CONN_FRAME_DATA + 17);
	for (int round = 0; round < 200000; round++) {
		seed = seed * 1103515245u + 12345u;
		uint32_t i = (seed >> 16) % 3;
		size_t len = conn_msg_frame_len((uint64_t)body, i);
		memcpy(buf, g_staging + (size_t)i * CONN_FRAME_MAX, len);
		int flips = 1 + (int)((seed >> 8) % 3);
		for (int k = 0; k < flips; k++) {
			seed = seed * 1103515245u + 12345u;
			/* Mostly the header, where the sizes are. */
			size_t at = (seed >> 4) % (seed & 1 ? CONN_FRAME_HDR : len);
			buf[at] ^= (uint8_t)(1u << ((seed >> 20) % 8));
		}
		seed = seed * 1103515245u + 12345u;
		if ((seed >> 12) % 4 == 0) {
			len = (seed >> 14) % CONN_FRAME_MAX + 1;
		}
		struct conn_frame f;
		if (conn_frame_decode(buf, len, &f) != 0) {
			continue;
		}
		accepted++;
		ck_assert_uint_le((uint64_t)CONN_FRAME_HDR + f.data_len, len);
		int ret = conn_msg_rx_feed(&rx, &f);
		if (ret != 0) {
			if (ret == 1) {
				ck_assert_uint_eq(rx.got, (uint32_t)rx.name_len + rx.from_len +
								  rx.payload_len);
			}
			conn_msg_rx_reset(&rx);
		}
	}
	conn_msg_rx_reset(&rx);
	/* Flipped payload bits leave a frame valid: the loop did reach the reassembly. */
	ck_assert_uint_gt(accepted, 1000);
}
END_TEST

Suite *verbs_msg_suite(void)
{
	Suite *s = suite_create("verbs_msg");
	TCase *tc = tcase_create("frames");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, msg_round_trip);
	tcase_add_test(tc, msg_encode_refuses);
	tcase_add_test(tc, msg_decode_hostile);
	tcase_add_test(tc, msg_answers);
	tcase_add_test(tc, msg_reassembly_hostile);
	tcase_add_test(tc, msg_fuzz);
	suite_add_tcase(s, tc);
	return s;
}
