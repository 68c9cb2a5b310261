/* SPDX-License-Identifier: MIT */
/**
 * \file rdmax.h
 * \brief librdmax: the client library of the rdmaxd transfer daemon.
 *
 * An application connects to the node's rdmaxd over a Unix socket, hands it
 * memory once (rdmax_region_alloc_host() or rdmax_region_register_fd()), exports
 * region descriptors to its peers however it likes, then submits transfer
 * jobs: WRITE, READ, PAGED_WRITE and PAGED_READ (KV-cache block tables), SCATTER (one
 * region to many peers), BARRIER (an imm to every peer of a group) and SEND
 * (a small message to a mailbox), alone or mixed in one batch. Every
 * submitted job gets exactly one completion event; rdmax_cancel() and
 * rdmax_job_status() act on jobs in flight.
 *
 * Error convention: every int-returning function returns 0 (or a count) on
 * success and a negative value on failure: a negative errno, or one of the
 * RDMAX_E_* codes below -1000. rdmax_strerror() names both.
 *
 * Thread safety: a struct rdmax_client and the regions and peer groups made
 * through it are not thread-safe: use one client per thread, or serialise
 * every call that names the client (or one of its objects) with a lock. Calls
 * that name no client (rdmax_strerror(), rdmax_err_name(), rdmax_desc_import())
 * are safe from any thread. Different clients never share state.
 *
 * Ownership: the library owns what it returns by pointer (the client, regions,
 * peer groups, rdmax_client_info(), the payloads of MESSAGE events) and frees
 * it in the matching destructor; everything the caller passes in stays the
 * caller's and need only live for the duration of the call.
 *
 * Object lifetimes come in pairs: rdmax_client_open()/rdmax_client_close(),
 * rdmax_region_alloc_host() and rdmax_region_alloc_gpu()/rdmax_region_free(),
 * rdmax_region_register_fd() and rdmax_region_register_gpu()/
 * rdmax_region_deregister(), rdmax_peer_group_create()/rdmax_peer_group_destroy(),
 * rdmax_mailbox_open_addr()/rdmax_mailbox_close().
 *
 * ABI: the library is librdmax.so.2; its symbols are in version node
 * RDMAX_2.0, and those added since in one node per release after it
 * (RDMAX_2.1: rdmax_expect_imm_flags(), rdmax_release_imm()).
 * struct rdmax_job and struct rdmax_event cross the boundary with their size
 * (the inline rdmax_submit() and rdmax_poll_events() pass sizeof of this
 * header's structs to rdmax_submit_sized() and rdmax_poll_events_sized()), and
 * struct rdmax_daemon_info starts with its own size, so later releases append
 * fields without breaking programs built against this header: a shorter job
 * is read as if its missing tail were zero, a longer one is refused with
 * RDMAX_E_INVALID_ARGUMENT only when its unknown tail is not zero, and events
 * are written up to the caller's size. Append fields only; never reorder.
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

/** ABI of this header: librdmax.so.\<RDMAX_ABI_VERSION\>, symbol version RDMAX_2.0. */
#define RDMAX_ABI_VERSION 2

/** Default client socket path of rdmaxd. */
#define RDMAX_DEFAULT_SOCKET "/run/rdmaxd.sock"

/**
 * \name Status codes
 * Job completions and library calls use these (negated, offset by 1000)
 * besides negative errno values. The numbers follow the protocol's Status
 * enum: RDMAX_E_x == -(1000 + rdmax.v1.Status.x).
 * @{
 */
#define RDMAX_OK                   0
#define RDMAX_ERR_BASE             1000
#define RDMAX_E_INVALID_ARGUMENT   (-1001) /**< a field is missing or malformed */
#define RDMAX_E_NOT_FOUND          (-1002) /**< unknown or stale region/descriptor/mailbox */
#define RDMAX_E_PERMISSION_DENIED  (-1003) /**< access flags, ownership or authentication */
#define RDMAX_E_OUT_OF_RANGE       (-1004) /**< offset/length outside a region */
#define RDMAX_E_UNREACHABLE        (-1005) /**< the peer daemon cannot be reached */
#define RDMAX_E_REMOTE_ACCESS      (-1006) /**< the remote side refused the access */
#define RDMAX_E_TIMEOUT            (-1007) /**< deadline passed or peer stopped answering */
#define RDMAX_E_CANCELLED          (-1008) /**< cancelled by the client or daemon shutdown */
#define RDMAX_E_TRANSPORT_ERROR    (-1009) /**< the connection failed during the job */
#define RDMAX_E_RESOURCE_EXHAUSTED (-1010) /**< a limit was hit */
#define RDMAX_E_UNIMPLEMENTED      (-1011) /**< request or job kind not implemented */
#define RDMAX_E_PROTOCOL_ERROR     (-1012) /**< undecodable message or protocol breach */
#define RDMAX_E_ALREADY_EXISTS     (-1013) /**< e.g. imm value claimed by another client */
#define RDMAX_E_INTERNAL           (-1014) /**< unexpected daemon-side failure */
/** libcuda.so.1 cannot be loaded: no NVIDIA driver (or one older than CUDA 11.7) */
#define RDMAX_E_GPU_DRIVER_MISSING (-1015)
/** the pointer is not CUDA device memory (cudaMalloc/cuMemAlloc) of this process */
#define RDMAX_E_GPU_NOT_DEVICE_MEMORY (-1016)
/** the allocation cannot be exported for RDMA: CUDA VMM, e.g. PyTorch expandable_segments */
#define RDMAX_E_GPU_NOT_EXPORTABLE (-1017)
/** no dma-buf support (driver, GPU, kernel or NIC) and no usable nvidia_peermem fallback */
#define RDMAX_E_GPU_NO_DMABUF (-1018)
/** no RDMA device can register GPU memory: the daemon runs the TCP transport only */
#define RDMAX_E_GPU_NEEDS_RDMA (-1019)
/** larger than the NIC's max_mr_size or the GPU's BAR1 space */
#define RDMAX_E_GPU_TOO_LARGE (-1020)
/** a registered GPU allocation was freed and a new one now lives at its address */
#define RDMAX_E_GPU_ADDRESS_REUSED (-1021)
#define RDMAX_E_DISCONNECTED       (-1100) /**< the daemon closed the connection */
/** @} */

