/* SPDX-License-Identifier: MIT */
/*
 * GPU memory without a GPU, the daemon side: gpu.c's validation, MR plans,
 * BAR1 budget, shared dma-bufs, flushes and peermem mappings, driven through
 * the fake CUDA driver (fake_cuda.c) against a real region table whose hooks
 * stand in for the verbs transport. Owns the suite "gpu"; the client side
 * (test_gpu_client.c), the sysfs topology (test_gpu_topo.c) and the pools
 * (test_gpu_pool.c) add their cases to it.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../client-lib/gpu.h"
#include "engine.h"
#include "fake_cuda.h"
#include "rdmaxd.h"
#include "test_gpu.h"

Suite *gpu_suite(void);

uint64_t unit_gpu_page_size(void)
{
	return (uint64_t)sysconf(_SC_PAGESIZE);
}

int unit_gpu_count_fds(void)
{
	int n = 0;
	char path[64];

	for (int fd = 0; fd < 1024; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n += access(path, F_OK) == 0;
	}
	return n;
}

/* ================================================================ daemon side */

/* The verbs transport's iova: high bits from the key, low bits from the memory. */
uint64_t unit_gpu_iova(const struct region *r)
{
	const uint64_t low = (UINT64_C(1) << 41) - 1;
	uint64_t addr = r->addr ? (uintptr_t)r->addr : r->gpu_addr;

	return ((r->key >> 42) << 41) | (addr & low);
}

static int hook_added(void *ctx, struct region *region)
{
	struct unit_gpu_hook *h = ctx;
	struct stat st;
	int ret;

	if (!region->gpu) {
		return 0; /* host memory: not this suite's business */
	}
	h->added++;
	h->iova = unit_gpu_iova(region);
	ret = gpu_mr_plan(region, 0, h->max_mr_size, h->dmabuf, h->iova, &h->plan);
	if (ret < 0) {
		return ret;
	}
	if (h->plan.how == GPU_MR_DMABUF) {
		h->fd_open = fstat(h->plan.fd, &st) == 0;
		h->fd_size = h->fd_open ? st.st_size : -1;
	}
	if (h->plan.how == GPU_MR_SHARED) {
		region->transport_data[0] = h->plan.shared;
	} else {
		region->transport_data[0] = malloc(8);
		h->live_mrs++;
	}
	return 0;
}

static void hook_removed(void *ctx, struct region *region)
{
	struct unit_gpu_hook *h = ctx;

	h->removed++;
	h->watch_at_removal = h->watch ? *h->watch : 0;
	if (region->transport_data[0] && region->gpu && !gpu_region_shares_mrs(region)) {
		free(region->transport_data[0]);
		h->live_mrs--;
	}
	region->transport_data[0] = NULL;
}

/* What the verbs transport's destroy does before gpu_destroy(): drop every MR left. */
void unit_gpu_drop_mrs(struct region_table *t, struct unit_gpu_hook *h)
{
	struct region *r;

	for (size_t it = 0; hmap_next(&t->by_id, &it, NULL, (void **)&r);) {
		hook_removed(h, r);
	}
	ck_assert_int_eq(h->live_mrs, 0);
}

void unit_gpu_table_with_hook(struct region_table *t, struct unit_gpu_hook *h)
{
	struct region_hooks hooks = {.added = hook_added, .removed = hook_removed, .ctx = h};

	memset(h, 0, sizeof(*h));
	h->max_mr_size = UINT64_MAX;
	h->dmabuf = true;
	ck_assert_int_eq(region_table_init(t, 0x5eed), 0);
	ck_assert_int_eq(region_table_add_hooks(t, &hooks), 0);
}

/* Tests only: memfds stand in for dma-bufs. */
int unit_gpu_accept_memfd(int fd, uint64_t *ret_size)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		return -errno;
	}
	*ret_size = (uint64_t)st.st_size;
	return 0;
}

