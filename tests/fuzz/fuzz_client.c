/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the client message path (daemon/session/ipc*.c and what they
 * calls: decoding, validation, dispatch into the real engine, region table,
 * imm table, mailboxes, rings and the TCP transport on loopback) through a
 * real client socket of a daemon in this process.
 *
 * Input: one byte of options (bit 0: the harness sends a well-formed Hello
 * first), then datagrams, each [flags u8][length u16 LE][bytes]; flags bit 0
 * attaches a sealed 64 KiB memfd (as RegisterRegion and RingSetup want),
 * bit 1 an unsealed one. Flags bit 2 has the harness rewrite a datagram that
 * decodes as a ClientMsg before sending it: region ids 1..n become the ids of
 * the regions this session registered (ids are never reused, so an input
 * cannot know them) and descriptors of the fuzzing daemon's instance become
 * the real descriptor of such a region, so that jobs move bytes. The
 * daemon's answers are read and dropped. After the last datagram the client
 * closes; the daemon must then settle (no session, no job) within a bounded
 * time, leak no memory (ASan) and keep no fd the input brought.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "desc.h"
#include "fuzz.h"
#include "../unit/pass_fds.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SETTLE_MS 10000
/* Open fds may vary by this much between inputs (peer connections coming and going). */
#define FD_SLACK 32

#define REGS_MAX 4

static struct rdmaxd *g_d;
static uint8_t g_sink[1 << 17];

/* The regions this input's session registered, from the daemon's replies. */
static struct {
	uint64_t id;
	uint8_t desc[DESC_MAX_BYTES];
	size_t desc_len;
} g_regs[REGS_MAX];
static size_t g_n_regs;

static void drain(int fd)
{
	ssize_t n;

	while ((n = recv(fd, g_sink, sizeof(g_sink), MSG_DONTWAIT)) > 0) {
		Rdmax__V1__DaemonMsg *m = rdmax__v1__daemon_msg__unpack(NULL, (size_t)n, g_sink);
		if (!m) {
			abort(); /* the daemon sent something its own protocol cannot decode */
		}
		if (getenv("RDMAXD_FUZZ_LOG")) {
			fprintf(stderr, "fuzz_client: reply seq %" PRIu64 " body %d", m->seq,
				(int)m->body_case);
			for (size_t i = 0;
			     m->body_case == RDMAX__V1__DAEMON_MSG__BODY_COMPLETIONS &&
			     i < m->completions->n_completions;
			     i++) {
				const Rdmax__V1__Completion *c = m->completions->completions[i];
				fprintf(stderr, " [job %" PRIu64 " status %d bytes %" PRIu64 " %s]",
					c->job_id, (int)c->status, c->bytes,
					c->message ? c->message : "");
			}
			if (m->body_case == RDMAX__V1__DAEMON_MSG__BODY_ERROR) {
				fprintf(stderr, " [status %d %s]", (int)m->error->status,
					m->error->message ? m->error->message : "");
			}
			fputc('\n', stderr);
		}
		if (m->body_case == RDMAX__V1__DAEMON_MSG__BODY_REGION && g_n_regs < REGS_MAX &&
		    m->region->desc.len <= DESC_MAX_BYTES) {
			g_regs[g_n_regs].id = m->region->region_id;
			memcpy(g_regs[g_n_regs].desc, m->region->desc.data, m->region->desc.len);
			g_regs[g_n_regs].desc_len = m->region->desc.len;
			g_n_regs++;
		}
		rdmax__v1__daemon_msg__free_unpacked(m, NULL);
	}
}

/* ------------------------------------------------------------ rewriting */

/* Bytes fields pointed at the harness's buffers, restored before freeing. */
static struct {
	ProtobufCBinaryData *field;
	ProtobufCBinaryData orig;
} g_swapped[64];
static size_t g_n_swapped;

static void map_region(uint64_t *id)
{
	if (g_n_regs && *id >= 1 && *id <= REGS_MAX) {
		*id = g_regs[(*id - 1) % g_n_regs].id;
	}
}

static void map_desc(ProtobufCBinaryData *field)
{
	struct remote_desc d;

	if (!g_n_regs || g_n_swapped == sizeof(g_swapped) / sizeof(g_swapped[0]) ||
	    desc_decode(field->data, field->len, &d) < 0 || d.instance_id != g_d->instance_id ||
	    d.region_id < 1 || d.region_id > REGS_MAX) {
		return;
	}
	size_t k = (d.region_id - 1) % g_n_regs;
	g_swapped[g_n_swapped].field = field;
	g_swapped[g_n_swapped].orig = *field;
	g_n_swapped++;
	field->data = g_regs[k].desc;
	field->len = g_regs[k].desc_len;
}

