/* SPDX-License-Identifier: MIT */
/*
 * A client's requests, one decoded ClientMsg at a time (ipc_dispatch):
 * Hello, region registration (host memfds, GPU buffers, pool slices) within
 * the client's and its uid's limits, deregistration, Submit (refused whole
 * when a job id is in flight or repeated, so no id gets a second
 * completion), imm counters, cancel, job status, peer groups and mailboxes,
 * and the delivery of mailbox messages to their owner. Every refusal is
 * answered with a named error. Never closes a session itself (it marks
 * close_after_flush) and never touches payload bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "desc.h"
#include "gpu.h"
#include "log.h"
#include "peer_group.h"
#include "rdmax.h"
#include "session_internal.h"
#include "status.h"
#include "transport.h"
static uint32_t collect_endpoints(struct rdmaxd *daemon, const struct region *region,
				  struct endpoint *eps, uint32_t max)
{
	uint32_t n = 0;

	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = daemon->transports[k];
		if (!t || n >= max) {
			continue;
		}
		int got = t->ops->endpoints(t, region, eps + n, max - n);
		if (got > 0) {
			n += (uint32_t)got;
		}
	}
	return n;
}

/* The region's descriptor as peers use it: every transport's endpoints. */
int ipc_encode_desc(struct rdmaxd *daemon, const struct region *region, uint8_t *buf, size_t size)
{
	struct endpoint eps[DESC_MAX_ENDPOINTS];
	uint32_t n = collect_endpoints(daemon, region, eps, DESC_MAX_ENDPOINTS);

	return region_desc_encode(&daemon->regions, region, daemon->node_name, eps, n, buf, size);
}

static void handle_hello(struct session *s, uint64_t seq, const Rdmax__V1__Hello *hello)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	const struct config *cfg = &daemon->cfg;
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Welcome welcome = RDMAX__V1__WELCOME__INIT;
	Rdmax__V1__Limits limits = RDMAX__V1__LIMITS__INIT;
	struct endpoint eps[DESC_MAX_ENDPOINTS];
	Rdmax__V1__Endpoint pep[DESC_MAX_ENDPOINTS];
	Rdmax__V1__Endpoint *pep_ptrs[DESC_MAX_ENDPOINTS];

	if (s->hello_done) {
		ipc_reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR, "Hello sent twice");
		return;
	}
	if (hello->protocol_version != RDMAX_PROTOCOL_VERSION) {
		ipc_reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR,
				 "protocol version %u is not supported (this daemon speaks %u)",
				 hello->protocol_version, RDMAX_PROTOCOL_VERSION);
		s->close_after_flush = true;
		return;
	}
	enum qos_class cls;
	if (hello->has_traffic_class &&
	    qos_class_from_wire(hello->traffic_class, QOS_BULK, &cls) < 0) {
		ipc_reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
				 "unknown traffic class %u (1: latency, 2: bulk)",
				 hello->traffic_class);
		s->close_after_flush = true;
		return;
	}
	s->owner.traffic_class = hello->has_traffic_class ? hello->traffic_class : 0;
	if (hello->client_name) {
		snprintf(s->name, sizeof(s->name), "%s", hello->client_name);
	}
	if (config_pin_devices(cfg->pin, s->name, s->owner.pinned_devices,
			       sizeof(s->owner.pinned_devices)) > 0) {
		log_info("client %" PRIu64 " '%s' is pinned to devices %s ([verbs] pin)", s->id,
			 s->name, s->owner.pinned_devices);
	}
	s->hello_done = true;
	log_info("client %" PRIu64 " '%s' connected (pid %d, uid %u)", s->id, s->name, (int)s->pid,
		 (unsigned)s->uid);

	uint32_t n = collect_endpoints(daemon, NULL, eps, DESC_MAX_ENDPOINTS);
	for (uint32_t i = 0; i < n; i++) {
		Rdmax__V1__Endpoint init = RDMAX__V1__ENDPOINT__INIT;
		pep[i] = init;
		pep[i].transport = (Rdmax__V1__Transport)eps[i].transport;
		pep[i].addr = eps[i].addr;
		pep[i].port = eps[i].port;
		if (eps[i].device[0]) {
			pep[i].device = eps[i].device;
		}
		pep_ptrs[i] = &pep[i];
	}
	limits.max_message_bytes = cfg->max_message_bytes;
	limits.max_fds_per_message = cfg->max_fds_per_message;
	limits.max_regions = cfg->max_regions;
	limits.max_registered_bytes = cfg->max_registered_bytes;
	limits.max_outstanding_jobs = cfg->max_outstanding_jobs;
	limits.max_jobs_per_submit = cfg->max_jobs_per_submit;
	limits.has_max_paged_pairs = 1;
	limits.max_paged_pairs = RDMAX_PAGED_PAIRS_MAX;
	welcome.protocol_version = RDMAX_PROTOCOL_VERSION;
	welcome.daemon_version = RDMAXD_VERSION;
	welcome.instance_id = daemon->instance_id;
	welcome.node_name = daemon->node_name;
	welcome.n_endpoints = n;
	welcome.endpoints = pep_ptrs;
	welcome.capabilities = (daemon->transports[ENDPOINT_TCP] ? RDMAX_CAP_TCP : 0) |
			       (daemon->transports[ENDPOINT_VERBS] ? RDMAX_CAP_VERBS : 0) |
			       (daemon->auth_key_len ? RDMAX_CAP_AUTH : 0) | RDMAX_CAP_RING |
			       RDMAX_CAP_IMM_STANDING | RDMAX_CAP_RING_COUNTS |
			       gpu_capabilities(daemon->gpu);
	welcome.limits = &limits;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_WELCOME;
	msg.welcome = &welcome;
	ipc_send_msg(s, &msg);
}

