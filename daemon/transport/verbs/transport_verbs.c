/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport: one-sided RDMA (WRITE, READ, WRITE_WITH_IMM) over RC
 * queue pairs that librdmacm connects. This file owns the transport object:
 * its creation and teardown, the transport ops the engine calls (submit,
 * endpoints, routes, conns, ports, shutdown), the memory registration of
 * regions on every device, and the address helpers the other verbs_*.c files
 * share. Payload bytes never pass through the daemon: the NICs move them
 * between registered regions. The one exception is SEND messages (at most
 * 64 KiB, verbs_msg.c and verbs_accept.c).
 *
 * The pieces: verbs_link.c (the conn state machine's ops on real rdma_cm and
 * verbs calls), verbs_accept.c (the accepting side and the owner's side of
 * messages), verbs_listen.c (listeners and rdma_cm event dispatch),
 * verbs_completions.c (CQ callbacks and the progress loop), verbs_msg.c (the
 * sender's side of messages); transport_verbs_internal.h holds what they share.
 *
 * It never calls rdma-core except through verbs.h, never blocks the loop
 * (every fd is non-blocking and drained in bounded batches) and never calls
 * an xfer's done from inside submit.
 */
#include "transport_verbs_internal.h"

/* ------------------------------------------------------------ helpers */

bool vt_is_wildcard(const char *addr)
{
	struct in6_addr a6;
	struct in_addr a4;

	if (inet_pton(AF_INET, addr, &a4) == 1) {
		return a4.s_addr == 0;
	}
	return inet_pton(AF_INET6, addr, &a6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&a6);
}

int vt_parse_sockaddr(const char *addr, uint16_t port, struct sockaddr_storage *ret_ss)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, addr, &sin->sin_addr) == 1) {
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
	} else if (inet_pton(AF_INET6, addr, &sin6->sin6_addr) == 1) {
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(port);
	} else {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	*ret_ss = ss;
	return 0;
}

void vt_format_sockaddr(const struct sockaddr *sa, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
		snprintf(buf, size, "[%s]:%u", host, ntohs(sin6->sin6_port));
	} else if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
		snprintf(buf, size, "%s:%u", host, ntohs(sin->sin_port));
	} else {
		snprintf(buf, size, "?");
	}
}

/* True when a and b (same family) agree on their first prefix_len bits. */
static bool same_subnet(const struct sockaddr_storage *a, const struct sockaddr_storage *b,
			uint32_t prefix_len)
{
	const uint8_t *x, *y;
	uint32_t bits;

	if (a->ss_family != b->ss_family || prefix_len == 0) {
		return false;
	}
	if (a->ss_family == AF_INET) {
		x = (const uint8_t *)&((const struct sockaddr_in *)a)->sin_addr;
		y = (const uint8_t *)&((const struct sockaddr_in *)b)->sin_addr;
		bits = MIN(prefix_len, 32u);
	} else {
		x = (const uint8_t *)&((const struct sockaddr_in6 *)a)->sin6_addr;
		y = (const uint8_t *)&((const struct sockaddr_in6 *)b)->sin6_addr;
		bits = MIN(prefix_len, 128u);
	}
	for (uint32_t i = 0; i < bits / 8; i++) {
		if (x[i] != y[i]) {
			return false;
		}
	}
	uint8_t mask = (uint8_t)(0xff00u >> (bits % 8));
	return (bits % 8) == 0 || ((x[bits / 8] ^ y[bits / 8]) & mask) == 0;
}

/*
 * The local device (its listener) that carries traffic to dst: the one whose
 * interface subnet holds dst, so that with several devices each peer device
 * is reached through its own device pair (rail); the only one when there is
 * one. NULL: let routing choose (the source stays unbound).
 */
static const struct listener *source_for(const struct verbs_transport *vt,
					 const struct sockaddr_storage *dst)
{
	const struct listener *only = NULL;
	uint32_t n = 0;

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		const struct listener *l = vt->listeners[vt->hcas.hcas[i]->index];
		if (!l) {
			continue;
		}
		if (same_subnet(&l->ss, dst, l->prefix_len)) {
			return l;
		}
		only = l;
		n++;
	}
	return n == 1 ? only : NULL;
}

/*
 * The source address for rdma_resolve_addr() towards dst, in *buf: the device
 * chosen by source_for() (port 0), else the configured listen address. Two
 * nodes on one host must not loop inside a device.
 */
