/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver of the unit tests (see fake_cuda.h). One fake is
 * current at a time: the driver API has no user pointer, like the real one.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda.h"

#define ALLOC_GRANULARITY (2u << 20) /* cuMemAlloc's: the export may round up to it */
#define MAPPING_OFFSET    (UINT64_C(1) << 44)

static struct fake_cuda *g_fake;

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

static struct fake_alloc *find(CUdeviceptr ptr)
{
	for (int i = 0; i < FAKE_CUDA_ALLOCS; i++) {
		struct fake_alloc *a = &g_fake->allocs[i];
		if (a->used && !a->freed && ptr >= a->base && ptr < a->base + a->size) {
			return a;
		}
	}
	return NULL;
}

static struct fake_alloc *new_alloc(void)
{
	for (int i = 0; i < FAKE_CUDA_ALLOCS; i++) {
		struct fake_alloc *a = &g_fake->allocs[i];
		if (!a->used) {
			memset(a, 0, sizeof(*a));
			a->used = true;
			return a;
		}
	}
	return NULL;
}

#define PRIMARY_CTX 0x1000 /* primary context of device d: PRIMARY_CTX + 0x10 * d */
#define APP_CTX     0x9000 /* a context the application created on device d */

static int current_device(void)
{
	uintptr_t v;

	if (g_fake->ctx_depth == 0) {
		return -1;
	}
	v = (uintptr_t)g_fake->ctx_stack[g_fake->ctx_depth - 1];
	return (int)((v - (v >= APP_CTX ? APP_CTX : PRIMARY_CTX)) / 0x10);
}

/* Everything but the pointer and device queries needs a current context. */
static bool no_ctx(void)
{
	if (g_fake->ctx_depth > 0) {
		return false;
	}
	g_fake->no_ctx_calls++;
	return true;
}

static CUcontext current_ctx(void)
{
	return g_fake->ctx_depth ? g_fake->ctx_stack[g_fake->ctx_depth - 1] : NULL;
}

/* ---------------------------------------------------------------- entry points */

