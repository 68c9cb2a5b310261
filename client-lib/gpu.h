/* SPDX-License-Identifier: MIT */
/*
 * Internals of librdmax's GPU memory support (gpu.c) and the few client.c
 * functions it builds on; never installed. Like internal.h, names carry a
 * client_ prefix so they cannot collide with daemon modules in the unit-test
 * binary.
 */
#ifndef RDMAX_CLIENT_GPU_H
#define RDMAX_CLIENT_GPU_H

#include <stdint.h>

#include "cuda_table.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"

struct client_gpu;

/* ---- provided by client.c ---- */

/*
 * Send a RegisterRegion or PoolAlloc request (with \p fd attached, or none
 * when fd < 0) and make a region of the RegionReply. The region's address
 * is \p addr. On success the caller gets the reply too when \p ret_reply is
 * not NULL, and frees it with rdmax__v1__daemon_msg__free_unpacked().
 */
int client_region_request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd,
			  uint64_t length, void *addr, struct rdmax_region **ret_region,
			  Rdmax__V1__DaemonMsg **ret_reply);
/* Set a region's address after the request (pool slices are mapped afterwards). */
void client_region_set_addr(struct rdmax_region *region, void *addr);
/* The region is an allocation: rdmax_region_free() releases it, not rdmax_region_deregister(). */
void client_region_set_allocated(struct rdmax_region *region);
/* The client's GPU state slot (NULL until a GPU call needed it). */
struct client_gpu **client_gpu_slot(struct rdmax_client *c);

/* ---- provided by gpu.c ---- */

/* A region is being freed (deregistered, or the client closes): drop GPU bookkeeping. */
void client_gpu_region_freed(struct rdmax_client *c, struct rdmax_region *region);
/* rdmax_client_close(): after every region was freed. */
void client_gpu_free(struct rdmax_client *c);

/*
 * Unit tests only: make \p c call the CUDA driver through \p table (a fake)
 * instead of loading libcuda, or, with table NULL, load \p library instead
 * of libcuda.so.1. Not exported from the shared library, so applications
 * cannot reach it; must come before the client's first GPU call.
 */
int client_gpu_use_cuda(struct rdmax_client *c, const struct rdmax_cuda *table,
			const char *library);

#endif
