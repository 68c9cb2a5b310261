/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench kv --relay: the KV row's raw reference. The same prefill and
 * decode clients (kv.c) over two relay processes that stand where the two
 * daemons do, with none of rdmaxd's code: one TCP connection, one header and
 * one gathered sendmsg() per request, one scattered recvmsg(), an 8-byte
 * acknowledgement and a 4-byte imm (kv.h). Against it the row measures
 * rdmaxd's own work; against iperf3 it measures the process layout and the
 * clients as well (docs/benchmarks.md, KV over TCP).
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include "kv.h"

/* What the sending relay puts before a request's blocks on the TCP connection. */
struct kv_relay_hdr {
	uint32_t client;
	uint32_t slot;
	uint32_t imm;
	uint32_t count;
	uint32_t dst[KV_RELAY_BLOCKS_MAX];
};

/* What the receiving relay answers when a request's blocks landed. */
struct kv_relay_ack {
	uint32_t client;
	uint32_t slot;
};

/*
 * --relay-spin: a relay polls without sleeping until this long after the
 * last time it moved something (each relay is a process of its own).
 */
#define KV_SPIN_YIELD_NS 4000 /* a yield after this much spinning, as rdmaxd's (spin_yield.h) */
static uint64_t kv_spin_ns;
static uint64_t kv_spin_until_ns;
static uint64_t kv_spin_yield_ns;

static void kv_spin_moved(void)
{
	kv_spin_until_ns = bench_now_ns() + kv_spin_ns;
}

/* Nothing to move: whether to try again at once (spinning) rather than sleep. */
static bool kv_spin_again(void)
{
	uint64_t now = bench_now_ns();

	if (now >= kv_spin_until_ns) {
		return false;
	}
	if (now >= kv_spin_yield_ns) {
		sched_yield();
		kv_spin_yield_ns = bench_now_ns() + KV_SPIN_YIELD_NS;
	}
	return true;
}

uint64_t kv_slot_bytes(const struct kv_opts *k)
{
	return (uint64_t)k->layers * k->blocks * k->block_len;
}

uint64_t kv_pool_blocks(const struct kv_opts *k)
{
	return (uint64_t)k->clients * k->window * k->layers * 2 * k->blocks;
}

uint64_t kv_src_bytes(const struct kv_opts *k)
{
	return 2 * (uint64_t)k->window * kv_slot_bytes(k);
}

uint8_t *kv_relay_map(int fd, uint64_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

/*
 * The receive low-water mark for `rest` bytes still to come, as rdmaxd sets it
 * (daemon/transport/tcp): woken once 256 KiB are queued while 512 KiB or more
 * are to come, 128 KiB while 256 KiB are, at every segment otherwise; never
 * more than half the rest, so the last byte always wakes the reader. Without
 * it a blocking read of a 4 MiB request was woken at nearly every segment.
 */
static void kv_relay_lowat(int fd, int *lowat, uint64_t rest)
{
	int want = rest >= (512u << 10) ? 256 << 10 : rest >= (256u << 10) ? 128 << 10 : 1;

	if (want != *lowat && setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) {
		*lowat = want;
	}
}

/*
 * Sends (out) or receives the n buffers of iov whole, in as few calls as the
 * socket allows; a receive wakes by the low-water mark. \return 0, -EPIPE at
 * the end of the stream, or a negative errno
 */
static int kv_relay_move(int fd, struct iovec *iov, uint32_t n, bool out)
{
	static int lowat = 1; /* the receiving relay's one socket */
	uint64_t rest = 0;

	for (uint32_t i = 0; i < n; i++) {
		rest += iov[i].iov_len;
	}
	bool spin = kv_spin_ns > 0;

	while (n > 0) {
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n};
		int flags = spin ? MSG_DONTWAIT : 0;
		ssize_t got;
		if (out) {
			got = sendmsg(fd, &msg, MSG_NOSIGNAL | flags);
		} else {
			kv_relay_lowat(fd, &lowat, rest);
			got = recvmsg(fd, &msg, flags);
		}
		if (got < 0 && errno == EINTR) {
			continue;
		}
		if (got < 0 && spin && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			spin = kv_spin_again(); /* past the spin: the next call sleeps */
			continue;
		}
		if (got <= 0) {
			return got == 0 ? -EPIPE : -errno;
		}
		if (kv_spin_ns > 0) {
			kv_spin_moved();
			spin = true;
		}
		rest -= (uint64_t)got;
		for (; n > 0 && (size_t)got >= iov->iov_len; iov++, n--) {
			got -= (ssize_t)iov->iov_len;
		}
		if (n > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + got;
			iov->iov_len -= (size_t)got;
		}
	}
	return 0;
}

static int kv_relay_move_buf(int fd, void *buf, size_t len, bool out)
{
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	return kv_relay_move(fd, &iov, 1, out);
}

