/* SPDX-License-Identifier: MIT */
/*
 * [engine] loop_cpus and worker_cpus (cpu_affinity.h): CPU lists, the check
 * against the CPUs the process may use, and where the loop and the workers
 * end up. Pinning happens on helper threads, so the runner keeps its CPUs.
 */
#include <arpa/inet.h>
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include "cpu_affinity.h"
#include "etcd.h"

Suite *cpu_affinity_suite(void);

static void parse_ok(const char *text, const char *formatted)
{
	const char *why = NULL;
	cpu_set_t set;
	char buf[128];

	ck_assert_msg(cpu_list_parse(text, &set, &why) == 0, "'%s': %s", text, why);
	cpu_list_format(&set, buf, sizeof(buf));
	ck_assert_str_eq(buf, formatted);
}

static void parse_bad(const char *text, int err, const char *why_expected)
{
	const char *why = NULL;
	cpu_set_t set;

	ck_assert_int_eq(cpu_list_parse(text, &set, &why), err);
	ck_assert_str_eq(why, why_expected);
}

START_TEST(cpu_lists_parse_and_format)
{
	parse_ok("", "");
	parse_ok("0", "0");
	parse_ok("0-3,6", "0-3,6");
	parse_ok("6,0-3", "0-3,6");
	parse_ok("1,2,3", "1-3");
	parse_ok("2-2", "2");
	parse_ok("1023", "1023");
	parse_bad("x", -EINVAL, "expected a CPU number");
	parse_bad(" 1", -EINVAL, "expected a CPU number");
	parse_bad("1 ", -EINVAL, "expected a CPU list such as 0-3,6");
	parse_bad("1,", -EINVAL, "expected a CPU number");
	parse_bad("1,,2", -EINVAL, "expected a CPU number");
	parse_bad("1-", -EINVAL, "expected a CPU number");
	parse_bad("-1", -EINVAL, "expected a CPU number");
	parse_bad("3-1", -EINVAL, "a range must not go downwards");
	parse_bad("1024", -ERANGE, "CPU number too large");
	parse_bad("99999999999999999999", -ERANGE, "CPU number too large");
}
END_TEST

/* The lowest and highest CPU the runner may use. */
static void allowed_bounds(unsigned *lo, unsigned *hi)
{
	cpu_set_t set;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	*lo = CPU_SETSIZE;
	*hi = 0;
	for (unsigned c = 0; c < CPU_SETSIZE; c++) {
		if (CPU_ISSET(c, &set)) {
			*lo = c < *lo ? c : *lo;
			*hi = c;
		}
	}
	ck_assert_uint_lt(*lo, CPU_SETSIZE);
}

START_TEST(cpus_outside_the_process_are_refused)
{
	char err[256] = "", list[32];
	unsigned lo, hi;

	allowed_bounds(&lo, &hi);
	ck_assert_uint_lt(hi, 1023); /* 1023 is nobody's here */
	snprintf(list, sizeof(list), "%u,1023", lo);
	ck_assert_int_eq(cpu_affinity_configure("", list, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "engine.worker_cpus: CPU 1023 is not one this daemon may run on "
				  "(allowed: ") == err,
		      "%s", err);
	ck_assert_int_eq(cpu_affinity_configure("0-x", "", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "engine.loop_cpus = '0-x': expected a CPU number");
	/* A refused configuration pins nothing. */
	ck_assert_int_eq(cpu_affinity_pin_loop(), 0);
	cpu_affinity_reset();
}
END_TEST

struct probe {
	int (*pin)(void);     /* run first on the thread */
	int pinned;           /* what it returned */
	cpu_set_t cpus;       /* the thread's CPUs after it */
	struct probe *worker; /* a thread to start from this one afterwards, or NULL */
};

static void *probe_main(void *arg)
{
	struct probe *p = arg;

	p->pinned = p->pin ? p->pin() : 0;
	sched_getaffinity(0, sizeof(p->cpus), &p->cpus);
	if (p->worker) {
		pthread_t t;
		ck_assert_int_eq(pthread_create(&t, NULL, probe_main, p->worker), 0);
		pthread_join(t, NULL);
	}
	if (p->pin == cpu_affinity_pin_worker) {
		cpu_affinity_worker_exit();
	}
	return NULL;
}

static void run_probe(struct probe *p)
{
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, probe_main, p), 0);
	pthread_join(t, NULL);
}

