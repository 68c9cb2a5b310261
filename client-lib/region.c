/* SPDX-License-Identifier: MIT */
/*
 * librdmax's objects that name memory: regions (allocated host memory, fds
 * the application registers; GPU regions are made in gpu.c through
 * client_region_request()), their descriptors, and peer groups of remote
 * descriptors. Owns the region and group handles and the mappings of
 * rdmax_region_alloc_host(); every daemon request goes through client.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client.h"
#include "gpu.h"

void client_group_free(struct rdmax_peer_group *group)
{
	struct rdmax_client *c = group->client;

	if (group->prev) {
		group->prev->next = group->next;
	} else {
		c->groups = group->next;
	}
	if (group->next) {
		group->next->prev = group->prev;
	}
	free(group);
}

void client_region_free(struct rdmax_region *region)
{
	struct rdmax_client *c = region->client;

	if (region->prev) {
		region->prev->next = region->next;
	} else {
		c->regions = region->next;
	}
	if (region->next) {
		region->next->prev = region->prev;
	}
	client_gpu_region_freed(c, region);
	if (region->map_len) {
		munmap(region->addr, region->map_len);
	}
	free(region);
}
/*
 * A peer's descriptor must name at least one endpoint to be usable; our own
 * daemon may hand out one without (no transport configured yet).
 */
static int desc_check(const void *bytes, size_t len, size_t min_endpoints)
{
	Rdmax__V1__RegionDesc *d;
	int r = 0;

	if (!bytes || len == 0 || len > RDMAX_DESC_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	d = rdmax__v1__region_desc__unpack(NULL, len, bytes);
	if (!d) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (d->version != 1 || d->n_endpoints < min_endpoints) {
		r = RDMAX_E_INVALID_ARGUMENT;
	}
	rdmax__v1__region_desc__free_unpacked(d, NULL);
	return r;
}

static int deregister_id(struct rdmax_client *c, uint64_t region_id)
{
	Rdmax__V1__DeregisterRegion d = RDMAX__V1__DEREGISTER_REGION__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	d.region_id = region_id;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION;
	msg.deregister_region = &d;
	/* No timeout: the daemon answers once the jobs holding the region are done. */
	return client_request_status(c, &msg, -1);
}

struct client_gpu **client_gpu_slot(struct rdmax_client *c)
{
	return &c->gpu;
}

void client_region_set_addr(struct rdmax_region *region, void *addr)
{
	region->addr = addr;
}

void client_region_set_allocated(struct rdmax_region *region)
{
	region->allocated = true;
}

/* A RegisterRegion or PoolAlloc request; map_len != 0: addr is ours to munmap. */
static int region_request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd,
			  uint64_t length, void *addr, size_t map_len,
			  struct rdmax_region **ret_region, Rdmax__V1__DaemonMsg **ret_reply)
{
	Rdmax__V1__DaemonMsg *reply;
	struct rdmax_region *region;
	int r;

	r = client_request(c, msg, fd, -1, &reply);
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_REGION) {
		r = client_unexpected_reply(c, reply);
		goto out_free_reply;
	}
	const Rdmax__V1__RegionReply *rep = reply->region;
	if (desc_check(rep->desc.data, rep->desc.len, 0) < 0 ||
	    (rep->has_length && rep->length < length)) {
		/* Registered but unusable: give it back rather than leak it in the daemon. */
		deregister_id(c, rep->region_id);
		r = RDMAX_E_PROTOCOL_ERROR;
		goto out_free_reply;
	}
	region = calloc(1, sizeof(*region));
	if (!region) {
		deregister_id(c, rep->region_id);
		r = -ENOMEM;
		goto out_free_reply;
	}
	region->client = c;
	region->id = rep->region_id;
	region->length = length;
	region->addr = addr;
	region->map_len = map_len;
	region->desc_len = (uint32_t)rep->desc.len;
	memcpy(region->desc, rep->desc.data, rep->desc.len);
	region->next = c->regions;
	if (c->regions) {
		c->regions->prev = region;
	}
	c->regions = region;
	*ret_region = region;
	if (ret_reply) {
		*ret_reply = reply;
		return 0;
	}
out_free_reply:
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

int client_region_request(struct rdmax_client *c, Rdmax__V1__ClientMsg *msg, int fd,
			  uint64_t length, void *addr, struct rdmax_region **ret_region,
			  Rdmax__V1__DaemonMsg **ret_reply)
{
	return region_request(c, msg, fd, length, addr, 0, ret_region, ret_reply);
}

static int register_region(struct rdmax_client *c, int fd, uint64_t offset, uint64_t length,
			   void *addr, size_t map_len, uint32_t access,
			   struct rdmax_region **ret_region)
{
	Rdmax__V1__RegisterRegion rr = RDMAX__V1__REGISTER_REGION__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	rr.kind = RDMAX__V1__REGION_KIND__REGION_HOST_FD;
	rr.access = access;
	rr.offset = offset;
	rr.length = length;
	rr.has_fd_index = 1;
	rr.fd_index = 0;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION;
	msg.register_region = &rr;
	return region_request(c, &msg, fd, length, addr, map_len, ret_region, NULL);
}

static int check_access(uint32_t access)
{
	const uint32_t known = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	return (access & ~known) ? RDMAX_E_INVALID_ARGUMENT : 0;
}

