/* SPDX-License-Identifier: MIT */
/* Wake-ups of the loop from other threads (loop_wake.h says why not uv_async_t). */
#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "loop_wake.h"
#include "util.h"

static void on_readable(uv_poll_t *poll, int status, int events)
{
	struct loop_wake *w = container_of(poll, struct loop_wake, poll);
	uint64_t n;

	(void)status;
	(void)events;
	/*
	 * Read the count, then clear the flag, then call back: a send after the
	 * clear writes the fd again, and what a send before it published is
	 * there for the callback to take.
	 */
	while (read(w->fd, &n, sizeof(n)) < 0 && errno == EINTR) {
	}
	atomic_store(&w->pending, false);
	w->cb(w);
}

int loop_wake_init(uv_loop_t *loop, struct loop_wake *w, loop_wake_cb cb)
{
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	if (fd < 0) {
		return -errno;
	}
	int err = uv_poll_init(loop, &w->poll, fd);
	if (err < 0) {
		close(fd);
		return err;
	}
	w->fd = fd;
	w->cb = cb;
	atomic_init(&w->pending, false);
	uv_poll_start(&w->poll, UV_READABLE, on_readable);
	return 0;
}

void loop_wake_send(struct loop_wake *w)
{
	static const uint64_t one = 1;

	if (atomic_exchange(&w->pending, true)) {
		return; /* the loop has yet to clear it: it will look */
	}
	/* Cannot block: the count stays far below its limit, read back on each wake-up. */
	while (write(w->fd, &one, sizeof(one)) < 0 && errno == EINTR) {
	}
}

void loop_wake_close(struct loop_wake *w, uv_close_cb closed)
{
	uv_close((uv_handle_t *)&w->poll, closed);
	/* uv_close() took the fd out of the loop's epoll set. */
	close(w->fd);
	w->fd = -1;
}
