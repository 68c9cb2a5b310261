/* SPDX-License-Identifier: MIT */
/*
 * librdmax's job path: checks what can be refused without the daemon, encodes
 * batches of jobs (through the shared-memory ring when it has room, else as
 * one Submit datagram) and the job-side requests (ExpectImm, Cancel,
 * JobStatus, mailboxes). Never waits for the daemon except in the requests
 * that need its answer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "job_codec.h"

static bool owned_region(const struct rdmax_client *c, const struct rdmax_region *r)
{
	return r && r->client == c;
}

static bool owned_group(const struct rdmax_client *c, const struct rdmax_peer_group *g)
{
	return g && g->client == c;
}

static int check_scatter(const struct rdmax_client *c, const struct rdmax_job *j)
{
	if (!owned_region(c, j->local) || (j->u.scatter.count && !j->u.scatter.dests) ||
	    (j->u.scatter.group && !owned_group(c, j->u.scatter.group))) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < j->u.scatter.count; i++) {
		const struct rdmax_scatter_dest *d = &j->u.scatter.dests[i];
		if (d->remote ? !client_desc_usable(d->remote) : !j->u.scatter.group) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	return 0;
}

static int check_barrier(const struct rdmax_client *c, const struct rdmax_job *j)
{
	if (j->u.barrier.group) {
		return owned_group(c, j->u.barrier.group) && j->u.barrier.count == 0
			       ? 0
			       : RDMAX_E_INVALID_ARGUMENT;
	}
	if (j->u.barrier.count == 0 || !j->u.barrier.remotes) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < j->u.barrier.count; i++) {
		if (!client_desc_usable(&j->u.barrier.remotes[i])) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	return 0;
}

/* The further region pairs of a paged job, against what the daemon announced. */
static int check_pairs(const struct rdmax_client *c, const struct rdmax_job *j)
{
	uint32_t max = c->info.max_paged_pairs ? c->info.max_paged_pairs : 1;

	if (j->n_pairs == 0) {
		return j->pairs ? RDMAX_E_INVALID_ARGUMENT : 0;
	}
	if (!j->pairs) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (max == 1) {
		return RDMAX_E_UNIMPLEMENTED; /* an older daemon would move pair 0 only */
	}
	if (j->n_pairs > max - 1) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < j->n_pairs; i++) {
		if (!owned_region(c, j->pairs[i].local) ||
		    !client_desc_usable(j->pairs[i].remote)) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
	}
	return 0;
}

/*
 * What can be refused without asking the daemon: what cannot be encoded.
 * Ranges, page lists and names are the daemon's to judge: it says why.
 */
static int check_job(const struct rdmax_client *c, const struct rdmax_job *j)
{
	bool imm_ok = j->op == RDMAX_OP_WRITE || j->op == RDMAX_OP_PAGED_WRITE ||
		      j->op == RDMAX_OP_SCATTER || j->op == RDMAX_OP_BARRIER;

	if (j->flags & ~RDMAX_JOB_IMM) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if ((j->flags & RDMAX_JOB_IMM) && !imm_ok) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if ((j->pairs || j->n_pairs) && j->op != RDMAX_OP_PAGED_WRITE &&
	    j->op != RDMAX_OP_PAGED_READ) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	switch (j->op) {
	case RDMAX_OP_WRITE:
	case RDMAX_OP_READ:
		if (!owned_region(c, j->local) || !client_desc_usable(j->remote)) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		if (j->local_offset > j->local->length ||
		    j->length > j->local->length - j->local_offset) {
			return RDMAX_E_OUT_OF_RANGE;
		}
		return 0;
	case RDMAX_OP_PAGED_WRITE:
	case RDMAX_OP_PAGED_READ:
		if (!owned_region(c, j->local) || !client_desc_usable(j->remote) ||
		    (j->u.paged.local_pages.count && !j->u.paged.local_pages.indices) ||
		    (j->u.paged.remote_pages.count && !j->u.paged.remote_pages.indices)) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		return check_pairs(c, j);
	case RDMAX_OP_SCATTER:
		return check_scatter(c, j);
	case RDMAX_OP_BARRIER:
		return check_barrier(c, j);
	case RDMAX_OP_SEND:
		/* remote is the mailbox's address; the name, when given, is checked against it. */
		if (!client_desc_usable(j->remote) || (j->u.send.length && !j->u.send.payload)) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		return j->u.send.length > RDMAX_MESSAGE_PAYLOAD_MAX ? RDMAX_E_RESOURCE_EXHAUSTED
								    : 0;
	default:
		return RDMAX_E_INVALID_ARGUMENT;
	}
}

