/* SPDX-License-Identifier: MIT */
/*
 * GPU pools: at start the daemon allocates [gpu] pool_bytes on every GPU
 * CUDA sees and registers it once; clients then lease slices of it (first
 * fit on GPU_POOL_ALIGN boundaries) that reuse the pool's MRs, and give them
 * back by deregistering the slice's region.
 *
 * Never registers a slice with a device of its own: a slice is the pool's
 * MRs at an offset. A pool's memory is freed only at gpu_destroy(), after
 * every slice and the pool's own registration are gone.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gpu.h"
#include "gpu_internal.h"
#include "log.h"
#include "rdmax.h"
#include "util.h"

/* ------------------------------------------------------------------- pools */

void gpu_pool_free_extents(struct gpu_pool *pool)
{
	while (pool->free) {
		struct extent *e = pool->free;
		pool->free = e->next;
		free(e);
	}
}

/* First fit; offsets stay GPU_POOL_ALIGN-aligned since every length is. */
static int pool_take_range(struct gpu_pool *pool, uint64_t length, uint64_t *ret_offset)
{
	for (struct extent **pp = &pool->free; *pp; pp = &(*pp)->next) {
		struct extent *e = *pp;
		if (e->length < length) {
			continue;
		}
		*ret_offset = e->offset;
		e->offset += length;
		e->length -= length;
		if (e->length == 0) {
			*pp = e->next;
			free(e);
		}
		return 0;
	}
	return RDMAX_E_RESOURCE_EXHAUSTED;
}

void gpu_pool_free_range(struct gpu_pool *pool, uint64_t offset, uint64_t length)
{
	struct extent **pp = &pool->free;
	struct extent *prev = NULL, *e;

	while (*pp && (*pp)->offset < offset) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	e = *pp;
	if (prev && prev->offset + prev->length == offset) {
		prev->length += length;
		if (e && prev->offset + prev->length == e->offset) {
			prev->length += e->length;
			prev->next = e->next;
			free(e);
		}
		return;
	}
	if (e && offset + length == e->offset) {
		e->offset = offset;
		e->length += length;
		return;
	}
	struct extent *n = malloc(sizeof(*n));
	if (!n) {
		/* The range is lost to the pool until restart: better than failing a release. */
		log_warn("GPU pool %" PRIu64 ": out of memory returning %" PRIu64 " bytes",
			 pool->id, length);
		return;
	}
	n->offset = offset;
	n->length = length;
	n->next = e;
	*pp = n;
}

static struct gpu_pool *find_pool(struct gpu *gpu, uint64_t pool_id, const char *bus_id)
{
	for (uint32_t i = 0; i < gpu->n_pools; i++) {
		struct gpu_pool *pool = &gpu->pools[i];
		if (!pool->region) {
			continue;
		}
		if (pool_id ? pool->id == pool_id
			    : (bus_id && strcasecmp(pool->bus_id, bus_id) == 0)) {
			return pool;
		}
	}
	return NULL;
}

