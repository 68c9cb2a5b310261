/* SPDX-License-Identifier: MIT */
/*
 * Straight-line encode and decode of the Job entries the ring carries most
 * (write and read): protobuf-c's generic pack and unpack walk descriptors
 * and cost about 1 500 and 1 900 instructions for a 64-byte write, most of
 * the ring hop's own work. The encoder writes the fields in protobuf-c's
 * order (by field number, required ones always, optional ones when set), so
 * its bytes are the same. The decoder takes only what it can decode to the
 * same values as protobuf-c, and says no to everything else (unknown or
 * repeated fields, values out of a field's range, missing required fields,
 * other kinds), which then goes through protobuf-c as before. Shared by the
 * library and the daemon; no allocation, no state.
 */
#include <string.h>

#include "job_codec.h"

enum {
	WT_VARINT = 0,
	WT_LEN = 2,
};

size_t job_codec_varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* A tag of a field below 16: one byte. */
static uint8_t *put_u64(uint8_t *p, unsigned field, uint64_t v)
{
	*p++ = (uint8_t)(field << 3 | WT_VARINT);
	return put_varint(p, v);
}

static uint8_t *put_bytes(uint8_t *p, unsigned field, const ProtobufCBinaryData *b)
{
	*p++ = (uint8_t)(field << 3 | WT_LEN);
	p = put_varint(p, b->len);
	if (b->len) {
		memcpy(p, b->data, b->len);
	}
	return p + b->len;
}

static size_t write_size(const Rdmax__V1__WriteJob *w)
{
	return 1 + job_codec_varint_len(w->local_region) + 1 +
	       job_codec_varint_len(w->local_offset) + 1 + job_codec_varint_len(w->length) + 1 +
	       job_codec_varint_len(w->remote_desc.len) + w->remote_desc.len + 1 +
	       job_codec_varint_len(w->remote_offset) +
	       (w->has_imm ? 1 + job_codec_varint_len(w->imm) : 0);
}

static size_t read_size(const Rdmax__V1__ReadJob *r)
{
	return 1 + job_codec_varint_len(r->remote_desc.len) + r->remote_desc.len + 1 +
	       job_codec_varint_len(r->remote_offset) + 1 + job_codec_varint_len(r->length) + 1 +
	       job_codec_varint_len(r->local_region) + 1 + job_codec_varint_len(r->local_offset);
}

static size_t kind_size(const Rdmax__V1__Job *job)
{
	if (job->kind_case == RDMAX__V1__JOB__KIND_WRITE && job->write) {
		return write_size(job->write);
	}
	if (job->kind_case == RDMAX__V1__JOB__KIND_READ && job->read) {
		return read_size(job->read);
	}
	return 0;
}

size_t job_codec_size(const Rdmax__V1__Job *job)
{
	size_t kind = kind_size(job);

	if (!kind) {
		return 0;
	}
	return 1 + job_codec_varint_len(job->job_id) +
	       (job->has_deadline_ms ? 1 + job_codec_varint_len(job->deadline_ms) : 0) +
	       (job->has_traffic_class ? 1 + job_codec_varint_len(job->traffic_class) : 0) + 1 +
	       job_codec_varint_len(kind) + kind;
}

void job_codec_pack(const Rdmax__V1__Job *job, uint8_t *out)
{
	uint8_t *p = put_u64(out, 1, job->job_id);
	size_t kind = kind_size(job);

	if (job->has_deadline_ms) {
		p = put_u64(p, 2, job->deadline_ms);
	}
	if (job->has_traffic_class) {
		p = put_u64(p, 3, job->traffic_class);
	}
	if (job->kind_case == RDMAX__V1__JOB__KIND_WRITE) {
		const Rdmax__V1__WriteJob *w = job->write;
		*p++ = 10 << 3 | WT_LEN;
		p = put_varint(p, kind);
		p = put_u64(p, 1, w->local_region);
		p = put_u64(p, 2, w->local_offset);
		p = put_u64(p, 3, w->length);
		p = put_bytes(p, 4, &w->remote_desc);
		p = put_u64(p, 5, w->remote_offset);
		if (w->has_imm) {
			p = put_u64(p, 6, w->imm);
		}
	} else {
		const Rdmax__V1__ReadJob *r = job->read;
		*p++ = 11 << 3 | WT_LEN;
		p = put_varint(p, kind);
		p = put_bytes(p, 1, &r->remote_desc);
		p = put_u64(p, 2, r->remote_offset);
		p = put_u64(p, 3, r->length);
		p = put_u64(p, 4, r->local_region);
		p = put_u64(p, 5, r->local_offset);
	}
}

/*
 * A varint of at most 10 bytes whose value fits 64 bits (protobuf-c drops
 * the bits beyond; such input goes to protobuf-c). 0 when there is none.
 */
static size_t get_varint_long(const uint8_t *p, size_t len, uint64_t *ret)
{
	uint64_t v = 0;

	for (size_t i = 0; i < len && i < 10; i++) {
		if (i == 9 && p[i] > 1) {
			return 0;
		}
		v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
		if (!(p[i] & 0x80)) {
			*ret = v;
			return i + 1;
		}
	}
	return 0;
}

/* Most fields of a job hold values below 128: one byte, no loop. */
static inline size_t get_varint(const uint8_t *p, size_t len, uint64_t *ret)
{
	if (len && p[0] < 0x80) {
		*ret = p[0];
		return 1;
	}
	return get_varint_long(p, len, ret);
}

