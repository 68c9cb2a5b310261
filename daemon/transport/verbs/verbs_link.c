/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport's conn_ops: the glue that runs the conn state machine
 * (conn.c) with real rdma_cm and verbs calls. It starts and resolves links
 * and probes, creates and connects their QPs, posts work requests in batches,
 * and runs the connection timers and the loop kick. It decides nothing about
 * connection state (conn.c does) and never calls rdma-core except through
 * verbs.h.
 */
#include "transport_verbs_internal.h"

/* ------------------------------------------------------- conn_ops */

/*
 * The first step of a link and of a probe alike: a new rdma_cm id whose
 * context is obj, resolving the address of peer (name in messages). Only a
 * link sets the ACK timeout: a probe carries no traffic. On failure nothing
 * is left behind and why says what failed.
 */
static int cm_resolve_start(struct verbs_transport *vt, const struct endpoint *peer,
			    const char *name, struct cm_obj *obj, bool ack_timeout,
			    struct rdma_cm_id **ret_id, char *why, size_t why_size)
{
	struct sockaddr_storage dst, src;
	struct rdma_cm_id *id;
	int ret;

	ret = vt_parse_sockaddr(peer->addr, peer->port, &dst);
	if (ret < 0) {
		snprintf(why, why_size, "'%s' is not a numeric address", peer->addr);
		return ret;
	}
	ret = verbs_cm_create_id(vt->cm, obj, &id);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_create_id() failed: %s", strerror(-ret));
		return ret;
	}
	if (ack_timeout && verbs_cm_set_ack_timeout(id, ACK_TIMEOUT) < 0) {
		log_debug("rdma_set_option(ACK_TIMEOUT) failed; using the default timeout");
	}
	ret = verbs_cm_resolve_addr(id, vt_source_addr(vt, &dst, &src), (struct sockaddr *)&dst,
				    (int)vt->daemon->cfg.connect_timeout_ms);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_resolve_addr() to %s failed: %s", name,
			 strerror(-ret));
		verbs_cm_destroy_id(id);
		return ret;
	}
	*ret_id = id;
	return 0;
}

static int link_start(void *ctx, struct conn_link *link, char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct conn *conn = link->conn;
	struct link_ctx *lc;
	int ret;

	lc = calloc(1, sizeof(*lc));
	if (!lc) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	lc->obj.kind = OBJ_LINK;
	lc->vt = vt;
	lc->link = link;
	ret = cm_resolve_start(vt, &conn->peer, conn->name, &lc->obj, true, &lc->id, why, why_size);
	if (ret < 0) {
		free(lc);
		return ret;
	}
	link->priv = lc;
	return 0;
}

static int link_resolve_route(void *ctx, struct conn_link *link, char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct link_ctx *lc = link->priv;

	lc->hca = hca_find(&vt->hcas, lc->id->verbs);
	if (!lc->hca) {
		snprintf(why, why_size,
			 "the route to %s uses device '%s', which this daemon "
			 "does not use",
			 link->conn->name, verbs_device_name(lc->id->verbs));
		return -ENODEV;
	}
	if (!hca_usable(lc->hca)) {
		snprintf(why, why_size, "device '%s' is not usable", lc->hca->name);
		return -ENODEV;
	}
	int ret = verbs_cm_resolve_route(lc->id, (int)vt->daemon->cfg.connect_timeout_ms);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_resolve_route() to %s failed: %s", link->conn->name,
			 strerror(-ret));
	}
	return ret;
}

uint8_t vt_rd_atom(int v)
{
	return (uint8_t)MAX(MIN(v, 255), 0);
}

