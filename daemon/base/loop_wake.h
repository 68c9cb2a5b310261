/* SPDX-License-Identifier: MIT */
/*
 * A wake-up of the loop from another thread that never makes the loop wait
 * for that thread. libuv's uv_async_t cannot promise this: its callback
 * first spins (pause, then sched_yield()) until no thread is inside
 * uv_async_send(), and a sender preempted by the loop it just woke, before
 * it left that call, holds the loop there. A loop that yields to it then
 * waits behind the sender's next system call, for an I/O thread a bulk
 * copy of up to a MiB; a loop at a real-time priority never lets it run at
 * all (docs/benchmarks.md, "The loop's wake-ups by its threads"). Here a
 * sender writes an eventfd only when no wake-up is pending, and the loop
 * reads it, clears the flag and then calls back: nothing a sender does
 * between its two steps is waited for.
 */
#ifndef RDMAXD_LOOP_WAKE_H
#define RDMAXD_LOOP_WAKE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <uv.h>

struct loop_wake;
typedef void (*loop_wake_cb)(struct loop_wake *w);

struct loop_wake {
	uv_poll_t poll; /* the eventfd; poll.data is the owner's */
	int fd;         /* -1 once closed */
	atomic_bool pending;
	loop_wake_cb cb;
};

/*
 * Watch a new eventfd on loop; cb runs on the loop after loop_wake_send().
 * \return 0 or a negative errno / libuv error
 */
int loop_wake_init(uv_loop_t *loop, struct loop_wake *w, loop_wake_cb cb);

/*
 * From any thread: cb runs on the loop after this call, at least once
 * (several sends before it runs may fold into one call). Never blocks.
 */
void loop_wake_send(struct loop_wake *w);

/* On the loop: stop watching and close; closed(&w->poll) runs as uv_close's callback. */
void loop_wake_close(struct loop_wake *w, uv_close_cb closed);

#endif
