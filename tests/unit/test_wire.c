/* SPDX-License-Identifier: MIT */
/*
 * Daemon-to-daemon wire codec: frame encoding (exact byte layout, bounds,
 * garbage), the hello and the segment table. The TCP transport that carries
 * these frames has its own cases in test_transport_tcp.c, run in this suite
 * as its "tcp" case. No sockets and no event loop here.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "rdmax.h"
#include "status.h"
#include "wire.h"

static struct wire_header sample_write(void)
{
	struct wire_header h = {
		.type = WIRE_WRITE,
		.flags = WIRE_F_HAS_IMM,
		.imm = 0xdeadbeef,
		.request_id = 0x0102030405060708ull,
		.instance = 0x1112131415161718ull,
		.region_id = 7,
		.region_key = 0xa1a2a3a4a5a6a7a8ull,
		.offset = 4096,
		.length = 1u << 20,
	};
	return h;
}

START_TEST(header_round_trip)
{
	struct wire_header in = sample_write();
	struct wire_header out;
	uint8_t buf[WIRE_HEADER_BYTES];

	wire_header_encode(&in, buf);
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &out), 0);
	ck_assert_uint_eq(out.type, WIRE_WRITE);
	ck_assert_uint_eq(out.flags, WIRE_F_HAS_IMM);
	ck_assert_uint_eq(out.imm, 0xdeadbeef);
	ck_assert_uint_eq(out.request_id, in.request_id);
	ck_assert_uint_eq(out.instance, in.instance);
	ck_assert_uint_eq(out.region_id, 7);
	ck_assert_uint_eq(out.region_key, in.region_key);
	ck_assert_uint_eq(out.offset, 4096);
	ck_assert_uint_eq(out.length, 1u << 20);
	ck_assert_uint_eq(out.status, 0);
	ck_assert_uint_eq(wire_payload_bytes(&out), 1u << 20);
}
END_TEST

/* The layout is the protocol: pin every offset and the byte order. */
START_TEST(header_layout_little_endian)
{
	struct wire_header in = sample_write();
	uint8_t buf[WIRE_HEADER_BYTES];

	wire_header_encode(&in, buf);
	static const uint8_t magic[4] = {'R', 'D', 'X', 'W'};
	ck_assert_mem_eq(buf, magic, 4);
	ck_assert_uint_eq(buf[4], WIRE_WRITE);
	ck_assert_uint_eq(buf[5], WIRE_F_HAS_IMM);
	ck_assert_uint_eq(buf[6] | buf[7], 0);
	static const uint8_t imm[4] = {0xef, 0xbe, 0xad, 0xde};
	ck_assert_mem_eq(buf + 12, imm, 4);
	static const uint8_t id[8] = {8, 7, 6, 5, 4, 3, 2, 1};
	ck_assert_mem_eq(buf + 16, id, 8);
	ck_assert_uint_eq(buf[32], 7);
	ck_assert_uint_eq(buf[40], 0xa8);
	ck_assert_uint_eq(buf[47], 0xa1);
	ck_assert_uint_eq(buf[48], 0x00);
	ck_assert_uint_eq(buf[49], 0x10);
	ck_assert_uint_eq(buf[58], 0x10);
}
END_TEST

/* Every bit of every field survives, whatever the host's byte order. */
START_TEST(header_round_trip_extremes)
{
	static const uint64_t values[] = {0, 1, 0x80, 0xff00ff00ff00ff00ull, UINT64_MAX};

	for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
		uint64_t v = values[i];
		struct wire_header in = {
			.type = WIRE_READ_RESP,
			.status = (uint32_t)v,
			.request_id = v,
			.instance = ~v,
			.region_id = v ^ 0x0123456789abcdefull,
			.region_key = v,
			.offset = ~v,
			.length = 0,
		};
		struct wire_header out;
		uint8_t buf[WIRE_HEADER_BYTES];

		wire_header_encode(&in, buf);
		ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &out), 0);
		ck_assert_uint_eq(out.status, in.status);
		ck_assert_uint_eq(out.request_id, in.request_id);
		ck_assert_uint_eq(out.instance, in.instance);
		ck_assert_uint_eq(out.region_id, in.region_id);
		ck_assert_uint_eq(out.region_key, in.region_key);
		ck_assert_uint_eq(out.offset, in.offset);
		ck_assert_uint_eq(buf[16], (uint8_t)v);
		ck_assert_uint_eq(buf[23], (uint8_t)(v >> 56));
	}
}
END_TEST