/* Room for \p count more jobs under the daemon's limit, after reading what has arrived. */
static int check_outstanding(struct rdmax_client *c, size_t count)
{
	uint32_t max = c->info.max_outstanding_jobs;

	if (max == 0 || (count <= max && c->jobs.len <= max - count)) {
		return 0;
	}
	/* Completions may be waiting in the socket: our count only falls when we read them. */
	int r = client_drain(c);
	if (r < 0) {
		return r;
	}
	if (count <= max && c->jobs.len <= max - count) {
		return 0;
	}
	return RDMAX_E_RESOURCE_EXHAUSTED;
}

/* One job's protobuf structures. */
struct pb_job {
	Rdmax__V1__Job job;
	union {
		Rdmax__V1__WriteJob write;
		Rdmax__V1__ReadJob read;
		Rdmax__V1__PagedWriteJob paged;
		Rdmax__V1__PagedReadJob paged_read;
		Rdmax__V1__ScatterJob scatter;
		Rdmax__V1__BarrierJob barrier;
		Rdmax__V1__SendJob send;
	} k;
	Rdmax__V1__PageList src;
	Rdmax__V1__PageList dst;
	size_t packed_len; /* ring_submit(): the entry's length, measured once */
	bool codec;        /* ring_submit(): packed by job_codec_pack() */
};

/* A Submit this small is encoded on the stack: the ring path then needs no malloc. */
#define SUBMIT_STACK_BYTES 2048u

/* Everything a Submit needs, in one allocation (every member is 8-byte aligned). */
struct submit_buf {
	Rdmax__V1__Job **ptrs;
	struct pb_job *pbs;
	Rdmax__V1__ScatterDest *dests;
	Rdmax__V1__ScatterDest **dest_ptrs;
	ProtobufCBinaryData *descs;  /* barrier descriptors */
	Rdmax__V1__PagedPair *pairs; /* further region pairs of paged jobs */
	Rdmax__V1__PagedPair **pair_ptrs;
	size_t next_dest;
	size_t next_desc;
	size_t next_pair;
};

static bool add_size(size_t *total, size_t count, size_t each)
{
	size_t bytes;
	return !__builtin_mul_overflow(count, each, &bytes) &&
	       !__builtin_add_overflow(*total, bytes, total);
}

/* The buffer for the batch: `stack` (stack_size bytes, 8-aligned) when it fits, else malloc. */
static void *submit_alloc(const struct rdmax_job *jobs, size_t count, struct submit_buf *ret,
			  void *stack, size_t stack_size)
{
	size_t n_dests = 0, n_descs = 0, n_pairs = 0, total = 0;
	char *mem;

	for (size_t i = 0; i < count; i++) {
		if (jobs[i].op == RDMAX_OP_SCATTER &&
		    __builtin_add_overflow(n_dests, jobs[i].u.scatter.count, &n_dests)) {
			return NULL;
		}
		if (jobs[i].op == RDMAX_OP_BARRIER && !jobs[i].u.barrier.group &&
		    __builtin_add_overflow(n_descs, jobs[i].u.barrier.count, &n_descs)) {
			return NULL;
		}
		if (__builtin_add_overflow(n_pairs, jobs[i].n_pairs, &n_pairs)) {
			return NULL;
		}
	}
	if (!add_size(&total, count, sizeof(struct pb_job)) ||
	    !add_size(&total, count, sizeof(Rdmax__V1__Job *)) ||
	    !add_size(&total, n_dests, sizeof(Rdmax__V1__ScatterDest)) ||
	    !add_size(&total, n_dests, sizeof(Rdmax__V1__ScatterDest *)) ||
	    !add_size(&total, n_descs, sizeof(ProtobufCBinaryData)) ||
	    !add_size(&total, n_pairs, sizeof(Rdmax__V1__PagedPair)) ||
	    !add_size(&total, n_pairs, sizeof(Rdmax__V1__PagedPair *))) {
		return NULL;
	}
	mem = total <= stack_size ? stack : malloc(total ? total : 1);
	if (!mem) {
		return NULL;
	}
	/* Largest alignment first so each array stays aligned. */
	ret->pbs = (struct pb_job *)mem;
	ret->dests = (Rdmax__V1__ScatterDest *)(ret->pbs + count);
	ret->descs = (ProtobufCBinaryData *)(ret->dests + n_dests);
	ret->pairs = (Rdmax__V1__PagedPair *)(ret->descs + n_descs);
	ret->ptrs = (Rdmax__V1__Job **)(ret->pairs + n_pairs);
	ret->dest_ptrs = (Rdmax__V1__ScatterDest **)(ret->ptrs + count);
	ret->pair_ptrs = (Rdmax__V1__PagedPair **)(ret->dest_ptrs + n_dests);
	ret->next_dest = 0;
	ret->next_desc = 0;
	ret->next_pair = 0;
	return mem;
}