/* The client's region limits; false when one would be broken (answered). */
static bool region_limits_ok(struct session *s, uint64_t seq, uint64_t length)
{
	const struct config *cfg = &s->ipc->daemon->cfg;

	if (s->region_count >= cfg->max_regions) {
		ipc_reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
				 "client already has %u regions (limit)", s->region_count);
		return false;
	}
	if (length > cfg->max_registered_bytes - s->registered_bytes) {
		ipc_reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
				 "registering %" PRIu64
				 " bytes would exceed the client's limit of %" PRIu64
				 " bytes (%" PRIu64 " registered)",
				 length, cfg->max_registered_bytes, s->registered_bytes);
		return false;
	}
	if (s->share->regions >= cfg->per_uid_regions) {
		ipc_reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
				 "the clients of uid %u already have %u regions ([limits] "
				 "per_uid_regions)",
				 (unsigned)s->uid, s->share->regions);
		return false;
	}
	if (cfg->per_uid_registered_bytes < s->share->registered_bytes ||
	    length > cfg->per_uid_registered_bytes - s->share->registered_bytes) {
		ipc_reply_status(
			s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
			"registering %" PRIu64 " bytes would exceed the share of uid %u: %" PRIu64
			" bytes ([limits] per_uid_registered_bytes, %" PRIu64 " registered)",
			length, (unsigned)s->uid, cfg->per_uid_registered_bytes,
			s->share->registered_bytes);
		return false;
	}
	return true;
}

static void reply_region(struct session *s, uint64_t seq, struct region *region,
			 const struct gpu_lease *lease);

