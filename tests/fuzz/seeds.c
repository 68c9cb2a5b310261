/* SPDX-License-Identifier: MIT */
/*
 * Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/):
 * a few well-formed inputs per target, built with the daemon's own encoders
 * so that they stay true to the formats. `make fuzz-seeds` runs it; the
 * output is committed, so a change of format shows in the diff.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "conn.h"
#include "desc.h"
#include "rdmax.h"
#include "rdmax.pb-c.h"
#include "rdmax_ring.h"
#include "wire.h"

static const char *g_root;

static void put(const char *target, const char *name, const void *data, size_t len)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", g_root, target);
	if (mkdir(path, 0755) < 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", g_root, target, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* ------------------------------------------------------------ descriptors */

static size_t tcp_desc(uint8_t *buf, uint64_t instance, uint16_t port)
{
	struct remote_desc d = {
		.instance_id = instance,
		.region_id = 1,
		.region_key = 0x5eed,
		.length = 65536,
		.access = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE,
		.node_name = "seed",
		.n_endpoints = 1,
	};
	d.endpoints[0].transport = ENDPOINT_TCP;
	strcpy(d.endpoints[0].addr, "127.0.0.1");
	d.endpoints[0].port = port;
	return (size_t)desc_encode(&d, buf, DESC_MAX_BYTES);
}

/* A mailbox address: the node's endpoint, a scoped name and a key, no region. */
static size_t mailbox_addr(uint8_t *buf, uint64_t instance, uint16_t port)
{
	struct remote_desc d = {
		.instance_id = instance,
		.region_key = 0x5eed,
		.node_name = "seed",
		.mailbox = "0:inbox",
		.n_endpoints = 1,
	};
	d.endpoints[0].transport = ENDPOINT_TCP;
	strcpy(d.endpoints[0].addr, "127.0.0.1");
	d.endpoints[0].port = port;
	return (size_t)desc_encode(&d, buf, DESC_MAX_BYTES);
}

static void desc_seeds(void)
{
	uint8_t buf[DESC_MAX_BYTES];
	struct remote_desc d = {
		.instance_id = 7,
		.region_id = 2,
		.region_key = 3,
		.length = 4096,
		.access = RDMAX_ACCESS_REMOTE_WRITE,
		.node_name = "node-b",
		.n_endpoints = 2,
	};

	put("desc", "tcp", buf, tcp_desc(buf, 42, 7471));
	put("desc", "mailbox-address", buf, mailbox_addr(buf, 42, 7471));
	d.endpoints[0].transport = ENDPOINT_VERBS;
	strcpy(d.endpoints[0].addr, "192.0.2.2");
	d.endpoints[0].port = 7471;
	strcpy(d.endpoints[0].device, "rxe0");
	d.endpoints[0].iova = 0x7f0000001000ull;
	d.endpoints[0].rkey = 0x1234;
	d.endpoints[1].transport = ENDPOINT_TCP;
	strcpy(d.endpoints[1].addr, "2001:db8::2");
	d.endpoints[1].port = 7472;
	put("desc", "verbs-and-tcp6", buf, (size_t)desc_encode(&d, buf, sizeof(buf)));
}

/* ----------------------------------------------------------------- client */

struct stream {
	uint8_t buf[16384];
	size_t len;
};

/* One datagram record of fuzz_client's input. */
static void add_msg(struct stream *s, uint8_t flags, Rdmax__V1__ClientMsg *m)
{
	size_t len = rdmax__v1__client_msg__get_packed_size(m);
	s->buf[s->len++] = flags;
	s->buf[s->len++] = (uint8_t)len;
	s->buf[s->len++] = (uint8_t)(len >> 8);
	rdmax__v1__client_msg__pack(m, s->buf + s->len);
	s->len += len;
}

static void add_register(struct stream *s, uint64_t seq)
{
	Rdmax__V1__ClientMsg m = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__RegisterRegion r = RDMAX__V1__REGISTER_REGION__INIT;
	r.kind = RDMAX__V1__REGION_KIND__REGION_HOST_FD;
	r.access = RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE;
	r.length = 65536;
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_REGISTER_REGION;
	m.register_region = &r;
	add_msg(s, 1 | 4, &m);
}

