/* SPDX-License-Identifier: MIT */
/*
 * Back-off for a listening socket whose accept() fails for want of
 * resources (EMFILE, ENFILE, ENOBUFS, ENOMEM). The pending connection stays
 * in the backlog, so the listener stays readable: polling it again at once
 * spins the loop at a full core. Instead accepting pauses for a delay that
 * doubles up to LISTEN_BACKOFF_MAX_MS while the failures last.
 */
#ifndef RDMAXD_LISTEN_BACKOFF_H
#define RDMAXD_LISTEN_BACKOFF_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define LISTEN_BACKOFF_MIN_MS 10
#define LISTEN_BACKOFF_MAX_MS 1000

struct listen_backoff {
	uv_timer_t timer;
	uv_poll_t *poll;   /* the listener's poll handle, restarted by the timer */
	uv_poll_cb cb;     /* its callback */
	uint32_t delay_ms; /* current pause; 0 while accepting works */
	uint64_t pauses;   /* how often accepting was paused, for tests and logs */
};

/*
 * Prepare for the listener watched by poll (readable, callback cb).
 * \return 0 or a negative libuv error
 */
int listen_backoff_init(struct listen_backoff *b, uv_loop_t *loop, uv_poll_t *poll, uv_poll_cb cb);

/*
 * After accept() failed with err (an errno value): true when it is a
 * shortage of resources and accepting was paused (the caller stops its
 * accept loop), false for any other error.
 */
bool listen_backoff_failed(struct listen_backoff *b, int err);

/* After a successful accept(): the next shortage starts with the shortest pause. */
static inline void listen_backoff_ok(struct listen_backoff *b)
{
	b->delay_ms = 0;
}

/* Close the timer; cb (may be NULL) runs from its close callback with the timer as handle. */
void listen_backoff_close(struct listen_backoff *b, uv_close_cb cb);

#endif
