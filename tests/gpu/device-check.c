/* SPDX-License-Identifier: MIT */
/*
 * The device check's helper (tests/gpu/device-check runs it): the real
 * rdmax_region_register_gpu() with the real libcuda, against the daemon's
 * real GPU registration (gpu_register(), gpu_check_dmabuf(), gpu_mr_plan())
 * behind a minimal protocol server in this process. Its region hook stops
 * where the verbs transport would call ibv_reg_dmabuf_mr(): no RDMA NIC is
 * needed. Checks the dma-buf file system, the page-rounded size, the offset
 * and iova page offset of every plan, and the memory kinds serving stacks
 * use.
 *
 * Prints one line per step: "PASS name", "FAIL name: why", "SKIP name: why".
 * Never counts a skip as a pass; the script prints the tally.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cuda_table.h"
#include "gpu.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "region.h"
#include "gpu_server.h"

#define MiB (UINT64_C(1) << 20)

static int g_failed;

static void step(const char *name, const char *verdict, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void step(const char *name, const char *verdict, const char *fmt, ...)
{
	char why[512] = "";
	va_list ap;

	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(why, sizeof(why), fmt, ap);
		va_end(ap);
	}
	g_failed += strcmp(verdict, "FAIL") == 0;
	printf("%s %s%s%s\n", verdict, name, why[0] ? ": " : "", why);
	fflush(stdout);
}

/* ---------------------------------------------------------------- the steps */

/* Driver entry points the library does not use: the check allocates with them. */
struct extra {
	CUresult (*mem_get_info)(size_t *free, size_t *total);
	CUresult (*mem_alloc_managed)(CUdeviceptr *p, size_t size, unsigned int flags);
	CUresult (*mem_host_alloc)(void **p, size_t size, unsigned int flags);
	CUresult (*mem_free_host)(void *p);
	CUresult (*mem_alloc_async)(CUdeviceptr *p, size_t size, void *stream);
	CUresult (*mem_free_async)(CUdeviceptr p, void *stream);
	CUresult (*stream_synchronize)(void *stream);
	CUresult (*mem_address_reserve)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
					unsigned long long flags);
	CUresult (*mem_address_free)(CUdeviceptr p, size_t size);
	CUresult (*mem_create)(unsigned long long *h, size_t size, const void *prop,
			       unsigned long long flags);
	CUresult (*mem_release)(unsigned long long h);
	CUresult (*mem_map)(CUdeviceptr p, size_t size, size_t offset, unsigned long long h,
			    unsigned long long flags);
	CUresult (*mem_unmap)(CUdeviceptr p, size_t size);
	CUresult (*mem_set_access)(CUdeviceptr p, size_t size, const void *desc, size_t count);
	CUresult (*mem_get_allocation_granularity)(size_t *g, const void *prop, int option);
};

static void *sym(void *lib, const char *name)
{
	return lib ? dlsym(lib, name) : NULL;
}

static void load_extra(struct extra *x)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	memset(x, 0, sizeof(*x));
	*(void **)&x->mem_get_info = sym(lib, "cuMemGetInfo_v2");
	*(void **)&x->mem_alloc_managed = sym(lib, "cuMemAllocManaged");
	*(void **)&x->mem_host_alloc = sym(lib, "cuMemHostAlloc");
	*(void **)&x->mem_free_host = sym(lib, "cuMemFreeHost");
	*(void **)&x->mem_alloc_async = sym(lib, "cuMemAllocAsync");
	*(void **)&x->mem_free_async = sym(lib, "cuMemFreeAsync");
	*(void **)&x->stream_synchronize = sym(lib, "cuStreamSynchronize");
	*(void **)&x->mem_address_reserve = sym(lib, "cuMemAddressReserve");
	*(void **)&x->mem_address_free = sym(lib, "cuMemAddressFree");
	*(void **)&x->mem_create = sym(lib, "cuMemCreate");
	*(void **)&x->mem_release = sym(lib, "cuMemRelease");
	*(void **)&x->mem_map = sym(lib, "cuMemMap");
	*(void **)&x->mem_unmap = sym(lib, "cuMemUnmap");
	*(void **)&x->mem_set_access = sym(lib, "cuMemSetAccess");
	*(void **)&x->mem_get_allocation_granularity = sym(lib, "cuMemGetAllocationGranularity");
}