static int link_connect(void *ctx, struct conn_link *link, const uint8_t *pd, size_t pd_len,
			char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	const struct config *cfg = &vt->daemon->cfg;
	struct link_ctx *lc = link->priv;
	struct hca *hca = lc->hca;
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param param;
	int ret;

	struct ibv_pd *qp_pd = hca->pd;
	if (link->conn->local_domain) {
		/*
		 * Per-uid isolation: the QP goes into the PD of the uid whose regions
		 * it reads and writes. The jobs that wait hold those regions, and so
		 * the domain, until the QP holds it too.
		 */
		if (!lc->domain) {
			lc->domain = vt_domain_find(vt, link->conn->local_domain);
			if (!lc->domain) {
				snprintf(why, why_size,
					 "protection domain %u is gone (its regions were "
					 "deregistered)",
					 link->conn->local_domain);
				return RDMAX_E_NOT_FOUND;
			}
			vt_domain_hold(lc->domain);
		}
		ret = vt_domain_pd(lc->domain, hca, &qp_pd);
		if (ret < 0) {
			snprintf(why, why_size, "ibv_alloc_pd() on '%s' failed: %s", hca->name,
				 strerror(-ret));
			return ret;
		}
	}
	ret = hca_reserve_cqes(hca, vt->sq_depth);
	if (ret < 0) {
		snprintf(why, why_size, "the completion queue of '%s' has no room for another QP",
			 hca->name);
		return ret;
	}
	lc->cqes = vt->sq_depth;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = hca->cq;
	attr.recv_cq = hca->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = vt->sq_depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_inline_data = cfg->inline_threshold;
	if (qp_pd == hca->pd) {
		attr.srq = hca->srq;
	} else {
		/*
		 * A domain's QPs carry one-sided WRs only (messages and imm records
		 * take the daemons' shared QPs): no receive is ever posted, so a
		 * stray SEND finds none instead of the shared PD's buffers.
		 */
		attr.cap.max_recv_wr = 1;
		attr.cap.max_recv_sge = 1;
	}
	ret = verbs_cm_create_qp(lc->id, qp_pd, &attr);
	if (ret < 0 && cfg->inline_threshold > 0) {
		/* The device may support less inline data than configured: go without. */
		attr.cap.max_inline_data = 0;
		ret = verbs_cm_create_qp(lc->id, qp_pd, &attr);
	}
	if (ret < 0) {
		snprintf(why, why_size, "rdma_create_qp() on '%s' failed: %s", hca->name,
			 strerror(-ret));
		return ret;
	}
	lc->qp_num = lc->id->qp->qp_num;
	vt_index_qp(vt, lc->qp_num, &lc->obj, &lc->indexed);
	lc->post.qp = lc->id->qp;
	lc->post.owner = lc;
	sq_plan_fini(&link->sq);
	ret = sq_plan_init(&link->sq, vt->sq_depth, cfg->signal_interval,
			   MIN(cfg->inline_threshold, attr.cap.max_inline_data),
			   vt->conns.policy.max_wr_bytes);
	if (ret < 0) {
		snprintf(why, why_size, "out of memory");
		return ret;
	}
	memset(&param, 0, sizeof(param));
	param.private_data = pd;
	param.private_data_len = (uint8_t)pd_len;
	param.responder_resources = vt_rd_atom(hca->attr.max_qp_rd_atom);
	param.initiator_depth = vt_rd_atom(hca->attr.max_qp_init_rd_atom);
	param.retry_count = RETRY_COUNT;
	param.rnr_retry_count = RNR_RETRY;
	param.flow_control = 1;
	ret = verbs_cm_connect(lc->id, &param);
	if (ret < 0) {
		snprintf(why, why_size, "rdma_connect() to %s failed: %s", link->conn->name,
			 strerror(-ret));
	}
	return ret;
}

static void link_disconnect(void *ctx, struct conn_link *link)
{
	struct link_ctx *lc = link->priv;

	if (!lc || !lc->id) {
		return;
	}
	/* rdma_disconnect() moves the QP to error; if it cannot, do that much at least. */
	if (verbs_cm_disconnect(lc->id) < 0 && lc->id->qp) {
		verbs_qp_to_error(lc->id->qp);
	}
}

