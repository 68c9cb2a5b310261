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
 * address reuse) is checked here before anything is sent. Every CUDA call
 * runs in the primary context of the memory's device and leaves the
 * caller's context as it found it. Never logs; all CUDA calls go through
 * the table so that the unit tests can drive every branch with a fake
 * driver.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "internal.h"

/* How a GPU registration reached the daemon. */
enum reg_path {
	PATH_NONE,   /* pool slices */
	PATH_DMABUF, /* a dma-buf the daemon holds */
	PATH_IPC,    /* a CUDA IPC handle (peermem) */
};

/* One GPU registration of this client. */
struct gpu_reg {
	struct gpu_reg *next;
	struct rdmax_region *region;
	CUdeviceptr base; /* the allocation holding the region (0 when not cuMemAlloc memory) */
	size_t size;
	uint64_t buffer_id;
	enum reg_path path;
	bool shared_export;   /* the daemon holds a dma-buf of the whole allocation */
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

/* What CUDA says about the memory behind a pointer. */
struct alloc_info {
	CUdeviceptr base; /* legacy: the allocation */
	size_t size;
	uint64_t buffer_id;
	CUdevice dev;
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	/*
	 * cuMemAlloc memory: the whole allocation is exported and shared by its
	 * regions, and a CUDA IPC handle is the fallback. Everything else
	 * (cuMemCreate/cuMemMap, cudaMallocAsync pools, pinned host memory)
	 * exports the page-aligned range of the region itself: for VMM memory
	 * cuMemGetAddressRange names only the mapping around the pointer.
	 */
	bool legacy;
	bool host;   /* cuMemHostAlloc memory */
	bool dmabuf; /* the device can export this kind as a dma-buf */
	bool c2c;    /* a Grace system: ask for a dma-buf mapped through PCIe BAR1 */
};

/* The primary context of the pointer's device, current for the CUDA calls. */
struct ctx_guard {
	CUdevice dev;
	bool retained;
	bool pushed;
};

static int ctx_enter(const struct rdmax_cuda *cu, int ordinal, struct ctx_guard *g)
{
	CUcontext ctx;

	memset(g, 0, sizeof(*g));
	if (cu->device_get(&g->dev, ordinal) != CUDA_SUCCESS ||
	    cu->primary_ctx_retain(&ctx, g->dev) != CUDA_SUCCESS) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	g->retained = true;
	if (cu->ctx_push_current(ctx) != CUDA_SUCCESS) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	g->pushed = true;
	return 0;
}

/* Restores the caller's context (none, or its own). */
static void ctx_leave(const struct rdmax_cuda *cu, struct ctx_guard *g)
{
	CUcontext popped;

	if (g->pushed) {
		cu->ctx_pop_current(&popped);
	}
	if (g->retained) {
		cu->primary_ctx_release(g->dev);
	}
	g->pushed = g->retained = false;
}

static int client_attr(const struct rdmax_cuda *cu, CUpointer_attribute attr, CUdeviceptr ptr)
{
	int v = 0;

	return cu->pointer_get_attribute(&v, attr, ptr) == CUDA_SUCCESS ? v : -1;
}

static int dev_attr(const struct rdmax_cuda *cu, CUdevice_attribute attr, CUdevice dev)
{
	int v = 0;

	return cu->device_get_attribute(&v, attr, dev) == CUDA_SUCCESS ? v : 0;
}

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

/* Memory type and device: answered without a current context. */
static int locate(const struct rdmax_cuda *cu, CUdeviceptr ptr, bool *ret_host, int *ret_ordinal)
{
	unsigned int memtype = 0;
	int ordinal = -1;

	if (cu->pointer_get_attribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) !=
		    CUDA_SUCCESS ||
	    (memtype != CU_MEMORYTYPE_DEVICE && memtype != CU_MEMORYTYPE_HOST) ||
	    cu->pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) !=
		    CUDA_SUCCESS ||
	    ordinal < 0) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	*ret_host = memtype == CU_MEMORYTYPE_HOST;
	*ret_ordinal = ordinal;
	return 0;
}

/* The rest, with the device's primary context current. */
static int describe(const struct rdmax_cuda *cu, CUdeviceptr ptr, bool host, CUdevice dev,
		    struct alloc_info *ret_info)
{
	struct alloc_info a;
	unsigned long long id = 0;
	void *mempool = NULL;