static CUresult f_init(unsigned int flags)
{
	return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult f_get_error_name(CUresult error, const char **str)
{
	switch ((int)error) {
	case CUDA_SUCCESS:
		*str = "CUDA_SUCCESS";
		break;
	case CUDA_ERROR_INVALID_VALUE:
		*str = "CUDA_ERROR_INVALID_VALUE";
		break;
	case CUDA_ERROR_INVALID_CONTEXT:
		*str = "CUDA_ERROR_INVALID_CONTEXT";
		break;
	case CUDA_ERROR_NOT_SUPPORTED:
		*str = "CUDA_ERROR_NOT_SUPPORTED";
		break;
	case CUDA_ERROR_INVALID_DEVICE:
		*str = "CUDA_ERROR_INVALID_DEVICE";
		break;
	case CUDA_ERROR_OUT_OF_MEMORY:
		*str = "CUDA_ERROR_OUT_OF_MEMORY";
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

static CUresult f_device_get_count(int *count)
{
	*count = g_fake->n_devices;
	return CUDA_SUCCESS;
}

static CUresult f_device_get(CUdevice *device, int ordinal)
{
	if (ordinal < 0 || ordinal >= g_fake->n_devices) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	*device = ordinal;
	return CUDA_SUCCESS;
}

static CUresult f_device_get_attribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	if (dev < 0 || dev >= g_fake->n_devices) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	switch ((int)attrib) {
	case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
		*pi = g_fake->dmabuf[dev] ? 1 : 0;
		return CUDA_SUCCESS;
	case CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED:
		*pi = g_fake->host_dmabuf[dev] ? 1 : 0;
		return CUDA_SUCCESS;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING:
		*pi = g_fake->ordering[dev];
		return CUDA_SUCCESS;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS:
		*pi = g_fake->flush_options[dev];
		return CUDA_SUCCESS;
	case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED:
		*pi = g_fake->c2c[dev] ? 1 : 0;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

static CUresult f_device_get_pci_bus_id(char *pciBusId, int len, CUdevice dev)
{
	if (dev < 0 || dev >= g_fake->n_devices || len < 13) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	snprintf(pciBusId, (size_t)len, "%s", g_fake->bus_id[dev]);
	return CUDA_SUCCESS;
}

static CUresult f_device_get_by_pci_bus_id(CUdevice *dev, const char *pciBusId)
{
	for (int i = 0; i < g_fake->n_devices; i++) {
		if (strcasecmp(g_fake->bus_id[i], pciBusId) == 0) {
			*dev = i;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_DEVICE;
}

static CUresult f_primary_ctx_retain(CUcontext *pctx, CUdevice dev)
{
	if (dev < 0 || dev >= g_fake->n_devices) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	*pctx = (CUcontext)(uintptr_t)(PRIMARY_CTX + 0x10 * (unsigned)dev);
	g_fake->retains++;
	return CUDA_SUCCESS;
}

static CUresult f_primary_ctx_release(CUdevice dev)
{
	if (dev < 0 || dev >= g_fake->n_devices) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	g_fake->releases++;
	return CUDA_SUCCESS;
}

static CUresult f_ctx_push_current(CUcontext ctx)
{
	if (!ctx || g_fake->ctx_depth >= FAKE_CUDA_CTX_MAX) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	g_fake->ctx_stack[g_fake->ctx_depth++] = ctx;
	if (g_fake->ctx_depth > g_fake->max_ctx_depth) {
		g_fake->max_ctx_depth = g_fake->ctx_depth;
	}
	return CUDA_SUCCESS;
}

static CUresult f_ctx_pop_current(CUcontext *pctx)
{
	if (g_fake->ctx_depth == 0) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	*pctx = g_fake->ctx_stack[--g_fake->ctx_depth];
	return CUDA_SUCCESS;
}

static CUresult f_ctx_get_current(CUcontext *pctx)
{
	*pctx = g_fake->ctx_depth ? g_fake->ctx_stack[g_fake->ctx_depth - 1] : NULL;
	return CUDA_SUCCESS;
}

static CUresult f_pointer_get_attribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	struct fake_alloc *a = find(ptr);

	if (!a) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	switch ((int)attribute) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		/* Managed memory answers DEVICE here: only IS_MANAGED tells. */
		*(unsigned int *)data =
			a->kind == FAKE_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
		*(int *)data = a->kind == FAKE_MANAGED;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = 1;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
		*(int *)data = a->kind == FAKE_VMM
				       ? a->rdma_capable
				       : a->kind == FAKE_DEVICE || a->kind == FAKE_MEMPOOL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
		*(void **)data = a->kind == FAKE_MEMPOOL ? (void *)(uintptr_t)0xb001 : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = a->buffer_id;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = a->device;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		/* ipc_get_fails: the attribute says yes, the call says no. */
		*(int *)data = a->kind == FAKE_DEVICE && !a->mapping;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

static CUresult f_pointer_set_attribute(const void *value, CUpointer_attribute attribute,
					CUdeviceptr ptr)
{
	struct fake_alloc *a = find(ptr);

	if (no_ctx()) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (!a || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ||
	    *(const unsigned int *)value != 1) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (a->vmm || a->kind == FAKE_MEMPOOL || g_fake->sync_memops_fails) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	g_fake->sync_memops++;
	return CUDA_SUCCESS;
}

static CUresult f_mem_get_address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct fake_alloc *a = find(dptr);

	if (no_ctx()) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	/* VMM memory: the one mapping around the pointer, not the reserved range. */
	if (!a || a->kind == FAKE_HOST) {
		return CUDA_ERROR_NOT_FOUND;
	}
	*pbase = a->base;
	*psize = a->size;
	return CUDA_SUCCESS;
}

static CUresult f_mem_get_handle_for_address_range(void *handle, CUdeviceptr dptr, size_t size,
						   CUmemRangeHandleType handleType,
						   unsigned long long flags)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct fake_alloc *a = find(dptr);
	int fd;

	if (no_ctx()) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (g_fake->export_result != CUDA_SUCCESS) {
		return g_fake->export_result;
	}
	if (handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || size == 0 ||
	    (flags & ~(unsigned long long)CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) ||
	    (flags && g_fake->no_pcie_flag)) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* "Users must ensure the dptr and size are aligned to the host page size." */
	if (dptr % page != 0 || size % page != 0 || !a) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (a->kind == FAKE_HOST ? !g_fake->host_dmabuf[a->device] : !g_fake->dmabuf[a->device]) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (a->vmm_partial || a->mapping || a->kind == FAKE_MANAGED) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (a->vmm) {
		/*
		 * A reserved range may be exported across mappings when it is
		 * fully mapped, on one device, with identical properties.
		 */
		for (CUdeviceptr at = dptr; at < dptr + size;) {
			struct fake_alloc *m = find(at);
			if (!m || !m->vmm || m->vmm_partial || m->reservation != a->reservation ||
			    m->device != a->device || m->rdma_capable != a->rdma_capable) {
				return CUDA_ERROR_INVALID_VALUE;
			}
			at = m->base + m->size;
		}
	} else {
		/* The range must stay inside the allocation (cuMemAlloc rounds up to 2 MiB). */
		uint64_t end = a->base +
			       round_up(a->size, a->kind == FAKE_DEVICE ? ALLOC_GRANULARITY : page);
		if (dptr + size > end) {
			return CUDA_ERROR_INVALID_VALUE;
		}
	}
	fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
		if (fd >= 0) {
			close(fd);
		}
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*(int *)handle = fd;
	g_fake->exports++;
	g_fake->last_export_base = dptr;
	g_fake->last_export_size = size;
	g_fake->last_export_flags = flags;
	g_fake->last_export_ctx = current_ctx();
	return CUDA_SUCCESS;
}

static CUresult f_mem_alloc(CUdeviceptr *dptr, size_t bytesize)
{
	int dev = current_device();

	if (dev < 0) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	*dptr = fake_cuda_alloc(g_fake, bytesize, dev);
	if (!*dptr) {
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	g_fake->mem_allocs++;
	return CUDA_SUCCESS;
}

static CUresult f_mem_free(CUdeviceptr dptr)
{
	struct fake_alloc *a = find(dptr);

	if (!a || a->base != dptr || a->mapping) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	a->freed = true;
	g_fake->mem_frees++;
	return CUDA_SUCCESS;
}

/* Handle bytes: "FAKEIPC" then the buffer id and the base of the allocation. */
static CUresult f_ipc_get_mem_handle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct fake_alloc *a = find(dptr);

	if (no_ctx()) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	/* Legacy IPC: cuMemAlloc memory, named by its base. */
	if (!a || a->base != dptr || a->kind != FAKE_DEVICE || a->mapping ||
	    g_fake->ipc_get_fails) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	memset(pHandle, 0, sizeof(*pHandle));
	memcpy((char *)pHandle, "FAKEIPC", 8);
	memcpy((char *)pHandle + 8, &a->buffer_id, 8);
	memcpy((char *)pHandle + 16, &a->base, 8);
	g_fake->ipc_gets++;
	return CUDA_SUCCESS;
}

static CUresult f_ipc_open_mem_handle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	uint64_t buffer_id;
	CUdeviceptr base;
	struct fake_alloc *a, *m;

	if (current_device() < 0) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (memcmp((char *)&handle, "FAKEIPC", 8) != 0 ||
	    flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	memcpy(&buffer_id, (char *)&handle + 8, 8);
	memcpy(&base, (char *)&handle + 16, 8);
	a = find(base);
	if (!a || a->buffer_id != buffer_id || a->base != base) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	m = new_alloc();
	if (!m) {
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	m->mapping = true;
	m->of = a->base;
	m->base =
		a->base + MAPPING_OFFSET + (CUdeviceptr)g_fake->ipc_opens * ALLOC_GRANULARITY * 64;
	m->size = a->size;
	m->device = a->device;
	m->kind = FAKE_DEVICE;
	m->buffer_id = g_fake->next_buffer_id++;
	g_fake->ipc_opens++;
	*pdptr = m->base;
	return CUDA_SUCCESS;
}

static CUresult f_ipc_close_mem_handle(CUdeviceptr dptr)
{
	struct fake_alloc *m = find(dptr);

	if (!m || !m->mapping || m->base != dptr || current_device() < 0) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	m->used = false;
	g_fake->ipc_closes++;
	return CUDA_SUCCESS;
}

static CUresult f_flush_gpu_direct_rdma_writes(CUflushGPUDirectRDMAWritesTarget target,
					       CUflushGPUDirectRDMAWritesScope scope)
{
	if (no_ctx()) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (target != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX ||
	    scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	g_fake->flushes++;
	g_fake->last_flush_ctx = current_ctx();
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- set-up */

void fake_cuda_init(struct fake_cuda *f)
{
	memset(f, 0, sizeof(*f));
	f->table.init = f_init;
	f->table.get_error_name = f_get_error_name;
	f->table.device_get_count = f_device_get_count;
	f->table.device_get = f_device_get;
	f->table.device_get_attribute = f_device_get_attribute;
	f->table.device_get_pci_bus_id = f_device_get_pci_bus_id;
	f->table.device_get_by_pci_bus_id = f_device_get_by_pci_bus_id;
	f->table.primary_ctx_retain = f_primary_ctx_retain;
	f->table.primary_ctx_release = f_primary_ctx_release;
	f->table.ctx_push_current = f_ctx_push_current;
	f->table.ctx_pop_current = f_ctx_pop_current;
	f->table.ctx_get_current = f_ctx_get_current;
	f->table.pointer_get_attribute = f_pointer_get_attribute;
	f->table.pointer_set_attribute = f_pointer_set_attribute;
	f->table.mem_get_address_range = f_mem_get_address_range;
	f->table.mem_get_handle_for_address_range = f_mem_get_handle_for_address_range;
	f->table.mem_alloc = f_mem_alloc;
	f->table.mem_free = f_mem_free;
	f->table.ipc_get_mem_handle = f_ipc_get_mem_handle;
	f->table.ipc_open_mem_handle = f_ipc_open_mem_handle;
	f->table.ipc_close_mem_handle = f_ipc_close_mem_handle;
	f->table.flush_gpu_direct_rdma_writes = f_flush_gpu_direct_rdma_writes;
	f->n_devices = 2;
	for (int d = 0; d < FAKE_CUDA_DEVICES; d++) {
		f->dmabuf[d] = true;
		f->ordering[d] = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
		f->flush_options[d] = CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
	}
	/* cuDeviceGetPCIBusId writes upper-case hex; sysfs uses lower case. */
	snprintf(f->bus_id[0], sizeof(f->bus_id[0]), "0000:3B:00.0");
	snprintf(f->bus_id[1], sizeof(f->bus_id[1]), "0000:86:00.0");
	f->next_buffer_id = 100;
	f->next_base = UINT64_C(0x7f0000000000);
	g_fake = f;
}

void fake_cuda_fini(struct fake_cuda *f)
{
	if (g_fake == f) {
		g_fake = NULL;
	}
}

static CUdeviceptr alloc_common(struct fake_cuda *f, CUdeviceptr base, size_t size, int dev,
				enum fake_kind kind, bool partial)
{
	struct fake_alloc *a;

	g_fake = f;
	a = new_alloc();
	if (!a || size == 0) {
		return 0;
	}
	a->base = base;
	a->size = size;
	a->device = dev;
	a->kind = kind;
	a->vmm = kind == FAKE_VMM;
	a->rdma_capable = a->vmm;
	a->reservation = a->vmm ? ++f->next_reservation : 0;
	a->vmm_partial = partial;
	a->buffer_id = f->next_buffer_id++;
	return a->base;
}

CUdeviceptr fake_cuda_alloc(struct fake_cuda *f, size_t size, int dev)
{
	CUdeviceptr base = f->next_base;

	f->next_base += round_up(size ? size : 1, ALLOC_GRANULARITY) + ALLOC_GRANULARITY;
	return alloc_common(f, base, size, dev, FAKE_DEVICE, false);
}

CUdeviceptr fake_cuda_alloc_vmm(struct fake_cuda *f, size_t size, int dev, bool partial)
{
	CUdeviceptr base = f->next_base;

	f->next_base += round_up(size ? size : 1, ALLOC_GRANULARITY) + ALLOC_GRANULARITY;
	return alloc_common(f, base, size, dev, FAKE_VMM, partial);
}

CUdeviceptr fake_cuda_alloc_vmm_chunks(struct fake_cuda *f, int n_chunks, size_t chunk, int dev,
				       bool rdma_capable)
{
	CUdeviceptr base = f->next_base;
	uint32_t reservation = ++f->next_reservation;

	f->next_base += round_up((uint64_t)n_chunks * chunk, ALLOC_GRANULARITY) + ALLOC_GRANULARITY;
	for (int i = 0; i < n_chunks; i++) {
		CUdeviceptr at = base + (CUdeviceptr)i * chunk;
		if (alloc_common(f, at, chunk, dev, FAKE_VMM, false) != at) {
			return 0;
		}
		struct fake_alloc *a = find(at);
		a->reservation = reservation;
		a->rdma_capable = rdma_capable;
	}
	return base;
}

CUdeviceptr fake_cuda_alloc_kind(struct fake_cuda *f, enum fake_kind kind, size_t size, int dev)
{
	CUdeviceptr base = f->next_base;

	f->next_base += round_up(size ? size : 1, ALLOC_GRANULARITY) + ALLOC_GRANULARITY;
	return alloc_common(f, base, size, dev, kind, false);
}

void fake_cuda_push_app_ctx(struct fake_cuda *f, CUcontext ctx)
{
	g_fake = f;
	g_fake->ctx_stack[g_fake->ctx_depth++] = ctx;
}

CUdeviceptr fake_cuda_alloc_at(struct fake_cuda *f, CUdeviceptr base, size_t size, int dev)
{
	return alloc_common(f, base, size, dev, FAKE_DEVICE, false);
}

void fake_cuda_free(struct fake_cuda *f, CUdeviceptr ptr)
{
	g_fake = f;
	struct fake_alloc *a = find(ptr);
	if (a && a->base == ptr) {
		a->freed = true;
	}
}

const struct fake_alloc *fake_cuda_find(const struct fake_cuda *f, CUdeviceptr ptr)
{
	for (int i = 0; i < FAKE_CUDA_ALLOCS; i++) {
		const struct fake_alloc *a = &f->allocs[i];
		if (a->used && !a->freed && ptr >= a->base && ptr < a->base + a->size) {
			return a;
		}
	}
	return NULL;
}

CUresult fake_cuda_ipc_handle(struct fake_cuda *f, CUdeviceptr ptr, CUipcMemHandle *ret_handle)
{
	CUresult r;

	fake_cuda_push_app_ctx(f, FAKE_CUDA_APP_CTX(0));
	r = f_ipc_get_mem_handle(ret_handle, ptr);
	f->ctx_depth--;
	return r;
}

int fake_cuda_mappings(const struct fake_cuda *f)
{
	int n = 0;

	for (int i = 0; i < FAKE_CUDA_ALLOCS; i++) {
		n += f->allocs[i].used && f->allocs[i].mapping;
	}
	return n;
}
