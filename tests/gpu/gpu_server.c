/* SPDX-License-Identifier: MIT */
/*
 * The minimal protocol server of gpu_server.h: Hello, RegisterRegion and
 * DeregisterRegion, answered by the daemon's GPU module and region table in
 * this process. Everything else is refused by name. One client per server.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../unit/pass_fds.h"
#include "gpu_server.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"

static int hook_added(void *ctx, struct region *region)
{
	struct server *s = ctx;
	const uint64_t low = (UINT64_C(1) << 41) - 1;
	struct plan_seen *p = &s->seen;
	int ret;

	p->n++;
	/* The verbs transport's iova: high bits from the key, low bits from the memory. */
	p->iova = ((region->key >> 42) << 41) | (region->gpu_addr & low);
	ret = gpu_mr_plan(region, 0, UINT64_MAX, true, p->iova, &p->plan);
	if (ret < 0) {
		return ret;
	}
	p->dmabuf_size = 0;
	p->check = p->plan.how != GPU_MR_DMABUF ? 0
		   : s->check_dmabuf            ? s->check_dmabuf(p->plan.fd, &p->dmabuf_size)
						: gpu_check_dmabuf(p->plan.fd, &p->dmabuf_size);
	/* Here the verbs transport would call ibv_reg_dmabuf_mr(): stop. */
	region->transport_data[0] = region;
	return 0;
}

static void hook_removed(void *ctx, struct region *region)
{
	region->transport_data[0] = NULL;
}

static void send_msg(struct server *s, Rdmax__V1__DaemonMsg *m)
{
	size_t len = rdmax__v1__daemon_msg__get_packed_size(m);
	uint8_t *buf = malloc(len ? len : 1);

	rdmax__v1__daemon_msg__pack(m, buf);
	if (send(s->cfd, buf, len, MSG_NOSIGNAL) < 0) {
		perror("send");
	}
	free(buf);
}

static void reply_status(struct server *s, uint64_t seq, int err, const char *why)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Error e = RDMAX__V1__ERROR__INIT;

	e.status = err ? -err - RDMAX_ERR_BASE : 0;
	e.message = err ? (char *)why : NULL;
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_ERROR;
	m.error = &e;
	send_msg(s, &m);
}

static void on_hello(struct server *s, uint64_t seq)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Welcome w = RDMAX__V1__WELCOME__INIT;
	Rdmax__V1__Limits l = RDMAX__V1__LIMITS__INIT;

	l.max_message_bytes = 1 << 20;
	l.max_fds_per_message = 4;
	l.max_regions = 1024;
	l.max_registered_bytes = UINT64_C(1) << 50;
	l.max_outstanding_jobs = 64;
	l.max_jobs_per_submit = 64;
	w.protocol_version = RDMAX_PROTOCOL_VERSION;
	w.daemon_version = (char *)s->name;
	w.instance_id = s->table.instance_id;
	w.node_name = (char *)s->name;
	w.capabilities = RDMAX_CAP_VERBS | gpu_capabilities(s->gpu);
	w.limits = &l;
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_WELCOME;
	m.welcome = &w;
	send_msg(s, &m);
}

static void on_register(struct server *s, uint64_t seq, const Rdmax__V1__RegisterRegion *rr,
			const int *fds, int n_fds)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__RegionReply r = RDMAX__V1__REGION_REPLY__INIT;
	struct gpu_reg_req req = {
		.kind = (enum region_kind)rr->kind,
		.fd = rr->has_fd_index && (int)rr->fd_index < n_fds ? fds[rr->fd_index] : -1,
		.offset = rr->offset,
		.length = rr->length,
		.access = rr->access,
		.bus_id = rr->gpu_bus_id,
		.buffer_id = rr->gpu_buffer_id,
		.ipc_handle = rr->has_cuda_ipc_handle ? rr->cuda_ipc_handle.data : NULL,
		.ipc_handle_len = rr->has_cuda_ipc_handle ? rr->cuda_ipc_handle.len : 0,
	};
	struct region *region;
	uint8_t desc[512];
	int ret;

	pthread_mutex_lock(&s->lock);
	ret = gpu_register(s->gpu, &s->table, s, &req, s->why, sizeof(s->why), &region);
	/* Before the reply: the client counts the dma-bufs this process holds. */
	for (int i = 0; i < n_fds; i++) {
		close(fds[i]);
	}
	if (ret < 0) {
		pthread_mutex_unlock(&s->lock);
		if (s->log) {
			fprintf(s->log, "refused %s: %s\n", rdmax_err_name(ret), s->why);
		}
		reply_status(s, seq, ret, s->why);
		return;
	}
	if (s->log) {
		fprintf(s->log,
			"register id=%" PRIu64 " kind=%d offset=%" PRIu64 " length=%" PRIu64
			" bus=%s plan=%s plan_offset=%" PRIu64 " dmabuf_size=%" PRIu64
			" check=%d fds=%d\n",
			region->id, (int)rr->kind, rr->offset, rr->length,
			rr->gpu_bus_id ? rr->gpu_bus_id : "",
			s->seen.plan.how == GPU_MR_DMABUF ? "dmabuf" : "other", s->seen.plan.offset,
			s->seen.dmabuf_size, s->seen.check, n_fds);
	}
	r.region_id = region->id;
	r.desc.data = desc;
	/* A descriptor needs an endpoint; nothing connects to this one. */
	struct endpoint ep = {.transport = ENDPOINT_TCP, .port = 9};
	snprintf(ep.addr, sizeof(ep.addr), "127.0.0.1");
	ret = region_desc_encode(&s->table, region, s->name, &ep, 1, desc, sizeof(desc));
	r.desc.len = ret > 0 ? (size_t)ret : 0;
	r.has_length = 1;
	r.length = region->length;
	pthread_mutex_unlock(&s->lock);
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_REGION;
	m.region = &r;
	send_msg(s, &m);
}

