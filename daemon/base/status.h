/* SPDX-License-Identifier: MIT */
/*
 * The one place where error codes meet the wire: daemon functions return 0
 * or a negative errno / RDMAX_E_* code; the protocol carries rdmax.v1.Status.
 */
#ifndef RDMAXD_STATUS_H
#define RDMAXD_STATUS_H

/* Protocol Status value (0 = OK) for an error code. */
int status_from_err(int err);
/* RDMAX_E_* (or 0) for a protocol Status value. */
int err_from_status(int status);
/* Short name such as "REMOTE_ACCESS". */
const char *status_name(int status);

#endif