struct sockaddr *vt_source_addr(const struct verbs_transport *vt,
				const struct sockaddr_storage *dst, struct sockaddr_storage *buf)
{
	const struct listener *l = source_for(vt, dst);

	if (l) {
		*buf = l->ss;
		if (buf->ss_family == AF_INET) {
			((struct sockaddr_in *)buf)->sin_port = 0;
		} else {
			((struct sockaddr_in6 *)buf)->sin6_port = 0;
		}
		return (struct sockaddr *)buf;
	}
	return vt->bind_src ? (struct sockaddr *)&vt->src : NULL;
}

/*
 * The address peers use for a region: its mapping's low bits (so the page
 * offset is that of the memory) under high bits taken from the region's
 * random key. A descriptor whose key was changed no longer agrees with its
 * iova, and one that was changed consistently points where no MR is.
 */
uint64_t vt_region_iova(const struct region *region)
{
	const uint64_t low = (UINT64_C(1) << IOVA_KEY_SHIFT) - 1;

	/* Memory without a host mapping (GPU) gives the address of its page offset. */
	uint64_t addr = region->addr ? (uint64_t)(uintptr_t)region->addr : region->gpu_addr;

	return ((region->key >> (64 - (63 - IOVA_KEY_SHIFT))) << IOVA_KEY_SHIFT) | (addr & low);
}

static bool iova_matches_key(uint64_t iova, uint64_t key)
{
	return iova >> IOVA_KEY_SHIFT == key >> (64 - (63 - IOVA_KEY_SHIFT));
}

void vt_index_qp(struct verbs_transport *vt, uint32_t qp_num, struct cm_obj *obj, bool *indexed)
{
	*indexed = hmap_put(&vt->qps, (uint64_t)qp_num + 1, obj) == 0;
}

void vt_unindex_qp(struct verbs_transport *vt, uint32_t qp_num, bool *indexed)
{
	if (*indexed) {
		hmap_del(&vt->qps, (uint64_t)qp_num + 1);
		*indexed = false;
	}
}

/* ------------------------------------------------------- regions (MRs) */

static int region_added(void *ctx, struct region *region)
{
	struct verbs_transport *vt = ctx;
	int access = IBV_ACCESS_RELAXED_ORDERING; /* masked by devices without it */
	int ret = 0;
	uint32_t i;

	if (!region->addr && !region->gpu) {
		log_warn("region %" PRIu64 ": memory without a host mapping or GPU handle cannot "
			 "be registered with RDMA devices",
			 region->id);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/* Least privilege: each right only when the region needs it. */
	if (region->writable) {
		access |= IBV_ACCESS_LOCAL_WRITE;
	}
	if (region->access & RDMAX_ACCESS_REMOTE_READ) {
		access |= IBV_ACCESS_REMOTE_READ;
	}
	if (region->access & RDMAX_ACCESS_REMOTE_WRITE) {
		access |= IBV_ACCESS_REMOTE_WRITE;
	}
	uint64_t iova = vt_region_iova(region);
	/* Per-uid isolation: the MRs go into the PDs of the owner's uid. */
	struct vt_domain *dom = NULL;
	if (vt->per_uid && (ret = vt_domain_hold_uid(vt, region->uid, &dom)) < 0) {
		return ret;
	}
	for (i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		struct ibv_mr *mr;
		struct ibv_pd *pd;
		if ((ret = vt_domain_pd(dom, hca, &pd)) < 0) {
			goto out_dereg;
		}
		if (region->gpu) {
			/* GPU memory and pool slices: gpu.c plans it, gpu_verbs.c logs failures. */
			ret = gpu_verbs_reg_mr(region, hca, pd, iova, access, &mr);
			if (ret < 0) {
				goto out_dereg;
			}
			region->transport_data[hca->index] = mr;
			continue;
		}
		if (region->length > hca->attr.max_mr_size) {
			log_warn("region %" PRIu64 " of %" PRIu64 " bytes is larger than the "
				 "max_mr_size (%" PRIu64 " bytes) of device '%s'",
				 region->id, region->length, (uint64_t)hca->attr.max_mr_size,
				 hca->name);
			ret = RDMAX_E_RESOURCE_EXHAUSTED;
			goto out_dereg;
		}
		ret = verbs_reg_mr(pd, region->addr, region->length, iova, access, &mr);
		if (ret < 0) {
			log_warn("ibv_reg_mr() of region %" PRIu64 " (%" PRIu64
				 " bytes) on '%s' failed: %s%s",
				 region->id, region->length, hca->name, strerror(-ret),
				 ret == -ENOMEM ? " (check the locked-memory limit, ulimit -l)"
						: "");
			goto out_dereg;
		}
		region->transport_data[hca->index] = mr;
	}
	return 0;

out_dereg:
	while (i-- > 0) {
		struct hca *hca = vt->hcas.hcas[i];
		if (region->gpu) {
			gpu_verbs_dereg_mr(region, hca, region->transport_data[hca->index]);
		} else {
			verbs_dereg_mr(region->transport_data[hca->index]);
		}
		region->transport_data[hca->index] = NULL;
	}
	vt_domain_put(vt, dom);
	return ret;
}

static void region_removed(void *ctx, struct region *region)
{
	struct verbs_transport *vt = ctx;

	if (!vt) {
		return;
	}
	bool registered = false;
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		struct ibv_mr *mr = region->transport_data[hca->index];
		if (!mr) {
			continue;
		}
		registered = true;
		if (region->gpu) {
			/* A pool slice's MR is its pool's: gpu_verbs.c leaves it alone. */
			gpu_verbs_dereg_mr(region, hca, mr);
			region->transport_data[hca->index] = NULL;
			continue;
		}
		int ret = verbs_dereg_mr(mr);
		if (ret < 0) {
			log_warn("ibv_dereg_mr() of region %" PRIu64 " on '%s' failed: %s",
				 region->id, hca->name, strerror(-ret));
		}
		region->transport_data[hca->index] = NULL;
	}
	/* region_added() held the uid's domain for it. */
	if (registered && vt->per_uid) {
		vt_domain_put(vt, vt_domain_of_uid(vt, region->uid));
	}
}

