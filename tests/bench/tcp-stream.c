/* SPDX-License-Identifier: MIT */
/*
 * tcp-stream: the raw TCP reference for rdmax-bench's TCP transport runs.
 * One process forks a receiver; the two talk over one TCP connection on
 * loopback (or --addr), with the same message sizes rdmax-bench uses:
 *
 *   stream mode: the sender write()s SIZE-byte messages back to back; the
 *     receiver recv()s each into one SIZE-byte buffer (as a daemon receives
 *     into region memory); the clock stops when the receiver has acknowledged
 *     the last byte, so nothing still queued in the kernel is counted;
 *   --lat: one SIZE-byte message, one 1-byte answer, per round trip;
 *   --spin: both ends use non-blocking sockets and retry at once instead of
 *     sleeping in the kernel, the way rdmaxd busy-polls (a reference that
 *     sleeps while the system under test spins measures wake-ups);
 *   --batch N: the sender hands N messages to one sendmsg() (rdmaxd batches
 *     up to 64 frames per call); the receiver still takes each message whole.
 *   --relay (with --lat): the round trip crosses a relay process the way a
 *     job crosses the requesting rdmaxd: the timing process hands the relay
 *     one byte over a Unix socket pair, the relay sends the SIZE bytes over
 *     TCP, and on the receiver's 1-byte answer answers the timing process
 *     with one byte. Four hand-offs per round trip instead of two, each a
 *     wake-up when the ends sleep: the process layout of a job through two
 *     daemons, with none of their code.
 *   --span BYTES (stream mode): the sender takes successive messages from, and
 *     the receiver lands them in, successive slices of a BYTES-long buffer,
 *     wrapping at its end, as a transfer of distinct data (KV blocks) moves
 *     through that much memory; without it both ends reuse one SIZE-byte
 *     buffer that stays in the caches, as iperf3 does.
 *   --answer (stream mode): the receiver answers every message with 64 bytes,
 *     as a responder acknowledges each write, and the sender reads the
 *     answers as they come; --quickack: the receiver sets TCP_QUICKACK after
 *     each answer, as rdmaxd does after answering bulk (Linux otherwise
 *     delays its ACKs of a socket that sends soon after it received).
 *   --epoll: the receiver and the relay wait for data in epoll_wait() on
 *     non-blocking sockets, as an event loop such as rdmaxd's does, instead
 *     of sleeping in recv() (the timing process still sleeps in recv(), as a
 *     client sleeps in poll()).
 *
 * It prints a table, or with --json the same JSON shape as rdmax-bench, so
 * tests/bench/report.py reads both, with each end's CPU time and the time it
 * waited for a CPU (the receiver's includes the relay's). It never touches rdmaxd; it only
 * measures what one plain TCP stream between two processes achieves here.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES     32
#define ANSWER_BYTES  64
#define DEFAULT_ITERS 1000u

struct opts {
	uint64_t sizes[MAX_SIZES];
	uint32_t n_sizes;
	uint64_t iters;
	double duration_s;
	bool lat;
	bool json;
	bool spin;
	bool relay;
	bool epoll;
	uint32_t batch; /* messages per sendmsg(), >= 1 */
	uint64_t span;  /* --span: bytes the messages cycle through; 0: one message's */
	bool answer;    /* --answer: ANSWER_BYTES back per message */
	bool quickack;  /* --quickack: TCP_QUICKACK after each answer */
	int recv_cpu;   /* --recv-cpu: the receiving process's one CPU; -1: the parent's */
	const char *addr;
	const char *label;
};

struct result {
	uint64_t size;
	uint64_t msgs;
	double seconds;
	double lat_us[5]; /* p50, p99, p99.9, max, mean (lat mode) */
	double cpu_s;     /* sender + receiver */
	double send_cpu_s, recv_cpu_s;
	double send_wait_s, recv_wait_s; /* waiting for a CPU while runnable */
	int recv_last_cpu;               /* where the receiver ended the stream */
};