static void assert_cpus(const cpu_set_t *set, const char *expected)
{
	char buf[128];

	cpu_list_format(set, buf, sizeof(buf));
	ck_assert_str_eq(buf, expected);
}

START_TEST(loop_and_workers_land_on_their_cpus)
{
	char err[256] = "", lo_list[16], hi_list[16], all[128];
	struct probe worker = {.pin = cpu_affinity_pin_worker};
	struct probe loop = {.pin = cpu_affinity_pin_loop, .worker = &worker};
	cpu_set_t allowed;
	unsigned lo, hi;

	allowed_bounds(&lo, &hi);
	sched_getaffinity(0, sizeof(allowed), &allowed);
	cpu_list_format(&allowed, all, sizeof(all));
	snprintf(lo_list, sizeof(lo_list), "%u", lo);
	snprintf(hi_list, sizeof(hi_list), "%u", hi);

	/* Both given: each thread on its list, the worker not on the loop's. */
	ck_assert_msg(cpu_affinity_configure(lo_list, hi_list, err, sizeof(err)) == 0, "%s", err);
	run_probe(&loop);
	ck_assert_int_eq(loop.pinned, 0);
	ck_assert_int_eq(worker.pinned, 0);
	assert_cpus(&loop.cpus, lo_list);
	assert_cpus(&worker.cpus, hi_list);
	ck_assert(cpu_affinity_loop_isolated() == (lo != hi));

	/* Only the loop pinned: a worker started from it gets every CPU back. */
	ck_assert_msg(cpu_affinity_configure(lo_list, "", err, sizeof(err)) == 0, "%s", err);
	run_probe(&loop);
	assert_cpus(&loop.cpus, lo_list);
	assert_cpus(&worker.cpus, all);
	ck_assert(!cpu_affinity_loop_isolated()); /* the workers may run on the loop's CPU */

	/* Nothing configured: neither call changes a thread's CPUs. */
	ck_assert_msg(cpu_affinity_configure("", "", err, sizeof(err)) == 0, "%s", err);
	struct probe narrow = {.pin = NULL};
	struct probe inherit = {.pin = cpu_affinity_pin_worker};
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(hi, &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	narrow.worker = &inherit;
	run_probe(&narrow);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(allowed), &allowed), 0);
	ck_assert_int_eq(inherit.pinned, 0);
	assert_cpus(&inherit.cpus, hi_list);
	ck_assert_int_eq(cpu_affinity_pin_loop(), 0);
	ck_assert(!cpu_affinity_loop_isolated());
	cpu_affinity_reset();
}
END_TEST

/*
 * getaddrinfo(), in place of libc's for libcurl too (an executable's symbol
 * comes first): the test's host name resolves to 127.0.0.1, and the CPUs of
 * the thread that resolved it are kept. Every other name goes to libc.
 */
#define RESOLVE_NAME "rdmax-affinity.test"
static pthread_mutex_t g_resolve_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_resolves;
static cpu_set_t g_resolve_cpus;

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
		struct addrinfo **res)
{
	static int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

	if (!real) {
		*(void **)&real = dlsym(RTLD_NEXT, "getaddrinfo");
	}
	if (node && strcmp(node, RESOLVE_NAME) == 0) {
		pthread_mutex_lock(&g_resolve_lock);
		g_resolves++;
		sched_getaffinity(0, sizeof(g_resolve_cpus), &g_resolve_cpus);
		pthread_mutex_unlock(&g_resolve_lock);
		node = "127.0.0.1";
	}
	return real(node, service, hints, res);
}

struct etcd_probe {
	uint16_t port; /* nothing listens there */
	bool done;
	int err;
	cpu_set_t loop_cpus; /* the loop thread's once the request ended */
};

static void etcd_probe_done(void *arg, int err, const char *why, json_t *doc)
{
	struct etcd_probe *p = arg;

	p->done = true;
	p->err = err;
}

