/* SPDX-License-Identifier: MIT */
/**
 * \file rdmax.h
 * \brief librdmax: the client library of the rdmaxd transfer daemon.
 *
 * An application connects to the node's rdmaxd over a Unix socket, hands it
 * memory once (rdmax_alloc_host() or rdmax_region_register_fd()), exports
 * region descriptors to its peers however it likes, then submits transfer
 * jobs. Every submitted job gets exactly one completion event.
 *
 * Error convention: every int-returning function returns 0 (or a count) on
 * success and a negative value on failure: a negative errno, or one of the
 * RDMAX_E_* codes below -1000. rdmax_strerror() names both.
 *
 * Thread safety: a struct rdmax_client is not thread-safe; use one per
 * thread or serialise calls.
 */
#ifndef RDMAX_H
#define RDMAX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Protocol version spoken by this library. */
#define RDMAX_PROTOCOL_VERSION 1

/** Default client socket path of rdmaxd. */
#define RDMAX_DEFAULT_SOCKET "/run/rdmaxd.sock"

/**
 * \name Status codes
 * Job completions and library calls use these (negated, offset by 1000)
 * besides negative errno values. The numbers follow the protocol's Status
 * enum: RDMAX_E_x == -(1000 + rdmax.v1.Status.x).
 * @{
 */
#define RDMAX_OK 0
#define RDMAX_ERR_BASE 1000
#define RDMAX_E_INVALID_ARGUMENT (-1001)   /**< a field is missing or malformed */
#define RDMAX_E_NOT_FOUND (-1002)          /**< unknown or stale region/descriptor/mailbox */
#define RDMAX_E_PERMISSION_DENIED (-1003)  /**< access flags, ownership or authentication */
#define RDMAX_E_OUT_OF_RANGE (-1004)       /**< offset/length outside a region */
#define RDMAX_E_UNREACHABLE (-1005)        /**< the peer daemon cannot be reached */
#define RDMAX_E_REMOTE_ACCESS (-1006)      /**< the remote side refused the access */
#define RDMAX_E_TIMEOUT (-1007)            /**< deadline passed or peer stopped answering */
#define RDMAX_E_CANCELLED (-1008)          /**< cancelled by the client or daemon shutdown */
#define RDMAX_E_TRANSPORT_ERROR (-1009)    /**< the connection failed during the job */
#define RDMAX_E_RESOURCE_EXHAUSTED (-1010) /**< a limit was hit */
#define RDMAX_E_UNIMPLEMENTED (-1011)      /**< request or job kind not implemented */
#define RDMAX_E_PROTOCOL_ERROR (-1012)     /**< undecodable message or protocol breach */
#define RDMAX_E_ALREADY_EXISTS (-1013)     /**< e.g. imm value claimed by another client */
#define RDMAX_E_INTERNAL (-1014)           /**< unexpected daemon-side failure */
#define RDMAX_E_DISCONNECTED (-1100)       /**< the daemon closed the connection */
/** @} */

/** \name Region access flags @{ */
#define RDMAX_ACCESS_LOCAL 0x0u        /**< only jobs of this node may use the region */
#define RDMAX_ACCESS_REMOTE_READ 0x1u  /**< peers may READ from the region */
#define RDMAX_ACCESS_REMOTE_WRITE 0x2u /**< peers may WRITE into the region */
/** @} */

/** Largest encoded region descriptor the library produces or accepts. */
#define RDMAX_DESC_MAX 1024

/** Bytes of the message text carried by an event. */
#define RDMAX_MESSAGE_MAX 160

/** Connection to the node's rdmaxd. Opaque. */
struct rdmax_client;

/** A region registered with the daemon by this client. Opaque. */
struct rdmax_region;

/** An encoded region descriptor, as produced by rdmax_region_desc(). */
struct rdmax_desc {
	uint32_t len;                /**< bytes used in \c bytes */
	uint8_t bytes[RDMAX_DESC_MAX]; /**< opaque encoding; ship it to peers as is */
};

/** Job kinds. */
enum rdmax_op {
	RDMAX_OP_WRITE = 1,       /**< local region -> remote descriptor */
	RDMAX_OP_READ = 2,        /**< remote descriptor -> local region */
	RDMAX_OP_PAGED_WRITE = 3, /**< page lists on both sides */
	RDMAX_OP_SCATTER = 4,     /**< one local region -> many destinations */
	RDMAX_OP_BARRIER = 5,     /**< zero-byte write-with-imm to each peer */
	RDMAX_OP_SEND = 6,        /**< small message to a named mailbox */
};

