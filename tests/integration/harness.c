/* SPDX-License-Identifier: MIT */
/*
 * Integration-test harness: starts and stops real rdmaxd processes, each in
 * its own directory under one run directory, connects real librdmax clients
 * and offers the bounded waits and data checks the cases share.
 *
 * A failed check assertion ends the test process with _exit(), so nothing
 * can clean up after it there. Instead every daemon is started with
 * PR_SET_PDEATHSIG (it dies with the test process), and the runner's
 * unchecked teardown, which runs in the parent after each case, prints the
 * log tail of every daemon directory a test left behind and removes it.
 * This file never talks to the daemon except through the public client API.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_WAIT_MS  20000
#define STOP_WAIT_MS   15000
#define LOG_TAIL_LINES 60

static char g_run_dir[64];
/* Daemons of this test process, so that a failure can say which one died. */
static struct itest_daemon *g_daemons[16];
static uint64_t g_seed;
static bool g_seed_set;

/* ------------------------------------------------------------- environment */

static const char *env_or(const char *name, const char *fallback)
{
	const char *v = getenv(name);

	return v && v[0] ? v : fallback;
}

const char *itest_addr_a(void)
{
	return env_or("RDMAX_TEST_ADDR_A", "127.0.0.1");
}

const char *itest_addr_b(void)
{
	return env_or("RDMAX_TEST_ADDR_B", "127.0.0.1");
}

const char *itest_transport(void)
{
	return env_or("RDMAX_TEST_TRANSPORT", "tcp");
}

/* RDMAX_TEST_FABRIC_STALL: a command taking "on"/"off" that stalls the test's fabric. */
static const char *fabric_stall_cmd(void)
{
	const char *cmd = getenv("RDMAX_TEST_FABRIC_STALL");

	return strcmp(itest_transport(), "tcp") != 0 && cmd && cmd[0] ? cmd : NULL;
}

static int fabric_stall(const char *how)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "%s %s", fabric_stall_cmd(), how);
	int status = system(cmd);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

bool itest_stopped_peer_stalls(void)
{
	return strcmp(itest_transport(), "tcp") == 0 || fabric_stall_cmd() != NULL;
}

int itest_daemon_resume_quiet(struct itest_daemon *d)
{
	if (d->fabric_stalled) {
		d->fabric_stalled = false;
		return fabric_stall("off") == 0 ? 0 : -EIO;
	}
	return kill(d->pid, SIGCONT) == 0 ? 0 : -errno;
}

bool itest_verbs_post_thread_forced(void)
{
	const char *v = getenv("RDMAXD_TEST_VERBS_POST_THREAD");

	/* As daemon/transport/verbs/transport_verbs.c reads it: any other value is off. */
	return v && strcmp(v, "1") == 0;
}

bool itest_verbs_software(void)
{
	const char *guest = getenv("RDMAX_GUEST");

	return strcmp(itest_transport(), "verbs") == 0 && guest && strcmp(guest, "1") == 0;
}

double itest_scale(void)
{
	const char *v = getenv("RDMAX_TEST_SCALE");
	char *end;
	double s;

	if (!v || !v[0]) {
		return 1.0;
	}
	s = strtod(v, &end);
	if (*end != '\0' || !(s > 0.0) || s > 16.0) {
		fprintf(stderr,
			"itest: ignoring RDMAX_TEST_SCALE='%s' (want a number in (0, 16])\n", v);
		return 1.0;
	}
	return s;
}

uint64_t itest_scaled(uint64_t n, uint64_t min)
{
	uint64_t v = (uint64_t)((double)n * itest_scale());

	return v < min ? min : v;
}

uint64_t itest_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void itest_sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
	}
}

/* ------------------------------------------------------------------ runner */

void itest_run_dir_init(void)
{
	snprintf(g_run_dir, sizeof(g_run_dir), "/tmp/rdmax-itest-XXXXXX");
	if (!mkdtemp(g_run_dir)) {
		fprintf(stderr, "itest: mkdtemp('%s') failed: %s\n", g_run_dir, strerror(errno));
		exit(EXIT_FAILURE);
	}
	(void)itest_seed();
}

static void remove_tree(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *e;

	if (!dir) {
		unlink(path);
		return;
	}
	while ((e = readdir(dir))) {
		char sub[512];
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
			continue;
		}
		snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
		if (e->d_type == DT_DIR) {
			remove_tree(sub);
		} else {
			unlink(sub);
		}
	}
	closedir(dir);
	rmdir(path);
}

