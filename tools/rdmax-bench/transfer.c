/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench: the responder (register a region, publish its descriptor, wait)
 * and the requester's job loop: the jobs of one size shaped per op kind
 * (write, read, paged, scatter), submitted in windows and batches, their
 * completions reaped with per-job latency. Prints nothing but errors.
 */
#include "bench.h"

/* ---- responder ---- */

/* \return the process exit status */
int bench_run_serve(struct opts *o)
{
	struct rdmax_client *c;
	struct rdmax_region *region;
	struct rdmax_desc desc;
	struct sigaction sa = {.sa_handler = bench_on_stop_signal};
	int ret;

	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	ret = rdmax_client_open(o->socket_path, "bench-serve", &c);
	if (ret < 0) {
		return bench_fail("connect", ret);
	}
	ret = rdmax_region_alloc_host(
		c, o->serve_bytes, RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE, &region);
	if (ret < 0) {
		rdmax_client_close(c);
		return bench_fail("allocate region", ret);
	}
	bench_fill_pattern(rdmax_region_addr(region), rdmax_region_length(region), 0);
	rdmax_region_desc(region, &desc);
	if (strcmp(o->desc_path, "-") == 0) {
		for (uint32_t i = 0; i < desc.len; i++) {
			printf("%02x", desc.bytes[i]);
		}
		printf("\n");
		fflush(stdout);
	} else {
		ret = bench_write_desc_file(o->desc_path, &desc);
		if (ret < 0) {
			fprintf(stderr, "rdmax-bench: cannot write descriptor to '%s': %s\n",
				o->desc_path, strerror(-ret));
			rdmax_client_close(c);
			return 1;
		}
	}
	fprintf(stderr, "rdmax-bench: serving %" PRIu64 " bytes (read+write) on daemon pid %d\n",
		rdmax_region_length(region), bench_daemon_pid_of(c));
	while (!bench_stop) {
		struct rdmax_event ev[16];
		int n = rdmax_poll_events(c, ev, 16, 100);
		if (n < 0 && n != -EINTR) {
			rdmax_client_close(c);
			return bench_fail("wait for events", n);
		}
		if (o->stop_file && access(o->stop_file, F_OK) == 0) {
			break;
		}
	}
	if (strcmp(o->desc_path, "-") != 0) {
		unlink(o->desc_path);
	}
	ret = rdmax_region_free(c, region);
	rdmax_client_close(c);
	return ret < 0 ? bench_fail("deregister", ret) : 0;
}

/* ---- requester ---- */

static int ensure_t(struct bench *b, uint64_t need)
{
	if (need <= b->t_cap) {
		return 0;
	}
	uint64_t cap = b->t_cap ? b->t_cap : 1024;
	while (cap < need) {
		cap *= 2;
	}
	uint64_t *t = realloc(b->t, cap * sizeof(*t));
	if (!t) {
		return -ENOMEM;
	}
	b->t = t;
	b->t_cap = cap;
	return 0;
}

static void fill_job(struct bench *b, struct rdmax_job *j, enum rdmax_op op, uint64_t size)
{
	memset(j, 0, sizeof(*j));
	j->id = b->next_id++;
	j->op = op;
	j->local = bench_op_reads(op) ? b->dst : b->src;
	switch (op) {
	case RDMAX_OP_PAGED_WRITE:
	case RDMAX_OP_PAGED_READ: {
		/* Written: src pages in order to dst pages reversed; read: the same way back. */
		bool read = op == RDMAX_OP_PAGED_READ;
		j->remote = &b->peer;
		j->u.paged.page_len = b->page_len;
		j->u.paged.local_pages.indices = read ? b->dst_pages : b->src_pages;
		j->u.paged.local_pages.count = b->n_pages;
		j->u.paged.remote_pages.indices = read ? b->src_pages : b->dst_pages;
		j->u.paged.remote_pages.count = b->n_pages;
		break;
	}
	case RDMAX_OP_SCATTER:
		j->u.scatter.dests = b->dests;
		j->u.scatter.count = b->n_dests;
		break;
	default:
		j->length = size;
		j->remote = &b->peer;
		break;
	}
	if (b->o->has_imm && !bench_op_reads(op)) {
		j->flags = RDMAX_JOB_IMM;
		j->imm = b->o->imm;
	}
}

/*
 * Page lists for a paged write (or read) of `size` bytes: source pages in
 * order, destination pages reversed (a block table), so no two neighbours
 * merge into one transfer; a paged read brings the peer's pages in order
 * into the local pages reversed. Scatter: `dests` equal slices to the same region.
 */
int bench_shape_jobs(struct bench *b, uint64_t size)
{
	struct opts *o = b->o;

	if (bench_op_paged(o->op)) {
		b->page_len = MIN_U64(o->page_len, size);
		b->n_pages = (size_t)(size / b->page_len);
		uint32_t *s = realloc(b->src_pages, b->n_pages * sizeof(*s));
		if (!s) {
			return -ENOMEM;
		}
		b->src_pages = s;
		uint32_t *d = realloc(b->dst_pages, b->n_pages * sizeof(*d));
		if (!d) {
			return -ENOMEM;
		}
		b->dst_pages = d;
		for (size_t i = 0; i < b->n_pages; i++) {
			b->src_pages[i] = (uint32_t)i;
			b->dst_pages[i] = (uint32_t)(b->n_pages - 1 - i);
		}
	} else if (o->op == RDMAX_OP_SCATTER) {
		b->n_dests = (size_t)MIN_U64(o->dests, size);
		struct rdmax_scatter_dest *d = realloc(b->dests, b->n_dests * sizeof(*d));
		if (!d) {
			return -ENOMEM;
		}
		b->dests = d;
		uint64_t slice = size / b->n_dests;
		for (size_t i = 0; i < b->n_dests; i++) {
			memset(&d[i], 0, sizeof(d[i]));
			d[i].remote = &b->peer;
			d[i].local_offset = d[i].remote_offset = i * slice;
			d[i].length = i + 1 == b->n_dests ? size - i * slice : slice;
		}
	}
	return 0;
}

