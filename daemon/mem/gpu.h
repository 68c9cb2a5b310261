/* SPDX-License-Identifier: MIT */
/*
 * GPU memory in the daemon: validation and registration of GPU regions
 * (dma-buf, or CUDA IPC + nvidia_peermem), the CUDA driver table for the
 * peermem path and the pools (libcuda loaded with dlopen, only when needed),
 * GPU pools leased in slices, and the PCI topology that maps every GPU to
 * its nearest RDMA devices. See docs/gpu.md.
 *
 * The verbs transport registers the memory: this module tells it what to
 * register on each device (gpu_mr_plan) and never calls verbs itself; the
 * thin executor of those plans is gpu_verbs.c.
 */
#ifndef RDMAXD_GPU_H
#define RDMAXD_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_table.h"
#include "config.h"
#include "region.h"

#define GPU_MAX      16  /* GPUs of a node the daemon tracks */
#define GPU_NIC_MAX  32  /* RDMA devices the topology scan records */
#define GPU_PATH_MAX 256 /* sysfs paths */
/* Slices of a pool start on this boundary (the GPU's page size for BAR1 mappings). */
#define GPU_POOL_ALIGN (64u * 1024)

struct gpu;
struct rdmaxd;

/* ---- topology ---- */

/* An RDMA device as sysfs shows it. */
struct gpu_nic {
	char name[64];
	char pci_path[GPU_PATH_MAX]; /* below the sysfs root; "" for software devices (rxe, siw) */
	int numa_node;               /* -1: unknown */
};

/* An NVIDIA GPU on the PCI bus, with its RDMA devices nearest first. */
struct gpu_dev {
	char bus_id[RDMAX_CUDA_BUS_ID_MAX]; /* "0000:3b:00.0", lower case */
	char pci_path[GPU_PATH_MAX];        /* below the sysfs root */
	int numa_node;                      /* -1: unknown */
	uint64_t bar1_bytes;                /* BAR1 aperture (0: unknown) */
	uint32_t n_nics;
	uint32_t nics[GPU_NIC_MAX]; /* indices into gpu_topology.nics, nearest first */
	int closeness[GPU_NIC_MAX]; /* of each, see gpu_closeness() (same order) */
};

struct gpu_topology {
	struct gpu_nic nics[GPU_NIC_MAX];
	uint32_t n_nics;
	struct gpu_dev gpus[GPU_MAX];
	uint32_t n_gpus;
};

/*
 * Read /sys/class/infiniband and the NVIDIA GPUs of /sys/bus/pci/devices
 * under `sysfs_root` (NULL or "": "/sys"), and order every GPU's devices by
 * closeness. A missing tree yields an empty topology, not an error.
 */
int gpu_topology_scan(const char *sysfs_root, struct gpu_topology *ret_topo);

/*
 * How close two PCI functions sit, from their sysfs paths and NUMA nodes:
 * 4 behind the same PCIe switch, 3 the same root port, 2 the same host
 * bridge, 1 the same NUMA node, 0 farther (across the CPU interconnect),
 * -1 unknown (no PCI path: a software device).
 */
int gpu_closeness(const char *path_a, int numa_a, const char *path_b, int numa_b);
/* Words for a closeness value ("same PCIe switch"). */
const char *gpu_closeness_text(int closeness);

/* The GPU with this PCI bus id (any case), or NULL. */
const struct gpu_dev *gpu_topology_find(const struct gpu_topology *topo, const char *bus_id);

/*
 * Order RDMA devices by closeness to the GPU with PCI bus id `bus_id`:
 * writes a permutation of 0..n-1 (indices into `names`) to ret_order,
 * nearest first; equally close devices keep their order, devices sysfs
 * does not know go last. For the verbs transport, to prefer the nearest
 * NICs for a GPU region's transfers and descriptor endpoints.
 * \return n, or RDMAX_E_NOT_FOUND for an unknown GPU (ret_order is then
 *         the identity)
 */
int gpu_nearest_devices(const struct gpu *gpu, const char *bus_id, const char *const *names,
			uint32_t n, uint32_t *ret_order);

/* ---- the module ---- */