int unit_gpu_memfd(uint64_t size)
{
	int fd = memfd_create("stand-in-dmabuf", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	return fd;
}

START_TEST(daemon_dmabuf_check_is_real)
{
	uint64_t size = 0;
	int memfd = unit_gpu_memfd(1 << 20);
	char path[] = "/tmp/rdmax-notdmabuf-XXXXXX";
	int file = mkstemp(path);

	/* On this host a memfd is not a dma-buf, nor is a file: both refused. */
	ck_assert_int_eq(gpu_check_dmabuf(memfd, &size), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_ge(file, 0);
	ck_assert_int_eq(gpu_check_dmabuf(file, &size), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(gpu_check_dmabuf(-1, &size), -EBADF);
	unlink(path);
	close(file);

	/* And through registration, with the real check. */
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct region *r;
	char why[320] = "";
	struct gpu_params p = {.sysfs_root = "/nonexistent", .verbs = true, .dmabuf = true};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF, .fd = memfd, .length = 4096};
	unit_gpu_table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "not a dma-buf"));
	ck_assert_int_eq(h.added, 0);
	ck_assert_uint_eq(t.count, 0);
	gpu_destroy(gpu);
	region_table_fini(&t);

	/* A real dma-buf, where the kernel offers udmabuf to make one. */
	int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0) {
		printf("gpu: skipped the real dma-buf half of daemon_dmabuf_check_is_real: "
		       "/dev/udmabuf: %s\n",
		       strerror(errno));
		close(memfd);
		return;
	}
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	struct udmabuf_create create = {.memfd = (uint32_t)memfd, .size = 1 << 20};
	int dmabuf = ioctl(dev, UDMABUF_CREATE, &create);
	if (dmabuf < 0) {
		printf("gpu: skipped the real dma-buf half: UDMABUF_CREATE: %s\n", strerror(errno));
	} else {
		ck_assert_int_eq(gpu_check_dmabuf(dmabuf, &size), 0);
		ck_assert_uint_eq(size, 1 << 20);
		close(dmabuf);
	}
	close(dev);
	close(memfd);
}
END_TEST

START_TEST(daemon_dmabuf_registration)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct region *r, *r2;
	char why[320] = "";
	const uint64_t size = 8 * MiB;
	int fd = unit_gpu_memfd(size);
	struct gpu_params p = {.sysfs_root = "/nonexistent",
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = unit_gpu_accept_memfd};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF,
				  .fd = fd,
				  .offset = 3 * MiB + 123,
				  .length = MiB,
				  .access = RDMAX_ACCESS_REMOTE_READ,
				  .bus_id = "0000:3B:00.0",
				  .buffer_id = 42};

	unit_gpu_table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_DMABUF);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r), 0);
	ck_assert_int_eq(r->kind, REGION_GPU_DMABUF);
	ck_assert_ptr_null(r->addr);
	ck_assert_uint_eq(r->length, MiB);
	ck_assert_str_eq(gpu_region_bus_id(r), "0000:3b:00.0");
	/* The hook registered the dma-buf while its fd was open, at the interior offset. */
	ck_assert_int_eq(h.plan.how, GPU_MR_DMABUF);
	ck_assert(h.fd_open);
	ck_assert_int_eq(h.fd_size, (off_t)size);
	ck_assert_uint_eq(h.plan.offset, 3 * MiB + 123);
	ck_assert_uint_eq(h.plan.length, MiB);
	/* iova and dma-buf offset share their page offset, as the kernel demands. */
	ck_assert_uint_eq(h.iova % unit_gpu_page_size(), (3 * MiB + 123) % unit_gpu_page_size());
	ck_assert_uint_eq(r->gpu_addr, 3 * MiB + 123);
	/* The daemon keeps the dma-buf for later slices of the allocation. */
	struct gpu_mr_plan later;
	ck_assert_int_eq(gpu_mr_plan(r, 0, UINT64_MAX, true, h.iova, &later), 0);
	ck_assert_int_ge(later.fd, 0);
	/* An iova on another page offset than the dma-buf offset: the kernel would refuse. */
	ck_assert_int_eq(gpu_mr_plan(r, 0, UINT64_MAX, true, h.iova + 1, &later),
			 RDMAX_E_INVALID_ARGUMENT);
	/* A device without dma-buf, or too small an MR limit: named errors. */
	ck_assert_int_eq(gpu_mr_plan(r, 0, UINT64_MAX, false, h.iova, &later),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_int_eq(gpu_mr_plan(r, 0, 4096, true, h.iova, &later), RDMAX_E_GPU_TOO_LARGE);
	ck_assert_int_eq(gpu_mr_plan(r, REGION_MAX_DEVICES, UINT64_MAX, true, 0, &later),
			 RDMAX_E_INVALID_ARGUMENT);

	/* Past the end of the dma-buf. */
	req.offset = size - 4096;
	req.length = 8192;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_OUT_OF_RANGE);
	ck_assert_ptr_nonnull(strstr(why, "past the end"));
	req.offset = UINT64_MAX - 10;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_OUT_OF_RANGE);
	/* The device's max_mr_size, through the hook: nothing stays registered. */
	req.offset = 0;
	req.length = 2 * MiB;
	h.max_mr_size = MiB;
	uint32_t count = t.count;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_TOO_LARGE);
	ck_assert_uint_eq(t.count, count);
	h.max_mr_size = UINT64_MAX;
	/* Access bits and length. */
	req.access = 0x10;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	req.access = 0;
	req.length = 0;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);

	region_deregister(&t, r, NULL, NULL);
	ck_assert_uint_eq(t.count, 0);
	ck_assert_int_eq(h.live_mrs, 0);
	gpu_destroy(gpu);
	region_table_fini(&t);
	close(fd);
}
END_TEST