static bool keep_dirs(void)
{
	return getenv("RDMAX_TEST_KEEP") && strcmp(getenv("RDMAX_TEST_KEEP"), "1") == 0;
}

void itest_run_dir_fini(void)
{
	if (!g_run_dir[0]) {
		return;
	}
	if (keep_dirs()) {
		fprintf(stderr, "itest: kept %s\n", g_run_dir);
		return;
	}
	remove_tree(g_run_dir);
}

static void print_tail(const char *path, const char *title, int lines)
{
	FILE *f = fopen(path, "r");
	long *starts;
	char line[1024];
	long pos = 0;
	size_t n = 0;

	if (!f) {
		fprintf(stderr, "---- %s: no log (%s)\n", title, strerror(errno));
		return;
	}
	starts = calloc((size_t)lines, sizeof(*starts));
	if (!starts) {
		fclose(f);
		return;
	}
	/* Remember where the last `lines` lines start, then print from the oldest. */
	while (fgets(line, sizeof(line), f)) {
		if (strchr(line, '\n') || feof(f)) {
			starts[n++ % (size_t)lines] = pos;
		}
		pos = ftell(f);
	}
	fprintf(stderr, "---- %s: last %zu lines of its log\n", title,
		n < (size_t)lines ? n : (size_t)lines);
	if (n > 0) {
		fseek(f, starts[n < (size_t)lines ? 0 : n % (size_t)lines], SEEK_SET);
		while (fgets(line, sizeof(line), f)) {
			fputs(line, stderr);
		}
	}
	fprintf(stderr, "---- end of %s\n", title);
	free(starts);
	fclose(f);
}

void itest_report_leftovers(void)
{
	if (fabric_stall_cmd()) {
		/* A test that failed with the link stalled must not stall the next ones. */
		fabric_stall("off");
	}
	DIR *dir = opendir(g_run_dir);
	struct dirent *e;

	if (!dir) {
		return;
	}
	while ((e = readdir(dir))) {
		char sub[384], path[448], test[128] = "?", title[1024];
		FILE *f;

		if (e->d_name[0] == '.') {
			continue;
		}
		snprintf(sub, sizeof(sub), "%s/%s", g_run_dir, e->d_name);
		snprintf(path, sizeof(path), "%s/test", sub);
		f = fopen(path, "r");
		if (f) {
			if (fgets(test, sizeof(test), f)) {
				test[strcspn(test, "\n")] = '\0';
			}
			fclose(f);
		}
		snprintf(title, sizeof(title), "daemon '%s' left by failed test '%s' (%s)",
			 e->d_name, test, sub);
		snprintf(path, sizeof(path), "%s/rdmaxd.log", sub);
		print_tail(path, title, LOG_TAIL_LINES);
		if (!keep_dirs()) {
			remove_tree(sub);
		}
	}
	closedir(dir);
}

void itest_open_socket_dirs(const struct itest_daemon *d)
{
	char path[sizeof(d->socket_path)];

	snprintf(path, sizeof(path), "%s", d->socket_path);
	for (int up = 0; up < 2; up++) {
		char *slash = strrchr(path, '/');
		ck_assert_ptr_nonnull(slash);
		*slash = '\0';
		ck_assert_int_eq(chmod(path, 0711), 0);
	}
}

void itest_child_setup(pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent) {
		_exit(127);
	}
}

/* ----------------------------------------------------------------- daemons */

/* The whole log is read, so a needle never falls between two reads. */
bool itest_log_contains(const struct itest_daemon *d, const char *needle)
{
	FILE *f = fopen(d->log_path, "re");
	char *text = NULL;
	size_t size = 0;
	bool found = false;

	if (!f) {
		return false;
	}
	FILE *mem = open_memstream(&text, &size);
	char buf[65536];
	size_t n;
	while (mem && (n = fread(buf, 1, sizeof(buf), f)) > 0) {
		fwrite(buf, 1, n, mem);
	}
	fclose(f);
	if (mem && fclose(mem) == 0) {
		found = strstr(text, needle) != NULL;
	}
	free(text);
	return found;
}

static const char *daemon_binary(void)
{
	static char path[512];

	snprintf(path, sizeof(path), "%s/rdmaxd", env_or("RDMAX_BUILD", "build"));
	return path;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	ck_assert_msg(fd >= 0, "open('%s') failed: %s", path, strerror(errno));
	ck_assert_msg(fchmod(fd, mode) == 0, "fchmod('%s') failed: %s", path, strerror(errno));
	size_t len = strlen(text);
	ck_assert_msg(write(fd, text, len) == (ssize_t)len, "write('%s') failed", path);
	close(fd);
}

