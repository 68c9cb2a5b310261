/* SPDX-License-Identifier: MIT */
/*
 * The daemon's GPU-to-NIC topology (gpu_topo.c) read from a fake sysfs tree,
 * and the tree itself, which the daemon-side cases of the suite "gpu" use too.
 */
#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../client-lib/gpu.h"
#include "test_gpu.h"

/* ================================================================ fake sysfs */

static void mkdirs(const char *root, const char *rel)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *p = path + strlen(root) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	}
	mkdir(path, 0755);
}

static void put(const char *root, const char *rel, const char *text)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static void link_to(const char *root, const char *rel_link, const char *target)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", root, rel_link);
	ck_assert_int_eq(symlink(target, path), 0);
}

/* A PCI function under /devices with its /bus/pci/devices link. */
static void pci_dev(const char *root, const char *dev_path, const char *vendor, const char *klass,
		    int numa)
{
	char rel[300], text[32], link[400], target[400];
	const char *name = strrchr(dev_path, '/') + 1;

	snprintf(rel, sizeof(rel), "devices/%s", dev_path);
	mkdirs(root, rel);
	snprintf(link, sizeof(link), "%s/vendor", rel);
	put(root, link, vendor);
	snprintf(link, sizeof(link), "%s/class", rel);
	put(root, link, klass);
	snprintf(link, sizeof(link), "%s/numa_node", rel);
	snprintf(text, sizeof(text), "%d\n", numa);
	put(root, link, text);
	snprintf(link, sizeof(link), "bus/pci/devices/%s", name);
	snprintf(target, sizeof(target), "../../../devices/%s", dev_path);
	link_to(root, link, target);
}

static void rdma_dev(const char *root, const char *name, const char *dev_path)
{
	char rel[256], target[400];

	snprintf(rel, sizeof(rel), "class/infiniband/%s", name);
	mkdirs(root, rel);
	if (dev_path) {
		snprintf(rel, sizeof(rel), "class/infiniband/%s/device", name);
		snprintf(target, sizeof(target), "../../../devices/%s", dev_path);
		link_to(root, rel, target);
	}
}

#define GPU_A_PATH "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:3b:00.0"
#define NIC_0_PATH "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:3c:00.0"
#define NIC_1_PATH "pci0000:00/0000:00:02.0/0000:05:00.0"
#define GPU_B_PATH "pci0000:80/0000:80:01.0/0000:86:00.0"
#define NIC_2_PATH "pci0000:80/0000:80:01.0/0000:86:00.1"
#define GPU_C_PATH "pci0000:40/0000:40:01.0/0000:41:00.0"

/*
 * GPU A (the fake's device 0) behind a PCIe switch with mlx5_0; mlx5_1 on
 * another root port of the same host bridge; GPU B (device 1) and mlx5_2 as
 * two functions of one root port on NUMA node 1; GPU C alone on its host
 * bridge of NUMA node 0; rxe0 without a PCI device; a NIC that is not a GPU.
 */