struct gpu_params {
	enum config_gpu_registration mode;
	uint64_t pool_bytes;    /* per GPU; 0: no pools */
	const char *sysfs_root; /* NULL: "/sys" */
	bool verbs;             /* an RDMA transport is running */
	bool dmabuf;            /* some RDMA device registers dma-bufs */
	/* Unit tests only; the daemon leaves them NULL. */
	const struct rdmax_cuda *cuda;                   /* a fake driver instead of libcuda */
	const char *cuda_library;                        /* instead of libcuda.so.1 */
	int (*check_dmabuf)(int fd, uint64_t *ret_size); /* instead of gpu_check_dmabuf() */
};

int gpu_create(const struct gpu_params *params, struct gpu **ret_gpu);

/*
 * Start-up: the parameters from the configuration and what the running
 * transports offer (verbs: a verbs transport runs; dmabuf: one of its ports
 * registers dma-bufs), then the pools (fails when pools are configured but
 * cannot be made).
 */
int gpu_start(struct rdmaxd *daemon, bool verbs, bool dmabuf, struct gpu **ret_gpu);

/* Deregister the pools nobody leases (shutdown, before the transports go). */
void gpu_stop(struct gpu *gpu, struct region_table *table);

/*
 * Free everything: CUDA IPC mappings, pool memory, contexts. Only after the
 * transports are gone (no MR may still reference GPU memory). Accepts NULL.
 */
void gpu_destroy(struct gpu *gpu);

/* RDMAX_CAP_DMABUF / RDMAX_CAP_PEERMEM bits this daemon offers clients. */
uint32_t gpu_capabilities(const struct gpu *gpu);

/* The node's topology, as scanned at start-up. */
const struct gpu_topology *gpu_topology(const struct gpu *gpu);

/* nvidia_peermem is loaded (under the given sysfs root; NULL: "/sys"). */
bool gpu_peermem_loaded(const char *sysfs_root);

/*
 * Is fd a dma-buf? Real dma-bufs only: /proc/self/fd names them "/dmabuf:"
 * (or "anon_inode:dmabuf" on old kernels); memfds and files are refused.
 * \param ret_size receives the dma-buf's size
 * \return 0, RDMAX_E_INVALID_ARGUMENT (not a dma-buf), or -errno
 */
int gpu_check_dmabuf(int fd, uint64_t *ret_size);

/* ---- regions ---- */

/* A RegisterRegion of a GPU kind, as the client sent it. */
struct gpu_reg_req {
	enum region_kind kind; /* REGION_GPU_DMABUF or REGION_GPU_CUDA_IPC */
	int fd;          /* DMABUF: the exported dma-buf; -1: the one of buffer_id sent before */
	uint64_t offset; /* of the region inside the dma-buf */
	uint64_t length;
	uint32_t access;
	const char *bus_id; /* may be NULL */
	uint64_t buffer_id;
	const uint8_t *ipc_handle; /* CUDA_IPC: the allocation's handle */
	size_t ipc_handle_len;
};

/*
 * Validate and register a GPU region (the hooks register it with the RDMA
 * devices). A dma-buf is kept (dup'd) while any region of its allocation is
 * registered, so that later regions of it (req->fd -1, same owner and
 * buffer_id) need no new export and are not charged again.
 * On failure `why` says what went wrong and how to fix it.
 * \return 0, RDMAX_E_GPU_* (NEEDS_RDMA, NO_DMABUF, DRIVER_MISSING,
 *         TOO_LARGE, NOT_EXPORTABLE), RDMAX_E_INVALID_ARGUMENT (not a
 *         dma-buf, bad handle, a bus id naming no GPU of the node or not
 *         the one the memory is on), RDMAX_E_NOT_FOUND (no dma-buf of that
 *         buffer id), RDMAX_E_OUT_OF_RANGE, or a hook's error
 */
int gpu_register(struct gpu *gpu, struct region_table *table, void *owner,
		 const struct gpu_reg_req *req, char *why, size_t why_size,
		 struct region **ret_region);

/*
 * Make GPUDirect RDMA writes that landed so far visible to the kernels of
 * every GPU holding a registered region, before an imm counter tells a
 * client they arrived: cuFlushGPUDirectRDMAWrites() in the GPU's primary
 * context where CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING is
 * below OWNER, nothing elsewhere. Loads libcuda only when a GPU region
 * exists. Accepts NULL.
 * \return the number of GPUs flushed, -EOPNOTSUPP when a GPU needs a flush
 *         it does not support (logged once), or RDMAX_E_GPU_DRIVER_MISSING
 */