struct itest_daemon *itest_daemon_new(const char *name, const char *addr)
{
	struct itest_daemon *d = calloc(1, sizeof(*d));
	char test[160], path[192];

	ck_assert_ptr_nonnull(d);
	ck_assert_msg(g_run_dir[0], "itest_run_dir_init() was not called");
	snprintf(d->name, sizeof(d->name), "%s", name);
	snprintf(d->addr, sizeof(d->addr), "%s", addr);
	snprintf(d->dir, sizeof(d->dir), "%s/%s-XXXXXX", g_run_dir, name);
	ck_assert_msg(mkdtemp(d->dir) != NULL, "mkdtemp('%s') failed: %s", d->dir, strerror(errno));
	snprintf(d->socket_path, sizeof(d->socket_path), "%s/rdmaxd.sock", d->dir);
	snprintf(d->log_path, sizeof(d->log_path), "%s/rdmaxd.log", d->dir);
	snprintf(d->conf_path, sizeof(d->conf_path), "%s/rdmaxd.conf", d->dir);
	snprintf(test, sizeof(test), "%s\n", tcase_name() ? tcase_name() : "?");
	/* Names the case in the leftover report of a failed test. */
	snprintf(path, sizeof(path), "%s/test", d->dir);
	write_file(path, test, 0644);
	for (size_t i = 0; i < sizeof(g_daemons) / sizeof(g_daemons[0]); i++) {
		if (!g_daemons[i]) {
			g_daemons[i] = d;
			break;
		}
	}
	/* An empty file keeps a system-wide /etc/rdmaxd/rdmaxd.conf out of the test. */
	write_file(d->conf_path, "; integration test: everything is on the command line\n", 0644);
	return d;
}

void itest_daemon_set(struct itest_daemon *d, const char *fmt, ...)
{
	va_list ap;
	char *s;

	ck_assert_int_lt(d->n_sets, ITEST_MAX_SETS);
	va_start(ap, fmt);
	ck_assert_int_ge(vasprintf(&s, fmt, ap), 0);
	va_end(ap);
	d->sets[d->n_sets++] = s;
}

void itest_daemon_auth_key(struct itest_daemon *d, const char *key)
{
	snprintf(d->key_path, sizeof(d->key_path), "%s/auth.key", d->dir);
	write_file(d->key_path, key, 0600);
}

void itest_daemon_port(struct itest_daemon *d, uint16_t port)
{
	d->port = port;
}

static int reap(struct itest_daemon *d, int timeout_ms, int *ret_status)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		int status;
		pid_t r = waitpid(d->pid, &status, WNOHANG);
		if (r == d->pid) {
			d->pid = 0;
			d->stopped = false;
			*ret_status = status;
			return 0;
		}
		if (r < 0 && errno != EINTR) {
			return -errno;
		}
		if (itest_now_ms() >= deadline) {
			return -ETIMEDOUT;
		}
		itest_sleep_ms(5);
	}
}

static const char *describe_status(int status, char *buf, size_t size)
{
	if (WIFEXITED(status)) {
		snprintf(buf, size, "exit status %d", WEXITSTATUS(status));
	} else if (WIFSIGNALED(status)) {
		snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	} else {
		snprintf(buf, size, "wait status 0x%x", status);
	}
	return buf;
}