void unit_gpu_sysfs(char *root, size_t size, uint64_t bar1_a, bool peermem)
{
	char text[256];

	snprintf(root, size, "/tmp/rdmax-sysfs-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	mkdirs(root, "bus/pci/devices");
	mkdirs(root, "class/infiniband");
	pci_dev(root, GPU_A_PATH, "0x10de\n", "0x030200\n", 0);
	pci_dev(root, NIC_0_PATH, "0x15b3\n", "0x020700\n", 0);
	pci_dev(root, NIC_1_PATH, "0x15b3\n", "0x020700\n", 0);
	pci_dev(root, GPU_B_PATH, "0x10de\n", "0x030000\n", 1);
	pci_dev(root, NIC_2_PATH, "0x15b3\n", "0x020700\n", 1);
	pci_dev(root, GPU_C_PATH, "0x10de\n", "0x030200\n", 0);
	rdma_dev(root, "mlx5_0", NIC_0_PATH);
	rdma_dev(root, "mlx5_1", NIC_1_PATH);
	rdma_dev(root, "mlx5_2", NIC_2_PATH);
	rdma_dev(root, "rxe0", NULL);
	/* BAR0 (16 MiB of registers), then BAR1. */
	snprintf(text, sizeof(text),
		 "0x00000000d0000000 0x00000000d0ffffff 0x0000000000040200\n"
		 "0x0000380000000000 0x%016llx 0x000000000014220c\n"
		 "0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
		 (unsigned long long)(0x380000000000ull + bar1_a - 1));
	put(root, "devices/" GPU_A_PATH "/resource", text);
	if (peermem) {
		mkdirs(root, "module/nvidia_peermem");
	}
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

void unit_gpu_rm_tree(const char *root)
{
	nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ================================================================ topology */

START_TEST(topology_from_sysfs)
{
	char root[64];
	struct gpu_topology t;
	const struct gpu_dev *a, *b, *c;

	unit_gpu_sysfs(root, sizeof(root), 256 * MiB, false);
	ck_assert_int_eq(gpu_topology_scan(root, &t), 0);
	ck_assert_uint_eq(t.n_nics, 4);
	ck_assert_uint_eq(t.n_gpus, 3); /* the Mellanox functions are not GPUs */
	a = gpu_topology_find(&t, "0000:3B:00.0");
	b = gpu_topology_find(&t, "0000:86:00.0");
	c = gpu_topology_find(&t, "0000:41:00.0");
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_nonnull(c);
	ck_assert_str_eq(a->bus_id, "0000:3b:00.0");
	ck_assert_str_eq(a->pci_path, "/devices/" GPU_A_PATH);
	ck_assert_uint_eq(a->bar1_bytes, 256 * MiB);
	ck_assert_uint_eq(b->bar1_bytes, 0);
	ck_assert_int_eq(b->numa_node, 1);
	/* A: the switch peer, then the same host bridge, then the other NUMA node, rxe last. */
	ck_assert_str_eq(t.nics[a->nics[0]].name, "mlx5_0");
	ck_assert_int_eq(a->closeness[0], 4);
	ck_assert_str_eq(t.nics[a->nics[1]].name, "mlx5_1");
	ck_assert_int_eq(a->closeness[1], 2);
	ck_assert_str_eq(t.nics[a->nics[2]].name, "mlx5_2");
	ck_assert_int_eq(a->closeness[2], 0);
	ck_assert_str_eq(t.nics[a->nics[3]].name, "rxe0");
	ck_assert_int_eq(a->closeness[3], -1);
	/* B shares its root port with mlx5_2. */
	ck_assert_str_eq(t.nics[b->nics[0]].name, "mlx5_2");
	ck_assert_int_eq(b->closeness[0], 3);
	/* C has no NIC on its host bridge: the same NUMA node is next best. */
	ck_assert_int_eq(c->closeness[0], 1);
	ck_assert_str_eq(gpu_closeness_text(4), "same PCIe switch");
	ck_assert_ptr_nonnull(strstr(gpu_closeness_text(0), "NUMA"));
	ck_assert_ptr_nonnull(strstr(gpu_closeness_text(-1), "unknown"));
	ck_assert_int_eq(gpu_closeness("/devices/pci0000:00/x", 0, "", 0), -1);
	ck_assert(!gpu_peermem_loaded(root));

	/* What the verbs transport asks: its devices, nearest first. */
	struct gpu_params p = {.sysfs_root = root, .verbs = true};
	struct gpu *gpu;
	const char *names[4] = {"mlx5_1", "rxe0", "mlx5_0", "mlx5_2"};
	uint32_t order[4];
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_nearest_devices(gpu, "0000:3b:00.0", names, 4, order), 4);
	ck_assert_uint_eq(order[0], 2);
	ck_assert_uint_eq(order[1], 0);
	ck_assert_uint_eq(order[2], 3);
	ck_assert_uint_eq(order[3], 1);
	ck_assert_int_eq(gpu_nearest_devices(gpu, "0000:99:00.0", names, 4, order),
			 RDMAX_E_NOT_FOUND);
	for (uint32_t i = 0; i < 4; i++) {
		ck_assert_uint_eq(order[i], i);
	}
	ck_assert_uint_eq(gpu_topology(gpu)->n_gpus, 3);
	gpu_destroy(gpu);

	/* No tree at all: an empty topology, not an error. */
	ck_assert_int_eq(gpu_topology_scan("/nonexistent-sysfs", &t), 0);
	ck_assert_uint_eq(t.n_gpus + t.n_nics, 0);
	unit_gpu_rm_tree(root);
}
END_TEST

void gpu_topo_add_tests(TCase *tc)
{
	tcase_add_test(tc, topology_from_sysfs);
}
