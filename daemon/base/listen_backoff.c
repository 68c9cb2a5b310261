/* SPDX-License-Identifier: MIT */
/*
 * Pauses a listener's poll handle while accept() runs out of resources and
 * restarts it from a timer. Owns only the timer; the listener, its poll
 * handle and the logging of the failure stay with the caller.
 */
#include <errno.h>

#include "listen_backoff.h"
#include "util.h"

static void on_backoff_timer(uv_timer_t *timer)
{
	struct listen_backoff *b = timer->data;

	/* Fails only for a listener being closed, which needs no restart. */
	(void)uv_poll_start(b->poll, UV_READABLE, b->cb);
}

int listen_backoff_init(struct listen_backoff *b, uv_loop_t *loop, uv_poll_t *poll, uv_poll_cb cb)
{
	int err = uv_timer_init(loop, &b->timer);

	if (err < 0) {
		return err;
	}
	b->timer.data = b;
	b->poll = poll;
	b->cb = cb;
	b->delay_ms = 0;
	b->pauses = 0;
	return 0;
}

bool listen_backoff_failed(struct listen_backoff *b, int err)
{
	if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) {
		return false;
	}
	b->delay_ms = b->delay_ms ? MIN(b->delay_ms * 2, (uint32_t)LISTEN_BACKOFF_MAX_MS)
				  : LISTEN_BACKOFF_MIN_MS;
	b->pauses++;
	uv_poll_stop(b->poll);
	uv_timer_start(&b->timer, on_backoff_timer, b->delay_ms, 0);
	return true;
}

void listen_backoff_close(struct listen_backoff *b, uv_close_cb cb)
{
	uv_timer_stop(&b->timer);
	uv_close((uv_handle_t *)&b->timer, cb);
}