/* REGION_GPU_DMABUF and REGION_GPU_CUDA_IPC (docs/gpu.md). */
static void handle_register_gpu(struct session *s, uint64_t seq,
				const Rdmax__V1__RegisterRegion *rr, const int *fds, size_t n_fds)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct gpu_reg_req req = {
		.kind = (enum region_kind)rr->kind,
		.fd = -1,
		.offset = rr->offset,
		.length = rr->length,
		.access = rr->access,
		.bus_id = rr->gpu_bus_id,
		.buffer_id = rr->has_gpu_buffer_id ? rr->gpu_buffer_id : 0,
		.ipc_handle = rr->has_cuda_ipc_handle ? rr->cuda_ipc_handle.data : NULL,
		.ipc_handle_len = rr->has_cuda_ipc_handle ? rr->cuda_ipc_handle.len : 0,
	};
	struct region *region;
	char why[320];
	int ret;

	/* A dma-buf registration without an fd names one the client sent before (buffer id). */
	if (rr->kind == RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF &&
	    (rr->has_fd_index || n_fds > 0)) {
		uint32_t idx = rr->has_fd_index ? rr->fd_index : 0;
		if (idx >= n_fds) {
			ipc_reply_status(
				s, seq, RDMAX_E_INVALID_ARGUMENT,
				"RegisterRegion names fd %u but the message carried %zu fds", idx,
				n_fds);
			return;
		}
		req.fd = fds[idx]; /* closed with the message's other fds once this returns */
	}
	if (!region_limits_ok(s, seq, rr->length)) {
		return;
	}
	ret = gpu_register(daemon->gpu, &daemon->regions, &s->owner, &req, why, sizeof(why),
			   &region);
	if (ret < 0) {
		log_debug("client %" PRIu64 ": GPU region refused: %s", s->id, why);
		ipc_reply_status(s, seq, ret, "cannot register GPU region: %s", why);
		return;
	}
	reply_region(s, seq, region, NULL);
}

static void handle_pool_alloc(struct session *s, uint64_t seq, const Rdmax__V1__PoolAlloc *pa)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct gpu_lease lease;
	struct region *region;
	char why[320];
	int ret;

	if (!region_limits_ok(s, seq, pa->length)) {
		return;
	}
	ret = gpu_pool_alloc(daemon->gpu, &daemon->regions, &s->owner, pa->pool_id, pa->gpu_bus_id,
			     pa->length, pa->access, &lease, why, sizeof(why), &region);
	if (ret < 0) {
		ipc_reply_status(s, seq, ret, "cannot lease from a GPU pool: %s", why);
		return;
	}
	reply_region(s, seq, region, &lease);
}

static void handle_register(struct session *s, uint64_t seq, const Rdmax__V1__RegisterRegion *rr,
			    const int *fds, size_t n_fds)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct region *region;
	int ret;

	if (rr->kind == RDMAX__V1__REGION_KIND__REGION_GPU_DMABUF ||
	    rr->kind == RDMAX__V1__REGION_KIND__REGION_GPU_CUDA_IPC) {
		handle_register_gpu(s, seq, rr, fds, n_fds);
		return;
	}
	if (rr->kind != RDMAX__V1__REGION_KIND__REGION_HOST_FD) {
		const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
			&rdmax__v1__region_kind__descriptor, rr->kind);
		if (v) {
			ipc_reply_status(
				s, seq, RDMAX_E_INVALID_ARGUMENT,
				"region kind %s cannot be registered (slices come from PoolAlloc)",
				v->name);
		} else {
			ipc_reply_status(
				s, seq, RDMAX_E_INVALID_ARGUMENT,
				"unknown region kind %d (this daemon knows REGION_HOST_FD, "
				"REGION_GPU_DMABUF and REGION_GPU_CUDA_IPC)",
				(int)rr->kind);
		}
		return;
	}
	uint32_t idx = rr->has_fd_index ? rr->fd_index : 0;
	if (idx >= n_fds) {
		ipc_reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
				 "RegisterRegion names fd %u but the message carried %zu fds", idx,
				 n_fds);
		return;
	}
	if (!region_limits_ok(s, seq, rr->length)) {
		return;
	}
	ret = region_register_host_fd(&daemon->regions, &s->owner, fds[idx], rr->offset, rr->length,
				      rr->access, &region);
	if (ret < 0) {
		const char *why = rdmax_strerror(ret);
		if (ret == RDMAX_E_PERMISSION_DENIED) {
			why = "the fd must be a memfd sealed with F_SEAL_SHRINK (and be writable "
			      "when "
			      "remote write access is asked)";
		} else if (ret == RDMAX_E_OUT_OF_RANGE) {
			why = "offset and length reach past the end of the file";
		} else if (ret == RDMAX_E_INVALID_ARGUMENT) {
			why = "zero length, unknown access bits, or not a regular file";
		}
		ipc_reply_status(s, seq, ret, "cannot register region: %s", why);
		return;
	}
	reply_region(s, seq, region, NULL);
}