static void map_job(Rdmax__V1__Job *j)
{
	switch (j->kind_case) {
	case RDMAX__V1__JOB__KIND_WRITE:
		map_region(&j->write->local_region);
		map_desc(&j->write->remote_desc);
		break;
	case RDMAX__V1__JOB__KIND_READ:
		map_region(&j->read->local_region);
		map_desc(&j->read->remote_desc);
		break;
	case RDMAX__V1__JOB__KIND_PAGED_WRITE:
		map_region(&j->paged_write->local_region);
		map_desc(&j->paged_write->remote_desc);
		for (size_t i = 0; i < j->paged_write->n_pairs; i++) {
			map_region(&j->paged_write->pairs[i]->local_region);
			map_desc(&j->paged_write->pairs[i]->remote_desc);
		}
		break;
	case RDMAX__V1__JOB__KIND_PAGED_READ:
		map_region(&j->paged_read->local_region);
		map_desc(&j->paged_read->remote_desc);
		for (size_t i = 0; i < j->paged_read->n_pairs; i++) {
			map_region(&j->paged_read->pairs[i]->local_region);
			map_desc(&j->paged_read->pairs[i]->remote_desc);
		}
		break;
	case RDMAX__V1__JOB__KIND_SCATTER:
		map_region(&j->scatter->local_region);
		for (size_t i = 0; i < j->scatter->n_dests; i++) {
			map_desc(&j->scatter->dests[i]->remote_desc);
		}
		break;
	case RDMAX__V1__JOB__KIND_BARRIER:
		for (size_t i = 0; i < j->barrier->n_remote_descs; i++) {
			map_desc(&j->barrier->remote_descs[i]);
		}
		break;
	case RDMAX__V1__JOB__KIND_SEND:
		map_desc(&j->send->remote_desc);
		break;
	default:
		break;
	}
}

/* Rewrite into out (size bytes); returns the new length, or 0 to send the bytes as they are. */
static size_t rewrite(const uint8_t *in, size_t len, uint8_t *out, size_t size)
{
	Rdmax__V1__ClientMsg *m = rdmax__v1__client_msg__unpack(NULL, len, in);
	size_t n = 0;

	if (!m) {
		return 0;
	}
	g_n_swapped = 0;
	switch (m->body_case) {
	case RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION:
		map_region(&m->deregister_region->region_id);
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_SUBMIT:
		for (size_t i = 0; i < m->submit->n_jobs; i++) {
			map_job(m->submit->jobs[i]);
		}
		break;
	case RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE:
		for (size_t i = 0; i < m->peer_group_create->n_remote_descs; i++) {
			map_desc(&m->peer_group_create->remote_descs[i]);
		}
		break;
	default:
		break;
	}
	if (rdmax__v1__client_msg__get_packed_size(m) <= size) {
		n = rdmax__v1__client_msg__pack(m, out);
	}
	while (g_n_swapped) {
		g_n_swapped--;
		*g_swapped[g_n_swapped].field = g_swapped[g_n_swapped].orig;
	}
	rdmax__v1__client_msg__free_unpacked(m, NULL);
	return n;
}

static int memfd(bool sealed)
{
	int fd = memfd_create("fuzz-client", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, 64 << 10) < 0) {
		abort();
	}
	if (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		abort();
	}
	return fd;
}

/* Send one datagram, running the daemon's loop while the socket is full. */
static bool send_datagram(int fd, const uint8_t *buf, size_t len, int attach)
{
	union test_fd_control control;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	int mfd = -1;

	if (attach) {
		mfd = memfd(attach == 1);
		test_attach_fd(&mh, &control, mfd);
	}
	bool ok = false;
	for (int tries = 0; tries < 1000; tries++) {
		ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n >= 0) {
			ok = true;
			break;
		}
		if (errno != EAGAIN) {
			break; /* the daemon closed the session */
		}
		fuzz_daemon_turns(g_d, 1);
		drain(fd);
	}
	if (mfd >= 0) {
		close(mfd);
	}
	return ok;
}

static void send_hello(int fd)
{
	Rdmax__V1__ClientMsg m = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__Hello h = RDMAX__V1__HELLO__INIT;
	uint8_t buf[128];

	h.protocol_version = RDMAX_PROTOCOL_VERSION;
	h.client_name = "fuzz";
	m.has_seq = 1;
	m.seq = 1;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	size_t len = rdmax__v1__client_msg__pack(&m, buf);
	send_datagram(fd, buf, len, 0);
}

/* Open fds of this process: the daemon's and the harness's. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d))) {
		n += e->d_name[0] != '.';
	}
	if (d) {
		closedir(d);
	}
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int base_fds = -1;
	struct fuzz_in in = {data, size};
	struct sockaddr_un sun = {.sun_family = AF_UNIX};

	if (!g_d) {
		g_d = fuzz_daemon_start(false);
	}
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", g_d->cfg.socket_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		abort();
	}
	fuzz_daemon_turns(g_d, 1);
	if (fuzz_u8(&in) & 1) {
		send_hello(fd);
	}
	g_n_regs = 0;
	while (in.n) {
		static uint8_t again[1 << 17];
		uint8_t flags = fuzz_u8(&in);
		const uint8_t *bytes;
		size_t len = fuzz_bytes(&in, fuzz_u16(&in), &bytes);
		size_t n = (flags & 4) ? rewrite(bytes, len, again, sizeof(again)) : 0;
		if (n) {
			bytes = again;
			len = n;
		}
		if (!send_datagram(fd, bytes, len, flags & 1 ? 1 : (flags & 2 ? 2 : 0))) {
			break;
		}
		fuzz_daemon_turns(g_d, 2);
		drain(fd);
	}
	/* Let jobs run a little, as a client would before it leaves. */
	fuzz_daemon_turns(g_d, 4);
	drain(fd);
	close(fd);
	if (!fuzz_daemon_settle(g_d, SETTLE_MS)) {
		fprintf(stderr,
			"fuzz_client: the daemon did not settle within %d ms of the "
			"client closing\n",
			SETTLE_MS);
		abort();
	}
	/* Every fd an input brought (sockets, memfds) must be gone with its session. */
	int fds = count_fds();
	if (base_fds < 0) {
		base_fds = fds;
	} else if (fds > base_fds + FD_SLACK) {
		fprintf(stderr, "fuzz_client: %d fds open, %d after the first input\n", fds,
			base_fds);
		abort();
	}
	return 0;
}
