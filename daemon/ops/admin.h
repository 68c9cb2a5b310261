/* SPDX-License-Identifier: MIT */
/*
 * The admin socket that rdmaxctl talks to: AF_UNIX SOCK_SEQPACKET, one
 * request per datagram (a command line such as "clients" or "peer-reset
 * 10.0.0.2:7471"), one JSON document per reply datagram. Only root, the
 * daemon's own user and members of the admin group may use it.
 * The protocol is described in docs/operations.md.
 */
#ifndef RDMAXD_ADMIN_H
#define RDMAXD_ADMIN_H

#include <stddef.h>

struct rdmaxd;
struct admin;
struct config;

/* Group whose members may use the admin socket besides root and the daemon's user. */
/* Largest request datagram. */
#define ADMIN_REQUEST_MAX 1024

/*
 * Listen on the inherited admin socket (daemon->admin_listen_fd), or bind
 * cfg.admin_socket_path. When the admin path is the default but the client
 * socket is not, the admin socket goes next to the client socket
 * ("<client path without .sock>-admin.sock"), so that several daemons on
 * one node never fight over /run/rdmaxd-admin.sock.
 */
int admin_create(struct rdmaxd *daemon, struct admin **ret_admin);
/* The admin socket path admin_create() binds for this configuration (see above). */
int admin_path_for(const struct config *cfg, char *buf, size_t size);
/* Stop listening, answer pending drains, close connections; unlinks only a socket it bound. */
void admin_shutdown(struct admin *admin);
/* Free; after the loop closed the handles. Accepts NULL. */
void admin_destroy(struct admin *admin);
/* Path the admin socket listens on. */
const char *admin_socket_path(const struct admin *admin);

#endif
