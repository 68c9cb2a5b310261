/* SPDX-License-Identifier: MIT */
/*
 * The rdma_cm events of an outgoing connection's links as pure logic: what a
 * rejection means (retryable or not, which error), what an established link
 * starts, and each event's step through the connecting states
 * (conn_link_event()). Like conn.c it never calls rdma-core or libuv; the
 * transport feeds it events it has already copied and acked.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "conn.h"
#include "conn_internal.h"
#include "log.h"

static int reject_err(enum conn_reject_reason reason, bool *ret_retryable)
{
	*ret_retryable = false;
	switch (reason) {
	case CONN_REJ_AUTH_REQUIRED:
	case CONN_REJ_AUTH_FAILED:
	case CONN_REJ_AUTH_UNUSED:
	case CONN_REJ_CLOCK:
	case CONN_REJ_REPLAY:
	case CONN_REJ_DOMAIN:
		return RDMAX_E_PERMISSION_DENIED;
	case CONN_REJ_DOMAIN_GONE:
		/* Every region of that domain was deregistered: as for one region. */
		return RDMAX_E_NOT_FOUND;
	case CONN_REJ_VERSION:
		return RDMAX_E_PROTOCOL_ERROR;
	case CONN_REJ_LIMIT:
	case CONN_REJ_RESOURCES:
		*ret_retryable = true;
		return RDMAX_E_RESOURCE_EXHAUSTED;
	case CONN_REJ_SHUTDOWN:
	default:
		*ret_retryable = true;
		return RDMAX_E_UNREACHABLE;
	}
}

static void on_rejected(struct conn_link *link, const struct conn_event_data *data)
{
	struct conn *conn = link->conn;
	const uint8_t *pd = data ? data->private_data : NULL;
	size_t len = data ? data->private_len : 0;
	char reason[CONN_MSG_MAX];
	bool retryable;

	if (pd && len >= 8 && get_le32(pd) == CONN_PD_MAGIC && pd[5] == CONN_PD_REJECT) {
		enum conn_reject_reason why = pd[6] < CONN_REJ_MAX ? pd[6] : CONN_REJ_MAX;
		int err = reject_err(why, &retryable);
		snprintf(reason, sizeof(reason), "peer refused: %s", conn_reject_reason_str(why));
		/*
		 * A domain's token is drawn per daemon start, so the xfers waiting
		 * here all name one instance: when the peer is another, the
		 * descriptor is stale, not forged.
		 */
		uint64_t instance = conn_pd_reject_instance(pd, len);
		const struct xfer *first =
			list_empty(&conn->pending)
				? NULL
				: container_of(conn->pending.next, struct xfer, link);
		if ((why == CONN_REJ_DOMAIN || why == CONN_REJ_DOMAIN_GONE) && instance && first &&
		    first->remote_instance != instance) {
			err = RDMAX_E_NOT_FOUND;
			snprintf(reason, sizeof(reason),
				 "stale descriptor: it names daemon instance %016" PRIx64
				 ", the peer is instance %016" PRIx64,
				 first->remote_instance, instance);
		}
		conn_attempt_failed(conn, err, retryable, reason);
		return;
	}
	/* A reject from the fabric or the peer's kernel (no listener on the port...). */
	snprintf(reason, sizeof(reason), "connection rejected (rdma_cm status %d)",
		 data ? data->status : 0);
	conn_attempt_failed(conn, RDMAX_E_UNREACHABLE, true, reason);
}

static void on_established(struct conn_link *link, const struct conn_event_data *data, uint64_t now)
{
	struct conn *conn = link->conn;
	struct conn_table *t = conn->table;
	const uint8_t *pd = data ? data->private_data : NULL;
	size_t len = data ? data->private_len : 0;

	if (!pd || len < 16 || get_le32(pd) != CONN_PD_MAGIC || pd[4] != CONN_PD_VERSION ||
	    pd[5] != CONN_PD_ACCEPT) {
		conn_attempt_failed(conn, RDMAX_E_PROTOCOL_ERROR, false,
				    "the peer accepted without rdmaxd's private data");
		return;
	}
	uint64_t instance = get_le64(pd + 8);
	if (t->key) {
		struct auth_transcript tr;
		uint8_t mac[AUTH_MAC_BYTES];
		uint8_t addr[16];
		if (!(pd[6] & 1) || len < 16 + AUTH_MAC_BYTES ||
		    conn_addr_parse(conn->peer.addr, addr) < 0) {
			conn_attempt_failed(conn, RDMAX_E_PERMISSION_DENIED, false,
					    "the peer did not prove that it holds the shared key");
			return;
		}
		conn_pd_transcript(&tr, link->request, addr, conn->peer.port, instance);
		if (auth_compute(t->key, t->key_len, AUTH_ROLE_SERVER, &tr, mac) < 0 ||
		    !auth_equal(mac, pd + 16, AUTH_MAC_BYTES)) {
			conn_attempt_failed(conn, RDMAX_E_PERMISSION_DENIED, false,
					    "the peer's proof of the shared key is wrong");
			return;
		}
	}
	if (conn->links_up > 0 && instance != conn->peer_instance) {
		conn_attempt_failed(conn, RDMAX_E_UNREACHABLE, true,
				    "the peer restarted while connecting");
		return;
	}
	conn->peer_instance = instance;
	link->state = LINK_UP;
	conn->links_up++;
	if (conn->links_up == conn->n_links) {
		conn_established(conn, now);
	}
}