RDMAX_EXPORT int rdmax_region_alloc_host(struct rdmax_client *client, uint64_t length,
					 uint32_t access, struct rdmax_region **ret_region)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct rdmax_region *region;
	uint64_t size;
	void *addr;
	int fd, r;

	if (!client || !ret_region) {
		return -EINVAL;
	}
	if (length == 0 || length > UINT64_MAX - page || check_access(access) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (client->err) {
		return client->err;
	}
	size = (length + page - 1) & ~(page - 1);
	if (size > SIZE_MAX || size > (uint64_t)INT64_MAX) {
		return -ENOMEM;
	}
	fd = memfd_create("rdmax", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		return -errno;
	}
	if (ftruncate(fd, (off_t)size) < 0) {
		r = -errno;
		goto out_close;
	}
	/* The daemon maps this file: it must never shrink under that mapping. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		goto out_close;
	}
	addr = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED) {
		r = -errno;
		goto out_close;
	}
	r = register_region(client, fd, 0, size, addr, (size_t)size, access, &region);
	if (r < 0) {
		goto out_unmap;
	}
	close(fd);
	region->allocated = true;
	*ret_region = region;
	return 0;

out_unmap:
	munmap(addr, (size_t)size);
out_close:
	close(fd);
	return r;
}

RDMAX_EXPORT int rdmax_region_register_fd(struct rdmax_client *client, int fd, uint64_t offset,
					  uint64_t length, void *addr, uint32_t access,
					  struct rdmax_region **ret_region)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	if (!client || !ret_region) {
		return -EINVAL;
	}
	if (fd < 0) {
		return -EBADF;
	}
	if (length == 0 || offset % page != 0 || offset > UINT64_MAX - length ||
	    check_access(access) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	return register_region(client, fd, offset, length, addr, 0, access, ret_region);
}

static int release(struct rdmax_client *client, struct rdmax_region *region)
{
	int r = deregister_id(client, region->id);
	client_region_free(region);
	return r;
}

RDMAX_EXPORT int rdmax_region_deregister(struct rdmax_client *client, struct rdmax_region *region)
{
	if (!client || !region || region->client != client || region->allocated) {
		return -EINVAL;
	}
	return release(client, region);
}

RDMAX_EXPORT int rdmax_region_free(struct rdmax_client *client, struct rdmax_region *region)
{
	if (!region) {
		return 0;
	}
	if (!client || region->client != client || !region->allocated) {
		return -EINVAL;
	}
	return release(client, region);
}

RDMAX_EXPORT void *rdmax_region_addr(const struct rdmax_region *region)
{
	return region ? region->addr : NULL;
}

RDMAX_EXPORT uint64_t rdmax_region_length(const struct rdmax_region *region)
{
	return region ? region->length : 0;
}

RDMAX_EXPORT uint64_t rdmax_region_id(const struct rdmax_region *region)
{
	return region ? region->id : 0;
}

RDMAX_EXPORT int rdmax_region_desc(const struct rdmax_region *region, struct rdmax_desc *ret_desc)
{
	if (!region || !ret_desc) {
		return -EINVAL;
	}
	ret_desc->len = region->desc_len;
	memcpy(ret_desc->bytes, region->desc, region->desc_len);
	memset(ret_desc->bytes + region->desc_len, 0, RDMAX_DESC_MAX - region->desc_len);
	return 0;
}

RDMAX_EXPORT int rdmax_desc_import(const void *bytes, size_t len, struct rdmax_desc *ret_desc)
{
	int r;

	if (!ret_desc) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	r = desc_check(bytes, len, 1);
	if (r < 0) {
		return r;
	}
	ret_desc->len = (uint32_t)len;
	memcpy(ret_desc->bytes, bytes, len);
	memset(ret_desc->bytes + len, 0, RDMAX_DESC_MAX - len);
	return 0;
}

bool client_desc_usable(const struct rdmax_desc *d)
{
	return d && d->len > 0 && d->len <= RDMAX_DESC_MAX;
}
RDMAX_EXPORT int rdmax_peer_group_create(struct rdmax_client *client,
					 const struct rdmax_desc *descs, size_t count,
					 struct rdmax_peer_group **ret_group)
{
	Rdmax__V1__PeerGroupCreate pg = RDMAX__V1__PEER_GROUP_CREATE__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;
	struct rdmax_peer_group *group;
	ProtobufCBinaryData *bins;
	int r;

	if (!client || !ret_group || (count && !descs)) {
		return -EINVAL;
	}
	if (count == 0 || count > SIZE_MAX / sizeof(*bins)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < count; i++) {
		if (!client_desc_usable(&descs[i])) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	group = calloc(1, sizeof(*group));
	bins = malloc(count * sizeof(*bins));
	if (!group || !bins) {
		r = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < count; i++) {
		bins[i] = client_desc_bytes(&descs[i]);
	}
	pg.n_remote_descs = count;
	pg.remote_descs = bins;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE;
	msg.peer_group_create = &pg;
	r = client_request(client, &msg, -1, -1, &reply);
	if (r < 0) {
		goto out_free;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_PEER_GROUP) {
		r = client_unexpected_reply(client, reply);
		rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
		goto out_free;
	}
	group->client = client;
	group->handle = reply->peer_group->peer_group;
	group->size = count;
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	group->next = client->groups;
	if (client->groups) {
		client->groups->prev = group;
	}
	client->groups = group;
	free(bins);
	*ret_group = group;
	return 0;

out_free:
	free(bins);
	free(group);
	return r;
}

RDMAX_EXPORT int rdmax_peer_group_destroy(struct rdmax_client *client,
					  struct rdmax_peer_group *group)
{
	Rdmax__V1__PeerGroupDestroy d = RDMAX__V1__PEER_GROUP_DESTROY__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	int r;

	if (!group) {
		return 0;
	}
	if (!client || group->client != client) {
		return -EINVAL;
	}
	d.peer_group = group->handle;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_DESTROY;
	msg.peer_group_destroy = &d;
	r = client_request_status(client, &msg, -1);
	client_group_free(group);
	return r;
}

RDMAX_EXPORT size_t rdmax_peer_group_size(const struct rdmax_peer_group *group)
{
	return group ? group->size : 0;
}
