/* SPDX-License-Identifier: MIT */
/*
 * Named regions without any store (docs/discovery.md): a client publishes a
 * region under a name on its daemon, a client of another node finds it by
 * (ADDR:PORT, name) and moves bytes with the descriptor it got back, with no
 * descriptor passed out of band. Names go with unpublish, deregistration and
 * client exit; bad and oversized names, missing names, unknown and
 * unreachable nodes and a restarted daemon each get their named error. Runs
 * over the transport under test (TCP here, verbs in the guest).
 */
#include <stdio.h>
#include <string.h>

#include "harness.h"

/* ADDR:PORT of a daemon's listener, as rdmax_lookup() takes it. */
static void node_of(const struct itest_daemon *d, char *buf, size_t size)
{
	snprintf(buf, size, strchr(d->addr, ':') ? "[%s]:%u" : "%s:%u", d->addr, d->port);
}

static struct itest_daemon *start_on_port(const char *name, const char *addr)
{
	struct itest_daemon *d = itest_daemon_new(name, addr);
	itest_daemon_port(d, itest_free_port(addr));
	itest_daemon_start(d);
	return d;
}

START_TEST(names_publish_lookup_transfer)
{
	const uint64_t len = 256 * KiB;
	struct itest_daemon *a = start_on_port("alpha", itest_addr_a());
	struct itest_daemon *b = start_on_port("beta", itest_addr_b());
	struct rdmax_client *ca = itest_client(a, "reader");
	struct rdmax_client *cb = itest_client(b, "owner");
	struct rdmax_region *la = itest_alloc(ca, len, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *rb =
		itest_alloc(cb, len, RDMAX_ACCESS_REMOTE_READ | RDMAX_ACCESS_REMOTE_WRITE);
	struct rdmax_desc found, direct = itest_desc(rb);
	char node_b[96];

	node_of(b, node_b, sizeof(node_b));
	itest_fill(itest_bytes(rb), len, itest_seed());
	ck_assert_int_eq(rdmax_region_publish(cb, rb, "kv/layer-0.cache"), 0);

	/* a finds b's region by name and reads it; the bytes are b's. */
	ck_assert_int_eq(rdmax_lookup(ca, node_b, "kv/layer-0.cache", 0, &found), 0);
	ck_assert_uint_eq(found.len, direct.len);
	ck_assert_mem_eq(found.bytes, direct.bytes, direct.len);
	struct rdmax_job job = itest_job(1, RDMAX_OP_READ, la, 0, &found, 0, len);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(la), itest_bytes(rb), len, "read through a looked-up desc");
	/* And writes into it. */
	itest_fill(itest_bytes(la), len, itest_seed() + 1);
	job = itest_job(2, RDMAX_OP_WRITE, la, 0, &found, 0, len);
	ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(rb), itest_bytes(la), len,
			    "write through a looked-up desc");

	/* The owner's own node answers from its table, by node name. */
	ck_assert_int_eq(rdmax_lookup(cb, "beta", "kv/layer-0.cache", 0, &found), 0);
	ck_assert_mem_eq(found.bytes, direct.bytes, direct.len);

	/* Missing name, remote and local: NOT_FOUND. */
	itest_assert_err(rdmax_lookup(ca, node_b, "kv/layer-1.cache", 0, &found),
			 RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_lookup(cb, "beta", "kv/layer-1.cache", 0, &found),
			 RDMAX_E_NOT_FOUND);

	itest_pair_end(ca, cb, a, b);
}
END_TEST

