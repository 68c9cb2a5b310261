/* SPDX-License-Identifier: MIT */
/*
 * The accepting side of the verbs transport, and the owner's side of SEND
 * messages. A connect request's private data is checked before any QP exists;
 * an accepted QP (struct passive) receives message frames, has them landed in
 * the named mailbox (or an imm record checked) and answers each with its
 * status from a registered answer pool. It also answers probes (connect
 * requests without a QP asking for this node's verdict). It never lets a peer
 * reach a region it was not granted, and never blocks on a full send queue:
 * answers wait in a bounded queue.
 */
#include "transport_verbs_internal.h"

/* ------------------------------------------------------- accepting side */

static void passive_free(struct passive *p)
{
	struct verbs_transport *vt = p->vt;

	if (p->id) {
		if (p->id->qp) {
			vt_unindex_qp(vt, p->qp_num, &p->indexed);
			verbs_cm_destroy_qp(p->id);
		}
		int err = verbs_cm_destroy_id(p->id);
		if (err < 0) {
			log_warn("rdma_destroy_id() failed: %s", strerror(-err));
		}
	}
	if (p->hca && p->cqes) {
		hca_release_cqes(p->hca, p->cqes);
	}
	/* The QP is gone: nothing reads the answer slots any more. */
	while (!list_empty(&p->ans_queue)) {
		struct answer *a = container_of(p->ans_queue.next, struct answer, link);
		list_del(&a->link);
		free(a);
	}
	conn_msg_rx_reset(&p->rx);
	int ret = verbs_dereg_mr(p->ans_mr);
	if (ret < 0) {
		log_warn("ibv_dereg_mr() of answer slots failed: %s", strerror(-ret));
	}
	free(p->ans_buf);
	vt_domain_put(vt, p->domain);
	conn_table_group_del(&vt->conns, p->instance, p->group);
	list_del(&p->link);
	free(p);
}

void vt_passive_close(struct passive *p, bool disconnect, const char *why)
{
	if (p->state == PASSIVE_UP) {
		log_debug("connection from %s closed: %s", p->name, why);
	}
	if (disconnect && p->id) {
		verbs_cm_disconnect(p->id);
	}
	passive_free(p);
}

static void refuse(struct verbs_transport *vt, struct rdma_cm_id *id, const char *name,
		   enum conn_reject_reason reason)
{
	uint8_t pd[56];
	int len = reason == CONN_REJ_DOMAIN || reason == CONN_REJ_DOMAIN_GONE
			  ? conn_pd_reject_domain(pd, sizeof(pd), reason, vt->conns.instance)
			  : conn_pd_reject(pd, sizeof(pd), reason);

	log_ratelimited(&vt->rl, LOG_WARNING, "refused connection from %s: %s", name,
			conn_reject_reason_str(reason));
	if (verbs_cm_reject(id, pd, (uint8_t)MAX(len, 0)) < 0) {
		log_debug("rdma_reject() failed");
	}
	verbs_cm_destroy_id(id);
}

static void answer_query(struct verbs_transport *vt, struct listener *l, struct rdma_cm_id *id,
			 const char *name, const struct cm_copy *ev);

