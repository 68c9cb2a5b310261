/* SPDX-License-Identifier: MIT */
/*
 * Daemon-to-daemon TCP wire format (docs/protocol.md, "TCP wire format").
 * Every frame is a fixed 64-byte little-endian header followed by
 * wire_payload_bytes() bytes. Encoding and decoding are explicit byte
 * operations with bounds checks; no struct is ever sent as it lies in memory.
 */
#ifndef RDMAXD_WIRE_H
#define RDMAXD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC               0x57584452u /* "RDXW" as bytes on the wire */
#define WIRE_VERSION             1
#define WIRE_HEADER_BYTES        64
#define WIRE_NONCE_BYTES         32
#define WIRE_MAC_BYTES           32
#define WIRE_NODE_NAME_BYTES     64
#define WIRE_HELLO_BYTES         112          /* version, flags, instance, nonce, node name */
#define WIRE_MESSAGE_MAX         160          /* text of ACK / ERROR / failed READ_RESP */
#define WIRE_BODY_MAX            256          /* largest body of a non-data frame */
#define WIRE_MAILBOX_NAME_MAX    75           /* MESSAGE: bytes of the scoped mailbox name */
#define WIRE_MESSAGE_PAYLOAD_MAX (64u << 10)  /* MESSAGE: bytes of the payload */
#define WIRE_SEGS_MAX            256          /* WRITE_SEGS, READ_SEGS: segments in one frame */
#define WIRE_SEG_BYTES           16           /* one entry of a segment table */
#define WIRE_SEGS_DATA_MAX       (1ull << 40) /* WRITE_SEGS, READ_SEGS: data bytes of one frame */
#define WIRE_LOOKUP_REPLY_MAX    1024         /* ACK of status 0 to a lookup: descriptor bytes */

/* Frame types; 0 and values from WIRE_TYPE_MAX up are invalid. */
enum wire_type {
	WIRE_HELLO = 1,     /* handshake: wire_hello body, both directions */
	WIRE_AUTH = 2,      /* handshake: 32-byte HMAC, both directions */
	WIRE_WRITE = 3,     /* request: `length` payload bytes for (region, offset) */
	WIRE_READ_REQ = 4,  /* request: send `length` bytes of (region, offset); no body */
	WIRE_READ_RESP = 5, /* answer: status 0 + `length` data bytes, or status + message */
	WIRE_ACK = 6, /* answer to WRITE or MESSAGE: status + message (length = message bytes); to a
		       * lookup MESSAGE status 0 + the descriptor */
	WIRE_ERROR = 7,   /* fatal: status + message, then the sender closes */
	WIRE_MESSAGE = 8, /* request: scoped mailbox name (`offset` bytes) then payload; key in
			     region_key */
	/*
	 * request: a segment table of `offset` entries (1..WIRE_SEGS_MAX) for
	 * one region, then `length` data bytes, the segments' bytes in table
	 * order; one ACK answers the whole frame.
	 */
	WIRE_WRITE_SEGS = 9,
	/*
	 * request: a segment table of `offset` entries for one region and no
	 * data; one READ_RESP answers with the `length` bytes of the segments
	 * in table order.
	 */
	WIRE_READ_SEGS = 10,
	WIRE_TYPE_MAX, /* terminator */
};

#define WIRE_F_HAS_IMM     0x01u /* WRITE, WRITE_SEGS: count one landing under `imm` */
#define WIRE_HELLO_F_AUTH  0x1u  /* HELLO: the sender requires HMAC authentication */
#define WIRE_HELLO_F_BOUND 0x2u  /* HELLO: its proof binds both ends of the connection */
#define WIRE_HELLO_F_SEGS  0x4u  /* HELLO: the sender takes WRITE_SEGS (else: WRITEs only) */
#define WIRE_HELLO_F_TLS   0x8u  /* HELLO: sent inside TLS 1.3 with the shared key's PSK */
/* HELLO: the sender opened this connection for latency-class requests only (ignored before) */
#define WIRE_HELLO_F_LATENCY 0x10u
/* HELLO: the sender takes READ_SEGS (else: READ_REQs only) */
#define WIRE_HELLO_F_READ_SEGS 0x20u

struct wire_header {
	uint8_t type;        /* enum wire_type */
	uint8_t flags;       /* WIRE_F_* */
	uint32_t status;     /* rdmax.v1.Status of an answer; 0 in requests */
	uint32_t imm;        /* WRITE with WIRE_F_HAS_IMM */
	uint64_t request_id; /* chosen by the requester, echoed in the answer */
	uint64_t instance;   /* target daemon start (descriptor's instance id) */
	uint64_t region_id;
	uint64_t region_key;
	uint64_t offset; /* in the target region; MESSAGE: bytes of the mailbox name */
	uint64_t length; /* data bytes, or body bytes for non-data frames */
};

struct wire_hello {
	uint16_t version;     /* WIRE_VERSION of the sender */
	uint16_t flags;       /* WIRE_HELLO_F_* */
	uint64_t instance_id; /* sender's daemon start */
	uint8_t nonce[WIRE_NONCE_BYTES];
	char node_name[WIRE_NODE_NAME_BYTES]; /* NUL-terminated after decode */
};

/* Write the header into out (WIRE_HEADER_BYTES). */
void wire_header_encode(const struct wire_header *header, uint8_t *out);

/*
 * Parse and check a header: magic, known type, flags valid for the type,
 * reserved bits zero, body lengths within their bounds.
 * \return 0, or RDMAX_E_PROTOCOL_ERROR for a short buffer or a bad header
 */
int wire_header_decode(const uint8_t *buf, size_t len, struct wire_header *ret_header);

/* Bytes that follow this (decoded) header on the wire. */
uint64_t wire_payload_bytes(const struct wire_header *header);

/* One entry of a segment table: a byte range of the frame's region. */
struct wire_seg {
	uint64_t offset;
	uint64_t length;
};

/* Write n entries (n * WIRE_SEG_BYTES bytes) into out. */
void wire_segs_encode(const struct wire_seg *segs, uint32_t n, uint8_t *out);

/*
 * Parse and check the segment table of a WRITE_SEGS or READ_SEGS header h (buf holds
 * h->offset * WIRE_SEG_BYTES bytes): every segment non-empty, its end within
 * 64 bits, and the lengths summing to h->length exactly. Ranges against the
 * region are the receiver's to check.
 * \return 0, or RDMAX_E_PROTOCOL_ERROR
 */
int wire_segs_decode(const struct wire_header *h, const uint8_t *buf, size_t len,
		     struct wire_seg *ret_segs);

/* \return WIRE_HELLO_BYTES, or -ENOSPC when size is too small */
int wire_hello_encode(const struct wire_hello *hello, uint8_t *out, size_t size);

/*
 * Parse a HELLO body. Longer bodies (a later version's extra fields) are
 * accepted; the node name is made printable and NUL-terminated.
 * \return 0 or RDMAX_E_PROTOCOL_ERROR
 */
int wire_hello_decode(const uint8_t *buf, size_t len, struct wire_hello *ret_hello);

/*
 * Copy peer-supplied text into dst as a printable NUL-terminated string
 * (control and non-ASCII bytes become '?'), truncating to dst_size - 1.
 */
void wire_text_copy(char *dst, size_t dst_size, const uint8_t *src, size_t len);

/* Name of a frame type for logs ("WRITE"), "unknown" for others. */
const char *wire_type_name(unsigned type);

#endif