START_TEST(names_bad_names_and_limits)
{
	struct itest_daemon *a = start_on_port("alpha", itest_addr_a());
	struct itest_daemon *b = start_on_port("beta", itest_addr_b());
	struct rdmax_client *ca = itest_client(a, "asker");
	struct rdmax_client *cb = itest_client(b, "owner");
	struct rdmax_client *cb2 = itest_client(b, "other");
	struct rdmax_region *rb = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_desc found;
	char node_b[96], longest[RDMAX_REGION_NAME_MAX + 1], oversized[RDMAX_REGION_NAME_MAX + 2];

	node_of(b, node_b, sizeof(node_b));
	memset(longest, 'n', RDMAX_REGION_NAME_MAX);
	longest[RDMAX_REGION_NAME_MAX] = '\0';
	memset(oversized, 'n', RDMAX_REGION_NAME_MAX + 1);
	oversized[RDMAX_REGION_NAME_MAX + 1] = '\0';

	/* Names: characters and length, at publication and at lookup. */
	const char *const bad[] = {"",           "with space",  "tab\there", "quote'",
				   "semi;colon", "uni\xc3\xa9", oversized};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		itest_assert_err(rdmax_region_publish(cb, rb, bad[i]), RDMAX_E_INVALID_ARGUMENT);
		itest_assert_err(rdmax_lookup(ca, node_b, bad[i], 0, &found),
				 RDMAX_E_INVALID_ARGUMENT);
	}
	ck_assert_int_eq(rdmax_region_publish(cb, rb, longest), 0);
	ck_assert_int_eq(rdmax_lookup(ca, node_b, longest, 0, &found), 0);

	/* Unique per node, whoever asks; a name needs a region of the caller. */
	itest_assert_err(rdmax_region_publish(cb2, rb, longest), RDMAX_E_NOT_FOUND);
	struct rdmax_region *rb2 = itest_alloc(cb2, 4096, RDMAX_ACCESS_REMOTE_READ);
	itest_assert_err(rdmax_region_publish(cb2, rb2, longest), RDMAX_E_ALREADY_EXISTS);

	/* Nodes: unknown names, malformed addresses, and a port nobody listens on. */
	itest_assert_err(rdmax_lookup(ca, "gamma", "x", 0, &found), RDMAX_E_UNREACHABLE);
	itest_assert_err(rdmax_lookup(ca, "300.1.1.1:5", "x", 0, &found), RDMAX_E_UNREACHABLE);
	itest_assert_err(rdmax_lookup(ca, "", "x", 0, &found), RDMAX_E_INVALID_ARGUMENT);
	char nobody[96];
	snprintf(nobody, sizeof(nobody), "%s:%u", itest_addr_b(), itest_free_port(itest_addr_b()));
	int r = rdmax_lookup(ca, nobody, "x", 3000, &found);
	ck_assert_msg(r == RDMAX_E_UNREACHABLE || r == RDMAX_E_TIMEOUT,
		      "lookup at a closed port: %s", rdmax_err_name(r));

	/* 256 names per client: the next is refused, other clients are not affected. */
	char name[32];
	for (int i = 1; i < 256; i++) {
		snprintf(name, sizeof(name), "slot.%d", i);
		ck_assert_int_eq(rdmax_region_publish(cb, rb, name), 0);
	}
	itest_assert_err(rdmax_region_publish(cb, rb, "slot.256"), RDMAX_E_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(rdmax_region_publish(cb2, rb2, "slot.256"), 0);
	ck_assert_int_eq(rdmax_lookup(ca, node_b, "slot.255", 0, &found), 0);

	rdmax_client_close(ca);
	itest_pair_end(cb, cb2, a, b);
}
END_TEST

