/* SPDX-License-Identifier: MIT */
/*
 * GPU memory check for a node with an NVIDIA GPU; tests/gpu/check-gpu.sh runs
 * it. Two processes: the parent loads libcuda (dlopen, through the project's
 * own driver table), allocates GPU memory and exports it as a dma-buf; the
 * child, forked before any CUDA call and never touching CUDA, receives the fd
 * over SCM_RIGHTS as rdmaxd would, checks it is a dma-buf of the right size,
 * and, where /dev/infiniband exists, registers it with ibv_reg_dmabuf_mr() and
 * RDMA-writes a pattern into it at an interior offset over a loopback RC QP.
 * The parent reads the memory back through CUDA: the pattern must sit at that
 * offset and nowhere else. Then the parent frees the memory while the child
 * still holds the dma-buf and its MR.
 *
 * Every step prints "step: NAME: PASS|FAIL|SKIP: detail"; a step whose
 * hardware is absent is skipped with the reason. Exit status: 0 when nothing
 * failed, 1 otherwise.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../unit/pass_fds.h"
#include "cuda_table.h"

#define DMA_BUF_FS_MAGIC 0x444d4142
#define ALLOC_BYTES      (8u << 20)
#define WRITE_OFFSET     ((3u << 20) + 4096 + 64) /* interior, not page aligned */
#define WRITE_BYTES      4096
#define PATTERN          0xa5

static int g_failed;

static void step(const char *name, const char *verdict, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void step(const char *name, const char *verdict, const char *fmt, ...)
{
	va_list ap;

	printf("step: %s: %s: ", name, verdict);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (strcmp(verdict, "FAIL") == 0) {
		g_failed = 1;
	}
}

/* ------------------------------------------------------------ messages */

static int send_msg(int sock, const char *text, int fd)
{
	union test_fd_control ctl;
	struct iovec iov = {.iov_base = (void *)text, .iov_len = strlen(text) + 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (fd >= 0) {
		test_attach_fd(&mh, &ctl, fd);
	}
	return sendmsg(sock, &mh, MSG_NOSIGNAL) < 0 ? -errno : 0;
}

/* Receive one message (up to size bytes) and maybe an fd; 30 s at most. */
static int recv_msg(int sock, char *buf, size_t size, int *ret_fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = size - 1};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.buf,
			    .msg_controllen = sizeof(ctl.buf)};
	struct pollfd pfd = {.fd = sock, .events = POLLIN};
	ssize_t n;

	if (poll(&pfd, 1, 30000) <= 0) {
		return -ETIMEDOUT;
	}
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	if (n <= 0) {
		return n == 0 ? -EPIPE : -errno;
	}
	buf[n] = '\0';
	if (ret_fd) {
		*ret_fd = -1;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
				memcpy(ret_fd, CMSG_DATA(c), sizeof(int));
			}
		}
	}
	return 0;
}

/* ------------------------------------------------------------ child: no CUDA */

struct loop {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *gpu_mr;
	struct ibv_mr *host_mr;
	uint8_t *host;
	char name[64];
};

static void loop_close(struct loop *l)
{
	if (l->qp) {
		ibv_destroy_qp(l->qp);
	}
	if (l->gpu_mr) {
		ibv_dereg_mr(l->gpu_mr);
	}
	if (l->host_mr) {
		ibv_dereg_mr(l->host_mr);
	}
	if (l->cq) {
		ibv_destroy_cq(l->cq);
	}
	if (l->pd) {
		ibv_dealloc_pd(l->pd);
	}
	if (l->ctx) {
		ibv_close_device(l->ctx);
	}
	free(l->host);
	memset(l, 0, sizeof(*l));
}