	memset(&a, 0, sizeof(a));
	a.dev = dev;
	a.host = host;
	/* Managed memory answers DEVICE or HOST by where its pages are now. */
	if (client_attr(cu, CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr) == 1) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	if (cu->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CUDA_SUCCESS ||
	    cu->device_get_pci_bus_id(a.bus_id, sizeof(a.bus_id), dev) != CUDA_SUCCESS) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	a.bus_id[sizeof(a.bus_id) - 1] = '\0';
	a.buffer_id = id;
	if (cu->pointer_get_attribute(&mempool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr) !=
	    CUDA_SUCCESS) {
		mempool = NULL;
	}
	/*
	 * VMM memory answers 0; cudaMallocAsync memory is not legacy either,
	 * whatever the attribute says, and cuIpcGetMemHandle decides at last.
	 */
	a.legacy = !host && !mempool &&
		   client_attr(cu, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr) == 1;
	if (a.legacy &&
	    (cu->mem_get_address_range(&a.base, &a.size, ptr) != CUDA_SUCCESS || a.size == 0)) {
		return RDMAX_E_GPU_NOT_DEVICE_MEMORY;
	}
	a.dmabuf = dev_attr(cu,
			    host ? CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED
				 : CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
			    dev) != 0;
	/* NVLink-C2C to the CPU: GH200, GB200. */
	a.c2c = dev_attr(cu, CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, dev) != 0;
	*ret_info = a;
	return 0;
}

/*
 * A registered allocation whose range the new one overlaps under another
 * buffer id was freed while registered: its region still names memory that
 * is no longer the application's. Only cuMemAlloc memory is tracked.
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

/* A live registration whose dma-buf of this allocation the daemon holds. */
static bool daemon_has_export(const struct client_gpu *g, const struct alloc_info *a)
{
	for (const struct gpu_reg *r = g->regs; r; r = r->next) {
		if (r->shared_export && r->buffer_id == a->buffer_id && r->base == a->base &&
		    r->size == a->size) {
			return true;
		}
	}
	return false;
}

/*
 * Export [start, start + size) as a dma-buf; both page aligned. On Grace
 * the NIC needs the PCIe BAR1 mapping, which drivers before CUDA 12.8 do
 * not know how to ask for: then the export is retried without the flag.
 */