static void encode_pages(Rdmax__V1__PageList *pl, const struct rdmax_pages *pages)
{
	rdmax__v1__page_list__init(pl);
	pl->has_offset = pages->offset != 0;
	pl->offset = pages->offset;
	pl->has_stride = pages->stride != 0;
	pl->stride = pages->stride;
	pl->n_indices = pages->count;
	pl->indices = (uint32_t *)pages->indices;
}

/* The job's further region pairs from b's arrays; *ret_n of them at *ret_pairs. */
static void encode_pairs(const struct rdmax_job *j, struct submit_buf *b,
			 Rdmax__V1__PagedPair ***ret_pairs, size_t *ret_n)
{
	*ret_pairs = j->n_pairs ? &b->pair_ptrs[b->next_pair] : NULL;
	*ret_n = j->n_pairs;
	for (size_t i = 0; i < j->n_pairs; i++) {
		Rdmax__V1__PagedPair *x = &b->pairs[b->next_pair];
		rdmax__v1__paged_pair__init(x);
		x->local_region = j->pairs[i].local->id;
		x->remote_desc = client_desc_bytes(j->pairs[i].remote);
		b->pair_ptrs[b->next_pair++] = x;
	}
}

static void encode_paged(const struct rdmax_job *j, struct pb_job *pb, struct submit_buf *b)
{
	Rdmax__V1__PagedWriteJob *pw = &pb->k.paged;

	rdmax__v1__paged_write_job__init(pw);
	pw->local_region = j->local->id;
	pw->page_len = j->u.paged.page_len;
	encode_pages(&pb->src, &j->u.paged.local_pages);
	encode_pages(&pb->dst, &j->u.paged.remote_pages);
	pw->src = &pb->src;
	pw->dst = &pb->dst;
	pw->remote_desc = client_desc_bytes(j->remote);
	if (j->flags & RDMAX_JOB_IMM) {
		pw->has_imm = 1;
		pw->imm = j->imm;
	}
	encode_pairs(j, b, &pw->pairs, &pw->n_pairs);
	pb->job.kind_case = RDMAX__V1__JOB__KIND_PAGED_WRITE;
	pb->job.paged_write = pw;
}

static void encode_paged_read(const struct rdmax_job *j, struct pb_job *pb, struct submit_buf *b)
{
	Rdmax__V1__PagedReadJob *pr = &pb->k.paged_read;

	rdmax__v1__paged_read_job__init(pr);
	pr->local_region = j->local->id;
	pr->page_len = j->u.paged.page_len;
	encode_pages(&pb->dst, &j->u.paged.local_pages);
	encode_pages(&pb->src, &j->u.paged.remote_pages);
	pr->dst = &pb->dst;
	pr->src = &pb->src;
	pr->remote_desc = client_desc_bytes(j->remote);
	encode_pairs(j, b, &pr->pairs, &pr->n_pairs);
	pb->job.kind_case = RDMAX__V1__JOB__KIND_PAGED_READ;
	pb->job.paged_read = pr;
}