/** \name Region access flags @{ */
#define RDMAX_ACCESS_LOCAL        0x0u /**< only jobs of this node may use the region */
#define RDMAX_ACCESS_REMOTE_READ  0x1u /**< peers may READ from the region */
#define RDMAX_ACCESS_REMOTE_WRITE 0x2u /**< peers may WRITE into the region */
/** @} */

/** Largest encoded region descriptor the library produces or accepts. */
#define RDMAX_DESC_MAX 1024

/** Bytes of the failure reason carried by a completion event, including the NUL. */
#define RDMAX_MESSAGE_MAX 160

/** Longest mailbox name in bytes (printable ASCII, no spaces). */
#define RDMAX_MAILBOX_NAME_MAX 64

/** Largest SEND payload in bytes. */
#define RDMAX_MESSAGE_PAYLOAD_MAX (64u * 1024)

/**
 * Region pairs one PAGED_WRITE or PAGED_READ may carry (its own
 * \c local / \c remote and \c n_pairs more). A daemon announces its own
 * bound as rdmax_daemon_info.max_paged_pairs.
 */
#define RDMAX_PAGED_PAIRS_MAX 256u

/** Bytes of a node name, including the terminating NUL. */
#define RDMAX_NODE_NAME_MAX 64

/** Connection to the node's rdmaxd. Opaque. */
struct rdmax_client;

/** A region registered with the daemon by this client. Opaque. */
struct rdmax_region;

/**
 * A peer group: remote region descriptors the daemon decoded and resolved
 * once, for repeated SCATTER and BARRIER jobs. Opaque.
 */
struct rdmax_peer_group;

/** An encoded region descriptor, as produced by rdmax_region_desc(). */
struct rdmax_desc {
	uint32_t len;                  /**< bytes used in \c bytes */
	uint8_t bytes[RDMAX_DESC_MAX]; /**< opaque encoding; ship it to peers as is */
};

/** Job kinds. */
enum rdmax_op {
	RDMAX_OP_WRITE = 1,       /**< local region -> remote descriptor */
	RDMAX_OP_READ = 2,        /**< remote descriptor -> local region */
	RDMAX_OP_PAGED_WRITE = 3, /**< page lists on both sides */
	RDMAX_OP_SCATTER = 4,     /**< one local region -> many destinations */
	RDMAX_OP_BARRIER = 5,     /**< zero-byte write-with-imm to each peer */
	RDMAX_OP_SEND = 6,        /**< small message to a mailbox address */
	RDMAX_OP_PAGED_READ = 7,  /**< page lists on both sides, remote pages into local ones */
};

/**
 * Job flags. RDMAX_JOB_IMM: the job carries \c imm (WRITE, PAGED_WRITE,
 * SCATTER; a BARRIER always carries it). The receiving node counts it once
 * per job when all of the job's bytes for that node have landed, however
 * the job was split (for SCATTER: once per destination node).
 */
#define RDMAX_JOB_IMM 0x1u

/**
 * \name Traffic classes (rdmax_job.traffic_class)
 * With the daemon's [qos] enabled, latency-class chunks pass queued bulk
 * chunks and get latency_weight : bulk_weight of the transfers while both
 * classes wait (docs/protocol.md, "Traffic classes"). RDMAX_CLASS_DEFAULT
 * takes the session's class ($RDMAX_TRAFFIC_CLASS at rdmax_client_open():
 * "latency" or "bulk"), else the daemon's [qos] default_class. Other values
 * fail the job with RDMAX_E_INVALID_ARGUMENT. @{
 */
#define RDMAX_CLASS_DEFAULT 0u /**< the session's class, else the daemon's default */
#define RDMAX_CLASS_LATENCY 1u /**< small, latency-sensitive transfers */
#define RDMAX_CLASS_BULK    2u /**< throughput transfers */
/** @} */

/**
 * A page list of one side of a PAGED_WRITE or PAGED_READ: page \c i starts at byte
 * <tt>offset + indices[i] * stride</tt> of its region and is \c page_len
 * bytes long (a KV-cache block table).
 */
struct rdmax_pages {
	uint64_t offset;         /**< byte offset of page 0 in the region */
	uint64_t stride;         /**< bytes from one page to the next; 0 means page_len */
	const uint32_t *indices; /**< page numbers, in transfer order */
	size_t count;            /**< entries in \c indices */
};

/**
 * One more region pair of a PAGED_WRITE or PAGED_READ: the job's page lists
 * move between \c local and \c remote too (every layer's K and V of a KV
 * cache, with the same block ids).
 */
struct rdmax_region_pair {
	struct rdmax_region *local;      /**< a region of this client */
	const struct rdmax_desc *remote; /**< a region of the same node as the job's \c remote */
};

/** One destination of a SCATTER. */
struct rdmax_scatter_dest {
	/** destination region; NULL to use member \c peer_index of the job's group */
	const struct rdmax_desc *remote;
	uint32_t peer_index;    /**< member of the job's peer group when \c remote is NULL */
	uint64_t remote_offset; /**< offset in the destination region */
	uint64_t local_offset;  /**< offset in the job's local region */
	uint64_t length;        /**< bytes */
};

