/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport's listeners (one per device IP, opened for the
 * configured address or every local interface) and the dispatch of rdma_cm
 * events to the object an id belongs to (listener, link, accepted QP, probe).
 * It drains the event channel in bounded batches and acks every event only
 * after copying it; it never handles an event's meaning itself beyond routing
 * it.
 */
#include "transport_verbs_internal.h"

/* ------------------------------------------------------- listeners */

void vt_listener_free(struct listener *l)
{
	if (!l) {
		return;
	}
	if (l->id) {
		verbs_cm_destroy_id(l->id);
	}
	free(l);
}

static int listener_bind(struct verbs_transport *vt, struct listener *l)
{
	int ret = verbs_cm_create_id(vt->cm, l, &l->id);

	if (ret < 0) {
		log_err("rdma_create_id() failed: %s", strerror(-ret));
		return ret;
	}
	ret = verbs_cm_bind_addr(l->id, (struct sockaddr *)&l->ss);
	if (ret < 0) {
		log_debug("rdma_bind_addr() to '%s' failed: %s", l->addr, strerror(-ret));
		verbs_cm_destroy_id(l->id);
		l->id = NULL;
	}
	return ret;
}

/* Bind a listener on addr; keep it when the address belongs to a device we use. */
static void try_listener(struct verbs_transport *vt, const char *addr, uint32_t prefix_len,
			 int prio)
{
	const struct config *cfg = &vt->daemon->cfg;
	struct listener *l = calloc(1, sizeof(*l));
	struct hca *hca;
	uint16_t port;
	int ret;

	if (!l) {
		return;
	}
	l->obj.kind = OBJ_LISTENER;
	l->prefix_len = prefix_len;
	copy_string(l->addr, sizeof(l->addr), addr);
	if (vt_parse_sockaddr(addr, cfg->listen_port, &l->ss) < 0) {
		log_msg(prio, "verbs: '%s' is not a numeric address", addr);
		goto out_free;
	}
	ret = listener_bind(vt, l);
	if (ret < 0) {
		log_msg(prio, "verbs: rdma_bind_addr() to '%s' port %u failed: %s", addr,
			cfg->listen_port, strerror(-ret));
		goto out_free;
	}
	if (!l->id->verbs) {
		log_msg(prio, "verbs: address '%s' is not on an RDMA device", addr);
		goto out_free;
	}
	const char *dev = verbs_device_name(l->id->verbs);
	if (!hca_selected(cfg->devices, dev)) {
		log_msg(prio,
			"verbs: address '%s' is on device '%s', which [verbs] devices does "
			"not select",
			addr, dev);
		goto out_free;
	}
	hca = hca_find(&vt->hcas, l->id->verbs);
	if (!hca) {
		ret = hca_open(&vt->hcas, l->id->verbs, &hca);
		if (ret < 0) {
			log_msg(prio, "verbs: device '%s' (address '%s') is not usable: %s", dev,
				addr, rdmax_strerror(ret));
			goto out_free;
		}
	}
	if (vt->listeners[hca->index]) {
		log_debug("verbs: device '%s' already listens on '%s'; not on '%s'", dev,
			  vt->listeners[hca->index]->addr, addr);
		goto out_free;
	}
	ret = verbs_cm_listen(l->id, LISTEN_BACKLOG);
	if (ret < 0) {
		log_err("rdma_listen() on '%s' port %u failed: %s", addr, cfg->listen_port,
			strerror(-ret));
		goto out_free;
	}
	port = verbs_cm_src_port(l->id);
	l->port = port;
	l->hca = hca;
	conn_addr_bytes((struct sockaddr *)&l->ss, l->addr_bytes, &port);
	vt->listeners[hca->index] = l;
	log_info("verbs: listening on %s port %u (device '%s')", addr, l->port, hca->name);
	return;

out_free:
	vt_listener_free(l);
}

/* Leading one bits of an interface's netmask (its prefix length). */
static uint32_t netmask_bits(const struct sockaddr *mask)
{
	const uint8_t *b;
	size_t n;
	uint32_t bits = 0;

	if (!mask) {
		return 0;
	}
	if (mask->sa_family == AF_INET) {
		b = (const uint8_t *)&((const struct sockaddr_in *)mask)->sin_addr;
		n = 4;
	} else if (mask->sa_family == AF_INET6) {
		b = (const uint8_t *)&((const struct sockaddr_in6 *)mask)->sin6_addr;
		n = 16;
	} else {
		return 0;
	}
	for (size_t i = 0; i < n && b[i] == 0xff; i++) {
		bits += 8;
	}
	for (size_t i = bits / 8; i < n && bits % 8 == 0; i++) {
		for (uint8_t m = 0x80; m && (b[i] & m); m >>= 1) {
			bits++;
		}
		break;
	}
	return bits;
}

void vt_open_listeners(struct verbs_transport *vt, int prio)
{
	const struct config *cfg = &vt->daemon->cfg;
	struct ifaddrs *ifa, *i;

	if (!vt_is_wildcard(cfg->listen_addr)) {
		try_listener(vt, cfg->listen_addr, 0, prio);
		return;
	}
	if (getifaddrs(&ifa) < 0) {
		log_err("getifaddrs() failed: %s", strerror(errno));
		return;
	}
	for (i = ifa; i; i = i->ifa_next) {
		char host[INET6_ADDRSTRLEN];
		if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) {
			continue;
		}
		if (i->ifa_addr->sa_family == AF_INET) {
			inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host,
				  sizeof(host));
		} else if (i->ifa_addr->sa_family == AF_INET6 &&
			   !IN6_IS_ADDR_LINKLOCAL(
				   &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr)) {
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, host,
				  sizeof(host));
		} else {
			continue;
		}
		try_listener(vt, host, netmask_bits(i->ifa_netmask), LOG_DEBUG);
	}
	freeifaddrs(ifa);
}

