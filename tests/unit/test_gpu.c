/* SPDX-License-Identifier: MIT */
/*
 * GPU memory without a GPU: librdmax's registration logic and the daemon's
 * validation, MR plans, peermem mappings, pools and topology, all driven
 * through the fake CUDA driver (fake_cuda.c). The client side talks to a
 * fake daemon thread that records what it received; the daemon side runs
 * gpu.c against a real region table whose hooks stand in for the verbs
 * transport, and against a fake sysfs tree.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/udmabuf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../client-lib/gpu.h"
#include "../../client-lib/internal.h"
#include "engine.h"
#include "fake_cuda.h"
#include "recv_fds.h"
#include "gpu.h"
#include "rdmaxd.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "region.h"
#include "status.h"

Suite *gpu_suite(void);

#define MiB (UINT64_C(1) << 20)

static uint64_t page_size(void)
{
	return (uint64_t)sysconf(_SC_PAGESIZE);
}

static int count_fds(void)
{
	int n = 0;
	char path[64];

	for (int fd = 0; fd < 1024; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n += access(path, F_OK) == 0;
	}
	return n;
}

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
	fds_before = count_fds();
	for (int i = 0; i < 5; i++) {
		void *p = (void *)(uintptr_t)(base + offsets[i]);
		ck_assert_int_eq(
			rdmax_region_register_gpu(c, p, 4096, RDMAX_ACCESS_REMOTE_WRITE, &r[i]), 0);
		ck_assert_ptr_eq(rdmax_region_addr(r[i]), p);
		ck_assert_uint_eq(rdmax_region_length(r[i]), 4096);
	}
	/* The client's dma-buf fds are closed once the daemon has its own. */
	ck_assert_int_eq(count_fds(), fds_before);
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
	CUdeviceptr base = fake_cuda_alloc(&cu, 3 * page_size() + 100, 0);
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(base + 10),
						   3 * page_size() + 90, 0, &r),
			 0);
	ck_assert_uint_eq(cu.last_export_size, 4 * page_size());
	/* One byte past the allocation: refused before anything is sent. */
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)(base + 10),
						   3 * page_size() + 91, 0, &r),
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
	const uint64_t chunk = 4 * MiB, page = page_size();

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
	const uint64_t page = page_size();

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
	fds_before = count_fds();
	ck_assert_int_eq(rdmax_region_register_gpu(c, (void *)(uintptr_t)p, 64 * MiB, 0, &r),
			 RDMAX_E_GPU_TOO_LARGE);
	ck_assert_int_eq(count_fds(), fds_before); /* the dma-buf did not leak */
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
static void make_sysfs(char *root, size_t size, uint64_t bar1_a, bool peermem)
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

static void rm_tree(const char *root)
{
	nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ================================================================ topology */

START_TEST(topology_from_sysfs)
{
	char root[64];
	struct gpu_topology t;
	const struct gpu_dev *a, *b, *c;

	make_sysfs(root, sizeof(root), 256 * MiB, false);
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
	rm_tree(root);
}
END_TEST

/* ================================================================ daemon side */

/* Stands in for the verbs transport's region hook on one device. */
struct hook {
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

/* The verbs transport's iova: high bits from the key, low bits from the memory. */
static uint64_t test_iova(const struct region *r)
{
	const uint64_t low = (UINT64_C(1) << 41) - 1;
	uint64_t addr = r->addr ? (uintptr_t)r->addr : r->gpu_addr;

	return ((r->key >> 42) << 41) | (addr & low);
}

static int hook_added(void *ctx, struct region *region)
{
	struct hook *h = ctx;
	struct stat st;
	int ret;

	if (!region->gpu) {
		return 0; /* host memory: not this suite's business */
	}
	h->added++;
	h->iova = test_iova(region);
	ret = gpu_mr_plan(region, 0, h->max_mr_size, h->dmabuf, h->iova, &h->plan);
	if (ret < 0) {
		return ret;
	}
	if (h->plan.how == GPU_MR_DMABUF) {
		h->fd_open = fstat(h->plan.fd, &st) == 0;
		h->fd_size = h->fd_open ? st.st_size : -1;
	}
	if (h->plan.how == GPU_MR_SHARED) {
		region->transport_data[0] = h->plan.shared;
	} else {
		region->transport_data[0] = malloc(8);
		h->live_mrs++;
	}
	return 0;
}

static void hook_removed(void *ctx, struct region *region)
{
	struct hook *h = ctx;

	h->removed++;
	h->watch_at_removal = h->watch ? *h->watch : 0;
	if (region->transport_data[0] && region->gpu && !gpu_region_shares_mrs(region)) {
		free(region->transport_data[0]);
		h->live_mrs--;
	}
	region->transport_data[0] = NULL;
}

/* What the verbs transport's destroy does before gpu_destroy(): drop every MR left. */
static void drop_mrs(struct region_table *t, struct hook *h)
{
	struct region *r;

	for (size_t it = 0; hmap_next(&t->by_id, &it, NULL, (void **)&r);) {
		hook_removed(h, r);
	}
	ck_assert_int_eq(h->live_mrs, 0);
}

static void table_with_hook(struct region_table *t, struct hook *h)
{
	struct region_hooks hooks = {.added = hook_added, .removed = hook_removed, .ctx = h};

	memset(h, 0, sizeof(*h));
	h->max_mr_size = UINT64_MAX;
	h->dmabuf = true;
	ck_assert_int_eq(region_table_init(t, 0x5eed), 0);
	ck_assert_int_eq(region_table_add_hooks(t, &hooks), 0);
}

/* Tests only: memfds stand in for dma-bufs. */
static int accept_memfd(int fd, uint64_t *ret_size)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		return -errno;
	}
	*ret_size = (uint64_t)st.st_size;
	return 0;
}