/* The loop: pinned, it runs one etcd request to a name libcurl must resolve. */
static void *etcd_probe_main(void *arg)
{
	struct etcd_probe *p = arg;
	char url[64];
	uv_loop_t loop;
	struct etcd *etcd;

	ck_assert_int_eq(cpu_affinity_pin_loop(), 0);
	ck_assert_int_eq(uv_loop_init(&loop), 0);
	snprintf(url, sizeof(url), "http://" RESOLVE_NAME ":%u", p->port);
	struct etcd_options opt = {.endpoints = url};
	ck_assert_int_eq(etcd_create(&loop, &opt, &etcd), 0);
	json_t *body = json_object();
	ck_assert_int_eq(
		etcd_post(etcd, "/v3/kv/range", body, false, 5000, etcd_probe_done, p, NULL), 0);
	json_decref(body);
	while (!p->done) {
		uv_run(&loop, UV_RUN_ONCE);
	}
	sched_getaffinity(0, sizeof(p->loop_cpus), &p->loop_cpus);
	etcd_close(etcd);
	uv_run(&loop, UV_RUN_DEFAULT);
	etcd_destroy(etcd);
	ck_assert_int_eq(uv_loop_close(&loop), 0);
	return NULL;
}

/*
 * Discovery's libcurl resolves names on threads it starts from the loop, and
 * a thread inherits its creator's CPUs: the resolver runs on the workers'
 * CPUs, not on the loop's, and the loop is back on its own afterwards.
 */
