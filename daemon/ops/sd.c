/* SPDX-License-Identifier: MIT */
/*
 * Service manager integration (see sd.h). Owns the watchdog and STATUS
 * timers, the test-only stall hook, the inherited listening sockets until
 * ipc and admin take them, and the order in which the operations modules come
 * up and go down. Never shuts down or unlinks an inherited socket: the socket
 * unit owns it and keeps it listening across restarts.
 *
 * The watchdog is pinged from a loop timer at half the interval the manager
 * asked for, so a loop that is stuck (in a blocking call, a livelock) stops
 * the pings and the manager restarts the daemon.
 *
 * Test hook: with RDMAXD_TEST_HOOKS=1 in the environment at start-up (and
 * only then), SIGUSR2 makes the loop sleep RDMAXD_TEST_STALL_MS milliseconds
 * (default 3000), so tests can watch the watchdog pings stop. Without the
 * variable SIGUSR2 keeps its default action; a warning is logged when enabled.
 */
#include "sd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "config.h"
#include "engine.h"
#include "ipc.h"
#include "log.h"
#include "metrics.h"
#include "rdmax.h"
#include "rdmaxd.h"
#include "transport.h"

#define STATUS_INTERVAL_MS 5000

struct svc {
	bool started;
	uv_timer_t watchdog;
	uv_timer_t status;
	uint64_t watchdog_usec; /* 0: no watchdog */
	bool hooks;             /* RDMAXD_TEST_HOOKS=1 */
	uv_signal_t stall;
};

static struct svc g_svc;

/* --------------------------------------------------------- socket activation */

static int socket_path_of(int fd, char *buf, size_t size)
{
	struct sockaddr_un addr;
	socklen_t len = sizeof(addr);

	memset(&addr, 0, sizeof(addr));
	if (getsockname(fd, (struct sockaddr *)&addr, &len) < 0) {
		return -errno;
	}
	if (addr.sun_family != AF_UNIX || len <= offsetof(struct sockaddr_un, sun_path) ||
	    addr.sun_path[0] == '\0') {
		return -EINVAL; /* unnamed or abstract */
	}
	snprintf(buf, size, "%.*s", (int)(len - offsetof(struct sockaddr_un, sun_path)),
		 addr.sun_path);
	return 0;
}

/* Check an inherited socket and adopt it for cfg_path; returns 0 or a negative error. */
static int adopt(int fd, const char *what, const char *expected, char *cfg_path, size_t cfg_size,
		 int *ret_fd)
{
	char actual[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
	int r;

	r = sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0);
	if (r <= 0) {
		log_err("inherited %s socket (fd %d) is not a listening AF_UNIX SOCK_SEQPACKET "
			"socket; check ListenSequentialPacket= in rdmaxd.socket",
			what, fd);
		return r < 0 ? r : -ENOTSOCK;
	}
	if (socket_path_of(fd, actual, sizeof(actual)) < 0) {
		log_err("inherited %s socket (fd %d) has no file system path", what, fd);
		return -EINVAL;
	}
	if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, expected, 0) <= 0) {
		log_warn("inherited %s socket is '%s' but the configuration says '%s'; using '%s'",
			 what, actual, expected, actual);
	}
	if (copy_string(cfg_path, cfg_size, actual) < 0) {
		return -ENAMETOOLONG;
	}
	/* The loop must never block in accept(); O_NONBLOCK is harmless to systemd's copy. */
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		return -errno;
	}
	log_info("using the %s socket '%s' passed by the service manager (fd %d)", what, actual,
		 fd);
	*ret_fd = fd;
	return 0;
}

