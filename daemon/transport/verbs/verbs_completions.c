/* SPDX-License-Identifier: MIT */
/*
 * Completions of the verbs transport: the device callbacks for send, receive
 * and immediate-data completions and async events, and the progress loop
 * (busy polling window, check and tick handles, closing of loop handles).
 * It polls each device in bounded batches and never blocks the loop.
 */
#include "transport_verbs_internal.h"

/* ------------------------------------------------------- completions */

void vt_on_send_wc(void *ctx, struct hca *hca, const struct ibv_wc *wc)
{
	struct verbs_transport *vt = ctx;
	struct cm_obj *obj = hmap_get(&vt->qps, (uint64_t)wc->qp_num + 1);

	if (obj && obj->kind == OBJ_PASSIVE) {
		vt_passive_send_wc((struct passive *)obj, wc);
		return;
	}
	if (!obj || obj->kind != OBJ_LINK) {
		/* A QP destroyed after a drain that gave up: its late completions mean nothing. */
		return;
	}
	struct link_ctx *lc = (struct link_ctx *)obj;
	conn_link_wc(lc->link, wc->wr_id, wc->status, wc->vendor_err, now_ms());
}

/*
 * A WRITE_WITH_IMM: its immediate names no region, so it cannot be counted
 * in any client's namespace (imm.h). This daemon sends imm records instead
 * (IMM_MAILBOX); a peer that sends this is older or hostile.
 */
void vt_on_imm(void *ctx, struct hca *hca, uint32_t imm)
{
	struct verbs_transport *vt = ctx;
	static struct log_ratelimit rl;

	vt->daemon->imm.dropped++;
	log_ratelimited(&rl, LOG_WARNING,
			"WRITE_WITH_IMM %u on device '%s' not counted: an imm must name the "
			"region it lands in (imm record)",
			imm, hca->name);
}

/* A SEND landed: a message frame at an accepted QP, an answer at one of ours. */
void vt_on_recv(void *ctx, struct hca *hca, uint32_t qp_num, const uint8_t *buf, uint32_t len)
{
	struct verbs_transport *vt = ctx;
	struct cm_obj *obj = hmap_get(&vt->qps, (uint64_t)qp_num + 1);
	struct conn_frame f;

	if (!obj) {
		return; /* its QP is gone */
	}
	if (obj->kind == OBJ_PASSIVE) {
		vt_passive_recv((struct passive *)obj, buf, len);
		return;
	}
	if (obj->kind != OBJ_LINK) {
		return;
	}
	struct conn_link *link = ((struct link_ctx *)obj)->link;
	if (conn_frame_decode(buf, len, &f) < 0 || f.type != CONN_FRAME_ANSWER) {
		log_ratelimited(&vt->rl, LOG_WARNING,
				"connection to %s closed: the peer sent a malformed answer (%u "
				"bytes)",
				link->conn->name, len);
		conn_close(link->conn, RDMAX_E_PROTOCOL_ERROR,
			   "the peer sent a malformed answer to a message");
		return;
	}
	conn_link_answer(link, &f, now_ms());
}

/* Close every connection and accepted group with a QP on hca. */
static void close_on_device(struct verbs_transport *vt, const struct hca *hca, const char *why)
{
	struct list_node *pos, *tmp;

	list_for_each_safe(pos, tmp, &vt->conns.conns)
	{
		struct conn *conn = container_of(pos, struct conn, link);
		for (uint32_t i = 0; i < conn->n_links; i++) {
			struct link_ctx *lc = conn->links[i].priv;
			if (lc && lc->hca == hca) {
				conn_close(conn, RDMAX_E_TRANSPORT_ERROR, why);
				break;
			}
		}
	}
	list_for_each_safe(pos, tmp, &vt->passives)
	{
		struct passive *p = container_of(pos, struct passive, link);
		if (p->hca == hca) {
			vt_passive_close(p, false, why);
		}
	}
}

void vt_on_async(void *ctx, struct hca *hca, enum ibv_event_type type, uint32_t qp_num)
{
	struct verbs_transport *vt = ctx;
	char why[128];

	switch (type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR: {
		struct cm_obj *obj = hmap_get(&vt->qps, (uint64_t)qp_num + 1);
		if (obj && obj->kind == OBJ_LINK) {
			conn_link_event(((struct link_ctx *)obj)->link, CONN_EV_QP_ERROR, NULL,
					now_ms());
		}
		/* An accepting QP in error: the requester sees it and disconnects. */
		break;
	}
	case IBV_EVENT_PORT_ERR:
		/*
		 * Its QPs would only notice after the transport's retries ran out
		 * (seconds): fail them now, so that the engine re-issues their
		 * chunks on the other devices at once.
		 */
		if (hca_usable(hca)) {
			break;
		}
		snprintf(why, sizeof(why), "device '%s' has no active port any more", hca->name);
		close_on_device(vt, hca, why);
		break;
	case IBV_EVENT_DEVICE_FATAL:
	case IBV_EVENT_CQ_ERR:
	case IBV_EVENT_SRQ_ERR:
		snprintf(why, sizeof(why), "the RDMA device '%s' failed", hca->name);
		close_on_device(vt, hca, why);
		break;
	default:
		break;
	}
}

/*
 * Something happened (a completion, a post): busy-poll for busy_poll_us from
 * now. busy_poll_us = 0: no spinning, every completion comes through the
 * channel.
 */
static void busy_renew(struct verbs_transport *vt)
{
	if (vt->daemon->cfg.busy_poll_us > 0) {
		vt->busy_until_ns = now_ns() + (uint64_t)vt->daemon->cfg.busy_poll_us * 1000;
		vt->hcas.busy = true;
	}
}