/* What the receiver (and the relay) report at the end of the stream: seconds. */
struct end_report {
	double cpu_s;
	double wait_s;
	int32_t cpu; /* the receiver's CPU at the end (sched_getcpu()) */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double rusage_s(int who)
{
	struct rusage ru;

	getrusage(who, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

/* Seconds this process waited for a CPU while runnable (its schedstat), 0 if unknown. */
static double run_wait_s(void)
{
	unsigned long long run, wait;
	FILE *f = fopen("/proc/self/schedstat", "r");
	int n = f ? fscanf(f, "%llu %llu", &run, &wait) : 0;

	if (f) {
		fclose(f);
	}
	return n == 2 ? (double)wait / 1e9 : 0;
}

/* --spin: every call is MSG_DONTWAIT and EAGAIN is retried at once. */
static bool g_spin;
/*
 * --epoll: the relay and the receiver wait for data in epoll_wait() on an
 * epoll set of their sockets, as an event loop does; -1 where a process
 * blocks in recv() (the timing process always does, as a client in poll()).
 */
static bool g_epoll;
static int g_ep = -1;

/* Wait for data on fd in epoll_wait() from now on (--epoll); fd stays blocking for sends. */
static int epoll_watch(int fd)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};

	if (g_ep < 0) {
		g_ep = epoll_create1(EPOLL_CLOEXEC);
		if (g_ep < 0) {
			return -errno;
		}
	}
	return epoll_ctl(g_ep, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static int write_all(int fd, const uint8_t *buf, uint64_t len)
{
	while (len > 0) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | (g_spin ? MSG_DONTWAIT : 0));
		if (n < 0) {
			if (errno == EINTR || (g_spin && errno == EAGAIN)) {
				continue;
			}
			return -errno;
		}
		buf += n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* \return bytes read (short only at end of stream) or a negative errno */
static int64_t read_full(int fd, uint8_t *buf, uint64_t len)
{
	uint64_t got = 0;

	while (got < len) {
		bool dontwait = g_spin || g_ep >= 0;
		ssize_t n = recv(fd, buf + got, len - got, dontwait ? MSG_DONTWAIT : MSG_WAITALL);
		if (n < 0) {
			if (errno == EINTR || (g_spin && errno == EAGAIN)) {
				continue;
			}
			if (errno == EAGAIN && g_ep >= 0) {
				struct epoll_event evs[4];
				if (epoll_wait(g_ep, evs, 4, -1) < 0 && errno != EINTR) {
					return -errno;
				}
				continue;
			}
			return -errno;
		}
		if (n == 0) {
			break;
		}
		got += (uint64_t)n;
	}
	return (int64_t)got;
}

/* batch messages of size bytes (all from buf) in as few sendmsg() calls as the socket allows. */
static int write_batch(int fd, const uint8_t *buf, uint64_t size, uint32_t batch)
{
	struct iovec iov[64];
	uint64_t left = size * batch, skip = 0;

	while (left > 0) {
		uint32_t n = 0;
		uint64_t off = skip;
		for (; n < batch && n < 64 && off < size * batch; n++) {
			uint64_t in = off % size;
			iov[n].iov_base = (void *)(buf + in);
			iov[n].iov_len = size - in;
			off += size - in;
		}
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n};
		ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL | (g_spin ? MSG_DONTWAIT : 0));
		if (sent < 0) {
			if (errno == EINTR || (g_spin && errno == EAGAIN)) {
				continue;
			}
			return -errno;
		}
		skip += (uint64_t)sent;
		left -= (uint64_t)sent;
	}
	return 0;
}

static void set_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/*
 * The receiver: per size, one connection; reads messages until the sender
 * shuts down its side, then answers one byte. In lat mode it answers every
 * message. Reports its CPU seconds per size on the connection's last byte.
 * \return the child's exit status
 */
/* The next message's offset in a span-long buffer (--span); 0 without one. */
static uint64_t next_slice(uint64_t *off, uint64_t size, uint64_t span)
{
	if (span == 0) {
		return 0;
	}
	if (*off + size > span) {
		*off = 0;
	}
	uint64_t at = *off;
	*off += size;
	return at;
}

static int receiver(int lfd, const struct opts *o, uint64_t max_size)
{
	uint8_t *buf = malloc(max_size);

	if (!buf) {
		return 1;
	}
	memset(buf, 0, max_size);
	for (uint32_t i = 0; i < o->n_sizes; i++) {
		uint64_t size = o->sizes[i];
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0 || (g_epoll && epoll_watch(fd) < 0)) {
			return 1;
		}
		set_nodelay(fd);
		double c0 = rusage_s(RUSAGE_SELF), w0 = run_wait_s();
		uint64_t off = 0;
		for (;;) {
			int64_t n = read_full(fd, buf + next_slice(&off, size, o->span), size);
			if (n < 0) {
				return 1;
			}
			if ((uint64_t)n < size) {
				break;
			}
			if (o->lat && write_all(fd, buf, 1) < 0) {
				return 1;
			}
			if (o->answer && write_all(fd, buf, ANSWER_BYTES) < 0) {
				return 1;
			}
			if (o->answer && o->quickack) {
				int one = 1;
				setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
			}
		}
		/* End of stream: acknowledge with our CPU time, so the sender can add it. */
		struct end_report end = {rusage_s(RUSAGE_SELF) - c0, run_wait_s() - w0,
					 sched_getcpu()};
		if (write_all(fd, (const uint8_t *)&end, sizeof(end)) < 0) {
			return 1;
		}
		close(fd);
	}
	free(buf);
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double pct_us(const uint64_t *s, uint64_t n, double p)
{
	uint64_t idx = (uint64_t)ceil(p * (double)n);
	idx = idx == 0 ? 0 : idx - 1;
	return (double)s[idx < n ? idx : n - 1] / 1e3;
}

/* \return a TCP socket connected to sa (the receiver may still be starting), or a negative errno */
static int connect_receiver(const struct sockaddr_in *sa)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0) {
		return -errno;
	}
	for (int tries = 0; connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0; tries++) {
		if (tries > 200) {
			int err = -errno;
			close(fd);
			return err;
		}
		usleep(10000);
	}
	set_nodelay(fd);
	return fd;
}

