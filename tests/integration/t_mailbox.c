/* SPDX-License-Identifier: MIT */
/*
 * Case "mailbox": mailboxes are scoped so one application cannot claim, fire
 * or exhaust another's. Names live in the namespace of the opener's uid (two
 * uids' "kv" coexist), a SEND reaches a mailbox only through its address
 * (a wrong key or another uid's name is NOT_FOUND and nothing is delivered),
 * and each uid has its share of open mailboxes and of unread message bytes.
 * The other-uid parts fork a child that becomes uid 65534, so they need root;
 * without it they print why they did not run.
 */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdmax.pb-c.h"

#define OTHER_UID 65534

/* addr with its key xor-ed with key_xor and, when scoped is not NULL, another scoped name. */
static int forge(const struct rdmax_desc *addr, uint64_t key_xor, const char *scoped,
		 struct rdmax_desc *ret)
{
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, addr->len, addr->bytes);

	if (!m || !m->mailbox) {
		if (m) {
			rdmax__v1__region_desc__free_unpacked(m, NULL);
		}
		return -1;
	}
	char *own = m->mailbox;
	m->region_key ^= key_xor;
	if (scoped) {
		m->mailbox = (char *)scoped;
	}
	size_t len = rdmax__v1__region_desc__get_packed_size(m);
	int ret_code = -1;
	if (len <= sizeof(ret->bytes)) {
		memset(ret, 0, sizeof(*ret));
		ret->len = (uint32_t)rdmax__v1__region_desc__pack(m, ret->bytes);
		ret_code = 0;
	}
	m->mailbox = own;
	rdmax__v1__region_desc__free_unpacked(m, NULL);
	return ret_code;
}

/* The scoped name an address carries ("" when it is none). */
static void scoped_of(const struct rdmax_desc *addr, char *buf, size_t size)
{
	Rdmax__V1__RegionDesc *m = rdmax__v1__region_desc__unpack(NULL, addr->len, addr->bytes);

	ck_assert_ptr_nonnull(m);
	snprintf(buf, size, "%s", m->mailbox ? m->mailbox : "");
	rdmax__v1__region_desc__free_unpacked(m, NULL);
}

static struct rdmax_job send_to(uint64_t id, const struct rdmax_desc *addr, const void *payload,
				size_t len)
{
	struct rdmax_job job = itest_job(id, RDMAX_OP_SEND, NULL, 0, addr, 0, 0);
	job.u.send.payload = payload;
	job.u.send.length = len;
	return job;
}

static void send_ok(struct rdmax_client *c, uint64_t id, const struct rdmax_desc *addr,
		    const char *text)
{
	struct rdmax_job job = send_to(id, addr, text, strlen(text));
	struct rdmax_event ev = itest_run_job(c, &job, ITEST_WAIT_MS);
	ck_assert_msg(ev.status == 0, "SEND %" PRIu64 ": %s ('%s')", id, rdmax_err_name(ev.status),
		      ev.reason);
}

/* The next message of c for box is exactly text. */
static void expect_message(struct rdmax_client *c, const char *box, const char *text)
{
	char got[256];
	int n = rdmax_mailbox_recv(c, box, got, sizeof(got), NULL, ITEST_WAIT_MS);

	ck_assert_msg(n == (int)strlen(text), "mailbox '%s': %s (%d bytes), expected '%s'", box,
		      rdmax_err_name(n < 0 ? n : 0), n, text);
	ck_assert_mem_eq(got, text, strlen(text));
}

/*
 * A client of another uid, in a child: opens "kv" in its own namespace and
 * sends the address to the parent on `out`; tries to post into `victim`
 * (another uid's scoped name) with its own key, which must be NOT_FOUND;
 * then waits for exactly one message, "for-other". Exit 0, else the step.
 */