int svc_listen_fds(struct rdmaxd *daemon)
{
	struct config *cfg = &daemon->cfg;
	char **names = NULL;
	char admin_path[sizeof(cfg->admin_socket_path)];
	char client_path[sizeof(cfg->socket_path)];
	int client = -1, admin = -1;
	int n, ret = 0;

	snprintf(client_path, sizeof(client_path), "%s", cfg->socket_path);
	if (admin_path_for(cfg, admin_path, sizeof(admin_path)) < 0) {
		snprintf(admin_path, sizeof(admin_path), "%s", cfg->admin_socket_path);
	}

	n = sd_listen_fds_with_names(1, &names);
	if (n < 0) {
		log_err("sd_listen_fds_with_names() failed: %s", strerror(-n));
		return n;
	}
	/* By name first. */
	for (int i = 0; i < n; i++) {
		const char *name = names && names[i] ? names[i] : "unknown";
		if (strcmp(name, SVC_FD_CLIENT) == 0 && client < 0) {
			client = i;
		} else if (strcmp(name, SVC_FD_ADMIN) == 0 && admin < 0) {
			admin = i;
		}
	}
	/* Unnamed sockets: by configured path, then in order (client first). */
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		if (i == client || i == admin) {
			continue;
		}
		if (admin < 0 && sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, admin_path, 0) > 0) {
			admin = i;
		} else if (client < 0 &&
			   sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, client_path, 0) > 0) {
			client = i;
		}
	}
	for (int i = 0; i < n; i++) {
		if (i == client || i == admin) {
			continue;
		}
		if (client < 0) {
			client = i;
		} else if (admin < 0) {
			admin = i;
		}
	}
	for (int i = 0; i < n && ret == 0; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		if (i == client) {
			ret = adopt(fd, "client", client_path, cfg->socket_path,
				    sizeof(cfg->socket_path), &daemon->client_listen_fd);
		} else if (i == admin) {
			ret = adopt(fd, "admin", admin_path, cfg->admin_socket_path,
				    sizeof(cfg->admin_socket_path), &daemon->admin_listen_fd);
		} else {
			log_warn("closing unexpected socket '%s' (fd %d) passed by the service "
				 "manager",
				 names && names[i] ? names[i] : "unknown", fd);
			close(fd);
		}
	}
	if (names) {
		for (int i = 0; i < n; i++) {
			free(names[i]);
		}
		free(names);
	}
	return ret;
}

/* ------------------------------------------------------------------ status */

static void format_rate(double bytes_per_s, char *buf, size_t size)
{
	static const char *const units[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s"};
	size_t u = 0;

	while (bytes_per_s >= 1000 && u + 1 < ARRAY_SIZE(units)) {
		bytes_per_s /= 1000;
		u++;
	}
	snprintf(buf, size, "%.3g %s", bytes_per_s, units[u]);
}

struct conn_tally {
	uint32_t total;
	uint32_t ready;
};

static void tally_conn(void *arg, const struct transport_conn_info *info)
{
	struct conn_tally *t = arg;

	t->total++;
	t->ready += strcmp(info->state, "ready") == 0;
}

static void build_status(struct rdmaxd *daemon, char *buf, size_t size)
{
	struct conn_tally conns = {0};
	char transports[160] = "";
	char rate[32];
	size_t used = 0;
	double jobs_s = 0, bytes_s = 0;

	for (size_t k = 0; k < ENDPOINT_MAX; k++) {
		struct transport *t = daemon->transports[k];
		struct endpoint ep[DESC_MAX_ENDPOINTS];
		if (!t) {
			continue;
		}
		int n = t->ops->endpoints(t, NULL, ep, DESC_MAX_ENDPOINTS);
		int w = snprintf(transports + used, sizeof(transports) - used, "%s%s",
				 used ? "+" : "", t->ops->name);
		used += w > 0 ? (size_t)w : 0;
		if (n > 0 && used < sizeof(transports)) {
			w = snprintf(transports + used, sizeof(transports) - used, " %s:%u",
				     ep[0].addr, ep[0].port);
			used += w > 0 ? (size_t)w : 0;
		}
		if (n > 1 && used < sizeof(transports)) {
			w = snprintf(transports + used, sizeof(transports) - used, " (%d devices)",
				     n);
			used += w > 0 ? (size_t)w : 0;
		}
		if (t->ops->list_conns) {
			t->ops->list_conns(t, tally_conn, &conns);
		}
	}
	if (daemon->metrics) {
		metrics_rates(daemon->metrics, &jobs_s, &bytes_s);
	}
	format_rate(bytes_s, rate, sizeof(rate));
	snprintf(buf, size,
		 "%s%s; %u clients; %u/%u peer connections ready; %" PRIu64
		 " jobs in flight; %.0f jobs/s, %s",
		 daemon->draining ? "DRAINING; " : "", transports[0] ? transports : "no transport",
		 ipc_client_count(daemon->ipc), conns.ready, conns.total,
		 daemon->engine ? engine_outstanding(daemon->engine) : 0, jobs_s, rate);
}

void svc_status_refresh(struct rdmaxd *daemon)
{
	char status[512];

	build_status(daemon, status, sizeof(status));
	sd_notifyf(0, "STATUS=%s", status);
}

static void status_tick(uv_timer_t *timer)
{
	svc_status_refresh(timer->data);
}

/* ---------------------------------------------------------------- watchdog */

static void watchdog_tick(uv_timer_t *timer)
{
	sd_notify(0, "WATCHDOG=1");
}

static void stall_cb(uv_signal_t *handle, int signum)
{
	const char *env = getenv("RDMAXD_TEST_STALL_MS");
	long ms = env ? strtol(env, NULL, 10) : 3000;
	struct timespec ts;

	if (ms <= 0 || ms > 600000) {
		ms = 3000;
	}
	log_warn("test hook: SIGUSR2 stalls the event loop for %ld ms", ms);
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (ms % 1000) * 1000000L;
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
	}
}