/* The address changed under a listener: bind and listen again (SPDK does the same). */
static void relisten(struct verbs_transport *vt, struct listener *l)
{
	if (l->id) {
		verbs_cm_destroy_id(l->id);
		l->id = NULL;
	}
	if (listener_bind(vt, l) < 0 || verbs_cm_listen(l->id, LISTEN_BACKLOG) < 0) {
		log_err("verbs: cannot listen on '%s' again after an address change", l->addr);
		return;
	}
	log_notice("verbs: listening on '%s' again after an address change", l->addr);
}

/* ------------------------------------------------------- event dispatch */

static enum conn_event conn_event_of(enum rdma_cm_event_type type, bool *ret_ok)
{
	*ret_ok = true;
	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		return CONN_EV_ADDR_RESOLVED;
	case RDMA_CM_EVENT_ADDR_ERROR:
		return CONN_EV_ADDR_ERROR;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		return CONN_EV_ROUTE_RESOLVED;
	case RDMA_CM_EVENT_ROUTE_ERROR:
		return CONN_EV_ROUTE_ERROR;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return CONN_EV_CONNECT_ERROR;
	case RDMA_CM_EVENT_UNREACHABLE:
		return CONN_EV_UNREACHABLE;
	case RDMA_CM_EVENT_REJECTED:
		return CONN_EV_REJECTED;
	case RDMA_CM_EVENT_ESTABLISHED:
		return CONN_EV_ESTABLISHED;
	case RDMA_CM_EVENT_DISCONNECTED:
		return CONN_EV_DISCONNECTED;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		return CONN_EV_DEVICE_REMOVAL;
	case RDMA_CM_EVENT_ADDR_CHANGE:
		return CONN_EV_ADDR_CHANGE;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		return CONN_EV_TIMEWAIT_EXIT;
	default:
		*ret_ok = false;
		return CONN_EV_MAX;
	}
}

static void dispatch(struct verbs_transport *vt, const struct cm_copy *ev)
{
	if (ev->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		vt_on_connect_request(vt, ev->listen_id->context, ev);
		return;
	}
	struct cm_obj *obj = ev->id ? ev->id->context : NULL;
	if (!obj) {
		return;
	}
	switch (obj->kind) {
	case OBJ_LISTENER: {
		struct listener *l = (struct listener *)obj;
		if (ev->type == RDMA_CM_EVENT_ADDR_CHANGE && !vt->shut) {
			relisten(vt, l);
		} else if (ev->type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
			log_err("verbs: device '%s' was removed; no longer listening on '%s'",
				l->hca->name, l->addr);
			l->hca->dead = true;
		}
		break;
	}
	case OBJ_LINK: {
		struct link_ctx *lc = (struct link_ctx *)obj;
		struct conn_event_data data = {
			.private_data = ev->pd,
			.private_len = ev->pd_len,
			.status = ev->status,
		};
		bool known;
		enum conn_event cev = conn_event_of(ev->type, &known);
		if (known) {
			conn_link_event(lc->link, cev, &data, now_ms());
		}
		break;
	}
	case OBJ_PASSIVE:
		vt_on_passive_event((struct passive *)obj, ev);
		break;
	case OBJ_PROBE:
		vt_on_probe_event((struct probe_ctx *)obj, ev);
		break;
	default:
		break;
	}
}

void vt_on_cm(uv_poll_t *handle, int status, int events)
{
	struct verbs_transport *vt = handle->data;
	struct rdma_cm_event *event;
	struct cm_copy ev;

	for (int i = 0; i < CM_BUDGET; i++) {
		int ret = verbs_cm_get_event(vt->cm, &event);
		if (ret < 0) {
			if (ret != -EAGAIN && ret != -EWOULDBLOCK && ret != -EINTR) {
				log_ratelimited(&vt->rl, LOG_ERR, "rdma_get_cm_event() failed: %s",
						strerror(-ret));
			}
			break;
		}
		/* Ack first (after copying what the handlers need): a destroy may follow. */
		memset(&ev, 0, sizeof(ev));
		ev.type = event->event;
		ev.status = event->status;
		ev.id = event->id;
		ev.listen_id = event->listen_id;
		if (event->param.conn.private_data && event->param.conn.private_data_len > 0) {
			ev.pd_len = MIN((size_t)event->param.conn.private_data_len, sizeof(ev.pd));
			memcpy(ev.pd, event->param.conn.private_data, ev.pd_len);
		}
		ev.initiator_depth = event->param.conn.initiator_depth;
		ev.responder_resources = event->param.conn.responder_resources;
		ret = verbs_cm_ack_event(event);
		if (ret < 0) {
			log_ratelimited(&vt->rl, LOG_ERR, "rdma_ack_cm_event() failed: %s",
					strerror(-ret));
		}
		dispatch(vt, &ev);
	}
	vt_progress(vt);
}
