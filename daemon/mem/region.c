/* SPDX-License-Identifier: MIT */
/*
 * Registered memory: the table of regions, their mappings and reference
 * counts. A region lives while its registration or any job holds it; only
 * the last reference unmaps it, so a deregistration or a client that dies
 * mid-transfer never pulls memory from under a transfer in flight.
 * Never does network I/O.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "rdmax.h"
#include "region.h"

int region_table_init(struct region_table *table, uint64_t instance_id)
{
	memset(table, 0, sizeof(*table));
	table->next_id = 1;
	table->instance_id = instance_id;
	return hmap_init(&table->by_id, 256);
}

void region_table_fini(struct region_table *table)
{
	struct region *region;
	size_t iter = 0;

	/* Only reached at exit; regions still held are leaked mappings the kernel reclaims. */
	while (hmap_next(&table->by_id, &iter, NULL, (void **)&region)) {
		if (region->map_base) {
			munmap(region->map_base, region->map_length);
		}
		free(region);
	}
	hmap_fini(&table->by_id);
}

int region_table_add_hooks(struct region_table *table, const struct region_hooks *hooks)
{
	if (table->n_hooks >= ARRAY_SIZE(table->hooks)) {
		return -ENOSPC;
	}
	table->hooks[table->n_hooks++] = *hooks;
	return 0;
}

static int check_host_fd(int fd, uint64_t offset, uint64_t length)
{
	struct stat st;
	int seals;

	if (fstat(fd, &st) < 0) {
		return -errno;
	}
	if (!S_ISREG(st.st_mode)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/*
	 * A file the client can shrink would make our mapping SIGBUS on access:
	 * only files sealed against shrinking are accepted.
	 */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		return RDMAX_E_PERMISSION_DENIED;
	}
	if (offset > (uint64_t)st.st_size || length > (uint64_t)st.st_size - offset) {
		return RDMAX_E_OUT_OF_RANGE;
	}
	return 0;
}