/* Allocate the pool memory on one GPU and register it once. */
static int pool_create(struct gpu *gpu, struct region_table *table, struct gpu_pool *pool,
		       bool want_dmabuf, bool want_peermem, char *why, size_t why_size)
{
	const struct rdmax_cuda *cu = gpu->cuda;
	const uint64_t bytes =
		(gpu->p.pool_bytes + GPU_POOL_ALIGN - 1) & ~(uint64_t)(GPU_POOL_ALIGN - 1);
	CUipcMemHandle handle;
	struct gpu_region *gr;
	struct region *region;
	unsigned int one = 1;
	int supported = 0, c2c = 0, fd = -1, ret;
	CUresult r;

	if (!gpu_push_ctx(gpu, pool->cdev)) {
		gpu_set_why(why, why_size, "cannot make GPU '%s' current", pool->bus_id);
		return -EIO;
	}
	r = cu->mem_alloc(&pool->base, (size_t)bytes);
	if (r != CUDA_SUCCESS) {
		gpu_pop_ctx(gpu);
		pool->base = 0;
		gpu_set_why(why, why_size, "cuMemAlloc() of %" PRIu64 " bytes failed: %s", bytes,
			    rdmax_cuda_error_name(cu, r));
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	pool->bytes = bytes;
	r = cu->ipc_get_mem_handle(&handle, pool->base);
	if (r == CUDA_SUCCESS) {
		cu->pointer_set_attribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, pool->base);
		cu->device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
					 pool->cdev->dev);
		/* Grace (C2C): ask for the PCIe BAR1 mapping; drivers before 12.8 do not know it.
		 */
		cu->device_get_attribute(&c2c, CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED,
					 pool->cdev->dev);
		if (want_dmabuf && supported && c2c &&
		    cu->mem_get_handle_for_address_range(
			    &fd, pool->base, (size_t)bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
			    CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) != CUDA_SUCCESS) {
			fd = -1;
		}
		if (want_dmabuf && supported && fd < 0 &&
		    cu->mem_get_handle_for_address_range(&fd, pool->base, (size_t)bytes,
							 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
							 0) != CUDA_SUCCESS) {
			fd = -1;
		}
	}
	gpu_pop_ctx(gpu);
	if (r != CUDA_SUCCESS) {
		gpu_set_why(why, why_size, "cuIpcGetMemHandle() failed: %s",
			    rdmax_cuda_error_name(cu, r));
		return -EIO;
	}
	memcpy(pool->ipc_handle, &handle, sizeof(pool->ipc_handle));
	if (fd < 0 && !want_peermem) {
		gpu_set_why(why, why_size,
			    "the GPU cannot export a dma-buf of its pool and nvidia_peermem is not "
			    "available");
		return RDMAX_E_GPU_NO_DMABUF;
	}
	pool->peermem = fd < 0;
	region = gpu_new_region(gpu, pool->peermem ? REGION_GPU_CUDA_IPC : REGION_GPU_DMABUF, NULL,
				bytes, RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE, &gr);
	if (!region) {
		if (fd >= 0) {
			close(fd);
		}
		gpu_set_why(why, why_size, "out of memory");
		return -ENOMEM;
	}
	gr->pool = pool;
	gr->cdev = pool->cdev;
	gr->fd = fd;
	gr->ptr = pool->base;
	snprintf(gr->bus_id, sizeof(gr->bus_id), "%s", pool->bus_id);
	gr->topo_index = gpu_topo_index(gpu, pool->bus_id);
	/* Slices' iovas are the pool's plus their offset: start at a page boundary. */
	region->gpu_addr = 0;
	ret = gpu_check_bar1(gpu, gr->topo_index, bytes, why, why_size);
	if (ret == 0) {
		ret = region_insert(table, region);
		if (ret < 0) {
			gpu_set_why(why, why_size, "registration with the RDMA devices failed: %s",
				    rdmax_strerror(ret));
		}
	}
	if (fd >= 0) {
		close(fd);
	}
	gr->fd = -1;
	if (ret < 0) {
		free(gr);
		free(region);
		return ret;
	}
	if (gr->topo_index >= 0) {
		gpu->bar1_used[gr->topo_index] += bytes;
	}
	gr->bar1_charge = bytes;
	gpu_link_region(gpu, gr);
	pool->free = calloc(1, sizeof(*pool->free));
	if (!pool->free) {
		region_deregister(table, region, NULL, NULL);
		gpu_set_why(why, why_size, "out of memory");
		return -ENOMEM;
	}
	pool->free->length = bytes;
	pool->region = region;
	return 0;
}

int gpu_pools_start(struct gpu *gpu, struct region_table *table)
{
	bool want_dmabuf, want_peermem;
	char why[256] = "";
	int count = 0, ret;

	if (!gpu || gpu->p.pool_bytes == 0) {
		return 0;
	}
	if (!gpu->p.verbs) {
		log_warn("[gpu] pool_bytes is set but no RDMA device is in use: no GPU pools");
		return 0;
	}
	want_dmabuf = gpu->p.mode != CONFIG_GPU_REG_PEERMEM && gpu->p.dmabuf;
	want_peermem = gpu->p.mode != CONFIG_GPU_REG_DMABUF && gpu->peermem;
	if (!want_dmabuf && !want_peermem) {
		log_warn("[gpu] pool_bytes is set but GPU memory cannot be registered here (no "
			 "device with dma-buf support%s): no GPU pools",
			 gpu->p.mode == CONFIG_GPU_REG_DMABUF ? "" : ", nvidia_peermem not loaded");
		return 0;
	}
	ret = gpu_get_cuda(gpu, why, sizeof(why));
	if (ret < 0) {
		log_err("[gpu] pool_bytes is set but %s", why);
		return ret;
	}
	if (gpu->cuda->device_get_count(&count) != CUDA_SUCCESS || count <= 0) {
		log_info("[gpu] pool_bytes is set but CUDA sees no GPU: no GPU pools");
		return 0;
	}
	for (int ordinal = 0; ordinal < count && gpu->n_pools < GPU_MAX; ordinal++) {
		struct gpu_pool *pool = &gpu->pools[gpu->n_pools];
		char bus_id[RDMAX_CUDA_BUS_ID_MAX];
		CUdevice dev;

		if (gpu->cuda->device_get(&dev, ordinal) != CUDA_SUCCESS ||
		    gpu->cuda->device_get_pci_bus_id(bus_id, sizeof(bus_id), dev) != CUDA_SUCCESS) {
			log_err("cannot identify CUDA device %d for its GPU pool", ordinal);
			return -EIO;
		}
		bus_id[sizeof(bus_id) - 1] = '\0';
		memset(pool, 0, sizeof(*pool));
		pool->id = gpu->n_pools + 1;
		gpu_lower_bus_id(pool->bus_id, bus_id);
		ret = gpu_get_cdev(gpu, bus_id, &pool->cdev, why, sizeof(why));
		if (ret == 0) {
			/* Counted now, so that gpu_destroy() frees the memory of a half-made pool.
			 */
			gpu->n_pools++;
			ret = pool_create(gpu, table, pool, want_dmabuf, want_peermem, why,
					  sizeof(why));
		}
		if (ret < 0) {
			log_err("cannot create the GPU pool of %" PRIu64 " bytes on '%s': %s",
				gpu->p.pool_bytes, pool->bus_id, why);
			return ret;
		}
		log_notice("GPU pool %" PRIu64 " on '%s': %" PRIu64 " bytes registered (%s)",
			   pool->id, pool->bus_id, pool->bytes,
			   pool->peermem ? "peermem" : "dma-buf");
	}
	return 0;
}