static void encode_scatter(const struct rdmax_job *j, struct pb_job *pb, struct submit_buf *b)
{
	Rdmax__V1__ScatterJob *sj = &pb->k.scatter;

	rdmax__v1__scatter_job__init(sj);
	sj->local_region = j->local->id;
	sj->n_dests = j->u.scatter.count;
	sj->dests = &b->dest_ptrs[b->next_dest];
	for (size_t i = 0; i < j->u.scatter.count; i++) {
		const struct rdmax_scatter_dest *d = &j->u.scatter.dests[i];
		Rdmax__V1__ScatterDest *x = &b->dests[b->next_dest];
		rdmax__v1__scatter_dest__init(x);
		if (d->remote) {
			x->has_remote_desc = 1;
			x->remote_desc = client_desc_bytes(d->remote);
		} else {
			x->has_peer_index = 1;
			x->peer_index = d->peer_index;
		}
		x->remote_offset = d->remote_offset;
		x->local_offset = d->local_offset;
		x->length = d->length;
		b->dest_ptrs[b->next_dest++] = x;
	}
	if (j->u.scatter.group) {
		sj->has_peer_group = 1;
		sj->peer_group = j->u.scatter.group->handle;
	}
	if (j->flags & RDMAX_JOB_IMM) {
		sj->has_imm = 1;
		sj->imm = j->imm;
	}
	pb->job.kind_case = RDMAX__V1__JOB__KIND_SCATTER;
	pb->job.scatter = sj;
}

static void encode_barrier(const struct rdmax_job *j, struct pb_job *pb, struct submit_buf *b)
{
	Rdmax__V1__BarrierJob *bj = &pb->k.barrier;

	rdmax__v1__barrier_job__init(bj);
	bj->imm = j->imm;
	if (j->u.barrier.group) {
		bj->has_peer_group = 1;
		bj->peer_group = j->u.barrier.group->handle;
	} else {
		bj->n_remote_descs = j->u.barrier.count;
		bj->remote_descs = &b->descs[b->next_desc];
		for (size_t i = 0; i < j->u.barrier.count; i++) {
			b->descs[b->next_desc++] = client_desc_bytes(&j->u.barrier.remotes[i]);
		}
	}
	pb->job.kind_case = RDMAX__V1__JOB__KIND_BARRIER;
	pb->job.barrier = bj;
}

static void encode_send(const struct rdmax_job *j, struct pb_job *pb)
{
	Rdmax__V1__SendJob *sj = &pb->k.send;

	rdmax__v1__send_job__init(sj);
	sj->remote_desc = client_desc_bytes(j->remote);
	sj->mailbox = (char *)j->u.send.mailbox;
	sj->payload.len = j->u.send.length;
	sj->payload.data = (uint8_t *)j->u.send.payload;
	pb->job.kind_case = RDMAX__V1__JOB__KIND_SEND;
	pb->job.send = sj;
}

static void encode_job(const struct rdmax_job *j, struct submit_buf *b, size_t i)
{
	struct pb_job *pb = &b->pbs[i];
	Rdmax__V1__Job *pj = &pb->job;

	rdmax__v1__job__init(pj);
	pj->job_id = j->id;
	if (j->deadline_ms) {
		pj->has_deadline_ms = 1;
		pj->deadline_ms = j->deadline_ms;
	}
	if (j->traffic_class) {
		pj->has_traffic_class = 1;
		pj->traffic_class = j->traffic_class;
	}
	switch (j->op) {
	case RDMAX_OP_WRITE: {
		Rdmax__V1__WriteJob *w = &pb->k.write;
		rdmax__v1__write_job__init(w);
		w->local_region = j->local->id;
		w->local_offset = j->local_offset;
		w->length = j->length;
		w->remote_desc = client_desc_bytes(j->remote);
		w->remote_offset = j->remote_offset;
		if (j->flags & RDMAX_JOB_IMM) {
			w->has_imm = 1;
			w->imm = j->imm;
		}
		pj->kind_case = RDMAX__V1__JOB__KIND_WRITE;
		pj->write = w;
		break;
	}
	case RDMAX_OP_READ: {
		Rdmax__V1__ReadJob *rd = &pb->k.read;
		rdmax__v1__read_job__init(rd);
		rd->remote_desc = client_desc_bytes(j->remote);
		rd->remote_offset = j->remote_offset;
		rd->length = j->length;
		rd->local_region = j->local->id;
		rd->local_offset = j->local_offset;
		pj->kind_case = RDMAX__V1__JOB__KIND_READ;
		pj->read = rd;
		break;
	}
	case RDMAX_OP_PAGED_WRITE:
		encode_paged(j, pb, b);
		break;
	case RDMAX_OP_PAGED_READ:
		encode_paged_read(j, pb, b);
		break;
	case RDMAX_OP_SCATTER:
		encode_scatter(j, pb, b);
		break;
	case RDMAX_OP_BARRIER:
		encode_barrier(j, pb, b);
		break;
	case RDMAX_OP_SEND:
		encode_send(j, pb);
		break;
	}
	b->ptrs[i] = pj;
}