/* ------------------------------------------------------- transport ops */

/*
 * The domain of an xfer's local region (per-uid isolation): its connection's
 * QPs must be in that PD here, or the NIC refuses the region's lkey. The MRs
 * of a region are all in its uid's PDs (or all in the shared ones), so the
 * first device that has one tells.
 */
static uint32_t local_domain(struct verbs_transport *vt, const struct xfer *xfer)
{
	if (!vt->per_uid || !xfer->local || xfer->length == 0) {
		return 0;
	}
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		const struct hca *hca = vt->hcas.hcas[i];
		if (xfer->local->transport_data[hca->index]) {
			const struct vt_domain *dom = vt_region_domain(vt, xfer->local, hca);
			return dom ? dom->number : 0;
		}
	}
	return 0;
}

static int check_xfer(const struct xfer *xfer)
{
	if ((unsigned)xfer->op >= XFER_OP_MAX || xfer->peer.transport != ENDPOINT_VERBS ||
	    !xfer->done || (xfer->op == XFER_READ && xfer->has_imm) ||
	    !memchr(xfer->peer.addr, '\0', sizeof(xfer->peer.addr))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (xfer->length == 0) {
		return 0;
	}
	if (!xfer->local || (!xfer->local->addr && !xfer->local->gpu)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (xfer->op == XFER_READ && !xfer->local->writable) {
		return RDMAX_E_PERMISSION_DENIED;
	}
	return region_check_range(xfer->local, xfer->local_offset, xfer->length);
}

/* A barrier's imm on its way as an imm record (see IMM_MAILBOX). */
struct imm_check {
	struct xfer msg;   /* the message carrying the record */
	struct xfer *user; /* the engine's zero-length write */
	uint8_t record[IMM_RECORD_LEN];
};

static void imm_check_done(struct xfer *msg, int err, const char *message)
{
	struct imm_check *ic = msg->ctx;
	struct xfer *user = ic->user;

	free(ic);
	user->done(user, err, message);
}

static int submit_imm_check(struct verbs_transport *vt, struct xfer *xfer)
{
	struct imm_check *ic = calloc(1, sizeof(*ic));

	if (!ic) {
		return -ENOMEM;
	}
	ic->user = xfer;
	put_le64(ic->record, xfer->remote_instance);
	put_le64(ic->record + 8, xfer->remote_region);
	put_le64(ic->record + 16, xfer->remote_key);
	for (int i = 0; i < 4; i++) {
		ic->record[24 + i] = (uint8_t)(xfer->imm >> (8 * i));
	}
	ic->msg.op = XFER_WRITE;
	ic->msg.peer = xfer->peer;
	ic->msg.remote_instance = xfer->remote_instance;
	ic->msg.has_uid = xfer->has_uid; /* a connection it opens counts for the job's uid */
	ic->msg.uid = xfer->uid;
	ic->msg.length = IMM_RECORD_LEN;
	ic->msg.mailbox = IMM_MAILBOX;
	ic->msg.payload = ic->record;
	ic->msg.done = imm_check_done;
	ic->msg.ctx = ic;
	int ret = vt_send_message(&vt->base, &ic->msg);
	if (ret < 0) {
		free(ic);
	}
	return ret;
}

/*
 * A write carrying bytes and an imm: the bytes as a plain RDMA WRITE, then,
 * once the NIC acknowledged them (they are in the peer's memory), the imm as
 * an imm record naming the region, so the peer counts it in the namespace of
 * that region's client. Listed in vt->imm_writes until the write's done, so
 * that withdraw can find it; a withdrawn one sends no record.
 */
struct imm_write {
	struct xfer data;
	struct xfer *user;
	struct verbs_transport *vt;
	struct list_node node; /* in vt->imm_writes */
	bool withdrawn;
};

static void imm_write_data_done(struct xfer *data, int err, const char *message)
{
	struct imm_write *iw = data->ctx;
	struct xfer *user = iw->user;
	struct verbs_transport *vt = iw->vt;
	bool withdrawn = iw->withdrawn;

	user->bytes_done = data->bytes_done;
	list_del(&iw->node);
	free(iw);
	if (withdrawn) {
		/* Its job completed: the write is over, and the imm must not count any more. */
		user->done(user, RDMAX_E_CANCELLED, "withdrawn after its job completed");
		return;
	}
	if (err == 0) {
		err = submit_imm_check(vt, user);
		message = err < 0 ? "cannot send the imm record after the write" : NULL;
	}
	if (err < 0) {
		user->done(user, err, message);
	}
}

static int submit_write_then_record(struct verbs_transport *vt, struct xfer *xfer)
{
	struct imm_write *iw = malloc(sizeof(*iw));

	if (!iw) {
		return -ENOMEM;
	}
	iw->data = *xfer;
	iw->data.has_imm = false;
	iw->data.done = imm_write_data_done;
	iw->data.ctx = iw;
	iw->user = xfer;
	iw->vt = vt;
	iw->withdrawn = false;
	int ret = conn_submit_domain(&vt->conns, &iw->data, local_domain(vt, xfer), now_ms());
	if (ret < 0) {
		free(iw);
		return ret;
	}
	list_add_tail(&vt->imm_writes, &iw->node);
	return 0;
}

/* The data write of an imm-carrying xfer that is not done yet, or NULL. */
static struct imm_write *find_imm_write(struct verbs_transport *vt, const struct xfer *user)
{
	for (struct list_node *pos = vt->imm_writes.next; pos != &vt->imm_writes; pos = pos->next) {
		struct imm_write *iw = container_of(pos, struct imm_write, node);
		if (iw->user == user) {
			return iw;
		}
	}
	return NULL;
}

/*
 * transport_ops.withdraw: a data xfer still queued (while its connection is
 * set up, or behind the send queue's credits) is taken back. What the NIC
 * already holds cannot be: -EINPROGRESS, and done follows once its WRs
 * completed or flushed (conn_withdraw(): a peer that takes none of them
 * within WITHDRAW_GRACE_MS loses the connection, whose QPs then flush). The
 * write of an imm-carrying xfer likewise, and its imm record is then never
 * sent. A message waiting for a staging slot is taken back; one staged (or
 * an imm record on its way) is left to finish: -EBUSY.
 */
static int verbs_withdraw(struct transport *transport, struct xfer *xfer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);

	if (xfer->mailbox) {
		for (struct list_node *pos = vt->msg_wait.next; pos != &vt->msg_wait;
		     pos = pos->next) {
			if (pos == &xfer->link) {
				list_del(&xfer->link);
				return 0;
			}
		}
		return -EBUSY;
	}
	if (xfer->has_imm) {
		struct imm_write *iw = find_imm_write(vt, xfer);
		if (!iw) {
			return -EBUSY;
		}
		if (conn_withdraw(&vt->conns, &iw->data, now_ms()) == 0) {
			list_del(&iw->node);
			free(iw);
			return 0;
		}
		/* Posted, or finished with its done on the way: no record follows it. */
		iw->withdrawn = true;
		return -EINPROGRESS;
	}
	return conn_withdraw(&vt->conns, xfer, now_ms());
}

static int verbs_submit(struct transport *transport, struct xfer *xfer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	char message[RDMAX_MESSAGE_MAX];

	if (vt->shut) {
		return RDMAX_E_CANCELLED;
	}
	int ret = check_xfer(xfer);
	if (ret < 0) {
		return ret;
	}
	xfer->wire_id = 0; /* a one-sided xfer, not a message */
	if (!iova_matches_key(xfer->peer.iova, xfer->remote_key)) {
		/* Caught here, so a forged key never reaches the wire. */
		snprintf(message, sizeof(message),
			 "unknown region: the descriptor's key does not match its address on "
			 "device '%s' (forged or corrupted descriptor)",
			 xfer->peer.device);
		conn_table_finish(&vt->conns, xfer, RDMAX_E_NOT_FOUND, message);
		return 0;
	}
	if (xfer->length == 0 && xfer->has_imm) {
		return submit_imm_check(vt, xfer);
	}
	if (xfer->has_imm) {
		return submit_write_then_record(vt, xfer);
	}
	return conn_submit_domain(&vt->conns, xfer, local_domain(vt, xfer), now_ms());
}

static int verbs_endpoints(struct transport *transport, const struct region *region,
			   struct endpoint *ret_endpoints, uint32_t max)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	uint32_t n = 0;

	for (uint32_t i = 0; i < vt->hcas.n && n < max; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		struct listener *l = vt->listeners[hca->index];
		struct endpoint ep = {.transport = ENDPOINT_VERBS};
		if (!l || hca->dead) {
			continue;
		}
		copy_string(ep.addr, sizeof(ep.addr), l->addr);
		ep.port = l->port;
		copy_string(ep.device, sizeof(ep.device), hca->name);
		if (region) {
			struct ibv_mr *mr = region->transport_data[hca->index];
			if (!mr) {
				continue;
			}
			ep.iova = vt_region_iova(region);
			ep.rkey = mr->rkey;
			const struct vt_domain *dom = vt_region_domain(vt, region, hca);
			if (dom) {
				ep.domain = dom->number;
				ep.domain_token = dom->token;
			}
		}
		ret_endpoints[n++] = ep;
	}
	/*
	 * Peers use the first endpoint they can reach: for GPU memory, list the
	 * NICs nearest the GPU first (same PCIe switch, root port, host bridge,
	 * NUMA node), so that the NIC that moves its bytes is the closest one.
	 */
	const char *bus_id = gpu_region_bus_id(region);
	if (bus_id && bus_id[0] && n > 1 && n <= REGION_MAX_DEVICES) {
		const char *names[REGION_MAX_DEVICES];
		struct endpoint sorted[REGION_MAX_DEVICES];
		uint32_t order[REGION_MAX_DEVICES];
		for (uint32_t i = 0; i < n; i++) {
			names[i] = ret_endpoints[i].device;
		}
		if (gpu_nearest_devices(vt->daemon->gpu, bus_id, names, n, order) > 0) {
			for (uint32_t i = 0; i < n; i++) {
				sorted[i] = ret_endpoints[order[i]];
			}
			memcpy(ret_endpoints, sorted, n * sizeof(*sorted));
		}
	}
	return (int)n;
}

