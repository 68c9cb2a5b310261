/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport's posting thread: post lists of bulk connections
 * handed off the loop, for devices whose post call does the NIC's work.
 *
 * On a software device (rxe, siw) ibv_post_send() runs the QP's protocol
 * processing inside the posting process's system call: under a bulk load
 * one call takes milliseconds, at times hundreds of them, and meanwhile the
 * daemon's one loop takes no job, posts no latency-class WR and delivers no
 * completion (docs/benchmarks.md, "Traffic classes"). The loop hands such
 * post lists to this thread instead and goes on.
 *
 * The thread only posts. Each post list is copied when it is handed over
 * (the transport's scratch WRs are reused by the next post), posted in the
 * order handed over, and its failure comes back to the loop through a
 * wake-up (loop_wake.h): the owner's failed() callback runs there. After a
 * QP's first failure its later lists are dropped unposted, but drain
 * markers, so that no WR posted after a failed one can complete and
 * confirm the failed one (RC completes in order); markers still go, to end
 * the drain. Before the
 * owner fails a QP's WRs without their completions, or destroys the QP, it
 * settles it (post_thread_settle()): lists not yet posted are withdrawn and
 * the one being posted is waited for, so no WR of a finished job reaches the
 * device afterwards.
 */
#ifndef RDMAXD_POST_THREAD_H
#define RDMAXD_POST_THREAD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include <infiniband/verbs.h>

#include "util.h"

struct post_thread;

/* One QP's share of the thread, embedded in its owner; zeroed before first use. */
struct post_qp {
	struct post_thread *pt; /* set on first hand-off; NULL: never handed over */
	void *qp;               /* what post() is given */
	void *owner;            /* what failed() is given */
	/* Under the thread's lock: */
	uint32_t pending; /* lists handed over and not yet posted, dropped or withdrawn */
	bool failed;      /* a post failed: later lists but markers are dropped */
	int data_err;     /* failures not yet reported, 0 when none */
	int marker_err;
	bool reporting; /* in pt->reports */
	struct list_node report_node;
};

/* Posts a list (the transport's ibv_post_send()); 0 or a negative errno. */
typedef int (*post_thread_post_fn)(void *qp, struct ibv_send_wr *wrs);
/*
 * A post failed, on the loop. marker: the list was a drain marker (the QP's
 * WRs will not be ended by it). The owner may settle and free q's owner here.
 */
typedef void (*post_thread_failed_fn)(void *arg, void *owner, bool marker, int err);

int post_thread_create(uv_loop_t *loop, post_thread_post_fn post, post_thread_failed_fn failed,
		       void *arg, struct post_thread **ret_pt);

/*
 * Stop the thread once every QP is settled, and close its loop handle;
 * closed(arg) runs when it is closed and the thread's memory freed.
 */
void post_thread_stop(struct post_thread *pt, void (*closed)(void *arg));

/*
 * Hand a post list (linked by next, its SGEs included) to the thread for
 * q->qp: copied, posted after every list handed over before it.
 * \return 0, or -ENOMEM (nothing handed over)
 */
int post_thread_submit(struct post_thread *pt, struct post_qp *q, const struct ibv_send_wr *wrs,
		       bool marker);

/* Lists of q are handed over and not yet done: q's next post must go the same way. */
bool post_qp_busy(struct post_qp *q);

/*
 * Withdraw q's lists not yet posted and wait for the one being posted (at
 * most one post call); its unreported failures are forgotten. Afterwards no
 * WR of q reaches the device through the thread. A no-op for a q never used.
 * \return the number of lists withdrawn
 */
uint32_t post_qp_settle(struct post_qp *q);

/* A settle that waits longer than this for the post call logs it (and its end). */
#define POST_THREAD_SETTLE_WARN_MS 1000

/* Set that threshold (tests); at least 1 ms. */
void post_thread_set_settle_warn_ms(struct post_thread *pt, uint32_t ms);

/* How many settles waited longer than the threshold. */
uint64_t post_thread_slow_settles(struct post_thread *pt);

#endif /* RDMAXD_POST_THREAD_H */