static int memfd_of(uint64_t size)
{
	int fd = memfd_create("stand-in-dmabuf", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	return fd;
}

START_TEST(daemon_dmabuf_check_is_real)
{
	uint64_t size = 0;
	int memfd = memfd_of(1 << 20);
	char path[] = "/tmp/rdmax-notdmabuf-XXXXXX";
	int file = mkstemp(path);

	/* On this host a memfd is not a dma-buf, nor is a file: both refused. */
	ck_assert_int_eq(gpu_check_dmabuf(memfd, &size), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_ge(file, 0);
	ck_assert_int_eq(gpu_check_dmabuf(file, &size), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(gpu_check_dmabuf(-1, &size), -EBADF);
	unlink(path);
	close(file);

	/* And through registration, with the real check. */
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct region *r;
	char why[320] = "";
	struct gpu_params p = {.sysfs_root = "/nonexistent", .verbs = true, .dmabuf = true};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF, .fd = memfd, .length = 4096};
	table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "not a dma-buf"));
	ck_assert_int_eq(h.added, 0);
	ck_assert_uint_eq(t.count, 0);
	gpu_destroy(gpu);
	region_table_fini(&t);

	/* A real dma-buf, where the kernel offers udmabuf to make one. */
	int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0) {
		printf("gpu: skipped the real dma-buf half of daemon_dmabuf_check_is_real: "
		       "/dev/udmabuf: %s\n",
		       strerror(errno));
		close(memfd);
		return;
	}
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	struct udmabuf_create create = {.memfd = (uint32_t)memfd, .size = 1 << 20};
	int dmabuf = ioctl(dev, UDMABUF_CREATE, &create);
	if (dmabuf < 0) {
		printf("gpu: skipped the real dma-buf half: UDMABUF_CREATE: %s\n", strerror(errno));
	} else {
		ck_assert_int_eq(gpu_check_dmabuf(dmabuf, &size), 0);
		ck_assert_uint_eq(size, 1 << 20);
		close(dmabuf);
	}
	close(dev);
	close(memfd);
}
END_TEST

