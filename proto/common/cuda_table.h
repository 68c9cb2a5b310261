/* SPDX-License-Identifier: MIT */
/*
 * The CUDA driver API as librdmax and rdmaxd use it: one table of function
 * pointers, filled from libcuda.so.1 at run time (dlopen, never a link-time
 * dependency) or, in the unit tests only, by a fake driver. Every CUDA call
 * of the project goes through this table. Internal: never installed.
 *
 * With cuda.h (RDMAX_HAVE_CUDA_H) its types are used and the table's entries
 * are checked against its prototypes at compile time; without it, the few
 * ABI-level declarations below stand in, so the project builds either way.
 */
#ifndef RDMAX_CUDA_TABLE_H
#define RDMAX_CUDA_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(RDMAX_HAVE_CUDA_H)
#include <cuda.h>
#else
/* The driver's ABI, from cuda.h (CUDA 11.7 and later); values never change. */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUipcMemHandle_st {
	char reserved[64];
} CUipcMemHandle;
typedef int CUpointer_attribute;
typedef int CUdevice_attribute;
typedef int CUmemRangeHandleType;
typedef int CUdriverProcAddressQueryResult;
typedef int CUflushGPUDirectRDMAWritesTarget;
typedef int CUflushGPUDirectRDMAWritesScope;
typedef uint64_t cuuint64_t;
#define CUDA_SUCCESS                                             0
#define CUDA_ERROR_INVALID_VALUE                                 1
#define CUDA_ERROR_OUT_OF_MEMORY                                 2
#define CUDA_ERROR_NOT_INITIALIZED                               3
#define CUDA_ERROR_NO_DEVICE                                     100
#define CUDA_ERROR_INVALID_DEVICE                                101
#define CUDA_ERROR_INVALID_CONTEXT                               201
#define CUDA_ERROR_NOT_FOUND                                     500
#define CUDA_ERROR_NOT_SUPPORTED                                 801
#define CUDA_ERROR_ALREADY_MAPPED                                208
#define CU_MEMORYTYPE_HOST                                       1
#define CU_MEMORYTYPE_DEVICE                                     2
#define CU_MEMORYTYPE_UNIFIED                                    4
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE                         2
#define CU_POINTER_ATTRIBUTE_SYNC_MEMOPS                         6
#define CU_POINTER_ATTRIBUTE_BUFFER_ID                           7
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL                      9
#define CU_POINTER_ATTRIBUTE_IS_MANAGED                          8
#define CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE          10
#define CU_POINTER_ATTRIBUTE_MAPPED                              13
#define CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE          15
#define CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE                      17
#define CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED         86
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS 117
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING      118
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED                    124
#define CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED         146
#define CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST              1
#define CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER                 100
#define CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER                 100
#define CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX       0
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD                      1
#define CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE              1
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS                       1
#define CU_GET_PROC_ADDRESS_DEFAULT                              0
#endif

/* Bytes of a CUDA IPC handle on the wire. */
#define RDMAX_CUDA_IPC_HANDLE_SIZE 64
/* Longest PCI bus id cuDeviceGetPCIBusId() writes ("0000:3b:00.0"), with the NUL. */
#define RDMAX_CUDA_BUS_ID_MAX 16
/* ABI version asked of cuGetProcAddress: the entry points below as of CUDA 12.0. */
#define RDMAX_CUDA_ABI_VERSION 12000

/*
 * X(member, name cuGetProcAddress knows, exported symbol, return, parameters).
 * dlsym must use the versioned names that cuda.h's macros map to (_v2): the
 * plain symbols of those entry points are older, incompatible ABIs. The
 * second argument is a bare identifier so that, with cuda.h, the table can be
 * checked against the prototype its macro selects.
 */
