/* SPDX-License-Identifier: MIT */
/*
 * Frames handled once their header is in. Requester: the answer (ACK or
 * READ_RESP) is matched to the oldest request in flight and completes its
 * xfer. Responder: WRITE, WRITE_SEGS, READ_REQ, READ_SEGS and MESSAGE are validated
 * with region_get_remote() (or the mailbox and name checks) before any byte
 * of memory is touched, and every request gets exactly one answer, a refusal
 * naming why. It never writes outside a validated range.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "imm.h"
#include "mailbox.h"
#include "names.h"
#include "region.h"
#include "status.h"
#include "tcp_internal.h"

/* ---- requester: answers ---- */

static int map_remote(uint32_t status)
{
	int err = err_from_status((int)status);

	/* The peer refusing an access is the remote side's decision, not ours. */
	if (err >= 0 || err == RDMAX_E_PERMISSION_DENIED) {
		return RDMAX_E_REMOTE_ACCESS;
	}
	return err;
}

void tcp_complete_request(struct tcp_conn *conn)
{
	struct frame *frame = conn->rx_req;
	struct xfer *xfer = frame->xfer;
	char text[WIRE_MESSAGE_MAX + 1];
	char message[MSG_BYTES];
	int err = 0;

	if (frame == conn->withdrawn) {
		conn->withdrawn = NULL; /* answered before the timer released it: done below does */
	}

	message[0] = '\0'; /* not "= {0}": clearing all of it costs more than the rest */
	if (conn->rx_h.status != 0) {
		err = map_remote(conn->rx_h.status);
		wire_text_copy(text, sizeof(text), conn->rx_body, conn->rx_h.length);
		snprintf(message, sizeof(message), "%s: %s", conn->name,
			 text[0] ? text : status_name((int)conn->rx_h.status));
	} else if (xfer->op == XFER_READ) {
		xfer->bytes_done = xfer->length;
	} else if (xfer->reply) {
		/* A lookup's answer: the descriptor, checked by the asker before use. */
		if (conn->rx_h.length == 0 || conn->rx_h.length > xfer->reply_size) {
			err = RDMAX_E_PROTOCOL_ERROR;
			snprintf(message, sizeof(message), "%s answered a lookup with %llu bytes",
				 conn->name, (unsigned long long)conn->rx_h.length);
		} else {
			memcpy(xfer->reply, conn->rx_body, conn->rx_h.length);
			xfer->reply_len = (uint32_t)conn->rx_h.length;
		}
	}
	/* An orphan's xfer is its ghost, inside the frame: released with it, never done. */
	bool orphan = frame->orphan;
	list_del(&frame->link);
	bool more = frame->more;
	tcp_frame_release(conn->tt, frame);
	conn->rx_req = NULL;
	if (orphan) {
		return;
	}
	if (more) {
		/* A WRITE cut from a WRITE_SEGS: its xfer completes with the last one. */
		if (err && conn->part_id != xfer->wire_id) {
			conn->part_id = xfer->wire_id;
			conn->part_err = err;
			copy_string(conn->part_msg, sizeof(conn->part_msg), message);
		}
		return;
	}
	if (conn->part_id == xfer->wire_id && conn->part_id != 0) {
		conn->part_id = 0; /* an earlier WRITE of the cut xfer was refused */
		xfer->done(xfer, conn->part_err, conn->part_msg);
		return;
	}
	xfer->done(xfer, err, message);
}

/* The segment table buffers, on a connection's first segment list. */
static int segs_memory(struct tcp_conn *conn)
{
	if (!conn->rx_segtab) {
		conn->rx_segtab = malloc((size_t)WIRE_SEGS_MAX * WIRE_SEG_BYTES);
		conn->rx_segs = malloc(WIRE_SEGS_MAX * sizeof(*conn->rx_segs));
		if (!conn->rx_segtab || !conn->rx_segs) {
			tcp_conn_lost(conn, LOG_ERR, "out of memory");
			return -ENOMEM;
		}
	}
	return 0;
}

