/* SPDX-License-Identifier: MIT */
/*
 * Framing of SEND messages (mailboxes) over the verbs transport: encoding,
 * strict decoding and reassembly of frames. Pure codec; the connections that
 * carry the frames are conn.h's.
 */
#ifndef RDMAXD_CONN_MSG_H
#define RDMAXD_CONN_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "rdmax.h"
#include "transport.h"

#define CONN_MSG_MAX RDMAX_MESSAGE_MAX /* bytes of a failure text, NUL included */

/*
 * SEND messages (mailboxes) ride the same QPs as one-sided xfers. The
 * requester cuts a message into frames, each one two-sided SEND into one
 * receive buffer of the peer's SRQ (CONN_FRAME_MAX bytes), and the peer
 * answers with one frame carrying the mailbox's status; the answer completes
 * the message. Every frame repeats the message's id and sizes, so the
 * receiver checks each one on its own before it copies a byte.
 *
 * Frame header (CONN_FRAME_HDR bytes, little-endian):
 *   0 magic u32 "RXM1" | 4 version u8 | 5 type u8 | 6 name_len u8 | 7 from_len u8
 *   8 id u64 | 16 payload_len u32 (answer: status i32) | 20 offset u32 (answer:
 *   text_len u32) | 24 key u64 (message: the mailbox's key, the same in every
 *   frame of a message, 0 for the daemon's reserved mailboxes; answer: zero)
 * Message frame data: bytes [offset, offset + n) of the body, which is the
 * mailbox name, the sender's node name and the payload; every frame but the
 * last carries CONN_FRAME_DATA bytes. Answer data: the text (no NUL).
 */
#define CONN_FRAME_MAX  4096 /* bytes of one frame: every SRQ receive buffer holds one */
#define CONN_FRAME_HDR  32
#define CONN_FRAME_DATA (CONN_FRAME_MAX - CONN_FRAME_HDR)
#define CONN_FROM_MAX   63 /* bytes of the sender's node name */
#define CONN_MSG_BODY_MAX                                                                          \
	(TRANSPORT_MAILBOX_NAME_MAX + CONN_FROM_MAX + TRANSPORT_MESSAGE_PAYLOAD_MAX)
#define CONN_MSG_FRAMES_MAX ((CONN_MSG_BODY_MAX + CONN_FRAME_DATA - 1) / CONN_FRAME_DATA)
/* Staging of one message: frame i at i * CONN_FRAME_MAX. */
#define CONN_MSG_STAGING     (CONN_MSG_FRAMES_MAX * CONN_FRAME_MAX)
#define CONN_ANSWER_TEXT_MAX (CONN_MSG_MAX - 1)
/* An answer of status 0 to a lookup carries the descriptor instead of text. */
#define CONN_ANSWER_DATA_MAX       TRANSPORT_REPLY_MAX
#define CONN_ANSWER_MAX            (CONN_FRAME_HDR + CONN_ANSWER_TEXT_MAX)
#define CONN_ANSWER_DATA_FRAME_MAX (CONN_FRAME_HDR + CONN_ANSWER_DATA_MAX)
#define CONN_FRAME_MAGIC           0x314d5852u /* "RXM1" little-endian */

enum conn_frame_type {
	CONN_FRAME_MESSAGE = 1, /* part of a message, requester -> owner of the mailbox */
	CONN_FRAME_ANSWER = 2,  /* the mailbox's status for a message, back */
	CONN_FRAME_TYPE_MAX,    /* terminator */
};

/* A checked frame; data points into the buffer it was decoded from. */
struct conn_frame {
	enum conn_frame_type type;
	uint64_t id; /* the requester's message id, never 0 */
	uint8_t name_len;
	uint8_t from_len;
	uint32_t payload_len;
	uint32_t offset;     /* body bytes before this frame's data */
	uint64_t key;        /* message: the mailbox's key */
	int status;          /* answer: 0 or RDMAX_E_* */
	const uint8_t *data; /* message: body bytes; answer: text */
	uint32_t data_len;
};

/* Frames of a message body of body_len bytes, and the wire length of frame i. */
uint32_t conn_msg_frames(uint64_t body_len);
uint32_t conn_msg_frame_len(uint64_t body_len, uint32_t index);

/*
 * Lay out a message's frames in staging (size >= CONN_MSG_STAGING for the
 * largest message): frame i at i * CONN_FRAME_MAX.
 * \param name the mailbox's scoped name (or a reserved one), \param key its key
 * \param from the sender's node name (0..CONN_FROM_MAX bytes)
 * \return the body length, or RDMAX_E_INVALID_ARGUMENT / -ENOSPC
 */
int conn_msg_encode(uint8_t *staging, size_t size, uint64_t id, const char *name, uint64_t key,
		    const char *from, const uint8_t *payload, uint32_t payload_len);

/* An answer frame (text cut to CONN_ANSWER_TEXT_MAX); returns its length or -ENOSPC. */
int conn_answer_encode(uint8_t *buf, size_t size, uint64_t id, int status, const char *text);

/* An answer of status 0 carrying len (<= CONN_ANSWER_DATA_MAX) bytes; length or -ENOSPC. */
int conn_answer_encode_data(uint8_t *buf, size_t size, uint64_t id, const uint8_t *data,
			    size_t len);

/*
 * Check one received frame of len bytes without trusting any of it: sizes
 * within their limits, the data exactly where the sizes put it, statuses
 * that exist. \return 0 or RDMAX_E_PROTOCOL_ERROR
 */
int conn_frame_decode(const uint8_t *buf, size_t len, struct conn_frame *ret_frame);

/* Reassembly of one QP's incoming message (RC keeps its frames in order). */
struct conn_msg_rx {
	uint64_t id;
	uint64_t key;
	uint8_t name_len;
	uint8_t from_len;
	uint32_t payload_len;
	uint32_t got;        /* body bytes so far */
	const uint8_t *body; /* name | from | payload once complete */
	uint8_t *owned;      /* the reassembly buffer (NULL for a one-frame message) */
};

/*
 * Feed a decoded message frame. Returns 1 when the message is complete (body
 * valid until conn_msg_rx_reset()), 0 when more frames follow, or
 * RDMAX_E_PROTOCOL_ERROR (out of order, sizes that change, a sender name that
 * is not printable) / -ENOMEM; the caller then resets.
 */
int conn_msg_rx_feed(struct conn_msg_rx *rx, const struct conn_frame *frame);
void conn_msg_rx_reset(struct conn_msg_rx *rx);

#endif
