/* SPDX-License-Identifier: MIT */
/*
 * librdmax against a fake daemon: a thread that listens on a socket in a
 * temporary folder and answers from a per-test script, recording what it
 * received for the test to check after joining it. The fake never asserts
 * itself (check's asserts belong to the test's own thread); it records the
 * first surprise in fake.bad.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../../client-lib/internal.h"
#include "fixtures.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "ring.h"

#define MAX_SEEN 4096

/* serve_ring's completion: found by a spinning client, or announced by a RingNotify. */
enum {
	RING_NOTIFY_NONE,
	RING_NOTIFY_COUNTED,   /* counted in notifies_sent, as the daemon does */
	RING_NOTIFY_UNCOUNTED, /* a daemon that offers the counts but does not keep them */
};

struct fake {
	char dir[64];
	char path[108];
	int lfd;
	int cfd;
	pthread_t thread;
	void (*serve)(struct fake *f);
	char bad[160]; /* first unexpected thing the fake met */

	/* What the Welcome says. */
	uint32_t welcome_version;
	uint32_t max_message_bytes;
	uint32_t max_jobs_per_submit;
	uint32_t max_outstanding_jobs;
	int refuse_hello;      /* Status to answer Hello with instead of Welcome */
	bool offer_ring;       /* RDMAX_CAP_RING: serve_ring answers RingSetup */
	bool post_after_yield; /* serve_ring: complete only once the client has yielded */
	bool offer_counts;     /* RDMAX_CAP_RING_COUNTS */
	int ring_notify;       /* serve_ring: RING_NOTIFY_* */
	pid_t client_tid;      /* serve_ring with a RingNotify: the thread that waits */

	/* What the fake saw. */
	char client_name[64];
	uint32_t hello_version;
	int n_seen;
	int seen[MAX_SEEN]; /* body case of every message after Hello */
	uint64_t next_region_id;
	Rdmax__V1__RegisterRegion *reg; /* last RegisterRegion */
	int reg_fd_count;
	int reg_seals;
	off_t reg_size;
	ino_t reg_ino;
	uint64_t dereg_id;
	Rdmax__V1__ClientMsg *submit[4]; /* first Submits, kept whole */
	int n_submits;
	size_t n_submitted_jobs;
	uint64_t last_submit_seq;
	uint64_t seq_seen_prev; /* for the strictly-increasing check */
};

#define FAKE_CHECK(f, cond)                                                                        \
	do {                                                                                       \
		if (!(cond) && !(f)->bad[0]) {                                                     \
			snprintf((f)->bad, sizeof((f)->bad), "line %d: %s", __LINE__, #cond);      \
		}                                                                                  \
	} while (0)

static int64_t ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A well-formed RegionDesc; node_pad lengthens it. Returns its encoded length. */
static size_t make_desc(uint8_t *buf, uint32_t version, int n_endpoints, uint64_t region_id,
			size_t node_pad)
{
	Rdmax__V1__RegionDesc d = RDMAX__V1__REGION_DESC__INIT;
	Rdmax__V1__Endpoint ep = RDMAX__V1__ENDPOINT__INIT;
	Rdmax__V1__Endpoint *eps[1] = {&ep};
	char node[RDMAX_DESC_MAX + 8];

	memset(node, 'n', node_pad);
	node[node_pad] = '\0';
	ep.transport = RDMAX__V1__TRANSPORT__TRANSPORT_TCP;
	ep.addr = "127.0.0.1";
	ep.port = 7471;
	d.version = version;
	d.instance_id = 0x1122334455667788ull;
	d.region_id = region_id;
	d.region_key = 0xabcdef;
	d.length = 8192;
	d.access = RDMAX_ACCESS_REMOTE_WRITE;
	d.n_endpoints = (size_t)n_endpoints;
	d.endpoints = eps;
	d.node_name = node;
	return rdmax__v1__region_desc__pack(&d, buf);
}

static void fake_send(struct fake *f, Rdmax__V1__DaemonMsg *m)
{
	size_t len = rdmax__v1__daemon_msg__get_packed_size(m);
	uint8_t *buf = malloc(len ? len : 1);
	rdmax__v1__daemon_msg__pack(m, buf);
	ssize_t n = send(f->cfd, buf, len, MSG_NOSIGNAL);
	FAKE_CHECK(f, n == (ssize_t)len);
	free(buf);
}

static void fake_send_error(struct fake *f, uint64_t seq, Rdmax__V1__Status status,
			    const char *message)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Error e = RDMAX__V1__ERROR__INIT;
	e.status = status;
	e.message = (char *)message;
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_ERROR;
	m.error = &e;
	fake_send(f, &m);
}

static void fake_send_completion(struct fake *f, uint64_t job_id, Rdmax__V1__Status status,
				 uint64_t bytes, const char *message)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Completions cs = RDMAX__V1__COMPLETIONS__INIT;
	Rdmax__V1__Completion c = RDMAX__V1__COMPLETION__INIT;
	Rdmax__V1__Completion *cp[1] = {&c};
	c.job_id = job_id;
	c.status = status;
	c.message = (char *)message;
	c.has_bytes = 1;
	c.bytes = bytes;
	cs.n_completions = 1;
	cs.completions = cp;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_COMPLETIONS;
	m.completions = &cs;
	fake_send(f, &m);
}

static void fake_send_imm(struct fake *f, uint32_t imm, uint64_t count)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__ImmReached ir = RDMAX__V1__IMM_REACHED__INIT;
	ir.imm = imm;
	ir.count = count;
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_IMM_REACHED;
	m.imm_reached = &ir;
	fake_send(f, &m);
}

/* Next client message (NULL at EOF); *ret_fd gets an attached fd or -1. */
static Rdmax__V1__ClientMsg *fake_recv(struct fake *f, int *ret_fd)
{
	const size_t buf_size = 256 * 1024;
	union {
		char b[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	uint8_t *buf = malloc(buf_size);
	struct iovec iov = {.iov_base = buf, .iov_len = buf_size};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	ssize_t n = recvmsg(f->cfd, &mh, MSG_CMSG_CLOEXEC);
	int fd = -1, n_fds = 0;

	if (n <= 0) {
		free(buf);
		return NULL;
	}
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			n_fds += (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			memcpy(&fd, CMSG_DATA(cm), sizeof(int));
		}
	}
	FAKE_CHECK(f, !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)));
	Rdmax__V1__ClientMsg *m = rdmax__v1__client_msg__unpack(NULL, (size_t)n, buf);
	free(buf);
	FAKE_CHECK(f, m != NULL);
	if (!m) {
		return NULL;
	}
	FAKE_CHECK(f, m->has_seq && m->seq > f->seq_seen_prev);
	f->seq_seen_prev = m->seq;
	if (ret_fd) {
		*ret_fd = fd;
		f->reg_fd_count = n_fds;
	} else if (fd >= 0) {
		close(fd);
	}
	if (m->body_case != RDMAX__V1__CLIENT_MSG__BODY_HELLO && f->n_seen < MAX_SEEN) {
		f->seen[f->n_seen++] = m->body_case;
	}
	return m;
}

static int fake_handshake(struct fake *f)
{
	Rdmax__V1__ClientMsg *m = fake_recv(f, NULL);
	Rdmax__V1__DaemonMsg r = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Welcome w = RDMAX__V1__WELCOME__INIT;
	Rdmax__V1__Limits l = RDMAX__V1__LIMITS__INIT;

	FAKE_CHECK(f, m && m->body_case == RDMAX__V1__CLIENT_MSG__BODY_HELLO);
	if (!m || m->body_case != RDMAX__V1__CLIENT_MSG__BODY_HELLO) {
		if (m) {
			rdmax__v1__client_msg__free_unpacked(m, NULL);
		}
		return -1;
	}
	f->hello_version = m->hello->protocol_version;
	snprintf(f->client_name, sizeof(f->client_name), "%s",
		 m->hello->client_name ? m->hello->client_name : "(none)");
	if (f->refuse_hello) {
		fake_send_error(f, m->seq, (Rdmax__V1__Status)f->refuse_hello, "go away");
		rdmax__v1__client_msg__free_unpacked(m, NULL);
		return -1;
	}
	l.max_message_bytes = f->max_message_bytes;
	l.max_fds_per_message = 1;
	l.max_regions = 16;
	l.max_registered_bytes = 1ull << 30;
	l.max_outstanding_jobs = f->max_outstanding_jobs;
	l.max_jobs_per_submit = f->max_jobs_per_submit;
	w.protocol_version = f->welcome_version;
	w.daemon_version = "9.8.7";
	w.instance_id = 0x1122334455667788ull;
	w.node_name = "fake-node";
	w.capabilities = RDMAX_CAP_TCP | RDMAX_CAP_AUTH | (f->offer_ring ? RDMAX_CAP_RING : 0) |
			 (f->offer_counts ? RDMAX_CAP_RING_COUNTS : 0);
	w.limits = &l;
	r.has_seq = 1;
	r.seq = m->seq;
	r.body_case = RDMAX__V1__DAEMON_MSG__BODY_WELCOME;
	r.welcome = &w;
	fake_send(f, &r);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	return 0;
}

