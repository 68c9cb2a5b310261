/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport's posting thread (post_thread.h says why and what it
 * guarantees). One thread, one queue: lists are posted in the order handed
 * over, whatever their QP, as the loop posted them before.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_affinity.h"
#include "log.h"
#include "loop_wake.h"
#include "post_thread.h"

/* One post list as handed over: its WRs, then their SGEs. */
struct post_list {
	struct list_node node; /* in pt->queue */
	struct post_qp *q;
	bool marker;
	struct ibv_send_wr *wrs; /* into the same allocation */
};

struct post_thread {
	struct loop_wake wake; /* a failure to report */
	post_thread_post_fn post;
	post_thread_failed_fn failed;
	void *arg;
	void (*closed)(void *arg);
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t work; /* a list was queued, or stop */
	pthread_cond_t done; /* a list left the thread's hands */
	struct list_node queue;
	struct list_node reports; /* struct post_qp with a failure to report */
	struct post_qp *current;  /* whose list is being posted; NULL when none */
	bool stop;
	uint32_t settle_warn_ms; /* a settle waiting longer says so in the log */
	uint64_t slow_settles;   /* settles that waited longer than that */
};

/* Copy a post list into one allocation, its next and sg_list pointers into the copy. */
static struct post_list *list_copy(const struct ibv_send_wr *wrs)
{
	size_t n = 0, n_sge = 0;

	for (const struct ibv_send_wr *w = wrs; w; w = w->next) {
		n++;
		n_sge += (size_t)MAX(w->num_sge, 0);
	}
	struct post_list *l = malloc(sizeof(*l) + n * sizeof(struct ibv_send_wr) +
				     n_sge * sizeof(struct ibv_sge));
	if (!l) {
		return NULL;
	}
	l->wrs = (struct ibv_send_wr *)(l + 1);
	struct ibv_sge *sge = (struct ibv_sge *)(l->wrs + n);
	size_t i = 0;
	for (const struct ibv_send_wr *w = wrs; w; w = w->next, i++) {
		struct ibv_send_wr *c = &l->wrs[i];
		*c = *w;
		c->next = i + 1 < n ? &l->wrs[i + 1] : NULL;
		if (w->num_sge > 0) {
			memcpy(sge, w->sg_list, (size_t)w->num_sge * sizeof(*sge));
			c->sg_list = sge;
			sge += w->num_sge;
		} else {
			c->sg_list = NULL;
		}
	}
	return l;
}

static void *post_main(void *arg)
{
	struct post_thread *pt = arg;
	int pinned = cpu_affinity_pin_worker();

	if (pinned < 0) {
		log_warn("verbs posting thread: cannot pin to engine.worker_cpus: %s",
			 strerror(-pinned));
	}
	pthread_mutex_lock(&pt->lock);
	for (;;) {
		while (!pt->stop && list_empty(&pt->queue)) {
			pthread_cond_wait(&pt->work, &pt->lock);
		}
		if (list_empty(&pt->queue)) {
			break;
		}
		struct post_list *l = container_of(pt->queue.next, struct post_list, node);
		struct post_qp *q = l->q;
		list_del(&l->node);
		int err = 0;
		if (!q->failed || l->marker) {
			pt->current = q;
			pthread_mutex_unlock(&pt->lock);
			err = pt->post(q->qp, l->wrs);
			pthread_mutex_lock(&pt->lock);
			pt->current = NULL;
		}
		bool marker = l->marker;
		free(l);
		q->pending--;
		if (err < 0) {
			q->failed = true;
			*(marker ? &q->marker_err : &q->data_err) = err;
			if (!q->reporting) {
				q->reporting = true;
				list_add_tail(&pt->reports, &q->report_node);
			}
		}
		pthread_cond_broadcast(&pt->done);
		if (err < 0) {
			/* Not under the lock: the loop this wakes takes it first thing. */
			pthread_mutex_unlock(&pt->lock);
			loop_wake_send(&pt->wake);
			pthread_mutex_lock(&pt->lock);
		}
	}
	pthread_mutex_unlock(&pt->lock);
	cpu_affinity_worker_exit();
	return NULL;
}

/* On the loop: each QP's failure once; the marker's, when both, as it ends the drain. */
static void on_wake(struct loop_wake *wake)
{
	struct post_thread *pt = wake->poll.data;

	for (;;) {
		pthread_mutex_lock(&pt->lock);
		if (list_empty(&pt->reports)) {
			pthread_mutex_unlock(&pt->lock);
			return;
		}
		struct post_qp *q = container_of(pt->reports.next, struct post_qp, report_node);
		list_del(&q->report_node);
		q->reporting = false;
		bool marker = q->marker_err != 0;
		int err = marker ? q->marker_err : q->data_err;
		q->marker_err = q->data_err = 0;
		void *owner = q->owner;
		pthread_mutex_unlock(&pt->lock);
		/* The callback may settle and free q, or another QP still in the list. */
		pt->failed(pt->arg, owner, marker, err);
	}
}

static void on_closed(uv_handle_t *handle)
{
	struct post_thread *pt = handle->data;
	void (*closed)(void *arg) = pt->closed;
	void *arg = pt->arg;

	pthread_cond_destroy(&pt->done);
	pthread_cond_destroy(&pt->work);
	pthread_mutex_destroy(&pt->lock);
	free(pt);
	if (closed) {
		closed(arg);
	}
}

