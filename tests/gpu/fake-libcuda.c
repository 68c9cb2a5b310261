/* SPDX-License-Identifier: MIT */
/*
 * The unit tests' fake CUDA driver (tests/unit/fake_cuda.c) as a shared
 * library named libcuda.so.1, so that programs that load the real driver
 * with dlopen (librdmax, and the daemon's GPU module in the fake GPU daemon)
 * load this one instead when LD_LIBRARY_PATH names its folder. Only the
 * tests do that: nothing in librdmax or rdmaxd knows about it.
 *
 * It exports cuGetProcAddress_v2, which rdmax_cuda_load() prefers, handing
 * out the fake's table entries by name, and a few fakecuda_* calls for the
 * tests to allocate "device" memory: real host memory (mmap), aligned like
 * cuMemAlloc's, that the fake then describes as device memory of a GPU.
 * One fake per process, as there is one driver per process.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "../unit/fake_cuda.h"

#define FAKECUDA_EXPORT      __attribute__((visibility("default")))
#define FAKECUDA_GRANULARITY (UINT64_C(2) << 20)

static struct fake_cuda g_f;
static int g_ready;

static struct fake_cuda *fake(void)
{
	if (!g_ready) {
		fake_cuda_init(&g_f);
		g_ready = 1;
	}
	return &g_f;
}

struct fakecuda_entry {
	const char *name;
	size_t offset;
};

#define FAKECUDA_ENTRY(member, fn, sym, ret, params) {#fn, offsetof(struct rdmax_cuda, member)},
static const struct fakecuda_entry g_entries[] = {RDMAX_CUDA_ENTRY_POINTS(FAKECUDA_ENTRY)};

FAKECUDA_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
					     cuuint64_t flags,
					     CUdriverProcAddressQueryResult *status);

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status)
{
	(void)cuda_version;
	(void)flags;
	for (size_t i = 0; i < sizeof(g_entries) / sizeof(g_entries[0]); i++) {
		if (strcmp(g_entries[i].name, symbol) == 0) {
			memcpy(pfn, (const char *)&fake()->table + g_entries[i].offset,
			       sizeof(*pfn));
			if (status) {
				*status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
			}
			return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
		}
	}
	*pfn = NULL;
	if (status) {
		*status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
	}
	return CUDA_ERROR_NOT_FOUND;
}

/* Host memory at an address aligned like cuMemAlloc's, never unmapped (addresses stay unique). */
static CUdeviceptr host_backed(size_t size)
{
	size_t len = size + FAKECUDA_GRANULARITY;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		return 0;
	}
	return ((CUdeviceptr)(uintptr_t)p + FAKECUDA_GRANULARITY - 1) & ~(FAKECUDA_GRANULARITY - 1);
}

/* cudaMalloc on device dev: size bytes of host memory the fake calls device memory. */
FAKECUDA_EXPORT CUdeviceptr fakecuda_alloc(size_t size, int dev);
CUdeviceptr fakecuda_alloc(size_t size, int dev)
{
	CUdeviceptr base = host_backed(size);

	return base ? fake_cuda_alloc_at(fake(), base, size, dev) : 0;
}

/* Another kind of memory (enum fake_kind: 3 managed, 4 pinned host, ...), not backed. */
FAKECUDA_EXPORT CUdeviceptr fakecuda_alloc_kind(int kind, size_t size, int dev);
CUdeviceptr fakecuda_alloc_kind(int kind, size_t size, int dev)
{
	if (kind < 0 || kind >= FAKE_KIND_MAX) {
		return 0;
	}
	return fake_cuda_alloc_kind(fake(), (enum fake_kind)kind, size, dev);
}

FAKECUDA_EXPORT void fakecuda_free(CUdeviceptr ptr);
void fakecuda_free(CUdeviceptr ptr)
{
	fake_cuda_free(fake(), ptr);
}

/* dma-buf exports so far, and the size of the last. */
FAKECUDA_EXPORT int fakecuda_exports(uint64_t *ret_last_size);
int fakecuda_exports(uint64_t *ret_last_size)
{
	if (ret_last_size) {
		*ret_last_size = fake()->last_export_size;
	}
	return fake()->exports;
}