/* Bytes one job of this size moves (a paged write drops a partial last page). */
uint64_t bench_job_bytes(const struct bench *b, uint64_t size)
{
	return bench_op_paged(b->o->op) ? b->n_pages * b->page_len : size;
}

/* One job, waited for; its failure message goes to `msg`. */
int bench_one_job(struct bench *b, enum rdmax_op op, uint64_t size, char *msg, size_t msg_len)
{
	struct rdmax_job j;
	int ret;

	fill_job(b, &j, op, size);
	j.flags = 0;
	j.imm = 0;
	ret = rdmax_submit(b->c, &j, 1);
	if (ret < 0) {
		snprintf(msg, msg_len, "the client library refused it (rdmax_submit: %s)",
			 rdmax_strerror(ret));
		return ret;
	}
	for (;;) {
		int n = rdmax_poll_events(b->c, b->events, EVENTS_MAX, WAIT_MS);
		if (n <= 0) {
			snprintf(msg, msg_len, "no completion: %s",
				 rdmax_strerror(n == 0 ? RDMAX_E_TIMEOUT : n));
			return n == 0 ? RDMAX_E_TIMEOUT : n;
		}
		for (int k = 0; k < n; k++) {
			struct rdmax_event *e = &b->events[k];
			if (e->type == RDMAX_EVENT_COMPLETION && e->job_id == j.id) {
				if (e->status != 0) {
					snprintf(msg, msg_len, "the daemon answered %s: %s",
						 rdmax_strerror(e->status), e->reason);
				}
				return e->status;
			}
		}
	}
}

/*
 * `count` jobs (or until `until_ns` when count is 0) with at most `window`
 * outstanding and up to `batch` per submit. Latencies land in b->t[0..jobs).
 */
int bench_run_jobs(struct bench *b, enum rdmax_op op, uint64_t size, uint64_t count,
		   uint64_t until_ns, uint64_t *ret_jobs, uint64_t *ret_t1)
{
	struct opts *o = b->o;
	uint64_t issued = 0, done = 0, inflight = 0, t_last = bench_now_ns();
	uint64_t base = b->next_id;
	bool stop_issuing = false;
	int ret;

	if (count) {
		ret = ensure_t(b, count);
		if (ret < 0) {
			return ret;
		}
	}
	for (;;) {
		while (!stop_issuing) {
			uint64_t k = o->batch;
			if (count) {
				k = MIN_U64(k, count - issued);
			} else if (bench_now_ns() >= until_ns) {
				k = 0;
			}
			if (k == 0) {
				stop_issuing = true;
				break;
			}
			if (inflight + k > o->window) {
				break;
			}
			ret = ensure_t(b, issued + k);
			if (ret < 0) {
				return ret;
			}
			for (uint64_t i = 0; i < k; i++) {
				fill_job(b, &b->jobs[i], op, size);
			}
			uint64_t t = bench_now_ns();
			ret = rdmax_submit(b->c, b->jobs, k);
			if (ret < 0) {
				b->next_id -= k;
				fprintf(stderr,
					"rdmax-bench: rdmax_submit() of %" PRIu64 " %s jobs: %s\n",
					k, o->op_name, rdmax_strerror(ret));
				return ret;
			}
			for (uint64_t i = 0; i < k; i++) {
				b->t[issued + i] = t;
			}
			issued += k;
			inflight += k;
		}
		if (stop_issuing && inflight == 0) {
			break;
		}
		int n = rdmax_poll_events(b->c, b->events, EVENTS_MAX, WAIT_MS);
		uint64_t t = bench_now_ns();
		if (n <= 0) {
			fprintf(stderr,
				"rdmax-bench: waiting for completions (%" PRIu64
				" in flight): %s\n",
				inflight, rdmax_strerror(n == 0 ? RDMAX_E_TIMEOUT : n));
			return n == 0 ? RDMAX_E_TIMEOUT : n;
		}
		for (int i = 0; i < n; i++) {
			struct rdmax_event *e = &b->events[i];
			if (e->type != RDMAX_EVENT_COMPLETION) {
				continue;
			}
			if (e->job_id < base || e->job_id - base >= issued) {
				continue; /* not ours: left over from an earlier phase */
			}
			if (e->status != 0) {
				fprintf(stderr,
					"rdmax-bench: %s job of %" PRIu64 " bytes failed: %s: %s\n",
					o->op_name, size, rdmax_strerror(e->status), e->reason);
				return e->status;
			}
			uint64_t seq = e->job_id - base;
			b->t[seq] = t - b->t[seq];
			inflight--;
			done++;
		}
		t_last = t;
	}
	*ret_jobs = done;
	*ret_t1 = t_last;
	return 0;
}
