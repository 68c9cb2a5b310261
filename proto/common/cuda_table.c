/* SPDX-License-Identifier: MIT */
/*
 * Loads the CUDA driver (libcuda.so.1) with dlopen and fills the table of
 * entry points that librdmax and rdmaxd call. Prefers cuGetProcAddress_v2,
 * which hands out the entry points of the ABI version asked for, and falls
 * back to dlsym of the versioned (_v2) symbols on drivers older than 12.0.
 *
 * Never links against CUDA, never unloads the library (libcuda does not
 * survive dlclose under a process that used it), never logs, and keeps no
 * state: each caller owns its table.
 */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>

#include "cuda_table.h"

#if defined(RDMAX_HAVE_CUDA_H)
/* The table must match the prototypes cuda.h's macros select (_v2 where they map). */
#define CHECK_PROTOTYPE(member, fn, symbol, ret, params)                                           \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&fn),                               \
						    __typeof__(((struct rdmax_cuda *)0)->member)), \
		       #fn " differs from cuda.h");
RDMAX_CUDA_ENTRY_POINTS(CHECK_PROTOTYPE)
_Static_assert(sizeof(CUipcMemHandle) == RDMAX_CUDA_IPC_HANDLE_SIZE, "IPC handle size");
_Static_assert(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED == 124, "attribute number");
_Static_assert(CU_POINTER_ATTRIBUTE_BUFFER_ID == 7, "attribute number");
_Static_assert(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD == 1, "handle type");
_Static_assert(CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE == 1, "range flag");
_Static_assert(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE == 15, "attribute number");
_Static_assert(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE == 17, "attribute number");
_Static_assert(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING == 118, "attribute number");
_Static_assert(CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED == 146, "attribute number");
#endif

/* cuGetProcAddress_v2 (CUDA 12.0): symbol, function, ABI version, flags, status. */
typedef CUresult (*get_proc_address_fn)(const char *symbol, void **pfn, int cuda_version,
					cuuint64_t flags, CUdriverProcAddressQueryResult *status);

struct entry {
	const char *name;   /* for cuGetProcAddress */
	const char *symbol; /* for dlsym */
	size_t offset;      /* of the member in struct rdmax_cuda */
};

#define ENTRY(member, fn, sym, ret, params) {#fn, sym, offsetof(struct rdmax_cuda, member)},
static const struct entry g_entries[] = {RDMAX_CUDA_ENTRY_POINTS(ENTRY)};

int rdmax_cuda_load(const char *library, struct rdmax_cuda *ret_table, const char **ret_why)
{
	struct rdmax_cuda t;
	get_proc_address_fn gpa;
	const char *why = NULL;
	void *lib;

	memset(&t, 0, sizeof(t));
	lib = dlopen(library ? library : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		if (ret_why) {
			*ret_why = "cannot load libcuda.so.1 (no NVIDIA driver on this node?)";
		}
		return -ENOENT;
	}
	*(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
	for (size_t i = 0; i < sizeof(g_entries) / sizeof(g_entries[0]); i++) {
		void *fn = NULL;
		CUdriverProcAddressQueryResult status;

		if (gpa && gpa(g_entries[i].name, &fn, RDMAX_CUDA_ABI_VERSION,
			       CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS) {
			fn = NULL;
		}
		if (!fn) {
			fn = dlsym(lib, g_entries[i].symbol);
		}
		if (!fn) {
			/* cuMemGetHandleForAddressRange is the youngest entry point (11.7). */
			why = "the NVIDIA driver is too old (CUDA 11.7 or later is needed)";
			break;
		}
		memcpy((char *)&t + g_entries[i].offset, &fn, sizeof(fn));
	}
	if (why) {
		if (ret_why) {
			*ret_why = why;
		}
		return -ENOSYS;
	}
	t.via_get_proc_address = gpa != NULL;
	if (t.init(0) != CUDA_SUCCESS) {
		if (ret_why) {
			*ret_why = "cuInit() failed (no usable GPU, or driver and kernel module "
				   "differ)";
		}
		return -EIO;
	}
	*ret_table = t;
	return 0;
}

const char *rdmax_cuda_error_name(const struct rdmax_cuda *cuda, CUresult r)
{
	const char *name = NULL;

	if (cuda && cuda->get_error_name && cuda->get_error_name(r, &name) == CUDA_SUCCESS &&
	    name) {
		return name;
	}
	return "unknown CUDA error";
}