void vt_on_progress(void *ctx)
{
	struct verbs_transport *vt = ctx;

	/* A completion event: the next completions may follow closely. */
	busy_renew(vt);
	vt_progress(vt);
}

static int poll_devices(struct verbs_transport *vt)
{
	int n = 0;

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		if (hca->open_handles > 0 && !hca->closing) {
			n += hca_poll(hca, POLL_BUDGET);
		}
	}
	return n;
}

/*
 * Busy-poll within busy_poll_us of the last completion or post, not for as
 * long as WRs are out: the WRs of a large transfer complete milliseconds
 * apart, and spinning through that costs a core (with Soft-RoCE, the very CPU
 * the emulated NIC needs). Once the window has passed, the CQs are armed and
 * the loop may sleep. Not while the daemon's loop spins (rdmaxd.spinning):
 * there the CQs stay unarmed between two jobs and the spin polls them, since
 * an armed CQ costs a completion event per completion and a read and a
 * re-arm per loop turn.
 */
void vt_on_check(uv_check_t *check)
{
	struct verbs_transport *vt = check->data;
	bool backlog = false;

	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		backlog |= vt->hcas.hcas[i]->backlog;
	}
	/* The clock only while it matters: without a TSC (emulation) a read is a syscall. */
	if (vt->hcas.busy &&
	    ((vt->conns.outstanding_wrs == 0 && !backlog && !vt->daemon->spinning) ||
	     now_ns() >= vt->busy_until_ns)) {
		/* Busy-polling ends: completions must wake the loop again. */
		vt->hcas.busy = false;
	}
	/* Polling when the loop turns anyway costs little and finds completions early. */
	if ((vt->conns.outstanding_wrs > 0 || backlog || vt->hcas.busy) && poll_devices(vt) > 0) {
		busy_renew(vt);
	}
	if (!vt->hcas.busy) {
		/*
		 * Not spinning: every CQ must be armed, also one whose poll stopped at its
		 * budget (left unarmed then) once its backlog is gone, or its next
		 * completions (message frames, answers) would wait for an event that
		 * never comes. A no-op for an armed CQ.
		 */
		for (uint32_t i = 0; i < vt->hcas.n; i++) {
			if (!vt->hcas.hcas[i]->backlog) {
				hca_arm(vt->hcas.hcas[i]);
			}
		}
	}
	vt_progress(vt);
}

/*
 * transport_ops.poll, from the daemon's spin between loop iterations: the
 * CQs while WRs are out or the CQs are left unarmed, then what was submitted
 * since is posted (the kick would post it only at the next loop turn).
 * Arming is left to on_check.
 */
int vt_poll(struct transport *transport)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	bool backlog = false;
	int n = 0;

	if (!vt->handles_open || !vt->conns_ready) {
		return 0;
	}
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		backlog |= vt->hcas.hcas[i]->backlog;
	}
	if (vt->conns.outstanding_wrs > 0 || backlog || vt->hcas.busy) {
		n = poll_devices(vt);
		if (n > 0) {
			busy_renew(vt);
		}
	}
	if (n > 0 || vt->conns.dirty || vt->conns.n_results > 0) {
		uint64_t posted = vt->conns.outstanding_wrs;
		vt_progress(vt);
		n += vt->conns.outstanding_wrs != posted;
	}
	return n;
}

void vt_on_tick(uv_timer_t *timer)
{
	struct verbs_transport *vt = timer->data;

	conn_table_tick(&vt->conns, now_ms());
	vt_progress(vt);
}

static void on_handle_closed(uv_handle_t *handle)
{
	struct verbs_transport *vt = handle->data;

	vt->handles--;
}

/* Once shut down and every connection is gone, the loop handles go too. */
static void maybe_close(struct verbs_transport *vt)
{
	if (!vt->shut || !vt->handles_open || !conn_table_idle(&vt->conns) ||
	    !list_empty(&vt->passives)) {
		return;
	}
	vt->handles_open = false;
	uv_close((uv_handle_t *)&vt->cm_poll, on_handle_closed);
	uv_close((uv_handle_t *)&vt->check, on_handle_closed);
	uv_close((uv_handle_t *)&vt->kick, on_handle_closed);
	uv_close((uv_handle_t *)&vt->tick, on_handle_closed);
	vt_poster_stop(vt);
	hca_table_close(&vt->hcas);
}

void vt_progress(struct verbs_transport *vt)
{
	if (!vt->conns_ready) {
		return;
	}
	uint64_t posted = vt->conns.outstanding_wrs;
	conn_table_work(&vt->conns, now_ms());
	if (vt->conns.outstanding_wrs > posted) {
		/* Just posted: small WRs complete within the window. */
		busy_renew(vt);
	}
	bool backlog = false;
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		backlog |= vt->hcas.hcas[i]->backlog;
	}
	/*
	 * While busy-polling the loop must not sleep: the CQs are not re-armed
	 * then (see on_check), and WRs can outlive their job (deadline, cancel,
	 * drain), so the engine's own busy-poll does not cover them; nor can the
	 * daemon's spin, which may stop before on_check arms them.
	 */
	bool busy = backlog ||
		    (vt->hcas.busy && (vt->conns.outstanding_wrs > 0 || vt->daemon->spinning));
	if (vt->handles_open && !vt->conns.dirty && vt->conns.n_results == 0 && !busy &&
	    uv_is_active((uv_handle_t *)&vt->kick)) {
		uv_idle_stop(&vt->kick);
	} else if (busy) {
		vt_kick(vt);
	}
	maybe_close(vt);
}