/*
 * --relay: the process between the timing one (ufd, a Unix socket) and the
 * receiver. Per byte from ufd, sends size bytes of buf to the receiver and
 * passes its 1-byte answer back. At the end of ufd's stream, ends its TCP
 * stream and passes on the receiver's CPU and wait seconds plus its own.
 * \return the child's exit status
 */
static int relay(int ufd, const struct sockaddr_in *sa, uint64_t size, const uint8_t *buf)
{
	double c0 = rusage_s(RUSAGE_SELF), w0 = run_wait_s();
	struct end_report end;
	int tfd = connect_receiver(sa);
	uint8_t b;

	if (tfd < 0 || (g_epoll && (epoll_watch(ufd) < 0 || epoll_watch(tfd) < 0))) {
		return 1;
	}
	for (;;) {
		int64_t n = read_full(ufd, &b, 1);
		if (n < 0) {
			return 1;
		}
		if (n == 0) {
			break;
		}
		if (write_all(tfd, buf, size) < 0 || read_full(tfd, &b, 1) != 1 ||
		    write_all(ufd, &b, 1) < 0) {
			return 1;
		}
	}
	shutdown(tfd, SHUT_WR);
	if (read_full(tfd, (uint8_t *)&end, sizeof(end)) != sizeof(end)) {
		return 1;
	}
	end.cpu_s += rusage_s(RUSAGE_SELF) - c0;
	end.wait_s += run_wait_s() - w0;
	return write_all(ufd, (const uint8_t *)&end, sizeof(end)) < 0;
}

