/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the client socket (ipc.c) against a daemon built in the test
 * process: region and imm tables, engine and client socket on a private
 * loop, no transport. Each test speaks raw datagrams to it.
 */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "ipc.h"
#include "log.h"
#include "rdmaxd.h"

Suite *ipc_suite(void);

static struct rdmaxd g_d;
static uv_loop_t g_loop;
static char g_dir[64];

static void daemon_up(void)
{
	char err[CONFIG_ERR_MAX], path[108];

	memset(&g_d, 0, sizeof(g_d));
	snprintf(g_dir, sizeof(g_dir), "/tmp/rdmax-unit-ipc-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(g_dir));
	config_defaults(&g_d.cfg);
	snprintf(path, sizeof(path), "%s/rdmaxd.sock", g_dir);
	ck_assert_int_eq(config_set(&g_d.cfg, "daemon", "socket", path, err, sizeof(err)), 0);
	log_set_level(LOG_ERR);
	ck_assert_int_eq(uv_loop_init(&g_loop), 0);
	g_d.loop = &g_loop;
	g_d.instance_id = 77;
	ck_assert_int_eq(region_table_init(&g_d.regions, g_d.instance_id), 0);
	ck_assert_int_eq(imm_table_init(&g_d.imm, 64, ipc_imm_fired, NULL), 0);
	ck_assert_int_eq(engine_create(&g_d, ipc_job_completed, &g_d.engine), 0);
	ck_assert_int_eq(ipc_create(&g_d, &g_d.ipc), 0);
}

static void daemon_down(void)
{
	ipc_shutdown(g_d.ipc);
	for (int i = 0; i < 10; i++) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
	}
	ipc_destroy(g_d.ipc);
	engine_destroy(g_d.engine);
	imm_table_fini(&g_d.imm);
	region_table_fini(&g_d.regions);
	uv_run(&g_loop, UV_RUN_NOWAIT);
	uv_loop_close(&g_loop);
	rmdir(g_dir);
}

/* Run the loop until the daemon has `want` clients; false after 5 s. */
static bool clients_become(uint32_t want)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	time_t deadline = ts.tv_sec + 5;
	while (ipc_client_count(g_d.ipc) != want) {
		uv_run(&g_loop, UV_RUN_NOWAIT);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		if (ts.tv_sec > deadline) {
			return false;
		}
		usleep(1000);
	}
	return true;
}

/* How many of this process's fds are the memfd called `name`. */
static int fds_named(const char *name)
{
	char want[128], link[PATH_MAX], target[PATH_MAX];
	int n = 0;

	snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
	for (int fd = 0; fd < 4096; fd++) {
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		ssize_t len = readlink(link, target, sizeof(target) - 1);
		if (len > 0) {
			target[len] = '\0';
			n += strcmp(target, want) == 0;
		}
	}
	return n;
}

/* An empty datagram carrying fds: the session ends and the daemon keeps none of them. */
START_TEST(ipc_empty_datagram_closes_its_fds)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} control;
	int mfds[4];

	daemon_up();
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", g_d.cfg.socket_path);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	ck_assert(clients_become(1));
	for (int i = 0; i < 4; i++) {
		mfds[i] = memfd_create("unit-empty-datagram", MFD_CLOEXEC);
		ck_assert_int_ge(mfds[i], 0);
	}
	struct iovec iov = {.iov_base = "", .iov_len = 0};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = control.buf,
			    .msg_controllen = sizeof(control.buf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(mfds));
	memcpy(CMSG_DATA(c), mfds, sizeof(mfds));
	ck_assert_int_eq(sendmsg(fd, &mh, MSG_NOSIGNAL), 0);
	for (int i = 0; i < 4; i++) {
		close(mfds[i]);
	}
	/* The daemon reads 0 bytes and ends the session. */
	ck_assert(clients_become(0));
	close(fd);
	ck_assert_int_eq(fds_named("unit-empty-datagram"), 0);
	daemon_down();
}
END_TEST

Suite *ipc_suite(void)
{
	Suite *s = suite_create("ipc");
	TCase *tc = tcase_create("ipc");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, ipc_empty_datagram_closes_its_fds);
	suite_add_tcase(s, tc);
	return s;
}