static void on_deregister(struct server *s, uint64_t seq, uint64_t id)
{
	struct region *region;

	pthread_mutex_lock(&s->lock);
	region = region_find_owned(&s->table, s, id);
	if (region) {
		region_deregister(&s->table, region, NULL, NULL);
	}
	pthread_mutex_unlock(&s->lock);
	if (s->log) {
		fprintf(s->log, "deregister id=%" PRIu64 " %s\n", id, region ? "ok" : "unknown");
	}
	reply_status(s, seq, region ? 0 : RDMAX_E_NOT_FOUND, "no such region");
}

void *gpu_server_main(void *arg)
{
	struct server *s = arg;
	uint8_t buf[65536];

	s->cfd = accept(s->lfd, NULL, NULL);
	while (s->cfd >= 0) {
		int fds[TEST_RECV_FDS_MAX], n_fds = 0;
		ssize_t n = test_recv_fds(s->cfd, buf, sizeof(buf), fds, &n_fds);
		if (n <= 0) {
			break;
		}
		Rdmax__V1__ClientMsg *m = rdmax__v1__client_msg__unpack(NULL, (size_t)n, buf);
		if (!m) {
			break;
		}
		if (m->body_case == RDMAX__V1__CLIENT_MSG__BODY_HELLO) {
			on_hello(s, m->seq);
		} else if (m->body_case == RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION) {
			on_register(s, m->seq, m->register_region, fds, n_fds);
			n_fds = 0; /* closed there */
		} else if (m->body_case == RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION) {
			on_deregister(s, m->seq, m->deregister_region->region_id);
		} else {
			reply_status(s, m->seq, RDMAX_E_INVALID_ARGUMENT,
				     "not in the device check");
		}
		for (int i = 0; i < n_fds; i++) {
			close(fds[i]);
		}
		rdmax__v1__client_msg__free_unpacked(m, NULL);
	}
	return NULL;
}

int gpu_server_start(struct server *s, const char *name,
		     int (*check_dmabuf)(int fd, uint64_t *ret_size), FILE *log)
{
	struct region_hooks hooks = {.added = hook_added, .removed = hook_removed, .ctx = s};
	struct gpu_params p = {.mode = CONFIG_GPU_REG_AUTO,
			       .verbs = true,
			       .dmabuf = true,
			       .check_dmabuf = check_dmabuf};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	memset(s, 0, sizeof(*s));
	s->name = name;
	s->check_dmabuf = check_dmabuf;
	s->log = log;
	pthread_mutex_init(&s->lock, NULL);
	if (region_table_init(&s->table, 0xdc) < 0 ||
	    region_table_add_hooks(&s->table, &hooks) < 0 || gpu_create(&p, &s->gpu) < 0) {
		return -1;
	}
	snprintf(s->dir, sizeof(s->dir), "/tmp/rdmax-gpusrv-XXXXXX");
	if (!mkdtemp(s->dir)) {
		return -1;
	}
	snprintf(s->path, sizeof(s->path), "%s/sock", s->dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
	s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(s->lfd, 1) < 0) {
		return -1;
	}
	return pthread_create(&s->thread, NULL, gpu_server_main, s) == 0 ? 0 : -1;
}