static int other_uid_mailbox(const char *socket_path, const char *victim, int out)
{
	struct rdmax_client *c;
	struct rdmax_desc mine, forged;
	char got[64];

	if (setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0) {
		return 2;
	}
	if (rdmax_client_open(socket_path, "tenant", &c) < 0) {
		return 3;
	}
	if (rdmax_mailbox_open_addr(c, "kv", &mine) != 0) {
		return 4;
	}
	if (forge(&mine, 0, victim, &forged) < 0) {
		return 5;
	}
	struct rdmax_job job = send_to(1, &forged, "squat", 5);
	if (rdmax_submit(c, &job, 1) != 0 ||
	    rdmax_wait_job(c, 1, ITEST_WAIT_MS) != RDMAX_E_NOT_FOUND) {
		return 6;
	}
	if (write(out, &mine, sizeof(mine)) != (ssize_t)sizeof(mine)) {
		return 7;
	}
	int n = rdmax_mailbox_recv(c, "kv", got, sizeof(got), NULL, ITEST_WAIT_MS);
	if (n != 9 || memcmp(got, "for-other", 9) != 0) {
		return 8;
	}
	if (rdmax_mailbox_recv(c, NULL, got, sizeof(got), NULL, ITEST_QUIET_MS) !=
	    RDMAX_E_TIMEOUT) {
		return 9;
	}
	rdmax_client_close(c);
	return 0;
}

static void wait_child(pid_t child, const char *what)
{
	int status;

	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "%s of uid %d failed at step %d (status 0x%x)", what, OTHER_UID,
		      WIFEXITED(status) ? WEXITSTATUS(status) : -1, status);
}

/*
 * Names are per uid and an address is the only way in: the same name in two
 * uids coexists and each gets only its own messages; a wrong key, another
 * mailbox's key, or another uid's scoped name is refused NOT_FOUND, remote
 * and on the same node, and delivers nothing.
 */