START_TEST(daemon_paths_and_capabilities)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct region *r;
	char root[64], why[320] = "";
	int fd = unit_gpu_memfd(MiB);
	struct gpu_reg_req dm = {.kind = REGION_GPU_DMABUF, .fd = fd, .length = 4096};
	struct gpu_reg_req ipc = {.kind = REGION_GPU_CUDA_IPC, .length = 4096};
	struct gpu_params p = {.check_dmabuf = unit_gpu_accept_memfd};

	unit_gpu_sysfs(root, sizeof(root), 0, true);
	p.sysfs_root = root;
	unit_gpu_table_with_hook(&t, &h);

	/* No RDMA transport: refused at once, with the words the brief asks for. */
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NEEDS_RDMA);
	ck_assert_ptr_nonnull(strstr(why, "need an RDMA device with dma-buf support"));
	ck_assert_int_eq(gpu_register(NULL, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NEEDS_RDMA);
	gpu_destroy(gpu);

	/* RDMA without dma-buf support, peermem loaded: only the fallback is offered. */
	p.verbs = true;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert(gpu_peermem_loaded(root));
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_PEERMEM);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "5.12"));
	gpu_destroy(gpu);

	/* registration = dmabuf: the IPC path is off even with peermem loaded. */
	p.dmabuf = true;
	p.mode = CONFIG_GPU_REG_DMABUF;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_DMABUF);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &ipc, why, sizeof(why), &r),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "registration = dmabuf"));
	gpu_destroy(gpu);

	/* registration = peermem: dma-bufs are refused even where devices take them. */
	p.mode = CONFIG_GPU_REG_PEERMEM;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_PEERMEM);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "registration = peermem"));
	gpu_destroy(gpu);

	/* auto with both: both offered. */
	p.mode = CONFIG_GPU_REG_AUTO;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_DMABUF | RDMAX_CAP_PEERMEM);
	/* Not a GPU kind. */
	struct gpu_reg_req host = {.kind = REGION_HOST_FD, .fd = fd, .length = 4096};
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &host, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	gpu_destroy(gpu);
	ck_assert_uint_eq(t.count, 0);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	close(fd);
}
END_TEST

START_TEST(daemon_bar1_budget)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct region *r1, *r2;
	char root[64], why[320] = "";
	int fd8 = unit_gpu_memfd(8 * MiB), fd16 = unit_gpu_memfd(16 * MiB);
	struct gpu_params p = {
		.verbs = true, .dmabuf = true, .check_dmabuf = unit_gpu_accept_memfd};
	struct gpu_reg_req req = {
		.kind = REGION_GPU_DMABUF, .fd = fd8, .length = 4096, .bus_id = "0000:3B:00.0"};

	unit_gpu_sysfs(root, sizeof(root), 16 * MiB, false);
	p.sysfs_root = root;
	unit_gpu_table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	/* The whole exported buffer counts, however little of it is registered. */
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r1), 0);
	req.fd = fd16;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_TOO_LARGE);
	ck_assert_ptr_nonnull(strstr(why, "BAR1"));
	ck_assert_int_eq(h.added, 1); /* refused before any device saw it */
	/* Another GPU (unknown BAR1) is not limited. */
	req.bus_id = "0000:86:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	region_deregister(&t, r2, NULL, NULL);
	/* Room again once the first region went. */
	region_deregister(&t, r1, NULL, NULL);
	req.bus_id = "0000:3b:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	region_deregister(&t, r2, NULL, NULL);
	gpu_destroy(gpu);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	close(fd8);
	close(fd16);
}
END_TEST