/* -------------------------------------------------------------- life cycle */

int svc_start(struct rdmaxd *daemon)
{
	const char *dir = daemon->cfg.metrics_textfile_dir;
	uint64_t usec = 0;
	int ret;

	ret = metrics_create(daemon, &daemon->metrics);
	if (ret < 0) {
		return ret;
	}
	ret = admin_create(daemon, &daemon->admin);
	if (ret < 0) {
		goto out_metrics;
	}
	if (dir && dir[0]) {
		uint32_t secs = daemon->cfg.metrics_textfile_interval_s;
		ret = metrics_textfile_start(daemon->metrics, dir, secs);
		if (ret < 0) {
			log_err("metrics textfile directory '%s' is unusable: %s", dir,
				strerror(-ret));
			goto out_admin;
		}
		log_info("writing metrics to '%s/rdmaxd.prom' every %u s", dir, secs);
	}

	uv_timer_init(daemon->loop, &g_svc.status);
	g_svc.status.data = daemon;
	uv_timer_init(daemon->loop, &g_svc.watchdog);
	g_svc.watchdog.data = daemon;
	/* Keep $WATCHDOG_USEC: a reload or re-exec must see it too. */
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
		g_svc.watchdog_usec = usec;
		uint64_t period_ms = MAX(usec / 2000, 1);
		uv_timer_start(&g_svc.watchdog, watchdog_tick, period_ms, period_ms);
		log_info("watchdog: pinging the service manager every %" PRIu64 " ms", period_ms);
	}
	const char *hooks = getenv("RDMAXD_TEST_HOOKS");
	g_svc.hooks = hooks && strcmp(hooks, "1") == 0;
	if (g_svc.hooks) {
		uv_signal_init(daemon->loop, &g_svc.stall);
		uv_signal_start(&g_svc.stall, stall_cb, SIGUSR2);
		log_warn("RDMAXD_TEST_HOOKS=1: test hooks are enabled (SIGUSR2 stalls the loop); "
			 "never set this in production");
	}
	g_svc.started = true;
	return 0;

out_admin:
	admin_shutdown(daemon->admin);
	uv_run(daemon->loop, UV_RUN_NOWAIT);
	admin_destroy(daemon->admin);
	daemon->admin = NULL;
out_metrics:
	metrics_destroy(daemon->metrics);
	daemon->metrics = NULL;
	return ret;
}

void svc_ready(struct rdmaxd *daemon)
{
	char status[512];

	build_status(daemon, status, sizeof(status));
	sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%d", status, (int)getpid());
	if (g_svc.started) {
		uv_timer_start(&g_svc.status, status_tick, STATUS_INTERVAL_MS, STATUS_INTERVAL_MS);
	}
}

void svc_extend_timeout(uint64_t usec, const char *what)
{
	if (what) {
		sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%" PRIu64 "\nSTATUS=%s", usec, what);
	} else {
		sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%" PRIu64, usec);
	}
}

