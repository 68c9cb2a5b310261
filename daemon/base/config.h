/* SPDX-License-Identifier: MIT */
/*
 * rdmaxd configuration: defaults, the INI file (libinih) and command-line
 * overrides. Every key is documented in config/rdmaxd.conf and rdmaxd.conf(5).
 */
#ifndef RDMAXD_CONFIG_H
#define RDMAXD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_DEFAULT_PATH "/etc/rdmaxd/rdmaxd.conf"
#define CONFIG_ERR_MAX      512

/* Which fabric the daemon uses. */
enum config_transport {
	CONFIG_TRANSPORT_AUTO,  /* verbs when a usable RDMA device with an IP exists, else TCP */
	CONFIG_TRANSPORT_TCP,   /* TCP only */
	CONFIG_TRANSPORT_VERBS, /* RDMA verbs only; start-up fails without a device */
	CONFIG_TRANSPORT_MAX,   /* terminator */
};

/* How GPU memory is registered with RDMA devices (docs/gpu.md). */
enum config_gpu_registration {
	CONFIG_GPU_REG_AUTO,    /* dma-buf where it works, else nvidia_peermem */
	CONFIG_GPU_REG_DMABUF,  /* dma-buf only */
	CONFIG_GPU_REG_PEERMEM, /* CUDA IPC + nvidia_peermem only */
	CONFIG_GPU_REG_MAX,     /* terminator */
};

/* Which protection domains the verbs transport registers regions in (docs/security.md). */
enum config_isolation {
	CONFIG_ISOLATION_SHARED,  /* one protection domain per device for every region */
	CONFIG_ISOLATION_PER_UID, /* one per local uid and device; QPs per peer and uid pair */
	CONFIG_ISOLATION_MAX,     /* terminator */
};

struct config {
	/* [daemon] */
	char socket_path[108];       /* client socket (AF_UNIX SOCK_SEQPACKET) */
	char admin_socket_path[108]; /* admin socket for rdmaxctl */
	char admin_group[32];        /* group whose members may use the admin socket */
	uint32_t socket_mode;        /* permission bits of the client socket */
	char node_name[64];          /* shown in logs and descriptors; default hostname */
	int log_level;               /* syslog priority, LOG_ERR..LOG_DEBUG */

	/* [transport] */
	enum config_transport transport;
	char listen_addr[64];     /* numeric address daemons connect to (TCP and rdma_cm) */
	uint16_t listen_port;     /* TCP transport port; 0 = ephemeral */
	char advertise_addr[64];  /* address put in descriptors; default listen_addr */
	bool tcp_encryption;      /* TLS 1.3 with a PSK from the auth key on TCP peer links */
	uint32_t tcp_io_threads;  /* TCP payload copies off the loop; 0: on the loop */
	uint32_t tcp_chunk_bytes; /* chunks of a job over TCP: one frame and one answer each */

	/* [auth] */
	char auth_key_file[256]; /* shared key for daemon-to-daemon HMAC; empty = off */

	/* [limits] per client unless said otherwise */
	uint32_t max_clients;
	uint32_t max_message_bytes;
	uint32_t max_fds_per_message;
	uint32_t max_regions;
	uint64_t max_registered_bytes;
	uint32_t max_outstanding_jobs;
	uint32_t max_jobs_per_submit;
	uint32_t max_isolation_domains; /* per-uid isolation: uids with a protection domain */
	uint32_t max_connections;       /* daemon-to-daemon connections, per node */
	uint32_t max_imm_counters;      /* distinct imm values tracked per node */
	uint32_t hello_timeout_ms;      /* a client must send Hello within this */
	/* Shares of one uid, summed over its clients (docs/security.md). */
	uint32_t per_uid_clients;
	uint32_t per_uid_regions;
	uint64_t per_uid_registered_bytes;
	uint32_t per_uid_outstanding_jobs;
	uint32_t per_uid_imm_counters;         /* imm counters one uid's clients may hold */
	uint32_t per_uid_mailboxes;            /* mailboxes open in one uid's namespace */
	uint64_t per_uid_queued_message_bytes; /* queued bytes above which messages are refused */
	uint32_t per_uid_peer_connections;     /* peer connections opened for one uid's jobs */
	uint32_t admin_max_connections;        /* admin socket connections at the same time */
	uint32_t admin_idle_timeout_ms;        /* an admin connection silent this long is closed */

	/* [peers] */
	uint32_t connect_timeout_ms;      /* one connection attempt */
	uint32_t connect_retries;         /* attempts after the first, with doubling backoff */
	uint32_t retry_backoff_ms;        /* first backoff */
	uint32_t peer_timeout_ms;         /* no progress from a peer for this long fails its jobs */
	uint32_t idle_timeout_s;          /* idle connections are closed after this; 0 = never */
	uint32_t handshake_timeout_ms;    /* a TCP handshake must finish within this */
	uint32_t max_handshakes;          /* incoming TCP connections in their handshake */
	uint32_t max_handshakes_per_host; /* the same, from one address */
	uint32_t max_connections_per_host; /* incoming TCP connections from one address */
	uint32_t reserved_outgoing;        /* of max_connections, kept for outgoing ones */
	uint32_t min_frame_rate_kib_s;     /* a frame must arrive at least this fast */