static void add_jobs(struct stream *s, uint64_t seq, Rdmax__V1__Job **jobs, size_t n)
{
	Rdmax__V1__ClientMsg m = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__Submit sub = RDMAX__V1__SUBMIT__INIT;
	sub.n_jobs = n;
	sub.jobs = jobs;
	m.has_seq = 1;
	m.seq = seq;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_SUBMIT;
	m.submit = &sub;
	add_msg(s, 4, &m);
}

static void client_seeds(void)
{
	uint8_t d_self[DESC_MAX_BYTES], d_far[DESC_MAX_BYTES], d_box[DESC_MAX_BYTES];
	/* The fuzzing daemon's instance (fuzz_daemon.c), and a port nobody listens on. */
	size_t n_self = tcp_desc(d_self, 0x0123456789abcdefull, 7471);
	size_t n_box = mailbox_addr(d_box, 0x0123456789abcdefull, 7471);
	size_t n_far = tcp_desc(d_far, 99, 1);
	struct stream s;

	/* Only the harness's Hello. */
	s.len = 0;
	s.buf[s.len++] = 1;
	put("client", "hello", s.buf, s.len);

	/* Hello, register, every job kind, cancel, status, deregister. */
	s.len = 0;
	s.buf[s.len++] = 1;
	add_register(&s, 2);
	Rdmax__V1__Job j[6];
	Rdmax__V1__Job *jp[6];
	Rdmax__V1__WriteJob w = RDMAX__V1__WRITE_JOB__INIT;
	Rdmax__V1__ReadJob r = RDMAX__V1__READ_JOB__INIT;
	Rdmax__V1__PagedWriteJob pw = RDMAX__V1__PAGED_WRITE_JOB__INIT;
	Rdmax__V1__PageList src = RDMAX__V1__PAGE_LIST__INIT, dst = RDMAX__V1__PAGE_LIST__INIT;
	Rdmax__V1__ScatterJob sc = RDMAX__V1__SCATTER_JOB__INIT;
	Rdmax__V1__ScatterDest sd = RDMAX__V1__SCATTER_DEST__INIT, *sdp = &sd;
	Rdmax__V1__BarrierJob b = RDMAX__V1__BARRIER_JOB__INIT;
	Rdmax__V1__SendJob se = RDMAX__V1__SEND_JOB__INIT;
	ProtobufCBinaryData bd_self = {n_self, d_self}, bd_far = {n_far, d_far};
	uint32_t idx[3] = {0, 2, 1};
	for (int i = 0; i < 6; i++) {
		Rdmax__V1__Job init = RDMAX__V1__JOB__INIT;
		j[i] = init;
		j[i].job_id = (uint64_t)i + 1;
		jp[i] = &j[i];
	}
	w.local_region = 1;
	w.length = 4096;
	w.remote_desc = bd_self;
	w.has_imm = 1;
	w.imm = 7;
	j[0].kind_case = RDMAX__V1__JOB__KIND_WRITE;
	j[0].write = &w;
	r.remote_desc = bd_far;
	r.length = 100;
	r.local_region = 1;
	j[1].kind_case = RDMAX__V1__JOB__KIND_READ;
	j[1].read = &r;
	j[1].has_deadline_ms = 1;
	j[1].deadline_ms = 50;
	pw.local_region = 1;
	pw.page_len = 1024;
	src.n_indices = dst.n_indices = 3;
	src.indices = dst.indices = idx;
	pw.src = &src;
	pw.dst = &dst;
	pw.remote_desc = bd_self;
	/* A second region pair with the same page lists (refused: it repeats the destination). */
	Rdmax__V1__PagedPair pair = RDMAX__V1__PAGED_PAIR__INIT, *pairp = &pair;
	pair.local_region = 1;
	pair.remote_desc = bd_self;
	pw.n_pairs = 1;
	pw.pairs = &pairp;
	j[2].kind_case = RDMAX__V1__JOB__KIND_PAGED_WRITE;
	j[2].paged_write = &pw;
	sd.has_remote_desc = 1;
	sd.remote_desc = bd_far;
	sd.length = 512;
	sc.local_region = 1;
	sc.n_dests = 1;
	sc.dests = &sdp;
	j[3].kind_case = RDMAX__V1__JOB__KIND_SCATTER;
	j[3].scatter = &sc;
	ProtobufCBinaryData descs[2] = {bd_self, bd_far};
	b.n_remote_descs = 2;
	b.remote_descs = descs;
	b.imm = 9;
	j[4].kind_case = RDMAX__V1__JOB__KIND_BARRIER;
	j[4].barrier = &b;
	se.remote_desc = (ProtobufCBinaryData){n_box, d_box};
	se.mailbox = "inbox";
	se.payload.len = 5;
	se.payload.data = (uint8_t *)"hello";
	j[5].kind_case = RDMAX__V1__JOB__KIND_SEND;
	j[5].send = &se;
	add_jobs(&s, 3, jp, 6);

	Rdmax__V1__ClientMsg m = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__Cancel c = RDMAX__V1__CANCEL__INIT;
	c.job_id = 2;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_CANCEL;
	m.cancel = &c;
	add_msg(&s, 0, &m);
	Rdmax__V1__JobStatusQuery q = RDMAX__V1__JOB_STATUS_QUERY__INIT;
	q.job_id = 1;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_JOB_STATUS;
	m.job_status = &q;
	add_msg(&s, 0, &m);
	Rdmax__V1__DeregisterRegion dr = RDMAX__V1__DEREGISTER_REGION__INIT;
	dr.region_id = 1;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_DEREGISTER_REGION;
	m.deregister_region = &dr;
	add_msg(&s, 4, &m);
	put("client", "jobs", s.buf, s.len);

	/* Imm, mailboxes, peer groups. */
	s.len = 0;
	s.buf[s.len++] = 1;
	Rdmax__V1__ExpectImm ei = RDMAX__V1__EXPECT_IMM__INIT;
	ei.imm = 7;
	ei.count = 2;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_EXPECT_IMM;
	m.expect_imm = &ei;
	add_msg(&s, 0, &m);
	/* A standing claim of the same value, then its release. */
	ei.has_standing = 1;
	ei.standing = 1;
	add_msg(&s, 0, &m);
	Rdmax__V1__ImmRelease ir = RDMAX__V1__IMM_RELEASE__INIT;
	ir.imm = 7;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_IMM_RELEASE;
	m.imm_release = &ir;
	add_msg(&s, 0, &m);
	Rdmax__V1__MailboxOpen mo = RDMAX__V1__MAILBOX_OPEN__INIT;
	mo.name = "inbox";
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_OPEN;
	m.mailbox_open = &mo;
	add_msg(&s, 0, &m);
	Rdmax__V1__PeerGroupCreate pg = RDMAX__V1__PEER_GROUP_CREATE__INIT;
	pg.n_remote_descs = 2;
	pg.remote_descs = descs;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_PEER_GROUP_CREATE;
	m.peer_group_create = &pg;
	add_msg(&s, 4, &m);
	Rdmax__V1__MailboxClose mc = RDMAX__V1__MAILBOX_CLOSE__INIT;
	mc.name = "inbox";
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_MAILBOX_CLOSE;
	m.mailbox_close = &mc;
	add_msg(&s, 0, &m);
	put("client", "imm-mailbox-group", s.buf, s.len);

	/* A ring over the attached memfd (64 KiB), then a doorbell. */
	s.len = 0;
	s.buf[s.len++] = 1;
	Rdmax__V1__RingSetup rs = RDMAX__V1__RING_SETUP__INIT;
	rs.sq_entries = 16;
	rs.sq_entry_bytes = 1024;
	rs.cq_entries = 16;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_SETUP;
	m.ring_setup = &rs;
	add_msg(&s, 1, &m);
	Rdmax__V1__RingDoorbell db = RDMAX__V1__RING_DOORBELL__INIT;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_RING_DOORBELL;
	m.ring_doorbell = &db;
	add_msg(&s, 0, &m);
	put("client", "ring", s.buf, s.len);

	/* No Hello: the first message must be refused. */
	s.len = 0;
	s.buf[s.len++] = 0;
	add_register(&s, 1);
	put("client", "no-hello", s.buf, s.len);
}