/* The dma-bufs this process holds (the daemon side keeps one per allocation). */
static int count_dmabufs(void)
{
	char path[64], target[128];
	int n = 0;

	for (int fd = 0; fd < 4096; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		ssize_t len = readlink(path, target, sizeof(target) - 1);
		if (len > 0) {
			target[len] = '\0';
			n += strncmp(target, "/dmabuf:", 8) == 0 ||
			     strncmp(target, "anon_inode:dmabuf", 17) == 0;
		}
	}
	return n;
}

struct ctx {
	const struct rdmax_cuda *cu;
	struct extra x;
	struct server *srv;
	struct rdmax_client *client;
	uint64_t page;
};

/* Register [p, p+len) and check what the daemon planned; deregisters again. */
static void check_register(struct ctx *c, const char *name, CUdeviceptr p, uint64_t len,
			   uint64_t want_offset, uint64_t want_size)
{
	struct rdmax_region *r;
	int ret = rdmax_region_register_gpu(c->client, (void *)(uintptr_t)p, len,
					    RDMAX_ACCESS_REMOTE_WRITE, &r);
	const struct plan_seen *s = &c->srv->seen;

	if (ret < 0) {
		step(name, "FAIL", "rdmax_region_register_gpu: %s (%s)", rdmax_strerror(ret),
		     c->srv->why);
		return;
	}
	if (s->plan.how != GPU_MR_DMABUF) {
		step(name, "FAIL", "not registered as a dma-buf (peermem fallback?)");
	} else if (s->check < 0) {
		step(name, "FAIL", "gpu_check_dmabuf: %s", rdmax_strerror(s->check));
	} else if (want_size && s->dmabuf_size != want_size) {
		step(name, "FAIL", "dma-buf of %" PRIu64 " bytes, expected %" PRIu64,
		     s->dmabuf_size, want_size);
	} else if (s->plan.offset != want_offset || s->plan.length != len) {
		step(name, "FAIL", "plan offset %" PRIu64 " length %" PRIu64 ", expected %" PRIu64,
		     s->plan.offset, s->plan.length, want_offset);
	} else if (s->iova % c->page != want_offset % c->page) {
		step(name, "FAIL", "iova page offset %" PRIu64 " != dma-buf offset's",
		     s->iova % c->page);
	} else {
		step(name, "PASS", "dma-buf of %" PRIu64 " bytes, offset %" PRIu64, s->dmabuf_size,
		     s->plan.offset);
	}
	rdmax_region_deregister(c->client, r);
}

static void steps_cumemalloc(struct ctx *c)
{
	const uint64_t size = 8 * MiB;
	const uint64_t offs[5] = {0, 4096, 65553, 3 * MiB + 1, size - 4096};
	char name[64];
	CUdeviceptr p;

	if (c->cu->mem_alloc(&p, size) != CUDA_SUCCESS) {
		step("cumemalloc", "FAIL", "cuMemAlloc of 8 MiB failed");
		return;
	}
	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "cumemalloc-offset-%" PRIu64, offs[i]);
		check_register(c, name, p + offs[i], 4096, offs[i], size);
	}
	c->cu->mem_free(p);
	/* Odd sizes: the export is rounded up to the page. */
	const uint64_t odd = 3 * c->page + 100;
	if (c->cu->mem_alloc(&p, odd) == CUDA_SUCCESS) {
		check_register(c, "odd-size", p + 10, odd - 10, 10,
			       (odd + c->page - 1) / c->page * c->page);
		c->cu->mem_free(p);
	}
}

