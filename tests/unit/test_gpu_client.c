/* SPDX-License-Identifier: MIT */
/*
 * GPU memory without a GPU, the client side: librdmax's registration logic
 * (client-lib/gpu.c) driven through the fake CUDA driver (fake_cuda.c),
 * talking to a fake daemon thread that records what it received; and the
 * GPU error names and statuses both sides share. Cases of the suite "gpu".
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../client-lib/gpu.h"
#include "../../client-lib/internal.h"
#include "fake_cuda.h"
#include "pass_fds.h"
#include "status.h"
#include "test_gpu.h"

/* ================================================================ fake daemon */

struct seen_reg {
	int kind;
	uint32_t access;
	uint64_t offset;
	uint64_t length;
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
	bool has_buffer_id;
	uint64_t buffer_id;
	int n_fds;
	off_t fd_size;
	size_t ipc_len;
	uint8_t ipc[RDMAX_CUDA_IPC_HANDLE_SIZE];
};

struct seen_pool {
	uint64_t pool_id;
	uint64_t length;
	uint32_t access;
	char bus_id[RDMAX_CUDA_BUS_ID_MAX];
};

struct fake_daemon {
	char dir[64];
	char path[108];
	int lfd;
	int cfd;
	pthread_t thread;
	/* What it answers. */
	uint32_t caps;
	int refuse_status;        /* RegisterRegion/PoolAlloc answered with this Status when set */
	int refuse_dmabuf_status; /* only dma-buf registrations answered with this Status */
	uint8_t pool_handle[RDMAX_CUDA_IPC_HANDLE_SIZE];
	uint64_t pool_offset; /* of the next slice; advances by 1 MiB */
	/* What it saw. */
	int n_regs;
	struct seen_reg regs[32];
	int n_pools;
	struct seen_pool pools[8];
	int n_deregs;
	uint64_t next_id;
	char bad[160];
};

static size_t make_desc(uint8_t *buf, uint64_t region_id)
{
	Rdmax__V1__RegionDesc d = RDMAX__V1__REGION_DESC__INIT;

	d.version = 1;
	d.instance_id = 0x1122334455667788ull;
	d.region_id = region_id;
	d.region_key = 0xabcdef;
	d.length = 8192;
	d.access = RDMAX_ACCESS_REMOTE_WRITE;
	return rdmax__v1__region_desc__pack(&d, buf);
}

static void fd_send(struct fake_daemon *f, Rdmax__V1__DaemonMsg *m)
{
	size_t len = rdmax__v1__daemon_msg__get_packed_size(m);
	uint8_t *buf = malloc(len ? len : 1);

	rdmax__v1__daemon_msg__pack(m, buf);
	if (send(f->cfd, buf, len, MSG_NOSIGNAL) != (ssize_t)len && !f->bad[0]) {
		snprintf(f->bad, sizeof(f->bad), "send failed");
	}
	free(buf);
}

static void fd_reply_status(struct fake_daemon *f, uint64_t seq, int status)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Error e = RDMAX__V1__ERROR__INIT;

	e.status = status;
	e.message = status ? "refused by the fake daemon" : NULL;
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_ERROR;
	m.error = &e;
	fd_send(f, &m);
}

static void fd_reply_region(struct fake_daemon *f, uint64_t seq, uint64_t length, bool lease)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__RegionReply r = RDMAX__V1__REGION_REPLY__INIT;
	uint8_t desc[256];

	r.region_id = ++f->next_id;
	r.desc.data = desc;
	r.desc.len = make_desc(desc, r.region_id);
	r.has_length = 1;
	r.length = length;
	if (lease) {
		r.has_cuda_ipc_handle = 1;
		r.cuda_ipc_handle.data = f->pool_handle;
		r.cuda_ipc_handle.len = sizeof(f->pool_handle);
		r.has_pool_offset = 1;
		r.pool_offset = f->pool_offset;
		r.has_pool_id = 1;
		r.pool_id = 1;
		f->pool_offset += MiB;
	}
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_REGION;
	m.region = &r;
	fd_send(f, &m);
}

static void fd_hello(struct fake_daemon *f, uint64_t seq)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Welcome w = RDMAX__V1__WELCOME__INIT;
	Rdmax__V1__Limits l = RDMAX__V1__LIMITS__INIT;

	l.max_message_bytes = 1 << 20;
	l.max_fds_per_message = 4;
	l.max_regions = 64;
	l.max_registered_bytes = 1ull << 40;
	l.max_outstanding_jobs = 64;
	l.max_jobs_per_submit = 64;
	w.protocol_version = RDMAX_PROTOCOL_VERSION;
	w.daemon_version = "fake";
	w.instance_id = 0x1122334455667788ull;
	w.node_name = "gpu-node";
	w.capabilities = f->caps;
	w.limits = &l;
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_WELCOME;
	m.welcome = &w;
	fd_send(f, &m);
}

