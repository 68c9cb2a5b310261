/* SPDX-License-Identifier: MIT */
/*
 * GPU memory in the daemon: the module object, the validation of GPU regions
 * before any device sees them (a real dma-buf, ranges inside it, the GPU's
 * BAR1 budget, the configured registration path), the sharing of one
 * dma-buf per client allocation, the CUDA driver table of the peermem path
 * and of the pools (libcuda through dlopen, loaded only when one of them
 * needs it, so nodes without GPUs run the same binary), the CUDA IPC mappings
 * it opened, the flush of GPUDirect RDMA writes, and the MR plans handed to
 * the verbs transport. Pools and their slices are in gpu_pool.c, the
 * GPU-to-NIC topology read from sysfs in gpu_topo.c.
 *
 * Never calls verbs: it tells the verbs transport what to register on each
 * device (gpu_mr_plan) and gpu_verbs.c executes that. Never touches GPU
 * memory contents. Keeps a client's dma-buf fd only while regions of that
 * allocation are registered (one export and one BAR1 charge per allocation);
 * loads CUDA for the dma-buf path only to flush writes where a GPU needs it.
 * Everything that can be known at registration is refused there with a
 * named error and a hint, never left to fail at the first transfer.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "gpu.h"
#include "gpu_internal.h"
#include "log.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "util.h"

/* <linux/magic.h>: the dma-buf pseudo file system (Linux 5.3 and later). */
#define DMA_BUF_FS_MAGIC 0x444d4142

void gpu_set_why(char *why, size_t why_size, const char *fmt, ...)
{
	va_list ap;

	if (!why || why_size == 0) {
		return;
	}
	va_start(ap, fmt);
	vsnprintf(why, why_size, fmt, ap);
	va_end(ap);
}

/* CUDA prints bus ids in upper case, sysfs in lower: keep one spelling. */
void gpu_lower_bus_id(char *dst, const char *src)
{
	size_t i = 0;

	for (; src && src[i] && i < RDMAX_CUDA_BUS_ID_MAX - 1; i++) {
		dst[i] = (char)tolower((unsigned char)src[i]);
	}
	dst[i] = '\0';
}

/* ---------------------------------------------------------------- module */

int gpu_create(const struct gpu_params *params, struct gpu **ret_gpu)
{
	struct gpu *gpu = calloc(1, sizeof(*gpu));
	int ret;

	if (!gpu) {
		return -ENOMEM;
	}
	gpu->p = *params;
	snprintf(gpu->sysfs_root, sizeof(gpu->sysfs_root), "%s",
		 gpu_root_or_default(params->sysfs_root));
	gpu->p.sysfs_root = gpu->sysfs_root;
	if (params->cuda_library) {
		snprintf(gpu->cuda_library, sizeof(gpu->cuda_library), "%s", params->cuda_library);
		gpu->p.cuda_library = gpu->cuda_library;
	}
	gpu->cuda = params->cuda;
	gpu->peermem = gpu_peermem_loaded(gpu->sysfs_root);
	ret = gpu_topology_scan(gpu->sysfs_root, &gpu->topo);
	if (ret < 0) {
		free(gpu);
		return ret;
	}
	*ret_gpu = gpu;
	return 0;
}

uint32_t gpu_capabilities(const struct gpu *gpu)
{
	uint32_t caps = 0;

	if (!gpu || !gpu->p.verbs) {
		return 0;
	}
	if (gpu->p.mode != CONFIG_GPU_REG_PEERMEM && gpu->p.dmabuf) {
		caps |= RDMAX_CAP_DMABUF;
	}
	if (gpu->p.mode != CONFIG_GPU_REG_DMABUF && gpu->peermem) {
		caps |= RDMAX_CAP_PEERMEM;
	}
	return caps;
}

const struct gpu_topology *gpu_topology(const struct gpu *gpu)
{
	return gpu ? &gpu->topo : NULL;
}

/* The driver table, loading libcuda the first time the daemon needs CUDA. */
int gpu_get_cuda(struct gpu *gpu, char *why, size_t why_size)
{
	if (!gpu->cuda && !gpu->cuda_why) {
		const char *reason = NULL;
		int r = rdmax_cuda_load(gpu->p.cuda_library, &gpu->loaded, &reason);
		if (r < 0) {
			gpu->cuda_why = reason ? reason : "cannot load libcuda.so.1";
			log_warn("CUDA driver unavailable: %s", gpu->cuda_why);
		} else {
			gpu->cuda = &gpu->loaded;
			log_info("CUDA driver loaded%s",
				 gpu->loaded.via_get_proc_address ? " (cuGetProcAddress)" : "");
		}
	}
	if (!gpu->cuda) {
		gpu_set_why(why, why_size, "the daemon cannot use CUDA: %s", gpu->cuda_why);
		return RDMAX_E_GPU_DRIVER_MISSING;
	}
	return 0;
}