static int verbs_route(struct transport *transport, const struct endpoint *peer, char *ret_device,
		       size_t device_size)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct sockaddr_storage dst;

	if (vt_parse_sockaddr(peer->addr, peer->port, &dst) < 0) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	const struct listener *l = source_for(vt, &dst);
	if (!l) {
		copy_string(ret_device, device_size, "");
		return 0;
	}
	if (!hca_usable(l->hca)) {
		return RDMAX_E_UNREACHABLE;
	}
	copy_string(ret_device, device_size, l->hca->name);
	return 0;
}

static void verbs_shutdown(struct transport *transport)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct list_node *pos, *tmp;

	if (vt->shut) {
		return;
	}
	vt->shut = true;
	for (uint32_t i = 0; i < REGION_MAX_DEVICES; i++) {
		vt_listener_free(vt->listeners[i]);
		vt->listeners[i] = NULL;
	}
	list_for_each_safe(pos, tmp, &vt->passives)
	{
		vt_passive_close(container_of(pos, struct passive, link), true,
				 "daemon shutting down");
	}
	conn_table_shutdown(&vt->conns);
	vt_progress(vt);
	/* Messages still waiting for a slot never reached a connection. */
	while (!list_empty(&vt->msg_wait)) {
		struct xfer *user = container_of(vt->msg_wait.next, struct xfer, link);
		list_del(&user->link);
		user->done(user, RDMAX_E_CANCELLED, "daemon shutting down");
	}
}