/* ------------------------------------------------------------- wire / tcp */

static size_t frame(uint8_t *out, uint8_t type, uint8_t flags, uint32_t status, uint64_t offset,
		    uint64_t length, const void *body, size_t body_len)
{
	struct wire_header h = {
		.type = type,
		.flags = flags,
		.status = status,
		.imm = flags ? 5 : 0,
		.request_id = 1,
		.offset = offset,
		.length = length,
	};
	wire_header_encode(&h, out);
	memcpy(out + WIRE_HEADER_BYTES, body, body_len);
	return WIRE_HEADER_BYTES + body_len;
}

static void wire_seeds(void)
{
	uint8_t buf[4096], hello[WIRE_HELLO_BYTES], payload[256];
	struct wire_hello wh = {.version = WIRE_VERSION, .instance_id = 5};
	size_t n;

	memset(payload, 0xab, sizeof(payload));
	strcpy(wh.node_name, "peer");
	wire_hello_encode(&wh, hello, sizeof(hello));
	put("wire", "hello", buf,
	    frame(buf, WIRE_HELLO, 0, 0, 0, sizeof(hello), hello, sizeof(hello)));
	put("wire", "ack", buf, frame(buf, WIRE_ACK, 0, 5, 0, 4, "nope", 4));
	put("wire", "message", buf, frame(buf, WIRE_MESSAGE, 0, 0, 5, 9, "inboxdata", 9));
	put("wire", "write-imm", buf,
	    frame(buf, WIRE_WRITE, WIRE_F_HAS_IMM, 0, 0, 16, payload, 16));

	/* fuzz_tcp: mode byte, then the stream. */
	buf[0] = 0; /* no harness HELLO: the peer's own, then an AUTH it never asked for */
	n = 1 + frame(buf + 1, WIRE_HELLO, 0, 0, 0, sizeof(hello), hello, sizeof(hello));
	n += frame(buf + n, WIRE_AUTH, 0, 0, 0, 32, payload, 32);
	put("tcp", "hello-auth", buf, n);
	buf[0] = 3; /* HELLO, then requests pointed at the region */
	n = 1 + frame(buf + 1, WIRE_WRITE, 0, 0, 100, 200, payload, 200);
	n += frame(buf + n, WIRE_WRITE, WIRE_F_HAS_IMM, 0, 0, 0, NULL, 0);
	n += frame(buf + n, WIRE_READ_REQ, 0, 0, 4000, 96, NULL, 0);
	n += frame(buf + n, WIRE_MESSAGE, 0, 0, 5, 9, "inboxdata", 9);
	put("tcp", "requests", buf, n);
	buf[0] = 3; /* a write past the end of the region */
	n = 1 + frame(buf + 1, WIRE_WRITE, 0, 0, 65500, 100, payload, 100);
	put("tcp", "write-past-end", buf, n);
	buf[0] = 7; /* the keyed daemon: handshake with the key, then requests */
	n = 1 + frame(buf + 1, WIRE_WRITE, WIRE_F_HAS_IMM, 0, 8, 64, payload, 64);
	n += frame(buf + n, WIRE_READ_REQ, 0, 0, 0, 128, NULL, 0);
	put("tcp", "keyed-requests", buf, n);
	buf[0] = 4; /* the keyed daemon: a HELLO without the key, then a made-up proof */
	wh.flags = WIRE_HELLO_F_AUTH;
	wire_hello_encode(&wh, hello, sizeof(hello));
	n = 1 + frame(buf + 1, WIRE_HELLO, 0, 0, 0, sizeof(hello), hello, sizeof(hello));
	n += frame(buf + n, WIRE_AUTH, 0, 0, 0, 32, payload, 32);
	put("tcp", "keyed-bad-proof", buf, n);
	buf[0] = 1; /* answers the responder never asked for */
	n = 1 + frame(buf + 1, WIRE_ACK, 0, 0, 0, 0, NULL, 0);
	n += frame(buf + n, WIRE_ERROR, 0, 13, 0, 4, "bye!", 4);
	put("tcp", "answers", buf, n);
}

