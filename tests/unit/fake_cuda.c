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

static int current_device(void)
{
	if (g_fake->ctx_depth == 0) {
		return -1;
	}
	return (int)(((uintptr_t)g_fake->ctx_stack[g_fake->ctx_depth - 1] - 0x1000) / 0x10);
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
	if (attrib != CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	*pi = g_fake->dmabuf[dev] ? 1 : 0;
	return CUDA_SUCCESS;
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
	*pctx = (CUcontext)(uintptr_t)(0x1000 + 0x10 * (unsigned)dev);
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
		*(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = a->buffer_id;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = a->device;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = !a->vmm && !a->mapping;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

static CUresult f_pointer_set_attribute(const void *value, CUpointer_attribute attribute,
					CUdeviceptr ptr)
{
	struct fake_alloc *a = find(ptr);

	if (!a || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ||
	    *(const unsigned int *)value != 1) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (a->vmm || g_fake->sync_memops_fails) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	g_fake->sync_memops++;
	return CUDA_SUCCESS;
}

static CUresult f_mem_get_address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct fake_alloc *a = find(dptr);

	if (!a) {
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

	if (g_fake->export_result != CUDA_SUCCESS) {
		return g_fake->export_result;
	}
	if (handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0 || size == 0) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* "Users must ensure the dptr and size are aligned to the host page size." */
	if (dptr % page != 0 || size % page != 0 || !a) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (!g_fake->dmabuf[a->device]) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (a->vmm_partial || a->mapping) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* The range must stay inside the allocation (cuMemAlloc rounds up to 2 MiB). */
	uint64_t end = a->base + (a->vmm ? a->size : round_up(a->size, ALLOC_GRANULARITY));
	if (dptr + size > end) {
		return CUDA_ERROR_INVALID_VALUE;
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

	/* Legacy IPC: cuMemAlloc memory, named by its base. */
	if (!a || a->base != dptr || a->vmm || a->mapping) {
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
	f->n_devices = 2;
	f->dmabuf[0] = f->dmabuf[1] = true;
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
				bool vmm, bool partial)
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
	a->vmm = vmm;
	a->vmm_partial = partial;
	a->buffer_id = f->next_buffer_id++;
	return a->base;
}

CUdeviceptr fake_cuda_alloc(struct fake_cuda *f, size_t size, int dev)
{
	CUdeviceptr base = f->next_base;

	f->next_base += round_up(size ? size : 1, ALLOC_GRANULARITY) + ALLOC_GRANULARITY;
	return alloc_common(f, base, size, dev, false, false);
}

CUdeviceptr fake_cuda_alloc_vmm(struct fake_cuda *f, size_t size, int dev, bool partial)
{
	CUdeviceptr base = f->next_base;

	f->next_base += round_up(size ? size : 1, ALLOC_GRANULARITY) + ALLOC_GRANULARITY;
	return alloc_common(f, base, size, dev, true, partial);
}

CUdeviceptr fake_cuda_alloc_at(struct fake_cuda *f, CUdeviceptr base, size_t size, int dev)
{
	return alloc_common(f, base, size, dev, false, false);
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

int fake_cuda_mappings(const struct fake_cuda *f)
{
	int n = 0;

	for (int i = 0; i < FAKE_CUDA_ALLOCS; i++) {
		n += f->allocs[i].used && f->allocs[i].mapping;
	}
	return n;
}