static void fake_reply_region(struct fake *f, uint64_t seq, uint64_t length)
{
	Rdmax__V1__DaemonMsg r = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__RegionReply rr = RDMAX__V1__REGION_REPLY__INIT;
	uint8_t desc[RDMAX_DESC_MAX];
	uint64_t id = ++f->next_region_id;

	rr.region_id = id;
	rr.desc.data = desc;
	rr.desc.len = make_desc(desc, 1, 1, id, 8);
	rr.has_length = 1;
	rr.length = length;
	r.has_seq = 1;
	r.seq = seq;
	r.body_case = RDMAX__V1__DAEMON_MSG__BODY_REGION;
	r.region = &rr;
	fake_send(f, &r);
}

/* Handle one RegisterRegion: record the fd's seals, size and inode, then reply. */
static void fake_register(struct fake *f, Rdmax__V1__ClientMsg *m, int fd)
{
	struct stat st;

	FAKE_CHECK(f, fd >= 0);
	if (f->reg) {
		rdmax__v1__register_region__free_unpacked(f->reg, NULL);
	}
	f->reg = m->register_region;
	m->register_region = NULL;
	m->body_case = RDMAX__V1__CLIENT_MSG__BODY__NOT_SET;
	if (fd >= 0) {
		f->reg_seals = fcntl(fd, F_GET_SEALS);
		if (fstat(fd, &st) == 0) {
			f->reg_size = st.st_size;
			f->reg_ino = st.st_ino;
		}
		/* Write through the daemon's own mapping, as the real one would. */
		void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			       (off_t)f->reg->offset);
		FAKE_CHECK(f, p != MAP_FAILED);
		if (p != MAP_FAILED) {
			memcpy(p, "written by the fake", 20);
			munmap(p, 4096);
		}
		close(fd);
	}
	fake_reply_region(f, m->seq, f->reg->length);
}

/*
 * The default daemon: registers, deregisters, acknowledges ExpectImm, keeps
 * Submits silently, until the client hangs up (NULL) or sends a message of
 * kind \p stop_on_body (returned to the caller).
 */
static Rdmax__V1__ClientMsg *fake_loop(struct fake *f, int stop_on_body)
{
	for (;;) {
		int fd = -1;
		Rdmax__V1__ClientMsg *m = fake_recv(f, &fd);
		if (!m) {
			return NULL;
		}
		if ((int)m->body_case == stop_on_body) {
			if (fd >= 0) {
				close(fd);
			}
			return m;
		}
		switch (m->body_case) {
		case RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION:
			fake_register(f, m, fd);
			fd = -1;
			break;
		case RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION:
			f->dereg_id = m->deregister_region->region_id;
			fake_send_error(f, m->seq, RDMAX__V1__STATUS__OK, NULL);
			break;
		case RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM:
			fake_send_error(f, m->seq, RDMAX__V1__STATUS__OK, NULL);
			break;
		case RDMAX__V1__CLIENT_MSG__BODY_SUBMIT:
			f->n_submitted_jobs += m->submit->n_jobs;
			f->last_submit_seq = m->seq;
			if (f->n_submits < 4) {
				f->submit[f->n_submits++] = m;
				m = NULL;
			}
			break;
		default:
			FAKE_CHECK(f, !"unexpected request");
			break;
		}
		if (fd >= 0) {
			close(fd);
		}
		if (m) {
			rdmax__v1__client_msg__free_unpacked(m, NULL);
		}
	}
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;

	f->cfd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	FAKE_CHECK(f, f->cfd >= 0);
	if (f->cfd >= 0) {
		f->serve(f);
		close(f->cfd);
	}
	return NULL;
}

static void fake_init(struct fake *f)
{
	memset(f, 0, sizeof(*f));
	f->welcome_version = 1;
	f->max_message_bytes = 1 << 20;
	f->max_jobs_per_submit = 1024;
	f->max_outstanding_jobs = 65536;
	f->lfd = -1;
	f->cfd = -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/rdmax-unit-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/sock", f->dir);
}

static void fake_start(struct fake *f, void (*serve)(struct fake *f))
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
	f->serve = serve;
	f->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(f->lfd, 0);
	ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(f->lfd, 4), 0);
	ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

/* Join the fake and check it met no surprise. */
static void fake_stop(struct fake *f)
{
	ck_assert_int_eq(pthread_join(f->thread, NULL), 0);
	close(f->lfd);
	unlink(f->path);
	rmdir(f->dir);
	ck_assert_msg(f->bad[0] == '\0', "fake daemon: %s", f->bad);
}

static void fake_cleanup(struct fake *f)
{
	for (int i = 0; i < f->n_submits; i++) {
		rdmax__v1__client_msg__free_unpacked(f->submit[i], NULL);
	}
	if (f->reg) {
		rdmax__v1__register_region__free_unpacked(f->reg, NULL);
	}
}

static struct rdmax_client *open_client(struct fake *f)
{
	struct rdmax_client *c = NULL;
	ck_assert_int_eq(rdmax_client_open(f->path, "unit-test", &c), 0);
	ck_assert_ptr_nonnull(c);
	return c;
}

/* ---- strerror, descriptors, internals ---------------------------------- */

START_TEST(test_strerror_every_code)
{
	static const int codes[] = {
		RDMAX_E_INVALID_ARGUMENT,  RDMAX_E_NOT_FOUND,
		RDMAX_E_PERMISSION_DENIED, RDMAX_E_OUT_OF_RANGE,
		RDMAX_E_UNREACHABLE,       RDMAX_E_REMOTE_ACCESS,
		RDMAX_E_TIMEOUT,           RDMAX_E_CANCELLED,
		RDMAX_E_TRANSPORT_ERROR,   RDMAX_E_RESOURCE_EXHAUSTED,
		RDMAX_E_UNIMPLEMENTED,     RDMAX_E_PROTOCOL_ERROR,
		RDMAX_E_ALREADY_EXISTS,    RDMAX_E_INTERNAL,
		RDMAX_E_DISCONNECTED,
	};
	const size_t n = sizeof(codes) / sizeof(codes[0]);

	for (size_t i = 0; i < n; i++) {
		const char *s = rdmax_strerror(codes[i]);
		ck_assert_ptr_nonnull(s);
		ck_assert_msg(s[0] != '\0', "empty name for %d", codes[i]);
		ck_assert_msg(strcmp(s, rdmax_strerror(-1099)) != 0 &&
				      strcmp(s, rdmax_strerror(-4095)) != 0,
			      "no name for %d: %s", codes[i], s);
		for (size_t k = 0; k < i; k++) {
			ck_assert_msg(strcmp(s, rdmax_strerror(codes[k])) != 0,
				      "%d and %d share the name '%s'", codes[i], codes[k], s);
		}
	}
	ck_assert_str_eq(rdmax_strerror(0), "success");
	ck_assert_str_eq(rdmax_strerror(-ENOENT), "No such file or directory");
	ck_assert_str_eq(rdmax_strerror(-EPIPE), "Broken pipe");
	ck_assert_ptr_nonnull(strstr(rdmax_strerror(-1050), "unknown"));
	ck_assert_ptr_nonnull(strstr(rdmax_strerror(-999), "unknown"));
	ck_assert_ptr_nonnull(strstr(rdmax_strerror(-5000), "unknown"));
	ck_assert_ptr_nonnull(strstr(rdmax_strerror(7), "unknown"));
	/* The status mapping the library applies to completions. */
	ck_assert_int_eq(client_err_from_status(0), 0);
	ck_assert_int_eq(client_err_from_status(6), RDMAX_E_REMOTE_ACCESS);
	ck_assert_int_eq(client_err_from_status(14), RDMAX_E_INTERNAL);
	ck_assert_int_eq(client_err_from_status(100), RDMAX_E_INTERNAL);
	ck_assert_int_eq(client_err_from_status(-3), RDMAX_E_INTERNAL);
}
END_TEST

START_TEST(test_desc_import_good)
{
	uint8_t buf[RDMAX_DESC_MAX];
	struct rdmax_desc d;
	size_t len = make_desc(buf, 1, 1, 77, 16);

	memset(&d, 0xaa, sizeof(d));
	ck_assert_int_eq(rdmax_desc_import(buf, len, &d), 0);
	ck_assert_uint_eq(d.len, len);
	ck_assert_mem_eq(d.bytes, buf, len);
	ck_assert_uint_eq(d.bytes[len], 0);
	ck_assert_uint_eq(d.bytes[RDMAX_DESC_MAX - 1], 0);
}
END_TEST