/* The sending relay: requests from the prefill clients out, acknowledgements back in. */
static int kv_sender(const struct kv_opts *k, const struct kv_relay *r, int tcp)
{
	size_t req_max = sizeof(struct kv_relay_req) + 2 * KV_RELAY_BLOCKS_MAX * sizeof(uint32_t);
	struct kv_relay_req *req = malloc(req_max);
	struct kv_relay_hdr *hdr = malloc(sizeof(*hdr));
	struct iovec *iov = calloc(1 + KV_RELAY_BLOCKS_MAX, sizeof(*iov));
	struct pollfd pfd[1 + KV_CLIENTS_MAX];
	uint8_t *src[KV_CLIENTS_MAX];
	struct kv_relay_ack acks[256];
	size_t ack_bytes = 0;

	if (!req || !hdr || !iov) {
		return 1;
	}
	pfd[0] = (struct pollfd){.fd = tcp, .events = POLLIN};
	for (uint32_t i = 0; i < k->clients; i++) {
		src[i] = kv_relay_map(r->src_fd[i], kv_src_bytes(k));
		if (!src[i]) {
			return 1;
		}
		pfd[1 + i] = (struct pollfd){.fd = r->prefill_sock[i][1], .events = POLLIN};
	}
	for (;;) {
		bool spin = kv_spin_ns > 0 && kv_spin_again();
		int ready = poll(pfd, 1 + k->clients, spin ? 0 : -1);
		if (ready < 0) {
			if (errno == EINTR) {
				continue;
			}
			return 1;
		}
		if (ready == 0) {
			continue;
		}
		if (kv_spin_ns > 0) {
			kv_spin_moved();
		}
		if (pfd[0].revents) {
			ssize_t got = recv(tcp, (uint8_t *)acks + ack_bytes,
					   sizeof(acks) - ack_bytes, MSG_DONTWAIT);
			if (got == 0) {
				return 0;
			}
			if (got < 0 && errno != EAGAIN && errno != EINTR) {
				return 1;
			}
			ack_bytes += got > 0 ? (size_t)got : 0;
			size_t whole = ack_bytes / sizeof(acks[0]);
			for (size_t a = 0; a < whole; a++) {
				if (acks[a].client >= k->clients) {
					return 1;
				}
				/*
				 * A client that had every slot back from the decode client may
				 * have ended before its last completions: as a daemon does,
				 * drop them.
				 */
				if (send(r->prefill_sock[acks[a].client][1], &acks[a].slot,
					 sizeof(acks[a].slot), MSG_NOSIGNAL) < 0 &&
				    errno != EPIPE && errno != ECONNRESET) {
					return 1;
				}
			}
			ack_bytes -= whole * sizeof(acks[0]);
			memmove(acks, (uint8_t *)acks + whole * sizeof(acks[0]), ack_bytes);
		}
		for (uint32_t i = 0; i < k->clients; i++) {
			if (!pfd[1 + i].revents) {
				continue;
			}
			ssize_t got = recv(pfd[1 + i].fd, req, req_max, MSG_DONTWAIT);
			if (got == 0) {
				pfd[1 + i].fd = -1; /* the client is done */
				continue;
			}
			if (got < 0) {
				if (errno == EAGAIN || errno == EINTR) {
					continue;
				}
				return 1;
			}
			if ((size_t)got < sizeof(*req) || req->count == 0 ||
			    req->count > KV_RELAY_BLOCKS_MAX ||
			    (size_t)got != sizeof(*req) + 2 * req->count * sizeof(uint32_t)) {
				fprintf(stderr, "rdmax-bench kv: the relay got a bad request\n");
				return 1;
			}
			*hdr = (struct kv_relay_hdr){.client = i,
						     .slot = req->slot,
						     .imm = req->imm,
						     .count = req->count};
			memcpy(hdr->dst, req->idx + req->count, req->count * sizeof(uint32_t));
			iov[0] = (struct iovec){.iov_base = hdr,
						.iov_len = offsetof(struct kv_relay_hdr, dst) +
							   req->count * sizeof(uint32_t)};
			for (uint32_t b = 0; b < req->count; b++) {
				if (((uint64_t)req->idx[b] + 1) * k->block_len > kv_src_bytes(k)) {
					return 1;
				}
				iov[1 + b] = (struct iovec){
					.iov_base = src[i] + (uint64_t)req->idx[b] * k->block_len,
					.iov_len = k->block_len};
			}
			if (kv_relay_move(tcp, iov, 1 + req->count, true) < 0) {
				return 1;
			}
		}
	}
}

