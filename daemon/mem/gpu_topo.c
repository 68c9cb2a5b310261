/* SPDX-License-Identifier: MIT */
/*
 * The node's GPU-to-NIC topology, read from sysfs: NVIDIA GPUs (their NUMA
 * node and BAR1 size), RDMA devices, how close each pair sits on the PCI
 * tree, and whether nvidia_peermem is loaded. The sysfs root is a parameter,
 * so tests run it over a fake tree.
 *
 * Only reads sysfs: never loads CUDA, never opens a device, never registers
 * memory. A file it cannot read leaves the field unknown, never an error.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gpu.h"
#include "gpu_internal.h"
#include "rdmax.h"
#include "util.h"

/* ---------------------------------------------------------------- topology */

const char *gpu_root_or_default(const char *root)
{
	return root && root[0] ? root : "/sys";
}

static bool read_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "re");
	bool ok;

	if (!f) {
		return false;
	}
	ok = fgets(buf, (int)size, f) != NULL;
	fclose(f);
	if (ok) {
		buf[strcspn(buf, "\n")] = '\0';
	}
	return ok;
}

static int read_numa(const char *dev_dir)
{
	char path[PATH_MAX + 32], line[32];

	snprintf(path, sizeof(path), "%s/numa_node", dev_dir);
	if (!read_line(path, line, sizeof(line))) {
		return -1;
	}
	return atoi(line) >= 0 ? atoi(line) : -1;
}

/* BAR1 of an NVIDIA GPU is its second memory resource: line 2 of `resource`. */
static uint64_t read_bar1(const char *dev_dir)
{
	char path[PATH_MAX + 32], line[128];
	unsigned long long start, end, flags;
	uint64_t size = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/resource", dev_dir);
	f = fopen(path, "re");
	if (!f) {
		return 0;
	}
	for (int i = 0; i < 2 && fgets(line, sizeof(line), f); i++) {
		if (i == 1 && sscanf(line, "%llx %llx %llx", &start, &end, &flags) == 3 &&
		    end > start) {
			size = (uint64_t)(end - start + 1);
		}
	}
	fclose(f);
	return size;
}

/* realpath of `link`, as a path below the (real) sysfs root; "" when it cannot be resolved. */
static void path_below_root(const char *real_root, const char *link, char *out, size_t size)
{
	char real[PATH_MAX];
	size_t n = strlen(real_root);

	out[0] = '\0';
	if (!realpath(link, real) || strncmp(real, real_root, n) != 0 || real[n] != '/') {
		return;
	}
	snprintf(out, size, "%s", real + n);
}

static void scan_nics(const char *root, const char *real_root, struct gpu_topology *t)
{
	char dir_path[GPU_PATH_MAX + 32];
	struct dirent *de;
	DIR *dir;

	snprintf(dir_path, sizeof(dir_path), "%.*s/class/infiniband", GPU_PATH_MAX, root);
	dir = opendir(dir_path);
	if (!dir) {
		return;
	}
	while ((de = readdir(dir)) && t->n_nics < GPU_NIC_MAX) {
		char link[PATH_MAX];
		struct gpu_nic *nic = &t->nics[t->n_nics];

		if (de->d_name[0] == '.') {
			continue;
		}
		snprintf(nic->name, sizeof(nic->name), "%.63s", de->d_name);
		snprintf(link, sizeof(link), "%s/%s/device", dir_path, de->d_name);
		/* Software devices (rxe, siw) have no PCI function: their path stays "". */
		path_below_root(real_root, link, nic->pci_path, sizeof(nic->pci_path));
		nic->numa_node = nic->pci_path[0] ? read_numa(link) : -1;
		t->n_nics++;
	}
	closedir(dir);
}

static void scan_gpus(const char *root, const char *real_root, struct gpu_topology *t)
{
	char dir_path[GPU_PATH_MAX + 32];
	struct dirent *de;
	DIR *dir;

	snprintf(dir_path, sizeof(dir_path), "%.*s/bus/pci/devices", GPU_PATH_MAX, root);
	dir = opendir(dir_path);
	if (!dir) {
		return;
	}
	while ((de = readdir(dir)) && t->n_gpus < GPU_MAX) {
		char dev_dir[GPU_PATH_MAX + 64], path[GPU_PATH_MAX + 96], vendor[16], klass[16];
		struct gpu_dev *g = &t->gpus[t->n_gpus];

		if (de->d_name[0] == '.' || strlen(de->d_name) >= RDMAX_CUDA_BUS_ID_MAX) {
			continue;
		}
		snprintf(dev_dir, sizeof(dev_dir), "%s/%s", dir_path, de->d_name);
		snprintf(path, sizeof(path), "%s/vendor", dev_dir);
		if (!read_line(path, vendor, sizeof(vendor)) || strcmp(vendor, "0x10de") != 0) {
			continue;
		}
		/* Display controllers: VGA (0x0300) and 3D (0x0302, data-centre GPUs). */
		snprintf(path, sizeof(path), "%s/class", dev_dir);
		if (!read_line(path, klass, sizeof(klass)) || strncmp(klass, "0x03", 4) != 0) {
			continue;
		}
		memset(g, 0, sizeof(*g));
		gpu_lower_bus_id(g->bus_id, de->d_name);
		path_below_root(real_root, dev_dir, g->pci_path, sizeof(g->pci_path));
		g->numa_node = read_numa(dev_dir);
		g->bar1_bytes = read_bar1(dev_dir);
		t->n_gpus++;
	}
	closedir(dir);
}

