/* SPDX-License-Identifier: MIT */
#include "cpu_affinity.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/*
 * The lists and the CPUs the daemon started with (allowed, read at start-up:
 * allowed_read). Written at start-up before any worker exists, and on
 * reload under g_workers.lock, which a worker holds while it reads them.
 */
static struct {
	bool loop_set, workers_set, allowed_read;
	cpu_set_t allowed, loop, workers;
} g_aff;

/* Worker threads alive (kernel thread ids), for a reload to move. */
#define WORKERS_MAX 256
static struct {
	pthread_mutex_t lock;
	pid_t tids[WORKERS_MAX];
	unsigned n;
} g_workers = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A decimal CPU number at *p, advanced past it. \return 0 or -EINVAL / -ERANGE */
static int parse_cpu(const char **p, unsigned *ret, const char **ret_why)
{
	unsigned long v = 0;
	const char *s = *p;

	if (*s < '0' || *s > '9') {
		*ret_why = "expected a CPU number";
		return -EINVAL;
	}
	for (; *s >= '0' && *s <= '9'; s++) {
		v = v * 10 + (unsigned long)(*s - '0');
		if (v >= CPU_SETSIZE) {
			*ret_why = "CPU number too large";
			return -ERANGE;
		}
	}
	*p = s;
	*ret = (unsigned)v;
	return 0;
}

int cpu_list_parse(const char *text, cpu_set_t *set, const char **ret_why)
{
	const char *p = text;

	CPU_ZERO(set);
	if (*p == '\0') {
		return 0;
	}
	for (;;) {
		unsigned lo, hi;
		int r = parse_cpu(&p, &lo, ret_why);
		if (r < 0) {
			return r;
		}
		hi = lo;
		if (*p == '-') {
			p++;
			r = parse_cpu(&p, &hi, ret_why);
			if (r < 0) {
				return r;
			}
			if (hi < lo) {
				*ret_why = "a range must not go downwards";
				return -EINVAL;
			}
		}
		for (unsigned c = lo; c <= hi; c++) {
			CPU_SET(c, set);
		}
		if (*p == '\0') {
			return 0;
		}
		if (*p != ',') {
			*ret_why = "expected a CPU list such as 0-3,6";
			return -EINVAL;
		}
		p++;
	}
}

void cpu_list_format(const cpu_set_t *set, char *buf, size_t size)
{
	size_t len = 0;

	if (size == 0) {
		return;
	}
	buf[0] = '\0';
	for (unsigned c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, set)) {
			continue;
		}
		unsigned hi = c;
		while (hi + 1 < CPU_SETSIZE && CPU_ISSET(hi + 1, set)) {
			hi++;
		}
		int n = hi == c ? snprintf(buf + len, size - len, "%s%u", len ? "," : "", c)
				: snprintf(buf + len, size - len, "%s%u-%u", len ? "," : "", c, hi);
		if (n < 0 || (size_t)n >= size - len) {
			return; /* truncated */
		}
		len += (size_t)n;
		c = hi;
	}
}

/* Parse one key's list into set; *ret_set whether it pins. \return 0 or -EINVAL with err */
static int take_list(const char *key, const char *text, cpu_set_t *set, bool *ret_set, char *err,
		     size_t err_size)
{
	const char *why = NULL;
	cpu_set_t outside;
	char list[64];

	if (cpu_list_parse(text, set, &why) < 0) {
		snprintf(err, err_size, "engine.%s = '%s': %s", key, text, why);
		return -EINVAL;
	}
	*ret_set = CPU_COUNT(set) > 0;
	CPU_AND(&outside, set, &g_aff.allowed);
	CPU_XOR(&outside, &outside, set);
	if (CPU_COUNT(&outside) > 0) {
		cpu_list_format(&g_aff.allowed, list, sizeof(list));
		for (unsigned c = 0; c < CPU_SETSIZE; c++) {
			if (CPU_ISSET(c, &outside)) {
				snprintf(err, err_size,
					 "engine.%s: CPU %u is not one this daemon may run on "
					 "(allowed: %s)",
					 key, c, list);
				break;
			}
		}
		return -EINVAL;
	}
	return 0;
}

/* The CPUs the daemon started with, once (the loop thread, before it is pinned). */
static int read_allowed(char *err, size_t err_size)
{
	if (g_aff.allowed_read) {
		return 0;
	}
	if (sched_getaffinity(0, sizeof(g_aff.allowed), &g_aff.allowed) < 0) {
		int e = errno;
		snprintf(err, err_size, "cannot read the daemon's CPUs: %s", strerror(e));
		return -e;
	}
	g_aff.allowed_read = true;
	return 0;
}