START_TEST(names_withdrawn_and_restart)
{
	struct itest_daemon *a = start_on_port("alpha", itest_addr_a());
	struct itest_daemon *b = start_on_port("beta", itest_addr_b());
	struct rdmax_client *ca = itest_client(a, "asker");
	struct rdmax_client *cb = itest_client(b, "owner");
	struct rdmax_client *cb2 = itest_client(b, "leaver");
	struct rdmax_region *la = itest_alloc(ca, 4096, RDMAX_ACCESS_LOCAL);
	struct rdmax_region *r1 = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *r2 = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_region *r3 = itest_alloc(cb2, 4096, RDMAX_ACCESS_REMOTE_READ);
	struct rdmax_desc found;
	char node_b[96];

	node_of(b, node_b, sizeof(node_b));
	ck_assert_int_eq(rdmax_region_publish(cb, r1, "unpublished"), 0);
	ck_assert_int_eq(rdmax_region_publish(cb, r2, "deregistered"), 0);
	ck_assert_int_eq(rdmax_region_publish(cb, r2, "deregistered.too"), 0);
	ck_assert_int_eq(rdmax_region_publish(cb2, r3, "left"), 0);
	ck_assert_int_eq(rdmax_lookup(ca, node_b, "unpublished", 0, &found), 0);
	ck_assert_int_eq(rdmax_lookup(ca, node_b, "deregistered.too", 0, &found), 0);
	ck_assert_int_eq(rdmax_lookup(ca, node_b, "left", 0, &found), 0);

	/* Unpublish: gone, and only its owner may withdraw it. */
	itest_assert_err(rdmax_region_unpublish(cb2, "unpublished"), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(rdmax_region_unpublish(cb, "unpublished"), 0);
	itest_assert_err(rdmax_region_unpublish(cb, "unpublished"), RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_lookup(ca, node_b, "unpublished", 0, &found), RDMAX_E_NOT_FOUND);
	/* Deregistration withdraws every name of the region. */
	ck_assert_int_eq(rdmax_region_free(cb, r2), 0);
	itest_assert_err(rdmax_lookup(ca, node_b, "deregistered", 0, &found), RDMAX_E_NOT_FOUND);
	itest_assert_err(rdmax_lookup(ca, node_b, "deregistered.too", 0, &found),
			 RDMAX_E_NOT_FOUND);
	/* The client's exit withdraws its names; the name is free again. */
	rdmax_client_close(cb2);
	itest_wait_status(b, "clients", 1); /* b has seen the exit: only "owner" is left */
	itest_assert_err(rdmax_lookup(ca, node_b, "left", 0, &found), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(rdmax_region_publish(cb, r1, "left"), 0);

	/* A descriptor found before b restarted is refused after; a new lookup works. */
	ck_assert_int_eq(rdmax_lookup(ca, node_b, "left", 0, &found), 0);
	struct rdmax_desc old = found;
	rdmax_client_close(cb);
	itest_daemon_stop(b);
	int r = rdmax_lookup(ca, node_b, "left", 3000, &found);
	ck_assert_msg(r == RDMAX_E_UNREACHABLE || r == RDMAX_E_TIMEOUT ||
			      r == RDMAX_E_TRANSPORT_ERROR,
		      "lookup on a stopped daemon: %s", rdmax_err_name(r));
	itest_daemon_start(b);
	cb = itest_client(b, "owner.again");
	struct rdmax_region *r4 = itest_alloc(cb, 4096, RDMAX_ACCESS_REMOTE_READ);
	memset(itest_bytes(r4), 0x5a, 4096);
	itest_assert_err(rdmax_lookup(ca, node_b, "left", 0, &found), RDMAX_E_NOT_FOUND);
	ck_assert_int_eq(rdmax_region_publish(cb, r4, "left"), 0);
	struct rdmax_job job = itest_job(1, RDMAX_OP_READ, la, 0, &old, 0, 4096);
	itest_expect_job_error(ca, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	ck_assert_int_eq(rdmax_lookup(ca, node_b, "left", 0, &found), 0);
	ck_assert_msg(found.len != old.len || memcmp(found.bytes, old.bytes, old.len) != 0,
		      "the restarted daemon handed out the old descriptor");
	job = itest_job(2, RDMAX_OP_READ, la, 0, &found, 0, 4096);
	struct rdmax_event ev = itest_run_job(ca, &job, ITEST_WAIT_MS);
	itest_assert_err(ev.status, 0);
	itest_assert_mem_eq(itest_bytes(la), itest_bytes(r4), 4096, "after the restart");

	itest_pair_end(ca, cb, a, b);
}
END_TEST

TCase *itest_tcase_names(void)
{
	TCase *tc = tcase_create("names");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, names_publish_lookup_transfer);
	tcase_add_test(tc, names_bad_names_and_limits);
	tcase_add_test(tc, names_withdrawn_and_restart);
	return tc;
}