/**
 * One job. Set \c id, \c op, the common fields and the fields of the
 * chosen op; everything else must be zero. Descriptors, regions, page lists,
 * destination arrays and payloads only need to stay valid until
 * rdmax_submit() returns (the library encodes them immediately).
 *
 * - WRITE: \c length bytes at \c local_offset of \c local to
 *   \c remote_offset of \c remote.
 * - READ: the reverse; \c local receives.
 * - PAGED_WRITE: \c u.paged.local_pages of \c local to
 *   \c u.paged.remote_pages of \c remote, pairwise in list order, each
 *   \c u.paged.page_len bytes. The lists have the same length (any number of
 *   pages; the daemon's message limit bounds it: 10 000 pages take about
 *   40 KB); destination pages must not repeat; every page must lie inside its
 *   region. Pages contiguous on both sides move as one transfer. No pages
 *   with RDMAX_JOB_IMM: the imm alone is sent.
 * - PAGED_READ: the mirror of PAGED_WRITE: \c u.paged.remote_pages of
 *   \c remote are read into \c u.paged.local_pages of \c local (the local
 *   pages are the destination and must not repeat; remote pages may). Takes
 *   no imm: the reader learns of the landing from the completion itself.
 * - Both paged kinds may carry more region pairs (\c pairs, \c n_pairs):
 *   the same page lists then move between each pair's regions too, as one
 *   job.
 * - SCATTER: from \c local to each of \c u.scatter.dests (descriptors, or
 *   members of \c u.scatter.group); with RDMAX_JOB_IMM each destination
 *   node counts the imm once for the job.
 * - BARRIER: a zero-byte write carrying \c imm to each distinct node of
 *   \c u.barrier.group or \c u.barrier.remotes (their regions need remote
 *   write access). Completes once every node acknowledged. A receiver that
 *   expects N senders calls rdmax_expect_imm(imm, N).
 * - SEND: \c u.send.length bytes to the mailbox whose address is \c remote
 *   (from rdmax_mailbox_open_addr(); a region descriptor is refused with
 *   RDMAX_E_INVALID_ARGUMENT). \c u.send.mailbox may be NULL; when set it
 *   must be the address's name. Completes once the message was handed to
 *   the mailbox's owner; RDMAX_E_NOT_FOUND when no such mailbox is open
 *   there or the address's key is not the mailbox's (the same answer).
 *
 * Extensible: later releases append fields after \c u. Zero the whole
 * struct (e.g. <tt>struct rdmax_job j = {0};</tt> or designated
 * initialisers) so that fields this program does not know stay zero.
 */
struct rdmax_job {
	uint64_t id;          /**< chosen by the caller, echoed in the completion */
	enum rdmax_op op;     /**< job kind */
	uint32_t flags;       /**< RDMAX_JOB_* */
	uint32_t imm;         /**< immediate value (RDMAX_JOB_IMM; always for BARRIER) */
	uint32_t deadline_ms; /**< 0: none; else the job fails with RDMAX_E_TIMEOUT after it */
	struct rdmax_region *local;      /**< WRITE, READ, PAGED_*, SCATTER: local region */
	uint64_t local_offset;           /**< WRITE/READ: offset in \c local */
	uint64_t length;                 /**< WRITE/READ: bytes */
	const struct rdmax_desc *remote; /**< WRITE, READ, PAGED_*: remote region; SEND: the
					      mailbox's address */
	uint64_t remote_offset;          /**< WRITE/READ: offset in the remote region */
	/** Fields of the other ops. */
	union {
		/** PAGED_WRITE and PAGED_READ */
		struct {
			uint64_t page_len;               /**< bytes per page, > 0 */
			struct rdmax_pages local_pages;  /**< pages of \c local */
			struct rdmax_pages remote_pages; /**< pages of \c remote */
		} paged;
		/** SCATTER */
		struct {
			const struct rdmax_scatter_dest *dests; /**< destinations */
			size_t count;                           /**< entries in \c dests, > 0 */
			struct rdmax_peer_group *group; /**< for peer_index destinations, or NULL */
		} scatter;
		/** BARRIER: either a group or a list of descriptors */
		struct {
			struct rdmax_peer_group *group;   /**< the peers, or NULL */
			const struct rdmax_desc *remotes; /**< or this array of descriptors */
			size_t count;                     /**< entries in \c remotes */
		} barrier;
		/** SEND */
		struct {
			const char *mailbox; /**< NULL, or the address's mailbox name */
			const void *payload; /**< message bytes */
			size_t length;       /**< at most RDMAX_MESSAGE_PAYLOAD_MAX */
		} send;
	} u;
	/**
	 * PAGED_WRITE and PAGED_READ (after RDMAX_2.0's first layout): \c n_pairs
	 * more region pairs moved with the same page lists, in this order after
	 * (\c local, \c remote); NULL and 0 for none. One completion for the
	 * whole job, its bytes the sum over all pairs; the imm is counted once,
	 * after every pair landed. Every remote must name the node of \c remote,
	 * and every region must hold the pages (the daemon names the pair it
	 * refuses). At most max_paged_pairs - 1 (rdmax_daemon_info): a daemon
	 * that does not announce the field takes none (RDMAX_E_UNIMPLEMENTED).
	 */
	const struct rdmax_region_pair *pairs;
	size_t n_pairs;         /**< entries in \c pairs */
	uint32_t traffic_class; /**< RDMAX_CLASS_*; appended after RDMAX_2.0's first layout */
};

/** Event kinds returned by rdmax_poll_events(). */
enum rdmax_event_type {
	RDMAX_EVENT_COMPLETION = 1,  /**< a job finished: job_id, status, bytes */
	RDMAX_EVENT_IMM_REACHED = 2, /**< an ExpectImm fired: imm, count */
	RDMAX_EVENT_MESSAGE = 3,     /**< a message for one of this client's mailboxes */
};

/**
 * One event. Each field has one meaning, for the event types named in its
 * comment; the others leave it zero. Extensible: later releases append
 * fields, written only to callers whose event size covers them.
 */