#define RDMAX_CUDA_ENTRY_POINTS(X)                                                                 \
	X(init, cuInit, "cuInit", CUresult, (unsigned int flags))                                  \
	X(get_error_name, cuGetErrorName, "cuGetErrorName", CUresult,                              \
	  (CUresult error, const char **str))                                                      \
	X(device_get_count, cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *count))          \
	X(device_get, cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice * device, int ordinal))      \
	X(device_get_attribute, cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult,            \
	  (int *pi, CUdevice_attribute attrib, CUdevice dev))                                      \
	X(device_get_pci_bus_id, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", CUresult,             \
	  (char *pciBusId, int len, CUdevice dev))                                                 \
	X(device_get_by_pci_bus_id, cuDeviceGetByPCIBusId, "cuDeviceGetByPCIBusId", CUresult,      \
	  (CUdevice * dev, const char *pciBusId))                                                  \
	X(primary_ctx_retain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult,      \
	  (CUcontext * pctx, CUdevice dev))                                                        \
	X(primary_ctx_release, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2",          \
	  CUresult, (CUdevice dev))                                                                \
	X(ctx_push_current, cuCtxPushCurrent, "cuCtxPushCurrent_v2", CUresult, (CUcontext ctx))    \
	X(ctx_pop_current, cuCtxPopCurrent, "cuCtxPopCurrent_v2", CUresult, (CUcontext * pctx))    \
	X(ctx_get_current, cuCtxGetCurrent, "cuCtxGetCurrent", CUresult, (CUcontext * pctx))       \
	X(pointer_get_attribute, cuPointerGetAttribute, "cuPointerGetAttribute", CUresult,         \
	  (void *data, CUpointer_attribute attribute, CUdeviceptr ptr))                            \
	X(pointer_set_attribute, cuPointerSetAttribute, "cuPointerSetAttribute", CUresult,         \
	  (const void *value, CUpointer_attribute attribute, CUdeviceptr ptr))                     \
	X(mem_get_address_range, cuMemGetAddressRange, "cuMemGetAddressRange_v2", CUresult,        \
	  (CUdeviceptr * pbase, size_t * psize, CUdeviceptr dptr))                                 \
	X(mem_get_handle_for_address_range, cuMemGetHandleForAddressRange,                         \
	  "cuMemGetHandleForAddressRange", CUresult,                                               \
	  (void *handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType handleType,           \
	   unsigned long long flags))                                                              \
	X(mem_alloc, cuMemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr * dptr, size_t bytesize)) \
	X(mem_free, cuMemFree, "cuMemFree_v2", CUresult, (CUdeviceptr dptr))                       \
	X(ipc_get_mem_handle, cuIpcGetMemHandle, "cuIpcGetMemHandle", CUresult,                    \
	  (CUipcMemHandle * pHandle, CUdeviceptr dptr))                                            \
	X(ipc_open_mem_handle, cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", CUresult,              \
	  (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int flags))                        \
	X(ipc_close_mem_handle, cuIpcCloseMemHandle, "cuIpcCloseMemHandle", CUresult,              \
	  (CUdeviceptr dptr))                                                                      \
	X(flush_gpu_direct_rdma_writes, cuFlushGPUDirectRDMAWrites, "cuFlushGPUDirectRDMAWrites",  \
	  CUresult,                                                                                \
	  (CUflushGPUDirectRDMAWritesTarget target, CUflushGPUDirectRDMAWritesScope scope))

#define RDMAX_CUDA_MEMBER(member, fn, symbol, ret, params) ret(*member) params;

/* The driver entry points; the unit tests' fake fills the same table. */
struct rdmax_cuda {
	RDMAX_CUDA_ENTRY_POINTS(RDMAX_CUDA_MEMBER)
	/* Set by the loader: true when cuGetProcAddress_v2 resolved the entry points. */
	bool via_get_proc_address;
};

/*
 * Load the driver library (NULL: "libcuda.so.1"), resolve every entry point
 * and call cuInit(0). The library stays loaded for the life of the process:
 * unloading libcuda under a process that uses CUDA is never safe.
 * \param library the library to open, or NULL
 * \param ret_table filled on success
 * \param ret_why receives a static reason on failure (may be NULL)
 * \return 0, -ENOENT when the library cannot be loaded, -ENOSYS when an
 *         entry point is missing (driver older than CUDA 11.7), or -EIO when
 *         cuInit() fails (no usable GPU or driver mismatch)
 */
int rdmax_cuda_load(const char *library, struct rdmax_cuda *ret_table, const char **ret_why);

/* Name of a CUresult for messages ("CUDA_ERROR_NOT_SUPPORTED"), never NULL. */
const char *rdmax_cuda_error_name(const struct rdmax_cuda *cuda, CUresult r);

#endif