START_TEST(mailbox_scoped_per_uid)
{
	if (strcmp(itest_transport(), "tcp") != 0 && strcmp(itest_transport(), "verbs") != 0) {
		fprintf(stderr, "itest: SKIP %s: transport '%s' carries no messages\n", __func__,
			itest_transport());
		return;
	}
	struct itest_daemon *a, *b;
	struct rdmax_client *sender, *owner;
	itest_pair_start(&a, &b, &sender, "sender", &owner, "owner");
	struct rdmax_client *peer = itest_client(b, "same-uid");
	struct rdmax_desc kv, kv2, wrong, theirs;
	char scoped[96], victim[32];

	ck_assert_int_eq(rdmax_mailbox_open_addr(owner, "kv", &kv), 0);
	scoped_of(&kv, scoped, sizeof(scoped));
	snprintf(victim, sizeof(victim), "%u:kv", (unsigned)geteuid());
	ck_assert_str_eq(scoped, victim);
	/* One namespace per uid: the same uid finds the name taken. */
	itest_assert_err(rdmax_mailbox_open(peer, "kv"), RDMAX_E_ALREADY_EXISTS);
	ck_assert_int_eq(rdmax_mailbox_open_addr(peer, "kv2", &kv2), 0);

	/* A wrong key, the key of another mailbox, another uid's name: refused, by name. */
	ck_assert_int_eq(forge(&kv, 1, NULL, &wrong), 0);
	struct rdmax_job job = send_to(1, &wrong, "x", 1);
	itest_expect_job_error(sender, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	job = send_to(2, &wrong, "x", 1);
	ck_assert_int_eq(rdmax_submit(peer, &job, 1), 0);
	struct rdmax_event ev;
	ck_assert_uint_eq(itest_collect(peer, &ev, 1, ITEST_WAIT_MS, NULL), 1);
	itest_assert_err(ev.status, RDMAX_E_NOT_FOUND);
	ck_assert_msg(strstr(ev.reason, "with this key is open on node 'b'"), "reason: '%s'",
		      ev.reason);
	ck_assert_int_eq(forge(&kv2, 0, scoped, &wrong), 0);
	job = send_to(3, &wrong, "x", 1);
	itest_expect_job_error(sender, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	char other[32];
	snprintf(other, sizeof(other), "%d:kv", OTHER_UID);
	ck_assert_int_eq(forge(&kv, 0, other, &wrong), 0);
	job = send_to(4, &wrong, "x", 1);
	itest_expect_job_error(sender, &job, RDMAX_E_NOT_FOUND, ITEST_WAIT_MS);
	/* Nothing of that reached anybody. */
	itest_assert_quiet(owner, ITEST_QUIET_MS);
	itest_assert_quiet(peer, 50);
	send_ok(sender, 5, &kv, "for-0");
	expect_message(owner, "kv", "for-0");

	if (geteuid() == 0) {
		int pipefd[2];
		itest_open_socket_dirs(b);
		ck_assert_int_eq(pipe(pipefd), 0);
		pid_t parent = getpid();
		pid_t child = fork();
		ck_assert_int_ge(child, 0);
		if (child == 0) {
			itest_child_setup(parent);
			close(pipefd[0]);
			_exit(other_uid_mailbox(b->socket_path, victim, pipefd[1]));
		}
		close(pipefd[1]);
		struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
		ck_assert_msg(poll(&pfd, 1, 2 * ITEST_WAIT_MS) == 1, "the tenant did not report");
		ssize_t n = read(pipefd[0], &theirs, sizeof(theirs));
		if (n != (ssize_t)sizeof(theirs)) {
			wait_child(child, "the tenant");
		}
		close(pipefd[0]);
		/* Its "kv" is its own mailbox, beside uid 0's. */
		scoped_of(&theirs, scoped, sizeof(scoped));
		ck_assert_str_eq(scoped, other);
		send_ok(sender, 6, &theirs, "for-other");
		send_ok(sender, 7, &kv, "for-0 again");
		expect_message(owner, "kv", "for-0 again");
		wait_child(child, "the tenant");
	} else {
		fprintf(stderr, "itest mailbox: not root, so no second uid: the other-uid part of "
				"mailbox_scoped_per_uid did not run\n");
	}
	itest_assert_quiet(owner, ITEST_QUIET_MS);
	itest_assert_quiet(peer, 50);

	rdmax_client_close(sender);
	itest_pair_end(owner, peer, a, b);
}
END_TEST

/* In a child that became OTHER_UID: open mailbox `name`; exit 0 when it opened. */
static int other_uid_opens(const char *socket_path, const char *name)
{
	struct rdmax_client *c;

	if (setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0) {
		return 2;
	}
	if (rdmax_client_open(socket_path, "tenant", &c) < 0) {
		return 3;
	}
	int ret = rdmax_mailbox_open(c, name);
	rdmax_client_close(c);
	return ret == 0 ? 0 : 4;
}

/*
 * Each uid's share: per_uid_mailboxes counts over all clients of the uid
 * (another uid still opens the same names), and per_uid_queued_message_bytes
 * refuses messages for any mailbox of a uid whose clients leave that much
 * unread, with RESOURCE_EXHAUSTED at the sender; nothing accepted is lost, and
 * the share comes back as they read.
 */
START_TEST(mailbox_uid_caps)
{
	if (strcmp(itest_transport(), "tcp") != 0 && strcmp(itest_transport(), "verbs") != 0) {
		fprintf(stderr, "itest: SKIP %s: transport '%s' carries no messages\n", __func__,
			itest_transport());
		return;
	}
	enum { MSG = 16 * 1024, MAX_MSGS = 4000 };
	struct itest_daemon *a = itest_daemon_new("a", itest_addr_a());
	struct itest_daemon *b = itest_daemon_new("b", itest_addr_b());
	itest_daemon_set(b, "limits.per_uid_mailboxes=3");
	itest_daemon_set(b, "limits.per_uid_queued_message_bytes=64K");
	itest_daemon_start(a);
	itest_daemon_start(b);
	struct rdmax_client *sender = itest_client(a, "sender");
	struct rdmax_client *c1 = itest_client(b, "one");
	struct rdmax_client *c2 = itest_client(b, "two");
	struct rdmax_desc m0, m1, m2, m3;

	ck_assert_int_eq(rdmax_mailbox_open_addr(c1, "m0", &m0), 0);
	ck_assert_int_eq(rdmax_mailbox_open_addr(c1, "m1", &m1), 0);
	ck_assert_int_eq(rdmax_mailbox_open_addr(c2, "m2", &m2), 0);
	itest_assert_err(rdmax_mailbox_open(c2, "m3"), RDMAX_E_RESOURCE_EXHAUSTED);
	itest_assert_err(rdmax_mailbox_open(c1, "m3"), RDMAX_E_RESOURCE_EXHAUSTED);
	if (geteuid() == 0) {
		itest_open_socket_dirs(b);
		pid_t parent = getpid();
		pid_t child = fork();
		ck_assert_int_ge(child, 0);
		if (child == 0) {
			itest_child_setup(parent);
			_exit(other_uid_opens(b->socket_path, "m0"));
		}
		wait_child(child, "a client opening a mailbox");
	} else {
		fprintf(stderr, "itest mailbox: not root, so no second uid: the other-uid part of "
				"mailbox_uid_caps did not run\n");
	}
	/* Closing gives the slot back to the uid, whichever client takes it. */
	ck_assert_int_eq(rdmax_mailbox_close(c1, "m1"), 0);
	ck_assert_int_eq(rdmax_mailbox_open_addr(c2, "m3", &m3), 0);

	/* c1 never reads: messages for it pile up until the uid's share is spent. */
	static uint8_t payload[MSG];
	size_t accepted = 0;
	bool refused = false;
	for (size_t i = 0; i < MAX_MSGS && !refused; i++) {
		itest_fill(payload, sizeof(payload), i);
		struct rdmax_job job = send_to(100 + i, &m0, payload, sizeof(payload));
		struct rdmax_event ev = itest_run_job(sender, &job, ITEST_WAIT_MS);
		if (ev.status == 0) {
			accepted++;
			continue;
		}
		itest_assert_err(ev.status, RDMAX_E_RESOURCE_EXHAUSTED);
		ck_assert_msg(strstr(ev.reason, "refused the message"), "reason: '%s'", ev.reason);
		refused = true;
	}
	ck_assert_msg(refused, "%zu messages of %d bytes were all queued", accepted, MSG);
	/* The share is the uid's: the other client's mailbox refuses too. */
	struct rdmax_job job = send_to(9000, &m2, payload, sizeof(payload));
	itest_expect_job_error(sender, &job, RDMAX_E_RESOURCE_EXHAUSTED, ITEST_WAIT_MS);

	/* Every accepted message is there, in order, bytes compared. */
	static uint8_t got[MSG + 1], want[MSG];
	for (size_t i = 0; i < accepted; i++) {
		int n = rdmax_mailbox_recv(c1, "m0", got, sizeof(got), NULL, ITEST_WAIT_MS);
		ck_assert_msg(n == MSG, "message %zu of %zu: %s (%d bytes)", i, accepted,
			      rdmax_err_name(n < 0 ? n : 0), n);
		itest_fill(want, sizeof(want), i);
		itest_assert_mem_eq(got, want, MSG, "queued message");
	}
	itest_assert_quiet(c1, ITEST_QUIET_MS);
	/* Read, the share is back. */
	send_ok(sender, 9001, &m2, "after");
	expect_message(c2, "m2", "after");

	rdmax_client_close(sender);
	itest_pair_end(c1, c2, a, b);
}
END_TEST

TCase *itest_tcase_mailbox(void)
{
	TCase *tc = tcase_create("mailbox");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, mailbox_scoped_per_uid);
	tcase_add_test(tc, mailbox_uid_caps);
	return tc;
}