/* ------------------------------------------------------------------- conn */

static void conn_seeds(void)
{
	static const uint8_t server[16] = {[10] = 0xff, [11] = 0xff, 192, 0, 2, 1};
	static const uint8_t peer[16] = {[10] = 0xff, [11] = 0xff, 192, 0, 2, 2};
	const char *key = "0123456789abcdef0123456789abcdef";
	uint8_t buf[8192], pd[256];

	/* Accepting: requests without and with a proof (mode 4 = keyed). */
	buf[0] = 0;
	conn_pd_connect(buf + 1, 0, 2, 77, 0x1111222233334444ull, 0, NULL, 0, server, 7471, 0, 0);
	put("conn", "connect", buf, 1 + CONN_PD_REQ_LEN);
	buf[0] = 4;
	conn_pd_connect(buf + 1, 1, 2, 77, 0x1111222233334444ull, 0, (const uint8_t *)key,
			strlen(key), server, 7471, 0, 0);
	put("conn", "connect-keyed", buf, 1 + CONN_PD_REQ_LEN);
	/* A request for a protection domain (per-uid isolation), with its proof. */
	buf[0] = 4;
	conn_pd_connect(buf + 1, 0, 1, 78, 0x1111222233334444ull, 0, (const uint8_t *)key,
			strlen(key), server, 7471, 5, 0x0123456789abcdefull);
	put("conn", "connect-domain", buf, 1 + CONN_PD_REQ_LEN);
	struct conn_query q = {
		.access = RDMAX_ACCESS_REMOTE_WRITE, .region_id = 1, .region_key = 2, .length = 8};
	buf[0] = 0;
	conn_pd_query(buf + 1, &q, NULL, 0, server, 7471);
	put("conn", "query", buf, 1 + CONN_PD_REQ_LEN);

	/* Connecting: the peer accepts (instance only) or rejects, link by link. */
	static const struct conn_ops no_ops;
	struct conn_table t;
	struct conn_policy p = {.links = 1,
				.sq_depth = 16,
				.signal_interval = 4,
				.batch = 4,
				.max_wr_bytes = 1 << 20,
				.max_connections = 8};
	uint8_t req[CONN_PD_REQ_LEN];
	conn_table_init(&t, &p, &no_ops, NULL, 0x1111222233334444ull, NULL, 0);
	conn_pd_connect(req, 0, 1, 1, 0xaaaabbbbccccddddull, 0, NULL, 0, peer, 7471, 0, 0);
	int len = conn_pd_accept(pd, sizeof(pd), &t, req, peer, 7471);
	conn_table_fini(&t);
	size_t n = 0;
	buf[n++] = 1;
	buf[n++] = 0; /* one link */
	buf[n++] = 0; /* established */
	buf[n++] = 0; /* status */
	buf[n++] = (uint8_t)len;
	memcpy(buf + n, pd, (size_t)len);
	put("conn", "accepted", buf, n + (size_t)len);
	len = conn_pd_reject(pd, sizeof(pd), CONN_REJ_AUTH_REQUIRED);
	n = 0;
	buf[n++] = 1;
	buf[n++] = 0;
	buf[n++] = 1; /* rejected */
	buf[n++] = 28;
	buf[n++] = (uint8_t)len;
	memcpy(buf + n, pd, (size_t)len);
	put("conn", "rejected", buf, n + (size_t)len);

	/* Messages: a two-frame SEND, then an answer. */
	static uint8_t staging[CONN_MSG_STAGING];
	static uint8_t payload[5000];
	memset(payload, 'p', sizeof(payload));
	int body = conn_msg_encode(staging, sizeof(staging), 9, "inbox", 0, "node-a", payload,
				   sizeof(payload));
	n = 0;
	buf[n++] = 2;
	for (uint32_t i = 0; i < conn_msg_frames((uint64_t)body); i++) {
		uint32_t fl = conn_msg_frame_len((uint64_t)body, i);
		buf[n++] = (uint8_t)fl;
		buf[n++] = (uint8_t)(fl >> 8);
		memcpy(buf + n, staging + (size_t)i * CONN_FRAME_MAX, fl);
		n += fl;
	}
	len = conn_answer_encode(pd, sizeof(pd), 9, RDMAX_E_NOT_FOUND, "no mailbox");
	buf[n++] = (uint8_t)len;
	buf[n++] = 0;
	memcpy(buf + n, pd, (size_t)len);
	put("conn", "message", buf, n + (size_t)len);
}