static void steps_slices(struct ctx *c)
{
	struct rdmax_region *r[16];
	CUdeviceptr p;
	int n = 0, before = count_dmabufs();

	if (c->cu->mem_alloc(&p, 64 * MiB) != CUDA_SUCCESS) {
		step("bar1-once-for-slices", "FAIL", "cuMemAlloc of 64 MiB failed");
		return;
	}
	for (; n < 16; n++) {
		if (rdmax_region_register_gpu(c->client, (void *)(uintptr_t)(p + n * 4 * MiB),
					      4 * MiB, 0, &r[n]) < 0) {
			break;
		}
	}
	int held = count_dmabufs() - before;
	if (n < 16) {
		step("bar1-once-for-slices", "FAIL", "slice %d refused: %s", n, c->srv->why);
	} else if (held != 1) {
		step("bar1-once-for-slices", "FAIL", "%d dma-bufs held for 16 slices", held);
	} else {
		step("bar1-once-for-slices", "PASS", "16 slices, one dma-buf");
	}
	while (n-- > 0) {
		rdmax_region_deregister(c->client, r[n]);
	}
	if (count_dmabufs() != before) {
		step("dmabuf-closed-with-last-slice", "FAIL", "still held");
	} else {
		step("dmabuf-closed-with-last-slice", "PASS", NULL);
	}
	c->cu->mem_free(p);
}

/* CUmemAllocationProp, as cuda.h lays it out (the check builds without cuda.h). */
struct alloc_prop {
	int type;         /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
	int handle_types; /* none */
	struct {
		int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
		int id;
	} location;
	void *win32;
	struct {
		unsigned char compression_type;
		unsigned char gpu_direct_rdma_capable;
		unsigned short usage;
		unsigned char reserved[4];
	} flags;
};

struct access_desc {
	struct {
		int type;
		int id;
	} location;
	int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
};

#if defined(RDMAX_HAVE_CUDA_H)
_Static_assert(sizeof(struct alloc_prop) == sizeof(CUmemAllocationProp), "CUmemAllocationProp");
_Static_assert(offsetof(struct alloc_prop, flags.gpu_direct_rdma_capable) ==
		       offsetof(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable),
	       "gpuDirectRDMACapable");
_Static_assert(sizeof(struct access_desc) == sizeof(CUmemAccessDesc), "CUmemAccessDesc");
_Static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == 1 && CU_MEM_LOCATION_TYPE_DEVICE == 1 &&
		       CU_MEM_ACCESS_FLAGS_PROT_READWRITE == 3,
	       "VMM constants");
#endif

static void steps_vmm(struct ctx *c, bool rdma)
{
	const char *tag = rdma ? "vmm-rdma" : "vmm-no-rdma-flag";
	struct alloc_prop prop = {.type = 1, .location = {1, 0}};
	struct access_desc acc = {.location = {1, 0}, .flags = 3};
	unsigned long long h[2] = {0, 0};
	CUdeviceptr va = 0;
	size_t gran = 0;
	char name[64];

	if (!c->x.mem_create || !c->x.mem_map || !c->x.mem_get_allocation_granularity) {
		step(tag, "SKIP", "the driver has no VMM entry points");
		return;
	}
	prop.flags.gpu_direct_rdma_capable = rdma;
	if (c->x.mem_get_allocation_granularity(&gran, &prop, 0) != CUDA_SUCCESS ||
	    c->x.mem_address_reserve(&va, 2 * gran, 0, 0, 0) != CUDA_SUCCESS ||
	    c->x.mem_create(&h[0], gran, &prop, 0) != CUDA_SUCCESS ||
	    c->x.mem_create(&h[1], gran, &prop, 0) != CUDA_SUCCESS ||
	    c->x.mem_map(va, gran, 0, h[0], 0) != CUDA_SUCCESS ||
	    c->x.mem_map(va + gran, gran, 0, h[1], 0) != CUDA_SUCCESS ||
	    c->x.mem_set_access(va, 2 * gran, &acc, 1) != CUDA_SUCCESS) {
		step(tag, "FAIL", "cannot make two VMM chunks of the granularity");
		goto out;
	}
	if (rdma) {
		snprintf(name, sizeof(name), "%s-inside-one-chunk", tag);
		check_register(c, name, va + c->page + 5, c->page, 5, 2 * c->page);
		snprintf(name, sizeof(name), "%s-across-both", tag);
		check_register(c, name, va + gran - c->page + 7, 2 * c->page, 7, 3 * c->page);
	} else {
		struct rdmax_region *r;
		int ret =
			rdmax_region_register_gpu(c->client, (void *)(uintptr_t)va, c->page, 0, &r);
		if (ret == RDMAX_E_GPU_NOT_EXPORTABLE) {
			step(tag, "PASS", "refused: %s", rdmax_strerror(ret));
		} else {
			step(tag, "FAIL", "expected GPU_NOT_EXPORTABLE, got %d", ret);
			if (ret == 0) {
				rdmax_region_deregister(c->client, r);
			}
		}
	}
out:
	if (va && c->x.mem_unmap) {
		c->x.mem_unmap(va, 2 * gran);
	}
	for (int i = 0; i < 2; i++) {
		if (h[i] && c->x.mem_release) {
			c->x.mem_release(h[i]);
		}
	}
	if (va && c->x.mem_address_free) {
		c->x.mem_address_free(va, 2 * gran);
	}
}