START_TEST(daemon_dmabuf_registration)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct region *r, *r2;
	char why[320] = "";
	const uint64_t size = 8 * MiB;
	int fd = memfd_of(size);
	struct gpu_params p = {.sysfs_root = "/nonexistent",
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = accept_memfd};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF,
				  .fd = fd,
				  .offset = 3 * MiB + 123,
				  .length = MiB,
				  .access = RDMAX_ACCESS_REMOTE_READ,
				  .bus_id = "0000:3B:00.0",
				  .buffer_id = 42};

	table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_DMABUF);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r), 0);
	ck_assert_int_eq(r->kind, REGION_GPU_DMABUF);
	ck_assert_ptr_null(r->addr);
	ck_assert_uint_eq(r->length, MiB);
	ck_assert_str_eq(gpu_region_bus_id(r), "0000:3b:00.0");
	/* The hook registered the dma-buf while its fd was open, at the interior offset. */
	ck_assert_int_eq(h.plan.how, GPU_MR_DMABUF);
	ck_assert(h.fd_open);
	ck_assert_int_eq(h.fd_size, (off_t)size);
	ck_assert_uint_eq(h.plan.offset, 3 * MiB + 123);
	ck_assert_uint_eq(h.plan.length, MiB);
	/* iova and dma-buf offset share their page offset, as the kernel demands. */
	ck_assert_uint_eq(h.iova % page_size(), (3 * MiB + 123) % page_size());
	ck_assert_uint_eq(r->gpu_addr, 3 * MiB + 123);
	/* The daemon keeps the dma-buf for later slices of the allocation. */
	struct gpu_mr_plan later;
	ck_assert_int_eq(gpu_mr_plan(r, 0, UINT64_MAX, true, h.iova, &later), 0);
	ck_assert_int_ge(later.fd, 0);
	/* An iova on another page offset than the dma-buf offset: the kernel would refuse. */
	ck_assert_int_eq(gpu_mr_plan(r, 0, UINT64_MAX, true, h.iova + 1, &later),
			 RDMAX_E_INVALID_ARGUMENT);
	/* A device without dma-buf, or too small an MR limit: named errors. */
	ck_assert_int_eq(gpu_mr_plan(r, 0, UINT64_MAX, false, h.iova, &later),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_int_eq(gpu_mr_plan(r, 0, 4096, true, h.iova, &later), RDMAX_E_GPU_TOO_LARGE);
	ck_assert_int_eq(gpu_mr_plan(r, REGION_MAX_DEVICES, UINT64_MAX, true, 0, &later),
			 RDMAX_E_INVALID_ARGUMENT);

	/* Past the end of the dma-buf. */
	req.offset = size - 4096;
	req.length = 8192;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_OUT_OF_RANGE);
	ck_assert_ptr_nonnull(strstr(why, "past the end"));
	req.offset = UINT64_MAX - 10;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_OUT_OF_RANGE);
	/* The device's max_mr_size, through the hook: nothing stays registered. */
	req.offset = 0;
	req.length = 2 * MiB;
	h.max_mr_size = MiB;
	uint32_t count = t.count;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_TOO_LARGE);
	ck_assert_uint_eq(t.count, count);
	h.max_mr_size = UINT64_MAX;
	/* Access bits and length. */
	req.access = 0x10;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	req.access = 0;
	req.length = 0;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);

	region_deregister(&t, r, NULL, NULL);
	ck_assert_uint_eq(t.count, 0);
	ck_assert_int_eq(h.live_mrs, 0);
	gpu_destroy(gpu);
	region_table_fini(&t);
	close(fd);
}
END_TEST

START_TEST(daemon_paths_and_capabilities)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct region *r;
	char root[64], why[320] = "";
	int fd = memfd_of(MiB);
	struct gpu_reg_req dm = {.kind = REGION_GPU_DMABUF, .fd = fd, .length = 4096};
	struct gpu_reg_req ipc = {.kind = REGION_GPU_CUDA_IPC, .length = 4096};
	struct gpu_params p = {.check_dmabuf = accept_memfd};

	make_sysfs(root, sizeof(root), 0, true);
	p.sysfs_root = root;
	table_with_hook(&t, &h);

	/* No RDMA transport: refused at once, with the words the brief asks for. */
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NEEDS_RDMA);
	ck_assert_ptr_nonnull(strstr(why, "need an RDMA device with dma-buf support"));
	ck_assert_int_eq(gpu_register(NULL, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NEEDS_RDMA);
	gpu_destroy(gpu);

	/* RDMA without dma-buf support, peermem loaded: only the fallback is offered. */
	p.verbs = true;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert(gpu_peermem_loaded(root));
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_PEERMEM);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "5.12"));
	gpu_destroy(gpu);

	/* registration = dmabuf: the IPC path is off even with peermem loaded. */
	p.dmabuf = true;
	p.mode = CONFIG_GPU_REG_DMABUF;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_DMABUF);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &ipc, why, sizeof(why), &r),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "registration = dmabuf"));
	gpu_destroy(gpu);

	/* registration = peermem: dma-bufs are refused even where devices take them. */
	p.mode = CONFIG_GPU_REG_PEERMEM;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_PEERMEM);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &dm, why, sizeof(why), &r),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "registration = peermem"));
	gpu_destroy(gpu);

	/* auto with both: both offered. */
	p.mode = CONFIG_GPU_REG_AUTO;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_uint_eq(gpu_capabilities(gpu), RDMAX_CAP_DMABUF | RDMAX_CAP_PEERMEM);
	/* Not a GPU kind. */
	struct gpu_reg_req host = {.kind = REGION_HOST_FD, .fd = fd, .length = 4096};
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &host, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	gpu_destroy(gpu);
	ck_assert_uint_eq(t.count, 0);
	region_table_fini(&t);
	rm_tree(root);
	close(fd);
}
END_TEST

