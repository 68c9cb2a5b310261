/* SPDX-License-Identifier: MIT */
/*
 * Which CPUs the daemon's threads run on ([engine] loop_cpus, worker_cpus).
 * The loop serves clients, small frames and latency-class connections; the
 * workers (the TCP transport's I/O threads, the verbs posting thread) move
 * bulk bytes. Kept on CPUs of their own, a latency job's hand-offs between
 * clients and loops never wait behind a bulk copy the kernel does not
 * preempt (docs/benchmarks.md, "A CPU of its own for the loops").
 *
 * cpu_affinity_configure() runs once at start-up, before any worker thread
 * exists; a worker calls cpu_affinity_pin_worker() first thing (and
 * cpu_affinity_worker_exit() last), and the loop thread
 * cpu_affinity_pin_loop() once its threads are started. Unconfigured (unit
 * tests, empty lists) both calls change nothing. On reload the loop thread
 * calls cpu_affinity_reconfigure(), which moves itself and every worker.
 */
#ifndef RDMAXD_CPU_AFFINITY_H
#define RDMAXD_CPU_AFFINITY_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * Parse a CPU list ("0", "0-3,6"; blanks not allowed; "" is the empty set)
 * into set. \return 0, or -EINVAL / -ERANGE with *ret_why saying what is wrong
 */
int cpu_list_parse(const char *text, cpu_set_t *set, const char **ret_why);

/* Write set as a CPU list ("0-3,6") into buf (truncated to size). */
void cpu_list_format(const cpu_set_t *set, char *buf, size_t size);

/*
 * Take the two lists (either may be empty: not pinned) and the CPUs this
 * process may run on now. \return 0, or -EINVAL with err naming the key and
 * the CPU that this process may not use
 */
int cpu_affinity_configure(const char *loop_cpus, const char *worker_cpus, char *err,
			   size_t err_size);

/* Pin the calling thread (the loop) to loop_cpus, if given. \return 0 or a negative errno */
int cpu_affinity_pin_loop(void);

/*
 * Pin the calling thread (a worker) to worker_cpus, or, without them, to all
 * the CPUs the process started with, so that it does not inherit the loop's
 * CPUs; and list it for cpu_affinity_reconfigure(). \return 0 or a negative
 * errno (the thread is listed either way)
 */
int cpu_affinity_pin_worker(void);

/*
 * The loop is about to call a library that may start a thread of its own
 * (libcurl's resolver threads): move the calling thread (the loop) to the
 * workers' CPUs, as cpu_affinity_pin_worker() would place a worker, so that a
 * thread started now inherits those instead of loop_cpus. The loop takes its
 * own back with cpu_affinity_pin_loop() once the call returned. Without
 * loop_cpus nothing changes. \return 0 or a negative errno
 */
int cpu_affinity_lend_loop(void);

/* The calling worker ends: take it off the list (before it returns). */
void cpu_affinity_worker_exit(void);

/*
 * New lists (reload), checked as at start-up against the CPUs the daemon
 * started with: the calling thread (the loop) and every listed worker move
 * to them; an empty list gives its threads back every CPU the daemon started
 * with. \return 0; a negative errno with err saying why, nothing changed
 * (lists refused, or the loop could not move); or how many workers could not
 * be moved (the lists apply to the others), err naming the first
 */
int cpu_affinity_reconfigure(const char *loop_cpus, const char *worker_cpus, char *err,
			     size_t err_size);

/*
 * Whether the loop has CPUs no worker may use (both lists given, disjoint):
 * then its spin takes nothing from a copy, and it need not sleep while
 * copies run (main.c, offloading()).
 */
bool cpu_affinity_loop_isolated(void);

/* Forget the configuration (tests). */
void cpu_affinity_reset(void);

#endif