static uint64_t monotonic_usec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Replace the auth key only when the new file is good: a failed reload keeps the old key. */
static int reload_auth_key(struct rdmaxd *daemon, const char *path, svc_load_key_fn load_key)
{
	struct rdmaxd *tmp = calloc(1, sizeof(*tmp));
	char err[CONFIG_ERR_MAX];
	int ret;

	if (!tmp) {
		return -ENOMEM;
	}
	snprintf(tmp->cfg.auth_key_file, sizeof(tmp->cfg.auth_key_file), "%s", path);
	ret = load_key(tmp, err, sizeof(err));
	if (ret < 0) {
		log_err("reload: %s; keeping the previous key", err);
	} else {
		bool changed = tmp->auth_key_len != daemon->auth_key_len ||
			       memcmp(tmp->auth_key, daemon->auth_key, tmp->auth_key_len) != 0;
		memcpy(daemon->auth_key, tmp->auth_key, sizeof(daemon->auth_key));
		daemon->auth_key_len = tmp->auth_key_len;
		snprintf(daemon->cfg.auth_key_file, sizeof(daemon->cfg.auth_key_file), "%s", path);
		if (changed) {
			log_notice("reload: authentication key %s",
				   daemon->auth_key_len ? "replaced"
							: "removed (authentication off)");
		}
	}
	explicit_bzero(tmp->auth_key, sizeof(tmp->auth_key));
	free(tmp);
	return ret;
}

void svc_reload(struct rdmaxd *daemon, const struct config *next, svc_load_key_fn load_key)
{
	struct config *cfg = &daemon->cfg;
	char restart[1024];
	int n;

	sd_notifyf(0, "RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC=%" PRIu64,
		   monotonic_usec());
	/* Paths of inherited sockets come from the socket units, not from the file. */
	struct config cmp = *next;
	if (daemon->client_listen_fd > 0) {
		memcpy(cmp.socket_path, cfg->socket_path, sizeof(cmp.socket_path));
	}
	if (daemon->admin_listen_fd > 0) {
		memcpy(cmp.admin_socket_path, cfg->admin_socket_path,
		       sizeof(cmp.admin_socket_path));
	}
	n = config_restart_keys(cfg, &cmp, restart, sizeof(restart));
	if (n > 0) {
		log_warn("reload: %s changed; %s effect only after a restart", restart,
			 n == 1 ? "it takes" : "they take");
	}
	if (next->log_level != cfg->log_level) {
		log_notice("reload: log level %s -> %s", log_level_name(cfg->log_level),
			   log_level_name(next->log_level));
		log_set_level(next->log_level);
	}
	/* The key is swapped only when the new file is good; keep the old path otherwise. */
	reload_auth_key(daemon, next->auth_key_file, load_key);
	char key_file[sizeof(cfg->auth_key_file)];
	memcpy(key_file, cfg->auth_key_file, sizeof(key_file));
	config_apply_reloadable(cfg, next);
	memcpy(cfg->auth_key_file, key_file, sizeof(key_file));
	daemon->imm.max_counters = cfg->max_imm_counters;
	if (daemon->engine) {
		engine_qos_reconfigure(daemon->engine); /* [qos] applies from the next chunk */
	}
	log_notice("configuration reloaded");
	svc_ready(daemon);
}

void svc_reload_failed(struct rdmaxd *daemon, const char *why)
{
	sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64, monotonic_usec());
	log_err("reload failed: %s; the running configuration is unchanged", why);
	svc_ready(daemon);
}

static void handle_closed(uv_handle_t *handle)
{
}

void svc_stopping(struct rdmaxd *daemon)
{
	sd_notify(0, "STOPPING=1\nSTATUS=shutting down");
	if (!g_svc.started) {
		return;
	}
	g_svc.started = false;
	uv_close((uv_handle_t *)&g_svc.watchdog, handle_closed);
	uv_close((uv_handle_t *)&g_svc.status, handle_closed);
	if (g_svc.hooks) {
		uv_close((uv_handle_t *)&g_svc.stall, handle_closed);
	}
	admin_shutdown(daemon->admin);
	metrics_shutdown(daemon->metrics);
}

void svc_fini(struct rdmaxd *daemon)
{
	admin_destroy(daemon->admin);
	daemon->admin = NULL;
	metrics_destroy(daemon->metrics);
	daemon->metrics = NULL;
}