START_TEST(daemon_bar1_budget)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct region *r1, *r2;
	char root[64], why[320] = "";
	int fd8 = memfd_of(8 * MiB), fd16 = memfd_of(16 * MiB);
	struct gpu_params p = {.verbs = true, .dmabuf = true, .check_dmabuf = accept_memfd};
	struct gpu_reg_req req = {
		.kind = REGION_GPU_DMABUF, .fd = fd8, .length = 4096, .bus_id = "0000:3B:00.0"};

	make_sysfs(root, sizeof(root), 16 * MiB, false);
	p.sysfs_root = root;
	table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	/* The whole exported buffer counts, however little of it is registered. */
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r1), 0);
	req.fd = fd16;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_TOO_LARGE);
	ck_assert_ptr_nonnull(strstr(why, "BAR1"));
	ck_assert_int_eq(h.added, 1); /* refused before any device saw it */
	/* Another GPU (unknown BAR1) is not limited. */
	req.bus_id = "0000:86:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	region_deregister(&t, r2, NULL, NULL);
	/* Room again once the first region went. */
	region_deregister(&t, r1, NULL, NULL);
	req.bus_id = "0000:3b:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	region_deregister(&t, r2, NULL, NULL);
	gpu_destroy(gpu);
	region_table_fini(&t);
	rm_tree(root);
	close(fd8);
	close(fd16);
}
END_TEST

START_TEST(daemon_shared_dmabuf)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct region *r[6], *bad;
	char root[64], why[320] = "";
	int owner, other;
	/* 16 MiB of BAR1; a 10 MiB allocation registered in six slices. */
	int fd = memfd_of(10 * MiB);
	struct gpu_params p = {.verbs = true, .dmabuf = true, .check_dmabuf = accept_memfd};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF,
				  .fd = fd,
				  .length = MiB,
				  .bus_id = "0000:3B:00.0",
				  .buffer_id = 77};

	make_sysfs(root, sizeof(root), 16 * MiB, false);
	p.sysfs_root = root;
	table_with_hook(&t, &h);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	int fd2 = memfd_of(10 * MiB);
	int fds_before = count_fds();
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &r[0]), 0);
	/* The daemon keeps one reference to the dma-buf for later slices. */
	ck_assert_int_eq(count_fds(), fds_before + 1);
	req.fd = -1;
	for (int i = 1; i < 6; i++) {
		req.offset = (uint64_t)i * MiB + 100;
		ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &r[i]), 0);
		/* Its own MR, over the same dma-buf, at its offset. */
		ck_assert_int_eq(h.plan.how, GPU_MR_DMABUF);
		ck_assert(h.fd_open);
		ck_assert_int_eq(h.fd_size, (off_t)(10 * MiB));
		ck_assert_uint_eq(h.plan.offset, (uint64_t)i * MiB + 100);
		ck_assert_uint_eq(h.iova % page_size(), 100);
	}
	ck_assert_int_eq(count_fds(), fds_before + 1);
	ck_assert_int_eq(h.live_mrs, 6);
	/* Charged once: 10 MiB of 16, so another 10 MiB allocation does not fit. */
	struct gpu_reg_req other_alloc = req;
	other_alloc.fd = fd2;
	other_alloc.offset = 0;
	other_alloc.buffer_id = 78;
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &other_alloc, why, sizeof(why), &bad),
			 RDMAX_E_GPU_TOO_LARGE);
	/* Past the shared dma-buf; another client's buffer ids name nothing of this one. */
	req.offset = 10 * MiB - 4096;
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &bad),
			 RDMAX_E_OUT_OF_RANGE);
	req.offset = 0;
	ck_assert_int_eq(gpu_register(gpu, &t, &other, &req, why, sizeof(why), &bad),
			 RDMAX_E_NOT_FOUND);
	ck_assert_ptr_nonnull(strstr(why, "buffer 77"));
	req.buffer_id = 0;
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &bad),
			 RDMAX_E_NOT_FOUND);
	req.buffer_id = 77;
	/* The dma-buf goes with its last region, and with it the charge. */
	for (int i = 0; i < 5; i++) {
		region_deregister(&t, r[i], NULL, NULL);
	}
	ck_assert_int_eq(count_fds(), fds_before + 1);
	region_deregister(&t, r[5], NULL, NULL);
	ck_assert_int_eq(count_fds(), fds_before);
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &bad),
			 RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &other_alloc, why, sizeof(why), &bad), 0);
	region_deregister(&t, bad, NULL, NULL);
	ck_assert_int_eq(h.live_mrs, 0);
	gpu_destroy(gpu);
	region_table_fini(&t);
	rm_tree(root);
	close(fd);
	close(fd2);
}
END_TEST

