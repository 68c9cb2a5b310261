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
