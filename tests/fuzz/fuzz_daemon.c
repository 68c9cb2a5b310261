/* SPDX-License-Identifier: MIT */
/*
 * An rdmaxd inside the fuzzing process, started the way main.c starts one
 * (region and imm tables, engine, TCP transport, GPU module, client socket)
 * but on the loopback address with a kernel-chosen port, a socket in a
 * temporary folder and short peer timeouts, so that every input ends in a
 * settled daemon within a bounded time. The targets drive its loop with
 * fuzz_daemon_turns() between their own socket operations.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "fuzz.h"
#include "gpu.h"
#include "ipc.h"
#include "log.h"
#include "transport.h"

static struct rdmaxd g_fuzz_daemon, g_keyed_daemon;
static char g_dir[32];

/* libFuzzer leaves through exit(): take the socket folder with us. */
static void remove_dir(void)
{
	unlink(g_fuzz_daemon.cfg.socket_path);
	unlink(g_keyed_daemon.cfg.socket_path);
	rmdir(g_dir);
}

static void must(int ret, const char *what)
{
	if (ret < 0) {
		fprintf(stderr, "fuzz harness: %s failed: %d\n", what, ret);
		abort();
	}
}

static void set(struct config *cfg, const char *section, const char *key, const char *value)
{
	char err[CONFIG_ERR_MAX];
	if (config_set(cfg, section, key, value, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz harness: %s.%s: %s\n", section, key, err);
		abort();
	}
}

uint64_t fuzz_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* One daemon: `name` is its node name and the stem of its socket files. */
static void start(struct rdmaxd *d, const char *name, bool keyed)
{
	char path[108];

	if (!g_dir[0]) {
		char dir[] = "/tmp/rdmaxd-fuzz-XXXXXX";
		if (!mkdtemp(dir)) {
			abort();
		}
		memcpy(g_dir, dir, sizeof(dir));
		atexit(remove_dir);
	}
	config_defaults(&d->cfg);
	snprintf(path, sizeof(path), "%s/%s.sock", g_dir, name);
	set(&d->cfg, "daemon", "socket", path);
	snprintf(path, sizeof(path), "%s/%s-admin.sock", g_dir, name);
	set(&d->cfg, "daemon", "admin_socket", path);
	set(&d->cfg, "daemon", "node_name", name);
	set(&d->cfg, "transport", "type", "tcp");
	set(&d->cfg, "transport", "listen", "127.0.0.1");
	set(&d->cfg, "transport", "port", "0");
	/*
	 * Outgoing attempts of the plain daemon give up fast, so that an input's jobs
	 * to unreachable addresses end quickly. The same value is the handshake
	 * deadline of incoming connections: the keyed daemon, whose handshake the
	 * TCP target must complete, gets 5 s, or a loaded machine that deschedules
	 * the fuzzer for 100 ms would see its connection dropped mid-handshake.
	 */
	set(&d->cfg, "peers", "connect_timeout_ms", keyed ? "5000" : "100");
	set(&d->cfg, "peers", "connect_retries", "0");
	set(&d->cfg, "peers", "peer_timeout_ms", "500");
	set(&d->cfg, "engine", "busy_poll_us", "0");
	/* Small enough that an input can reach the limits. */
	set(&d->cfg, "limits", "max_outstanding_jobs", "64");
	set(&d->cfg, "limits", "max_regions", "16");
	set(&d->cfg, "limits", "max_imm_counters", "64");
	/* Set RDMAXD_FUZZ_LOG=debug to see what the daemon makes of an input. */
	const char *level = getenv("RDMAXD_FUZZ_LOG");
	set(&d->cfg, "daemon", "log_level", level ? level : "err");
	log_init(d->cfg.log_level, false);
	if (keyed) {
		memcpy(d->auth_key, FUZZ_AUTH_KEY, strlen(FUZZ_AUTH_KEY));
		d->auth_key_len = strlen(FUZZ_AUTH_KEY);
	}
	copy_string(d->node_name, sizeof(d->node_name), d->cfg.node_name);
	d->instance_id = keyed ? FUZZ_KEYED_INSTANCE : FUZZ_INSTANCE;
	d->loop = uv_default_loop();
	d->started_ms = now_ms();
	counters_init(&d->counters);
	must(region_table_init(&d->regions, d->instance_id), "region_table_init");
	must(imm_table_init(&d->imm, d->cfg.max_imm_counters, ipc_imm_fired, NULL),
	     "imm_table_init");
	must(engine_create(d, ipc_job_completed, &d->engine), "engine_create");
	must(transport_tcp_create(d, &d->transports[ENDPOINT_TCP]), "transport_tcp_create");
	must(gpu_start(d, false, false, &d->gpu), "gpu_start");
	must(ipc_create(d, &d->ipc), "ipc_create");
}

struct rdmaxd *fuzz_daemon_start(bool keyed)
{
	struct rdmaxd *d = keyed ? &g_keyed_daemon : &g_fuzz_daemon;

	if (!d->loop) {
		start(d, keyed ? "fuzz-keyed" : "fuzz", keyed);
	}
	return d;
}

void fuzz_daemon_turns(struct rdmaxd *daemon, int turns)
{
	for (int i = 0; i < turns; i++) {
		uv_run(daemon->loop, UV_RUN_NOWAIT);
	}
}

uint16_t fuzz_daemon_tcp_port(struct rdmaxd *daemon)
{
	struct transport *t = daemon->transports[ENDPOINT_TCP];
	struct endpoint ep;

	must(t->ops->endpoints(t, NULL, &ep, 1), "tcp endpoints");
	return ep.port;
}

bool fuzz_daemon_settle(struct rdmaxd *daemon, int timeout_ms)
{
	uint64_t deadline = fuzz_now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		uv_run(daemon->loop, UV_RUN_NOWAIT);
		bool clients = daemon->ipc && ipc_client_count(daemon->ipc) > 0;
		if (!clients && engine_outstanding(daemon->engine) == 0) {
			return true;
		}
		if (fuzz_now_ms() > deadline) {
			return false;
		}
		usleep(200);
	}
}