/** Job flags. */
#define RDMAX_JOB_IMM 0x1u /**< the job carries \c imm (WRITE, PAGED_WRITE, SCATTER) */

/**
 * One transfer job. Fill the fields of the chosen op; unused fields must be
 * zero. The descriptors and regions must stay valid until rdmax_submit()
 * returns (the library encodes them immediately).
 */
struct rdmax_job {
	uint64_t id;          /**< chosen by the caller, echoed in the completion */
	enum rdmax_op op;     /**< job kind */
	uint32_t flags;       /**< RDMAX_JOB_* */
	uint32_t imm;         /**< immediate value when RDMAX_JOB_IMM is set */
	uint32_t deadline_ms; /**< 0: none; else the job fails with RDMAX_E_TIMEOUT after it */
	struct rdmax_region *local;     /**< WRITE/READ: local region */
	uint64_t local_offset;          /**< WRITE/READ: offset in \c local */
	uint64_t length;                /**< WRITE/READ: bytes */
	const struct rdmax_desc *remote; /**< WRITE/READ: remote region descriptor */
	uint64_t remote_offset;         /**< WRITE/READ: offset in the remote region */
};

/** Event kinds returned by rdmax_poll_events(). */
enum rdmax_event_type {
	RDMAX_EVENT_COMPLETION = 1,  /**< a job finished: job_id, status, bytes */
	RDMAX_EVENT_IMM_REACHED = 2, /**< an ExpectImm fired: imm, count */
	RDMAX_EVENT_MESSAGE = 3,     /**< a mailbox message arrived */
};

/** One event. */
struct rdmax_event {
	enum rdmax_event_type type; /**< what happened */
	uint64_t job_id;            /**< COMPLETION: the job's id */
	int status;                 /**< COMPLETION: 0 or RDMAX_E_* */
	uint64_t bytes;             /**< COMPLETION: bytes moved; MESSAGE: payload bytes */
	uint32_t imm;               /**< IMM_REACHED: the imm value */
	uint64_t count;             /**< IMM_REACHED: the count that was reached */
	char message[RDMAX_MESSAGE_MAX]; /**< COMPLETION: reason when status != 0; MESSAGE: mailbox */
};

/** Information returned by the daemon on connect. */
struct rdmax_daemon_info {
	uint32_t protocol_version;   /**< daemon's protocol version */
	char daemon_version[32];     /**< daemon's release */
	char node_name[64];          /**< node name */
	uint64_t instance_id;        /**< random per daemon start */
	uint32_t capabilities;       /**< RDMAX_CAP_* bits */
	uint32_t max_message_bytes;  /**< per-client limit */
	uint32_t max_fds_per_message; /**< per-client limit */
	uint32_t max_regions;        /**< per-client limit */
	uint64_t max_registered_bytes; /**< per-client limit */
	uint32_t max_outstanding_jobs; /**< per-client limit */
	uint32_t max_jobs_per_submit;  /**< per-client limit */
};

/** \name Daemon capabilities @{ */
#define RDMAX_CAP_TCP 0x1u
#define RDMAX_CAP_VERBS 0x2u
#define RDMAX_CAP_DMABUF 0x4u
#define RDMAX_CAP_PEERMEM 0x8u
#define RDMAX_CAP_AUTH 0x10u
/** @} */

/**
 * Connect to rdmaxd and say hello.
 * \param socket_path path of the daemon's client socket; NULL means
 *        $RDMAX_SOCKET, else RDMAX_DEFAULT_SOCKET
 * \param client_name name shown in the daemon's logs; may be NULL
 * \param ret_client receives the connection on success
 * \return 0 or a negative error
 */
int rdmax_client_open(const char *socket_path, const char *client_name,
		      struct rdmax_client **ret_client);

/**
 * Close the connection. The daemon fails the client's outstanding jobs and
 * releases its regions. Local mappings made by rdmax_alloc_host() are
 * unmapped and the client's region handles are freed. Accepts NULL.
 * \param client connection to close
 */
void rdmax_client_close(struct rdmax_client *client);

/**
 * What the daemon said in its Welcome.
 * \param client an open connection
 * \return pointer valid until rdmax_client_close()
 */
const struct rdmax_daemon_info *rdmax_client_info(const struct rdmax_client *client);

/**
 * A file descriptor that becomes readable when events may be waiting, for
 * the application's own event loop. Call rdmax_poll_events() with a zero
 * timeout when it does.
 * \param client an open connection
 * \return the fd (owned by the library)
 */
int rdmax_client_fd(const struct rdmax_client *client);

