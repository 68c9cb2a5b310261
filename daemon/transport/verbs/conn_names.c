/* SPDX-License-Identifier: MIT */
/*
 * Names of the verbs connection states and events, and the one place where a
 * work completion's status (rdma-core's ibv_wc_status and vendor error)
 * becomes an RDMAX_E_* code with a message naming the operation and the
 * peer. Pure functions: no state, no I/O.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "conn.h"
#include "verbs.h"
#include "conn_internal.h"

const char *conn_state_name(enum conn_state state)
{
	static const char *const names[CONN_STATE_MAX] = {
		[CONN_BACKOFF] = "backoff",         [CONN_CONNECTING] = "connecting",
		[CONN_ESTABLISHED] = "established", [CONN_DRAINING] = "draining",
		[CONN_CLOSED] = "closed",
	};
	return (unsigned)state < CONN_STATE_MAX ? names[state] : "?";
}

const char *link_state_name(enum link_state state)
{
	static const char *const names[LINK_STATE_MAX] = {
		[LINK_IDLE] = "idle",
		[LINK_RESOLVING_ADDR] = "resolving-addr",
		[LINK_RESOLVING_ROUTE] = "resolving-route",
		[LINK_CONNECTING] = "connecting",
		[LINK_UP] = "up",
		[LINK_DRAINING] = "draining",
		[LINK_DRAINED] = "drained",
	};
	return (unsigned)state < LINK_STATE_MAX ? names[state] : "?";
}

const char *conn_event_name(enum conn_event event)
{
	static const char *const names[CONN_EV_MAX] = {
		[CONN_EV_ADDR_RESOLVED] = "ADDR_RESOLVED",
		[CONN_EV_ROUTE_RESOLVED] = "ROUTE_RESOLVED",
		[CONN_EV_ESTABLISHED] = "ESTABLISHED",
		[CONN_EV_REJECTED] = "REJECTED",
		[CONN_EV_ADDR_ERROR] = "ADDR_ERROR",
		[CONN_EV_ROUTE_ERROR] = "ROUTE_ERROR",
		[CONN_EV_UNREACHABLE] = "UNREACHABLE",
		[CONN_EV_CONNECT_ERROR] = "CONNECT_ERROR",
		[CONN_EV_DISCONNECTED] = "DISCONNECTED",
		[CONN_EV_DEVICE_REMOVAL] = "DEVICE_REMOVAL",
		[CONN_EV_ADDR_CHANGE] = "ADDR_CHANGE",
		[CONN_EV_TIMEWAIT_EXIT] = "TIMEWAIT_EXIT",
		[CONN_EV_QP_ERROR] = "QP_ERROR",
	};
	return (unsigned)event < CONN_EV_MAX ? names[event] : "?";
}

const char *conn_op_name(enum xfer_op op)
{
	return op == XFER_READ ? "RDMA READ from" : "RDMA WRITE to";
}

/*
 * Out of line on purpose: inlined where every operand is a literal or a fixed
 * array, GCC proves that the longest message would be cut, which is intended
 * (the start names the operation, the peer and the cause).
 */
int __attribute__((noinline))
conn_wc_error_named(int wc_status, uint32_t vendor_err, const char *op, const char *peer,
		    char *message, size_t message_size)
{
	const char *what;
	int err;

	switch ((enum ibv_wc_status)wc_status) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
		err = RDMAX_E_REMOTE_ACCESS;
		what = "the peer's device refused the access (region not registered for it, "
		       "deregistered, or out of bounds)";
		break;
	case IBV_WC_REM_INV_REQ_ERR:
		err = RDMAX_E_INVALID_ARGUMENT;
		what = "the peer's device found the request invalid";
		break;
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_REM_ABORT_ERR:
	case IBV_WC_REM_INV_RD_REQ_ERR:
		err = RDMAX_E_TRANSPORT_ERROR;
		what = "the peer's device could not complete the operation";
		break;
	case IBV_WC_RETRY_EXC_ERR:
		err = RDMAX_E_UNREACHABLE;
		what = "no acknowledgement from the peer after all retries";
		break;
	case IBV_WC_RNR_RETRY_EXC_ERR:
		err = RDMAX_E_TRANSPORT_ERROR;
		what = "the peer had no receive posted after all retries";
		break;
	case IBV_WC_RESP_TIMEOUT_ERR:
		err = RDMAX_E_TIMEOUT;
		what = "the peer's response timed out";
		break;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		err = RDMAX_E_PERMISSION_DENIED;
		what = "the local region is not registered for this access";
		break;
	case IBV_WC_WR_FLUSH_ERR:
		err = RDMAX_E_TRANSPORT_ERROR;
		what = "flushed: the connection failed";
		break;
	default:
		err = RDMAX_E_INTERNAL;
		what = "local device error";
		break;
	}
	snprintf(message, message_size, "%s %s failed: %s (%s, vendor error %#x)", op, peer, what,
		 verbs_wc_status_str((enum ibv_wc_status)wc_status), vendor_err);
	return err;
}

int conn_wc_error(int wc_status, uint32_t vendor_err, enum xfer_op op, const char *peer,
		  char *message, size_t message_size)
{
	return conn_wc_error_named(wc_status, vendor_err, conn_op_name(op), peer, message,
				   message_size);
}
