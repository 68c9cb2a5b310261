/* SPDX-License-Identifier: MIT */
/* What several unit suites build their cases from. */
#ifndef RDMAXD_TEST_FIXTURES_H
#define RDMAXD_TEST_FIXTURES_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct client_ring;

/* A memfd of len bytes with the given seals added (0: none); the case fails if it cannot. */
int unit_sealed_memfd(size_t len, unsigned seals);

/* The library's side of a ring takes every completion there is and gives the slots back; how many.
 */
uint32_t unit_ring_consume(struct client_ring *ring);

/* Whether thread `tid` of this process is asleep (state S in its /proc stat): blocked in a wait. */
bool unit_thread_sleeps(pid_t tid);

/*
 * recvmsg() calls of the calling thread that heard EAGAIN (the unit binary
 * links with --wrap=recvmsg; test_transport_tcp.c holds the wrapper).
 */
uint64_t unit_recvmsg_eagain(void);

/*
 * Called before each send() of this process while set (the unit binary
 * links with --wrap=send; test_transport_tcp.c holds the wrapper): 0 lets
 * the call go on, an errno fails it with that error, sending nothing.
 */
extern int (*unit_before_send)(int fd);

/* The TCP transport's cases (test_transport_tcp.c), run as the "wire" suite's "tcp" case. */
TCase *unit_tcp_transport_tcase(void);

#endif