/* A new region of this client: account for it and answer with its descriptor. */
static void reply_region(struct session *s, uint64_t seq, struct region *region,
			 const struct gpu_lease *lease)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	uint8_t desc[DESC_MAX_BYTES];

	list_add_tail(&s->regions, &region->owner_link);
	s->region_count++;
	s->registered_bytes += region->length;
	s->share->regions++;
	s->share->registered_bytes += region->length;

	int len = ipc_encode_desc(daemon, region, desc, sizeof(desc));
	if (len < 0) {
		ipc_reply_status(s, seq, len, "cannot encode the region's descriptor");
		s->region_count--;
		s->registered_bytes -= region->length;
		s->share->regions--;
		s->share->registered_bytes -= region->length;
		region_deregister(&daemon->regions, region, NULL, NULL);
		return;
	}
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__RegionReply reply = RDMAX__V1__REGION_REPLY__INIT;
	reply.region_id = region->id;
	reply.desc.data = desc;
	reply.desc.len = (size_t)len;
	reply.has_length = 1;
	reply.length = region->length;
	if (lease) {
		reply.has_cuda_ipc_handle = 1;
		reply.cuda_ipc_handle.data = (uint8_t *)lease->ipc_handle;
		reply.cuda_ipc_handle.len = sizeof(lease->ipc_handle);
		reply.has_pool_offset = 1;
		reply.pool_offset = lease->offset;
		reply.has_pool_id = 1;
		reply.pool_id = lease->pool_id;
		reply.gpu_bus_id = (char *)lease->bus_id;
	}
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_REGION;
	msg.region = &reply;
	log_debug("client %" PRIu64 " registered region %" PRIu64 " (%" PRIu64 " bytes, access %u)",
		  s->id, region->id, region->length, region->access);
	ipc_send_msg(s, &msg);
}

static void deregistered(struct region *region, void *arg)
{
	struct dereg_wait *wait = arg;

	if (wait->session) {
		ipc_reply_status(wait->session, wait->seq, 0, NULL);
	}
	free(wait);
}

static void handle_deregister(struct session *s, uint64_t seq, const Rdmax__V1__DeregisterRegion *d)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	struct region *region = region_find_owned(&daemon->regions, &s->owner, d->region_id);
	struct dereg_wait *wait;

	if (!region) {
		ipc_reply_status(s, seq, RDMAX_E_NOT_FOUND, "region %" PRIu64 " is not registered",
				 d->region_id);
		return;
	}
	wait = malloc(sizeof(*wait));
	if (!wait) {
		ipc_reply_status(s, seq, -ENOMEM, "out of memory");
		return;
	}
	wait->session = s;
	wait->seq = seq;
	names_unpublish_region(&s->ipc->names, &s->owner, region->id);
	s->region_count--;
	s->registered_bytes -= region->length;
	s->share->regions--;
	s->share->registered_bytes -= region->length;
	/* Replies now, or once the last job holding the region returned. */
	region_deregister(&daemon->regions, region, deregistered, wait);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * A job id already in flight, or twice in this Submit: the id that is in the
 * way (true), or false. Such a Submit is refused as a whole, so that no id
 * ever gets a second completion.
 */
static bool submit_has_duplicate(struct session *s, const Rdmax__V1__Submit *submit,
				 uint64_t *ret_id)
{
	uint64_t *ids;

	for (size_t i = 0; i < submit->n_jobs; i++) {
		if (engine_job_in_flight(&s->owner, submit->jobs[i]->job_id)) {
			*ret_id = submit->jobs[i]->job_id;
			return true;
		}
	}
	if (submit->n_jobs < 2) {
		return false;
	}
	ids = malloc(submit->n_jobs * sizeof(*ids));
	if (!ids) {
		return false; /* the engine still refuses an id in flight, without a completion */
	}
	for (size_t i = 0; i < submit->n_jobs; i++) {
		ids[i] = submit->jobs[i]->job_id;
	}
	qsort(ids, submit->n_jobs, sizeof(*ids), cmp_u64);
	for (size_t i = 1; i < submit->n_jobs; i++) {
		if (ids[i] == ids[i - 1]) {
			*ret_id = ids[i];
			free(ids);
			return true;
		}
	}
	free(ids);
	return false;
}

