/* SPDX-License-Identifier: MIT */
/*
 * A minimal protocol server around the daemon's real GPU registration
 * (gpu_register(), gpu_check_dmabuf(), gpu_mr_plan()) and region table, for
 * programs that drive librdmax's GPU path without a daemon: the device
 * check (real libcuda) and the fake GPU daemon of the Python tests (the
 * fake libcuda). Its region hook stops where the verbs transport would call
 * ibv_reg_dmabuf_mr(): no RDMA NIC is needed. Test code only.
 */
#ifndef RDMAX_TEST_GPU_SERVER_H
#define RDMAX_TEST_GPU_SERVER_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu.h"
#include "region.h"

/* What the region hook saw of the last registration. */
struct plan_seen {
	int n;
	struct gpu_mr_plan plan;
	uint64_t iova;
	uint64_t dmabuf_size; /* gpu_check_dmabuf() of the plan's fd */
	int check;            /* its result */
};

struct server {
	int lfd, cfd;
	char dir[64], path[108];
	pthread_t thread;
	struct region_table table;
	struct gpu *gpu;
	struct plan_seen seen;
	pthread_mutex_t lock;
	char why[320];
	const char *name;                                /* node name and daemon version */
	int (*check_dmabuf)(int fd, uint64_t *ret_size); /* NULL: gpu_check_dmabuf() */
	FILE *log;                                       /* NULL, or a line per request */
};

/*
 * Listen on a new socket (s->path, in a fresh temporary folder) and serve
 * one client in a thread (s->thread) until it leaves. The Welcome offers
 * RDMAX_CAP_VERBS and what the GPU module offers.
 * \param name node name and daemon version
 * \param check_dmabuf instead of gpu_check_dmabuf() (NULL: the real check)
 * \param log NULL, or where a line per registration and deregistration goes
 * \return 0 or -1 (errno set)
 */
int gpu_server_start(struct server *s, const char *name,
		     int (*check_dmabuf)(int fd, uint64_t *ret_size), FILE *log);

/* The thread's body: serves s->lfd's first client. */
void *gpu_server_main(void *arg);

#endif