/* ------------------------------------------------------------------- ring */

static void ring_seeds(void)
{
	uint8_t buf[2048], msg[256];
	size_t n = 0;
	Rdmax__V1__ClientMsg m = RDMAX__V1__CLIENT_MSG__INIT;
	Rdmax__V1__Cancel c = RDMAX__V1__CANCEL__INIT;

	c.job_id = 3;
	m.body_case = RDMAX__V1__CLIENT_MSG__BODY_CANCEL;
	m.cancel = &c;
	size_t len = rdmax__v1__client_msg__pack(&m, msg);
	buf[n++] = 0; /* small valid geometry */
	buf[n++] = 2; /* 8 submission entries */
	buf[n++] = 0; /* of 128 bytes */
	buf[n++] = 2; /* 8 completion entries */
	buf[n++] = 0; /* file exactly as large as needed */
	/* STEP_WRITE the entry header {len, 0, after 0} and body into slot 0. */
	struct rdmax_ring_sqe sqe = {.len = (uint32_t)len};
	uint32_t off = RDMAX_RING_CTL_BYTES;
	buf[n++] = 0;
	memcpy(buf + n, &off, 4);
	n += 4;
	buf[n++] = (uint8_t)(sizeof(sqe) + len);
	memcpy(buf + n, &sqe, sizeof(sqe));
	n += sizeof(sqe);
	memcpy(buf + n, msg, len);
	n += len;
	buf[n++] = 1; /* STEP_TAIL + 1 */
	buf[n++] = 1;
	buf[n++] = 2; /* STEP_TAKE */
	buf[n++] = 0;
	buf[n++] = 3; /* STEP_POST */
	buf[n++] = 4;
	memcpy(buf + n, "done", 4);
	n += 4;
	memset(buf + n, 1, 9);
	n += 9;
	buf[n++] = 4; /* STEP_CQ_HEAD */
	buf[n++] = 0;
	buf[n++] = 5; /* wake request, sleep, wake */
	buf[n++] = 6;
	buf[n++] = 7;
	put("ring", "cancel-entry", buf, n);
}

/* ----------------------------------------------------------------- config */

static void config_seeds(void)
{
	const char *full =
		"[daemon]\nsocket = /run/rdmaxd.sock\nnode_name = node-a\n"
		"log_level = info\n\n[transport]\ntype = tcp\nlisten = 0.0.0.0\n"
		"port = 7471\n\n[limits]\nmax_clients = 64\nmax_message_bytes = 1M\n\n"
		"[peers]\nconnect_timeout_ms = 2000\n\n[verbs]\ndevices = mlx5_0,mlx5_1\n"
		"pin = infer*:mlx5_0;*:mlx5_1\n\n[gpu]\nregistration = auto\n"
		"pool_bytes = 1G\n";
	const char *override = "-engine.chunk_bytes=256K\n[engine]\nbusy_poll_us = 10\n";
	const char *bad = "[limits]\nmax_clients = lots\n";

	put("config", "full", full, strlen(full));
	put("config", "override", override, strlen(override));
	put("config", "bad-value", bad, strlen(bad));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	g_root = argv[1];
	mkdir(g_root, 0755);
	desc_seeds();
	client_seeds();
	wire_seeds();
	conn_seeds();
	ring_seeds();
	config_seeds();
	return 0;
}
