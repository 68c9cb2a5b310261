/* SPDX-License-Identifier: MIT */
/*
 * Framing of the client protocol: every ClientMsg and DaemonMsg body, built
 * with its required fields, survives encode/decode unchanged; every
 * truncation is refused or visibly loses the body; garbage never decodes
 * into a message with a body the daemon would act on.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "rdmax.pb-c.h"

Suite *framing_suite(void);

/* A heap-built message with every required field set, so free_unpacked can free it. */
static ProtobufCMessage *build(const ProtobufCMessageDescriptor *desc)
{
	ProtobufCMessage *m = calloc(1, desc->sizeof_message);
	ck_assert_ptr_nonnull(m);
	desc->message_init(m);
	for (unsigned i = 0; i < desc->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &desc->fields[i];
		void *member = (char *)m + f->offset;
		if (f->label != PROTOBUF_C_LABEL_REQUIRED) {
			continue;
		}
		switch (f->type) {
		case PROTOBUF_C_TYPE_STRING:
			*(char **)member = strdup("x");
			break;
		case PROTOBUF_C_TYPE_BYTES: {
			ProtobufCBinaryData *b = member;
			b->data = malloc(3);
			memcpy(b->data, "abc", 3);
			b->len = 3;
			break;
		}
		case PROTOBUF_C_TYPE_MESSAGE:
			*(ProtobufCMessage **)member = build(f->descriptor);
			break;
		case PROTOBUF_C_TYPE_UINT64:
			*(uint64_t *)member = 0x123456789ull + i;
			break;
		case PROTOBUF_C_TYPE_UINT32:
			*(uint32_t *)member = 7u + i;
			break;
		default:
			break; /* enums and bools keep their defaults */
		}
	}
	return m;
}

/* Put a body in the oneof of an envelope (ClientMsg or DaemonMsg) by field index. */
static ProtobufCMessage *envelope_with(const ProtobufCMessageDescriptor *env, unsigned field)
{
	ProtobufCMessage *m = build(env);
	const ProtobufCFieldDescriptor *f = &env->fields[field];
	*(ProtobufCMessage **)((char *)m + f->offset) = build(f->descriptor);
	*(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
	/* seq */
	const ProtobufCFieldDescriptor *seq =
		protobuf_c_message_descriptor_get_field_by_name(env, "seq");
	*(protobuf_c_boolean *)((char *)m + seq->quantifier_offset) = 1;
	*(uint64_t *)((char *)m + seq->offset) = 42;
	return m;
}

static void check_envelope(const ProtobufCMessageDescriptor *env)
{
	unsigned bodies = 0;
	for (unsigned i = 0; i < env->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &env->fields[i];
		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) {
			continue;
		}
		bodies++;
		ProtobufCMessage *m = envelope_with(env, i);
		size_t len = protobuf_c_message_get_packed_size(m);
		uint8_t *buf = malloc(len);
		uint8_t *again = malloc(len);
		ck_assert_uint_eq(protobuf_c_message_pack(m, buf), len);

		ProtobufCMessage *d = protobuf_c_message_unpack(env, NULL, len, buf);
		ck_assert_msg(d != NULL, "%s.%s does not decode", env->name, f->name);
		ck_assert_uint_eq(*(uint32_t *)((char *)d + f->quantifier_offset), f->id);
		ck_assert_uint_eq(protobuf_c_message_get_packed_size(d), len);
		protobuf_c_message_pack(d, again);
		ck_assert_msg(memcmp(buf, again, len) == 0, "%s.%s changes on a round trip",
			      env->name, f->name);
		protobuf_c_message_free_unpacked(d, NULL);

		for (size_t cut = 0; cut < len; cut++) {
			d = protobuf_c_message_unpack(env, NULL, cut, buf);
			if (d) {
				/* Only a cut before the body decodes, and then without it. */
				ck_assert_msg(*(uint32_t *)((char *)d + f->quantifier_offset) !=
						      f->id,
					      "%s.%s truncated to %zu bytes still decodes",
					      env->name, f->name, cut);
				protobuf_c_message_free_unpacked(d, NULL);
			}
		}
		protobuf_c_message_free_unpacked(m, NULL);
		free(buf);
		free(again);
	}
	ck_assert_uint_ge(bodies, 8);
}

START_TEST(client_messages_round_trip_and_truncate)
{
	check_envelope(&rdmax__v1__client_msg__descriptor);
}
END_TEST

START_TEST(daemon_messages_round_trip_and_truncate)
{
	check_envelope(&rdmax__v1__daemon_msg__descriptor);
}
END_TEST

START_TEST(every_job_kind_round_trips)
{
	const ProtobufCMessageDescriptor *job = &rdmax__v1__job__descriptor;
	unsigned kinds = 0;
	for (unsigned i = 0; i < job->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &job->fields[i];
		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) {
			continue;
		}
		kinds++;
		Rdmax__V1__Job *j = (Rdmax__V1__Job *)build(job);
		*(ProtobufCMessage **)((char *)j + f->offset) = build(f->descriptor);
		j->kind_case = (Rdmax__V1__Job__KindCase)f->id;
		uint8_t buf[4096];
		size_t len = rdmax__v1__job__pack(j, buf);
		Rdmax__V1__Job *d = rdmax__v1__job__unpack(NULL, len, buf);
		ck_assert_ptr_nonnull(d);
		ck_assert_int_eq(d->kind_case, (int)f->id);
		ck_assert_uint_eq(d->job_id, j->job_id);
		rdmax__v1__job__free_unpacked(d, NULL);
		rdmax__v1__job__free_unpacked(j, NULL);
	}
	/* WRITE READ PAGED_WRITE SCATTER BARRIER SEND PAGED_READ */
	ck_assert_uint_eq(kinds, 7);
}
END_TEST

START_TEST(garbage_and_missing_required_refused)
{
	uint8_t garbage[256];
	unsigned seed = 12345;
	int decoded_with_body = 0;
	for (int round = 0; round < 2000; round++) {
		size_t len = 1 + (size_t)(rand_r(&seed) % sizeof(garbage));
		for (size_t i = 0; i < len; i++) {
			garbage[i] = (uint8_t)rand_r(&seed);
		}
		Rdmax__V1__ClientMsg *m = rdmax__v1__client_msg__unpack(NULL, len, garbage);
		if (m) {
			decoded_with_body += m->body_case != RDMAX__V1__CLIENT_MSG__BODY__NOT_SET;
			rdmax__v1__client_msg__free_unpacked(m, NULL);
		}
	}
	/* Random bytes essentially never form a complete request. */
	ck_assert_int_lt(decoded_with_body, 5);

	/* A WriteJob without its required remote_desc does not decode. */
	uint8_t buf[64];
	/* Pack fields one by one: local_region=1, local_offset=2, length=3, remote_offset=5. */
	size_t n = 0;
	buf[n++] = 0x08;
	buf[n++] = 1;
	buf[n++] = 0x10;
	buf[n++] = 0;
	buf[n++] = 0x18;
	buf[n++] = 5;
	buf[n++] = 0x28;
	buf[n++] = 0;
	ck_assert_ptr_null(rdmax__v1__write_job__unpack(NULL, n, buf));
}
END_TEST

Suite *framing_suite(void)
{
	Suite *s = suite_create("framing");
	TCase *tc = tcase_create("framing");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, client_messages_round_trip_and_truncate);
	tcase_add_test(tc, daemon_messages_round_trip_and_truncate);
	tcase_add_test(tc, every_job_kind_round_trips);
	tcase_add_test(tc, garbage_and_missing_required_refused);
	suite_add_tcase(s, tc);
	return s;
}