/* Shared leading components of two paths ("/devices/pci0000:00/0000:00:01.0/..."). */
static int shared_components(const char *a, const char *b)
{
	int shared = 0;

	for (;;) {
		while (*a == '/') {
			a++;
		}
		while (*b == '/') {
			b++;
		}
		size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
		if (la == 0 || la != lb || memcmp(a, b, la) != 0) {
			return shared;
		}
		shared++;
		a += la;
		b += lb;
	}
}

int gpu_closeness(const char *path_a, int numa_a, const char *path_b, int numa_b)
{
	if (!path_a || !path_b || !path_a[0] || !path_b[0]) {
		return -1;
	}
	/* "devices", then the host bridge, the root port, then switch ports. */
	int shared = shared_components(path_a, path_b);
	if (shared >= 4) {
		return 4;
	}
	if (shared == 3) {
		return 3;
	}
	if (shared == 2) {
		return 2;
	}
	return numa_a >= 0 && numa_a == numa_b ? 1 : 0;
}

const char *gpu_closeness_text(int closeness)
{
	switch (closeness) {
	case 4:
		return "same PCIe switch";
	case 3:
		return "same root port";
	case 2:
		return "same host bridge";
	case 1:
		return "same NUMA node";
	case 0:
		return "across NUMA nodes (CPU interconnect)";
	default:
		return "unknown (no PCI device)";
	}
}

/* Stable order by closeness, nearest first; unknown (-1) last. */
static void sort_by_closeness(uint32_t *idx, int *closeness, uint32_t n)
{
	for (uint32_t i = 1; i < n; i++) {
		uint32_t id = idx[i];
		int c = closeness[i];
		uint32_t j = i;
		while (j > 0 && closeness[j - 1] < c) {
			idx[j] = idx[j - 1];
			closeness[j] = closeness[j - 1];
			j--;
		}
		idx[j] = id;
		closeness[j] = c;
	}
}

int gpu_topology_scan(const char *sysfs_root, struct gpu_topology *ret_topo)
{
	const char *root = gpu_root_or_default(sysfs_root);
	char real_root[PATH_MAX];
	struct gpu_topology *t = calloc(1, sizeof(*t));

	if (!t) {
		return -ENOMEM;
	}
	if (realpath(root, real_root)) {
		scan_nics(root, real_root, t);
		scan_gpus(root, real_root, t);
	}
	for (uint32_t g = 0; g < t->n_gpus; g++) {
		struct gpu_dev *gd = &t->gpus[g];
		for (uint32_t i = 0; i < t->n_nics; i++) {
			gd->nics[i] = i;
			gd->closeness[i] = gpu_closeness(gd->pci_path, gd->numa_node,
							 t->nics[i].pci_path, t->nics[i].numa_node);
		}
		gd->n_nics = t->n_nics;
		sort_by_closeness(gd->nics, gd->closeness, gd->n_nics);
	}
	*ret_topo = *t;
	free(t);
	return 0;
}

const struct gpu_dev *gpu_topology_find(const struct gpu_topology *topo, const char *bus_id)
{
	if (!topo || !bus_id) {
		return NULL;
	}
	for (uint32_t g = 0; g < topo->n_gpus; g++) {
		if (strcasecmp(topo->gpus[g].bus_id, bus_id) == 0) {
			return &topo->gpus[g];
		}
	}
	return NULL;
}

int gpu_nearest_devices(const struct gpu *gpu, const char *bus_id, const char *const *names,
			uint32_t n, uint32_t *ret_order)
{
	const struct gpu_dev *gd = gpu ? gpu_topology_find(&gpu->topo, bus_id) : NULL;
	int closeness[64];

	for (uint32_t i = 0; i < n; i++) {
		ret_order[i] = i;
	}
	if (!gd || n > ARRAY_SIZE(closeness)) {
		return RDMAX_E_NOT_FOUND;
	}
	for (uint32_t i = 0; i < n; i++) {
		closeness[i] = -1;
		for (uint32_t k = 0; k < gd->n_nics; k++) {
			if (strcmp(gpu->topo.nics[gd->nics[k]].name, names[i]) == 0) {
				closeness[i] = gd->closeness[k];
				break;
			}
		}
	}
	sort_by_closeness(ret_order, closeness, n);
	return (int)n;
}

bool gpu_peermem_loaded(const char *sysfs_root)
{
	const char *root = gpu_root_or_default(sysfs_root);
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/kernel/mm/memory_peers/nv_mem/version", root);
	if (access(path, F_OK) == 0) {
		return true;
	}
	snprintf(path, sizeof(path), "%s/module/nvidia_peermem", root);
	return access(path, F_OK) == 0;
}
