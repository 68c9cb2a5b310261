/* SPDX-License-Identifier: MIT */
/*
 * rdmaxd start-up and shutdown: command line, configuration, logging, the
 * control loop and the order in which modules come up and go down. Does no
 * data-path work.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "cpu_affinity.h"
#include "discovery.h"
#include "engine.h"
#include "gpu.h"
#include "ipc.h"
#include "log.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "sd.h"
#include "spin_yield.h"
#include "transport.h"

#define AUTH_KEY_MIN 16

struct signals {
	uv_signal_t sigint;
	uv_signal_t sigterm;
	uv_signal_t sighup;
	uv_prepare_t busy_check;
	uv_idle_t busy_idle;
	uint64_t last_busy_ns;
	uint64_t last_outstanding; /* engine_outstanding() at the previous loop turn */
};

static struct rdmaxd g_daemon;
static struct signals g_signals;
/* The command line, re-parsed on SIGHUP so its overrides keep applying. */
static int g_argc;
static char **g_argv;
/* engine.loop_cpus and worker_cpus keep the loop apart from the copies (start-up, reload). */
static bool g_loop_isolated;

int rdmaxd_load_auth_key(struct rdmaxd *daemon, char *err, size_t err_size)
{
	const char *path = daemon->cfg.auth_key_file;
	struct stat st;
	uint8_t buf[RDMAXD_AUTH_KEY_MAX + 1];
	ssize_t n;
	int fd;

	daemon->auth_key_len = 0;
	if (!path[0]) {
		return 0;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, err_size, "cannot open auth key file '%s': %s", path,
			 strerror(errno));
		return -errno;
	}
	if (fstat(fd, &st) < 0 || (st.st_mode & 077)) {
		snprintf(err, err_size,
			 "auth key file '%s' must not be readable by group or others (chmod 600)",
			 path);
		close(fd);
		return -EPERM;
	}
	n = read(fd, buf, sizeof(buf));
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) {
		n--;
	}
	if (n < AUTH_KEY_MIN || n > RDMAXD_AUTH_KEY_MAX) {
		snprintf(err, err_size, "auth key file '%s' must hold %d to %d bytes", path,
			 AUTH_KEY_MIN, RDMAXD_AUTH_KEY_MAX);
		return -EINVAL;
	}
	memcpy(daemon->auth_key, buf, (size_t)n);
	daemon->auth_key_len = (size_t)n;
	return 0;
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: rdmaxd [OPTIONS]\n"
		"RDMA transfer daemon: moves application memory between nodes.\n\n"
		"  -c, --config FILE        configuration file (default %s if it exists)\n"
		"  -s, --socket PATH        client socket path\n"
		"  -l, --listen ADDR        address peers connect to\n"
		"  -p, --port PORT          TCP transport port (0: any)\n"
		"  -t, --transport NAME     auto | tcp | verbs\n"
		"  -n, --node-name NAME     node name in logs and descriptors\n"
		"  -k, --auth-key-file FILE shared key for daemon-to-daemon authentication\n"
		"  -L, --log-level LEVEL    err | warning | notice | info | debug\n"
		"  -o, --set SECTION.KEY=VALUE  set any configuration key\n"
		"      --check-config       check the configuration, print it, and exit\n"
		"      --print-example-config  print a commented file of every key at its default\n"
		"  -V, --version            print the version and exit\n"
		"  -h, --help               this text\n",
		CONFIG_DEFAULT_PATH);
}

