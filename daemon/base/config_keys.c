/* SPDX-License-Identifier: MIT */
/*
 * The table of configuration keys: every key's section, type, field, range,
 * reload behaviour and help text, and the sections' help. Data only: the
 * parser, config_set, the printers and the example file in config.c walk it.
 */
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "config_internal.h"
#include "log.h"
#include "util.h"

const struct config_section g_sections[] = {
	{"daemon", "Sockets, naming and logging of this daemon."},
	{"transport", "How this daemon talks to the daemons on other nodes."},
	{"auth", "Authentication between daemons."},
	{"limits", "Limits that protect the daemon from its clients. Values are per client unless "
		   "said otherwise."},
	{"peers", "Connections to other daemons."},
	{"engine", "How jobs are turned into transfers."},
	{"verbs", "RDMA verbs transport."},
	{"metrics", "Metrics export besides rdmaxctl stats."},
	{"discovery", "Named regions and node membership (docs/discovery.md)."},
	{"gpu", "GPU memory: how it is registered with RDMA devices, and GPU pools (see "
		"docs/gpu.md)."},
	{"qos", "Traffic classes: how transfers of latency-class and bulk-class jobs share the "
		"daemon's connections (docs/operations.md, \"Traffic classes\")."},
};

const struct config_key g_keys[] = {
	{"daemon", "socket", KEY_PATH, FIELD(socket_path), 0, 0, 0,
	 "Absolute path of the client socket (AF_UNIX, SOCK_SEQPACKET) that applications "
	 "connect to."},
	{"daemon", "admin_socket", KEY_PATH, FIELD(admin_socket_path), 0, 0, 0,
	 "Absolute path of the admin socket that rdmaxctl connects to; must differ from "
	 "socket."},
	{"daemon", "admin_group", KEY_NAME, FIELD(admin_group), 0, 0, 0,
	 "Group whose members may use the admin socket besides root and the daemon's own "
	 "user; the admin socket is given this group when it exists."},
	{"daemon", "socket_mode", KEY_MODE, FIELD(socket_mode), 0, 0777, 0,
	 "Permission bits of the client socket, in octal. 0666 lets every local user connect; "
	 "0660 limits it to the daemon's user and group."},
	{"daemon", "node_name", KEY_NAME, FIELD(node_name), 0, 0, KEY_EMPTY,
	 "Name of this node in log lines and region descriptors: letters, digits, '.', '-' or "
	 "'_'. Empty means the host name."},
	{"daemon", "log_level", KEY_LEVEL, FIELD(log_level), LOG_ERR, LOG_DEBUG, KEY_RELOAD,
	 "Most verbose priority that is logged: err, warning, notice, info or debug."},

	{"transport", "type", KEY_TRANSPORT, FIELD(transport), 0, CONFIG_TRANSPORT_MAX - 1, 0,
	 "Fabric between daemons: auto (RDMA verbs when a usable device with an IP address "
	 "exists, else TCP), tcp, or verbs (start-up fails without a usable device)."},
	{"transport", "listen", KEY_ADDR, FIELD(listen_addr), 0, 0, 0,
	 "Numeric IPv4 or IPv6 address on which this daemon accepts connections from other "
	 "daemons (TCP transport and rdma_cm). 0.0.0.0 or :: listens on all addresses."},
	{"transport", "port", KEY_UINT, FIELD(listen_port), 0, 65535, 0,
	 "Port of the TCP transport listener; 0 picks a free port at start-up."},
	{"transport", "advertise", KEY_ADDR, FIELD(advertise_addr), 0, 0,
	 KEY_EMPTY | KEY_NO_WILDCARD,
	 "Numeric address written into region descriptors for peers to connect to. Empty means "
	 "the listen address, so it must be set when listen is 0.0.0.0 or ::."},
	{"transport", "tcp_encryption", KEY_ONOFF, FIELD(tcp_encryption), 0, 1, 0,
	 "on wraps every TCP connection between daemons in TLS 1.3 with a pre-shared key derived "
	 "from [auth] key_file (required then): the payload is encrypted and the key proven "
	 "inside the channel. off keeps the plain wire. Both ends must use the same setting. "
	 "RDMA verbs traffic is never encrypted."},
	{"transport", "tcp_io_threads", KEY_UINT, FIELD(tcp_io_threads), 0, 16, 0,
	 "Threads that copy large payloads of the TCP transport (256 KiB and more queued on a "
	 "connection, or left of a payload being received) to and from the kernel, so the "
	 "daemon's loop stays free for clients, small frames and latency-class connections, "
	 "and sleeps instead of spinning while bulk bytes move. 0 copies everything on the loop. "
	 "Connections with tcp_encryption = on copy on the loop."},
	{"transport", "tcp_chunk_bytes", KEY_SIZE, FIELD(tcp_chunk_bytes), 4 * KiB, GiB, 0,
	 "Large jobs to other daemons over TCP are split into chunks of this many bytes (what "
	 "engine.chunk_bytes is over RDMA devices): each chunk is one frame and one answer on "
	 "the connection, so larger chunks cost fewer frames, answers and system calls per "
	 "byte. A chunk of pages carries at most 256 of them."},

	{"auth", "key_file", KEY_PATH, FIELD(auth_key_file), 0, 0, KEY_EMPTY | KEY_RELOAD,
	 "Absolute path of the file holding the shared key with which daemons authenticate each "
	 "other (HMAC). It must "
	 "not be readable by group or others. Empty turns authentication off."},

	{"limits", "max_clients", KEY_UINT, FIELD(max_clients), 1, 65536, KEY_RELOAD,
	 "Client connections accepted at the same time, for the whole daemon."},
	{"limits", "max_message_bytes", KEY_SIZE, FIELD(max_message_bytes), 4 * KiB, 64 * MiB, 0,
	 "Largest message a client may send, in bytes."},
	{"limits", "max_fds_per_message", KEY_UINT, FIELD(max_fds_per_message), 1, 253, KEY_RELOAD,
	 "File descriptors a client may attach to one message."},
	{"limits", "max_regions", KEY_UINT, FIELD(max_regions), 1, 1048576, KEY_RELOAD,
	 "Memory regions a client may have registered at the same time."},
	{"limits", "max_registered_bytes", KEY_SIZE, FIELD(max_registered_bytes), 4 * KiB,
	 1024 * TiB, KEY_RELOAD,
	 "Total size of the memory a client may have registered, in bytes."},
	{"limits", "max_outstanding_jobs", KEY_UINT, FIELD(max_outstanding_jobs), 1, 1048576,
	 KEY_RELOAD, "Jobs a client may have submitted that have not completed yet."},
	{"limits", "max_jobs_per_submit", KEY_UINT, FIELD(max_jobs_per_submit), 1, 65536,
	 KEY_RELOAD, "Jobs in one submit message; at most max_outstanding_jobs."},
	{"limits", "max_connections", KEY_UINT, FIELD(max_connections), 1, 65536, KEY_RELOAD,
	 "Connections to other daemons that this node keeps open, for the whole daemon."},
	{"limits", "max_isolation_domains", KEY_UINT, FIELD(max_isolation_domains), 1, 65536, 0,
	 "With [verbs] isolation = per-uid: local uids that may have regions registered at the "
	 "same time (each has a protection domain per device); a further uid's registration "
	 "is refused with RESOURCE_EXHAUSTED until one has none left."},
	{"limits", "max_imm_counters", KEY_UINT, FIELD(max_imm_counters), 1, 16777216, KEY_RELOAD,
	 "Distinct immediate-value counters tracked on this node, for the whole daemon."},
	{"limits", "hello_timeout_ms", KEY_UINT, FIELD(hello_timeout_ms), 100, 600000, KEY_RELOAD,
	 "Time a new client connection has to send Hello before it is closed, in "
	 "milliseconds."},
	{"limits", "per_uid_clients", KEY_UINT, FIELD(per_uid_clients), 1, 65536, KEY_RELOAD,
	 "Client connections of one uid at the same time, so that no user can take every "
	 "slot of max_clients."},
	{"limits", "per_uid_regions", KEY_UINT, FIELD(per_uid_regions), 1, 16777216, KEY_RELOAD,
	 "Memory regions registered by all clients of one uid together."},
	{"limits", "per_uid_registered_bytes", KEY_SIZE, FIELD(per_uid_registered_bytes), 4 * KiB,
	 1024 * TiB, KEY_RELOAD, "Bytes registered by all clients of one uid together."},
	{"limits", "per_uid_outstanding_jobs", KEY_UINT, FIELD(per_uid_outstanding_jobs), 1,
	 16777216, KEY_RELOAD, "Jobs without a completion of all clients of one uid together."},
	{"limits", "per_uid_imm_counters", KEY_UINT, FIELD(per_uid_imm_counters), 1, 16777216,
	 KEY_RELOAD,
	 "Immediate-value counters (claimed or counting) held in the namespace of one uid."},
	{"limits", "per_uid_mailboxes", KEY_UINT, FIELD(per_uid_mailboxes), 1, 4096, KEY_RELOAD,
	 "Mailboxes open in the namespace of one uid, over all its clients."},
	{"limits", "per_uid_queued_message_bytes", KEY_SIZE, FIELD(per_uid_queued_message_bytes),
	 64 * KiB, 1 * TiB, KEY_RELOAD,
	 "Bytes waiting to be read by all clients of one uid together above which a message for "
	 "one of their mailboxes is refused."},
	{"limits", "per_uid_peer_connections", KEY_UINT, FIELD(per_uid_peer_connections), 1, 65536,
	 KEY_RELOAD, "Connections to peer daemons opened for the jobs of one uid's clients."},
	{"limits", "admin_max_connections", KEY_UINT, FIELD(admin_max_connections), 1, 4096,
	 KEY_RELOAD, "Connections to the admin socket at the same time, for the whole daemon."},
	{"limits", "admin_idle_timeout_ms", KEY_UINT, FIELD(admin_idle_timeout_ms), 100, 3600000,
	 KEY_RELOAD,
	 "An admin connection that sends nothing for this long is closed, in "
	 "milliseconds."},

	{"peers", "connect_timeout_ms", KEY_UINT, FIELD(connect_timeout_ms), 10, 600000, 0,
	 "Time allowed for one connection attempt to another daemon, in milliseconds."},
	{"peers", "connect_retries", KEY_UINT, FIELD(connect_retries), 0, 100, 0,
	 "Attempts after a failed first connection attempt before the waiting jobs fail with "
	 "UNREACHABLE."},
	{"peers", "retry_backoff_ms", KEY_UINT, FIELD(retry_backoff_ms), 1, 60000, 0,
	 "Wait before the first retry, in milliseconds; it doubles for each further retry."},
	{"peers", "peer_timeout_ms", KEY_UINT, FIELD(peer_timeout_ms), 100, 3600000, KEY_RELOAD,
	 "Jobs waiting on a peer that makes no progress for this long fail with TIMEOUT, in "
	 "milliseconds."},
	{"peers", "idle_timeout_s", KEY_UINT, FIELD(idle_timeout_s), 0, 604800, KEY_RELOAD,
	 "Connections without traffic for this long are closed, in seconds; 0 keeps them open."},
	{"peers", "handshake_timeout_ms", KEY_UINT, FIELD(handshake_timeout_ms), 10, 600000,
	 KEY_RELOAD,
	 "TCP transport: time a connection, incoming or outgoing, has to finish its handshake "
	 "(HELLO and authentication) after the TCP connection is up, in milliseconds; an "
	 "outgoing attempt also ends at connect_timeout_ms."},
	{"peers", "max_handshakes", KEY_UINT, FIELD(max_handshakes), 1, 65536, KEY_RELOAD,
	 "TCP transport: incoming connections that may be in their handshake at the same time; "
	 "further ones are closed at once. They never take the slots of established connections."},
	{"peers", "max_handshakes_per_host", KEY_UINT, FIELD(max_handshakes_per_host), 1, 65536,
	 KEY_RELOAD,
	 "TCP transport: incoming connections from one address that may be in their handshake at "
	 "the same time."},
	{"peers", "max_connections_per_host", KEY_UINT, FIELD(max_connections_per_host), 1, 65536,
	 KEY_RELOAD,
	 "TCP transport: incoming connections kept open from one address (every daemon on that "
	 "host together)."},
	{"peers", "reserved_outgoing", KEY_UINT, FIELD(reserved_outgoing), 0, 65536, KEY_RELOAD,
	 "TCP transport: of limits.max_connections, this many (at most half) are kept for the "
	 "connections this daemon opens, so peers connecting in cannot stop it from reaching "
	 "others."},
	{"peers", "min_frame_rate_kib_s", KEY_UINT, FIELD(min_frame_rate_kib_s), 1, 16777216,
	 KEY_RELOAD,
	 "TCP transport: every frame from a peer must arrive whole within peer_timeout_ms plus "
	 "its size at this rate, in KiB/s; a peer that stalls or trickles a frame is "
	 "disconnected."},

	{"engine", "chunk_bytes", KEY_SIZE, FIELD(chunk_bytes), 4 * KiB, GiB, 0,
	 "Large jobs are split into chunks of this many bytes, spread over devices and queue "
	 "pairs."},
	{"engine", "rail_retry_ms", KEY_UINT, FIELD(rail_retry_ms), 0, 3600000, KEY_RELOAD,
	 "After a transfer over a device pair (a local and a peer RDMA device) failed, chunks "
	 "avoid that pair for this long and go over the other pairs, in milliseconds."},
	{"engine", "busy_poll_us", KEY_UINT, FIELD(busy_poll_us), 0, 1000000, 0,
	 "After the last activity the daemon keeps polling this long before it sleeps, in "
	 "microseconds; lower latency for more CPU time. Polls that keep finding nothing yield "
	 "the CPU to any other runnable process. 0 never busy-polls."},
	{"engine", "loop_cpus", KEY_CPUS, FIELD(loop_cpus), 0, 0, KEY_EMPTY | KEY_RELOAD,
	 "CPUs the daemon's loop thread runs on, as a list such as 0-1,4 (it serves clients, "
	 "small frames and latency-class connections). Empty: not pinned. Give it CPUs that "
	 "worker_cpus does not name so that a latency job never waits behind a bulk copy "
	 "(docs/operations.md, \"CPUs\")."},
	{"engine", "worker_cpus", KEY_CPUS, FIELD(worker_cpus), 0, 0, KEY_EMPTY | KEY_RELOAD,
	 "CPUs of the threads that move bulk bytes (the TCP transport's I/O threads, the verbs "
	 "posting thread), as a list such as 2-7. Empty: every CPU the daemon started with."},

	{"verbs", "devices", KEY_DEVICES, FIELD(devices), 0, 0, 0,
	 "RDMA devices to use: auto (all usable devices) or a comma-separated list of device "
	 "names such as mlx5_0,mlx5_1."},
	{"verbs", "pin", KEY_PIN, FIELD(pin), 0, 0, KEY_EMPTY,
	 "Devices that carry a client's traffic (NIC-GPU affinity), by the name the client gives "
	 "when it connects: blank-separated rules NAME=DEVICE[+DEVICE...], where NAME is a shell "
	 "pattern, e.g. 'prefill-gpu0=mlx5_0 prefill-gpu1=mlx5_1 *=mlx5_0+mlx5_1'. The first "
	 "matching rule applies; clients no rule matches use every device. Empty pins nobody."},
	{"verbs", "qps_per_peer", KEY_UINT, FIELD(qps_per_peer), 1, 64, 0,
	 "Queue pairs opened to each peer daemon; jobs are spread over them."},
	{"verbs", "inline_threshold", KEY_SIZE, FIELD(inline_threshold), 0, 4096, 0,
	 "Writes of at most this many bytes are sent inline with the work request, up to the "
	 "device's limit."},
	{"verbs", "signal_interval", KEY_UINT, FIELD(signal_interval), 1, 1024, 0,
	 "One work request in this many asks for a completion; higher values cost fewer "
	 "completions but hold send queue slots longer."},
	{"verbs", "isolation", KEY_ISOLATION, FIELD(isolation), 0, CONFIG_ISOLATION_MAX - 1, 0,
	 "Protection domains of registered memory: shared (one per device for every region) or "
	 "per-uid (one per local uid and device; a peer's queue pairs for one uid's regions are "
	 "in that uid's domain, so an rkey of one uid is refused by the NIC on another uid's "
	 "queue pairs). per-uid costs a protection domain per uid and device and queue pairs "
	 "per peer and uid pair."},

	{"metrics", "textfile_dir", KEY_PATH, FIELD(metrics_textfile_dir), 0, 0, KEY_EMPTY,
	 "Directory of node_exporter's textfile collector; the daemon writes rdmaxd.prom there "
	 "atomically. Empty turns it off."},
	{"metrics", "textfile_interval_s", KEY_UINT, FIELD(metrics_textfile_interval_s), 1, 3600, 0,
	 "Seconds between two writes of the metrics textfile."},
	{"metrics", "job_stages", KEY_BOOL, FIELD(metrics_job_stages), 0, 1, KEY_RELOAD,
	 "true: jobs to other daemons are timed in three stages (queue: accepted to the call "
	 "that hands their first bytes to the NIC or the socket, ibv_post_send() or sendmsg(); "
	 "post: that call; complete: its return to the completion handed to the client), as "
	 "rdmaxd_job_stage_seconds. Two clock reads per such call the loop makes; what the "
	 "verbs posting thread or the TCP I/O threads send is not timed."},

	{"discovery", "backend", KEY_TEXT, FIELD(discovery_backend), 0, 0, 0,
	 "Node membership: none (named regions are still looked up by ADDR:PORT, with no "
	 "store) or etcd (each daemon keeps a node record under a lease, and node names resolve "
	 "everywhere; docs/discovery.md)."},
	{"discovery", "endpoints", KEY_TEXT, FIELD(discovery_endpoints), 0, 0, KEY_EMPTY,
	 "etcd client URLs, comma-separated, e.g. http://10.0.0.1:2379,http://10.0.0.2:2379; "
	 "the next one is tried when one fails."},
	{"discovery", "prefix", KEY_TEXT, FIELD(discovery_prefix), 0, 0, 0,
	 "Key prefix of this cluster in etcd; daemons with the same prefix see each other."},
	{"discovery", "ttl_s", KEY_UINT, FIELD(discovery_ttl_s), 2, 3600, 0,
	 "Lease of the node record, in seconds: a daemon that stops renewing it (killed, cut "
	 "off) is lost to the others after at most this long. Renewed every ttl_s/3."},
	{"discovery", "ca_file", KEY_PATH, FIELD(discovery_ca_file), 0, 0, KEY_EMPTY,
	 "CA certificate (PEM) that signs etcd's server certificate, for https endpoints."},
	{"discovery", "cert_file", KEY_PATH, FIELD(discovery_cert_file), 0, 0, KEY_EMPTY,
	 "Client certificate (PEM) for etcd's client-certificate authentication."},
	{"discovery", "key_file", KEY_PATH, FIELD(discovery_key_file), 0, 0, KEY_EMPTY,
	 "Private key (PEM) of cert_file."},
	{"discovery", "user", KEY_TEXT, FIELD(discovery_user), 0, 0, KEY_EMPTY,
	 "etcd user for token authentication (with password_file); empty: none."},
	{"discovery", "password_file", KEY_PATH, FIELD(discovery_password_file), 0, 0, KEY_EMPTY,
	 "File holding the etcd user's password (first line); not readable by group or others."},

	{"gpu", "registration", KEY_GPU_REG, FIELD(gpu_registration), 0, CONFIG_GPU_REG_MAX - 1, 0,
	 "How GPU memory is registered with RDMA devices: auto (dma-buf where the kernel, driver "
	 "and device support it, else a CUDA IPC handle pinned by nvidia_peermem), dmabuf (dma-buf "
	 "only), or peermem (nvidia_peermem only)."},
	{"gpu", "pool_bytes", KEY_SIZE, FIELD(gpu_pool_bytes), 0, TiB, 0,
	 "Bytes of GPU memory allocated on every GPU at start-up and registered once with the RDMA "
	 "devices; clients lease slices of it without registering. 0 makes no pools."},

	{"qos", "enabled", KEY_BOOL, FIELD(qos_enabled), 0, 1, KEY_RELOAD,
	 "true: chunks to other daemons are scheduled by traffic class (weighted between the "
	 "classes, round robin between the clients of a class) within max_in_flight, and "
	 "latency-class frames pass queued bulk frames on TCP connections. false: every job "
	 "issues its chunks as soon as its own window allows (classes are still counted)."},
	{"qos", "latency_weight", KEY_UINT, FIELD(qos_weight[0]), 1, 1000, KEY_RELOAD,
	 "Share of the latency class while both classes have chunks waiting: bytes are granted "
	 "in the ratio latency_weight : bulk_weight."},
	{"qos", "bulk_weight", KEY_UINT, FIELD(qos_weight[1]), 1, 1000, KEY_RELOAD,
	 "Share of the bulk class while both classes have chunks waiting; at least 1, so bulk "
	 "never starves."},
	{"qos", "default_class", KEY_CLASS, FIELD(qos_default_class), 0, 1, KEY_RELOAD,
	 "Class of jobs whose client named none, for the job or its session: latency or bulk."},
	{"qos", "max_in_flight", KEY_UINT, FIELD(qos_max_in_flight), 2, 65536, KEY_RELOAD,
	 "With enabled: chunks in flight to other daemons at once, for the whole daemon; "
	 "further chunks wait for the scheduler."},
	{"qos", "latency_reserve", KEY_UINT, FIELD(qos_latency_reserve), 0, 65535, KEY_RELOAD,
	 "With enabled: of max_in_flight, this many are kept for latency-class chunks, so a "
	 "latency job never waits for a bulk chunk to return; less than max_in_flight."},
	{"qos", "lane_linger_ms", KEY_UINT, FIELD(qos_lane_linger_ms), 0, 3600000, KEY_RELOAD,
	 "How long after a latency-class connection last carried traffic (or opened) the daemon "
	 "keeps its loop free for it: the TCP transport's bulk copies stay on its I/O threads "
	 "(transport.tcp_io_threads) and bulk posts on software RDMA devices on the posting "
	 "thread. Afterwards the loop copies and posts bulk again, which moves bulk faster when "
	 "no latency traffic needs it. 0 keeps them off the loop while any latency-class "
	 "connection is open."},
};

const size_t g_n_sections = ARRAY_SIZE(g_sections);
const size_t g_n_keys = ARRAY_SIZE(g_keys);