START_TEST(header_truncated)
{
	struct wire_header in = sample_write();
	struct wire_header out = {.type = 99};
	uint8_t buf[WIRE_HEADER_BYTES];

	wire_header_encode(&in, buf);
	for (size_t len = 0; len < WIRE_HEADER_BYTES; len++) {
		ck_assert_int_eq(wire_header_decode(buf, len, &out), RDMAX_E_PROTOCOL_ERROR);
	}
	ck_assert_int_eq(wire_header_decode(NULL, WIRE_HEADER_BYTES, &out), RDMAX_E_PROTOCOL_ERROR);
	ck_assert_uint_eq(out.type, 99); /* untouched on error */
}
END_TEST

START_TEST(header_garbage)
{
	struct wire_header in = sample_write();
	struct wire_header out;
	uint8_t buf[WIRE_HEADER_BYTES];

	wire_header_encode(&in, buf);
	buf[1] ^= 0x20; /* magic */
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &out), RDMAX_E_PROTOCOL_ERROR);

	wire_header_encode(&in, buf);
	buf[7] = 1; /* reserved */
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &out), RDMAX_E_PROTOCOL_ERROR);

	wire_header_encode(&in, buf);
	buf[5] = 0x80; /* unknown flag */
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &out), RDMAX_E_PROTOCOL_ERROR);

	/* Fixed pseudo-random garbage never decodes (the magic alone rejects it). */
	uint32_t x = 12345;
	for (int round = 0; round < 1000; round++) {
		for (size_t i = 0; i < sizeof(buf); i++) {
			x = x * 1103515245u + 12345u;
			buf[i] = (uint8_t)(x >> 16);
		}
		ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &out),
				 RDMAX_E_PROTOCOL_ERROR);
	}
}
END_TEST

START_TEST(header_unknown_types)
{
	struct wire_header h = {.type = WIRE_READ_REQ, .length = 10};
	struct wire_header out;
	uint8_t buf[WIRE_HEADER_BYTES];

	static const unsigned bad[] = {0, WIRE_TYPE_MAX, 100, 255};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		wire_header_encode(&h, buf);
		buf[4] = (uint8_t)bad[i];
		ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &out),
				 RDMAX_E_PROTOCOL_ERROR);
	}
	ck_assert_str_eq(wire_type_name(WIRE_TYPE_MAX), "unknown");
	ck_assert_str_eq(wire_type_name(0), "unknown");
	ck_assert_str_eq(wire_type_name(WIRE_READ_RESP), "READ_RESP");
}
END_TEST

static int decode_one(const struct wire_header *h)
{
	struct wire_header out;
	uint8_t buf[WIRE_HEADER_BYTES];

	wire_header_encode(h, buf);
	return wire_header_decode(buf, sizeof(buf), &out);
}

START_TEST(header_type_rules)
{
	/* A READ_REQ carries a length but no payload. */
	struct wire_header h = {.type = WIRE_READ_REQ, .length = 1u << 30};
	ck_assert_int_eq(decode_one(&h), 0);
	ck_assert_uint_eq(wire_payload_bytes(&h), 0);

	/* imm only on WRITE, and only with the flag. */
	h = (struct wire_header){.type = WIRE_READ_REQ, .flags = WIRE_F_HAS_IMM};
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h = (struct wire_header){.type = WIRE_WRITE, .imm = 5};
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h = (struct wire_header){.type = WIRE_WRITE, .flags = WIRE_F_HAS_IMM, .imm = 5};
	ck_assert_int_eq(decode_one(&h), 0); /* zero-length write with imm */

	/* Requests carry no status; ERROR must carry one. */
	h = (struct wire_header){.type = WIRE_WRITE, .status = 3};
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h = (struct wire_header){.type = WIRE_ERROR};
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);

	/* Message bodies are bounded. */
	h = (struct wire_header){.type = WIRE_ACK, .status = 3, .length = WIRE_MESSAGE_MAX};
	ck_assert_int_eq(decode_one(&h), 0);
	h.length = WIRE_MESSAGE_MAX + 1;
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h = (struct wire_header){.type = WIRE_ERROR, .status = 3, .length = 1u << 20};
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);

	/* A failed READ_RESP carries a message, a good one any data length. */
	h = (struct wire_header){.type = WIRE_READ_RESP, .status = 2, .length = 4096};
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h.status = 0;
	ck_assert_int_eq(decode_one(&h), 0);

	/* Handshake bodies: exact proof size, bounded hello. */
	h = (struct wire_header){.type = WIRE_AUTH, .length = WIRE_MAC_BYTES};
	ck_assert_int_eq(decode_one(&h), 0);
	h.length = WIRE_MAC_BYTES + 1;
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h = (struct wire_header){.type = WIRE_HELLO, .length = WIRE_HELLO_BYTES};
	ck_assert_int_eq(decode_one(&h), 0);
	h.length = WIRE_HELLO_BYTES - 1;
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h.length = WIRE_BODY_MAX + 1;
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
	h.length = UINT64_MAX;
	ck_assert_int_eq(decode_one(&h), RDMAX_E_PROTOCOL_ERROR);
}
END_TEST