/* ------------------------------------------------------- the posting thread */

static int post_on_thread(void *qp, struct ibv_send_wr *wrs)
{
	return verbs_post_send(qp, wrs);
}

/* A post list of lc failed on the thread: as if link_post had failed (or the marker). */
static void on_post_failed(void *arg, void *owner, bool marker, int err)
{
	struct verbs_transport *vt = arg;
	struct link_ctx *lc = owner;
	char why[CONN_MSG_MAX];

	snprintf(why, sizeof(why), "ibv_post_send() on '%s' failed: %s", lc->hca->name,
		 strerror(-err));
	conn_link_post_failed(lc->link, marker, why);
	vt_progress(vt);
}

/*
 * Whether a latency lane is open and, with [qos] lane_linger_ms, started an
 * attempt or took an xfer that recently (conn_table.lane_used_ms): a lane left open after its
 * traffic ended leaves bulk posts to the loop again.
 */
static bool lanes_active(const struct verbs_transport *vt)
{
	uint32_t linger = vt->daemon->cfg.qos_lane_linger_ms;

	return vt->conns.lanes_open > 0 &&
	       (linger == 0 || now_ms() - vt->conns.lane_used_ms < linger);
}

/*
 * Whether lc's next post list goes to the thread: while any of its lists is
 * there (RC orders a QP's WRs as posted), and for a bulk connection on a
 * software device while a latency lane is active (lanes_active()), from
 * its first attempt on (its set-up waits for the loop too), so that the loop takes the lane's
 * events and posts its WRs without waiting behind the bulk posts' protocol
 * work. A latency lane always posts from the loop.
 */
static bool on_thread(struct verbs_transport *vt, struct link_ctx *lc)
{
	if (post_qp_busy(&lc->post)) {
		return true;
	}
	if (lc->link->conn->latency_lane || vt->poster_unavailable ||
	    !(vt->post_thread_always || (lc->hca->software && lanes_active(vt)))) {
		return false;
	}
	if (!vt->poster) {
		int ret = post_thread_create(vt->daemon->loop, post_on_thread, on_post_failed, vt,
					     &vt->poster);
		if (ret < 0) {
			log_warn("verbs: no posting thread (%s): bulk posts stay on the loop",
				 strerror(-ret));
			vt->poster_unavailable = true;
			return false;
		}
		vt->handles++;
	}
	return true;
}

static void on_poster_closed(void *arg)
{
	struct verbs_transport *vt = arg;

	vt->handles--;
}

void vt_poster_stop(struct verbs_transport *vt)
{
	if (vt->poster) {
		post_thread_stop(vt->poster, on_poster_closed);
		vt->poster = NULL;
	}
}

/* ------------------------------------------------------- posting */

/*
 * [metrics] job_stages: the post call that carried each WR's xfer, the first
 * one where an xfer took several (its job's engine times the stages). A
 * SEND's xfer is the message's own (verbs_msg.c hands its stamps on).
 */
static void stamp_posted(const struct wr_desc *wrs, size_t n, uint64_t post_ns,
			 uint64_t post_end_ns)
{
	for (size_t i = 0; i < n; i++) {
		struct xfer *x = wrs[i].xfer;
		if (wrs[i].kind != WR_MARKER && x && !x->post_ns) {
			x->post_ns = post_ns;
			x->post_end_ns = post_end_ns;
		}
	}
}

