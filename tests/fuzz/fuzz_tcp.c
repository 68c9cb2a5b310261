/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the TCP transport's frame handling (daemon/transport/tcp/), before
 * and after the handshake, through a real socket into a daemon in this
 * process. The first byte chooses the mode: bit 2 picks the daemon that
 * requires the shared key over the one without; bit 0 has the harness do
 * the handshake first (HELLO, and with the key the client's proof computed
 * from the daemon's HELLO), so the rest reaches the post-handshake states;
 * bit 1 rewrites the instance, region and key of each WRITE / READ_REQ
 * header that decodes to those of a 64 KiB region registered there, so
 * that accesses can succeed.
 * The remaining bytes go to the daemon as they are. Whatever arrives, the
 * daemon must answer or close that one connection, stay within the region,
 * and be left with no connection once the socket is closed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "fuzz.h"
#include "rdmax.h"
#include "transport.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REGION_BYTES (64u << 10)
#define STREAM_MAX   (1u << 20)

#define PEER_INSTANCE 0x4242

/* The two daemons (plain, keyed), a region on each, and the one this input talks to. */
static struct rdmaxd *g_ds[2];
static struct region *g_regions[2];
static struct rdmaxd *g_d;
static struct region *g_region;
static int g_owner;
static uint8_t g_stream[STREAM_MAX];
static uint8_t g_sink[65536];

static void setup(void)
{
	for (int k = 0; k < 2; k++) {
		g_ds[k] = fuzz_daemon_start(k == 1);
		/* The region's owner is no client session: it has no uid to ask for. */
		g_ds[k]->regions.owner_uid = NULL;
		int fd = memfd_create("fuzz-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd < 0 || ftruncate(fd, REGION_BYTES) < 0 ||
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0 ||
		    region_register_host_fd(&g_ds[k]->regions, &g_owner, fd, 0, REGION_BYTES,
					    RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE,
					    &g_regions[k]) < 0) {
			abort();
		}
		close(fd);
	}
}

static const uint8_t g_nonce[WIRE_NONCE_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};

static size_t put_frame(uint8_t *out, uint8_t type, const void *body, size_t len)
{
	struct wire_header h = {.type = type, .length = len};

	wire_header_encode(&h, out);
	memcpy(out + WIRE_HEADER_BYTES, body, len);
	return WIRE_HEADER_BYTES + len;
}

static size_t put_hello(uint8_t *out, bool keyed)
{
	struct wire_hello hello = {.version = WIRE_VERSION,
				   .instance_id = PEER_INSTANCE,
				   .flags = keyed ? WIRE_HELLO_F_AUTH | WIRE_HELLO_F_BOUND : 0};
	uint8_t body[WIRE_HELLO_BYTES];

	memcpy(hello.nonce, g_nonce, sizeof(g_nonce));
	memcpy(hello.node_name, "fuzzpeer", 9);
	wire_hello_encode(&hello, body, sizeof(body));
	return put_frame(out, WIRE_HELLO, body, sizeof(body));
}

/*
 * With the key: send our HELLO, wait for the daemon's, then send the client
 * proof over both nonces and instances. Returns false when the daemon did
 * not answer as the protocol says (a finding: it must answer a valid HELLO).
 */
static bool handshake_keyed(int fd)
{
	uint8_t buf[WIRE_HEADER_BYTES + WIRE_HELLO_BYTES + WIRE_MAC_BYTES * 2];
	size_t got = 0, len = put_hello(buf, true);
	struct wire_header h;
	struct wire_hello theirs;

	ssize_t n = -1;
	for (int tries = 0; tries < 1000 && n < 0; tries++) {
		n = send(fd, buf, len, MSG_NOSIGNAL);
		if (n < 0 && errno != EAGAIN && errno != ENOTCONN) {
			fprintf(stderr, "fuzz_tcp: send(HELLO): %s\n", strerror(errno));
			return false;
		}
		fuzz_daemon_turns(g_d, 1);
	}
	if (n != (ssize_t)len) {
		fprintf(stderr, "fuzz_tcp: sent %zd of %zu HELLO bytes\n", n, len);
		return false;
	}
	uint64_t deadline = fuzz_now_ms() + 5000;
	while (got < WIRE_HEADER_BYTES + WIRE_HELLO_BYTES && fuzz_now_ms() < deadline) {
		fuzz_daemon_turns(g_d, 1);
		n = recv(fd, buf + got, WIRE_HEADER_BYTES + WIRE_HELLO_BYTES - got, 0);
		if (n > 0) {
			got += (size_t)n;
		} else if (n == 0 || errno != EAGAIN) {
			fprintf(stderr, "fuzz_tcp: recv after %zu bytes: %s\n", got,
				n == 0 ? "closed" : strerror(errno));
			return false;
		}
	}
	if (got < WIRE_HEADER_BYTES + WIRE_HELLO_BYTES || wire_header_decode(buf, got, &h) < 0 ||
	    h.type != WIRE_HELLO ||
	    wire_hello_decode(buf + WIRE_HEADER_BYTES, h.length, &theirs) < 0 ||
	    !(theirs.flags & WIRE_HELLO_F_AUTH)) {
		fprintf(stderr, "fuzz_tcp: %zu bytes received, not a HELLO with the key flag\n",
			got);
		return false;
	}
	struct auth_transcript tr = {.client_instance = PEER_INSTANCE,
				     .server_instance = theirs.instance_id,
				     .bound = true};
	uint8_t mac[AUTH_MAC_BYTES];
	/* The proof binds both ends of this connection, as the daemon's does. */
	struct sockaddr_storage local, remote;
	socklen_t local_len = sizeof(local), remote_len = sizeof(remote);
	if (getsockname(fd, (struct sockaddr *)&local, &local_len) < 0 ||
	    getpeername(fd, (struct sockaddr *)&remote, &remote_len) < 0 ||
	    auth_endpoint((struct sockaddr *)&local, tr.client_addr, &tr.client_port) < 0 ||
	    auth_endpoint((struct sockaddr *)&remote, tr.server_addr, &tr.server_port) < 0) {
		fprintf(stderr, "fuzz_tcp: cannot name the connection's ends: %s\n",
			strerror(errno));
		return false;
	}
	memcpy(tr.client_nonce, g_nonce, sizeof(g_nonce));
	memcpy(tr.server_nonce, theirs.nonce, sizeof(tr.server_nonce));
	if (auth_compute((const uint8_t *)FUZZ_AUTH_KEY, strlen(FUZZ_AUTH_KEY), AUTH_ROLE_CLIENT,
			 &tr, mac) < 0) {
		abort();
	}
	len = put_frame(buf, WIRE_AUTH, mac, sizeof(mac));
	return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len;
}

/* Copy the frames, pointing decodable requests at the region. */
static size_t patch_frames(const uint8_t *in, size_t n, uint8_t *out, size_t len)
{
	while (n >= WIRE_HEADER_BYTES) {
		struct wire_header h;
		if (wire_header_decode(in, n, &h) < 0) {
			break;
		}
		if (h.type == WIRE_WRITE || h.type == WIRE_READ_REQ) {
			h.instance = g_d->instance_id;
			h.region_id = g_region->id;
			h.region_key = g_region->key;
		}
		wire_header_encode(&h, out + len);
		len += WIRE_HEADER_BYTES;
		in += WIRE_HEADER_BYTES;
		n -= WIRE_HEADER_BYTES;
		uint64_t body = wire_payload_bytes(&h);
		size_t take = body < n ? (size_t)body : n;
		memcpy(out + len, in, take);
		len += take;
		in += take;
		n -= take;
	}
	memcpy(out + len, in, n);
	return len + n;
}

static void count_one(void *arg, const struct transport_conn_info *info)
{
	(*(size_t *)arg)++;
}

static size_t count_conns(void)
{
	struct transport *t = g_d->transports[ENDPOINT_TCP];
	size_t n = 0;

	t->ops->list_conns(t, count_one, &n);
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

	if (!g_ds[0]) {
		setup();
	}
	if (size == 0 || size > STREAM_MAX / 2) {
		return -1;
	}
	uint8_t mode = data[0];
	bool keyed = mode & 4;
	g_d = g_ds[keyed];
	g_region = g_regions[keyed];
	size_t len = 0;
	if ((mode & 1) && !keyed) {
		len = put_hello(g_stream, false);
	}
	if (mode & 2) {
		len = patch_frames(data + 1, size - 1, g_stream, len);
	} else {
		memcpy(g_stream + len, data + 1, size - 1);
		len += size - 1;
	}

	sin.sin_port = htons(fuzz_daemon_tcp_port(g_d));
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 ||
	    (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 && errno != EINPROGRESS)) {
		abort();
	}
	fuzz_daemon_turns(g_d, 1);
	if ((mode & 1) && keyed && !handshake_keyed(fd)) {
		fprintf(stderr, "fuzz_tcp: the keyed daemon did not answer a valid HELLO\n");
		abort();
	}
	size_t sent = 0;
	int quiet = 0;
	bool eof = false;
	uint64_t deadline = fuzz_now_ms() + 5000;
	while (!eof && quiet < 20 && fuzz_now_ms() < deadline) {
		bool moved = false;
		if (sent < len) {
			ssize_t n = send(fd, g_stream + sent, len - sent, MSG_NOSIGNAL);
			if (n > 0) {
				sent += (size_t)n;
				moved = true;
			} else if (n < 0 && errno != EAGAIN && errno != ENOTCONN) {
				break; /* the daemon closed the connection */
			}
		}
		fuzz_daemon_turns(g_d, 1);
		for (;;) {
			ssize_t n = recv(fd, g_sink, sizeof(g_sink), 0);
			if (n > 0) {
				moved = true;
				continue;
			}
			eof = n == 0 || (errno != EAGAIN && errno != ENOTCONN);
			break;
		}
		quiet = moved || sent < len ? 0 : quiet + 1;
	}
	close(fd);
	/* The connection must go away with the socket. */
	deadline = fuzz_now_ms() + 5000;
	while (count_conns() > 0) {
		if (fuzz_now_ms() > deadline) {
			fprintf(stderr, "fuzz_tcp: the daemon kept the connection after close\n");
			abort();
		}
		fuzz_daemon_turns(g_d, 1);
	}
	if (!fuzz_daemon_settle(g_d, 5000)) {
		abort();
	}
	return 0;
}
