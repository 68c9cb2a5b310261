/* SPDX-License-Identifier: MIT */
/*
 * Conversion between the daemon's error codes (negative errno or RDMAX_E_*)
 * and the protocol's Status enum. The only place that knows both.
 */
#include <errno.h>
#include <stdbool.h>

#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "status.h"

/* RDMAX_E_* codes mirror every value of the Status enum, GPU_* included. */
static bool is_status(int status)
{
	return status > 0 && status < 100 &&
	       protobuf_c_enum_descriptor_get_value(&rdmax__v1__status__descriptor, status) != NULL;
}

int status_from_err(int err)
{
	if (err == 0) {
		return RDMAX__V1__STATUS__OK;
	}
	if (err <= -(RDMAX_ERR_BASE + 1) && err > -(RDMAX_ERR_BASE + 100) &&
	    is_status(-err - RDMAX_ERR_BASE)) {
		return -err - RDMAX_ERR_BASE;
	}
	switch (-err) {
	case EINVAL:
	case EBADF:
	case ENAMETOOLONG:
		return RDMAX__V1__STATUS__INVALID_ARGUMENT;
	case ENOENT:
		return RDMAX__V1__STATUS__NOT_FOUND;
	case EPERM:
	case EACCES:
		return RDMAX__V1__STATUS__PERMISSION_DENIED;
	case ERANGE:
	case EOVERFLOW:
	case ENXIO:
		return RDMAX__V1__STATUS__OUT_OF_RANGE;
	case ECONNREFUSED:
	case EHOSTUNREACH:
	case ENETUNREACH:
	case EHOSTDOWN:
		return RDMAX__V1__STATUS__UNREACHABLE;
	case ETIMEDOUT:
		return RDMAX__V1__STATUS__TIMEOUT;
	case ECANCELED:
		return RDMAX__V1__STATUS__CANCELLED;
	case ECONNRESET:
	case EPIPE:
	case ECONNABORTED:
	case EIO:
		return RDMAX__V1__STATUS__TRANSPORT_ERROR;
	case ENOMEM:
	case ENOSPC:
	case EMFILE:
	case ENFILE:
	case EMSGSIZE:
	case E2BIG:
		return RDMAX__V1__STATUS__RESOURCE_EXHAUSTED;
	case ENOSYS:
	case EOPNOTSUPP:
		return RDMAX__V1__STATUS__UNIMPLEMENTED;
	case EEXIST:
		return RDMAX__V1__STATUS__ALREADY_EXISTS;
	case EPROTO:
	case EBADMSG:
		return RDMAX__V1__STATUS__PROTOCOL_ERROR;
	default:
		return RDMAX__V1__STATUS__INTERNAL;
	}
}

int err_from_status(int status)
{
	if (!is_status(status)) {
		return status == 0 ? 0 : RDMAX_E_INTERNAL;
	}
	return -(RDMAX_ERR_BASE + status);
}

const char *status_name(int status)
{
	const ProtobufCEnumValue *v =
		protobuf_c_enum_descriptor_get_value(&rdmax__v1__status__descriptor, status);
	return v ? v->name : "UNKNOWN";
}