START_TEST(resolver_threads_leave_the_loop_cpus)
{
	char err[256] = "", lo_list[16], hi_list[16];
	struct etcd_probe p = {0};
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	unsigned lo, hi;
	pthread_t t;

	allowed_bounds(&lo, &hi);
	snprintf(lo_list, sizeof(lo_list), "%u", lo);
	snprintf(hi_list, sizeof(hi_list), "%u", hi);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	p.port = ntohs(sa.sin_port);
	close(fd); /* a port nothing listens on: the request ends refused */

	ck_assert_msg(cpu_affinity_configure(lo_list, hi_list, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(pthread_create(&t, NULL, etcd_probe_main, &p), 0);
	pthread_join(t, NULL);
	ck_assert_int_ne(p.err, 0);
	pthread_mutex_lock(&g_resolve_lock);
	ck_assert_int_ge(g_resolves, 1);
	assert_cpus(&g_resolve_cpus, hi_list);
	pthread_mutex_unlock(&g_resolve_lock);
	assert_cpus(&p.loop_cpus, lo_list);
	cpu_affinity_reset();
}
END_TEST

/* A worker that stays alive, listed, until told to end. */
struct live_worker {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pid_t tid;
	bool ready, stop;
};

static void *live_worker_main(void *arg)
{
	struct live_worker *w = arg;

	cpu_affinity_pin_worker();
	pthread_mutex_lock(&w->lock);
	w->tid = (pid_t)syscall(SYS_gettid);
	w->ready = true;
	pthread_cond_broadcast(&w->cond);
	while (!w->stop) {
		pthread_cond_wait(&w->cond, &w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	cpu_affinity_worker_exit();
	return NULL;
}

/* What a reload does from the loop thread: reconfigure, then the loop's own CPUs. */
struct reload {
	const char *loop, *workers;
	int ret;
	char err[256];
	cpu_set_t cpus;
};

static void *reload_main(void *arg)
{
	struct reload *r = arg;

	r->ret = cpu_affinity_reconfigure(r->loop, r->workers, r->err, sizeof(r->err));
	sched_getaffinity(0, sizeof(r->cpus), &r->cpus);
	return NULL;
}

static void run_reload(struct reload *r, const char *loop, const char *workers)
{
	pthread_t t;

	r->loop = loop;
	r->workers = workers;
	ck_assert_int_eq(pthread_create(&t, NULL, reload_main, r), 0);
	pthread_join(t, NULL);
}

static void assert_thread_cpus(pid_t tid, const char *expected)
{
	cpu_set_t set;

	ck_assert_int_eq(sched_getaffinity(tid, sizeof(set), &set), 0);
	assert_cpus(&set, expected);
}

START_TEST(reload_moves_the_loop_and_live_workers)
{
	struct live_worker w = {.lock = PTHREAD_MUTEX_INITIALIZER,
				.cond = PTHREAD_COND_INITIALIZER};
	char err[256] = "", lo_list[16], hi_list[16], all[128];
	struct reload r;
	cpu_set_t allowed;
	unsigned lo, hi;
	pthread_t t;

	allowed_bounds(&lo, &hi);
	sched_getaffinity(0, sizeof(allowed), &allowed);
	cpu_list_format(&allowed, all, sizeof(all));
	snprintf(lo_list, sizeof(lo_list), "%u", lo);
	snprintf(hi_list, sizeof(hi_list), "%u", hi);

	/* Started unpinned, with a worker alive. */
	ck_assert_msg(cpu_affinity_configure("", "", err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(pthread_create(&t, NULL, live_worker_main, &w), 0);
	pthread_mutex_lock(&w.lock);
	while (!w.ready) {
		pthread_cond_wait(&w.cond, &w.lock);
	}
	pthread_mutex_unlock(&w.lock);
	assert_thread_cpus(w.tid, all);

	/* A reload pins both: the loop where it runs the reload, the worker from outside. */
	run_reload(&r, hi_list, lo_list);
	ck_assert_msg(r.ret == 0, "%s", r.err);
	assert_cpus(&r.cpus, hi_list);
	assert_thread_cpus(w.tid, lo_list);
	ck_assert(cpu_affinity_loop_isolated() == (lo != hi));

	/* Lists the daemon may not use change nothing. */
	run_reload(&r, lo_list, "1023");
	ck_assert_int_eq(r.ret, -EINVAL);
	ck_assert_msg(strstr(r.err, "engine.worker_cpus: CPU 1023 is not one") == r.err, "%s",
		      r.err);
	assert_thread_cpus(w.tid, lo_list);
	ck_assert(cpu_affinity_loop_isolated() == (lo != hi));

	/* Only the loop pinned: the worker gets every CPU back. */
	run_reload(&r, lo_list, "");
	ck_assert_msg(r.ret == 0, "%s", r.err);
	assert_cpus(&r.cpus, lo_list);
	assert_thread_cpus(w.tid, all);

	/* Empty lists: every thread back on every CPU the process started with. */
	run_reload(&r, "", "");
	ck_assert_msg(r.ret == 0, "%s", r.err);
	assert_cpus(&r.cpus, all);
	assert_thread_cpus(w.tid, all);

	/* A worker that ended is off the list: the next reload moves no one else. */
	pthread_mutex_lock(&w.lock);
	w.stop = true;
	pthread_cond_broadcast(&w.cond);
	pthread_mutex_unlock(&w.lock);
	pthread_join(t, NULL);
	run_reload(&r, hi_list, hi_list);
	ck_assert_msg(r.ret == 0, "%s", r.err);
	assert_cpus(&r.cpus, hi_list);
	cpu_affinity_reset();
}
END_TEST

START_TEST(overlapping_lists_are_not_isolated)
{
	char err[256] = "", list[32];
	unsigned lo, hi;

	allowed_bounds(&lo, &hi);
	snprintf(list, sizeof(list), "%u", lo);
	ck_assert_msg(cpu_affinity_configure(list, list, err, sizeof(err)) == 0, "%s", err);
	ck_assert(!cpu_affinity_loop_isolated());
	ck_assert_msg(cpu_affinity_configure("", list, err, sizeof(err)) == 0, "%s", err);
	ck_assert(!cpu_affinity_loop_isolated());
	cpu_affinity_reset();
}
END_TEST

Suite *cpu_affinity_suite(void)
{
	Suite *s = suite_create("cpu_affinity");
	TCase *tc = tcase_create("cpu_affinity");

	tcase_add_test(tc, cpu_lists_parse_and_format);
	tcase_add_test(tc, cpus_outside_the_process_are_refused);
	tcase_add_test(tc, loop_and_workers_land_on_their_cpus);
	tcase_add_test(tc, resolver_threads_leave_the_loop_cpus);
	tcase_add_test(tc, reload_moves_the_loop_and_live_workers);
	tcase_add_test(tc, overlapping_lists_are_not_isolated);
	suite_add_tcase(s, tc);
	return s;
}