static void handle_submit(struct session *s, uint64_t seq, const Rdmax__V1__Submit *submit)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	uint64_t dup;

	if (submit->n_jobs > daemon->cfg.max_jobs_per_submit) {
		ipc_reply_status(s, seq, RDMAX_E_RESOURCE_EXHAUSTED,
				 "Submit carries %zu jobs; the limit is %u per message",
				 submit->n_jobs, daemon->cfg.max_jobs_per_submit);
		return;
	}
	if (submit_has_duplicate(s, submit, &dup)) {
		ipc_reply_status(s, seq, RDMAX_E_INVALID_ARGUMENT,
				 "job id %" PRIu64 " is already in flight or appears twice in this "
				 "Submit; no job of it was started",
				 dup);
		return;
	}
	for (size_t i = 0; i < submit->n_jobs && session_live(s); i++) {
		if (engine_submit(daemon->engine, &s->owner, submit->jobs[i]) < 0) {
			/* Only without memory for the check above; the id keeps its one completion.
			 */
			log_warn("client %" PRIu64 ": job id %" PRIu64
				 " already in flight; dropped",
				 s->id, submit->jobs[i]->job_id);
		}
	}
}

static void handle_peer_group_create(struct session *s, uint64_t seq,
				     const Rdmax__V1__PeerGroupCreate *req)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__PeerGroupReply reply = RDMAX__V1__PEER_GROUP_REPLY__INIT;
	char why[RDMAX_MESSAGE_MAX];
	uint64_t handle;

	int ret = peer_group_create(s->ipc->daemon, &s->owner.groups, req->remote_descs,
				    req->n_remote_descs, &handle, why, sizeof(why));
	if (ret < 0) {
		ipc_reply_status(s, seq, ret, "cannot create the peer group: %s", why);
		return;
	}
	log_debug("client %" PRIu64 " created peer group %" PRIu64 " of %zu members", s->id, handle,
		  req->n_remote_descs);
	reply.peer_group = handle;
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_PEER_GROUP;
	msg.peer_group = &reply;
	ipc_send_msg(s, &msg);
}

/* The address of an open mailbox: the node's endpoints, its scoped name and key. */
static int encode_mailbox_addr(struct rdmaxd *daemon, const struct mailbox_ref *ref, uint8_t *buf,
			       size_t size)
{
	struct remote_desc addr;

	memset(&addr, 0, sizeof(addr));
	addr.instance_id = daemon->instance_id;
	addr.region_key = ref->key;
	copy_string(addr.node_name, sizeof(addr.node_name), daemon->node_name);
	copy_string(addr.mailbox, sizeof(addr.mailbox), ref->scoped);
	addr.n_endpoints = collect_endpoints(daemon, NULL, addr.endpoints, DESC_MAX_ENDPOINTS);
	return desc_encode(&addr, buf, size);
}

