/* SPDX-License-Identifier: MIT */
/*
 * Private to daemon/mem/gpu*.c: the state of the GPU module (struct gpu, its
 * regions, the clients' dma-bufs, the pools) and the helpers its files share.
 * No other module includes this: they use gpu.h.
 *
 * Include gpu.h first: this header does not include it, so that gpu.c (which
 * owns gpu.h) does not reach itself through it (tests/check-layout treats a
 * .c and its .h as one module and refuses include cycles).
 */
#ifndef RDMAXD_GPU_INTERNAL_H
#define RDMAXD_GPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CUDA state of one GPU the daemon uses (peermem mappings, pools). */
struct gpu_cuda_dev {
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	CUdevice dev;
	CUcontext ctx; /* primary context, retained */
};

/* A free extent of a pool. */
struct extent {
	struct extent *next;
	uint64_t offset;
	uint64_t length;
};

struct gpu_pool {
	uint64_t id; /* 1, 2, ...; 0 is "by bus id" on the wire */
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	struct gpu_cuda_dev *cdev;
	CUdeviceptr base;
	uint64_t bytes;
	uint8_t ipc_handle[RDMAX_CUDA_IPC_HANDLE_SIZE];
	bool peermem;          /* registered through nvidia_peermem, else dma-buf */
	struct region *region; /* the daemon's own registration of the whole pool */
	struct extent *free;   /* sorted by offset, coalesced */
	uint64_t leased;
	uint32_t slices;
};

/*
 * A client's dma-buf of one allocation, kept while any of its regions is
 * registered: later regions of the allocation (named by buffer id) get their
 * own MRs over it without a new export, and its BAR1 space is charged once.
 * NVIDIA's exporter maps a dma-buf once for all its attachments; N exports
 * of one allocation would take N times its size of BAR1.
 */
struct gpu_dmabuf {
	struct gpu_dmabuf *next;
	void *owner; /* buffer ids are per process: never shared between clients */
	uint64_t buffer_id;
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	int fd;
	uint64_t size;
	uint32_t users; /* regions using it */
	int topo_index;
	uint64_t bar1_charge;
};

/* What a region of a GPU kind holds besides struct region (region->gpu). */
struct gpu_region {
	struct gpu *gpu;
	struct gpu_region *prev, *next; /* gpu->regions */
	struct region *region;
	int fd;                    /* pools: the dma-buf, only while the hooks register it */
	struct gpu_dmabuf *dmabuf; /* client dma-buf regions: the allocation's dma-buf */
	uint64_t dmabuf_offset;    /* of the region in the dma-buf */
	CUdeviceptr mapped;        /* peermem: our mapping of the client's allocation (to close) */
	CUdeviceptr ptr;           /* peermem and peermem pools: the region's device address */
	struct gpu_cuda_dev *cdev;
	int topo_index; /* GPU in the topology, -1 when unknown */
	uint64_t bar1_charge;
	struct gpu_pool *pool; /* the pool (its own region and its slices) */
	bool slice;
	uint64_t slice_offset;
	uint64_t slice_length; /* reserved, rounded to GPU_POOL_ALIGN */
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	uint64_t buffer_id;
};

struct gpu {
	struct gpu_params p;
	char sysfs_root[GPU_PATH_MAX];
	char cuda_library[GPU_PATH_MAX];
	bool peermem; /* nvidia_peermem loaded */
	struct gpu_topology topo;
	uint64_t bar1_used[GPU_MAX]; /* by topology index */
	const struct rdmax_cuda *cuda;
	struct rdmax_cuda loaded;
	const char *cuda_why; /* why loading failed (sticky) */
	struct gpu_cuda_dev cdevs[GPU_MAX];
	uint32_t n_cdevs;
	struct gpu_pool pools[GPU_MAX];
	uint32_t n_pools;
	struct gpu_region *regions;
	struct gpu_dmabuf *dmabufs;
	/* Whether GPUDirect RDMA writes into each GPU need a flush (by bus id). */
	struct {
		char bus_id[RDMAX_CUDA_BUS_ID_MAX];
		int state; /* FLUSH_* */
	} flush[GPU_MAX];
	uint32_t n_flush;
	/* The GPUs holding registered memory, found again only after regions changed. */
	char buses[GPU_MAX][RDMAX_CUDA_BUS_ID_MAX];
	uint32_t n_buses;
	bool buses_stale;
};

enum {
	FLUSH_NOT_NEEDED, /* the GPU orders remote writes for its own kernels */
	FLUSH_NEEDED,     /* cuFlushGPUDirectRDMAWrites before telling a client */
	FLUSH_CANNOT,     /* needed but not supported, or the GPU is unknown to CUDA */
	FLUSH_STATE_MAX,  /* terminator */
};

/* gpu.c */
void gpu_set_why(char *why, size_t why_size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Copies a PCI bus id in lower case (CUDA prints upper case, sysfs lower). */
void gpu_lower_bus_id(char *dst, const char *src);
/* The driver table, loading libcuda the first time the daemon needs CUDA. */
int gpu_get_cuda(struct gpu *gpu, char *why, size_t why_size);
/* The GPU's CUDA device and primary context, retained once per daemon. */
int gpu_get_cdev(struct gpu *gpu, const char *bus_id, struct gpu_cuda_dev **ret_cdev, char *why,
		 size_t why_size);
bool gpu_push_ctx(const struct gpu *gpu, const struct gpu_cuda_dev *cd);
void gpu_pop_ctx(const struct gpu *gpu);
/* The GPU's index in the topology, -1 when sysfs does not show it. */
int gpu_topo_index(const struct gpu *gpu, const char *bus_id);
/* 0 when `charge` fits the BAR1 space left on GPU `index`, else RDMAX_E_GPU_TOO_LARGE. */
int gpu_check_bar1(const struct gpu *gpu, int index, uint64_t charge, char *why, size_t why_size);
void gpu_link_region(struct gpu *gpu, struct gpu_region *gr);
/* Fresh region + gpu_region pair, not yet registered. */
struct region *gpu_new_region(struct gpu *gpu, enum region_kind kind, void *owner, uint64_t length,
			      uint32_t access, struct gpu_region **ret_gr);

/* gpu_topo.c */
/* The sysfs root, "/sys" when none is configured. */
const char *gpu_root_or_default(const char *root);

/* gpu_pool.c */
/* Frees a pool's free list (at gpu_destroy). */
void gpu_pool_free_extents(struct gpu_pool *pool);
/* Returns a slice's range to its pool's free list, coalescing neighbours. */
void gpu_pool_free_range(struct gpu_pool *pool, uint64_t offset, uint64_t length);

#endif /* RDMAXD_GPU_INTERNAL_H */