/* The GPU's CUDA device and primary context, retained once per daemon. */
int gpu_get_cdev(struct gpu *gpu, const char *bus_id, struct gpu_cuda_dev **ret_cdev, char *why,
		 size_t why_size)
{
	const struct rdmax_cuda *cu = gpu->cuda;
	struct gpu_cuda_dev *cd;
	CUresult r;

	for (uint32_t i = 0; i < gpu->n_cdevs; i++) {
		if (strcasecmp(gpu->cdevs[i].bus_id, bus_id) == 0) {
			*ret_cdev = &gpu->cdevs[i];
			return 0;
		}
	}
	if (gpu->n_cdevs >= GPU_MAX) {
		gpu_set_why(why, why_size, "more than %d GPUs in use", GPU_MAX);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	cd = &gpu->cdevs[gpu->n_cdevs];
	memset(cd, 0, sizeof(*cd));
	gpu_lower_bus_id(cd->bus_id, bus_id);
	r = cu->device_get_by_pci_bus_id(&cd->dev, bus_id);
	if (r != CUDA_SUCCESS) {
		gpu_set_why(why, why_size,
			    "no GPU with PCI bus id '%s' is visible to the daemon (%s)", bus_id,
			    rdmax_cuda_error_name(cu, r));
		return RDMAX_E_INVALID_ARGUMENT;
	}
	r = cu->primary_ctx_retain(&cd->ctx, cd->dev);
	if (r != CUDA_SUCCESS) {
		gpu_set_why(why, why_size, "cuDevicePrimaryCtxRetain() on GPU '%s' failed: %s",
			    bus_id, rdmax_cuda_error_name(cu, r));
		return -EIO;
	}
	gpu->n_cdevs++;
	*ret_cdev = cd;
	return 0;
}

bool gpu_push_ctx(const struct gpu *gpu, const struct gpu_cuda_dev *cd)
{
	return gpu->cuda->ctx_push_current(cd->ctx) == CUDA_SUCCESS;
}

void gpu_pop_ctx(const struct gpu *gpu)
{
	CUcontext popped;

	gpu->cuda->ctx_pop_current(&popped);
}

static void close_mapping(struct gpu *gpu, struct gpu_cuda_dev *cd, CUdeviceptr mapped)
{
	if (!mapped || !gpu->cuda) {
		return;
	}
	if (gpu_push_ctx(gpu, cd)) {
		CUresult r = gpu->cuda->ipc_close_mem_handle(mapped);
		if (r != CUDA_SUCCESS) {
			log_warn("cuIpcCloseMemHandle() on GPU '%s' failed: %s", cd->bus_id,
				 rdmax_cuda_error_name(gpu->cuda, r));
		}
		gpu_pop_ctx(gpu);
	}
}

int gpu_topo_index(const struct gpu *gpu, const char *bus_id)
{
	const struct gpu_dev *gd = gpu_topology_find(&gpu->topo, bus_id);

	return gd ? (int)(gd - gpu->topo.gpus) : -1;
}

/* BAR1 is where the NIC reaches GPU memory: refuse what cannot fit in it. */
int gpu_check_bar1(const struct gpu *gpu, int index, uint64_t charge, char *why, size_t why_size)
{
	const struct gpu_dev *gd;

	if (index < 0) {
		return 0;
	}
	gd = &gpu->topo.gpus[index];
	if (gd->bar1_bytes == 0 ||
	    charge <= gd->bar1_bytes - MIN(gd->bar1_bytes, gpu->bar1_used[index])) {
		return 0;
	}
	gpu_set_why(why, why_size,
		    "%" PRIu64 " bytes do not fit the BAR1 space of GPU '%s' (%" PRIu64
		    " bytes, %" PRIu64 " in use by registered regions); register smaller "
		    "allocations or enable resizable BAR",
		    charge, gd->bus_id, gd->bar1_bytes, gpu->bar1_used[index]);
	return RDMAX_E_GPU_TOO_LARGE;
}

void gpu_link_region(struct gpu *gpu, struct gpu_region *gr)
{
	gpu->buses_stale = true;
	gr->prev = NULL;
	gr->next = gpu->regions;
	if (gpu->regions) {
		gpu->regions->prev = gr;
	}
	gpu->regions = gr;
}

static void unlink_region(struct gpu *gpu, struct gpu_region *gr)
{
	gpu->buses_stale = true;
	if (gr->prev) {
		gr->prev->next = gr->next;
	} else if (gpu->regions == gr) {
		gpu->regions = gr->next;
	}
	if (gr->next) {
		gr->next->prev = gr->prev;
	}
	gr->prev = gr->next = NULL;
}

/* The last region of an allocation went: its MRs are gone, the dma-buf and its charge go. */
static void dmabuf_put(struct gpu *gpu, struct gpu_dmabuf *db)
{
	if (--db->users > 0) {
		return;
	}
	for (struct gpu_dmabuf **pp = &gpu->dmabufs; *pp; pp = &(*pp)->next) {
		if (*pp == db) {
			*pp = db->next;
			break;
		}
	}
	if (db->topo_index >= 0) {
		gpu->bar1_used[db->topo_index] -=
			MIN(gpu->bar1_used[db->topo_index], db->bar1_charge);
	}
	close(db->fd);
	free(db);
}

static struct gpu_dmabuf *dmabuf_find(struct gpu *gpu, void *owner, uint64_t buffer_id,
				      const char *bus_id)
{
	for (struct gpu_dmabuf *db = gpu->dmabufs; db; db = db->next) {
		if (db->owner == owner && db->buffer_id == buffer_id &&
		    strcasecmp(db->bus_id, bus_id ? bus_id : "") == 0) {
			return db;
		}
	}
	return NULL;
}

/* region->fini: after the devices let go of the memory. */
static void gpu_region_fini(struct region *region)
{
	struct gpu_region *gr = region->gpu;
	struct gpu *gpu;

	if (!gr) {
		return;
	}
	gpu = gr->gpu;
	if (gr->mapped) {
		close_mapping(gpu, gr->cdev, gr->mapped);
	}
	if (gr->topo_index >= 0) {
		gpu->bar1_used[gr->topo_index] -=
			MIN(gpu->bar1_used[gr->topo_index], gr->bar1_charge);
	}
	if (gr->dmabuf) {
		dmabuf_put(gpu, gr->dmabuf);
		gr->dmabuf = NULL;
	}
	if (gr->slice) {
		gpu_pool_free_range(gr->pool, gr->slice_offset, gr->slice_length);
		gr->pool->leased -= gr->slice_length;
		gr->pool->slices--;
	} else if (gr->pool) {
		/* The pool's own registration went; its memory stays until gpu_destroy(). */
		gr->pool->region = NULL;
	}
	unlink_region(gpu, gr);
	region->gpu = NULL;
	region->fini = NULL;
	free(gr);
}

/* Fresh region + gpu_region pair, not yet registered. */
struct region *gpu_new_region(struct gpu *gpu, enum region_kind kind, void *owner, uint64_t length,
			      uint32_t access, struct gpu_region **ret_gr)
{
	struct region *region = calloc(1, sizeof(*region));
	struct gpu_region *gr = calloc(1, sizeof(*gr));

	if (!region || !gr) {
		free(region);
		free(gr);
		return NULL;
	}
	gr->gpu = gpu;
	gr->region = region;
	gr->fd = -1;
	gr->topo_index = -1;
	region->kind = kind;
	region->owner = owner;
	region->length = length;
	region->access = access;
	/* No host mapping; "writable" means the devices may write into it. */
	region->writable = true;
	region->gpu = gr;
	region->fini = gpu_region_fini;
	*ret_gr = gr;
	return region;
}

int gpu_check_dmabuf(int fd, uint64_t *ret_size)
{
	char link[64], target[256];
	struct statfs sfs;
	bool dmabuf = false;
	off_t size;
	ssize_t n;

	if (fd < 0) {
		return -EBADF;
	}
	if (fstatfs(fd, &sfs) < 0) {
		return -errno;
	}
	if ((unsigned long)sfs.f_type == DMA_BUF_FS_MAGIC) {
		dmabuf = true;
	} else {
		/* Kernels whose dma-bufs were anonymous inodes name them in /proc only. */
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		n = readlink(link, target, sizeof(target) - 1);
		if (n > 0) {
			target[n] = '\0';
			dmabuf = strncmp(target, "/dmabuf:", 8) == 0 ||
				 strncmp(target, "anon_inode:dmabuf", 17) == 0;
		}
	}
	if (!dmabuf) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/* dma-bufs answer SEEK_END with their size. */
	size = lseek(fd, 0, SEEK_END);
	if (size < 0) {
		return -errno;
	}
	lseek(fd, 0, SEEK_SET);
	*ret_size = (uint64_t)size;
	return 0;
}

/*
 * The dma-buf half of gpu_register(): the client's dma-buf (a new one to
 * keep, with its BAR1 charge) or the one of the allocation it named.
 */
static int check_dmabuf_req(struct gpu *gpu, void *owner, const struct gpu_reg_req *req,
			    struct gpu_dmabuf **ret_db, bool *ret_new, char *why, size_t why_size)
{
	struct gpu_dmabuf *db;
	uint64_t size = 0;
	int ret;

	if (gpu->p.mode == CONFIG_GPU_REG_PEERMEM) {
		gpu_set_why(why, why_size,
			    "dma-buf registration is turned off ([gpu] registration = peermem)");
		return RDMAX_E_GPU_NO_DMABUF;
	}
	if (!gpu->p.dmabuf) {
		gpu_set_why(why, why_size,
			    "no RDMA device of this daemon can register dma-bufs (that needs Linux "
			    "5.12+, rdma-core 34+ and a NIC driver with dma-buf support)%s",
			    gpu->peermem ? ""
					 : "; nvidia_peermem, the fallback, is not loaded either");
		return RDMAX_E_GPU_NO_DMABUF;
	}
	if (req->fd < 0) {
		db = req->buffer_id ? dmabuf_find(gpu, owner, req->buffer_id, req->bus_id) : NULL;
		if (!db) {
			gpu_set_why(why, why_size,
				    "this client holds no registered dma-buf of buffer %" PRIu64
				    " on GPU '%s' (send the fd)",
				    req->buffer_id, req->bus_id ? req->bus_id : "");
			return RDMAX_E_NOT_FOUND;
		}
		if (req->offset > db->size || req->length > db->size - req->offset) {
			gpu_set_why(why, why_size,
				    "offset %" PRIu64 " and length %" PRIu64
				    " reach past the end of the %" PRIu64 "-byte dma-buf",
				    req->offset, req->length, db->size);
			return RDMAX_E_OUT_OF_RANGE;
		}
		*ret_db = db;
		*ret_new = false;
		return 0;
	}
	ret = gpu->p.check_dmabuf ? gpu->p.check_dmabuf(req->fd, &size)
				  : gpu_check_dmabuf(req->fd, &size);
	if (ret == RDMAX_E_INVALID_ARGUMENT) {
		gpu_set_why(why, why_size,
			    "the fd is not a dma-buf (a GPU_DMABUF region carries the fd that "
			    "cuMemGetHandleForAddressRange() exported)");
		return ret;
	}
	if (ret < 0) {
		gpu_set_why(why, why_size, "cannot inspect the fd: %s", strerror(-ret));
		return ret;
	}
	if (req->offset > size || req->length > size - req->offset) {
		gpu_set_why(why, why_size,
			    "offset %" PRIu64 " and length %" PRIu64
			    " reach past the end of the %" PRIu64 "-byte dma-buf",
			    req->offset, req->length, size);
		return RDMAX_E_OUT_OF_RANGE;
	}
	db = calloc(1, sizeof(*db));
	if (!db) {
		gpu_set_why(why, why_size, "out of memory");
		return -ENOMEM;
	}
	/* The message's fds are closed after the request: keep a reference of our own. */
	db->fd = fcntl(req->fd, F_DUPFD_CLOEXEC, 0);
	if (db->fd < 0) {
		ret = -errno;
		free(db);
		gpu_set_why(why, why_size, "cannot keep the dma-buf: %s", strerror(-ret));
		return ret;
	}
	db->owner = owner;
	db->buffer_id = req->buffer_id;
	gpu_lower_bus_id(db->bus_id, req->bus_id);
	db->size = size;
	db->topo_index = gpu_topo_index(gpu, db->bus_id);
	/* The exporter maps the whole buffer through BAR1 for the NIC. */
	db->bar1_charge = size;
	*ret_db = db;
	*ret_new = true;
	return 0;
}

/*
 * The client names the GPU; the daemon checks the name: a PCI bus id of an
 * NVIDIA GPU of this node (when sysfs shows any), so that BAR1 is charged to
 * the GPU that exists. For peermem the opened memory's device is compared too.
 */
static int check_bus_id(const struct gpu *gpu, const char *bus_id, char *why, size_t why_size)
{
	unsigned int dom, bus, dev, fn;
	int n = 0;

	if (!bus_id || !bus_id[0]) {
		if (gpu->topo.n_gpus == 0) {
			return 0;
		}
		gpu_set_why(why, why_size, "a GPU region needs the PCI bus id of its GPU");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (strlen(bus_id) != 12 ||
	    sscanf(bus_id, "%4x:%2x:%2x.%1x%n", &dom, &bus, &dev, &fn, &n) != 4 || n != 12) {
		gpu_set_why(why, why_size, "'%.32s' is not a PCI bus id (0000:3b:00.0)", bus_id);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (gpu->topo.n_gpus > 0 && !gpu_topology_find(&gpu->topo, bus_id)) {
		gpu_set_why(why, why_size, "no NVIDIA GPU with PCI bus id '%s' on this node",
			    bus_id);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	return 0;
}

/* The peermem half: open the client's allocation in the daemon. */
static int open_ipc_req(struct gpu *gpu, const struct gpu_reg_req *req, struct gpu_region *gr,
			char *why, size_t why_size)
{
	CUdeviceptr mapped = 0, base = 0;
	char mem_bus[RDMAX_CUDA_BUS_ID_MAX] = "";
	CUipcMemHandle handle;
	size_t size = 0;
	CUresult r;
	int ret;

	if (gpu->p.mode == CONFIG_GPU_REG_DMABUF) {
		gpu_set_why(why, why_size,
			    "peermem registration is turned off ([gpu] registration = dmabuf)");
		return RDMAX_E_GPU_NO_DMABUF;
	}
	if (!gpu->peermem) {
		gpu_set_why(
			why, why_size,
			"nvidia_peermem is not loaded (modprobe nvidia_peermem), and GPU memory "
			"registered from a CUDA IPC handle needs it");
		return RDMAX_E_GPU_NO_DMABUF;
	}
	if (!req->ipc_handle || req->ipc_handle_len != sizeof(handle) || !req->bus_id ||
	    !req->bus_id[0]) {
		gpu_set_why(
			why, why_size,
			"a GPU_CUDA_IPC region needs a %zu-byte CUDA IPC handle and the GPU's PCI "
			"bus id",
			sizeof(handle));
		return RDMAX_E_INVALID_ARGUMENT;
	}
	ret = check_bus_id(gpu, req->bus_id, why, why_size);
	if (ret < 0) {
		return ret;
	}
	ret = gpu_get_cuda(gpu, why, why_size);
	if (ret < 0) {
		return ret;
	}
	ret = gpu_get_cdev(gpu, req->bus_id, &gr->cdev, why, why_size);
	if (ret < 0) {
		return ret;
	}
	memcpy(&handle, req->ipc_handle, sizeof(handle));
	if (!gpu_push_ctx(gpu, gr->cdev)) {
		gpu_set_why(why, why_size, "cannot make GPU '%s' current", req->bus_id);
		return -EIO;
	}
	r = gpu->cuda->ipc_open_mem_handle(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (r == CUDA_SUCCESS &&
	    gpu->cuda->mem_get_address_range(&base, &size, mapped) != CUDA_SUCCESS) {
		size = 0;
	}
	if (r == CUDA_SUCCESS) {
		/* The GPU the memory is on, not the one the client named. */
		int ordinal = -1;
		CUdevice dev;
		if (gpu->cuda->pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
						     mapped) != CUDA_SUCCESS ||
		    gpu->cuda->device_get(&dev, ordinal) != CUDA_SUCCESS ||
		    gpu->cuda->device_get_pci_bus_id(mem_bus, sizeof(mem_bus), dev) !=
			    CUDA_SUCCESS) {
			mem_bus[0] = '\0';
		}
		mem_bus[sizeof(mem_bus) - 1] = '\0';
	}
	gpu_pop_ctx(gpu);
	if (r != CUDA_SUCCESS) {
		gpu_set_why(why, why_size, "cuIpcOpenMemHandle() on GPU '%s' failed: %s",
			    req->bus_id, rdmax_cuda_error_name(gpu->cuda, r));
		return RDMAX_E_INVALID_ARGUMENT;
	}
	gr->mapped = mapped;
	if (strcasecmp(mem_bus, gr->cdev->bus_id) != 0) {
		char low[RDMAX_CUDA_BUS_ID_MAX];
		gpu_lower_bus_id(low, mem_bus);
		gpu_set_why(why, why_size, "the memory of the handle is on GPU '%s', not on '%s'",
			    low[0] ? low : "?", gr->cdev->bus_id);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (req->offset > size || req->length > size - req->offset) {
		gpu_set_why(why, why_size,
			    "offset %" PRIu64 " and length %" PRIu64
			    " reach past the end of the %zu-byte allocation",
			    req->offset, req->length, size);
		return RDMAX_E_OUT_OF_RANGE;
	}
	gr->ptr = mapped + req->offset;
	return 0;
}

int gpu_register(struct gpu *gpu, struct region_table *table, void *owner,
		 const struct gpu_reg_req *req, char *why, size_t why_size,
		 struct region **ret_region)
{
	const uint32_t known = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct gpu_dmabuf *db = NULL;
	struct gpu_region *gr;
	struct region *region;
	uint64_t charge = 0;
	bool new_db = false;
	int ret;

	if (!gpu || !gpu->p.verbs) {
		gpu_set_why(why, why_size,
			    "GPU regions need an RDMA device with dma-buf support, and this daemon "
			    "runs without one (TCP transport only)");
		return RDMAX_E_GPU_NEEDS_RDMA;
	}
	if (req->kind != REGION_GPU_DMABUF && req->kind != REGION_GPU_CUDA_IPC) {
		gpu_set_why(why, why_size, "not a GPU region kind");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (req->length == 0 || (req->access & ~known)) {
		gpu_set_why(why, why_size, "zero length or unknown access bits");
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (req->offset > UINT64_MAX - req->length) {
		gpu_set_why(why, why_size, "offset and length overflow");
		return RDMAX_E_OUT_OF_RANGE;
	}
	region = gpu_new_region(gpu, req->kind, owner, req->length, req->access, &gr);
	if (!region) {
		gpu_set_why(why, why_size, "out of memory");
		return -ENOMEM;
	}
	gpu_lower_bus_id(gr->bus_id, req->bus_id);
	gr->buffer_id = req->buffer_id;
	gr->topo_index = gpu_topo_index(gpu, gr->bus_id);
	if (req->kind == REGION_GPU_DMABUF) {
		ret = check_dmabuf_req(gpu, owner, req, &db, &new_db, why, why_size);
		if (ret == 0) {
			ret = check_bus_id(gpu, req->bus_id, why, why_size);
		}
		if (ret == 0) {
			gr->dmabuf = db;
			charge = new_db ? db->bar1_charge : 0;
		}
		gr->dmabuf_offset = req->offset;
		/* The iova shares the page offset of the region in the dma-buf. */
		region->gpu_addr = req->offset;
	} else {
		ret = open_ipc_req(gpu, req, gr, why, why_size);
		/* nvidia_peermem pins the registered pages only. */
		charge = (req->length + page - 1) & ~(page - 1);
		region->gpu_addr = gr->ptr;
	}
	if (ret == 0) {
		ret = gpu_check_bar1(gpu, gr->topo_index, charge, why, why_size);
	}
	if (ret < 0) {
		goto out_free;
	}
	ret = region_insert(table, region);
	if (ret < 0) {
		gpu_set_why(why, why_size, "registration with the RDMA devices failed: %s",
			    rdmax_strerror(ret));
		goto out_free;
	}
	if (db) {
		/* The dma-buf carries the charge, once for all regions of the allocation. */
		if (new_db) {
			db->next = gpu->dmabufs;
			gpu->dmabufs = db;
			if (db->topo_index >= 0) {
				gpu->bar1_used[db->topo_index] += charge;
			}
		}
		db->users++;
	} else {
		if (gr->topo_index >= 0) {
			gpu->bar1_used[gr->topo_index] += charge;
		}
		gr->bar1_charge = charge;
	}
	gpu_link_region(gpu, gr);
	log_debug("GPU region %" PRIu64 " on '%s' (%s, buffer %" PRIu64 ", offset %" PRIu64
		  ", %" PRIu64 " bytes)",
		  region->id, gr->bus_id[0] ? gr->bus_id : "?",
		  req->kind == REGION_GPU_DMABUF ? "dma-buf" : "peermem", gr->buffer_id,
		  req->offset, region->length);
	*ret_region = region;
	return 0;

out_free:
	if (gr->mapped) {
		close_mapping(gpu, gr->cdev, gr->mapped);
	}
	if (new_db) {
		close(db->fd);
		free(db);
	}
	free(gr);
	free(region);
	return ret;
}

/* Does this GPU need cuFlushGPUDirectRDMAWrites? Asked once; no context needed. */
static int flush_state(struct gpu *gpu, const char *bus_id)
{
	const struct rdmax_cuda *cu = gpu->cuda;
	int ordering = 0, options = 0, state;
	CUdevice dev;
	uint32_t i;

	for (i = 0; i < gpu->n_flush; i++) {
		if (strcmp(gpu->flush[i].bus_id, bus_id) == 0) {
			return gpu->flush[i].state;
		}
	}
	if (cu->device_get_by_pci_bus_id(&dev, bus_id) != CUDA_SUCCESS) {
		log_warn("GPU '%s' is not visible to the daemon's CUDA: writes into it are not "
			 "flushed before imm counters fire",
			 bus_id);
		state = FLUSH_CANNOT;
	} else if (cu->device_get_attribute(&ordering,
					    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
					    dev) == CUDA_SUCCESS &&
		   ordering >= CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER) {
		state = FLUSH_NOT_NEEDED;
	} else if (cu->device_get_attribute(
			   &options, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
			   dev) == CUDA_SUCCESS &&
		   (options & CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST)) {
		state = FLUSH_NEEDED;
		log_info(
			"GPU '%s' does not order GPUDirect RDMA writes for its kernels: the daemon "
			"flushes them before an imm counter fires",
			bus_id);
	} else {
		log_warn(
			"GPU '%s' needs GPUDirect RDMA writes flushed but does not support "
			"cuFlushGPUDirectRDMAWrites: kernels may see stale data right after an imm "
			"counter fired",
			bus_id);
		state = FLUSH_CANNOT;
	}
	if (gpu->n_flush < GPU_MAX) {
		gpu_lower_bus_id(gpu->flush[gpu->n_flush].bus_id, bus_id);
		gpu->flush[gpu->n_flush].state = state;
		gpu->n_flush++;
	}
	return state;
}

int gpu_flush_writes(struct gpu *gpu)
{
	char(*buses)[RDMAX_CUDA_BUS_ID_MAX];
	uint32_t n = 0;
	int flushed = 0, err = 0;

	if (!gpu || !gpu->regions) {
		return 0;
	}
	buses = gpu->buses;
	if (gpu->buses_stale) {
		/* The GPUs holding registered memory (client regions, pools, slices). */
		for (const struct gpu_region *gr = gpu->regions; gr && n < GPU_MAX; gr = gr->next) {
			uint32_t k = 0;
			if (!gr->bus_id[0]) {
				continue;
			}
			while (k < n && strcmp(buses[k], gr->bus_id) != 0) {
				k++;
			}
			if (k == n) {
				snprintf(buses[n++], RDMAX_CUDA_BUS_ID_MAX, "%s", gr->bus_id);
			}
		}
		gpu->n_buses = n;
		gpu->buses_stale = false;
	}
	n = gpu->n_buses;
	if (n == 0) {
		return 0;
	}
	if (gpu_get_cuda(gpu, NULL, 0) < 0) {
		return RDMAX_E_GPU_DRIVER_MISSING;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct gpu_cuda_dev *cd;
		int state = flush_state(gpu, buses[i]);
		if (state == FLUSH_NOT_NEEDED) {
			continue;
		}
		if (state == FLUSH_CANNOT) {
			err = -EOPNOTSUPP;
			continue;
		}
		if (gpu_get_cdev(gpu, buses[i], &cd, NULL, 0) < 0 || !gpu_push_ctx(gpu, cd)) {
			err = -EIO;
			continue;
		}
		CUresult r = gpu->cuda->flush_gpu_direct_rdma_writes(
			CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
			CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
		gpu_pop_ctx(gpu);
		if (r != CUDA_SUCCESS) {
			log_warn("cuFlushGPUDirectRDMAWrites() on GPU '%s' failed: %s", buses[i],
				 rdmax_cuda_error_name(gpu->cuda, r));
			err = -EIO;
			continue;
		}
		flushed++;
	}
	return err ? err : flushed;
}

const char *gpu_region_bus_id(const struct region *region)
{
	const struct gpu_region *gr;

	if (!region || !region->gpu) {
		return NULL;
	}
	gr = region->gpu;
	return gr->slice ? gr->pool->bus_id : gr->bus_id;
}

bool gpu_region_shares_mrs(const struct region *region)
{
	const struct gpu_region *gr = region ? region->gpu : NULL;

	return gr && gr->slice;
}

int gpu_mr_plan(const struct region *region, uint32_t dev_index, uint64_t max_mr_size,
		bool dev_dmabuf, uint64_t iova, struct gpu_mr_plan *ret_plan)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	const struct gpu_region *gr = region ? region->gpu : NULL;
	struct gpu_mr_plan plan;

	if (!gr || dev_index >= REGION_MAX_DEVICES) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	memset(&plan, 0, sizeof(plan));
	plan.fd = -1;
	plan.length = region->length;
	if (gr->slice) {
		if (!gr->pool->region || !gr->pool->region->transport_data[dev_index]) {
			return -ENODEV;
		}
		plan.how = GPU_MR_SHARED;
		plan.shared = gr->pool->region->transport_data[dev_index];
		*ret_plan = plan;
		return 0;
	}
	if (max_mr_size && region->length > max_mr_size) {
		return RDMAX_E_GPU_TOO_LARGE;
	}
	if (region->kind == REGION_GPU_DMABUF) {
		if (!dev_dmabuf) {
			return RDMAX_E_GPU_NO_DMABUF;
		}
		plan.fd = gr->dmabuf ? gr->dmabuf->fd : gr->fd;
		if (plan.fd < 0) {
			/* A pool's fd lives only while the pool is being registered. */
			return RDMAX_E_INVALID_ARGUMENT;
		}
		if (iova % page != gr->dmabuf_offset % page) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		plan.how = GPU_MR_DMABUF;
		plan.offset = gr->dmabuf_offset;
	} else {
		plan.how = GPU_MR_ADDR;
		plan.addr = (void *)(uintptr_t)gr->ptr;
	}
	*ret_plan = plan;
	return 0;
}

/* -------------------------------------------------------- start and stop */

int gpu_start(struct rdmaxd *daemon, bool verbs, bool dmabuf, struct gpu **ret_gpu)
{
	struct gpu_params params = {
		.mode = daemon->cfg.gpu_registration,
		.pool_bytes = daemon->cfg.gpu_pool_bytes,
		.verbs = verbs,
		.dmabuf = dmabuf,
	};
	struct gpu *gpu;
	int ret;

	ret = gpu_create(&params, &gpu);
	if (ret < 0) {
		log_err("cannot set up GPU support: %s", strerror(-ret));
		return ret;
	}
	uint32_t caps = gpu_capabilities(gpu);
	log_info("GPU memory: %u GPU%s, registration %s (offered: %s%s%s)", gpu->topo.n_gpus,
		 gpu->topo.n_gpus == 1 ? "" : "s", config_gpu_registration_name(params.mode),
		 caps & RDMAX_CAP_DMABUF ? "dma-buf" : "",
		 (caps & RDMAX_CAP_DMABUF) && (caps & RDMAX_CAP_PEERMEM) ? ", " : "",
		 caps & RDMAX_CAP_PEERMEM ? "peermem" : (caps ? "" : "none"));
	ret = gpu_pools_start(gpu, &daemon->regions);
	if (ret < 0) {
		gpu_stop(gpu, &daemon->regions);
		gpu_destroy(gpu);
		return ret;
	}
	*ret_gpu = gpu;
	return 0;
}

void gpu_stop(struct gpu *gpu, struct region_table *table)
{
	for (uint32_t i = 0; gpu && i < gpu->n_pools; i++) {
		struct gpu_pool *pool = &gpu->pools[i];
		/* Leased slices use the pool's MRs: those go with the transport. */
		if (pool->region && pool->slices == 0) {
			region_deregister(table, pool->region, NULL, NULL);
		}
	}
}

void gpu_destroy(struct gpu *gpu)
{
	if (!gpu) {
		return;
	}
	/* Regions still registered are only freed from here on (no more hooks run). */
	while (gpu->regions) {
		struct gpu_region *gr = gpu->regions;
		if (gr->mapped) {
			close_mapping(gpu, gr->cdev, gr->mapped);
		}
		if (gr->region) {
			gr->region->gpu = NULL;
			gr->region->fini = NULL;
		}
		unlink_region(gpu, gr);
		free(gr);
	}
	while (gpu->dmabufs) {
		struct gpu_dmabuf *db = gpu->dmabufs;
		gpu->dmabufs = db->next;
		close(db->fd);
		free(db);
	}
	for (uint32_t i = 0; i < gpu->n_pools; i++) {
		struct gpu_pool *pool = &gpu->pools[i];
		if (pool->base && gpu->cuda && gpu_push_ctx(gpu, pool->cdev)) {
			gpu->cuda->mem_free(pool->base);
			gpu_pop_ctx(gpu);
		}
		gpu_pool_free_extents(pool);
	}
	for (uint32_t i = 0; i < gpu->n_cdevs; i++) {
		gpu->cuda->primary_ctx_release(gpu->cdevs[i].dev);
	}
	free(gpu);
}