static void connecting_step(struct conn_link *link, enum conn_event event,
			    const struct conn_event_data *data, uint64_t now)
{
	struct conn *conn = link->conn;
	struct conn_table *t = conn->table;
	char why[CONN_MSG_MAX] = "";
	int ret;

	switch (event) {
	case CONN_EV_ADDR_RESOLVED:
		if (link->state != LINK_RESOLVING_ADDR) {
			break;
		}
		link->state = LINK_RESOLVING_ROUTE;
		ret = t->ops->link_resolve_route(t->ctx, link, why, sizeof(why));
		if (ret < 0) {
			conn_attempt_failed(
				conn, ret == RDMAX_E_RESOURCE_EXHAUSTED ? ret : RDMAX_E_UNREACHABLE,
				ret != RDMAX_E_RESOURCE_EXHAUSTED, why);
		}
		break;
	case CONN_EV_ROUTE_RESOLVED: {
		uint8_t addr[16];
		if (link->state != LINK_RESOLVING_ROUTE) {
			break;
		}
		if (conn_addr_parse(conn->peer.addr, addr) < 0) {
			conn_attempt_failed(conn, RDMAX_E_INVALID_ARGUMENT, false,
					    "bad peer address");
			break;
		}
		random_bytes(link->request, sizeof(link->request));
		conn_pd_connect(link->request, (uint8_t)link->index, (uint8_t)conn->n_links,
				conn->attempt_id, t->instance, conn_realtime_ms(), t->key,
				t->key_len, addr, conn->peer.port, conn->remote_domain,
				conn->remote_token);
		link->state = LINK_CONNECTING;
		ret = t->ops->link_connect(t->ctx, link, link->request, CONN_PD_REQ_LEN, why,
					   sizeof(why));
		if (ret < 0) {
			/* No QP or CQ space here is not the peer's fault: do not retry. */
			conn_attempt_failed(
				conn, ret == RDMAX_E_RESOURCE_EXHAUSTED ? ret : RDMAX_E_UNREACHABLE,
				ret != RDMAX_E_RESOURCE_EXHAUSTED, why);
		}
		break;
	}
	case CONN_EV_ESTABLISHED:
		if (link->state == LINK_CONNECTING) {
			on_established(link, data, now);
		}
		break;
	case CONN_EV_REJECTED:
		on_rejected(link, data);
		break;
	case CONN_EV_ADDR_ERROR:
	case CONN_EV_ROUTE_ERROR:
	case CONN_EV_UNREACHABLE:
	case CONN_EV_CONNECT_ERROR:
	case CONN_EV_DISCONNECTED:
	case CONN_EV_DEVICE_REMOVAL:
	case CONN_EV_ADDR_CHANGE:
	case CONN_EV_QP_ERROR:
		snprintf(why, sizeof(why), "%s (status %d)", conn_event_name(event),
			 data ? data->status : 0);
		conn_attempt_failed(conn, RDMAX_E_UNREACHABLE, true, why);
		break;
	default:
		break;
	}
}

void conn_link_event(struct conn_link *link, enum conn_event event,
		     const struct conn_event_data *data, uint64_t now)
{
	struct conn *conn = link->conn;
	char message[CONN_MSG_MAX];

	log_debug("connection to %s link %u (%s): %s", conn->name, link->index,
		  link_state_name(link->state), conn_event_name(event));
	if (event == CONN_EV_TIMEWAIT_EXIT || link->state == LINK_IDLE) {
		return;
	}
	switch (conn->state) {
	case CONN_CONNECTING:
		connecting_step(link, event, data, now);
		break;
	case CONN_ESTABLISHED:
		if (event == CONN_EV_DEVICE_REMOVAL) {
			/* Only destroy calls are allowed now: no marker, fail what was posted. */
			for (uint32_t i = 0; i < conn->n_links; i++) {
				struct conn_link *l = &conn->links[i];
				conn_link_fail_all(conn, l);
				l->state = LINK_DRAINED;
			}
		}
		if (event == CONN_EV_DISCONNECTED || event == CONN_EV_DEVICE_REMOVAL ||
		    event == CONN_EV_ADDR_CHANGE || event == CONN_EV_QP_ERROR ||
		    event == CONN_EV_CONNECT_ERROR || event == CONN_EV_UNREACHABLE) {
			snprintf(message, sizeof(message), "connection to %s lost: %s", conn->name,
				 event == CONN_EV_DISCONNECTED ? "the peer disconnected"
							       : conn_event_name(event));
			/* At notice: jobs failed by a flush before this event point here. */
			log_notice("%s", message);
			conn_down(conn, RDMAX_E_TRANSPORT_ERROR, message);
		}
		break;
	case CONN_DRAINING:
		if (event == CONN_EV_DEVICE_REMOVAL) {
			conn_link_fail_all(conn, link);
			link->state = LINK_DRAINED;
			conn_check_drained(conn);
		}
		break;
	default:
		break;
	}
}