int cpu_affinity_configure(const char *loop_cpus, const char *worker_cpus, char *err,
			   size_t err_size)
{
	cpu_affinity_reset();
	/* Unpinned, a failure to read is no error: a reload that pins reads again. */
	int ret = read_allowed(err, err_size);
	if (*loop_cpus == '\0' && *worker_cpus == '\0') {
		return 0;
	}
	if (ret < 0) {
		return ret;
	}
	if (take_list("loop_cpus", loop_cpus, &g_aff.loop, &g_aff.loop_set, err, err_size) < 0 ||
	    take_list("worker_cpus", worker_cpus, &g_aff.workers, &g_aff.workers_set, err,
		      err_size) < 0) {
		cpu_affinity_reset();
		return -EINVAL;
	}
	return 0;
}

static int pin_thread(pid_t tid, const cpu_set_t *set)
{
	return sched_setaffinity(tid, sizeof(*set), set) < 0 ? -errno : 0;
}

static int pin_self(const cpu_set_t *set)
{
	return pin_thread(0, set);
}

/* A worker's CPUs: worker_cpus, else (the loop pinned, or on reload) all it started with. */
static const cpu_set_t *worker_set(void)
{
	return g_aff.workers_set ? &g_aff.workers : &g_aff.allowed;
}

int cpu_affinity_pin_loop(void)
{
	return g_aff.loop_set ? pin_self(&g_aff.loop) : 0;
}

int cpu_affinity_lend_loop(void)
{
	return g_aff.loop_set ? pin_self(worker_set()) : 0;
}

int cpu_affinity_pin_worker(void)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);
	int ret = 0;

	pthread_mutex_lock(&g_workers.lock);
	if (g_aff.loop_set || g_aff.workers_set) {
		ret = pin_self(worker_set());
	}
	if (g_workers.n < WORKERS_MAX) {
		g_workers.tids[g_workers.n++] = tid;
	}
	pthread_mutex_unlock(&g_workers.lock);
	return ret;
}

void cpu_affinity_worker_exit(void)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);

	pthread_mutex_lock(&g_workers.lock);
	for (unsigned i = 0; i < g_workers.n; i++) {
		if (g_workers.tids[i] == tid) {
			g_workers.tids[i] = g_workers.tids[--g_workers.n];
			break;
		}
	}
	pthread_mutex_unlock(&g_workers.lock);
}

int cpu_affinity_reconfigure(const char *loop_cpus, const char *worker_cpus, char *err,
			     size_t err_size)
{
	cpu_set_t loop, workers;
	bool loop_set, workers_set;
	int ret = read_allowed(err, err_size);

	if (ret < 0) {
		return ret;
	}
	if (take_list("loop_cpus", loop_cpus, &loop, &loop_set, err, err_size) < 0 ||
	    take_list("worker_cpus", worker_cpus, &workers, &workers_set, err, err_size) < 0) {
		return -EINVAL;
	}
	ret = pin_self(loop_set ? &loop : &g_aff.allowed);
	if (ret < 0) {
		snprintf(err, err_size, "cannot move the loop: %s", strerror(-ret));
		return ret;
	}
	pthread_mutex_lock(&g_workers.lock);
	g_aff.loop = loop;
	g_aff.loop_set = loop_set;
	g_aff.workers = workers;
	g_aff.workers_set = workers_set;
	for (unsigned i = 0; i < g_workers.n; i++) {
		int r = pin_thread(g_workers.tids[i], worker_set());
		if (r < 0 && ret++ == 0) {
			snprintf(err, err_size, "cannot move worker thread %d: %s",
				 (int)g_workers.tids[i], strerror(-r));
		}
	}
	pthread_mutex_unlock(&g_workers.lock);
	return ret;
}

bool cpu_affinity_loop_isolated(void)
{
	cpu_set_t both;

	if (!g_aff.loop_set || !g_aff.workers_set) {
		return false;
	}
	CPU_AND(&both, &g_aff.loop, &g_aff.workers);
	return CPU_COUNT(&both) == 0;
}

void cpu_affinity_reset(void)
{
	pthread_mutex_lock(&g_workers.lock);
	memset(&g_aff, 0, sizeof(g_aff));
	pthread_mutex_unlock(&g_workers.lock);
}
