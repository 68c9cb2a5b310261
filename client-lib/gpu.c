/* SPDX-License-Identifier: MIT */
/*
 * librdmax's GPU memory: registration of CUDA device memory (dma-buf, or a
 * CUDA IPC handle for the nvidia_peermem fallback) and leases from the
 * daemon's GPU pools. Owns the client's CUDA driver table (libcuda loaded
 * with dlopen at the first GPU call), the list of its GPU registrations with
 * the allocation behind each, and the CUDA IPC mappings of pools.
 *
 * The daemon can only register what it can import, and whatever goes wrong
 * must show at registration, never at the first transfer: every property
 * the library can check (device memory, exportability, driver support,
 * address reuse) is checked here before anything is sent. Never logs; all
 * CUDA calls go through the table so that the unit tests can drive every
 * branch with a fake driver.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "internal.h"

/* One GPU registration of this client. */
struct gpu_reg {
	struct gpu_reg *next;
	struct rdmax_region *region;
	CUdeviceptr base; /* the allocation holding the region (0 for pool slices) */
	size_t size;
	uint64_t buffer_id;
	struct pool_map *map; /* pool slices: the pool's mapping here */
};

/* A daemon pool mapped into this process through its CUDA IPC handle. */
struct pool_map {
	struct pool_map *next;
	uint64_t pool_id;
	uint8_t handle[RDMAX_CUDA_IPC_HANDLE_SIZE];
	CUdevice dev;
	CUcontext ctx; /* the device's primary context, retained */
	CUdeviceptr base;
	uint32_t refs; /* slices using the mapping */
};

struct client_gpu {
	const struct rdmax_cuda *cuda; /* NULL until loaded */
	struct rdmax_cuda loaded;
	int load_err; /* sticky once loading failed */
	const char *library;
	struct gpu_reg *regs;
	struct pool_map *maps;
};

/* What CUDA says about the allocation behind a pointer. */
struct alloc_info {
	CUdeviceptr base;
	size_t size;
	uint64_t buffer_id;
	CUdevice dev;
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	bool ipc_capable; /* legacy CUDA IPC works: cuMemAlloc memory, not VMM */
	bool dmabuf;      /* the device can export dma-bufs */
};

static struct client_gpu *gpu_state(struct rdmax_client *c)
{
	struct client_gpu **slot = client_gpu_slot(c);

	if (!*slot) {
		*slot = calloc(1, sizeof(**slot));
	}
	return *slot;
}

int client_gpu_use_cuda(struct rdmax_client *c, const struct rdmax_cuda *table, const char *library)
{
	struct client_gpu *g;

	if (!c) {
		return -EINVAL;
	}
	g = gpu_state(c);
	if (!g) {
		return -ENOMEM;
	}
	if (g->cuda || g->regs) {
		return -EBUSY;
	}
	g->cuda = table;
	g->library = library;
	g->load_err = 0;
	return 0;
}

/* The driver table, loading libcuda on first use. */
static int get_cuda(struct rdmax_client *c, const struct rdmax_cuda **ret_cuda)
{
	struct client_gpu *g = gpu_state(c);

	if (!g) {
		return -ENOMEM;
	}
	if (!g->cuda && !g->load_err) {
		int r = rdmax_cuda_load(g->library, &g->loaded, NULL);
		if (r < 0) {
			g->load_err = RDMAX_E_GPU_DRIVER_MISSING;
		} else {
			g->cuda = &g->loaded;
		}
	}
	if (!g->cuda) {
		return g->load_err;
	}
	*ret_cuda = g->cuda;
	return 0;
}

