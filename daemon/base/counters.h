/* SPDX-License-Identifier: MIT */
/*
 * The daemon's counters and histograms: what the data path records (jobs by kind and status,
 * bytes, latency and size histograms, peers, connection events, imm counters). A leaf: it
 * knows no module above it, so the engine, sessions and transports record without depending on
 * the renderer (ops/metrics.c), which reads this struct when a scrape asks.
 */
#ifndef RDMAXD_COUNTERS_H
#define RDMAXD_COUNTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COUNTERS_KINDS      8  /* room for every enum job_kind (engine.h asserts it) */
#define COUNTERS_STATUSES   32 /* room for every protocol Status value */
#define COUNTERS_PEERS      64 /* peers tracked by name; later ones count under "other" */
#define COUNTERS_PEER_NAME  64
#define COUNTERS_TRANSPORTS 3 /* "tcp", "verbs", and "other" last */
#define COUNTERS_CLASSES    2 /* traffic classes: latency, bulk (enum qos_class) */

/* Connection events a transport reports. */
enum counters_conn_event {
	COUNTERS_CONN_ESTABLISHED, /* handshake done, data may flow */
	COUNTERS_CONN_FAILED,      /* a connection attempt failed */
	COUNTERS_CONN_CLOSED,      /* an established connection went away */
	COUNTERS_CONN_EVENT_MAX,   /* terminator */
};

/* How a TLS-wrapped TCP connection moves its bytes ([transport] tcp_encryption = on). */
enum counters_tls_mode {
	COUNTERS_TLS_KTLS,     /* kernel TLS both ways: plain sendmsg()/recvmsg() on the socket */
	COUNTERS_TLS_KTLS_TX,  /* kernel TLS for sending, OpenSSL for receiving */
	COUNTERS_TLS_USER,     /* OpenSSL both ways (no kernel TLS) */
	COUNTERS_TLS_MODE_MAX, /* terminator */
};

/*
 * Stages of a job to another daemon, timed while [metrics] job_stages is on,
 * from the calls of the loop that hand its bytes to the NIC (ibv_post_send())
 * or the socket (sendmsg()); not from the verbs posting thread or the TCP
 * I/O threads.
 */
enum counters_stage {
	COUNTERS_STAGE_QUEUE,    /* accepted by the engine -> the call sending its first bytes */
	COUNTERS_STAGE_POST,     /* that ibv_post_send() or sendmsg() call */
	COUNTERS_STAGE_COMPLETE, /* its last such call returned -> its completion to the client */
	COUNTERS_STAGE_MAX,      /* terminator */
};

/* Upper bounds of the latency (seconds) and size (bytes) buckets; +Inf is implicit. */
extern const double counters_latency_bounds[];
extern const size_t counters_latency_buckets;
extern const double counters_size_bounds[];
extern const size_t counters_size_buckets;
/* Finer bounds (seconds) for the stages of a job: 1 µs to 1 s. */
extern const double counters_stage_bounds[];
extern const size_t counters_stage_buckets;
/* "queue", "post", "complete" */
extern const char *const counters_stage_names[COUNTERS_STAGE_MAX];
/* "tcp", "verbs", "other": the names of conn_events' first index. */
extern const char *const counters_transport_names[COUNTERS_TRANSPORTS];
extern const char *const counters_conn_event_names[COUNTERS_CONN_EVENT_MAX];
/* "ktls", "ktls_tx", "user" */
extern const char *const counters_tls_mode_names[COUNTERS_TLS_MODE_MAX];

struct histogram {
	uint64_t buckets[32]; /* non-cumulative counts; last used slot is +Inf */
	uint64_t count;
	double sum;
};

struct peer_stats {
	char name[COUNTERS_PEER_NAME];
	/* The lookup key: comparing it is cheaper than formatting name per job. */
	char addr[46];
	uint16_t port;
	uint64_t jobs_ok[COUNTERS_KINDS];
	uint64_t jobs_failed[COUNTERS_KINDS];
	uint64_t bytes[COUNTERS_KINDS];
};