START_TEST(daemon_checks_bus_id)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *r;
	CUipcMemHandle handle;
	char root[64], why[320] = "";
	int fd = memfd_of(MiB);

	fake_cuda_init(&cu);
	make_sysfs(root, sizeof(root), 0, true);
	table_with_hook(&t, &h);
	struct gpu_params p = {.sysfs_root = root,
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = accept_memfd,
			       .cuda = &cu.table};
	struct gpu_reg_req req = {
		.kind = REGION_GPU_DMABUF, .fd = fd, .length = 4096, .bus_id = "0000:99:00.0"};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	/* Not a GPU of this node, not a bus id at all, or none where GPUs are known. */
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "0000:99:00.0"));
	req.bus_id = "../../etc";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	req.bus_id = NULL;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	req.bus_id = "0000:3B:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r), 0);
	region_deregister(&t, r, NULL, NULL);
	/* peermem: the opened memory must be on the GPU the client named. */
	CUdeviceptr alloc = fake_cuda_alloc(&cu, 4 * MiB, 1); /* 0000:86:00.0 */
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, alloc, &handle), CUDA_SUCCESS);
	struct gpu_reg_req ipc = {.kind = REGION_GPU_CUDA_IPC,
				  .length = MiB,
				  .bus_id = "0000:3b:00.0",
				  .ipc_handle = (const uint8_t *)&handle,
				  .ipc_handle_len = sizeof(handle)};
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &ipc, why, sizeof(why), &r),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "0000:86:00.0"));
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ipc.bus_id = "0000:86:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &ipc, why, sizeof(why), &r), 0);
	region_deregister(&t, r, NULL, NULL);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.retains, cu.releases);
	region_table_fini(&t);
	rm_tree(root);
	close(fd);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(daemon_flushes_before_imm)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *r0, *r1;
	char root[64], why[320] = "";
	int fd = memfd_of(MiB);

	fake_cuda_init(&cu);
	make_sysfs(root, sizeof(root), 0, false);
	table_with_hook(&t, &h);
	struct gpu_params p = {.sysfs_root = root,
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = accept_memfd,
			       .cuda_library = "libcuda-not-here.so.1"};
	/* No GPU region: nothing to flush, CUDA not even loaded. */
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(gpu_flush_writes(NULL), 0);

	/* Device 0 does not order GPUDirect writes for its own kernels: flushed, device 1 not. */
	p.cuda = &cu.table;
	p.cuda_library = NULL;
	cu.ordering[0] = 0;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	struct gpu_reg_req req = {
		.kind = REGION_GPU_DMABUF, .fd = fd, .length = 4096, .bus_id = "0000:86:00.0"};
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r1), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 0);
	ck_assert_int_eq(cu.flushes, 0);
	req.bus_id = "0000:3b:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r0), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 1);
	ck_assert_int_eq(cu.flushes, 1);
	ck_assert_ptr_eq(cu.last_flush_ctx, FAKE_CUDA_PRIMARY_CTX(0));
	ck_assert_int_eq(cu.ctx_depth, 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), 1);
	ck_assert_int_eq(cu.flushes, 2);
	/* A GPU that needs the flush but cannot do it: said once, not pretended. */
	cu.flush_options[0] = 0;
	region_deregister(&t, r0, NULL, NULL);
	region_deregister(&t, r1, NULL, NULL);
	gpu_destroy(gpu);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r0), 0);
	ck_assert_int_eq(gpu_flush_writes(gpu), -EOPNOTSUPP);
	ck_assert_int_eq(cu.flushes, 2);
	region_deregister(&t, r0, NULL, NULL);
	ck_assert_int_eq(h.live_mrs, 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.retains, cu.releases);
	region_table_fini(&t);
	rm_tree(root);
	close(fd);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(daemon_peermem_owner_gone)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *r;
	CUipcMemHandle handle;
	char root[64], why[320] = "";
	int owner;

	fake_cuda_init(&cu);
	make_sysfs(root, sizeof(root), 0, true);
	table_with_hook(&t, &h);
	h.watch = &cu.ipc_closes;
	CUdeviceptr alloc = fake_cuda_alloc(&cu, 4 * MiB, 0);
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, alloc, &handle), CUDA_SUCCESS);
	struct gpu_params p = {.sysfs_root = root, .verbs = true, .cuda = &cu.table};
	struct gpu_reg_req req = {.kind = REGION_GPU_CUDA_IPC,
				  .length = MiB,
				  .bus_id = "0000:3b:00.0",
				  .ipc_handle = (const uint8_t *)&handle,
				  .ipc_handle_len = sizeof(handle)};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &owner, &req, why, sizeof(why), &r), 0);
	/* The client dies with a job still using the region (session_close deregisters). */
	region_get(r);
	region_deregister(&t, r, NULL, NULL);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 1);
	ck_assert_int_eq(h.live_mrs, 1);
	/* The last job lets go: the MR goes first, then the mapping, nothing later. */
	region_put(&t, r);
	ck_assert_int_eq(h.live_mrs, 0);
	ck_assert_int_eq(h.watch_at_removal, 0);
	ck_assert_int_eq(cu.ipc_closes, 1);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ck_assert_int_eq(cu.ctx_depth, 0);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.retains, cu.releases);
	region_table_fini(&t);
	rm_tree(root);
	fake_cuda_fini(&cu);
}
END_TEST