static int describe(const struct rdmax_cuda *cu, CUdeviceptr ptr, struct alloc_info *ret_info)
{
	struct alloc_info a;
	unsigned int memtype = 0;
	int ordinal = -1, flag = 0;
	unsigned long long id = 0;

	memset(&a, 0, sizeof(a));
	if (cu->pointer_get_attribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) !=
		    CUDA_SUCCESS ||
	    memtype != CU_MEMORYTYPE_DEVICE) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	if (cu->mem_get_address_range(&a.base, &a.size, ptr) != CUDA_SUCCESS || a.size == 0) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	if (cu->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CUDA_SUCCESS ||
	    cu->pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) !=
		    CUDA_SUCCESS ||
	    cu->device_get(&a.dev, ordinal) != CUDA_SUCCESS ||
	    cu->device_get_pci_bus_id(a.bus_id, sizeof(a.bus_id), a.dev) != CUDA_SUCCESS) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	a.bus_id[sizeof(a.bus_id) - 1] = '\0';
	a.buffer_id = id;
	/* VMM memory (cuMemCreate, expandable segments) answers 0 here. */
	a.ipc_capable =
		cu->pointer_get_attribute(&flag, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
					  ptr) == CUDA_SUCCESS &&
		flag != 0;
	flag = 0;
	a.dmabuf = cu->device_get_attribute(&flag, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, a.dev) ==
			   CUDA_SUCCESS &&
		   flag != 0;
	*ret_info = a;
	return 0;
}

/*
 * A registered allocation whose range the new one overlaps under another
 * buffer id was freed while registered: its region still names memory that
 * is no longer the application's.
 */
static struct gpu_reg *find_reused(const struct client_gpu *g, const struct alloc_info *a)
{
	for (struct gpu_reg *r = g->regs; r; r = r->next) {
		if (r->size == 0 || r->buffer_id == a->buffer_id) {
			continue;
		}
		if (r->base < a->base + a->size && a->base < r->base + r->size) {
			return r;
		}
	}
	return NULL;
}

/*
 * Export the whole allocation as a dma-buf: the daemon addresses the region
 * at its offset inside it. Base and size must be page aligned.
 */
static int export_dmabuf(const struct rdmax_cuda *cu, const struct alloc_info *a, int *ret_fd)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t size = ((uint64_t)a->size + page - 1) & ~(page - 1);
	int fd = -1;
	CUresult r;

	if (a->base % page != 0) {
		return RDMAX_E_GPU_NOT_EXPORTABLE;
	}
	r = cu->mem_get_handle_for_address_range(&fd, a->base, (size_t)size,
						 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (r != CUDA_SUCCESS || fd < 0) {
		if (!a->ipc_capable) {
			return RDMAX_E_GPU_NOT_EXPORTABLE;
		}
		return r == CUDA_ERROR_NOT_SUPPORTED ? RDMAX_E_GPU_NO_DMABUF
						     : RDMAX_E_GPU_NOT_EXPORTABLE;
	}
	*ret_fd = fd;
	return 0;
}

static int remember(struct client_gpu *g, struct rdmax_region *region, const struct alloc_info *a,
		    struct pool_map *map)
{
	struct gpu_reg *r = calloc(1, sizeof(*r));

	if (!r) {
		return -ENOMEM;
	}
	r->region = region;
	if (a) {
		r->base = a->base;
		r->size = a->size;
		r->buffer_id = a->buffer_id;
	}
	r->map = map;
	r->next = g->regs;
	g->regs = r;
	return 0;
}

static int send_register(struct rdmax_client *c, Rdmax__V1__RegisterRegion *rr, int fd,
			 uint64_t length, void *addr, struct rdmax_region **ret_region)
{
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION;
	msg.register_region = rr;
	return client_region_request(c, &msg, fd, length, addr, ret_region, NULL);
}