static int sender_one(const struct opts *o, const struct sockaddr_in *sa, uint64_t size,
		      uint8_t *buf, struct result *r)
{
	uint64_t count = o->duration_s > 0 ? UINT64_MAX : o->iters;
	uint64_t *lat = NULL, lat_cap = 0;
	uint64_t until, t0, msgs = 0, off = 0, answered = 0;
	uint8_t answers[65536];
	struct end_report peer;
	double c0, w0;
	pid_t relay_pid = -1;
	uint8_t ack;
	int fd, ret = -EIO;

	if (o->relay) {
		int sp[2];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
			return -errno;
		}
		relay_pid = fork();
		if (relay_pid < 0) {
			ret = -errno;
			close(sp[0]);
			close(sp[1]);
			return ret;
		}
		if (relay_pid == 0) {
			close(sp[0]);
			_exit(relay(sp[1], sa, size, buf));
		}
		close(sp[1]);
		fd = sp[0];
	} else {
		fd = connect_receiver(sa);
		if (fd < 0) {
			return fd;
		}
	}
	c0 = rusage_s(RUSAGE_SELF);
	w0 = run_wait_s();
	t0 = now_ns();
	until = t0 + (uint64_t)(o->duration_s * 1e9);
	while (msgs < count && (o->duration_s <= 0 || now_ns() < until)) {
		uint64_t ts = now_ns();
		if (o->batch > 1 && !o->lat) {
			if (write_batch(fd, buf, size, o->batch) < 0) {
				goto out_close;
			}
			msgs += o->batch;
			continue;
		}
		if (write_all(fd, buf + next_slice(&off, size, o->span), o->relay ? 1 : size) < 0) {
			goto out_close;
		}
		if (o->lat) {
			if (read_full(fd, &ack, 1) != 1) {
				goto out_close;
			}
			if (msgs == lat_cap) {
				lat_cap = lat_cap ? lat_cap * 2 : 4096;
				uint64_t *nl = realloc(lat, lat_cap * sizeof(*lat));
				if (!nl) {
					goto out_close;
				}
				lat = nl;
			}
			lat[msgs] = now_ns() - ts;
		}
		msgs++;
		while (o->answer) { /* the answers that are in, without waiting */
			ssize_t n = recv(fd, answers, sizeof(answers), MSG_DONTWAIT);
			if (n <= 0) {
				break;
			}
			answered += (uint64_t)n;
		}
	}
	shutdown(fd, SHUT_WR);
	for (uint64_t rest = o->answer ? msgs * ANSWER_BYTES - answered : 0; rest > 0;) {
		int64_t n = read_full(fd, answers, rest < sizeof(answers) ? rest : sizeof(answers));
		if (n <= 0) {
			goto out_close;
		}
		rest -= (uint64_t)n;
	}
	if (read_full(fd, (uint8_t *)&peer, sizeof(peer)) != sizeof(peer)) {
		goto out_close;
	}
	memset(r, 0, sizeof(*r));
	r->size = size;
	r->msgs = msgs;
	r->seconds = (double)(now_ns() - t0) / 1e9;
	r->send_cpu_s = rusage_s(RUSAGE_SELF) - c0;
	r->send_wait_s = run_wait_s() - w0;
	r->recv_cpu_s = peer.cpu_s;
	r->recv_wait_s = peer.wait_s;
	r->recv_last_cpu = peer.cpu;
	r->cpu_s = r->send_cpu_s + r->recv_cpu_s;
	if (o->lat && msgs > 0) {
		double sum = 0;
		qsort(lat, msgs, sizeof(*lat), cmp_u64);
		for (uint64_t i = 0; i < msgs; i++) {
			sum += (double)lat[i];
		}
		r->lat_us[0] = pct_us(lat, msgs, 0.5);
		r->lat_us[1] = pct_us(lat, msgs, 0.99);
		r->lat_us[2] = pct_us(lat, msgs, 0.999);
		r->lat_us[3] = (double)lat[msgs - 1] / 1e3;
		r->lat_us[4] = sum / (double)msgs / 1e3;
	}
	ret = 0;
out_close:
	free(lat);
	close(fd);
	if (relay_pid > 0) {
		int status;
		if (waitpid(relay_pid, &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0) {
			ret = ret ? ret : -EIO;
		}
	}
	return ret;
}