START_TEST(daemon_shared_dmabuf)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct region *r[6], *bad;
	char root[64], why[320] = "";
	int owner, other;
	/* 16 MiB of BAR1; a 10 MiB allocation registered in six slices. */
	int fd = unit_gpu_memfd(10 * MiB);
	struct gpu_params p = {
		.verbs = true, .dmabuf = true, .check_dmabuf = unit_gpu_accept_memfd};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF,
				  .fd = fd,
				  .length = MiB,
				  .bus_id = "0000:3B:00.0",
				  .buffer_id = 77};

	unit_gpu_sysfs(root, sizeof(root), 16 * MiB, false);
	p.sysfs_root = root;
	unit_gpu_table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	int fd2 = unit_gpu_memfd(10 * MiB);
	int fds_before = unit_gpu_count_fds();
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &r[0]), 0);
	/* The daemon keeps one reference to the dma-buf for later slices. */
	ck_assert_int_eq(unit_gpu_count_fds(), fds_before + 1);
	req.fd = -1;
	for (int i = 1; i < 6; i++) {
		req.offset = (uint64_t)i * MiB + 100;
		ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &r[i]), 0);
		/* Its own MR, over the same dma-buf, at its offset. */
		ck_assert_int_eq(h.plan.how, GPU_MR_DMABUF);
		ck_assert(h.fd_open);
		ck_assert_int_eq(h.fd_size, (off_t)(10 * MiB));
		ck_assert_uint_eq(h.plan.offset, (uint64_t)i * MiB + 100);
		ck_assert_uint_eq(h.iova % unit_gpu_page_size(), 100);
	}
	ck_assert_int_eq(unit_gpu_count_fds(), fds_before + 1);
	ck_assert_int_eq(h.live_mrs, 6);
	/* Charged once: 10 MiB of 16, so another 10 MiB allocation does not fit. */
	struct gpu_reg_req other_alloc = req;
	other_alloc.fd = fd2;
	other_alloc.offset = 0;
	other_alloc.buffer_id = 78;
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &other_alloc, why, sizeof(why), &bad),
			 RDMAX_E_GPU_TOO_LARGE);
	/* Past the shared dma-buf; another client's buffer ids name nothing of this one. */
	req.offset = 10 * MiB - 4096;
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &bad),
			 RDMAX_E_OUT_OF_RANGE);
	req.offset = 0;
	ck_assert_int_eq(gpu_register(gpu, &t, &other, &req, why, sizeof(why), &bad),
			 RDMAX_E_NOT_FOUND);
	ck_assert_ptr_nonnull(strstr(why, "buffer 77"));
	req.buffer_id = 0;
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &bad),
			 RDMAX_E_NOT_FOUND);
	req.buffer_id = 77;
	/* The dma-buf goes with its last region, and with it the charge. */
	for (int i = 0; i < 5; i++) {
		region_deregister(&t, r[i], NULL, NULL);
	}
	ck_assert_int_eq(unit_gpu_count_fds(), fds_before + 1);
	region_deregister(&t, r[5], NULL, NULL);
	ck_assert_int_eq(unit_gpu_count_fds(), fds_before);
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &bad),
			 RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &other_alloc, why, sizeof(why), &bad), 0);
	region_deregister(&t, bad, NULL, NULL);
	ck_assert_int_eq(h.live_mrs, 0);
	gpu_destroy(gpu);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	close(fd);
	close(fd2);
}
END_TEST

