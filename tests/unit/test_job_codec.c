/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the ring entry's straight-line codec (proto/common/
 * job_codec.c) against protobuf-c itself, and of the arena ring entries are
 * unpacked into (daemon/base/arena.c): the same bytes out, the same values
 * in, and everything else left to protobuf-c.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "job_codec.h"
#include "rdmax.pb-c.h"

void ring_codec_tcases(Suite *s);

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng;
}

/* Values of every varint length, 0 and the extremes included. */
static uint64_t rnd_value(void)
{
	switch (rnd() % 4) {
	case 0:
		return 0;
	case 1:
		return rnd() % 200;
	case 2:
		return UINT64_MAX - rnd() % 3;
	default:
		return rnd() >> (rnd() % 64);
	}
}

struct sample {
	Rdmax__V1__Job job;
	Rdmax__V1__WriteJob w;
	Rdmax__V1__ReadJob r;
	uint8_t desc[300];
};

static void make_sample(struct sample *s)
{
	size_t dlen = rnd() % 4 == 0 ? 0 : rnd() % sizeof(s->desc);

	rdmax__v1__job__init(&s->job);
	rdmax__v1__write_job__init(&s->w);
	rdmax__v1__read_job__init(&s->r);
	for (size_t i = 0; i < dlen; i++) {
		s->desc[i] = (uint8_t)rnd();
	}
	s->job.job_id = rnd_value();
	if (rnd() % 2) {
		s->job.has_deadline_ms = 1;
		s->job.deadline_ms = (uint32_t)rnd_value();
	}
	if (rnd() % 2) {
		s->job.has_traffic_class = 1;
		s->job.traffic_class = (uint32_t)rnd_value();
	}
	if (rnd() % 2) {
		s->w.local_region = rnd_value();
		s->w.local_offset = rnd_value();
		s->w.length = rnd_value();
		s->w.remote_desc.data = dlen ? s->desc : NULL;
		s->w.remote_desc.len = dlen;
		s->w.remote_offset = rnd_value();
		if (rnd() % 2) {
			s->w.has_imm = 1;
			s->w.imm = (uint32_t)rnd_value();
		}
		s->job.kind_case = RDMAX__V1__JOB__KIND_WRITE;
		s->job.write = &s->w;
	} else {
		s->r.remote_desc.data = dlen ? s->desc : NULL;
		s->r.remote_desc.len = dlen;
		s->r.remote_offset = rnd_value();
		s->r.length = rnd_value();
		s->r.local_region = rnd_value();
		s->r.local_offset = rnd_value();
		s->job.kind_case = RDMAX__V1__JOB__KIND_READ;
		s->job.read = &s->r;
	}
}

static void assert_bytes_eq(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b)
{
	ck_assert_uint_eq(a->len, b->len);
	ck_assert_int_eq(a->data == NULL, b->data == NULL);
	if (a->len) {
		ck_assert_int_eq(memcmp(a->data, b->data, a->len), 0);
	}
}

/* The fields the engine reads, equal in both decodings. */
static void assert_jobs_eq(const Rdmax__V1__Job *a, const Rdmax__V1__Job *b)
{
	ck_assert_uint_eq(a->job_id, b->job_id);
	ck_assert_int_eq(a->has_deadline_ms, b->has_deadline_ms);
	ck_assert_uint_eq(a->deadline_ms, b->deadline_ms);
	ck_assert_int_eq(a->has_traffic_class, b->has_traffic_class);
	ck_assert_uint_eq(a->traffic_class, b->traffic_class);
	ck_assert_int_eq(a->kind_case, b->kind_case);
	if (a->kind_case == RDMAX__V1__JOB__KIND_WRITE) {
		ck_assert_uint_eq(a->write->local_region, b->write->local_region);
		ck_assert_uint_eq(a->write->local_offset, b->write->local_offset);
		ck_assert_uint_eq(a->write->length, b->write->length);
		assert_bytes_eq(&a->write->remote_desc, &b->write->remote_desc);
		ck_assert_uint_eq(a->write->remote_offset, b->write->remote_offset);
		ck_assert_int_eq(a->write->has_imm, b->write->has_imm);
		ck_assert_uint_eq(a->write->imm, b->write->imm);
	} else {
		ck_assert_int_eq(a->kind_case, RDMAX__V1__JOB__KIND_READ);
		assert_bytes_eq(&a->read->remote_desc, &b->read->remote_desc);
		ck_assert_uint_eq(a->read->remote_offset, b->read->remote_offset);
		ck_assert_uint_eq(a->read->length, b->read->length);
		ck_assert_uint_eq(a->read->local_region, b->read->local_region);
		ck_assert_uint_eq(a->read->local_offset, b->read->local_offset);
	}
}

/* Random write and read jobs: protobuf-c's bytes, and protobuf-c's values back. */
START_TEST(job_codec_matches_protobuf_c)
{
	uint8_t mine[512], theirs[512];

	for (int i = 0; i < 20000; i++) {
		struct sample s;
		struct job_codec_msg m;
		make_sample(&s);
		size_t len = job_codec_size(&s.job);
		ck_assert_uint_eq(len, rdmax__v1__job__get_packed_size(&s.job));
		ck_assert_uint_le(len, sizeof(mine));
		job_codec_pack(&s.job, mine);
		ck_assert_uint_eq(rdmax__v1__job__pack(&s.job, theirs), len);
		ck_assert_int_eq(memcmp(mine, theirs, len), 0);
		ck_assert_int_eq(job_codec_unpack(mine, len, &m), 1);
		assert_jobs_eq(&m.job, &s.job);
		Rdmax__V1__Job *pc = rdmax__v1__job__unpack(NULL, len, mine);
		ck_assert_ptr_nonnull(pc);
		assert_jobs_eq(&m.job, pc);
		rdmax__v1__job__free_unpacked(pc, NULL);
	}
}
END_TEST