static void print_results(const struct opts *o, const struct result *rs, uint32_t n)
{
	if (o->json) {
		printf("{\"tool\": \"tcp-stream\", \"mode\": \"%s\", \"label\": \"",
		       o->lat ? "lat" : "stream");
		for (const char *p = o->label ? o->label : ""; *p; p++) {
			if (*p == '"' || *p == '\\') {
				putchar('\\');
			}
			if ((unsigned char)*p >= 0x20) {
				putchar(*p);
			}
		}
		printf("\", \"op\": \"write\", \"status\": \"ok\", \"params\": {\"iters\": %" PRIu64
		       ", \"duration_s\": %g, \"lat\": %s, \"spin\": %s, \"relay\": %s, \"epoll\": "
		       "%s, \"batch\": %u, \"span\": %" PRIu64 ", \"recv_cpu\": %d}, "
		       "\"results\": [",
		       o->iters, o->duration_s, o->lat ? "true" : "false",
		       o->spin ? "true" : "false", o->relay ? "true" : "false",
		       o->epoll ? "true" : "false", o->batch, o->span, o->recv_cpu);
	} else {
		printf("tcp-stream%s%s%s%s%s: one TCP connection to %s\n%9s %8s %8s %8s %8s %10s "
		       "%9s "
		       "%9s "
		       "%9s %9s\n",
		       o->lat ? " --lat" : "", o->spin ? " --spin" : "", o->relay ? " --relay" : "",
		       o->epoll ? " --epoll" : "", o->span ? " --span" : "", o->addr, "bytes",
		       "msgs", "seconds", "GB/s", "Gb/s", "msgs/s", "p50_us", "p99_us", "p99.9_us",
		       "cpu_s/GB");
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct result *r = &rs[i];
		double gbs = r->seconds > 0 ? (double)(r->size * r->msgs) / r->seconds / 1e9 : 0;
		double rate = r->seconds > 0 ? (double)r->msgs / r->seconds : 0;
		double gb = (double)(r->size * r->msgs) / 1e9;
		double cpu_gb = gb > 0 ? r->cpu_s / gb : 0;
		if (o->json) {
			printf("%s\n  {\"bytes\": %" PRIu64 ", \"jobs\": %" PRIu64
			       ", \"seconds\": %.6f, \"GBps\": %.6f, \"Gbps\": %.6f, "
			       "\"jobs_per_s\": "
			       "%.1f, \"lat_us\": {\"p50\": %.3f, \"p99\": %.3f, \"p999\": %.3f, "
			       "\"max\": %.3f, \"mean\": %.3f}, \"cpu_s_per_GB\": %.4f, "
			       "\"send_cpu_s\": %.4f, \"send_wait_s\": %.4f, \"recv_cpu_s\": %.4f, "
			       "\"recv_wait_s\": %.4f, \"recv_last_cpu\": %d}",
			       i ? "," : "", r->size, r->msgs, r->seconds, gbs, gbs * 8, rate,
			       r->lat_us[0], r->lat_us[1], r->lat_us[2], r->lat_us[3], r->lat_us[4],
			       cpu_gb, r->send_cpu_s, r->send_wait_s, r->recv_cpu_s, r->recv_wait_s,
			       r->recv_last_cpu);
		} else {
			printf("%9" PRIu64 " %8" PRIu64
			       " %8.3f %8.3f %8.3f %10.0f %9.1f %9.1f %9.1f "
			       "%9.3f\n",
			       r->size, r->msgs, r->seconds, gbs, gbs * 8, rate, r->lat_us[0],
			       r->lat_us[1], r->lat_us[2], cpu_gb);
		}
	}
	if (o->json) {
		printf("\n]}\n");
	}
}

static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	uint64_t mult = 1;

	if (errno || end == s) {
		return -EINVAL;
	}
	if (*end == 'K' || *end == 'k') {
		mult = 1ull << 10;
		end++;
	} else if (*end == 'M' || *end == 'm') {
		mult = 1ull << 20;
		end++;
	}
	if (*end || v == 0 || v > (1ull << 30) / mult) {
		return -EINVAL;
	}
	*ret = v * mult;
	return 0;
}