void tcp_on_answer_header(struct tcp_conn *conn)
{
	const struct wire_header *h = &conn->rx_h;
	struct frame *frame = NULL;

	tcp_offload_answered(conn, h->request_id);
	if (!list_empty(&conn->inflight)) {
		frame = container_of(conn->inflight.next, struct frame, link);
	}
	if (!frame || frame->xfer->wire_id != h->request_id ||
	    (h->type == WIRE_ACK) != (frame->xfer->op == XFER_WRITE)) {
		tcp_protocol_error(conn, "%s for request %llu, which is not the oldest in flight",
				   wire_type_name(h->type), (unsigned long long)h->request_id);
		return;
	}
	struct xfer *xfer = frame->xfer;
	/* A READ_REQ cut from a READ_SEGS reads one run; a READ_SEGS all of the xfer's. */
	uint64_t want = frame->read_part ? frame->read_len : xfer->length;
	conn->rx_req = frame;
	if (h->type == WIRE_ACK || h->status != 0) {
		tcp_rx_expect(conn, RX_BODY, conn->rx_body, h->length);
	} else if (frame->orphan && h->length == want) {
		/* Its job completed: the memory is no longer the job's to write. */
		tcp_rx_expect(conn, RX_DISCARD, NULL, h->length);
	} else if (h->length != want) {
		tcp_protocol_error(conn, "READ_RESP of %llu bytes for a read of %llu",
				   (unsigned long long)h->length, (unsigned long long)want);
	} else if (frame->read_part) {
		tcp_rx_expect(conn, RX_DATA, xfer->local->addr + frame->read_offset, h->length);
	} else if (xfer->n_runs > 0) {
		/* A READ_SEGS answer: the runs' bytes in order, each into its local range. */
		if (segs_memory(conn) < 0) {
			return;
		}
		for (uint32_t i = 0; i < xfer->n_runs; i++) {
			conn->rx_segs[i] = (struct wire_seg){.offset = xfer->runs[i].local_offset,
							     .length = xfer->runs[i].length};
		}
		tcp_rx_segs_start(conn, xfer->local->addr, xfer->n_runs);
	} else {
		tcp_rx_expect(conn, RX_DATA,
			      h->length ? xfer->local->addr + xfer->local_offset : NULL, h->length);
	}
}

/* ---- responder: requests ---- */

static void describe_refusal(char *buf, size_t size, int err, const struct wire_header *h)
{
	unsigned long long id = (unsigned long long)h->region_id;
	const char *what = h->type == WIRE_READ_REQ || h->type == WIRE_READ_SEGS ? "read" : "write";

	switch (err) {
	case RDMAX_E_NOT_FOUND:
		snprintf(buf, size, "region %llu not found (stale descriptor or deregistered)", id);
		break;
	case RDMAX_E_OUT_OF_RANGE:
		snprintf(buf, size, "range %llu+%llu is outside region %llu",
			 (unsigned long long)h->offset, (unsigned long long)h->length, id);
		break;
	case RDMAX_E_PERMISSION_DENIED:
		snprintf(buf, size, "region %llu is not registered for remote %s", id, what);
		break;
	default:
		snprintf(buf, size, "remote %s of region %llu failed: %s", what, id,
			 status_name(status_from_err(err)));
		break;
	}
}

/* region_get_remote() decides; the range is checked again here as belt and braces. */
static int get_target(struct tcp_conn *conn, uint32_t access, struct region **ret_region)
{
	struct region_table *regions = &conn->tt->daemon->regions;
	const struct wire_header *h = &conn->rx_h;
	struct region *region;

	int err = region_get_remote(regions, h->instance, h->region_id, h->region_key, h->offset,
				    h->length, access, &region);
	if (err < 0) {
		return err;
	}
	if (h->offset > region->length || h->length > region->length - h->offset) {
		err = RDMAX_E_OUT_OF_RANGE;
	} else if (!region->addr && h->length > 0) {
		err = RDMAX_E_GPU_NEEDS_RDMA; /* no host mapping (GPU memory) */
	} else if (access == RDMAX_ACCESS_REMOTE_WRITE && !region->writable) {
		err = RDMAX_E_PERMISSION_DENIED;
	}
	if (err < 0) {
		region_put(regions, region);
		return err;
	}
	*ret_region = region;
	return 0;
}

/*
 * MESSAGE for a mailbox of this daemon: the body (name, then payload) is
 * bounded by wire_header_decode(), so it is received whole, then delivered.
 */
static void on_message_request(struct tcp_conn *conn)
{
	const struct wire_header *h = &conn->rx_h;
	struct rdmaxd *d = conn->tt->daemon;

	conn->rx_err = 0;
	if (h->instance != d->instance_id &&
	    h->instance != 0) { /* 0: a lookup, checked at the end */
		conn->rx_err = RDMAX_E_NOT_FOUND;
		snprintf(conn->rx_msg, sizeof(conn->rx_msg),
			 "node '%s' restarted since the descriptor was made (stale descriptor)",
			 d->node_name);
	} else if (!(conn->rx_msgbuf = malloc(h->length))) {
		conn->rx_err = RDMAX_E_RESOURCE_EXHAUSTED;
		snprintf(conn->rx_msg, sizeof(conn->rx_msg), "node '%s' is out of memory",
			 d->node_name);
	}
	if (conn->rx_err) {
		tcp_rx_expect(conn, RX_DISCARD, NULL, h->length);
		return;
	}
	tcp_rx_expect(conn, RX_DATA, conn->rx_msgbuf, h->length);
}

