/* SPDX-License-Identifier: MIT */
/*
 * What the files of librdmax share beyond internal.h: the client, region and
 * peer-group objects, and the request/reply calls of client.c that region.c
 * and submit.c build on. Never installed.
 */
#ifndef RDMAX_CLIENT_CLIENT_H
#define RDMAX_CLIENT_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"
#include "rdmax.pb-c.h"

struct rdmax_region {
	struct rdmax_client *client;
	struct rdmax_region *prev;
	struct rdmax_region *next;
	uint64_t id;
	uint64_t length;
	void *addr;     /* caller's mapping, ours when map_len != 0 */
	size_t map_len; /* rdmax_region_alloc_host(): bytes to munmap */
	bool allocated; /* made by an alloc call: rdmax_region_free(), not _deregister() */
	uint32_t desc_len;
	uint8_t desc[RDMAX_DESC_MAX];
};

struct rdmax_peer_group {
	struct rdmax_client *client;
	struct rdmax_peer_group *prev;
	struct rdmax_peer_group *next;
	uint64_t handle; /* the daemon's */
	size_t size;     /* members */
};

struct rdmax_client {
	int fd;
	int err;           /* sticky: DISCONNECTED, PROTOCOL_ERROR, lost event */
	int hangup_err;    /* why the daemon said it would hang up (Error with seq 0) */
	uint64_t next_seq; /* requests use 1, 2, ...; 0 marks events */
	struct rdmax_daemon_info info;

	uint8_t *rx;
	size_t rx_size;
	uint8_t *tx;
	size_t tx_size;
	size_t max_tx; /* largest request the daemon accepts */

	uint64_t want_seq;           /* reply a synchronous call waits for, 0: none */
	Rdmax__V1__DaemonMsg *reply; /* that reply, once it arrived */

	struct client_evq events;
	struct client_jobs jobs;
	struct client_pending *pending; /* oldest first */
	struct client_pending **pending_tail;

	struct rdmax_region *regions;
	struct rdmax_peer_group *groups;
	struct client_gpu *gpu; /* GPU registrations and pool mappings (gpu.c); NULL until used */

	/* Payloads of MESSAGE events returned by the last rdmax_poll_events(). */
	void **handed;
	size_t n_handed;
	size_t cap_handed;

	int64_t spin_ns; /* busy-poll window before sleeping in poll() */
	/* Datagrams both ways, for the ring's ordering (RingNotify not counted). */
	uint64_t msgs_sent;
	uint64_t msgs_received;
	uint64_t notifies_read;  /* RingNotify datagrams read */
	bool ring_counts;        /* the daemon counts its RingNotifies (RDMAX_CAP_RING_COUNTS) */
	struct client_ring ring; /* ring.v.base == NULL: the socket carries jobs */
	bool ring_wake;          /* a RingNotify is asked for */
	bool notify_pending;     /* a taken request's RingNotify may wait (without ring_counts) */
	bool spin_yield;         /* spin with sched_yield() rather than a pause ... */
	int64_t spin_pause_ns;   /* ... once a ring wait has lasted this long */
};

/* ---- client.c: requests and the receive path ---- */

/* Send one message (with \p fd attached when fd >= 0); errors stick in c->err. */
int client_send_msg(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd);
/*
 * Send a request and wait up to \p timeout_ms (-1: forever) for its reply,
 * keeping the events that arrive meanwhile. *ret_reply is the caller's to free.
 */
int client_request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd, int timeout_ms,
		   Rdmax__V1__DaemonMsg **ret_reply);
/* A request answered by a Status reply: its RDMAX_E_* (or 0). */
int client_request_status(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd);
/* A reply of the wrong kind: the connection cannot be trusted any more. */
int client_unexpected_reply(struct rdmax_client *c, const Rdmax__V1__DaemonMsg *reply);
/* Handle what the socket (and the ring) hold now, without waiting. */
int client_drain(struct rdmax_client *c);

/* ---- region.c: regions, descriptors, peer groups ---- */

/* Unlink and free a region handle (unmapping memory of rdmax_region_alloc_host()). */
void client_region_free(struct rdmax_region *region);
/* Unlink and free a peer-group handle. */
void client_group_free(struct rdmax_peer_group *group);
/* A descriptor with a length the encoder accepts. */
bool client_desc_usable(const struct rdmax_desc *d);

static inline ProtobufCBinaryData client_desc_bytes(const struct rdmax_desc *d)
{
	return (ProtobufCBinaryData){.len = d->len, .data = (uint8_t *)d->bytes};
}

#endif
