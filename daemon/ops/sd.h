/* SPDX-License-Identifier: MIT */
/*
 * Service manager integration: sockets inherited by socket activation, the
 * notify protocol (READY, STATUS, RELOADING, STOPPING, EXTEND_TIMEOUT_USEC),
 * the watchdog, SIGHUP reloads, and bringing the operations modules (admin
 * socket, metrics) up and down. Functions are prefixed svc_ to stay clear of
 * libsystemd's sd_ names. Outside systemd every notification is a no-op.
 */
#ifndef RDMAXD_SD_H
#define RDMAXD_SD_H

#include <stddef.h>
#include <stdint.h>

struct rdmaxd;
struct config;

/* Names the socket unit gives its sockets (FileDescriptorName=). */
#define SVC_FD_CLIENT "client"
#define SVC_FD_ADMIN  "admin"

/*
 * Take the listening sockets passed by the service manager ($LISTEN_FDS):
 * sets daemon->client_listen_fd / admin_listen_fd for those found. Each must
 * be a listening AF_UNIX SOCK_SEQPACKET socket; when its path differs from
 * the configuration, the socket's path wins (with a warning). Sockets are
 * matched by name, or by path and then order when unnamed.
 * \return 0 (also when nothing was passed) or a negative error
 */
int svc_listen_fds(struct rdmaxd *daemon);

/* Create the metrics and the admin socket, start the timers. Before the loop runs. */
int svc_start(struct rdmaxd *daemon);

/* Everything listens: READY=1 with a first STATUS= line. */
void svc_ready(struct rdmaxd *daemon);

/*
 * Ask the service manager for more start-up (or shutdown) time: slow device
 * set-up calls this before each step that may take long. what goes to STATUS=.
 */
void svc_extend_timeout(uint64_t usec, const char *what);

/* Send a fresh STATUS= line now (also done on a timer). */
void svc_status_refresh(struct rdmaxd *daemon);

/*
 * Apply a re-read configuration (SIGHUP): RELOADING=1, the keys that can
 * change at run time (log level, limits, auth key file, peer timeouts), a
 * warning naming every other changed key, then READY=1. next is the full
 * configuration as parsed at start-up (file plus command-line overrides);
 * load_key reads daemon->cfg.auth_key_file (rdmaxd_load_auth_key).
 */
typedef int (*svc_load_key_fn)(struct rdmaxd *daemon, char *err, size_t err_size);
void svc_reload(struct rdmaxd *daemon, const struct config *next, svc_load_key_fn load_key);
/* A reload that could not even parse the configuration: READY=1 again, nothing changed. */
void svc_reload_failed(struct rdmaxd *daemon, const char *why);

/* STOPPING=1; stop timers, the admin socket and the metrics writer. */
void svc_stopping(struct rdmaxd *daemon);

/* Free what svc_start created; after the loop closed every handle. */
void svc_fini(struct rdmaxd *daemon);

#endif
