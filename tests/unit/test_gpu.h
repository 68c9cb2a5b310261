/* SPDX-License-Identifier: MIT */
/*
 * What the files of the unit suite "gpu" share: the stand-in for the verbs
 * transport's region hook, dma-buf stand-ins, the fake sysfs tree, and the
 * functions that add each file's cases to the suite (test_gpu.c owns it).
 */
#ifndef RDMAXD_TEST_GPU_H
#define RDMAXD_TEST_GPU_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpu.h"
#include "region.h"

#define MiB (UINT64_C(1) << 20)

uint64_t unit_gpu_page_size(void);
/* The verbs transport's iova of a region: high bits from the key, low bits from the memory. */
uint64_t unit_gpu_iova(const struct region *r);
/* Open file descriptors of the process (leak checks). */
int unit_gpu_count_fds(void);

/* Stands in for the verbs transport's region hook on one device. */
struct unit_gpu_hook {
	uint64_t max_mr_size;
	bool dmabuf;
	int added, removed;
	int live_mrs;
	struct gpu_mr_plan plan;
	uint64_t iova;
	bool fd_open;
	off_t fd_size;
	const int *watch;     /* a counter to note when an MR goes (order checks) */
	int watch_at_removal; /* its value then */
};

/* A region table whose hooks are `h` (MR plans recorded, not registered). */
void unit_gpu_table_with_hook(struct region_table *t, struct unit_gpu_hook *h);
/* What the verbs transport's destroy does before gpu_destroy(): drop every MR left. */
void unit_gpu_drop_mrs(struct region_table *t, struct unit_gpu_hook *h);
/* Tests only: memfds stand in for dma-bufs. */
int unit_gpu_accept_memfd(int fd, uint64_t *ret_size);
int unit_gpu_memfd(uint64_t size);

/* A fake sysfs tree in a fresh directory (its path written to root): three GPUs, NICs at
 * every distance from them (test_gpu_topo.c says which). */
void unit_gpu_sysfs(char *root, size_t size, uint64_t bar1_a, bool peermem);
void unit_gpu_rm_tree(const char *root);

/* Each file's cases, added to the suite's one test case. */
void gpu_client_add_tests(TCase *tc);
void gpu_topo_add_tests(TCase *tc);
void gpu_pool_add_tests(TCase *tc);

#endif /* RDMAXD_TEST_GPU_H */