/*
 * What the codec leaves to protobuf-c: other kinds are not sized, and
 * entries it does not take whole (cut, a field twice, an unknown field, a
 * required field missing, a value past uint32) are refused, never decoded
 * differently. Random byte flips of valid entries: whatever the codec takes,
 * protobuf-c takes with the same values.
 */
START_TEST(job_codec_leaves_the_rest)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__SendJob send = RDMAX__V1__SEND_JOB__INIT;
	struct job_codec_msg m;
	uint8_t buf[512];

	job.kind_case = RDMAX__V1__JOB__KIND_SEND;
	job.send = &send;
	ck_assert_uint_eq(job_codec_size(&job), 0);
	job.kind_case = RDMAX__V1__JOB__KIND__NOT_SET;
	ck_assert_uint_eq(job_codec_size(&job), 0);

	/* job_id 5, write {1:1 2:2 3:3 4:"" 5:4} */
	const uint8_t ok[] = {0x08, 5, 0x52, 10, 0x08, 1, 0x10, 2, 0x18, 3, 0x22, 0, 0x28, 4};
	ck_assert_int_eq(job_codec_unpack(ok, sizeof(ok), &m), 1);
	ck_assert_ptr_null(m.job.write->remote_desc.data);
	ck_assert_int_eq(job_codec_unpack(ok, sizeof(ok) - 1, &m), 0); /* cut */
	const uint8_t twice[] = {0x08, 5, 0x08, 6, 0x52, 10, 0x08, 1,
				 0x10, 2, 0x18, 3, 0x22, 0,  0x28, 4};
	ck_assert_int_eq(job_codec_unpack(twice, sizeof(twice), &m), 0);
	const uint8_t unknown[] = {0x08, 5, 0x52, 12, 0x08, 1, 0x10, 2,
				   0x18, 3, 0x22, 0,  0x28, 4, 0x38, 1};
	ck_assert_int_eq(job_codec_unpack(unknown, sizeof(unknown), &m), 0);
	const uint8_t missing[] = {0x08, 5, 0x52, 8, 0x08, 1, 0x10, 2, 0x18, 3, 0x22, 0};
	ck_assert_int_eq(job_codec_unpack(missing, sizeof(missing), &m), 0);
	const uint8_t wide[] = {0x08, 5, 0x10, 0x80, 0x80, 0x80, 0x80, 0x10, 0x52, 10,
				0x08, 1, 0x10, 2,    0x18, 3,    0x22, 0,    0x28, 4};
	ck_assert_int_eq(job_codec_unpack(wide, sizeof(wide), &m), 0);

	for (int i = 0; i < 20000; i++) {
		struct sample s;
		make_sample(&s);
		size_t len = rdmax__v1__job__pack(&s.job, buf);
		for (int k = 0, flips = 1 + (int)(rnd() % 3); k < flips; k++) {
			buf[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
		}
		if (rnd() % 4 == 0) {
			len -= rnd() % len;
		}
		Rdmax__V1__Job *pc = rdmax__v1__job__unpack(NULL, len, buf);
		if (job_codec_unpack(buf, len, &m)) {
			ck_assert_ptr_nonnull(pc);
			assert_jobs_eq(&m.job, pc);
		}
		if (pc) {
			rdmax__v1__job__free_unpacked(pc, NULL);
		}
	}
}
END_TEST

/* Within its buffer an arena never mallocs; past it, it spills and reset frees the spill. */
START_TEST(arena_spills_and_resets)
{
	struct arena a;
	uint8_t buf[512];
	struct sample s;

	ck_assert_int_eq(arena_init(&a, 1024), 0);
	make_sample(&s);
	size_t len = rdmax__v1__job__pack(&s.job, buf);
	for (int round = 0; round < 3; round++) {
		Rdmax__V1__Job *j = rdmax__v1__job__unpack(arena_pb_allocator(&a), len, buf);
		ck_assert_ptr_nonnull(j);
		assert_jobs_eq(j, &s.job);
		ck_assert_uint_eq(a.spills, 0);
		ck_assert_uint_le(a.used, a.cap);
		arena_reset(&a);
		ck_assert_uint_eq(a.used, 0);
	}
	void *p = arena_alloc(&a, 1000);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq((uintptr_t)p % 16, 0);
	void *q = arena_alloc(&a, 100); /* past the 1 KiB buffer */
	ck_assert_ptr_nonnull(q);
	ck_assert_uint_eq((uintptr_t)q % 16, 0);
	ck_assert_uint_eq(a.spills, 1);
	memset(q, 0xa5, 100);
	ck_assert_ptr_nonnull(a.spill);
	arena_reset(&a);
	ck_assert_ptr_null(a.spill);
	arena_fini(&a);
	arena_fini(&a); /* twice, as a destructor may be */
}
END_TEST

void ring_codec_tcases(Suite *s)
{
	TCase *tc = tcase_create("job_codec");

	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, job_codec_matches_protobuf_c);
	tcase_add_test(tc, job_codec_leaves_the_rest);
	tcase_add_test(tc, arena_spills_and_resets);
	suite_add_tcase(s, tc);
}
