/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of daemon/config.c: defaults, every key, every kind of error with
 * its line number (checked against what libinih itself reports), --set
 * overrides, cross-field validation, the print/load round trip, and that the
 * shipped example file and man page cover every key.
 */
#include <check.h>
#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

Suite *config_suite(void);

#define EXAMPLE_PATH "config/rdmaxd.conf"
#define MAN_PATH     "docs/man/rdmaxd.conf.5"

/* Write text to a new temporary file; the caller unlinks path. */
static void write_temp(const char *text, char *path, size_t path_size)
{
	int fd;
	size_t len = strlen(text);

	snprintf(path, path_size, "/tmp/rdmaxd-config-test-XXXXXX");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
	ck_assert_int_eq(close(fd), 0);
}

/* Load text as a file over cfg; err gets the message with the temp path replaced by "F". */
static int load_text(struct config *cfg, const char *text, char *err, size_t err_size)
{
	char path[64], raw[CONFIG_ERR_MAX];
	int r;

	write_temp(text, path, sizeof(path));
	raw[0] = '\0';
	r = config_load(cfg, path, raw, sizeof(raw));
	ck_assert_int_eq(unlink(path), 0);
	if (strncmp(raw, path, strlen(path)) == 0) {
		snprintf(err, err_size, "F%s", raw + strlen(path));
	} else {
		snprintf(err, err_size, "%s", raw);
	}
	return r;
}

static char *print_to_string(const struct config *cfg)
{
	char *buf = NULL;
	size_t size = 0;
	FILE *f = open_memstream(&buf, &size);

	ck_assert_ptr_nonnull(f);
	config_print(cfg, f);
	ck_assert_int_eq(fclose(f), 0);
	return buf;
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "re");
	char *buf;
	long size;

	if (!f) {
		return NULL;
	}
	ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
	size = ftell(f);
	ck_assert_int_ge(size, 0);
	rewind(f);
	buf = calloc(1, (size_t)size + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
	fclose(f);
	return buf;
}

/* ------------------------------------------------------------ defaults */

START_TEST(defaults_are_valid)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";
	char host[256] = "";

	config_defaults(&cfg);
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.socket_path, "/run/rdmaxd.sock");
	ck_assert_str_eq(cfg.admin_socket_path, "/run/rdmaxd-admin.sock");
	ck_assert_uint_eq(cfg.socket_mode, 0666);
	ck_assert_int_eq(gethostname(host, sizeof(host) - 1), 0);
	ck_assert_int_ne(cfg.node_name[0], '\0');
	ck_assert_int_eq(strncmp(cfg.node_name, host, strlen(cfg.node_name)), 0);
	ck_assert_int_eq(cfg.log_level, LOG_INFO);
	ck_assert_int_eq(cfg.transport, CONFIG_TRANSPORT_AUTO);
	ck_assert_str_eq(cfg.listen_addr, "127.0.0.1");
	ck_assert_uint_eq(cfg.listen_port, 7471);
	ck_assert_str_eq(cfg.advertise_addr, "");
	ck_assert_str_eq(cfg.auth_key_file, "");
	ck_assert_uint_eq(cfg.max_clients, 256);
	ck_assert_uint_eq(cfg.max_message_bytes, 1048576);
	ck_assert_uint_eq(cfg.max_fds_per_message, 4);
	ck_assert_uint_eq(cfg.max_regions, 1024);
	ck_assert_uint_eq(cfg.max_registered_bytes, 64ull << 30);
	ck_assert_uint_eq(cfg.max_outstanding_jobs, 4096);
	ck_assert_uint_eq(cfg.max_jobs_per_submit, 1024);
	ck_assert_uint_eq(cfg.max_connections, 1024);
	ck_assert_uint_eq(cfg.max_imm_counters, 65536);
	ck_assert_uint_eq(cfg.connect_timeout_ms, 3000);
	ck_assert_uint_eq(cfg.connect_retries, 3);
	ck_assert_uint_eq(cfg.retry_backoff_ms, 100);
	ck_assert_uint_eq(cfg.peer_timeout_ms, 10000);
	ck_assert_uint_eq(cfg.idle_timeout_s, 300);
	ck_assert_uint_eq(cfg.chunk_bytes, 1048576);
	ck_assert_uint_eq(cfg.tcp_chunk_bytes, 4 << 20);
	ck_assert_uint_eq(cfg.busy_poll_us, 1000);
	ck_assert_str_eq(cfg.loop_cpus, "");
	ck_assert_str_eq(cfg.worker_cpus, "");
	ck_assert_str_eq(cfg.devices, "auto");
	ck_assert_uint_eq(cfg.qps_per_peer, 2);
	ck_assert_uint_eq(cfg.inline_threshold, 64);
	ck_assert_uint_eq(cfg.signal_interval, 16);
	ck_assert_int_eq(cfg.isolation, CONFIG_ISOLATION_SHARED);
	ck_assert_str_eq(config_isolation_name(CONFIG_ISOLATION_PER_UID), "per-uid");
	ck_assert_uint_eq(cfg.max_isolation_domains, 256);
	ck_assert_str_eq(config_transport_name(CONFIG_TRANSPORT_VERBS), "verbs");
	ck_assert_str_eq(config_transport_name(CONFIG_TRANSPORT_MAX), "unknown");
}
END_TEST