START_TEST(test_desc_import_garbage)
{
	uint8_t buf[RDMAX_DESC_MAX + 64];
	uint8_t junk[64];
	struct rdmax_desc d;
	size_t len;

	memset(&d, 0xaa, sizeof(d));
	memset(junk, 0xff, sizeof(junk));
	ck_assert_int_eq(rdmax_desc_import(junk, sizeof(junk), &d), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_desc_import("hello world", 11, &d), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_desc_import(junk, 0, &d), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_desc_import(NULL, 10, &d), RDMAX_E_INVALID_ARGUMENT);

	len = make_desc(buf, 2, 1, 1, 0);
	ck_assert_int_eq(rdmax_desc_import(buf, len, &d), RDMAX_E_INVALID_ARGUMENT);
	len = make_desc(buf, 1, 0, 1, 0);
	ck_assert_int_eq(rdmax_desc_import(buf, len, &d), RDMAX_E_INVALID_ARGUMENT);
	/* A truncated good descriptor misses required fields. */
	len = make_desc(buf, 1, 1, 1, 0);
	ck_assert_int_eq(rdmax_desc_import(buf, len / 2, &d), RDMAX_E_INVALID_ARGUMENT);
	/* Well formed but longer than the library accepts. */
	len = make_desc(buf, 1, 1, 1, RDMAX_DESC_MAX);
	ck_assert_uint_gt(len, RDMAX_DESC_MAX);
	ck_assert_int_eq(rdmax_desc_import(buf, len, &d), RDMAX_E_INVALID_ARGUMENT);
	/* Out-parameter untouched on failure. */
	ck_assert_uint_eq(d.len, 0xaaaaaaaau);
	ck_assert_uint_eq(d.bytes[0], 0xaa);
}
END_TEST

/* Take the i-th event (negative: from the tail) from both the queue and the model. */
static void evq_take(struct client_evq *q, long pick, uint64_t *model, size_t *model_len)
{
	struct rdmax_event e;
	size_t i = pick < 0 ? q->len - (size_t)-pick : (size_t)pick;

	ck_assert_uint_lt(i, q->len);
	client_evq_remove(q, i, &e);
	ck_assert_uint_eq(e.job_id, model[i]);
	memmove(&model[i], &model[i + 1], (*model_len - i - 1) * sizeof(model[0]));
	(*model_len)--;
	ck_assert_uint_eq(q->len, *model_len);
	for (size_t k = 0; k < q->len; k++) {
		ck_assert_uint_eq(client_evq_at(q, k)->job_id, model[k]);
	}
}

static void evq_add(struct client_evq *q, uint64_t id, uint64_t *model, size_t *model_len)
{
	ck_assert_int_eq(client_evq_reserve(q, 1), 0);
	struct rdmax_event *p = client_evq_push(q);
	ck_assert_uint_eq(p->job_id, 0);
	ck_assert_int_eq(p->status, 0);
	p->job_id = id;
	model[(*model_len)++] = id;
}

START_TEST(test_event_queue)
{
	struct client_evq q = {0};
	struct rdmax_event out[64];
	uint64_t model[128];
	size_t n = 0;

	for (uint64_t id = 1; id <= 12; id++) {
		evq_add(&q, id, model, &n);
	}
	ck_assert_uint_eq(client_evq_pop(&q, out, 10), 10);
	for (size_t i = 0; i < 10; i++) {
		ck_assert_uint_eq(out[i].job_id, i + 1);
	}
	memmove(model, model + 10, 2 * sizeof(model[0]));
	n = 2;
	/* Fill the first ring exactly: it now wraps around its end. */
	size_t cap = q.cap;
	for (uint64_t id = 13; q.len < cap; id++) {
		evq_add(&q, id, model, &n);
	}
	ck_assert_uint_eq(q.cap, cap);
	ck_assert_uint_gt(q.head + q.len, q.cap);
	/* Near the head, the middle across the wrap, the tail, the head. */
	evq_take(&q, 1, model, &n);
	evq_take(&q, 9, model, &n);
	evq_take(&q, -2, model, &n);
	evq_take(&q, 0, model, &n);
	/* Grow from a wrapped state, then take again. */
	for (uint64_t id = 100; id < 150; id++) {
		evq_add(&q, id, model, &n);
	}
	ck_assert_uint_gt(q.cap, cap);
	evq_take(&q, 20, model, &n);
	evq_take(&q, -1, model, &n);
	evq_take(&q, 3, model, &n);

	size_t left = q.len;
	ck_assert_uint_eq(client_evq_pop(&q, out, 5), 5);
	ck_assert_uint_eq(client_evq_pop(&q, out + 5, 64), left - 5);
	for (size_t i = 0; i < left; i++) {
		ck_assert_uint_eq(out[i].job_id, model[i]);
	}
	ck_assert_uint_eq(client_evq_pop(&q, out, 64), 0);
	client_evq_free(&q);
	client_evq_free(NULL);
}
END_TEST

START_TEST(test_job_set)
{
	struct client_jobs s = {0};
	uint64_t seq;

	ck_assert(!client_jobs_has(&s, 5));
	ck_assert(!client_jobs_take(&s, 5, &seq));
	/* Ids that collide in the low bits, plus duplicates. */
	for (uint64_t i = 0; i < 3000; i++) {
		ck_assert_int_eq(client_jobs_reserve(&s, 1), 0);
		client_jobs_add(&s, (i % 1000) << 20, i + 1);
	}
	ck_assert_uint_eq(s.len, 3000);
	for (uint64_t i = 0; i < 1000; i += 2) {
		for (int k = 0; k < 3; k++) {
			ck_assert(client_jobs_take(&s, i << 20, &seq));
			ck_assert_uint_eq((seq - 1) % 1000, i);
		}
		ck_assert(!client_jobs_has(&s, i << 20));
	}
	for (uint64_t i = 1; i < 1000; i += 2) {
		ck_assert(client_jobs_has(&s, i << 20));
	}
	ck_assert_uint_eq(s.len, 1500);
	for (uint64_t i = 1; i < 1000; i += 2) {
		for (int k = 0; k < 3; k++) {
			ck_assert(client_jobs_take(&s, i << 20, &seq));
		}
	}
	ck_assert_uint_eq(s.len, 0);
	ck_assert(!client_jobs_has(&s, 1 << 20));
	client_jobs_free(&s);
}
END_TEST

START_TEST(test_copy_text)
{
	char buf[4];

	client_copy_text(buf, sizeof(buf), "abc");
	ck_assert_str_eq(buf, "abc");
	client_copy_text(buf, sizeof(buf), "abcdef");
	ck_assert_str_eq(buf, "abc");
	client_copy_text(buf, sizeof(buf), "ab\xc3\xa9");
	ck_assert_str_eq(buf, "ab"); /* é would be cut in half */
	client_copy_text(buf, sizeof(buf), "a\xe2\x82\xac");
	ck_assert_str_eq(buf, "a");
	client_copy_text(buf, sizeof(buf), NULL);
	ck_assert_str_eq(buf, "");
}
END_TEST

/* ---- against the fake daemon -------------------------------------------- */

static void serve_hello_then_hangup(struct fake *f)
{
	fake_handshake(f);
	Rdmax__V1__ClientMsg *m = fake_recv(f, NULL);
	FAKE_CHECK(f, m == NULL);
	if (m) {
		rdmax__v1__client_msg__free_unpacked(m, NULL);
	}
}

START_TEST(test_open_welcome)
{
	struct fake f;
	fake_init(&f);
	f.max_jobs_per_submit = 77;
	fake_start(&f, serve_hello_then_hangup);
	struct rdmax_client *c = open_client(&f);

	const struct rdmax_daemon_info *info = rdmax_client_info(c);
	ck_assert_uint_eq(info->protocol_version, 1);
	ck_assert_str_eq(info->daemon_version, "9.8.7");
	ck_assert_str_eq(info->node_name, "fake-node");
	ck_assert_uint_eq(info->instance_id, 0x1122334455667788ull);
	ck_assert_uint_eq(info->capabilities, RDMAX_CAP_TCP | RDMAX_CAP_AUTH);
	ck_assert_uint_eq(info->max_message_bytes, 1 << 20);
	ck_assert_uint_eq(info->max_regions, 16);
	ck_assert_uint_eq(info->max_registered_bytes, 1ull << 30);
	ck_assert_uint_eq(info->max_outstanding_jobs, 65536);
	ck_assert_uint_eq(info->max_jobs_per_submit, 77);
	int fd = rdmax_client_fd(c);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
	rdmax_client_close(c);
	rdmax_client_close(NULL);
	fake_stop(&f);
	fake_cleanup(&f);
	ck_assert_str_eq(f.client_name, "unit-test");
	ck_assert_uint_eq(f.hello_version, RDMAX_PROTOCOL_VERSION);
}
END_TEST