/* Connect the QP to itself: RTR towards its own QP number on the same port. */
static int connect_self(struct loop *l, uint8_t port, char *why, size_t why_size)
{
	struct ibv_port_attr pa;
	struct ibv_qp_attr a;
	union ibv_gid gid;
	int gid_index = -1;

	if (ibv_query_port(l->ctx, port, &pa)) {
		snprintf(why, why_size, "ibv_query_port() failed");
		return -1;
	}
	if (pa.state != IBV_PORT_ACTIVE) {
		snprintf(why, why_size, "port %u of %s is not active", port, l->name);
		return -1;
	}
	if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		struct ibv_gid_entry entries[64];
		ssize_t n = ibv_query_gid_table(l->ctx, entries, 64, 0);
		for (ssize_t i = 0; i < n; i++) {
			if (entries[i].port_num == port &&
			    entries[i].gid_type == IBV_GID_TYPE_ROCE_V2) {
				gid_index = (int)entries[i].gid_index;
				gid = entries[i].gid;
				break;
			}
		}
		if (gid_index < 0) {
			snprintf(why, why_size, "no RoCE v2 GID on port %u of %s", port, l->name);
			return -1;
		}
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(l->qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		snprintf(why, why_size, "QP to INIT failed");
		return -1;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = pa.active_mtu;
	a.dest_qp_num = l->qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.port_num = port;
	a.ah_attr.dlid = pa.lid;
	if (gid_index >= 0) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
		a.ah_attr.grh.hop_limit = 1;
	}
	if (ibv_modify_qp(l->qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER)) {
		snprintf(why, why_size, "QP to RTR failed: %s", strerror(errno));
		return -1;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(l->qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
		snprintf(why, why_size, "QP to RTS failed: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* Register the dma-buf on the first usable device and write WRITE_BYTES into it. */
static void child_rdma(int fd, uint64_t size, struct loop *l)
{
	const char *want = getenv("RDMAX_GPU_CHECK_DEVICE");
	struct ibv_device **list;
	char why[160] = "";
	int n = 0;

	if (access("/dev/infiniband", F_OK) != 0) {
		step("register-dmabuf-mr", "SKIP", "no /dev/infiniband on this node");
		step("loopback-write", "SKIP", "no RDMA device");
		return;
	}
	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n && !l->ctx; i++) {
		if (want && strcmp(want, ibv_get_device_name(list[i])) != 0) {
			continue;
		}
		l->ctx = ibv_open_device(list[i]);
		if (l->ctx) {
			snprintf(l->name, sizeof(l->name), "%s", ibv_get_device_name(list[i]));
		}
	}
	if (list) {
		ibv_free_device_list(list);
	}
	if (!l->ctx) {
		step("register-dmabuf-mr", "SKIP", "no RDMA device could be opened%s%s",
		     want ? " named " : "", want ? want : "");
		step("loopback-write", "SKIP", "no RDMA device");
		return;
	}
	l->pd = ibv_alloc_pd(l->ctx);
	if (!l->pd) {
		step("register-dmabuf-mr", "FAIL", "ibv_alloc_pd() on %s failed", l->name);
		return;
	}
	/* The iova shares the page offset of the dma-buf offset (0 here). */
	l->gpu_mr = ibv_reg_dmabuf_mr(l->pd, 0, size, 0x100000000ull, fd,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					      IBV_ACCESS_REMOTE_READ);
	if (!l->gpu_mr) {
		int err = errno;
		step("register-dmabuf-mr",
		     err == EOPNOTSUPP || err == EPROTONOSUPPORT ? "SKIP" : "FAIL",
		     "ibv_reg_dmabuf_mr() on %s failed: %s%s", l->name, strerror(err),
		     err == EOPNOTSUPP || err == EPROTONOSUPPORT
			     ? " (kernel or NIC driver without dma-buf support, e.g. Soft-RoCE)"
			     : "");
		step("loopback-write", "SKIP", "no dma-buf MR");
		return;
	}
	step("register-dmabuf-mr", "PASS", "%s: lkey 0x%x rkey 0x%x, %llu bytes", l->name,
	     l->gpu_mr->lkey, l->gpu_mr->rkey, (unsigned long long)size);

	l->host = aligned_alloc(4096, WRITE_BYTES);
	l->cq = ibv_create_cq(l->ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr qia = {
		.send_cq = l->cq,
		.recv_cq = l->cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	if (!l->host || !l->cq) {
		step("loopback-write", "FAIL", "out of memory or ibv_create_cq() failed");
		return;
	}
	memset(l->host, PATTERN, WRITE_BYTES);
	l->host_mr = ibv_reg_mr(l->pd, l->host, WRITE_BYTES, IBV_ACCESS_LOCAL_WRITE);
	l->qp = l->host_mr ? ibv_create_qp(l->pd, &qia) : NULL;
	if (!l->qp) {
		step("loopback-write", "FAIL", "ibv_reg_mr() or ibv_create_qp() on %s failed: %s",
		     l->name, strerror(errno));
		return;
	}
	if (connect_self(l, 1, why, sizeof(why)) < 0) {
		step("loopback-write", "SKIP", "%s", why);
		return;
	}
	struct ibv_sge sge = {
		.addr = (uintptr_t)l->host, .length = WRITE_BYTES, .lkey = l->host_mr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = {.remote_addr = 0x100000000ull + WRITE_OFFSET, .rkey = l->gpu_mr->rkey},
	};
	struct ibv_send_wr *bad;
	if (ibv_post_send(l->qp, &wr, &bad)) {
		step("loopback-write", "FAIL", "ibv_post_send() failed");
		return;
	}
	struct ibv_wc wc;
	int got = 0;
	for (int spins = 0; spins < 5000 && got == 0; spins++) {
		got = ibv_poll_cq(l->cq, 1, &wc);
		if (got == 0) {
			usleep(1000);
		}
	}
	if (got <= 0 || wc.status != IBV_WC_SUCCESS) {
		step("loopback-write", "FAIL", "RDMA write into GPU memory did not complete: %s",
		     got > 0 ? ibv_wc_status_str(wc.status) : "no completion within 5 s");
		return;
	}
	step("loopback-write", "PASS", "%u bytes written at offset %u of the GPU allocation",
	     WRITE_BYTES, WRITE_OFFSET);
}

static int child_main(int sock)
{
	char msg[64];
	struct statfs sfs;
	char link[64], target[128] = "";
	struct loop l;
	int fd = -1;
	off_t size;

	memset(&l, 0, sizeof(l));
	if (recv_msg(sock, msg, sizeof(msg), &fd) < 0 || strcmp(msg, "dmabuf") != 0 || fd < 0) {
		/* The parent skipped (no GPU) or failed before exporting. */
		return 0;
	}
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	target[n > 0 ? n : 0] = '\0';
	size = lseek(fd, 0, SEEK_END);
	if (fstatfs(fd, &sfs) == 0 && (unsigned long)sfs.f_type == DMA_BUF_FS_MAGIC &&
	    size == (off_t)ALLOC_BYTES) {
		step("child-sees-dmabuf", "PASS", "'%s', %lld bytes, in a process without CUDA",
		     target, (long long)size);
	} else {
		step("child-sees-dmabuf", "FAIL",
		     "fd is '%s' (fs magic 0x%lx), %lld bytes; expected a "
		     "dma-buf of %u bytes",
		     target, (unsigned long)sfs.f_type, (long long)size, ALLOC_BYTES);
	}
	child_rdma(fd, (uint64_t)ALLOC_BYTES, &l);
	send_msg(sock, l.qp ? "written" : "checked", -1);
	/* The parent frees the GPU memory now; we still hold the fd (and the MR). */
	if (recv_msg(sock, msg, sizeof(msg), NULL) == 0 && strcmp(msg, "freed") == 0) {
		size = lseek(fd, 0, SEEK_END);
		step("hold-after-free", size == (off_t)ALLOC_BYTES ? "PASS" : "FAIL",
		     "after cuMemFree() in the exporter the dma-buf is still %lld bytes%s",
		     (long long)size, l.gpu_mr ? " and its MR still registered" : "");
	}
	loop_close(&l);
	close(fd);
	send_msg(sock, "done", -1);
	return g_failed;
}

/* ------------------------------------------------------------ parent: CUDA */

static void skip_later_steps(const char *why)
{
	step("child-sees-dmabuf", "SKIP", "%s", why);
	step("register-dmabuf-mr", "SKIP", "%s", why);
	step("loopback-write", "SKIP", "%s", why);
	step("read-back", "SKIP", "%s", why);
	step("hold-after-free", "SKIP", "%s", why);
}

typedef CUresult (*memcpy_htod_fn)(CUdeviceptr dst, const void *src, size_t bytes);
typedef CUresult (*memcpy_dtoh_fn)(void *dst, CUdeviceptr src, size_t bytes);

static int parent_main(int sock, pid_t child)
{
	struct rdmax_cuda cu;
	const char *why = NULL;
	char bus[RDMAX_CUDA_BUS_ID_MAX] = "", msg[64];
	int count = 0, dmabuf = 0, fd = -1, status = 0;
	CUdevice dev;
	CUcontext ctx, popped;
	CUdeviceptr ptr = 0;
	CUresult r;

	if (rdmax_cuda_load(NULL, &cu, &why) < 0) {
		step("load-libcuda", "SKIP", "%s", why);
		goto out_no_gpu;
	}
	step("load-libcuda", "PASS", "entry points via %s",
	     cu.via_get_proc_address ? "cuGetProcAddress_v2" : "dlsym of the _v2 symbols");
	if (cu.device_get_count(&count) != CUDA_SUCCESS || count == 0) {
		step("find-gpu", "SKIP", "CUDA sees no GPU");
		goto out_no_gpu;
	}
	cu.device_get(&dev, 0);
	cu.device_get_pci_bus_id(bus, sizeof(bus), dev);
	cu.device_get_attribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev);
	step("find-gpu", "PASS", "%d GPU%s; GPU 0 at %s, dma-buf %s", count, count == 1 ? "" : "s",
	     bus,
	     dmabuf ? "supported" : "NOT supported (proprietary kernel module or old driver?)");
	if (cu.primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS ||
	    cu.ctx_push_current(ctx) != CUDA_SUCCESS) {
		step("allocate", "FAIL", "cannot make GPU 0's primary context current");
		goto out_no_gpu;
	}
	r = cu.mem_alloc(&ptr, ALLOC_BYTES);
	if (r != CUDA_SUCCESS) {
		step("allocate", "FAIL", "cuMemAlloc(%u) failed: %s", ALLOC_BYTES,
		     rdmax_cuda_error_name(&cu, r));
		goto out_pop;
	}
	step("allocate", "PASS", "%u bytes at 0x%llx", ALLOC_BYTES, (unsigned long long)ptr);

	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	memcpy_htod_fn htod = lib ? (memcpy_htod_fn)dlsym(lib, "cuMemcpyHtoD_v2") : NULL;
	memcpy_dtoh_fn dtoh = lib ? (memcpy_dtoh_fn)dlsym(lib, "cuMemcpyDtoH_v2") : NULL;
	uint8_t *host = calloc(1, ALLOC_BYTES);
	if (htod && host) {
		htod(ptr, host, ALLOC_BYTES); /* zeros, so that a stray write shows */
	}
	unsigned int one = 1;
	cu.pointer_set_attribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr);

	if (!dmabuf) {
		step("export-dmabuf", "SKIP",
		     "the GPU or driver cannot export dma-bufs (needs the "
		     "NVIDIA open kernel module and CUDA 11.7+)");
		skip_later_steps("no dma-buf");
		goto out_free;
	}
	r = cu.mem_get_handle_for_address_range(&fd, ptr, ALLOC_BYTES,
						CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (r != CUDA_SUCCESS || fd < 0) {
		step("export-dmabuf", "FAIL", "cuMemGetHandleForAddressRange() failed: %s",
		     rdmax_cuda_error_name(&cu, r));
		skip_later_steps("no dma-buf");
		goto out_free;
	}
	step("export-dmabuf", "PASS", "fd %d for the whole allocation", fd);
	if (send_msg(sock, "dmabuf", fd) < 0) {
		step("pass-to-child", "FAIL", "sendmsg(SCM_RIGHTS) failed");
		goto out_free;
	}
	close(fd);
	if (recv_msg(sock, msg, sizeof(msg), NULL) < 0) {
		step("pass-to-child", "FAIL", "the child did not answer");
		goto out_free;
	}
	if (strcmp(msg, "written") == 0) {
		if (!dtoh || !host) {
			step("read-back", "SKIP", "cuMemcpyDtoH_v2 not found");
		} else if (dtoh(host, ptr, ALLOC_BYTES) != CUDA_SUCCESS) {
			step("read-back", "FAIL", "cuMemcpyDtoH() failed");
		} else {
			size_t bad = 0, first_bad = 0;
			for (size_t i = 0; i < ALLOC_BYTES; i++) {
				uint8_t want = i >= WRITE_OFFSET && i < WRITE_OFFSET + WRITE_BYTES
						       ? PATTERN
						       : 0;
				if (host[i] != want && bad++ == 0) {
					first_bad = i;
				}
			}
			if (bad) {
				step("read-back", "FAIL",
				     "%zu bytes differ, the first at offset %zu "
				     "(a wrong dma-buf offset lands writes on neighbouring memory)",
				     bad, first_bad);
			} else {
				step("read-back", "PASS",
				     "pattern at offset %u only, read through "
				     "CUDA",
				     WRITE_OFFSET);
			}
		}
	} else {
		step("read-back", "SKIP", "no RDMA write was made");
	}
out_free:
	cu.mem_free(ptr);
	free(host);
	send_msg(sock, "freed", -1);
	recv_msg(sock, msg, sizeof(msg), NULL);
out_pop:
	cu.ctx_pop_current(&popped);
	cu.primary_ctx_release(dev);
	goto out_wait;
out_no_gpu:
	step("export-dmabuf", "SKIP", "no GPU");
	skip_later_steps("no GPU");
	send_msg(sock, "none", -1);
out_wait:
	close(sock);
	if (waitpid(child, &status, 0) == child && (!WIFEXITED(status) || WEXITSTATUS(status))) {
		g_failed = 1;
	}
	return g_failed;
}

int main(void)
{
	int sv[2];
	pid_t child;

	setvbuf(stdout, NULL, _IOLBF, 0);
	/* The child exists before any CUDA call: a forked CUDA process is not safe. */
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		return 1;
	}
	child = fork();
	if (child < 0) {
		perror("fork");
		return 1;
	}
	if (child == 0) {
		close(sv[0]);
		_exit(child_main(sv[1]));
	}
	close(sv[1]);
	return parent_main(sv[0], child) ? 1 : 0;
}
