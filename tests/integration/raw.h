/* SPDX-License-Identifier: MIT */
/*
 * A raw client of the daemon socket for protocol-abuse tests: it speaks the
 * protobuf messages of proto/rdmax.proto directly (or sends bytes that are
 * not messages at all), with SCM_RIGHTS fds where asked. Like the harness,
 * every helper asserts instead of returning errors.
 */
#ifndef RDMAX_ITEST_RAW_H
#define RDMAX_ITEST_RAW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdmax.pb-c.h"

/* Connect to the daemon's client socket; returns the fd. */
int raw_connect(const char *socket_path);
/* Send one datagram with fds attached; returns 0 or -errno (the peer may have closed). */
int raw_send(int fd, const void *buf, size_t len, const int *fds, size_t n_fds);
/* Encode and send one ClientMsg; returns 0 or -errno as raw_send(). */
int raw_try_send_msg(int fd, const Rdmax__V1__ClientMsg *msg, const int *fds, size_t n_fds);
/* Encode and send one ClientMsg; asserts it was sent. */
void raw_send_msg(int fd, const Rdmax__V1__ClientMsg *msg, const int *fds, size_t n_fds);
/*
 * Receive and decode one DaemonMsg (free with rdmax__v1__daemon_msg__free_unpacked).
 * Returns NULL on timeout, or with *ret_closed set when the daemon closed the socket.
 */
Rdmax__V1__DaemonMsg *raw_recv(int fd, int timeout_ms, bool *ret_closed);
/*
 * Receive a message that must be an Error reply echoing `seq` (with a message
 * unless OK); returns its status as RDMAX_E_* (or 0).
 */
#define raw_recv_status(fd, seq) raw_recv_status_at(__FILE__, __LINE__, fd, seq)
int raw_recv_status_at(const char *file, int line, int fd, uint64_t seq);
/* The message of the last Error reply raw_recv_status() or raw_expect_status() took. */
const char *raw_last_error_message(void);
/* Receive a message that must be an Error carrying `err` (0 or RDMAX_E_*) and echo `seq`. */
#define raw_expect_status(fd, seq, err) raw_expect_status_at(__FILE__, __LINE__, fd, seq, err)
void raw_expect_status_at(const char *file, int line, int fd, uint64_t seq, int err);
/* The daemon must close the connection within timeout_ms (any messages before are dropped). */
void raw_expect_closed(int fd, int timeout_ms);
/* Send Hello (seq 1) and check the Welcome. */
void raw_hello(int fd);
/* Receive Completions until job_id completed; returns its status as RDMAX_E_* (or 0). */
int raw_wait_completion(int fd, uint64_t job_id, int timeout_ms);

/*
 * Receive Completions until n completions arrived (or timeout); their job ids
 * and statuses (RDMAX_E_* or 0) are stored in order. Returns how many arrived.
 */
size_t raw_collect(int fd, uint64_t *ret_ids, int *ret_statuses, size_t n, int timeout_ms);

/* A memfd of `size` bytes; sealed against shrinking when `seal`. */
int raw_memfd(const char *name, size_t size, bool seal);

/* RDMAX_E_* (or 0) for a protocol Status. */
int raw_err_from_status(int status);

#endif