RDMAX_EXPORT int rdmax_region_register_gpu(struct rdmax_client *client, void *dev_ptr,
					   uint64_t length, uint32_t access,
					   struct rdmax_region **ret_region)
{
	Rdmax__V1__RegisterRegion rr = RDMAX__V1__REGISTER_REGION__INIT;
	const uint32_t known = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	const struct rdmax_cuda *cu;
	CUipcMemHandle handle;
	struct client_gpu *g;
	struct rdmax_region *region;
	struct alloc_info a;
	CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)dev_ptr;
	uint32_t caps;
	int fd = -1, r;

	if (!client || !ret_region) {
		return -EINVAL;
	}
	if (!dev_ptr || length == 0 || (access & ~known) || ptr > UINT64_MAX - length) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	caps = rdmax_client_info(client)->capabilities;
	/* Nothing to export for a daemon that could not register it anyway. */
	if (!(caps & RDMAX_CAP_VERBS)) {
		return RDMAX_E_GPU_NEEDS_RDMA;
	}
	if (!(caps & (RDMAX_CAP_DMABUF | RDMAX_CAP_PEERMEM))) {
		return RDMAX_E_GPU_NO_DMABUF;
	}
	r = get_cuda(client, &cu);
	if (r < 0) {
		return r;
	}
	g = gpu_state(client);
	r = describe(cu, ptr, &a);
	if (r < 0) {
		return r;
	}
	if (ptr + length > a.base + a.size) {
		return RDMAX_E_OUT_OF_RANGE;
	}
	if (find_reused(g, &a)) {
		return RDMAX_E_GPU_ADDRESS_REUSED;
	}

	/*
	 * The NIC reads and writes GPU memory behind CUDA's back: synchronous
	 * copies into the allocation must have finished when they return. VMM
	 * memory does not take the attribute; whether it exports decides below.
	 */
	unsigned int one = 1;
	if (cu->pointer_set_attribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr) !=
		    CUDA_SUCCESS &&
	    a.ipc_capable) {
		return RDMAX_E_GPU_NOT_EXPORTABLE;
	}
	rr.access = access;
	rr.offset = ptr - a.base; /* the region's place inside the exported allocation */
	rr.length = length;
	rr.gpu_bus_id = a.bus_id;
	rr.has_gpu_buffer_id = 1;
	rr.gpu_buffer_id = a.buffer_id;
	r = RDMAX_E_GPU_NO_DMABUF;
	if ((caps & RDMAX_CAP_DMABUF) && a.dmabuf) {
		r = export_dmabuf(cu, &a, &fd);
	}
	if (r == 0) {
		rr.kind = RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF;
		rr.has_fd_index = 1;
		rr.fd_index = 0;
	} else if (r == RDMAX_E_GPU_NO_DMABUF && (caps & RDMAX_CAP_PEERMEM)) {
		/* Fallback: the daemon opens the allocation and nvidia_peermem pins it. */
		if (!a.ipc_capable) {
			return RDMAX_E_GPU_NOT_EXPORTABLE;
		}
		if (cu->ipc_get_mem_handle(&handle, a.base) != CUDA_SUCCESS) {
			return RDMAX_E_GPU_NOT_EXPORTABLE;
		}
		rr.kind = RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC;
		rr.has_cuda_ipc_handle = 1;
		rr.cuda_ipc_handle.data = (uint8_t *)&handle;
		rr.cuda_ipc_handle.len = sizeof(handle);
	} else {
		return r;
	}
	r = send_register(client, &rr, fd, length, dev_ptr, &region);
	if (fd >= 0) {
		/* The daemon holds its own reference to the dma-buf now (or refused it). */
		close(fd);
	}
	if (r < 0) {
		return r;
	}
	r = remember(g, region, &a, NULL);
	if (r < 0) {
		rdmax_region_deregister(client, region);
		return r;
	}
	*ret_region = region;
	return 0;
}