/* One field of a message: its number, wire type and value (or bytes). */
struct field {
	uint32_t number;
	uint32_t wire;
	uint64_t value; /* WT_VARINT */
	const uint8_t *data;
	size_t len; /* WT_LEN */
};

/* The next field at *off; 0 when the bytes are not a field this decoder takes. */
static inline int next_field(const uint8_t *buf, size_t len, size_t *off, struct field *f)
{
	size_t at = *off, n;

	/* Every field here has a number below 16: a one-byte tag. */
	if (at >= len || buf[at] >= 0x80 || (buf[at] >> 3) == 0) {
		return 0;
	}
	f->number = buf[at] >> 3;
	f->wire = buf[at] & 7;
	at++;
	if (f->wire == WT_VARINT) {
		n = get_varint(buf + at, len - at, &f->value);
		if (!n) {
			return 0;
		}
		*off = at + n;
		return 1;
	}
	if (f->wire == WT_LEN) {
		uint64_t flen;
		n = get_varint(buf + at, len - at, &flen);
		if (!n || flen > len - at - n) {
			return 0;
		}
		at += n;
		f->data = buf + at;
		f->len = (size_t)flen;
		*off = at + (size_t)flen;
		return 1;
	}
	return 0;
}

/* What protobuf-c makes of a bytes field: no pointer when it is empty. */
static void set_bytes(ProtobufCBinaryData *b, const struct field *f)
{
	b->len = f->len;
	b->data = f->len ? (uint8_t *)f->data : NULL;
}

static int unpack_write(const uint8_t *buf, size_t len, Rdmax__V1__WriteJob *w)
{
	uint32_t seen = 0;
	struct field f;

	rdmax__v1__write_job__init(w);
	for (size_t off = 0; off < len;) {
		if (!next_field(buf, len, &off, &f) || f.number > 6 || (seen & (1u << f.number)) ||
		    f.wire != (f.number == 4 ? WT_LEN : WT_VARINT)) {
			return 0;
		}
		seen |= 1u << f.number;
		switch (f.number) {
		case 1:
			w->local_region = f.value;
			break;
		case 2:
			w->local_offset = f.value;
			break;
		case 3:
			w->length = f.value;
			break;
		case 4:
			set_bytes(&w->remote_desc, &f);
			break;
		case 5:
			w->remote_offset = f.value;
			break;
		case 6:
			if (f.value > UINT32_MAX) {
				return 0;
			}
			w->has_imm = 1;
			w->imm = (uint32_t)f.value;
			break;
		}
	}
	return (seen & 0x3e) == 0x3e; /* 1..5 required */
}

static int unpack_read(const uint8_t *buf, size_t len, Rdmax__V1__ReadJob *r)
{
	uint32_t seen = 0;
	struct field f;

	rdmax__v1__read_job__init(r);
	for (size_t off = 0; off < len;) {
		if (!next_field(buf, len, &off, &f) || f.number > 5 || (seen & (1u << f.number)) ||
		    f.wire != (f.number == 1 ? WT_LEN : WT_VARINT)) {
			return 0;
		}
		seen |= 1u << f.number;
		switch (f.number) {
		case 1:
			set_bytes(&r->remote_desc, &f);
			break;
		case 2:
			r->remote_offset = f.value;
			break;
		case 3:
			r->length = f.value;
			break;
		case 4:
			r->local_region = f.value;
			break;
		case 5:
			r->local_offset = f.value;
			break;
		}
	}
	return (seen & 0x3e) == 0x3e;
}

int job_codec_unpack(const uint8_t *buf, size_t len, struct job_codec_msg *ret)
{
	Rdmax__V1__Job *job = &ret->job;
	uint32_t seen = 0;
	struct field f;

	rdmax__v1__job__init(job);
	for (size_t off = 0; off < len;) {
		if (!next_field(buf, len, &off, &f) || (seen & (1u << f.number))) {
			return 0;
		}
		seen |= 1u << f.number;
		switch (f.number) {
		case 1:
			if (f.wire != WT_VARINT) {
				return 0;
			}
			job->job_id = f.value;
			break;
		case 2:
		case 3:
			if (f.wire != WT_VARINT || f.value > UINT32_MAX) {
				return 0;
			}
			if (f.number == 2) {
				job->has_deadline_ms = 1;
				job->deadline_ms = (uint32_t)f.value;
			} else {
				job->has_traffic_class = 1;
				job->traffic_class = (uint32_t)f.value;
			}
			break;
		case 10:
			if (f.wire != WT_LEN || (seen & (1u << 11)) ||
			    !unpack_write(f.data, f.len, &ret->k.write)) {
				return 0;
			}
			job->kind_case = RDMAX__V1__JOB__KIND_WRITE;
			job->write = &ret->k.write;
			break;
		case 11:
			if (f.wire != WT_LEN || (seen & (1u << 10)) ||
			    !unpack_read(f.data, f.len, &ret->k.read)) {
				return 0;
			}
			job->kind_case = RDMAX__V1__JOB__KIND_READ;
			job->read = &ret->k.read;
			break;
		default:
			return 0;
		}
	}
	return (seen & (1u << 1)) && job->kind_case != RDMAX__V1__JOB__KIND__NOT_SET;
}
