/* SPDX-License-Identifier: MIT */
/*
 * A small JSON writer for admin replies: a growable buffer, commas and string
 * escaping handled here, so callers only name keys and values. Running out of
 * memory or room is remembered and reported once by json_finish().
 */
#ifndef RDMAXD_JSON_H
#define RDMAXD_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_DEPTH_MAX 16

struct json {
	char *buf;
	size_t len;
	size_t cap;
	size_t limit; /* largest document accepted */
	int err;      /* first error (-ENOMEM, -EMSGSIZE), 0 when none */
	uint32_t depth;
	bool need_comma[JSON_DEPTH_MAX];
};

/* Empty writer that refuses to grow past limit bytes. */
void json_init(struct json *j, size_t limit);
void json_fini(struct json *j);
/* 0 and the document (NUL-terminated, owned by j), or the first error. */
int json_finish(struct json *j, const char **ret_text, size_t *ret_len);

/* Containers; key is NULL inside arrays and at the top level. */
void json_obj_open(struct json *j, const char *key);
void json_obj_close(struct json *j);
void json_arr_open(struct json *j, const char *key);
void json_arr_close(struct json *j);

void json_str(struct json *j, const char *key, const char *value);
void json_strf(struct json *j, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void json_u64(struct json *j, const char *key, uint64_t value);
void json_i64(struct json *j, const char *key, int64_t value);
void json_double(struct json *j, const char *key, double value);
void json_bool(struct json *j, const char *key, bool value);
void json_null(struct json *j, const char *key);

#endif