START_TEST(test_open_env_and_paths)
{
	struct fake f;
	struct rdmax_client *c = NULL;
	char long_path[200];

	fake_init(&f);
	fake_start(&f, serve_hello_then_hangup);
	setenv("RDMAX_SOCKET", f.path, 1);
	ck_assert_int_eq(rdmax_client_open(NULL, NULL, &c), 0);
	rdmax_client_close(c);
	fake_stop(&f);
	fake_cleanup(&f);
	/* No name given: the program's name goes in the Hello. */
	ck_assert_str_eq(f.client_name, program_invocation_short_name);

	c = NULL;
	ck_assert_int_eq(rdmax_client_open("/nonexistent/rdmax.sock", "x", &c), -ENOENT);
	ck_assert_ptr_null(c);
	memset(long_path, 'a', sizeof(long_path) - 1);
	long_path[0] = '/';
	long_path[sizeof(long_path) - 1] = '\0';
	ck_assert_int_eq(rdmax_client_open(long_path, "x", &c), -ENAMETOOLONG);
	ck_assert_int_eq(rdmax_client_open("", "x", &c), -EINVAL);
	ck_assert_int_eq(rdmax_client_open(f.path, "x", NULL), -EINVAL);
	ck_assert_ptr_null(c);
}
END_TEST

/* What rdmaxd does when it has too many clients: say why, hang up, read nothing. */
static void serve_reject(struct fake *f)
{
	Rdmax__V1__DaemonMsg m = RDMAX__V1__DAEMON_MSG__INIT;
	Rdmax__V1__Error e = RDMAX__V1__ERROR__INIT;
	e.status = RDMAX__V1__STATUS__RESOURCE_EXHAUSTED;
	e.message = "too many clients";
	m.body_case = RDMAX__V1__DAEMON_MSG__BODY_ERROR;
	m.error = &e;
	fake_send(f, &m);
}

static void serve_hello_only(struct fake *f)
{
	fake_handshake(f);
}

START_TEST(test_open_refused)
{
	struct fake f;
	struct rdmax_client *c = NULL;

	/* A daemon of another protocol version. */
	fake_init(&f);
	f.welcome_version = 2;
	fake_start(&f, serve_hello_only);
	ck_assert_int_eq(rdmax_client_open(f.path, "x", &c), RDMAX_E_PROTOCOL_ERROR);
	ck_assert_ptr_null(c);
	fake_stop(&f);

	/* A daemon that turns the client away before or after the Hello went out. */
	for (int i = 0; i < 10; i++) {
		fake_init(&f);
		fake_start(&f, serve_reject);
		ck_assert_int_eq(rdmax_client_open(f.path, "x", &c), RDMAX_E_RESOURCE_EXHAUSTED);
		ck_assert_ptr_null(c);
		fake_stop(&f);
	}

	/* A daemon that refuses the Hello. */
	fake_init(&f);
	f.refuse_hello = RDMAX__V1__STATUS__PERMISSION_DENIED;
	fake_start(&f, serve_hello_only);
	ck_assert_int_eq(rdmax_client_open(f.path, "x", &c), RDMAX_E_PERMISSION_DENIED);
	ck_assert_ptr_null(c);
	fake_stop(&f);
	fake_cleanup(&f);
}
END_TEST

/* Register, with 40 events sent before the reply; deregister, with one more. */
static void serve_alloc(struct fake *f)
{
	int fd = -1;
	Rdmax__V1__ClientMsg *m;

	if (fake_handshake(f) < 0) {
		return;
	}
	m = fake_recv(f, &fd);
	FAKE_CHECK(f, m && m->body_case == RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION);
	if (!m || m->body_case != RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION) {
		return;
	}
	for (uint64_t i = 0; i < 39; i++) {
		fake_send_completion(f, 1000 + i, RDMAX__V1__STATUS__OK, i, NULL);
	}
	fake_send_imm(f, 5, 2);
	fake_register(f, m, fd);
	rdmax__v1__client_msg__free_unpacked(m, NULL);

	m = fake_recv(f, NULL);
	FAKE_CHECK(f, m && m->body_case == RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION);
	if (!m || m->body_case != RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION) {
		return;
	}
	f->dereg_id = m->deregister_region->region_id;
	fake_send_imm(f, 6, 1);
	/* The daemon answers only when jobs holding the region are done: take a while. */
	usleep(50 * 1000);
	fake_send_error(f, m->seq, RDMAX__V1__STATUS__OK, NULL);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	fake_loop(f, -1);
}

START_TEST(test_alloc_host_queues_events)
{
	struct fake f;
	struct rdmax_region *region = NULL;
	struct rdmax_event ev[64];
	struct rdmax_desc d;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	fake_init(&f);
	fake_start(&f, serve_alloc);
	struct rdmax_client *c = open_client(&f);

	ck_assert_int_eq(rdmax_region_alloc_host(c, 5000, RDMAX_ACCESS_REMOTE_WRITE, &region), 0);
	ck_assert_ptr_nonnull(region);
	ck_assert_uint_eq(rdmax_region_length(region), (5000 + page - 1) / page * page);
	ck_assert_uint_eq(rdmax_region_id(region), 1);
	/* The fake wrote through its own mapping of the memfd: we share the pages. */
	ck_assert_str_eq((char *)rdmax_region_addr(region), "written by the fake");
	ck_assert_int_eq(rdmax_region_desc(region, &d), 0);
	ck_assert_int_eq(rdmax_desc_import(d.bytes, d.len, &d), 0);

	int64_t t0 = ms_now();
	ck_assert_int_eq(rdmax_region_free(c, region), 0);
	ck_assert_int_ge(ms_now() - t0, 40);

	/* Everything that arrived while waiting for replies, in order. */
	ck_assert_int_eq(rdmax_poll_events(c, ev, 64, 0), 41);
	for (int i = 0; i < 39; i++) {
		ck_assert_int_eq(ev[i].type, RDMAX_EVENT_COMPLETION);
		ck_assert_uint_eq(ev[i].job_id, 1000 + (uint64_t)i);
		ck_assert_uint_eq(ev[i].bytes, (uint64_t)i);
		ck_assert_int_eq(ev[i].status, 0);
	}
	ck_assert_int_eq(ev[39].type, RDMAX_EVENT_IMM_REACHED);
	ck_assert_uint_eq(ev[39].imm, 5);
	ck_assert_uint_eq(ev[39].count, 2);
	ck_assert_int_eq(ev[40].type, RDMAX_EVENT_IMM_REACHED);
	ck_assert_uint_eq(ev[40].imm, 6);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 64, 0), 0);
	/* Completions of jobs never submitted do not make the count negative. */
	ck_assert_uint_eq(client_outstanding_jobs(c), 0);
	rdmax_client_close(c);
	fake_stop(&f);

	ck_assert_ptr_nonnull(f.reg);
	ck_assert_int_eq(f.reg->kind, RDMAX__V1__REGION_KIND__REGION_HOST_FD);
	ck_assert_uint_eq(f.reg->access, RDMAX_ACCESS_REMOTE_WRITE);
	ck_assert_uint_eq(f.reg->offset, 0);
	ck_assert_uint_eq(f.reg->length, (5000 + page - 1) / page * page);
	ck_assert_uint_eq(f.reg->fd_index, 0);
	ck_assert_int_eq(f.reg_fd_count, 1);
	ck_assert_int_eq(f.reg_seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	ck_assert_int_eq(f.reg_size, (off_t)((5000 + page - 1) / page * page));
	ck_assert_uint_eq(f.dereg_id, 1);
	fake_cleanup(&f);
}
END_TEST

static void serve_register_fd(struct fake *f)
{
	if (fake_handshake(f) < 0) {
		return;
	}
	Rdmax__V1__ClientMsg *m = fake_loop(f, RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION);
	if (m) {
		fake_send_error(f, m->seq, RDMAX__V1__STATUS__NOT_FOUND, "gone");
		rdmax__v1__client_msg__free_unpacked(m, NULL);
	}
	fake_loop(f, -1);
}

START_TEST(test_register_fd)
{
	struct fake f;
	struct rdmax_region *region = NULL;
	struct stat st;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	fake_init(&f);
	fake_start(&f, serve_register_fd);
	struct rdmax_client *c = open_client(&f);

	int fd = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)(4 * page)), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	void *addr = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)page);
	ck_assert_ptr_ne(addr, MAP_FAILED);

	ck_assert_int_eq(rdmax_region_register_fd(c, fd, page + 1, page, addr, 0, &region),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_region_register_fd(c, -1, 0, page, addr, 0, &region), -EBADF);
	ck_assert_int_eq(rdmax_region_register_fd(c, fd, 0, 0, addr, 0, &region),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_region_register_fd(c, fd, 0, page, addr, 0x80, &region),
			 RDMAX_E_INVALID_ARGUMENT);
	ck_assert_ptr_null(region);

	ck_assert_int_eq(rdmax_region_register_fd(c, fd, page, 2 * page, addr,
						  RDMAX_ACCESS_REMOTE_READ, &region),
			 0);
	ck_assert_ptr_eq(rdmax_region_addr(region), addr);
	ck_assert_uint_eq(rdmax_region_length(region), 2 * page);
	/* The caller's fd stays the caller's. */
	ck_assert_int_ge(fcntl(fd, F_GETFD), 0);
	ck_assert_int_eq(fstat(fd, &st), 0);

	/* The daemon's error comes back, and the handle is freed all the same. */
	ck_assert_int_eq(rdmax_region_deregister(c, region), RDMAX_E_NOT_FOUND);
	/* Our mapping is the caller's: still there. */
	ck_assert_str_eq((char *)addr, "written by the fake");
	rdmax_client_close(c);
	fake_stop(&f);

	ck_assert_uint_eq(f.reg->offset, page);
	ck_assert_uint_eq(f.reg->length, 2 * page);
	ck_assert_uint_eq(f.reg->access, RDMAX_ACCESS_REMOTE_READ);
	ck_assert_uint_eq((uint64_t)f.reg_ino, (uint64_t)st.st_ino);
	ck_assert_int_eq(f.reg_seals, F_SEAL_SHRINK);
	munmap(addr, 2 * page);
	close(fd);
	fake_cleanup(&f);
}
END_TEST

