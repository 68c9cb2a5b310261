/* SPDX-License-Identifier: MIT */
/* What several unit suites build their cases from. */
#ifndef RDMAXD_TEST_FIXTURES_H
#define RDMAXD_TEST_FIXTURES_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

struct client_ring;

/* A memfd of len bytes with the given seals added (0: none); the case fails if it cannot. */
int unit_sealed_memfd(size_t len, unsigned seals);

/* The library's side of a ring takes every completion there is and gives the slots back; how many.
 */
uint32_t unit_ring_consume(struct client_ring *ring);

/* The TCP transport's cases (test_transport_tcp.c), run as the "wire" suite's "tcp" case. */
TCase *unit_tcp_transport_tcase(void);

#endif
