/* SPDX-License-Identifier: MIT */
/*
 * The ring's common entry without protobuf-c's generic walk: a Job of kind
 * write or read, encoded as protobuf-c encodes it (the same bytes) and
 * decoded when it has the plain shape the library writes. Anything else is
 * left to protobuf-c, so both give the same message for every input.
 */
#ifndef RDMAX_JOB_CODEC_H
#define RDMAX_JOB_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "rdmax.pb-c.h"

/* A decoded Job and its kind, in caller memory; bytes fields point into the input. */
struct job_codec_msg {
	Rdmax__V1__Job job;
	union {
		Rdmax__V1__WriteJob write;
		Rdmax__V1__ReadJob read;
	} k;
};

/* Bytes of v as a protobuf varint. */
size_t job_codec_varint_len(uint64_t v);

/*
 * The packed size of a write or read Job, equal to
 * rdmax__v1__job__get_packed_size(); 0 for any other kind (use protobuf-c).
 */
size_t job_codec_size(const Rdmax__V1__Job *job);

/* Writes the job_codec_size() bytes (non-zero) that rdmax__v1__job__pack() writes. */
void job_codec_pack(const Rdmax__V1__Job *job, uint8_t *out);

/*
 * 1 with *ret filled when buf holds a write or read Job in which every field
 * is known, of its wire type, within its range and present at most once, and
 * every required field is there; protobuf-c decodes such bytes to the same
 * values. 0 for anything else: the caller decodes with protobuf-c, which
 * accepts or refuses it as before. ret->...remote_desc points into buf.
 */
int job_codec_unpack(const uint8_t *buf, size_t len, struct job_codec_msg *ret);

#endif