static void verbs_list_conns(struct transport *transport, transport_conn_cb cb, void *arg)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct list_node *pos;
	uint64_t now = now_ms();

	for (pos = vt->conns.conns.next; pos != &vt->conns.conns; pos = pos->next) {
		const struct conn *conn = container_of(pos, struct conn, link);
		struct transport_conn_info info = {
			.peer = conn->name,
			.node_name = "",
			/* "ready" is the name the admin views count, whatever the fabric. */
			.state = conn->state == CONN_ESTABLISHED ? "ready"
								 : conn_state_name(conn->state),
			.outgoing = true,
			.in_flight = conn_outstanding(conn),
			.queued = conn->n_pending,
			.bytes_sent = conn->bytes_sent,
			.bytes_received = conn->bytes_received,
			.idle_ms = now - MIN(now, conn->last_active_ms),
			.local_domain = conn->local_domain,
			.remote_domain = conn->remote_domain,
			.latency_lane = conn->latency_lane,
			.qps = conn->n_links,
		};
		cb(arg, &info);
	}
	/* The accepting side moves no bytes itself: the peer's NIC reads and writes. */
	for (pos = vt->passives.next; pos != &vt->passives; pos = pos->next) {
		const struct passive *p = container_of(pos, struct passive, link);
		struct transport_conn_info info = {
			.peer = p->name,
			.node_name = "",
			.state = p->state == PASSIVE_UP ? "ready" : "accepting",
			.outgoing = false,
			.in_flight = (uint32_t)(p->ans_posted - p->ans_done),
			.queued = p->n_queued,
			.local_domain = p->domain ? p->domain->number : 0,
		};
		cb(arg, &info);
	}
}