struct counters {
	uint64_t jobs[COUNTERS_KINDS][COUNTERS_STATUSES];
	uint64_t bytes[COUNTERS_KINDS][COUNTERS_STATUSES];
	uint64_t local_jobs; /* jobs between two regions of this daemon */
	struct histogram latency[COUNTERS_KINDS];
	struct histogram size[COUNTERS_KINDS];
	struct peer_stats peers[COUNTERS_PEERS];
	uint32_t n_peers;
	struct peer_stats other; /* peers beyond COUNTERS_PEERS */
	uint64_t conn_events[COUNTERS_TRANSPORTS][COUNTERS_CONN_EVENT_MAX];
	uint64_t tcp_tls[COUNTERS_TLS_MODE_MAX]; /* TLS handshakes completed, by data path */
	uint64_t tcp_io_thread_sent;             /* TCP payload bytes sent by the I/O threads */
	uint64_t tcp_io_thread_received;         /* and received by them */
	uint64_t verbs_post_thread_wrs;          /* verbs WRs handed to the posting thread */
	uint64_t verbs_cq_events;                /* completion events the loop woke for */
	uint64_t imm_writes;                     /* jobs carrying an imm that completed OK here */
	uint64_t imm_fired;                      /* ExpectImm claims that reached their count */
	/* RingNotify datagrams sent to clients asleep on unread completions. */
	uint64_t ring_notifies;
	/* Wake requests of clients that had read every completion already: no datagram. */
	uint64_t ring_notifies_spared;
	/*
	 * Turns of the loop that waited in epoll instead of spinning because
	 * bulk copies ran on I/O threads (never where engine.loop_cpus is apart
	 * from engine.worker_cpus).
	 */
	uint64_t loop_sleeps_for_copies;
	uint64_t total_jobs;
	uint64_t total_bytes;
	/* By traffic class ([qos]): jobs that completed OK and failed, bytes, latency. */
	uint64_t class_ok[COUNTERS_CLASSES];
	uint64_t class_failed[COUNTERS_CLASSES];
	uint64_t class_bytes[COUNTERS_CLASSES];
	struct histogram class_latency[COUNTERS_CLASSES];
	/* [metrics] job_stages: jobs to other daemons that completed OK, by stage (bounds:
	 * counters_stage_bounds). */
	struct histogram job_stage[COUNTERS_STAGE_MAX];
};

void counters_init(struct counters *c);

/*
 * A job completed (exactly once per job). kind is an enum job_kind, err 0 or a negative error,
 * bytes what moved, latency from submission to completion; peer_addr is NULL for a job between
 * two regions of this daemon.
 */
void counters_job_done(struct counters *c, int kind, int err, uint64_t bytes, uint64_t latency_ns,
		       const char *peer_addr, uint16_t peer_port, bool had_imm);
/* The same job by traffic class (0 latency, 1 bulk); other values are not counted. */
void counters_class_done(struct counters *c, int cls, int err, uint64_t bytes, uint64_t latency_ns);
/* A job to another daemon that completed OK, in nanoseconds per stage. */
void counters_job_stages(struct counters *c, const uint64_t stage_ns[COUNTERS_STAGE_MAX]);
/*
 * The q-quantile (0 < q <= 1) of a latency histogram, in seconds: the upper
 * bound of the bucket holding it (the last finite bound for +Inf); 0 when empty.
 */
double counters_quantile(const struct histogram *h, double q);
/* The same for a histogram of the n_bounds bounds given (a stage histogram). */
double counters_quantile_of(const struct histogram *h, const double *bounds, size_t n_bounds,
			    double q);
/* transport is the transport's name ("tcp", "verbs"). */
void counters_conn_event(struct counters *c, const char *transport, enum counters_conn_event event);
/* An ExpectImm of a client reached its count. */
void counters_imm_fired(struct counters *c);

#endif
