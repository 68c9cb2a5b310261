/* SPDX-License-Identifier: MIT */
/*
 * A fake CUDA driver for the unit tests: fills the same struct rdmax_cuda
 * that librdmax and rdmaxd fill from libcuda, and keeps the rules the real
 * driver enforces where the project's logic depends on them (page-aligned
 * dma-buf export of a mapped range, IPC handles of allocation bases only,
 * a current context for IPC mappings and allocations, VMM memory that is
 * not IPC capable). dma-bufs are memfds of the exported size. Linked into
 * the unit-test binary only; the daemon and the library never see it.
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

struct fake_alloc {
	bool used;
	bool freed;
	CUdeviceptr base;
	size_t size;
	uint64_t buffer_id;
	int device;
	bool vmm;         /* cuMemCreate/cuMemMap memory: not legacy-IPC capable */
	bool vmm_partial; /* not fully mapped: cannot be exported */
	bool mapping;     /* an IPC mapping opened in this process */
	CUdeviceptr of;   /* mapping: base of the allocation it maps */
};

struct fake_cuda {
	struct rdmax_cuda table;

	/* Knobs. */
	int n_devices;
	bool dmabuf[FAKE_CUDA_DEVICES]; /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
	char bus_id[FAKE_CUDA_DEVICES][RDMAX_CUDA_BUS_ID_MAX];
	CUresult export_result; /* forced result of cuMemGetHandleForAddressRange (0: rules) */
	bool sync_memops_fails;

	/* What happened. */
	struct fake_alloc allocs[FAKE_CUDA_ALLOCS];
	uint64_t next_buffer_id;
	CUdeviceptr next_base;
	int exports;
	CUdeviceptr last_export_base;
	size_t last_export_size;
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
/* A new allocation at exactly `base` (the caching allocator reused the address). */
CUdeviceptr fake_cuda_alloc_at(struct fake_cuda *f, CUdeviceptr base, size_t size, int dev);
void fake_cuda_free(struct fake_cuda *f, CUdeviceptr ptr);
const struct fake_alloc *fake_cuda_find(const struct fake_cuda *f, CUdeviceptr ptr);
/* Live IPC mappings opened in this process. */
int fake_cuda_mappings(const struct fake_cuda *f);

#endif