void vt_on_connect_request(struct verbs_transport *vt, struct listener *l, const struct cm_copy *ev)
{
	struct rdma_cm_id *id = ev->id;
	struct conn_request req;
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param param;
	uint8_t accept_pd[64];
	char name[64];
	int ret;

	vt_format_sockaddr(&id->route.addr.dst_addr, name, sizeof(name));
	if (vt->shut) {
		refuse(vt, id, name, CONN_REJ_SHUTDOWN);
		return;
	}
	if (conn_pd_type(ev->pd, ev->pd_len) == CONN_PD_QUERY) {
		answer_query(vt, l, id, name, ev);
		return;
	}
	/* Everything about the request is checked before a QP exists. */
	enum conn_reject_reason reason = conn_pd_check(
		&vt->conns, ev->pd, ev->pd_len, l->addr_bytes, l->port, conn_realtime_ms(), &req);
	if (reason != CONN_REJ_NONE) {
		refuse(vt, id, name, reason);
		return;
	}
	/*
	 * A request for a protection domain must prove the domain's token, which
	 * only descriptors of its regions carry; then its QP goes into that
	 * domain's PD, where only that uid's rkeys are valid.
	 */
	struct vt_domain *dom = NULL;
	if (req.domain) {
		/*
		 * Numbers are not reused before 2^24 more domains, so an unknown one
		 * is a domain whose regions and QPs are all gone.
		 */
		dom = vt_domain_find(vt, req.domain);
		if (!dom) {
			refuse(vt, id, name, CONN_REJ_DOMAIN_GONE);
			return;
		}
		if (!conn_pd_domain_ok(ev->pd, ev->pd_len, dom->token)) {
			refuse(vt, id, name, CONN_REJ_DOMAIN);
			return;
		}
	}
	struct hca *hca = hca_find(&vt->hcas, id->verbs);
	if (!hca || !hca_usable(hca)) {
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	struct ibv_pd *qp_pd;
	if (vt_domain_pd(dom, hca, &qp_pd) < 0) {
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	ret = conn_table_group_add(&vt->conns, req.instance, req.group);
	if (ret < 0) {
		refuse(vt, id, name,
		       ret == RDMAX_E_RESOURCE_EXHAUSTED ? CONN_REJ_LIMIT : CONN_REJ_RESOURCES);
		return;
	}
	struct passive *p = calloc(1, sizeof(*p));
	if (!p) {
		conn_table_group_del(&vt->conns, req.instance, req.group);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	p->obj.kind = OBJ_PASSIVE;
	p->vt = vt;
	p->hca = hca;
	p->instance = req.instance;
	p->group = req.group;
	p->domain = dom;
	if (dom) {
		vt_domain_hold(dom);
	}
	list_init(&p->ans_queue);
	copy_string(p->name, sizeof(p->name), name);
	list_add_tail(&vt->passives, &p->link);
	/* The accepting QP only sends answers to messages, every one signaled. */
	if (hca_reserve_cqes(hca, PASSIVE_SQ) < 0) {
		p->id = NULL;
		passive_free(p);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	p->cqes = PASSIVE_SQ;
	/* A domain's QP carries no messages (verbs_link.c), so it needs no answer slots. */
	p->ans_buf = dom ? NULL : aligned_alloc(ANSWER_SLOT, PASSIVE_SQ * ANSWER_SLOT);
	ret = dom          ? 0
	      : p->ans_buf ? verbs_reg_mr(hca->pd, p->ans_buf, PASSIVE_SQ * ANSWER_SLOT,
					  (uintptr_t)p->ans_buf, 0, &p->ans_mr)
			   : -ENOMEM;
	if (ret < 0) {
		log_warn("cannot register answer slots on '%s' for %s: %s", hca->name, name,
			 strerror(-ret));
		passive_free(p);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = hca->cq;
	attr.recv_cq = hca->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = PASSIVE_SQ;
	attr.cap.max_send_sge = 1;
	if (dom) {
		/* No receives are ever posted: a SEND on it finds none (RNR). */
		attr.cap.max_recv_wr = 1;
		attr.cap.max_recv_sge = 1;
	} else {
		attr.srq = hca->srq;
	}
	ret = verbs_cm_create_qp(id, qp_pd, &attr);
	if (ret < 0) {
		log_warn("rdma_create_qp() on '%s' for %s failed: %s", hca->name, name,
			 strerror(-ret));
		passive_free(p);
		refuse(vt, id, name, CONN_REJ_RESOURCES);
		return;
	}
	p->id = id;
	id->context = p;
	p->qp_num = id->qp->qp_num;
	vt_index_qp(vt, p->qp_num, &p->obj, &p->indexed);
	int len = conn_pd_accept(accept_pd, sizeof(accept_pd), &vt->conns, ev->pd, l->addr_bytes,
				 l->port);
	memset(&param, 0, sizeof(param));
	param.private_data = accept_pd;
	param.private_data_len = (uint8_t)MAX(len, 0);
	param.responder_resources = MIN(vt_rd_atom(hca->attr.max_qp_rd_atom), ev->initiator_depth);
	param.initiator_depth =
		MIN(vt_rd_atom(hca->attr.max_qp_init_rd_atom), ev->responder_resources);
	param.retry_count = RETRY_COUNT;
	param.rnr_retry_count = RNR_RETRY;
	param.flow_control = 1;
	ret = verbs_cm_accept(id, &param);
	if (ret < 0) {
		log_warn("rdma_accept() of %s failed: %s", name, strerror(-ret));
		passive_free(p);
		return;
	}
	p->state = PASSIVE_ACCEPTING;
	log_debug("accepting QP %u from %s (link %u of %u, instance %016" PRIx64
		  ", protection domain %u)",
		  p->qp_num, name, req.link_index + 1, req.n_links, req.instance, req.domain);
}

void vt_on_passive_event(struct passive *p, const struct cm_copy *ev)
{
	switch (ev->type) {
	case RDMA_CM_EVENT_ESTABLISHED:
		p->state = PASSIVE_UP;
		log_debug("connection from %s established (QP %u)", p->name, p->qp_num);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		vt_passive_close(p, true, "the peer disconnected");
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_ADDR_CHANGE:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		vt_passive_close(p, ev->type != RDMA_CM_EVENT_DEVICE_REMOVAL,
				 verbs_cm_event_str(ev->type));
		break;
	default:
		break;
	}
}

/* ------------------------------------------------------- messages, owner's side */

/* data: text for the answer (NUL-terminated), or len descriptor bytes when status is 0. */
static int answer_post(struct passive *p, uint64_t id, int status, const uint8_t *data,
		       uint32_t data_len)
{
	struct ibv_send_wr wr;
	struct ibv_sge sge;

	if (!p->ans_buf) {
		/* A domain's QP has no receives, so nothing on it can want an answer. */
		return -EPROTO;
	}
	uint8_t *buf = p->ans_buf + (p->ans_posted % PASSIVE_SQ) * ANSWER_SLOT;
	int len = status == 0 && data_len
			  ? conn_answer_encode_data(buf, ANSWER_SLOT, id, data, data_len)
			  : conn_answer_encode(buf, ANSWER_SLOT, id, status, (const char *)data);

	if (len < 0) {
		return len;
	}
	sge.addr = (uintptr_t)buf;
	sge.length = (uint32_t)len;
	sge.lkey = p->ans_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = p->ans_posted;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	/* Every answer signaled: its completion frees its slot, in order (RC). */
	wr.send_flags = IBV_SEND_SIGNALED;
	int ret = verbs_post_send(p->id->qp, &wr);
	if (ret == 0) {
		p->ans_posted++;
	}
	return ret;
}

static bool answer_room(const struct passive *p)
{
	return p->ans_posted - p->ans_done < PASSIVE_SQ;
}

/* Post waiting answers while the send queue has room; false when p had to close. */
static bool answers_flush(struct passive *p)
{
	while (!list_empty(&p->ans_queue) && answer_room(p)) {
		struct answer *a = container_of(p->ans_queue.next, struct answer, link);
		int ret = answer_post(p, a->id, a->status, a->data, a->len);
		if (ret < 0) {
			log_ratelimited(&p->vt->rl, LOG_WARNING,
					"connection from %s closed: ibv_post_send() of an answer "
					"failed: %s",
					p->name, strerror(-ret));
			vt_passive_close(p, true, "an answer could not be posted");
			return false;
		}
		list_del(&a->link);
		p->n_queued--;
		free(a);
	}
	return true;
}

static void answer(struct passive *p, uint64_t id, int status, const uint8_t *data,
		   uint32_t data_len)
{
	struct answer *a;

	if (list_empty(&p->ans_queue) && answer_room(p)) {
		int ret = answer_post(p, id, status, data, data_len);
		if (ret < 0) {
			log_ratelimited(&p->vt->rl, LOG_WARNING,
					"connection from %s closed: ibv_post_send() of an answer "
					"failed: %s",
					p->name, strerror(-ret));
			vt_passive_close(p, true, "an answer could not be posted");
		}
		return;
	}
	/* A requester keeps few messages in flight: this many means it takes no answers. */
	if (p->n_queued >= ANSWERS_MAX || !(a = calloc(1, sizeof(*a)))) {
		log_ratelimited(&p->vt->rl, LOG_WARNING,
				"connection from %s closed: %u answers wait for its send queue",
				p->name, p->n_queued);
		vt_passive_close(p, true, "too many answers waiting");
		return;
	}
	a->id = id;
	a->status = status;
	a->len = MIN(data_len, (uint32_t)CONN_ANSWER_DATA_MAX);
	memcpy(a->data, data, a->len);
	list_add_tail(&p->ans_queue, &a->link);
	p->n_queued++;
}

/* The daemon's own errors become statuses a peer understands. */
static int wire_status(int err)
{
	if (err == 0 || (err <= RDMAX_E_INVALID_ARGUMENT && err >= RDMAX_E_DISCONNECTED)) {
		return err;
	}
	return err == -ENOMEM ? RDMAX_E_RESOURCE_EXHAUSTED : RDMAX_E_INTERNAL;
}

/* An imm record from a peer: the region must exist, match its key and take writes. */
static int imm_record_land(struct rdmaxd *d, const uint8_t *rec, size_t len, char *text,
			   size_t text_size)
{
	struct region *region;

	if (len != IMM_RECORD_LEN) {
		snprintf(text, text_size, "malformed imm record of %zu bytes", len);
		return RDMAX_E_INVALID_ARGUMENT;
	}
	uint64_t instance = get_le64(rec), id = get_le64(rec + 8), key = get_le64(rec + 16);
	uint32_t imm = (uint32_t)rec[24] | (uint32_t)rec[25] << 8 | (uint32_t)rec[26] << 16 |
		       (uint32_t)rec[27] << 24;
	int err = region_get_remote(&d->regions, instance, id, key, 0, 0, RDMAX_ACCESS_REMOTE_WRITE,
				    &region);
	if (err == 0 && !region->writable) {
		err = RDMAX_E_PERMISSION_DENIED;
	}
	if (err == 0) {
		/* The imm counts in the namespace of the region's client (imm.h). */
		imm_landed(&d->imm, region_imm_owner(region), imm);
		region_put(&d->regions, region);
		return 0;
	}
	if (err == RDMAX_E_PERMISSION_DENIED) {
		snprintf(text, text_size,
			 "region %" PRIu64 " of node '%s' does not take remote writes", id,
			 d->node_name);
		return RDMAX_E_REMOTE_ACCESS;
	}
	snprintf(text, text_size,
		 "unknown region %" PRIu64 " on node '%s': stale or forged descriptor", id,
		 d->node_name);
	return err == RDMAX_E_NOT_FOUND ? RDMAX_E_NOT_FOUND : wire_status(err);
}

/* A frame landed on an accepted QP: reassemble, deliver, answer. */
void vt_passive_recv(struct passive *p, const uint8_t *buf, uint32_t len)
{
	struct rdmaxd *d = p->vt->daemon;
	char name[TRANSPORT_MAILBOX_NAME_MAX + 1];
	char from[CONN_FROM_MAX + 1];
	char text[CONN_MSG_MAX] = "";
	struct conn_frame f;
	int status;

	int ret = conn_frame_decode(buf, len, &f);
	if (ret == 0) {
		ret = f.type == CONN_FRAME_MESSAGE ? conn_msg_rx_feed(&p->rx, &f)
						   : RDMAX_E_PROTOCOL_ERROR;
	}
	if (ret == 0) {
		return; /* more frames follow */
	}
	if (ret < 0) {
		/* A peer that breaks the format is not trusted with another frame. */
		log_ratelimited(&p->vt->rl, LOG_WARNING, "connection from %s closed: %s", p->name,
				ret == -ENOMEM ? "out of memory for an incoming message"
					       : "malformed message frame");
		vt_passive_close(p, true, "malformed message frame");
		return;
	}
	const struct conn_msg_rx *rx = &p->rx;
	const uint8_t *payload = rx->body + rx->name_len + rx->from_len;
	memcpy(name, rx->body, rx->name_len);
	name[rx->name_len] = '\0';
	memcpy(from, rx->body + rx->name_len, rx->from_len);
	from[rx->from_len] = '\0';
	if (rx->name_len == sizeof(IMM_MAILBOX) - 1 && strcmp(name, IMM_MAILBOX) == 0) {
		status = imm_record_land(d, payload, rx->payload_len, text, sizeof(text));
	} else if (rx->name_len == sizeof(TRANSPORT_LOOKUP_MAILBOX) - 1 &&
		   strcmp(name, TRANSPORT_LOOKUP_MAILBOX) == 0) {
		uint8_t desc[CONN_ANSWER_DATA_MAX];
		uint64_t id = rx->id;
		int n = names_serve(d->names, d->node_name, payload, rx->payload_len, desc,
				    sizeof(desc), text, sizeof(text));
		conn_msg_rx_reset(&p->rx);
		if (n > 0) {
			answer(p, id, 0, desc, (uint32_t)n);
		} else {
			answer(p, id, wire_status(n), (const uint8_t *)text,
			       (uint32_t)strlen(text));
		}
		return;
	} else if (memchr(rx->body, '\0', rx->name_len) ||
		   mailbox_scoped_check(name, rx->name_len) < 0) {
		status = RDMAX_E_INVALID_ARGUMENT;
		snprintf(text, sizeof(text),
			 "mailbox name is not valid (1 to %u printable characters without spaces)",
			 TRANSPORT_MAILBOX_NAME_MAX);
	} else {
		status = wire_status(mailbox_deliver(d->mailboxes, name, rx->key, payload,
						     rx->payload_len, from));
		if (status == RDMAX_E_NOT_FOUND) {
			snprintf(text, sizeof(text),
				 "no mailbox '%s' with this key is open on node '%.32s'", name,
				 d->node_name);
		} else if (status < 0) {
			snprintf(text, sizeof(text), "mailbox '%s' refused the message: %s", name,
				 rdmax_strerror(status));
		}
	}
	if (status < 0) {
		log_ratelimited(&p->vt->rl, LOG_INFO, "refused message from %s: %s", p->name, text);
	}
	uint64_t id = rx->id;
	conn_msg_rx_reset(&p->rx);
	answer(p, id, status, (const uint8_t *)text, (uint32_t)strlen(text));
}

/* An answer's send completed (or failed: then the connection is gone). */
void vt_passive_send_wc(struct passive *p, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS) {
		if (wc->status != IBV_WC_WR_FLUSH_ERR) {
			log_ratelimited(&p->vt->rl, LOG_INFO, "answer to %s failed: %s", p->name,
					verbs_wc_status_str(wc->status));
		}
		vt_passive_close(p, true, "an answer could not be sent");
		return;
	}
	p->ans_done++;
	answers_flush(p);
}

void vt_on_probe_event(struct probe_ctx *pc, const struct cm_copy *ev)
{
	struct verbs_transport *vt = pc->vt;
	struct rdma_conn_param param;
	int ret = 0;

	switch (ev->type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		ret = verbs_cm_resolve_route(pc->id, (int)vt->daemon->cfg.connect_timeout_ms);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		/* No QP: the owner always rejects a query, so none is ever needed. */
		memset(&param, 0, sizeof(param));
		param.private_data = pc->probe->request;
		param.private_data_len = CONN_PD_REQ_LEN;
		param.qp_num = 1;
		param.retry_count = RETRY_COUNT;
		param.rnr_retry_count = RNR_RETRY;
		ret = verbs_cm_connect(pc->id, &param);
		break;
	case RDMA_CM_EVENT_REJECTED:
		conn_probe_answer(pc->probe, ev->pd, ev->pd_len);
		return;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		return;
	default:
		/* Errors, and an accept that a daemon of this kind never sends. */
		conn_probe_answer(pc->probe, NULL, 0);
		return;
	}
	if (ret < 0) {
		log_debug("probe of %s: %s failed: %s", pc->probe->name,
			  verbs_cm_event_str(ev->type), strerror(-ret));
		conn_probe_answer(pc->probe, NULL, 0);
	}
}

/* The owner's side of a probe: its verdict on the access, in a reject. */
static void answer_query(struct verbs_transport *vt, struct listener *l, struct rdma_cm_id *id,
			 const char *name, const struct cm_copy *ev)
{
	struct conn_query q;
	struct region *region;
	uint8_t pd[16];

	enum conn_reject_reason reason =
		conn_pd_check_query(&vt->conns, ev->pd, ev->pd_len, l->addr_bytes, l->port, &q);
	if (reason != CONN_REJ_NONE) {
		refuse(vt, id, name, reason);
		return;
	}
	int verdict = region_get_remote(&vt->daemon->regions, vt->daemon->instance_id, q.region_id,
					q.region_key, q.offset, q.length, q.access, &region);
	if (verdict == 0) {
		region_put(&vt->daemon->regions, region);
	}
	log_debug("verdict for %s on region %" PRIu64 " [%" PRIu64 ", +%" PRIu64 "): %s", name,
		  q.region_id, q.offset, q.length, verdict ? rdmax_strerror(verdict) : "allowed");
	int len = conn_pd_verdict(pd, sizeof(pd), verdict);
	if (verbs_cm_reject(id, pd, (uint8_t)MAX(len, 0)) < 0) {
		log_debug("rdma_reject() of a query failed");
	}
	verbs_cm_destroy_id(id);
}