static void handle_mailbox_open(struct session *s, uint64_t seq, const char *name,
				bool want_address)
{
	const struct config *cfg = &s->ipc->daemon->cfg;
	struct mailbox_ref ref;
	int ret = mailbox_open(&s->ipc->mailboxes, &s->owner, (uint32_t)s->uid, name,
			       &s->share->mailboxes, cfg->per_uid_mailboxes, &ref);

	switch (ret) {
	case 0: {
		if (!want_address) {
			log_debug("client %" PRIu64 " opened mailbox '%s'", s->id, ref.scoped);
			ipc_reply_status(s, seq, 0, NULL);
			break;
		}
		uint8_t addr[DESC_MAX_BYTES];
		int len = encode_mailbox_addr(s->ipc->daemon, &ref, addr, sizeof(addr));
		if (len < 0) {
			mailbox_close(&s->ipc->mailboxes, &s->owner, (uint32_t)s->uid, name);
			ipc_reply_status(s, seq, len, "cannot encode the mailbox's address: %s",
					 rdmax_strerror(len));
			break;
		}
		Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
		Rdmax__V1__MailboxReply reply = RDMAX__V1__MAILBOX_REPLY__INIT;
		log_debug("client %" PRIu64 " opened mailbox '%s'", s->id, ref.scoped);
		reply.address.data = addr;
		reply.address.len = (size_t)len;
		msg.has_seq = 1;
		msg.seq = seq;
		msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_MAILBOX;
		msg.mailbox = &reply;
		ipc_send_msg(s, &msg);
		break;
	}
	case RDMAX_E_INVALID_ARGUMENT:
		ipc_reply_status(s, seq, ret,
				 "mailbox name '%.64s' is not valid: 1 to %u printable characters "
				 "without spaces",
				 name ? name : "", MAILBOX_NAME_MAX);
		break;
	case RDMAX_E_ALREADY_EXISTS:
		ipc_reply_status(s, seq, ret,
				 "mailbox '%s' is already open for uid %u on this node", name,
				 (unsigned)s->uid);
		break;
	case RDMAX_E_RESOURCE_EXHAUSTED:
		ipc_reply_status(s, seq, ret,
				 "too many mailboxes open (limits: %u per client, %u per uid "
				 "([limits] per_uid_mailboxes), %u per node)",
				 MAILBOX_MAX_PER_CLIENT, cfg->per_uid_mailboxes,
				 MAILBOX_MAX_PER_NODE);
		break;
	default:
		ipc_reply_status(s, seq, ret, "cannot open mailbox: %s", rdmax_strerror(ret));
		break;
	}
}

/*
 * Mailbox delivery (mailbox_deliver_cb): one MailboxMessage event to the
 * owner. Refused, so the sender hears of it, rather than risk the owner's
 * session: when it does not read its events, when the clients of its uid
 * together have per_uid_queued_message_bytes unread, or when the event would
 * not fit its message limit.
 */
int ipc_deliver_message(void *owner, const char *name, const uint8_t *payload, size_t len,
			const char *from_node)
{
	struct session *s = session_of(owner);
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__MailboxMessage ev = RDMAX__V1__MAILBOX_MESSAGE__INIT;

	if (!session_live(s)) {
		return RDMAX_E_NOT_FOUND;
	}
	if (s->queued_bytes + len > SESSION_MAX_QUEUED_BYTES / 2 ||
	    s->share->queued_bytes + len > s->ipc->daemon->cfg.per_uid_queued_message_bytes) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	ev.mailbox = (char *)name;
	ev.payload.data = (uint8_t *)payload;
	ev.payload.len = len;
	ev.from_node = (char *)(from_node ? from_node : "");
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_MAILBOX_MESSAGE;
	msg.mailbox_message = &ev;
	if (rdmax__v1__daemon_msg__get_packed_size(&msg) > s->ipc->tx_size) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	int ret = ipc_send_msg(s, &msg);
	return ret < 0 ? RDMAX_E_RESOURCE_EXHAUSTED : 0;
}

static void handle_job_status(struct session *s, uint64_t seq, const Rdmax__V1__JobStatusQuery *q)
{
	Rdmax__V1__DaemonMsg msg = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__JobStatusReply reply = RDMAX__V1__JOB_STATUS_REPLY__INIT;
	uint64_t done = 0, total = 0;

	reply.job_id = q->job_id;
	reply.in_flight = engine_job_progress(s->ipc->daemon->engine, &s->owner, q->job_id, &done,
					      &total) == 0;
	if (reply.in_flight) {
		reply.has_bytes_done = 1;
		reply.bytes_done = done;
		reply.has_bytes_total = 1;
		reply.bytes_total = total;
	}
	msg.has_seq = 1;
	msg.seq = seq;
	msg.body_case = RDMAX__V1__DAEMON_MSG__BODY_JOB_STATUS;
	msg.job_status = &reply;
	ipc_send_msg(s, &msg);
}

