/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench: the helpers every mode shares: the stop flag, the monotonic
 * clock, error lines, the per-seed byte pattern, CPU time of a process and of
 * this one, its threads' time on and waiting for a CPU, the machine's idle
 * time, the daemon's pid from SO_PEERCRED, and descriptor files and hex.
 * Never talks to a daemon beyond reading its pid off the library's socket.
 */
#include "bench.h"

volatile sig_atomic_t bench_stop;

void bench_on_stop_signal(int sig)
{
	(void)sig;
	bench_stop = 1;
}

uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int bench_fail(const char *what, int err)
{
	fprintf(stderr, "rdmax-bench: %s: %s\n", what, rdmax_strerror(err));
	return 1;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* A pattern that differs per seed, so a stale buffer never passes a check. */
void bench_fill_pattern(uint8_t *buf, uint64_t len, uint64_t seed)
{
	for (uint64_t i = 0; i < len; i += 8) {
		uint64_t v = mix(i / 8 + seed * 0x9e3779b97f4a7c15ull);
		memcpy(buf + i, &v, len - i < 8 ? len - i : 8);
	}
}

/* utime+stime of a process in seconds, or a negative value when unreadable. */
double bench_proc_cpu_s(int pid)
{
	char path[64], buf[1024];
	unsigned long long utime, stime;
	FILE *f;
	size_t n;

	if (pid <= 0) {
		return -1;
	}
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f) {
		return -1;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* comm may contain spaces and parentheses: fields restart after the last ')'. */
	char *p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
			 &stime) != 2) {
		return -1;
	}
	return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/*
 * Time every thread of a process ran and waited to run (the scheduler's
 * /proc/PID/task/TID/schedstat, nanoseconds: exact where utime+stime counts
 * ticks), in seconds, how many times they were put on a CPU and how many
 * times they went to sleep (status: voluntary_ctxt_switches; a yield or a
 * preemption is not one); false when unreadable. Threads that exited are not
 * counted.
 */
bool bench_proc_sched(int pid, struct bench_sched *ret)
{
	char path[64];
	struct dirent *e;
	DIR *d;

	memset(ret, 0, sizeof(*ret));
	if (pid <= 0) {
		return false;
	}
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	if (!d) {
		return false;
	}
	bool any = false;
	while ((e = readdir(d)) != NULL) {
		char file[96];
		unsigned long long run, wait, runs;
		if (e->d_name[0] == '.') {
			continue;
		}
		snprintf(file, sizeof(file), "/proc/%d/task/%.16s/schedstat", pid, e->d_name);
		FILE *f = fopen(file, "r");
		if (!f) {
			continue; /* the thread exited meanwhile */
		}
		if (fscanf(f, "%llu %llu %llu", &run, &wait, &runs) == 3) {
			ret->run_s += (double)run / 1e9;
			ret->wait_s += (double)wait / 1e9;
			ret->runs += (double)runs;
			any = true;
		}
		fclose(f);
		snprintf(file, sizeof(file), "/proc/%d/task/%.16s/status", pid, e->d_name);
		f = fopen(file, "r");
		if (!f) {
			continue;
		}
		char line[128];
		unsigned long long sleeps;
		while (fgets(line, sizeof(line), f)) {
			if (sscanf(line, "voluntary_ctxt_switches: %llu", &sleeps) == 1) {
				ret->sleeps += (double)sleeps;
				break;
			}
		}
		fclose(f);
	}
	closedir(d);
	return any;
}

/* Seconds all CPUs together spent idle (idle + iowait of /proc/stat), or a negative value. */
double bench_host_idle_s(void)
{
	unsigned long long v[5];
	FILE *f = fopen("/proc/stat", "r");

	if (!f) {
		return -1;
	}
	int n = fscanf(f, "cpu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4]);
	fclose(f);
	if (n != 5) {
		return -1;
	}
	return (double)(v[3] + v[4]) / (double)sysconf(_SC_CLK_TCK);
}

struct bench_usage bench_self_usage(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) < 0) {
		return (struct bench_usage){0};
	}
	return (struct bench_usage){
		.cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
			 (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6,
		.switches = (double)ru.ru_nvcsw + (double)ru.ru_nivcsw,
	};
}

double bench_self_cpu_s(void)
{
	return bench_self_usage().cpu_s;
}

int bench_daemon_pid_of(const struct rdmax_client *c)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(rdmax_client_fd(c), SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		return -errno;
	}
	return cred.pid;
}

static int hex_digit(char ch)
{
	if (ch >= '0' && ch <= '9') {
		return ch - '0';
	}
	if (ch >= 'a' && ch <= 'f') {
		return ch - 'a' + 10;
	}
	if (ch >= 'A' && ch <= 'F') {
		return ch - 'A' + 10;
	}
	return -EINVAL;
}

int bench_import_hex(const char *hex, struct rdmax_desc *ret_desc)
{
	uint8_t buf[RDMAX_DESC_MAX];
	size_t len = strlen(hex), n = 0;

	while (len > 0 && (hex[len - 1] == '\n' || hex[len - 1] == ' ')) {
		len--;
	}
	if (len % 2 || len / 2 > sizeof(buf)) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < len; i += 2) {
		int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
		if (hi < 0 || lo < 0) {
			return RDMAX_E_INVALID_ARGUMENT;
		}
		buf[n++] = (uint8_t)(hi << 4 | lo);
	}
	return rdmax_desc_import(buf, n, ret_desc);
}

/* Wait up to 30 s for the responder to publish its descriptor. */
int bench_read_desc_file(const char *path, struct rdmax_desc *ret_desc)
{
	uint8_t buf[RDMAX_DESC_MAX + 1];
	uint64_t deadline = bench_now_ns() + 30000000000ull;
	FILE *f;

	while (!(f = fopen(path, "rb"))) {
		if (bench_now_ns() > deadline) {
			fprintf(stderr, "rdmax-bench: no descriptor at '%s': %s\n", path,
				strerror(errno));
			return RDMAX_E_TIMEOUT;
		}
		usleep(10000);
	}
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	if (n > RDMAX_DESC_MAX) {
		return RDMAX_E_INVALID_ARGUMENT;
	}
	return rdmax_desc_import(buf, n, ret_desc);
}

int bench_write_desc_file(const char *path, const struct rdmax_desc *desc)
{
	char tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	f = fopen(tmp, "wb");
	if (!f) {
		return -errno;
	}
	if (fwrite(desc->bytes, 1, desc->len, f) != desc->len) {
		fclose(f);
		unlink(tmp);
		return -EIO;
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0) {
		int err = -errno;
		unlink(tmp);
		return err;
	}
	return 0;
}

void bench_caps_string(uint32_t caps, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s%s%s%s%s%s", caps & RDMAX_CAP_TCP ? "tcp " : "",
		 caps & RDMAX_CAP_VERBS ? "verbs " : "", caps & RDMAX_CAP_DMABUF ? "dmabuf " : "",
		 caps & RDMAX_CAP_PEERMEM ? "peermem " : "", caps & RDMAX_CAP_AUTH ? "auth " : "",
		 caps & RDMAX_CAP_RING ? "ring " : "",
		 caps & RDMAX_CAP_IMM_STANDING ? "imm-standing " : "",
		 caps & RDMAX_CAP_RING_COUNTS ? "ring-counts " : "");
	size_t n = strlen(buf);
	if (n > 0) {
		buf[n - 1] = '\0';
	}
}