/* Every key set to a value that is not its default. */
static const char g_every_key[] = "; all keys\n"
				  "[daemon]\n"
				  "socket = /tmp/rdmaxd-test.sock\n"
				  "admin_socket = /tmp/rdmaxd-test-admin.sock\n"
				  "admin_group = ops\n"
				  "socket_mode = 0660\n"
				  "node_name = node-7.rack_2\n"
				  "log_level = debug\n"
				  "[transport]\n"
				  "type = tcp\n"
				  "listen = ::\n"
				  "port = 0\n"
				  "advertise = fd00::17\n"
				  "tcp_encryption = on\n"
				  "tcp_io_threads = 5\n"
				  "tcp_chunk_bytes = 256K\n"
				  "[auth]\n"
				  "key_file = /etc/rdmaxd/key\n"
				  "[limits]\n"
				  "max_clients = 17\n"
				  "max_message_bytes = 64K\n"
				  "max_fds_per_message = 253\n"
				  "max_regions = 1048576\n"
				  "max_registered_bytes = 3T\n"
				  "max_outstanding_jobs = 100\n"
				  "max_jobs_per_submit = 10\n"
				  "max_connections = 2\n"
				  "max_isolation_domains = 8\n"
				  "max_imm_counters = 16777216\n"
				  "hello_timeout_ms = 250\n"
				  "per_uid_clients = 3\n"
				  "per_uid_regions = 5\n"
				  "per_uid_registered_bytes = 1G\n"
				  "per_uid_outstanding_jobs = 7\n"
				  "per_uid_imm_counters = 9\n"
				  "per_uid_mailboxes = 11\n"
				  "per_uid_queued_message_bytes = 1M\n"
				  "per_uid_peer_connections = 13\n"
				  "admin_max_connections = 2\n"
				  "admin_idle_timeout_ms = 1500\n"
				  "[peers]\n"
				  "connect_timeout_ms = 10\n"
				  "connect_retries = 0\n"
				  "retry_backoff_ms = 60000\n"
				  "peer_timeout_ms = 3600000\n"
				  "idle_timeout_s = 0\n"
				  "handshake_timeout_ms = 10\n"
				  "max_handshakes = 1\n"
				  "max_handshakes_per_host = 65536\n"
				  "max_connections_per_host = 1\n"
				  "reserved_outgoing = 0\n"
				  "min_frame_rate_kib_s = 16777216\n"
				  "[engine]\n"
				  "chunk_bytes = 4194304\n"
				  "busy_poll_us = 0\n"
				  "loop_cpus = 0\n"
				  "worker_cpus = 1-3,6\n"
				  "rail_retry_ms = 250\n"
				  "[verbs]\n"
				  "devices = mlx5_0,mlx5_1\n"
				  "pin = prefill-*=mlx5_0 decode=mlx5_0+mlx5_1\n"
				  "qps_per_peer = 64\n"
				  "inline_threshold = 0\n"
				  "signal_interval = 1\n"
				  "isolation = per-uid\n"
				  "[metrics]\n"
				  "textfile_dir = /var/lib/node-exporter\n"
				  "textfile_interval_s = 60\n"
				  "job_stages = true\n"
				  "[discovery]\n"
				  "backend = etcd\n"
				  "endpoints = https://10.0.0.1:2379,https://10.0.0.2:2379\n"
				  "prefix = /rdmaxd/prod-a/\n"
				  "ttl_s = 30\n"
				  "ca_file = /etc/rdmaxd/etcd-ca.pem\n"
				  "cert_file = /etc/rdmaxd/etcd.pem\n"
				  "key_file = /etc/rdmaxd/etcd.key\n"
				  "user = rdmaxd\n"
				  "password_file = /etc/rdmaxd/etcd.password\n"
				  "[gpu]\n"
				  "registration = peermem\n"
				  "pool_bytes = 2G\n"
				  "[qos]\n"
				  "enabled = true\n"
				  "latency_weight = 1000\n"
				  "bulk_weight = 3\n"
				  "default_class = latency\n"
				  "max_in_flight = 65536\n"
				  "latency_reserve = 65535\n"
				  "lane_linger_ms = 0\n";