/* A lookup of a named region: answered with the descriptor, or refused with a reason. */
static void serve_lookup(struct tcp_conn *conn, const uint8_t *name, size_t len)
{
	struct rdmaxd *d = conn->tt->daemon;
	uint8_t *desc = malloc(WIRE_LOOKUP_REPLY_MAX);
	int n = desc ? names_serve(d->names, d->node_name, name, len, desc, WIRE_LOOKUP_REPLY_MAX,
				   conn->rx_msg, sizeof(conn->rx_msg))
		     : -ENOMEM;

	if (n < 0) {
		free(desc);
		if (n == -ENOMEM) {
			snprintf(conn->rx_msg, sizeof(conn->rx_msg), "node '%s' is out of memory",
				 d->node_name);
		}
		log_ratelimited(&conn->tt->rl, LOG_DEBUG, "refused lookup from %s: %s", conn->name,
				conn->rx_msg);
		tcp_queue_small(conn, WIRE_ACK, n, conn->rx_msg, strlen(conn->rx_msg));
		return;
	}
	struct wire_header h = {
		.type = WIRE_ACK, .request_id = conn->rx_h.request_id, .length = (uint64_t)n};
	struct frame *frame = tcp_frame_new(conn->tt, &h, NULL, 0);
	if (!frame) {
		free(desc);
		tcp_conn_lost(conn, LOG_ERR, "out of memory");
		return;
	}
	frame->owned = desc;
	frame->payload = desc;
	frame->payload_len = (uint64_t)n;
	tcp_queue_frame(conn, frame);
}

void tcp_on_message_done(struct tcp_conn *conn, bool received)
{
	struct rdmaxd *d = conn->tt->daemon;
	char name[WIRE_MAILBOX_NAME_MAX + 1];
	size_t name_len = conn->rx_h.offset;
	int err = conn->rx_err;

	if (received) {
		uint8_t *body = conn->rx_msgbuf;
		conn->rx_msgbuf = NULL;
		wire_text_copy(name, sizeof(name), body, name_len);
		if (strcmp(name, TRANSPORT_LOOKUP_MAILBOX) == 0 && !memchr(body, '\0', name_len)) {
			serve_lookup(conn, body + name_len, conn->rx_h.length - name_len);
			free(body);
			return;
		}
		if (conn->rx_h.instance == 0) {
			err = RDMAX_E_NOT_FOUND;
			snprintf(conn->rx_msg, sizeof(conn->rx_msg),
				 "a message must name the instance of node '%s'", d->node_name);
		} else if (memchr(body, '\0', name_len) ||
			   mailbox_scoped_check(name, name_len) < 0) {
			err = RDMAX_E_INVALID_ARGUMENT;
			snprintf(conn->rx_msg, sizeof(conn->rx_msg),
				 "mailbox name '%s' is not valid", name);
		} else {
			err = mailbox_deliver(d->mailboxes, name, conn->rx_h.region_key,
					      body + name_len, conn->rx_h.length - name_len,
					      conn->node_name);
			if (err == RDMAX_E_NOT_FOUND) {
				snprintf(conn->rx_msg, sizeof(conn->rx_msg),
					 "no mailbox '%s' with this key is open on node '%.32s'",
					 name, d->node_name);
			} else if (err < 0) {
				snprintf(conn->rx_msg, sizeof(conn->rx_msg),
					 "mailbox '%s' refused the message: %s", name,
					 rdmax_strerror(err));
			}
		}
		free(body);
	}
	if (err < 0) {
		log_ratelimited(&conn->tt->rl, LOG_INFO, "refused MESSAGE from %s: %s", conn->name,
				conn->rx_msg);
		tcp_queue_small(conn, WIRE_ACK, err, conn->rx_msg, strlen(conn->rx_msg));
		return;
	}
	tcp_queue_small(conn, WIRE_ACK, 0, NULL, 0);
}

/* WRITE_SEGS, READ_SEGS: the table comes first, bounded by wire_header_decode() (4 KiB). */
static void on_segs_request(struct tcp_conn *conn)
{
	if (segs_memory(conn) < 0) {
		return;
	}
	tcp_rx_expect(conn, RX_SEGTAB, conn->rx_segtab, conn->rx_h.offset * WIRE_SEG_BYTES);
}