void itest_daemon_start(struct itest_daemon *d)
{
	char port[16], title[128], why[96];
	char *argv[24 + 2 * ITEST_MAX_SETS];
	size_t n = 0;
	pid_t parent = getpid();
	int status;

	ck_assert_msg(d->pid == 0, "daemon '%s' is already running", d->name);
	snprintf(port, sizeof(port), "%u", (unsigned)d->port);
	argv[n++] = (char *)daemon_binary();
	argv[n++] = "--config";
	argv[n++] = d->conf_path;
	argv[n++] = "--socket";
	argv[n++] = d->socket_path;
	argv[n++] = "--listen";
	argv[n++] = d->addr;
	argv[n++] = "--port";
	argv[n++] = port;
	argv[n++] = "--transport";
	argv[n++] = (char *)itest_transport();
	argv[n++] = "--node-name";
	argv[n++] = d->name;
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	char admin[192];
	snprintf(admin, sizeof(admin), "daemon.admin_socket=%s/admin.sock", d->dir);
	argv[n++] = "--set";
	argv[n++] = admin;
	if (d->key_path[0]) {
		argv[n++] = "--auth-key-file";
		argv[n++] = d->key_path;
	}
	/* The whole suite under per-uid protection domains (RDMAX_TEST_ISOLATION=per-uid). */
	char isolation[64];
	const char *iso = getenv("RDMAX_TEST_ISOLATION");
	if (iso && iso[0]) {
		snprintf(isolation, sizeof(isolation), "verbs.isolation=%s", iso);
		argv[n++] = "--set";
		argv[n++] = isolation;
	}
	for (size_t i = 0; i < d->n_sets; i++) {
		argv[n++] = "--set";
		argv[n++] = d->sets[i];
	}
	argv[n] = NULL;

	pid_t pid = fork();
	ck_assert_msg(pid >= 0, "fork() failed: %s", strerror(errno));
	if (pid == 0) {
		itest_child_setup(parent);
		int log = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		int null = open("/dev/null", O_RDONLY);
		if (log < 0 || null < 0 || dup2(null, 0) < 0 || dup2(log, 1) < 0 ||
		    dup2(log, 2) < 0) {
			_exit(126);
		}
		execv(argv[0], argv);
		dprintf(2, "itest: execv('%s') failed: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	d->pid = pid;

	snprintf(title, sizeof(title), "daemon '%s'", d->name);
	uint64_t deadline = itest_now_ms() + START_WAIT_MS;
	int last = 0;
	for (;;) {
		struct rdmax_client *probe = NULL;

		if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
			d->pid = 0;
			print_tail(d->log_path, title, LOG_TAIL_LINES);
			ck_abort_msg("daemon '%s' did not start: %s", d->name,
				     describe_status(status, why, sizeof(why)));
		}
		last = rdmax_client_open(d->socket_path, "itest-probe", &probe);
		if (last == 0) {
			rdmax_client_close(probe);
			return;
		}
		if (itest_now_ms() >= deadline) {
			print_tail(d->log_path, title, LOG_TAIL_LINES);
			ck_abort_msg("daemon '%s' socket '%s' accepted no client within %d ms: %s",
				     d->name, d->socket_path, START_WAIT_MS, rdmax_err_name(last));
		}
		itest_sleep_ms(10);
	}
}

void itest_daemon_stop(struct itest_daemon *d)
{
	char title[128], why[96];
	int status;

	ck_assert_msg(d->pid > 0, "daemon '%s' is not running", d->name);
	snprintf(title, sizeof(title), "daemon '%s'", d->name);
	kill(d->pid, SIGTERM);
	if (d->fabric_stalled) {
		ck_assert_int_eq(itest_daemon_resume_quiet(d), 0);
	}
	if (d->stopped) {
		kill(d->pid, SIGCONT);
	}
	int ret = reap(d, STOP_WAIT_MS, &status);
	if (ret == -ETIMEDOUT) {
		print_tail(d->log_path, title, LOG_TAIL_LINES);
		kill(d->pid, SIGKILL);
		reap(d, STOP_WAIT_MS, &status);
		ck_abort_msg("daemon '%s' did not exit within %d ms of SIGTERM", d->name,
			     STOP_WAIT_MS);
	}
	ck_assert_msg(ret == 0, "waitpid() failed: %s", strerror(-ret));
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		print_tail(d->log_path, title, LOG_TAIL_LINES);
		ck_abort_msg("daemon '%s' stopped with %s, expected exit status 0", d->name,
			     describe_status(status, why, sizeof(why)));
	}
	ck_assert_msg(access(d->socket_path, F_OK) < 0 && errno == ENOENT,
		      "daemon '%s' left its socket '%s' behind", d->name, d->socket_path);
}

void itest_daemon_kill(struct itest_daemon *d)
{
	int status;

	ck_assert_msg(d->pid > 0, "daemon '%s' is not running", d->name);
	kill(d->pid, SIGKILL);
	if (d->fabric_stalled) {
		/* Dead now, as a stopped peer that is killed: its link works again. */
		ck_assert_int_eq(itest_daemon_resume_quiet(d), 0);
	}
	ck_assert_int_eq(reap(d, STOP_WAIT_MS, &status), 0);
	ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		      "daemon '%s' did not die from SIGKILL", d->name);
}