int post_thread_create(uv_loop_t *loop, post_thread_post_fn post, post_thread_failed_fn failed,
		       void *arg, struct post_thread **ret_pt)
{
	struct post_thread *pt = calloc(1, sizeof(*pt));
	int err;

	if (!pt) {
		return -ENOMEM;
	}
	pt->post = post;
	pt->failed = failed;
	pt->arg = arg;
	pt->settle_warn_ms = POST_THREAD_SETTLE_WARN_MS;
	list_init(&pt->queue);
	list_init(&pt->reports);
	pthread_mutex_init(&pt->lock, NULL);
	pthread_cond_init(&pt->work, NULL);
	/* A settle's wait is timed on the monotonic clock (settle_wait()). */
	pthread_condattr_t attr;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&pt->done, &attr);
	pthread_condattr_destroy(&attr);
	err = loop_wake_init(loop, &pt->wake, on_wake);
	if (err < 0) {
		pthread_cond_destroy(&pt->done);
		pthread_cond_destroy(&pt->work);
		pthread_mutex_destroy(&pt->lock);
		free(pt);
		return err;
	}
	pt->wake.poll.data = pt;
	err = -pthread_create(&pt->thread, NULL, post_main, pt);
	if (err < 0) {
		/* The handle goes with the loop's next turn, and pt with it (on_closed). */
		loop_wake_close(&pt->wake, on_closed);
		return err;
	}
	*ret_pt = pt;
	return 0;
}

void post_thread_stop(struct post_thread *pt, void (*closed)(void *arg))
{
	pthread_mutex_lock(&pt->lock);
	pt->stop = true;
	pthread_cond_signal(&pt->work);
	pthread_mutex_unlock(&pt->lock);
	pthread_join(pt->thread, NULL);
	pt->closed = closed;
	loop_wake_close(&pt->wake, on_closed);
}

int post_thread_submit(struct post_thread *pt, struct post_qp *q, const struct ibv_send_wr *wrs,
		       bool marker)
{
	struct post_list *l = list_copy(wrs);

	if (!l) {
		return -ENOMEM;
	}
	l->q = q;
	l->marker = marker;
	pthread_mutex_lock(&pt->lock);
	if (!q->pt) {
		q->pt = pt;
		list_init(&q->report_node);
	}
	q->pending++;
	list_add_tail(&pt->queue, &l->node);
	pthread_cond_signal(&pt->work);
	pthread_mutex_unlock(&pt->lock);
	return 0;
}

bool post_qp_busy(struct post_qp *q)
{
	struct post_thread *pt = q->pt;

	if (!pt) {
		return false;
	}
	pthread_mutex_lock(&pt->lock);
	bool busy = q->pending > 0;
	pthread_mutex_unlock(&pt->lock);
	return busy;
}

/*
 * Wait, under pt->lock, until the thread's post call for q returns. On a
 * software device that call does the QP's protocol work and may take long
 * (post_thread.h); the loop waits in the meantime, so a wait longer than
 * settle_warn_ms is logged, and its end too.
 */
static void settle_wait(struct post_thread *pt, struct post_qp *q)
{
	if (pt->current != q) {
		return;
	}
	uint64_t start = now_ms();
	bool warned = false;

	while (pt->current == q) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += pt->settle_warn_ms / 1000;
		ts.tv_nsec += (long)(pt->settle_warn_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (pthread_cond_timedwait(&pt->done, &pt->lock, &ts) == ETIMEDOUT &&
		    pt->current == q && !warned) {
			warned = true;
			pt->slow_settles++;
			log_warn(
				"verbs posting thread: a post call on a queue pair being closed "
				"has not returned after %" PRIu64 " ms; the event loop waits for "
				"it, since WRs of failed jobs must not reach the device afterwards",
				now_ms() - start);
		}
	}
	if (warned) {
		log_warn("verbs posting thread: that post call returned after %" PRIu64 " ms",
			 now_ms() - start);
	}
}

void post_thread_set_settle_warn_ms(struct post_thread *pt, uint32_t ms)
{
	pthread_mutex_lock(&pt->lock);
	pt->settle_warn_ms = MAX(ms, 1u);
	pthread_mutex_unlock(&pt->lock);
}

uint64_t post_thread_slow_settles(struct post_thread *pt)
{
	pthread_mutex_lock(&pt->lock);
	uint64_t n = pt->slow_settles;
	pthread_mutex_unlock(&pt->lock);
	return n;
}

uint32_t post_qp_settle(struct post_qp *q)
{
	struct post_thread *pt = q->pt;
	struct list_node *pos, *tmp;
	uint32_t withdrawn = 0;

	if (!pt) {
		return 0;
	}
	pthread_mutex_lock(&pt->lock);
	list_for_each_safe(pos, tmp, &pt->queue)
	{
		struct post_list *l = container_of(pos, struct post_list, node);
		if (l->q == q) {
			list_del(&l->node);
			free(l);
			q->pending--;
			withdrawn++;
		}
	}
	settle_wait(pt, q);
	if (q->reporting) {
		list_del(&q->report_node);
		q->reporting = false;
	}
	q->data_err = q->marker_err = 0;
	pthread_mutex_unlock(&pt->lock);
	return withdrawn;
}
