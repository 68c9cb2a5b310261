/* SPDX-License-Identifier: MIT */
/* The daemon's top-level state, shared by its modules. */
#ifndef RDMAXD_RDMAXD_H
#define RDMAXD_RDMAXD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "counters.h"
#include "desc.h"
#include "imm.h"
#include "region.h"
#include "uid_counts.h"

#define RDMAXD_VERSION      "0.1.0"
#define RDMAXD_AUTH_KEY_MAX 256

struct admin;
struct discovery;
struct engine;
struct gpu;
struct ipc;
struct mailbox_table;
struct name_table;
struct metrics;
struct transport;

struct rdmaxd {
	uv_loop_t *loop;
	struct config cfg;
	uint64_t instance_id; /* random per start; descriptors of older starts are stale */
	char node_name[64];
	struct region_table regions;
	struct imm_table imm;
	struct engine *engine;
	struct ipc *ipc;
	struct mailbox_table *mailboxes; /* SEND targets of this node, owned by ipc; may be NULL */
	struct name_table *names;        /* named regions of this node, owned by ipc; may be NULL */
	struct discovery *discovery;     /* lookups and membership (discovery/); may be NULL */
	struct transport *transports[ENDPOINT_MAX]; /* by endpoint kind; NULL when absent */
	/* Peer connections opened for each uid's jobs ([limits] per_uid_peer_connections). */
	struct uid_counts peer_conns;
	struct gpu *gpu; /* GPU regions, pools and topology (gpu.c); NULL before start-up */
	uint8_t auth_key[RDMAXD_AUTH_KEY_MAX];
	size_t auth_key_len; /* 0: authentication off */
	bool stopping;
	struct counters counters; /* what the data path records; ops/metrics.c renders it */
	/* Operations (sd.c, admin.c, metrics.c). */
	struct metrics *metrics;
	struct admin *admin;
	bool draining;        /* rdmaxctl drain: new jobs are refused */
	int client_listen_fd; /* listening socket inherited from systemd (>= 3); 0: bind */
	int admin_listen_fd;  /* likewise for the admin socket */
	uint64_t started_ms;  /* now_ms() at start-up */
	/*
	 * Copies on transport I/O threads now, and now_ns() when one was last
	 * handed out or back: the loop sleeps instead of spinning meanwhile and
	 * for busy_poll_us after.
	 */
	uint32_t io_offloaded;
	uint64_t io_offload_ns;
	/*
	 * The loop spins (main.c's busy window): it cannot sleep, so the
	 * transports poll their completion queues instead of arming them.
	 */
	bool spinning;
};

/* Read cfg.auth_key_file (must not be group/world readable). */
int rdmaxd_load_auth_key(struct rdmaxd *daemon, char *err, size_t err_size);

#endif