static int link_post(void *ctx, struct conn_link *link, const struct wr_desc *wrs, size_t n,
		     char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct link_ctx *lc = link->priv;
	struct hca *hca = lc->hca;

	if (!lc->id || !lc->id->qp || n > SQ_DEPTH) {
		snprintf(why, why_size, "no queue pair");
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		const struct wr_desc *d = &wrs[i];
		struct ibv_send_wr *w = &vt->wrs[i];
		struct ibv_sge *sge = &vt->sges[i];

		memset(w, 0, sizeof(*w));
		w->wr_id = d->seq;
		w->send_flags = d->signaled ? IBV_SEND_SIGNALED : 0;
		w->next = i + 1 < n ? &vt->wrs[i + 1] : NULL;
		if (d->kind == WR_MARKER) {
			w->opcode = IBV_WR_RDMA_WRITE;
			continue;
		}
		struct xfer *x = d->xfer;
		if (d->kind == WR_SEND) {
			/* A message frame, from the staging pool (host memory). */
			sge->addr = (uintptr_t)(x->payload + d->offset);
			sge->length = (uint32_t)d->length;
			sge->lkey = vt->pool_mr[hca->index]->lkey;
			w->sg_list = sge;
			w->num_sge = 1;
			w->opcode = IBV_WR_SEND;
			if (d->inline_data) {
				w->send_flags |= IBV_SEND_INLINE;
			}
			continue;
		}
		/* Inline data is copied by the CPU: GPU memory (no mapping) goes by DMA. */
		bool inline_data = d->inline_data && x->local && x->local->addr;
		if (d->length > 0) {
			struct ibv_mr *mr = x->local->transport_data[hca->index];
			if (!mr) {
				snprintf(why, why_size, "region %" PRIu64 " has no MR on '%s'",
					 x->local->id, hca->name);
				return -EINVAL;
			}
			/*
			 * The device addresses the MR by its iova; inline data is copied
			 * by the CPU at post time, from the mapping.
			 */
			if (inline_data) {
				sge->addr =
					(uintptr_t)(x->local->addr + x->local_offset + d->offset);
			} else {
				sge->addr = vt_region_iova(x->local) + x->local_offset + d->offset;
			}
			sge->length = (uint32_t)d->length;
			sge->lkey = mr->lkey;
			w->sg_list = sge;
			w->num_sge = 1;
		}
		w->wr.rdma.remote_addr = x->peer.iova + x->remote_offset + d->offset;
		w->wr.rdma.rkey = x->peer.rkey;
		switch (d->kind) {
		case WR_READ:
			w->opcode = IBV_WR_RDMA_READ;
			break;
		case WR_WRITE_IMM:
			w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			w->imm_data = htonl(x->imm);
			break;
		default:
			w->opcode = IBV_WR_RDMA_WRITE;
			break;
		}
		if (inline_data) {
			w->send_flags |= IBV_SEND_INLINE;
		}
	}
	if (on_thread(vt, lc)) {
		bool marker = n == 1 && wrs[0].kind == WR_MARKER;
		if (post_thread_submit(vt->poster, &lc->post, vt->wrs, marker) == 0) {
			vt->daemon->counters.verbs_post_thread_wrs += n;
			return 0;
		}
		if (post_qp_busy(&lc->post)) {
			snprintf(why, why_size, "out of memory for a post list");
			return -ENOMEM;
		}
		/* Nothing of the QP is on the thread: posting here keeps the order. */
	}
	bool timed = vt->daemon->cfg.metrics_job_stages;
	uint64_t post_ns = timed ? now_ns() : 0;
	int ret = verbs_post_send(lc->id->qp, vt->wrs);
	if (ret < 0) {
		snprintf(why, why_size, "ibv_post_send() on '%s' failed: %s", hca->name,
			 strerror(-ret));
	} else if (timed) {
		stamp_posted(wrs, n, post_ns, now_ns());
	}
	return ret;
}

static void link_settle(void *ctx, struct conn_link *link)
{
	struct link_ctx *lc = link->priv;

	if (lc) {
		post_qp_settle(&lc->post);
	}
}