START_TEST(daemon_checks_bus_id)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *r;
	CUipcMemHandle handle;
	char root[64], why[320] = "";
	int fd = unit_gpu_memfd(MiB);

	fake_cuda_init(&cu);
	unit_gpu_sysfs(root, sizeof(root), 0, true);
	unit_gpu_table_with_hook(&t, &h);
	struct gpu_params p = {.sysfs_root = root,
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = unit_gpu_accept_memfd,
			       .cuda = &cu.table};
	struct gpu_reg_req req = {
		.kind = REGION_GPU_DMABUF, .fd = fd, .length = 4096, .bus_id = "0000:99:00.0"};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	/* Not a GPU of this node, not a bus id at all, or none where GPUs are known. */
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "0000:99:00.0"));
	req.bus_id = "../../etc";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	req.bus_id = NULL;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	req.bus_id = "0000:3B:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r), 0);
	region_deregister(&t, r, NULL, NULL);
	/* peermem: the opened memory must be on the GPU the client named. */
	CUdeviceptr alloc = fake_cuda_alloc(&cu, 4 * MiB, 1); /* 0000:86:00.0 */
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, alloc, &handle), CUDA_SUCCESS);
	struct gpu_reg_req ipc = {.kind = REGION_GPU_CUDA_IPC,
				  .length = MiB,
				  .bus_id = "0000:3b:00.0",
				  .ipc_handle = (const uint8_t *)&handle,
				  .ipc_handle_len = sizeof(handle)};
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &ipc, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "0000:86:00.0"));
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ipc.bus_id = "0000:86:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &ipc, why, sizeof(why), &r), 0);
	region_deregister(&t, r, NULL, NULL);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.retains, cu.releases);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	close(fd);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(daemon_flushes_before_imm)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *r0, *r1;
	char root[64], why[320] = "";
	int fd = unit_gpu_memfd(MiB);

	fake_cuda_init(&cu);
	unit_gpu_sysfs(root, sizeof(root), 0, false);
	unit_gpu_table_with_hook(&t, &h);
	struct gpu_params p = {.sysfs_root = root,
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = unit_gpu_accept_memfd,
			       .cuda_library = "libcuda-not-here.so.1"};
	/* No GPU region: nothing to flush, CUDA not even loaded. */
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(gpu_flush_writes(NULL), 0);

	/* Device 0 does not order GPUDirect writes for its own kernels: flushed, device 1 not. */
	p.cuda = &cu.table;
	p.cuda_library = NULL;
	cu.ordering[0] = 0;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	struct gpu_reg_req req = {
		.kind = REGION_GPU_DMABUF, .fd = fd, .length = 4096, .bus_id = "0000:86:00.0"};
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r1), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 0);
	ck_assert_int_eq(cu.flushes, 0);
	req.bus_id = "0000:3b:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r0), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 1);
	ck_assert_int_eq(cu.flushes, 1);
	ck_assert_ptr_eq(cu.last_flush_ctx, FAKE_CUDA_PRIMARY_CTX(0));
	ck_assert_int_eq(cu.ctx_depth, 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 1);
	ck_assert_int_eq(cu.flushes, 2);
	/* A GPU that needs the flush but cannot do it: said once, not pretended. */
	cu.flush_options[0] = 0;
	region_deregister(&t, r0, NULL, NULL);
	region_deregister(&t, r1, NULL, NULL);
	gpu_destroy(gpu);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r0), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), -EOPNOTSUPP);
	ck_assert_int_eq(cu.flushes, 2);
	region_deregister(&t, r0, NULL, NULL);
	ck_assert_int_eq(h.live_mrs, 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.retains, cu.releases);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	close(fd);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(daemon_peermem_owner_gone)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *r;
	CUipcMemHandle handle;
	char root[64], why[320] = "";
	int owner;

	fake_cuda_init(&cu);
	unit_gpu_sysfs(root, sizeof(root), 0, true);
	unit_gpu_table_with_hook(&t, &h);
	h.watch = &cu.ipc_closes;
	CUdeviceptr alloc = fake_cuda_alloc(&cu, 4 * MiB, 0);
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, alloc, &handle), CUDA_SUCCESS);
	struct gpu_params p = {.sysfs_root = root, .verbs = true, .cuda = &cu.table};
	struct gpu_reg_req req = {.kind = REGION_GPU_CUDA_IPC,
				  .length = MiB,
				  .bus_id = "0000:3b:00.0",
				  .ipc_handle = (const uint8_t *)&handle,
				  .ipc_handle_len = sizeof(handle)};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &r), 0);
	/* The client dies with a job still using the region (session_close deregisters). */
	region_get(r);
	region_deregister(&t, r, NULL, NULL);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 1);
	ck_assert_int_eq(h.live_mrs, 1);
	/* The last job lets go: the MR goes first, then the mapping, nothing later. */
	region_put(&t, r);
	ck_assert_int_eq(h.live_mrs, 0);
	ck_assert_int_eq(h.watch_at_removal, 0);
	ck_assert_int_eq(cu.ipc_closes, 1);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ck_assert_int_eq(cu.ctx_depth, 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.retains, cu.releases);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(daemon_peermem_open_close)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct region *r, *r2;
	struct fake_cuda cu;
	CUipcMemHandle handle;
	char root[64], why[320] = "";

	fake_cuda_init(&cu);
	unit_gpu_sysfs(root, sizeof(root), 0, true);
	unit_gpu_table_with_hook(&t, &h);
	/* The client's allocation, and its handle. */
	CUdeviceptr alloc = fake_cuda_alloc(&cu, 4 * MiB, 0);
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, alloc, &handle), CUDA_SUCCESS);
	struct gpu_params p = {.sysfs_root = root, .verbs = true, .cuda = &cu.table};
	struct gpu_reg_req req = {.kind = REGION_GPU_CUDA_IPC,
				  .offset = MiB + 64,
				  .length = MiB,
				  .access = RDMAX_ACCESS_REMOTE_WRITE,
				  .bus_id = "0000:3B:00.0",
				  .ipc_handle = (const uint8_t *)&handle,
				  .ipc_handle_len = sizeof(handle)};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r), 0);
	/* Opened once, in the GPU's primary context, which is not left current. */
	ck_assert_int_eq(cu.ipc_opens, 1);
	ck_assert_int_eq(cu.ctx_depth, 0);
	ck_assert_int_eq(r->kind, REGION_GPU_CUDA_IPC);
	ck_assert_int_eq(h.plan.how, GPU_MR_ADDR);
	const struct fake_alloc *m = fake_cuda_find(&cu, (CUdeviceptr)(uintptr_t)h.plan.addr);
	ck_assert_ptr_nonnull(m);
	ck_assert(m->mapping);
	ck_assert_uint_eq(m->of, alloc);
	ck_assert_uint_eq((uintptr_t)h.plan.addr, m->base + MiB + 64);
	ck_assert_uint_eq(h.iova % unit_gpu_page_size(),
			  (m->base + MiB + 64) % unit_gpu_page_size());
	/* Past the allocation: the mapping is closed again. */
	req.offset = 4 * MiB - 4096;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_OUT_OF_RANGE);
	ck_assert_int_eq(cu.ipc_closes, 1);
	/* A handle of the wrong size, an unknown GPU, a garbage handle. */
	req.offset = 0;
	req.ipc_handle_len = 10;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	req.ipc_handle_len = sizeof(handle);
	req.bus_id = "0000:99:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "0000:99:00.0"));
	req.bus_id = "0000:3b:00.0";
	uint8_t junk[64];
	memset(junk, 0x5a, sizeof(junk));
	req.ipc_handle = junk;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "cuIpcOpenMemHandle"));
	/* Deregistration closes the mapping after the devices let go. */
	ck_assert_int_eq(cu.ipc_closes, 1);
	region_deregister(&t, r, NULL, NULL);
	ck_assert_int_eq(cu.ipc_closes, 2);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ck_assert_int_eq(h.live_mrs, 0);
	/* A region still registered at shutdown is closed by gpu_destroy(). */
	req.ipc_handle = (const uint8_t *)&handle;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	region_deregister(&t, r2, NULL, NULL);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	unit_gpu_drop_mrs(&t, &h);
	gpu_destroy(gpu);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ck_assert_int_eq(cu.retains, cu.releases);
	ck_assert_int_eq(cu.ctx_depth, 0);
	region_table_fini(&t);

	/* Without libcuda the fallback is refused by name. */
	unit_gpu_table_with_hook(&t, &h);
	p.cuda = NULL;
	p.cuda_library = "libcuda-not-here.so.1";
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_DRIVER_MISSING);
	ck_assert_ptr_nonnull(strstr(why, "libcuda"));
	gpu_destroy(gpu);
	region_table_fini(&t);

	/* Without nvidia_peermem. */
	unit_gpu_rm_tree(root);
	unit_gpu_sysfs(root, sizeof(root), 0, false);
	unit_gpu_table_with_hook(&t, &h);
	p.cuda = &cu.table;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "nvidia_peermem"));
	gpu_destroy(gpu);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	fake_cuda_fini(&cu);
}
END_TEST