/* The receiving relay: each request's blocks into the pool, then its ack and its imm. */
static int kv_receiver(const struct kv_opts *k, const struct kv_relay *r, int tcp)
{
	uint64_t pool_blocks = kv_pool_blocks(k);
	uint8_t *pool = kv_relay_map(r->pool_fd, pool_blocks * k->block_len);
	struct kv_relay_hdr *hdr = malloc(sizeof(*hdr));
	struct iovec *iov = calloc(KV_RELAY_BLOCKS_MAX, sizeof(*iov));

	if (!pool || !hdr || !iov) {
		return 1;
	}
	for (;;) {
		int ret = kv_relay_move_buf(tcp, hdr, offsetof(struct kv_relay_hdr, dst), false);
		/*
		 * Between requests the sending relay's end is the end of the run: a
		 * close, or a reset where it was stopped with acknowledgements still
		 * unread (a prefill client may end once the decode handed every slot
		 * back, before its last completions).
		 */
		if (ret == -EPIPE || ret == -ECONNRESET) {
			return 0;
		}
		if (ret < 0 || hdr->count == 0 || hdr->count > KV_RELAY_BLOCKS_MAX ||
		    kv_relay_move_buf(tcp, hdr->dst, hdr->count * sizeof(uint32_t), false) < 0) {
			return 1;
		}
		for (uint32_t b = 0; b < hdr->count; b++) {
			if (hdr->dst[b] >= pool_blocks) {
				return 1;
			}
			iov[b] = (struct iovec){.iov_base =
							pool + (uint64_t)hdr->dst[b] * k->block_len,
						.iov_len = k->block_len};
		}
		struct kv_relay_ack ack = {.client = hdr->client, .slot = hdr->slot};
		if (kv_relay_move(tcp, iov, hdr->count, false) < 0 ||
		    kv_relay_move_buf(tcp, &ack, sizeof(ack), true) < 0 ||
		    send(r->decode_sock[1], &hdr->imm, sizeof(hdr->imm), MSG_NOSIGNAL) < 0) {
			return 1;
		}
	}
}

static int kv_memfd(const char *name, uint64_t len)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd >= 0 && ftruncate(fd, (off_t)len) < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	return fd < 0 ? -errno : fd;
}

static void kv_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int kv_relay_start(const struct kv_opts *k, struct kv_relay *r)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sa_len = sizeof(sa);
	int lfd;

	if (!k->one_job || kv_slot_bytes(k) / k->block_len > KV_RELAY_BLOCKS_MAX) {
		fprintf(stderr, "rdmax-bench kv: --relay takes --one-job and at most %d blocks\n",
			KV_RELAY_BLOCKS_MAX);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < k->clients; i++) {
		r->src_fd[i] = kv_memfd("rdmax-bench-kv-src", kv_src_bytes(k));
		if (r->src_fd[i] < 0) {
			return r->src_fd[i];
		}
		if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, r->prefill_sock[i]) < 0) {
			return -errno;
		}
	}
	r->pool_fd = kv_memfd("rdmax-bench-kv-pool", kv_pool_blocks(k) * k->block_len);
	if (r->pool_fd < 0) {
		return r->pool_fd;
	}
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, r->decode_sock) < 0) {
		return -errno;
	}
	kv_spin_ns = (uint64_t)k->relay_spin_us * 1000;
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 1) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sa_len) < 0) {
		return -errno;
	}
	r->receiver = fork();
	if (r->receiver == 0) {
		signal(SIGTERM, SIG_DFL);
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0) {
			_exit(1);
		}
		kv_nodelay(fd);
		_exit(kv_receiver(k, r, fd));
	}
	r->sender = r->receiver < 0 ? -1 : fork();
	if (r->sender == 0) {
		signal(SIGTERM, SIG_DFL);
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			_exit(1);
		}
		kv_nodelay(fd);
		_exit(kv_sender(k, r, fd));
	}
	close(lfd);
	return r->receiver < 0 || r->sender < 0 ? -errno : 0;
}

int kv_relay_stop(struct kv_relay *r)
{
	int ret = 0;

	for (int i = 0; i < 2; i++) {
		pid_t pid = i ? r->receiver : r->sender;
		int status;
		if (pid <= 0) {
			continue;
		}
		kill(pid, SIGTERM);
		if (waitpid(pid, &status, 0) < 0 ||
		    !(WIFSIGNALED(status) ? WTERMSIG(status) == SIGTERM
					  : WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
			ret = -EIO;
		}
	}
	return ret;
}

int kv_relay_submit(int sock, uint32_t slot, uint32_t imm, uint32_t count, const uint32_t *src,
		    const uint32_t *dst)
{
	uint32_t head[3] = {slot, imm, count};
	struct iovec iov[3] = {{head, sizeof(head)},
			       {(void *)src, count * sizeof(uint32_t)},
			       {(void *)dst, count * sizeof(uint32_t)}};
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 3};

	return sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 ? -errno : 0;
}

int kv_relay_poll(int sock, uint32_t *vals, int max, int timeout_ms)
{
	int n = 0;

	if (timeout_ms != 0) {
		struct pollfd pfd = {.fd = sock, .events = POLLIN};
		if (poll(&pfd, 1, timeout_ms) < 0) {
			return -errno;
		}
	}
	for (; n < max; n++) {
		ssize_t got = recv(sock, &vals[n], sizeof(vals[n]), MSG_DONTWAIT);
		if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
			break;
		}
		if (got != (ssize_t)sizeof(vals[n])) {
			return got < 0 ? -errno : -EPIPE;
		}
	}
	return n;
}