int region_register_host_fd(struct region_table *table, void *owner, int fd, uint64_t offset,
			    uint64_t length, uint32_t access, struct region **ret_region)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct region *region;
	int ret;

	if (length == 0 ||
	    access & ~(uint32_t)(RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (offset > UINT64_MAX - length) {
		return RDMAX_E_OUT_OF_RANGE;
	}
	ret = check_host_fd(fd, offset, length);
	if (ret < 0) {
		return ret;
	}
	region = calloc(1, sizeof(*region));
	if (!region) {
		return -ENOMEM;
	}
	uint64_t map_offset = offset & ~(page - 1);
	uint64_t delta = offset - map_offset;
	region->map_length = (size_t)((delta + length + page - 1) & ~(page - 1));
	region->writable = true;
	region->map_base = mmap(NULL, region->map_length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
				(off_t)map_offset);
	if (region->map_base == MAP_FAILED && errno == EACCES) {
		/* A read-only fd can still be a write source or a remote read target. */
		region->writable = false;
		region->map_base = mmap(NULL, region->map_length, PROT_READ, MAP_SHARED, fd,
					(off_t)map_offset);
	}
	if (region->map_base == MAP_FAILED) {
		ret = -errno;
		region->map_base = NULL;
		goto out_free;
	}
	if (!region->writable && (access & RDMAX_ACCESS_REMOTE_WRITE)) {
		ret = RDMAX_E_PERMISSION_DENIED;
		goto out_unmap;
	}
	region->addr = (uint8_t *)region->map_base + delta;
	region->kind = REGION_HOST_FD;
	region->access = access;
	region->length = length;
	region->owner = owner;
	ret = region_insert(table, region);
	if (ret < 0) {
		goto out_unmap;
	}
	*ret_region = region;
	return 0;

out_unmap:
	munmap(region->map_base, region->map_length);
out_free:
	free(region);
	return ret;
}

int region_insert(struct region_table *table, struct region *region)
{
	int ret;

	region->id = table->next_id++;
	if (!region->key) {
		region->key = random_u64();
	}
	region->refs = 1;
	region->uid = table->owner_uid && region->owner ? table->owner_uid(region->owner) : 0;
	list_init(&region->owner_link);
	for (uint32_t i = 0; i < table->n_hooks; i++) {
		ret = table->hooks[i].added(table->hooks[i].ctx, region);
		if (ret < 0) {
			while (i-- > 0) {
				table->hooks[i].removed(table->hooks[i].ctx, region);
			}
			return ret;
		}
	}
	ret = hmap_put(&table->by_id, region->id, region);
	if (ret < 0) {
		for (uint32_t i = table->n_hooks; i-- > 0;) {
			table->hooks[i].removed(table->hooks[i].ctx, region);
		}
		return ret;
	}
	table->count++;
	table->total_bytes += region->length;
	return 0;
}

struct region *region_find_owned(struct region_table *table, void *owner, uint64_t id)
{
	struct region *region = hmap_get(&table->by_id, id);

	if (!region || region->owner != owner || region->deregistering) {
		return NULL;
	}
	return region;
}

int region_check_range(const struct region *region, uint64_t offset, uint64_t length)
{
	if (offset > region->length || length > region->length - offset) {
		return RDMAX_E_OUT_OF_RANGE;
	}
	return 0;
}

int region_get_remote(struct region_table *table, uint64_t instance_id, uint64_t id, uint64_t key,
		      uint64_t offset, uint64_t length, uint32_t need_access,
		      struct region **ret_region)
{
	struct region *region;

	if (instance_id != table->instance_id) {
		return RDMAX_E_NOT_FOUND;
	}
	region = hmap_get(&table->by_id, id);
	/* A wrong key is reported like a missing region: no oracle for guessing keys. */
	if (!region || region->key != key || region->deregistering) {
		return RDMAX_E_NOT_FOUND;
	}
	if ((region->access & need_access) != need_access) {
		return RDMAX_E_PERMISSION_DENIED;
	}
	if (region_check_range(region, offset, length) < 0) {
		return RDMAX_E_OUT_OF_RANGE;
	}
	region_get(region);
	*ret_region = region;
	return 0;
}

void region_get(struct region *region)
{
	region->refs++;
}

void region_put(struct region_table *table, struct region *region)
{
	if (--region->refs > 0) {
		return;
	}
	for (uint32_t i = table->n_hooks; i-- > 0;) {
		table->hooks[i].removed(table->hooks[i].ctx, region);
	}
	hmap_del(&table->by_id, region->id);
	table->count--;
	table->total_bytes -= region->length;
	if (region->map_base) {
		munmap(region->map_base, region->map_length);
	}
	if (region->fini) {
		region->fini(region);
	}
	list_del(&region->owner_link);
	if (region->released_cb) {
		region->released_cb(region, region->released_arg);
	}
	free(region);
}

void region_deregister(struct region_table *table, struct region *region, region_released_cb cb,
		       void *arg)
{
	if (region->deregistering) {
		return;
	}
	region->deregistering = true;
	region->released_cb = cb;
	region->released_arg = arg;
	region_put(table, region);
}

int region_desc_encode(const struct region_table *table, const struct region *region,
		       const char *node_name, const struct endpoint *endpoints,
		       uint32_t n_endpoints, uint8_t *buf, size_t buf_size)
{
	struct remote_desc desc;

	if (n_endpoints > DESC_MAX_ENDPOINTS) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	memset(&desc, 0, sizeof(desc));
	desc.instance_id = table->instance_id;
	desc.region_id = region->id;
	desc.region_key = region->key;
	desc.length = region->length;
	desc.access = region->access;
	copy_string(desc.node_name, sizeof(desc.node_name), node_name);
	desc.n_endpoints = n_endpoints;
	memcpy(desc.endpoints, endpoints, n_endpoints * sizeof(*endpoints));
	return desc_encode(&desc, buf, buf_size);
}