static int verbs_reset_peer(struct transport *transport, const char *peer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct list_node *pos, *tmp;
	int closed = 0;

	list_for_each_safe(pos, tmp, &vt->conns.conns)
	{
		struct conn *conn = container_of(pos, struct conn, link);
		if (strcmp(conn->name, peer) == 0 && conn->state != CONN_DRAINING &&
		    conn->state != CONN_CLOSED) {
			log_notice("connection to %s reset by the administrator", conn->name);
			conn_close(conn, RDMAX_E_TRANSPORT_ERROR,
				   "connection reset by the administrator (rdmaxctl peer reset)");
			closed++;
		}
	}
	list_for_each_safe(pos, tmp, &vt->passives)
	{
		struct passive *p = container_of(pos, struct passive, link);
		if (strcmp(p->name, peer) == 0) {
			log_notice("connection from %s reset by the administrator", p->name);
			vt_passive_close(p, true, "reset by the administrator");
			closed++;
		}
	}
	vt_progress(vt);
	return closed;
}

static uint32_t mtu_bytes(enum ibv_mtu mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 0;
}

static bool peermem_loaded(void)
{
	return access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
	       access("/sys/module/nvidia_peermem/version", F_OK) == 0;
}

static void verbs_list_ports(struct transport *transport, transport_port_cb cb, void *arg)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	struct ibv_gid_entry gids[64];
	bool peermem = peermem_loaded();

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		int n_gids = verbs_query_gid_table(hca->ctx, gids, ARRAY_SIZE(gids));
		for (uint8_t port = 1; port <= hca->n_ports; port++) {
			struct transport_port_info info;
			struct ibv_port_attr pa;
			char netdev[IF_NAMESIZE] = "";
			memset(&info, 0, sizeof(info));
			if (verbs_query_port(hca->ctx, port, &pa) < 0) {
				continue;
			}
			info.device = hca->name;
			info.port = port;
			info.state = verbs_port_state_str(pa.state);
			info.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
										   : "InfiniBand";
			info.active_mtu = mtu_bytes(pa.active_mtu);
			info.max_mtu = mtu_bytes(pa.max_mtu);
			info.dmabuf = hca->dmabuf;
			info.peermem = peermem;
			info.netdev = netdev;
			for (int g = 0; g < n_gids && info.n_gids < TRANSPORT_PORT_GIDS_MAX; g++) {
				if (gids[g].port_num != port) {
					continue;
				}
				if (!netdev[0] && gids[g].ndev_ifindex) {
					if_indextoname(gids[g].ndev_ifindex, netdev);
				}
				info.gids[info.n_gids].index = gids[g].gid_index;
				inet_ntop(AF_INET6, gids[g].gid.raw, info.gids[info.n_gids].gid,
					  sizeof(info.gids[info.n_gids].gid));
				info.gids[info.n_gids].type =
					gids[g].gid_type == IBV_GID_TYPE_ROCE_V2   ? "RoCE v2"
					: gids[g].gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
										   : "IB";
				info.n_gids++;
			}
			cb(arg, &info);
		}
	}
}

static void unhook(struct verbs_transport *vt)
{
	struct region_table *table = &vt->daemon->regions;

	/* Regions that outlive the transport must not reach it through the hooks. */
	for (uint32_t i = 0; i < table->n_hooks; i++) {
		if (table->hooks[i].ctx == vt) {
			table->hooks[i].ctx = NULL;
		}
	}
}

static void verbs_destroy(struct transport *transport)
{
	struct region *region;
	size_t iter = 0;

	if (!transport) {
		return;
	}
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	if (!vt->shut || vt->handles > 0 || vt->hcas.handles > 0) {
		log_err("transport_verbs: destroy() before shutdown completed (%u handles open)",
			vt->handles + vt->hcas.handles);
		return;
	}
	/* MRs of regions still held (jobs that never returned) go with the devices. */
	while (hmap_next(&vt->daemon->regions.by_id, &iter, NULL, (void **)&region)) {
		region_removed(vt, region);
	}
	unhook(vt);
	conn_table_fini(&vt->conns);
	vt_domains_fini(vt);
	hmap_fini(&vt->qps);
	vt_pool_close(vt);
	hca_table_free(&vt->hcas);
	verbs_cm_destroy_channel(vt->cm);
	verbs_free_devices(vt->devices);
	free(vt);
}