static void fd_register(struct fake_daemon *f, uint64_t seq, const Rdmax__V1__RegisterRegion *rr,
			const int *fds, int n_fds)
{
	struct seen_reg *s = &f->regs[f->n_regs < 32 ? f->n_regs++ : 31];
	struct stat st;

	memset(s, 0, sizeof(*s));
	s->kind = rr->kind;
	s->access = rr->access;
	s->offset = rr->offset;
	s->length = rr->length;
	snprintf(s->bus_id, sizeof(s->bus_id), "%s", rr->gpu_bus_id ? rr->gpu_bus_id : "");
	s->has_buffer_id = rr->has_gpu_buffer_id;
	s->buffer_id = rr->gpu_buffer_id;
	s->n_fds = n_fds;
	s->fd_size = n_fds > 0 && fstat(fds[0], &st) == 0 ? st.st_size : -1;
	if (rr->has_cuda_ipc_handle && rr->cuda_ipc_handle.len <= sizeof(s->ipc)) {
		s->ipc_len = rr->cuda_ipc_handle.len;
		memcpy(s->ipc, rr->cuda_ipc_handle.data, s->ipc_len);
	}
	for (int i = 0; i < n_fds; i++) {
		close(fds[i]);
	}
	if (f->refuse_status) {
		fd_reply_status(f, seq, f->refuse_status);
	} else if (f->refuse_dmabuf_status &&
		   rr->kind == RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF) {
		fd_reply_status(f, seq, f->refuse_dmabuf_status);
	} else {
		fd_reply_region(f, seq, rr->length, false);
	}
}

static void *fd_main(void *arg)
{
	struct fake_daemon *f = arg;
	uint8_t buf[65536];

	f->cfd = accept(f->lfd, NULL, NULL);
	if (f->cfd < 0) {
		snprintf(f->bad, sizeof(f->bad), "accept failed");
		return NULL;
	}
	for (;;) {
		int fds[TEST_RECV_FDS_MAX], n_fds = 0;
		ssize_t n = test_recv_fds(f->cfd, buf, sizeof(buf), fds, &n_fds);
		if (n <= 0) {
			break;
		}
		Rdmax__V1__ClientMsg *m = rdmax__v1__client_msg__unpack(NULL, (size_t)n, buf);
		if (!m) {
			snprintf(f->bad, sizeof(f->bad), "undecodable message");
			break;
		}
		switch (m->body_case) {
		case RDMAX__V1__CLIENT_MSG__BODY_HELLO:
			fd_hello(f, m->seq);
			break;
		case RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION:
			fd_register(f, m->seq, m->register_region, fds, n_fds);
			n_fds = 0;
			break;
		case RDMAX__V1__CLIENT_MSG__BODY_POOL_ALLOC: {
			struct seen_pool *p = &f->pools[f->n_pools < 8 ? f->n_pools++ : 7];
			p->pool_id = m->pool_alloc->pool_id;
			p->length = m->pool_alloc->length;
			p->access = m->pool_alloc->access;
			snprintf(p->bus_id, sizeof(p->bus_id), "%s",
				 m->pool_alloc->gpu_bus_id ? m->pool_alloc->gpu_bus_id : "");
			if (f->refuse_status) {
				fd_reply_status(f, m->seq, f->refuse_status);
			} else {
				fd_reply_region(f, m->seq, m->pool_alloc->length, true);
			}
			break;
		}
		case RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION:
			f->n_deregs++;
			fd_reply_status(f, m->seq, 0);
			break;
		default:
			snprintf(f->bad, sizeof(f->bad), "unexpected body %d", (int)m->body_case);
			break;
		}
		for (int i = 0; i < n_fds; i++) {
			close(fds[i]);
		}
		rdmax__v1__client_msg__free_unpacked(m, NULL);
	}
	return NULL;
}

static void fd_start(struct fake_daemon *f, uint32_t caps)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	memset(f, 0, sizeof(*f));
	f->caps = caps;
	f->cfd = -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/rdmax-gpu-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/sock", f->dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
	f->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(f->lfd, 0);
	ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(f->lfd, 4), 0);
	ck_assert_int_eq(pthread_create(&f->thread, NULL, fd_main, f), 0);
}