/*
 * The batch as ring entries, all or none: -ENOSPC when the ring lacks room
 * or a job does not fit a slot (the caller then uses the socket, which keeps
 * the order through the entries' `after`).
 */
static int ring_submit(struct rdmax_client *c, const struct rdmax_job *jobs, size_t count,
		       struct submit_buf *b)
{
	uint32_t max = client_ring_sqe_max(&c->ring);
	size_t submit_len = 0;

	if (count > client_ring_sq_space(&c->ring)) {
		return -ENOSPC;
	}
	for (size_t i = 0; i < count; i++) {
		encode_job(&jobs[i], b, i);
		/* Writes and reads straight-line, the same bytes as protobuf-c's. */
		size_t len = job_codec_size(b->ptrs[i]);
		b->pbs[i].codec = len != 0;
		if (!len) {
			len = rdmax__v1__job__get_packed_size(b->ptrs[i]);
		}
		b->pbs[i].packed_len = len;
		submit_len += 1 + job_codec_varint_len(len) + len;
		if (len > max) {
			/* The socket path encodes again from the start. */
			b->next_dest = 0;
			b->next_desc = 0;
			b->next_pair = 0;
			return -ENOSPC;
		}
	}
	/* The same limit as the Submit it replaces: the call behaves alike on both paths. */
	size_t msg_len = 1 + job_codec_varint_len(c->next_seq) + 1 +
			 job_codec_varint_len(submit_len) + submit_len;
	if (msg_len > c->max_tx) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < count; i++) {
		size_t len = b->pbs[i].packed_len;
		uint8_t *data =
			client_ring_sqe_prepare(&c->ring, (uint32_t)i, (uint32_t)len, c->msgs_sent);
		if (b->pbs[i].codec) {
			job_codec_pack(b->ptrs[i], data);
		} else {
			rdmax__v1__job__pack(b->ptrs[i], data);
		}
	}
	bool doorbell = client_ring_sq_publish(&c->ring, (uint32_t)count);
	/*
	 * A ring job's completion also proves the Submits sent before it were
	 * accepted: the daemon took it only after reading them.
	 */
	for (size_t i = 0; i < count; i++) {
		client_jobs_add(&c->jobs, jobs[i].id, c->next_seq - 1);
	}
	if (doorbell) {
		Rdmax__V1__RingDoorbell db = RDMAX__V1__RING_DOORBELL__INIT;
		Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
		msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_DOORBELL;
		msg.ring_doorbell = &db;
		/* The jobs are the daemon's now; a failure here sticks for the next call. */
		(void)client_send_msg(c, &msg, -1);
	}
	return 0;
}