START_TEST(hello_round_trip)
{
	struct wire_hello in = {
		.version = WIRE_VERSION,
		.flags = WIRE_HELLO_F_AUTH,
		.instance_id = 0x0123456789abcdefull,
		.node_name = "node-a",
	};
	struct wire_hello out;
	uint8_t buf[WIRE_BODY_MAX];

	for (int i = 0; i < WIRE_NONCE_BYTES; i++) {
		in.nonce[i] = (uint8_t)(i * 7 + 1);
	}
	ck_assert_int_eq(wire_hello_encode(&in, buf, WIRE_HELLO_BYTES - 1), -ENOSPC);
	ck_assert_int_eq(wire_hello_encode(&in, buf, sizeof(buf)), WIRE_HELLO_BYTES);
	ck_assert_uint_eq(buf[0], WIRE_VERSION);
	ck_assert_uint_eq(buf[8], 0xef);
	ck_assert_int_eq(wire_hello_decode(buf, WIRE_HELLO_BYTES, &out), 0);
	ck_assert_uint_eq(out.version, WIRE_VERSION);
	ck_assert_uint_eq(out.flags, WIRE_HELLO_F_AUTH);
	ck_assert_uint_eq(out.instance_id, in.instance_id);
	ck_assert_mem_eq(out.nonce, in.nonce, WIRE_NONCE_BYTES);
	ck_assert_str_eq(out.node_name, "node-a");

	/* A later version may append fields; they are ignored, within the bound. */
	memset(buf + WIRE_HELLO_BYTES, 0x55, sizeof(buf) - WIRE_HELLO_BYTES);
	ck_assert_int_eq(wire_hello_decode(buf, sizeof(buf), &out), 0);
	ck_assert_int_eq(wire_hello_decode(buf, WIRE_BODY_MAX + 1, &out), RDMAX_E_PROTOCOL_ERROR);
}
END_TEST

START_TEST(hello_garbage)
{
	struct wire_hello in = {.version = WIRE_VERSION, .node_name = "n"};
	struct wire_hello out = {.version = 77};
	uint8_t buf[WIRE_HELLO_BYTES];

	wire_hello_encode(&in, buf, sizeof(buf));
	ck_assert_int_eq(wire_hello_decode(buf, WIRE_HELLO_BYTES - 1, &out),
			 RDMAX_E_PROTOCOL_ERROR);
	ck_assert_int_eq(wire_hello_decode(NULL, WIRE_HELLO_BYTES, &out), RDMAX_E_PROTOCOL_ERROR);

	/* An unterminated name is garbage. */
	memset(buf + 48, 'x', WIRE_NODE_NAME_BYTES);
	ck_assert_int_eq(wire_hello_decode(buf, sizeof(buf), &out), RDMAX_E_PROTOCOL_ERROR);
	ck_assert_uint_eq(out.version, 77);

	/* Control characters in a name never reach a log line. */
	wire_hello_encode(&in, buf, sizeof(buf));
	memcpy(buf + 48, "a\nb\x1b[31m\xff", 9);
	ck_assert_int_eq(wire_hello_decode(buf, sizeof(buf), &out), 0);
	ck_assert_str_eq(out.node_name, "a?b?[31m?");
}
END_TEST