	/* [engine] */
	uint32_t chunk_bytes;   /* large jobs are split into chunks of this size */
	uint32_t busy_poll_us;  /* keep polling this long after the last activity */
	char loop_cpus[128];    /* CPU list of the loop thread; empty: not pinned */
	char worker_cpus[128];  /* CPU list of the I/O and posting threads; empty: not pinned */
	uint32_t rail_retry_ms; /* a failed device pair is avoided this long */

	/* [verbs] */
	char devices[256]; /* "auto" or comma-separated device names */
	char pin[512];     /* client -> devices rules; see config_pin_devices() */
	uint32_t qps_per_peer;
	uint32_t inline_threshold; /* bytes; capped by the QP's max_inline_data */
	uint32_t signal_interval;  /* signal one WR in this many */
	enum config_isolation isolation;

	/* [metrics] */
	char metrics_textfile_dir[256]; /* node_exporter textfile directory; empty = off */
	uint32_t metrics_textfile_interval_s;
	bool metrics_job_stages; /* time the stages of jobs (rdmaxd_job_stage_seconds) */

	/* [discovery] (docs/discovery.md) */
	char discovery_backend[8];     /* "none" or "etcd" */
	char discovery_endpoints[256]; /* etcd client URLs, comma-separated */
	char discovery_prefix[64];     /* key prefix of this cluster, starts with '/' */
	uint32_t discovery_ttl_s;      /* lease of the node record */
	char discovery_ca_file[256];
	char discovery_cert_file[256];
	char discovery_key_file[256];
	char discovery_user[64];
	char discovery_password_file[256];

	/* [gpu] */
	enum config_gpu_registration gpu_registration;
	uint64_t gpu_pool_bytes; /* per GPU, allocated and registered at start-up; 0 = no pools */

	/* [qos] (classes: 0 latency, 1 bulk, as enum qos_class) */
	bool qos_enabled;
	uint32_t qos_weight[2];       /* per class, >= 1 */
	uint32_t qos_default_class;   /* class of jobs that name none */
	uint32_t qos_max_in_flight;   /* chunks to other daemons at once, daemon-wide */
	uint32_t qos_latency_reserve; /* of those, kept for the latency class */
	uint32_t qos_lane_linger_ms;  /* bulk off the loop until this long after lane traffic */
};

void config_defaults(struct config *cfg);

/*
 * Load an INI file over the current values. On error returns a negative errno
 * and writes "path:line: message" into err; cfg is then left unchanged.
 */
int config_load(struct config *cfg, const char *path, char *err, size_t err_size);

/* Set one key ("section", "key", "value"); errors are written into err without a location. */
int config_set(struct config *cfg, const char *section, const char *key, const char *value,
	       char *err, size_t err_size);

/* Set one key from a command-line override "section.key=value". */
int config_set_option(struct config *cfg, const char *arg, char *err, size_t err_size);

/* Cross-field checks after loading and overrides (e.g. limits not zero). */
int config_validate(const struct config *cfg, char *err, size_t err_size);

/* Write the effective configuration as INI (for --check-config and rdmaxctl). */
void config_print(const struct config *cfg, FILE *out);

/*
 * Write the example file shipped as config/rdmaxd.conf: every key commented
 * out at its default, with what it does, its unit, range and reload behaviour.
 */
void config_print_example(FILE *out);

/*
 * Count the keys that differ between old_cfg and new_cfg but only take effect
 * on restart (a SIGHUP reload applies the others); names them, comma-separated
 * as "[section] key", in buf.
 */
/* Copy every key marked 'applied on reload' from next into cfg (SIGHUP). */
void config_apply_reloadable(struct config *cfg, const struct config *next);

int config_restart_keys(const struct config *old_cfg, const struct config *new_cfg, char *buf,
			size_t buf_size);

#define CONFIG_PIN_RULES_MAX 32
#define CONFIG_PIN_NAME_MAX  63

/* Check a [verbs] pin value; -EINVAL with the reason in *ret_why. */
int config_pin_check(const char *pin, const char **ret_why);

/*
 * The devices the first rule of `pin` whose pattern matches client_name
 * allows, comma-separated into buf. 1 when a rule matched, 0 when none did,
 * -ENAMETOOLONG when buf is too small.
 */
int config_pin_devices(const char *pin, const char *client_name, char *buf, size_t size);

const char *config_transport_name(enum config_transport t);
const char *config_gpu_registration_name(enum config_gpu_registration r);
/* "latency" (0), "bulk" (1): [qos] default_class. */
const char *config_class_name(uint32_t cls);
const char *config_isolation_name(enum config_isolation i);

#endif