static void usage(FILE *out)
{
	fprintf(out, "Usage: tcp-stream [-s SIZE[,SIZE...]] [-n MSGS | -D SECS] [--lat] [--json]\n"
		     "                  [--spin] [--batch N] [--relay] [--epoll] [--addr IPV4]\n"
		     "                  [--span BYTES] [--answer [--quickack]] [--label TEXT]\n"
		     "                  [--recv-cpu CPU]\n"
		     "One TCP stream between two processes (--relay: the sender's end in a\n"
		     "third process); sizes take K/M suffixes. --recv-cpu: the receiving\n"
		     "process runs on that CPU alone (the sending end keeps the caller's CPUs).\n");
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"sizes", required_argument, NULL, 's'},
		{"iters", required_argument, NULL, 'n'},
		{"duration", required_argument, NULL, 'D'},
		{"lat", no_argument, NULL, 'L'},
		{"spin", no_argument, NULL, 'S'},
		{"batch", required_argument, NULL, 'B'},
		{"relay", no_argument, NULL, 'R'},
		{"json", no_argument, NULL, 'j'},
		{"epoll", no_argument, NULL, 'E'},
		{"addr", required_argument, NULL, 'A'},
		{"label", required_argument, NULL, 'l'},
		{"span", required_argument, NULL, 'P'}, /* stream mode only */
		{"answer", no_argument, NULL, 'W'},
		{"quickack", no_argument, NULL, 'Q'},
		{"recv-cpu", required_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct opts o = {.iters = DEFAULT_ITERS,
			 .addr = "127.0.0.1",
			 .n_sizes = 1,
			 .sizes = {1 << 20},
			 .batch = 1,
			 .recv_cpu = -1};
	struct result rs[MAX_SIZES];
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sa_len = sizeof(sa);
	uint64_t max_size = 0;
	int opt, lfd, status;
	pid_t child;

	while ((opt = getopt_long(argc, argv, "s:n:D:h", options, NULL)) != -1) {
		switch (opt) {
		case 's': {
			char *dup = strdup(optarg), *save = NULL;
			o.n_sizes = 0;
			for (char *t = strtok_r(dup, ",", &save); t;
			     t = strtok_r(NULL, ",", &save)) {
				if (o.n_sizes == MAX_SIZES ||
				    parse_size(t, &o.sizes[o.n_sizes]) < 0) {
					fprintf(stderr, "tcp-stream: bad size '%s'\n", t);
					return 2;
				}
				o.n_sizes++;
			}
			free(dup);
			break;
		}
		case 'n':
			o.iters = strtoull(optarg, NULL, 0);
			break;
		case 'D':
			o.duration_s = strtod(optarg, NULL);
			break;
		case 'L':
			o.lat = true;
			break;
		case 'S':
			o.spin = true;
			break;
		case 'B':
			o.batch = (uint32_t)strtoul(optarg, NULL, 0);
			if (o.batch == 0 || o.batch > 64) {
				fprintf(stderr, "tcp-stream: --batch takes 1..64\n");
				return 2;
			}
			break;
		case 'R':
			o.relay = true;
			break;
		case 'E':
			o.epoll = true;
			break;
		case 'j':
			o.json = true;
			break;
		case 'A':
			o.addr = optarg;
			break;
		case 'l':
			o.label = optarg;
			break;
		case 'W':
			o.answer = true;
			break;
		case 'Q':
			o.quickack = true;
			break;
		case 'C': {
			char *end;
			long cpu = strtol(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || cpu < 0 || cpu >= CPU_SETSIZE) {
				fprintf(stderr, "tcp-stream: bad --recv-cpu '%s'\n", optarg);
				return 2;
			}
			o.recv_cpu = (int)cpu;
			break;
		}
		case 'P':
			if (parse_size(optarg, &o.span) < 0) {
				fprintf(stderr, "tcp-stream: bad span '%s'\n", optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (o.n_sizes == 0 || (o.iters == 0 && o.duration_s <= 0) || (o.relay && !o.lat) ||
	    ((o.span || o.answer) && (o.lat || o.batch > 1)) || (o.quickack && !o.answer)) {
		usage(stderr);
		return 2;
	}
	if (inet_pton(AF_INET, o.addr, &sa.sin_addr) != 1) {
		fprintf(stderr, "tcp-stream: bad address '%s'\n", o.addr);
		return 2;
	}
	for (uint32_t i = 0; i < o.n_sizes; i++) {
		max_size = o.sizes[i] > max_size ? o.sizes[i] : max_size;
	}
	if (o.span && o.span < max_size) {
		fprintf(stderr, "tcp-stream: --span is below the largest size\n");
		return 2;
	}
	max_size = o.span ? o.span : max_size;
	g_spin = o.spin;
	g_epoll = o.epoll;
	signal(SIGPIPE, SIG_IGN);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sa_len) < 0) {
		fprintf(stderr, "tcp-stream: listen on '%s' failed: %s\n", o.addr, strerror(errno));
		return 1;
	}
	child = fork();
	if (child < 0) {
		fprintf(stderr, "tcp-stream: fork() failed: %s\n", strerror(errno));
		return 1;
	}
	if (child == 0) {
		if (o.recv_cpu >= 0) {
			cpu_set_t set;
			CPU_ZERO(&set);
			CPU_SET(o.recv_cpu, &set);
			if (sched_setaffinity(0, sizeof(set), &set) < 0) {
				fprintf(stderr, "tcp-stream: --recv-cpu %d: %s\n", o.recv_cpu,
					strerror(errno));
				_exit(1);
			}
		}
		_exit(receiver(lfd, &o, max_size));
	}
	close(lfd);
	uint8_t *buf = malloc(max_size);
	if (!buf) {
		kill(child, SIGKILL);
		return 1;
	}
	for (uint64_t i = 0; i < max_size; i++) {
		buf[i] = (uint8_t)(i * 131 + 7);
	}
	int ret = 0;
	for (uint32_t i = 0; i < o.n_sizes && ret == 0; i++) {
		ret = sender_one(&o, &sa, o.sizes[i], buf, &rs[i]);
		if (ret < 0) {
			fprintf(stderr, "tcp-stream: %" PRIu64 "-byte messages: %s\n", o.sizes[i],
				strerror(-ret));
		}
	}
	free(buf);
	if (ret < 0) {
		kill(child, SIGKILL);
	}
	if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "tcp-stream: the receiver failed\n");
		return 1;
	}
	if (ret < 0) {
		return 1;
	}
	print_results(&o, rs, o.n_sizes);
	return 0;
}