/*
 * The READ_RESP to a READ_SEGS whose every segment was checked: the
 * segments' bytes in table order, sent straight from the region, which the
 * frame references until its last byte left.
 */
static void answer_read_segs(struct tcp_conn *conn, struct region *region)
{
	const struct wire_header *h = &conn->rx_h;
	uint32_t n = (uint32_t)h->offset;
	struct wire_header resp = {
		.type = WIRE_READ_RESP, .request_id = h->request_id, .length = h->length};
	struct frame *frame = tcp_frame_new(conn->tt, &resp, NULL, 0);
	struct plan_run *runs = frame ? malloc(n * sizeof(*runs)) : NULL;

	if (!runs) {
		if (frame) {
			tcp_frame_release(conn->tt, frame);
		}
		region_put(&conn->tt->daemon->regions, region);
		tcp_conn_lost(conn, LOG_ERR, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		runs[i] = (struct plan_run){.local_offset = conn->rx_segs[i].offset,
					    .length = conn->rx_segs[i].length};
	}
	frame->region = region;
	frame->owned = (uint8_t *)runs; /* freed with the frame */
	frame->runs = runs;
	frame->n_runs = n;
	frame->base = region->addr;
	frame->payload_len = h->length;
	tcp_queue_frame(conn, frame);
}

/*
 * The table of a WRITE_SEGS or READ_SEGS is in: every segment is checked
 * against the region (instance, key, bounds, remote write or read) before
 * any byte is touched; a refusal names the first bad segment and answers
 * once (a WRITE_SEGS's data is dropped first), and nothing of the frame
 * lands or leaves.
 */
void tcp_on_segtab(struct tcp_conn *conn)
{
	struct region_table *regions = &conn->tt->daemon->regions;
	const struct wire_header *h = &conn->rx_h;
	struct wire_seg *segs = conn->rx_segs;
	struct region *region = NULL;
	uint32_t n = (uint32_t)h->offset, i = 0;
	bool write = h->type == WIRE_WRITE_SEGS;

	if (wire_segs_decode(h, conn->rx_segtab, conn->rx_len, segs) < 0) {
		tcp_protocol_error(conn, "malformed %s segment table", wire_type_name(h->type));
		return;
	}
	int err = region_get_remote(
		regions, h->instance, h->region_id, h->region_key, segs[0].offset, segs[0].length,
		write ? RDMAX_ACCESS_REMOTE_WRITE : RDMAX_ACCESS_REMOTE_READ, &region);
	if (err == 0 && write && !region->writable) {
		err = RDMAX_E_PERMISSION_DENIED;
	} else if (err == 0 && !region->addr) {
		err = RDMAX_E_GPU_NEEDS_RDMA;
	}
	for (; err == 0 && i < n; i++) {
		if (segs[i].offset > region->length ||
		    segs[i].length > region->length - segs[i].offset) {
			err = RDMAX_E_OUT_OF_RANGE;
			break;
		}
	}
	if (err == 0 && !write) {
		tcp_rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES);
		conn->frame_deadline = 0;
		answer_read_segs(conn, region);
		return;
	}
	if (err < 0) {
		if (region) {
			region_put(regions, region);
		}
		if (err == RDMAX_E_OUT_OF_RANGE) {
			snprintf(conn->rx_msg, sizeof(conn->rx_msg),
				 "segment %u: range %llu+%llu is outside region %llu", i,
				 (unsigned long long)segs[i].offset,
				 (unsigned long long)segs[i].length,
				 (unsigned long long)h->region_id);
		} else {
			describe_refusal(conn->rx_msg, sizeof(conn->rx_msg), err, h);
		}
		log_ratelimited(&conn->tt->rl, LOG_INFO, "refused %s from %s: %s",
				wire_type_name(h->type), conn->name, conn->rx_msg);
		if (!write) {
			tcp_rx_expect(conn, RX_HEADER, conn->rx_hdr, WIRE_HEADER_BYTES);
			conn->frame_deadline = 0;
			tcp_queue_small(conn, WIRE_READ_RESP, err, conn->rx_msg,
					strlen(conn->rx_msg));
			return;
		}
		if (h->length > DISCARD_MAX) {
			/* Skipping it would take the peer's time, not ours: no frame is that big.
			 */
			tcp_protocol_error(conn,
					   "refused WRITE_SEGS of %llu bytes is too large to skip",
					   (unsigned long long)h->length);
			return;
		}
		conn->rx_err = err;
		tcp_rx_expect(conn, RX_DISCARD, NULL, h->length);
		return;
	}
	conn->rx_region = region;
	tcp_rx_segs_start(conn, region->addr, n);
}