static void map_put(const struct rdmax_cuda *cu, struct client_gpu *g, struct pool_map *m)
{
	CUcontext popped;

	if (--m->refs > 0) {
		return;
	}
	for (struct pool_map **pp = &g->maps; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	if (cu->ctx_push_current(m->ctx) == CUDA_SUCCESS) {
		cu->ipc_close_mem_handle(m->base);
		cu->ctx_pop_current(&popped);
	}
	cu->primary_ctx_release(m->dev);
	free(m);
}

/*
 * The pool's mapping in this process. A handle can be opened once per
 * process, so slices of one pool share the mapping.
 */
static int map_get(const struct rdmax_cuda *cu, struct client_gpu *g, CUdevice dev,
		   uint64_t pool_id, const uint8_t *handle, struct pool_map **ret_map)
{
	CUipcMemHandle h;
	CUcontext popped;
	struct pool_map *m;
	CUresult r;

	for (m = g->maps; m; m = m->next) {
		if (m->pool_id == pool_id && m->dev == dev &&
		    memcmp(m->handle, handle, sizeof(m->handle)) == 0) {
			m->refs++;
			*ret_map = m;
			return 0;
		}
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		return -ENOMEM;
	}
	m->pool_id = pool_id;
	m->dev = dev;
	memcpy(m->handle, handle, sizeof(m->handle));
	memcpy(&h, handle, sizeof(h));
	/* The application's current context is left alone: the mapping lives in the primary one. */
	if (cu->primary_ctx_retain(&m->ctx, dev) != CUDA_SUCCESS) {
		free(m);
		return -EIO;
	}
	if (cu->ctx_push_current(m->ctx) != CUDA_SUCCESS) {
		cu->primary_ctx_release(dev);
		free(m);
		return -EIO;
	}
	r = cu->ipc_open_mem_handle(&m->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	cu->ctx_pop_current(&popped);
	if (r != CUDA_SUCCESS) {
		cu->primary_ctx_release(dev);
		free(m);
		return -EIO;
	}
	m->refs = 1;
	m->next = g->maps;
	g->maps = m;
	*ret_map = m;
	return 0;
}

RDMAX_EXPORT int rdmax_region_alloc_gpu(struct rdmax_client *client, int cuda_device,
					uint64_t length, uint32_t access,
					struct rdmax_region **ret_region)
{
	Rdmax__V1__PoolAlloc pa = RDMAX__V1__POOL_ALLOC__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	const uint32_t known = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	const struct rdmax_cuda *cu;
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	Rdmax__V1__DaemonMsg *reply;
	struct rdmax_region *region;
	struct pool_map *map;
	struct client_gpu *g;
	CUdevice dev;
	int r;

	if (!client || !ret_region) {
		return -EINVAL;
	}
	if (cuda_device < 0 || length == 0 || (access & ~known)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	r = get_cuda(client, &cu);
	if (r < 0) {
		return r;
	}
	g = gpu_state(client);
	if (cu->device_get(&dev, cuda_device) != CUDA_SUCCESS ||
	    cu->device_get_pci_bus_id(bus_id, sizeof(bus_id), dev) != CUDA_SUCCESS) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	bus_id[sizeof(bus_id) - 1] = '\0';
	pa.pool_id = 0;
	pa.length = length;
	pa.access = access;
	pa.gpu_bus_id = bus_id;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_POOL_ALLOC;
	msg.pool_alloc = &pa;
	r = client_region_request(client, &msg, -1, length, NULL, &region, &reply);
	if (r < 0) {
		return r;
	}
	const Rdmax__V1__RegionReply *rep = reply->region;
	if (!rep->has_cuda_ipc_handle || rep->cuda_ipc_handle.len != RDMAX_CUDA_IPC_HANDLE_SIZE ||
	    !rep->has_pool_offset) {
		r = RDMAX_E_PROTOCOL_ERROR;
		goto out_deregister;
	}
	r = map_get(cu, g, dev, rep->has_pool_id ? rep->pool_id : 0, rep->cuda_ipc_handle.data,
		    &map);
	if (r < 0) {
		goto out_deregister;
	}
	client_region_set_addr(region, (void *)(uintptr_t)(map->base + rep->pool_offset));
	r = remember(g, region, NULL, map);
	if (r < 0) {
		map_put(cu, g, map);
		goto out_deregister;
	}
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	client_region_set_allocated(region);
	*ret_region = region;
	return 0;

out_deregister:
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	rdmax_region_deregister(client, region);
	return r;
}

void client_gpu_region_freed(struct rdmax_client *c, struct rdmax_region *region)
{
	struct client_gpu *g = *client_gpu_slot(c);

	if (!g) {
		return;
	}
	for (struct gpu_reg **pp = &g->regs; *pp; pp = &(*pp)->next) {
		struct gpu_reg *r = *pp;
		if (r->region != region) {
			continue;
		}
		*pp = r->next;
		if (r->map) {
			map_put(g->cuda, g, r->map);
		}
		free(r);
		return;
	}
}

void client_gpu_free(struct rdmax_client *c)
{
	struct client_gpu **slot = client_gpu_slot(c);
	struct client_gpu *g = *slot;

	if (!g) {
		return;
	}
	/* Regions were freed first; whatever is left was never attached to one. */
	while (g->regs) {
		struct gpu_reg *r = g->regs;
		g->regs = r->next;
		if (r->map) {
			map_put(g->cuda, g, r->map);
		}
		free(r);
	}
	free(g);
	*slot = NULL;
}
