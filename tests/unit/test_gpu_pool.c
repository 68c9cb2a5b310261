/* SPDX-License-Identifier: MIT */
/*
 * GPU pools (gpu_pool.c) without a GPU: pools made at start on every GPU the
 * fake CUDA driver shows, slices leased and returned, and the paths a pool
 * takes or refuses. Cases of the suite "gpu".
 */
#include <check.h>
#include <string.h>

#include "../../client-lib/gpu.h"
#include "fake_cuda.h"
#include "test_gpu.h"

struct pool_seen {
	int n;
	struct gpu_pool_info info[4];
};

static void note_pool(void *arg, const struct gpu_pool_info *info)
{
	struct pool_seen *s = arg;

	if (s->n < 4) {
		s->info[s->n++] = *info;
	}
}

START_TEST(daemon_pools)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *s1, *s2, *s3, *none;
	struct gpu_lease l1, l2, l3;
	struct pool_seen seen = {0};
	char why[320] = "";
	int owner;

	fake_cuda_init(&cu);
	cu.dmabuf[1] = false; /* device 1 cannot export: its pool goes through peermem */
	unit_gpu_table_with_hook(&t, &h);
	struct gpu_params p = {.sysfs_root = "/nonexistent",
			       .verbs = true,
			       .dmabuf = true,
			       .pool_bytes = 4 * MiB + 1,
			       .cuda = &cu.table};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	/* Device 1 without peermem: the start-up refuses rather than half-works. */
	ck_assert_int_lt(gpu_pools_start(gpu, &t), 0);
	gpu_stop(gpu, &t);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.mem_allocs, cu.mem_frees);
	ck_assert_uint_eq(t.count, 0);

	cu.dmabuf[1] = true;
	cu.c2c[1] = true; /* a Grace GPU: its pool's dma-buf is mapped through PCIe */
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_pools_start(gpu, &t), 0);
	ck_assert_uint_eq(cu.last_export_flags, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
	ck_assert_int_eq(cu.ctx_depth, 0);
	ck_assert_uint_eq(t.count, 2); /* one registration per GPU */
	ck_assert_int_eq(h.plan.how, GPU_MR_DMABUF);
	ck_assert(h.fd_open);
	gpu_for_each_pool(gpu, note_pool, &seen);
	ck_assert_int_eq(seen.n, 2);
	ck_assert_str_eq(seen.info[0].bus_id, "0000:3b:00.0");
	ck_assert_str_eq(seen.info[0].path, "dmabuf");
	ck_assert_uint_eq(seen.info[0].bytes, 4 * MiB + GPU_POOL_ALIGN); /* rounded up */
	ck_assert_str_eq(seen.info[1].bus_id, "0000:86:00.0");

	/* Slices by bus id (any case) and by pool id; offsets on GPU_POOL_ALIGN. */
	ck_assert_int_eq(gpu_pool_alloc(gpu, &t, &owner, 0, "0000:3B:00.0", 100, 0, &l1, why,
					sizeof(why), &s1),
			 0);
	ck_assert_int_eq(gpu_pool_alloc(gpu, &t, &owner, 1, NULL, 2 * MiB,
					RDMAX_ACCESS_REMOTE_WRITE, &l2, why, sizeof(why), &s2),
			 0);
	ck_assert_uint_eq(l1.offset, 0);
	ck_assert_uint_eq(l2.offset, GPU_POOL_ALIGN);
	ck_assert_uint_eq(l1.pool_id, 1);
	ck_assert_str_eq(l1.bus_id, "0000:3b:00.0");
	ck_assert_int_eq(memcmp(l1.ipc_handle, "FAKEIPC", 8), 0);
	ck_assert_int_eq(s1->kind, REGION_POOL_SLICE);
	ck_assert_ptr_eq(s1->owner, &owner);
	ck_assert_uint_eq(s1->length, 100);
	/* Slices use the pool's MR, at the pool's iova plus their offset. */
	ck_assert_int_eq(h.plan.how, GPU_MR_SHARED);
	ck_assert(gpu_region_shares_mrs(s2));
	struct region *pool_region = NULL;
	for (size_t it = 0; hmap_next(&t.by_id, &it, NULL, (void **)&pool_region);) {
		if (pool_region->owner == NULL &&
		    strcmp(gpu_region_bus_id(pool_region), "0000:3b:00.0") == 0) {
			break;
		}
	}
	ck_assert_ptr_nonnull(pool_region);
	ck_assert_ptr_eq(s2->transport_data[0], pool_region->transport_data[0]);
	ck_assert_uint_eq(unit_gpu_iova(s2), unit_gpu_iova(pool_region) + GPU_POOL_ALIGN);
	ck_assert_uint_eq(s2->key >> 32, pool_region->key >> 32);
	ck_assert_uint_ne(s2->key, pool_region->key);
	ck_assert_str_eq(gpu_region_bus_id(s2), "0000:3b:00.0");
	/* Full, unknown, bad arguments. */
	ck_assert_int_eq(
		gpu_pool_alloc(gpu, &t, &owner, 1, NULL, 4 * MiB, 0, &l3, why, sizeof(why), &none),
		RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_ptr_nonnull(strstr(why, "no free range"));
	ck_assert_int_eq(
		gpu_pool_alloc(gpu, &t, &owner, 9, NULL, 4096, 0, &l3, why, sizeof(why), &none),
		RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(gpu_pool_alloc(gpu, &t, &owner, 0, "0000:99:00.0", 4096, 0, &l3, why,
					sizeof(why), &none),
			 RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(
		gpu_pool_alloc(gpu, &t, &owner, 1, NULL, 0, 0, &l3, why, sizeof(why), &none),
		RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(
		gpu_pool_alloc(gpu, &t, &owner, 1, NULL, 4096, 0x40, &l3, why, sizeof(why), &none),
		RDMAX_E_INVALID_ARGUMENT);
	/* Returned ranges coalesce: the whole pool is one range again. */
	region_deregister(&t, s1, NULL, NULL);
	ck_assert_int_eq(gpu_pool_alloc(gpu, &t, &owner, 1, NULL, GPU_POOL_ALIGN, 0, &l3, why,
					sizeof(why), &s3),
			 0);
	ck_assert_uint_eq(l3.offset, 0);
	region_deregister(&t, s3, NULL, NULL);
	/* A job still holding a slice keeps its range leased. */
	region_get(s2);
	region_deregister(&t, s2, NULL, NULL);
	seen.n = 0;
	gpu_for_each_pool(gpu, note_pool, &seen);
	ck_assert_uint_eq(seen.info[0].slices, 1);
	ck_assert_uint_eq(seen.info[0].leased, 2 * MiB);
	region_put(&t, s2);
	seen.n = 0;
	gpu_for_each_pool(gpu, note_pool, &seen);
	ck_assert_uint_eq(seen.info[0].slices, 0);
	ck_assert_uint_eq(seen.info[0].leased, 0);
	ck_assert_int_eq(gpu_pool_alloc(gpu, &t, &owner, 1, NULL, seen.info[0].bytes, 0, &l3, why,
					sizeof(why), &s3),
			 0);
	region_deregister(&t, s3, NULL, NULL);

	/* Shutdown: pools deregistered, memory freed, contexts released. */
	gpu_stop(gpu, &t);
	ck_assert_uint_eq(t.count, 0);
	ck_assert_int_eq(h.live_mrs, 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.mem_allocs, 4); /* two for the refused start-up, two here */
	ck_assert_int_eq(cu.mem_frees, 4);
	ck_assert_int_eq(cu.retains, cu.releases);
	region_table_fini(&t);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(daemon_pools_peermem_and_off)
{
	struct region_table t;
	struct unit_gpu_hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *s;
	struct gpu_lease l;
	char root[64], why[320] = "";
	int owner;

	fake_cuda_init(&cu);
	cu.n_devices = 1;
	unit_gpu_sysfs(root, sizeof(root), 0, true);
	unit_gpu_table_with_hook(&t, &h);
	struct gpu_params p = {.sysfs_root = root,
			       .verbs = true,
			       .mode = CONFIG_GPU_REG_PEERMEM,
			       .dmabuf = true,
			       .pool_bytes = MiB,
			       .cuda = &cu.table};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_pools_start(gpu, &t), 0);
	/* peermem: the pool registers at its device address. */
	ck_assert_int_eq(h.plan.how, GPU_MR_ADDR);
	ck_assert_ptr_nonnull(fake_cuda_find(&cu, (CUdeviceptr)(uintptr_t)h.plan.addr));
	ck_assert_int_eq(gpu_pool_alloc(gpu, &t, &owner, 0, "0000:3b:00.0", 4096, 0, &l, why,
					sizeof(why), &s),
			 0);
	/* A pool with a slice out at shutdown stays for the transport to tear down. */
	gpu_stop(gpu, &t);
	ck_assert_uint_eq(t.count, 2);
	unit_gpu_drop_mrs(&t, &h);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.mem_frees, 1);
	region_table_fini(&t);

	/* Pools off, or without an RDMA device: nothing allocated. */
	unit_gpu_table_with_hook(&t, &h);
	p.pool_bytes = 0;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_pools_start(gpu, &t), 0);
	ck_assert_int_eq(
		gpu_pool_alloc(gpu, &t, &owner, 1, NULL, 4096, 0, &l, why, sizeof(why), &s),
		RDMAX_E_NOT_FOUND);
	gpu_destroy(gpu);
	p.pool_bytes = MiB;
	p.verbs = false;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_pools_start(gpu, &t), 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.mem_allocs, 1);
	/* Configured, but no CUDA: start-up fails with the named error. */
	p.verbs = true;
	p.cuda = NULL;
	p.cuda_library = "libcuda-not-here.so.1";
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_pools_start(gpu, &t), RDMAX_E_GPU_DRIVER_MISSING);
	gpu_destroy(gpu);
	ck_assert_uint_eq(t.count, 0);
	region_table_fini(&t);
	unit_gpu_rm_tree(root);
	fake_cuda_fini(&cu);
}

void gpu_pool_add_tests(TCase *tc)
{
	tcase_add_test(tc, daemon_pools);
	tcase_add_test(tc, daemon_pools_peermem_and_off);
}