struct rdmax_event {
	enum rdmax_event_type type;     /**< what happened */
	uint64_t job_id;                /**< COMPLETION: the job's id */
	int status;                     /**< COMPLETION: 0 or RDMAX_E_* */
	uint64_t bytes;                 /**< COMPLETION: bytes moved; MESSAGE: payload bytes */
	uint32_t imm;                   /**< IMM_REACHED: the imm value */
	uint64_t count;                 /**< IMM_REACHED: the count that was reached */
	char reason[RDMAX_MESSAGE_MAX]; /**< COMPLETION: why it failed ("" when status is 0) */
	char mailbox[RDMAX_MAILBOX_NAME_MAX + 1]; /**< MESSAGE: the receiving mailbox's name */
	/**
	 * MESSAGE: the payload (\c bytes long), owned by the library and valid
	 * until the next rdmax_poll_events() or rdmax_client_close() call.
	 */
	const void *payload;
	char from_node[RDMAX_NODE_NAME_MAX]; /**< MESSAGE: node name of the sender's daemon */
};

/**
 * Information returned by the daemon on connect. Extensible: later releases
 * append fields; a field exists when RDMAX_INFO_HAS(info, field) says so.
 */
struct rdmax_daemon_info {
	uint32_t struct_size;          /**< bytes of this struct the library filled in */
	uint32_t protocol_version;     /**< daemon's protocol version */
	char daemon_version[32];       /**< daemon's release */
	char node_name[64];            /**< node name */
	uint64_t instance_id;          /**< random per daemon start */
	uint32_t capabilities;         /**< RDMAX_CAP_* bits */
	uint32_t max_message_bytes;    /**< per-client limit */
	uint32_t max_fds_per_message;  /**< per-client limit */
	uint32_t max_regions;          /**< per-client limit */
	uint64_t max_registered_bytes; /**< per-client limit */
	uint32_t max_outstanding_jobs; /**< per-client limit */
	uint32_t max_jobs_per_submit;  /**< per-client limit */
	/** region pairs of one paged job (1 + rdmax_job.n_pairs); 1 when the daemon predates them
	 */
	uint32_t max_paged_pairs;
};

/** Whether \p info (a struct rdmax_daemon_info pointer) has \p field. */
#define RDMAX_INFO_HAS(info, field)                                                                \
	((info)->struct_size >= offsetof(struct rdmax_daemon_info, field) + sizeof((info)->field))

/** \name Daemon capabilities @{ */
#define RDMAX_CAP_TCP          0x1u
#define RDMAX_CAP_VERBS        0x2u
#define RDMAX_CAP_DMABUF       0x4u
#define RDMAX_CAP_PEERMEM      0x8u
#define RDMAX_CAP_AUTH         0x10u
#define RDMAX_CAP_RING         0x20u /**< shared-memory submission/completion ring */
#define RDMAX_CAP_IMM_STANDING 0x40u /**< standing imm claims (RDMAX_EXPECT_STANDING) */
#define RDMAX_CAP_RING_COUNTS  0x80u /**< the ring counts RingNotify datagrams (no EAGAIN reads) */
/** @} */

/**
 * Connect to rdmaxd and say hello.
 * \param socket_path path of the daemon's client socket; NULL means
 *        $RDMAX_SOCKET, else RDMAX_DEFAULT_SOCKET
 * \param client_name name shown in the daemon's logs and metrics, and matched by
 *        the daemon's [verbs] pin rules, which may bind this client's traffic
 *        to some RDMA devices (e.g. the NICs nearest its GPU); may be NULL.
 *        $RDMAX_TRAFFIC_CLASS ("latency" or "bulk"), when set, is the class
 *        of the session's jobs that name none (RDMAX_E_INVALID_ARGUMENT for
 *        any other value)
 * \param ret_client receives the connection on success; close it with
 *        rdmax_client_close()
 * \return 0 or a negative error (RDMAX_E_DISCONNECTED or -ECONNREFUSED/-ENOENT
 *         when no daemon listens, RDMAX_E_PROTOCOL_ERROR when the peer is not rdmaxd)
 * Thread-safe: yes (it touches no other client).
 */
int rdmax_client_open(const char *socket_path, const char *client_name,
		      struct rdmax_client **ret_client);

/**
 * Close the connection. The daemon fails the client's outstanding jobs and
 * releases its regions. Local mappings made by rdmax_region_alloc_host() are
 * unmapped and the client's region and peer-group handles are freed: none of
 * them may be used afterwards. Accepts NULL.
 * \param client connection to close; freed
 */
void rdmax_client_close(struct rdmax_client *client);

/**
 * What the daemon said in its Welcome.
 * \param client an open connection
 * \return pointer owned by the library, valid until rdmax_client_close()
 *         (NULL for a NULL client); check RDMAX_INFO_HAS() before reading a
 *         field newer than RDMAX_2.0
 */
const struct rdmax_daemon_info *rdmax_client_info(const struct rdmax_client *client);

/**
 * A file descriptor that becomes readable when events may be waiting, for
 * the application's own event loop. Call rdmax_poll_events() with a zero
 * timeout when it does.
 * \param client an open connection
 * \return the fd (owned by the library: never read, write or close it), or -EINVAL
 */
int rdmax_client_fd(const struct rdmax_client *client);

/**
 * Whether this connection submits jobs and receives completions through the
 * shared-memory ring (docs/protocol.md). rdmax_client_open() sets it up when
 * the daemon offers it (RDMAX_CAP_RING) unless the environment says
 * RDMAX_RING=0; without it every job and completion crosses the socket. The
 * behaviour of every other call is the same either way.
 * \param client an open connection
 * \return 1 when the ring is in use, 0 when not, or -EINVAL
 */
int rdmax_client_uses_ring(const struct rdmax_client *client);

/**
 * Allocate host memory (a sealed memfd mapped here), register it with the
 * daemon and return the region. rdmax_region_addr() is the mapping, zeroed;
 * rdmax_region_free() releases both.
 * \param client an open connection
 * \param length bytes (rounded up to the page size)
 * \param access RDMAX_ACCESS_* bits
 * \param ret_region receives the region, owned by the library until
 *        rdmax_region_free() or rdmax_client_close()
 * \return 0 or a negative error (RDMAX_E_INVALID_ARGUMENT for length 0 or
 *         unknown access bits, RDMAX_E_RESOURCE_EXHAUSTED past the daemon's
 *         region limits, -ENOMEM)
 */