static int submit(struct rdmax_client *client, const struct rdmax_job *jobs, size_t count)
{
	Rdmax__V1__Submit submit = RDMAX__V1__SUBMIT__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	union {
		uint8_t bytes[SUBMIT_STACK_BYTES];
		uint64_t align;
	} stack;
	struct client_pending *p = NULL;
	struct submit_buf b;
	void *mem;
	int r;

	if (client->err) {
		return client->err;
	}
	if (count == 0) {
		return 0;
	}
	for (size_t i = 0; i < count; i++) {
		r = check_job(client, &jobs[i]);
		if (r < 0) {
			return r;
		}
	}
	if (client->info.max_jobs_per_submit && count > client->info.max_jobs_per_submit) {
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	r = check_outstanding(client, count);
	if (r < 0) {
		return r;
	}
	mem = submit_alloc(jobs, count, &b, stack.bytes, sizeof(stack.bytes));
	if (!mem) {
		return -ENOMEM;
	}
	/* Reserve before sending so nothing can fail once the daemon has the jobs. */
	r = client_jobs_reserve(&client->jobs, count);
	if (r < 0) {
		goto out_free_mem;
	}
	if (client->ring.v.base) {
		r = ring_submit(client, jobs, count, &b);
		if (r != -ENOSPC) {
			goto out_free_mem;
		}
	}
	/* The socket path: the Submit's reply settles these ids. */
	p = malloc(sizeof(*p) + count * sizeof(p->ids[0]));
	if (!p) {
		r = -ENOMEM;
		goto out_free_mem;
	}
	for (size_t i = 0; i < count; i++) {
		encode_job(&jobs[i], &b, i);
		p->ids[i] = jobs[i].id;
	}
	submit.n_jobs = count;
	submit.jobs = b.ptrs;
	msg.has_seq = 1;
	msg.seq = client->next_seq++;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_SUBMIT;
	msg.submit = &submit;
	r = client_send_msg(client, &msg, -1);
	if (r < 0) {
		goto out_free_pending;
	}
	p->next = NULL;
	p->seq = msg.seq;
	p->n_ids = count;
	*client->pending_tail = p;
	client->pending_tail = &p->next;
	for (size_t i = 0; i < count; i++) {
		client_jobs_add(&client->jobs, jobs[i].id, msg.seq);
	}
	r = 0;
	goto out_free_mem;

out_free_pending:
	free(p);
out_free_mem:
	if (mem != stack.bytes) {
		free(mem);
	}
	return r;
}

/*
 * Whether the caller's job of job_size bytes has nothing past what this
 * library knows: a newer program's fields must be zero to be ignored safely.
 */
static bool tail_zero(const struct rdmax_job *job, size_t job_size)
{
	const uint8_t *p = (const uint8_t *)job;

	for (size_t i = sizeof(struct rdmax_job); i < job_size; i++) {
		if (p[i]) {
			return false;
		}
	}
	return true;
}

RDMAX_EXPORT int rdmax_submit_sized(struct rdmax_client *client, const struct rdmax_job *jobs,
				    size_t count, size_t job_size)
{
	struct rdmax_job *copy;
	int r;

	if (!client || (!jobs && count)) {
		return -EINVAL;
	}
	if (job_size < RDMAX_JOB_SIZE_MIN) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	if (job_size == sizeof(struct rdmax_job)) {
		return submit(client, jobs, count);
	}
	/* Another release's layout: copy each job into this one's, zero-extended or cut. */
	if (count > SIZE_MAX / sizeof(*copy)) {
		return -ENOMEM;
	}
	copy = calloc(count ? count : 1, sizeof(*copy));
	if (!copy) {
		return -ENOMEM;
	}
	for (size_t i = 0; i < count; i++) {
		const struct rdmax_job *j = (const void *)((const uint8_t *)jobs + i * job_size);
		if (!tail_zero(j, job_size)) {
			free(copy);
			return RDMAX_E_INVALID_ARGUMENT;
		}
		memcpy(&copy[i], j, job_size < sizeof(*copy) ? job_size : sizeof(*copy));
	}
	r = submit(client, copy, count);
	free(copy);
	return r;
}

_Static_assert(sizeof(struct rdmax_job) >= RDMAX_JOB_SIZE_MIN, "RDMAX_2.0 job layout");

RDMAX_EXPORT int rdmax_expect_imm_flags(struct rdmax_client *client, uint32_t imm, uint64_t count,
					uint32_t flags)
{
	Rdmax__V1__ExpectImm e = RDMAX__V1__EXPECT_IMM__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client) {
		return -EINVAL;
	}
	if (flags & ~(RDMAX_EXPECT_STANDING | RDMAX_EXPECT_RESET)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	/* A daemon without it would take the claim as one-shot: say so instead. */
	if ((flags & RDMAX_EXPECT_STANDING) &&
	    !(client->info.capabilities & RDMAX_CAP_IMM_STANDING)) {
		return RDMAX_E_UNIMPLEMENTED;
	}
	e.imm = imm;
	e.count = count;
	e.has_reset = !!(flags & RDMAX_EXPECT_RESET);
	e.reset = e.has_reset;
	e.has_standing = !!(flags & RDMAX_EXPECT_STANDING);
	e.standing = e.has_standing;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM;
	msg.expect_imm = &e;
	return client_request_status(client, &msg, -1);
}

RDMAX_EXPORT int rdmax_expect_imm(struct rdmax_client *client, uint32_t imm, uint64_t count)
{
	return rdmax_expect_imm_flags(client, imm, count, 0);
}

RDMAX_EXPORT int rdmax_release_imm(struct rdmax_client *client, uint32_t imm)
{
	Rdmax__V1__ImmRelease r = RDMAX__V1__IMM_RELEASE__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client) {
		return -EINVAL;
	}
	if (!(client->info.capabilities & RDMAX_CAP_IMM_STANDING)) {
		return RDMAX_E_UNIMPLEMENTED;
	}
	r.imm = imm;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_IMM_RELEASE;
	msg.imm_release = &r;
	return client_request_status(client, &msg, -1);
}
RDMAX_EXPORT int rdmax_cancel(struct rdmax_client *client, uint64_t job_id)
{
	Rdmax__V1__Cancel cancel = RDMAX__V1__CANCEL__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client) {
		return -EINVAL;
	}
	cancel.job_id = job_id;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_CANCEL;
	msg.cancel = &cancel;
	return client_request_status(client, &msg, -1);
}