START_TEST(daemon_peermem_open_close)
{
	struct region_table t;
	struct hook h;
	struct gpu *gpu;
	struct region *r, *r2;
	struct fake_cuda cu;
	CUipcMemHandle handle;
	char root[64], why[320] = "";

	fake_cuda_init(&cu);
	make_sysfs(root, sizeof(root), 0, true);
	table_with_hook(&t, &h);
	/* The client's allocation, and its handle. */
	CUdeviceptr alloc = fake_cuda_alloc(&cu, 4 * MiB, 0);
	ck_assert_int_eq(fake_cuda_ipc_handle(&cu, alloc, &handle), CUDA_SUCCESS);
	struct gpu_params p = {.sysfs_root = root, .verbs = true, .cuda = &cu.table};
	struct gpu_reg_req req = {.kind = REGION_GPU_CUDA_IPC,
				  .offset = MiB + 64,
				  .length = MiB,
				  .access = RDMAX_ACCESS_REMOTE_WRITE,
				  .bus_id = "0000:3B:00.0",
				  .ipc_handle = (const uint8_t *)&handle,
				  .ipc_handle_len = sizeof(handle)};
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r), 0);
	/* Opened once, in the GPU's primary context, which is not left current. */
	ck_assert_int_eq(cu.ipc_opens, 1);
	ck_assert_int_eq(cu.ctx_depth, 0);
	ck_assert_int_eq(r->kind, REGION_GPU_CUDA_IPC);
	ck_assert_int_eq(h.plan.how, GPU_MR_ADDR);
	const struct fake_alloc *m = fake_cuda_find(&cu, (CUdeviceptr)(uintptr_t)h.plan.addr);
	ck_assert_ptr_nonnull(m);
	ck_assert(m->mapping);
	ck_assert_uint_eq(m->of, alloc);
	ck_assert_uint_eq((uintptr_t)h.plan.addr, m->base + MiB + 64);
	ck_assert_uint_eq(h.iova % page_size(), (m->base + MiB + 64) % page_size());
	/* Past the allocation: the mapping is closed again. */
	req.offset = 4 * MiB - 4096;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_OUT_OF_RANGE);
	ck_assert_int_eq(cu.ipc_closes, 1);
	/* A handle of the wrong size, an unknown GPU, a garbage handle. */
	req.offset = 0;
	req.ipc_handle_len = 10;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	req.ipc_handle_len = sizeof(handle);
	req.bus_id = "0000:99:00.0";
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "0000:99:00.0"));
	req.bus_id = "0000:3b:00.0";
	uint8_t junk[64];
	memset(junk, 0x5a, sizeof(junk));
	req.ipc_handle = junk;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(why, "cuIpcOpenMemHandle"));
	/* Deregistration closes the mapping after the devices let go. */
	ck_assert_int_eq(cu.ipc_closes, 1);
	region_deregister(&t, r, NULL, NULL);
	ck_assert_int_eq(cu.ipc_closes, 2);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ck_assert_int_eq(h.live_mrs, 0);
	/* A region still registered at shutdown is closed by gpu_destroy(). */
	req.ipc_handle = (const uint8_t *)&handle;
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	region_deregister(&t, r2, NULL, NULL);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2), 0);
	drop_mrs(&t, &h);
	gpu_destroy(gpu);
	ck_assert_int_eq(fake_cuda_mappings(&cu), 0);
	ck_assert_int_eq(cu.retains, cu.releases);
	ck_assert_int_eq(cu.ctx_depth, 0);
	region_table_fini(&t);

	/* Without libcuda the fallback is refused by name. */
	table_with_hook(&t, &h);
	p.cuda = NULL;
	p.cuda_library = "libcuda-not-here.so.1";
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_DRIVER_MISSING);
	ck_assert_ptr_nonnull(strstr(why, "libcuda"));
	gpu_destroy(gpu);
	region_table_fini(&t);

	/* Without nvidia_peermem. */
	rm_tree(root);
	make_sysfs(root, sizeof(root), 0, false);
	table_with_hook(&t, &h);
	p.cuda = &cu.table;
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &t, &h, &req, why, sizeof(why), &r2),
			 RDMAX_E_GPU_NO_DMABUF);
	ck_assert_ptr_nonnull(strstr(why, "nvidia_peermem"));
	gpu_destroy(gpu);
	region_table_fini(&t);
	rm_tree(root);
	fake_cuda_fini(&cu);
}
END_TEST

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
	struct hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *s1, *s2, *s3, *none;
	struct gpu_lease l1, l2, l3;
	struct pool_seen seen = {0};
	char why[320] = "";
	int owner;

	fake_cuda_init(&cu);
	cu.dmabuf[1] = false; /* device 1 cannot export: its pool goes through peermem */
	table_with_hook(&t, &h);
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
	ck_assert_uint_eq(test_iova(s2), test_iova(pool_region) + GPU_POOL_ALIGN);
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
	struct hook h;
	struct gpu *gpu;
	struct fake_cuda cu;
	struct region *s;
	struct gpu_lease l;
	char root[64], why[320] = "";
	int owner;

	fake_cuda_init(&cu);
	cu.n_devices = 1;
	make_sysfs(root, sizeof(root), 0, true);
	table_with_hook(&t, &h);
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
	drop_mrs(&t, &h);
	gpu_destroy(gpu);
	ck_assert_int_eq(cu.mem_frees, 1);
	region_table_fini(&t);

	/* Pools off, or without an RDMA device: nothing allocated. */
	table_with_hook(&t, &h);
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
	rm_tree(root);
	fake_cuda_fini(&cu);
}
END_TEST