/* The engine never copies GPU memory within the node: it has no host mapping to copy. */
static int g_done_err;
static char g_done_msg[256];
static int g_done;

static void on_done(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes)
{
	g_done++;
	g_done_err = err;
	snprintf(g_done_msg, sizeof(g_done_msg), "%s", message ? message : "");
}

static void submit_local_write(struct engine *e, struct job_owner *owner, uint64_t id,
			       const struct region *from, const uint8_t *desc, size_t desc_len)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;

	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_WRITE;
	job.write = &w;
	w.local_region = from->id;
	w.length = 4096;
	w.remote_desc.data = (uint8_t *)desc;
	w.remote_desc.len = desc_len;
	engine_submit(e, owner, &job);
}

START_TEST(engine_refuses_same_node_gpu_copies)
{
	struct rdmaxd d;
	struct engine *engine;
	struct job_owner owner;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct region *gpu_region, *host;
	uint8_t gdesc[DESC_MAX_BYTES], hdesc[DESC_MAX_BYTES];
	char why[320];
	int dmabuf = unit_gpu_memfd(MiB);
	int memfd = memfd_create("host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	struct gpu_params p = {.sysfs_root = "/nonexistent",
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = unit_gpu_accept_memfd};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF,
				  .fd = dmabuf,
				  .length = 65536,
				  .access = RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ};

	memset(&d, 0, sizeof(d));
	config_defaults(&d.cfg);
	d.loop = uv_default_loop();
	d.instance_id = 0x5eed;
	unit_gpu_table_with_hook(&d.regions, &h);
	ck_assert_int_eq(imm_table_init(&d.imm, 16, NULL, NULL), 0);
	ck_assert_int_eq(engine_create(&d, on_done, &engine), 0);
	ck_assert_int_eq(job_owner_init(&owner), 0);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &d.regions, &owner, &req, why, sizeof(why), &gpu_region),
			 0);
	ck_assert_int_eq(ftruncate(memfd, 65536), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(region_register_host_fd(
				 &d.regions, &owner, memfd, 0, 65536,
				 RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ, &host),
			 0);
	struct endpoint ep = {.transport = ENDPOINT_TCP, .port = 9};
	snprintf(ep.addr, sizeof(ep.addr), "127.0.0.1");
	int glen = region_desc_encode(&d.regions, gpu_region, "n", &ep, 1, gdesc, sizeof(gdesc));
	int hlen = region_desc_encode(&d.regions, host, "n", &ep, 1, hdesc, sizeof(hdesc));
	ck_assert_int_gt(glen, 0);
	ck_assert_int_gt(hlen, 0);

	/* Host into GPU, GPU into host: a named refusal, not a copy through NULL. */
	submit_local_write(engine, &owner, 1, host, gdesc, (size_t)glen);
	ck_assert_int_eq(g_done, 1);
	ck_assert_int_eq(g_done_err, RDMAX_E_GPU_NEEDS_RDMA);
	ck_assert_ptr_nonnull(strstr(g_done_msg, "GPU memory"));
	submit_local_write(engine, &owner, 2, gpu_region, hdesc, (size_t)hlen);
	ck_assert_int_eq(g_done, 2);
	ck_assert_int_eq(g_done_err, RDMAX_E_GPU_NEEDS_RDMA);
	/* Host to host on the same node still copies. */
	submit_local_write(engine, &owner, 3, host, hdesc, (size_t)hlen);
	ck_assert_int_eq(g_done, 3);
	ck_assert_int_eq(g_done_err, 0);

	job_owner_leave(engine, &owner);
	region_deregister(&d.regions, gpu_region, NULL, NULL);
	region_deregister(&d.regions, host, NULL, NULL);
	engine_destroy(engine);
	gpu_destroy(gpu);
	imm_table_fini(&d.imm);
	region_table_fini(&d.regions);
	uv_run(uv_default_loop(), UV_RUN_NOWAIT);
	close(memfd);
	close(dmabuf);
}
END_TEST

Suite *gpu_suite(void)
{
	Suite *s = suite_create("gpu");
	TCase *tc = tcase_create("gpu");

	tcase_set_timeout(tc, 10);
	gpu_client_add_tests(tc);
	gpu_topo_add_tests(tc);
	tcase_add_test(tc, daemon_dmabuf_check_is_real);
	tcase_add_test(tc, daemon_dmabuf_registration);
	tcase_add_test(tc, daemon_paths_and_capabilities);
	tcase_add_test(tc, daemon_bar1_budget);
	tcase_add_test(tc, daemon_shared_dmabuf);
	tcase_add_test(tc, daemon_checks_bus_id);
	tcase_add_test(tc, daemon_flushes_before_imm);
	tcase_add_test(tc, daemon_peermem_open_close);
	tcase_add_test(tc, daemon_peermem_owner_gone);
	gpu_pool_add_tests(tc);
	tcase_add_test(tc, engine_refuses_same_node_gpu_copies);
	suite_add_tcase(s, tc);
	return s;
}
