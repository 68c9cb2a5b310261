/* SPDX-License-Identifier: MIT */
/* What several unit suites build their cases from. */
#ifndef RDMAXD_TEST_FIXTURES_H
#define RDMAXD_TEST_FIXTURES_H

#include <check.h>
#include <stddef.h>

/* A memfd of len bytes with the given seals added (0: none); the case fails if it cannot. */
int unit_sealed_memfd(size_t len, unsigned seals);

/* The TCP transport's cases (test_transport_tcp.c), run as the "wire" suite's "tcp" case. */
TCase *unit_tcp_transport_tcase(void);

#endif