void tcp_rx_segs_start(struct tcp_conn *conn, uint8_t *base, uint32_t n)
{
	const struct wire_seg *segs = conn->rx_segs;

	conn->rx_seg_base = base;
	conn->rx_n_segs = n;
	conn->rx_seg = 0;
	conn->rx_segs_after = 0;
	for (uint32_t k = 1; k < n; k++) {
		conn->rx_segs_after += segs[k].length;
	}
	tcp_rx_expect(conn, RX_SEGDATA, base + segs[0].offset, segs[0].length);
}

/* The current segment is full: on to the next one. \return false after the last. */
bool tcp_next_seg(struct tcp_conn *conn)
{
	if (conn->rx_seg + 1 >= conn->rx_n_segs) {
		return false;
	}
	const struct wire_seg *seg = &conn->rx_segs[++conn->rx_seg];
	conn->rx_segs_after -= seg->length;
	tcp_rx_expect(conn, RX_SEGDATA, conn->rx_seg_base + seg->offset, seg->length);
	return true;
}

/* WRITE or READ_REQ: validated before any byte of the region is touched. */
void tcp_on_request(struct tcp_conn *conn)
{
	const struct wire_header *h = &conn->rx_h;
	bool write = h->type == WIRE_WRITE;
	struct region *region;

	if (h->type == WIRE_MESSAGE) {
		on_message_request(conn);
		return;
	}
	if ((h->type == WIRE_WRITE_SEGS && conn->tt->no_segs) ||
	    (h->type == WIRE_READ_SEGS && conn->tt->no_read_segs)) {
		tcp_protocol_error(conn, "unknown frame type %u",
				   h->type); /* as a release before them */
		return;
	}
	if (h->type == WIRE_WRITE_SEGS || h->type == WIRE_READ_SEGS) {
		on_segs_request(conn);
		return;
	}

	int err = get_target(conn, write ? RDMAX_ACCESS_REMOTE_WRITE : RDMAX_ACCESS_REMOTE_READ,
			     &region);
	if (err < 0) {
		describe_refusal(conn->rx_msg, sizeof(conn->rx_msg), err, h);
		log_ratelimited(&conn->tt->rl, LOG_INFO, "refused %s from %s: %s",
				wire_type_name(h->type), conn->name, conn->rx_msg);
		if (write && h->length > DISCARD_MAX) {
			/* Skipping it would take the peer's time, not ours: no frame is that big.
			 */
			tcp_protocol_error(conn, "refused WRITE of %llu bytes is too large to skip",
					   (unsigned long long)h->length);
		} else if (write) { /* the payload is on its way: drop it, then answer */
			conn->rx_err = err;
			tcp_rx_expect(conn, RX_DISCARD, NULL, h->length);
		} else {
			tcp_queue_small(conn, WIRE_READ_RESP, err, conn->rx_msg,
					strlen(conn->rx_msg));
		}
		return;
	}
	if (write) {
		conn->rx_region = region;
		tcp_rx_expect(conn, RX_DATA, h->length ? region->addr + h->offset : NULL,
			      h->length);
		return;
	}
	struct wire_header resp = {
		.type = WIRE_READ_RESP, .request_id = h->request_id, .length = h->length};
	struct frame *frame = tcp_frame_new(conn->tt, &resp, NULL, 0);
	if (!frame) {
		region_put(&conn->tt->daemon->regions, region);
		tcp_conn_lost(conn, LOG_ERR, "out of memory");
		return;
	}
	frame->region = region; /* held until the last byte left */
	frame->payload = h->length ? region->addr + h->offset : NULL;
	frame->payload_len = h->length;
	tcp_queue_frame(conn, frame);
}

/* The imm counts only once every byte of the WRITE is in the region. */
void tcp_on_write_done(struct tcp_conn *conn, bool landed)
{
	struct rdmaxd *d = conn->tt->daemon;

	if (!landed) {
		tcp_queue_small(conn, WIRE_ACK, conn->rx_err, conn->rx_msg, strlen(conn->rx_msg));
		return;
	}
	/* The imm counts in the namespace of the region's client (imm.h). */
	void *owner = region_imm_owner(conn->rx_region);
	if (conn->rx_h.flags & WIRE_F_HAS_IMM) {
		imm_landed(&d->imm, owner, conn->rx_h.imm);
	}
	region_put(&d->regions, conn->rx_region);
	conn->rx_region = NULL;
	tcp_queue_small(conn, WIRE_ACK, 0, NULL, 0);
}