void itest_daemon_pause(struct itest_daemon *d)
{
	ck_assert(d->pid > 0);
	if (fabric_stall_cmd()) {
		/* The peer's NIC answers without its process: silence the link instead. */
		ck_assert_msg(fabric_stall("on") == 0, "'%s on' failed", fabric_stall_cmd());
		d->fabric_stalled = true;
	} else {
		ck_assert_int_eq(kill(d->pid, SIGSTOP), 0);
	}
	d->stopped = true;
}

void itest_daemon_resume(struct itest_daemon *d)
{
	ck_assert(d->pid > 0);
	ck_assert_int_eq(itest_daemon_resume_quiet(d), 0);
	d->stopped = false;
}

void itest_daemon_free(struct itest_daemon *d)
{
	int status;

	if (!d) {
		return;
	}
	if (d->pid > 0) {
		kill(d->pid, SIGKILL);
		reap(d, STOP_WAIT_MS, &status);
	}
	for (size_t i = 0; i < sizeof(g_daemons) / sizeof(g_daemons[0]); i++) {
		if (g_daemons[i] == d) {
			g_daemons[i] = NULL;
		}
	}
	for (size_t i = 0; i < d->n_sets; i++) {
		free(d->sets[i]);
	}
	if (!keep_dirs()) {
		remove_tree(d->dir);
	}
	free(d);
}

const char *itest_daemon_deaths(void)
{
	static char text[512];
	size_t used = 0;

	text[0] = '\0';
	/*
	 * Only called when a check already failed. A crashing daemon's sockets
	 * close before it becomes a zombie (a core dump takes a while): wait a bit.
	 */
	for (int tries = 0; tries < 20 && !text[0]; tries++) {
		if (tries > 0) {
			itest_sleep_ms(50);
		}
		for (size_t i = 0; i < sizeof(g_daemons) / sizeof(g_daemons[0]); i++) {
			struct itest_daemon *d = g_daemons[i];
			siginfo_t info;

			if (!d || d->pid <= 0) {
				continue;
			}
			/* Peek only (WNOWAIT): stop() and kill() still reap it. */
			memset(&info, 0, sizeof(info));
			if (waitid(P_PID, (id_t)d->pid, &info, WEXITED | WNOHANG | WNOWAIT) < 0 ||
			    info.si_pid != d->pid) {
				continue;
			}
			int n;
			if (info.si_code == CLD_EXITED) {
				n = snprintf(text + used, sizeof(text) - used,
					     "; daemon '%s' exited with status %d", d->name,
					     info.si_status);
			} else {
				n = snprintf(text + used, sizeof(text) - used,
					     "; daemon '%s' died from signal %d (%s)", d->name,
					     info.si_status, strsignal(info.si_status));
			}
			if (n < 0 || (size_t)n >= sizeof(text) - used) {
				break;
			}
			used += (size_t)n;
		}
	}
	return text;
}

void itest_daemon_print_log(const struct itest_daemon *d, int lines)
{
	char title[128];

	snprintf(title, sizeof(title), "daemon '%s'", d->name);
	print_tail(d->log_path, title, lines);
}

int itest_daemon_fd_count(const struct itest_daemon *d)
{
	char path[64];
	struct dirent *e;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
	DIR *dir = opendir(path);
	ck_assert_msg(dir != NULL, "opendir('%s') failed: %s", path, strerror(errno));
	while ((e = readdir(dir))) {
		if (e->d_name[0] != '.') {
			n++;
		}
	}
	closedir(dir);
	return n - 1; /* the directory stream itself is not the daemon's */
}

bool itest_daemon_maps(const struct itest_daemon *d, const char *needle)
{
	char path[64], line[1024];
	bool found = false;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)d->pid);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "fopen('%s') failed: %s", path, strerror(errno));
	while (!found && fgets(line, sizeof(line), f)) {
		found = strstr(line, needle) != NULL;
	}
	fclose(f);
	return found;
}

int itest_admin_reply(const struct itest_daemon *d, const char *cmd, char *reply, size_t size)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int ret = -1;

	int len = snprintf(NULL, 0, "%s/admin.sock", d->dir);
	if (size == 0 || len < 0 || (size_t)len >= sizeof(sa.sun_path)) {
		return -1;
	}
	memcpy(sa.sun_path, d->dir, strlen(d->dir));
	memcpy(sa.sun_path + strlen(d->dir), "/admin.sock", sizeof("/admin.sock"));
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		return -1;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    send(fd, cmd, strlen(cmd), MSG_NOSIGNAL) == (ssize_t)strlen(cmd)) {
		ssize_t n = recv(fd, reply, size - 1, 0);
		if (n > 0) {
			reply[n] = '\0';
			ret = 0;
		}
	}
	close(fd);
	return ret;
}