START_TEST(every_key_is_parsed)
{
	struct config cfg, def;
	char err[CONFIG_ERR_MAX] = "";
	char *a, *b, *pa, *pb;
	int keys = 0, differ = 0;

	config_defaults(&cfg);
	ck_assert_msg(load_text(&cfg, g_every_key, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.socket_path, "/tmp/rdmaxd-test.sock");
	ck_assert_str_eq(cfg.admin_socket_path, "/tmp/rdmaxd-test-admin.sock");
	ck_assert_uint_eq(cfg.socket_mode, 0660);
	ck_assert_str_eq(cfg.node_name, "node-7.rack_2");
	ck_assert_int_eq(cfg.log_level, LOG_DEBUG);
	ck_assert_int_eq(cfg.transport, CONFIG_TRANSPORT_TCP);
	ck_assert_str_eq(cfg.listen_addr, "::");
	ck_assert_uint_eq(cfg.listen_port, 0);
	ck_assert_str_eq(cfg.advertise_addr, "fd00::17");
	ck_assert(cfg.tcp_encryption);
	ck_assert_uint_eq(cfg.tcp_io_threads, 5);
	ck_assert_uint_eq(cfg.tcp_chunk_bytes, 256 << 10);
	ck_assert_str_eq(cfg.auth_key_file, "/etc/rdmaxd/key");
	ck_assert_uint_eq(cfg.max_clients, 17);
	ck_assert_uint_eq(cfg.max_message_bytes, 65536);
	ck_assert_uint_eq(cfg.max_fds_per_message, 253);
	ck_assert_uint_eq(cfg.max_regions, 1048576);
	ck_assert_uint_eq(cfg.max_registered_bytes, 3ull << 40);
	ck_assert_uint_eq(cfg.max_outstanding_jobs, 100);
	ck_assert_uint_eq(cfg.max_jobs_per_submit, 10);
	ck_assert_uint_eq(cfg.max_connections, 2);
	ck_assert_uint_eq(cfg.max_imm_counters, 16777216);
	ck_assert_uint_eq(cfg.hello_timeout_ms, 250);
	ck_assert_uint_eq(cfg.per_uid_clients, 3);
	ck_assert_uint_eq(cfg.per_uid_regions, 5);
	ck_assert_uint_eq(cfg.per_uid_registered_bytes, 1ull << 30);
	ck_assert_uint_eq(cfg.per_uid_outstanding_jobs, 7);
	ck_assert_uint_eq(cfg.per_uid_imm_counters, 9);
	ck_assert_uint_eq(cfg.per_uid_mailboxes, 11);
	ck_assert_uint_eq(cfg.per_uid_queued_message_bytes, 1u << 20);
	ck_assert_uint_eq(cfg.per_uid_peer_connections, 13);
	ck_assert_uint_eq(cfg.admin_max_connections, 2);
	ck_assert_uint_eq(cfg.admin_idle_timeout_ms, 1500);
	ck_assert_uint_eq(cfg.connect_timeout_ms, 10);
	ck_assert_uint_eq(cfg.connect_retries, 0);
	ck_assert_uint_eq(cfg.retry_backoff_ms, 60000);
	ck_assert_uint_eq(cfg.peer_timeout_ms, 3600000);
	ck_assert_uint_eq(cfg.idle_timeout_s, 0);
	ck_assert_uint_eq(cfg.handshake_timeout_ms, 10);
	ck_assert_uint_eq(cfg.max_handshakes, 1);
	ck_assert_uint_eq(cfg.max_handshakes_per_host, 65536);
	ck_assert_uint_eq(cfg.max_connections_per_host, 1);
	ck_assert_uint_eq(cfg.reserved_outgoing, 0);
	ck_assert_uint_eq(cfg.min_frame_rate_kib_s, 16777216);
	ck_assert_uint_eq(cfg.chunk_bytes, 4 << 20);
	ck_assert_uint_eq(cfg.busy_poll_us, 0);
	ck_assert_str_eq(cfg.loop_cpus, "0");
	ck_assert_str_eq(cfg.worker_cpus, "1-3,6");
	ck_assert_str_eq(cfg.devices, "mlx5_0,mlx5_1");
	ck_assert_str_eq(cfg.pin, "prefill-*=mlx5_0 decode=mlx5_0+mlx5_1");
	ck_assert_uint_eq(cfg.rail_retry_ms, 250);
	ck_assert_uint_eq(cfg.qps_per_peer, 64);
	ck_assert_uint_eq(cfg.inline_threshold, 0);
	ck_assert_uint_eq(cfg.signal_interval, 1);
	ck_assert_int_eq(cfg.isolation, CONFIG_ISOLATION_PER_UID);
	ck_assert_uint_eq(cfg.max_isolation_domains, 8);
	ck_assert_str_eq(cfg.discovery_backend, "etcd");
	ck_assert_str_eq(cfg.discovery_endpoints, "https://10.0.0.1:2379,https://10.0.0.2:2379");
	ck_assert_str_eq(cfg.discovery_prefix, "/rdmaxd/prod-a/");
	ck_assert_uint_eq(cfg.discovery_ttl_s, 30);
	ck_assert_str_eq(cfg.discovery_user, "rdmaxd");
	ck_assert_str_eq(cfg.discovery_password_file, "/etc/rdmaxd/etcd.password");
	ck_assert_int_eq(cfg.gpu_registration, CONFIG_GPU_REG_PEERMEM);
	ck_assert_uint_eq(cfg.gpu_pool_bytes, 2ull << 30);
	ck_assert(cfg.metrics_job_stages);
	ck_assert(cfg.qos_enabled);
	ck_assert_uint_eq(cfg.qos_weight[0], 1000);
	ck_assert_uint_eq(cfg.qos_weight[1], 3);
	ck_assert_uint_eq(cfg.qos_default_class, 0);
	ck_assert_uint_eq(cfg.qos_max_in_flight, 65536);
	ck_assert_uint_eq(cfg.qos_latency_reserve, 65535);
	ck_assert_uint_eq(cfg.qos_lane_linger_ms, 0);

	/* The file above must change every key config_print knows, so none is left untested. */
	config_defaults(&def);
	a = print_to_string(&def);
	b = print_to_string(&cfg);
	for (pa = a, pb = b; *pa && *pb;) {
		size_t la = strcspn(pa, "\n"), lb = strcspn(pb, "\n");

		if (memchr(pa, '=', la)) {
			keys++;
			differ += la != lb || memcmp(pa, pb, la) != 0;
		}
		pa += la + (pa[la] == '\n');
		pb += lb + (pb[lb] == '\n');
	}
	ck_assert_int_eq(keys, 78);
	ck_assert_int_eq(differ, keys);
	free(a);
	free(b);
}
END_TEST

START_TEST(file_syntax_accepted)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";

	config_defaults(&cfg);
	/* BOM, CRLF, comments of both kinds, an inline ';' comment, ':' separator, duplicates. */
	ck_assert_msg(load_text(&cfg,
				"\xEF\xBB\xBF"
				"# comment\r\n"
				"; comment\r\n"
				"   ; indented comment\r\n"
				"\r\n"
				"[limits]\r\n"
				"max_regions = 5 ; five\r\n"
				"max_clients: 9\r\n"
				"max_regions = 6\r\n"
				"[limits] ; again\r\n"
				"max_connections=3\r\n",
				err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert_uint_eq(cfg.max_regions, 6);
	ck_assert_uint_eq(cfg.max_clients, 9);
	ck_assert_uint_eq(cfg.max_connections, 3);

	/* An empty file changes nothing. */
	ck_assert_int_eq(load_text(&cfg, "", err, sizeof(err)), 0);
	ck_assert_uint_eq(cfg.max_regions, 6);
}
END_TEST

/* ------------------------------------------------------------- errors */

struct load_case {
	const char *text;
	const char *err;     /* expected message, temp path shown as "F" */
	bool libinih_syntax; /* libinih itself must report the same line */
};

static int accept_all(void *user, const char *section, const char *name, const char *value)
{
	return 1;
}

START_TEST(load_errors_name_the_line)
{
	static const struct load_case cases[] = {
		{"[limits]\nmax_regions = abc\n",
		 "F:2: invalid value 'abc' for [limits] max_regions: not a number", false},
		{"\n\n[limits]\nfoo = 1\n", "F:4: unknown key 'foo' in section [limits]", false},
		{"[daemon]\n[foo]\n", "F:2: unknown section [foo]", false},
		{"[ daemon ]\n", "F:1: unknown section [ daemon ]", false},
		{"[]\n", "F:1: unknown section []", false},
		{"max_regions = 5\n", "F:1: key 'max_regions' is outside of any section", false},
		{"[limits]\n= 5\n", "F:2: missing key name before '='", false},
		{"[limits]\nmax_regions = 5\n  max_clients = 3\n",
		 "F:3: indented line: remove the leading blanks (an indented line continues the "
		 "previous value)",
		 false},
		{"[daemon]\nlog_level = info\nthis line has no equals sign\n",
		 "F:3: syntax error: expected 'key = value', '[section]' or a comment", true},
		{"; header\n[daemon\nlog_level = info\n",
		 "F:2: syntax error: section header without ']'", true},
		{"[daemon] x\n", "F:1: syntax error: unexpected text after ']'", false},
		{"[daemon]\nlog_level ; = info\n",
		 "F:2: syntax error: expected 'key = value', '[section]' or a comment", true},
		{"[daemon ;]\n", "F:1: syntax error: section header without ']'", true},
		{"[limits]\nmax_regions = -1\n",
		 "F:2: invalid value '-1' for [limits] "
		 "max_regions: negative numbers are not allowed",
		 false},
		{"[limits]\nmax_regions =\n",
		 "F:2: invalid value '' for [limits] max_regions: empty value", false},
		{"[limits]\nmax_regions = 5 # five\n",
		 "F:2: invalid value '5 # five' for [limits] "
		 "max_regions: unexpected text after the "
		 "number",
		 false},
		{"[limits]\nmax_regions = 1K\n",
		 "F:2: invalid value '1K' for [limits] "
		 "max_regions: unexpected text after the number",
		 false},
		{"[limits]\nmax_fds_per_message = 254\n",
		 "F:2: invalid value '254' for [limits] max_fds_per_message: out of range "
		 "(1..253)",
		 false},
		{"[limits]\nmax_message_bytes = 2k\n",
		 "F:2: invalid value '2k' for [limits] max_message_bytes: out of range (4K..64M)",
		 false},
		{"[limits]\nmax_message_bytes = 1X\n",
		 "F:2: invalid value '1X' for [limits] max_message_bytes: unknown size suffix (use "
		 "K, "
		 "M, G or T)",
		 false},
		{"[limits]\nmax_message_bytes = 1KB\n",
		 "F:2: invalid value '1KB' for [limits] max_message_bytes: unexpected text after "
		 "the "
		 "number (sizes take one suffix: K, M, G or T)",
		 false},
		{"[limits]\nmax_registered_bytes = 18446744073709551616\n",
		 "F:2: invalid value '18446744073709551616' for [limits] max_registered_bytes: "
		 "number "
		 "too large (4K..1024T)",
		 false},
		{"[limits]\nmax_registered_bytes = 16777216T\n",
		 "F:2: invalid value '16777216T' for [limits] max_registered_bytes: number too "
		 "large "
		 "(4K..1024T)",
		 false},
		{"[transport]\nport = 65536\n",
		 "F:2: invalid value '65536' for [transport] port: out of range (0..65535)", false},
		{"[transport]\nlisten = localhost\n",
		 "F:2: invalid value 'localhost' for [transport] listen: not a numeric IPv4 or "
		 "IPv6 "
		 "address",
		 false},
		{"[transport]\nadvertise = 0.0.0.0\n",
		 "F:2: invalid value '0.0.0.0' for [transport] advertise: peers cannot connect to "
		 "a "
		 "wildcard address",
		 false},
		{"[transport]\ntype = rdma\n",
		 "F:2: invalid value 'rdma' for [transport] type: expected auto, tcp or verbs",
		 false},
		{"[gpu]\nregistration = gdr\n",
		 "F:2: invalid value 'gdr' for [gpu] registration: expected auto, dmabuf or "
		 "peermem",
		 false},
		{"[daemon]\nlog_level = verbose\n",
		 "F:2: invalid value 'verbose' for [daemon] "
		 "log_level: expected err, warning, notice, "
		 "info or debug",
		 false},
		{"[daemon]\nsocket_mode = 0669\n",
		 "F:2: invalid value '0669' for [daemon] "
		 "socket_mode: not an octal mode such as 0660",
		 false},
		{"[daemon]\nsocket_mode = 01777\n",
		 "F:2: invalid value '01777' for [daemon] socket_mode: out of range (0000..0777)",
		 false},
		{"[daemon]\nsocket = run/rdmaxd.sock\n",
		 "F:2: invalid value 'run/rdmaxd.sock' for [daemon] socket: not an absolute path",
		 false},
		{"[daemon]\nnode_name = a/b\n",
		 "F:2: invalid value 'a/b' for [daemon] node_name: only letters, digits, '.', '-' "
		 "and '_' are allowed",
		 false},
		{"[verbs]\ndevices = mlx5_0,,mlx5_1\n",
		 "F:2: invalid value 'mlx5_0,,mlx5_1' for [verbs] devices: expected auto or "
		 "comma-separated device names (letters, digits, '.', '-', '_')",
		 false},
		{"[verbs]\ndevices = mlx5_0,mlx5_0\n",
		 "F:2: invalid value 'mlx5_0,mlx5_0' for "
		 "[verbs] devices: a device is listed twice",
		 false},
		/* The first error wins, wherever it comes from. */
		{"[limits]\nmax_regions = x\n[nope]\n",
		 "F:2: invalid value 'x' for [limits] max_regions: not a number", false},
		{"[limits]\nbad line\nmax_regions = x\n",
		 "F:2: syntax error: expected 'key = value', '[section]' or a comment", true},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct config cfg;
		char err[CONFIG_ERR_MAX] = "";
		int r;

		config_defaults(&cfg);
		r = load_text(&cfg, cases[i].text, err, sizeof(err));
		ck_assert_msg(r == -EINVAL, "case %zu: returned %d", i, r);
		ck_assert_msg(strcmp(err, cases[i].err) == 0, "case %zu: got '%s', want '%s'", i,
			      err, cases[i].err);
		if (cases[i].libinih_syntax) {
			/* Our line count must agree with libinih's own report for the line. */
			char path[64];
			unsigned line = (unsigned)strtoul(cases[i].err + 2, NULL, 10);

			write_temp(cases[i].text, path, sizeof(path));
			ck_assert_int_eq(ini_parse(path, accept_all, NULL), (int)line);
			ck_assert_int_eq(unlink(path), 0);
		}
	}
}
END_TEST

START_TEST(long_line_is_refused)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";
	char text[512];
	char path[64];

	/* libinih would cut this line in two and read the tail as line 3. */
	snprintf(text, sizeof(text), "[daemon]\nnode_name = %0*d\n[limits]\nmax_regions = 1\n", 250,
		 7);
	config_defaults(&cfg);
	ck_assert_int_eq(load_text(&cfg, text, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "F:2: line longer than 199 characters");

	write_temp(text, path, sizeof(path));
	ck_assert_int_eq(ini_parse(path, accept_all, NULL), 3);
	ck_assert_int_eq(unlink(path), 0);
}
END_TEST

START_TEST(failed_load_changes_nothing)
{
	struct config cfg, before;
	char err[CONFIG_ERR_MAX] = "";
	char *a, *b;

	config_defaults(&cfg);
	before = cfg;
	ck_assert_int_eq(
		load_text(&cfg, "[limits]\nmax_regions = 7\nmax_clients = x\n", err, sizeof(err)),
		-EINVAL);
	a = print_to_string(&before);
	b = print_to_string(&cfg);
	ck_assert_str_eq(a, b);
	free(a);
	free(b);
}
END_TEST

START_TEST(unopenable_file)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";

	config_defaults(&cfg);
	ck_assert_int_eq(config_load(&cfg, "/nonexistent/rdmaxd.conf", err, sizeof(err)), -ENOENT);
	ck_assert_str_eq(err, "cannot open '/nonexistent/rdmaxd.conf': No such file or directory");
	ck_assert_int_eq(config_load(&cfg, "/tmp", err, sizeof(err)), -EISDIR);
	ck_assert_str_eq(err, "cannot read '/tmp': Is a directory");
	/* A NULL error buffer is allowed. */
	ck_assert_int_eq(config_load(&cfg, "/nonexistent/rdmaxd.conf", NULL, 0), -ENOENT);
}
END_TEST

/* ---------------------------------------------------------- config_set */

START_TEST(set_keys_and_errors)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";

	config_defaults(&cfg);
	ck_assert_int_eq(config_set(&cfg, "limits", "max_regions", "12", err, sizeof(err)), 0);
	ck_assert_uint_eq(cfg.max_regions, 12);
	ck_assert_int_eq(config_set(&cfg, "engine", "chunk_bytes", "2m", err, sizeof(err)), 0);
	ck_assert_uint_eq(cfg.chunk_bytes, 2 << 20);
	ck_assert_int_eq(config_set(&cfg, "daemon", "log_level", "4", err, sizeof(err)), 0);
	ck_assert_int_eq(cfg.log_level, LOG_WARNING);
	ck_assert_int_eq(config_set(&cfg, "daemon", "log_level", "warn", err, sizeof(err)), 0);
	ck_assert_int_eq(cfg.log_level, LOG_WARNING);
	ck_assert_int_eq(config_set(&cfg, "verbs", "devices", " mlx5_0 , rxe0 ", err, sizeof(err)),
			 -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "verbs", "devices", "mlx5_0 , rxe0", err, sizeof(err)),
			 0);
	ck_assert_str_eq(cfg.devices, "mlx5_0,rxe0");
	ck_assert_int_eq(config_set(&cfg, "engine", "loop_cpus", "0,2-3", err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.loop_cpus, "0,2-3");
	ck_assert_int_eq(config_set(&cfg, "engine", "worker_cpus", "3-1", err, sizeof(err)),
			 -EINVAL);
	ck_assert_str_eq(err, "invalid value '3-1' for [engine] worker_cpus: a range must not go "
			      "downwards");
	ck_assert_int_eq(config_set(&cfg, "engine", "loop_cpus", "", err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.loop_cpus, "");
	/* Empty node_name means the host name again. */
	ck_assert_int_eq(config_set(&cfg, "daemon", "node_name", "x", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "daemon", "node_name", "", err, sizeof(err)), 0);
	ck_assert_int_ne(cfg.node_name[0], '\0');
	ck_assert_str_ne(cfg.node_name, "x");

	ck_assert_int_eq(config_set(&cfg, "limits", "foo", "1", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "unknown key 'foo' in section [limits]");
	ck_assert_int_eq(config_set(&cfg, "limit", "max_regions", "1", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "unknown section [limit]");
	ck_assert_int_eq(config_set(&cfg, "limits", "max_regions", "0", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err,
			 "invalid value '0' for [limits] max_regions: out of range (1..1048576)");
	ck_assert_int_eq(config_set(&cfg, "limits", "max_regions", " 5", err, sizeof(err)),
			 -EINVAL);
	ck_assert_str_eq(err, "invalid value ' 5' for [limits] max_regions: not a number");
	ck_assert_int_eq(config_set(&cfg, "limits", "max_regions", "+5", err, sizeof(err)),
			 -EINVAL);
	ck_assert_str_eq(err, "invalid value '+5' for [limits] max_regions: not a number");
	/* Values that config_print could not write back are refused. */
	ck_assert_int_eq(config_set(&cfg, "auth", "key_file", "/a ;b", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "invalid value '/a ;b' for [auth] key_file: ' ;' would start a "
			      "comment");
	ck_assert_int_eq(config_set(&cfg, "auth", "key_file", "/a\nb", err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "auth", "key_file", "/a ", err, sizeof(err)), -EINVAL);
	ck_assert_uint_eq(cfg.max_regions, 12);
	ck_assert_str_eq(cfg.auth_key_file, "");
}
END_TEST

START_TEST(set_string_lengths)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";
	char value[300];

	config_defaults(&cfg);
	/* "key_file = " plus the value must fit libinih's 199-character line. */
	value[0] = '/';
	memset(value + 1, 'k', 187);
	value[188] = '\0';
	ck_assert_int_eq(config_set(&cfg, "auth", "key_file", value, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.auth_key_file, value);
	value[188] = 'k';
	value[189] = '\0';
	ck_assert_int_eq(config_set(&cfg, "auth", "key_file", value, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, ": too long (at most 188 characters)") != NULL, "%s", err);

	/* A socket path fills sun_path, terminator included. */
	memset(value + 1, 's', 106);
	value[107] = '\0';
	ck_assert_int_eq(config_set(&cfg, "daemon", "socket", value, err, sizeof(err)), 0);
	value[107] = 's';
	value[108] = '\0';
	ck_assert_int_eq(config_set(&cfg, "daemon", "socket", value, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, ": too long (at most 107 characters)") != NULL, "%s", err);

	memset(value, 'n', 63);
	value[63] = '\0';
	ck_assert_int_eq(config_set(&cfg, "daemon", "node_name", value, err, sizeof(err)), 0);
	value[63] = 'n';
	value[64] = '\0';
	ck_assert_int_eq(config_set(&cfg, "daemon", "node_name", value, err, sizeof(err)), -EINVAL);
}
END_TEST

START_TEST(set_option_syntax)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";

	config_defaults(&cfg);
	ck_assert_int_eq(config_set_option(&cfg, "transport.port=9000", err, sizeof(err)), 0);
	ck_assert_uint_eq(cfg.listen_port, 9000);
	ck_assert_int_eq(config_set_option(&cfg, "auth.key_file=/etc/a=b", err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.auth_key_file, "/etc/a=b");
	ck_assert_int_eq(config_set_option(&cfg, "auth.key_file=", err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.auth_key_file, "");

	static const char *const bad[] = {"port=1",       "transport.port", ".port=1",
					  "transport.=1", "transport=a.b",  ""};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(config_set_option(&cfg, bad[i], err, sizeof(err)), -EINVAL);
		ck_assert_msg(strncmp(err, "expected section.key=value", 26) == 0, "%s: %s", bad[i],
			      err);
	}
	ck_assert_int_eq(config_set_option(&cfg, "transport.prot=1", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "unknown key 'prot' in section [transport]");
	ck_assert_uint_eq(cfg.listen_port, 9000);
}
END_TEST

/* ------------------------------------------------------------ validate */

START_TEST(pin_rules)
{
	const char *why = NULL;
	char devs[64];
	const char *rules = "prefill-gpu[01]=mlx5_0+mlx5_1  decode=mlx5_2 *=mlx5_3";

	ck_assert_int_eq(config_pin_check(rules, &why), 0);
	ck_assert_int_eq(config_pin_devices(rules, "prefill-gpu1", devs, sizeof(devs)), 1);
	ck_assert_str_eq(devs, "mlx5_0,mlx5_1");
	ck_assert_int_eq(config_pin_devices(rules, "decode", devs, sizeof(devs)), 1);
	ck_assert_str_eq(devs, "mlx5_2");
	/* The first matching rule wins; the catch-all only takes the rest. */
	ck_assert_int_eq(config_pin_devices(rules, "prefill-gpu7", devs, sizeof(devs)), 1);
	ck_assert_str_eq(devs, "mlx5_3");
	ck_assert_int_eq(config_pin_devices("decode=mlx5_2", "prefill", devs, sizeof(devs)), 0);
	ck_assert_int_eq(config_pin_devices("", "any", devs, sizeof(devs)), 0);
	ck_assert_int_eq(config_pin_devices(rules, "decode", devs, 4), -ENAMETOOLONG);

	const char *bad[] = {"decode", "=mlx5_0",  "decode=", "decode=mlx5_0+",
			     "a=b c",  "a=mlx5 0", "a=ml/x"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why = NULL;
		ck_assert_msg(config_pin_check(bad[i], &why) == -EINVAL, "'%s' accepted", bad[i]);
		ck_assert_ptr_nonnull(why);
	}
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";
	config_defaults(&cfg);
	ck_assert_int_eq(config_set(&cfg, "verbs", "pin", "x=", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(cfg.pin, "");
	ck_assert_int_eq(config_set(&cfg, "verbs", "pin", "x=mlx5_0", err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.pin, "x=mlx5_0");
}
END_TEST

START_TEST(validate_rules)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX] = "";

	config_defaults(&cfg);
	cfg.max_jobs_per_submit = cfg.max_outstanding_jobs + 1;
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "[limits] max_jobs_per_submit (4097) exceeds max_outstanding_jobs "
			      "(4096)");

	/* TLS takes its PSK from the shared key: no key, no start. */
	config_defaults(&cfg);
	cfg.tcp_encryption = true;
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "[transport] tcp_encryption = on needs [auth] key_file: the TLS key "
			      "is derived from it");
	snprintf(cfg.auth_key_file, sizeof(cfg.auth_key_file), "%s", "/etc/rdmaxd/key");
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "transport", "tcp_encryption", "yes", err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "expected off or on"), "%s", err);

	config_defaults(&cfg);
	snprintf(cfg.admin_socket_path, sizeof(cfg.admin_socket_path), "%s", cfg.socket_path);
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "[daemon] socket and admin_socket are both '/run/rdmaxd.sock'");

	config_defaults(&cfg);
	memset(cfg.socket_path, 'a', sizeof(cfg.socket_path));
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "[daemon] socket is not terminated");

	config_defaults(&cfg);
	cfg.socket_path[0] = '\0';
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);

	config_defaults(&cfg);
	snprintf(cfg.listen_addr, sizeof(cfg.listen_addr), "0.0.0.0");
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "[transport] advertise must be set when listen is the wildcard "
			      "address '0.0.0.0'");
	snprintf(cfg.advertise_addr, sizeof(cfg.advertise_addr), "10.0.0.5");
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), 0);

	/* Values put into the struct by code get the parser's range checks too. */
	config_defaults(&cfg);
	cfg.max_fds_per_message = 0;
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "invalid value '0' for [limits] max_fds_per_message: out of range "
			      "(1..253)");

	config_defaults(&cfg);
	cfg.log_level = 9;
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "[daemon] log_level 9 is out of range");

	config_defaults(&cfg);
	cfg.transport = CONFIG_TRANSPORT_MAX;
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);

	config_defaults(&cfg);
	cfg.node_name[0] = '\0';
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "[daemon] node_name is empty");

	config_defaults(&cfg);
	snprintf(cfg.auth_key_file, sizeof(cfg.auth_key_file), "%s", cfg.admin_socket_path);
	ck_assert_int_eq(config_validate(&cfg, err, sizeof(err)), -EINVAL);
}
END_TEST