#define LONG_MESSAGE_LEN 300

static void serve_submit(struct fake *f)
{
	char message[LONG_MESSAGE_LEN + 1];

	if (fake_handshake(f) < 0) {
		return;
	}
	Rdmax__V1__ClientMsg *m = fake_loop(f, RDMAX__V1__CLIENT_MSG__BODY_SUBMIT);
	if (!m) {
		return;
	}
	f->submit[f->n_submits++] = m;
	memset(message, 'x', LONG_MESSAGE_LEN);
	message[LONG_MESSAGE_LEN] = '\0';
	fake_send_completion(f, 2, RDMAX__V1__STATUS__REMOTE_ACCESS, 0, message);
	fake_send_imm(f, 9, 3);
	fake_send_completion(f, 1, RDMAX__V1__STATUS__OK, 4096, NULL);
	fake_loop(f, -1);
}

START_TEST(test_submit_encoding_and_wait)
{
	struct fake f;
	struct rdmax_region *region;
	struct rdmax_desc remote;
	struct rdmax_event ev[8];
	uint8_t buf[RDMAX_DESC_MAX];

	fake_init(&f);
	fake_start(&f, serve_submit);
	struct rdmax_client *c = open_client(&f);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 8192, RDMAX_ACCESS_LOCAL, &region), 0);
	size_t dlen = make_desc(buf, 1, 1, 99, 32);
	ck_assert_int_eq(rdmax_desc_import(buf, dlen, &remote), 0);

	struct rdmax_job jobs[2] = {
		{.id = 1,
		 .op = RDMAX_OP_WRITE,
		 .flags = RDMAX_JOB_IMM,
		 .imm = 9,
		 .deadline_ms = 500,
		 .local = region,
		 .local_offset = 4096,
		 .length = 4096,
		 .remote = &remote,
		 .remote_offset = 128},
		{.id = 2,
		 .op = RDMAX_OP_READ,
		 .local = region,
		 .local_offset = 0,
		 .length = 100,
		 .remote = &remote,
		 .remote_offset = 64},
	};
	ck_assert_int_eq(rdmax_submit(c, jobs, 2), 0);
	ck_assert_uint_eq(client_outstanding_jobs(c), 2);
	ck_assert_int_eq(rdmax_submit(c, jobs, 0), 0);

	/* Job 1 completes last; the events before it stay queued. */
	ck_assert_int_eq(rdmax_wait_job(c, 1, 2000), 0);
	ck_assert_uint_eq(client_outstanding_jobs(c), 0);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 8, 0), 2);
	ck_assert_int_eq(ev[0].type, RDMAX_EVENT_COMPLETION);
	ck_assert_uint_eq(ev[0].job_id, 2);
	ck_assert_int_eq(ev[0].status, RDMAX_E_REMOTE_ACCESS);
	ck_assert_uint_eq(strlen(ev[0].reason), RDMAX_MESSAGE_MAX - 1);
	ck_assert_int_eq(ev[0].reason[0], 'x');
	ck_assert_int_eq(ev[1].type, RDMAX_EVENT_IMM_REACHED);
	ck_assert_uint_eq(ev[1].imm, 9);
	ck_assert_uint_eq(ev[1].count, 3);
	/* Consumed and no longer outstanding: nothing to wait for. */
	ck_assert_int_eq(rdmax_wait_job(c, 2, 1000), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(rdmax_wait_job(c, 1, 1000), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(rdmax_region_free(c, region), 0);
	rdmax_client_close(c);
	fake_stop(&f);

	ck_assert_int_eq(f.n_submits, 1);
	const Rdmax__V1__Submit *s = f.submit[0]->submit;
	ck_assert_uint_eq(s->n_jobs, 2);
	const Rdmax__V1__Job *j0 = s->jobs[0];
	ck_assert_uint_eq(j0->job_id, 1);
	ck_assert(j0->has_deadline_ms);
	ck_assert_uint_eq(j0->deadline_ms, 500);
	ck_assert_int_eq(j0->kind_case, RDMAX__V1__JOB__KIND_WRITE);
	ck_assert_uint_eq(j0->write->local_region, 1);
	ck_assert_uint_eq(j0->write->local_offset, 4096);
	ck_assert_uint_eq(j0->write->length, 4096);
	ck_assert_uint_eq(j0->write->remote_offset, 128);
	ck_assert_uint_eq(j0->write->remote_desc.len, dlen);
	ck_assert_mem_eq(j0->write->remote_desc.data, buf, dlen);
	ck_assert(j0->write->has_imm);
	ck_assert_uint_eq(j0->write->imm, 9);
	const Rdmax__V1__Job *j1 = s->jobs[1];
	ck_assert_uint_eq(j1->job_id, 2);
	ck_assert(!j1->has_deadline_ms);
	ck_assert_int_eq(j1->kind_case, RDMAX__V1__JOB__KIND_READ);
	ck_assert_uint_eq(j1->read->local_region, 1);
	ck_assert_uint_eq(j1->read->local_offset, 0);
	ck_assert_uint_eq(j1->read->length, 100);
	ck_assert_uint_eq(j1->read->remote_offset, 64);
	ck_assert_mem_eq(j1->read->remote_desc.data, buf, dlen);
	fake_cleanup(&f);
}
END_TEST

static void serve_default(struct fake *f)
{
	if (fake_handshake(f) == 0) {
		fake_loop(f, -1);
	}
}

/* The library's sched_yield() calls (the unit binary links with --wrap=sched_yield). */
static atomic_uint g_yields;
int __real_sched_yield(void);
int __wrap_sched_yield(void);

int __wrap_sched_yield(void)
{
	atomic_fetch_add(&g_yields, 1);
	return __real_sched_yield();
}

/*
 * A daemon with a ring: answers RingSetup with the daemon's own ring code and
 * one RegisterRegion, then completes the first ring entry through the ring,
 * at once or (post_after_yield) only after the client's first yield, and
 * answers the DeregisterRegion. Each datagram it sends is reported in the
 * ring, as the daemon does: a client on its ring reads the socket only then.
 * With ring_notify it completes only once the client sleeps, and wakes it
 * with a RingNotify.
 */
static void serve_ring(struct fake *f)
{
	struct ring ring = {0};
	uint8_t entry[RDMAX_RING_MAX_SQE_BYTES];
	int fd = -1;

	if (fake_handshake(f) < 0) {
		return;
	}
	Rdmax__V1__ClientMsg *m = fake_recv(f, &fd);
	FAKE_CHECK(f, m && m->body_case == RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP && fd >= 0);
	if (!m || m->body_case != RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP || fd < 0) {
		return;
	}
	int ret = ring_map(fd, m->ring_setup->sq_entries, m->ring_setup->sq_entry_bytes,
			   m->ring_setup->cq_entries, &ring);
	FAKE_CHECK(f, ret == 0);
	close(fd);
	fake_send_error(f, m->seq, RDMAX__V1__STATUS__OK, NULL);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	if (ret != 0) {
		return;
	}
	uint64_t sent = 2; /* the Welcome and this answer */
	fd = -1;
	m = fake_recv(f, &fd);
	FAKE_CHECK(f, m && m->body_case == RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION);
	if (!m) {
		ring_unmap(&ring);
		return;
	}
	fake_register(f, m, fd);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	ring_report_sent(&ring, ++sent);

	int64_t deadline = ms_now() + 10000;
	while (ring_sq_peek(&ring, UINT64_MAX, entry, sizeof(entry)) == -EAGAIN &&
	       ms_now() < deadline) {
	}
	ring_sq_consume(&ring);
	while (f->post_after_yield && atomic_load(&g_yields) == 0 && ms_now() < deadline) {
	}
	while (f->ring_notify && !unit_thread_sleeps(f->client_tid) && ms_now() < deadline) {
	}
	FAKE_CHECK(f, ms_now() < deadline);
	FAKE_CHECK(f, ring_cq_post(&ring, 7, RDMAX__V1__STATUS__OK, 64, NULL, 0) == 0);
	if (f->ring_notify) {
		Rdmax__V1__DaemonMsg r = RDMAX__V1__DAEMON_MSG__INIT;
		Rdmax__V1__RingNotify notify = RDMAX__V1__RING_NOTIFY__INIT;

		FAKE_CHECK(f, ring_take_wake_request(&ring) == RING_WAKE_TAKEN);
		if (f->ring_notify == RING_NOTIFY_COUNTED) {
			ring_report_notifies(&ring, 1);
		}
		r.body_case = RDMAX__V1__DAEMON_MSG__BODY_RING_NOTIFY;
		r.ring_notify = &notify;
		fake_send(f, &r);
	}
	m = fake_recv(f, NULL);
	FAKE_CHECK(f, m && m->body_case == RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION);
	if (m) {
		fake_send_error(f, m->seq, RDMAX__V1__STATUS__OK, NULL);
		ring_report_sent(&ring, ++sent);
		rdmax__v1__client_msg__free_unpacked(m, NULL);
		m = fake_recv(f, NULL); /* the hang-up */
		FAKE_CHECK(f, !m);
	}
	ring_unmap(&ring);
}

/* serve_ring's job: a 64 B write, id 7, from a new 4 KiB region (returned) to \p remote. */
static struct rdmax_region *ring_job_region(struct rdmax_client *c, struct rdmax_job *job,
					    struct rdmax_desc *remote)
{
	struct rdmax_region *region;
	uint8_t buf[RDMAX_DESC_MAX];

	ck_assert_int_eq(rdmax_region_alloc_host(c, 4096, RDMAX_ACCESS_LOCAL, &region), 0);
	ck_assert_int_eq(rdmax_desc_import(buf, make_desc(buf, 1, 1, 99, 8), remote), 0);
	*job = (struct rdmax_job){
		.id = 7, .op = RDMAX_OP_WRITE, .local = region, .length = 64, .remote = remote};
	return region;
}

/*
 * A ring wait pauses before it yields (RDMAX_SPIN_PAUSE_NS): a completion
 * that comes within the pause costs no sched_yield(); with no pause the
 * wait yields between its looks, and still sees the completion.
 */
START_TEST(test_ring_wait_pauses_before_yielding)
{
	for (int pausing = 1; pausing >= 0; pausing--) {
		struct fake f;
		struct rdmax_region *region;
		struct rdmax_desc remote;
		struct rdmax_job job;

		/* Long enough that neither the spin nor the pause can end first. */
		setenv("RDMAX_SPIN_US", "20000000", 1);
		setenv("RDMAX_SPIN_PAUSE_NS", pausing ? "4000000000" : "0", 1);
		fake_init(&f);
		f.offer_ring = true;
		f.post_after_yield = !pausing;
		fake_start(&f, serve_ring);
		struct rdmax_client *c = open_client(&f);
		unsetenv("RDMAX_SPIN_US");
		unsetenv("RDMAX_SPIN_PAUSE_NS");
		region = ring_job_region(c, &job, &remote);
		atomic_store(&g_yields, 0);
		ck_assert_int_eq(rdmax_submit(c, &job, 1), 0);
		ck_assert_int_eq(rdmax_wait_job(c, 7, 10000), 0);
		unsigned yields = atomic_load(&g_yields);
		if (pausing) {
			ck_assert_msg(yields == 0, "%u sched_yield() calls within the pause",
				      yields);
		} else {
			ck_assert_uint_ge(yields, 1);
		}
		ck_assert_int_eq(rdmax_region_free(c, region), 0);
		rdmax_client_close(c);
		fake_stop(&f);
		fake_cleanup(&f);
	}
}
END_TEST

/*
 * A sleeping ring client reads what the daemon's counts name and no more: a
 * wake-up by a counted RingNotify costs no recvmsg() that hears EAGAIN. A
 * daemon that offers the counts but leaves a RingNotify out of them costs
 * the client that read back, not a busy poll() on the unread datagram.
 */
START_TEST(test_ring_reads_what_the_daemon_counts)
{
	for (int notify = RING_NOTIFY_COUNTED; notify <= RING_NOTIFY_UNCOUNTED; notify++) {
		struct fake f;
		struct rdmax_region *region;
		struct rdmax_desc remote;
		struct rdmax_job job;
		struct rdmax_event ev;
		struct timespec t0, t1;

		setenv("RDMAX_SPIN_US", "0", 1);
		fake_init(&f);
		f.offer_ring = true;
		f.offer_counts = true;
		f.ring_notify = notify;
		f.client_tid = (pid_t)syscall(SYS_gettid);
		fake_start(&f, serve_ring);
		struct rdmax_client *c = open_client(&f);
		unsetenv("RDMAX_SPIN_US");
		ck_assert_int_eq(rdmax_client_uses_ring(c), 1);
		region = ring_job_region(c, &job, &remote);
		uint64_t eagain = unit_recvmsg_eagain();
		ck_assert_int_eq(rdmax_submit(c, &job, 1), 0);
		ck_assert_int_eq(rdmax_wait_job(c, 7, 10000), 0);
		if (notify == RING_NOTIFY_COUNTED) {
			ck_assert_uint_eq(unit_recvmsg_eagain() - eagain, 0);
		}
		/* Nothing more comes: the wait sleeps, whatever was left unread. */
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
		ck_assert_int_eq(rdmax_poll_events(c, &ev, 1, 300), 0);
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
		int64_t cpu_ns = (t1.tv_sec - t0.tv_sec) * 1000000000ll + (t1.tv_nsec - t0.tv_nsec);
		ck_assert_msg(cpu_ns < 30000000, "a 300 ms wait spent %lld ns of CPU",
			      (long long)cpu_ns);
		ck_assert_int_eq(rdmax_region_free(c, region), 0);
		rdmax_client_close(c);
		fake_stop(&f);
		fake_cleanup(&f);
	}
}
END_TEST

START_TEST(test_submit_refused_locally)
{
	struct fake f;
	struct rdmax_region *region;
	struct rdmax_desc small, big;
	uint8_t buf[RDMAX_DESC_MAX];

	fake_init(&f);
	f.max_jobs_per_submit = 4;
	f.max_message_bytes = 2048;
	f.max_outstanding_jobs = 6;
	fake_start(&f, serve_default);
	struct rdmax_client *c = open_client(&f);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 4096, 0, &region), 0);
	ck_assert_int_eq(rdmax_desc_import(buf, make_desc(buf, 1, 1, 5, 0), &small), 0);
	ck_assert_int_eq(rdmax_desc_import(buf, make_desc(buf, 1, 1, 5, 900), &big), 0);

	struct rdmax_job ok = {
		.id = 1, .op = RDMAX_OP_WRITE, .local = region, .length = 4096, .remote = &small};
	struct rdmax_job j = ok;
	j.op = (enum rdmax_op)99;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	/* Other kinds whose fields cannot be encoded: a page list without indices, no payload. */
	j.op = RDMAX_OP_PAGED_WRITE;
	j.u.paged.page_len = 4096;
	j.u.paged.local_pages.count = j.u.paged.remote_pages.count = 1;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	j = ok;
	j.op = RDMAX_OP_SEND;
	j.u.send.length = 1;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	j.u.send.mailbox = "box";
	j.u.send.length = RDMAX_MESSAGE_PAYLOAD_MAX + 1;
	j.u.send.payload = &j;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_RESOURCE_EXHAUSTED);
	j = ok;
	j.op = RDMAX_OP_BARRIER;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	j = ok;
	j.op = RDMAX_OP_READ;
	j.flags = RDMAX_JOB_IMM;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	j = ok;
	j.flags = 0x80;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	j = ok;
	j.local = NULL;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	j = ok;
	j.remote = NULL;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_INVALID_ARGUMENT);
	j = ok;
	j.local_offset = 1;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_OUT_OF_RANGE);
	j = ok;
	j.local_offset = UINT64_MAX;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), RDMAX_E_OUT_OF_RANGE);
	ck_assert_int_eq(rdmax_submit(NULL, &ok, 1), -EINVAL);
	ck_assert_int_eq(rdmax_submit(c, NULL, 1), -EINVAL);

	/* One bad job refuses the whole batch. */
	struct rdmax_job batch[5] = {ok, ok, ok, ok, ok};
	batch[2].remote = NULL;
	ck_assert_int_eq(rdmax_submit(c, batch, 3), RDMAX_E_INVALID_ARGUMENT);
	batch[2].remote = &small;
	/* Limits from the Welcome. */
	ck_assert_int_eq(rdmax_submit(c, batch, 5), RDMAX_E_RESOURCE_EXHAUSTED);
	batch[0].remote = batch[1].remote = batch[2].remote = &big;
	ck_assert_int_eq(rdmax_submit(c, batch, 3), RDMAX_E_RESOURCE_EXHAUSTED);
	batch[0].remote = batch[1].remote = batch[2].remote = &small;
	ck_assert_int_eq(rdmax_submit(c, batch, 4), 0);
	ck_assert_int_eq(rdmax_submit(c, batch, 3), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(rdmax_submit(c, batch, 2), 0);
	ck_assert_uint_eq(client_outstanding_jobs(c), 6);
	ck_assert_int_eq(rdmax_submit(c, batch, 1), RDMAX_E_RESOURCE_EXHAUSTED);

	/* A synchronous request last, so the fake has seen everything. */
	ck_assert_int_eq(rdmax_expect_imm(c, 1, 1), 0);
	rdmax_client_close(c);
	fake_stop(&f);
	ck_assert_int_eq(f.n_seen, 4);
	ck_assert_int_eq(f.seen[0], RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION);
	ck_assert_int_eq(f.seen[1], RDMAX__V1__CLIENT_MSG__BODY_SUBMIT);
	ck_assert_int_eq(f.seen[2], RDMAX__V1__CLIENT_MSG__BODY_SUBMIT);
	ck_assert_int_eq(f.seen[3], RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM);
	ck_assert_uint_eq(f.n_submitted_jobs, 6);
	fake_cleanup(&f);
}
END_TEST