int gpu_flush_writes(struct gpu *gpu);

/* The PCI bus id of a GPU region or pool slice ("" when unknown), NULL for host memory. */
const char *gpu_region_bus_id(const struct region *region);

/* What the verbs transport registers for a GPU region on one device. */
enum gpu_mr_how {
	GPU_MR_DMABUF,  /* ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access) */
	GPU_MR_ADDR,    /* ibv_reg_mr at addr (peermem: the daemon's device pointer) */
	GPU_MR_SHARED,  /* pool slice: the pool's MR on this device, no registration */
	GPU_MR_HOW_MAX, /* terminator */
};

struct gpu_mr_plan {
	enum gpu_mr_how how;
	int fd;          /* DMABUF */
	uint64_t offset; /* DMABUF: of the region in the dma-buf */
	void *addr;      /* ADDR */
	uint64_t length;
	void *shared; /* SHARED: the pool's MR (region->transport_data of the pool) */
};

/*
 * The plan for registering a GPU region on device `dev_index` at `iova`.
 * \return 0, RDMAX_E_GPU_TOO_LARGE (past max_mr_size),
 *         RDMAX_E_GPU_NO_DMABUF (a dma-buf region on a device without
 *         dma-buf support), RDMAX_E_INVALID_ARGUMENT (iova and dma-buf
 *         offset on different page offsets: the kernel would refuse)
 */
int gpu_mr_plan(const struct region *region, uint32_t dev_index, uint64_t max_mr_size,
		bool dev_dmabuf, uint64_t iova, struct gpu_mr_plan *ret_plan);

/* Pool slices share their pool's MRs: the verbs transport must not deregister those. */
bool gpu_region_shares_mrs(const struct region *region);

/*
 * For the verbs transport's region hooks (gpu_verbs.c): register a region
 * of a GPU kind or a pool slice on one device at `iova`, following
 * gpu_mr_plan(), in protection domain pd of that device, and undo it. The
 * dereg leaves a slice's shared MR (in the device's shared PD) alone.
 * Errors are logged here, naming the device and the hint.
 */
struct hca;
struct ibv_mr;
struct ibv_pd;
int gpu_verbs_reg_mr(struct region *region, struct hca *hca, struct ibv_pd *pd, uint64_t iova,
		     int access, struct ibv_mr **ret_mr);
void gpu_verbs_dereg_mr(struct region *region, struct hca *hca, struct ibv_mr *mr);

/* ---- pools ---- */

/* Where a leased slice lives, for the client to map it. */
struct gpu_lease {
	uint64_t pool_id;
	uint64_t offset; /* of the slice inside the pool allocation */
	uint8_t ipc_handle[RDMAX_CUDA_IPC_HANDLE_SIZE];
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
};

/*
 * Allocate and register a pool on every GPU ([gpu] pool_bytes); a no-op
 * when pools are off. Pools need an RDMA transport and a GPU path (dma-buf
 * or peermem); without one they are skipped with a warning.
 */
int gpu_pools_start(struct gpu *gpu, struct region_table *table);

/*
 * Lease `length` bytes of the pool `pool_id` (0: the pool of the GPU named
 * by bus_id) as a region of kind REGION_POOL_SLICE owned by `owner`. The
 * slice returns to the pool when the region is freed.
 * \return 0, RDMAX_E_NOT_FOUND (no such pool), RDMAX_E_RESOURCE_EXHAUSTED
 *         (no free range large enough), RDMAX_E_INVALID_ARGUMENT, or a
 *         hook's error
 */
int gpu_pool_alloc(struct gpu *gpu, struct region_table *table, void *owner, uint64_t pool_id,
		   const char *bus_id, uint64_t length, uint32_t access,
		   struct gpu_lease *ret_lease, char *why, size_t why_size,
		   struct region **ret_region);

/* One pool, as the admin socket shows it. */
struct gpu_pool_info {
	uint64_t pool_id;
	const char *bus_id;
	const char *path; /* "dmabuf" or "peermem" */
	uint64_t bytes;
	uint64_t leased; /* bytes in slices */
	uint32_t slices;
};
typedef void (*gpu_pool_cb)(void *arg, const struct gpu_pool_info *info);
void gpu_for_each_pool(const struct gpu *gpu, gpu_pool_cb cb, void *arg);

#endif