void ipc_dispatch(struct session *s, const Rdmax__V1__ClientMsg *m, const int *fds, size_t n_fds)
{
	struct rdmaxd *daemon = s->ipc->daemon;
	uint64_t seq = m->has_seq ? m->seq : 0;
	int ret;

	if (!s->hello_done && m->body_case != RDMAX__V1__CLIENT_MSG__BODY_HELLO) {
		ipc_reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR, "the first message must be Hello");
		s->close_after_flush = true;
		return;
	}
	switch (m->body_case) {
	case RDMAX__V1__CLIENT_MSG__BODY_HELLO:
		handle_hello(s, seq, m->hello);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION:
		handle_register(s, seq, m->register_region, fds, n_fds);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION:
		handle_deregister(s, seq, m->deregister_region);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_SUBMIT:
		handle_submit(s, seq, m->submit);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM:
		ret = imm_expect(
			&daemon->imm, &s->owner, m->expect_imm->imm, m->expect_imm->count,
			(m->expect_imm->has_reset && m->expect_imm->reset ? IMM_RESET : 0) |
				(m->expect_imm->has_standing && m->expect_imm->standing
					 ? IMM_STANDING
					 : 0));
		if (ret == RDMAX_E_RESOURCE_EXHAUSTED) {
			ipc_reply_status(s, seq, ret,
					 "every imm counter this uid may hold is claimed ([limits] "
					 "per_uid_imm_counters, max_imm_counters)");
		} else if (ret < 0) {
			ipc_reply_status(s, seq, ret, "ExpectImm refused: %s", rdmax_strerror(ret));
		} else {
			ipc_reply_status(s, seq, 0, NULL);
		}
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_IMM_RELEASE:
		ret = imm_release(&daemon->imm, &s->owner, m->imm_release->imm);
		ipc_reply_status(s, seq, ret, ret ? "imm %u is not claimed by this client" : NULL,
				 m->imm_release->imm);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_CANCEL:
		ret = engine_cancel(daemon->engine, &s->owner, m->cancel->job_id);
		ipc_reply_status(s, seq, ret, ret ? "job %" PRIu64 " is not in flight" : NULL,
				 m->cancel->job_id);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS:
		handle_job_status(s, seq, m->job_status);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE:
		handle_peer_group_create(s, seq, m->peer_group_create);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_DESTROY:
		ret = peer_group_destroy(&s->owner.groups, m->peer_group_destroy->peer_group);
		ipc_reply_status(s, seq, ret, ret ? "peer group %" PRIu64 " does not exist" : NULL,
				 m->peer_group_destroy->peer_group);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN:
		handle_mailbox_open(s, seq, m->mailbox_open->name,
				    m->mailbox_open->has_want_address &&
					    m->mailbox_open->want_address);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_CLOSE:
		ret = mailbox_close(&s->ipc->mailboxes, &s->owner, (uint32_t)s->uid,
				    m->mailbox_close->name);
		ipc_reply_status(s, seq, ret,
				 ret ? "this client has no mailbox '%.64s' open" : NULL,
				 m->mailbox_close->name);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_POOL_ALLOC:
		handle_pool_alloc(s, seq, m->pool_alloc);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP:
		ipc_handle_ring_setup(s, seq, m->ring_setup, fds, n_fds);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_REGION_PUBLISH:
		ipc_handle_publish(s, seq, m->region_publish);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_REGION_UNPUBLISH:
		ret = names_unpublish(&s->ipc->names, &s->owner, m->region_unpublish->name);
		ipc_reply_status(s, seq, ret,
				 ret ? "this client published no region as '%.64s'" : NULL,
				 m->region_unpublish->name);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_LOOKUP:
		ipc_handle_lookup(s, seq, m->lookup);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_NODES:
		ipc_handle_nodes(s, seq);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_RING_DOORBELL:
		/* Reading the datagram already took the ring's entries and woke it. */
		break;
	default:
		ipc_reply_status(s, seq, RDMAX_E_PROTOCOL_ERROR, "message has no body");
		break;
	}
}