/* Accept Submit A silently, refuse Submit B, then complete A's job. */
static void serve_refuse(struct fake *f)
{
	if (fake_handshake(f) < 0) {
		return;
	}
	Rdmax__V1__ClientMsg *a = fake_loop(f, RDMAX__V1__CLIENT_MSG__BODY_SUBMIT);
	Rdmax__V1__ClientMsg *b = a ? fake_recv(f, NULL) : NULL;
	FAKE_CHECK(f, b && b->body_case == RDMAX__V1__CLIENT_MSG__BODY_SUBMIT);
	if (b) {
		fake_send_error(f, b->seq, RDMAX__V1__STATUS__RESOURCE_EXHAUSTED, "queue full");
		rdmax__v1__client_msg__free_unpacked(b, NULL);
	}
	if (a) {
		fake_send_completion(f, a->submit->jobs[0]->job_id, RDMAX__V1__STATUS__OK, 1, NULL);
		rdmax__v1__client_msg__free_unpacked(a, NULL);
	}
	fake_loop(f, -1);
}

START_TEST(test_submit_refused_by_daemon)
{
	struct fake f;
	struct rdmax_region *region;
	struct rdmax_desc remote;
	struct rdmax_event ev[4];
	uint8_t buf[RDMAX_DESC_MAX];

	fake_init(&f);
	fake_start(&f, serve_refuse);
	struct rdmax_client *c = open_client(&f);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 4096, 0, &region), 0);
	ck_assert_int_eq(rdmax_desc_import(buf, make_desc(buf, 1, 1, 5, 0), &remote), 0);
	struct rdmax_job j = {
		.op = RDMAX_OP_WRITE, .local = region, .length = 1, .remote = &remote};
	struct rdmax_job batch[2] = {j, j};

	j.id = 10;
	ck_assert_int_eq(rdmax_submit(c, &j, 1), 0);
	batch[0].id = 1;
	batch[1].id = 2;
	ck_assert_int_eq(rdmax_submit(c, batch, 2), 0);
	ck_assert_uint_eq(client_outstanding_jobs(c), 3);

	/* Each job of the refused Submit gets its one completion, carrying the refusal. */
	ck_assert_int_eq(rdmax_wait_job(c, 1, 2000), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_uint_eq(client_outstanding_jobs(c), 1);
	ck_assert_int_eq(rdmax_wait_job(c, 10, 2000), 0);
	ck_assert_uint_eq(client_outstanding_jobs(c), 0);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 0), 1);
	ck_assert_uint_eq(ev[0].job_id, 2);
	ck_assert_int_eq(ev[0].status, RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_str_eq(ev[0].reason, "queue full");
	rdmax_client_close(c);
	fake_stop(&f);
	fake_cleanup(&f);
}
END_TEST