int rdmax_region_alloc_host(struct rdmax_client *client, uint64_t length, uint32_t access,
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
 * \param ret_region receives the region; release it with rdmax_region_deregister()
 * \return 0 or a negative error (RDMAX_E_INVALID_ARGUMENT for an unaligned
 *         offset or unknown access bits, RDMAX_E_PERMISSION_DENIED for an fd
 *         without F_SEAL_SHRINK, -EBADF)
 */
int rdmax_region_register_fd(struct rdmax_client *client, int fd, uint64_t offset, uint64_t length,
			     void *addr, uint32_t access, struct rdmax_region **ret_region);

/**
 * Register CUDA device memory of this process (docs/gpu.md). The library
 * finds the whole allocation that holds \p dev_ptr and hands it to the
 * daemon as a dma-buf (the daemon registers it with every RDMA device; no
 * copy through host memory), or, when the daemon or the driver offers no
 * dma-buf path, as a CUDA IPC handle for the nvidia_peermem fallback. Any
 * interior range of an allocation may be registered, the same allocation
 * more than once. Deregister the region before freeing the memory: a new
 * allocation at the address of a registered one is refused with
 * RDMAX_E_GPU_ADDRESS_REUSED. libcuda is loaded at the first call; the
 * memory's GPU needs no current context in the calling thread.
 * GPU regions move over RDMA only: the daemon never copies them through
 * host memory, so jobs that would need that (the TCP transport, a copy
 * between two regions of this node) fail.
 * \param client an open connection
 * \param dev_ptr start of the range (device pointer)
 * \param length bytes
 * \param access RDMAX_ACCESS_* bits
 * \param ret_region receives the region; rdmax_region_addr() returns \p dev_ptr;
 *        release it with rdmax_region_deregister()
 * \return 0 or a negative error: RDMAX_E_GPU_DRIVER_MISSING,
 *         RDMAX_E_GPU_NOT_DEVICE_MEMORY, RDMAX_E_GPU_NOT_EXPORTABLE,
 *         RDMAX_E_GPU_NO_DMABUF, RDMAX_E_GPU_NEEDS_RDMA, RDMAX_E_GPU_TOO_LARGE,
 *         RDMAX_E_GPU_ADDRESS_REUSED, RDMAX_E_OUT_OF_RANGE (range past the
 *         end of the allocation), or another error
 */
int rdmax_region_register_gpu(struct rdmax_client *client, void *dev_ptr, uint64_t length,
			      uint32_t access, struct rdmax_region **ret_region);

/**
 * Lease GPU memory from the daemon's pool on a GPU ([gpu] pool_bytes, see
 * docs/gpu.md): the pool was registered with the RDMA devices when the
 * daemon started, so a lease costs no registration. The library maps the
 * pool into this process (CUDA IPC) and rdmax_region_addr() returns the
 * slice's device pointer. rdmax_region_free() gives the slice back, as does
 * closing the connection.
 * \param client an open connection
 * \param cuda_device CUDA device ordinal in this process
 * \param length bytes (rounded up to the pool's granularity)
 * \param access RDMAX_ACCESS_* bits
 * \param ret_region receives the region; release it with rdmax_region_free()
 * \return 0 or a negative error: RDMAX_E_NOT_FOUND (no pool on that GPU),
 *         RDMAX_E_RESOURCE_EXHAUSTED (pool full), RDMAX_E_GPU_DRIVER_MISSING,
 *         or another error
 */
int rdmax_region_alloc_gpu(struct rdmax_client *client, int cuda_device, uint64_t length,
			   uint32_t access, struct rdmax_region **ret_region);

/**
 * Deregister a region made by rdmax_region_register_fd() or
 * rdmax_region_register_gpu(). Waits until the daemon has finished the jobs
 * that use it, then frees the handle; the memory stays the caller's.
 * \param client an open connection
 * \param region the region; freed even when the daemon's answer is an error
 * \return 0 or a negative error; -EINVAL (nothing freed) for a region of
 *         another client or one made by rdmax_region_alloc_host() or
 *         rdmax_region_alloc_gpu()
 */
int rdmax_region_deregister(struct rdmax_client *client, struct rdmax_region *region);

/**
 * Free a region made by rdmax_region_alloc_host() or rdmax_region_alloc_gpu():
 * waits until the daemon has finished the jobs that use it, deregisters it,
 * unmaps its memory (host) or gives the pool slice back (GPU), and frees the
 * handle. Accepts NULL.
 * \param client an open connection
 * \param region the region; freed even when the daemon's answer is an error
 * \return 0 or a negative error; -EINVAL (nothing freed) for a region of
 *         another client or one made by a register call
 */
int rdmax_region_free(struct rdmax_client *client, struct rdmax_region *region);

/**
 * \param region a region
 * \return the local address of the region (the library's mapping for
 *         rdmax_region_alloc_host(), the caller's address otherwise), or NULL
 *         when unknown
 */
void *rdmax_region_addr(const struct rdmax_region *region);

/** \param region a region \return the region's length in bytes (0 for NULL) */
uint64_t rdmax_region_length(const struct rdmax_region *region);

/** \param region a region \return the daemon's id of the region (0 for NULL) */
uint64_t rdmax_region_id(const struct rdmax_region *region);

/**
 * The region's descriptor, for peers to address it.
 * \param region a registered region
 * \param ret_desc receives a copy of the descriptor (the caller's memory)
 * \return 0 or -EINVAL
 */
int rdmax_region_desc(const struct rdmax_region *region, struct rdmax_desc *ret_desc);

/**
 * Build a descriptor from bytes received from a peer (checks the encoding:
 * a version this library knows, at least one endpoint). Thread-safe.
 * \param bytes the encoded descriptor
 * \param len its length, at most RDMAX_DESC_MAX
 * \param ret_desc receives the descriptor (the caller's memory)
 * \return 0 or RDMAX_E_INVALID_ARGUMENT
 */
int rdmax_desc_import(const void *bytes, size_t len, struct rdmax_desc *ret_desc);

/**
 * Submit jobs in one message; kinds may be mixed freely (WRITE, READ,
 * PAGED_WRITE, PAGED_READ, SCATTER, BARRIER, SEND in one batch). The daemon
 * starts them in array order; they run concurrently. Either all jobs are
 * accepted for processing (each then gets exactly one completion event,
 * which may be an error) or the call fails and none was submitted:
 * RDMAX_E_INVALID_ARGUMENT for a job whose fields cannot be encoded (unknown
 * op or flags, missing region, descriptor, page indices or mailbox, a
 * non-zero field this library does not know), RDMAX_E_RESOURCE_EXHAUSTED
 * when the batch exceeds the daemon's message or job limits. The daemon
 * judges ranges, page lists and names and reports them in the completion.
 * The call does not wait for the daemon: should the daemon refuse the whole
 * message later, each of its jobs gets a completion event carrying the
 * refusal's status.
 * Applications call rdmax_submit(); this is what it calls.
 * \param client an open connection
 * \param jobs array of \p count jobs, \p job_size bytes apart; read during
 *        the call only (descriptors, page lists and payloads are encoded at once)
 * \param count number of jobs (at most max_jobs_per_submit)
 * \param job_size sizeof(struct rdmax_job) of the caller's header; at least
 *        RDMAX_JOB_SIZE_MIN
 * \return 0 or a negative error
 */
int rdmax_submit_sized(struct rdmax_client *client, const struct rdmax_job *jobs, size_t count,
		       size_t job_size);

/** Smallest job size rdmax_submit_sized() accepts: struct rdmax_job of RDMAX_2.0. */
#define RDMAX_JOB_SIZE_MIN 136u

/**
 * rdmax_submit_sized() with this header's struct size.
 * \param client an open connection
 * \param jobs array of jobs
 * \param count number of jobs
 * \return 0 or a negative error
 */
static inline int rdmax_submit(struct rdmax_client *client, const struct rdmax_job *jobs,
			       size_t count)
{
	return rdmax_submit_sized(client, jobs, count, sizeof(struct rdmax_job));
}

/**
 * Ask to be told when \p count jobs carrying \p imm have fully landed in
 * regions of this client. Fires once as an RDMAX_EVENT_IMM_REACHED event;
 * \p count is then taken off the counter. Each client counts in its own
 * namespace: landings in other clients' regions never count here. A value
 * reused for many rounds (one per slot) is better claimed once with
 * rdmax_expect_imm_flags(RDMAX_EXPECT_STANDING).
 * \return 0 or a negative error (RDMAX_E_RESOURCE_EXHAUSTED when every imm
 * counter the uid may hold is claimed)
 * \param client an open connection
 * \param imm the immediate value
 * \param count landings to wait for, > 0
 */
int rdmax_expect_imm(struct rdmax_client *client, uint32_t imm, uint64_t count);

/** rdmax_expect_imm_flags() flags. @{ */
/**
 * A standing claim: it stays after it fires and fires again each time
 * \p count more landings are counted, until rdmax_release_imm() or another
 * claim of the value. A receiver that reuses one imm per slot claims it once
 * instead of once per request. An event's \c count is then a multiple of
 * \p count: more than one only when the claim found several counts landed.
 */
#define RDMAX_EXPECT_STANDING 0x1u
/** Drop the landings counted so far for the value before claiming it. */
#define RDMAX_EXPECT_RESET 0x2u
/** @} */

/**
 * rdmax_expect_imm() with flags. A claim replaces the value's earlier
 * claim by this client (one-shot or standing).
 * \param client an open connection
 * \param imm the immediate value
 * \param count landings per firing, > 0
 * \param flags RDMAX_EXPECT_* bits
 * \return 0 or a negative error (RDMAX_E_INVALID_ARGUMENT for count 0 or
 *         unknown flags, RDMAX_E_UNIMPLEMENTED for RDMAX_EXPECT_STANDING when
 *         the daemon lacks RDMAX_CAP_IMM_STANDING, RDMAX_E_RESOURCE_EXHAUSTED
 *         as for rdmax_expect_imm())
 */
int rdmax_expect_imm_flags(struct rdmax_client *client, uint32_t imm, uint64_t count,
			   uint32_t flags);

/**
 * End this client's claim of \p imm, one-shot or standing. Landings counted
 * and not consumed stay counted for a later claim; an IMM_REACHED event the
 * daemon sent before the release may still be returned.
 * \param client an open connection
 * \param imm the immediate value
 * \return 0 or a negative error (RDMAX_E_NOT_FOUND when the value is not
 *         claimed, RDMAX_E_UNIMPLEMENTED when the daemon lacks
 *         RDMAX_CAP_IMM_STANDING)
 */
int rdmax_release_imm(struct rdmax_client *client, uint32_t imm);

/**
 * Return up to \p max events, waiting up to \p timeout_ms for the first
 * (0: do not wait; -1: wait forever). Events received before the
 * connection failed are returned before the error. The payloads of
 * RDMAX_EVENT_MESSAGE events returned by one call are owned by the library
 * and stay valid until the next call (or rdmax_client_close()); copy what
 * must live longer. Applications call rdmax_poll_events(); this is what it
 * calls.
 * \param client an open connection
 * \param events receives the events, \p event_size bytes apart
 * \param max room in \p events
 * \param event_size sizeof(struct rdmax_event) of the caller's header, at
 *        least RDMAX_EVENT_SIZE_MIN: fields past it are not written, fields
 *        the library does not know are zeroed
 * \param timeout_ms 0: do not wait; -1: wait forever
 * \return number of events (0 on timeout) or a negative error
 *         (RDMAX_E_DISCONNECTED once the daemon has hung up, -EINVAL for a
 *         size below the minimum)
 */
int rdmax_poll_events_sized(struct rdmax_client *client, struct rdmax_event *events, size_t max,
			    size_t event_size, int timeout_ms);

/** Smallest event size rdmax_poll_events_sized() accepts: struct rdmax_event of RDMAX_2.0. */
#define RDMAX_EVENT_SIZE_MIN 352u

/**
 * rdmax_poll_events_sized() with this header's struct size.
 * \param client an open connection
 * \param events receives the events
 * \param max room in \p events
 * \param timeout_ms 0: do not wait; -1: wait forever
 * \return number of events (0 on timeout) or a negative error
 */
static inline int rdmax_poll_events(struct rdmax_client *client, struct rdmax_event *events,
				    size_t max, int timeout_ms)
{
	return rdmax_poll_events_sized(client, events, max, sizeof(struct rdmax_event), timeout_ms);
}

/**
 * Wait for one job's completion; other events that arrive meanwhile are kept
 * for rdmax_poll_events(). The completion's reason is not returned: use
 * rdmax_poll_events() when it matters.
 * \param client an open connection
 * \param job_id the job
 * \param timeout_ms 0: do not wait; -1: wait forever
 * \return the job's status (0 or RDMAX_E_*), RDMAX_E_TIMEOUT when the wait
 *         timed out, RDMAX_E_NOT_FOUND when the job is not outstanding and
 *         its completion is not queued, or another negative error
 */
int rdmax_wait_job(struct rdmax_client *client, uint64_t job_id, int timeout_ms);

/**
 * Wait until the given imm value's ExpectImm fires; other events are kept.
 * \param client an open connection
 * \param imm the value given to rdmax_expect_imm()
 * \param timeout_ms 0: do not wait; -1: wait forever
 * \return 0, RDMAX_E_TIMEOUT, or a negative error
 */
int rdmax_wait_imm(struct rdmax_client *client, uint32_t imm, int timeout_ms);

/**
 * Cancel a job in flight. The daemon completes it with RDMAX_E_CANCELLED at
 * once (the completion event follows); transfers already handed to the
 * network may still land, the rest are not sent.
 * \param client an open connection
 * \param job_id the job
 * \return 0, RDMAX_E_NOT_FOUND when the job is not in flight (its
 *         completion is then already on its way), or a negative error
 */
int rdmax_cancel(struct rdmax_client *client, uint64_t job_id);

/**
 * Progress of a job in flight.
 * \param client an open connection
 * \param job_id the job
 * \param ret_done receives the bytes moved so far (may be NULL)
 * \param ret_total receives the job's total bytes (may be NULL)
 * \return 0, RDMAX_E_NOT_FOUND when the job is not in flight, or a
 *         negative error
 */
int rdmax_job_status(struct rdmax_client *client, uint64_t job_id, uint64_t *ret_done,
		     uint64_t *ret_total);

/**
 * Create a peer group from remote region descriptors: the daemon decodes
 * and resolves them once, and SCATTER and BARRIER jobs name the group.
 * Members on the same node count as one node for imm and barriers.
 * \param client an open connection
 * \param descs the members (at most 1024)
 * \param count entries in \p descs
 * \param ret_group receives the group
 * \return 0 or a negative error (RDMAX_E_RESOURCE_EXHAUSTED past 64 groups
 *         per client or 1024 members, RDMAX_E_UNREACHABLE when a member has
 *         no endpoint the daemon can use)
 */
int rdmax_peer_group_create(struct rdmax_client *client, const struct rdmax_desc *descs,
			    size_t count, struct rdmax_peer_group **ret_group);

/**
 * Destroy a peer group. Jobs already submitted with it run on.
 * \param client an open connection
 * \param group the group; freed even when an error is returned. Accepts NULL.
 * \return 0 or a negative error
 */
int rdmax_peer_group_destroy(struct rdmax_client *client, struct rdmax_peer_group *group);

/** \param group a group \return the number of members of a group (0 for NULL) */
size_t rdmax_peer_group_size(const struct rdmax_peer_group *group);

/**
 * Open a mailbox on this client's node and get its address. Names live in
 * the namespace of the client's uid: another uid's mailbox of the same name
 * is another mailbox. The address (node endpoints, the uid-scoped name and a
 * random key) is a bearer capability like a region descriptor: SEND jobs
 * whose \c remote is this address arrive as RDMAX_EVENT_MESSAGE events;
 * a SEND without it (a wrong or stale key, a region descriptor) reaches
 * nothing. Ship it to the senders however you ship descriptors. Reopening a
 * name after closing it makes a new key, so old addresses stop working.
 * Limits: 64 mailboxes per client, [limits] per_uid_mailboxes per uid.
 * \param client an open connection
 * \param name 1 to RDMAX_MAILBOX_NAME_MAX printable characters, no spaces
 * \param ret_addr receives the address (may be NULL)
 * \return 0 or a negative error (RDMAX_E_ALREADY_EXISTS when this uid has
 *         the name open, RDMAX_E_INVALID_ARGUMENT, RDMAX_E_RESOURCE_EXHAUSTED)
 */
int rdmax_mailbox_open_addr(struct rdmax_client *client, const char *name,
			    struct rdmax_desc *ret_addr);

/**
 * rdmax_mailbox_open_addr() without the address: only senders that got the
 * address some other way (an earlier open does not count: every open makes
 * a new key) can reach the mailbox. Kept for programs built against 2.0.
 * \param client an open connection
 * \param name 1 to RDMAX_MAILBOX_NAME_MAX printable characters, no spaces
 * \return as rdmax_mailbox_open_addr()
 */
int rdmax_mailbox_open(struct rdmax_client *client, const char *name);

/**
 * Close one of this client's mailboxes; later SENDs to it fail with
 * RDMAX_E_NOT_FOUND. Messages already queued for this client stay queued.
 * \param client an open connection
 * \param name a mailbox this client opened
 * \return 0, RDMAX_E_NOT_FOUND, or a negative error
 */
int rdmax_mailbox_close(struct rdmax_client *client, const char *name);

/**
 * Wait for the next message for mailbox \p name (NULL: any of this
 * client's mailboxes) and copy its payload into \p buf; other events are
 * kept for rdmax_poll_events().
 * \param client an open connection
 * \param name the mailbox, or NULL
 * \param buf receives up to \p size payload bytes
 * \param size bytes of \p buf
 * \param ret_from receives the sender's node name (RDMAX_NODE_NAME_MAX bytes), or NULL
 * \param timeout_ms 0: do not wait; -1: wait forever
 * \return the payload's length (more than \p size when it was cut),
 *         RDMAX_E_TIMEOUT, or a negative error
 */
int rdmax_mailbox_recv(struct rdmax_client *client, const char *name, void *buf, size_t size,
		       char *ret_from, int timeout_ms);

/* ------------------------------------------------------------ discovery */

/** Bytes of a published region name (docs/discovery.md). */
#define RDMAX_REGION_NAME_MAX 128

/**
 * Publish \p region under \p name on this client's node, so that clients
 * of any node can find its descriptor with rdmax_lookup(). Names are unique
 * per node; the name goes when rdmax_region_unpublish(), the region's
 * deregistration or this client's exit withdraws it. A client holds at most
 * 256 names, a node 4096. Thread-safety: like every call on \p client.
 * \param client an open connection
 * \param region a region of \p client
 * \param name 1 to RDMAX_REGION_NAME_MAX characters of A-Z a-z 0-9 . _ : @ + / -
 * \return 0, RDMAX_E_INVALID_ARGUMENT (bad name), RDMAX_E_ALREADY_EXISTS
 *         (published on this node), RDMAX_E_RESOURCE_EXHAUSTED (a limit),
 *         RDMAX_E_NOT_FOUND (not a region of this client), or a negative error
 */
int rdmax_region_publish(struct rdmax_client *client, const struct rdmax_region *region,
			 const char *name);

/**
 * Withdraw a name this client published; lookups then get RDMAX_E_NOT_FOUND.
 * \return 0, RDMAX_E_NOT_FOUND, or a negative error
 */
int rdmax_region_unpublish(struct rdmax_client *client, const char *name);

/**
 * Find the descriptor published under \p name on \p node. This client's
 * daemon asks the node's daemon over its authenticated peer link (TCP or
 * verbs); no other service is involved. The descriptor is checked before
 * it is returned.
 * \param client an open connection
 * \param node a node name (this node's own, or one discovery knows:
 *        rdmax_nodes()), or ADDR:PORT (or [ADDR]:PORT) of a daemon's
 *        listener, as its descriptors' endpoints name it
 * \param name the published name
 * \param timeout_ms how long the daemon waits for the node (0: 5 s; at most 60 s)
 * \param ret_desc receives the descriptor on success
 * \return 0; RDMAX_E_NOT_FOUND (nothing published under \p name there, or
 *         the node restarted since discovery saw it); RDMAX_E_UNREACHABLE
 *         (unknown or lost node, or no connection); RDMAX_E_TIMEOUT;
 *         RDMAX_E_INVALID_ARGUMENT (bad name or node); or a negative error
 */
int rdmax_lookup(struct rdmax_client *client, const char *node, const char *name, int timeout_ms,
		 struct rdmax_desc *ret_desc);

/** One node of the cluster as discovery knows it (rdmax_nodes()). */
struct rdmax_node {
	char name[RDMAX_NODE_NAME_MAX]; /**< node name, NUL-terminated */
	uint64_t instance_id;           /**< its daemon's start */
	int alive;                      /**< 0: lost (lease expired or restarted) */
	char addr[46];                  /**< first listener's address */
	uint32_t port;                  /**< first listener's port: rdmax_lookup(ADDR:PORT) */
	uint64_t age_ms;                /**< since this instance was first seen */
};

/**
 * The nodes discovery knows, alive and lost. Each entry is written up to
 * \p node_size bytes, so programs built against an older header (a shorter
 * struct rdmax_node) keep working when fields are appended. Thread-safe.
 * \param client an open connection
 * \param nodes receives up to \p max nodes, \p node_size bytes apart
 * \param max entries of \p nodes
 * \param node_size sizeof(struct rdmax_node) of the caller's header, at least
 *        RDMAX_NODE_SIZE_MIN (RDMAX_E_INVALID_ARGUMENT otherwise)
 * \return the number of nodes known (more than \p max when the array was too
 *         short), RDMAX_E_UNIMPLEMENTED when the daemon runs without a
 *         discovery backend, or a negative error
 */
int rdmax_nodes_sized(struct rdmax_client *client, struct rdmax_node *nodes, size_t max,
		      size_t node_size);

/** Smallest node size rdmax_nodes_sized() accepts: struct rdmax_node of RDMAX_2.0. */
#define RDMAX_NODE_SIZE_MIN 136u

/**
 * rdmax_nodes_sized() with this header's struct size.
 * \param client an open connection
 * \param nodes receives up to \p max nodes
 * \param max entries of \p nodes
 * \return as rdmax_nodes_sized()
 */
static inline int rdmax_nodes(struct rdmax_client *client, struct rdmax_node *nodes, size_t max)
{
	return rdmax_nodes_sized(client, nodes, max, sizeof(struct rdmax_node));
}

/**
 * Describe an error code (negative errno or RDMAX_E_*) in words.
 * Thread-safe.
 * \param err 0, a negative errno or an RDMAX_E_* code
 * \return a static string, e.g. "timed out"
 */
const char *rdmax_strerror(int err);

/**
 * The symbolic name of an error code: "RDMAX_E_TIMEOUT", "ENOENT",
 * "RDMAX_OK" for 0, "RDMAX_E_UNKNOWN" or "UNKNOWN" for codes it does not
 * know. For logs and tests. Thread-safe.
 * \param err 0, a negative errno or an RDMAX_E_* code
 * \return a static string
 */
const char *rdmax_err_name(int err);

#ifdef __cplusplus
}
#endif

#endif /* RDMAX_H */
