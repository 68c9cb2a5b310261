/* SPDX-License-Identifier: MIT */
/* What several unit suites build their cases from. */
#include "fixtures.h"

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../client-lib/internal.h"

int unit_sealed_memfd(size_t len, unsigned seals)
{
	int fd = memfd_create("unit", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	if (seals) {
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, (int)seals), 0);
	}
	return fd;
}

uint32_t unit_ring_consume(struct client_ring *ring)
{
	uint32_t n = 0;

	while (client_ring_cq_peek(ring) != NULL) {
		client_ring_cq_advance(ring);
		n++;
	}
	if (n) {
		client_ring_cq_release(ring);
	}
	return n;
}

bool unit_thread_sleeps(pid_t tid)
{
	char path[64], stat[512];

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	FILE *fp = fopen(path, "r");
	if (!fp) {
		return false;
	}
	size_t n = fread(stat, 1, sizeof(stat) - 1, fp);
	fclose(fp);
	stat[n] = '\0';
	const char *end = strrchr(stat, ')'); /* the name may hold spaces */
	return end && end[1] == ' ' && end[2] == 'S';
}