static void serve_expect_imm(struct fake *f)
{
	if (fake_handshake(f) < 0) {
		return;
	}
	Rdmax__V1__ClientMsg *m = fake_loop(f, RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM);
	if (!m) {
		return;
	}
	/* The refused standing claims never reached the daemon: this is the plain one. */
	FAKE_CHECK(f, m->expect_imm->imm == 3 && m->expect_imm->count == 2 &&
			      !m->expect_imm->has_standing && !m->expect_imm->has_reset);
	fake_send_error(f, m->seq, RDMAX__V1__STATUS__ALREADY_EXISTS, "claimed");
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	m = fake_loop(f, RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM);
	if (!m) {
		return;
	}
	FAKE_CHECK(f, m->expect_imm->imm == 4 && m->expect_imm->has_reset && m->expect_imm->reset &&
			      !m->expect_imm->has_standing);
	fake_send_error(f, m->seq, RDMAX__V1__STATUS__OK, NULL);
	fake_send_completion(f, 50, RDMAX__V1__STATUS__OK, 0, NULL);
	usleep(30 * 1000);
	fake_send_imm(f, 4, 2);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	fake_loop(f, -1);
}

START_TEST(test_expect_and_wait_imm)
{
	struct fake f;
	struct rdmax_event ev[4];

	fake_init(&f);
	fake_start(&f, serve_expect_imm);
	struct rdmax_client *c = open_client(&f);
	/* This daemon lacks RDMAX_CAP_IMM_STANDING: refused here, never sent as one-shot. */
	ck_assert_int_eq(rdmax_expect_imm_flags(c, 3, 2, RDMAX_EXPECT_STANDING),
			 RDMAX_E_UNIMPLEMENTED);
	ck_assert_int_eq(rdmax_release_imm(c, 3), RDMAX_E_UNIMPLEMENTED);
	ck_assert_int_eq(rdmax_expect_imm_flags(c, 3, 2, 0x100), RDMAX_E_INVALID_ARGUMENT);
	ck_assert_int_eq(rdmax_expect_imm(c, 3, 2), RDMAX_E_ALREADY_EXISTS);
	ck_assert_int_eq(rdmax_expect_imm_flags(c, 4, 2, RDMAX_EXPECT_RESET), 0);
	ck_assert_int_eq(rdmax_wait_imm(c, 4, 2000), 0);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 0), 1);
	ck_assert_uint_eq(ev[0].job_id, 50);
	rdmax_client_close(c);
	fake_stop(&f);
	fake_cleanup(&f);
}
END_TEST

START_TEST(test_timeouts)
{
	struct fake f;
	struct rdmax_region *region;
	struct rdmax_desc remote;
	struct rdmax_event ev[4];
	uint8_t buf[RDMAX_DESC_MAX];
	int64_t t0;

	fake_init(&f);
	fake_start(&f, serve_default);
	struct rdmax_client *c = open_client(&f);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 4096, 0, &region), 0);
	ck_assert_int_eq(rdmax_desc_import(buf, make_desc(buf, 1, 1, 5, 0), &remote), 0);
	struct rdmax_job j = {
		.id = 5, .op = RDMAX_OP_WRITE, .local = region, .length = 1, .remote = &remote};
	ck_assert_int_eq(rdmax_submit(c, &j, 1), 0);

	t0 = ms_now();
	ck_assert_int_eq(rdmax_wait_job(c, 5, 80), RDMAX_E_TIMEOUT);
	ck_assert_int_ge(ms_now() - t0, 80);
	ck_assert_int_lt(ms_now() - t0, 1000);
	/* Never submitted: answered at once. */
	t0 = ms_now();
	ck_assert_int_eq(rdmax_wait_job(c, 6, 5000), RDMAX_E_NOT_FOUND);
	ck_assert_int_lt(ms_now() - t0, 1000);
	t0 = ms_now();
	ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 50), 0);
	ck_assert_int_ge(ms_now() - t0, 50);
	t0 = ms_now();
	ck_assert_int_eq(rdmax_wait_imm(c, 3, 60), RDMAX_E_TIMEOUT);
	ck_assert_int_ge(ms_now() - t0, 60);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 0), 0);
	ck_assert_int_eq(rdmax_wait_job(c, 5, 0), RDMAX_E_TIMEOUT);
	ck_assert_uint_eq(client_outstanding_jobs(c), 1);
	rdmax_client_close(c);
	fake_stop(&f);
	fake_cleanup(&f);
}
END_TEST

/*
 * Complete job 1 and fire an imm, then hang up with job 2 outstanding and
 * the client's second Submit unread (the kernel then reports ECONNRESET).
 */
static void serve_hangup(struct fake *f)
{
	if (fake_handshake(f) < 0) {
		return;
	}
	Rdmax__V1__ClientMsg *m = fake_loop(f, RDMAX__V1__CLIENT_MSG__BODY_SUBMIT);
	if (!m) {
		return;
	}
	fake_send_completion(f, 1, RDMAX__V1__STATUS__OK, 1, NULL);
	fake_send_imm(f, 8, 1);
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	/* Let the second Submit arrive, and stay unread. */
	struct pollfd pfd = {.fd = f->cfd, .events = POLLIN};
	poll(&pfd, 1, 2000);
	usleep(20 * 1000);
}