static const struct transport_ops g_verbs_ops = {
	.name = "verbs",
	.submit = verbs_submit,
	.endpoints = verbs_endpoints,
	.shutdown = verbs_shutdown,
	.destroy = verbs_destroy,
	.list_conns = verbs_list_conns,
	.reset_peer = verbs_reset_peer,
	.list_ports = verbs_list_ports,
	.send_message = vt_send_message,
	.withdraw = verbs_withdraw,
	.poll = vt_poll,
	.route = verbs_route,
};

/* Everything create() built before it failed, in reverse. */
static void create_undo(struct verbs_transport *vt)
{
	for (uint32_t i = 0; i < REGION_MAX_DEVICES; i++) {
		vt_listener_free(vt->listeners[i]);
	}
	vt_pool_close(vt);
	/* Device handles were never run by the loop: close and forget them. */
	hca_table_close(&vt->hcas);
	uv_run(vt->daemon->loop, UV_RUN_NOWAIT);
	hca_table_free(&vt->hcas);
	verbs_cm_destroy_channel(vt->cm);
	verbs_free_devices(vt->devices);
	free(vt);
}

static void build_policy(struct verbs_transport *vt, struct conn_policy *p)
{
	const struct config *cfg = &vt->daemon->cfg;
	uint64_t max_wr = MAX_WR_BYTES;

	vt->sq_depth = SQ_DEPTH;
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		if (hca->max_msg_sz > 0) {
			max_wr = MIN(max_wr, hca->max_msg_sz);
		}
		vt->sq_depth = MIN(vt->sq_depth, (uint32_t)MAX(hca->attr.max_qp_wr, 4));
	}
	memset(p, 0, sizeof(*p));
	p->links = cfg->qps_per_peer;
	p->sq_depth = vt->sq_depth;
	p->signal_interval = cfg->signal_interval;
	p->inline_threshold = cfg->inline_threshold;
	p->batch = POST_BATCH;
	p->max_wr_bytes = max_wr;
	p->connect_timeout_ms = cfg->connect_timeout_ms;
	p->connect_retries = cfg->connect_retries;
	p->retry_backoff_ms = cfg->retry_backoff_ms;
	p->drain_timeout_ms = MAX((uint32_t)DRAIN_MIN_MS, cfg->connect_timeout_ms);
	p->peer_timeout_ms = cfg->peer_timeout_ms;
	p->withdraw_grace_ms = MIN((uint32_t)WITHDRAW_GRACE_MS, cfg->peer_timeout_ms);
	p->idle_timeout_s = cfg->idle_timeout_s;
	p->max_connections = cfg->max_connections;
}

