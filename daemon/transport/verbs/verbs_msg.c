/* SPDX-License-Identifier: MIT */
/*
 * The sender's side of SEND messages over verbs: frames staged in a
 * registered pool of MSG_SLOTS slots, handed to the connection, and the
 * answer handed back to the engine. Messages wait in order for a free slot
 * (none overtakes another); a waiting one starts when a slot frees, never
 * from inside send_message. It never blocks the loop waiting for a slot.
 */
#include "transport_verbs_internal.h"

/* ------------------------------------------------------- messages, sender's side */

static void msg_done(struct xfer *wire, int err, const char *message);

static void slot_free(struct verbs_transport *vt, struct msg_slot *s)
{
	s->user = NULL;
	vt->free_slots[vt->n_free_slots++] = (uint32_t)(s - vt->slots);
}

/* Stage a message into a free slot and hand it to its connection. */
static int msg_start(struct verbs_transport *vt, struct xfer *user)
{
	struct msg_slot *s = &vt->slots[vt->free_slots[--vt->n_free_slots]];
	struct xfer *wire = &s->msg.xfer;
	uint64_t id = ++vt->next_msg_id;
	int ret;

	s->user = user;
	int body =
		conn_msg_encode(s->staging, CONN_MSG_STAGING, id, user->mailbox, user->remote_key,
				vt->from, user->payload, (uint32_t)user->length);
	if (body < 0) {
		ret = body;
		goto out_free;
	}
	memset(wire, 0, sizeof(*wire));
	wire->op = XFER_WRITE;
	wire->peer = user->peer;
	wire->remote_instance = user->remote_instance;
	wire->has_uid = user->has_uid;
	wire->uid = user->uid;
	wire->length = (uint64_t)body;
	wire->mailbox = user->mailbox;
	wire->payload = s->staging;
	wire->reply = user->reply; /* a lookup's answer lands in the asker's buffer */
	wire->reply_size = user->reply_size;
	wire->wire_id = id;
	wire->done = msg_done;
	wire->ctx = s;
	ret = conn_submit_message(&vt->conns, &s->msg, now_ms());
	if (ret < 0) {
		goto out_free;
	}
	return 0;

out_free:
	slot_free(vt, s);
	return ret;
}

/* Start waiting messages while slots are free (never from inside send_message). */
static void msg_pump(struct verbs_transport *vt)
{
	char text[RDMAX_MESSAGE_MAX];

	while (vt->n_free_slots > 0 && !list_empty(&vt->msg_wait)) {
		struct xfer *user = container_of(vt->msg_wait.next, struct xfer, link);
		list_del(&user->link);
		int ret = vt->shut ? RDMAX_E_CANCELLED : msg_start(vt, user);
		if (ret < 0) {
			snprintf(text, sizeof(text), "%s",
				 ret == RDMAX_E_CANCELLED ? "daemon shutting down"
							  : rdmax_strerror(ret));
			user->done(user, ret, text);
		}
	}
}

/* The connection finished a message: free its slot, then tell the engine. */
static void msg_done(struct xfer *wire, int err, const char *message)
{
	struct msg_slot *s = wire->ctx;
	struct verbs_transport *vt = s->vt;
	struct xfer *user = s->user;

	user->reply_len = err ? 0 : wire->reply_len;
	/* [metrics] job_stages: the post that sent the message is the job's. */
	user->post_ns = wire->post_ns;
	user->post_end_ns = wire->post_end_ns;
	slot_free(vt, s);
	user->bytes_done = err ? 0 : user->length;
	msg_pump(vt);
	user->done(user, err, message);
}

/* SEND: a message to a mailbox of the peer daemon, answered with its status. */
int vt_send_message(struct transport *transport, struct xfer *xfer)
{
	struct verbs_transport *vt = container_of(transport, struct verbs_transport, base);
	size_t name_len =
		xfer->mailbox ? strnlen(xfer->mailbox, TRANSPORT_MAILBOX_NAME_MAX + 1) : 0;

	if (vt->shut) {
		return RDMAX_E_CANCELLED;
	}
	if (xfer->op != XFER_WRITE || xfer->peer.transport != ENDPOINT_VERBS || !xfer->done ||
	    name_len == 0 || name_len > TRANSPORT_MAILBOX_NAME_MAX ||
	    xfer->length > TRANSPORT_MESSAGE_PAYLOAD_MAX || (xfer->length > 0 && !xfer->payload) ||
	    !memchr(xfer->peer.addr, '\0', sizeof(xfer->peer.addr))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	xfer->bytes_done = 0;
	/* In order: a message never overtakes one that waits for a slot. */
	if (vt->n_free_slots == 0 || !list_empty(&vt->msg_wait)) {
		list_add_tail(&vt->msg_wait, &xfer->link);
		return 0;
	}
	return msg_start(vt, xfer);
}

/* The staging pool: MSG_SLOTS messages, registered for local reads on every device. */
int vt_pool_open(struct verbs_transport *vt)
{
	size_t len = (size_t)MSG_SLOTS * CONN_MSG_STAGING;
	void *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int ret;

	if (buf == MAP_FAILED) {
		ret = -errno;
		log_err("mmap() of %zu bytes of message staging failed: %s", len, strerror(-ret));
		return ret;
	}
	vt->pool = buf;
	for (uint32_t i = 0; i < vt->hcas.n; i++) {
		struct hca *hca = vt->hcas.hcas[i];
		ret = verbs_reg_mr(hca->pd, buf, len, (uintptr_t)buf, 0, &vt->pool_mr[hca->index]);
		if (ret < 0) {
			log_err("ibv_reg_mr() of %zu bytes of message staging on '%s' failed: %s%s",
				len, hca->name, strerror(-ret),
				ret == -ENOMEM ? " (check the locked-memory limit, ulimit -l)"
					       : "");
			return ret;
		}
	}
	for (uint32_t i = 0; i < MSG_SLOTS; i++) {
		vt->slots[i].vt = vt;
		vt->slots[i].staging = vt->pool + (size_t)i * CONN_MSG_STAGING;
		vt->free_slots[i] = MSG_SLOTS - 1 - i;
	}
	vt->n_free_slots = MSG_SLOTS;
	/* Frames carry printable names only: the owner refuses anything else. */
	const char *name = vt->daemon->node_name;
	size_t n = strnlen(name, CONN_FROM_MAX);
	for (size_t i = 0; i < n; i++) {
		vt->from[i] = name[i] >= 0x20 && name[i] <= 0x7e ? name[i] : '?';
	}
	vt->from[n] = '\0';
	return 0;
}

void vt_pool_close(struct verbs_transport *vt)
{
	for (uint32_t i = 0; i < REGION_MAX_DEVICES; i++) {
		int ret = verbs_dereg_mr(vt->pool_mr[i]);
		if (ret < 0) {
			log_warn("ibv_dereg_mr() of message staging failed: %s", strerror(-ret));
		}
		vt->pool_mr[i] = NULL;
	}
	if (vt->pool) {
		munmap(vt->pool, (size_t)MSG_SLOTS * CONN_MSG_STAGING);
		vt->pool = NULL;
	}
}