static void link_destroy(void *ctx, struct conn_link *link)
{
	struct verbs_transport *vt = ctx;
	struct link_ctx *lc = link->priv;

	if (!lc) {
		return;
	}
	post_qp_settle(&lc->post);
	if (lc->id) {
		if (lc->id->qp) {
			vt_unindex_qp(vt, lc->qp_num, &lc->indexed);
			verbs_cm_destroy_qp(lc->id);
		}
		/* Every event of the id was acked when it was read: this cannot block. */
		int ret = verbs_cm_destroy_id(lc->id);
		if (ret < 0) {
			log_warn("rdma_destroy_id() failed: %s", strerror(-ret));
		}
	}
	if (lc->hca && lc->cqes) {
		hca_release_cqes(lc->hca, lc->cqes);
	}
	vt_domain_put(vt, lc->domain);
	free(lc);
	link->priv = NULL;
}

static void on_conn_timer(uv_timer_t *timer)
{
	struct conn_priv *cp = timer->data;

	conn_timer_fired(cp->conn, now_ms());
	vt_progress(cp->vt);
}

static void timer_start(void *ctx, struct conn *conn, uint64_t ms)
{
	struct verbs_transport *vt = ctx;
	struct conn_priv *cp = conn->priv;

	if (!cp) {
		cp = calloc(1, sizeof(*cp));
		if (!cp) {
			/* Without a timer the connection cannot go on: fail it from the loop. */
			log_err("out of memory for a connection timer");
			return;
		}
		cp->vt = vt;
		cp->conn = conn;
		uv_timer_init(vt->daemon->loop, &cp->timer);
		cp->timer.data = cp;
		conn->priv = cp;
		vt->handles++;
	}
	uv_timer_start(&cp->timer, on_conn_timer, ms, 0);
}

static void timer_stop(void *ctx, struct conn *conn)
{
	struct conn_priv *cp = conn->priv;

	if (cp) {
		uv_timer_stop(&cp->timer);
	}
}

static void on_kick(uv_idle_t *idle)
{
	vt_progress(idle->data);
}

void vt_kick(void *ctx)
{
	struct verbs_transport *vt = ctx;

	if (vt->handles_open && !uv_is_active((uv_handle_t *)&vt->kick)) {
		uv_idle_start(&vt->kick, on_kick);
	}
}

static void on_conn_timer_closed(uv_handle_t *handle)
{
	struct conn_priv *cp = handle->data;
	struct verbs_transport *vt = cp->vt;

	conn_free(cp->conn);
	free(cp);
	vt->handles--;
	vt_progress(vt);
}

static void release(void *ctx, struct conn *conn)
{
	struct conn_priv *cp = conn->priv;

	if (!cp) {
		conn_free(conn);
		return;
	}
	uv_close((uv_handle_t *)&cp->timer, on_conn_timer_closed);
}

static int probe_start(void *ctx, struct conn_probe *probe, char *why, size_t why_size)
{
	struct verbs_transport *vt = ctx;
	struct probe_ctx *pc;
	int ret;

	pc = calloc(1, sizeof(*pc));
	if (!pc) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	pc->obj.kind = OBJ_PROBE;
	pc->vt = vt;
	pc->probe = probe;
	ret = cm_resolve_start(vt, &probe->peer, probe->name, &pc->obj, false, &pc->id, why,
			       why_size);
	if (ret < 0) {
		free(pc);
		return ret;
	}
	probe->priv = pc;
	return 0;
}

static void probe_destroy(void *ctx, struct conn_probe *probe)
{
	struct probe_ctx *pc = probe->priv;

	if (!pc) {
		return;
	}
	verbs_cm_destroy_id(pc->id);
	free(pc);
	probe->priv = NULL;
}

const struct conn_ops vt_conn_ops = {
	.link_start = link_start,
	.link_resolve_route = link_resolve_route,
	.link_connect = link_connect,
	.link_disconnect = link_disconnect,
	.link_post = link_post,
	.link_settle = link_settle,
	.link_destroy = link_destroy,
	.timer_start = timer_start,
	.timer_stop = timer_stop,
	.kick = vt_kick,
	.release = release,
	.probe_start = probe_start,
	.probe_destroy = probe_destroy,
};