START_TEST(test_disconnect)
{
	struct fake f;
	struct rdmax_region *region, *r2 = NULL;
	struct rdmax_desc remote;
	struct rdmax_event ev[4];
	uint8_t buf[RDMAX_DESC_MAX];

	fake_init(&f);
	fake_start(&f, serve_hangup);
	struct rdmax_client *c = open_client(&f);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 4096, 0, &region), 0);
	ck_assert_int_eq(rdmax_desc_import(buf, make_desc(buf, 1, 1, 5, 0), &remote), 0);
	struct rdmax_job j = {
		.op = RDMAX_OP_WRITE, .local = region, .length = 1, .remote = &remote};
	struct rdmax_job batch[2] = {j, j};
	batch[0].id = 1;
	batch[1].id = 2;
	ck_assert_int_eq(rdmax_submit(c, batch, 2), 0);
	batch[0].id = 3;
	ck_assert_int_eq(rdmax_submit(c, batch, 1), 0);

	/* Job 2 never completes: the hang-up ends the wait. */
	ck_assert_int_eq(rdmax_wait_job(c, 2, 5000), RDMAX_E_DISCONNECTED);
	fake_stop(&f);
	fake_cleanup(&f);
	/* What arrived before the hang-up is still handed out, then the error. */
	ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 1000), 2);
	ck_assert_uint_eq(ev[0].job_id, 1);
	ck_assert_int_eq(ev[1].type, RDMAX_EVENT_IMM_REACHED);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 1000), RDMAX_E_DISCONNECTED);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 0), RDMAX_E_DISCONNECTED);
	/* Every later call, without SIGPIPE killing the process. */
	ck_assert_int_eq(rdmax_submit(c, batch, 1), RDMAX_E_DISCONNECTED);
	ck_assert_int_eq(rdmax_expect_imm(c, 1, 1), RDMAX_E_DISCONNECTED);
	ck_assert_int_eq(rdmax_wait_job(c, 2, -1), RDMAX_E_DISCONNECTED);
	ck_assert_int_eq(rdmax_wait_imm(c, 8, -1), RDMAX_E_DISCONNECTED);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 4096, 0, &r2), RDMAX_E_DISCONNECTED);
	ck_assert_ptr_null(r2);
	ck_assert_int_eq(rdmax_region_free(c, region), RDMAX_E_DISCONNECTED);
	rdmax_client_close(c);
}
END_TEST

static void serve_event_then_hangup(struct fake *f)
{
	if (fake_handshake(f) == 0) {
		fake_send_completion(f, 77, RDMAX__V1__STATUS__CANCELLED, 0, "daemon shutdown");
	}
}

/* The client's first send after the hang-up meets a closed peer (EPIPE). */
START_TEST(test_send_after_hangup)
{
	struct fake f;
	struct rdmax_region *region = NULL;
	struct rdmax_event ev[2];

	fake_init(&f);
	fake_start(&f, serve_event_then_hangup);
	struct rdmax_client *c = open_client(&f);
	fake_stop(&f);
	fake_cleanup(&f);
	ck_assert_int_eq(rdmax_expect_imm(c, 1, 1), RDMAX_E_DISCONNECTED);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 1, 0, &region), RDMAX_E_DISCONNECTED);
	ck_assert_ptr_null(region);
	/* The completion sent before the hang-up is not lost. */
	ck_assert_int_eq(rdmax_poll_events(c, ev, 2, 0), 1);
	ck_assert_uint_eq(ev[0].job_id, 77);
	ck_assert_int_eq(ev[0].status, RDMAX_E_CANCELLED);
	ck_assert_str_eq(ev[0].reason, "daemon shutdown");
	ck_assert_int_eq(rdmax_poll_events(c, ev, 2, 0), RDMAX_E_DISCONNECTED);
	rdmax_client_close(c);
}
END_TEST

static void serve_garbage(struct fake *f)
{
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
	if (fake_handshake(f) < 0) {
		return;
	}
	FAKE_CHECK(f, send(f->cfd, junk, sizeof(junk), MSG_NOSIGNAL) == sizeof(junk));
	fake_loop(f, -1);
}

static void serve_oversized(struct fake *f)
{
	size_t len = 100 * 1024;
	uint8_t *big = calloc(1, len);
	if (fake_handshake(f) < 0) {
		free(big);
		return;
	}
	FAKE_CHECK(f, send(f->cfd, big, len, MSG_NOSIGNAL) == (ssize_t)len);
	free(big);
	fake_loop(f, -1);
}

START_TEST(test_protocol_errors)
{
	void (*serves[])(struct fake *) = {serve_garbage, serve_oversized};
	struct rdmax_event ev[4];

	for (size_t i = 0; i < 2; i++) {
		struct fake f;
		fake_init(&f);
		f.max_message_bytes = 4096;
		fake_start(&f, serves[i]);
		struct rdmax_client *c = open_client(&f);
		ck_assert_int_eq(rdmax_poll_events(c, ev, 4, 2000), RDMAX_E_PROTOCOL_ERROR);
		ck_assert_int_eq(rdmax_expect_imm(c, 1, 1), RDMAX_E_PROTOCOL_ERROR);
		rdmax_client_close(c);
		fake_stop(&f);
		fake_cleanup(&f);
	}
}
END_TEST

#define FLOOD_SUBMITS 2000

/* Send events, then stop reading for a while so the client's sends block. */
static void serve_slow_reader(struct fake *f)
{
	if (fake_handshake(f) < 0) {
		return;
	}
	Rdmax__V1__ClientMsg *m = fake_loop(f, RDMAX__V1__CLIENT_MSG__BODY_SUBMIT);
	if (!m) {
		return;
	}
	f->n_submitted_jobs += m->submit->n_jobs;
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	for (uint64_t i = 0; i < 50; i++) {
		fake_send_completion(f, 5000 + i, RDMAX__V1__STATUS__OK, 0, NULL);
	}
	usleep(300 * 1000);
	fake_loop(f, -1);
}

START_TEST(test_send_blocks_then_flows)
{
	struct fake f;
	struct rdmax_region *region;
	struct rdmax_desc remote;
	struct rdmax_event ev[64];
	uint8_t buf[RDMAX_DESC_MAX];

	fake_init(&f);
	fake_start(&f, serve_slow_reader);
	struct rdmax_client *c = open_client(&f);
	ck_assert_int_eq(rdmax_region_alloc_host(c, 4096, 0, &region), 0);
	ck_assert_int_eq(rdmax_desc_import(buf, make_desc(buf, 1, 1, 5, 600), &remote), 0);
	struct rdmax_job j = {
		.op = RDMAX_OP_WRITE, .local = region, .length = 1, .remote = &remote};
	for (uint64_t i = 0; i < FLOOD_SUBMITS; i++) {
		j.id = i;
		ck_assert_int_eq(rdmax_submit(c, &j, 1), 0);
	}
	ck_assert_int_eq(rdmax_expect_imm(c, 1, 1), 0);
	ck_assert_int_eq(rdmax_poll_events(c, ev, 64, 0), 50);
	ck_assert_uint_eq(ev[49].job_id, 5049);
	ck_assert_uint_eq(client_outstanding_jobs(c), FLOOD_SUBMITS);
	rdmax_client_close(c);
	fake_stop(&f);
	fake_cleanup(&f);
	ck_assert_uint_eq(f.n_submitted_jobs, FLOOD_SUBMITS);
}
END_TEST

Suite *client_suite(void);

Suite *client_suite(void)
{
	Suite *s = suite_create("client");
	TCase *tc = tcase_create("local");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_strerror_every_code);
	tcase_add_test(tc, test_desc_import_good);
	tcase_add_test(tc, test_desc_import_garbage);
	tcase_add_test(tc, test_event_queue);
	tcase_add_test(tc, test_job_set);
	tcase_add_test(tc, test_copy_text);
	suite_add_tcase(s, tc);

	tc = tcase_create("fake_daemon");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_open_welcome);
	tcase_add_test(tc, test_open_env_and_paths);
	tcase_add_test(tc, test_open_refused);
	tcase_add_test(tc, test_alloc_host_queues_events);
	tcase_add_test(tc, test_register_fd);
	tcase_add_test(tc, test_submit_encoding_and_wait);
	tcase_add_test(tc, test_ring_wait_pauses_before_yielding);
	tcase_add_test(tc, test_ring_reads_what_the_daemon_counts);
	tcase_add_test(tc, test_submit_refused_locally);
	tcase_add_test(tc, test_submit_refused_by_daemon);
	tcase_add_test(tc, test_expect_and_wait_imm);
	tcase_add_test(tc, test_timeouts);
	tcase_add_test(tc, test_disconnect);
	tcase_add_test(tc, test_send_after_hangup);
	tcase_add_test(tc, test_protocol_errors);
	tcase_add_test(tc, test_send_blocks_then_flows);
	suite_add_tcase(s, tc);
	return s;
}