/* One field of the daemon's admin reply to cmd, or UINT64_MAX when it cannot be read. */
static uint64_t admin_field(const struct itest_daemon *d, const char *cmd, const char *field)
{
	char reply[65536], key[64];

	if (itest_admin_reply(d, cmd, reply, sizeof(reply)) < 0) {
		return UINT64_MAX;
	}
	snprintf(key, sizeof(key), "\"%s\":", field);
	const char *p = strstr(reply, key);
	return p ? strtoull(p + strlen(key), NULL, 10) : UINT64_MAX;
}

void itest_wait_status(const struct itest_daemon *d, const char *field, uint64_t want)
{
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS, got;

	while ((got = admin_field(d, "status", field)) != want && itest_now_ms() < deadline) {
		itest_sleep_ms(10);
	}
	ck_assert_msg(got == want,
		      "daemon %s: status field '%s' is %" PRIu64 ", waited for %" PRIu64, d->name,
		      field, got, want);
}

uint64_t itest_stats_field(const struct itest_daemon *d, const char *field)
{
	return admin_field(d, "stats", field);
}

void itest_wait_maps(const struct itest_daemon *d, const char *needle, bool want)
{
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	bool got;

	while ((got = itest_daemon_maps(d, needle)) != want && itest_now_ms() < deadline) {
		itest_sleep_ms(10);
	}
	ck_assert_msg(got == want, "daemon %s %s '%s' after %d ms", d->name,
		      want ? "does not map" : "still maps", needle, ITEST_WAIT_MS);
}