/* The engine never copies GPU memory within the node: it has no host mapping to copy. */
static int g_done_err;
static char g_done_msg[256];
static int g_done;

static void on_done(void *owner, uint64_t job_id, int err, const char *message, uint64_t bytes)
{
	g_done++;
	g_done_err = err;
	snprintf(g_done_msg, sizeof(g_done_msg), "%s", message ? message : "");
}

static void submit_local_write(struct engine *e, struct job_owner *owner, uint64_t id,
			       const struct region *from, const uint8_t *desc, size_t desc_len)
{
	Rdmax__V1__Job job = RDMAX__V1__JOB__INIT;
	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;

	job.job_id = id;
	job.kind_case = RDMAX__V1__JOB__KIND_WRITE;
	job.write = &w;
	w.local_region = from->id;
	w.length = 4096;
	w.remote_desc.data = (uint8_t *)desc;
	w.remote_desc.len = desc_len;
	engine_submit(e, owner, &job);
}

START_TEST(engine_refuses_same_node_gpu_copies)
{
	struct rdmaxd d;
	struct engine *engine;
	struct job_owner owner;
	struct hook h;
	struct gpu *gpu;
	struct region *gpu_region, *host;
	uint8_t gdesc[DESC_MAX_BYTES], hdesc[DESC_MAX_BYTES];
	char why[320];
	int dmabuf = memfd_of(MiB);
	int memfd = memfd_create("host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	struct gpu_params p = {.sysfs_root = "/nonexistent",
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = accept_memfd};
	struct gpu_reg_req req = {.kind = REGION_GPU_DMABUF,
				  .fd = dmabuf,
				  .length = 65536,
				  .access = RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ};

	memset(&d, 0, sizeof(d));
	config_defaults(&d.cfg);
	d.loop = uv_default_loop();
	d.instance_id = 0x5eed;
	table_with_hook(&d.regions, &h);
	ck_assert_int_eq(imm_table_init(&d.imm, 16, NULL, NULL), 0);
	ck_assert_int_eq(engine_create(&d, on_done, &engine), 0);
	ck_assert_int_eq(job_owner_init(&owner), 0);
	ck_assert_int_eq(gpu_create(&p, &gpu), 0);
	ck_assert_int_eq(gpu_register(gpu, &d.regions, &owner, &req, why, sizeof(why), &gpu_region),
			 0);
	ck_assert_int_eq(ftruncate(memfd, 65536), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(region_register_host_fd(
				 &d.regions, &owner, memfd, 0, 65536,
				 RDMAX_ACCESS_REMOTE_WRITE | RDMAX_ACCESS_REMOTE_READ, &host),
			 0);
	struct endpoint ep = {.transport = ENDPOINT_TCP, .port = 9};
	snprintf(ep.addr, sizeof(ep.addr), "127.0.0.1");
	int glen = region_desc_encode(&d.regions, gpu_region, "n", &ep, 1, gdesc, sizeof(gdesc));
	int hlen = region_desc_encode(&d.regions, host, "n", &ep, 1, hdesc, sizeof(hdesc));
	ck_assert_int_gt(glen, 0);
	ck_assert_int_gt(hlen, 0);

	/* Host into GPU, GPU into host: a named refusal, not a copy through NULL. */
	submit_local_write(engine, &owner, 1, host, gdesc, (size_t)glen);
	ck_assert_int_eq(g_done, 1);
	ck_assert_int_eq(g_done_err, RDMAX_E_GPU_NEEDS_RDMA);
	ck_assert_ptr_nonnull(strstr(g_done_msg, "GPU memory"));
	submit_local_write(engine, &owner, 2, gpu_region, hdesc, (size_t)hlen);
	ck_assert_int_eq(g_done, 2);
	ck_assert_int_eq(g_done_err, RDMAX_E_GPU_NEEDS_RDMA);
	/* Host to host on the same node still copies. */
	submit_local_write(engine, &owner, 3, host, hdesc, (size_t)hlen);
	ck_assert_int_eq(g_done, 3);
	ck_assert_int_eq(g_done_err, 0);

	job_owner_leave(engine, &owner);
	region_deregister(&d.regions, gpu_region, NULL, NULL);
	region_deregister(&d.regions, host, NULL, NULL);
	engine_destroy(engine);
	gpu_destroy(gpu);
	imm_table_fini(&d.imm);
	region_table_fini(&d.regions);
	uv_run(uv_default_loop(), UV_RUN_NOWAIT);
	close(memfd);
	close(dmabuf);
}
END_TEST

Suite *gpu_suite(void)
{
	Suite *s = suite_create("gpu");
	TCase *tc = tcase_create("gpu");

	tcase_set_timeout(tc, 10);
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
	tcase_add_test(tc, topology_from_sysfs);
	tcase_add_test(tc, daemon_dmabuf_check_is_real);
	tcase_add_test(tc, daemon_dmabuf_registration);
	tcase_add_test(tc, daemon_paths_and_capabilities);
	tcase_add_test(tc, daemon_bar1_budget);
	tcase_add_test(tc, daemon_shared_dmabuf);
	tcase_add_test(tc, daemon_checks_bus_id);
	tcase_add_test(tc, daemon_flushes_before_imm);
	tcase_add_test(tc, daemon_peermem_open_close);
	tcase_add_test(tc, daemon_peermem_owner_gone);
	tcase_add_test(tc, daemon_pools);
	tcase_add_test(tc, daemon_pools_peermem_and_off);
	tcase_add_test(tc, engine_refuses_same_node_gpu_copies);
	suite_add_tcase(s, tc);
	return s;
}