/**
 * Allocate host memory (a sealed memfd mapped here), register it with the
 * daemon and return the region.
 * \param client an open connection
 * \param length bytes (rounded up to the page size)
 * \param access RDMAX_ACCESS_* bits
 * \param ret_region receives the region
 * \return 0 or a negative error
 */
int rdmax_alloc_host(struct rdmax_client *client, uint64_t length, uint32_t access,
		     struct rdmax_region **ret_region);

/**
 * Register a range of an fd the application already has (memfd with
 * F_SEAL_SHRINK, shm or hugetlbfs file). The daemon maps it itself; the fd
 * stays owned by the caller.
 * \param client an open connection
 * \param fd the file
 * \param offset start of the range in the file (page aligned)
 * \param length bytes
 * \param addr the caller's own mapping of the range, or NULL (then
 *        rdmax_region_addr() returns NULL)
 * \param access RDMAX_ACCESS_* bits
 * \param ret_region receives the region
 * \return 0 or a negative error
 */
int rdmax_region_register_fd(struct rdmax_client *client, int fd, uint64_t offset,
			     uint64_t length, void *addr, uint32_t access,
			     struct rdmax_region **ret_region);

/**
 * Deregister a region. Waits until the daemon has finished the jobs that
 * use it, then frees the handle (and unmaps memory from rdmax_alloc_host()).
 * \param client an open connection
 * \param region the region; freed even when an error is returned
 * \return 0 or a negative error
 */
int rdmax_region_deregister(struct rdmax_client *client, struct rdmax_region *region);

/** \return the local address of the region, or NULL when unknown */
void *rdmax_region_addr(const struct rdmax_region *region);

/** \return the region's length in bytes */
uint64_t rdmax_region_length(const struct rdmax_region *region);

/** \return the daemon's id of the region */
uint64_t rdmax_region_id(const struct rdmax_region *region);

/**
 * The region's descriptor, for peers to address it.
 * \param region a registered region
 * \param ret_desc receives a copy of the descriptor
 * \return 0 or a negative error
 */
int rdmax_region_desc(const struct rdmax_region *region, struct rdmax_desc *ret_desc);

/**
 * Build a descriptor from bytes received from a peer (checks the encoding).
 * \param bytes the encoded descriptor
 * \param len its length
 * \param ret_desc receives the descriptor
 * \return 0 or RDMAX_E_INVALID_ARGUMENT
 */
int rdmax_desc_import(const void *bytes, size_t len, struct rdmax_desc *ret_desc);

/**
 * Submit jobs in one message. Either all jobs are accepted for processing
 * (each then gets exactly one completion event, which may be an error) or
 * the call fails and none was submitted. The call does not wait for the
 * daemon: should the daemon refuse the whole message later, each of its
 * jobs gets a completion event carrying the refusal's status.
 * \param client an open connection
 * \param jobs array of jobs
 * \param count number of jobs (at most max_jobs_per_submit)
 * \return 0 or a negative error
 */
int rdmax_submit(struct rdmax_client *client, const struct rdmax_job *jobs, size_t count);

/**
 * Ask to be told when \p count jobs carrying \p imm have fully landed on
 * this node. Fires once as an RDMAX_EVENT_IMM_REACHED event; the counter is
 * then reset. A value claimed by another client is refused.
 * \return 0 or a negative error (RDMAX_E_ALREADY_EXISTS)
 */
int rdmax_expect_imm(struct rdmax_client *client, uint32_t imm, uint64_t count);

/**
 * Return up to \p max events, waiting up to \p timeout_ms for the first
 * (0: do not wait; -1: wait forever). Events received before the
 * connection failed are returned before the error.
 * \return number of events (0 on timeout) or a negative error
 *         (RDMAX_E_DISCONNECTED once the daemon has hung up)
 */
int rdmax_poll_events(struct rdmax_client *client, struct rdmax_event *events, size_t max,
		      int timeout_ms);

/**
 * Wait for one job's completion; other events that arrive meanwhile are kept
 * for rdmax_poll_events().
 * \return the job's status (0 or RDMAX_E_*), RDMAX_E_TIMEOUT when the wait
 *         timed out, RDMAX_E_NOT_FOUND when the job is not outstanding and
 *         its completion is not queued, or another negative error
 */
int rdmax_wait_job(struct rdmax_client *client, uint64_t job_id, int timeout_ms);

/**
 * Wait until the given imm value's ExpectImm fires; other events are kept.
 * \return 0, RDMAX_E_TIMEOUT, or a negative error
 */
int rdmax_wait_imm(struct rdmax_client *client, uint32_t imm, int timeout_ms);

/**
 * Name an error code (negative errno or RDMAX_E_*).
 * \return a static string
 */
const char *rdmax_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif /* RDMAX_H */