uint16_t itest_free_port(const char *addr)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd;

	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, addr, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		ss.ss_family = AF_INET;
		len = sizeof(struct sockaddr_in);
	} else {
		ck_assert_msg(inet_pton(AF_INET6, addr, &((struct sockaddr_in6 *)&ss)->sin6_addr) ==
				      1,
			      "'%s' is not a numeric address", addr);
		ss.ss_family = AF_INET6;
		len = sizeof(struct sockaddr_in6);
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_msg(fd >= 0, "socket() failed: %s", strerror(errno));
	ck_assert_msg(bind(fd, (struct sockaddr *)&ss, len) == 0, "bind('%s':0) failed: %s", addr,
		      strerror(errno));
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	close(fd);
	return ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
				       : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

/* ----------------------------------------------------------------- clients */

struct rdmax_client *itest_client(const struct itest_daemon *d, const char *name)
{
	uint64_t deadline = itest_now_ms() + ITEST_WAIT_MS;
	struct rdmax_client *c = NULL;
	int ret;

	for (;;) {
		ret = rdmax_client_open(d->socket_path, name, &c);
		if (ret == 0) {
			ck_assert_ptr_nonnull(c);
			return c;
		}
		if (itest_now_ms() >= deadline) {
			ck_abort_msg("rdmax_client_open('%s') for '%s' failed: %s%s",
				     d->socket_path, name, rdmax_err_name(ret),
				     itest_daemon_deaths());
		}
		itest_sleep_ms(10);
	}
}

struct rdmax_region *itest_alloc(struct rdmax_client *c, uint64_t length, uint32_t access)
{
	struct rdmax_region *r = NULL;
	int ret = rdmax_region_alloc_host(c, length, access, &r);

	ck_assert_msg(ret == 0, "rdmax_region_alloc_host(%" PRIu64 ", access %u) failed: %s",
		      length, access, rdmax_err_name(ret));
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_ge(rdmax_region_length(r), length);
	return r;
}

struct rdmax_desc itest_desc(const struct rdmax_region *region)
{
	struct rdmax_desc desc;
	int ret = rdmax_region_desc(region, &desc);

	ck_assert_msg(ret == 0, "rdmax_region_desc() failed: %s", rdmax_err_name(ret));
	ck_assert_uint_gt(desc.len, 0);
	ck_assert_uint_le(desc.len, RDMAX_DESC_MAX);
	return desc;
}

uint8_t *itest_bytes(const struct rdmax_region *region)
{
	uint8_t *p = rdmax_region_addr(region);

	ck_assert_msg(p != NULL, "region has no local mapping");
	return p;
}

struct rdmax_job itest_job(uint64_t id, enum rdmax_op op, struct rdmax_region *local,
			   uint64_t local_offset, const struct rdmax_desc *remote,
			   uint64_t remote_offset, uint64_t length)
{
	struct rdmax_job job;

	memset(&job, 0, sizeof(job));
	job.id = id;
	job.op = op;
	job.local = local;
	job.local_offset = local_offset;
	job.remote = remote;
	job.remote_offset = remote_offset;
	job.length = length;
	return job;
}

static void fail_unexpected(const struct rdmax_event *ev, const char *while_doing)
{
	ck_abort_msg("unexpected event while %s: type %d, job %" PRIu64 ", status %s, imm %u, "
		     "count %" PRIu64 ", message '%s'",
		     while_doing, (int)ev->type, ev->job_id, rdmax_err_name(ev->status), ev->imm,
		     ev->count, ev->reason);
}

struct rdmax_event itest_run_job(struct rdmax_client *c, const struct rdmax_job *job,
				 int timeout_ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;
	struct rdmax_event ev;
	int ret = rdmax_submit(c, job, 1);

	ck_assert_msg(ret == 0, "rdmax_submit(job %" PRIu64 ") failed: %s%s", job->id,
		      rdmax_err_name(ret), itest_daemon_deaths());
	for (;;) {
		uint64_t now = itest_now_ms();
		ck_assert_msg(now < deadline, "job %" PRIu64 " got no completion within %d ms%s",
			      job->id, timeout_ms, itest_daemon_deaths());
		ret = rdmax_poll_events(c, &ev, 1, (int)(deadline - now));
		ck_assert_msg(ret >= 0, "rdmax_poll_events() failed: %s%s", rdmax_err_name(ret),
			      itest_daemon_deaths());
		if (ret == 0) {
			continue;
		}
		if (ev.type != RDMAX_EVENT_COMPLETION || ev.job_id != job->id) {
			fail_unexpected(&ev, "waiting for one job");
		}
		return ev;
	}
}

void itest_open_latency_lane(struct rdmax_client *ca, struct rdmax_client *cb)
{
	struct rdmax_region *src = itest_alloc(ca, 4 * KiB, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *dst = itest_alloc(cb, 4 * KiB, RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc desc = itest_desc(dst);
	/* An id no test's own jobs use. */
	struct rdmax_job job = itest_job(1ull << 62, RDMAX_OP_WRITE, src, 0, &desc, 0, 4 * KiB);
	job.traffic_class = RDMAX_CLASS_LATENCY;
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "latency-class write failed: %s ('%s')",
		      rdmax_err_name(ev.status), ev.reason);
	ck_assert_int_eq(rdmax_region_free(ca, src), 0);
	ck_assert_int_eq(rdmax_region_free(cb, dst), 0);
}

void itest_pair_start(struct itest_daemon **a, struct itest_daemon **b, struct rdmax_client **ca,
		      const char *name_a, struct rdmax_client **cb, const char *name_b)
{
	*a = itest_daemon_new("a", itest_addr_a());
	*b = itest_daemon_new("b", itest_addr_b());
	itest_daemon_start(*a);
	itest_daemon_start(*b);
	*ca = itest_client(*a, name_a);
	*cb = itest_client(*b, name_b);
}

void itest_pair_end(struct rdmax_client *ca, struct rdmax_client *cb, struct itest_daemon *a,
		    struct itest_daemon *b)
{
	rdmax_client_close(ca);
	rdmax_client_close(cb);
	itest_daemon_stop(a);
	itest_daemon_stop(b);
	itest_daemon_free(a);
	itest_daemon_free(b);
}

bool itest_expect_job_error_at(const char *file, int line, struct rdmax_client *c,
			       const struct rdmax_job *job, int err, int timeout_ms)
{
	int ret = rdmax_submit(c, job, 1);
	struct rdmax_event ev;

	if (ret < 0) {
		ck_assert_msg(ret == err,
			      "%s:%d: rdmax_submit(job %" PRIu64
			      ") refused it with %s, expected %s",
			      file, line, job->id, rdmax_err_name(ret), rdmax_err_name(err));
		/* A refused job has no completion. */
		itest_assert_quiet(c, 100);
		return false;
	}
	size_t n = itest_collect(c, &ev, 1, timeout_ms, NULL);
	ck_assert_msg(n == 1, "%s:%d: job %" PRIu64 " got no completion within %d ms%s", file, line,
		      job->id, timeout_ms, itest_daemon_deaths());
	ck_assert_msg(ev.job_id == job->id,
		      "%s:%d: completion for job %" PRIu64 ", expected %" PRIu64, file, line,
		      ev.job_id, job->id);
	ck_assert_msg(ev.status == err,
		      "%s:%d: job %" PRIu64 " completed with %s ('%s'), expected %s", file, line,
		      job->id, rdmax_err_name(ev.status), ev.reason, rdmax_err_name(err));
	ck_assert_msg(ev.reason[0] != '\0', "%s:%d: job %" PRIu64 " failed with %s but no message",
		      file, line, job->id, rdmax_err_name(err));
	itest_assert_quiet(c, 100);
	return true;
}

size_t itest_collect(struct rdmax_client *c, struct rdmax_event *out, size_t count, int timeout_ms,
		     size_t *imm_events)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;
	struct rdmax_event evs[64];
	size_t n = 0;

	while (n < count) {
		uint64_t now = itest_now_ms();
		if (now >= deadline) {
			break;
		}
		size_t want = count - n < 64 ? count - n : 64;
		int got = rdmax_poll_events(c, evs, want, (int)(deadline - now));
		ck_assert_msg(got >= 0,
			      "rdmax_poll_events() failed after %zu of %zu completions: %s%s", n,
			      count, rdmax_err_name(got), itest_daemon_deaths());
		for (int i = 0; i < got; i++) {
			if (evs[i].type == RDMAX_EVENT_COMPLETION) {
				out[n++] = evs[i];
			} else if (evs[i].type == RDMAX_EVENT_IMM_REACHED && imm_events) {
				(*imm_events)++;
			} else {
				fail_unexpected(&evs[i], "collecting completions");
			}
		}
	}
	return n;
}

void itest_assert_quiet(struct rdmax_client *c, int ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)ms;
	struct rdmax_event ev;

	for (;;) {
		uint64_t now = itest_now_ms();
		if (now >= deadline) {
			return;
		}
		int got = rdmax_poll_events(c, &ev, 1, (int)(deadline - now));
		ck_assert_msg(got >= 0, "rdmax_poll_events() failed: %s%s", rdmax_err_name(got),
			      itest_daemon_deaths());
		if (got > 0) {
			fail_unexpected(&ev, "expecting no event");
		}
	}
}