static CUresult export_range(const struct rdmax_cuda *cu, const struct alloc_info *a,
			     CUdeviceptr start, uint64_t size, int *ret_fd)
{
	int fd = -1;
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;

	if (a->c2c) {
		r = cu->mem_get_handle_for_address_range(
			&fd, start, (size_t)size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
			CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
	}
	if (r != CUDA_SUCCESS) {
		fd = -1;
		r = cu->mem_get_handle_for_address_range(&fd, start, (size_t)size,
							 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	}
	if (r == CUDA_SUCCESS && fd < 0) {
		r = CUDA_ERROR_INVALID_VALUE;
	}
	*ret_fd = r == CUDA_SUCCESS ? fd : -1;
	return r;
}

static int remember(struct client_gpu *g, struct rdmax_region *region, const struct alloc_info *a,
		    enum reg_path path, bool shared_export, struct pool_map *map)
{
	struct gpu_reg *r = calloc(1, sizeof(*r));

	if (!r) {
		return -ENOMEM;
	}
	r->region = region;
	if (a) {
		r->base = a->legacy ? a->base : 0;
		r->size = a->legacy ? a->size : 0;
		r->buffer_id = a->buffer_id;
	}
	r->path = path;
	r->shared_export = shared_export;
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

/* The dma-buf path: the daemon's copy of the allocation's dma-buf, or a new export. */
static int register_dmabuf(struct rdmax_client *c, const struct rdmax_cuda *cu,
			   const struct alloc_info *a, CUdeviceptr ptr,
			   Rdmax__V1__RegisterRegion *rr, bool *ret_shared,
			   struct rdmax_region **ret_region)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct client_gpu *g = gpu_state(c);
	CUdeviceptr start;
	uint64_t size;
	int fd = -1, r;

	rr->kind = RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF;
	if (a->legacy && daemon_has_export(g, a)) {
		/* No fd: the daemon finds the dma-buf by buffer id. */
		rr->has_fd_index = 0;
		rr->offset = ptr - a->base;
		r = send_register(c, rr, -1, rr->length, (void *)(uintptr_t)ptr, ret_region);
		if (r != RDMAX_E_NOT_FOUND) {
			*ret_shared = true;
			return r;
		}
	}
	if (a->legacy) {
		if (a->base % page != 0) {
			return RDMAX_E_GPU_NOT_EXPORTABLE;
		}
		start = a->base;
		size = ((uint64_t)a->size + page - 1) & ~(page - 1);
	} else {
		start = ptr & ~(page - 1);
		size = ((ptr + rr->length + page - 1) & ~(page - 1)) - start;
	}
	CUresult cr = export_range(cu, a, start, size, &fd);
	if (cr != CUDA_SUCCESS) {
		return cr == CUDA_ERROR_NOT_SUPPORTED && a->legacy ? RDMAX_E_GPU_NO_DMABUF
								   : RDMAX_E_GPU_NOT_EXPORTABLE;
	}
	rr->has_fd_index = 1;
	rr->fd_index = 0;
	rr->offset = ptr - start; /* the region's place inside the exported range */
	r = send_register(c, rr, fd, rr->length, (void *)(uintptr_t)ptr, ret_region);
	/* The daemon holds its own reference to the dma-buf now (or refused it). */
	close(fd);
	*ret_shared = a->legacy;
	return r;
}

/* The peermem fallback: the daemon opens the allocation, nvidia_peermem pins it. */
static int register_ipc(struct rdmax_client *c, const struct rdmax_cuda *cu,
			const struct alloc_info *a, CUdeviceptr ptr, Rdmax__V1__RegisterRegion *rr,
			struct rdmax_region **ret_region)
{
	CUipcMemHandle handle;

	if (!a->legacy || cu->ipc_get_mem_handle(&handle, a->base) != CUDA_SUCCESS) {
		return RDMAX_E_GPU_NOT_EXPORTABLE;
	}
	rr->kind = RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC;
	rr->has_fd_index = 0;
	rr->offset = ptr - a->base;
	rr->has_cuda_ipc_handle = 1;
	rr->cuda_ipc_handle.data = (uint8_t *)&handle;
	rr->cuda_ipc_handle.len = sizeof(handle);
	return send_register(c, rr, -1, rr->length, (void *)(uintptr_t)ptr, ret_region);
}

RDMAX_EXPORT int rdmax_region_register_gpu(struct rdmax_client *client, void *dev_ptr,
					   uint64_t length, uint32_t access,
					   struct rdmax_region **ret_region)
{
	Rdmax__V1__RegisterRegion rr = RDMAX__V1__REGISTER_REGION__INIT;
	const uint32_t known = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	const struct rdmax_cuda *cu = NULL;
	struct ctx_guard ctx;
	struct client_gpu *g;
	struct rdmax_region *region = NULL;
	struct alloc_info a;
	CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)dev_ptr;
	enum reg_path path = PATH_NONE;
	bool shared = false, host = false;
	uint32_t caps;
	int ordinal = -1, r;

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
	r = locate(cu, ptr, &host, &ordinal);
	if (r < 0) {
		return r;
	}
	/* Whatever the calling thread has current (nothing, or another device) comes back. */
	r = ctx_enter(cu, ordinal, &ctx);
	if (r < 0) {
		goto out;
	}
	r = describe(cu, ptr, host, ctx.dev, &a);
	if (r < 0) {
		goto out;
	}
	if (a.legacy && ptr + length > a.base + a.size) {
		r = RDMAX_E_OUT_OF_RANGE;
		goto out;
	}
	if (a.legacy && find_reused(g, &a)) {
		r = RDMAX_E_GPU_ADDRESS_REUSED;
		goto out;
	}
	/* VMM memory made without the GPUDirect RDMA flag cannot be pinned by the NIC. */
	if (!a.legacy && !host &&
	    client_attr(cu, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, ptr) != 1) {
		r = RDMAX_E_GPU_NOT_EXPORTABLE;
		goto out;
	}

	/*
	 * The NIC reads and writes GPU memory behind CUDA's back: synchronous
	 * copies into the allocation must have finished when they return.
	 * VMM and pool memory do not take the attribute (docs/gpu.md).
	 */
	unsigned int one = 1;
	if (cu->pointer_set_attribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr) !=
		    CUDA_SUCCESS &&
	    a.legacy) {
		r = RDMAX_E_GPU_NOT_EXPORTABLE;
		goto out;
	}
	rr.access = access;
	rr.length = length;
	rr.gpu_bus_id = a.bus_id;
	rr.has_gpu_buffer_id = 1;
	rr.gpu_buffer_id = a.buffer_id;
	r = RDMAX_E_GPU_NO_DMABUF;
	if ((caps & RDMAX_CAP_DMABUF) && a.dmabuf) {
		r = register_dmabuf(client, cu, &a, ptr, &rr, &shared, &region);
		path = PATH_DMABUF;
	} else if (!a.legacy && !host && (caps & RDMAX_CAP_DMABUF)) {
		r = RDMAX_E_GPU_NOT_EXPORTABLE;
	}
	/*
	 * Any failure of the dma-buf path (the export, or the daemon's
	 * registration with the NIC) falls back to peermem, as NCCL does.
	 */
	if ((r == RDMAX_E_GPU_NO_DMABUF || r == RDMAX_E_GPU_NOT_EXPORTABLE) && a.legacy &&
	    (caps & RDMAX_CAP_PEERMEM)) {
		r = register_ipc(client, cu, &a, ptr, &rr, &region);
		path = PATH_IPC;
		shared = false;
	}
	if (r < 0) {
		goto out;
	}
	r = remember(g, region, &a, path, shared, NULL);
	if (r < 0) {
		ctx_leave(cu, &ctx);
		rdmax_region_deregister(client, region);
		return r;
	}
	*ret_region = region;
out:
	ctx_leave(cu, &ctx);
	return r;
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
	if (r == CUDA_SUCCESS) {
		/*
		 * This process's synchronous copies into its slices must have
		 * finished when they return, as for registered memory. Best
		 * effort: a mapping that refuses it is documented.
		 */
		unsigned int one = 1;
		cu->pointer_set_attribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, m->base);
	}
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
	r = remember(g, region, NULL, PATH_NONE, false, map);
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
