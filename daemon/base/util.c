/* SPDX-License-Identifier: MIT */
/* Small helpers shared by daemon modules: clocks, random ids, bounded string copies. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "util.h"

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t now_ms(void)
{
	return now_ns() / 1000000ull;
}

void random_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			/* Keys and nonces must never be predictable: no fallback. */
			abort();
		}
		p += n;
		len -= (size_t)n;
	}
}

uint64_t random_u64(void)
{
	uint64_t v;

	random_bytes(&v, sizeof(v));
	return v;
}

int copy_string(char *dst, size_t dst_size, const char *src)
{
	size_t len = strlen(src);

	if (len >= dst_size) {
		return -ENAMETOOLONG;
	}
	memcpy(dst, src, len + 1);
	return 0;
}

bool name_in_list(const char *list, const char *name)
{
	size_t len = strlen(name);
	const char *p = list;

	while (*p) {
		const char *end = strchr(p, ',');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		if (n == len && strncmp(p, name, n) == 0) {
			return true;
		}
		if (!end) {
			break;
		}
		p = end + 1;
	}
	return false;
}

/* Length of the well-formed UTF-8 sequence at p (1..4), or 0. */
static size_t utf8_seq_len(const unsigned char *p)
{
	unsigned char c = p[0];

	if (c < 0x80) {
		return 1;
	}
	if (c >= 0xc2 && c <= 0xdf) {
		return (p[1] & 0xc0) == 0x80 ? 2 : 0;
	}
	if (c >= 0xe0 && c <= 0xef) {
		unsigned char lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
		return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 ? 3 : 0;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		unsigned char lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
		return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 && (p[3] & 0xc0) == 0x80
			       ? 4
			       : 0;
	}
	return 0;
}

size_t utf8_sanitize(char *s)
{
	unsigned char *p = (unsigned char *)s;
	size_t replaced = 0;

	/* A NUL stops every check above at the first byte that is not a continuation. */
	while (*p) {
		size_t n = utf8_seq_len(p);
		if (n == 0) {
			*p++ = '?';
			replaced++;
		} else {
			p += n;
		}
	}
	return replaced;
}
