/* SPDX-License-Identifier: MIT */
/*
 * Names of error codes: negative errno values and the RDMAX_E_* codes that
 * mirror the protocol's Status enum. Shared by the library and the daemon, so
 * both speak of an error in the same words.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rdmax.h"

#define RDMAX_EXPORT __attribute__((visibility("default")))

static const char *const rdmax_errors[] = {
	[-RDMAX_E_INVALID_ARGUMENT - RDMAX_ERR_BASE] = "invalid argument",
	[-RDMAX_E_NOT_FOUND - RDMAX_ERR_BASE] = "not found (unknown or stale region, descriptor "
						"or job)",
	[-RDMAX_E_PERMISSION_DENIED - RDMAX_ERR_BASE] = "permission denied",
	[-RDMAX_E_OUT_OF_RANGE - RDMAX_ERR_BASE] = "offset or length outside the region",
	[-RDMAX_E_UNREACHABLE - RDMAX_ERR_BASE] = "peer daemon unreachable",
	[-RDMAX_E_REMOTE_ACCESS - RDMAX_ERR_BASE] = "remote side refused the access",
	[-RDMAX_E_TIMEOUT - RDMAX_ERR_BASE] = "timed out",
	[-RDMAX_E_CANCELLED - RDMAX_ERR_BASE] = "cancelled",
	[-RDMAX_E_TRANSPORT_ERROR - RDMAX_ERR_BASE] = "transport error",
	[-RDMAX_E_RESOURCE_EXHAUSTED - RDMAX_ERR_BASE] = "resource limit reached",
	[-RDMAX_E_UNIMPLEMENTED - RDMAX_ERR_BASE] = "not implemented",
	[-RDMAX_E_PROTOCOL_ERROR - RDMAX_ERR_BASE] = "protocol error",
	[-RDMAX_E_ALREADY_EXISTS - RDMAX_ERR_BASE] = "already exists",
	[-RDMAX_E_INTERNAL - RDMAX_ERR_BASE] = "internal daemon error",
	[-RDMAX_E_GPU_DRIVER_MISSING - RDMAX_ERR_BASE] =
		"GPU memory needs the NVIDIA driver: libcuda.so.1 (CUDA 11.7 or later) cannot be "
		"loaded",
	[-RDMAX_E_GPU_NOT_DEVICE_MEMORY - RDMAX_ERR_BASE] =
		"not CUDA device memory of this process (managed memory migrates and is never "
		"registered: use cudaMalloc, cudaMallocAsync or cuMemCreate memory)",
	[-RDMAX_E_GPU_NOT_EXPORTABLE - RDMAX_ERR_BASE] =
		"GPU allocation cannot be exported for RDMA (CUDA VMM or cudaMallocAsync memory "
		"such as PyTorch expandable_segments that is not fully mapped, not created "
		"GPUDirect RDMA capable, or on a GPU without dma-buf: allocate with cudaMalloc or "
		"turn expandable segments off)",
	[-RDMAX_E_GPU_NO_DMABUF - RDMAX_ERR_BASE] =
		"no dma-buf support for GPU memory (needs the NVIDIA open kernel module, "
		"CUDA 11.7+, Linux 5.12+, rdma-core 34+) and no nvidia_peermem fallback; see "
		"docs/gpu.md",
	[-RDMAX_E_GPU_NEEDS_RDMA - RDMAX_ERR_BASE] =
		"GPU regions need an RDMA device with dma-buf support (GPU memory never moves "
		"through host memory or the TCP transport)",
	[-RDMAX_E_GPU_TOO_LARGE - RDMAX_ERR_BASE] =
		"GPU region larger than the RDMA device's max_mr_size or the GPU's BAR1 space",
	[-RDMAX_E_GPU_ADDRESS_REUSED - RDMAX_ERR_BASE] =
		"a registered GPU allocation was freed and its address reused: deregister the old "
		"region before freeing its memory",
};

RDMAX_EXPORT const char *rdmax_strerror(int err)
{
	if (err == 0) {
		return "success";
	}
	if (err == RDMAX_E_DISCONNECTED) {
		return "disconnected from the daemon";
	}
	if (err <= -RDMAX_ERR_BASE) {
		size_t i = (size_t)(-(int64_t)err - RDMAX_ERR_BASE);
		if (i < sizeof(rdmax_errors) / sizeof(rdmax_errors[0]) && rdmax_errors[i]) {
			return rdmax_errors[i];
		}
		return "unknown rdmax error";
	}
	if (err < 0) {
		/* strerrordesc_np: a static string, unlike strerror()'s shared buffer. */
		const char *s = strerrordesc_np(-err);
		if (s) {
			return s;
		}
	}
	return "unknown error";
}

static const char *const rdmax_error_names[] = {
#define NAME(x) [-x - RDMAX_ERR_BASE] = #x
	NAME(RDMAX_E_INVALID_ARGUMENT),
	NAME(RDMAX_E_NOT_FOUND),
	NAME(RDMAX_E_PERMISSION_DENIED),
	NAME(RDMAX_E_OUT_OF_RANGE),
	NAME(RDMAX_E_UNREACHABLE),
	NAME(RDMAX_E_REMOTE_ACCESS),
	NAME(RDMAX_E_TIMEOUT),
	NAME(RDMAX_E_CANCELLED),
	NAME(RDMAX_E_TRANSPORT_ERROR),
	NAME(RDMAX_E_RESOURCE_EXHAUSTED),
	NAME(RDMAX_E_UNIMPLEMENTED),
	NAME(RDMAX_E_PROTOCOL_ERROR),
	NAME(RDMAX_E_ALREADY_EXISTS),
	NAME(RDMAX_E_INTERNAL),
	NAME(RDMAX_E_GPU_DRIVER_MISSING),
	NAME(RDMAX_E_GPU_NOT_DEVICE_MEMORY),
	NAME(RDMAX_E_GPU_NOT_EXPORTABLE),
	NAME(RDMAX_E_GPU_NO_DMABUF),
	NAME(RDMAX_E_GPU_NEEDS_RDMA),
	NAME(RDMAX_E_GPU_TOO_LARGE),
	NAME(RDMAX_E_GPU_ADDRESS_REUSED),
#undef NAME
};

RDMAX_EXPORT const char *rdmax_err_name(int err)
{
	if (err == 0) {
		return "RDMAX_OK";
	}
	if (err == RDMAX_E_DISCONNECTED) {
		return "RDMAX_E_DISCONNECTED";
	}
	if (err <= -RDMAX_ERR_BASE) {
		size_t i = (size_t)(-(int64_t)err - RDMAX_ERR_BASE);
		if (i < sizeof(rdmax_error_names) / sizeof(rdmax_error_names[0]) &&
		    rdmax_error_names[i]) {
			return rdmax_error_names[i];
		}
		return "RDMAX_E_UNKNOWN";
	}
	if (err < 0) {
		/* glibc's "ENOENT", "ETIMEDOUT", ...: a static string. */
		const char *s = strerrorname_np(-err);
		if (s) {
			return s;
		}
	}
	return "UNKNOWN";
}
