/* SPDX-License-Identifier: MIT */
/*
 * A fake CUDA driver for the unit tests: fills the same struct rdmax_cuda
 * that librdmax and rdmaxd fill from libcuda, and keeps the rules the real
 * driver enforces where the project's logic depends on them (page-aligned
 * dma-buf export of a mapped range, IPC handles of allocation bases only,
 * a current context for every call but the pointer and device queries,
 * VMM memory as several mappings of one reserved range, each of which
 * cuMemGetAddressRange answers alone, memory kinds that are not IPC
 * capable). dma-bufs are memfds of the exported size. Linked into the
 * unit-test binary only; the daemon and the library never see it.
 */
#ifndef RDMAX_FAKE_CUDA_H
#define RDMAX_FAKE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_table.h"

#define FAKE_CUDA_DEVICES 4
#define FAKE_CUDA_ALLOCS  64
#define FAKE_CUDA_CTX_MAX 8
/* The primary context of device d, and a context an application made on it. */
#define FAKE_CUDA_PRIMARY_CTX(d) ((CUcontext)(uintptr_t)(0x1000 + 0x10 * (d)))
#define FAKE_CUDA_APP_CTX(d)     ((CUcontext)(uintptr_t)(0x9000 + 0x10 * (d)))

/* How memory was allocated. */
enum fake_kind {
	FAKE_DEVICE,  /* cuMemAlloc / cudaMalloc */
	FAKE_VMM,     /* one cuMemCreate + cuMemMap mapping inside a reserved range */
	FAKE_MEMPOOL, /* cudaMallocAsync from a memory pool */
	FAKE_MANAGED, /* cudaMallocManaged */
	FAKE_HOST,    /* cuMemHostAlloc: page-locked host memory */
	FAKE_KIND_MAX,
};

struct fake_alloc {
	bool used;
	bool freed;
	CUdeviceptr base;
	size_t size;
	uint64_t buffer_id;
	int device;
	enum fake_kind kind;
	bool vmm;             /* kind == FAKE_VMM */
	bool vmm_partial;     /* not fully mapped: cannot be exported */
	bool rdma_capable;    /* VMM: created with gpuDirectRDMACapable */
	uint32_t reservation; /* VMM: mappings of one reserved range share it */
	bool mapping;         /* an IPC mapping opened in this process */
	CUdeviceptr of;       /* mapping: base of the allocation it maps */
};

struct fake_cuda {
	struct rdmax_cuda table;

	/* Knobs. */
	int n_devices;
	bool dmabuf[FAKE_CUDA_DEVICES]; /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
	char bus_id[FAKE_CUDA_DEVICES][RDMAX_CUDA_BUS_ID_MAX];
	CUresult export_result; /* forced result of cuMemGetHandleForAddressRange (0: rules) */
	bool sync_memops_fails;
	bool ipc_get_fails; /* cuIpcGetMemHandle refuses although the attribute says 1 */
	int ordering[FAKE_CUDA_DEVICES]; /* ..._GPU_DIRECT_RDMA_WRITES_ORDERING (default OWNER) */
	int flush_options[FAKE_CUDA_DEVICES]; /* ..._GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS (HOST) */
	bool c2c[FAKE_CUDA_DEVICES];          /* HOST_NATIVE_ATOMIC_SUPPORTED: a Grace system */
	bool no_pcie_flag;                    /* a driver that does not know the PCIE flag */
	bool host_dmabuf[FAKE_CUDA_DEVICES];  /* HOST_ALLOC_DMA_BUF_SUPPORTED */

	/* What happened. */
	struct fake_alloc allocs[FAKE_CUDA_ALLOCS];
	uint64_t next_buffer_id;
	CUdeviceptr next_base;
	int exports;
	CUdeviceptr last_export_base;
	size_t last_export_size;
	unsigned long long last_export_flags;
	CUcontext last_export_ctx; /* current when the last export succeeded */
	int flushes;
	CUcontext last_flush_ctx;
	int no_ctx_calls; /* calls refused for want of a current context */
	uint32_t next_reservation;
	int sync_memops;
	int ipc_gets, ipc_opens, ipc_closes;
	int retains, releases;
	int mem_allocs, mem_frees;
	CUcontext ctx_stack[FAKE_CUDA_CTX_MAX];
	int ctx_depth;
	int max_ctx_depth;
};

/* Install a fresh fake (2 devices, both with dma-buf) as the current one. */
void fake_cuda_init(struct fake_cuda *f);
/* Close nothing; the fake holds no fds. Resets the current fake. */
void fake_cuda_fini(struct fake_cuda *f);

/* cudaMalloc as an application would: an allocation on device `dev`. */
CUdeviceptr fake_cuda_alloc(struct fake_cuda *f, size_t size, int dev);
/* VMM memory (expandable segments): not IPC capable; `partial`: export fails too. */
CUdeviceptr fake_cuda_alloc_vmm(struct fake_cuda *f, size_t size, int dev, bool partial);
/*
 * A reserved range of n_chunks * chunk bytes mapped by n_chunks separate
 * cuMemCreate allocations (what PyTorch's expandable segments grow by):
 * cuMemGetAddressRange answers only the mapping around a pointer.
 */
CUdeviceptr fake_cuda_alloc_vmm_chunks(struct fake_cuda *f, int n_chunks, size_t chunk, int dev,
				       bool rdma_capable);
/* cudaMallocAsync, cudaMallocManaged or cuMemHostAlloc memory. */
CUdeviceptr fake_cuda_alloc_kind(struct fake_cuda *f, enum fake_kind kind, size_t size, int dev);
/* A thread's context stack (the fake has one, like a single thread): push as an application. */
void fake_cuda_push_app_ctx(struct fake_cuda *f, CUcontext ctx);
/* A new allocation at exactly `base` (the caching allocator reused the address). */
CUdeviceptr fake_cuda_alloc_at(struct fake_cuda *f, CUdeviceptr base, size_t size, int dev);
void fake_cuda_free(struct fake_cuda *f, CUdeviceptr ptr);
const struct fake_alloc *fake_cuda_find(const struct fake_cuda *f, CUdeviceptr ptr);
/* cuIpcGetMemHandle as the owner of the memory would call it (with a context). */
CUresult fake_cuda_ipc_handle(struct fake_cuda *f, CUdeviceptr ptr, CUipcMemHandle *ret_handle);
/* Live IPC mappings opened in this process. */
int fake_cuda_mappings(const struct fake_cuda *f);

#endif