/* After the client closed: join and check the fake met nothing strange. */
static void fd_stop(struct fake_daemon *f)
{
	pthread_join(f->thread, NULL);
	if (f->cfd >= 0) {
		close(f->cfd);
	}
	close(f->lfd);
	unlink(f->path);
	rmdir(f->dir);
	ck_assert_msg(f->bad[0] == '\0', "fake daemon: %s", f->bad);
}

static struct rdmax_client *open_with_fake(struct fake_daemon *d, struct fake_cuda *cu)
{
	struct rdmax_client *c = NULL;

	ck_assert_int_eq(rdmax_client_open(d->path, "gpu-test", &c), 0);
	if (cu) {
		ck_assert_int_eq(client_gpu_use_cuda(c, &cu->table, NULL), 0);
	}
	return c;
}

#define CAPS_ALL (RDMAX_CAP_VERBS | RDMAX_CAP_DMABUF | RDMAX_CAP_PEERMEM)

/* ================================================================ client */

START_TEST(client_interior_offsets)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r[5];
	const uint64_t size = 8 * MiB;
	/* Interior pointers, page aligned or not: UCX #11417 dropped ptr - base here. */
	const uint64_t offsets[5] = {0, 4096, 65536 + 17, 3 * MiB + 1, size - 4096};
	int fds_before;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	CUdeviceptr base = fake_cuda_alloc(&cu, size, 1);
	fake_cuda_alloc(&cu, 4 * MiB, 1); /* a neighbour right after it */
	fds_before = unit_gpu_count_fds();
	for (int i = 0; i < 5; i++) {
		void *p = (void *)(uintptr_t)(base + offsets[i]);
		ck_assert_int_eq(
			rdmax_region_register_gpu(c, p, 4096, RDMAX_ACCESS_REMOTE_WRITE, &r[i]), 0);
		ck_assert_ptr_eq(rdmax_region_addr(r[i]), p);
		ck_assert_uint_eq(rdmax_region_length(r[i]), 4096);
	}
	/* The client's dma-buf fds are closed once the daemon has its own. */
	ck_assert_int_eq(unit_gpu_count_fds(), fds_before);
	/* The whole allocation is exported, page aligned, once while any of it is registered. */
	ck_assert_int_eq(cu.exports, 1);
	ck_assert_uint_eq(cu.last_export_base, base);
	ck_assert_uint_eq(cu.last_export_size, size);
	ck_assert_int_eq(cu.sync_memops, 5);
	for (int i = 0; i < 5; i++) {
		rdmax_region_deregister(c, r[i]);
	}
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 5);
	for (int i = 0; i < 5; i++) {
		const struct seen_reg *s = &d.regs[i];
		ck_assert_int_eq(s->kind, RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF);
		ck_assert_uint_eq(s->offset, offsets[i]); /* == ptr - base */
		ck_assert_uint_eq(s->length, 4096);
		ck_assert_uint_eq(s->access, RDMAX_ACCESS_REMOTE_WRITE);
		/* The first carries the dma-buf; the others name it by buffer id. */
		ck_assert_int_eq(s->n_fds, i == 0 ? 1 : 0);
		ck_assert_int_eq(s->fd_size, i == 0 ? (off_t)size : -1);
		ck_assert_str_eq(s->bus_id, "0000:86:00.0");
		ck_assert(s->has_buffer_id);
		ck_assert_uint_eq(s->buffer_id, fake_cuda_find(&cu, base)->buffer_id);
	}
	ck_assert_int_eq(d.n_deregs, 5);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_odd_sizes_and_ranges)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	/* An allocation that is not a whole number of pages exports rounded up. */
	CUdeviceptr base = fake_cuda_alloc(&cu, 3 * unit_gpu_page_size() + 100, 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(base + 10),
						   3 * unit_gpu_page_size() + 90, 0, &r),
			 0);
	ck_assert_uint_eq(cu.last_export_size, 4 * unit_gpu_page_size());
	/* One byte past the allocation: refused before anything is sent. */
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(base + 10),
						   3 * unit_gpu_page_size() + 91, 0, &r),
			 RDMAX_E_OUT_OF_RANGE);
	/* Not GPU memory, bad arguments. */
	char host[64];
	ck_assert_int_eq(rdmax_region_register_gpu(c, host, sizeof(host), 0, &r),
			 RDMAX_E_GPU_NOT_DEVICE_MEMORY);
	ck_assert_int_eq(rdmax_region_register_gpu(c, NULL, 4096, 0, &r), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)base, 0, 0, &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)base, 4096, 0x80, &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_region_register_gpu(NULL, (void *)(uintptr_t)base, 4096, 0, &r),
			 -EINVAL);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 1);
	ck_assert_uint_eq(d.regs[0].offset, 10);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_buffer_id_reuse)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *a1, *a2, *b;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	CUdeviceptr base = fake_cuda_alloc(&cu, 4 * MiB, 0);
	/* The same allocation twice (two tensors in one block): two regions. */
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)base, MiB, 0, &a1), 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(base + MiB), MiB, 0, &a2),
			 0);
	/* Freed while registered, a new allocation at the same address: refused. */
	fake_cuda_free(&cu, base);
	CUdeviceptr again = fake_cuda_alloc_at(&cu, base, 2 * MiB, 0);
	ck_assert_uint_eq(again, base);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)base, MiB, 0, &b),
			 RDMAX_E_GPU_ADDRESS_REUSED);
	/* An overlapping one at another base is the same mistake. */
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(base + MiB), 4096, 0, &b),
			 RDMAX_E_GPU_ADDRESS_REUSED);
	rdmax_region_deregister(c, a1);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)base, MiB, 0, &b),
			 RDMAX_E_GPU_ADDRESS_REUSED);
	/* Once the stale regions are gone, the new allocation registers. */
	rdmax_region_deregister(c, a2);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)base, MiB, 0, &b), 0);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 3);
	ck_assert_uint_ne(d.regs[0].buffer_id, d.regs[2].buffer_id);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_vmm_and_driver_support)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	/* Expandable segments: not fully mapped, not IPC capable. */
	CUdeviceptr vmm = fake_cuda_alloc_vmm(&cu, 4 * MiB, 0, true);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)vmm, MiB, 0, &r),
			 RDMAX_E_GPU_NOT_EXPORTABLE);
	/* Fully mapped VMM memory exports as a dma-buf. */
	CUdeviceptr vmm_ok = fake_cuda_alloc_vmm(&cu, 4 * MiB, 0, false);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)vmm_ok, MiB, 0, &r), 0);
	ck_assert_int_eq(d.n_regs, 1);
	/* A driver without dma-buf: the peermem fallback carries an IPC handle, no fd. */
	cu.dmabuf[0] = false;
	CUdeviceptr plain = fake_cuda_alloc(&cu, 4 * MiB, 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(plain + 8192), MiB,
						   RDMAX_ACCESS_REMOTE_READ, &r),
			 0);
	/* ...but VMM memory has no IPC handle either. */
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)vmm_ok, MiB, 0, &r),
			 RDMAX_E_GPU_NOT_EXPORTABLE);
	/* Export refused by the driver, for any reason: the peermem fallback (as NCCL). */
	cu.dmabuf[0] = true;
	cu.export_result = CUDA_ERROR_NOT_SUPPORTED;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)plain, MiB, 0, &r), 0);
	cu.export_result = CUDA_ERROR_INVALID_VALUE;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)plain, MiB, 0, &r), 0);
	/* ...unless the allocation cannot be opened by handle either. */
	cu.ipc_get_fails = true;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)plain, MiB, 0, &r),
			 RDMAX_E_GPU_NOT_EXPORTABLE);
	cu.ipc_get_fails = false;
	cu.export_result = CUDA_SUCCESS;
	/* SYNC_MEMOPS refused on ordinary memory: something is wrong, say so now. */
	cu.sync_memops_fails = true;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)plain, MiB, 0, &r),
			 RDMAX_E_GPU_NOT_EXPORTABLE);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 4);
	ck_assert_int_eq(d.regs[3].kind, RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC);
	ck_assert_int_eq(d.regs[1].kind, RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC);
	ck_assert_int_eq(d.regs[1].n_fds, 0);
	ck_assert_uint_eq(d.regs[1].offset, 8192);
	ck_assert_uint_eq(d.regs[1].ipc_len, RDMAX_CUDA_IPC_HANDLE_SIZE);
	ck_assert_int_eq(memcmp(d.regs[1].ipc, "FAKEIPC", 8), 0);
	uint64_t handle_base;
	memcpy(&handle_base, d.regs[1].ipc + 16, 8);
	ck_assert_uint_eq(handle_base, plain); /* the handle names the allocation base */
	ck_assert_int_eq(d.regs[2].kind, RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_vmm_mappings)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *inside, *across, *bad;
	const uint64_t chunk = 4 * MiB, page = unit_gpu_page_size();

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	/* Expandable segments: one reserved range grown by two separately created chunks. */
	CUdeviceptr seg = fake_cuda_alloc_vmm_chunks(&cu, 2, chunk, 0, true);
	CUdeviceptr base;
	size_t size;
	fake_cuda_push_app_ctx(&cu, FAKE_CUDA_APP_CTX(0));
	ck_assert_int_eq(cu.table.mem_get_address_range(&base, &size, seg + chunk + 5), 0);
	cu.ctx_depth--;
	ck_assert_uint_eq(base, seg + chunk); /* the driver names only the mapping */
	ck_assert_uint_eq(size, chunk);
	/* Inside one chunk: the page-aligned range of the region itself is exported. */
	CUdeviceptr p = seg + 3 * page + 100;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 2 * page, 0, &inside),
			 0);
	ck_assert_uint_eq(cu.last_export_base, seg + 3 * page);
	ck_assert_uint_eq(cu.last_export_size, 3 * page);
	/* Across both chunks: one dma-buf of the pages it covers. */
	p = seg + chunk - 2 * page + 17;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 4 * page,
						   RDMAX_ACCESS_REMOTE_WRITE, &across),
			 0);
	ck_assert_uint_eq(cu.last_export_base, seg + chunk - 2 * page);
	ck_assert_uint_eq(cu.last_export_size, 5 * page);
	ck_assert_int_eq(cu.exports, 2);
	/* Past the mapped range: the export fails, and VMM memory has no IPC fallback. */
	ck_assert_int_eq(
		rdmax_region_register_gpu(c, (void *)(uintptr_t)(seg + chunk), chunk + 1, 0, &bad),
		RDMAX_E_GPU_NOT_EXPORTABLE);
	/* Chunks made without the GPUDirect RDMA flag: refused before any export. */
	CUdeviceptr plain = fake_cuda_alloc_vmm_chunks(&cu, 2, chunk, 0, false);
	int exports = cu.exports;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)plain, page, 0, &bad),
			 RDMAX_E_GPU_NOT_EXPORTABLE);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(plain + chunk - page),
						   2 * page, 0, &bad),
			 RDMAX_E_GPU_NOT_EXPORTABLE);
	ck_assert_int_eq(cu.exports, exports);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 2);
	ck_assert_int_eq(d.regs[0].kind, RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF);
	ck_assert_uint_eq(d.regs[0].offset, 100);
	ck_assert_int_eq(d.regs[0].fd_size, (off_t)(3 * page));
	ck_assert_uint_eq(d.regs[1].offset, 17);
	ck_assert_uint_eq(d.regs[1].length, 4 * page);
	ck_assert_int_eq(d.regs[1].n_fds, 1);
	ck_assert_int_eq(d.regs[1].fd_size, (off_t)(5 * page));
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_context_handling)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r1, *r2, *s;
	CUipcMemHandle h;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	CUdeviceptr a = fake_cuda_alloc(&cu, 4 * MiB, 1);
	/* A thread with no current context: the pointer's device's primary context is used. */
	ck_assert_int_eq(cu.ctx_depth, 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)a, MiB, 0, &r1), 0);
	ck_assert_ptr_eq(cu.last_export_ctx, FAKE_CUDA_PRIMARY_CTX(1));
	ck_assert_int_eq(cu.ctx_depth, 0);
	ck_assert_int_eq(cu.no_ctx_calls, 0);
	/* A thread current on another device gets its own context back. */
	CUdeviceptr b = fake_cuda_alloc(&cu, 4 * MiB, 1);
	fake_cuda_push_app_ctx(&cu, FAKE_CUDA_APP_CTX(0));
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)b, MiB, 0, &r2), 0);
	ck_assert_ptr_eq(cu.last_export_ctx, FAKE_CUDA_PRIMARY_CTX(1));
	ck_assert_int_eq(cu.ctx_depth, 1);
	ck_assert_ptr_eq(cu.ctx_stack[0], FAKE_CUDA_APP_CTX(0));
	/* Pool slices too: the mapping gets SYNC_MEMOPS, the caller's context stays. */
	CUdeviceptr pool = fake_cuda_alloc(&cu, 16 * MiB, 1);
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, pool, &h), CUDA_SUCCESS);
	memcpy(d.pool_handle, &h, sizeof(h));
	int sync_before = cu.sync_memops;
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, 1, 4096, 0, &s), 0);
	ck_assert_int_eq(cu.sync_memops, sync_before + 1);
	ck_assert_int_eq(cu.ctx_depth, 1);
	ck_assert_ptr_eq(cu.ctx_stack[0], FAKE_CUDA_APP_CTX(0));
	rdmax_region_free(c, s);
	rdmax_region_deregister(c, r1);
	rdmax_region_deregister(c, r2);
	ck_assert_int_eq(cu.ctx_depth, 1);
	cu.ctx_depth = 0;
	ck_assert_int_eq(cu.retains, cu.releases);
	ck_assert_int_eq(cu.no_ctx_calls, 0);
	rdmax_client_close(c);
	fd_stop(&d);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_repeated_slices)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r[8], *again;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	/* A KV cache cut into slices, each registered on its own. */
	CUdeviceptr kv = fake_cuda_alloc(&cu, 32 * MiB, 0);
	for (int i = 0; i < 8; i++) {
		ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(kv + i * 4 * MiB),
							   4 * MiB, 0, &r[i]),
				 0);
	}
	ck_assert_int_eq(cu.exports, 1);
	/* While one slice is left, new slices still share the daemon's dma-buf. */
	for (int i = 1; i < 8; i++) {
		rdmax_region_deregister(c, r[i]);
	}
	ck_assert_int_eq(
		rdmax_region_register_gpu(c, (void *)(uintptr_t)(kv + MiB), MiB, 0, &again), 0);
	ck_assert_int_eq(cu.exports, 1);
	rdmax_region_deregister(c, r[0]);
	rdmax_region_deregister(c, again);
	/* Once none is left, the next registration exports again. */
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)kv, MiB, 0, &again), 0);
	ck_assert_int_eq(cu.exports, 2);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 10);
	for (int i = 0; i < 10; i++) {
		ck_assert_int_eq(d.regs[i].n_fds, i == 0 || i == 9 ? 1 : 0);
		ck_assert_uint_eq(d.regs[i].buffer_id, d.regs[0].buffer_id);
		ck_assert_int_eq(d.regs[i].kind, RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF);
	}
	ck_assert_uint_eq(d.regs[8].offset, MiB);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_fallbacks_and_grace)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	CUdeviceptr a = fake_cuda_alloc(&cu, 4 * MiB, 0);
	/* The daemon cannot register the dma-buf (NIC refused it): peermem instead. */
	d.refuse_dmabuf_status = RDMAX__V1__STATUS__GPU_NOT_EXPORTABLE;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)a, MiB, 0, &r), 0);
	rdmax_region_deregister(c, r);
	d.refuse_dmabuf_status = 0;
	/* A Grace system: the dma-buf is mapped through PCIe BAR1 for the NIC. */
	cu.c2c[0] = true;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)a, MiB, 0, &r), 0);
	ck_assert_uint_eq(cu.last_export_flags, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
	rdmax_region_deregister(c, r);
	/* A driver that does not know the flag: exported without it. */
	cu.no_pcie_flag = true;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)a, MiB, 0, &r), 0);
	ck_assert_uint_eq(cu.last_export_flags, 0);
	rdmax_region_deregister(c, r);
	/* x86: no flag. */
	cu.c2c[0] = false;
	cu.no_pcie_flag = false;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)a, MiB, 0, &r), 0);
	ck_assert_uint_eq(cu.last_export_flags, 0);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 5);
	ck_assert_int_eq(d.regs[0].kind, RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF);
	ck_assert_int_eq(d.regs[1].kind, RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC);
	ck_assert_int_eq(d.regs[1].n_fds, 0);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_memory_kinds)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r;
	const uint64_t page = unit_gpu_page_size();

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, &cu);
	/* cudaMallocAsync: the range is exported (no legacy IPC, no SYNC_MEMOPS). */
	CUdeviceptr pool = fake_cuda_alloc_kind(&cu, FAKE_MEMPOOL, 4 * MiB, 0);
	ck_assert_int_eq(
		rdmax_region_register_gpu(c, (void *)(uintptr_t)(pool + page + 8), page, 0, &r), 0);
	ck_assert_uint_eq(cu.last_export_base, pool + page);
	ck_assert_uint_eq(cu.last_export_size, 2 * page);
	/* cudaMallocAsync on a GPU without dma-buf: no handle to fall back on. */
	cu.dmabuf[0] = false;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)pool, page, 0, &r),
			 RDMAX_E_GPU_NOT_EXPORTABLE);
	cu.dmabuf[0] = true;
	/* Managed memory migrates: never registered. */
	CUdeviceptr managed = fake_cuda_alloc_kind(&cu, FAKE_MANAGED, 4 * MiB, 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)managed, page, 0, &r),
			 RDMAX_E_GPU_NOT_DEVICE_MEMORY);
	/* Pinned host memory: a dma-buf where the driver exports it, else a named refusal. */
	CUdeviceptr host = fake_cuda_alloc_kind(&cu, FAKE_HOST, 4 * MiB, 1);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)host, page, 0, &r),
			 RDMAX_E_GPU_NO_DMABUF);
	cu.host_dmabuf[1] = true;
	ck_assert_int_eq(
		rdmax_region_register_gpu(c, (void *)(uintptr_t)(host + 2 * page), page, 0, &r), 0);
	ck_assert_uint_eq(cu.last_export_base, host + 2 * page);
	ck_assert_int_eq(cu.ctx_depth, 0);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs, 2);
	ck_assert_uint_eq(d.regs[0].offset, 8);
	ck_assert_str_eq(d.regs[1].bus_id, "0000:86:00.0");
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_daemon_capabilities)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r;
	struct rdmax_client *c;
	CUdeviceptr p;

	/* TCP only: nothing is exported. */
	fake_cuda_init(&cu);
	fd_start(&d, 0);
	c = open_with_fake(&d, &cu);
	p = fake_cuda_alloc(&cu, MiB, 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 4096, 0, &r),
			 RDMAX_E_GPU_NEEDS_RDMA);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(cu.exports, 0);

	/* RDMA without a GPU path. */
	fd_start(&d, RDMAX_CAP_VERBS);
	c = open_with_fake(&d, &cu);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 4096, 0, &r),
			 RDMAX_E_GPU_NO_DMABUF);
	rdmax_client_close(c);
	fd_stop(&d);

	/* dma-buf only, on a GPU that cannot export. */
	cu.dmabuf[0] = false;
	fd_start(&d, RDMAX_CAP_VERBS | RDMAX_CAP_DMABUF);
	c = open_with_fake(&d, &cu);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 4096, 0, &r),
			 RDMAX_E_GPU_NO_DMABUF);
	rdmax_client_close(c);
	fd_stop(&d);

	/* peermem only: IPC even where dma-buf would work. */
	cu.dmabuf[0] = true;
	fd_start(&d, RDMAX_CAP_VERBS | RDMAX_CAP_PEERMEM);
	c = open_with_fake(&d, &cu);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 4096, 0, &r), 0);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.regs[0].kind, RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC);
	ck_assert_int_eq(cu.exports, 0);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_daemon_refuses)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *r;
	int fds_before;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	d.refuse_status = RDMAX__V1__STATUS__GPU_TOO_LARGE;
	struct rdmax_client *c = open_with_fake(&d, &cu);
	CUdeviceptr p = fake_cuda_alloc(&cu, 64 * MiB, 0);
	fds_before = unit_gpu_count_fds();
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 64 * MiB, 0, &r),
			 RDMAX_E_GPU_TOO_LARGE);
	ck_assert_int_eq(unit_gpu_count_fds(), fds_before); /* the dma-buf did not leak */
	/* A refused registration leaves nothing behind: the same memory registers later. */
	d.refuse_status = 0;
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, MiB, 0, &r), 0);
	rdmax_client_close(c);
	fd_stop(&d);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(client_missing_libcuda)
{
	struct fake_daemon d;
	struct rdmax_cuda table;
	struct rdmax_region *r;
	const char *why = NULL;
	char host[64];

	ck_assert_int_eq(rdmax_cuda_load("libcuda-not-here.so.1", &table, &why), -ENOENT);
	ck_assert_ptr_nonnull(why);
	fd_start(&d, CAPS_ALL);
	struct rdmax_client *c = open_with_fake(&d, NULL);
	ck_assert_int_eq(client_gpu_use_cuda(c, NULL, "libcuda-not-here.so.1"), 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, host, sizeof(host), 0, &r),
			 RDMAX_E_GPU_DRIVER_MISSING);
	/* Sticky: the library is not searched for again on every call. */
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, 0, 4096, 0, &r), RDMAX_E_GPU_DRIVER_MISSING);
	rdmax_client_close(c);
	fd_stop(&d);
	ck_assert_int_eq(d.n_regs + d.n_pools, 0);
}
END_TEST