int transport_verbs_create(struct rdmaxd *daemon, struct transport **ret_transport)
{
	const struct config *cfg = &daemon->cfg;
	/* Under "auto" a missing device is normal: say why at info level only. */
	int prio = cfg->transport == CONFIG_TRANSPORT_VERBS ? LOG_ERR : LOG_INFO;
	struct hca_callbacks cb = {
		.send_wc = vt_on_send_wc,
		.imm = vt_on_imm,
		.recv = vt_on_recv,
		.async = vt_on_async,
		.progress = vt_on_progress,
	};
	struct conn_policy policy;
	struct verbs_transport *vt;
	int ret;

	if ((ret = auth_init()) < 0) {
		log_err("sodium_init() failed");
		return ret;
	}
	vt = calloc(1, sizeof(*vt));
	if (!vt) {
		return -ENOMEM;
	}
	vt->base.ops = &g_verbs_ops;
	vt->base.kind = ENDPOINT_VERBS;
	vt->base.daemon = daemon;
	vt->daemon = daemon;
	list_init(&vt->passives);
	list_init(&vt->msg_wait);
	list_init(&vt->imm_writes);
	cb.ctx = vt;
	hca_table_init(&vt->hcas, daemon->loop, &cb);
	vt->hcas.events = &daemon->counters.verbs_cq_events;

	ret = verbs_get_devices(&vt->devices);
	if (ret <= 0) {
		log_msg(prio, "verbs: no RDMA device found%s%s", ret < 0 ? ": " : "",
			ret < 0 ? strerror(-ret) : "");
		free(vt);
		return ret < 0 ? ret : -ENODEV;
	}
	ret = verbs_cm_create_channel(&vt->cm);
	if (ret < 0) {
		log_msg(prio, "verbs: rdma_create_event_channel() failed: %s", strerror(-ret));
		verbs_free_devices(vt->devices);
		free(vt);
		return -ENODEV;
	}
	if ((ret = verbs_set_nonblock(vt->cm->fd)) < 0) {
		log_err("fcntl(O_NONBLOCK) on the rdma_cm channel failed: %s", strerror(-ret));
		create_undo(vt);
		return ret;
	}
	if ((ret = hmap_init(&vt->qps, 256)) < 0) {
		create_undo(vt);
		return ret;
	}
	vt_open_listeners(vt, prio);
	if (vt->hcas.n == 0) {
		log_msg(prio, "verbs: no usable RDMA device has the listen address '%s'",
			cfg->listen_addr);
		hmap_fini(&vt->qps);
		create_undo(vt);
		return -ENODEV;
	}
	if (!vt_is_wildcard(cfg->listen_addr) &&
	    vt_parse_sockaddr(cfg->listen_addr, 0, &vt->src) == 0) {
		vt->bind_src = true;
	}
	if ((ret = vt_pool_open(vt)) < 0) {
		hmap_fini(&vt->qps);
		create_undo(vt);
		return ret;
	}
	build_policy(vt, &policy);
	ret = conn_table_init(&vt->conns, &policy, &vt_conn_ops, vt, daemon->instance_id,
			      daemon->auth_key, daemon->auth_key_len);
	if (ret < 0) {
		log_err("verbs: cannot set up the connection table: %s", strerror(-ret));
		hmap_fini(&vt->qps);
		create_undo(vt);
		return ret;
	}
	const char *post_thread = getenv("RDMAXD_TEST_VERBS_POST_THREAD");
	vt->post_thread_always = post_thread && strcmp(post_thread, "1") == 0;
	if (vt->post_thread_always) {
		log_warn("RDMAXD_TEST_VERBS_POST_THREAD=1: every bulk post list goes to the "
			 "posting thread; never set this in production");
	}
	vt->conns.uid_conns = &daemon->peer_conns;
	vt->conns.uid_conn_limit = &daemon->cfg.per_uid_peer_connections;
	vt->conns_ready = true;
	if ((ret = vt_domains_init(vt)) < 0) {
		conn_table_fini(&vt->conns);
		hmap_fini(&vt->qps);
		create_undo(vt);
		return ret;
	}
	struct region_hooks hooks = {.added = region_added, .removed = region_removed, .ctx = vt};
	if ((ret = region_table_add_hooks(&daemon->regions, &hooks)) < 0) {
		log_err("verbs: cannot install the region hooks: %s", strerror(-ret));
		vt_domains_fini(vt);
		conn_table_fini(&vt->conns);
		hmap_fini(&vt->qps);
		create_undo(vt);
		return ret;
	}
	uv_poll_init(daemon->loop, &vt->cm_poll, vt->cm->fd);
	uv_check_init(daemon->loop, &vt->check);
	uv_idle_init(daemon->loop, &vt->kick);
	uv_timer_init(daemon->loop, &vt->tick);
	vt->cm_poll.data = vt->check.data = vt->kick.data = vt->tick.data = vt;
	vt->handles = 4;
	vt->handles_open = true;
	uv_poll_start(&vt->cm_poll, UV_READABLE, vt_on_cm);
	uv_check_start(&vt->check, vt_on_check);
	uint64_t tick = MIN(MAX(cfg->peer_timeout_ms / 4, 10u), 1000u);
	uv_timer_start(&vt->tick, vt_on_tick, tick, tick);

	char devs[256] = "";
	size_t used = 0;
	for (uint32_t i = 0; i < vt->hcas.n && used < sizeof(devs); i++) {
		const struct hca *hca = vt->hcas.hcas[i];
		const struct listener *l = vt->listeners[hca->index];
		int n = snprintf(devs + used, sizeof(devs) - used, "%s%s (%s port %u)",
				 i ? ", " : "", hca->name, l ? l->addr : "?", l ? l->port : 0);
		used += n > 0 ? (size_t)n : 0;
	}
	log_notice("verbs transport on %s: %u QP%s per peer, SQ %u, inline up to %u bytes, "
		   "signal every %u WRs%s%s",
		   devs, policy.links, policy.links == 1 ? "" : "s", policy.sq_depth,
		   policy.inline_threshold, policy.signal_interval,
		   daemon->auth_key_len ? ", authentication on" : "",
		   vt->per_uid ? ", a protection domain per uid" : "");
	vt->base.ordered = policy.links == 1;
	*ret_transport = &vt->base;
	return 0;
}
