/* SPDX-License-Identifier: MIT */
/*
 * JSON writer used by the admin socket. Owns only its buffer; never does I/O.
 * Strings are escaped per RFC 8259, and bytes that are not valid UTF-8 are
 * replaced by U+FFFD so a client name can never break a reply.
 */
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void json_init(struct json *j, size_t limit)
{
	memset(j, 0, sizeof(*j));
	j->limit = limit;
}

void json_fini(struct json *j)
{
	if (!j) {
		return;
	}
	free(j->buf);
	j->buf = NULL;
	j->len = j->cap = 0;
}

static bool reserve(struct json *j, size_t more)
{
	if (j->err) {
		return false;
	}
	if (j->len + more + 1 > j->limit) {
		j->err = -EMSGSIZE;
		return false;
	}
	if (j->len + more + 1 <= j->cap) {
		return true;
	}
	size_t cap = j->cap ? j->cap : 1024;
	while (cap < j->len + more + 1) {
		cap *= 2;
	}
	char *buf = realloc(j->buf, cap);
	if (!buf) {
		j->err = -ENOMEM;
		return false;
	}
	j->buf = buf;
	j->cap = cap;
	return true;
}

static void put(struct json *j, const char *s, size_t n)
{
	if (!reserve(j, n)) {
		return;
	}
	memcpy(j->buf + j->len, s, n);
	j->len += n;
	j->buf[j->len] = '\0';
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static size_t utf8_len(const unsigned char *s)
{
	if (s[0] < 0x80) {
		return 1;
	}
	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		return (s[1] & 0xc0) == 0x80 ? 2 : 0;
	}
	if (s[0] >= 0xe0 && s[0] <= 0xef) {
		if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) {
			return 0;
		}
		if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0)) {
			return 0; /* overlong or surrogate */
		}
		return 3;
	}
	if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80) {
			return 0;
		}
		if ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90)) {
			return 0;
		}
		return 4;
	}
	return 0;
}

static void put_string(struct json *j, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");

	put(j, "\"", 1);
	while (*p && !j->err) {
		char esc[8];
		size_t n;

		switch (*p) {
		case '"':
			put(j, "\\\"", 2);
			p++;
			continue;
		case '\\':
			put(j, "\\\\", 2);
			p++;
			continue;
		case '\n':
			put(j, "\\n", 2);
			p++;
			continue;
		case '\t':
			put(j, "\\t", 2);
			p++;
			continue;
		default:
			break;
		}
		if (*p < 0x20 || *p == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", *p);
			put(j, esc, 6);
			p++;
			continue;
		}
		n = utf8_len(p);
		if (n == 0) {
			put(j, "\\ufffd", 6);
			p++;
			continue;
		}
		put(j, (const char *)p, n);
		p += n;
	}
	put(j, "\"", 1);
}

/* Comma and key before a value. */
static void begin_value(struct json *j, const char *key)
{
	if (j->depth > 0) {
		if (j->need_comma[j->depth - 1]) {
			put(j, ",", 1);
		}
		j->need_comma[j->depth - 1] = true;
	}
	if (key) {
		put_string(j, key);
		put(j, ":", 1);
	}
}

static void open_container(struct json *j, const char *key, char c)
{
	begin_value(j, key);
	if (j->depth >= JSON_DEPTH_MAX) {
		if (!j->err) {
			j->err = -EOVERFLOW;
		}
		return;
	}
	put(j, &c, 1);
	j->need_comma[j->depth++] = false;
}

static void close_container(struct json *j, char c)
{
	if (j->depth == 0) {
		if (!j->err) {
			j->err = -EINVAL;
		}
		return;
	}
	j->depth--;
	put(j, &c, 1);
}

void json_obj_open(struct json *j, const char *key)
{
	open_container(j, key, '{');
}

void json_obj_close(struct json *j)
{
	close_container(j, '}');
}

void json_arr_open(struct json *j, const char *key)
{
	open_container(j, key, '[');
}

void json_arr_close(struct json *j)
{
	close_container(j, ']');
}

void json_str(struct json *j, const char *key, const char *value)
{
	begin_value(j, key);
	put_string(j, value);
}

void json_strf(struct json *j, const char *key, const char *fmt, ...)
{
	char text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	json_str(j, key, text);
}

void json_u64(struct json *j, const char *key, uint64_t value)
{
	char text[32];
	int n = snprintf(text, sizeof(text), "%" PRIu64, value);

	begin_value(j, key);
	put(j, text, (size_t)n);
}

void json_i64(struct json *j, const char *key, int64_t value)
{
	char text[32];
	int n = snprintf(text, sizeof(text), "%" PRId64, value);

	begin_value(j, key);
	put(j, text, (size_t)n);
}

void json_double(struct json *j, const char *key, double value)
{
	char text[64];
	int n;

	begin_value(j, key);
	if (!isfinite(value)) {
		put(j, "null", 4); /* JSON has no NaN or infinity */
		return;
	}
	n = snprintf(text, sizeof(text), "%.6g", value);
	put(j, text, (size_t)n);
}

void json_bool(struct json *j, const char *key, bool value)
{
	begin_value(j, key);
	put(j, value ? "true" : "false", value ? 4 : 5);
}

void json_null(struct json *j, const char *key)
{
	begin_value(j, key);
	put(j, "null", 4);
}

int json_finish(struct json *j, const char **ret_text, size_t *ret_len)
{
	if (j->err) {
		return j->err;
	}
	if (j->depth != 0) {
		return -EINVAL;
	}
	if (!reserve(j, 0)) {
		return j->err;
	}
	if (!j->buf) {
		return -EINVAL;
	}
	*ret_text = j->buf;
	*ret_len = j->len;
	return 0;
}