int gpu_pool_alloc(struct gpu *gpu, struct region_table *table, void *owner, uint64_t pool_id,
		   const char *bus_id, uint64_t length, uint32_t access,
		   struct gpu_lease *ret_lease, char *why, size_t why_size,
		   struct region **ret_region)
{
	const uint32_t known = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	struct gpu_pool *pool;
	struct gpu_region *gr;
	struct region *region;
	uint64_t reserved, offset;
	int ret;

	if (length == 0 || (access & ~known) || length > UINT64_MAX - GPU_POOL_ALIGN) {
		gpu_set_why(why, why_size, "zero length, unknown access bits or length too large");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	pool = gpu ? find_pool(gpu, pool_id, bus_id) : NULL;
	if (!pool) {
		if (pool_id) {
			gpu_set_why(why, why_size, "no GPU pool %" PRIu64 " ([gpu] pool_bytes)",
				    pool_id);
		} else {
			gpu_set_why(why, why_size, "no GPU pool on GPU '%s' ([gpu] pool_bytes)",
				    bus_id ? bus_id : "");
		}
		return RDMAX_E_NOT_FOUND;
	}
	reserved = (length + GPU_POOL_ALIGN - 1) & ~(uint64_t)(GPU_POOL_ALIGN - 1);
	if (pool_take_range(pool, reserved, &offset) < 0) {
		gpu_set_why(why, why_size,
			    "GPU pool %" PRIu64 " on '%s' has no free range of %" PRIu64
			    " bytes (%" PRIu64 " of %" PRIu64 " bytes leased)",
			    pool->id, pool->bus_id, reserved, pool->leased, pool->bytes);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	region = gpu_new_region(gpu, REGION_POOL_SLICE, owner, length, access, &gr);
	if (!region) {
		gpu_pool_free_range(pool, offset, reserved);
		gpu_set_why(why, why_size, "out of memory");
		return -ENOMEM;
	}
	gr->pool = pool;
	gr->slice = true;
	gr->slice_offset = offset;
	gr->slice_length = reserved;
	gr->cdev = pool->cdev;
	snprintf(gr->bus_id, sizeof(gr->bus_id), "%s", pool->bus_id);
	region->gpu_addr = pool->region->gpu_addr + offset;
	/*
	 * A slice is addressed through its pool's MRs at the pool's iova plus
	 * its offset; the verbs transport derives an iova's high bits from the
	 * region key, so the slice's key keeps the pool's high half. The low
	 * half stays random: where keys are checked (TCP, same-node jobs,
	 * access probes) descriptors of returned slices are refused.
	 */
	region->key =
		(pool->region->key & ~UINT64_C(0xffffffff)) | (random_u64() & UINT64_C(0xffffffff));
	if (region->key == pool->region->key) {
		region->key ^= 1;
	}
	ret = region_insert(table, region);
	if (ret < 0) {
		gpu_pool_free_range(pool, offset, reserved);
		free(gr);
		free(region);
		gpu_set_why(why, why_size, "registration with the RDMA devices failed: %s",
			    rdmax_strerror(ret));
		return ret;
	}
	pool->leased += reserved;
	pool->slices++;
	gpu_link_region(gpu, gr);
	memset(ret_lease, 0, sizeof(*ret_lease));
	ret_lease->pool_id = pool->id;
	ret_lease->offset = offset;
	memcpy(ret_lease->ipc_handle, pool->ipc_handle, sizeof(ret_lease->ipc_handle));
	snprintf(ret_lease->bus_id, sizeof(ret_lease->bus_id), "%s", pool->bus_id);
	*ret_region = region;
	return 0;
}

void gpu_for_each_pool(const struct gpu *gpu, gpu_pool_cb cb, void *arg)
{
	for (uint32_t i = 0; gpu && i < gpu->n_pools; i++) {
		const struct gpu_pool *pool = &gpu->pools[i];
		struct gpu_pool_info info = {
			.pool_id = pool->id,
			.bus_id = pool->bus_id,
			.path = pool->peermem ? "peermem" : "dmabuf",
			.bytes = pool->bytes,
			.leased = pool->leased,
			.slices = pool->slices,
		};
		if (pool->region) {
			cb(arg, &info);
		}
	}
}