static void steps_kinds(struct ctx *c)
{
	struct rdmax_region *r;
	CUdeviceptr p;
	void *host;
	int ret;

	if (c->x.mem_alloc_async && c->x.mem_alloc_async(&p, 4 * MiB, NULL) == CUDA_SUCCESS) {
		c->x.stream_synchronize(NULL);
		check_register(c, "cudamallocasync", p + c->page + 3, c->page, 3, 2 * c->page);
		c->x.mem_free_async(p, NULL);
		c->x.stream_synchronize(NULL);
	} else {
		step("cudamallocasync", "SKIP", "cuMemAllocAsync unavailable");
	}
	if (c->x.mem_alloc_managed && c->x.mem_alloc_managed(&p, 4 * MiB, 1) == CUDA_SUCCESS) {
		ret = rdmax_region_register_gpu(c->client, (void *)(uintptr_t)p, c->page, 0, &r);
		if (ret == RDMAX_E_GPU_NOT_DEVICE_MEMORY) {
			step("managed-refused", "PASS", NULL);
		} else {
			step("managed-refused", "FAIL", "got %d", ret);
			if (ret == 0) {
				rdmax_region_deregister(c->client, r);
			}
		}
		c->cu->mem_free(p);
	} else {
		step("managed-refused", "SKIP", "cuMemAllocManaged unavailable");
	}
	if (c->x.mem_host_alloc && c->x.mem_host_alloc(&host, 4 * MiB, 0) == CUDA_SUCCESS) {
		ret = rdmax_region_register_gpu(c->client, host, c->page, 0, &r);
		if (ret == 0) {
			step("pinned-host", "PASS", "exported as a dma-buf of %" PRIu64 " bytes",
			     c->srv->seen.dmabuf_size);
			rdmax_region_deregister(c->client, r);
		} else if (ret == RDMAX_E_GPU_NO_DMABUF) {
			step("pinned-host", "PASS", "refused by name: the driver cannot export it");
		} else {
			step("pinned-host", "FAIL", "got %s (%s)", rdmax_strerror(ret),
			     c->srv->why);
		}
		c->x.mem_free_host(host);
	} else {
		step("pinned-host", "SKIP", "cuMemHostAlloc unavailable");
	}
}

struct thread_arg {
	struct ctx *c;
	CUdeviceptr p;
	int ret;
	CUcontext after;
};

static void *no_ctx_thread(void *arg)
{
	struct thread_arg *t = arg;
	struct rdmax_region *r;

	t->ret = rdmax_region_register_gpu(t->c->client, (void *)(uintptr_t)t->p, 4096, 0, &r);
	if (t->ret == 0) {
		rdmax_region_deregister(t->c->client, r);
	}
	t->c->cu->ctx_get_current(&t->after);
	return NULL;
}

static void step_no_context(struct ctx *c)
{
	struct thread_arg t = {.c = c};
	pthread_t th;

	if (c->cu->mem_alloc(&t.p, MiB) != CUDA_SUCCESS) {
		step("thread-without-context", "FAIL", "cuMemAlloc failed");
		return;
	}
	pthread_create(&th, NULL, no_ctx_thread, &t);
	pthread_join(th, NULL);
	if (t.ret < 0) {
		step("thread-without-context", "FAIL", "%s", rdmax_strerror(t.ret));
	} else if (t.after) {
		step("thread-without-context", "FAIL", "a context was left current");
	} else {
		step("thread-without-context", "PASS", NULL);
	}
	c->cu->mem_free(t.p);
}

