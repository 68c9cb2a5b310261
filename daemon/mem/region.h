/* SPDX-License-Identifier: MIT */
/*
 * Registered memory. A region is fd-backed memory the daemon mapped or
 * imported on behalf of one client. In-flight jobs hold references; a region
 * being deregistered stays until the last reference goes. Never does network
 * I/O: transports are told about new and departing regions through hooks.
 */
#ifndef RDMAXD_REGION_H
#define RDMAXD_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "desc.h"
#include "hmap.h"
#include "util.h"

/* Kind of memory behind a region; values equal rdmax.v1.RegionKind. */
enum region_kind {
	REGION_HOST_FD = 0,      /* memfd / shm / hugetlbfs mapped by the daemon */
	REGION_GPU_DMABUF = 1,   /* GPU memory as a dma-buf (verbs only) */
	REGION_GPU_CUDA_IPC = 2, /* GPU memory as a CUDA IPC handle (peermem) */
	REGION_POOL_SLICE = 3,   /* slice of a daemon-owned pool */
	REGION_KIND_MAX,         /* terminator */
};

#define REGION_MAX_DEVICES 8

struct region;
typedef void (*region_released_cb)(struct region *region, void *arg);

struct region {
	uint64_t id;  /* daemon-wide, never reused within one daemon start */
	uint64_t key; /* random; descriptors must carry it */
	enum region_kind kind;
	uint32_t access; /* RDMAX_ACCESS_* */
	uint64_t length;
	uint8_t *addr;  /* daemon's mapping of the region start (host kinds) */
	void *map_base; /* what to munmap */
	size_t map_length;
	void *owner;                    /* the client session that registered it */
	uint32_t uid;                   /* the owner's uid (region_table.owner_uid); 0 without */
	struct list_node owner_link;    /* in the owner's list of regions */
	uint32_t refs;                  /* 1 for the registration + 1 per job holding it */
	bool deregistering;             /* no new jobs; freed at refs == 0 */
	bool writable;                  /* mapped writable (fd opened read-write) */
	region_released_cb released_cb; /* called once freed (deregistration reply) */
	void *released_arg;
	void *transport_data[REGION_MAX_DEVICES]; /* per-device MRs of the verbs transport */
	/*
	 * Kinds without a host mapping (addr NULL: GPU memory, GPU pool slices):
	 * the address whose low bits the region's iova takes in place of addr's,
	 * so that the iova shares the page offset of the memory (the dma-buf
	 * offset, or the daemon's device pointer for peermem).
	 */
	uint64_t gpu_addr;
	void *gpu;                           /* struct gpu_region (gpu.c); NULL for host kinds */
	void (*fini)(struct region *region); /* after the hooks' removal, before the free */
};

/* Hooks a transport installs to learn about regions (verbs: ibv_reg_mr / dereg). */
struct region_hooks {
	int (*added)(void *ctx, struct region *region);
	void (*removed)(void *ctx, struct region *region);
	void *ctx;
};

struct region_table {
	struct hmap by_id;
	uint64_t next_id;
	uint64_t instance_id; /* this daemon start */
	uint64_t total_bytes; /* all registered bytes */
	uint32_t count;
	struct region_hooks hooks[2];
	uint32_t n_hooks;
	/*
	 * The uid of a region's owner, asked before the hooks run (the verbs
	 * transport's per-uid protection domains need it); NULL: every region
	 * gets uid 0. Set by the layer that knows what an owner is.
	 */
	uint32_t (*owner_uid)(void *owner);
};

int region_table_init(struct region_table *table, uint64_t instance_id);
void region_table_fini(struct region_table *table);
int region_table_add_hooks(struct region_table *table, const struct region_hooks *hooks);

/*
 * Map `length` bytes at `offset` of a host fd (memfd with F_SEAL_SHRINK, or a
 * shm/hugetlbfs file) and register it. The fd is not kept. Errors:
 * RDMAX_E_INVALID_ARGUMENT (bad access bits, zero length, misaligned offset),
 * RDMAX_E_PERMISSION_DENIED (memfd without F_SEAL_SHRINK),
 * RDMAX_E_OUT_OF_RANGE (range past the end of the file), -errno from mmap.
 */
int region_register_host_fd(struct region_table *table, void *owner, int fd, uint64_t offset,
			    uint64_t length, uint32_t access, struct region **ret_region);

/*
 * Register a region another module prepared (GPU memory, pool slices): the
 * caller allocated it with calloc and set kind, access, length, owner and
 * its own fields; a non-zero key is kept (pool slices share the high bits
 * of their pool's key), otherwise one is drawn. Assigns the id and runs the
 * hooks (the verbs transport registers it with its devices). On failure the
 * region is not in the table and still the caller's to free.
 */
int region_insert(struct region_table *table, struct region *region);

/*
 * The namespace an imm landing in this region counts in (imm.h): its
 * client, or NULL once it is being deregistered (its client may be gone and
 * the client's memory reused by another).
 */
static inline void *region_imm_owner(const struct region *region)
{
	return region->deregistering ? NULL : region->owner;
}

/* The owner's region with this id, or NULL (unknown, other owner, or deregistering). */
struct region *region_find_owned(struct region_table *table, void *owner, uint64_t id);

/*
 * Validate a peer's access to [offset, offset+length) of a region named by a
 * descriptor: instance and key must match (else RDMAX_E_NOT_FOUND "stale"),
 * the range must fit (RDMAX_E_OUT_OF_RANGE), and the access bit must be set
 * (RDMAX_E_PERMISSION_DENIED). On success takes a reference.
 */
int region_get_remote(struct region_table *table, uint64_t instance_id, uint64_t id, uint64_t key,
		      uint64_t offset, uint64_t length, uint32_t need_access,
		      struct region **ret_region);

/* Check a local range of an owned region (RDMAX_E_OUT_OF_RANGE). */
int region_check_range(const struct region *region, uint64_t offset, uint64_t length);

void region_get(struct region *region);
void region_put(struct region_table *table, struct region *region);

/*
 * Start deregistration: no new jobs may use it; cb runs once the last job let
 * go (possibly before this returns).
 */
void region_deregister(struct region_table *table, struct region *region, region_released_cb cb,
		       void *arg);

/* Encode the descriptor of a region with the given endpoints into buf. */
int region_desc_encode(const struct region_table *table, const struct region *region,
		       const char *node_name, const struct endpoint *endpoints,
		       uint32_t n_endpoints, uint8_t *buf, size_t buf_size);

#endif