RDMAX_EXPORT int rdmax_job_status(struct rdmax_client *client, uint64_t job_id, uint64_t *ret_done,
				  uint64_t *ret_total)
{
	Rdmax__V1__JobStatusQuery q = RDMAX__V1__JOB_STATUS_QUERY__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;
	int r;

	if (!client) {
		return -EINVAL;
	}
	q.job_id = job_id;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS;
	msg.job_status = &q;
	r = client_request(client, &msg, -1, -1, &reply);
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_JOB_STATUS ||
	    reply->job_status->job_id != job_id) {
		r = client_unexpected_reply(client, reply);
	} else if (!reply->job_status->in_flight) {
		r = RDMAX_E_NOT_FOUND;
	} else {
		if (ret_done) {
			*ret_done = reply->job_status->bytes_done;
		}
		if (ret_total) {
			*ret_total = reply->job_status->bytes_total;
		}
	}
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}
RDMAX_EXPORT int rdmax_mailbox_open_addr(struct rdmax_client *client, const char *name,
					 struct rdmax_desc *ret_addr)
{
	Rdmax__V1__MailboxOpen mo = RDMAX__V1__MAILBOX_OPEN__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__DaemonMsg *reply;

	if (!client) {
		return -EINVAL;
	}
	if (!name || strnlen(name, RDMAX_MAILBOX_NAME_MAX + 1) > RDMAX_MAILBOX_NAME_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	mo.name = (char *)name;
	mo.has_want_address = 1;
	mo.want_address = 1;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN;
	msg.mailbox_open = &mo;
	int r = client_request(client, &msg, -1, -1, &reply);
	if (r < 0) {
		return r;
	}
	if (reply->body_case != RDMAX__V1__DAEMON_MSG__BODY_MAILBOX) {
		r = client_unexpected_reply(client, reply);
	} else if (reply->mailbox->address.len == 0 ||
		   reply->mailbox->address.len > RDMAX_DESC_MAX) {
		r = RDMAX_E_PROTOCOL_ERROR;
	} else if (ret_addr) {
		ret_addr->len = (uint32_t)reply->mailbox->address.len;
		memcpy(ret_addr->bytes, reply->mailbox->address.data, ret_addr->len);
	}
	rdmax__v1__daemon_msg__free_unpacked(reply, NULL);
	return r;
}

RDMAX_EXPORT int rdmax_mailbox_open(struct rdmax_client *client, const char *name)
{
	return rdmax_mailbox_open_addr(client, name, NULL);
}

RDMAX_EXPORT int rdmax_mailbox_close(struct rdmax_client *client, const char *name)
{
	Rdmax__V1__MailboxClose mc = RDMAX__V1__MAILBOX_CLOSE__INIT;
	Rdmax__V1__ClientMsg msg = RDMAX__V1__CLIENT_MSG__INIT;

	if (!client) {
		return -EINVAL;
	}
	if (!name || strnlen(name, RDMAX_MAILBOX_NAME_MAX + 1) > RDMAX_MAILBOX_NAME_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	mc.name = (char *)name;
	msg.body_case = RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_CLOSE;
	msg.mailbox_close = &mc;
	return client_request_status(client, &msg, -1);
}
