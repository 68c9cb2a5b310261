/* SPDX-License-Identifier: MIT */
/*
 * Client socket: AF_UNIX SOCK_SEQPACKET, one protobuf message per datagram,
 * SCM_RIGHTS fds, SO_PEERCRED, per-client sessions and limits. Never calls
 * verbs. Completions from the engine are batched per client and flushed once
 * per loop iteration.
 */
#ifndef RDMAXD_IPC_H
#define RDMAXD_IPC_H

#include <stdint.h>

struct rdmaxd;
struct ipc;

int ipc_create(struct rdmaxd *daemon, struct ipc **ret_ipc);
/* Stop accepting, flush and close every session, unlink the socket. */
void ipc_shutdown(struct ipc *ipc);
void ipc_destroy(struct ipc *ipc);

/* Engine completion callback (owner is the session's job_owner). */
void ipc_job_completed(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes);
/* imm table callback (owner is the session's job_owner). */
void ipc_imm_fired(void *owner, uint32_t imm, uint64_t count, void *arg);

uint32_t ipc_client_count(const struct ipc *ipc);

#endif