START_TEST(client_pool_slices)
{
	struct fake_daemon d;
	struct fake_cuda cu;
	struct rdmax_region *s1, *s2, *bad;
	CUipcMemHandle h;

	fake_cuda_init(&cu);
	fd_start(&d, CAPS_ALL);
	/* The daemon's pool: an allocation whose IPC handle the fake daemon hands out. */
	CUdeviceptr pool = fake_cuda_alloc(&cu, 64 * MiB, 1);
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, pool, &h), CUDA_SUCCESS);
	memcpy(d.pool_handle, &h, sizeof(h));
	d.pool_offset = 2 * MiB;
	struct rdmax_client *c = open_with_fake(&d, &cu);
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, 1, 100000, RDMAX_ACCESS_REMOTE_WRITE, &s1), 0);
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, 1, 4096, 0, &s2), 0);
	/* One mapping for both slices, opened in the primary context, which was popped again. */
	ck_assert_int_eq(cu.ipc_opens, 1);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 1);
	ck_assert_int_eq(cu.ctx_depth, 0);
	const struct fake_alloc *m =
		fake_cuda_find(&cu, (CUdeviceptr)(uintptr_t)rdmax_region_addr(s1));
	ck_assert_ptr_nonnull(m);
	ck_assert(m->mapping);
	ck_assert_uint_eq(m->of, pool);
	ck_assert_uint_eq((uintptr_t)rdmax_region_addr(s1), m->base + 2 * MiB);
	ck_assert_uint_eq((uintptr_t)rdmax_region_addr(s2), m->base + 3 * MiB);
	ck_assert_uint_eq(rdmax_region_length(s1), 100000);
	/* Errors: bad device, daemon refusal. */
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, 7, 4096, 0, &bad), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, -1, 4096, 0, &bad), RDMAX_E_INVALID_ARGUMENT);
	d.refuse_status = RDMAX__V1__STATUS__RESOURCE_EXHAUSTED;
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, 1, 4096, 0, &bad), RDMAX_E_RESOURCE_EXHAUSTED);
	d.refuse_status = 0;
	/* The mapping goes with the last slice. */
	rdmax_region_free(c, s1);
	ck_assert_int_eq(cu.ipc_closes, 0);
	rdmax_region_free(c, s2);
	ck_assert_int_eq(cu.ipc_closes, 1);
	ck_assert_int_eq(cu.retains, cu.releases);
	/* A slice left at close is unmapped by rdmax_client_close(). */
	ck_assert_int_eq(rdmax_region_alloc_gpu(c, 1, 4096, 0, &s1), 0);
	rdmax_client_close(c);
	ck_assert_int_eq(cu.ipc_closes, 2);
	ck_assert_int_eq(cu.retains, cu.releases);
	ck_assert_int_eq(cu.ctx_depth, 0);
	fd_stop(&d);
	ck_assert_int_eq(d.n_pools, 4);
	ck_assert_uint_eq(d.pools[0].pool_id, 0);
	ck_assert_str_eq(d.pools[0].bus_id, "0000:86:00.0");
	ck_assert_uint_eq(d.pools[0].length, 100000);
	ck_assert_uint_eq(d.pools[0].access, RDMAX_ACCESS_REMOTE_WRITE);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(gpu_error_names_and_statuses)
{
	static const int codes[] = {
		RDMAX_E_GPU_DRIVER_MISSING, RDMAX_E_GPU_NOT_DEVICE_MEMORY,
		RDMAX_E_GPU_NOT_EXPORTABLE, RDMAX_E_GPU_NO_DMABUF,
		RDMAX_E_GPU_NEEDS_RDMA,     RDMAX_E_GPU_TOO_LARGE,
		RDMAX_E_GPU_ADDRESS_REUSED,
	};

	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		const char *s = rdmax_strerror(codes[i]);
		ck_assert_ptr_null(strstr(s, "unknown"));
		for (size_t k = 0; k < i; k++) {
			ck_assert_str_ne(s, rdmax_strerror(codes[k]));
		}
		/* They cross the wire as themselves, both ways. */
		int st = status_from_err(codes[i]);
		ck_assert_int_eq(st, -codes[i] - RDMAX_ERR_BASE);
		ck_assert_int_eq(err_from_status(st), codes[i]);
		ck_assert_int_eq(client_err_from_status(st), codes[i]);
		ck_assert_str_ne(status_name(st), "UNKNOWN");
	}
	ck_assert_ptr_nonnull(strstr(rdmax_strerror(RDMAX_E_GPU_NOT_EXPORTABLE), "expandable"));
	ck_assert_ptr_nonnull(strstr(rdmax_strerror(RDMAX_E_GPU_NEEDS_RDMA), "dma-buf"));
	ck_assert_int_eq(err_from_status(22), RDMAX_E_INTERNAL);
}
END_TEST

void gpu_client_add_tests(TCase *tc)
{
	tcase_add_test(tc, client_interior_offsets);
	tcase_add_test(tc, client_odd_sizes_and_ranges);
	tcase_add_test(tc, client_buffer_id_reuse);
	tcase_add_test(tc, client_vmm_and_driver_support);
	tcase_add_test(tc, client_vmm_mappings);
	tcase_add_test(tc, client_context_handling);
	tcase_add_test(tc, client_repeated_slices);
	tcase_add_test(tc, client_fallbacks_and_grace);
	tcase_add_test(tc, client_memory_kinds);
	tcase_add_test(tc, client_daemon_capabilities);
	tcase_add_test(tc, client_daemon_refuses);
	tcase_add_test(tc, client_missing_libcuda);
	tcase_add_test(tc, client_pool_slices);
	tcase_add_test(tc, gpu_error_names_and_statuses);
}