/* ------------------------------------------------------------------- data */

uint64_t itest_seed(void)
{
	if (!g_seed_set) {
		const char *v = getenv("RDMAX_TEST_SEED");
		g_seed = v && v[0] ? strtoull(v, NULL, 0)
				   : (uint64_t)time(NULL) ^ (uint64_t)getpid();
		g_seed_set = true;
		fprintf(stderr, "itest: data seed %" PRIu64 " (set RDMAX_TEST_SEED to repeat)\n",
			g_seed);
	}
	return g_seed;
}

void itest_permute(uint32_t *out, size_t n, uint64_t seed)
{
	uint64_t x = seed | 1;
	for (size_t i = 0; i < n; i++) {
		out[i] = (uint32_t)i;
	}
	for (size_t i = n ? n - 1 : 0; i > 0; i--) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		size_t j = (size_t)(x % (i + 1));
		uint32_t t = out[i];
		out[i] = out[j];
		out[j] = t;
	}
}

void itest_fill(void *buf, size_t len, uint64_t seed)
{
	uint64_t x = (seed ^ itest_seed()) * 0x9e3779b97f4a7c15ull + 1;
	uint8_t *p = buf;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		uint64_t v = x * 0x2545f4914f6cdd1dull;
		memcpy(p + i, &v, 8);
	}
	for (; i < len; i++) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		p[i] = (uint8_t)((x * 0x2545f4914f6cdd1dull) >> 56);
	}
}

void itest_mem_eq_at(const char *file, int line, const uint8_t *a, const uint8_t *b, size_t len,
		     const char *what)
{
	if (memcmp(a, b, len) == 0) {
		return;
	}
	size_t first = 0, diff = 0;
	while (a[first] == b[first]) {
		first++;
	}
	for (size_t i = first; i < len; i++) {
		diff += a[i] != b[i];
	}
	ck_abort_msg("%s:%d: %s: %zu of %zu bytes differ, first at offset %zu (0x%02x != 0x%02x)",
		     file, line, what, diff, len, first, a[first], b[first]);
}