/* Apply command-line overrides after the file, in the order given. */
static int apply_override(struct config *cfg, const char *section, const char *key,
			  const char *value)
{
	char err[CONFIG_ERR_MAX];

	if (config_set(cfg, section, key, value, err, sizeof(err)) < 0) {
		fprintf(stderr, "rdmaxd: %s\n", err);
		return -EINVAL;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct config *cfg, bool *ret_check)
{
	static const struct option options[] = {
		{"config", required_argument, NULL, 'c'},
		{"socket", required_argument, NULL, 's'},
		{"listen", required_argument, NULL, 'l'},
		{"port", required_argument, NULL, 'p'},
		{"transport", required_argument, NULL, 't'},
		{"node-name", required_argument, NULL, 'n'},
		{"auth-key-file", required_argument, NULL, 'k'},
		{"log-level", required_argument, NULL, 'L'},
		{"set", required_argument, NULL, 'o'},
		{"check-config", no_argument, NULL, 'C'},
		{"print-example-config", no_argument, NULL, 'E'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *config_path = NULL;
	char err[CONFIG_ERR_MAX];
	int opt;

	/* First pass: find the config file, which the other options override. */
	while ((opt = getopt_long(argc, argv, "c:s:l:p:t:n:k:L:o:Vh", options, NULL)) != -1) {
		switch (opt) {
		case 'c':
			config_path = optarg;
			break;
		case 'V':
			printf("rdmaxd %s (protocol %d)\n", RDMAXD_VERSION, RDMAX_PROTOCOL_VERSION);
			exit(EXIT_SUCCESS);
		case 'E':
			config_print_example(stdout);
			exit(EXIT_SUCCESS);
		case 'h':
			usage(stdout);
			exit(EXIT_SUCCESS);
		case '?':
			usage(stderr);
			return -EINVAL;
		default:
			break;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "rdmaxd: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (!config_path && access(CONFIG_DEFAULT_PATH, F_OK) == 0) {
		config_path = CONFIG_DEFAULT_PATH;
	}
	if (config_path && config_load(cfg, config_path, err, sizeof(err)) < 0) {
		fprintf(stderr, "rdmaxd: %s\n", err);
		return -EINVAL;
	}
	optind = 1;
	while ((opt = getopt_long(argc, argv, "c:s:l:p:t:n:k:L:o:Vh", options, NULL)) != -1) {
		int ret = 0;
		switch (opt) {
		case 's':
			ret = apply_override(cfg, "daemon", "socket", optarg);
			break;
		case 'l':
			ret = apply_override(cfg, "transport", "listen", optarg);
			break;
		case 'p':
			ret = apply_override(cfg, "transport", "port", optarg);
			break;
		case 't':
			ret = apply_override(cfg, "transport", "type", optarg);
			break;
		case 'n':
			ret = apply_override(cfg, "daemon", "node_name", optarg);
			break;
		case 'k':
			ret = apply_override(cfg, "auth", "key_file", optarg);
			break;
		case 'L':
			ret = apply_override(cfg, "daemon", "log_level", optarg);
			break;
		case 'o':
			if (config_set_option(cfg, optarg, err, sizeof(err)) < 0) {
				fprintf(stderr, "rdmaxd: --set '%s': %s\n", optarg, err);
				return -EINVAL;
			}
			break;
		case 'C':
			*ret_check = true;
			break;
		default:
			break;
		}
		if (ret < 0) {
			return ret;
		}
	}
	if (config_validate(cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "rdmaxd: invalid configuration: %s\n", err);
		return -EINVAL;
	}
	return 0;
}

static void handle_close_noop(uv_handle_t *handle)
{
}

/*
 * Discovery lost a node: its jobs fail now with a named error rather than
 * after transport timeouts, and its connections go (a returning node gets new
 * ones, to its new instance).
 */
static void node_lost(struct rdmaxd *daemon, const char *node, uint64_t instance)
{
	char message[RDMAX_MESSAGE_MAX];
	uint32_t conns = 0;

	snprintf(message, sizeof(message),
		 "node '%.63s' was lost (instance %016" PRIx64
		 "): its lease expired or it restarted",
		 node, instance);
	uint32_t jobs = daemon->engine ? engine_fail_instance(daemon->engine, instance,
							      RDMAX_E_UNREACHABLE, message)
				       : 0;
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = daemon->transports[k];
		if (t && t->ops->reset_peer) {
			int n = t->ops->reset_peer(t, node);
			conns += n > 0 ? (uint32_t)n : 0;
		}
	}
	log_notice("node '%s' lost: %u job(s) failed, %u connection(s) closed", node, jobs, conns);
}

static void stop_daemon(struct rdmaxd *daemon, const char *why)
{
	if (daemon->stopping) {
		return;
	}
	daemon->stopping = true;
	svc_stopping(daemon);
	log_notice("shutting down (%s): %" PRIu64 " jobs outstanding", why,
		   daemon->engine ? engine_outstanding(daemon->engine) : 0);
	/* Order: fail jobs, tell clients, drop connections, then let the loop drain. */
	if (daemon->engine) {
		engine_cancel_all(daemon->engine);
	}
	ipc_shutdown(daemon->ipc);
	discovery_shutdown(daemon->discovery);
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		if (daemon->transports[k]) {
			daemon->transports[k]->ops->shutdown(daemon->transports[k]);
		}
	}
	uv_close((uv_handle_t *)&g_signals.sigint, handle_close_noop);
	uv_close((uv_handle_t *)&g_signals.sigterm, handle_close_noop);
	uv_close((uv_handle_t *)&g_signals.sighup, handle_close_noop);
	uv_close((uv_handle_t *)&g_signals.busy_check, handle_close_noop);
	uv_close((uv_handle_t *)&g_signals.busy_idle, handle_close_noop);
}

/* Where the loop and the workers run, as applied now (start-up, reload). */
static void log_cpus(const struct config *cfg, const char *prefix)
{
	g_loop_isolated = cpu_affinity_loop_isolated();
	log_notice("%sloop on CPUs %s, workers on CPUs %s%s", prefix,
		   cfg->loop_cpus[0] ? cfg->loop_cpus : "(any)",
		   cfg->worker_cpus[0] ? cfg->worker_cpus : "(any)",
		   g_loop_isolated ? " (apart: the loop spins while they copy)" : "");
}

/*
 * Reload: [engine] loop_cpus and worker_cpus move the loop and every worker
 * thread now; lists the daemon may not use leave both as they were.
 */
static void reload_cpus(struct rdmaxd *daemon, struct config *next)
{
	char err[256];

	if (strcmp(next->loop_cpus, daemon->cfg.loop_cpus) == 0 &&
	    strcmp(next->worker_cpus, daemon->cfg.worker_cpus) == 0) {
		return;
	}
	int ret = cpu_affinity_reconfigure(next->loop_cpus, next->worker_cpus, err, sizeof(err));
	if (ret < 0) {
		log_err("reload: %s; the loop and workers keep their CPUs", err);
		memcpy(next->loop_cpus, daemon->cfg.loop_cpus, sizeof(next->loop_cpus));
		memcpy(next->worker_cpus, daemon->cfg.worker_cpus, sizeof(next->worker_cpus));
		return;
	}
	if (ret > 0) {
		log_warn("reload: %s (%d worker%s not moved)", err, ret, ret == 1 ? "" : "s");
	}
	log_cpus(next, "reload: ");
}

/* SIGHUP: the configuration file and the start-up command line, parsed again. */
static void reload_config(struct rdmaxd *daemon)
{
	struct config next;
	bool check_only = false;

	config_defaults(&next);
	optind = 0; /* glibc: restart getopt from scratch */
	if (parse_args(g_argc, g_argv, &next, &check_only) < 0) {
		svc_reload_failed(daemon, "the configuration is invalid (see the message above)");
		return;
	}
	reload_cpus(daemon, &next);
	svc_reload(daemon, &next, rdmaxd_load_auth_key);
}

static void on_signal(uv_signal_t *handle, int signum)
{
	struct rdmaxd *daemon = handle->data;

	if (signum == SIGHUP) {
		reload_config(daemon);
		return;
	}
	stop_daemon(daemon, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/*
 * One spin call lasts at most this long (or busy_poll_us, if less), so that
 * sockets, timers and signals wait at most that for the loop's next turn.
 */
#define SPIN_BUDGET_US 200
/* Passes between two clock reads: in a guest without a TSC a read is a syscall. */
#define SPIN_CLOCK_EVERY 16
/* When the spin gives the CPU away (spin_yield.h); what it learnt lasts across spins. */
static struct spin_yield g_spin_yield = {.every = SPIN_YIELD_MAX, .backoff = 1};
/*
 * Bulk copies are on the transports' I/O threads, or were within
 * busy_poll_us (between two of them the loop waits for socket readiness):
 * the loop sleeps in epoll rather than spin. Not where the loop has CPUs of
 * its own (engine.loop_cpus apart from worker_cpus): there its spin takes
 * no time from a copy, and a sleep would cost every hop a wake-up.
 */
static bool offloading(const struct rdmaxd *daemon, uint64_t now)
{
	if (g_loop_isolated) {
		return false;
	}
	return daemon->io_offloaded > 0 ||
	       (daemon->io_offload_ns && now >= daemon->io_offload_ns &&
		now - daemon->io_offload_ns < (uint64_t)daemon->cfg.busy_poll_us * 1000);
}

/* One pass over everything that can move without the loop; how much moved. */
static int poll_pass(struct rdmaxd *daemon, uint64_t now)
{
	int moved = ipc_poll_pass(daemon->ipc, now);

	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = daemon->transports[k];
		if (t && t->ops->poll) {
			moved += t->ops->poll(t);
		}
	}
	return moved;
}

/*
 * The loop is busy (busy_check_cb started the idle handle): instead of one
 * epoll_wait(0) per pass, pass over the clients' rings and the transports
 * (ring entries started and posted, CQs and sockets with answers due
 * polled, completions written back to the rings) until the budget is spent
 * or nothing keeps the daemon busy any more; then the loop turns once, so
 * that sockets, timers and signals are served between two spins.
 */
static void busy_idle_cb(uv_idle_t *idle)
{
	struct rdmaxd *daemon = idle->data;
	uint32_t budget_us = MIN(daemon->cfg.busy_poll_us, (uint32_t)SPIN_BUDGET_US);
	uint64_t window = (uint64_t)daemon->cfg.busy_poll_us * 1000;
	uint64_t start = now_ns();
	uint64_t now = start;

	if (daemon->stopping || budget_us == 0) {
		return;
	}
	uint64_t clock_at = start;
	g_spin_yield.idle_passes = 0;
	for (uint32_t pass = 1;; pass++) {
		bool moved = poll_pass(daemon, now) > 0;
		if (moved) {
			g_signals.last_busy_ns = now;
		}
		if (spin_yield_due(&g_spin_yield, moved)) {
			/*
			 * Nothing moved for about SPIN_YIELD_IDLE_NS: give the CPU to a
			 * runnable process (a client, the peer daemon, the kernel's
			 * socket work, an emulated NIC's), as the library's spin does;
			 * with a CPU to spare this returns at once, and the next one
			 * waits longer (spin_yield.h). Not on every empty pass where
			 * passes are cheap: a ring entry arriving during the system
			 * call waits for it.
			 */
			uint64_t before = now_ns();
			sched_yield();
			now = now_ns();
			spin_yield_done(&g_spin_yield, now - before);
		}
		if (pass % SPIN_CLOCK_EVERY) {
			continue;
		}
		now = now_ns();
		spin_yield_learn(&g_spin_yield, now - clock_at, SPIN_CLOCK_EVERY);
		clock_at = now;
		if (now - start >= (uint64_t)budget_us * 1000) {
			break;
		}
		/* The same rule as busy_check_cb: nothing in the window, nothing to spin for. */
		if ((now >= g_signals.last_busy_ns && now - g_signals.last_busy_ns >= window &&
		     !ipc_rings_awake(daemon->ipc)) ||
		    offloading(daemon, now)) {
			break;
		}
	}
	g_signals.last_outstanding = daemon->engine ? engine_outstanding(daemon->engine) : 0;
}

/*
 * For busy_poll_us after jobs arrived or completed, keep the loop polling
 * with a zero timeout instead of sleeping in epoll: a wake-up costs far more
 * than a job on this path. Not for as long as jobs are outstanding: large
 * jobs complete milliseconds apart, and spinning through that costs a core
 * (with Soft-RoCE, the CPU the emulated NIC needs). Transports poll their own
 * completions within the same window.
 */
static void busy_check_cb(uv_prepare_t *prepare)
{
	struct rdmaxd *daemon = prepare->data;
	uint64_t now = now_ns();
	uint64_t outstanding = daemon->engine ? engine_outstanding(daemon->engine) : 0;

	if (outstanding != g_signals.last_outstanding) {
		g_signals.last_outstanding = outstanding;
		g_signals.last_busy_ns = now;
	}
	bool busy = now - g_signals.last_busy_ns < (uint64_t)daemon->cfg.busy_poll_us * 1000;
	/* A client's ring is polled from the loop: it bounds its own window. */
	busy = busy || ipc_rings_awake(daemon->ipc);
	if (offloading(daemon, now)) {
		/*
		 * Bulk bytes move on I/O threads: sleep in epoll instead, so that a
		 * doorbell, a small frame or a thread's result wakes the loop ahead
		 * of the busy threads. Rings ask their clients for doorbells
		 * meanwhile; one that just got entries keeps the loop turning.
		 */
		busy = !ipc_rings_sleep(daemon->ipc);
		if (!busy) {
			daemon->counters.loop_sleeps_for_copies++;
		}
	}
	if (busy && !uv_is_active((uv_handle_t *)&g_signals.busy_idle)) {
		uv_idle_start(&g_signals.busy_idle, busy_idle_cb);
	} else if (!busy && uv_is_active((uv_handle_t *)&g_signals.busy_idle)) {
		uv_idle_stop(&g_signals.busy_idle);
	}
	daemon->spinning = busy;
}

static void note_dmabuf(void *arg, const struct transport_port_info *info)
{
	bool *dmabuf = arg;

	*dmabuf = *dmabuf || info->dmabuf;
}

/* Whether one port of the verbs transport registers dma-bufs (GPU memory without peermem). */
static bool verbs_dmabuf(struct transport *verbs)
{
	bool dmabuf = false;

	if (verbs && verbs->ops->list_ports) {
		verbs->ops->list_ports(verbs, note_dmabuf, &dmabuf);
	}
	return dmabuf;
}

static int start_transports(struct rdmaxd *daemon)
{
	enum config_transport want = daemon->cfg.transport;
	const char *configured = config_transport_name(want);
	int ret;

	if (want != CONFIG_TRANSPORT_TCP) {
		ret = transport_verbs_create(daemon, &daemon->transports[ENDPOINT_VERBS]);
		if (ret < 0 && want == CONFIG_TRANSPORT_VERBS) {
			log_err("transport 'verbs' requested but no usable RDMA device has the "
				"listen address '%s': %s",
				daemon->cfg.listen_addr, rdmax_strerror(ret));
			return ret;
		}
	}
	/* Under auto TCP stays up beside verbs, so peers without RDMA still reach us. */
	if (want != CONFIG_TRANSPORT_VERBS) {
		ret = transport_tcp_create(daemon, &daemon->transports[ENDPOINT_TCP]);
		if (ret < 0) {
			log_err("cannot start the TCP transport: %s", rdmax_strerror(ret));
			return ret;
		}
	}
	if (daemon->transports[ENDPOINT_VERBS] && daemon->transports[ENDPOINT_TCP]) {
		log_notice("transport: verbs, and tcp for peers without RDMA (configured: %s)",
			   configured);
	} else if (daemon->transports[ENDPOINT_VERBS]) {
		log_notice("transport: verbs (configured: %s)", configured);
	} else {
		log_notice("transport: tcp (configured: %s%s)", configured,
			   want == CONFIG_TRANSPORT_AUTO ? "; no usable RDMA device" : "");
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct rdmaxd *daemon = &g_daemon;
	struct transport *verbs;
	bool check_only = false;
	char err[CONFIG_ERR_MAX];
	int ret;

	g_argc = argc;
	g_argv = argv;
	config_defaults(&daemon->cfg);
	if (parse_args(argc, argv, &daemon->cfg, &check_only) < 0) {
		return 2;
	}
	if (rdmaxd_load_auth_key(daemon, err, sizeof(err)) < 0) {
		fprintf(stderr, "rdmaxd: %s\n", err);
		return 2;
	}
	if (check_only) {
		config_print(&daemon->cfg, stdout);
		fprintf(stderr, "rdmaxd: configuration OK\n");
		return 0;
	}
	log_init(daemon->cfg.log_level, true);
	/* Before any worker thread starts: each pins itself from this. */
	if (cpu_affinity_configure(daemon->cfg.loop_cpus, daemon->cfg.worker_cpus, err,
				   sizeof(err)) < 0) {
		fprintf(stderr, "rdmaxd: %s\n", err);
		return 2;
	}
	copy_string(daemon->node_name, sizeof(daemon->node_name), daemon->cfg.node_name);
	daemon->instance_id = random_u64();
	daemon->loop = uv_default_loop();
	signal(SIGPIPE, SIG_IGN);
	daemon->started_ms = now_ms();
	counters_init(&daemon->counters);
	ret = svc_listen_fds(daemon);
	if (ret < 0) {
		goto out;
	}

	ret = region_table_init(&daemon->regions, daemon->instance_id);
	if (ret < 0) {
		goto out;
	}
	ret = imm_table_init(&daemon->imm, daemon->cfg.max_imm_counters, ipc_imm_fired, NULL);
	if (ret < 0) {
		goto out_regions;
	}
	ret = engine_create(daemon, ipc_job_completed, &daemon->engine);
	if (ret < 0) {
		goto out_imm;
	}
	ret = start_transports(daemon);
	if (ret < 0) {
		goto out_engine;
	}
	verbs = daemon->transports[ENDPOINT_VERBS];
	/* After the transports: GPU pools are registered through their region hooks. */
	ret = gpu_start(daemon, verbs != NULL, verbs_dmabuf(verbs), &daemon->gpu);
	if (ret < 0) {
		goto out_transports;
	}
	ret = discovery_create(daemon, ipc_lookup_done, &daemon->discovery);
	if (ret < 0) {
		goto out_transports;
	}
	discovery_set_lost_cb(daemon->discovery, node_lost);
	ret = ipc_create(daemon, &daemon->ipc);
	if (ret < 0) {
		goto out_transports;
	}
	/* After the transports: threads the libraries started so far keep every CPU. */
	ret = cpu_affinity_pin_loop();
	if (ret < 0) {
		log_err("cannot pin the loop to engine.loop_cpus %s: %s", daemon->cfg.loop_cpus,
			strerror(-ret));
		ipc_shutdown(daemon->ipc);
		goto out_transports;
	}
	g_loop_isolated = cpu_affinity_loop_isolated();
	if (daemon->cfg.loop_cpus[0] || daemon->cfg.worker_cpus[0]) {
		log_cpus(&daemon->cfg, "");
	}
	ret = svc_start(daemon);
	if (ret < 0) {
		ipc_shutdown(daemon->ipc);
		goto out_transports;
	}
	uv_signal_init(daemon->loop, &g_signals.sigint);
	uv_signal_init(daemon->loop, &g_signals.sigterm);
	uv_signal_init(daemon->loop, &g_signals.sighup);
	g_signals.sigint.data = g_signals.sigterm.data = g_signals.sighup.data = daemon;
	uv_signal_start(&g_signals.sigint, on_signal, SIGINT);
	uv_signal_start(&g_signals.sigterm, on_signal, SIGTERM);
	uv_signal_start(&g_signals.sighup, on_signal, SIGHUP);
	uv_prepare_init(daemon->loop, &g_signals.busy_check);
	g_signals.busy_check.data = daemon;
	uv_prepare_start(&g_signals.busy_check, busy_check_cb);
	uv_idle_init(daemon->loop, &g_signals.busy_idle);
	g_signals.busy_idle.data = daemon;

	log_notice("rdmaxd %s ready: node '%s', socket '%s', instance %016" PRIx64, RDMAXD_VERSION,
		   daemon->node_name, daemon->cfg.socket_path, daemon->instance_id);
	svc_ready(daemon);
	uv_run(daemon->loop, UV_RUN_DEFAULT);
	ret = 0;

out_transports:
	/* Pools nobody leases are deregistered while the devices are still there. */
	gpu_stop(daemon->gpu, &daemon->regions);
	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		if (daemon->transports[k]) {
			if (!daemon->stopping) {
				daemon->transports[k]->ops->shutdown(daemon->transports[k]);
			}
			/* Let close callbacks run before freeing. */
			uv_run(daemon->loop, UV_RUN_NOWAIT);
			daemon->transports[k]->ops->destroy(daemon->transports[k]);
			daemon->transports[k] = NULL;
		}
	}
	/* Every lookup's xfer came back from its transport: free them. */
	if (daemon->discovery) {
		discovery_shutdown(daemon->discovery);
		uv_run(daemon->loop, UV_RUN_NOWAIT);
		discovery_destroy(daemon->discovery);
		daemon->discovery = NULL;
	}
	/* No MR references GPU memory any more: free it, before the region table goes. */
	gpu_destroy(daemon->gpu);
	daemon->gpu = NULL;
	svc_fini(daemon);
	ipc_destroy(daemon->ipc);
out_engine:
	engine_destroy(daemon->engine);
out_imm:
	imm_table_fini(&daemon->imm);
out_regions:
	region_table_fini(&daemon->regions);
out:
	uid_counts_fini(&daemon->peer_conns);
	if (uv_loop_close(daemon->loop) != 0) {
		log_warn("event loop closed with handles still open");
	}
	if (ret < 0) {
		log_err("start-up failed: %s", rdmax_strerror(ret));
		return 1;
	}
	log_notice("stopped");
	return 0;
}