START_TEST(restart_keys_follow_reload_rules)
{
	struct config def, cfg;
	char err[CONFIG_ERR_MAX] = "";
	char names[1024];

	config_defaults(&def);
	cfg = def;
	/* Only keys applied on SIGHUP changed: no restart needed. */
	ck_assert_int_eq(config_set(&cfg, "daemon", "log_level", "debug", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "limits", "max_clients", "3", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "auth", "key_file", "/k", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "peers", "peer_timeout_ms", "200", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "peers", "idle_timeout_s", "2", err, sizeof(err)), 0);
	ck_assert_int_eq(config_restart_keys(&def, &cfg, names, sizeof(names)), 0);
	ck_assert_str_eq(names, "");

	/* With every key changed, exactly the restart-only keys are named. */
	ck_assert_msg(load_text(&cfg, g_every_key, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(config_restart_keys(&def, &cfg, names, sizeof(names)), 38);
	ck_assert_str_eq(
		names, "[daemon] socket, [daemon] admin_socket, [daemon] admin_group, "
		       "[daemon] socket_mode, "
		       "[daemon] node_name, [transport] type, [transport] listen, "
		       "[transport] port, [transport] advertise, [transport] tcp_encryption, "
		       "[transport] tcp_io_threads, [transport] tcp_chunk_bytes, "
		       "[limits] max_message_bytes, [limits] max_isolation_domains, "
		       "[peers] connect_timeout_ms, "
		       "[peers] connect_retries, [peers] retry_backoff_ms, "
		       "[engine] chunk_bytes, [engine] busy_poll_us, "
		       "[verbs] devices, [verbs] pin, "
		       "[verbs] qps_per_peer, [verbs] inline_threshold, "
		       "[verbs] signal_interval, [verbs] isolation, [metrics] textfile_dir, "
		       "[metrics] textfile_interval_s, [discovery] backend, [discovery] endpoints, "
		       "[discovery] prefix, [discovery] ttl_s, [discovery] ca_file, "
		       "[discovery] cert_file, [discovery] key_file, [discovery] user, "
		       "[discovery] password_file, [gpu] registration, [gpu] pool_bytes");
}
END_TEST

/* ---------------------------------------------------------- round trip */

START_TEST(print_load_round_trip)
{
	struct config cfg, back;
	char err[CONFIG_ERR_MAX] = "";
	char path[64], long_path[200];
	char *a, *b;

	config_defaults(&cfg);
	ck_assert_msg(load_text(&cfg, g_every_key, err, sizeof(err)) == 0, "%s", err);
	/* The longest key_file that fits, an odd size and an empty string. */
	long_path[0] = '/';
	memset(long_path + 1, 'p', 187);
	long_path[188] = '\0';
	ck_assert_int_eq(config_set(&cfg, "auth", "key_file", long_path, err, sizeof(err)), 0);
	ck_assert_int_eq(
		config_set(&cfg, "limits", "max_registered_bytes", "1000001", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "transport", "advertise", "", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&cfg, "daemon", "socket_mode", "7", err, sizeof(err)), 0);

	a = print_to_string(&cfg);
	write_temp(a, path, sizeof(path));
	config_defaults(&back);
	ck_assert_msg(config_load(&back, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(unlink(path), 0);
	b = print_to_string(&back);
	ck_assert_str_eq(a, b);
	ck_assert_str_eq(back.auth_key_file, long_path);
	ck_assert_uint_eq(back.max_registered_bytes, 1000001);
	ck_assert_uint_eq(back.socket_mode, 07);
	ck_assert_str_eq(back.devices, "mlx5_0,mlx5_1");
	free(a);
	free(b);
}
END_TEST

START_TEST(example_file_matches_table)
{
	char *shipped = read_file(EXAMPLE_PATH);
	char *generated = NULL;
	size_t size = 0;
	FILE *f;
	struct config def, loaded;
	char err[CONFIG_ERR_MAX] = "";
	char *a, *b;

	if (!shipped) {
		printf("config: skipped example_file_matches_table: %s not found (run from the "
		       "repository root)\n",
		       EXAMPLE_PATH);
		return;
	}
	f = open_memstream(&generated, &size);
	ck_assert_ptr_nonnull(f);
	config_print_example(f);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_msg(strcmp(shipped, generated) == 0,
		      "%s is out of date with the key table in daemon/config.c; regenerate it "
		      "from config_print_example()",
		      EXAMPLE_PATH);

	/* The example loads, and changes nothing. */
	config_defaults(&def);
	loaded = def;
	ck_assert_msg(config_load(&loaded, EXAMPLE_PATH, err, sizeof(err)) == 0, "%s", err);
	a = print_to_string(&def);
	b = print_to_string(&loaded);
	ck_assert_str_eq(a, b);
	free(a);
	free(b);
	free(shipped);
	free(generated);
}
END_TEST

/* Drop roff font and escape sequences so the man page text can be compared. */
static void unroff(char *s)
{
	char *out = s;

	for (char *p = s; *p;) {
		if (p[0] == '\\' && p[1] == 'f' && p[2]) {
			p += 3;
		} else if (p[0] == '\\' && p[1] == '-') {
			*out++ = '-';
			p += 2;
		} else if (p[0] == '\\' && p[1] == '(' && p[2] == 'a' && p[3] == 'q') {
			*out++ = '\'';
			p += 4;
		} else if (p[0] == '\\' && p[1] == '&') {
			p += 2;
		} else {
			*out++ = *p++;
		}
	}
	*out = '\0';
}

START_TEST(man_page_documents_every_key)
{
	char *man = read_file(MAN_PATH);
	struct config def;
	char *printed, *line;
	int keys = 0;

	if (!man) {
		printf("config: skipped man_page_documents_every_key: %s not found (run from the "
		       "repository root)\n",
		       MAN_PATH);
		return;
	}
	config_defaults(&def);
	def.node_name[0] = '\0';
	printed = print_to_string(&def);
	for (line = strtok(printed, "\n"); line; line = strtok(NULL, "\n")) {
		char name[64], value[256], entry[96], want[300];
		char *at, *end, *para;
		int n = sscanf(line, "%63[a-z_] = %255[^\n]", name, value);

		if (n < 1) {
			continue;
		}
		if (n == 1) {
			value[0] = '\0';
		}
		keys++;
		snprintf(entry, sizeof(entry), "\n.TP\n.B %s\n", name);
		at = strstr(man, entry);
		ck_assert_msg(at != NULL, "%s has no entry '.TP .B %s'", MAN_PATH, name);
		at += strlen(entry);
		end = strstr(at, "\n.TP\n");
		if (!end || (strstr(at, "\n.S") && strstr(at, "\n.S") < end)) {
			end = strstr(at, "\n.S");
		}
		para = strndup(at, end ? (size_t)(end - at) : strlen(at));
		ck_assert_ptr_nonnull(para);
		unroff(para);
		snprintf(want, sizeof(want), "Default: %s", value[0] ? value : "empty");
		ck_assert_msg(strstr(para, want) != NULL, "%s: entry of %s lacks '%s'", MAN_PATH,
			      name, want);
		free(para);
	}
	ck_assert_int_eq(keys, 78);
	free(printed);
	free(man);
}
END_TEST

Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("config");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, defaults_are_valid);
	tcase_add_test(tc, every_key_is_parsed);
	tcase_add_test(tc, file_syntax_accepted);
	tcase_add_test(tc, load_errors_name_the_line);
	tcase_add_test(tc, long_line_is_refused);
	tcase_add_test(tc, failed_load_changes_nothing);
	tcase_add_test(tc, unopenable_file);
	tcase_add_test(tc, set_keys_and_errors);
	tcase_add_test(tc, set_string_lengths);
	tcase_add_test(tc, set_option_syntax);
	tcase_add_test(tc, validate_rules);
	tcase_add_test(tc, pin_rules);
	tcase_add_test(tc, restart_keys_follow_reload_rules);
	tcase_add_test(tc, print_load_round_trip);
	tcase_add_test(tc, example_file_matches_table);
	tcase_add_test(tc, man_page_documents_every_key);
	suite_add_tcase(s, tc);
	return s;
}