static void step_free_while_held(struct ctx *c)
{
	struct rdmax_region *r, *r2;
	size_t free0 = 0, free1 = 0, free2 = 0, total;
	CUdeviceptr p, q;
	const uint64_t size = 256 * MiB;

	if (!c->x.mem_get_info || c->cu->mem_alloc(&p, size) != CUDA_SUCCESS) {
		step("free-while-registered", "SKIP", "cuMemGetInfo or 256 MiB unavailable");
		return;
	}
	if (rdmax_region_register_gpu(c->client, (void *)(uintptr_t)p, MiB, 0, &r) < 0) {
		step("free-while-registered", "FAIL", "register: %s", c->srv->why);
		c->cu->mem_free(p);
		return;
	}
	c->x.mem_get_info(&free0, &total);
	c->cu->mem_free(p); /* the application's mistake */
	c->x.mem_get_info(&free1, &total);
	/* The dma-buf keeps the memory until the region goes. */
	if (free1 >= free0 + size) {
		step("free-while-registered", "FAIL", "memory returned while the daemon holds it");
	} else {
		step("free-while-registered", "PASS", "memory stays allocated");
	}
	if (c->cu->mem_alloc(&q, size) == CUDA_SUCCESS) {
		if (q == p) {
			int ret = rdmax_region_register_gpu(c->client, (void *)(uintptr_t)q, MiB, 0,
							    &r2);
			step("address-reused", ret == RDMAX_E_GPU_ADDRESS_REUSED ? "PASS" : "FAIL",
			     "got %d", ret);
			if (ret == 0) {
				rdmax_region_deregister(c->client, r2);
			}
		} else {
			step("address-reused", "SKIP", "the driver gave another address");
		}
		c->cu->mem_free(q);
	}
	rdmax_region_deregister(c->client, r);
	c->x.mem_get_info(&free2, &total);
	printf("INFO free memory: %zu with the region, %zu after cuMemFree, %zu after "
	       "deregistration\n",
	       free0, free1, free2);
}

int main(void)
{
	struct rdmax_cuda cu;
	struct server srv;
	struct ctx c = {0};
	const char *why = NULL;
	int count = 0;
	const char *names[] = {"cumemalloc",
			       "odd-size",
			       "bar1-once-for-slices",
			       "vmm-rdma",
			       "vmm-no-rdma-flag",
			       "cudamallocasync",
			       "managed-refused",
			       "pinned-host",
			       "thread-without-context",
			       "free-while-registered"};

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (rdmax_cuda_load(NULL, &cu, &why) < 0) {
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			step(names[i], "SKIP", "%s", why);
		}
		return 0;
	}
	if (cu.device_get_count(&count) != CUDA_SUCCESS || count < 1) {
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			step(names[i], "SKIP", "CUDA sees no GPU");
		}
		return 0;
	}
	if (gpu_server_start(&srv, "device-check", NULL, NULL) < 0) {
		step("daemon-side", "FAIL", "cannot start the in-process server: %s",
		     strerror(errno));
		return 1;
	}
	c.cu = &cu;
	c.srv = &srv;
	c.page = (uint64_t)sysconf(_SC_PAGESIZE);
	load_extra(&c.x);
	int ret = rdmax_client_open(srv.path, "device-check", &c.client);
	if (ret < 0) {
		step("client", "FAIL", "rdmax_client_open: %s", rdmax_strerror(ret));
		return 1;
	}
	CUdevice dev;
	CUcontext ctx, popped;
	cu.device_get(&dev, 0);
	cu.primary_ctx_retain(&ctx, dev);
	cu.ctx_push_current(ctx);
	step_no_context(&c); /* a new thread: no context current there */
	steps_cumemalloc(&c);
	steps_slices(&c);
	steps_vmm(&c, true);
	steps_vmm(&c, false);
	steps_kinds(&c);
	step_free_while_held(&c);
	rdmax_client_close(c.client);
	pthread_join(srv.thread, NULL);
	cu.ctx_pop_current(&popped);
	cu.primary_ctx_release(dev);
	return g_failed ? 1 : 0;
}
