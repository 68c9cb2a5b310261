/* SPDX-License-Identifier: MIT */
/*
 * Client socket: AF_UNIX SOCK_SEQPACKET, one protobuf message per datagram,
 * SCM_RIGHTS fds, SO_PEERCRED, per-client sessions and limits. Never calls
 * verbs. Completions from the engine are batched per client and flushed once
 * per loop iteration.
 */
#ifndef RDMAXD_IPC_H
#define RDMAXD_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rdmaxd;
struct ipc;

int ipc_create(struct rdmaxd *daemon, struct ipc **ret_ipc);
/* Stop accepting, flush and close every session, unlink the socket. */
void ipc_shutdown(struct ipc *ipc);
void ipc_destroy(struct ipc *ipc);

/* Engine completion callback (owner is the session's job_owner). */
void ipc_job_completed(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes);
/* discovery_lookup_cb (owner is the session's job_owner). */
void ipc_lookup_done(void *owner, uint64_t seq, int err, const char *message, const uint8_t *desc,
		     size_t desc_len);
/* imm table callback (owner is the session's job_owner). */
void ipc_imm_fired(void *owner, uint32_t imm, uint64_t count, void *arg);

uint32_t ipc_client_count(const struct ipc *ipc);

/* Whether a client's shared-memory ring is being polled (the loop must not sleep). */
bool ipc_rings_awake(const struct ipc *ipc);
/* Put every client's ring to sleep (doorbells instead of polling); false if one stays awake. */
bool ipc_rings_sleep(struct ipc *ipc);
/*
 * One spin pass: rings taken, pending completions sent; how much moved
 * (main.c). now: a recent now_ns() (ring windows are judged by it), or 0.
 */
int ipc_poll_pass(struct ipc *ipc, uint64_t now);

/* One connected client, as the admin socket and metrics show it. */
struct ipc_client_info {
	uint64_t id; /* session number, unique within this daemon start */
	int pid;
	uint32_t uid;
	uint32_t gid;
	const char *name;  /* from Hello, or "pid-N" */
	const void *owner; /* the session's job owner: matches jobs and regions */
	uint32_t regions;
	uint64_t registered_bytes;
	uint32_t outstanding;  /* jobs without a completion */
	uint64_t jobs_ok;      /* completions with status OK */
	uint64_t jobs_failed;  /* completions with an error */
	uint64_t bytes;        /* bytes moved by completed jobs */
	uint64_t queued_bytes; /* replies waiting for the client to read */
	uint64_t connected_ms; /* time since connect */
};
typedef void (*ipc_client_cb)(void *arg, const struct ipc_client_info *info);

/* Report every client (after Hello or not) to cb, synchronously. */
void ipc_for_each_client(const struct ipc *ipc, ipc_client_cb cb, void *arg);

#endif