START_TEST(text_copy_bounds)
{
	char dst[8];

	wire_text_copy(dst, sizeof(dst), (const uint8_t *)"region 7 is gone", 16);
	ck_assert_str_eq(dst, "region ");
	wire_text_copy(dst, sizeof(dst), (const uint8_t *)"a\0b", 3);
	ck_assert_str_eq(dst, "a?b");
	wire_text_copy(dst, sizeof(dst), NULL, 0);
	ck_assert_str_eq(dst, "");
	dst[0] = 'z';
	wire_text_copy(dst, 0, (const uint8_t *)"abc", 3);
	ck_assert_int_eq(dst[0], 'z');
}
END_TEST

/* WRITE_SEGS and READ_SEGS: header bounds, the table's layout, hostile tables. */
START_TEST(segs_codec)
{
	struct wire_seg in[3] = {{.offset = 0x1000, .length = 5},
				 {.offset = 7, .length = 0x20000},
				 {.offset = UINT64_MAX - 9, .length = 9}};
	struct wire_seg out[WIRE_SEGS_MAX];
	uint8_t table[WIRE_SEGS_MAX * WIRE_SEG_BYTES + 16];
	struct wire_header h = {.type = WIRE_WRITE_SEGS,
				.flags = WIRE_F_HAS_IMM,
				.imm = 3,
				.offset = 3,
				.length = 5 + 0x20000 + 9};
	uint8_t buf[WIRE_HEADER_BYTES];
	struct wire_header d;

	wire_header_encode(&h, buf);
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &d), 0);
	ck_assert_uint_eq(wire_payload_bytes(&d), 3 * WIRE_SEG_BYTES + h.length);
	ck_assert_str_eq(wire_type_name(WIRE_WRITE_SEGS), "WRITE_SEGS");
	wire_segs_encode(in, 3, table);
	/* Entry 1, little-endian: offset then length. */
	ck_assert_uint_eq(table[16], 7);
	ck_assert_uint_eq(table[24 + 2], 2);
	ck_assert_int_eq(wire_segs_decode(&d, table, 3 * WIRE_SEG_BYTES, out), 0);
	for (int i = 0; i < 3; i++) {
		ck_assert_uint_eq(out[i].offset, in[i].offset);
		ck_assert_uint_eq(out[i].length, in[i].length);
	}
	/* The table must be exactly as long as the header says. */
	ck_assert_int_eq(wire_segs_decode(&d, table, 2 * WIRE_SEG_BYTES, out),
			 RDMAX_E_PROTOCOL_ERROR);
	ck_assert_int_eq(wire_segs_decode(&d, table, 4 * WIRE_SEG_BYTES, out),
			 RDMAX_E_PROTOCOL_ERROR);

	/* Header bounds: 1..WIRE_SEGS_MAX entries, at least a byte each, a data cap, no status. */
	struct {
		uint64_t n, length;
		uint32_t status;
		int want;
	} hdr[] = {
		{0, 10, 0, RDMAX_E_PROTOCOL_ERROR},
		{WIRE_SEGS_MAX + 1, 1 << 20, 0, RDMAX_E_PROTOCOL_ERROR},
		{UINT64_MAX, UINT64_MAX, 0, RDMAX_E_PROTOCOL_ERROR},
		{4, 3, 0, RDMAX_E_PROTOCOL_ERROR},
		{1, WIRE_SEGS_DATA_MAX + 1, 0, RDMAX_E_PROTOCOL_ERROR},
		{1, 1, 5, RDMAX_E_PROTOCOL_ERROR},
		{WIRE_SEGS_MAX, WIRE_SEGS_DATA_MAX, 0, 0},
		{1, 1, 0, 0},
	};
	/* READ_SEGS: the same bounds; it carries its table and nothing after it. */
	static const uint8_t types[] = {WIRE_WRITE_SEGS, WIRE_READ_SEGS};
	for (size_t t = 0; t < sizeof(types); t++) {
		for (size_t i = 0; i < sizeof(hdr) / sizeof(hdr[0]); i++) {
			struct wire_header x = {.type = types[t],
						.offset = hdr[i].n,
						.length = hdr[i].length,
						.status = hdr[i].status};
			wire_header_encode(&x, buf);
			ck_assert_msg(wire_header_decode(buf, sizeof(buf), &d) == hdr[i].want,
				      "%s case %zu", wire_type_name(types[t]), i);
			if (hdr[i].want == 0) {
				ck_assert_uint_eq(wire_payload_bytes(&d),
						  hdr[i].n * WIRE_SEG_BYTES +
							  (t == 0 ? hdr[i].length : 0));
			}
		}
	}

	/* Hostile tables under a valid header. */
	struct {
		struct wire_seg segs[3];
		uint64_t length;
	} bad[] = {
		{{{0, 10}, {10, 0}, {20, 10}}, 20},             /* an empty segment */
		{{{0, 10}, {10, 10}, {20, 10}}, 31},            /* sum short of length */
		{{{0, 10}, {10, 10}, {20, 10}}, 29},            /* sum beyond length */
		{{{UINT64_MAX - 4, 10}, {0, 10}, {0, 10}}, 30}, /* end past 64 bits */
		{{{0, UINT64_MAX / 2 + 1}, {0, UINT64_MAX / 2 + 1}, {0, 2}}, 4},   /* sum wraps */
		{{{0, 1ull << 39}, {0, 1ull << 39}, {0, 1ull << 39}}, 3ull << 38}, /* over length */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct wire_header x = {
			.type = WIRE_WRITE_SEGS, .offset = 3, .length = bad[i].length};
		wire_segs_encode(bad[i].segs, 3, table);
		ck_assert_msg(wire_segs_decode(&x, table, 3 * WIRE_SEG_BYTES, out) ==
				      RDMAX_E_PROTOCOL_ERROR,
			      "table %zu accepted", i);
	}
	/* The largest table: WIRE_SEGS_MAX one-byte segments. */
	for (uint32_t i = 0; i < WIRE_SEGS_MAX; i++) {
		in[0] = (struct wire_seg){.offset = (uint64_t)i * 2, .length = 1};
		wire_segs_encode(in, 1, table + (size_t)i * WIRE_SEG_BYTES);
	}
	struct wire_header max = {
		.type = WIRE_WRITE_SEGS, .offset = WIRE_SEGS_MAX, .length = WIRE_SEGS_MAX};
	ck_assert_int_eq(wire_segs_decode(&max, table, WIRE_SEGS_MAX * WIRE_SEG_BYTES, out), 0);
	ck_assert_uint_eq(out[WIRE_SEGS_MAX - 1].offset, 2 * (WIRE_SEGS_MAX - 1));
	/* A READ_SEGS takes the same table. */
	max.type = WIRE_READ_SEGS;
	ck_assert_int_eq(wire_segs_decode(&max, table, WIRE_SEGS_MAX * WIRE_SEG_BYTES, out), 0);
	ck_assert_str_eq(wire_type_name(WIRE_READ_SEGS), "READ_SEGS");
	/* A read counts no imm. */
	struct wire_header rs = {.type = WIRE_READ_SEGS,
				 .flags = WIRE_F_HAS_IMM,
				 .imm = 3,
				 .offset = 1,
				 .length = 1};
	wire_header_encode(&rs, buf);
	ck_assert_int_eq(wire_header_decode(buf, sizeof(buf), &d), RDMAX_E_PROTOCOL_ERROR);
	/* Only the *_SEGS frames have a table. */
	max.type = WIRE_WRITE;
	ck_assert_int_eq(wire_segs_decode(&max, table, WIRE_SEGS_MAX * WIRE_SEG_BYTES, out),
			 RDMAX_E_PROTOCOL_ERROR);
	max.type = WIRE_READ_REQ;
	ck_assert_int_eq(wire_segs_decode(&max, table, WIRE_SEGS_MAX * WIRE_SEG_BYTES, out),
			 RDMAX_E_PROTOCOL_ERROR);
}
END_TEST

Suite *wire_suite(void);

Suite *wire_suite(void)
{
	Suite *s = suite_create("wire");
	TCase *tc = tcase_create("frames");

	tcase_set_timeout(tc, 5);
	tcase_add_test(tc, header_round_trip);
	tcase_add_test(tc, header_layout_little_endian);
	tcase_add_test(tc, header_round_trip_extremes);
	tcase_add_test(tc, header_truncated);
	tcase_add_test(tc, header_garbage);
	tcase_add_test(tc, header_unknown_types);
	tcase_add_test(tc, header_type_rules);
	tcase_add_test(tc, hello_round_trip);
	tcase_add_test(tc, hello_garbage);
	tcase_add_test(tc, text_copy_bounds);
	tcase_add_test(tc, segs_codec);
	suite_add_tcase(s, tc);

	suite_add_tcase(s, unit_tcp_transport_tcase());
	return s;
}
